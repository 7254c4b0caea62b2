"""One case, in the grader's process: the inputs made, the call made elsewhere, the verdict made here.

The inputs come from the operator (random, with a seed the submission never sees, fresh for every
call; and its adversarial sets at the small sizes), the output is poisoned, and the reference, the
comparison and the verdict are computed here from what the call sent back, never from anything the
submission's process says about itself beyond plain facts (what it launched, what was refused).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import device as _device
from ..gpulock import gpu_lock, pinned
from ..check import judge, poison_like, run_once, tolerance_of
from ..ladder import Size, as_size
from .draws import Draw, adversarial_draws, random_draw
from .reasons import advice_for
from .report import PASSED, SKIPPED, CaseResult
from .supervisor import RUNAWAY_FLOOR_S, CallReply, CaseAborted, GraderError
from .watch import FRESH_DRAWS, simulated_device

ADVERSARIAL_SIZES = 2  # adversarial input sets are graded at this many of the smallest sizes
# And at the largest size of at most this many elements (a size past one full resident grid: a missing
# grid-stride loop, a float32 running total or a grid sized from the SM count shows there on the inputs
# built to expose it, e.g. the maximum at the very end, a large first element), in the simulator too
# (its largest sizes are a few thousand elements: a float32 running total of 4100 elements after a large
# first one is already wrong), but not at the 2^28 sizes of a GPU, where making the sets and their
# float64 reference costs more than it proves.
ADVERSARIAL_LARGE_MAX_ELEMENTS = 1 << 25
SIM_SM_COUNT = 2  # the simulated device's multiprocessors while grading: grids sized from it stay small
# ...and for one case of each stage, this many: split and persistent schedules then take more than two
# blocks (a partial result combined as if there were two, a split count bounded by 2, shows there).
WIDE_SM_COUNT = 5
# A speed ratio under the bar is timed again, both stages, this many times at most, each stage's best
# time kept: on an H200 host running 24 grading workers the answer key once timed itself at 0.28 of its
# own speed (one process's launches stalled by the others' work on the same CPUs), and failed its bar.
SPEED_RETAKES = 2
RUNAWAY_FACTOR = 10  # a call is stopped after this many times the solution's own time at its size
AGAIN = "again, new inputs"  # the label of the call that repeats the first size with fresh inputs
VALUE_REASONS = ("wrong-values", "all-zeros", "unwritten", "uninitialised", "nan")


_JOB_GPU = threading.local()  # this thread's GPU, where the grader's jobs are spread over several


@contextmanager
def on_gpu(gpu: tuple[int, str] | None):
    """For the duration, this thread's GPU work is on one of the process's GPUs, ``gpu`` = (its index among
    them, its ``CUDA_VISIBLE_DEVICES`` name): the answer key's calls here run on it (numba's current device)
    and ``on_the_gpu`` holds its lock. None: the process's own GPU, as without it."""
    if gpu is None:
        yield
        return
    from numba import cuda

    before = getattr(_JOB_GPU, "gpu", None)
    _JOB_GPU.gpu = gpu
    try:
        with pinned(gpu[1]), cuda.gpus[gpu[0]]:
            yield
    finally:
        _JOB_GPU.gpu = before


def job_gpu() -> tuple[int, str] | None:
    """The GPU ``on_gpu`` gave this thread (None: the process's)."""
    return getattr(_JOB_GPU, "gpu", None)


def on_the_gpu(kind: str):
    """Hold the GPU "shared" (running kernels: a call of the submission in its worker, the solution here) or
    "exclusive" (timing them), across the grader's threads and every other grading process on this GPU
    (``workbench.gpulock``): with ``--jobs N`` the calls run side by side while a speed is measured alone.
    The simulator has no GPU to share and no timer: nothing to hold."""
    return nullcontext() if _device.is_simulator() else getattr(gpu_lock(), kind)()


