"""What the CNN layer ladders share (depthwise.py, pooling.py, batchnorm.py): NCHW float32 images, the
sizes they are checked and timed at, the bytes one image tensor holds, and their README heading.

The sizes are a ResNet layer's (64 channels of 56x56 at batch 32 to 128) and a few of its neighbours,
large enough to be bandwidth-bound. They live here, not in one of those ladders, because a ladder module
that imports another gets no exercise: the grader refuses the answer key's modules while it grades.
"""

import numpy as np

SIM_SIZES = [(1, 2, 3, 5), (1, 3, 9, 10), (2, 3, 7, 6)]  # quick tier: the first and (1, 3, 9, 10)
CHECK_SIZES = [(1, 1, 1, 2), (2, 3, 17, 19), (4, 64, 28, 28), (32, 64, 56, 56)]
BENCH_SIZES = [(32, 64, 56, 56), (32, 256, 14, 14), (32, 128, 28, 28), (128, 64, 56, 56)]
HEADLINE = (128, 64, 56, 56)  # a ResNet layer at batch 128: 103 MB in, large enough to be bandwidth-bound
GROUP = "CNN layers: depthwise convolution, max-pooling, BatchNorm"


def nchw_images(size, rng):
    """One random N x C x H x W float32 image tensor (the first four numbers of ``size``)."""
    N, C, H, W = size[:4]
    return (rng.uniform(-2.0, 2.0, (N, C, H, W)).astype(np.float32),)


def nchw_bytes(size):
    """The bytes of one N x C x H x W float32 tensor."""
    N, C, H, W = size[:4]
    return 4 * N * C * H * W
