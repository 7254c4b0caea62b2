# CORRECT (unusual): histogram.global_atomics with warp-aggregated atomics: the lanes of a warp that hold
# the same byte find each other with match_any_sync, and only the lowest of them adds their count. The warp
# walks the input 32 elements at a time (a grid-stride loop over warps), so every lane reaches every
# shuffle; lanes past the end carry a value no byte has.
"""histogram.global_atomics: match_any_sync warp aggregation."""

from numba import cuda, int32

from workbench.ladder import blocks_for

EXPECT = {"target": "histogram.global_atomics", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 256
FULL_MASK = 0xFFFFFFFF
NO_BIN = 256


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


@cuda.jit
def _aggregated(x, out):
    lane = cuda.threadIdx.x % 32
    warp = cuda.grid(1) // 32
    warps = cuda.gridsize(1) // 32
    for base in range(warp * 32, x.size, warps * 32):  # the same trip count for all 32 lanes
        i = base + lane
        value = int32(x[i]) if i < x.size else int32(NO_BIN)
        peers = cuda.match_any_sync(FULL_MASK, value)
        leader = (peers & cuda.lanemask_lt()) == 0
        if leader and value != NO_BIN:
            cuda.atomic.add(out, value, int32(cuda.popc(peers)))


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _aggregated[blocks_for(x.size, THREADS * 16), THREADS](x, out)
