"""Bug: matvec.thread_per_row launched with 2048 threads per block.

A block may have at most 1024 threads; a GPU refuses the launch (and numba's plain simulator would
have run it). Expected: "launch refused ... 1024 threads".
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "matvec.thread_per_row", "reason": "launch-limit", "says": "1024"}
THREADS = 2048  # BUG: over the 1024-thread limit


@cuda.jit
def _rows(a, x, y):
    row = cuda.grid(1)
    if row < a.shape[0]:
        acc = float32(0.0)
        for col in range(a.shape[1]):
            acc += a[row, col] * x[col]
        y[row] = acc


def thread_per_row(a, x, y):
    _rows[blocks_for(a.shape[0], THREADS), THREADS](a, x, y)
