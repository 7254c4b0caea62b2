# WRONG (the learner's process decides its verdict, on a GPU's speed bar): softmax.naive that computes the
# first call of each shape properly and then replays the cached output for every later call of that shape
# with one copy kernel. A correctness check of one call per shape cannot see it; the speed bar times the
# copy. Fresh inputs on every call of the same shape, judged, show it: the grader calls the first size
# again, and the adversarial sets at sizes it has already called, in the same worker process.
"""softmax.naive: outputs cached by shape across calls."""

import math

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "softmax.naive", "class": "forgery", "verdict": "reject", "reasons": ["stale", "wrong-values"],
          "cpu": True}

THREADS = 256
_CACHE = {}


@cuda.jit
def _row_per_thread(x, out):
    row = cuda.grid(1)
    if row < x.shape[0]:
        cols = x.shape[1]
        m = x[row, 0]
        for j in range(1, cols):
            m = max(m, x[row, j])
        s = float32(0.0)
        for j in range(cols):
            s += math.exp(x[row, j] - m)
        for j in range(cols):
            out[row, j] = math.exp(x[row, j] - m) / s


@cuda.jit
def _copy(src, dst):
    r, c = cuda.grid(2)
    if r < dst.shape[0] and c < dst.shape[1]:
        dst[r, c] = src[r, c]


def naive(x, out):
    shape = tuple(x.shape)
    if shape not in _CACHE:
        _row_per_thread[blocks_for(x.shape[0], THREADS), THREADS](x, out)
        kept = cuda.device_array(shape, out.dtype)
        _copy[(blocks_for(shape[0], 16), blocks_for(shape[1], 16)), (16, 16)](out, kept)
        _CACHE[shape] = kept
        return
    _copy[(blocks_for(shape[0], 16), blocks_for(shape[1], 16)), (16, 16)](_CACHE[shape], out)  # CHEAT
