"""Ladder tables in Markdown, the README's course map and the chapter pages under docs/, generated from
the registry, the curriculum (workbench/curriculum.py) and ``results/``.

The README's course map lies between ``<!-- course -->`` and ``<!-- /course -->``: a row per chapter with
its primary variant's best stage against the best library peer, linking the chapter's page
``docs/NN_<slug>.md``, which holds each variant's table and committed figures. A new operator therefore
appears without anyone editing the README: `workbench table --update-readme` writes both.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import curriculum, paths, profiles, registry, results
from .bench import peak_key, percent_of_peak
from .bench import stage_precision as bench_stage_precision
from .ladder import AXES, Operator, size_label


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


STREAMS = {"copy_gbps": "copy", "read_gbps": "read-only", "read2_write1_gbps": "two-reads-one-write"}


def peak_caption(op: Operator, peaks: dict) -> str:
    """The table's sentence on what "% of peak" divides by."""
    key = peak_key(op, peaks)
    if key is None or not peaks.get(key):
        return "% of peak is — (no peak of this precision measured yet)"
    if key in STREAMS:
        return f"% of peak is of the measured {STREAMS[key]} bandwidth, {peaks[key]:.0f} GB/s"
    precision = key.split("_")[1]
    return f"% of peak is of the measured cuBLAS {precision} rate, {peaks[key] / 1e3:.1f} TFLOP/s"


def teaches_host_time(stages: list[dict]) -> bool:
    """Does the ladder change what a call costs on the host, not on the GPU? Two consecutive stages with the
    same GPU time (within 3%), a host call at least twice that in one of them, and the host's share (host
    call minus GPU time) more than halved or doubled from one to the other (the launch-overhead ladder: four
    ways of launching the same kernels). Then the table shows the host call beside the GPU time."""
    for a, b in zip(stages, stages[1:]):
        if not (a.get("host_call_us") and b.get("host_call_us")):
            continue
        same_gpu = abs(a["median_us"] / b["median_us"] - 1) <= 0.03
        host_a, host_b = (max(r["host_call_us"] - r["median_us"], 1e-3) for r in (a, b))
        host_bound = max(a["host_call_us"] / a["median_us"], b["host_call_us"] / b["median_us"]) >= 2
        if same_gpu and host_bound and max(host_a / host_b, host_b / host_a) > 2:
            return True
    return False


def ladder_table(op: Operator, data: dict) -> str:
    """Markdown table of a ladder at its headline size, from one recorded results file."""
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    stages = sorted((r for r in recs if r.get("kind") == "stage"), key=lambda r: r["order"])
    peers = [r for r in recs if r.get("kind") == "peer"]
    if not stages:
        elsewhere = figures_elsewhere(op)
        if elsewhere:
            return elsewhere
        return f"_no recorded figures for {op.name} yet: `workbench bench {op.name}` on a GPU records them_\n"
    # "vs peer" compares with the strongest peer recorded at this size (the fastest library call, eager
    # torch or torch.compile); every peer keeps its own row, timed against that strongest one.
    strongest = min(peers, key=lambda r: r["median_us"]) if peers else None
    first = stages[0]
    v = first["versions"]
    torch = f", torch {v['torch']}" if "torch" in v else ""
    host = teaches_host_time(stages)
    lines = [f"{op.title}, {first['size_label']} {first['dtype']} on **{data['device']}**, "
             f"{max(r['date'] for r in stages)[:10]} (numba-cuda {v.get('numba_cuda')}, numba {v.get('numba')}{torch}); "
             f"{peak_caption(op, data.get('peaks') or {})}"
             + ("; host call µs is the time of one call from Python, launch included" if host else "") + ".", "",
             "| # | stage | median µs | " + ("host call µs | " if host else "") + "GB/s | GFLOP/s | % of peak | vs best peer |",  # the peer row at 1.00x
             "|---|---|---:|" + ("---:|" if host else "") + "---:|---:|---:|---:|"]
    peaks_ = data.get("peaks") or {}

    def host_cell(r):
        return f"{r['host_call_us']:.1f} | " if host else ""

    for r in stages:
        peer = strongest or r.get("peer")
        ratio = f"{peer['median_us'] / r['median_us']:.2f}x" if peer else "—"
        pct = percent_of_peak(op, r["gbps"], r["gflops"], peaks_, r["stage"])
        lines.append(f"| {r['order']} | {stage_words(op, r['stage'])} | {r['median_us']:.1f} | {host_cell(r)}{r['gbps']:.0f} | "
                     f"{r['gflops']:.0f} | {_fmt(pct, '.0f')} | {ratio} |")
    for r in peers:
        pct = percent_of_peak(op, r["gbps"], r["gflops"], peaks_)
        lines.append(f"| — | {peer_name(r['stage'])} (library) | {r['median_us']:.1f} | {host_cell(r)}{r['gbps']:.0f} | "
                     f"{r['gflops']:.0f} | {_fmt(pct, '.0f')} | {strongest['median_us'] / r['median_us']:.2f}x |")
    if not any(r["stage"] == "torch.compile" for r in peers):
        lines += compiled_elsewhere(op, stages[-1])
    return "\n".join(lines) + "\n"


