"""Make numba's CUDA simulator behave more like a GPU.

numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) runs each CUDA thread of a block as a Python thread,
one block after another. That makes kernels easy to debug, but the simulator is forgiving where a
GPU is not, and it lacks parts of numba's CUDA API. ``install()`` patches its classes in memory
(nothing on disk changes) so that:

* the warp intrinsics exist (``cuda.shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``,
  ``shfl_xor_sync``, ``ballot_sync``, ``any_sync``, ``all_sync``, ``eq_sync``, ``match_any_sync``,
  ``match_all_sync``, ``syncwarp``, ``activemask``, ``lanemask_lt``), with the semantics of PTX's
  ``shfl.sync``, ``vote.sync``, ``match.sync`` and ``bar.warp.sync`` as numba-cuda emits them, and
  with misuse that would hang or give undefined results on a GPU stopped by a :class:`WarpSyncError`
  that says what went wrong;
* data races are found (:mod:`workbench.simulator.races`): every access to global and shared
  memory is checked against the earlier ones, and two that conflict (different threads, at least
  one writing, nothing ordering them) stop the launch with a :class:`RaceError` naming the array,
  the index, the two threads and blocks and the source lines. On by default;
  ``WORKBENCH_SIM_RACECHECK=0`` or :func:`racecheck` turns it off;
* the simulated device has :func:`sm_count` multiprocessors (132, like an H100/H200, unless
  ``WORKBENCH_SIM_SM_COUNT`` or :func:`simulated_sm_count` says fewer): with few, a grid sized
  from the SM count is small, so a kernel that forgot its grid-stride loop fails at small sizes;
  ``cuda.get_current_device()`` reports it (``MULTIPROCESSOR_COUNT``) with the other usual limits;
* launches a GPU would refuse raise :class:`LaunchLimitError` (block and grid sizes, 48 KiB of
  shared memory per block), and, inside :func:`thread_budget`, launches too big to simulate in
  reasonable time raise :class:`TooManyThreads` before they start (:func:`simulated_threads`,
  :func:`estimated_seconds`);
* shared memory starts every block full of garbage (NaN for floats, the bytes of 0x7FFBADAD for
  everything else), as it does on a GPU, so reading it before writing it shows up instead of
  quietly reading zeros or the previous block's values;
* ``cuda.popc``, ``cuda.ffs`` and ``cuda.clz`` count bits in the width of their argument's type, as
  numba does (the simulator's versions assume a non-negative 32-bit value, which a ballot with lane
  31 set is not);
* the rest of what numba offers on a GPU works: ``cuda.libdevice`` (and ``numba.cuda.libdevice``)
  functions (:mod:`workbench.simulator.libdevice`), the cache-hint loads and stores
  (``cuda.ldcs``, ``cuda.stcs``, ...), ``cuda.nanosleep``, ``alignment=`` of shared and local
  arrays, and ``cuda.jit`` options that only matter to the compiler (``lineinfo``,
  ``launch_bounds``, ``max_registers``, ``fastmath``, ``cache``, ``forceinline``, ``lto``, ...);
  what the simulator cannot run (code linked with ``link=`` or ``cuda.declare_device``, a grid-wide
  ``this_grid().sync()`` over several blocks, a block waiting for a later one) raises
  :class:`NeedsGPU` with the reason, never a wrong answer;
* :func:`record_launches` lists every kernel launch with numba's types for its arguments, so the
  same kernels can be compiled for a real GPU elsewhere.

Warp intrinsics are rendezvous: each lane deposits its operand and sleeps until every lane of the
mask has; then each computes its own result from all the operands. To notice a rendezvous that can
never complete (a lane in the mask took another branch, sits in ``syncthreads()``, or returned), the
block scheduler is replaced too (see :class:`_Block`): numba's version polls every thread in a busy
loop and only knows about ``syncthreads()``.

One deliberate difference from PTX: a mask that names a lane which has returned from the kernel is
an error here. PTX just leaves exited lanes out of the wait, but a shuffle that reads one gets an
undefined value and a vote silently ignores it, so such a mask is almost always a bug (typically
an early ``return`` before a full-warp reduction); build masks with ``cuda.activemask()`` or
``cuda.ballot_sync`` instead.

Cost (measured on a 2-core CPU shared with other jobs, so only a guide): a simulated thread costs
0.1-1 ms, from a kernel with a few element accesses to one with hundreds; race checking adds 1-3 µs
per element access (30-50% on the access-heavy ladders: see workbench.simulator.races). Python
threads are reused from block to block and launch to launch, as starting one costs more than most
simulated threads do.
"""

import operator
import os
import queue
import sys
import threading
import time
from contextlib import contextmanager

import numba
import numpy as np

from . import counters as counting
from . import libdevice as libdevice_bodies
from . import races as race_detector
from .races import RaceError

if numba.config.ENABLE_CUDASIM:
    from numba.cuda import types as _cuda_types
    from numba.cuda.errors import normalize_kernel_dimensions
    from numba.cuda.np.numpy_support import as_dtype
    from numba.cuda.simulator import api as _api
    from numba.cuda.simulator import kernel as _kernel
    from numba.cuda.simulator import kernelapi as _kernelapi
    from numba.cuda.simulator.args import ArgHint, InOut
    from numba.cuda.simulator.cudadrv import devices as _devices
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray

    _TrackedGlobalArray = race_detector.make_global_array_class(FakeWithinKernelCUDAArray)

__all__ = [
    "FULL_MASK", "POISON_WORD", "WARP_SIZE", "DEFAULT_SM_COUNT", "SECONDS_PER_THREAD",
    "LaunchLimitError", "NeedsGPU", "RaceError", "TooManyThreads", "WarpSyncError",
    "install", "record_launches", "racecheck", "racecheck_enabled", "sm_count", "simulated_sm_count",
    "simulated_threads", "estimated_seconds", "thread_budget",
]

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF

# Limits of every CUDA GPU since compute capability 3.0.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
# Shared memory a block may use without the kernel opting in to more (cudaFuncSetAttribute with
# cudaFuncAttributeMaxDynamicSharedMemorySize, which numba does not do). Static shared memory
# (cuda.shared.array with a fixed shape) can never exceed it.
SHARED_MEMORY_PER_BLOCK = 48 * 1024

# What uninitialised shared memory holds here. As float32 and as float64 these bytes are NaN, so
# the untyped dynamic buffer is NaN whichever float type a kernel views it as; ints read 0x7FFBADAD.
POISON_WORD = 0x7FFBADAD
_POISON_BYTES = np.frombuffer(np.uint32(POISON_WORD).tobytes(), dtype=np.uint8)

# After a block fails, how long its launch waits for the other threads to notice and stop.
_UNWIND_SECONDS = 1.0

# The simulated device: an H100/H200 has 132 multiprocessors. Grading uses fewer (simulated_sm_count),
# so that grids sized from the SM count are small enough to show a missing grid-stride loop.
DEFAULT_SM_COUNT = 132
SM_COUNT_ENV = "WORKBENCH_SIM_SM_COUNT"
RACECHECK_ENV = "WORKBENCH_SIM_RACECHECK"

# Wall time per simulated thread, race checking on, on the 2-core development machine while other
# jobs ran: 0.13 ms for a persistent-grid sum (a few accesses per thread), up to about 1 ms for
# kernels with hundreds of shared-memory accesses per thread. Estimates use the slow end, so that
# a launch the estimate lets through finishes within a time-out derived from it.
SECONDS_PER_THREAD = 1e-3


class LaunchLimitError(ValueError):
    """A launch configuration or resource use that a GPU would refuse."""


