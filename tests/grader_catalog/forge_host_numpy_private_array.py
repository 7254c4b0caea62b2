# WRONG (the learner's process decides its verdict): histogram.global_atomics computed with numpy on the
# host, reaching the data without copy_to_host: through the simulator's device array (a numpy array inside,
# `_ary`) or, on a GPU, numba's raw driver copy. One dummy kernel is launched so that "no kernel was
# launched" is not what gives it away, and the counts go back with copy_to_device (host to device).
"""histogram.global_atomics: numpy on the host, reached around copy_to_host."""

import numpy as np
from numba import cuda

EXPECT = {"target": "histogram.global_atomics", "class": "forgery", "verdict": "reject", "reasons": ["*"],
          "cpu": True}


@cuda.jit
def _touch(out):
    pass


def _host_copy(a):
    inside = getattr(a, "_ary", None)
    if inside is not None:  # the simulator's device array
        return np.array(inside)
    from numba.cuda.cudadrv import driver

    host = np.empty(a.shape, a.dtype)
    driver.device_to_host(host, a, a.nbytes)
    return host


def global_atomics(x, out):
    counts = np.bincount(_host_copy(x), minlength=256).astype(np.int32)  # CHEAT: the host does the work
    _touch[1, 1](out)
    out.copy_to_device(counts)
