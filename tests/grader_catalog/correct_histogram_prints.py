# CORRECT (unusual): histogram.shared_privatized whose launcher prints progress to stdout, once without a
# newline, and writes to stderr. A learner's prints are not part of any report: grading must neither crash
# nor fail a case because of them.
"""histogram.shared_privatized: prints (one without a newline) in the launcher."""

import sys

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.shared_privatized", "class": "correct", "verdict": "accept", "cpu": True}

BINS = 256
THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _privatized(x, out):
    bins = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    if bins[t] != 0:
        cuda.atomic.add(out, t, bins[t])


def shared_privatized(x, out):
    print(f"counting {x.size} bytes...", end="")  # no newline
    sys.stderr.write("debug: launching\n")
    _zero_bins[1, BINS](out)
    _privatized[blocks_for(x.size, THREADS * 16), THREADS](x, out)
    print(" done", end="", flush=True)
