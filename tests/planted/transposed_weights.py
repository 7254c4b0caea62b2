"""Bug: stencil.naive reads the weights transposed, w[j, i] instead of w[i, j].

w is not symmetric, so every output is wrong (and a symmetric test kernel would never have shown
it). Expected: wrong values, with the grader's hint that the weights are transposed.
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "stencil.naive", "reason": "wrong-values", "says": "transposed"}
RADIUS = 2
DIAMETER = 2 * RADIUS + 1
TILE = 16


def _grid(img):
    rows, cols = img.shape
    return (blocks_for(cols, TILE), blocks_for(rows, TILE)), (TILE, TILE)


@cuda.jit
def _conv(img, w, out):
    col, row = cuda.grid(2)
    rows, cols = img.shape
    if row < rows and col < cols:
        acc = float32(0.0)
        for i in range(DIAMETER):
            r = row + i - RADIUS
            if 0 <= r < rows:
                for j in range(DIAMETER):
                    c = col + j - RADIUS
                    if 0 <= c < cols:
                        acc += w[j, i] * img[r, c]  # BUG: w[i, j]
        out[row, col] = acc


def naive(img, w, out):
    blocks, threads = _grid(img)
    _conv[blocks, threads](img, w, out)
