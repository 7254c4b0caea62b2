"""Bug: argmax.warp_shuffle keeps the LAST maximum on a tie (>= where > belongs).

Random floats almost never tie, so this passes a careless test; the grader's inputs always repeat the
maximum. Expected: wrong index, with the hint that ties go to the lowest index.
"""

from numba import cuda, int32

import numpy as np

from workbench.ladder import blocks_for, scratch, sm_count

EXPECT = {"stage": "argmax.warp_shuffle", "reason": "wrong-values", "says": "LOWEST index"}
THREADS = 256
NO_INDEX = 2**31 - 1
NEG_INF = np.float32(-np.inf)


def _resident_grid(n):
    return min(blocks_for(n, THREADS * 16), sm_count() * (2048 // THREADS))


@cuda.jit
def _store_index(indices, out):
    out[0] = indices[0]


@cuda.jit
def _block_best(values, indices, has_indices, out_values, out_indices):
    # One thread per block does the whole block's share: slow, simple, and wrong only in the tie rule.
    if cuda.threadIdx.x == 0:
        best_value = NEG_INF
        best_index = int32(NO_INDEX)
        for i in range(cuda.blockIdx.x, values.size, cuda.gridDim.x):
            v = values[i]
            if v >= best_value:  # BUG: on a tie, a later index wins
                best_value = v
                best_index = indices[i] if has_indices else int32(i)
        out_values[cuda.blockIdx.x] = best_value
        out_indices[cuda.blockIdx.x] = best_index


def warp_shuffle(x, out):
    blocks = _resident_grid(x.size)
    values = scratch("planted.ties.values", blocks, np.float32)
    indices = scratch("planted.ties.indices", blocks, np.int32)
    _block_best[blocks, THREADS](x, indices, 0, values, indices)
    final_values = scratch("planted.ties.final_values", 1, np.float32)
    final_indices = scratch("planted.ties.final_indices", 1, np.int32)
    _block_best[1, THREADS](values, indices, 1, final_values, final_indices)
    _store_index[1, 1](final_indices, out)
