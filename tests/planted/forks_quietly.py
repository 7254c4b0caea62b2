"""Cheat: histogram.global_atomics computes the right answer, and forks through libc (no Python
audit event sees it); the copy waits forever under a name of its own.

After every call the grader looks for processes the worker left behind, kills them, and fails the
case. Expected: "background-process".
"""

import ctypes

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"stage": "histogram.global_atomics", "reason": "background-process", "says": "still running"}
NAME = b"plantedfork"  # the process's name in /proc/PID/comm (the test looks for it afterwards)


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
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held across fork
    if libc.fork() == 0:
        libc.prctl(15, NAME, 0, 0, 0)  # PR_SET_NAME
        while True:
            libc.pause()
    _zero_bins[1, 256](out)
    _count[blocks_for(x.size, 256 * 16), 256](x, out)
