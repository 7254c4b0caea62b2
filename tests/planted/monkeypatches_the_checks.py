"""Cheat: histogram.global_atomics replaces the workbench's comparison and tolerance with ones that
always pass, and then computes a wrong answer (every count one too many).

The comparison is made in the grader's own process, from the outputs only. Expected: "wrong-values".
"""

from numba import cuda, int32

import workbench.check
from workbench.ladder import Operator, blocks_for

EXPECT = {"stage": "histogram.global_atomics", "reason": "wrong-values", "says": "elements differ"}


def _always_passes(key, size, out, ref, tolerance):
    return workbench.check.CheckResult(key, list(size), "passed", 0.0, tolerance)


workbench.check.compare = _always_passes
Operator.tolerance_for = lambda self, size, dtype: float("inf")


@cuda.jit
def _count_plus_one(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 1  # BUG (deliberate): every bin starts at one


@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    _count_plus_one[1, 256](x, out)
    _count[blocks_for(x.size, 256 * 16), 256](x, out)
