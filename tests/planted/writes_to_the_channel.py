"""Cheat: histogram.global_atomics writes a forged reply to every file descriptor it did not open,
hoping one of them is the grader's channel.

The channel is framed and checked: bytes that are not the grader's fail the case. Expected:
"channel".
"""

import json
import os
import struct

from numba import cuda

EXPECT = {"stage": "histogram.global_atomics", "reason": "channel", "says": "channel"}


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    forged = json.dumps({"type": "called", "id": 0, "error": None, "passed": True}).encode()
    for fd in range(3, 1024):
        try:
            os.write(fd, b"@@workbench-grade@@ passed\n" + struct.pack("<Q", len(forged)) + forged)
        except OSError:
            pass
