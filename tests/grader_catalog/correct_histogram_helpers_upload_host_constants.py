# CORRECT (unusual): histogram.global_atomics uploads host-made data with the workbench's helpers: the
# zeros its counts start from, made by numpy and sent with `workbench.ladder.to_device`, then counted into
# by a kernel and copied into out by another. Host to device copies of the submission's own host data are
# allowed (only reading device data on the host, or writing out from it, is refused), helper or not.
"""histogram.global_atomics: zeros uploaded from the host through workbench.ladder.to_device."""

import numpy as np
from numba import cuda, int32

from workbench.ladder import blocks_for, to_device

EXPECT = {"target": "histogram.global_atomics", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 128


@cuda.jit
def _count(x, counts):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(counts, x[i], int32(1))


@cuda.jit
def _copy(counts, out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = counts[b]


def global_atomics(x, out):
    counts = to_device(np.zeros(out.size, dtype=np.int32))
    _count[blocks_for(x.size, THREADS * 8), THREADS](x, counts)
    _copy[blocks_for(out.size, THREADS), THREADS](counts, out)