COMPILE_RUN = ("runs", "gpu_compile_peer.json")  # an earlier run that timed torch.compile of each expression alone


def compiled_elsewhere(op: Operator, at: dict) -> list[str]:
    """A note under a table whose run timed no torch.compile: what torch.compile took at the same size in
    the run that timed it alone. It is not a ratio in the table, as ratios come from one run; but a table
    that says "2x torch" where torch.compile is faster than the last stage must say so."""
    path = results.results_dir().joinpath(*COMPILE_RUN)
    if not path.exists():
        return []
    run = json.loads(path.read_text())
    compiled = [r for row in run.get("rows", []) for r in row.get("records", [])
                if r.get("op") == op.name and r.get("stage") == "torch.compile" and r.get("size") == at["size"]]
    if not compiled:
        return []
    c = compiled[0]
    return ["", f"_torch.compile of the same expression was timed in another run "
                f"(`results/{'/'.join(COMPILE_RUN)}`, {c['date'][:10]}, {c.get('device', '?')}): {c['median_us']:.1f} µs "
                f"at {c['size_label']}, against {at['median_us']:.1f} µs for `{at['stage']}` here. It has no ratio "
                "in this table, as a table's ratios come from one run._"]


def recorded_table(op: Operator) -> str:
    """The table from the newest recorded file that has this operator (a note if none has)."""
    data = results.latest_file_with(op.name)
    return ladder_table(op, data) if data is not None else ladder_table(op, {"records": []})


# -- figures measured across GPUs: the all-reduce's run (workbench/tools/allreduce.py) ----------------------

# Stage kernels changed after the recorded run: the README says so under its table until the next run.
CHANGED_SINCE_RUN: dict[str, str] = {}  # stage -> what changed (none: the run is of the committed kernels)


def figures_elsewhere(op: Operator) -> str | None:
    """The markdown table of an operator measured across GPUs, from the run file its
    ``Operator.figures_elsewhere`` names (under results/), or None where no run of two GPUs or more is
    recorded."""
    run = multi_gpu_run(op)
    if run is None:
        return None
    if op.name == "allreduce":
        return allreduce_table(op, run)
    return fused_allreduce_table(op, run) if run.get("fused") else None


def multi_gpu_run(op: Operator) -> dict | None:
    """The recorded run of an operator measured across GPUs (``Operator.figures_elsewhere``), or None where
    there is none of two GPUs or more."""
    path = results.results_dir() / op.figures_elsewhere if op.figures_elsewhere else None
    run = json.loads(path.read_text()) if path and path.exists() else None
    return run if run and run.get("ranks", 1) >= 2 else None


def bytes_label(nbytes: int) -> str:
    """A message size as the all-reduce's tables and figures name it: 4 KB, 16 MB, 1 GB."""
    return f"{nbytes >> 30} GB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def bus_gbps(nbytes: int, ranks: int, us: float | None) -> float | None:
    """nccl-tests' bus bandwidth of an all-reduce of ``nbytes`` a rank in ``us``: 2(N-1)/N x bytes / time."""
    return 2 * (ranks - 1) / ranks * nbytes / (us * 1e-6) / 1e9 if us else None


