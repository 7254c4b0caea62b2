# CORRECT (unusual): softmax.warp_shuffle with the online update written out, guarded for -inf: an element
# of -inf adds nothing, and two summaries merge only when the incoming one has seen a finite element, so
# -inf - (-inf) is never computed. The maximum and sum are combined with butterfly shuffles.
"""softmax.warp_shuffle: online softmax with an explicit -inf guard."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "softmax.warp_shuffle", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 128
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)


@cuda.jit(device=True, inline=True)
def _merge(m, s, m_other, s_other):
    if m_other == NEG_INF:  # the other summary saw nothing finite
        return m, s
    if m == NEG_INF:
        return m_other, s_other
    m_new = max(m, m_other)
    return m_new, s * math.exp(m - m_new) + s_other * math.exp(m_other - m_new)


@cuda.jit
def _online(x, out):
    row = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row < x.shape[0]:
        cols = x.shape[1]
        m = NEG_INF
        s = float32(0.0)
        for j in range(lane, cols, 32):
            m, s = _merge(m, s, x[row, j], float32(1.0))
        offset = 16
        while offset > 0:
            m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
            s_other = cuda.shfl_xor_sync(FULL_MASK, s, offset)
            m, s = _merge(m, s, m_other, s_other)
            offset //= 2
        inverse = float32(1.0) / s
        for j in range(lane, cols, 32):
            out[row, j] = math.exp(x[row, j] - m) * inverse


def warp_shuffle(x, out):
    _online[blocks_for(x.shape[0], WARPS), THREADS](x, out)
