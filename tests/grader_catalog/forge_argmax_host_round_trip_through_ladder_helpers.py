# WRONG (forgery): argmax.shared_tree finds the index with numpy on the host, having moved x there with
# the workbench's own `to_host`, then sends the answer back with its `to_device` and copies it into out
# with a one-thread kernel, so that a kernel writes the output. The host-access guard once trusted any
# code living in workbench/, and so the copy made for the submission. A helper now acts for its caller.
"""argmax.shared_tree: numpy on the host, carried through workbench.ladder's helpers."""

import numpy as np
from numba import cuda

from workbench.ladder import to_device, to_host

EXPECT = {"target": "argmax.shared_tree", "class": "forgery", "verdict": "reject", "reasons": ["host-copy"],
          "cpu": True, "quick": True}


@cuda.jit
def _copy_one(src, out):
    out[0] = src[0]


def shared_tree(x, out):
    answer = to_device(np.array([np.argmax(to_host(x))], dtype=np.int32))
    _copy_one[1, 1](answer, out)