def elsewhere_stage_line(op: Operator, stage: str) -> str | None:
    """One sentence of a stage's figures in the run of several GPUs (the smallest and largest message, or
    every shape, against the peer), or None where the run has none for it."""
    run = multi_gpu_run(op)
    if run is None:
        return None
    where = f"`{stage}` on {run['ranks']} x {run['device']} (`results/{op.figures_elsewhere}`)"
    nccl = run.get("nccl") or {}
    if op.name == "allreduce":
        mine = {r["bytes"]: r["gpu_us"] for r in run["stages"] if r["stage"] == stage and "gpu_us" in r and r.get("correct")}
        theirs = {r["bytes"]: r["gpu_us"] for r in nccl.get("allreduce", []) if "gpu_us" in r}
        if not mine:
            return None
        small, large, n = min(mine), max(mine), run["ranks"]
        peer = (f" (NCCL {theirs[small]:.1f})" if small in theirs else "",
                f" (NCCL {bus_gbps(large, n, theirs[large]):.0f})" if large in theirs else "")
        return (f"{where}: {mine[small]:.1f} µs a call at {bytes_label(small)}{peer[0]}, "
                f"{bus_gbps(large, n, mine[large]):.0f} GB/s bus bandwidth at {bytes_label(large)}{peer[1]}.")
    mine = {(r["rows"], r["cols"]): r["gpu_us"] for r in run.get("fused", []) if r["stage"] == stage and "gpu_us" in r and r.get("correct")}
    theirs = {(r["rows"], r["cols"]): r["gpu_us"] for r in nccl.get("fused", []) if "gpu_us" in r}
    if not mine:
        return None
    shapes = sorted(mine)
    return (f"{where}, µs a call at " + " / ".join(f"{r}x{c}" for r, c in shapes) + ": "
            + " / ".join(f"{mine[s]:.1f}" for s in shapes)
            + (" (NCCL + add + torch RMSNorm " + " / ".join(f"{theirs[s]:.1f}" for s in shapes) + ")."
               if all(s in theirs for s in shapes) else "."))


def _run_heading(op: Operator, run: dict, what: str) -> str:
    v = run.get("versions", {})
    return (f"{what}, {run['ranks']} x **{run['device']}**{', ' + run['date'][:10] if run.get('date') else ''} "
            f"(numba-cuda {v.get('numba_cuda')}, torch {v.get('torch')}), measured by `workbench record` on "
            f"{run['ranks']} GPUs (`results/{op.figures_elsewhere}`): GPU time per call in µs")


def _since_the_run(op: Operator, names: list) -> list[str]:
    """The notes under a recorded table: stages added since the run, and stages whose kernel changed."""
    notes = [f"`{stage}` changed after this run ({what}): its figures are the earlier kernel's."
             for stage, what in CHANGED_SINCE_RUN.items() if stage in names]
    missing = [s.name for s in op.stages if s.name not in names]
    if missing:
        notes.append(f"Not in this run (added since, not yet timed on several GPUs): {', '.join(missing)}.")
    return ["", "_" + " ".join(notes) + "_"] if notes else []


def allreduce_table(op: Operator, run: dict) -> str:
    """Per message size: each stage's GPU µs beside NCCL's, then the same as bus bandwidth (2(N-1)/N bytes
    over the time): two narrow tables rather than one too wide to read."""
    n, names = run["ranks"], list(dict.fromkeys(r["stage"] for r in run["stages"]))
    by = {(r["stage"], r["bytes"]): r for r in run["stages"] if "gpu_us" in r and r.get("correct")}
    nccl = {r["bytes"]: r for r in (run.get("nccl") or {}).get("allreduce", []) if "gpu_us" in r}

    def microseconds(r, nbytes):
        return f"{r['gpu_us']:.1f}" if r else "—"

    def bus_bandwidth(r, nbytes):
        return f"{bus_gbps(nbytes, n, r['gpu_us']):.3g}" if r else "—"

    def table(cell) -> list[str]:
        lines = ["| bytes per GPU | " + " | ".join(names) + " | NCCL |", "|---:|" + "---:|" * (len(names) + 1)]
        for nbytes in run["sizes"]:
            lines.append(f"| {bytes_label(nbytes)} | " + " | ".join(cell(by.get((s, nbytes)), nbytes) for s in names)
                         + f" | {cell(nccl.get(nbytes), nbytes)} |")
        return lines

    lines = ([_run_heading(op, run, "AllReduce of float32 buffers") + ":", ""] + table(microseconds)
             + ["", "The same calls as bus bandwidth, GB/s (2(N-1)/N of the bytes over the time, NCCL's measure):",
                ""] + table(bus_bandwidth))
    return "\n".join(lines + _since_the_run(op, names)) + "\n"


