"""Cheat: histogram.global_atomics looks for the reference among the objects of its process (the old
grader computed it in the same process, before the call) and copies it into the output.

The reference is computed in the grader's process only. Expected: the output is never written.
"""

import gc

import numpy as np
from numba import cuda

EXPECT = {"stage": "histogram.global_atomics", "reason": ["unwritten", "uninitialised", "all-zeros"], "says": ""}


@cuda.jit
def _copy(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


@cuda.jit
def _nothing(out):
    pass


def global_atomics(x, out):
    _nothing[1, 1](out)
    for obj in gc.get_objects():
        if isinstance(obj, np.ndarray) and obj.shape == (256,) and obj.dtype == np.int64 and obj.sum() == x.size:
            _copy[1, 256](cuda.to_device(obj.astype(np.int32)), out)
            return
