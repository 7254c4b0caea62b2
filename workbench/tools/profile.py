"""``workbench profile OP[.STAGE]... [--size S] [--counters]``: Nsight Compute's counters for each stage, recorded.

On a GPU with ``ncu``: each stage runs in a child process (``python -m workbench.tools.target``), once to
warm up and once inside ``cuProfilerStart``/``cuProfilerStop``, under ``ncu --clock-control none
--profile-from-start off --csv --page raw --print-units base --metrics ...`` (the set in
``workbench.profiles.METRICS`` and the warp stall reasons; ``--clock-control none`` leaves the clocks as
the timings saw them). Every kernel of the stage becomes a record in ``results/profiles/<gpu>.json``;
then a table per stage and the sentences that explain the three largest steps of the staircase.

``--peers`` profiles the operator's library peers too (eager torch, cuBLAS/cuDNN/cuSPARSE behind it,
``torch.compile``'s generated kernels), at the same size in the same way, recorded beside the stages as
what they are measured against: the counters that say why a last stage is behind a library.

``--counters`` adds the sectors, requests, shared-memory wavefronts and bank conflicts and branch uniformity
that ``workbench counters`` counts in the simulator, at the size it counts at by default (the operator's
largest simulator size), and records them apart (``results/profiles/counters/<gpu>.json``: kernels that
small say nothing about speed), for ``tests/test_counters.py`` to hold the simulator to. A metric this ``ncu``
does not know is left out (and named) rather than losing the stage.

Without a GPU (or without ``ncu``) it prints the recorded profile. Exit status: 0 done, 1 a stage
could not be profiled (or nothing recorded to show), 2 a bad argument.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import device as _device
from .. import bench, profiles, registry, sizes, tables
from ..ladder import as_size, size_label
from ..results import environment, now

NCU_TIMEOUT_S = 600
MISSING_METRIC_RETRIES = 4  # profile again without the metrics ncu said it does not know, at most this often


def find_ncu() -> str | None:
    for candidate in (os.environ.get("NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def ncu_command(ncu: str, target: str, size, metrics: list[str], log: str, impl: str | None = None,
                peer: str | None = None) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--print-units", "base", "--log-file", log, "--metrics", ",".join(metrics),
           sys.executable, "-m", "workbench.tools.target", target, "--size", size_label(size), "--warmup",
           "--profile-range"]
    return cmd + (["--impl", impl] if impl else []) + (["--peer", peer] if peer else [])


def profile_stage(ncu: str, target: str, size, impl: str | None = None, counters: bool = False,
                  peer: str | None = None) -> tuple[list[dict], str]:
    """(kernel records, "" or why none) for one stage, ``target`` = OP.STAGE, at one size (or, with
    ``peer``, for that library peer of the operator ``target`` = OP). A metric this ncu does not know (its error names it) is left out
    and the run profiled again, so one missing metric costs only itself; then, failing that, the run
    is tried without the stall reasons."""
    env = dict(os.environ, WORKBENCH_MODE="gpu")
    why = ""
    for with_stalls in (True, False):
        metrics = profiles.metric_names(with_stalls, counters)
        for _ in range(MISSING_METRIC_RETRIES + 1):
            with tempfile.TemporaryDirectory() as tmp:
                log = str(Path(tmp) / "ncu.csv")
                run = subprocess.run(ncu_command(ncu, target, size, metrics, log, impl, peer), capture_output=True,
                                     text=True, env=env, timeout=NCU_TIMEOUT_S)
                text = Path(log).read_text() if Path(log).exists() else run.stdout
            kernels = profiles.parse_ncu_csv(text)
            if kernels:
                return kernels, ""
            errors = [l for l in (text + run.stdout + run.stderr).splitlines() if "ERROR" in l or "error" in l]
            why = " ".join(errors)[-500:] or f"ncu exited {run.returncode} and reported no kernel"
            unknown = [m for m in metrics if any(_named_in(m, line) for line in errors)]
            if not unknown or len(unknown) == len(metrics):  # nothing named, or an error about everything
                break
            metrics = [m for m in metrics if m not in unknown]
    return [], why


def _named_in(metric: str, line: str) -> bool:
    """Does ncu's message name this metric (in full, or its base name without the .sum/.pct/.ratio)? A
    whole name only: smsp__inst_executed is not named by a message about smsp__inst_executed_op_barrier."""
    base = metric.rsplit(".", 1)[0]
    return re.search(rf"(?<![\w.]){re.escape(base)}(?![\w])", line) is not None


def records_for(place: dict, size, kernels: list[dict], ncu_version: str) -> list[dict]:
    """One record per kernel, each with ``place``: the op, the stage and its order; a peer's name as its
    stage, order 0 and kind "peer", as bench's peer records are."""
    date = now()
    return [{**place, "size": list(size), "kernel": k["kernel"], "launch": i, "metrics": k["metrics"],
             "stalls": k["stalls"], "date": date, "ncu": ncu_version}
            for i, k in enumerate(kernels)]


