# WRONG (numeric trap): transpose.tiled staging the tile in float16 shared memory ("half the shared
# memory, twice the occupancy"). A transpose must move bits unchanged: float16 keeps 11 significant bits
# (an error near 2e-4 on ordinary values, past the 1e-5 tolerance) and overflows to inf above 65504.
"""transpose.tiled: a float16 tile."""

import numpy as np
from numba import cuda

EXPECT = {"target": "transpose.tiled", "class": "numeric", "verdict": "reject",
          "reasons": ["wrong-values", "nan"], "cpu": True}

TILE = 32


@cuda.jit
def _tiled(x, out):
    tile = cuda.shared.array((TILE, TILE), np.float16)  # BUG: a narrower type than the data
    tiles_across = (x.shape[1] + TILE - 1) // TILE
    row0 = (cuda.blockIdx.x // tiles_across) * TILE
    col0 = (cuda.blockIdx.x % tiles_across) * TILE
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = row0 + ty
    col = col0 + tx
    if row < x.shape[0] and col < x.shape[1]:
        tile[ty, tx] = x[row, col]  # rounded to float16 by the store
    cuda.syncthreads()
    out_row = col0 + ty
    out_col = row0 + tx
    if out_row < x.shape[1] and out_col < x.shape[0]:
        out[out_row, out_col] = tile[tx, ty]


def tiled(x, out):
    rows, cols = x.shape
    tiles = max(1, ((rows + TILE - 1) // TILE) * ((cols + TILE - 1) // TILE))
    _tiled[tiles, (TILE, TILE)](x, out)
