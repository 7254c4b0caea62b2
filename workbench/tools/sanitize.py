"""``workbench sanitize OP[.STAGE] [--tool T] [--impl FILE] [--size S]``: compute-sanitizer on stages.

Each stage runs once in a child process (``python -m workbench.tools.target``) under
``compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck`` (all four by default), with
``NUMBA_CUDA_DEBUGINFO=1`` so the kernels carry line information, and every finding becomes one
teaching line: the kernel, the source line and its text, the thread, what it did (``workbench.sanitizer_reports``).
``--impl FILE`` checks a learner's launcher for the stage instead of the answer key's.
``--parse LOG --tool T`` reads a saved sanitizer log instead (no GPU needed).

Exit status: 0 nothing found, 1 findings (or the tool failed), 2 a bad argument or no GPU/sanitizer.
"""

from __future__ import annotations

import json
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .. import device as _device
from .. import registry, sanitizer_reports, sizes
from ..ladder import as_size, size_label

TIMEOUT_S = 600


def find_sanitizer() -> str | None:
    for candidate in (os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer"),
                      "/usr/local/cuda/bin/compute-sanitizer"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def default_size(op):
    """Small and awkward: the middle simulator size (not a multiple of any block), where bugs at the
    edges of the data show and the sanitizer's slowdown does not matter."""
    sim = [as_size(s) for s in op.sim_sizes]
    return sim[len(sim) // 2]


def sanitizer_command(tool_path: str, tool: str, target: str, size, impl: str | None) -> list[str]:
    cmd = [tool_path, "--tool", tool, "--print-limit", "100"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "hazard"]  # hazards name both threads
    cmd += [sys.executable, "-m", "workbench.tools.target", target, "--size", size_label(size)]
    return cmd + (["--impl", impl] if impl else [])


def run_tool(tool_path: str, tool: str, stage, size, impl: str | None = None) -> tuple[list, str]:
    """(findings, the raw output) of one tool on one stage."""
    env = dict(os.environ, WORKBENCH_MODE="gpu", NUMBA_CUDA_DEBUGINFO="1")
    run = subprocess.run(sanitizer_command(tool_path, tool, stage.key, size, impl), capture_output=True, text=True,
                         env=env, timeout=TIMEOUT_S)
    output = run.stdout + run.stderr
    findings = sanitizer_reports.parse(output, tool)
    # The report may name a kernel's file by its bare name (the debug info's directory is printed apart,
    # or not at all): point such findings at the file we ran, so that the teaching line can quote the code.
    ran = [Path(impl)] if impl else []
    ran.append(Path(inspect.getsourcefile(stage.launch) or ""))
    for f in findings:
        if f.file and not Path(f.file).is_file():
            f.file = next((str(c) for c in ran if c.name == Path(f.file).name and c.is_file()), f.file)
    return findings, output


def cmd_sanitize(args) -> int:
    from ..console import console as Console

    console, err = Console(), Console(stderr=True)
    tools = args.tool or list(sanitizer_reports.TOOLS)
    if args.parse:
        if len(tools) != 1:
            err.print("[red]error:[/] --parse reads one log: name its --tool")
            return 2
        log = Path(args.parse)
        if not log.is_file():
            err.print(f"[red]error:[/] --parse: no such file {log}")
            return 2
        text = log.read_text(errors="replace")
        if not sanitizer_reports.is_sanitizer_log(text):
            err.print(f"[red]error:[/] {log} is not a compute-sanitizer log (no '========= ' lines): "
                      "--parse reads what `compute-sanitizer --tool T ...` printed")
            return 2
        return _report(console, sanitizer_reports.parse(text, tools[0]), args.json)
    if not args.target:
        err.print("[red]error:[/] name a target (OP or OP.STAGE), or --parse a saved log")
        return 2
    op, stages = registry.resolve(args.target)
    tool_path = find_sanitizer()
    if _device.is_simulator() or tool_path is None:
        _device.announce()
        why = "no GPU here" if _device.is_simulator() else "no compute-sanitizer found (set $COMPUTE_SANITIZER or PATH)"
        err.print(f"[red]sanitize needs a GPU and compute-sanitizer:[/] {why}. In the simulator `workbench check` "
                  "and the grader catch races and out-of-bounds indices themselves.")
        return 2
    try:
        size = sizes.check_size(op, args.size) if args.size else default_size(op)
    except sizes.SizeError as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    findings, failures = [], []
    for stage in stages:
        for tool in tools:
            err.print(f"{tool}: {stage.key} @ {size_label(size)} ...")
            found, output = run_tool(tool_path, tool, stage, size, args.impl)
            count = sanitizer_reports.error_count(output)
            if not found and count is None:
                failures.append(f"{tool} on {stage.key} printed no summary: {output.strip()[-400:]}")
            findings += found
    status = _report(console, findings, args.json)
    for f in failures:
        err.print(f"[red]{f}[/]", highlight=False)
    return 1 if failures else status


def _report(console, findings, as_json: bool) -> int:
    if as_json:
        print(json.dumps([{**f.as_dict(), "message": sanitizer_reports.teach(f)} for f in findings], indent=1))
    elif findings:
        for f in findings:
            console.print(f"[red]•[/] {sanitizer_reports.teach(f)}", highlight=False, soft_wrap=True)
    else:
        console.print("[green]no errors found[/]")
    return 1 if findings else 0


def add_cli(sub) -> None:
    """Add `workbench sanitize` to the CLI's subparsers."""
    s = sub.add_parser("sanitize", help="compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on stages",
                       description=__doc__.split("\n\n")[0])
    s.add_argument("target", nargs="?", help="OP or OP.STAGE")
    s.add_argument("--tool", action="append", choices=sanitizer_reports.TOOLS, help="one tool (repeatable; default all four)")
    s.add_argument("--impl", help="check a learner's launcher for the stage from this file")
    s.add_argument("--size", type=sizes.size_arg, help="problem size (default: a small, awkward one)")
    s.add_argument("--parse", metavar="LOG", help="read a saved compute-sanitizer log instead of running one")
    s.add_argument("--json", action="store_true", help="print the findings as JSON")
    s.set_defaults(func=cmd_sanitize)
