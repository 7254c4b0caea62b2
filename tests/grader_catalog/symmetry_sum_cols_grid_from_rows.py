# WRONG (a size symmetry): reduction[cols].thread_per_column, one thread per column, but the grid is counted from
# the number of rows (x.shape[0]) where it means columns. Every simulator size the grader once used for
# a column reduction had at least as many rows as columns, so the threads (rounded up to whole blocks of
# 32) covered every column; a wide matrix leaves its last columns unwritten. The grader now grades each
# rectangle in both orientations.
"""sum_cols.thread_per_column: the grid counted along the wrong dimension."""

from numba import cuda, float32

EXPECT = {"target": "reduction[cols].thread_per_column", "class": "symmetry", "verdict": "reject",
          "reasons": ["unwritten"], "cpu": True, "quick": True}

THREADS = 32


@cuda.jit
def _column_sums(x, out):
    c = cuda.grid(1)
    if c < x.shape[1]:
        total = float32(0.0)
        for r in range(x.shape[0]):
            total += x[r, c]
        out[c] = total


def thread_per_column(x, out):
    _column_sums[(x.shape[0] + THREADS - 1) // THREADS, THREADS](x, out)  # BUG: x.shape[1] columns