def _ncu_version(ncu: str) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def print_profile(console, device: str, records: list[dict]) -> None:
    console.print(tables.profile_table(device, records))
    for sentence in profiles.explain_steps(records) + profiles.explain_against_peers(records):
        console.print(f"• {sentence}", highlight=False)


def cmd_profile(args) -> int:
    from ..console import console as Console

    console, err = Console(), Console(stderr=True)
    targets = [(target, *registry.resolve(target)) for target in args.target]
    ncu = find_ncu()
    if _device.is_simulator() or ncu is None:
        why = "no GPU here" if _device.is_simulator() else "no ncu (Nsight Compute) found: set $NCU or PATH"
        missing = 0
        for target, op, stages in targets:
            device, records = profiles.recorded(op.name)
            names = {s.name for s in stages}
            peer_records = [r for r in records if r.get("kind") == "peer"]  # shown beside any stage of theirs
            records = [r for r in records if r["stage"] in names and r.get("kind") != "peer"]
            if not records:
                err.print(f"[yellow]{why}, and no recorded profile of {target}[/] in {profiles.profiles_dir()}: "
                          f"`workbench profile {target}` on a GPU with Nsight Compute records one")
                missing += 1
                continue
            if args.size:  # the size asked for, never another one in its place
                at = [r for r in records if tuple(r["size"]) == tuple(args.size)]
                if not at:
                    shown = ", ".join(sorted({size_label(tuple(r["size"])) for r in records}))
                    err.print(f"[yellow]{why}, and no recorded profile of {target} at {size_label(args.size)}[/] "
                              f"(recorded at {shown}): `workbench profile {target} --size {size_label(args.size)}` "
                              "on a GPU with Nsight Compute records one")
                    missing += 1
                    continue
                records = at
                peer_records = [r for r in peer_records if tuple(r["size"]) == tuple(args.size)]
            records += [r for r in peer_records if r["size"] in [x["size"] for x in records]]
            err.print(f"{why}: the profile recorded on {device}")
            print_profile(console, device, records)
        return 1 if missing else 0
    plan = []  # (what runs: OP.STAGE or OP, its place in the records, peer name or None, size)
    for _, op, stages in targets:
        try:
            # --counters: at the size `workbench counters` counts at, so that the two compare
            size = sizes.check_size(op, args.size) if args.size else (
                profiles.counter_size(op) if args.counters else as_size(op.headline_size))
        except sizes.SizeError as exc:
            err.print(f"[red]error:[/] {exc}")
            return 2
        plan += [(s.key, {"op": op.name, "stage": s.name, "order": s.order}, None, size) for s in stages]
        if args.peers:
            plan += [(op.name, {"op": op.name, "stage": name, "order": 0, "kind": "peer"}, name, size)
                     for name, _ in bench.peer_launches(op, size, with_compile=True)]
    version = _ncu_version(ncu)
    device = environment()["device"]
    by_op, failed = {}, []
    for target, place, peer, size in plan:
        shown = f"{target} · {peer}" if peer else target
        err.print(f"profiling {shown} @ {size_label(size)} ...")
        kernels, why = profile_stage(ncu, target, size, args.impl, counters=args.counters, peer=peer)
        if not kernels:
            failed.append(f"{shown}: {why}")
            continue
        recs = records_for(place, size, kernels, version)
        by_op.setdefault(place["op"], []).extend(recs)
        if not args.no_save:
            profiles.save(device, recs, counters=args.counters)
    for records in by_op.values():
        print_profile(console, device, records)
    for f in failed:
        err.print(f"[red]not profiled[/] {f}", highlight=False)
    return 1 if failed or not by_op else 0


def add_cli(sub) -> None:
    """Add `workbench profile` to the CLI's subparsers."""
    s = sub.add_parser("profile", help="Nsight Compute counters per stage (DRAM %%, occupancy, stalls, ...), recorded",
                       description=__doc__.split("\n\n")[0])
    s.add_argument("target", nargs="+", help="OP or OP.STAGE, one or several")
    s.add_argument("--size", type=sizes.size_arg, help="problem size (default: the operator's headline size; with "
                                                 "--counters its largest simulator size)")
    s.add_argument("--counters", action="store_true",
                   help="record the memory-access and divergence counters the simulator counts too "
                        "(`workbench counters`; profiles.COUNTER_METRICS), to hold the two to each other")
    s.add_argument("--peers", action="store_true",
                   help="profile the operator's library peers too (eager torch, torch.compile), recorded beside "
                        "the stages")
    s.add_argument("--impl", help="profile a learner's launcher from this file instead of the answer key's")
    s.add_argument("--no-save", action="store_true", help="do not write results/profiles/")
    s.set_defaults(func=cmd_profile)

