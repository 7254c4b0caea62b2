"""Cheat: histogram.global_atomics computes once per input size, then hands back the saved result
(a kernel copies it) whenever the same size comes again.

Every call gets fresh inputs, and the first size is graded twice. Expected: "stale".
"""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"stage": "histogram.global_atomics", "reason": "stale", "says": "earlier call"}
_saved: dict = {}


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


@cuda.jit
def _copy(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def global_atomics(x, out):
    saved = _saved.get(x.shape)
    if saved is None:
        _zero_bins[1, 256](out)
        _count[blocks_for(x.size, 256 * 16), 256](x, out)
        saved = _saved[x.shape] = cuda.device_array_like(out)
        _copy[1, 256](out, saved)
    else:
        _copy[1, 256](saved, out)  # BUG (deliberate): last call's answer for these new inputs
