# CORRECT (unusual): elementwise.fused with a fixed 2-D grid of 4 x 4 blocks of 16 x 16 threads and 2-D
# grid-stride loops: each thread visits every (rows-stride, cols-stride) element of its own, whatever the
# matrix's shape, with x moving fastest along the columns (coalesced).
"""elementwise.fused: a fixed 2-D grid with 2-D grid-stride loops."""

import math

from numba import cuda, float32

EXPECT = {"target": "elementwise.fused", "class": "correct", "verdict": "accept", "cpu": True}


@cuda.jit(device=True, inline=True)
def gelu(v):
    return float32(0.5) * v * (float32(1.0) + math.erf(v * float32(0.7071067811865476)))


@cuda.jit
def _fused(x, bias, residual, out):
    col0, row0 = cuda.grid(2)
    col_step, row_step = cuda.gridsize(2)
    for row in range(row0, x.shape[0], row_step):
        for col in range(col0, x.shape[1], col_step):
            out[row, col] = gelu(x[row, col] + bias[col]) + residual[row, col]


def fused(x, bias, residual, out):
    _fused[(4, 4), (16, 16)](x, bias, residual, out)
