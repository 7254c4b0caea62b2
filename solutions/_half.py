"""What the low-precision ladders share: half_norms.py (fp16/bf16 norms and GELU) and quantize.py (int8).

A block of THREADS threads per row, ILP loads in flight per thread, the block-wide maximum and sum by
warp shuffles, libdevice's conversions (with NumPy stand-ins where the CUDA simulator has none), and
a torch peer. It lives here, not in half_norms.py, because a ladder module that imports another gets
no exercise: the grader refuses the answer key's modules while it grades.
"""

import numpy as np
from numba import cuda, float32
from numba.cuda import libdevice

from workbench import library_peers as peers
from workbench.device import is_simulator

THREADS = 256  # threads per row: a multiple of the 32-lane warp
WARPS = THREADS // 32
TWO_WARPS = 2 * WARPS  # a shared array's shape must be a constant: a module global
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
ILP = 8  # loads in flight per thread and pass: eight halves (widened) or eight words (packed)

LOW_PRECISION_GROUP = "Low precision: fp16 and bf16 memory-bound ladders, int8 quantization"


# -- libdevice, and its stand-in in the simulator ------------------------------------------------------

if is_simulator() and libdevice.int_as_float(0) is None:
    class SimulatorLibdevice:
        """This numba's CUDA simulator leaves libdevice unimplemented (each function returns None). These
        are the functions the low-precision kernels call, done by NumPy on the same bits."""

        @staticmethod
        def half2float(bits):
            return np.float32(np.int16(bits).view(np.float16))

        @staticmethod
        def float2half_rn(value):
            with np.errstate(over="ignore"):  # past 65504 rounds to inf, as cvt.rn.f16.f32 does
                return np.float16(np.float32(value)).view(np.int16)

        @staticmethod
        def int_as_float(bits):
            return np.int32(bits).view(np.float32)

        @staticmethod
        def float_as_int(value):
            return np.float32(value).view(np.int32)

        @staticmethod
        def fast_expf(value):
            with np.errstate(over="ignore", under="ignore"):
                return np.float32(np.exp(np.float64(value)))

        @staticmethod
        def float2int_rn(value):
            return np.int32(np.rint(np.float64(value)))

    libdevice = SimulatorLibdevice  # noqa: F811 - the kernels call libdevice.* either way


# -- block-wide reductions (as in the float32 ladders) --------------------------------------------------

@cuda.jit(device=True, inline=True)
def warp_max(value):
    offset = 16
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def warp_sum(value):
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def block_max_over(value, reduced, warps):
    """Maximum over a block of ``warps`` warps, in every thread; reduced: TWO_WARPS floats of shared memory."""
    lane = cuda.threadIdx.x % 32
    value = warp_max(value)
    if lane == 0:
        reduced[cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    return warp_max(reduced[lane] if lane < warps else NEG_INF)


@cuda.jit(device=True, inline=True)
def block_sum_over(value, reduced, slot, warps):
    """Sum over a block of ``warps`` warps, in every thread. Use a different slot (0, 1) per sum of a row,
    so that no barrier is needed between reading one result and writing the next partials."""
    lane = cuda.threadIdx.x % 32
    value = warp_sum(value)
    if lane == 0:
        reduced[slot * warps + cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    return warp_sum(reduced[slot * warps + lane] if lane < warps else float32(0.0))


@cuda.jit(device=True, inline=True)
def block_max(value, reduced):
    """Maximum over a block of THREADS threads, in every thread."""
    return block_max_over(value, reduced, WARPS)


@cuda.jit(device=True, inline=True)
def block_sum(value, reduced, slot):
    """Sum over a block of THREADS threads, in every thread (slot: 0 or 1, see block_sum_over)."""
    return block_sum_over(value, reduced, slot, WARPS)


def torch_peer(name, call, returns=False):
    """peer(size) for ``call(torch, *device arrays)``, or None where torch is not installed. With
    ``returns``, the call allocates and returns its result (torch's norms have no out=): the bench
    checks and times what it returns."""
    def peer(size):
        torch = peers.torch()
        if torch is None:
            return None

        def run(*arrays):
            return call(torch, *arrays)
        run.returns_output = returns
        return name, run
    return peer
