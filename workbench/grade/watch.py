"""Watching one call of a submission's launcher: what it launched, what it was refused, what it raised.

:func:`run_watched` is the whole of a call, wherever the submission runs (the grading worker, or the
notebook for ``grade_function``): the inputs copied to the device, the output poisoned, the launcher
run under the :class:`Watch` and the device-array guard, and the outputs copied back. It returns plain
facts (:class:`CallOutcome`); the grader judges them elsewhere.
"""

from __future__ import annotations

import os
import time
import traceback
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import device as _device
from ..check import poison_like
from .guards import Guard, HostAccessRefused, Refusal
from .submission import describe, python_function


@dataclass
class CallOutcome:
    out: np.ndarray | None  # the output as the call left it (None if the call raised)
    inputs_after: list  # the inputs as the call left them
    error: dict | None = None  # {"reason", "message"} if the launcher raised
    launches: list = field(default_factory=list)  # submission.describe() of each kernel launched
    refusals: list = field(default_factory=list)  # guards.Refusal
    seconds: float = 0.0


@contextmanager
def _patched(owner, name, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


class Watch:
    """While active: record the kernels launched, and fill new device buffers (``cuda.device_array``)
    with garbage (poison), as fresh device memory can hold on a GPU."""

    def __init__(self):
        self.kernels: list = []  # the Python functions of the kernels launched, in order
        self._stack = ExitStack()

    def __enter__(self) -> "Watch":
        from numba import cuda

        if _device.is_simulator():
            from ..simulator import record_launches

            self._recorded = self._stack.enter_context(record_launches())
        else:
            from numba.cuda import dispatcher

            original_call, watch = dispatcher.CUDADispatcher.call, self

            def call(disp, args, launch_config):
                watch.kernels.append(disp.py_func)
                return original_call(disp, args, launch_config)

            self._stack.enter_context(_patched(dispatcher.CUDADispatcher, "call", call))
        for name in ("device_array", "device_array_like"):
            self._stack.enter_context(_patched(cuda, name, _poisoned(getattr(cuda, name))))
        return self

    def __exit__(self, *exc) -> bool:
        if _device.is_simulator():
            self.kernels += [py for py, _ in self._recorded]
        self._stack.close()
        return False


def _poisoned(allocate: Callable) -> Callable:
    def allocate_poisoned(*args, **kwargs):
        arr = allocate(*args, **kwargs)
        arr.copy_to_device(poison_like(np.empty(arr.shape, arr.dtype)))
        return arr

    return allocate_poisoned


def run_watched(launch: Callable, inputs: tuple, out: np.ndarray, guard: Guard, submission_file: str | None,
                max_threads: int | None = None) -> CallOutcome:
    """Run ``launch(*inputs, out)`` on device copies (``out`` arrives poisoned) and report the facts.
    In the simulator, launches past ``max_threads`` CUDA threads in all are refused (too slow to run:
    "needs a GPU", never a hang)."""
    from numba import cuda

    d_inputs = [cuda.to_device(np.ascontiguousarray(a)) for a in inputs]
    d_out = cuda.to_device(out)
    cuda.synchronize()
    guard.take()  # refusals before this call were reported with their own phase
    error = None
    t0 = time.perf_counter()
    watch = Watch()
    try:
        with guard.call(d_out), watch, _thread_budget(max_threads):
            launch(*d_inputs, d_out)
            cuda.synchronize()
    except BaseException as exc:  # the learner's code: SystemExit and all, reported, never raised here
        if isinstance(exc, KeyboardInterrupt):
            raise
        error = classify(exc, submission_file)
    seconds = time.perf_counter() - t0
    launched = {id(f): f for f in map(python_function, watch.kernels) if f is not None}
    outcome = CallOutcome(None, [], error, [describe(f) for f in launched.values()], guard.take(), seconds)
    if error is None:
        outcome.out = d_out.copy_to_host()
        outcome.inputs_after = [d.copy_to_host() for d in d_inputs]
    return outcome


def simulated_device(sm_count: int | None):
    """In the simulator, a device with ``sm_count`` multiprocessors (a context manager), so that grids
    sized from the SM count are small and a missing grid-stride loop shows at small sizes."""
    if not sm_count or not _device.is_simulator():
        return nullcontext()
    from ..simulator import simulated_sm_count

    return simulated_sm_count(sm_count)


def threads_in(seconds: float) -> int:
    """About how many CUDA threads the simulator runs in ``seconds``."""
    from ..simulator import estimated_seconds

    return int(seconds / estimated_seconds(1))


def _thread_budget(max_threads: int | None):
    if max_threads is None or not _device.is_simulator():
        return nullcontext()
    from ..simulator import thread_budget

    return thread_budget(max_threads)


# -- what the exception says -------------------------------------------------------------------------

def classify(exc: BaseException, submission_file: str | None) -> dict:
    """{"reason", "message"} for an exception a submission raised, naming the line of the submission
    where it happened."""
    from ..simulator import LaunchLimitError, NeedsGPU, RaceError, WarpSyncError

    name = type(exc).__name__
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    where = _where(exc, submission_file)
    if isinstance(exc, SystemExit):
        return {"reason": "exited", "message": f"the stage called exit({exc.code!r}){where}"}
    if isinstance(exc, HostAccessRefused):
        return {"reason": "host-copy", "message": f"{first}{where}"}
    if isinstance(exc, NeedsGPU):
        return {"reason": "needs-gpu", "message": f"{text}{where}"}
    if isinstance(exc, RaceError):
        return {"reason": "race", "message": f"a data race{where}: {text[:1500]}"}
    if isinstance(exc, IndexError):
        return {"reason": "out-of-bounds", "message": f"out-of-bounds access{where}: {first}. Missing bounds check?"}
    if isinstance(exc, LaunchLimitError):
        return {"reason": "launch-limit", "message": f"launch refused{where}: {first}"}
    if isinstance(exc, WarpSyncError):
        return {"reason": "warp-sync", "message": f"{name}{where}: {text}"}
    if type(exc).__module__.startswith("numba") and ".errors" in type(exc).__module__:
        return {"reason": "compile-error", "message": f"{name}{where}: {text[:1500]}"}
    return {"reason": "exception", "message": f"{name}{where}: {first}"}


def import_error_text(exc: BaseException, submission_file: str) -> str:
    """Why a file did not import: the lines of the file the error passed through, and the error
    (a SyntaxError names its own line)."""
    from .targets import display_path

    target = os.path.realpath(submission_file)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) == target]
    lines = [f"  {display_path(f.filename)}, line {f.lineno}: {(f.line or '').strip()}" for f in frames[-3:]]
    error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return "\n".join([f"importing {display_path(submission_file)} failed:", *lines, error])


def _where(exc: BaseException, submission_file: str | None) -> str:
    if not submission_file:
        return ""
    from .targets import display_path

    target = os.path.realpath(submission_file)
    mine = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) == target]
    if not mine:
        return ""
    f = mine[-1]
    return f" at {display_path(f.filename)}, line {f.lineno} (`{(f.line or '').strip()}`)"


def refusal_facts(refusals: list[Refusal]) -> list[dict]:
    return [{"reason": r.reason, "what": r.what} for r in refusals]
