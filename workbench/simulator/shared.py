"""Shared memory: garbage at the start of every block, and the 48 KiB limit."""

import sys
import threading

import numba
import numpy as np

from .core import POISON_WORD, SHARED_MEMORY_PER_BLOCK, LaunchLimitError

if numba.config.ENABLE_CUDASIM:
    from numba.cuda import types as _cuda_types
    from numba.cuda.np.numpy_support import as_dtype
    from numba.cuda.simulator import kernelapi as _kernelapi


_POISON_BYTES = np.frombuffer(np.uint32(POISON_WORD).tobytes(), dtype=np.uint8)

# The launch running now (set by workbench.simulator.launches): its race checker, and its
# shared-memory opt-in (set_max_dynamic_shared_memory), if any.
running_races = None
opted_in_bytes = 0


def check_shared_memory(static_bytes, dynamic_bytes, opted_in_bytes=0):
    """The limits a GPU enforces. A kernel given more dynamic shared memory with
    ``workbench.shared_memory.set_max_dynamic_shared_memory`` (which records ``sim_max_dynamic_shared_bytes``
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


def shared_array(self, shape, dtype, alignment=None):
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
    races = running_races
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
            check_shared_memory(static_bytes, self._dynshared_size, opted_in_bytes)
            array = np.empty(shape, dtype)
            _poison(array)
            self._allocations[line] = array
        if races is None:
            return array
        tracked = self.__dict__.setdefault("sim_tracked", {})
        if line not in tracked:
            tracked[line] = races.track_shared(array, caller)
        return tracked[line]


def local_array(self, shape, dtype, alignment=None):
    """FakeCUDALocal.array, accepting alignment= as numba does on a GPU."""
    _check_alignment(alignment)
    if isinstance(dtype, _cuda_types.Type):
        dtype = as_dtype(dtype)
    return np.empty(shape, dtype)


def poison_shared_memory(shared):
    """Poison a launch's shared memory; done at the start of every block, as a new block's is garbage."""
    for array in shared._allocations.values():
        _poison(array)
    _poison(shared._dynshared)


def install():
    _kernelapi.FakeCUDAShared.array = shared_array
    _kernelapi.FakeCUDALocal.array = local_array
