# WRONG (launch geometry that needs a big size): histogram.global_atomics with the grid sized to the GPU
# (2 blocks per multiprocessor) but one element per thread instead of a grid-stride
# loop. Right while n fits in one full grid (132 SMs x 2 x 256 = 67584 elements on an H100/H200), so
# every simulator size passes on a simulated 132-SM device; elements past the grid are never counted.
"""histogram.global_atomics: a machine-sized grid without the grid-stride loop."""

from numba import cuda, int32

from workbench.ladder import sm_count

EXPECT = {"target": "histogram.global_atomics", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": True, "quick": True}

THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    i = cuda.grid(1)
    if i < x.size:  # BUG: one element per thread; the grid does not grow with n
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _count[sm_count() * 2, THREADS](x, out)
