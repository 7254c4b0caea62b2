# CORRECT (unusual): argmax.warp_shuffle with one 64-bit atomic max per thread: the value's bits, made
# order-preserving as an unsigned integer, in the high half, and (2^32 - 1 - index) in the low half, so the
# largest key is the largest value and, among equal values, the lowest index. It needs
# cuda.libdevice.float_as_int, which the simulator lacks: it must be provided there, or the stage graded
# as "needs a GPU", never called wrong.
"""argmax.warp_shuffle: packed (value, index) keys and cuda.atomic.max."""

import numpy as np
from numba import cuda, float32, int64, uint64

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "argmax.warp_shuffle", "class": "correct", "verdict": "accept", "cpu": True,
          "may_need_gpu": True}

THREADS = 256
LOW = uint64(0xFFFFFFFF)


@cuda.jit(device=True, inline=True)
def _key(value, index):
    value = value + float32(0.0)  # -0.0 becomes +0.0: the two are equal, a tie, and must get one key
    bits = int64(cuda.libdevice.float_as_int(value))  # the float's bits, as a signed 32-bit integer
    ordered = bits + int64(2**31) if bits >= 0 else int64(-1) - bits  # monotone in the float's order
    return (uint64(ordered) << uint64(32)) | (LOW - uint64(index))


@cuda.jit
def _clear(key):
    key[0] = uint64(0)


@cuda.jit
def _best(x, key):
    best = uint64(0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        k = _key(x[i], i)
        if k > best:
            best = k
    cuda.atomic.max(key, 0, best)


@cuda.jit
def _decode(key, out):
    out[0] = LOW - (key[0] & LOW)


def warp_shuffle(x, out):
    key = scratch("catalog.packed.key", 1, np.uint64)
    _clear[1, 1](key)
    _best[blocks_for(x.size, THREADS * 16), THREADS](x, key)
    _decode[1, 1](key, out)
