# CORRECT (unusual): matvec.warp_per_row with a whole block of 128 threads per row and a shared-memory tree
# instead of a warp and shuffles: more threads per row, same coalesced reads.
"""matvec.warp_per_row: a block per row, shared-memory tree."""

from numba import cuda, float32

EXPECT = {"target": "matvec.warp_per_row", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 128


@cuda.jit
def _block_per_row(a, x, y):
    partials = cuda.shared.array(THREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    acc = float32(0.0)
    for col in range(t, a.shape[1], THREADS):
        acc += a[row, col] * x[col]
    partials[t] = acc
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        y[row] = partials[0]


def warp_per_row(a, x, y):
    _block_per_row[a.shape[0], THREADS](a, x, y)
