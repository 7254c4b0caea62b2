# WRONG (numeric trap): rmsnorm.fused (a block per row) without eps: x / sqrt(mean(x^2)). Right for every
# row with something in it, random or tiny; a row of zeros is 0 * (1 / sqrt(0)) = 0 * inf = NaN where the
# answer is 0.
"""rmsnorm.fused: no eps at all."""

import math

from numba import cuda, float32

EXPECT = {"target": "rmsnorm.fused", "class": "numeric", "verdict": "reject", "reasons": ["nan"],
          "inputs": "zero-rows", "cpu": True}

THREADS = 128


@cuda.jit
def _block_per_row(x, weight, out):
    partials = cuda.shared.array(THREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    cols = x.shape[1]
    acc = float32(0.0)
    for j in range(t, cols, THREADS):
        acc += x[row, j] * x[row, j]
    partials[t] = acc
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    rstd = float32(1.0) / math.sqrt(partials[0] / float32(cols))  # BUG: + eps is missing
    for j in range(t, cols, THREADS):
        out[row, j] = x[row, j] * rstd * weight[j]


def fused(x, weight, out):
    _block_per_row[x.shape[0], THREADS](x, weight, out)
