# WRONG (race between blocks): reduction.shared_tree, each block's sum flushed with a plain `out[0] += ...`.
# Thread 0 of every block reads out[0], adds its block's sum and writes it back. On a GPU the blocks run
# at the same time: two of them read the same old total and one block's sum is lost. The simulator runs
# blocks one after another, so the total is right there unless the grader looks for the conflict.
"""reduction.shared_tree: the block tree is right; the flush of the block sums is not atomic."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.shared_tree", "class": "race", "verdict": "reject", "reasons": ["race"],
          "cpu": True, "quick": True}

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
        out[0] += partials[0]  # BUG: read-modify-write from every block, not cuda.atomic.add


def shared_tree(x, out):
    _zero[1, 1](out)
    _tree[blocks_for(x.size, THREADS), THREADS](x, out)
