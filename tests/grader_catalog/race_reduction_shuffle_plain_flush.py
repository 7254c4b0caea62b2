# WRONG (race between blocks): reduction.warp_shuffle whose block total (warp shuffles, then warp 0 over
# the warp sums: right) is added to the output by thread 0 with a plain `out[0] += total`. Every block reads
# out[0], adds and writes it back: on a GPU blocks run at the same time, two read the same old total and
# one block's sum is lost. The simulator runs blocks one after another, so the sum is right there unless
# the grader looks for the two blocks' unordered accesses.
"""reduction.warp_shuffle: the block totals flushed without an atomic."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "reduction.warp_shuffle", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "wrong-values"],  # a GPU shows the race by its effect (README)
          "cpu": True, "quick": True}

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
        total = _warp_sum(warp_sums[lane] if lane < WARPS else float32(0.0))
        if lane == 0:
            out[0] = out[0] + total  # BUG: every block's read-modify-write of out[0], not cuda.atomic.add


def warp_shuffle(x, out):
    _zero[1, 1](out)
    _sum[blocks_for(x.size, THREADS * 2), THREADS](x, out)
