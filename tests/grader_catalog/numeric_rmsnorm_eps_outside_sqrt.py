# WRONG (numeric trap): rmsnorm.unfused with rstd = 1 / (sqrt(mean(x^2)) + eps). Rows of ordinary
# magnitude hide it (eps / 2 relative); rows whose root mean square is near sqrt(eps) (a few 1e-3) and
# tiny rows are off by up to 40% and by far more.
"""rmsnorm.unfused: eps added outside the square root."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "rmsnorm.unfused", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "cpu": True}

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
EPS = np.float32(1e-5)


@cuda.jit
def _row_rstd(x, rstd):
    row = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row < x.shape[0]:
        squares = float32(0.0)
        for j in range(lane, x.shape[1], 32):
            squares += x[row, j] * x[row, j]
        offset = 16
        while offset > 0:
            squares += cuda.shfl_down_sync(FULL_MASK, squares, offset)
            offset //= 2
        if lane == 0:
            rstd[row] = float32(1.0) / (math.sqrt(squares / float32(x.shape[1])) + EPS)  # BUG: eps under the root


@cuda.jit
def _scale_rows(x, rstd, weight, out):
    row, j = cuda.grid(2)
    if row < x.shape[0] and j < x.shape[1]:
        out[row, j] = x[row, j] * rstd[row] * weight[j]


def unfused(x, weight, out):
    rows, cols = x.shape
    rstd = scratch("catalog.rms_eps.rstd", rows)
    _row_rstd[blocks_for(rows, WARPS), THREADS](x, rstd)
    _scale_rows[(blocks_for(rows, 16), blocks_for(cols, 16)), (16, 16)](x, rstd, weight, out)
