# CORRECT (unusual): reduction.fused as a persistent grid: 32 blocks of 64 threads per multiprocessor,
# whatever n is, each thread looping over the data with a grid-stride loop, block sums combined by the last
# block to finish. On a simulated 132-SM device that is 4224 blocks for even the smallest input: grading
# must scale (a simulated device with few SMs) or say plainly that the simulator cannot run it.
"""reduction.fused: a persistent grid, 32 blocks per SM."""

import numpy as np
from numba import cuda, float32, int32

from workbench.ladder import scratch, sm_count

EXPECT = {"target": "reduction.fused", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 64


@cuda.jit
def _persistent(x, block_sums, done, out):
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
        is_last[0] = cuda.atomic.add(done, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if is_last[0]:
        acc = float32(0.0)
        for b in range(t, cuda.gridDim.x, THREADS):
            acc += block_sums[b]
        partials[t] = acc
        cuda.syncthreads()
        half = THREADS // 2
        while half > 0:
            if t < half:
                partials[t] += partials[t + half]
            cuda.syncthreads()
            half //= 2
        if t == 0:
            out[0] = partials[0]
            done[0] = 0


def fused(x, out):
    blocks = sm_count() * 32
    block_sums = scratch("catalog.persistent.block_sums", blocks)
    done = scratch("catalog.persistent.done", 1, np.int32, zeroed=True)
    _persistent[blocks, THREADS](x, block_sums, done, out)
