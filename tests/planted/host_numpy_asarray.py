"""Cheat: histogram.global_atomics reads the device input on the host as a numpy array (no
copy_to_host call), counts with numpy, and launches a kernel to copy the counts into the output.

Device data is not readable on the host while the stage runs. Expected: "host-copy".
"""

import numpy as np
from numba import cuda

EXPECT = {"stage": "histogram.global_atomics", "reason": "host-copy", "says": "on the host"}


@cuda.jit
def _copy(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def global_atomics(x, out):
    try:
        host = np.asarray(x._ary if hasattr(x, "_ary") else x)  # the simulator's numpy array, or a copy
    except Exception:
        host = np.array([x[i] for i in range(x.size)], dtype=np.uint8)
    counts = np.bincount(host.astype(np.int64), minlength=256).astype(np.int32)
    _copy[1, 256](cuda.to_device(counts), out)
