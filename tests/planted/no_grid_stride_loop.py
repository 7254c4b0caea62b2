"""Bug: histogram.global_atomics sizes its grid to fill the GPU (from the SM count) and gives each
thread one element, without a grid-stride loop.

Right while the input has fewer elements than the grid has threads; past that, the rest are never
counted. On a real GPU that is millions of elements; the grader's simulated device has two SMs, so
the grid has 4096 threads and the bug shows at 8195 elements. Expected: wrong counts.
"""

from numba import cuda, int32

from workbench.ladder import sm_count

EXPECT = {"stage": "histogram.global_atomics", "reason": "wrong-values", "says": "differ", "sizes": [[8195]]}
THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    i = cuda.grid(1)
    if i < x.size:  # BUG: one element per thread; no `for i in range(..., cuda.gridsize(1))`
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _count[sm_count() * (2048 // THREADS), THREADS](x, out)
