# WRONG (numeric trap): softmax.naive whose row maximum starts at 0.0 instead of the row's first element.
# Subtracting 0 instead of the true maximum is harmless while some logit is near or above 0; on a row of
# logits all below -100 every exp underflows to 0 and the row is 0 / 0 = NaN. Random rows catch it only on
# some seeds (a one-column row of -1e4 logits), the all-negative rows always.
"""softmax.naive: the running maximum starts at 0."""

import math

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "softmax.naive", "class": "numeric", "verdict": "reject", "reasons": ["nan"],
          "inputs": "all-negative", "cpu": True}

THREADS = 256


@cuda.jit
def _row_per_thread(x, out):
    row = cuda.grid(1)
    if row < x.shape[0]:
        cols = x.shape[1]
        m = float32(0.0)  # BUG: should start at x[row, 0] (or -inf)
        for j in range(cols):
            m = max(m, x[row, j])
        s = float32(0.0)
        for j in range(cols):
            s += math.exp(x[row, j] - m)
        inverse = float32(1.0) / s
        for j in range(cols):
            out[row, j] = math.exp(x[row, j] - m) * inverse


def naive(x, out):
    _row_per_thread[blocks_for(x.shape[0], THREADS), THREADS](x, out)