def fused_allreduce_table(op: Operator, run: dict) -> str:
    """Per (tokens, hidden): each stage's GPU µs beside NCCL + torch.add + RMSNorm, torch's and (where the run
    timed it) the workbench's."""
    names = list(dict.fromkeys(r["stage"] for r in run["fused"]))
    by = {(r["stage"], r["rows"], r["cols"]): r for r in run["fused"] if "gpu_us" in r and r.get("correct")}
    base = {(r["rows"], r["cols"]): r for r in (run.get("nccl") or {}).get("fused", []) if "gpu_us" in r}
    peers = [("NCCL+torch", "gpu_us")]
    if any("workbench_rmsnorm_gpu_us" in b for b in base.values()):
        peers.append(("NCCL+workbench", "workbench_rmsnorm_gpu_us"))
    lines = [_run_heading(op, run, "AllReduce + residual + RMSNorm") + ". NCCL+torch: NCCL's all-reduce, "
             "torch.add and torch's RMSNorm; NCCL+workbench: the same with the workbench's RMSNorm.", "",
             "| tokens x hidden | " + " | ".join(names + [label for label, _ in peers]) + " |",
             "|---|" + "---:|" * (len(names) + len(peers))]
    for rows, cols in sorted({(r["rows"], r["cols"]) for r in run["fused"]}):
        cells = [f"{by[(s, rows, cols)]['gpu_us']:.1f}" if (s, rows, cols) in by else "—" for s in names]
        b = base.get((rows, cols), {})
        cells += [f"{b[key]:.1f}" if key in b else "—" for _, key in peers]
        lines.append(f"| {rows}x{cols} | " + " | ".join(cells) + " |")
    return "\n".join(lines + _since_the_run(op, names)) + "\n"


# -- the README --------------------------------------------------------------------------------------

def between(text: str, name: str) -> tuple[str, str, str] | None:
    """Split ``text`` at ``<!-- name -->`` ... ``<!-- /name -->``: (head, body, tail), or None."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    if start not in text or end not in text.split(start, 1)[1]:
        return None
    head, rest = text.split(start, 1)
    body, tail = rest.split(end, 1)
    return head + start, body, end + tail


def replace_between(text: str, name: str, body: str) -> str | None:
    parts = between(text, name)
    return None if parts is None else f"{parts[0]}\n{body}{parts[2]}"


def committed_plots(op: Operator) -> list[Path]:
    """The committed figures of an operator that its chapter's page shows, in a fixed order."""
    return [p for kind in ("staircase", "latency", "roofline")
            if (p := paths.COMMITTED_PLOTS_DIR / f"{op.slug}_{kind}.png").exists()]


# -- the course: best stage against the best peer ------------------------------------------------------

def best_against_peer(op: Operator) -> dict | None:
    """``op``'s fastest stage at its headline size against its strongest library peer, from the newest
    recorded file that has it (as the ladder table compares them): {'stage', 'percent', 'peer', 'ratio'},
    the last three None where there is no peak or peer; None where nothing is recorded."""
    from . import plots  # matplotlib: only for what needs it, not for every command that formats a table

    if op.figures_elsewhere:
        return _best_in_the_run(op)
    data = results.latest_file_with(op.name)
    best, peer = plots.best_stage(op, data) if data else (None, None)
    if best is None:
        return None
    precision = bench_stage_precision(op, best["stage"])
    return {"stage": best["stage"], "precision": precision,
            "percent": percent_of_peak(op, best["gbps"], best["gflops"], data.get("peaks") or {}, best["stage"]),
            "peer": peer["stage"] if peer else None,
            "ratio": peer["median_us"] / best["median_us"] if peer else None}


