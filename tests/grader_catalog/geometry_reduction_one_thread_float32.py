# WRONG (a float32 running total, right only while n is small): reduction.coalesced done by a single
# thread that walks all of x into one float32 total. Once the total is large, each new element is below
# half its spacing and rounds away (at 2^28 elements of mean 0.5 the sum stalls near 2^25: 75% short).
# Random vectors of a few thousand elements do not show it; a large first element does at any n >= 1000.
"""reduction.coalesced: one thread, one float32 running total."""

from numba import cuda, float32

EXPECT = {"target": "reduction.coalesced", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "inputs": "large-first-element", "cpu": True}


@cuda.jit
def _sum_all(x, out):
    if cuda.grid(1) == 0:
        total = float32(0.0)
        for i in range(x.size):  # BUG: one running total over every element, in float32
            total += x[i]
        out[0] = total


def coalesced(x, out):
    _sum_all[1, 32](x, out)
