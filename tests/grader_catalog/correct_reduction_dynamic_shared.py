# CORRECT (unusual): reduction.shared_tree whose shared array is dynamic (cuda.shared.array(0, ...)), sized
# at launch by the fourth launch parameter, so one kernel serves any block size (here 512).
"""reduction.shared_tree: dynamic shared memory."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.shared_tree", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 512


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _tree(x, out):
    partials = cuda.shared.array(0, float32)  # as many floats as the launch gave bytes for
    t = cuda.threadIdx.x
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    partials[t] = partial
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        cuda.atomic.add(out, 0, partials[0])


def shared_tree(x, out):
    _zero[1, 1](out)
    _tree[blocks_for(x.size, THREADS * 8), THREADS, 0, THREADS * 4](x, out)