def _best_in_the_run(op: Operator) -> dict | None:
    """best_against_peer for an operator measured across GPUs, from its run: the fastest stage at the run's
    largest message (or shape) against NCCL there (the unfused epilogue with torch's RMSNorm for the fused
    operator); % of peak: its bus bandwidth over the links' measured ceiling, SM stores both ways."""
    run = multi_gpu_run(op)
    if run is None:
        return None
    nccl = run.get("nccl") or {}
    if op.name == "allreduce":
        largest = max(run["sizes"])
        mine = {r["stage"]: r["gpu_us"] for r in run["stages"] if r["bytes"] == largest and r.get("correct") and "gpu_us" in r}
        theirs = next((r["gpu_us"] for r in nccl.get("allreduce", []) if r["bytes"] == largest and "gpu_us" in r), None)
        peer = "NCCL"
    else:
        largest = max((r["rows"], r["cols"]) for r in run["fused"])
        mine = {r["stage"]: r["gpu_us"] for r in run["fused"] if (r["rows"], r["cols"]) == largest
                and r.get("correct") and "gpu_us" in r}
        theirs = next((r["gpu_us"] for r in nccl.get("fused", []) if (r["rows"], r["cols"]) == largest and "gpu_us" in r),
                      None)
        peer = "NCCL + torch"
    if not mine:
        return None
    stage = min(mine, key=mine.get)
    ceiling = (run.get("ceiling") or {}).get("sm_push_gbps_each_way")
    n = run["ranks"]
    percent = 100 * bus_gbps(largest, n, mine[stage]) / ceiling if op.name == "allreduce" and ceiling else None
    return {"stage": stage, "precision": None, "percent": percent, "peer": peer if theirs else None,
            "ratio": theirs / mine[stage] if theirs else None}


def stage_words(op: Operator, stage: str) -> str:
    """A stage as the tables name it: with its arithmetic's precision where that is not the operator's own
    ("split_k (TF32)"), so a ratio to a float32 library is read for what it is."""
    precision = bench_stage_precision(op, stage)
    return f"{stage} ({precision.upper()})" if precision else stage


def peer_name(name: str) -> str:
    """A library peer as torch code names it: ``F.gelu`` for ``torch.nn.functional.gelu`` (tables stay
    within 100 columns)."""
    return name.replace("torch.nn.functional.", "F.")


def peer_words(found: dict | None) -> str:
    """'1.52x torch.compile': the best stage's time ratio to the strongest peer (above 1x: faster than the
    library); or a dash."""
    if found is None or found["ratio"] is None:
        return "—"
    return f"{found['ratio']:.2f}x {peer_name(found['peer'])}"


def against_peer_words(found: dict | None, brief: bool = False) -> str:
    """'`rows_in_flight` 1.52x torch.compile', or a dash; ``brief``: the peer's name without what its
    parentheses add ("torch.conv_transpose2d", not "... (cuDNN fp32)"), as the course map shows it."""
    if found is None:
        return "—"
    words = peer_words(found)
    stage = f"`{found['stage']}`" + (f" ({found['precision'].upper()})" if found.get("precision") else "")
    return f"{stage} " + (re.sub(r" \(.*\)$", "", words) if brief else words)


def percent_words(found: dict | None) -> str:
    return "—" if found is None or found["percent"] is None else f"{found['percent']:.0f}%"


def variants_table(names) -> str:
    """Operators side by side (a chapter's variants): each one's best stage, its time ratio to its strongest
    peer and its % of peak, at each operator's own headline size (Markdown; the rates are in the ladder
    tables)."""
    ops = registry.load_operators()
    lines = ["| operator | best stage | vs best peer | % of peak |", "|---|---|---|---:|"]
    for name in names:
        found = best_against_peer(ops[name])
        stage = f"`{found['stage']}`" if found else "—"
        lines.append(f"| `{name}` | {stage} | {peer_words(found)} | {percent_words(found)} |")
    return "\n".join(lines) + "\n"


def served_words(served: list, among: list) -> str:
    """Which of ``among`` (a chapter's operators) a stage serves, in the fewest words: 'every variant',
    'dtype fp16, bf16', 'function gelu x dtype fp16, bf16', '... except `activation[tanh,fp16]`', 'all but
    `softmax`', or the names."""
    if len(served) == len(among):
        return "every variant" if len(among) > 1 else f"`{among[0].name}`"
    names = lambda ops: ", ".join(f"`{op.name}`" for op in ops)  # noqa: E731
    if len(served) == 1:
        return names(served)
    if len({op.family for op in among}) == 1:  # one family: say it by the values of its axes
        axes = [a for a in AXES if len({op.variant.get(a, AXES[a]) for op in among}) > 1]
        chosen = {a: [] for a in axes}
        for op in served:
            for a in axes:
                if op.variant.get(a, AXES[a]) not in chosen[a]:
                    chosen[a].append(op.variant.get(a, AXES[a]))
        inside = [op for op in among if all(op.variant.get(a, AXES[a]) in chosen[a] for a in axes)]
        narrowed = [a for a in axes if len(chosen[a]) < len({op.variant.get(a, AXES[a]) for op in among})]
        exceptions = [op for op in inside if op not in served]
        if narrowed and len(exceptions) <= 2:
            words = " x ".join(f"{a} {', '.join(chosen[a])}" for a in narrowed)
            return words + (f", except {names(exceptions)}" if exceptions else "")
    missing = [op for op in among if op not in served]
    if len(missing) < len(served) and len(missing) <= 3:
        return "all but " + names(missing)
    return names(served)


