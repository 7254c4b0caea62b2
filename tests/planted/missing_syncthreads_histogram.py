"""Bug: histogram.shared_privatized without the cuda.syncthreads() between zeroing the shared bins and
counting into them.

A fast thread counts into bins that a slower thread has not zeroed yet (garbage + 1), and the slower
thread then zeroes away counts already made. The simulator's race check sees the unordered write
and read of the same bin. Expected: a race (or wrong counts), with advice naming syncthreads.
"""

from numba import cuda, int32

from workbench.ladder import blocks_for, sm_count

# Which counts survive the race depends on thread timing: some wrong, or (at small sizes) all lost.
EXPECT = {"stage": "histogram.shared_privatized", "reason": ["race", "wrong-values", "all-zeros"], "says": "syncthreads"}
BINS = 256
THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def _grid(n):
    return min(blocks_for(n, THREADS * 16), sm_count() * (2048 // THREADS))


@cuda.jit
def _privatized(x, out):
    bins = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    # BUG: missing cuda.syncthreads() here
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    if bins[t] != 0:
        cuda.atomic.add(out, t, bins[t])


def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _privatized[_grid(x.size), THREADS](x, out)
