# CORRECT (unusual): layernorm.warp_shuffle with Welford's running mean and squared deviations per lane
# (on values shifted by the row's first element), merged across the warp with Chan's formula over
# butterfly shuffles: one pass for the statistics instead of two.
"""layernorm.warp_shuffle: Welford per lane, Chan merges across the warp."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "layernorm.warp_shuffle", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
EPS = np.float32(1e-5)


@cuda.jit
def _welford(x, weight, bias, out):
    row = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row < x.shape[0]:
        cols = x.shape[1]
        x0 = x[row, 0]
        n = float32(0.0)
        mean = float32(0.0)
        m2 = float32(0.0)
        for j in range(lane, cols, 32):
            v = x[row, j] - x0
            n += float32(1.0)
            delta = v - mean
            mean += delta / n
            m2 += delta * (v - mean)
        offset = 16
        while offset > 0:
            n_b = cuda.shfl_xor_sync(FULL_MASK, n, offset)
            mean_b = cuda.shfl_xor_sync(FULL_MASK, mean, offset)
            m2_b = cuda.shfl_xor_sync(FULL_MASK, m2, offset)
            total = n + n_b
            if total > float32(0.0):
                delta = mean_b - mean
                mean += delta * (n_b / total)
                m2 += m2_b + delta * delta * (n * n_b / total)
                n = total
            offset //= 2
        rstd = float32(1.0) / math.sqrt(m2 / n + EPS)
        for j in range(lane, cols, 32):
            out[row, j] = (x[row, j] - x0 - mean) * rstd * weight[j] + bias[j]


def warp_shuffle(x, weight, bias, out):
    _welford[blocks_for(x.shape[0], WARPS), THREADS](x, weight, bias, out)
