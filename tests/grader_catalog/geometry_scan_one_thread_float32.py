# WRONG (a float32 running total, right only while n is small): scan.hillis_steele replaced by one thread
# that walks x keeping a float32 running total. Beyond 2^24 or so the total's spacing exceeds the elements
# and y stops growing (at 2^28 the last prefixes are off by three quarters); random vectors at the
# simulator's sizes stay accurate, a large first element (y starts at 2^25) shows it at n >= 1000.
"""scan.hillis_steele: one thread, one float32 running total."""

from numba import cuda, float32

EXPECT = {"target": "scan.hillis_steele", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "inputs": "large-first-element", "cpu": True}


@cuda.jit
def _sequential(x, y):
    if cuda.grid(1) == 0:
        total = float32(0.0)
        for i in range(x.size):  # BUG: n additions into one float32 total
            total += x[i]
            y[i] = total


def hillis_steele(x, y):
    _sequential[1, 1](x, y)
