# WRONG (numeric trap): argmax.warp_shuffle whose running best starts at float32's most negative value
# (not -inf) with "no index", and a thread takes an element only if it is strictly larger. On any vector
# with a larger element that is the same thing; when every element IS that most negative value, nothing
# is ever taken and the answer is the "no index" marker.
"""argmax.warp_shuffle: the running best starts at -FLT_MAX with a strict comparison."""

import numpy as np
from numba import cuda, float32, int32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "argmax.warp_shuffle", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "inputs": "all-equal-lowest", "cpu": True}

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
LOWEST = np.float32(np.finfo(np.float32).min)
NO_INDEX = 2**31 - 1


@cuda.jit(device=True, inline=True)
def _warp_argmax(value, index):
    offset = 16
    while offset > 0:
        other_value = cuda.shfl_xor_sync(FULL_MASK, value, offset)
        other_index = cuda.shfl_xor_sync(FULL_MASK, index, offset)
        if other_value > value or (other_value == value and other_index < index):
            value = other_value
            index = other_index
        offset //= 2
    return value, index


@cuda.jit
def _block_argmax(values, indices, has_indices, out_values, out_indices):
    warp_values = cuda.shared.array(WARPS, float32)
    warp_indices = cuda.shared.array(WARPS, int32)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    best_value = LOWEST  # BUG: a real element can equal this, and then > never takes it
    best_index = int32(NO_INDEX)
    for i in range(cuda.grid(1), values.size, cuda.gridsize(1)):
        if values[i] > best_value:
            best_value = values[i]
            best_index = indices[i] if has_indices else int32(i)
    best_value, best_index = _warp_argmax(best_value, best_index)
    if lane == 0:
        warp_values[warp] = best_value
        warp_indices[warp] = best_index
    cuda.syncthreads()
    if warp == 0:
        best_value = warp_values[lane] if lane < WARPS else LOWEST
        best_index = warp_indices[lane] if lane < WARPS else int32(NO_INDEX)
        best_value, best_index = _warp_argmax(best_value, best_index)
        if lane == 0:
            out_values[cuda.blockIdx.x] = best_value
            out_indices[cuda.blockIdx.x] = best_index


@cuda.jit
def _store(indices, out):
    out[0] = indices[0]


def warp_shuffle(x, out):
    blocks = min(blocks_for(x.size, THREADS * 16), 64)
    values = scratch("catalog.lowest_start.values", blocks, np.float32)
    indices = scratch("catalog.lowest_start.indices", blocks, np.int32)
    no_indices = scratch("catalog.lowest_start.no_indices", 1, np.int32)
    final_value = scratch("catalog.lowest_start.final_value", 1, np.float32)
    final_index = scratch("catalog.lowest_start.final_index", 1, np.int32)
    _block_argmax[blocks, THREADS](x, no_indices, 0, values, indices)
    _block_argmax[1, THREADS](values, indices, 1, final_value, final_index)
    _store[1, 1](final_index, out)
