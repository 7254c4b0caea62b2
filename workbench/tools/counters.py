"""``workbench counters OP[.STAGE] [--size S] [--json] [--against-recorded]``: the profiler's counters,
counted in the simulator.

For each stage, run once at a simulator size (default: the operator's largest), a table per
kernel of its source lines, the worst first: each global load or store with its 32-byte sectors per
request against the ideal, each shared-memory access with its wavefronts per request (bank conflicts),
each branch with how often it split a warp; then the kernel's totals (active lanes per instruction,
barriers, atomics, bytes touched against the stage's bytes model). No GPU needed: on a GPU machine the
counting runs in a child process in the simulator. Exit status: 0 done, 1 a stage could not be run
(or failed its check), 2 a bad argument.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .. import device as _device
from .. import profiles, registry, sizes
from ..ladder import size_label

TOP_LINES = 12  # rows per kernel table, the worst first (--json has them all)


def cmd_counters(args) -> int:
    from ..console import console as Console

    console, err = Console(), Console(stderr=True)
    op, stages = registry.resolve(args.target)
    try:
        size = sizes.check_size(op, args.size) if args.size else profiles.counter_size(op)
    except sizes.SizeError as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    if not _device.is_simulator():  # the counting needs the simulator's view of every access
        argv = [sys.executable, "-m", "workbench", "counters", args.target] + (
            ["--size", size_label(size)] if args.size else [])
        argv += ["--json"] * args.json + ["--against-recorded"] * args.against_recorded
        return subprocess.run(argv, env=dict(os.environ, WORKBENCH_MODE="sim")).returncode
    if args.against_recorded:
        return print_against_recorded(console, err, args.target, stages)
    warning = sizes.simulator_warning(op, size)
    if warning:
        err.print(f"[yellow]{warning}[/]")
    failed = False
    documents = []
    for stage in stages:
        if stage.gpu_only:
            err.print(f"{stage.key}: not counted, the simulator cannot run it ({stage.gpu_only})")
            continue
        counted = profiles.simulated(stage, size)
        failed |= counted.status != "passed"
        if args.json:
            documents.append(profiles.simulated_as_dict(counted))
        else:
            print_counted(console, counted)
    if args.json:
        print(json.dumps(documents, indent=1))
    return 1 if failed else 0


def print_against_recorded(console, err, target, stages) -> int:
    """A Markdown table of the simulator's figures against Nsight Compute's, for every stage of ``stages``
    with counters recorded by `workbench profile --counters`, at the size they were recorded at."""
    names = {(stage.op.name, stage.name): stage for stage in stages if not stage.gpu_only}
    recorded = {key: metrics for key, metrics in profiles.recorded_counters().items() if key[:2] in names}
    if not recorded:
        err.print(f"[yellow]no Nsight Compute counters recorded for {target}[/] in {profiles.profiles_dir()}: "
                  f"`workbench profile --counters {target}` on a GPU records them")
        return 1
    console.print("| stage | size | figure | simulator | Nsight Compute | within 10% |\n|---|---|---|---:|---:|---|",
                  highlight=False, markup=False)
    for (op_name, stage_name, size), metrics in sorted(recorded.items(), key=lambda kv: names[kv[0][:2]].order):
        for row in profiles.compare_counters(profiles.simulated(names[(op_name, stage_name)], size), metrics):
            console.print(f"| {row['stage']} | {size_label(size)} | {row['figure']} | {row['simulator']:.2f} | "
                          f"{row['recorded']:.2f} | {'yes' if row['agree'] else 'no'} |", highlight=False, markup=False)
    return 0


def print_counted(console, counted) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]{counted.stage.key}[/] @ {size_label(counted.size)} in the simulator: "
                  f"check {counted.status}" + (f" ({counted.message})" if counted.status != "passed" else ""))
    for kernel in counted.kernels:
        summary = profiles.kernel_summary(kernel)
        table = Table(title=f"{kernel.kernel} ({kernel.launches} launch{'es' if kernel.launches > 1 else ''})",
                      caption="per request: 32-byte sectors (global), wavefronts (shared), share split "
                              "(branch); eff: the ideal's share",
                      title_justify="left", caption_justify="left", highlight=False, box=box.SIMPLE_HEAD,
                      pad_edge=False)
        table.add_column("line: source", no_wrap=True, overflow="ellipsis", width=27)
        for column in ("access", "instr", "per req", "eff", "wasted"):
            table.add_column(column, justify="left" if column == "access" else "right", no_wrap=True,
                             width=13 if column == "access" else None,
                             min_width=len(column))
        for row in profiles.counter_rows(kernel)[:TOP_LINES]:
            table.add_row(f"{row['line']}: " + escape(row["source"]), row["what"], f"{row['requests']:,}",
                          f"{row['per_request']:.2f}", f"{row['efficiency_pct']:.0f}%", f"{row['wasted']:,}")
        console.print(table)
        console.print(f"  {summary['threads_per_instruction']:.1f} of 32 lanes active per line executed; "
                      f"{summary['branch_uniform_pct']:.0f}% of branches uniform; {summary['barriers']} block "
                      f"barriers; {summary['warp_intrinsics']} warp intrinsics; atomics (warp instructions): "
                      f"{summary.get('global_atomic_requests', 0)} global, {summary.get('shared_atomic_requests', 0)} "
                      "shared", highlight=False)
    console.print(f"  global bytes touched {counted.unique_global_bytes:,} (through L1 in whole sectors: "
                  f"{sum(k.l1_global_bytes for k in counted.kernels):,}); the bytes model says "
                  f"{counted.bytes_model:,}", highlight=False)


def add_cli(sub) -> None:
    """Add `workbench counters` to the CLI's subparsers."""
    s = sub.add_parser("counters", help="sectors per request, bank conflicts, divergence per source line, "
                                        "counted in the simulator", description=__doc__.split("\n\n")[0])
    s.add_argument("target", help="OP or OP.STAGE")
    s.add_argument("--size", type=sizes.size_arg, help="problem size (default: the largest simulator size)")
    s.add_argument("--json", action="store_true", help="print the counters of every line as JSON")
    s.add_argument("--against-recorded", action="store_true",
                   help="compare with the Nsight Compute counters `workbench profile --counters` recorded (Markdown)")
    s.set_defaults(func=cmd_counters)
