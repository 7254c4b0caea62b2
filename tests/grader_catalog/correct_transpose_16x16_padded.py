# CORRECT (unusual): transpose.padded with 16 x 16 tiles (one padding column: 17 words a row) on a 2-D grid,
# blockIdx.x along columns and blockIdx.y along rows, instead of 32 x 32 tiles on a 1-D grid.
"""transpose.padded: 16 x 16 tiles, a 2-D grid."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "transpose.padded", "class": "correct", "verdict": "accept", "cpu": True}

TILE = 16
PADDED = TILE + 1


@cuda.jit
def _padded(x, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row0 = cuda.blockIdx.y * TILE
    col0 = cuda.blockIdx.x * TILE
    if row0 + ty < x.shape[0] and col0 + tx < x.shape[1]:
        tile[ty, tx] = x[row0 + ty, col0 + tx]
    cuda.syncthreads()
    if col0 + ty < x.shape[1] and row0 + tx < x.shape[0]:
        out[col0 + ty, row0 + tx] = tile[tx, ty]


def padded(x, out):
    rows, cols = x.shape
    _padded[(blocks_for(cols, TILE), blocks_for(rows, TILE)), (TILE, TILE)](x, out)
