"""Prepared launches: pay for a numba launch's Python work once, then launch for about a microsecond.

What ``kernel[grid, block](a, b)`` does on every call, measured by numba-cuda's own tracker on an H200
(issue 17): find the compiled overload for the arguments' numba types, then turn each argument into
the flat list the kernel's ABI takes (an array becomes meminfo, parent, size, itemsize, data pointer,
shape..., strides...: about 3.5-4 µs an array, more for a torch tensor, whose
``__cuda_array_interface__`` dict is built on every read), then call the driver. About 26 µs for a
kernel of two arrays, against 7 µs for torch's ``x.add_(1)``.

None of that work depends on anything but the arguments' identity, so it can be done once:

* :class:`KernelLaunch` flattens one launch's arguments once, packs them as the ``void**`` array
  ``cuLaunchKernel`` takes, and keeps the driver function: a call is one ``cuLaunchKernel``.
* :class:`Graph` captures a sequence of launches into a CUDA graph: a call is one ``cuGraphLaunch``,
  however many kernels it holds.
* :class:`PreparedCall` is the fast calling path for any workbench stage (a proposal for
  ``Stage``, issue 17): the first call with a set of arguments runs the stage's own launcher while
  recording its launches, and later calls with the same argument objects replay them as one graph.
  It checks the arguments once, when it prepares them, as the stage itself would.
* :func:`host_time_per_call` measures what a Python caller pays per call.

A replay launches the very kernels, grids and argument values of the recorded call, so it is only
valid while those buffers live and hold their place: plans are keyed by the argument objects'
identity (a torch tensor's ``data_ptr`` is checked too), keep the recorded arrays alive, and are
dropped with :meth:`PreparedCall.clear`. A launcher that does anything but launch kernels (a host
copy, a memset, an allocation per call) cannot be replayed: recording finds launches whose
arguments differ between two runs and refuses them with a clear error.

Recording relies on numba-cuda 0.30's launch path: ``numba.cuda.dispatcher`` hands every launch
to ``cuda.core.launch(stream, config, kernel, *flat_args)``, which :func:`recording_launches`
wraps for the duration of one call. It is the one place here that reaches below numba's public API;
an upgrade that changes it makes recording find no launch, which raises :class:`PreparedCallError`
instead of replaying nothing.

In numba's simulator there is no driver: everything here falls back to calling the launcher.
"""

from __future__ import annotations

import ctypes
import time
import weakref
from contextlib import contextmanager
from typing import Callable, Sequence

from . import device as _device
from . import timing
from .ladder import as_numba_view


class PreparedCallError(RuntimeError):
    """A launch that cannot be prepared or replayed; the message says why."""


# -- the driver, through cuda.bindings --------------------------------------------------------------

def _driver():
    from cuda.bindings import driver

    return driver


