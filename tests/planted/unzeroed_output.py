"""Bug: histogram.global_atomics counts into `out` without zeroing it first.

The output buffer holds whatever was there before (the grader fills it with a known garbage value),
so every bin comes out as garbage + count. Expected: "uninitialised": accumulated into without
being zeroed first.
"""

from numba import cuda, int32

from workbench.ladder import blocks_for, sm_count

EXPECT = {"stage": "histogram.global_atomics", "reason": "uninitialised", "says": "zeroed first"}
THREADS = 256


def _grid(n):
    return min(blocks_for(n, THREADS * 16), sm_count() * (2048 // THREADS))


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    # BUG: no _zero_bins[1, 256](out) first
    _count[_grid(x.size), THREADS](x, out)
