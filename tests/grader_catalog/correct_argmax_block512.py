# CORRECT (unusual): argmax.shared_tree with 512-thread blocks, each thread first comparing two elements
# (i and i + 512 within its block's 1024) before the shared-memory tree, then the block winners reduced by
# one block in a grid-stride loop that keeps the tie rule.
"""argmax.shared_tree: 512 threads, two elements per thread, a second small launch."""

import numpy as np
from numba import cuda, float32, int32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "argmax.shared_tree", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 512
NO_INDEX = 2**31 - 1
NEG_INF = np.float32(-np.inf)


@cuda.jit(device=True, inline=True)
def _beats(value, index, best_value, best_index):
    return value > best_value or (value == best_value and index < best_index)


@cuda.jit(device=True, inline=True)
def _tree(values, indices, t):
    half = THREADS // 2
    while half > 0:
        if t < half and _beats(values[t + half], indices[t + half], values[t], indices[t]):
            values[t] = values[t + half]
            indices[t] = indices[t + half]
        cuda.syncthreads()
        half //= 2


@cuda.jit
def _blocks(x, out_values, out_indices):
    values = cuda.shared.array(THREADS, float32)
    indices = cuda.shared.array(THREADS, int32)
    t = cuda.threadIdx.x
    best_value = NEG_INF
    best_index = int32(NO_INDEX)
    for k in range(2):
        i = cuda.blockIdx.x * 2 * THREADS + k * THREADS + t
        if i < x.size and _beats(x[i], i, best_value, best_index):
            best_value = x[i]
            best_index = i
    values[t] = best_value
    indices[t] = best_index
    cuda.syncthreads()
    _tree(values, indices, t)
    if t == 0:
        out_values[cuda.blockIdx.x] = values[0]
        out_indices[cuda.blockIdx.x] = indices[0]


@cuda.jit
def _final(cand_values, cand_indices, out):
    values = cuda.shared.array(THREADS, float32)
    indices = cuda.shared.array(THREADS, int32)
    t = cuda.threadIdx.x
    best_value = NEG_INF
    best_index = int32(NO_INDEX)
    for b in range(t, cand_values.size, THREADS):
        if _beats(cand_values[b], cand_indices[b], best_value, best_index):
            best_value = cand_values[b]
            best_index = cand_indices[b]
    values[t] = best_value
    indices[t] = best_index
    cuda.syncthreads()
    _tree(values, indices, t)
    if t == 0:
        out[0] = indices[0]


def shared_tree(x, out):
    blocks = blocks_for(x.size, 2 * THREADS)
    cand_values = scratch("catalog.block512.values", blocks, np.float32)
    cand_indices = scratch("catalog.block512.indices", blocks, np.int32)
    _blocks[blocks, THREADS](x, cand_values, cand_indices)
    _final[1, THREADS](cand_values, cand_indices, out)