class WarpSyncError(RuntimeError):
    """A warp intrinsic used in a way that hangs, or gives undefined results, on a GPU."""


class NeedsGPU(RuntimeError):
    """Code the simulator cannot run (the message says why): run or grade it on a GPU.

    Not a wrong answer: the code may well be right, the simulator just cannot tell."""


class TooManyThreads(NeedsGPU):
    """A launch with more threads than the simulator can run in the time the caller allowed."""


class _Aborted(RuntimeError):
    """Raised in threads woken because their block already failed; never reaches the user."""


_installed = False
# numba's originals, which the patched versions call; set by install().
_original_kernel_call = None
_original_jit = None


def install():
    """Patch numba's CUDA simulator as the module docstring describes. Safe to call twice.

    The simulator must be on (``NUMBA_ENABLE_CUDASIM=1`` before numba is first imported): on a GPU
    there is nothing to patch, and the patched classes do not exist.
    """
    global _installed, _original_kernel_call, _original_jit
    if not numba.config.ENABLE_CUDASIM:
        raise RuntimeError(
            "workbench.simulator.install() patches numba's CUDA simulator, which is off: set "
            "NUMBA_ENABLE_CUDASIM=1 in the environment before numba is first imported."
        )
    if _installed:
        return
    _original_kernel_call = _kernel.FakeCUDAKernel.__call__
    _original_jit = _api.jit
    _kernel.FakeCUDAKernel.__call__ = _launch
    _kernelapi.FakeCUDAShared.array = _shared_array
    _kernelapi.FakeCUDALocal.array = _local_array
    _kernelapi.GridGroup.sync = _grid_sync
    for function in _INTRINSICS:
        setattr(_kernelapi.FakeCUDAModule, function.__name__, function)
    _install_atomics()
    _install_device()
    _install_api()
    _installed = True


# ------------------------------------------------------------------------------------------------
# Switches: race checking, the simulated SM count, the thread budget
# ------------------------------------------------------------------------------------------------

_racecheck_override = []  # the stack of racecheck() blocks
_sm_count_override = []  # the stack of simulated_sm_count() blocks
_budgets = []  # the active thread_budget() blocks


def racecheck_enabled():
    """Is race checking on? Yes, unless ``WORKBENCH_SIM_RACECHECK=0`` or inside ``racecheck(False)``."""
    if _racecheck_override:
        return _racecheck_override[-1]
    setting = os.environ.get(RACECHECK_ENV, "1").strip().lower()
    return setting not in ("0", "off", "false", "no")


@contextmanager
def racecheck(enabled=True):
    """Turn race checking on (or off) for the launches inside the ``with`` block, whatever the
    environment says."""
    _racecheck_override.append(bool(enabled))
    try:
        yield
    finally:
        _racecheck_override.pop()


def sm_count():
    """Multiprocessors of the simulated device: 132 (an H100/H200), ``WORKBENCH_SIM_SM_COUNT``, or
    the innermost :func:`simulated_sm_count`."""
    if _sm_count_override:
        return _sm_count_override[-1]
    setting = os.environ.get(SM_COUNT_ENV, "").strip()
    if not setting:
        return DEFAULT_SM_COUNT
    try:
        count = int(setting)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{SM_COUNT_ENV} must be a whole number of multiprocessors, at least 1; got {setting!r}")
    return count


@contextmanager
def simulated_sm_count(count):
    """Simulate a device with `count` multiprocessors inside the ``with`` block.

    ``workbench.ladder.sm_count()`` and ``cuda.get_current_device().MULTIPROCESSOR_COUNT`` report it,
    so a launcher that sizes its grid from the SM count launches few blocks: with 2 SMs and 8
    blocks of 256 threads per SM, a kernel without a grid-stride loop leaves every element past
    4096 untouched.
    """
    count = operator.index(count)
    if count < 1:
        raise ValueError(f"a device needs at least 1 multiprocessor; got {count}")
    _sm_count_override.append(count)
    try:
        yield count
    finally:
        _sm_count_override.pop()


def simulated_threads(grid, block):
    """The number of CUDA threads a launch ``kernel[grid, block]`` runs (ints or 1-3 element tuples)."""
    total = 1
    for dims in (grid, block):
        for n in (dims if isinstance(dims, (tuple, list)) else (dims,)):
            total *= operator.index(n)
    return total


def estimated_seconds(threads):
    """About how long the simulator takes to run `threads` CUDA threads (see SECONDS_PER_THREAD)."""
    return threads * SECONDS_PER_THREAD


class _Budget:
    def __init__(self, max_threads):
        self.max_threads = max_threads
        self.used = 0


@contextmanager
def thread_budget(max_threads):
    """Refuse launches that would take the threads run inside the ``with`` block past `max_threads`.

    The launch that would cross the limit raises :class:`TooManyThreads` before it starts, with a
    message that says how many threads it wanted, how long that would take, and what to do (grade
    on a GPU, or size the grid from the data or from ``sm_count()``). Yields an object whose
    ``used`` attribute counts the threads run so far.
    """
    budget = _Budget(operator.index(max_threads))
    _budgets.append(budget)
    try:
        yield budget
    finally:
        _budgets.remove(budget)


def _charge_budgets(kernel, grid_dim, block_dim):
    threads = simulated_threads(grid_dim, block_dim)
    for budget in _budgets:
        if budget.used + threads > budget.max_threads:
            blocks = simulated_threads(grid_dim, 1)
            before = f" (after {budget.used:,} in earlier launches)" if budget.used else ""
            raise TooManyThreads(
                f"kernel {kernel.__name__} launches {blocks:,} blocks of {simulated_threads(1, block_dim):,} "
                f"threads = {threads:,} threads{before}, past the {budget.max_threads:,} this check allows: "
                f"the simulator runs one Python thread per CUDA thread, about "
                f"{_duration(estimated_seconds(threads))} for this launch, so it cannot run it in "
                "reasonable time. Grade it on a GPU, or use a smaller grid: size it from the data, or "
                "from workbench.ladder.sm_count() (a few multiprocessors in the simulator), and loop "
                "over the rest with a grid-stride loop."
            )
    for budget in _budgets:
        budget.used += threads


def _duration(seconds):
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


# ------------------------------------------------------------------------------------------------
# Launches: limits and recording
# ------------------------------------------------------------------------------------------------

_recordings = []  # the lists of the active record_launches() blocks


@contextmanager
def record_launches():
    """Record the kernel launches made inside the ``with`` block.

    Yields a list that each launch appends ``(py_function, argument_types)`` to, where
    ``argument_types`` is a tuple of numba types, as the GPU dispatcher would infer them: arrays by
    dtype, dimensions and layout (a device array or ``cuda.In(...)`` wrapper types like the NumPy
    array inside it), a Python int as int64, a float as float64. That is enough to compile the same
    kernel, e.g. with ``cuda.compile_ptx(py_function, argument_types)``. Device-function calls are
    not launches and are not recorded.
    """
    launches = []
    _recordings.append(launches)
    try:
        yield launches
    finally:
        _recordings[:] = [active for active in _recordings if active is not launches]


def _numba_type(arg):
    while isinstance(arg, ArgHint):
        arg = arg.value
    if isinstance(arg, FakeCUDAArray):
        arg = arg._ary
    if isinstance(arg, np.ndarray) and arg.dtype.name == "bfloat16":
        # numba's own typeof knows no bfloat16; numba-cuda's (the one a GPU launch uses) maps
        # ml_dtypes' bfloat16 to its __nv_bfloat16
        from numba.cuda.typing.typeof import typeof as cuda_typeof

        return cuda_typeof(arg)
    return numba.typeof(arg)