@dataclass
class Case:
    size: Size
    inputs: str  # "random", an adversarial set's label, or AGAIN
    draw: Draw  # the inputs and their reference, made when the case runs (once for all the operator's stages)
    sm_count: int | None = None  # the simulated device's multiprocessors for this case (None: SIM_SM_COUNT)


def elements(size) -> int:
    """A size's element count, a switch's 0 (attention's CAUSAL off) counted as 1, not as no elements."""
    return int(np.prod([max(1, n) for n in size]))


def plan(op, sizes, seed: int) -> list[Case]:
    """The cases for one stage: each size on random inputs; the first size again on fresh inputs
    (a stage that keeps results between calls fails it); the operator's adversarial sets at the
    smallest sizes and at the largest size of at most ADVERSARIAL_LARGE_MAX_ELEMENTS. The draws depend
    on the operator, the size, the seed and the stream only, so the stages of an operator share them."""
    sizes = [as_size(s) for s in sizes]
    cases = [Case(size, "random", random_draw(op, size, seed, i)) for i, size in enumerate(sizes)]
    cases.insert(1, Case(sizes[0], AGAIN, random_draw(op, sizes[0], seed, 10_000)))
    by_elements = sorted(dict.fromkeys(sizes), key=elements)
    if _device.is_simulator() and len(sizes) > 1:  # (a GPU has its own SM count)
        middle = by_elements[len(by_elements) // 2]  # (more blocks at the largest size cost twice its time)
        cases.append(Case(middle, f"random on {WIDE_SM_COUNT} SMs", random_draw(op, middle, seed, 15_000),
                          WIDE_SM_COUNT))
    adversarial = by_elements[:ADVERSARIAL_SIZES]
    large = [s for s in by_elements if elements(s) <= ADVERSARIAL_LARGE_MAX_ELEMENTS]
    if large and large[-1] not in adversarial:
        adversarial.append(large[-1])
    for j, size in enumerate(adversarial):
        for label, draw in adversarial_draws(op, size, seed, 20_000 + j):
            cases.append(Case(size, label, draw))
    return cases


def same_file(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str, folders) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(os.path.realpath(d) + os.sep) for d in folders)


@dataclass
class Submission:
    """Where a stage's code comes from and how far to trust it."""

    file: str | None  # the file graded (None: unknown, e.g. a function typed in a console)
    shown_as: str  # the file as the learner knows it
    answer_key: dict = field(default_factory=dict)  # fingerprint -> name of the answer key's code
    answer_key_dirs: tuple = ()  # where the answer key lives (its `_*.py` modules are shared helpers)
    own_file_only: bool = True  # every function the stage runs must come from ``file`` as written
    own_dirs: tuple = ()  # folders whose files count as the submission's too (the answer key's own)
    hint_missing: str = ""  # added to "the submission does not define this stage"

    shared_code: frozenset | None = None  # fingerprints of the answer key's shared code this stage may run

    def owns(self, filename: str) -> bool:
        """Is code from this file the submission's own?"""
        return same_file(filename, self.file) or bool(self.own_dirs and _inside(filename, self.own_dirs))

    def is_shared(self, filename: str) -> bool:
        """Is this file one of the answer key's shared modules (``solutions/_*.py``)?"""
        return os.path.basename(filename).startswith("_") and _inside(filename, self.answer_key_dirs)


def foreign_code(functions: list[dict], submission: Submission) -> tuple[str, str] | None:
    """(reason, message) if the stage runs the answer key's code, or (``own_file_only``) code that is
    not in the submission's file as written; None if all of it is the submission's own."""
    for f in functions:
        where = f"{f['file']}, line {f['line']}"
        mine = submission.owns(f["file"])
        if not mine and submission.is_shared(f["file"]):
            # Shared helpers are importable (the exercise imports them), but only those the solution's own
            # stage runs are given: the rest of those modules (another stage's whole kernel) is the answer.
            if submission.shared_code is None or f["fingerprint"] in submission.shared_code:
                continue
            return "answer-key", (f"`{f['qualname']}` ({where}) is the answer key's shared code, which this "
                                  "stage's exercise does not give you: write it yourself")
        if f["fingerprint"] in submission.answer_key and not mine:
            key = submission.answer_key[f["fingerprint"]]
            return "answer-key", f"`{f['qualname']}` ({where}) is the answer key's {key}"
        if not submission.own_file_only:
            continue
        if not mine:
            return "exec", f"`{f['qualname']}` comes from {where}, not from the submission's file"
        if f.get("source_matches") is False:
            return "exec", (f"the code of `{f['qualname']}` is not the code written in its file at line "
                            f"{f['line']}: it was compiled from other source")
    return None


