"""Bug: matvec.thread_per_row without `if row < rows`.

The grid is rounded up to whole blocks of 256 threads, so the threads past the last row index a row
that does not exist. On a GPU: garbage reads and writes past the end of y (or none visible); in the
simulator: IndexError. Expected: "out-of-bounds access ... missing bounds check?".
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "matvec.thread_per_row", "reason": "out-of-bounds", "says": "missing bounds check"}
THREADS = 256


@cuda.jit
def _rows(a, x, y):
    row = cuda.grid(1)
    acc = float32(0.0)  # BUG: no `if row < a.shape[0]:`
    for col in range(a.shape[1]):
        acc += a[row, col] * x[col]
    y[row] = acc


def thread_per_row(a, x, y):
    _rows[blocks_for(a.shape[0], THREADS), THREADS](a, x, y)
