# WRONG (launch geometry that needs a big size): reduction.coalesced with 2 blocks per multiprocessor read
# from the device (cuda.get_current_device().MULTIPROCESSOR_COUNT) and one element per thread: right until
# n passes 2 x SMs x 256 elements (67584 on an H200), then the tail of x is never added.
"""reduction.coalesced: grid from the device's SM count, no grid-stride loop."""

from numba import cuda, float32

EXPECT = {"target": "reduction.coalesced", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": True}

THREADS = 256


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _add(x, out):
    i = cuda.grid(1)
    if i < x.size:  # BUG: no loop: a thread adds one element, whatever n is
        cuda.atomic.add(out, 0, x[i])


def coalesced(x, out):
    blocks = 2 * cuda.get_current_device().MULTIPROCESSOR_COUNT
    _zero[1, 1](out)
    _add[blocks, THREADS](x, out)
