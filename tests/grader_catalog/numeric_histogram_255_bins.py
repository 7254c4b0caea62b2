# WRONG (numeric trap, a fencepost): histogram.shared_privatized with a private table of BINS - 1 = 255
# counters ("the largest value is 255"). The value 255 then lands one past the end of the shared array:
# on a GPU it silently corrupts the neighbouring shared memory (or nothing visible), in the simulator it is
# an out-of-bounds index. Short random vectors may not contain a 255; the edge-bins vectors always do.
"""histogram.shared_privatized: one private counter short."""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.shared_privatized", "class": "numeric", "verdict": "reject",
          "reasons": ["out-of-bounds", "wrong-values"], "inputs": "edge-bins", "cpu": True}

THREADS = 256
TABLE = 255  # BUG: values 0..255 need 256 counters


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _privatized(x, out):
    bins = cuda.shared.array(TABLE, int32)
    t = cuda.threadIdx.x
    if t < TABLE:
        bins[t] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    if t < TABLE and bins[t] != 0:
        cuda.atomic.add(out, t, bins[t])


def shared_privatized(x, out):
    _zero_bins[1, 256](out)
    _privatized[blocks_for(x.size, THREADS * 16), THREADS](x, out)
