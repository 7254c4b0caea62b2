# CORRECT (unusual): reduction.coalesced run on a stream of its own: both launches are queued on it and the
# launcher waits for that stream, not for the whole device.
"""reduction.coalesced: launches on a non-default stream."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.coalesced", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 256


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _partials(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    cuda.atomic.add(out, 0, partial)


def coalesced(x, out):
    stream = cuda.stream()
    _zero[1, 1, stream](out)
    _partials[blocks_for(x.size, THREADS * 16), THREADS, stream](x, out)
    stream.synchronize()