_SOLUTION_SECONDS: dict = {}  # (stage, size) -> the solution's (first, later) call times, measured once per process
_SOLUTION_LOCK = threading.Lock()  # one solution run at a time: files are graded in threads


def solution_seconds(stage, size, inputs: tuple, sm_count: int | None = None) -> tuple[float, float]:
    """The answer key's own times for ``stage`` at ``size``, run here in the grader's process as the worker runs
    the submission: (its first call, a call after it). On a GPU the first call compiles whatever kernel this
    size needs that this process has not compiled yet; in the simulator nothing compiles, and one run is both."""
    key = (stage.key, tuple(size), sm_count)
    with _SOLUTION_LOCK:
        if key not in _SOLUTION_SECONDS:
            template = stage.op.make_output(size)
            with simulated_device(sm_count or SIM_SM_COUNT), on_the_gpu("shared"):
                t0 = time.perf_counter()
                run_once(stage, inputs, template)
                first = again = time.perf_counter() - t0
                if not _device.is_simulator():
                    t0 = time.perf_counter()
                    run_once(stage, inputs, template)
                    again = time.perf_counter() - t0
            _SOLUTION_SECONDS[key] = (first, again)
    return _SOLUTION_SECONDS[key]


def runaway_limit(stage, size, inputs: tuple, sm_count: int | None = None):
    """For the worker's supervisor: how long this call may run, and why (asked only once it is late).
    A multiple of the solution's run time, plus the time the solution's first call here took to compile: a
    submission's call that compiles (its stage's first, or the first of a size that needs another kernel)
    compiles as long, tens of seconds on a busy machine, and is no loop that never ends."""
    gpu = job_gpu()  # (limit() runs in a thread of its own: on this job's GPU too)

    def limit() -> tuple[float, str]:
        with on_gpu(gpu):
            first, theirs = solution_seconds(stage, size, inputs, sm_count)
        compiling = max(0.0, first - theirs)
        allowed = max(RUNAWAY_FLOOR_S, RUNAWAY_FACTOR * theirs) + compiling
        why = f"{RUNAWAY_FACTOR} times the solution's {theirs:.2g} s at this size, and at least {RUNAWAY_FLOOR_S:.0f} s"
        if compiling >= 0.1:
            why += f", plus the {compiling:.2g} s its first call took to compile"
        return allowed, why + ": a loop that never ends?"
    return limit


