# WRONG (race between blocks): scan.hillis_steele in one pass, each block adding the running total that
# the block before it left in global memory, read without any flag, fence or atomic. On a GPU blocks do not
# run in order: block b often reads prefix[b - 1] before block b - 1 has written it (garbage). The simulator
# runs the blocks in index order, so it is always right there unless the grader runs them out of order or
# looks for the read of another block's write.
"""scan.hillis_steele: a chained single-pass scan without the decoupled look-back's flags."""

from numba import cuda, float32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "scan.hillis_steele", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "nan", "wrong-values"],
          "cpu": True}

THREADS = 256


@cuda.jit
def _chained(x, y, prefix):
    buf = cuda.shared.array(THREADS, float32)
    carry = cuda.shared.array(1, float32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    i = b * THREADS + t
    buf[t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()
    offset = 1
    while offset < THREADS:
        v = buf[t - offset] if t >= offset else float32(0.0)
        cuda.syncthreads()
        buf[t] += v
        cuda.syncthreads()
        offset *= 2
    if t == THREADS - 1:
        before = prefix[b - 1] if b > 0 else float32(0.0)  # BUG: block b - 1 may not have written it yet
        prefix[b] = before + buf[t]
        carry[0] = before
    cuda.syncthreads()
    if i < x.size:
        y[i] = buf[t] + carry[0]


def hillis_steele(x, y):
    tiles = blocks_for(x.size, THREADS)
    prefix = scratch("catalog.chained.prefix", tiles)
    _chained[tiles, THREADS](x, y, prefix)
