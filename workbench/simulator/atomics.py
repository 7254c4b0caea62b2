"""Fences and atomics: what orders blocks (for the race checker); the grid-wide barrier."""

import sys
import threading

import numba

from . import races as race_detector
from .core import NeedsGPU

if numba.config.ENABLE_CUDASIM:
    from numba.cuda.simulator import kernel as _kernel
    from numba.cuda.simulator import kernelapi as _kernelapi


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


def grid_sync(self):
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


def install():
    atomics = _kernelapi.FakeCUDAAtomic
    for name in _ATOMIC_OPERATIONS:
        setattr(atomics, name, _tracked_atomic(getattr(atomics, name)))
    atomics.compare_and_swap = _tracked_compare_and_swap(atomics.compare_and_swap)
    _kernelapi.FakeCUDAModule.threadfence = _threadfence
    _kernelapi.FakeCUDAModule.threadfence_system = _threadfence
    _kernelapi.GridGroup.sync = grid_sync