def _ok(result, what: str):
    """cuda.bindings returns (CUresult, values...): raise on an error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise PreparedCallError(f"{what} failed: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else values


def cufunction(handle):
    """A ``CUfunction`` for the context's current device from numba's or cuda.core's kernel handle
    (numba-cuda 0.30 loads kernels as library kernels, ``CUkernel``)."""
    driver = _driver()
    if isinstance(handle, driver.CUfunction):
        return handle
    kernel = handle if isinstance(handle, driver.CUkernel) else driver.CUkernel(int(handle))
    return _ok(driver.cuKernelGetFunction(kernel), "cuKernelGetFunction")


def _dim3(d) -> tuple[int, int, int]:
    d = (int(d),) if isinstance(d, int) else tuple(int(v) for v in d)
    return (d + (1, 1, 1))[:3]


# -- packing a flat argument list ---------------------------------------------------------------------

def pack(flat: Sequence) -> tuple[ctypes.Array, list]:
    """The ``void**`` array ``cuLaunchKernel`` takes for a flat argument list, and the ctypes values it
    points into (keep both alive). A Python int is pointer-sized (intptr_t) and a bool one byte, as
    ``cuda.core.launch`` passes them; ctypes scalars (numba's integer and float arguments) as they are."""
    holders = []
    for v in flat:
        if isinstance(v, bool):
            holders.append(ctypes.c_bool(v))
        elif isinstance(v, int):
            holders.append(ctypes.c_ssize_t(v))
        elif isinstance(v, float):
            holders.append(ctypes.c_double(v))
        elif isinstance(v, (ctypes.c_bool, ctypes.c_int8, ctypes.c_uint8, ctypes.c_int16, ctypes.c_uint16,
                            ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float,
                            ctypes.c_double, ctypes.c_void_p)):
            holders.append(v)
        else:
            raise PreparedCallError(f"cannot pack a kernel argument of type {type(v).__name__}")
    params = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
    return params, holders


def flatten(value, numba_type=None) -> list:
    """One kernel argument as the flat list numba's kernel ABI takes. An array (numba's, or anything
    with ``__cuda_array_interface__``, read once here): meminfo, parent, size, itemsize, data pointer,
    shape..., strides in bytes. An int: int64; a float: float64; a bool: one byte."""
    import numpy as np

    if isinstance(value, bool):
        return [value]
    if isinstance(value, (int, np.integer)):
        return [ctypes.c_int64(int(value))]
    if isinstance(value, (float, np.floating)):
        return [ctypes.c_double(float(value))]
    from numba import cuda

    a = value if hasattr(value, "device_ctypes_pointer") else cuda.as_cuda_array(value)
    ptr = a.device_ctypes_pointer.value or 0
    return [0, 0, int(a.size), int(a.dtype.itemsize), int(ptr), *map(int, a.shape), *map(int, a.strides)]


# -- one kernel launch, prepared -----------------------------------------------------------------------

class KernelLaunch:
    """``kernel[grid, block, stream, shared_bytes](*args)`` with everything but the driver call done
    once: the overload found, the arguments flattened and packed. Calling it launches it again with
    the same arguments (the same buffers: their contents may change between calls)."""

    def __init__(self, function, grid, block, flat_args: Sequence, shared_bytes: int = 0, keep=(), py_func=None,
                 cluster=1):
        self.function = function
        self.py_func = py_func  # the kernel's Python function, where known: the grader's record of a launch
        self.grid, self.block = _dim3(grid), _dim3(block)
        self.cluster = _dim3(cluster)  # blocks a thread-block cluster (sm_90): (1, 1, 1) launches without clusters
        self.shared_bytes = int(shared_bytes)
        self.flat_args = list(flat_args)
        self.params, self._holders = pack(self.flat_args)
        self.params_address = ctypes.addressof(self.params)
        self.keep = tuple(keep)  # the arrays the flat arguments point into

    @classmethod
    def of(cls, kernel, grid, block, args: Sequence, shared_bytes: int = 0, cluster=1) -> "KernelLaunch":
        """Prepare numba kernel ``kernel`` (a ``@cuda.jit`` dispatcher) for ``args``, compiling it if needed."""
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        overload = kernel.compile(argtypes)
        flat = [v for a, t in zip(args, argtypes) for v in flatten(a, t)]
        return cls(cufunction(overload.library.get_cufunc().handle), grid, block, flat, shared_bytes, keep=args,
                   py_func=kernel.py_func, cluster=cluster)

    def launch(self, stream=0) -> None:
        gx, gy, gz = self.grid
        bx, by, bz = self.block
        if self.cluster != (1, 1, 1):
            err = _driver().cuLaunchKernelEx(self.launch_config(stream), self.function, self.params_address, 0)
            if int(err[0]) != 0:
                raise PreparedCallError(f"cuLaunchKernelEx (clusters of {self.cluster}) failed: {err[0].name}")
            return
        err = _driver().cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz, self.shared_bytes, stream,
                                       self.params_address, 0)
        if int(err[0]) != 0:
            raise PreparedCallError(f"cuLaunchKernel failed: {err[0].name}")

    def launch_config(self, stream=0):
        """The ``CUlaunchConfig`` of this launch, its cluster shape as a launch attribute (numba's launch
        has no parameter for one: this is the driver's own way, ``cuLaunchKernelEx``)."""
        driver = _driver()
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = self.grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block
        config.sharedMemBytes = self.shared_bytes
        config.hStream = driver.CUstream(int(stream))
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = self.cluster
        config.attrs = [attribute]
        config.numAttrs = 1
        return config

    def max_active_clusters(self) -> int:
        """How many clusters of this launch's shape the device can hold at once (its shared memory and
        threads a block, the SMs of each GPC): the most a persistent grid of clusters should launch."""
        return int(_ok(_driver().cuOccupancyMaxActiveClusters(self.function, self.launch_config()),
                       "cuOccupancyMaxActiveClusters"))

    def __call__(self, stream=0) -> None:  # through launch, which the grader watches
        self.launch(stream)

    def same_as(self, other: "KernelLaunch") -> bool:
        return (int(self.function) == int(other.function) and self.grid == other.grid and self.block == other.block
                and self.cluster == other.cluster and self.shared_bytes == other.shared_bytes
                and _values(self.flat_args) == _values(other.flat_args))


def _values(flat) -> list:
    return [v.value if hasattr(v, "value") else v for v in flat]


