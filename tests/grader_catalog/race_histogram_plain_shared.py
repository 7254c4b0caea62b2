# WRONG (race between threads, in shared memory): histogram.shared_privatized whose block-private bins are
# incremented with a plain `bins[v] += 1`. The threads of a block hit the same shared counter at once (the
# hot bin) and increments are lost; compute-sanitizer's racecheck sees this one, the simulator's Python
# threads almost never switch inside the statement. The flush to global memory is atomic and right.
"""histogram.shared_privatized: private bins in shared memory, incremented without atomics."""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.shared_privatized", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race"],  # a GPU shows the race by its effect (README)
          "cpu": True}

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
        bins[x[i]] += int32(1)  # BUG: 256 threads of the block share these counters: not atomic
    cuda.syncthreads()
    if bins[t] != 0:
        cuda.atomic.add(out, t, bins[t])


def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _privatized[blocks_for(x.size, THREADS * 16), THREADS](x, out)
