# WRONG (a chunk boundary missed by one): softmax.ilp, eight columns a step, runs its unrolled loop while
# j + (ILP - 1) * THREADS <= cols where the bound is <: a thread whose step would end exactly at the row's
# end reads (and writes) column `cols`, one past the row. That happens only where cols is within one block
# (256) short of a whole number of steps of 2048 columns; every size the grader once derived (1, 5, 33,
# 100, 101, 1000, 4097, 4098 columns) missed that window. The grader now grades each declared boundary
# (softmax.ilp: ILP_SPAN columns) hit exactly and missed by one either side.
"""softmax.ilp: the unrolled step's bound written with <=."""

import math

import numpy as np
from numba import cuda, float32, uint64

EXPECT = {"target": "softmax.ilp", "class": "symmetry", "verdict": "reject",
          "reasons": ["out-of-bounds"], "gpu_reasons": ["out-of-bounds", "wrong-values", "race", "gpu-fault"],
          "cpu": True}

THREADS = 256
WARPS = THREADS // 32
TWO_WARPS = 2 * WARPS
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
ILP = 8
ILP_SPAN = ILP * THREADS


@cuda.jit(device=True, inline=True)
def _warp_max(value):
    offset = 16
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit
def _block_per_row_ilp(x, out):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(ILP, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    cols = uint64(x.shape[1])
    last = uint64((ILP - 1) * THREADS)
    m = NEG_INF
    j = t
    while j + last <= cols:  # BUG: < (the step's last column must be inside the row)
        for u in range(ILP):
            m = max(m, x[row, j + uint64(u * THREADS)])
        j += uint64(ILP_SPAN)
    while j < cols:
        m = max(m, x[row, j])
        j += uint64(THREADS)
    m = _warp_max(m)
    if lane == 0:
        reduced[warp] = m
    cuda.syncthreads()
    m = _warp_max(reduced[lane] if lane < WARPS else NEG_INF)
    s = float32(0.0)
    j = t
    while j + last <= cols:  # BUG: <
        for u in range(ILP):
            s += math.exp(x[row, j + uint64(u * THREADS)] - m)
        j += uint64(ILP_SPAN)
    while j < cols:
        s += math.exp(x[row, j] - m)
        j += uint64(THREADS)
    s = _warp_sum(s)
    if lane == 0:
        reduced[WARPS + warp] = s
    cuda.syncthreads()
    inverse = float32(1.0) / _warp_sum(reduced[WARPS + lane] if lane < WARPS else float32(0.0))
    j = t
    while j + last <= cols:  # BUG: <
        for u in range(ILP):
            xs[u] = x[row, j + uint64(u * THREADS)]
        for u in range(ILP):
            out[row, j + uint64(u * THREADS)] = math.exp(xs[u] - m) * inverse
        j += uint64(ILP_SPAN)
    while j < cols:
        out[row, j] = math.exp(x[row, j] - m) * inverse
        j += uint64(THREADS)


def ilp(x, out):
    _block_per_row_ilp[x.shape[0], THREADS](x, out)
