# CORRECT (unusual): transpose.padded with 16 x 16 tiles (one padding column: 17 words a row) on a 2-D grid,
# blockIdx.x along columns and blockIdx.y along rows, instead of 32 x 32 tiles on a 1-D grid. A grid's y
# dimension holds at most 65535 blocks (3_000_001 rows are 187_501 tiles): the grid's y is capped there and
# each block walks its rows of tiles with a stride of gridDim.y.
"""transpose.padded: 16 x 16 tiles, a 2-D grid."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "transpose.padded", "class": "correct", "verdict": "accept", "cpu": True}

TILE = 16
PADDED = TILE + 1
MAX_GRID_Y = 65535  # the most blocks a grid's y dimension holds


@cuda.jit
def _padded(x, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col0 = cuda.blockIdx.x * TILE
    for row_tile in range(cuda.blockIdx.y, (x.shape[0] + TILE - 1) // TILE, cuda.gridDim.y):
        row0 = row_tile * TILE
        if row0 + ty < x.shape[0] and col0 + tx < x.shape[1]:
            tile[ty, tx] = x[row0 + ty, col0 + tx]
        cuda.syncthreads()
        if col0 + ty < x.shape[1] and row0 + tx < x.shape[0]:
            out[col0 + ty, row0 + tx] = tile[tx, ty]
        cuda.syncthreads()  # every thread has read the tile before the next row of tiles overwrites it


def padded(x, out):
    rows, cols = x.shape
    row_tiles = min(blocks_for(rows, TILE), MAX_GRID_Y)
    _padded[(blocks_for(cols, TILE), row_tiles), (TILE, TILE)](x, out)
