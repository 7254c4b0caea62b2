# CORRECT (unusual): reduction.warp_shuffle with 128-thread blocks (4 warps) instead of 256, each thread
# summing about 32 elements. A different block size is a tuning choice, not a mistake.
"""reduction.warp_shuffle: 128 threads a block."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.warp_shuffle", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 128
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF


@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    offset = 16
    while offset > 0:
        value += cuda.shfl_down_sync(FULL_MASK, value, offset)
        offset //= 2
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
    partial = _warp_sum(partial)
    if lane == 0:
        warp_sums[warp] = partial
    cuda.syncthreads()
    if warp == 0:
        partial = warp_sums[lane] if lane < WARPS else float32(0.0)
        partial = _warp_sum(partial)
        if lane == 0:
            cuda.atomic.add(out, 0, partial)


def warp_shuffle(x, out):
    _zero[1, 1](out)
    _sum[blocks_for(x.size, THREADS * 32), THREADS](x, out)
