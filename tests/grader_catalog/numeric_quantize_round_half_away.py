# WRONG (numeric trap): quantize.block_per_row rounding x / scale with C's roundf, floor(|v| + 0.5) with v's
# sign, which sends every exact tie away from zero (2.5 -> 3, -0.5 -> -1, 126.5 -> 127) where the operator
# rounds half to even (2, 0, 126). Random rows never land on a tie (x / scale = 127 x / max|x| of normal
# draws), so they pass; the adversarial "ties (scale 1)" rows are k + 0.5 with a +-127 in each row, so the
# scale is exactly 1 and half their ties (those with k even) come out one step off. (block_per_row, not
# naive: at 1 x 8300, naive's 2-D grid launches 132,864 threads, past the 120,000 the simulator may run
# within the catalog's 120-second case timeout, so the stage is skipped before its adversarial sets.)
"""quantize.block_per_row: ties rounded away from zero (roundf) instead of to even."""

import math

import numpy as np
from numba import cuda, float32, int8, int32

from workbench.ladder import scratch

EXPECT = {"target": "quantize.block_per_row", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "inputs": "ties (scale 1)", "cpu": True}

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
QMAX = 127
SCALE_BYTES = 4


@cuda.jit(device=True, inline=True)
def _warp_max(value):
    offset = 16
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _round_half_away(v):
    q = int32(math.floor(abs(v) + float32(0.5)))  # BUG: roundf; a tie must go to its even neighbour
    if v < float32(0.0):
        q = -q
    return int8(min(max(q, int32(-QMAX)), int32(QMAX)))


@cuda.jit
def _quantize_block_per_row(x, out, scales, scale_bytes):
    reduced = cuda.shared.array(WARPS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    lane = t % 32
    cols = x.shape[1]
    amax = float32(0.0)
    for j in range(t, cols, THREADS):
        amax = max(amax, abs(x[row, j]))
    amax = _warp_max(amax)
    if lane == 0:
        reduced[t // 32] = amax
    cuda.syncthreads()
    amax = _warp_max(reduced[lane] if lane < WARPS else float32(0.0))
    scale = amax / float32(QMAX) if amax > float32(0.0) else float32(1.0)
    for j in range(t, cols, THREADS):
        out[row, j] = _round_half_away(x[row, j] / scale)
    if t == 0:  # the scale's 4 bytes: the float32 just written, read back through a byte view of it
        scales[row] = scale
        for k in range(SCALE_BYTES):
            out[row, cols + k] = scale_bytes[SCALE_BYTES * row + k]


def block_per_row(x, out):
    scales = scratch("catalog.quantize_round_half_away.scales", (x.shape[0],), np.float32)
    _quantize_block_per_row[x.shape[0], THREADS](x, out, scales, scales.view(np.int8))
