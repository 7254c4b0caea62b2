# WRONG (launch geometry that needs a big size): histogram.shared_privatized with block-private bins in
# shared memory (right) on a grid of 2 blocks per SM (as a "persistent" kernel would size it) where each
# thread counts ONE element, i = cuda.grid(1), instead of looping with a grid-stride loop. Right while n
# fits in one grid (2 x 132 x 256 = 67584 on an H200); past it, elements are never counted.
"""histogram.shared_privatized: private bins, a machine-sized grid, no grid-stride loop."""

from numba import cuda, int32

from workbench.ladder import sm_count

EXPECT = {"target": "histogram.shared_privatized", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": True}

BINS = 256
THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _privatized(x, out):
    bins = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    cuda.syncthreads()
    i = cuda.grid(1)
    if i < x.size:  # BUG: one element per thread, and the grid does not grow with n
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    if bins[t] != 0:
        cuda.atomic.add(out, t, bins[t])


def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _privatized[sm_count() * 2, THREADS](x, out)
