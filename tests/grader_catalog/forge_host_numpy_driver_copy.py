# WRONG (the learner's process decides its verdict): argmax.shared_tree computed with numpy on the host
# after a raw driver copy of x (numba.cuda.cudadrv.driver.device_to_host: no copy_to_host to see), written
# back with a raw host-to-device copy, and one empty kernel launched. numba's driver functions take the
# simulator's arrays too, so the same path works (and must be caught) in the simulator and on a GPU.
"""argmax.shared_tree: numpy on the host via raw driver copies."""

import numpy as np
from numba import cuda

EXPECT = {"target": "argmax.shared_tree", "class": "forgery", "verdict": "reject", "reasons": ["*"], "cpu": True}


@cuda.jit
def _touch(out):
    pass


def shared_tree(x, out):
    from numba.cuda.cudadrv import driver

    host = np.empty(x.shape, x.dtype)
    driver.device_to_host(host, x, x.nbytes)  # CHEAT
    answer = np.array([np.argmax(host)], np.int32)
    _touch[1, 1](out)
    driver.host_to_device(out, answer, answer.nbytes)
