# WRONG (race between blocks): histogram.shared_privatized, counting in shared memory with atomics (right),
# then adding the block's bins to the global ones with `out[b] += bins[b]`. Every block does that to the
# same 256 global counters, and on a GPU the blocks run at once: counts are lost. Blocks run in order in
# the simulator, so only a grader that looks for conflicting accesses across blocks catches it.
"""histogram.shared_privatized: the flush of the private bins is not atomic."""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.shared_privatized", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "wrong-values"],  # a GPU shows the race by its effect (README)
          "cpu": True, "quick": False}

BINS = 256
THREADS = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _privatized(x, out):
    bins = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], int32(1))
    cuda.syncthreads()
    out[t] += bins[t]  # BUG: every block adds into the same global bins without an atomic


def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _privatized[blocks_for(x.size, THREADS * 4), THREADS](x, out)
