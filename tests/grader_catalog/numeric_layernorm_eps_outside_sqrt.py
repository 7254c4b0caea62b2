# WRONG (numeric trap): layernorm.naive with rstd = 1 / (sqrt(var) + eps) instead of 1 / sqrt(var + eps).
# Where the variance is near 1 (every random row) the two differ by about eps / 2, far inside the
# tolerance; where the variance is near eps (a spread of a few 1e-3) they differ by up to 40%.
"""layernorm.naive: eps added outside the square root."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "layernorm.naive", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "inputs": "variance-near-eps", "cpu": True}

THREADS = 256
EPS = np.float32(1e-5)


@cuda.jit
def _row_per_thread(x, weight, bias, out):
    row = cuda.grid(1)
    if row < x.shape[0]:
        cols = x.shape[1]
        x0 = x[row, 0]
        total = float32(0.0)
        for j in range(cols):
            total += x[row, j] - x0
        mean = total / float32(cols)
        squares = float32(0.0)
        for j in range(cols):
            d = x[row, j] - x0 - mean
            squares += d * d
        rstd = float32(1.0) / (math.sqrt(squares / float32(cols)) + EPS)  # BUG: eps belongs under the root
        for j in range(cols):
            out[row, j] = (x[row, j] - x0 - mean) * rstd * weight[j] + bias[j]


def naive(x, weight, bias, out):
    _row_per_thread[blocks_for(x.shape[0], THREADS), THREADS](x, weight, bias, out)