def stages_served_table(names) -> str:
    """Which variants each stage serves (Markdown): a stage written once for several variants (the 16-bit
    formats, every activation) is one row; the stage's paragraph says why the others lack it."""
    ops = registry.load_operators()
    among = [ops[name] for name in names]
    lines = ["| stage | serves |", "|---|---|"]
    lines += [f"| `{stage}` | {served_words(served, among)} |" for stage, served in registry.stages_served(among)]
    return "\n".join(lines) + "\n"


# -- the README's course map and the chapter pages under docs/ ------------------------------------------

def link(text: str, target: str) -> str:
    return f"[{text}]({target})"


def course_map() -> str:
    """The course as one Markdown table, its links relative to the README: each chapter (linking its page
    under docs/), its Part, its primary variant's best stage against the best peer, % of peak, and its
    notebook; core chapters starred."""
    ops = registry.load_operators()
    lines = ["| chapter | Part | best stage vs best peer | % peak | targets | notebook |",
             "|---|---|---|---:|---|---|"]
    for ch in registry.chapters():
        found = best_against_peer(ops[ch.primary])
        star = " ★" if ch.core else ""
        lines.append(f"| {link(f'{ch.number} {ch.slug}', ch.page)}{star} | {ch.part} | "
                     f"{against_peer_words(found, brief=True)} | {percent_words(found)} | {targets_words(ch.operators)} | "
                     f"{link('notebook', 'notebooks/' + ch.notebook)} |")
    return "\n".join(lines) + "\n"


def targets_words(names) -> str:
    """'2/3' (met of declared) for the targets the operators ``names`` declare (workbench.targets, judged on the
    records), '—' where they declare none: the course map's column."""
    from .targets import MET, NEVER, verdicts

    ops = registry.load_operators()
    found = verdicts([ops[n] for n in names])
    if not found:
        return "—"
    met, never = sum(v.status == MET for v in found), sum(v.status == NEVER for v in found)
    return f"{met}/{len(found)}" + (f" ({never} unmeasured)" if never else "")


def targets_table(names) -> str:
    """Each declared target of the operators ``names``, the figure the records give and the verdict: what
    `workbench targets` prints, as Markdown ('' where none is declared)."""
    from .targets import verdicts

    ops = registry.load_operators()
    found = verdicts([ops[n] for n in names])
    if not found:
        return ""
    lines = ["| operator | target | figure | verdict |", "|---|---|---:|---|"]
    for v in found:
        figure = "—" if v.value is None else (f"{v.value:.2f}x" if v.unit == "x" else f"{v.value:.0f}%")
        lines.append(f"| `{v.op}` | {v.target} | {figure} | {v.status} |")
    return "\n".join(lines) + "\n"


def parts_line() -> str:
    """'Parts: 1 Foundations · 2 Rows · ...' (the Parts that hold a chapter)."""
    present = {ch.part for ch in registry.chapters()}
    return "Parts: " + " · ".join(f"{p.number} {p.title}" for p in curriculum.PARTS if p.number in present)


def chapter_page(ch) -> str:
    """docs/NN_<slug>.md: what the chapter teaches, then each variant's table and committed figures."""
    ops = registry.load_operators()
    by_number = {c.number: c for c in registry.chapters()}
    part = curriculum.part(ch.part)
    pre = ", ".join(link(f"{n} {by_number[n].slug}", f"{by_number[n].stem}.md") for n in ch.prerequisites)
    out = [f"# {ch.number}. {ch.title}", "",
           f"Part {part.number}, {part.title}" + (" · on the core path ★" if ch.core else "")
           + (f" · about {ch.minutes} minutes" if ch.minutes else "")
           + (f" · after {pre}" if pre else "") + " · notebook "
           + link(ch.notebook, f"../notebooks/{ch.notebook}") + " · " + link("course map", "../README.md"), ""]
    if ch.unfiled:
        out += [curriculum.unfiled_note(ch), ""]
    else:
        out += ["It answers:", ""] + [f"- {q}" for q in ch.teaches] + [""]
    for family, others in registry.family_elsewhere(ch):
        out += [f"The `{family}` family continues in " + ", ".join(link(f"{c.number} {c.slug}", f"{c.stem}.md")
                                                               for c in others) + ".", ""]
    if len(ch.operators) > 1:
        out += [f"Its variants, by {ch.axes}, each at its own headline size:", "", variants_table(ch.operators),
                "Which variants each stage serves (each stage's paragraph says why):", "",
                stages_served_table(ch.operators)]
    goals = targets_table(ch.operators)
    if goals:
        out += ["Its targets, judged on the records (`workbench targets` prints the same):", "", goals]
    for name in ch.operators:
        op = ops[name]
        out += [f"## `{name}`: {op.title}", "", f"`solutions/{registry.short_module_name(op)}.py`", "",
                recorded_table(op).rstrip("\n"), ""]
        figures = committed_plots(op)
        if figures:
            out += [f"![{name} {p.stem.rsplit('_', 1)[1]}](../{p.relative_to(paths.REPO_ROOT).as_posix()})"
                    for p in figures] + [""]
    return "\n".join(out)


