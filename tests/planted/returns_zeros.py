"""Bug: reduction.coalesced computes each thread's partial sum and never adds it to the output.

The launcher zeroes the output and the kernel's result stays in registers: the answer is 0.
Expected: "the output is all zeros".
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "reduction.coalesced", "reason": "all-zeros", "says": "all zeros"}
THREADS = 256


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _partials(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    # BUG: forgot cuda.atomic.add(out, 0, partial)


def coalesced(x, out):
    _zero[1, 1](out)
    _partials[blocks_for(x.size, THREADS * 16), THREADS](x, out)
