"""Bug: scan.hillis_steele with a loop whose index never advances: the kernel never ends.

Expected: the case times out ("did not finish in time") and grading goes on. (The test grades this
file with a short timeout.)
"""

from numba import cuda

EXPECT = {"stage": "scan.hillis_steele", "reason": "timeout", "says": "never ends"}


@cuda.jit
def _forever(x, y):
    i = cuda.grid(1)
    while i < x.size:
        y[i] = x[i]  # BUG: forgot i += cuda.gridsize(1)


def hillis_steele(x, y):
    _forever[1, 32](x, y)
