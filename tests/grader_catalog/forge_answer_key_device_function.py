# WRONG (the learner's process decides its verdict): reduction.warp_shuffle whose kernel is its own, but
# the part of the exercise (the warp and block reduction) is the answer key's device function, imported.
# Only launched kernels were checked for coming from solutions/, and device functions are not launched.
"""reduction.warp_shuffle: own kernel, the answer key's _block_sum inside."""

from numba import cuda, float32

from solutions.reduction import _block_sum

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.warp_shuffle", "class": "forgery", "verdict": "reject", "reasons": ["*"],
          "cpu": True}

THREADS = 256


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _mine(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    total = _block_sum(partial)  # CHEAT: the exercise's device function, from the answer key
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(out, 0, total)


def warp_shuffle(x, out):
    _zero[1, 1](out)
    _mine[blocks_for(x.size, THREADS * 16), THREADS](x, out)
