"""``workbench``: learn to write fast GPU kernels by watching them get fast.

Commands: list, check, diff, bench, record, targets, sweep, run, peaks, plot, table, ptx, doctor (here,
``add_core_cli``), and the rooms' grade, exercises, notebooks, profile and sanitize (``workbench/grade/``,
``workbench/generate/``, ``workbench/tools/``), each group registered by its ``add_cli``. Every command exits
non-zero on any failure, so scripts and CI can rely on it; a wrong argument gets one line, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)

from .console import console as Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import device as _device
from . import paths, registry, sizes, tables
from .ladder import size_label
from .sweep import SweepError

console = Console(stderr=False)
err = Console(stderr=True)



class UsageError(Exception):
    """A wrong argument: shown as one line, exit status 2."""


def _sizes_for(op, given) -> list | None:
    """The sizes a person gave, checked against ``op`` before anything runs (None: the defaults)."""
    if not given:
        return None
    try:
        checked = [sizes.check_size(op, s) for s in given]
    except sizes.SizeError as exc:
        raise UsageError(str(exc)) from None
    for s in checked:
        warning = sizes.simulator_warning(op, s)
        if warning:
            err.print(f"[yellow]warning:[/] {warning}")
    return checked


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True)


def _fmt(x, spec=".3g") -> str:
    return "—" if x is None else format(x, spec)


# -- list ----------------------------------------------------------------------------------------

def cmd_list(args) -> int:
    ops = registry.load_operators()
    chapters = registry.chapters()
    if args.target:  # a family (all its variants), one variant, or one chapter (its number or name)
        try:
            chosen = registry.operators_named(args.target)
        except registry.UnknownTarget as not_an_operator:
            if "[" in args.target:  # a variant's name: what the registry says names the family's variants
                raise not_an_operator from None
            try:
                chosen = [ops[name] for name in registry.chapter(args.target).operators]
            except registry.UnknownTarget:
                raise registry.UnknownTarget(
                    f"no operator or chapter {args.target!r}{registry.renamed_hint(args.target)}: `workbench list` "
                    f"shows the families and the chapters "
                    f"({', '.join(ch.stem for ch in chapters)})") from None
    else:
        chosen = list(ops.values())
    if args.json:
        print(json.dumps([{"op": op.name, "family": op.family, "variant": op.variant, "title": op.title,
                           "chapter": registry.chapter_of(op).stem, "size": op.size_form, "module": op.module,
                           "stages": [{"name": s.name, "order": s.order, "summary": s.summary, "gpu_only": s.gpu_only}
                                      for s in op.stages]}
                          for op in chosen], indent=1))
        return 0
    if not args.target:  # the course: a row per chapter; `workbench list CHAPTER|FAMILY|OP` shows stages
        families = registry.families()
        table = Table(title=f"{len(families)} families, {len(ops)} variants, in {len(chapters)} chapters "
                            "(`workbench list CHAPTER|FAMILY|OP` shows the stages)", title_justify="left")
        for col in ("#", "chapter", "operators (a family's name alone is its default variant)"):
            table.add_column(col)
        for ch in chapters:
            table.add_row(str(ch.number) + (" ★" if ch.core else ""), ch.slug, ", ".join(ch.operators))
        console.print(table)
        return 0
    if len(chosen) > 1:  # which variants each stage serves, before the ladders
        from .tables import served_words

        table = Table(title="which variants each stage serves", title_justify="left")
        table.add_column("stage")
        table.add_column("serves")
        for stage, served in registry.stages_served(chosen):
            table.add_row(stage, served_words(served, chosen).replace("`", ""))
        console.print(table)
    # Variants whose ladders are the same stages (an activation's seven functions) share one table.
    ladders: dict[tuple, list] = {}
    for op in chosen:
        ladders.setdefault(tuple((s.name, s.summary, s.gpu_only) for s in op.stages), []).append(op)
    for same in ladders.values():
        op = same[0]
        names = ", ".join(o.name for o in same)
        title = op.title if len(same) == 1 else f"{len(same)} variants, one ladder"
        table = Table(title=f"{names}: {title}  (size {op.size_form}, {op.module}, chapter "
                            f"{registry.chapter_of(op).stem})", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("stage")
        table.add_column("what changed and why")
        for s in op.stages:
            table.add_row(str(s.order), s.name + (" (GPU only)" if s.gpu_only else ""), s.summary)
        console.print(table)
    return 0


# -- check ---------------------------------------------------------------------------------------

def run_checks(target: str, given_sizes=None, seed=None) -> tuple:
    """check.check_ladder at the sizes given (default: the operator's), adversarial inputs included."""
    from .check import check_ladder, default_sizes

    op, stages = registry.resolve(target)
    chosen = _sizes_for(op, given_sizes) or default_sizes(op)
    with _progress() as prog:
        task = prog.add_task(f"checking {target}", total=len(stages) * len(chosen))

        def step(text):
            prog.update(task, description=text)
            prog.advance(task)

        results = check_ladder(op, stages, chosen, seed, progress=step)
    return op, results


# How every verdict prints (check's and ptx's statuses are the same words: passed, failed, skipped).
VERDICTS = {"passed": "[green]ok[/]", "failed": "[red]FAIL[/]", "skipped": "[yellow]skipped[/]"}


def print_checks(results) -> None:
    table = Table(title_justify="left")
    for col in ("stage", "size", "inputs", "rel. error", "tolerance", "result"):
        table.add_column(col)
    for r in results:
        verdict = VERDICTS[r.status]
        table.add_row(r.key, "x".join(map(str, r.size)), r.inputs, _fmt(r.rel_err), _fmt(r.tolerance, ".1g"),
                      verdict + (f" {r.message}" if r.message else ""))
    console.print(table)
    counts = {status: sum(r.status == status for r in results) for status in ("passed", "failed", "skipped")}
    line = f"{counts['passed']} passed, {counts['failed']} failed"
    if counts["skipped"]:
        line += f", {counts['skipped']} skipped (not judged: they need a GPU)"
    (err if counts["failed"] else console).print(line)


def cmd_check(args) -> int:
    _device.announce()
    _, results = run_checks(args.target, args.size, args.seed)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
    else:
        print_checks(results)
    return 1 if any(r.failed for r in results) else 0


# -- diff ----------------------------------------------------------------------------------------

def cmd_diff(args) -> int:
    from . import diff

    op, stages = registry.resolve(args.target)
    if "." not in args.target:
        raise UsageError(f"diff takes OP.STAGE, e.g. {op.name}.{op.stages[-1].name}; stages of {op.name}: "
                         f"{', '.join(s.name for s in op.stages)}")
    against = None
    if args.against:
        against = registry.resolve(f"{op.name}.{args.against}")[1][0]
    d = diff.stage_diff(stages[0], against)
    # The diff shows each stage's paragraph as "(the paragraph above)": the paragraph goes above it.
    paragraph = " ".join(stages[0].summary.split())
    if args.html:
        import html

        print(f"<p>{html.escape(paragraph)}</p>\n{diff.as_html(d)}")
        return 0
    print(textwrap.fill(paragraph, 100) + "\n")
    if console.is_terminal and not args.plain:
        console.print(diff.as_rich(d), end="")
    else:
        print(diff.as_text(d), end="")
    return 0


# -- bench / peaks ---------------------------------------------------------------------------------

def _need_gpu(what: str) -> bool:
    if _device.is_simulator():
        _device.announce()
        err.print(f"[red]{what} needs a real GPU.[/] Timings from the simulator would be meaningless; "
                  "`workbench plot OP` shows the figures recorded on a GPU in results/.")
        return False
    return True


def _peaks_for_device(remeasure: bool = False) -> dict:
    from . import results
    from .ceilings import keep_best, measure_peaks

    env = results.environment()
    stored = results.stored_peaks(env["device"])
    if stored and not remeasure:
        return stored
    err.print("measuring this device's peaks (copy bandwidth, library GEMM)...")
    peaks = keep_best(stored, measure_peaks())
    results.save_records(env["device"], [], peaks=peaks)
    return peaks


def print_bench(records) -> None:
    table = Table(title_justify="left")
    for col in ("stage", "size", "median µs", "p10–p90 µs", "GB/s", "GFLOP/s", "% peak", "vs peer", "host call µs"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for r in records:
        peer = r.get("peer")
        ratio = f"{peer['median_us'] / r['median_us']:.2f}x" if peer else "—"
        table.add_row(r["stage"] if r.get("kind") == "stage" else f"[red]{r['stage']}[/]", r["size_label"],
                      f"{r['median_us']:.1f}", f"{r['p10_us']:.1f}–{r['p90_us']:.1f}", f"{r['gbps']:.0f}",
                      f"{r['gflops']:.0f}", _fmt(r.get("pct_of_peak"), ".0f"), ratio, f"{r['host_call_us']:.0f}")
    console.print(table)


def bench_target(target: str, given_sizes, seed, save: bool, quick: bool = False,
                 with_compile: bool = True) -> tuple[list, list]:
    import numpy as np

    from . import results
    from .bench import bench_size
    from .ceilings import check_ceilings

    op, stages = registry.resolve(target)
    peaks = _peaks_for_device()
    env = results.environment()
    chosen = _sizes_for(op, given_sizes) or ([op.headline_size] if quick else op.bench_sizes)
    rng = np.random.default_rng(seed)
    records, failures = [], []
    with _progress() as prog:
        task = prog.add_task(f"bench {target}", total=len(chosen) * (len(stages) + 1 + with_compile))

        def step(text):
            prog.update(task, description=text)
            prog.advance(task)

        for size in chosen:
            recs, fails = bench_size(op, stages, size, peaks, rng, env, step, with_compile=with_compile)
            peaks = check_ceilings(recs, peaks, lambda line: err.print(line, markup=False, highlight=False))
            records += recs
            failures += fails
            if save and recs:  # after every size: an interrupted run keeps what it measured
                results.save_records(env["device"], recs, peaks=peaks)
    return records, failures


def cmd_bench(args) -> int:
    if args.against:
        return bench_against(args)
    if not _need_gpu("bench"):
        return 2
    targets = list(registry.load_operators()) if args.target == "all" else [args.target]
    records, failures = [], []
    for target in targets:
        recs, fails = bench_target(target, args.size, args.seed, save=not args.no_save, quick=args.quick,
                                   with_compile=not args.no_compile)
        records += recs
        failures += fails
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        print_bench(records)
    for f in failures:
        err.print(f"[red]FAIL[/] {f}")
    return 1 if failures else 0


def bench_against(args) -> int:
    """`bench OP.STAGE --against OTHER`: the two stages timed in turn, several rounds, one verdict."""
    import numpy as np

    from . import results
    from .bench import alternate, middle_record
    from .record import change

    op, stages = registry.resolve(args.target)
    if "." not in args.target:
        raise UsageError(f"--against compares two stages: bench OP.STAGE --against STAGE, e.g. "
                         f"bench {op.name}.{op.stages[-1].name} --against {op.stages[0].name}")
    other = registry.resolve(f"{op.name}.{args.against}")[1][0]
    if args.rounds < 1:
        raise UsageError(f"--rounds is a whole number of at least 1; got {args.rounds}")
    chosen = _sizes_for(op, args.size) or [op.headline_size]
    if not _need_gpu("bench --against"):
        return 2
    peaks, env = _peaks_for_device(), results.environment()
    rng = np.random.default_rng(args.seed)
    status = 0
    for size in chosen:
        by_stage, failures = alternate(op, [stages[0], other], size, peaks, rng, env, args.rounds)
        for f in failures:
            err.print(f"[red]FAIL[/] {f}")
        if failures or not all(by_stage.values()):
            status = 1
            continue
        a, b = (middle_record(by_stage[s.name]) for s in (stages[0], other))
        for r in (a, b):
            console.print(f"{r['stage']:<24} @ {r['size_label']}: {r['median_us']:.1f} µs "
                          f"(p10-p90 over {args.rounds} rounds {r['p10_us']:.1f}-{r['p90_us']:.1f})")
        ch = change(b, a)
        verdict = ("within the noise of both" if ch is None else
                   f"{a['stage']} is {'faster' if ch > 0 else 'slower'} by {abs(ch):.0%}")
        console.print(f"{a['stage']} against {b['stage']}: {b['median_us'] / a['median_us']:.3f}x, {verdict}")
    return status


def cmd_sweep(args) -> int:
    from . import sweep
    from .ladder import as_size

    op, stages = registry.resolve(args.target)
    if "." not in args.target:
        raise UsageError(f"sweep takes OP.STAGE, e.g. {op.name}.{op.stages[-1].name}")
    settings = sweep.parse_settings(args.settings)
    for setting in settings:
        sweep.check_setting(args.target, setting)
    size = (_sizes_for(op, [args.size] if args.size else None) or [as_size(op.headline_size)])[0]
    if not _need_gpu("sweep"):
        return 2
    table = Table(title=f"{args.target} @ {size_label(size)}", title_justify="left")
    for col in ("setting", "median µs", "p10–p90 µs", "GB/s", "GFLOP/s", "vs as committed", "result"):
        table.add_column(col, justify="left" if col in ("setting", "result") else "right")
    base = None
    status = 0
    for setting in [{}] + settings:
        label = ", ".join(f"{k}={v}" for k, v in setting.items()) or "as committed"
        err.print(f"{label} ...")
        row = sweep.run_setting(args.target, size, setting)
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps(row) + "\n")
        rec = next((r for r in row.get("records", []) if r["kind"] == "stage"), None)
        if rec is None:
            status = 1
            why = row.get("error") or "; ".join(row.get("failures", []))
            table.add_row(label, "—", "—", "—", "—", "—", f"[red]FAIL[/] {why.strip().splitlines()[-1][:200] if why else ''}")
            continue
        base = base or rec
        table.add_row(label, f"{rec['median_us']:.1f}", f"{rec['p10_us']:.1f}–{rec['p90_us']:.1f}", f"{rec['gbps']:.0f}",
                      f"{rec['gflops']:.0f}", f"{base['median_us'] / rec['median_us']:.2f}x", "[green]ok[/]")
    console.print(table)
    return status


def peaks_table(peaks: dict, heading: str) -> Table:
    """The memory ceilings by access pattern beside NVIDIA's figure, then the library GEMM rates."""
    from rich.markup import escape

    from .bench import PATTERN_PEAK
    from .ceilings import MEASURED_BY, datasheet_gbps

    device = (peaks.get("environment") or {}).get("device", "")
    sheet = peaks.get("datasheet_gbps") or datasheet_gbps(device)
    table = Table(title=heading, title_justify="left")
    for col in ("pattern", "measured by", "GB/s", "% of datasheet"):
        table.add_column(col, justify="right" if col in ("GB/s", "% of datasheet") else "left")
    for pattern, key in PATTERN_PEAK.items():
        gbps = peaks.get(key)
        # The ceiling is the best of several measurements where the file holds them (ours, memcpy, torch's).
        candidates = dict(peaks.get(key.replace("_gbps", "_detail_gbps")) or {})
        both = (peaks.get("stream_detail_gbps") or {}).get(key) or {}
        if both.get("torch"):
            if not candidates and both.get("workbench"):
                candidates["ours"] = both["workbench"]
            candidates["torch"] = both["torch"]
        how = MEASURED_BY[pattern]
        if candidates:
            how = "best of " + ", ".join(f"{k} {v:.0f}" for k, v in candidates.items())
        kept = (peaks.get("kept") or {}).get(key)
        if kept:  # an earlier run on this device model measured more: the ceiling keeps that
            how = f"{kept['value']:.0f} on {(kept.get('date') or '?')[:10]}, above this run's {how}"
        again = (peaks.get("remeasured") or {}).get(key)
        if again:  # measured again during a bench run, because a record had moved more
            how += f"; measured again on {again['date'][:10]} ({again['gbps']:.0f}) as {escape(again['because'])}"
        table.add_row(pattern, how, f"{gbps:.0f}" if gbps else "not measured",
                      f"{100 * gbps / sheet:.0f}" if gbps and sheet else "—")
    table.add_row("datasheet", "NVIDIA's figure (not a ceiling)", f"{sheet:.0f}" if sheet else "unknown",
                  "100" if sheet else "—")
    for k in ("gemm_fp32_gflops", "gemm_tf32_gflops", "gemm_fp16_gflops"):
        if peaks.get(k):
            kept = (peaks.get("kept") or {}).get(k)
            how = peaks.get("gemm_library", "library GEMM")
            table.add_row(k.replace("_gflops", ""), f"{how}, on {kept['date'][:10]}" if kept else how,
                          f"{peaks[k] / 1e3:.1f} TFLOP/s", "")
    return table


def _say_records_above(peaks: dict) -> None:
    """Name the stored records of this device that moved more than their ceiling: the ceiling is then wrong."""
    from . import results
    from rich.markup import escape

    from .ceilings import records_above

    device = (peaks.get("environment") or {}).get("device")
    records = [r for data in results.load_all() if data.get("device") == device for r in data.get("records", [])]
    above = records_above(peaks, records)
    if not above:
        return
    console.print(f"[yellow]{len(above)} records moved more than their ceiling[/] (a ceiling a kernel beats is "
                  "wrong: `workbench peaks --measure` on that GPU measures it again, with every layout it knows):")
    for rec, key, ratio in above[:8]:
        console.print(f"  {escape(rec['op'])}.{escape(rec['stage'])} at {rec['size_label']} ({rec['date'][:10]}): "
                      f"{rec['gbps']:.0f} GB/s, {100 * ratio:.1f}% of {key.replace('_gbps', '')}")
    if len(above) > 8:
        console.print(f"  ... and {len(above) - 8} more (`workbench peaks --json` and the records file hold them)")


def cmd_peaks(args) -> int:
    from . import results
    from .bench import PATTERN_PEAK

    if args.measure:
        if not _need_gpu("peaks --measure"):
            return 2
        peaks = _peaks_for_device(remeasure=True)
        found = [(f"measured now on {peaks['environment']['device']}, {peaks['date'][:10]}", peaks)]
    else:
        device = None if _device.is_simulator() else results.environment()["device"]
        found = [(f"recorded on {data['device']}, {(data['peaks'].get('date') or '?')[:10]}", data["peaks"])
                 for data in results.load_all() if (data.get("peaks") or {}).get("copy_gbps")
                 and device in (None, data["device"])]
        if not found:
            err.print(f"no ceilings recorded{f' for {device}' if device else ''} in {paths.results_dir()}: "
                      "`workbench peaks --measure` on a GPU measures and records them")
            return 1
    if args.json:
        print(json.dumps(found[0][1] if len(found) == 1 else {h: p for h, p in found}, indent=1))
        return 0
    for heading, peaks in found:
        console.print(peaks_table(peaks, heading))
        _say_records_above(peaks)
        missing = [p for p, k in PATTERN_PEAK.items() if not peaks.get(k)]
        if missing:
            console.print(f"{' and '.join(missing)}: not measured when this file was recorded; operators of "
                          "that pattern divide by copy meanwhile. `workbench peaks --measure` on that GPU records it.")
    return 0


# -- record / targets ------------------------------------------------------------------------------

def _operators_named(names) -> list:
    """The operators a person named (all of them for none; a family's name: all its variants), each checked."""
    ops = registry.load_operators()
    if not names:
        return list(ops.values())
    return list({op.name: op for name in names for op in registry.operators_named(name)}.values())


def cmd_record(args) -> int:
    """Ceilings if stale, then what is stalest or never recorded, within the budget; a summary."""
    import time

    from . import record, results

    started = time.monotonic()
    if args.budget <= 0:
        raise UsageError(f"--budget is a number of seconds above 0; got {args.budget:g}")
    ops = _operators_named(args.families)
    if args.dry_run:
        return _print_record_plan(ops, not args.no_compile)
    if not _need_gpu("record"):
        return 2

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    env = results.environment()
    peaks = results.stored_peaks(env["device"])
    stale = record.peaks_stale(peaks, env)
    if stale and time.monotonic() - started + record.PEAKS_SECONDS <= args.budget:
        say(f"ceilings: {stale}; measuring them")
        peaks = _peaks_for_device(remeasure=True)
    elif stale:
        say(f"ceilings: {stale}; not enough budget to measure them (~{record.PEAKS_SECONDS:.0f} s)")
    several = [op for op in ops if record.needs_several_gpus(op)]
    if several:
        _record_several_gpus(several, args.budget - (time.monotonic() - started), say)
    summary = record.record(ops, args.budget, env["device"], record.gpu_measure_item(peaks or {}, env, args.seed,
                            not args.no_compile), say=say, with_compile=not args.no_compile, started=started)
    for line in summary.lines():
        say(line)
    return 1 if summary.failures else 0


def _print_record_plan(ops, with_compile: bool) -> int:
    """What `record` would measure, in order, against this device's results (any recorded file without a GPU)."""
    from . import record, results

    device = None if _device.is_simulator() else results.environment()["device"]
    found = [d for d in results.load_all() if device in (None, d["device"])]
    data = found[0] if found else results.empty(device or "simulator")
    console.print(f"plan against the records of {data['device']}:")
    for n, item in enumerate(record.plan(ops, data, with_compile), 1):
        why = f"never recorded: {', '.join(item.missing)}" if item.missing else f"last recorded {item.oldest[:10]}"
        console.print(f"{n:4d}. {item.label} ({why}; ~{item.estimate_s:.0f} s)", markup=False, highlight=False,
                      soft_wrap=True)
    return 0


def _record_several_gpus(ops, budget_s: float, say) -> None:
    """The all-reduce's run (workbench/tools/allreduce.py) in a process of its own, on two GPUs or more."""
    import subprocess

    from numba import cuda

    names = ", ".join(op.name for op in ops)
    if len(cuda.gpus) < 2:
        say(f"{names}: measured across GPUs; this machine has one: skipped")
        return
    if budget_s < ALLREDUCE_SECONDS:
        say(f"{names}: needs ~{ALLREDUCE_SECONDS} s, {budget_s:.0f} s left: skipped")
        return
    say(f"{names}: measuring on {len(cuda.gpus)} GPUs (~{ALLREDUCE_SECONDS} s)")
    try:
        own_budget = max(ALLREDUCE_SECONDS, min(budget_s, 2 * ALLREDUCE_SECONDS)) - 15  # it stops starting at this
        subprocess.run([sys.executable, "-m", "workbench.tools.allreduce", "--budget", f"{own_budget:.0f}"],
                       cwd=paths.REPO_ROOT, timeout=budget_s)
    except subprocess.TimeoutExpired:
        say(f"{names}: not finished within {budget_s:.0f} s; what it wrote is in results/runs/")


ALLREDUCE_SECONDS = 180  # the all-reduce's run on two H200s: NCCL, the links, every stage at 10 sizes


def cmd_targets(args) -> int:
    from .targets import verdicts

    found = verdicts(_operators_named(args.families))
    if args.json:
        print(json.dumps([v.as_dict() for v in found], indent=1))
        return 0
    table = Table(title_justify="left")
    for col in ("operator", "target", "figure", "against", "stage", "date", "verdict"):
        table.add_column(col, justify="right" if col == "figure" else "left")
    colour = {"met": "green", "missed": "red", "never measured": "yellow"}
    for v in found:
        figure = "—" if v.value is None else (f"{v.value:.2f}x" if v.unit == "x" else f"{v.value:.0f}%")
        table.add_row(v.op, v.target, figure, v.peer or "—", v.stage or "—", (v.date or "—")[:10],
                      f"[{colour[v.status]}]{v.status}[/]" + (f" ({v.why})" if v.why else ""))
    wide = console if console.is_terminal else Console(width=200)  # a log (not a terminal) gets whole lines
    wide.print(table)
    counts = {s: sum(v.status == s for v in found) for s in colour}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


# -- plot / table / run --------------------------------------------------------------------------

def _recorded(op) -> dict | None:
    from . import results

    data = results.latest_file_with(op.name)
    if data is None and op.figures_elsewhere:
        err.print(f"[yellow]{op.name} is measured across GPUs[/]: `workbench record` on a machine with two GPUs or "
                  f"more records it in {paths.results_dir() / op.figures_elsewhere}")
    elif data is None:
        err.print(f"[yellow]no recorded figures for {op.name} in {paths.results_dir()}[/]: "
                  f"`workbench bench {op.name}` on a GPU records them")
    return data


def _plot_dir(args) -> Path:
    return Path(args.out) if args.out else paths.output_dir("plots")


def _save_plots(op, data: dict, out_dir: Path, live: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from .plots import save_all

    metric = "gflops" if op.bound == "compute" else "gbps"
    saved = save_all(data, op.name, out_dir, metric=metric, live=live)
    for p in saved:
        console.print(f"wrote {p}")
    recorded_sizes = {tuple(r["size"]) for r in data["records"] if r["op"] == op.name and r.get("kind") == "stage"}
    if not any(p.name.endswith("_latency.png") for p in saved) and len(recorded_sizes) < 2:
        console.print(f"no latency plot: {op.name} is recorded at one size only "
                      f"({', '.join(size_label(s) for s in recorded_sizes)}); latency against size needs two or more, "
                      f"which `workbench bench {op.name}` on a GPU measures (its bench sizes)")


def cmd_plot(args) -> int:
    from . import results

    op = registry.operator(args.op)
    data = _recorded(op)
    if data is None and op.figures_elsewhere:  # its run drew its plots: results/runs/<op>_*.png
        drawn = sorted((results.results_dir() / "runs").glob(f"{op.slug}_*.png"))
        for p in drawn:
            console.print(f"its recorded plot: {p}")
        return 0 if drawn else 1
    if data is None:
        return 1
    _save_plots(op, data, _plot_dir(args), live=False)
    return 0


def cmd_table(args) -> int:
    if args.update_readme:
        if args.op:
            raise UsageError("table --update-readme regenerates the course map and every chapter's page: give no OP")
        if not args.readme:  # the figures README shows are redrawn with its tables, from the same records,
            from .plots import update_committed_plots  # first: the chapter pages link the figures that exist

            update_committed_plots(log=console.print)
        outcome = tables.update_readme(Path(args.readme) if args.readme else None)
        readme = args.readme or paths.README
        if outcome == "no-markers":
            err.print(f"[red]{readme} has no <!-- course --> ... <!-- /course --> markers[/]")
            return 1
        console.print(f"{outcome}: the course map of {readme} and the chapter pages beside it (docs/)")
        return 0
    ops = registry.operators_named(args.op) if args.op else list(registry.load_operators().values())
    status = 0
    for op in ops:
        data = _recorded(op)
        if data is None:
            status = 1
            continue
        print(tables.ladder_table(op, data))
    return status


def cmd_run(args) -> int:
    """The main job: check the ladder, then (on a GPU) measure it, then draw it."""
    _device.announce()
    op = registry.operator(args.op)
    _, checks = run_checks(args.op, args.size, args.seed)
    print_checks(checks)
    if any(r.failed for r in checks):
        err.print("[red]checks failed: not timing a wrong kernel[/]")
        return 1
    status = 0
    if not _device.is_simulator():
        records, failures = bench_target(args.op, args.size, args.seed, save=True, quick=args.quick)
        print_bench(records)
        status = 1 if failures else 0
    data = _recorded(op)
    if data is not None:
        _save_plots(op, data, _plot_dir(args), live=not _device.is_simulator())
        if _device.is_simulator():
            console.print(f"plots show figures recorded on {data['device']} (see results/)")
    return status


def cmd_ptx(args) -> int:
    """Compile every kernel of the stages for sm_90 (no GPU needed) and report registers and spills."""
    if not _device.is_simulator():  # kernels are collected by running them in the simulator
        import subprocess

        env = dict(os.environ, WORKBENCH_MODE="sim")
        return subprocess.call([sys.executable, "-m", "workbench.cli", *sys.argv[1:]], env=env)
    from .ptxcheck import check_stages

    _, stages = registry.resolve(args.target)
    with _progress() as prog:
        task = prog.add_task(f"compiling {args.target} for sm_90", total=len(stages))

        def step(text):
            prog.update(task, description=text)
            prog.advance(task)

        reports = check_stages(stages, progress=step)
    table = Table(title_justify="left")
    for col in ("stage", "kernel", "registers", "spill B", "smem B", "result"):
        table.add_column(col)
    for r in reports:
        table.add_row(r.stage, r.kernel.rsplit(".", 1)[-1], _fmt(r.registers, "d"), _fmt(r.spill_bytes, "d"),
                      _fmt(r.shared_bytes, "d"), VERDICTS[r.status] + (f" {r.message}" if r.message else ""))
    console.print(table)
    if not reports:
        err.print(f"[red]no kernel of {args.target} was compiled[/]")
        return 1
    failed = sum(r.failed for r in reports)
    if failed:
        err.print(f"[red]{failed} kernel(s) failed[/]")
    return 1 if failed else 0


# -- doctor --------------------------------------------------------------------------------------

def doctor_report() -> tuple[dict, list[str]]:
    import numpy

    from . import results

    env = results.environment()
    probe = _device.probe()
    env["probe"] = probe.reason
    warnings = []
    np_major_minor = tuple(int(p) for p in numpy.__version__.split(".")[:2])
    nc = env.get("numba_cuda", "0")
    if np_major_minor >= (2, 5) and nc.startswith("0.30"):
        warnings.append(f"numpy {numpy.__version__} with numba-cuda {nc}: no kernel compiles "
                        "(np.row_stack was removed in numpy 2.5). Install numpy<2.5.")
    if _device.is_simulator():
        warnings.append(_device.SIMULATOR_NOTICE.format(reason=probe.reason))
    return env, warnings


def cmd_doctor(args) -> int:
    env, warnings = doctor_report()
    if args.json:
        print(json.dumps({"environment": env, "warnings": warnings}, indent=1))
        return 0
    table = Table(title="workbench doctor", title_justify="left", show_header=False)
    for k in ("mode", "device", "compute_capability", "sm_count", "l2_bytes", "cuda_driver", "cuda_runtime",
              "probe", "python", "numba", "numba_cuda", "numpy", "torch", "cupy"):
        if k in env:
            table.add_row(k, str(env[k]))
    console.print(table)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}")
    return 0


# -- entry point -----------------------------------------------------------------------------------

TARGET_HELP = "an operator (reduction) or one stage of it (reduction.fused); `workbench list` shows them"
SIZE_HELP = "a problem size in the operator's form: 1000, 2**20, 1e6, 32768x4096 (repeatable)"
SEED_HELP = "seed of the random inputs (default: fresh each run)"
JSON_HELP = "print machine-readable JSON instead of a table"


def build_parser() -> argparse.ArgumentParser:
    """Every command, registered one way: each group's ``add_cli(sub)`` (this module's own first, then the
    rooms'); the list of commands in ``--help`` is read back from what they registered."""
    from .generate.exercises import add_cli as add_exercises_cli  # `workbench exercises build|check|reset`
    from .generate.notebooks import add_cli as add_notebooks_cli  # `workbench notebooks build|check`
    from .grade.cli import add_cli as add_grade_cli  # `workbench grade ...`
    from .tools.profile import add_cli as add_profile_cli  # `workbench profile` (Nsight Compute)
    from .tools.sanitize import add_cli as add_sanitize_cli  # `workbench sanitize` (compute-sanitizer)
    from .tools.counters import add_cli as add_counters_cli  # `workbench counters` (counted in the simulator)

    p = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\n")[0].split(": ", 1)[1].capitalize())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_cli in (add_core_cli, add_grade_cli, add_exercises_cli, add_notebooks_cli, add_profile_cli,
                    add_sanitize_cli, add_counters_cli):
        add_cli(sub)
    p.epilog = f"commands: {', '.join(sub.choices)} (`workbench COMMAND --help` for each)"
    return p