def run_case(stage, session, case: Case, case_id: int, *, functions: list[dict], submission: Submission) -> CaseResult:
    """Make the inputs, have ``session`` call the submission on them, and judge what came back."""
    op = stage.op
    inputs = case.draw.inputs()
    out = poison_like(op.make_output(case.size))
    result = CaseResult(stage.key, list(case.size), PASSED, inputs=case.inputs,
                        tolerance=tolerance_of(stage, case.size))
    t0 = time.perf_counter()
    try:
        with on_the_gpu("shared"):
            reply = session.call(stage.name, case_id, inputs, out,
                                 limit=runaway_limit(stage, case.size, inputs, case.sm_count), sm_count=case.sm_count)
    except CaseAborted as aborted:
        result.seconds = time.perf_counter() - t0
        result.output = aborted.printed
        return result.fail(aborted.reason, aborted.message, advice_for(aborted.reason))
    result.seconds, result.output = reply.seconds, reply.printed
    shared = any(f["shared_memory"] for f in functions)
    verdict = _refused(reply) or foreign_code(reply.launches, submission) or _raised(reply.error)
    if verdict:
        reason, message = verdict
        if reason == "needs-gpu":
            result.status, result.reason, result.message = SKIPPED, reason, message
            return result
        return result.fail(reason, message, advice_for(reason, shared, message))
    if not reply.launches:
        checked = judge(stage, case.size, inputs, reply.out, reply.inputs_after, reference=case.draw.reference())
        also = f" (and the output is wrong too: {checked.message})" if checked.failed else ""
        return result.fail("no-kernel-launch", "no kernel was launched during the call" + also,
                           advice_for("no-kernel-launch"))
    checked = judge(stage, case.size, inputs, reply.out, reply.inputs_after, label=case.inputs,
                    reference=case.draw.reference())
    result.rel_err = None if checked.rel_err is None or not np.isfinite(checked.rel_err) else float(checked.rel_err)
    result.first_bad_index, result.worst = checked.first_bad_index, checked.worst
    if checked.failed:
        reason, message = checked.reason, checked.message
        if reason in VALUE_REASONS and not _device.is_simulator():
            differ = second_run_differs(stage, session, case, case_id, inputs, reply.out, result.tolerance)
            if differ:
                reason, message = "race", f"{message}; {differ}"
        result.fail(reason, message, advice_for(reason, shared, message))
    return result


def second_run_differs(stage, session, case: Case, case_id: int, inputs: tuple, first: np.ndarray,
                        tolerance: float) -> str:
    """On a GPU, a race shows as wrong values, not as a race (only the simulator watches every access):
    run a wrong case again on the same inputs. A different output (beyond the tolerance: atomics may
    add floats in another order) means the result depends on the order threads and blocks ran in.
    Returns what to add to the message, or "" (the same output, or no second output to compare)."""
    try:
        with on_the_gpu("shared"):
            reply = session.call(stage.name, case_id, inputs, poison_like(stage.op.make_output(case.size)),
                                 sm_count=case.sm_count)
    except CaseAborted:
        return ""
    second = reply.out
    if reply.error is not None or second is None or second.shape != first.shape:
        return ""
    if np.issubdtype(first.dtype, np.floating):
        a, b = first.astype(np.float64), second.astype(np.float64)
        finite = np.isfinite(a) & np.isfinite(b)
        scale = max(1.0, float(np.max(np.abs(a[finite]), initial=0.0)))
        same = np.where(finite, np.abs(a - b) <= tolerance * scale, (a == b) | (np.isnan(a) & np.isnan(b)))
    else:
        same = first == second
    changed = np.flatnonzero(~same)
    if not changed.size:
        return ""
    index = list(np.unravel_index(changed[0], first.shape)) if first.ndim else []
    return (f"and a second run on the same inputs gave a different output ({changed.size} of {first.size} "
            f"elements, first at index {[int(i) for i in index]}: {first.flat[changed[0]]} then "
            f"{second.flat[changed[0]]}): the result depends on the order in which threads and blocks ran, a "
            f"data race (or a read of memory nobody wrote, or of state kept from the previous call)")


REFUSED = {"host-copy": "it read device data on the host", "host-write": "it wrote the output from the host",
           "process": "it started a process", "wrote-file": "it wrote to a file in the repository",
           "answer-key": "it reached for the answer key",
           "tampered": "it replaced numba's or the grader's own functions",
           "signal": "it signalled a process that is not its own",
           "thread": "it left work running in another thread"}


def _refused(reply: CallReply) -> tuple[str, str] | None:
    if reply.refusals:
        first = reply.refusals[0]
        more = f"; {len(reply.refusals) - 1} more refused" if len(reply.refusals) > 1 else ""
        reason = first["reason"]
        return reason, f"{REFUSED.get(reason, reason)}: {first['what']} (refused{more})"
    if reply.strays:
        return "background-process", "still running after the call: " + "; ".join(reply.strays)
    return None


