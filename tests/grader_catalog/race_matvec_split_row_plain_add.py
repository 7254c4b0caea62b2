# WRONG (race between blocks): matvec.warp_per_row with each row split between two blocks (one per half of
# the columns, to have more warps for short matrices), and the halves added into y with `y[row] += acc`.
# The two blocks owning a row run at once on a GPU and one half is lost; in the simulator they run one
# after the other and the sum is right unless the grader looks for the conflicting writes.
"""matvec.warp_per_row: a row's two halves flushed with a plain add."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "matvec.warp_per_row", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "wrong-values"],
          "cpu": True}

THREADS = 256
FULL_MASK = 0xFFFFFFFF


@cuda.jit
def _zero(y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = float32(0.0)


@cuda.jit
def _half_rows(a, x, y):
    lane = cuda.threadIdx.x % 32
    row = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // 32
    if row < a.shape[0]:
        cols = a.shape[1]
        chunk = (cols + 1) // 2
        start = cuda.blockIdx.y * chunk
        stop = min(cols, start + chunk)
        acc = float32(0.0)
        for col in range(start + lane, stop, 32):
            acc += a[row, col] * x[col]
        offset = 16
        while offset > 0:
            acc += cuda.shfl_down_sync(FULL_MASK, acc, offset)
            offset //= 2
        if lane == 0:
            y[row] += acc  # BUG: the other half of this row is added by another block, not atomically


def warp_per_row(a, x, y):
    _zero[blocks_for(y.size, THREADS), THREADS](y)
    _half_rows[(blocks_for(a.shape[0] * 32, THREADS), 2), THREADS](a, x, y)
