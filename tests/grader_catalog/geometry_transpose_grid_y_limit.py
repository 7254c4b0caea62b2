# WRONG (launch geometry that needs a big size): transpose.naive with a 2-D grid, one block per 32 x 8
# tile, blockIdx.y walking the rows. A grid's y dimension holds at most 65535 blocks: a matrix of more
# than 65535 x 8 = 524280 rows (the 1_000_003 x 1 and 3_000_001 x 3 cases on a GPU) cannot be launched.
# The simulator refuses the same launch, but its sizes never get there.
"""transpose.naive: a 2-D grid whose y dimension grows with the rows."""

from numba import cuda

from workbench.ladder import blocks_for

EXPECT = {"target": "transpose.naive", "class": "geometry", "verdict": "reject",
          "reasons": ["launch-limit"], "cpu": False}


@cuda.jit
def _naive(x, out):
    col, row = cuda.grid(2)
    if row < x.shape[0] and col < x.shape[1]:
        out[col, row] = x[row, col]


def naive(x, out):
    rows, cols = x.shape
    _naive[(blocks_for(cols, 32), blocks_for(rows, 8)), (32, 8)](x, out)  # BUG: y blocks capped at 65535
