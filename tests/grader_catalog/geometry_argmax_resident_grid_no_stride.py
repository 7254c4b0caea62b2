# WRONG (launch geometry that needs a big size): argmax.warp_shuffle with a machine-sized grid
# (2 blocks per SM) but a thread looks at one element only, i = cuda.grid(1): every element past
# one full grid is ignored, so a maximum that lies there is never seen. Random vectors show it only when
# their maximum happens to lie past the grid (on some seeds); a maximum placed at the end always does,
# at a size past one full grid.
"""argmax.warp_shuffle: resident grid, no grid-stride loop."""

import numpy as np
from numba import cuda, float32, int32

from workbench.ladder import scratch, sm_count

EXPECT = {"target": "argmax.warp_shuffle", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "inputs": "max-at-end", "cpu": True}

THREADS = 256
NO_INDEX = 2**31 - 1


@cuda.jit
def _block_best(x, values, indices):
    best_v = cuda.shared.array(THREADS, float32)
    best_i = cuda.shared.array(THREADS, int32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if i < x.size:  # BUG: one element per thread, never i + gridsize
        best_v[t] = x[i]
        best_i[t] = i
    else:
        best_v[t] = float32(-np.inf)
        best_i[t] = NO_INDEX
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            v = best_v[t + half]
            j = best_i[t + half]
            if v > best_v[t] or (v == best_v[t] and j < best_i[t]):
                best_v[t] = v
                best_i[t] = j
        cuda.syncthreads()
        half //= 2
    if t == 0:
        values[cuda.blockIdx.x] = best_v[0]
        indices[cuda.blockIdx.x] = best_i[0]


@cuda.jit
def _final(values, indices, out):
    if cuda.grid(1) == 0:
        best = values[0]
        where = indices[0]
        for b in range(1, values.size):
            if values[b] > best or (values[b] == best and indices[b] < where):
                best = values[b]
                where = indices[b]
        out[0] = where


def warp_shuffle(x, out):
    blocks = sm_count() * 2
    values = scratch("catalog.resident.values", blocks, np.float32)
    indices = scratch("catalog.resident.indices", blocks, np.int32)
    _block_best[blocks, THREADS](x, values, indices)
    _final[1, 1](values, indices, out)
