"""``workbench grade``: the command line of the grader room (``add_cli`` hooks it into ``workbench``).

Bad input (an unknown stage, a size of the wrong form, a missing file) is refused with one line
before anything runs; an error in the grader itself is one line too, and says it is not the
learner's; neither ever shows a traceback. Exit status: 0 all judged stages passed, 1 a stage failed
(or nothing to grade), 2 bad input or a grader error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from .. import device as _device
from ..registry import UnknownTarget
from ..sizes import SizeError, size_arg
from .api import TIMEOUT_GPU_S, TIMEOUT_SIM_S, BadOption, check_options, grade
from .report import CaseResult, StageGrade
from .stages import Listener

BAD_INPUT, GRADER_ERROR = 2, 2


class ProgressBars(Listener):
    """A bar for the stages and one for the cases of each stage being graded, on stderr."""

    def __init__(self, progress, total_stages: int):
        self.progress = progress
        self.overall = progress.add_task("stages", total=total_stages)
        self.tasks: dict = {}

    def file_started(self, shown_as: str, stages: int) -> None:
        self.progress.console.print(f"[dim]grading {shown_as}[/]")

    def stage_started(self, key: str, cases: int) -> None:
        self.tasks[key] = self.progress.add_task(f"  {key}", total=cases)

    def case_done(self, key: str, result: CaseResult) -> None:
        if key in self.tasks:
            self.progress.advance(self.tasks[key])

    def stage_done(self, grade: StageGrade) -> None:
        task = self.tasks.pop(grade.key, None)
        if task is not None:
            self.progress.remove_task(task)
        self.progress.advance(self.overall)


class Lines(Listener):
    """Without a terminal: one line per job (an operator of a file), so a log shows what is being graded."""

    def __init__(self, console, clock=time.monotonic):
        self.console, self.clock = console, clock
        self.started: dict[str, float] = {}  # stage key -> when its first case began (jobs run in threads)

    def file_started(self, shown_as: str, stages: int) -> None:
        self.console.print(f"grading {shown_as} ({stages} stage{'s' * (stages != 1)})")

    def stage_started(self, key: str, cases: int) -> None:
        self.started[key] = self.clock()

    def stage_done(self, grade: StageGrade) -> None:
        """Each verdict as it comes: a log cut off mid-run (a GPU session's time limit) still says what passed,
        how long each stage took (what the next run is planned from) and its speed against the solution's."""
        failed = [c for c in grade.cases if c.failed]
        if failed:  # (and why the first failed: a log cut off before the report still says)
            said = [f"{len(failed)} of {len(grade.cases)} cases failed; {failed[0].label}: {failed[0].reason}"]
        else:
            said = [f"{len(grade.cases)} cases"]
        began = self.started.pop(grade.key, None)  # (a stage judged whole, without cases, never started)
        if began is not None:
            said.append(f"{self.clock() - began:.0f} s")
        ratios = [c.speed["ratio"] for c in grade.cases if c.speed]
        if ratios:
            said.append(f"speed {ratios[0]:.2f}")
        self.console.print(f"  {grade.key}: {grade.status} ({'; '.join(said)})", highlight=False)


STACKS_VARIABLE = "WORKBENCH_GRADE_STACKS"  # a file: every thread's stack is written there on SIGINT


def cmd_grade(args) -> int:
    from ..console import console as Console

    err = Console(stderr=True)
    stacks = os.environ.get(STACKS_VARIABLE)
    if stacks:  # a GPU session's diagnosis: where each thread was when `timeout -s INT` came, written by C
        import faulthandler  # code that needs no thread's cooperation (on the H200 two runs outlived their
        import signal        # SIGINT by 20 s, and were killed with nothing said)

        faulthandler.register(signal.SIGINT, file=open(stacks, "w"), all_threads=True, chain=True)
    try:
        return _grade(args, err)
    except (UnknownTarget, SizeError, BadOption) as exc:
        err.print(f"[red]error:[/] {exc.args[0] if exc.args else exc}", highlight=False, soft_wrap=True)
        return BAD_INPUT
    except KeyboardInterrupt as exc:
        report = getattr(exc, "report", None)  # (api.GradeInterrupted: the stages graded before it)
        if report is not None and args.json:  # a GPU session's run cut off by its time limit keeps its cases
            print(json.dumps(dict(report.as_dict(), interrupted=True), indent=1))
        count = len(report.stages) if report is not None else 0
        done = f"; {count} stage{'s' * (count != 1)} graded before it" if report is not None else ""
        err.print(f"[yellow]interrupted[/] (every grading process was stopped{done})")
        return stop_now(130)
    except Exception as exc:  # the grader's own bug: one line, never a traceback, never the learner's fault
        err.print(f"[red]grader error (not your code):[/] {type(exc).__name__}: {exc}", highlight=False,
                  soft_wrap=True)
        return GRADER_ERROR


def stop_now(status: int) -> NoReturn:
    """End the process at once, without waiting for the grading threads: a thread can be where no
    interrupt reaches it (waiting for a kernel of the answer key's that runs for minutes, or for the GPU
    lock behind it), and Python's exit joins every thread of a pool, so `grade` stopped by Ctrl-C or
    `timeout -s INT` hung until it was killed (seen on the H200). The workers are stopped already."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _grade(args, err) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .targets import targets

    impl = args.impl
    args.target = args.target or None  # (none given: every exercise)
    check_options(seed=args.seed, timeout=args.timeout, jobs=args.jobs)
    refused = bad_impl(impl) or bad_junit(args.junit)
    if refused:
        raise BadOption(refused)
    stages = targets(args.target, impl)  # an unknown target is refused here, before anything runs
    missing = missing_in_folder(impl, args.target, stages)
    if missing:
        raise BadOption(missing)
    if not args.json:
        _device.announce()
    options = dict(sizes=args.size, quick=args.quick, seed=args.seed, timeout=args.timeout, jobs=args.jobs,
                   speed=not args.no_speed)
    if args.json or not err.is_terminal:
        # A line per verdict on stderr as it comes, with --json too (its report is on stdout): a run stopped
        # before its end (a GPU session's time limit) still says what it graded.
        report = grade(args.target, impl, listener=Lines(err), **options)
    else:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as progress:
            report = grade(args.target, impl, listener=ProgressBars(progress, len(stages)), **options)
    if args.junit:
        Path(args.junit).write_text(report.junit())
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        report.render()
    if not report.stages:
        err.print("[yellow]nothing to grade[/] (no exercise stage matched)")
        return 1
    if report.errors:
        return GRADER_ERROR
    return 0 if report.passed else 1


def bad_impl(impl: str) -> str | None:
    """Why ``--impl`` cannot be graded (one line), or None."""
    from .targets import BUILT_IN

    if impl in BUILT_IN:
        return None
    if not os.path.exists(impl):
        return f"--impl {impl}: no such file or folder (use exercises, solutions, a .py file or a folder of them)"
    if os.path.isfile(impl) and not impl.endswith(".py"):
        return f"--impl {impl}: not a Python file (a submission is a .py file, or a folder of them)"
    return None


def bad_junit(junit: str | None) -> str | None:
    """A JUnit report goes into a folder that exists: a typo in its path makes no folders anywhere."""
    if not junit:
        return None
    folder = Path(junit).parent
    if not folder.is_dir():
        return f"--junit {junit}: the folder {folder} does not exist (create it first)"
    if Path(junit).is_dir():
        return f"--junit {junit}: is a folder; give the path of the XML file to write"
    return None


def missing_in_folder(impl: str, target: str | None, stages: list) -> str | None:
    """A target asked for by name in a folder that has no file for it: said once, before grading."""
    from .targets import BUILT_IN, not_an_exercise, submission_path

    if not (target and os.path.isdir(impl)) or impl in BUILT_IN:
        return None
    files = sorted({str(submission_path(impl, s.op)) for s in stages
                    if not submission_path(impl, s.op).exists() and not not_an_exercise(s)})
    if not files:
        return None
    named = " ".join(target) if isinstance(target, (list, tuple)) else target
    return f"--impl {impl}: the folder has no {', '.join(Path(f).name for f in files)} for {named}"


def add_cli(sub) -> None:
    """Add `workbench grade` to the CLI's subparsers."""
    s = sub.add_parser("grade", help="grade exercises (or solutions, or a file): correctness, then speed on a GPU",
                       description="Grade a submission against the answer key: every stage on random and "
                                   "adversarial inputs at sizes that are not multiples of a block, in a separate "
                                   "process; on a GPU, a speed bar.")
    s.add_argument("target", nargs="*", help="OP, OP.STAGE or FAMILY; several are graded in one run (their "
                                             "operators shared among --jobs) (default: every exercise)")
    s.add_argument("--impl", default="exercises",
                   help="exercises (default), solutions (the answer key), or a path to a file or folder")
    s.add_argument("--size", type=size_arg, action="append",
                   help="grade at this size only, e.g. 1000 or 33x65 (repeatable)")
    s.add_argument("--quick", action="store_true",
                   help="two or three sizes per stage (the smallest, an awkward one, one with every dimension "
                        "different) instead of all")
    s.add_argument("--seed", type=int, help="reproduce a run (the report prints its seed); checked with the other options")
    s.add_argument("--timeout", type=float,
                   help=f"seconds per case, compiling not counted (default {TIMEOUT_SIM_S:.0f} in the "
                        f"simulator, {TIMEOUT_GPU_S:.0f} on a GPU); importing the submission may take as long "
                        "(at least 30 s, at most 120)")
    s.add_argument("--jobs", type=int,
                   help="operators graded in parallel, each in its own process (default: CPU count in the "
                        "simulator, 1 on a GPU; on a GPU the calls run side by side and each speed bar is "
                        "timed with the GPU to itself; on a host of several GPUs the jobs take turns over them)")
    s.add_argument("--no-speed", action="store_true", help="skip the speed bar on a GPU")
    s.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    s.add_argument("--junit", metavar="PATH", help="also write a JUnit XML report")
    s.set_defaults(func=cmd_grade)

