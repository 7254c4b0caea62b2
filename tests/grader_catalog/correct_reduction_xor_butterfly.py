# CORRECT (unusual): reduction.warp_shuffle with a butterfly (shfl_xor_sync): after five steps every lane
# holds the warp's sum, not only lane 0. The warp sums meet in shared memory and warp 0 repeats.
"""reduction.warp_shuffle: xor butterfly shuffles."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.warp_shuffle", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF


@cuda.jit(device=True, inline=True)
def _butterfly(value):
    mask = 16
    while mask > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, mask)
        mask //= 2
    return value


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _sum(x, out):
    warp_sums = cuda.shared.array(WARPS, float32)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    partial = _butterfly(partial)
    if lane == 0:
        warp_sums[warp] = partial
    cuda.syncthreads()
    if warp == 0:
        total = _butterfly(warp_sums[lane] if lane < WARPS else float32(0.0))
        if lane == 0:
            cuda.atomic.add(out, 0, total)


def warp_shuffle(x, out):
    _zero[1, 1](out)
    _sum[blocks_for(x.size, THREADS * 16), THREADS](x, out)
