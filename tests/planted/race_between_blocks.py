"""Bug: reduction.shared_tree adds each block's total to the output with a plain `+=`.

Every block's thread 0 reads out[0], adds its block's total and writes it back: on a GPU, blocks run
at the same time, so two of them read the same old total and one block's sum is lost. The
simulator runs blocks one after another (always right), but its race check sees two blocks write
the same global element with nothing ordering them. Expected: "race", with advice naming atomics.
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "reduction.shared_tree", "reason": "race", "says": "cuda.atomic"}
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
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            partials[t] += partials[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        out[0] += partials[0]  # BUG: not atomic; blocks race for out[0]


def shared_tree(x, out):
    _zero[1, 1](out)
    _tree[blocks_for(x.size, THREADS * 2), THREADS](x, out)
