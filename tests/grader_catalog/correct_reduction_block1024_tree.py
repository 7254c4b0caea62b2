# CORRECT (unusual): reduction.shared_tree with the largest block there is, 1024 threads, and a ten-step
# shared-memory tree. Few blocks, many threads each: legal, and right.
"""reduction.shared_tree: 1024 threads a block."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.shared_tree", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 1024


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _tree(x, out):
    partials = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    partials[t] = partial
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        cuda.atomic.add(out, 0, partials[0])


def shared_tree(x, out):
    _zero[1, 1](out)
    _tree[blocks_for(x.size, THREADS * 4), THREADS](x, out)
