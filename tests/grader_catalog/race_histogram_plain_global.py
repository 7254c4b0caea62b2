# WRONG (race between blocks, and between threads): histogram.global_atomics with `out[x[i]] += 1`.
# Every thread of every block increments the bins with a plain read-modify-write: increments that meet on
# one bin (half the data falls in one hot bin) are lost on a GPU. The simulator runs blocks one after
# another and its threads rarely switch inside a statement, so the counts come out right there unless
# the grader looks for conflicting accesses.
"""histogram.global_atomics: plain increments instead of cuda.atomic.add."""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.global_atomics", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race"],  # a GPU shows the race by its effect (README)
          "cpu": True}

THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[x[i]] += int32(1)  # BUG: not atomic


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, THREADS * 8), THREADS](x, out)
