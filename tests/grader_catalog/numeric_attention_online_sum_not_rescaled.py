# WRONG (numeric trap): attention.flash, the online softmax rescales the output rows by alpha = exp2(m - m')
# when a key tile raises a query's running maximum from m to m', but adds the tile's weights to the running
# sum without rescaling it: l = l + p, where the solution has l = l * alpha + p. The sum then keeps terms
# relative to the old maximum, too large by 1 / alpha, and the output (O / l) comes out too small. Only a
# query whose maximum grows past its first key tile shows it: at the simulator's 17 and 18 keys (tiles of
# 16), a query or two of every head, and only when its largest score falls in the second tile; on random
# and extreme logits alone a grading run missed it about one time in five (a float64 model of this kernel,
# 200 runs: 22%). The "rising-logits" inputs raise every maximum at every tile: caught every time.
"""attention.flash: the running sum not rescaled when the maximum grows."""

import math

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "attention.flash", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "inputs": "rising-logits", "cpu": True}

TILE = 16
ROW = 128 + 1  # D up to 128, one float of padding: the 16 rows' column d in 16 banks
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
LOWEST = np.float32(np.finfo(np.float32).min)
LOG2E = 1.4426950408889634


@cuda.jit
def _flash(q, k, v, out, scale_log2e, causal):
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
    i = cuda.blockIdx.x * TILE + ty
    for d in range(tx, D, TILE):
        Qs[ty, d] = q[b, h, i, d] if i < S else float32(0.0)
        Os[ty, d] = float32(0.0)
    m_run = LOWEST
    l_part = float32(0.0)
    for j0 in range(0, S, TILE):
        for d in range(tx, D, TILE):
            Ks[ty, d] = k[b, h, j0 + ty, d] if j0 + ty < S else float32(0.0)
            Vs[ty, d] = v[b, h, j0 + ty, d] if j0 + ty < S else float32(0.0)
        cuda.syncthreads()
        x = float32(0.0)
        for d in range(D):
            x += Qs[ty, d] * Ks[tx, d]
        x *= scale_log2e
        if j0 + tx >= S or (causal[0] != 0 and j0 + tx > i):
            x = NEG_INF
        tile_max = x
        for offset in (8, 4, 2, 1):  # the maximum over this row's 16 lanes
            tile_max = max(tile_max, cuda.shfl_xor_sync(FULL_MASK, tile_max, offset))
        m_new = max(m_run, tile_max)
        alpha = math.exp2(m_run - m_new)
        p = math.exp2(x - m_new)
        l_part = l_part + p  # BUG: l_part * alpha + p
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


def flash(q, k, v, causal, out):
    B, H, S, D = q.shape
    scale_log2e = np.float32(LOG2E / math.sqrt(D))
    _flash[(blocks_for(S, TILE), B * H), (TILE, TILE)](q, k, v, out, scale_log2e, causal)
