"""Correct: histogram.global_atomics written in full below its exercise's stub line, which was left
in place (a no-op `pass` that still carries the TODO(exercise) mark).

A stage is judged by what it does: it passes, with a note to delete the leftover line. Expected:
passed.
"""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"stage": "histogram.global_atomics", "status": "passed", "note": "TODO(exercise) line"}


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, 256 * 16), 256](x, out)
