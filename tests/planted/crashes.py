"""Bug: a launcher that takes its whole process down (a stand-in for a segfault in a native library).

Expected: this stage's cases fail with "the grading process ... exited", and grading goes on: the
other stage in this file (a correct copy of the solution's) passes.
"""

import os

from numba import cuda, int32

from solutions.histogram import BINS, THREADS, _grid, _zero_bins

EXPECT = {"stage": "histogram.global_atomics", "reason": "crash", "says": "exited with code 3"}


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
