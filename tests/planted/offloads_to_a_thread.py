"""Cheat: histogram.global_atomics zeroes the bins, then hands the counting kernel to a thread that
launches it a moment after the launcher has returned. A timer that waits on the call's stream would
time only the zeroing; in a check the output may be complete or not, depending on which thread wins.

Expected: refused as "thread" (a thread it started was still running when the call returned).
"""

import threading
import time

from numba import cuda, int32

EXPECT = {"stage": "histogram.global_atomics", "reason": "thread", "says": "still running"}


@cuda.jit
def _zero(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


def _later(x, out):
    time.sleep(0.5)
    _count[4, 256](x, out)


def global_atomics(x, out):
    _zero[1, 256](out)
    threading.Thread(target=_later, args=(x, out), daemon=True).start()
