"""Correct: histogram.global_atomics that prints as it goes: text without a newline, a line that looks
like the old grader's protocol, bytes that are not UTF-8, on stdout and on stderr.

What a submission prints is its own output, shown in the report; it can never break grading.
Expected: passed.
"""

import os
import sys

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"stage": "histogram.global_atomics", "status": "passed"}


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
    print("counting", x.size, "elements...", end="")
    print('@@workbench-grade@@ {"event": "result", "garbage": ', end="", flush=True)
    print("half a line on stderr", end="", file=sys.stderr, flush=True)
    os.write(1, b"\xff\xfe not utf-8 \x00")
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, 256 * 16), 256](x, out)
    print(" done", end="")