def _raised(error: dict | None) -> tuple[str, str] | None:
    if error is None:
        return None
    return str(error.get("reason", "exception")), str(error.get("message", ""))


def stale_if_repeat(cases: list[CaseResult]) -> None:
    """A wrong answer on the repeated first size, right the first time: results kept between calls."""
    first, again = cases[0] if cases else None, next((c for c in cases if c.inputs == AGAIN), None)
    if first and again and first.passed and again.failed and again.reason in VALUE_REASONS:
        again.reason = "stale"
        again.message = f"right the first time, wrong on new inputs of the same size: {again.message}"
        again.advice = advice_for("stale")


ROOFLINE_MARGIN = 2.0  # times the device's published bandwidth: rotated inputs larger than L2 cannot beat it


def below_roofline(moved_bytes: int, median_us: float, device_name: str | None) -> str:
    """Why a time is impossible (it moves the stage's minimum traffic faster than ROOFLINE_MARGIN times
    the device's memory bandwidth: the work was done elsewhere, on another stream or thread the timer
    never waited for, or the timer was fooled), or "" where it is possible or the device is unknown."""
    from ..ceilings import datasheet_gbps

    peak = datasheet_gbps(device_name or "")
    if not peak or median_us <= 0:
        return "" if peak is None or median_us > 0 else "a time of zero"
    gbps = moved_bytes / median_us / 1e3
    if gbps <= ROOFLINE_MARGIN * peak:
        return ""
    return (f"{median_us:.3g} µs moves its {moved_bytes / 1e6:.3g} MB at {gbps:.0f} GB/s, more than {ROOFLINE_MARGIN:g} "
            f"times the {peak:.0f} GB/s this GPU's memory can: the time cannot be the stage's own")


def speed_case(stage, session, key, bar: float, seed: int) -> CaseResult:
    """Time the submission (in its worker, ``session``) and the solution stage (in ``key``: a worker of
    the answer key's file, or this process for a function defined here) on the same draws of the inputs,
    copied before either timer starts (GPU only); then judge what the submission's calls on fresh inputs
    after its timing wrote (``watch.fresh_outputs``): a result replayed, or left to another stream or
    thread, is refused, whatever its time. Only the two timings hold the GPU exclusive, one after the other
    (copies, compiles and checks hold it shared): no other job's kernel runs during either (``--jobs N``).
    Each stage is timed in a process of its own that does nothing else meanwhile: timed here, beside the
    grader's threads making other operators' inputs and references, the answer key's launches would wait
    for the host (on an H200 under load it timed itself 3.7 times slower than the same code in a worker)."""
    from ..results import environment

    op = stage.op
    size = as_size(op.grade_speed_size or op.headline_size)
    draws = [random_draw(op, size, seed, 30_000 + k) for k in range(FRESH_DRAWS)]
    inputs = [draw.inputs() for draw in draws]
    template = op.make_output(size)
    case = CaseResult(stage.key, list(size), PASSED, kind="speed")
    t0 = time.perf_counter()
    try:
        with on_the_gpu("shared"):  # copies and compiles, both stages', while other jobs' kernels may run
            _the_key(_key_prepared, key, stage)  # (first: in this process, preparing clears the workspaces)
            error = session.ready_to_time(stage.name, inputs, poison_like(template))
            if error is None:
                _the_key(key.ready_to_time, stage.name, inputs, template)
        attempts, mine_us, theirs_us = 0, float("inf"), float("inf")
        while error is None:
            with on_the_gpu("exclusive"):  # the two timings alone on the GPU, one after the other
                mine, error = session.time(stage.name)
                theirs = _the_key(key.time, stage.name, keep=False) if error is None else None
            if error is not None:
                break
            attempts += 1
            # The best of each stage's timings: a host that stalls a process's launches (other jobs'
            # workers on the same CPUs) only ever adds time, to either stage.
            mine_us, theirs_us = min(mine_us, mine), min(theirs_us, theirs)
            if theirs_us / mine_us >= bar or attempts > SPEED_RETAKES:
                break
            with on_the_gpu("shared"):  # under the bar: both timed again (the key's copies were let go)
                _the_key(key.ready_to_time, stage.name, inputs, template)
        if error is None:
            with on_the_gpu("shared"):  # checking what it does after timing is no timing: others may run
                outputs, error = session.after_timing(stage.name)
    except CaseAborted as aborted:
        return case.fail(aborted.reason, f"timing: {aborted.message}", advice_for(aborted.reason))
    if error is not None:
        reason, message = _raised(error)
        return case.fail(reason, f"timing: {message}", advice_for(reason))
    moved = op.bytes_moved(size)
    ratio = theirs_us / mine_us
    speed = {"gbps": moved / mine_us / 1e3, "solution_gbps": moved / theirs_us / 1e3, "ratio": ratio,
             "bar": bar, "median_us": mine_us, "solution_median_us": theirs_us, "attempts": attempts}
    case.speed, case.seconds = speed, time.perf_counter() - t0
    wrong = fresh_output_wrong(stage, size, inputs, outputs, reference=lambda k: draws[k].reference())
    floor = below_roofline(moved, mine_us, environment().get("device"))
    if wrong:
        reason, message = wrong
        case.fail(reason, message, advice_for(reason))
    elif floor:
        case.fail("below-roofline", floor, advice_for("below-roofline"))
    elif ratio < bar:
        case.fail("too-slow", f"{100 * ratio:.0f}% of the solution's bandwidth, the bar is {100 * bar:.0f}%",
                  advice_for("too-slow"))
    return case


