# WRONG (numeric trap): layernorm.coalesced (a block per row) that forgets eps: rstd = 1 / sqrt(var). Right
# on every row with a spread; a constant row has variance 0, and 0 * (1 / sqrt(0)) = 0 * inf = NaN where
# the answer is the bias.
"""layernorm.coalesced: no eps at all."""

import math

from numba import cuda, float32

EXPECT = {"target": "layernorm.coalesced", "class": "numeric", "verdict": "reject", "reasons": ["nan"],
          "inputs": "constant-rows", "cpu": True}

THREADS = 128


@cuda.jit(device=True, inline=True)
def _block_sum(value, partials):
    t = cuda.threadIdx.x
    partials[t] = value
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    total = partials[0]
    cuda.syncthreads()  # everyone has read partials[0] before it is reused
    return total


@cuda.jit
def _block_per_row(x, weight, bias, out):
    partials = cuda.shared.array(THREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    cols = x.shape[1]
    x0 = x[row, 0]
    acc = float32(0.0)
    for j in range(t, cols, THREADS):
        acc += x[row, j] - x0
    mean = _block_sum(acc, partials) / float32(cols)
    acc = float32(0.0)
    for j in range(t, cols, THREADS):
        d = x[row, j] - x0 - mean
        acc += d * d
    rstd = float32(1.0) / math.sqrt(_block_sum(acc, partials) / float32(cols))  # BUG: + eps is missing
    for j in range(t, cols, THREADS):
        out[row, j] = (x[row, j] - x0 - mean) * rstd * weight[j] + bias[j]


def coalesced(x, weight, bias, out):
    _block_per_row[x.shape[0], THREADS](x, weight, bias, out)
