"""Bug: scan.hillis_steele computed in place in the input, then copied to the output.

One thread walks x adding each element to the next (slow, but that is not the bug): y comes out
right, and x is destroyed. A caller's data must not change. Expected: "input 0 was modified".
"""

from numba import cuda

EXPECT = {"stage": "scan.hillis_steele", "reason": "input-modified", "says": "was modified"}


@cuda.jit
def _scan_in_place(x, y):
    if cuda.grid(1) == 0:
        y[0] = x[0]
        for i in range(1, x.size):
            x[i] += x[i - 1]  # BUG: writes the input
            y[i] = x[i]


def hillis_steele(x, y):
    _scan_in_place[1, 32](x, y)
