# WRONG (numeric trap, a fencepost): matvec.warp_per_row whose column loop stops at cols - 1. One term of
# each dot product is missing: with random data that moves each y by a few percent; with x selecting only
# the last column, y is all zeros where it should be that column.
"""matvec.warp_per_row: the column loop stops one early."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "matvec.warp_per_row", "class": "numeric", "verdict": "reject",
          "reasons": ["wrong-values", "all-zeros"], "cpu": True}

THREADS = 256
FULL_MASK = 0xFFFFFFFF


@cuda.jit
def _warp_per_row(a, x, y):
    lane = cuda.threadIdx.x % 32
    row = cuda.grid(1) // 32
    if row < a.shape[0]:
        acc = float32(0.0)
        for col in range(lane, a.shape[1] - 1, 32):  # BUG: the last column is never read
            acc += a[row, col] * x[col]
        offset = 16
        while offset > 0:
            acc += cuda.shfl_down_sync(FULL_MASK, acc, offset)
            offset //= 2
        if lane == 0:
            y[row] = acc


def warp_per_row(a, x, y):
    _warp_per_row[blocks_for(a.shape[0] * 32, THREADS), THREADS](a, x, y)
