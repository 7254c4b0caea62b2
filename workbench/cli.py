"""``workbench``: list, check, bench, run, peaks, plot, table, ptx, doctor.

Every command exits non-zero on any failure, so scripts and CI can rely on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import device as _device

console = Console(stderr=False)
err = Console(stderr=True)


def _parse_size(text: str) -> tuple:
    try:
        return tuple(int(eval_int(p)) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 1000, 2**20 or 32768x4096; got {text!r}")


def eval_int(text: str) -> int:
    """'4096', '2**28', '1e6' -> int, without eval."""
    text = text.strip()
    if "**" in text:
        base, exp = text.split("**")
        return int(base) ** int(exp)
    if "^" in text:
        base, exp = text.split("^")
        return int(base) ** int(exp)
    return int(float(text)) if "e" in text else int(text)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True)


def _fmt(x, spec=".3g") -> str:
    return "—" if x is None else format(x, spec)


# -- list ----------------------------------------------------------------------------------------

def cmd_list(args) -> int:
    from .ladder import load_operators

    ops = load_operators()
    if args.json:
        print(json.dumps([{"op": op.name, "title": op.title, "stages": [
            {"name": s.name, "order": s.order, "summary": s.summary, "gpu_only": s.gpu_only} for s in op.stages]}
            for op in ops.values()], indent=1))
        return 0
    for op in ops.values():
        table = Table(title=f"{op.name}: {op.title}", show_lines=False, title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("stage")
        table.add_column("what changed and why")
        for s in op.stages:
            table.add_row(str(s.order), s.name + (" (GPU only)" if s.gpu_only else ""), s.summary)
        console.print(table)
    return 0


# -- check ---------------------------------------------------------------------------------------

def _run_checks(target: str, sizes, seed):
    from .check import check_stage, default_sizes
    from .ladder import resolve

    op, stages = resolve(target)
    sizes = sizes or default_sizes(op)
    results = []
    import numpy as np

    rng = np.random.default_rng(seed)
    with _progress() as prog:
        task = prog.add_task(f"checking {target}", total=len(stages) * len(sizes))
        for stage in stages:
            for size in sizes:
                prog.update(task, description=f"{stage.key} @ {'x'.join(map(str, size))}")
                results.append(check_stage(stage, size, rng))
                prog.advance(task)
    return op, results


def _print_checks(results) -> None:
    table = Table(title_justify="left")
    for col in ("stage", "size", "rel. error", "tolerance", "result"):
        table.add_column(col)
    for r in results:
        verdict = "[yellow]skip[/]" if r.skipped else ("[green]ok[/]" if r.passed else "[red]FAIL[/]")
        table.add_row(r.key, "x".join(map(str, r.size)), _fmt(r.rel_err), _fmt(r.tolerance, ".1g"),
                      verdict + (f" {r.message}" if r.message else ""))
    console.print(table)


def cmd_check(args) -> int:
    _device.announce()
    _, results = _run_checks(args.target, args.size, args.seed)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
    else:
        _print_checks(results)
    failed = [r for r in results if not r.passed]
    if failed:
        err.print(f"[red]{len(failed)} check(s) failed[/]")
    return 1 if failed else 0


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
    from .peaks import measure_peaks

    env = results.environment()
    path = results.path_for(env["device"])
    if not remeasure and path.exists():
        stored = results.load(path).get("peaks") or {}
        if stored.get("copy_gbps"):
            return stored
    err.print("measuring this device's peaks (copy bandwidth, library GEMM)...")
    peaks = measure_peaks()
    results.save_records(env["device"], [], peaks=peaks)
    return peaks


def _print_bench(records) -> None:
    table = Table(title_justify="left")
    for col in ("stage", "size", "median µs", "p10–p90 µs", "GB/s", "GFLOP/s", "% peak", "vs peer", "host call µs"):
        table.add_column(col, justify="right" if col not in ("stage",) else "left")
    for r in records:
        peer = r.get("peer")
        ratio = f"{peer['median_us'] / r['median_us']:.2f}x" if peer else "—"
        table.add_row(r["stage"] if r.get("kind") == "stage" else f"[red]{r['stage']}[/]", r["size_label"],
                      f"{r['median_us']:.1f}", f"{r['p10_us']:.1f}–{r['p90_us']:.1f}", f"{r['gbps']:.0f}",
                      f"{r['gflops']:.0f}", _fmt(r.get("pct_of_peak"), ".0f"), ratio, f"{r['host_call_us']:.0f}")
    console.print(table)


def _bench(target: str, sizes, seed, save: bool) -> tuple[list, list]:
    import numpy as np

    from . import results
    from .bench import bench_size
    from .ladder import resolve

    op, stages = resolve(target)
    peaks = _peaks_for_device()
    env = results.environment()
    sizes = sizes or op.bench_sizes
    rng = np.random.default_rng(seed)
    records, failures = [], []
    with _progress() as prog:
        task = prog.add_task(f"bench {target}", total=len(sizes) * (len(stages) + 1))

        def step(text):
            prog.update(task, description=text)
            prog.advance(task)

        for size in sizes:
            recs, fails = bench_size(op, stages, size, peaks, rng, env, step)
            records += recs
            failures += fails
            if save and recs:  # after every size: an interrupted run keeps what it measured
                results.save_records(env["device"], recs, peaks=peaks)
    return records, failures


def cmd_bench(args) -> int:
    if not _need_gpu("bench"):
        return 2
    from .ladder import load_operators, resolve

    targets = list(load_operators()) if args.target == "all" else [args.target]
    records, failures = [], []
    for target in targets:
        op, _ = resolve(target)
        sizes = args.size or ([op.headline_size] if args.quick else None)
        recs, fails = _bench(target, sizes, args.seed, save=not args.no_save)
        records += recs
        failures += fails
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        _print_bench(records)
    for f in failures:
        err.print(f"[red]FAIL[/] {f}")
    return 1 if failures else 0


def cmd_peaks(args) -> int:
    if not _need_gpu("peaks"):
        return 2
    peaks = _peaks_for_device(remeasure=True)
    if args.json:
        print(json.dumps(peaks, indent=1))
    else:
        console.print(f"copy bandwidth: {peaks['copy_gbps']:.0f} GB/s  "
                      f"({', '.join(f'{k} {v:.0f}' for k, v in peaks['copy_detail_gbps'].items())})")
        for k in ("gemm_fp32_gflops", "gemm_tf32_gflops", "gemm_fp16_gflops"):
            if k in peaks:
                console.print(f"{k.replace('_gflops', '')}: {peaks[k] / 1e3:.1f} TFLOP/s")
    return 0


# -- plot / table / run --------------------------------------------------------------------------

def _recorded(op_name: str, live_records=None) -> dict | None:
    from . import results

    data = results.latest_file_with(op_name)
    if data is None:
        err.print(f"[yellow]no recorded figures for {op_name} in {results.results_dir()}[/]")
    return data


def cmd_plot(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from .plots import save_all
    from .ladder import resolve

    op, _ = resolve(args.op)
    data = _recorded(op.name)
    if data is None:
        return 1
    metric = "gflops" if op.bound == "compute" else "gbps"
    for p in save_all(data, op.name, Path(args.out), metric=metric):
        console.print(f"wrote {p}")
    return 0


def ladder_table(op_name: str, data: dict) -> str:
    """Markdown table of a ladder at its headline size, from recorded results."""
    from .ladder import load_operators
    from .plots import headline

    op = load_operators()[op_name]
    recs = headline([r for r in data["records"] if r["op"] == op_name], op.headline_size)
    stages = sorted((r for r in recs if r.get("kind") == "stage"), key=lambda r: r["order"])
    peers_ = [r for r in recs if r.get("kind") == "peer"]
    if not stages:
        return f"_no recorded figures for {op_name}_\n"
    first = stages[0]
    v = first["versions"]
    lines = [f"{op.title}, {first['size_label']} {first['dtype']} on **{data['device']}**, "
             f"{max(r['date'] for r in stages)[:10]} (numba-cuda {v.get('numba_cuda')}, numba {v.get('numba')}"
             + (f", torch {v['torch']}" if 'torch' in v else "") + "); % of peak is of the "
             + (f"measured cuBLAS fp32 rate, {data['peaks'].get('gemm_fp32_gflops', float('nan')) / 1e3:.1f} TFLOP/s."
                if op.bound == "compute" else
                f"measured copy bandwidth, {data['peaks'].get('copy_gbps', float('nan')):.0f} GB/s."), "",
             "| # | stage | median µs | GB/s | GFLOP/s | % of peak | vs " + (peers_[0]["stage"] if peers_ else "peer") + " |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in stages:
        ratio = f"{r['peer']['median_us'] / r['median_us']:.2f}x" if r.get("peer") else "—"
        lines.append(f"| {r['order']} | {r['stage']} | {r['median_us']:.1f} | {r['gbps']:.0f} | {r['gflops']:.0f} | "
                     f"{_fmt(r.get('pct_of_peak'), '.0f')} | {ratio} |")
    for r in peers_:
        lines.append(f"| — | {r['stage']} (library) | {r['median_us']:.1f} | {r['gbps']:.0f} | {r['gflops']:.0f} | "
                     f"{_fmt(r.get('pct_of_peak'), '.0f')} | 1.00x |")
    return "\n".join(lines) + "\n"


def update_readme(op_name: str, table: str, readme: Path) -> bool:
    """Replace the text between <!-- ladder:OP --> and <!-- /ladder:OP --> in the README."""
    text = readme.read_text()
    start, end = f"<!-- ladder:{op_name} -->", f"<!-- /ladder:{op_name} -->"
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{table}{end}{tail}"
    if new != text:
        tmp = readme.with_suffix(".md.tmp")
        tmp.write_text(new)
        os.replace(tmp, readme)
    return True


def cmd_table(args) -> int:
    from .ladder import load_operators
    from .results import REPO_ROOT

    names = [args.op] if args.op else list(load_operators())
    status = 0
    for name in names:
        data = _recorded(name)
        if data is None:
            status = 1
            continue
        table = ladder_table(name, data)
        if args.update_readme:
            readme = Path(args.readme or REPO_ROOT / "README.md")
            if update_readme(name, table, readme):
                console.print(f"updated the {name} table in {readme}")
            else:
                err.print(f"[yellow]{readme} has no <!-- ladder:{name} --> markers[/]")
                status = 1
        else:
            print(table)
    return status


def cmd_run(args) -> int:
    """The main job: check the ladder, then (on a GPU) measure it, then draw it."""
    import matplotlib

    matplotlib.use("Agg")
    from .ladder import resolve
    from .plots import save_all

    _device.announce()
    op, _ = resolve(args.op)
    _, results_ = _run_checks(args.op, None, args.seed)
    _print_checks(results_)
    if any(not r.passed for r in results_):
        err.print("[red]checks failed: not timing a wrong kernel[/]")
        return 1
    status = 0
    if not _device.is_simulator():
        sizes = [op.headline_size] if args.quick else None
        records, failures = _bench(args.op, sizes, args.seed, save=True)
        _print_bench(records)
        status = 1 if failures else 0
    data = _recorded(op.name)
    if data is not None:
        metric = "gflops" if op.bound == "compute" else "gbps"
        for p in save_all(data, op.name, Path(args.out), metric=metric, live=not _device.is_simulator()):
            console.print(f"wrote {p}")
        if _device.is_simulator():
            console.print(f"plots show figures recorded on {data['device']} (see results/)")
    return status


def cmd_ptx(args) -> int:
    """Compile every kernel of the stages for sm_90 (no GPU needed) and report registers and spills."""
    if not _device.is_simulator():  # kernels are collected by running them in the simulator
        import subprocess

        env = dict(os.environ, WORKBENCH_MODE="sim")
        return subprocess.call([sys.executable, "-m", "workbench.cli", *sys.argv[1:]], env=env)
    from .ladder import resolve
    from .ptxcheck import check_stages

    _, stages = resolve(args.target)
    reports = check_stages(stages)
    table = Table(title_justify="left")
    for col in ("stage", "kernel", "registers", "spill B", "smem B", "result"):
        table.add_column(col)
    for r in reports:
        table.add_row(r.stage, r.kernel.rsplit(".", 1)[-1], _fmt(r.registers, "d"), _fmt(r.spill_bytes, "d"),
                      _fmt(r.shared_bytes, "d"), "[green]ok[/]" if r.ok else f"[red]FAIL[/] {r.message}")
    console.print(table)
    return 0 if all(r.ok for r in reports) else 1


# -- doctor --------------------------------------------------------------------------------------

def doctor_report() -> tuple[dict, list[str]]:
    import numba
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
    del numba
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

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="operators and their stages")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("check", help="correctness of OP or OP.STAGE against a float64 reference")
    s.add_argument("target")
    s.add_argument("--size", type=_parse_size, action="append", help="e.g. 1000 or 32768x4096 (repeatable)")
    s.add_argument("--seed", type=int)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("bench", help="check, time and record OP or OP.STAGE (or all) on the GPU")
    s.add_argument("target")
    s.add_argument("--size", type=_parse_size, action="append")
    s.add_argument("--quick", action="store_true", help="only the headline size")
    s.add_argument("--no-save", action="store_true", help="do not write results/")
    s.add_argument("--seed", type=int)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("run", help="the main job: check, bench (GPU), plot")
    s.add_argument("op")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--seed", type=int)
    s.add_argument("--out", default="results/plots")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("peaks", help="measure this device's copy bandwidth and library GEMM rates")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_peaks)

    s = sub.add_parser("plot", help="staircase, latency-vs-size and roofline from results/")
    s.add_argument("op")
    s.add_argument("--out", default="results/plots")
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser("table", help="markdown ladder table from results/ (--update-readme rewrites README)")
    s.add_argument("op", nargs="?")
    s.add_argument("--update-readme", action="store_true")
    s.add_argument("--readme")
    s.set_defaults(func=cmd_table)

    s = sub.add_parser("ptx", help="compile every kernel for sm_90 without a GPU; registers and spills")
    s.add_argument("target")
    s.set_defaults(func=cmd_ptx)

    s = sub.add_parser("doctor", help="GPU, driver, CUDA, numba and numpy versions; known-bad combinations")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_doctor)

    from .notebook import add_cli as add_notebooks_cli  # `workbench notebooks build [--execute]`

    add_notebooks_cli(sub)

    from .grade import add_cli as add_grade_cli  # `workbench grade ...` and `workbench exercises build|check`

    add_grade_cli(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyError as exc:
        err.print(f"[red]error:[/] {exc.args[0]}")
        return 2
    except KeyboardInterrupt:
        err.print("[red]interrupted[/] (results already written are intact)")
        return 130


if __name__ == "__main__":
    sys.exit(main())
