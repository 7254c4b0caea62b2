# CORRECT (unusual): stencil.shared_tile with a block the size of the patch, 20 x 20 = 400 threads: every
# thread loads one pixel of the tile and its halo (zero outside the image), and only the inner 16 x 16
# threads compute an output. One load each, no loop; a fifth of the threads idle while computing.
"""stencil.shared_tile: one thread per patch pixel, the inner ones compute."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "stencil.shared_tile", "class": "correct", "verdict": "accept", "cpu": True}

RADIUS = 2
TILE = 16
PATCH = TILE + 2 * RADIUS


@cuda.jit
def _patch(img, w, out):
    tile = cuda.shared.array((PATCH, PATCH), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    rows, cols = img.shape
    r = cuda.blockIdx.y * TILE - RADIUS + ty
    c = cuda.blockIdx.x * TILE - RADIUS + tx
    tile[ty, tx] = img[r, c] if (0 <= r < rows and 0 <= c < cols) else float32(0.0)
    cuda.syncthreads()
    row = r + RADIUS
    col = c + RADIUS
    if tx < TILE and ty < TILE and row < rows and col < cols:
        acc = float32(0.0)
        for i in range(5):
            for j in range(5):
                acc += w[i, j] * tile[ty + i, tx + j]
        out[row, col] = acc


def shared_tile(img, w, out):
    rows, cols = img.shape
    _patch[(blocks_for(cols, TILE), blocks_for(rows, TILE)), (PATCH, PATCH)](img, w, out)
