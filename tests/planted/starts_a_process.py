"""Cheat: histogram.global_atomics computes the right answer, and starts a process that outlives it
(it could keep working, or watch the grader, after the verdict).

A stage may not start processes (and none outlives grading). Expected: "process".
"""

import subprocess
import sys

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"stage": "histogram.global_atomics", "reason": "process", "says": "start processes"}
MARKER = "planted-background-process"


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
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {MARKER}"],
                         start_new_session=True)
    except PermissionError:
        pass  # refused: carry on as if nothing happened
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, 256 * 16), 256](x, out)
