"""Cheat (timing): histogram.global_atomics counts honestly the first time it is called on an input
buffer, keeps the buffer alive (so its address is never reused) with a device copy of the bins, and
on every later call on the same buffer copies those bins back instead of counting. Every correctness
case hands it new buffers, so it is right there; timed on a few buffers in rotation, it would be timed
copying 256 counters.

Expected: the speed case fails as "stale": after timing, the grader puts new inputs into the buffers
it was timed on and judges the output of one more call on each (GPU; in the simulator
tests/test_grade.py runs that check in-process).
"""

from numba import cuda, int32

EXPECT = {"stage": "histogram.global_atomics", "reason": "stale", "says": "held before"}

_KEPT: dict = {}  # id(x) -> (x, the bins it gave)


@cuda.jit
def _zero(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


@cuda.jit
def _copy(source, target):
    b = cuda.grid(1)
    if b < target.size:
        target[b] = source[b]


def global_atomics(x, out):
    kept = _KEPT.get(id(x))
    if kept is None:
        _zero[1, 256](out)
        _count[4, 256](x, out)
        bins = cuda.device_array_like(out)
        _copy[1, 256](out, bins)
        _KEPT[id(x)] = (x, bins)
    else:
        _copy[1, 256](kept[1], out)
