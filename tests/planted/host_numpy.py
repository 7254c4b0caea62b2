"""Bug: histogram.global_atomics computed on the host with numpy instead of in a kernel.

The answer would be right, and it is not the exercise: the data goes to the host and back and no
kernel runs. Device data is not readable on the host while the stage runs. Expected: "host-copy".
"""

import numpy as np

EXPECT = {"stage": "histogram.global_atomics", "reason": "host-copy", "says": "copy_to_host"}


def global_atomics(x, out):
    counts = np.bincount(x.copy_to_host(), minlength=256).astype(np.int32)  # BUG: numpy on the host
    out.copy_to_device(counts)
