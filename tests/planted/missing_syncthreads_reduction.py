"""Bug: reduction.shared_tree without the cuda.syncthreads() inside the tree loop.

Thread t reads partials[t + half] before the thread that owns it has written it: on a GPU a race that
usually works in testing and fails in production; in the simulator the race check sees it (and
shared memory starts as NaN, so the sum would come out NaN). Expected: a race (or a NaN computed by
the kernel), with advice naming syncthreads.
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "reduction.shared_tree", "reason": ["race", "nan"], "says": "syncthreads"}
THREADS = 256


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
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]  # BUG: no barrier: the partner may not have written yet
        half //= 2
    if t == 0:
        cuda.atomic.add(out, 0, partials[0])


def shared_tree(x, out):
    _zero[1, 1](out)
    _tree[blocks_for(x.size, THREADS * 16), THREADS](x, out)