class Graph:
    """A sequence of prepared launches captured once into a CUDA graph; calling it launches the graph
    on the default stream, so it is ordered with every other default-stream launch (numba's, torch's)."""

    def __init__(self, launches: Sequence[KernelLaunch]):
        driver = _driver()
        if not launches:
            raise PreparedCallError("a graph needs at least one launch")
        self.launches = list(launches)
        stream = _ok(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
        try:
            _ok(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture")
            try:
                for k in self.launches:
                    k.launch(stream)
            finally:
                graph = _ok(driver.cuStreamEndCapture(stream), "cuStreamEndCapture")
            self.graph = graph
            self.exec = _ok(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            _ok(driver.cuStreamDestroy(stream), "cuStreamDestroy")
        self.default_stream = driver.CUstream(0)

    def launch(self) -> None:
        err = _driver().cuGraphLaunch(self.exec, self.default_stream)
        if int(err[0]) != 0:
            raise PreparedCallError(f"cuGraphLaunch failed: {err[0].name}")

    def __call__(self) -> None:  # through launch, which the grader watches
        self.launch()

    def __len__(self) -> int:
        return len(self.launches)


# -- recording what a launcher launches -------------------------------------------------------------

@contextmanager
def recording_launches():
    """Within the block, every numba kernel launch still runs, and is also recorded as a
    :class:`KernelLaunch` in the list the block receives."""
    from numba.cuda import dispatcher as numba_dispatcher

    real = getattr(numba_dispatcher, "launch", None)
    if real is None:
        raise PreparedCallError("this numba-cuda does not launch through cuda.core.launch: nothing to record "
                                "(recording was written for numba-cuda 0.30)")
    seen: list[KernelLaunch] = []

    def record(stream, config, kernel, *flat):
        if getattr(config, "is_cooperative", False) or getattr(config, "cooperative_launch", False):
            raise PreparedCallError("a cooperative launch cannot be recorded")
        if int(getattr(stream, "handle", 0) or 0) != 0:
            raise PreparedCallError("a launch on a stream other than the default one cannot be recorded")
        seen.append(KernelLaunch(cufunction(kernel.handle), config.grid, config.block, flat,
                                 getattr(config, "shmem_size", 0) or 0, keep=_current_launch_args()))
        return real(stream, config, kernel, *flat)

    numba_dispatcher.launch = record
    try:
        yield seen
    finally:
        numba_dispatcher.launch = real


def _current_launch_args() -> tuple:
    """The Python arguments of the launch numba is making (its arrays: a replay must keep them alive,
    scratch buffers included), or () where this numba-cuda does not say."""
    try:
        from numba.cuda.cext import _dispatcher as numba_cext

        return tuple(numba_cext.get_current_launch_args() or ())
    except (ImportError, AttributeError):
        return ()


def record(launcher: Callable, args: tuple) -> list[KernelLaunch]:
    """Run ``launcher(*args)`` once (it computes its result as usual) and return its launches."""
    with recording_launches() as seen:
        launcher(*args)
    return seen


# -- the fast calling path for a stage --------------------------------------------------------------

class _Plan:
    def __init__(self, args: tuple, value):
        self.refs = [_ref(a) for a in args]
        self.pointers = [_data_ptr(a) for a in args]
        self.value = value

    def matches(self, args: tuple) -> bool:
        for ref, ptr, a in zip(self.refs, self.pointers, args):
            if ref() is not a:
                return False
            if ptr is not None and a.data_ptr() != ptr:  # a torch tensor given new storage in place
                return False
        return True


def _ref(a):
    try:
        return weakref.ref(a)
    except TypeError:  # ints, floats: held (and compared) by value
        return lambda a=a: a


def _data_ptr(a):
    return a.data_ptr() if callable(getattr(a, "data_ptr", None)) else None


class PlanCache:
    """Something prepared for a set of argument objects (a launch, a graph), found again by their
    identity: ``get(args, make)`` returns ``make()``'s value the first time and the same value while
    the same objects are passed (a torch tensor's ``data_ptr`` must not have changed either). The
    ``max_plans`` most recent sets are kept; a plan holds references to what it was made from only
    through ``make``'s value (keep its arrays there)."""

    def __init__(self, max_plans: int = 128):
        self.max_plans = max_plans
        self.plans: dict[tuple, _Plan] = {}

    def find(self, args: tuple):
        """The value kept for these very objects, or None."""
        plan = self.plans.get(tuple(map(id, args)))
        return plan.value if plan is not None and plan.matches(args) else None

    def add(self, args: tuple, value):
        if len(self.plans) >= self.max_plans:
            self.plans.pop(next(iter(self.plans)))
        self.plans[tuple(map(id, args))] = _Plan(args, value)
        return value

    def get(self, args: tuple, make: Callable):
        """``find(args)``, or ``make()`` kept for them."""
        value = self.find(args)
        return value if value is not None else self.add(args, make())

    def clear(self) -> None:
        self.plans.clear()

    def __len__(self) -> int:
        return len(self.plans)


class PreparedCall:
    """Call ``launcher`` (a stage, or any function that only launches numba kernels on the default
    stream) at the cost of one graph launch.

    The first call with a set of argument objects checks them (``validate``; a stage's operator's by
    default), runs the launcher once recording its launches (that call computes its result as
    usual), and runs it a second time to make sure the launches do not change from call to call.
    Later calls with the same objects replay the recorded launches as one CUDA graph (or, with
    ``use_graph=False``, as prepared launches one by one).
    """

    def __init__(self, launcher: Callable, validate: Callable | None = None, *, max_plans: int = 128,
                 use_graph: bool = True):
        self.launcher = getattr(launcher, "launch", launcher)  # a Stage: its raw launcher
        self.validate = validate if validate is not None else getattr(getattr(launcher, "op", None), "validate", None)
        self.use_graph = use_graph
        self.plans = PlanCache(max_plans)
        self.simulated = _device.is_simulator()

    def __call__(self, *args):
        if self.simulated:  # no driver to prepare against: the launcher, checked, as the stage would be
            if self.validate is not None:
                self.validate(*args)
            return self.launcher(*args)
        replay = self.plans.find(args)
        if replay is None:
            self.plans.add(args, self.prepare(args))  # the recording run did this call's work
        else:
            replay()

    def prepare(self, args: tuple):
        """Check ``args``, run the launcher on them while recording (this call's result), keep the replay.
        The recording run does this call's work."""
        if self.validate is not None:
            self.validate(*args)
        # A raw launcher uses numba's array attributes: torch/CuPy tensors are recorded through numba
        # views of the same memory (the replay launches on the same pointers).
        args = tuple(as_numba_view(a) for a in args)
        first = record(self.launcher, args)
        if not first:
            raise PreparedCallError("the launcher launched no numba kernel that could be recorded")
        second = record(self.launcher, args)  # the same work again: harmless, and proves it is replayable
        if len(first) != len(second) or not all(a.same_as(b) for a, b in zip(first, second)):
            raise PreparedCallError("the launcher's launches change from call to call (a buffer allocated per "
                                    "call?): they cannot be replayed")
        graph = Graph(first) if self.use_graph else None
        keep = (tuple(args), first)

        def replay(graph=graph, launches=first, keep=keep):
            if graph is not None:
                graph.launch()
            else:
                for k in launches:
                    k.launch(0)
        return replay

    def clear(self) -> None:
        self.plans.clear()


# -- what a Python caller pays ------------------------------------------------------------------------

def host_time_per_call(fn: Callable, args: tuple, calls: int = 200, repeats: int = 5) -> dict:
    """Host time of ``fn(*args)`` as a Python loop pays it: ``enqueue_us``, the median over ``repeats``
    of (``calls`` calls back to back, then one synchronize) / ``calls``, which is the launch overhead
    when the kernels are shorter than it; and ``call_sync_us``, the median of one call followed by a
    synchronize (the harness's ``host_call_us``: overhead + GPU time + the wait). Also ``gpu_us``: the
    GPU's time per call, from CUDA events on the default stream around the same loop queued behind a sleep
    (so no wait for the host falls inside them). When the GPU is the slower side (a graph replay of many
    small kernels), ``enqueue_us`` approaches it; when the host is descheduled (other processes loading the
    CPUs), ``enqueue_us`` grows and ``gpu_us`` does not."""
    import numpy as np
    from numba import cuda

    fn(*args)
    cuda.synchronize()
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        cuda.synchronize()
        loops.append((time.perf_counter() - t0) * 1e6 / calls)
    # The GPU's own time: the same loop queued behind a sleep that outlasts the enqueueing, so the GPU
    # never waits for the host inside the events (it would when the host is slower than the kernels, or
    # descheduled by other processes); a sample whose sleep ran out first is taken again, sleeping longer.
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    hold_us = 2 * calls * max(loops) + 50
    gpu = []
    for _ in range(repeats):
        for _attempt in range(timing.STARVED_RETAKES + 1):
            timing.keep_gpu_busy(hold_us)
            start.record()
            for _ in range(calls):
                fn(*args)
            starved = hasattr(start, "query") and start.query()  # (the simulator's events cannot say)
            end.record()
            end.synchronize()
            if not starved:
                break
            hold_us *= 2
        gpu.append(cuda.event_elapsed_time(start, end) * 1e3 / calls)
    singles = []
    for _ in range(20):
        t0 = time.perf_counter()
        fn(*args)
        cuda.synchronize()
        singles.append((time.perf_counter() - t0) * 1e6)
    return {"enqueue_us": float(np.median(loops)), "call_sync_us": float(np.median(singles)),
            "gpu_us": float(np.median(gpu)), "calls": calls}
