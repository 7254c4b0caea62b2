"""``grade()``: a submission's files, each in a worker process; ``grade_function()``: a launcher
defined here (a notebook cell), in this process. Both judge with the same cases and the same report.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from .. import device as _device
from .. import registry
from ..ladder import as_size
from ..sizes import check_size
from .cases import SIM_SM_COUNT, Submission, on_gpu, plan
from .guards import Guard
from .report import FAILED, NOT_AN_EXERCISE, Report, StageGrade
from .stages import Listener, grade_stage, stage_verdict
from .supervisor import CallReply, WorkerSession
from .submission import describe_launcher
from .targets import answer_key_code, display_path, grade_sizes, not_an_exercise, submission_path, targets
from .watch import (classify, fresh_outputs, refusal_facts, run_watched, simulated_device, threads_in, threads_left,
                    timing_arg_sets)

NOTEBOOK_COLUMNS = 100  # grade_function's report in a notebook: no line wider than the page

TIMEOUT_SIM_S = 300.0  # per case, in the simulator: generous, it is slow
TIMEOUT_GPU_S = 60.0
SPEED_NOT_JUDGED = "the speed bar (no GPU here: the simulator cannot time kernels)"


class BadOption(ValueError):
    """An option of grade() (or `workbench grade`) that cannot be used; the message is one line naming what
    was expected."""


MAX_SEED = 2**63 - 1


def check_options(*, seed=None, timeout=None, jobs=None) -> None:
    """Refuse a seed, timeout or job count that cannot mean anything, before anything runs: a timeout of 0
    (or less) is not "the default", a negative seed is not a seed numpy takes, 0 jobs grade nothing."""
    if seed is not None and not (isinstance(seed, (int, np.integer)) and 0 <= seed <= MAX_SEED):
        raise BadOption(f"--seed {seed}: a seed is a whole number from 0 to {MAX_SEED}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
        raise BadOption(f"--timeout {timeout}: seconds per case, a number greater than 0")
    if jobs is not None and not (isinstance(jobs, (int, np.integer)) and jobs >= 1):
        raise BadOption(f"--jobs {jobs}: operators graded in parallel, a whole number of at least 1")


def new_seed() -> int:
    return int(np.random.SeedSequence().entropy % (2**31))


def checked_sizes(stages, sizes) -> list | None:
    """``sizes`` as tuples, each checked against every operator graded (a workbench.sizes.SizeError
    names what was expected), before anything runs."""
    if not sizes:
        return None
    sizes = [as_size(s) for s in sizes]
    for op in {id(s.op): s.op for s in stages}.values():
        for size in sizes:
            check_size(op, size)
    return sizes


def grade(target: str | list | None = None, impl: str = "exercises", *, sizes=None, quick: bool = False,
          seed: int | None = None, timeout: float | None = None, jobs: int | None = None, speed: bool = True,
          listener: Listener | None = None) -> Report:
    """Grade the stages of ``target`` (one, or a list; default: every exercise) in ``impl`` (exercises, solutions, a
    file or a folder). One worker process per operator of each file, ``jobs`` of them at a time; on a GPU
    the calls share the GPU and each speed case has it alone (``cases.on_the_gpu``).

    Raises registry.UnknownTarget, sizes.SizeError or BadOption for a bad target, size or option,
    before anything runs."""
    check_options(seed=seed, timeout=timeout, jobs=jobs)
    mode = _device.mode()
    seed = new_seed() if seed is None else int(seed)
    timeout = timeout or (TIMEOUT_SIM_S if mode == "sim" else TIMEOUT_GPU_S)
    # On a GPU one job unless asked: the lock keeps parallel speed bars honest, but each job holds its
    # operator's inputs and outputs at full size, in its worker and here.
    jobs = jobs or (max(1, os.cpu_count() or 1) if mode == "sim" else 1)
    listener = listener or Listener()
    stages = targets(target, impl)
    sizes = checked_sizes(stages, sizes)
    report = Report(impl, mode, seed)
    if speed and mode == "sim":
        report.not_judged.append(SPEED_NOT_JUDGED)
    # A job is one operator of one file: its own worker, graded stage after stage (its draws are made once,
    # for its first stage, and reused: draws.DRAWS). Jobs run ``jobs`` at a time: a file of many operators
    # (activations.py: 21 operators, 79 stages) is not one long job that the others wait for.
    by_job: dict[tuple[Path, str], list] = {}
    for stage in stages:
        why_not = None if impl == "solutions" else not_an_exercise(stage)  # the answer key grades every stage
        if why_not:
            report.stages.append(StageGrade(stage.key, stage.order, NOT_AN_EXERCISE, notes=[why_not]))
            continue
        by_job.setdefault((submission_path(impl, stage.op), stage.op.name), []).append(stage)
    report.files = list(dict.fromkeys(display_path(path) for path, _ in by_job))
    operators_in = Counter(path for path, _ in by_job)
    t0 = time.perf_counter()

    sessions: list[WorkerSession] = []  # every worker started, so that an interrupt can stop them all

    # In the simulator each running job's worker keeps to a core of its own (simulator.run_on_one_core:
    # half the time): a job takes a free slot, its worker the slot's core, and gives the slot back.
    slots = queue.SimpleQueue()
    for slot in range(jobs):
        slots.put(slot)

    # On a host of several GPUs the slots take turns over them: a job's workers see its slot's GPU alone,
    # and its thread holds that GPU's lock and runs the answer key's calls there (cases.on_gpu).
    gpus = visible_gpus() if mode != "sim" and jobs > 1 else []

    def grade_one(item):
        (path, op_name), job_stages = item
        heading = display_path(path) + (f" ({op_name})" if operators_in[path] > 1 else "")
        slot = slots.get()
        gpu = (slot % len(gpus), gpus[slot % len(gpus)]) if len(gpus) > 1 else None
        try:
            with on_gpu(gpu):
                return _grade_file(path, job_stages, impl, sizes=sizes, quick=quick, seed=seed, timeout=timeout,
                                   speed=speed, listener=listener, sessions=sessions, heading=heading,
                                   core=slot if mode == "sim" else None, gpu=gpu[1] if gpu else None)
        finally:
            slots.put(slot)

    listener = _Collecting(listener)  # what was graded so far, for a report of an interrupted run
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for grades in pool.map(grade_one, by_job.items()):
            report.stages += grades
    except BaseException as exc:  # Ctrl-C (or worse): kill every worker now rather than after its stage
        graded = listener.stop()  # (before the kills: a stage whose worker is killed is no verdict)
        pool.shutdown(wait=False, cancel_futures=True)
        for session in list(sessions):  # (stopping them one after another, each given 2 s to say goodbye,
            session.kill()              # kept an interrupted run on the H200 alive past its 30 s of grace)
        if isinstance(exc, KeyboardInterrupt):
            report.stages = sorted(graded, key=lambda s: (s.key.split(".")[0], s.order))
            report.seconds = time.perf_counter() - t0
            raise GradeInterrupted(report) from None
        raise
    pool.shutdown()
    report.stages.sort(key=lambda s: (s.key.split(".")[0], s.order))
    report.seconds = time.perf_counter() - t0
    return report


class GradeInterrupted(KeyboardInterrupt):
    """``grade`` interrupted (Ctrl-C, or ``timeout -s INT`` ending a GPU session's run): ``report`` holds
    the stages graded before it, so that what was done is still reported."""

    def __init__(self, report: Report):
        super().__init__("interrupted")
        self.report = report


class _Collecting(Listener):
    """Passes every event on to ``listener`` and keeps each stage's grade as it comes."""

    def __init__(self, listener: Listener):
        self.listener, self.done, self.stopped = listener, [], False

    def stop(self) -> list:
        """The grades so far; any that come later (a stage whose worker was killed) are not said."""
        self.stopped = True
        return list(self.done)

    def file_started(self, shown_as: str, stages: int) -> None:
        self.listener.file_started(shown_as, stages)

    def stage_started(self, key: str, cases: int) -> None:
        self.listener.stage_started(key, cases)

    def case_done(self, key: str, result) -> None:
        self.listener.case_done(key, result)

    def stage_done(self, grade: StageGrade) -> None:
        if not self.stopped:
            self.done.append(grade)  # (list.append: safe across the jobs' threads)
            self.listener.stage_done(grade)


def visible_gpus() -> list[str]:
    """The GPUs this process sees, each named as ``CUDA_VISIBLE_DEVICES`` would name it alone."""
    from numba import cuda

    count = len(cuda.gpus)
    named = [n.strip() for n in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if n.strip()]
    return named[:count] if named else [str(i) for i in range(count)]


def _max_threads(timeout: float) -> int | None:
    """In the simulator, the CUDA threads a call may launch in all: what runs in about the case's
    timeout (more is refused up front as "needs a GPU", rather than left to time out)."""
    return threads_in(timeout) if _device.is_simulator() else None


def _answer_key_dirs() -> list[str]:
    import solutions

    return [os.path.realpath(p) for p in solutions.__path__]


def _grade_file(path: Path, stages: list, impl: str, *, sizes, quick, seed, timeout, speed,
                listener: Listener, sessions: list, heading: str, core: int | None = None,
                gpu: str | None = None) -> list[StageGrade]:
    """``stages`` (of one operator) of the file at ``path``, in a worker of their own (kept to the
    ``core``-th core, if given; seeing only the GPU ``gpu``, a ``CUDA_VISIBLE_DEVICES`` name, if given)."""
    shown = display_path(path)
    listener.file_started(heading, len(stages))
    key_dirs = _answer_key_dirs()
    is_key = impl == "solutions" or any(os.path.realpath(path).startswith(d + os.sep) for d in key_dirs)
    hint = ""
    if impl == "exercises":
        hint = (" (the exercise predates this stage of the solution: `workbench exercises build` adds it, "
                "with --backup if you have edited the file)")
    submission = Submission(str(path), shown, {} if is_key else answer_key_code(stages[0].op), tuple(key_dirs),
                            own_dirs=tuple(key_dirs) if is_key else (), hint_missing=hint)
    if not path.exists():
        build = ": run `workbench exercises build`" if impl == "exercises" else ""
        return [stage_verdict(s, FAILED, "missing", f"{shown} does not exist{build}", file=shown) for s in stages]
    job = {"type": "job", "submission": str(path.resolve()), "guard_answer_key": not is_key,
           "answer_key_dirs": key_dirs, "sm_count": SIM_SM_COUNT, "max_threads": _max_threads(timeout), "core": core,
           "gpu": gpu}
    session = WorkerSession(job, timeout)
    # The answer key, timed for the speed bar in a worker of its own like the submission (started at the
    # first speed case: never in the simulator).
    key = WorkerSession(dict(job, submission=str(registry.source_file(stages[0].op).resolve()),
                             guard_answer_key=False), timeout)
    sessions += [session, key]
    grades = []
    try:
        for stage in stages:
            cases = plan(stage.op, sizes or grade_sizes(stage.op, _device.mode(), quick, stage), seed)
            grade = grade_stage(stage, session, cases, submission, seed=seed, speed=speed, listener=listener,
                                key=key)
            listener.stage_done(grade)
            grades.append(grade)
    finally:
        session.close()
        key.close()
    return grades


# -- in this process: a launcher defined in a notebook ----------------------------------------------

class InProcessSession:
    """The worker's part, played in this process for a function defined here: the same watch and
    device-array guard, but no process boundary (a kernel that hangs hangs the caller)."""

    def __init__(self, launcher: Callable, file: str | None):
        self.launcher, self.file = launcher, file

    def loaded(self) -> dict:
        return {"ok": True}

    def prepare(self, op: str, stage: str) -> dict:
        from ..ladder import clear_scratch

        clear_scratch()
        return {"ok": True, "functions": describe_launcher(self.launcher)}

    def call(self, stage: str, case_id: int, inputs: tuple, out: np.ndarray, limit=None,
             sm_count: int | None = None) -> CallReply:
        with simulated_device(sm_count):  # (a hang hangs the caller here: no limit to apply)
            outcome = run_watched(self.launcher, inputs, out, Guard(), self.file, _max_threads(TIMEOUT_SIM_S))
        return CallReply(outcome.error, outcome.launches, refusal_facts(outcome.refusals), outcome.seconds,
                         outcome.out, outcome.inputs_after)

    def ready_to_time(self, stage: str, draws: list[tuple], out: np.ndarray) -> dict | None:
        from ..bench import first_call
        from ..results import environment

        self.timing = None
        self.threads_before = set(threading.enumerate())
        try:
            arg_sets = timing_arg_sets(draws, out, environment().get("l2_bytes"))
            first_call(self.launcher, arg_sets[0])
        except Exception as exc:
            return classify(exc, self.file)
        self.timing = (draws, arg_sets)
        return None

    def time(self, stage: str, keep: bool = True) -> tuple[float | None, dict | None]:
        from ..timing import measure

        try:
            return measure(self.launcher, self.timing[1]).median_us, None
        except Exception as exc:
            return None, classify(exc, self.file)
        finally:
            if not keep:
                self.timing = None

    def after_timing(self, stage: str) -> tuple[list | None, dict | None]:
        (draws, arg_sets), self.timing = self.timing, None
        try:
            outputs = fresh_outputs(self.launcher, arg_sets, draws)
        except Exception as exc:
            return None, classify(exc, self.file)
        left = threads_left(self.threads_before)
        if left:
            return None, {"reason": left[0].reason, "message": left[0].what}
        return outputs, None


def grade_function(op_stage: str, launcher: Callable, *, sizes=None, quick: bool = False, seed: int | None = None,
                   speed: bool = True, show: bool = True) -> Report:
    """Grade a launcher defined here (a notebook cell) as stage ``op.stage``, in this process.

    The same cases, checks and report as ``workbench grade``, without the worker process: a kernel
    that hangs hangs the notebook (interrupt the kernel). Prints the report unless show=False."""
    mode = _device.mode()
    seed = new_seed() if seed is None else int(seed)
    _, (stage,) = registry.resolve(op_stage)
    sizes = checked_sizes([stage], sizes)
    try:
        from inspect import getsourcefile

        file = getsourcefile(launcher)
    except TypeError:
        file = None
    name = getattr(launcher, "__qualname__", "function")
    report = Report(f"{name} as {stage.key}", mode, seed, files=[f"{name} ({display_path(file)})"])
    if speed and mode == "sim":
        report.not_judged.append(SPEED_NOT_JUDGED)
    submission = Submission(file, display_path(file), answer_key_code(stage.op), tuple(_answer_key_dirs()),
                            own_file_only=False)
    t0 = time.perf_counter()
    cases = plan(stage.op, sizes or grade_sizes(stage.op, mode, quick, stage), seed)
    with simulated_device(SIM_SM_COUNT):
        grade = grade_stage(stage, InProcessSession(launcher, file), cases, submission, seed=seed, speed=speed,
                            listener=Listener(), key=InProcessSession(stage.launch, None))
    report.stages.append(grade)
    report.seconds = time.perf_counter() - t0
    if show:  # in a notebook: within the 100 columns a page shows at 1280 px
        print(report.text(width=NOTEBOOK_COLUMNS), end="")
    return report

