"""Cheat: histogram.global_atomics computes the right answer and writes a file into the repository
(it could as well rewrite a test or the answer key).

The repository is not writable while grading: the write is refused, and the case fails even though
the submission catches the error. Expected: "wrote-file".
"""

from numba import cuda, int32

from workbench.ladder import blocks_for
from workbench.paths import REPO_ROOT

EXPECT = {"stage": "histogram.global_atomics", "reason": "wrote-file", "says": "repository"}
TARGET = REPO_ROOT / "planted-write-into-the-repository.txt"


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    try:
        TARGET.write_text("written while being graded\n")
    except PermissionError:
        pass
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, 256 * 16), 256](x, out)