def docs_pages() -> dict[str, str]:
    """{path under the checkout: text} for every chapter's page."""
    return {ch.page: chapter_page(ch) for ch in registry.chapters()}


def core_path_line() -> str:
    """'★ The core path (13 chapters, about 13 hours): 11 → 13 → ...'."""
    core = [ch for ch in registry.chapters() if ch.core]
    hours = sum(ch.minutes for ch in core) / 60
    return (f"★ The core path ({len(core)} chapters, about {hours:.0f} hours): "
            + " → ".join(str(ch.number) for ch in core) + ".")


def render_readme(text: str) -> str:
    """README text with its generated course map made anew (unchanged text if it has no markers)."""
    new = replace_between(text, "course", f"{parts_line()}.\n\n{course_map()}\n{core_path_line()}\n")
    return text if new is None else new


def _write(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def update_readme(readme: Path | None = None) -> str:
    """Rewrite the README's course map and, beside it, the chapter pages it links (docs/; pages of
    chapters that no longer exist removed): "updated", "unchanged" or "no-markers"."""
    readme = Path(readme or paths.README)
    text = readme.read_text()
    if between(text, "course") is None:
        return "no-markers"
    changed = _write(readme, render_readme(text))
    root = readme.parent
    pages = docs_pages()
    for rel, page in pages.items():
        changed |= _write(root / rel, page)
    for old in sorted((root / "docs").glob("[0-9][0-9]_*.md")):
        if old.relative_to(root).as_posix() not in pages:
            old.unlink()
            changed = True
    return "updated" if changed else "unchanged"


# -- recorded Nsight Compute counters (`workbench profile`, the notebooks) ------------------------------------

PROFILE_COLUMNS = ("stage", "size", "kernels", "µs", "DRAM % peak", "occupancy %", "regs", "smem B", "L1 hit %",
                   "L2 hit %", "instructions", "top stalls (cycles/instr)")


def _counter(v, spec):
    return "—" if not isinstance(v, (int, float)) else format(v, spec)


def profile_rows(records: list[dict]) -> list[list[str]]:
    """A row per stage of an operator's recorded counters (its kernels summed), in PROFILE_COLUMNS order."""
    rows = []
    for r in profiles.stage_totals(records):
        stalls = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in r["top_stalls"])
        rows.append([profiles.row_label(r), size_label(r["size"]), str(r["kernels"]),
                     _counter(r["duration_ns"] / 1e3, ".1f"), _counter(r["dram_pct_of_peak"], ".0f"),
                     _counter(r["occupancy_pct"], ".0f"), _counter(r["registers"], "d"),
                     _counter(r["shared_bytes"], "d"), _counter(r["l1_hit_pct"], ".0f"),
                     _counter(r["l2_hit_pct"], ".0f"), _counter(r["instructions"], ".3g"), stalls or "—"])
    return rows


def profile_title(device: str, records: list[dict]) -> str:
    return f"{records[0]['op']} on {device} (Nsight Compute, --clock-control none)"


def profile_table(device: str, records: list[dict]):
    """The same rows as a rich Table, for the terminal."""
    from rich.table import Table

    table = Table(title=profile_title(device, records), title_justify="left")
    for col in PROFILE_COLUMNS:
        table.add_column(col, justify="left" if col in ("stage", "top stalls (cycles/instr)") else "right")
    for row in profile_rows(records):
        table.add_row(*row)
    return table
