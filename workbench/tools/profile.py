"""``workbench profile OP[.STAGE] [--size S]``: Nsight Compute's counters for each stage, recorded.

On a GPU with ``ncu``: each stage runs in a child process (``python -m workbench.tools.target``), once to
warm up and once inside ``cuProfilerStart``/``cuProfilerStop``, under ``ncu --clock-control none
--profile-from-start off --csv --page raw --print-units base --metrics ...`` (the set in
``workbench.profiles.METRICS`` and the warp stall reasons; ``--clock-control none`` leaves the clocks as
the timings saw them). Every kernel of the stage becomes a record in ``results/profiles/<gpu>.json``;
then a table per stage and the sentences that explain the three largest steps of the staircase.

Without a GPU (or without ``ncu``) it prints the recorded profile. Exit status: 0 done, 1 a stage
could not be profiled (or nothing recorded to show), 2 a bad argument.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import device as _device
from .. import profiles, registry, sizes, tables
from ..ladder import as_size, size_label
from ..results import environment, now

NCU_TIMEOUT_S = 600


def find_ncu() -> str | None:
    for candidate in (os.environ.get("NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def ncu_command(ncu: str, target: str, size, with_stalls: bool, log: str, impl: str | None = None) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--print-units", "base", "--log-file", log, "--metrics", ",".join(profiles.metric_names(with_stalls)),
           sys.executable, "-m", "workbench.tools.target", target, "--size", size_label(size), "--warmup",
           "--profile-range"]
    return cmd + (["--impl", impl] if impl else [])


def profile_stage(ncu: str, stage, size, impl: str | None = None) -> tuple[list[dict], str]:
    """(kernel records, "" or why none) for one stage at one size."""
    env = dict(os.environ, WORKBENCH_MODE="gpu")
    why = ""
    for with_stalls in (True, False):  # an ncu that does not know a stall metric: the core set alone
        with tempfile.TemporaryDirectory() as tmp:
            log = str(Path(tmp) / "ncu.csv")
            run = subprocess.run(ncu_command(ncu, stage.key, size, with_stalls, log, impl), capture_output=True,
                                 text=True, env=env, timeout=NCU_TIMEOUT_S)
            text = Path(log).read_text() if Path(log).exists() else run.stdout
        kernels = profiles.parse_ncu_csv(text)
        if kernels:
            return kernels, ""
        why = " ".join(l for l in (text + run.stderr).splitlines() if "ERROR" in l or "error" in l)[-500:] \
            or f"ncu exited {run.returncode} and reported no kernel"
    return [], why


def records_for(stage, size, kernels: list[dict], ncu_version: str) -> list[dict]:
    date = now()
    return [{"op": stage.op.name, "stage": stage.name, "order": stage.order, "size": list(size), "kernel": k["kernel"],
             "launch": i, "metrics": k["metrics"], "stalls": k["stalls"], "date": date, "ncu": ncu_version}
            for i, k in enumerate(kernels)]


def _ncu_version(ncu: str) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def print_profile(console, device: str, records: list[dict]) -> None:
    console.print(tables.profile_table(device, records))
    for sentence in profiles.explain_steps(records):
        console.print(f"• {sentence}", highlight=False)


def cmd_profile(args) -> int:
    from rich.console import Console

    console, err = Console(), Console(stderr=True)
    op, stages = registry.resolve(args.target)
    ncu = find_ncu()
    if _device.is_simulator() or ncu is None:
        why = "no GPU here" if _device.is_simulator() else "no ncu (Nsight Compute) found: set $NCU or PATH"
        device, records = profiles.recorded(op.name)
        names = {s.name for s in stages}
        records = [r for r in records if r["stage"] in names]
        if not records:
            err.print(f"[yellow]{why}, and no recorded profile of {args.target}[/] in {profiles.profiles_dir()}: "
                      f"`workbench profile {args.target}` on a GPU with Nsight Compute records one")
            return 1
        err.print(f"{why}: the profile recorded on {device}")
        print_profile(console, device, records)
        return 0
    try:
        size = sizes.check_size(op, args.size) if args.size else as_size(op.headline_size)
    except sizes.SizeError as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    version = _ncu_version(ncu)
    device = environment()["device"]
    all_records, failed = [], []
    for stage in stages:
        err.print(f"profiling {stage.key} @ {size_label(size)} ...")
        kernels, why = profile_stage(ncu, stage, size, args.impl)
        if not kernels:
            failed.append(f"{stage.key}: {why}")
            continue
        recs = records_for(stage, size, kernels, version)
        all_records += recs
        if not args.no_save:
            profiles.save(device, recs)
    if all_records:
        print_profile(console, device, all_records)
    for f in failed:
        err.print(f"[red]not profiled[/] {f}", highlight=False)
    return 1 if failed or not all_records else 0


def add_cli(sub) -> None:
    """Add `workbench profile` to the CLI's subparsers."""
    s = sub.add_parser("profile", help="Nsight Compute counters per stage (DRAM %%, occupancy, stalls, ...), recorded",
                       description=__doc__.split("\n\n")[0])
    s.add_argument("target", help="OP or OP.STAGE")
    s.add_argument("--size", type=size_arg, help="problem size (default: the operator's headline size)")
    s.add_argument("--impl", help="profile a learner's launcher from this file instead of the answer key's")
    s.add_argument("--no-save", action="store_true", help="do not write results/profiles/")
    s.set_defaults(func=cmd_profile)


def size_arg(text: str):
    import argparse

    try:
        return sizes.parse_size(text)
    except sizes.SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