def _launch(self, *args):
    """FakeCUDAKernel.__call__: numba's launch, with the checks a GPU makes, recording, the thread
    budget, and race checking (which needs the array arguments wrapped, so numba's version is
    rebuilt here rather than called)."""
    needs_gpu = getattr(self, "sim_needs_gpu", None)  # set by jit() for code linked with link=
    if needs_gpu:
        raise NeedsGPU(needs_gpu)
    if self._device or _kernel._kernel_context is not None:
        if counting.current.launch is not None:  # counted: its lines are traced too
            counting.current.launch.entering_device_function()
        return _original_kernel_call(self, *args)  # a device function: a call, not a launch
    grid_dim, block_dim = normalize_kernel_dimensions(self.grid_dim, self.block_dim)
    _check_launch(grid_dim, block_dim, self.dynshared_size, getattr(self, "sim_max_dynamic_shared_bytes", 0))
    _charge_budgets(self.fn, grid_dim, block_dim)
    if _recordings:
        launch = (self.fn, tuple(_numba_type(arg) for arg in args))
        for launches in _recordings:
            launches.append(launch)
    counts = counting.new_launch(self.fn, grid_dim, block_dim)  # None unless inside counters.counting()
    # The counters see the accesses through the race checker's tracked arrays, so counting turns it on.
    races = None
    if racecheck_enabled() or counts is not None:
        races = race_detector.LaunchRaces(self.fn, _TrackedGlobalArray)
        races.counts = counts
    global _opted_in_bytes
    _opted_in_bytes = getattr(self, "sim_max_dynamic_shared_bytes", 0)
    try:
        _run_kernel(self, grid_dim, block_dim, args, races)
    finally:
        _opted_in_bytes = 0
    if counts is not None:
        counting.finish_launch(counts)


_opted_in_bytes = 0  # the running launch's shared-memory opt-in (set_max_dynamic_shared_memory), if any


_active_races = None  # the LaunchRaces of the launch running now, if race checking is on


def _run_kernel(kernel, grid_dim, block_dim, args, races):
    """numba's FakeCUDAKernel.__call__ for a launch: arguments to fake device arrays, one block
    after another, copies back to host arrays at the end."""
    global _active_races
    fake_cuda_module = _kernelapi.FakeCUDAModule(grid_dim, block_dim, kernel.dynshared_size)
    names = kernel.fn.__code__.co_varnames[: kernel.fn.__code__.co_argcount]
    with _kernel._push_kernel_context(fake_cuda_module):
        retr = []  # copies back to host arrays passed directly, after the launch
        fake_args = [
            _fake_argument(kernel, arg, retr, races, names[i] if i < len(names) else f"argument {i}")
            for i, arg in enumerate(args)
        ]
        workers = _take_workers(simulated_threads(1, block_dim))
        _active_races = races
        try:
            with _kernelapi.swapped_cuda_module(kernel.fn, fake_cuda_module):
                for grid_point in np.ndindex(*grid_dim):
                    _run_block(workers, kernel.fn, grid_dim, block_dim, grid_point, fake_args, kernel._debug, races)
        finally:
            _active_races = None
            _give_back_workers(workers)
        for write_back in retr:
            write_back()


def _fake_argument(kernel, arg, retr, races, name):
    """What the kernel gets for one argument (numba's fake_arg), tracked if race checking is on."""
    numba_type = None
    for extension in kernel.extensions:
        numba_type, arg = extension.prepare_args(numba_type, arg, stream=0, retr=retr)
    if isinstance(arg, np.ndarray) and arg.ndim > 0:
        arg = InOut(arg).to_device(retr)
    elif isinstance(arg, ArgHint):
        arg = arg.to_device(retr)
    elif isinstance(arg, np.void):
        arg = FakeCUDAArray(arg)
    if not isinstance(arg, FakeCUDAArray):
        return arg
    if races is not None and isinstance(arg._ary, np.ndarray):
        return races.track_argument(arg, name)
    return FakeWithinKernelCUDAArray(arg)


