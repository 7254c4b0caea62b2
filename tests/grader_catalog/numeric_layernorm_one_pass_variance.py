# WRONG (numeric trap): layernorm.naive with the one-pass variance E[x^2] - E[x]^2 in float32. For a row
# of mean 1e4 and spread 1, E[x^2] = 100000001 is stored to within 4: the difference is noise, often
# negative (NaN on a GPU; the simulator's sqrt raises a math domain error). The random rows include such
# rows; so do the near-constant adversarial rows.
"""layernorm.naive: variance as E[x^2] - E[x]^2."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "layernorm.naive", "class": "numeric", "verdict": "reject",
          "reasons": ["wrong-values", "nan", "exception"], "cpu": True}

THREADS = 256
EPS = np.float32(1e-5)


@cuda.jit
def _row_per_thread(x, weight, bias, out):
    row = cuda.grid(1)
    if row < x.shape[0]:
        cols = x.shape[1]
        total = float32(0.0)
        squares = float32(0.0)
        for j in range(cols):
            total += x[row, j]
            squares += x[row, j] * x[row, j]
        mean = total / float32(cols)
        var = squares / float32(cols) - mean * mean  # BUG: two large, nearly equal numbers subtracted
        rstd = float32(1.0) / math.sqrt(var + EPS)
        for j in range(cols):
            out[row, j] = (x[row, j] - mean) * rstd * weight[j] + bias[j]


def naive(x, weight, bias, out):
    _row_per_thread[blocks_for(x.shape[0], THREADS), THREADS](x, weight, bias, out)
