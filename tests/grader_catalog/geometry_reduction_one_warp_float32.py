# WRONG (a float32 running total, right only while n is small): reduction.coalesced with a single
# warp: 32 threads each sum every 32nd element into a float32 partial, then a shuffle adds the 32
# partials. Each partial is a running total over n / 32 elements. The random inputs are centred on 0, so
# the partials stay small and the sum stays accurate even at 2^28 (an H200 passed it there). The
# large-first-element inputs (x[0] = 2^25, the rest near 1) show it once n / 32 is large: lane 0's
# partial starts at 2^25, where the float32 spacing is 4, and every later term rounds away; at
# 16_777_217 the sum is 1% short, five times the tolerance (a float64 check of this model: 1.04e-2
# against 1.95e-3). At the simulator's sizes (a few hundred terms a lane) the loss stays inside the
# tolerance: only a GPU, which grades the adversarial sets at a large size too, shows it.
"""reduction.coalesced: a single warp of float32 partial sums."""

from numba import cuda, float32

EXPECT = {"target": "reduction.coalesced", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": False,
          "gpu_inputs": "large-first-element"}

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
