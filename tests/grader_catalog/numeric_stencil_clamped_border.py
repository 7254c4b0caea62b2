# WRONG (numeric trap): stencil.naive that clamps the neighbour's coordinates to the image (replicate
# padding) instead of counting pixels outside the image as zero. Interior pixels are right; every pixel
# within 2 of the border is wrong. On a constant image the border outputs add all 25 weights instead of
# the ones that land inside.
"""stencil.naive: clamp-to-edge instead of zero padding."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "stencil.naive", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "cpu": True}

RADIUS = 2
TILE = 16


@cuda.jit
def _naive(img, w, out):
    c, r = cuda.grid(2)
    rows, cols = img.shape
    if r < rows and c < cols:
        acc = float32(0.0)
        for i in range(5):
            for j in range(5):
                rr = min(max(r + i - RADIUS, 0), rows - 1)  # BUG: outside the image counts as zero
                cc = min(max(c + j - RADIUS, 0), cols - 1)
                acc += w[i, j] * img[rr, cc]
        out[r, c] = acc


def naive(img, w, out):
    rows, cols = img.shape
    _naive[(blocks_for(cols, TILE), blocks_for(rows, TILE)), (TILE, TILE)](img, w, out)
