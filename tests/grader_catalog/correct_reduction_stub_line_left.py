# CORRECT (unusual): reduction.coalesced, filled in, with the exercise's stub line still below the code.
# The stub line is a no-op `pass`; the kernel is complete. The grader judges what runs: this is a correct
# stage, not "not implemented yet".
"""reduction.coalesced: complete code, the TODO(exercise) line left in place."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.coalesced", "class": "correct", "verdict": "accept", "cpu": True, "quick": True}

THREADS = 256


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _grid_stride_partials(x, out):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    partial = float32(0.0)
    for i in range(start, x.size, stride):
        partial += x[i]
    cuda.atomic.add(out, 0, partial)
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def coalesced(x, out):
    _zero[1, 1](out)
    _grid_stride_partials[blocks_for(x.size, THREADS * 16), THREADS](x, out)
