"""Cheat: histogram.global_atomics is correct but slow, and replaces time.perf_counter (what the
workbench's timer reads, in the worker's process) by a clock that runs ten times slower, so that on
a GPU its speed would be judged by its own clock.

Expected: refused as "tampered", whatever the kernel does (here: at import).
"""

import time

from numba import cuda, int32

EXPECT = {"stage": "histogram.global_atomics", "reason": "tampered", "says": "perf_counter"}

_real = time.perf_counter
time.perf_counter = lambda: _real() / 10


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


@cuda.jit
def _zero(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def global_atomics(x, out):
    _zero[1, 256](out)
    _count[4, 256](x, out)
