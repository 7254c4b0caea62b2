"""Bug: matvec.warp_per_row launched with one THREAD per row instead of one WARP per row.

The kernel is right, the launch is not: blocks_for(rows, 256) threads make rows / 32 warps, so only
the first rows / 32 rows get a warp and the rest of y is never written. Expected: output elements that
still hold the poison ("never written").
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "matvec.warp_per_row", "reason": "unwritten", "says": "never written"}
THREADS = 256
FULL_MASK = 0xFFFFFFFF


@cuda.jit
def _warp_rows(a, x, y):
    lane = cuda.threadIdx.x % 32
    row = cuda.grid(1) // 32
    if row < a.shape[0]:
        acc = float32(0.0)
        for col in range(lane, a.shape[1], 32):
            acc += a[row, col] * x[col]
        offset = 16
        while offset > 0:
            acc += cuda.shfl_down_sync(FULL_MASK, acc, offset)
            offset //= 2
        if lane == 0:
            y[row] = acc


def warp_per_row(a, x, y):
    _warp_rows[blocks_for(a.shape[0], THREADS), THREADS](a, x, y)  # BUG: should be a.shape[0] * 32 threads
