# CORRECT (unusual): histogram.shared_privatized counting into a temporary allocated on every call with
# cuda.device_array (new device memory holds garbage: the grader fills it with poison), zeroed by a kernel
# first, then copied into out by another kernel.
"""histogram.shared_privatized: a fresh device temporary per call, zeroed before use."""

import numpy as np
from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.shared_privatized", "class": "correct", "verdict": "accept", "cpu": True}

BINS = 256
THREADS = 256


@cuda.jit
def _zero(counts):
    b = cuda.grid(1)
    if b < counts.size:
        counts[b] = 0


@cuda.jit
def _privatized(x, counts):
    bins = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    if bins[t] != 0:
        cuda.atomic.add(counts, t, bins[t])


@cuda.jit
def _copy(counts, out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = counts[b]


def shared_privatized(x, out):
    counts = cuda.device_array(BINS, np.int32)
    _zero[1, BINS](counts)
    _privatized[blocks_for(x.size, THREADS * 16), THREADS](x, counts)
    _copy[1, BINS](counts, out)