def add_core_cli(sub) -> None:
    """The commands of this module: list, check, diff, bench, record, targets, sweep, run, peaks, plot,
    table, ptx, doctor."""
    s = sub.add_parser("list", help="the chapters and their operators; an operator's or chapter's stages")
    s.add_argument("target", nargs="?", metavar="OP|CHAPTER",
                   help="an operator (softmax[fp16]) or a chapter (21, softmax or 21_softmax): its stages")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("check", help="correctness of OP or OP.STAGE against a float64 reference")
    s.add_argument("target", help=TARGET_HELP)
    s.add_argument("--size", type=sizes.size_arg, action="append", help=SIZE_HELP)
    s.add_argument("--seed", type=sizes.seed_arg, help=SEED_HELP)
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("diff", help="what changed in OP.STAGE's kernels and launcher since the previous stage")
    s.add_argument("target", help="OP.STAGE, e.g. softmax.ilp")
    s.add_argument("--against", metavar="STAGE", help="compare with this stage of the same operator instead")
    s.add_argument("--html", action="store_true", help="print HTML (added lines green, removed red)")
    s.add_argument("--plain", action="store_true", help="plain unified diff, no colour")
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser("bench", help="check, time and record OP or OP.STAGE (or all) on the GPU")
    s.add_argument("target", help=TARGET_HELP + ", or all")
    s.add_argument("--size", type=sizes.size_arg, action="append", help=SIZE_HELP)
    s.add_argument("--quick", action="store_true", help="only the operator's headline size")
    s.add_argument("--no-save", action="store_true", help="do not write results/")
    s.add_argument("--no-compile", action="store_true",
                   help="time only the eager peer, not the operator's torch expression under torch.compile")
    s.add_argument("--against", metavar="STAGE",
                   help="A/B: time OP.STAGE and this stage of the same operator in turn (--rounds), nothing saved")
    s.add_argument("--rounds", type=int, default=3, help="rounds of an --against comparison (default 3)")
    s.add_argument("--seed", type=sizes.seed_arg, help=SEED_HELP)
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("sweep", help="on a GPU: a stage's module constants tried, each setting in a fresh process, "
                                      "checked and timed beside the committed values")
    s.add_argument("target", help="OP.STAGE, e.g. scan.decoupled_lookback")
    s.add_argument("settings", nargs="+", metavar="NAME=V1,V2",
                   help="a module constant and the values to try (several: every combination)")
    s.add_argument("--size", type=sizes.size_arg, help="the size to time at (default: the headline size)")
    s.add_argument("--log", metavar="FILE", help="append each setting's row to this JSON-lines file")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("record", help="on a GPU: measure what is stalest or never recorded (ceilings first if "
                                       "stale) within a time budget, saving after every size; a summary")
    s.add_argument("families", nargs="*", metavar="FAMILY", help="operators to record (default: all)")
    s.add_argument("--budget", type=float, default=540.0, help="seconds the whole run may take (default 540)")
    s.add_argument("--no-compile", action="store_true", help="time only the eager peer, not torch.compile")
    s.add_argument("--dry-run", action="store_true", help="print the plan in order, measure nothing (no GPU needed)")
    s.add_argument("--seed", type=sizes.seed_arg, help=SEED_HELP)
    s.set_defaults(func=cmd_record)

    s = sub.add_parser("targets", help="each operator's declared targets: met, missed or never measured")
    s.add_argument("families", nargs="*", metavar="FAMILY", help="operators (default: all)")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_targets)

    s = sub.add_parser("run", help="the main job: check, bench (on a GPU), plot")
    s.add_argument("op", help="an operator, e.g. reduction")
    s.add_argument("--size", type=sizes.size_arg, action="append", help=SIZE_HELP + "; default: the operator's")
    s.add_argument("--quick", action="store_true", help="bench only the headline size")
    s.add_argument("--seed", type=sizes.seed_arg, help=SEED_HELP)
    s.add_argument("--out", help="folder for the plots (default: out/plots in the checkout, git-ignored)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("peaks", help="the recorded memory ceilings (read, copy, 2 reads + 1 write) and GEMM rates; "
                                      "--measure: measure and record this GPU's")
    s.add_argument("--measure", action="store_true",
                   help="measure this GPU's ceilings now and record them in results/ (needs a GPU)")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_peaks)

    s = sub.add_parser("plot", help="staircase, latency-vs-size and roofline from results/")
    s.add_argument("op", help="an operator, e.g. reduction")
    s.add_argument("--out", help="folder for the plots (default: out/plots in the checkout, git-ignored; "
                                 "results/plots holds the committed ones README shows)")
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser("table", help="markdown ladder table from results/ (--update-readme rewrites README's)")
    s.add_argument("op", nargs="?", help="an operator (default: all)")
    s.add_argument("--update-readme", action="store_true",
                   help="regenerate README's course map and the chapter pages under docs/ (tables, plots), "
                        "and redraw the committed plots (results/plots) whose records changed")
    s.add_argument("--readme", help="the README to update (default: the checkout's)")
    s.set_defaults(func=cmd_table)

    s = sub.add_parser("ptx", help="compile every kernel for sm_90 without a GPU; registers and spills")
    s.add_argument("target", help=TARGET_HELP)
    s.set_defaults(func=cmd_ptx)

    s = sub.add_parser("doctor", help="GPU, driver, CUDA, numba and numpy versions; known-bad combinations")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_doctor)


def _size_values_attached(argv: list[str]) -> list[str]:
    """``--size -5x3`` as ``--size=-5x3``: argparse reads a value that starts with "-" and is not a plain
    negative number as the next option, and would answer "expected one argument" instead of saying what
    is wrong with the size."""
    out, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--size" and rest and rest[0][:1] == "-" and rest[0][1:2].isdigit():
            arg = f"--size={rest.pop(0)}"
        out.append(arg)
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(_size_values_attached(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.func(args) or 0)
    except (registry.UnknownTarget, UsageError, sizes.SizeError, SweepError) as exc:
        err.print(f"[red]error:[/] {exc.args[0] if exc.args else exc}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("[red]interrupted[/] (results already written are intact)")
        return 130


if __name__ == "__main__":
    sys.exit(main())
