# CORRECT (unusual): histogram.global_atomics compiled with @cuda.jit(lineinfo=True), so that a profiler
# (Nsight Compute) maps instructions back to source lines. A compile option, not a change of meaning: the
# simulator must accept it (or say that only a GPU can grade it), never call it a wrong answer.
"""histogram.global_atomics: lineinfo=True."""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.global_atomics", "class": "correct", "verdict": "accept", "cpu": True,
          "may_need_gpu": True}

THREADS = 256


@cuda.jit(lineinfo=True)
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit(lineinfo=True)
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, THREADS * 16), THREADS](x, out)
