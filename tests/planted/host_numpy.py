"""Bug: histogram.global_atomics computed on the host with numpy instead of in a kernel.

The answer is right, and it is not the exercise: the data goes to the host and back and no kernel
runs. Expected: "no kernel was launched".
"""

import numpy as np

EXPECT = {"stage": "histogram.global_atomics", "reason": "no-kernel-launch", "says": "no kernel was launched"}


def global_atomics(x, out):
    counts = np.bincount(x.copy_to_host(), minlength=256).astype(np.int32)  # BUG: numpy on the host
    out.copy_to_device(counts)
