"""Watching one call of a submission's launcher: what it launched, what it was refused, what it raised.

:func:`run_watched` is the whole of a call, wherever the submission runs (the grading worker, or the
notebook for ``grade_function``): the inputs copied to the device, the output poisoned, the launcher
run under the :class:`Watch` and the device-array guard, and the outputs copied back. It returns plain
facts (:class:`CallOutcome`); the grader judges them elsewhere.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import device as _device
from ..check import poison_like
from .. import ladder
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

    def __init__(self, on_compiling: Callable[[float | None], None] | None = None):
        self.kernels: list = []  # the Python functions of the kernels launched, in order
        # On a GPU, told None as numba starts compiling a kernel, then the seconds it took.
        self.on_compiling = on_compiling
        self.compiling = False  # inside a compile already (its device functions compile within it)
        self._stack = ExitStack()

    def __enter__(self) -> "Watch":
        from numba import cuda

        if _device.is_simulator():
            from ..simulator import record_launches

            self._recorded = self._stack.enter_context(record_launches())
        else:
            from numba.cuda import dispatcher

            watch = self
            original_call, original_compile = dispatcher.CUDADispatcher.call, dispatcher.CUDADispatcher.compile

            def call(disp, args, launch_config):
                watch.kernels.append(disp.py_func)
                check_launch_limits(launch_config.griddim, launch_config.blockdim)
                return original_call(disp, args, launch_config)

            def compile(disp, sig):
                # Every compile goes through here (a launch's, set_max_dynamic_shared_memory's): tens of
                # seconds on a busy machine, which the supervisor must not count against the call's runaway
                # limit, so it hears when compiling starts and how long it took. Only the outermost compile
                # speaks (a kernel's compile compiles its device functions inside it).
                if watch.on_compiling is None or watch.compiling or not will_compile(disp, sig):
                    return original_compile(disp, sig)
                watch.compiling = True
                watch.on_compiling(None)
                t0 = time.perf_counter()
                try:
                    return original_compile(disp, sig)
                finally:
                    watch.compiling = False
                    watch.on_compiling(time.perf_counter() - t0)

            self._stack.enter_context(_patched(dispatcher.CUDADispatcher, "call", call))
            self._stack.enter_context(_patched(dispatcher.CUDADispatcher, "compile", compile))
            self._watch_prepared_launches()
        for name in ("device_array", "device_array_like"):
            self._stack.enter_context(_patched(cuda, name, _poisoned(getattr(cuda, name))))
        return self

    def _watch_prepared_launches(self) -> None:
        """Launches that skip numba's dispatcher: a prepared ``cuLaunchKernel`` and a CUDA graph's
        ``cuGraphLaunch`` (workbench.prepared, the launch_overhead ladder's tools) are launches too."""
        from .. import prepared

        watch = self
        kernel_launch, graph_launch = prepared.KernelLaunch.launch, prepared.Graph.launch

        def launch_prepared(k, stream=0):
            watch.kernels.append(k.py_func)
            check_launch_limits(k.grid, k.block)
            return kernel_launch(k, stream)

        def launch_graph(g):
            watch.kernels += [k.py_func for k in g.launches]
            return graph_launch(g)

        self._stack.enter_context(_patched(prepared.KernelLaunch, "launch", launch_prepared))
        self._stack.enter_context(_patched(prepared.Graph, "launch", launch_graph))

    def __exit__(self, *exc) -> bool:
        if _device.is_simulator():
            self.kernels += [py for py, _ in self._recorded]
        self._stack.close()
        return False


def will_compile(dispatcher, sig) -> bool:
    """Whether ``dispatcher.compile(sig)`` compiles: no overload yet for the signature's argument types
    (numba's own lookup); a signature it cannot read is counted as compiling."""
    if getattr(dispatcher, "specialized", False):
        return False
    try:
        from numba.cuda.core import sigutils

        return tuple(sigutils.normalize_signature(sig)[0]) not in dispatcher.overloads
    except Exception:
        return True


# The limits every CUDA GPU since compute capability 3.0 enforces on a launch. The driver refuses a
# launch past them with a bare CUDA_ERROR_INVALID_VALUE; the grader says which limit instead (the
# simulator refuses the same launches with the same LaunchLimitError).
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024


def _dims(dims) -> tuple:
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def check_launch_limits(griddim, blockdim) -> None:
    """Raise the simulator's LaunchLimitError, naming the limit, for a launch a GPU would refuse."""
    from ..simulator import LaunchLimitError

    grid, block = _dims(griddim), _dims(blockdim)
    for name, dims, limits in (("gridDim", grid, MAX_GRID), ("blockDim", block, MAX_BLOCK)):
        for axis, n, limit in zip("xyz", dims, limits):
            if n > limit:
                where = (" (a grid's y and z dimensions hold at most 65535 blocks: put the long dimension "
                         "on x, or loop over it)") if name == "gridDim" and axis != "x" else ""
                raise LaunchLimitError(f"{name}.{axis} = {n} exceeds its limit of {limit}{where}")
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise LaunchLimitError(f"a block of {' x '.join(map(str, block))} = {threads} threads exceeds the "
                               f"limit of {MAX_THREADS_PER_BLOCK} threads per block")


# -- what the grader's own copies rely on, as it was before the submission was imported ------------------

class Primitives:
    """The functions the worker's own copies to and from the device go through, taken before the
    submission is imported, and a check that they are still in place. A submission that replaces one
    (``copy_to_host`` returning a forged answer, a driver copy, ``cuda.to_device``) is refused as
    "tampered": the worker copies the outputs back with the functions taken here, never with the
    ones the submission could have replaced."""

    def __init__(self):
        from numba import cuda

        self.places: list = []  # (owner, name, the value taken)
        self.copy_to_host = None
        if _device.is_simulator():
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as Array

            owners = [(Array, ("copy_to_host", "copy_to_device", "__getattr__", "__getitem__"))]
        else:
            from numba.cuda.cudadrv import devicearray, driver

            Array = devicearray.DeviceNDArrayBase
            owners = [(Array, ("copy_to_host", "copy_to_device", "device_ctypes_pointer", "alloc_size")),
                      (devicearray.DeviceNDArray, tuple(n for n in ("copy_to_host", "__getitem__")
                                                        if n in devicearray.DeviceNDArray.__dict__)),
                      (driver, ("device_to_host", "host_to_device", "device_pointer", "device_ctypes_pointer",
                                "host_pointer"))]
        owners.append((cuda, ("to_device", "device_array", "device_array_like", "synchronize", "event",
                              "event_elapsed_time")))
        # The clocks and the workbench's timer that the speed bar is measured with (in this process): a
        # submission that replaces one would decide its own time.
        from .. import timing

        owners += [(time, ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time")),
                   (timing, ("measure", "_elapsed_us"))]
        if not _device.is_simulator():
            from numba.cuda.cudadrv import driver

            owners.append((driver.Event, ("record", "synchronize", "wait", "elapsed_time")))
        for owner, names in owners:
            for name in names:
                if name in vars(owner):
                    self.places.append((owner, name, vars(owner)[name]))
        self.copy_to_host = vars(Array)["copy_to_host"]
        self.to_device = cuda.to_device
        self.synchronize = cuda.synchronize

    def replaced(self) -> list[str]:
        """What the submission has replaced since (empty: nothing)."""
        return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, value in self.places
                if vars(owner).get(name) is not value]


_primitives: Primitives | None = None


def take_primitives() -> Primitives:
    """Take them (once per process, before the submission is imported: the worker does it first)."""
    global _primitives
    if _primitives is None:
        _primitives = Primitives()
    return _primitives


def _poisoned(allocate: Callable) -> Callable:
    def allocate_poisoned(*args, **kwargs):
        arr = allocate(*args, **kwargs)
        poison = poison_like(np.empty(arr.shape, arr.dtype))
        if ladder.moved_as_bits(arr.dtype):
            arr.view(np.uint16).copy_to_device(poison.view(np.uint16))
        else:
            arr.copy_to_device(poison)
        return arr

    return allocate_poisoned


def _to_device(own: Primitives, host: np.ndarray):
    """A device copy through the grader's own primitive, of any dtype a stage takes: numba-cuda refuses to
    copy ml_dtypes' bfloat16 (its buffer protocol has no such format), so it travels as its 16-bit patterns,
    as ``ladder.to_device`` moves it."""
    host = np.ascontiguousarray(host)
    if ladder.moved_as_bits(host.dtype):
        return own.to_device(host.view(np.uint16)).view(host.dtype)
    return own.to_device(host)


def _to_host(own: Primitives, dev) -> np.ndarray:
    """A host copy through the grader's own primitive (bfloat16 as its 16-bit patterns, as in _to_device)."""
    if ladder.moved_as_bits(dev.dtype):
        return own.copy_to_host(dev.view(np.uint16)).view(dev.dtype)
    return own.copy_to_host(dev)


def run_watched(launch: Callable, inputs: tuple, out: np.ndarray, guard: Guard, submission_file: str | None,
                max_threads: int | None = None, on_compiling: Callable[[float | None], None] | None = None) -> CallOutcome:
    """Run ``launch(*inputs, out)`` on device copies (``out`` arrives poisoned) and report the facts.
    In the simulator, launches past ``max_threads`` CUDA threads in all are refused (too slow to run:
    "needs a GPU", never a hang). ``on_compiling`` hears of each launch that compiles (``Watch``)."""
    own = take_primitives()
    d_inputs = [_to_device(own, a) for a in inputs]
    d_out = _to_device(own, out)
    own.synchronize()
    guard.take()  # refusals before this call were reported with their own phase
    error = None
    threads_before = set(threading.enumerate())
    t0 = time.perf_counter()
    watch = Watch(on_compiling)
    try:
        with guard.call(d_out), watch, _thread_budget(max_threads):
            launch(*d_inputs, d_out)
            own.synchronize()
    except BaseException as exc:  # the learner's code: SystemExit and all, reported, never raised here
        if isinstance(exc, KeyboardInterrupt):
            raise
        error = classify(exc, submission_file)
    seconds = time.perf_counter() - t0
    launched = {id(f): f for f in map(python_function, watch.kernels) if f is not None}
    refusals = guard.take() + tampered(own)
    if error is None:  # (a launch that raised in the simulator leaves its simulated CUDA threads behind)
        refusals += threads_left(threads_before)
    outcome = CallOutcome(None, [], error, [describe(f) for f in launched.values()], refusals, seconds)
    if error is None:
        outcome.out = _to_host(own, d_out)
        outcome.inputs_after = [_to_host(own, d) for d in d_inputs]
    return outcome


# -- timing: fresh inputs, and only work that is done when the call's stream is synchronized counts ------

FRESH_DRAWS = 2  # different random draws of the inputs the speed bar is timed on (each a float64 reference to judge)


def timing_arg_sets(draws: list[tuple], template: np.ndarray, l2_bytes: int | None) -> list[tuple]:
    """Device argument sets to time a stage on, made before the timer starts: ``bench``'s rotating sets
    (enough that cycling through them leaves the L2 cache cold) for each draw, interleaved so that set
    i holds draw i % len(draws). The draws are different random inputs, never copies of one: an output
    kept from another set's call is a wrong output here."""
    from ..bench import rotating_arg_sets

    per_draw = [rotating_arg_sets(draw, template, l2_bytes, max_sets=max(1, 16 // len(draws))) for draw in draws]
    return [args for sets in zip(*per_draw) for args in sets]


def fresh_outputs(launch: Callable, arg_sets: list[tuple], draws: list[tuple]) -> list[np.ndarray]:
    """After timing: the first len(draws) argument sets are given new inputs (set i the draw after its
    own, i + 1) and a poisoned output, outside any timer; then the launcher is called once on each, as
    a timed call is, and each output copied back as soon as an event recorded after the call on the
    default stream has fired: what a timer waiting on that event counts as done. A result kept from an
    earlier call on the same buffers (by pointer, by shape) is stale here; work left running on another
    stream or thread has not written its output yet. Output i is judged against draw (i + 1) % len(draws)."""
    from numba import cuda

    from ..ladder import fill_from_host

    own = take_primitives()
    for i, args in enumerate(arg_sets[:len(draws)]):
        for device, host in zip(args[:-1], draws[(i + 1) % len(draws)]):
            fill_from_host(device, np.ascontiguousarray(host))
        fill_from_host(args[-1], poison_like(np.empty(args[-1].shape, args[-1].dtype)))
    own.synchronize()
    outputs = []
    for args in arg_sets[:len(draws)]:
        launch(*args)
        done = cuda.event()
        done.record()
        done.synchronize()
        outputs.append(_to_host(own, args[-1]))
    return outputs


def threads_left(before: set) -> list[Refusal]:
    """A refusal for the threads a call started and left running: the work a launcher hands to another
    thread (a kernel launched from it once the call has returned) is not done when the call's stream is
    synchronized, so a timer waiting on that stream would not count it. The simulator's own pool of
    threads (one per simulated CUDA thread, kept between launches, idle once a launch has returned) is
    the workbench's, not the call's."""
    left = [t for t in threading.enumerate() if t not in before and t.is_alive() and not _idle_simulator_thread(t)]
    if not left:
        return []
    names = ", ".join(t.name for t in left[:3])
    return [Refusal("thread", f"{len(left)} thread(s) it started ({names}) still running when the call returned")]


def _idle_simulator_thread(thread: threading.Thread) -> bool:
    return type(thread).__module__.startswith("workbench.simulator") and not getattr(thread, "busy", True)


def tampered(own: Primitives) -> list[Refusal]:
    """A refusal for each of the workbench's and numba's copy functions the submission replaced."""
    return [Refusal("tampered", f"{what} was replaced (monkeypatched)") for what in own.replaced()]


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
    if isinstance(exc, RaceError):  # (its "Fix:" paragraph goes: the advice says it, the likely cause first)
        text = "\n".join(line for line in text.splitlines() if not line.startswith("Fix:"))
        return {"reason": "race", "message": f"a data race{_race_where(exc, submission_file) or where}: {text[:1500]}"}
    fault = gpu_fault(exc)
    if fault:
        return {"reason": "gpu-fault", "message": f"{fault}{where} ({first})"}
    if isinstance(exc, IndexError):
        return {"reason": "out-of-bounds", "message": f"out-of-bounds access{where}: {first}. Missing bounds check?"}
    if isinstance(exc, LaunchLimitError):
        return {"reason": "launch-limit", "message": f"launch refused{where}: {first}"}
    if isinstance(exc, WarpSyncError):
        return {"reason": "warp-sync", "message": f"{name}{where}: {text}"}
    if type(exc).__module__.startswith("numba") and ".errors" in type(exc).__module__:
        return {"reason": "compile-error", "message": f"{name}{where}: {text[:1500]}"}
    return {"reason": "exception", "message": f"{name}{where}: {first}"}


# CUDA errors a kernel's own fault raises (at the launch or at the next synchronisation), by code, with
# their likely cause. After one of them the process's CUDA context is unusable: the worker is replaced.
GPU_FAULTS = {
    700: "an illegal memory address in your kernel: an index past the end of an array (a missing bounds "
         "check? a grid rounded up to whole blocks?) or past a shared array's size",
    701: "the launch needs more registers or shared memory than a block can have: fewer threads per block",
    702: "the kernel ran too long and was stopped by the driver: a loop that never ends?",
    715: "an illegal instruction in your kernel",
    716: "a misaligned memory access in your kernel: a wide load or store at an address that is not a "
         "multiple of its size (a reinterpreted view at an odd offset?)",
    718: "an invalid program counter in your kernel",
    719: "your kernel faulted (launch failure): an out-of-bounds access or a bad pointer, most likely",
}


def gpu_fault(exc: BaseException) -> str | None:
    """What a CUDA error raised by the submission's call means, if it is a kernel's fault; else None."""
    code = getattr(exc, "code", None)
    if code is None and exc.args and isinstance(exc.args[0], int):  # (the simulator's stand-in class)
        code = exc.args[0]
    if type(exc).__name__ not in ("CudaAPIError", "CudaDriverError") or code not in GPU_FAULTS:
        return None
    return f"the GPU reported a fault (CUDA error {code}): {GPU_FAULTS[code]}"


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


def _race_where(exc, submission_file: str | None) -> str:
    """The first of a race's two lines (the write, if one wrote) that is in the submission."""
    if not submission_file:
        return ""
    from .targets import display_path

    target = os.path.realpath(submission_file)
    for filename, line, text in getattr(exc, "places", []):
        if os.path.realpath(filename) == target:
            return f" at {display_path(filename)}, line {line} (`{text}`)"
    return ""


def refusal_facts(refusals: list[Refusal]) -> list[dict]:
    return [{"reason": r.reason, "what": r.what} for r in refusals]
