"""Cheat: histogram.global_atomics is correct, and replaces numba's cuda.event (the events the
workbench's timer records around the timed calls) by a maker of events it controls: on a GPU their
second record could be made early, so that the stage is timed faster than it runs.

Expected: refused as "tampered", whatever the kernel does (here: at import).
"""

from numba import cuda, int32

EXPECT = {"stage": "histogram.global_atomics", "reason": "tampered", "says": "cuda.event"}

_real_event = cuda.event


def _event(*args, **kwargs):
    return _real_event(*args, **kwargs)  # (where the timer's record() calls would be intercepted)


cuda.event = _event


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
