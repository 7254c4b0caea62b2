"""Bug: a launcher that takes its whole process down (a stand-in for a segfault in a native library).

Expected: this stage's case fails with "the process running your code exited with code 3", and
grading goes on in a fresh process: the other stage in this file (a correct one) passes.
"""

import os

from numba import cuda, int32

from workbench.ladder import blocks_for, sm_count

EXPECT = {"stage": "histogram.global_atomics", "reason": "crash", "says": "exited with code 3"}
BINS = 256
THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def _grid(n):
    return min(blocks_for(n, THREADS * 16), sm_count() * (2048 // THREADS))


def global_atomics(x, out):
    os._exit(3)  # BUG: the process dies


@cuda.jit
def _privatized(x, out):
    bins = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    if bins[t] != 0:
        cuda.atomic.add(out, t, bins[t])


def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _privatized[_grid(x.size), THREADS](x, out)