def _the_key(request: Callable, *args, **kwargs):
    """A request to the answer key's session (``speed_case``), its error (or timing's) returned as a value
    unwrapped: the key failing to run, or its worker stopped or late, is the grader's failure
    (GraderError), never the submission's."""
    try:
        result = request(*args, **kwargs)
    except CaseAborted as aborted:
        raise GraderError(f"the answer key's worker, timing its stage: {aborted.message}") from None
    value, error = result if isinstance(result, tuple) else (None, result)
    if error is not None:
        raise GraderError(f"the answer key could not be timed: {error.get('message', error)}")
    return value


def _key_prepared(key, stage) -> tuple[None, dict | None]:
    """The answer key's stage found in ``key``: (None, None), or (None, why not)."""
    prepared = key.prepare(stage.op.name, stage.name)
    return None, (None if prepared.get("ok") else {"message": prepared.get("message", "its stage was not found")})


def fresh_output_wrong(stage, size, draws: list[tuple], outputs: list,
                       reference: Callable[[int], np.ndarray | None] = lambda k: None) -> tuple[str, str] | None:
    """(reason, message) if an output of the calls on fresh inputs after timing is wrong, else None.
    Output i is of draw (i + 1) % len(draws), in the buffers that held draw i while it was timed
    (``watch.fresh_outputs``). Unwritten: the work was not done when the call's stream was synchronized
    ("not-done"); the answer for draw i: kept from an earlier call ("stale"); else a kernel wrong there.
    ``reference(k)``: draw k's reference where the grader keeps it (None: computed here)."""
    for i, out in enumerate(outputs):
        k = (i + 1) % len(draws)
        held, before = draws[k], draws[i]
        checked = judge(stage, size, held, out, held, reference=reference(k))
        if not checked.failed:
            continue
        where = "called on new inputs in buffers it had been timed on, its output once the call's stream was done"
        if checked.reason == "unwritten":
            return "not-done", f"{where}: {checked.message}"
        if not judge(stage, size, before, out, before, reference=reference(i)).failed:
            return "stale", f"{where} is the answer for the inputs those buffers held before (a result kept)"
        return checked.reason or "wrong-values", f"wrong at the timing size: {checked.message}"
    return None
