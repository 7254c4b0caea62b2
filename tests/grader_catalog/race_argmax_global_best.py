# WRONG (race between blocks): argmax.shared_tree where each block's winner is compared with a global best
# and written over it with plain loads and stores. Two blocks can both see themselves beat the old best and
# the later store wins, whichever value is larger: on a GPU the answer depends on timing. The simulator runs
# blocks one after another, so the comparison always sees the final best of the blocks before it.
"""argmax.shared_tree: the block tree is right; the global compare-and-write is not atomic."""

import numpy as np
from numba import cuda, float32, int32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "argmax.shared_tree", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "wrong-values"],
          "cpu": True}

THREADS = 256
NO_INDEX = 2**31 - 1


@cuda.jit
def _start(best, out):
    best[0] = float32(-np.inf)
    out[0] = NO_INDEX


@cuda.jit
def _tree(x, best, out):
    values = cuda.shared.array(THREADS, float32)
    indices = cuda.shared.array(THREADS, int32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    values[t] = x[i] if i < x.size else float32(-np.inf)
    indices[t] = i if i < x.size else NO_INDEX
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            v = values[t + half]
            j = indices[t + half]
            if v > values[t] or (v == values[t] and j < indices[t]):
                values[t] = v
                indices[t] = j
        cuda.syncthreads()
        half //= 2
    if t == 0:
        v = values[0]
        j = indices[0]
        if v > best[0] or (v == best[0] and j < out[0]):  # BUG: read, compare, write: other blocks interleave
            best[0] = v
            out[0] = j


def shared_tree(x, out):
    best = scratch("catalog.global_best.value", 1, np.float32)
    _start[1, 1](best, out)
    _tree[blocks_for(x.size, THREADS), THREADS](x, best, out)
