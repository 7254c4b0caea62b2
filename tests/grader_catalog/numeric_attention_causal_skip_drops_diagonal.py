# WRONG (numeric trap): attention.causal_skip, tiles of 16 queries and 16 keys, the query blocks walked
# backwards, and under the causal mask the key loop stops before the block's own diagonal tile: "keys
# before q0 are visible to every query of the block, keys from q0 on are in the future". But query
# q0 + r sees keys q0 .. q0 + r too, the diagonal tile, the only one that needs the mask (the solution
# stops at min(S, q0 + 16)). Every query then misses its own key and the ones just before it; the first
# block (q0 = 0) walks no tile at all, and its sum of 0 divides 0: NaN. Without the mask it is right.
"""attention.causal_skip: the diagonal tile skipped with the ones past it."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "attention.causal_skip", "class": "numeric", "verdict": "reject",
          "reasons": ["nan"], "cpu": True}

TILE = 16
ROW = 128 + 1  # D up to 128, one float of padding: the 16 rows' column d in 16 banks
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
LOWEST = np.float32(np.finfo(np.float32).min)
LOG2E = 1.4426950408889634


@cuda.jit
def _flash_skip(q, k, v, out, scale_log2e, causal):
    Qs = cuda.shared.array((TILE, ROW), float32)
    Ks = cuda.shared.array((TILE, ROW), float32)
    Vs = cuda.shared.array((TILE, ROW), float32)
    Os = cuda.shared.array((TILE, ROW), float32)
    Ps = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    H, S, D = q.shape[1], q.shape[2], q.shape[3]
    b = cuda.blockIdx.y // H
    h = cuda.blockIdx.y % H
    q0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * TILE  # the longest block of a head first
    i = q0 + ty
    is_causal = causal[0] != 0
    for d in range(tx, D, TILE):
        Qs[ty, d] = q[b, h, i, d] if i < S else float32(0.0)
        Os[ty, d] = float32(0.0)
    m_run = LOWEST
    l_part = float32(0.0)
    end = q0 if is_causal else S  # BUG: min(S, q0 + TILE), the diagonal tile included
    for j0 in range(0, end, TILE):
        for d in range(tx, D, TILE):
            Ks[ty, d] = k[b, h, j0 + ty, d] if j0 + ty < S else float32(0.0)
            Vs[ty, d] = v[b, h, j0 + ty, d] if j0 + ty < S else float32(0.0)
        cuda.syncthreads()
        x = float32(0.0)
        for d in range(D):
            x += Qs[ty, d] * Ks[tx, d]
        x *= scale_log2e
        if j0 + tx >= S or (is_causal and j0 + tx > i):
            x = NEG_INF
        tile_max = x
        for offset in (8, 4, 2, 1):  # the maximum over this row's 16 lanes
            tile_max = max(tile_max, cuda.shfl_xor_sync(FULL_MASK, tile_max, offset))
        m_new = max(m_run, tile_max)
        alpha = math.exp2(m_run - m_new)
        p = math.exp2(x - m_new)
        l_part = l_part * alpha + p
        m_run = m_new
        Ps[ty, tx] = p
        cuda.syncthreads()
        for d in range(tx, D, TILE):
            acc = Os[ty, d] * alpha
            for c in range(TILE):
                acc += Ps[ty, c] * Vs[c, d]
            Os[ty, d] = acc
        cuda.syncthreads()
    for offset in (8, 4, 2, 1):
        l_part += cuda.shfl_xor_sync(FULL_MASK, l_part, offset)
    if i < S:
        for d in range(tx, D, TILE):
            out[b, h, i, d] = Os[ty, d] / l_part


def causal_skip(q, k, v, causal, out):
    B, H, S, D = q.shape
    scale_log2e = np.float32(LOG2E / math.sqrt(D))
    _flash_skip[(blocks_for(S, TILE), B * H), (TILE, TILE)](q, k, v, out, scale_log2e, causal)
