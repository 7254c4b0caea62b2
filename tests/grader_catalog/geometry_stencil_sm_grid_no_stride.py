# WRONG (launch geometry that needs a big size): stencil.naive with a flat grid of 2 blocks per SM, one
# output pixel per thread (p = cuda.grid(1), row p // cols, column p % cols), and no loop. It covers
# 2 x 132 x 256 = 67584 pixels on an H200, every simulator image on a simulated 132-SM device, but not the
# GPU's 1000 x 1000: pixels past the first 67584 are never written.
"""stencil.naive: a flat machine-sized grid without the grid-stride loop."""

from numba import cuda, float32

from workbench.ladder import sm_count

EXPECT = {"target": "stencil.naive", "class": "geometry", "verdict": "reject",
          "reasons": ["unwritten"], "cpu": True}

RADIUS = 2
THREADS = 256


@cuda.jit
def _naive(img, w, out):
    rows, cols = img.shape
    p = cuda.grid(1)
    if p < rows * cols:  # BUG: one pixel per thread; the grid does not grow with the image
        r = p // cols
        c = p % cols
        acc = float32(0.0)
        for i in range(5):
            for j in range(5):
                rr = r + i - RADIUS
                cc = c + j - RADIUS
                if 0 <= rr < rows and 0 <= cc < cols:
                    acc += w[i, j] * img[rr, cc]
        out[r, c] = acc


def naive(img, w, out):
    _naive[sm_count() * 2, THREADS](img, w, out)
