"""Bug: reduction.naive accumulates into a scratch buffer that was never set to zero.

cuda.device_array (and workbench's scratch()) return uninitialised memory: on a GPU whatever the last
user left there. The grader hands out garbage (NaN) there, so the sum is NaN. Expected: a NaN computed
by the kernel, with the message naming a buffer never initialised.
"""

import numpy as np
from numba import cuda, float32, float64

from workbench.ladder import blocks_for, scratch

EXPECT = {"stage": "reduction.naive", "reason": "nan", "says": "never initialised"}
THREADS = 256


@cuda.jit
def _add_all(x, total):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(total, 0, float64(x[i]))


@cuda.jit
def _store(total, out):
    out[0] = float32(total[0])


def naive(x, out):
    total = scratch("planted.uninitialised.total", 1, np.float64)  # BUG: never zeroed
    _add_all[blocks_for(x.size, THREADS), THREADS](x, total)
    _store[1, 1](total, out)
