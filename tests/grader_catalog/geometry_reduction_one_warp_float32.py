# WRONG (a float32 running total, right only while n is large enough): reduction.coalesced with a single
# warp: 32 threads each sum every 32nd element into a float32 partial, then a shuffle adds the 32
# partials. Each partial is a running total over n / 32 elements: at 2^28 (8 million terms each, of mean
# 0.5) it stalls where its spacing passes the terms (about 2^22), and the sum comes out far short. At the
# simulator's sizes (a few hundred terms per thread) even a large first element stays inside the
# tolerance: only the GPU's 2^28 case shows it.
"""reduction.coalesced: a single warp of float32 partial sums."""

from numba import cuda, float32

EXPECT = {"target": "reduction.coalesced", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": False}

FULL_MASK = 0xFFFFFFFF


@cuda.jit
def _one_warp(x, out):
    lane = cuda.threadIdx.x
    partial = float32(0.0)
    for i in range(lane, x.size, 32):  # BUG: n / 32 terms in one float32 partial
        partial += x[i]
    offset = 16
    while offset > 0:
        partial += cuda.shfl_down_sync(FULL_MASK, partial, offset)
        offset //= 2
    if lane == 0:
        out[0] = partial


def coalesced(x, out):
    _one_warp[1, 32](x, out)
