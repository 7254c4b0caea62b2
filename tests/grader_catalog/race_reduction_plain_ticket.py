# WRONG (race between blocks): reduction.fused with the "last block adds up" ticket counter incremented
# with a plain `done[0] += 1`. Two blocks can read the same count, so no block (or two) sees itself as
# the last one: the output is never written, or written from partial sums. In the simulator blocks run
# in order, so the count is always right there unless the grader looks for the conflict.
"""reduction.fused: one pass with a last-block sum; the ticket counter is not atomic."""

import numpy as np
from numba import cuda, float32, int32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "reduction.fused", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "unwritten", "wrong-values"],
          "cpu": True}

THREADS = 256


@cuda.jit
def _fused(x, block_sums, done, out):
    partials = cuda.shared.array(THREADS, float32)
    is_last = cuda.shared.array(1, int32)
    t = cuda.threadIdx.x
    acc = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        acc += x[i]
    partials[t] = acc
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        block_sums[cuda.blockIdx.x] = partials[0]
        cuda.threadfence()
        ticket = done[0]  # BUG: a plain read and write of the counter; cuda.atomic.add returns the old value
        done[0] = ticket + 1
        is_last[0] = ticket == cuda.gridDim.x - 1
    cuda.syncthreads()
    if is_last[0] and t == 0:
        total = float32(0.0)
        for b in range(cuda.gridDim.x):
            total += block_sums[b]
        out[0] = total
        done[0] = 0


def fused(x, out):
    blocks = blocks_for(x.size, THREADS * 4)
    block_sums = scratch("catalog.ticket.block_sums", blocks)
    done = scratch("catalog.ticket.done", 1, np.int32, zeroed=True)
    _fused[blocks, THREADS](x, block_sums, done, out)
