"""What every part of the simulator shares: the warp, the limits of a GPU, the simulated device's
defaults, and the errors it raises.
"""

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


# The simulated device: an H100/H200 has 132 multiprocessors. Grading uses fewer (simulated_sm_count),
# so that grids sized from the SM count are small enough to show a missing grid-stride loop.
DEFAULT_SM_COUNT = 132
SM_COUNT_ENV = "WORKBENCH_SIM_SM_COUNT"
RACECHECK_ENV = "WORKBENCH_SIM_RACECHECK"
CORE_ENV = "WORKBENCH_SIM_CORE"  # keep the process on this core (an index): switches.run_on_one_core

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
