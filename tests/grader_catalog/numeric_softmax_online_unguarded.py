# WRONG (numeric trap): softmax.warp_shuffle, online softmax with the running maximum started at -inf and
# the update s = s * exp(m - m_new) + exp(v - m_new) written as in the paper. While only -inf has been
# seen, m - m_new is -inf - (-inf) = NaN, and the NaN spreads through the row: any masked row whose first
# elements (in some lane) are -inf. The solution starts at float32's most negative value instead.
"""softmax.warp_shuffle: online softmax without the -inf guard."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "softmax.warp_shuffle", "class": "numeric", "verdict": "reject", "reasons": ["nan"],
          "cpu": True}

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)


@cuda.jit
def _online(x, out):
    row = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row < x.shape[0]:
        cols = x.shape[1]
        m = NEG_INF
        s = float32(0.0)
        for j in range(lane, cols, 32):
            v = x[row, j]
            m_new = max(m, v)
            s = s * math.exp(m - m_new) + math.exp(v - m_new)  # BUG: -inf - -inf is NaN
            m = m_new
        offset = 16
        while offset > 0:
            m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
            s_other = cuda.shfl_xor_sync(FULL_MASK, s, offset)
            m_new = max(m, m_other)
            s = s * math.exp(m - m_new) + s_other * math.exp(m_other - m_new)
            m = m_new
            offset //= 2
        for j in range(lane, cols, 32):
            out[row, j] = math.exp(x[row, j] - m) / s


def warp_shuffle(x, out):
    _online[blocks_for(x.shape[0], WARPS), THREADS](x, out)