def _check_launch(grid_dim, block_dim, dynamic_shared_bytes, opted_in_bytes=0):
    """Raise LaunchLimitError for a configuration a GPU would refuse to launch."""
    for name, dims in (("gridDim", grid_dim), ("blockDim", block_dim)):
        for axis, n in zip("xyz", dims):
            if n < 1:
                raise LaunchLimitError(
                    f"{name}.{axis} = {n}: every grid and block dimension must be at least 1"
                )
    threads = block_dim[0] * block_dim[1] * block_dim[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise LaunchLimitError(
            f"a block of {' x '.join(map(str, block_dim))} = {threads} threads exceeds the limit of "
            f"{MAX_THREADS_PER_BLOCK} threads per block"
        )
    for name, dims, limits in (("blockDim", block_dim, MAX_BLOCK_DIM), ("gridDim", grid_dim, MAX_GRID_DIM)):
        for axis, n, limit in zip("xyz", dims, limits):
            if n > limit:
                raise LaunchLimitError(f"{name}.{axis} = {n} exceeds its limit of {limit}")
    _check_shared_memory(0, dynamic_shared_bytes, opted_in_bytes)


def _check_shared_memory(static_bytes, dynamic_bytes, opted_in_bytes=0):
    """The limits a GPU enforces. A kernel given more dynamic shared memory with
    ``workbench.launch.set_max_dynamic_shared_memory`` (which records ``sim_max_dynamic_shared_bytes``
    on it here) may use up to that much in all; static shared memory stays within 48 KiB."""
    total = static_bytes + dynamic_bytes
    if opted_in_bytes > SHARED_MEMORY_PER_BLOCK and static_bytes <= SHARED_MEMORY_PER_BLOCK and total <= opted_in_bytes:
        return
    limit = f"48 KiB ({SHARED_MEMORY_PER_BLOCK} bytes)"
    if static_bytes > SHARED_MEMORY_PER_BLOCK:
        raise LaunchLimitError(
            f"static shared memory (cuda.shared.array) of {static_bytes} bytes per block exceeds the "
            f"{limit} limit for static shared memory"
        )
    if total <= SHARED_MEMORY_PER_BLOCK:
        return
    if static_bytes == 0:
        what = f"dynamic shared memory of {dynamic_bytes} bytes per block"
    else:
        what = (
            f"static ({static_bytes} bytes) + dynamic ({dynamic_bytes} bytes) shared memory = "
            f"{total} bytes per block"
        )
    raise LaunchLimitError(
        f"{what} exceeds the {limit} a block may use unless the kernel opts in to more "
        "(cudaFuncAttributeMaxDynamicSharedMemorySize)"
    )


# ------------------------------------------------------------------------------------------------
# Shared memory: garbage at the start of every block, and the 48 KiB limit
# ------------------------------------------------------------------------------------------------

_shared_lock = threading.Lock()


def _poison(array):
    """Fill an array with garbage, as uninitialised GPU memory holds.

    Floats become NaN, which spreads through any arithmetic, so a kernel reading shared memory it
    never wrote (often: a missing syncthreads()) produces visibly wrong results. Other types get
    the repeated bytes of POISON_WORD.
    """
    if array.dtype.kind in "fc":
        array.fill(np.nan)
    else:
        raw = array.reshape(-1).view(np.uint8)
        raw[:] = np.resize(_POISON_BYTES, raw.size)


def _check_alignment(alignment):
    """numba accepts alignment= on shared and local arrays (a power of 2, in bytes); a numpy array
    needs none, so here it is only checked."""
    if alignment is None:
        return
    if not isinstance(alignment, (int, np.integer)) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of 2 (bytes); got {alignment!r}")


def _shared_array(self, shape, dtype, alignment=None):
    """FakeCUDAShared.array that poisons new arrays, enforces the 48 KiB limit, and tracks accesses.

    It keeps numba's scheme: shape 0 is a view of the launch's dynamic shared buffer; any other
    shape is a static array, one per source line, shared by every thread of the launch (so two
    allocations on one line alias). It must replace, not wrap, numba's method, because the source
    line is found from the caller's frame. With race checking on, kernels get a tracked view of
    the array (one per line, so every thread sees the same object).

    The static size is known only when the allocation runs, so the limit is checked then, in the
    first block, rather than before the kernel starts as a GPU would.
    """
    _check_alignment(alignment)
    if isinstance(dtype, _cuda_types.Type):
        dtype = as_dtype(dtype)
    dtype = np.dtype(dtype)
    caller = sys._getframe(1)
    races = _active_races
    if shape == 0:
        count = self._dynshared_size // dtype.itemsize
        array = np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        return array if races is None else races.track_shared(array, caller)
    line = (caller.f_code.co_filename, caller.f_lineno)
    with _shared_lock:
        array = self._allocations.get(line)
        if array is None:
            nbytes = int(np.prod(shape)) * dtype.itemsize
            static_bytes = sum(other.nbytes for other in self._allocations.values()) + nbytes
            _check_shared_memory(static_bytes, self._dynshared_size, _opted_in_bytes)
            array = np.empty(shape, dtype)
            _poison(array)
            self._allocations[line] = array
        if races is None:
            return array
        tracked = self.__dict__.setdefault("sim_tracked", {})
        if line not in tracked:
            tracked[line] = races.track_shared(array, caller)
        return tracked[line]


def _local_array(self, shape, dtype, alignment=None):
    """FakeCUDALocal.array, accepting alignment= as numba does on a GPU."""
    _check_alignment(alignment)
    if isinstance(dtype, _cuda_types.Type):
        dtype = as_dtype(dtype)
    return np.empty(shape, dtype)


def _poison_shared_memory(shared):
    """Poison a launch's shared memory; done at the start of every block, as a new block's is garbage."""
    for array in shared._allocations.values():
        _poison(array)
    _poison(shared._dynshared)


# ------------------------------------------------------------------------------------------------
# The block scheduler: syncthreads(), warp rendezvous, deadlock detection
# ------------------------------------------------------------------------------------------------

_IN_SYNCTHREADS = "syncthreads()"  # a thread's sim_wait while it waits at the barrier


class _Arrival:
    """One lane's call of a warp intrinsic, waiting for the other lanes of its mask."""

    __slots__ = ("thread", "lane", "kind", "mask", "value", "values")

    def __init__(self, thread, lane, kind, mask, value):
        self.thread = thread
        self.lane = lane
        self.kind = kind
        self.mask = mask
        self.value = value
        self.values = None  # {lane: value} of the whole mask, once everyone has arrived


class _Warp:
    def __init__(self, lock, index, lanes):
        self.index = index
        self.first_thread = index * WARP_SIZE
        self.existing = (1 << lanes) - 1  # the last warp of a block may be partial
        # Lanes that have arrived at an intrinsic, by (intrinsic, mask). PTX completes a *.sync
        # instruction when every lane of the mask has executed one "with the same qualifiers and
        # same membermask": that is the key. Disjoint masks (two half-warps) proceed independently.
        self.waiting = {}
        self.at_activemask = []  # arrivals in activemask(), see _Block.activemask
        self.arrived = threading.Condition(lock)


class _Block:
    """The synchronisation state of one simulated thread block.

    Every thread reports here when it waits in syncthreads() or a warp intrinsic, and when it exits.
    One lock guards it all, so "every thread still running is waiting, and no wait can complete"
    is a fact checked at the moment it becomes true, instead of a guess made by polling with
    timeouts. Conditions on that lock let threads sleep: one per warp (completing a warp intrinsic
    wakes only that warp), one for the barrier, one for the thread that launched the block.

    Under the lock:
      live     threads started and not exited;
      blocked  live threads waiting in syncthreads() or a warp intrinsic. Whoever completes a wait
               counts the waiters out at once, before they get to run again, so a thread that
               was just released is never mistaken for a stuck one;
      failure  the (exception, traceback) that ends the block, or None. Once it is set, every wait
               raises _Aborted, and the counts no longer matter.

    A barrier completes as soon as all live threads are in it, a warp intrinsic as soon as its last
    lane arrives, and activemask() as soon as no other lane of its warp is running. So if all live
    threads are blocked, none of them will ever be released: a deadlock, reported as a
    WarpSyncError (one always involves a warp intrinsic).
    """

    def __init__(self, block_dim, block_idx, grid_dim=(1, 1, 1), races=None):
        self.block_idx = block_idx
        self.linear_index = block_idx[0] + grid_dim[0] * (block_idx[1] + grid_dim[1] * block_idx[2])
        self.races = races
        self.shared_shadow = races.new_block_shadow() if races is not None else None
        size = block_dim[0] * block_dim[1] * block_dim[2]
        self.threads = [None] * size  # by linear thread id
        self.lock = threading.Lock()
        self.live = size
        self.blocked = 0
        self.failure = None
        self.barrier = []
        self.barrier_generation = 0
        self.votes = None  # syncthreads_count/and/or
        self.barrier_released = threading.Condition(self.lock)
        self.finished = threading.Condition(self.lock)
        self.warps = [
            _Warp(self.lock, w, min(WARP_SIZE, size - w * WARP_SIZE)) for w in range(-(-size // WARP_SIZE))
        ]

    def add(self, thread):
        thread.sim_block = self
        thread.sim_wait = None  # what the thread waits in: _IN_SYNCTHREADS, an _Arrival, or None
        thread.sim_exited = False
        thread.sim_clock = None
        if self.races is not None:
            thread.sim_clock = race_detector.ThreadClock(
                self.linear_index, self.block_idx, thread.thread_id, tuple(thread.threadIdx)
            )
        self.threads[thread.thread_id] = thread

    def run(self):
        """Start the threads; return when all have exited, or raise the block's failure."""
        for thread in self.threads:
            thread.start()
        with self.lock:
            while self.live and self.failure is None:
                self.finished.wait()
            if self.failure is not None:
                # Give the woken threads a moment to stop, so none runs on into the next launch.
                self.finished.wait_for(lambda: self.live == 0, timeout=_UNWIND_SECONDS)
        if self.races is not None:
            self.races.raise_found()  # a race, before what it may have caused (a bad index, a deadlock)
        if self.failure is not None:
            exception, traceback = self.failure
            raise exception.with_traceback(traceback)

    # All methods below run with the lock held.

    def _warp_of(self, thread):
        return self.warps[thread.thread_id // WARP_SIZE]

    def _block(self, thread, wait):
        thread.sim_wait = wait
        self.blocked += 1
        self._settle_activemask(self._warp_of(thread))

    def _wake(self, thread):
        thread.sim_wait = None
        self.blocked -= 1

    def _sleep(self, condition, done):
        """Sleep on condition until done(); raise _Aborted if the block fails first."""
        while not done():
            if self.failure is not None:
                raise _Aborted("another thread of the block failed")
            condition.wait()

    def _raise_if_failed(self):
        if self.failure is not None:
            raise _Aborted("another thread of the block failed")

    def _fail(self, failure):
        if self.failure is not None:
            return
        self.failure = failure
        for warp in self.warps:
            warp.arrived.notify_all()
        self.barrier_released.notify_all()
        self.finished.notify_all()

    def _release_barrier(self):
        if self.races is not None:
            race_detector.barrier([thread.sim_clock for thread in self.barrier])
            if self.races.counts is not None:
                self.races.counts.barrier(len({thread.thread_id // WARP_SIZE for thread in self.barrier}))
        for thread in self.barrier:
            self._wake(thread)
        self.barrier = []
        self.barrier_generation += 1
        self.barrier_released.notify_all()

    def _settle_activemask(self, warp):
        """Complete the warp's activemask() calls once no other lane of it is running."""
        if not warp.at_activemask:
            return
        calling = sum(1 << arrival.lane for arrival in warp.at_activemask)
        for lane in _lanes(warp.existing & ~calling):
            thread = self.threads[warp.first_thread + lane]
            if not thread.sim_exited and thread.sim_wait is None:
                return  # still running: it may yet call activemask() too
        for arrival in warp.at_activemask:
            arrival.values = calling
            self._wake(arrival.thread)
        warp.at_activemask = []
        warp.arrived.notify_all()

    def _check_deadlock(self):
        if self.live and self.blocked == self.live:
            self._fail((WarpSyncError(self._describe_deadlock()), None))

    # Entry points, called by the simulated threads.

    def syncthreads(self, thread):
        with self.lock:
            self._raise_if_failed()
            generation = self.barrier_generation
            self.barrier.append(thread)
            self._block(thread, _IN_SYNCTHREADS)
            if len(self.barrier) == self.live:
                self._release_barrier()
            else:
                self._check_deadlock()
            self._sleep(self.barrier_released, lambda: self.barrier_generation != generation)

    def syncthreads_vote(self, thread, value, combine):
        """syncthreads_count/and/or: a barrier at which every thread votes; `combine` counts the votes."""
        if self.votes is None:
            with self.lock:
                if self.votes is None:
                    self.votes = np.zeros(len(self.threads), dtype=np.bool_)
        self.votes[thread.thread_id] = bool(value)
        self.syncthreads(thread)
        result = combine(self.votes)
        self.syncthreads(thread)  # nobody votes again before everyone has counted
        return result

    def rendezvous(self, thread, kind, mask, value):
        """Wait until every lane of mask has called intrinsic `kind` with this mask.

        Returns {lane: value} for the lanes of the mask. Each lane gets its own _Arrival, and the
        last lane to arrive hands all of them the same dict and removes the group: a fast lane
        that goes straight on to its next call starts a new group and overwrites nothing that a
        slower lane still has to read.
        """
        warp = self._warp_of(thread)
        arrival = _Arrival(thread, thread.thread_id % WARP_SIZE, kind, mask, value)
        with self.lock:
            self._raise_if_failed()
            group = warp.waiting.setdefault((kind, mask), [])
            group.append(arrival)
            self._block(thread, arrival)
            if len(group) == mask.bit_count():
                del warp.waiting[(kind, mask)]
                values = {member.lane: member.value for member in group}
                if self.races is not None:
                    race_detector.warp_meeting([member.thread.sim_clock for member in group])
                    if self.races.counts is not None:
                        self.races.counts.intrinsic(kind)
                for member in group:
                    member.values = values
                    self._wake(member.thread)
                warp.arrived.notify_all()
            else:
                self._check_deadlock()
            self._sleep(warp.arrived, lambda: arrival.values is not None)
        return arrival.values

    def activemask(self, thread):
        """The lanes of the thread's warp that call activemask() "together" with it.

        On a GPU, activemask() returns the lanes executing that instruction with the caller. The
        simulator's threads do not run in lockstep (one may finish the kernel before the next
        starts), so "together" is approximated: wait until every other lane of the warp has
        called activemask() too, or waits in syncthreads() or a warp intrinsic, or has exited;
        the answer is the lanes that called. In converged code that is every lane that has not
        exited, as on a GPU; inside a branch it leaves out lanes on the other path once they
        wait or finish. It never deadlocks: it completes whenever a lane of the warp stops
        running, so it is settled in _block() and thread_exited().
        """
        warp = self._warp_of(thread)
        arrival = _Arrival(thread, thread.thread_id % WARP_SIZE, "activemask", None, None)
        with self.lock:
            self._raise_if_failed()
            warp.at_activemask.append(arrival)
            self._block(thread, arrival)
            self._sleep(warp.arrived, lambda: arrival.values is not None)
        return arrival.values

    def thread_exited(self, thread):
        with self.lock:
            thread.sim_exited = True
            self.live -= 1
            self._settle_activemask(self._warp_of(thread))
            if thread.exception is not None:
                self._fail(thread.exception)
            elif self.barrier and len(self.barrier) == self.live:
                self._release_barrier()  # exited threads no longer count at the barrier
            else:
                self._check_deadlock()
            if self.live == 0:
                self.finished.notify_all()

    def _describe_deadlock(self):
        lines = [
            f"deadlock in block {tuple(self.block_idx)}: every thread that has not exited is waiting, "
            "and none of the waits can complete."
        ]
        for warp in self.warps:
            for (kind, mask), group in warp.waiting.items():
                arrived = sum(1 << member.lane for member in group)
                by_place = {}
                for lane in _lanes(mask & ~arrived):
                    place = self._whereabouts(self.threads[warp.first_thread + lane])
                    by_place.setdefault(place, []).append(lane)
                missing = "; ".join(f"{_lane_words(lanes)}: {place}" for place, lanes in by_place.items())
                lines.append(
                    f"  warp {warp.index}: {_lane_words(_lanes(arrived))} wait in {kind}(mask={mask:#010x}) "
                    f"for the rest of the mask, which never arrives ({missing})"
                )
        if self.barrier:
            waiting = _ranges(thread.thread_id for thread in self.barrier)
            lines.append(
                f"  threads {waiting} (linear ids) wait in syncthreads(), which needs every thread "
                "that has not exited"
            )
        lines.append(
            "A warp intrinsic returns only when every lane named in its mask has called the same "
            "intrinsic with the same mask. A lane that took another branch, waits in syncthreads() "
            "or has returned never arrives: on a GPU the kernel hangs or computes garbage. Name only "
            "the lanes that take part (cuda.activemask() and cuda.ballot_sync build such masks)."
        )
        return "\n".join(lines)

    @staticmethod
    def _whereabouts(thread):
        if thread.sim_exited:
            return "exited"
        if thread.sim_wait is _IN_SYNCTHREADS:
            return "in syncthreads()"
        return f"in {thread.sim_wait.kind}(mask={thread.sim_wait.mask:#010x})"


def _run_block(workers, fn, grid_dim, block_dim, grid_point, args, debug, races):
    """numba's BlockManager.run, rebuilt on _Block and reused threads: one per CUDA thread of the
    block, then sleep until all are done."""
    _poison_shared_memory(_kernel._kernel_context.shared)
    block = _Block(block_dim, grid_point, grid_dim, races)

    def job():
        if debug:
            np.seterr(divide="raise")  # numba's debug=True: division by zero raises
        fn(*args)

    for worker, index in zip(workers, np.ndindex(*block_dim)):
        worker.assign(job, grid_point, index, block_dim)
        block.add(worker)
    block.run()


# Errors whose message is complete as it is: numba's thread runner prefixes every message with
# "tid=[...] ctaid=[...]:", which would only clutter these.
_OWN_ERRORS = (RaceError, NeedsGPU, WarpSyncError, LaunchLimitError, _Aborted)


class _Worker(threading.Thread):
    """A Python thread that runs one CUDA thread of one block after another.

    Starting a Python thread costs more than most simulated CUDA threads do (a few hundred µs), so
    threads are kept between blocks and launches: a launch takes as many idle workers as its
    blocks have threads (see _take_workers) and gives them back at the end. ``threading.
    current_thread()`` is the worker, so what the simulator's ``cuda`` module reads from it
    (threadIdx, blockIdx, syncthreads) is set anew for each block by assign().
    """

    def __init__(self):
        super().__init__(daemon=True, name="simulated CUDA thread")
        self.jobs = queue.SimpleQueue()
        self.busy = False  # running a CUDA thread (or stuck in one that never returned)
        self.launched = False
        self.job = None

    def assign(self, job, grid_point, index, block_dim):
        self.job = job
        self.blockIdx = _kernelapi.Dim3(*grid_point)
        self.threadIdx = _kernelapi.Dim3(*index)
        self.thread_id = index[0] + block_dim[0] * (index[1] + block_dim[1] * index[2])
        self.exception = None

    def start(self):
        """Run the assigned CUDA thread (called by _Block.run)."""
        self.busy = True
        if not self.launched:
            self.launched = True
            super().start()
        self.jobs.put(self.job)

    def run(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.run_cuda_thread(job)

    def run_cuda_thread(self, job):
        """Run the kernel as one CUDA thread, record its exception (if any), report the exit."""
        tracking = race_detector.current
        tracking.clock, tracking.block = self.sim_clock, self.sim_block
        races = self.sim_block.races
        counts = races.counts if races is not None else None
        if counts is not None:
            counts.start_thread(self.sim_clock)
        try:
            # A GPU computes inf and NaN without a word; numpy's scalars, which the simulator computes
            # with, would warn once per thread (the adversarial inputs hold NaN and inf on purpose).
            with np.errstate(all="ignore"):
                job()
        except race_detector.SpinWait as error:
            self.exception = (NeedsGPU(str(error)), sys.exc_info()[2])
        except _OWN_ERRORS as error:
            self.exception = (error, sys.exc_info()[2])
        except (SystemExit, KeyboardInterrupt) as error:  # sys.exit() in a kernel: the launch says so
            self.exception = (error, sys.exc_info()[2])
        except Exception as error:
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            message = f"{where}: {error}" if str(error) else where
            try:
                renamed = type(error)(message)  # as numba does, so the message says which thread
            except Exception:
                renamed = error
            self.exception = (renamed, sys.exc_info()[2])
        finally:
            if counts is not None:
                counts.end_thread()  # before the exit is reported: the launch may end with it
            tracking.clock = tracking.block = None
            self.job = None
            self.busy = False
            self.sim_block.thread_exited(self)

    # The kernel-side API numba's BlockThread offers.

    def syncthreads(self):
        self.sim_block.syncthreads(self)

    def syncthreads_count(self, value):
        return int(self.sim_block.syncthreads_vote(self, value, np.count_nonzero))

    def syncthreads_and(self, value):
        return 1 if self.sim_block.syncthreads_vote(self, value, np.all) else 0

    def syncthreads_or(self, value):
        return 1 if self.sim_block.syncthreads_vote(self, value, np.any) else 0

    def __str__(self):
        return f"Thread <<<{self.blockIdx}, {self.threadIdx}>>>"


_idle_workers = []
_workers_lock = threading.Lock()
_MAX_IDLE_WORKERS = MAX_THREADS_PER_BLOCK


def _take_workers(count):
    with _workers_lock:
        taken = _idle_workers[len(_idle_workers) - min(count, len(_idle_workers)):]
        del _idle_workers[len(_idle_workers) - len(taken):]
    return taken + [_Worker() for _ in range(count - len(taken))]


def _give_back_workers(workers):
    """Keep the workers that finished for later launches; one still running a CUDA thread (its
    block failed and it has not noticed, or it loops forever) is left to itself."""
    with _workers_lock:
        room = _MAX_IDLE_WORKERS - len(_idle_workers)
        _idle_workers.extend([worker for worker in workers if not worker.busy and worker.is_alive()][:room])


def _forget_workers():
    """In a forked child the workers' threads do not exist (fork copies only the forking thread)."""
    global _workers_lock
    _workers_lock = threading.Lock()
    _idle_workers.clear()


os.register_at_fork(after_in_child=_forget_workers)


def _lanes(bits):
    return [lane for lane in range(WARP_SIZE) if bits >> lane & 1]


def _ranges(numbers):
    """'0-15, 20, 22-23' for 0, 1, ..., 15, 20, 22, 23."""
    parts = []
    for n in sorted(numbers):
        if parts and parts[-1][1] == n - 1:
            parts[-1][1] = n
        else:
            parts.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def _lane_words(lanes):
    return f"lane {lanes[0]}" if len(lanes) == 1 else f"lanes {_ranges(lanes)}"


# ------------------------------------------------------------------------------------------------
# Warp intrinsics (methods of the simulator's fake `cuda` module)
# ------------------------------------------------------------------------------------------------


def _enter_warp_call(kind, mask):
    """Check a warp intrinsic's mask for the calling thread; return (thread, lane, mask).

    numba truncates the mask to 32 bits, so -1 means all lanes. The caller must be in its own mask
    (PTX: undefined otherwise), and every lane the mask names must exist: in a block whose size is
    not a multiple of 32 the last warp is partial, and the lanes it lacks never arrive.
    """
    thread = threading.current_thread()
    mask = operator.index(mask) & FULL_MASK
    lane = thread.thread_id % WARP_SIZE
    if not mask >> lane & 1:
        raise WarpSyncError(
            f"{kind}: lane {lane} called it with mask {mask:#010x}, which does not include lane {lane}; "
            "every calling lane must be in the mask (on a GPU the result is undefined)"
        )
    block = thread.sim_block
    warp = block.warps[thread.thread_id // WARP_SIZE]
    absent = mask & ~warp.existing
    if absent:
        raise WarpSyncError(
            f"{kind}(mask={mask:#010x}): {_lane_words(_lanes(absent))} of warp {warp.index} do not exist: "
            f"the block has {len(block.threads)} threads, so this warp has only "
            f"{_lane_words(_lanes(warp.existing))}. Name only lanes that exist (cuda.activemask() "
            "lists them), or make the block size a multiple of 32."
        )
    return thread, lane, mask


def _check_word(kind, value):
    """numba's shfl and match intrinsics take int32, int64, float32 or float64 values; nothing else."""
    if type(value) is int:
        ok = -(2**63) <= value < 2**63  # numba types a Python int as int64
    elif type(value) is float:
        ok = True
    else:
        ok = isinstance(value, np.generic) and value.dtype.kind in "if" and value.dtype.itemsize in (4, 8)
    if not ok:
        raise TypeError(
            f"{kind} works on int32, int64, float32 and float64 values, as numba's does; got "
            f"{value!r} of type {type(value).__name__}"
        )


def _like(received, own, kind, lane, source):
    """Give a value that arrived from another lane the type of the caller's own value.

    In compiled code a variable has one type in every lane; in the simulator, lanes that took
    different paths can hold, say, a Python float and a numpy.float32. Same kind: convert. Int and
    float: numba would have made both float, so the code likely relies on an int start value.
    """
    if type(received) is type(own):
        return received
    if isinstance(received, (float, np.floating)) == isinstance(own, (float, np.floating)):
        return type(own)(received)
    raise TypeError(
        f"{kind}: lane {lane} passes a {type(own).__name__} but lane {source} passes a "
        f"{type(received).__name__}. Compiled, the variable would have one float type in every lane: "
        "start it from a float (0.0, not 0)."
    )


def _shuffle(kind, mask, value, b, source_lane):
    _check_word(kind, value)
    thread, lane, mask = _enter_warp_call(kind, mask)
    # PTX uses only b[4:0]: a lane index or offset of 32 means 0, 33 means 1, -1 means 31.
    source = source_lane(lane, operator.index(b) & (WARP_SIZE - 1))
    if not mask >> source & 1:
        raise WarpSyncError(
            f"{kind}: lane {lane} reads lane {source}, which is not in the mask {mask:#010x}; "
            "on a GPU the value it gets is undefined"
        )
    values = thread.sim_block.rendezvous(thread, kind, mask, value)
    return _like(values[source], value, kind, lane, source)


# Source lane j for each mode, from PTX's shfl.sync with the c operand numba passes (0x1f for idx,
# down and bfly: clamp at lane 31; 0 for up: clamp at lane 0). Out of range, a lane reads itself.


def _idx_source(lane, b):
    return b


def _up_source(lane, b):
    return lane - b if lane >= b else lane


def _down_source(lane, b):
    return lane + b if lane + b < WARP_SIZE else lane


def _xor_source(lane, b):
    return lane ^ b


def shfl_sync(self, mask, value, src_lane):
    """Return `value` from lane ``src_lane % 32``.

    numba's API has no width argument: shuffles always span the whole 32-lane warp. `value` is an
    int32, int64, float32 or float64 (Python int and float count as the 64-bit types) and comes
    back with the caller's type. Every lane named in `mask` must call the same intrinsic with the
    same mask; the lane read must be one of them.
    """
    return _shuffle("shfl_sync", mask, value, src_lane, _idx_source)


def shfl_up_sync(self, mask, value, delta):
    """Return `value` from lane ``lane - delta``, or the caller's own if that is below 0.

    Only ``delta % 32`` counts. See shfl_sync for width, types and mask.
    """
    return _shuffle("shfl_up_sync", mask, value, delta, _up_source)


def shfl_down_sync(self, mask, value, delta):
    """Return `value` from lane ``lane + delta``, or the caller's own if that is above 31.

    Only ``delta % 32`` counts. See shfl_sync for width, types and mask.
    """
    return _shuffle("shfl_down_sync", mask, value, delta, _down_source)


def shfl_xor_sync(self, mask, value, lane_mask):
    """Return `value` from lane ``lane ^ (lane_mask % 32)``. See shfl_sync for width, types and mask."""
    return _shuffle("shfl_xor_sync", mask, value, lane_mask, _xor_source)


def _vote(kind, mask, predicate):
    """Rendezvous on a predicate; return (ballot of the mask's lanes, mask)."""
    if not isinstance(predicate, (bool, int, np.integer, np.bool_)):
        raise TypeError(
            f"{kind}: the predicate must be an integer or a boolean, as numba requires; got {predicate!r}"
        )
    thread, _, mask = _enter_warp_call(kind, mask)
    votes = thread.sim_block.rendezvous(thread, kind, mask, bool(predicate))
    return sum(1 << lane for lane, vote in votes.items() if vote), mask


def _int32(bits):
    return np.uint32(bits).view(np.int32)


def ballot_sync(self, mask, predicate):
    """Bit i set if lane i of `mask` has a true predicate.

    numba types the result int32, so with lane 31 set it is negative: a full-warp ballot is -1,
    not 0xFFFFFFFF.
    """
    return _int32(_vote("ballot_sync", mask, predicate)[0])


def any_sync(self, mask, predicate):
    """True if the predicate is true in any lane of `mask`."""
    return _vote("any_sync", mask, predicate)[0] != 0


def all_sync(self, mask, predicate):
    """True if the predicate is true in every lane of `mask`."""
    ballot, mask = _vote("all_sync", mask, predicate)
    return ballot == mask


def eq_sync(self, mask, predicate):
    """True if the predicate has the same truth value in every lane of `mask`."""
    ballot, mask = _vote("eq_sync", mask, predicate)
    return ballot in (0, mask)


def _match(kind, mask, value):
    """Rendezvous on a value's bits (floats compare as bits, as match.sync does).

    Returns ({lane: bits} for the mask, the caller's bits, mask).
    """
    _check_word(kind, value)
    thread, lane, mask = _enter_warp_call(kind, mask)
    patterns = thread.sim_block.rendezvous(thread, kind, mask, np.asarray(value).tobytes())
    return patterns, patterns[lane], mask


def match_any_sync(self, mask, value):
    """The lanes of `mask` whose value has the same bits as the caller's, as an int32 bit mask."""
    patterns, own, _ = _match("match_any_sync", mask, value)
    return _int32(sum(1 << lane for lane, pattern in patterns.items() if pattern == own))


def match_all_sync(self, mask, value):
    """``(mask, True)`` if every lane of `mask` has the same value, else ``(0, False)``; mask as int32."""
    patterns, own, mask = _match("match_all_sync", mask, value)
    if all(pattern == own for pattern in patterns.values()):
        return _int32(mask), True
    return np.int32(0), False


def syncwarp(self, mask=FULL_MASK):
    """Wait until every lane of `mask` has called syncwarp with this mask."""
    thread, _, mask = _enter_warp_call("syncwarp", mask)
    thread.sim_block.rendezvous(thread, "syncwarp", mask, None)


def activemask(self):
    """The lanes of the caller's warp running with it, as a uint32 (approximated: _Block.activemask)."""
    thread = threading.current_thread()
    return np.uint32(thread.sim_block.activemask(thread))


def lanemask_lt(self):
    """The lanes below the caller's, as a uint32: ``(1 << lane) - 1``."""
    return np.uint32((1 << threading.current_thread().thread_id % WARP_SIZE) - 1)


def _bits(value):
    """An integer's bits as numba sees them: two's complement in its type's width (Python int: int64)."""
    width = value.dtype.itemsize * 8 if isinstance(value, np.integer) else 64
    return int(value) & ((1 << width) - 1), width


def popc(self, value):
    """Number of set bits (of a negative int too, e.g. a ballot with lane 31 set)."""
    return _bits(value)[0].bit_count()


def ffs(self, value):
    """1-based position of the lowest set bit; 0 if none."""
    bits = _bits(value)[0]
    return (bits & -bits).bit_length()


def clz(self, value):
    """Number of leading zero bits, in the width of the value's type."""
    bits, width = _bits(value)
    return width - bits.bit_length()


_INTRINSICS = (
    shfl_sync,
    shfl_up_sync,
    shfl_down_sync,
    shfl_xor_sync,
    ballot_sync,
    any_sync,
    all_sync,
    eq_sync,
    match_any_sync,
    match_all_sync,
    syncwarp,
    activemask,
    lanemask_lt,
    popc,
    ffs,
    clz,
)


# ------------------------------------------------------------------------------------------------
# Fences and atomics: what orders blocks (for the race checker)
# ------------------------------------------------------------------------------------------------


def _threadfence(self):
    """cuda.threadfence() (and threadfence_system()): no-op for memory here, a release for the
    race checker: this thread's next atomic publishes what it did before the fence."""
    tracking = race_detector.current
    if tracking.clock is not None:
        tracking.clock.fence(tracking.block.barrier_generation)


_ATOMIC_OPERATIONS = ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax",
                      "nanmin", "cas")


def _tracked_atomic(original):
    """An atomic that, on a tracked array, is checked and synchronised by the race checker."""

    def atomic(self, array, index, *operands):
        if isinstance(array, race_detector.TrackedMemory):
            raw = race_detector.untracked(array)
            return array.tracked_atomic(index, lambda: original(self, raw, index, *operands), sys._getframe(1))
        return original(self, array, index, *operands)

    atomic.__name__ = original.__name__
    atomic.__doc__ = original.__doc__
    return atomic


def _tracked_compare_and_swap(original):
    def compare_and_swap(self, array, old, value):
        if isinstance(array, race_detector.TrackedMemory):
            raw = race_detector.untracked(array)
            index = (0,) * raw.ndim
            return array.tracked_atomic(index, lambda: original(self, raw, old, value), sys._getframe(1))
        return original(self, array, old, value)

    return compare_and_swap


def _install_atomics():
    atomics = _kernelapi.FakeCUDAAtomic
    for name in _ATOMIC_OPERATIONS:
        setattr(atomics, name, _tracked_atomic(getattr(atomics, name)))
    atomics.compare_and_swap = _tracked_compare_and_swap(atomics.compare_and_swap)


def _grid_sync(self):
    """this_grid().sync(): a barrier over every block of the grid, which blocks run one after
    another cannot meet; with one block it is syncthreads(), as numba's simulator has it."""
    grid = _kernel._kernel_context.gridDim
    if grid.x * grid.y * grid.z > 1:
        raise NeedsGPU(
            "cuda.cg.this_grid().sync() waits for every block of the grid, but the simulator runs the "
            "blocks one after another, so the first block would wait forever. A grid-wide barrier "
            "needs a GPU (and a cooperative launch); or split the kernel in two launches at the barrier."
        )
    threading.current_thread().syncthreads()


# ------------------------------------------------------------------------------------------------
# The simulated device: its multiprocessor count and the usual limits
# ------------------------------------------------------------------------------------------------

# What cuda.get_current_device().<NAME> reports here: an H100/H200's values, except the SM count.
DEVICE_ATTRIBUTES = {
    "WARP_SIZE": WARP_SIZE,
    "MAX_THREADS_PER_BLOCK": MAX_THREADS_PER_BLOCK,
    "MAX_BLOCK_DIM_X": MAX_BLOCK_DIM[0],
    "MAX_BLOCK_DIM_Y": MAX_BLOCK_DIM[1],
    "MAX_BLOCK_DIM_Z": MAX_BLOCK_DIM[2],
    "MAX_GRID_DIM_X": MAX_GRID_DIM[0],
    "MAX_GRID_DIM_Y": MAX_GRID_DIM[1],
    "MAX_GRID_DIM_Z": MAX_GRID_DIM[2],
    "MAX_SHARED_MEMORY_PER_BLOCK": SHARED_MEMORY_PER_BLOCK,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": SHARED_MEMORY_PER_BLOCK,  # numba cannot opt in
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 228 * 1024,
    "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "MAX_REGISTERS_PER_BLOCK": 65536,
    "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
    "L2_CACHE_SIZE": 50 * 1024 * 1024,
    "TOTAL_CONSTANT_MEMORY": 64 * 1024,
}


def _device_attribute(self, name):
    """FakeCUDADevice.__getattr__: the simulated device's attributes (numba reads a real one's from
    the driver by the same names)."""
    if name == "MULTIPROCESSOR_COUNT":
        return sm_count()
    if name in DEVICE_ATTRIBUTES:
        return DEVICE_ATTRIBUTES[name]
    raise AttributeError(
        f"the simulated device has no attribute {name!r}; it has MULTIPROCESSOR_COUNT, "
        + ", ".join(DEVICE_ATTRIBUTES)
    )


def _install_device():
    device = _devices.FakeCUDADevice
    device.__getattr__ = _device_attribute
    device.name = b"numba CUDA simulator (workbench)"


# ------------------------------------------------------------------------------------------------
# The rest of numba's CUDA API: libdevice, cache hints, nanosleep, jit options, declare_device
# ------------------------------------------------------------------------------------------------


def _load(array, index):
    """A load with a cache hint (cuda.ldca, ldcg, ldcs, ldlu, ldcv): the hint only matters to caches."""
    return array[index]


def _store(array, index, value):
    """A store with a cache hint (cuda.stcg, stcs, stwb, stwt): the hint only matters to caches."""
    array[index] = value


def _nanosleep(self, ns):
    """cuda.nanosleep: let the other simulated threads run (a spin-wait loop needs them to)."""
    time.sleep(0)


_LOADS = ("ldca", "ldcg", "ldcs", "ldlu", "ldcv")
_STORES = ("stcg", "stcs", "stwb", "stwt")

# cuda.jit options that change only how the GPU compiler builds a kernel: accepted and ignored.
COMPILER_ONLY_OPTIONS = frozenset({
    "debug", "opt", "lineinfo", "cache", "launch_bounds", "max_registers", "lto", "fastmath",
    "inline", "forceinline", "shared_memory_carveout", "extensions", "argtypes", "restype",
})


def jit(func_or_sig=None, device=False, link=(), boundscheck=None, **options):
    """numba.cuda.jit for the simulator: numba's, accepting every option a GPU's accepts.

    Options for the GPU compiler (``lineinfo``, ``launch_bounds``, ``max_registers``, ``fastmath``,
    ``cache``, ...) change nothing here. ``link=`` (CUDA C++ or PTX linked in) cannot run in the
    simulator: the kernel or device function raises :class:`NeedsGPU` when called.
    """
    unknown = sorted(set(options) - COMPILER_ONLY_OPTIONS)
    if unknown:
        raise TypeError(f"cuda.jit() got unexpected keyword argument(s) {', '.join(unknown)}; it takes "
                        f"device, link, boundscheck, {', '.join(sorted(COMPILER_ONLY_OPTIONS))}")
    kept = {name: options[name] for name in ("debug", "fastmath", "inline", "opt", "cache") if name in options}
    make = _original_jit(func_or_sig, device=device, boundscheck=boundscheck, **kept)

    def mark(kernel):
        if link:
            files = ", ".join(str(item) for item in (link if isinstance(link, (list, tuple)) else [link]))
            kernel.sim_needs_gpu = (
                f"{kernel.__name__} links code with link= ({files}), which the simulator cannot run"
            )
        return kernel

    if isinstance(make, _kernel.FakeCUDAKernel):
        return mark(make)
    return lambda fn: mark(make(fn))


def declare_device(name, sig, link=None, use_cooperative=False, abi="numba"):
    """cuda.declare_device: a device function written in CUDA C++ or PTX. The simulator cannot run
    it: calling it raises NeedsGPU (numba's simulator returns None, which fails obscurely)."""

    def external(*args):
        raise NeedsGPU(
            f"{name} is declared with cuda.declare_device and comes from CUDA C++ or PTX "
            f"({link or 'linked code'}), which the simulator cannot run"
        )

    external.__name__ = name
    return external


def _install_api():
    module = _kernelapi.FakeCUDAModule
    module.threadfence = _threadfence
    module.threadfence_system = _threadfence
    module.nanosleep = _nanosleep
    module.libdevice = libdevice_bodies.install(unavailable=NeedsGPU)
    for name in _LOADS:
        setattr(module, name, staticmethod(_load))
    for name in _STORES:
        setattr(module, name, staticmethod(_store))
    import numba.cuda
    from numba.cuda import simulator as simulator_package

    for namespace in (numba.cuda, _api, simulator_package):
        namespace.jit = jit
        namespace.declare_device = declare_device
        for name in _LOADS:
            setattr(namespace, name, _load)
        for name in _STORES:
            setattr(namespace, name, _store)
