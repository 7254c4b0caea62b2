# WRONG (race between blocks): gemm.coalesced with split-K (the K loop cut in four slices, one per
# blockIdx.z, for more parallelism on small matrices), each slice added into out with `out[r, c] += ...`.
# The four blocks that own an output element run at once on a GPU and partial products are lost. The
# simulator runs them in order, so only a grader that looks for conflicting writes across blocks sees it.
"""gemm.coalesced: split-K with a plain add of the slices."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "gemm.coalesced", "class": "race", "verdict": "reject", "reasons": ["race"],
          "gpu_reasons": ["race", "wrong-values"],
          "cpu": True}

SLICES = 4


@cuda.jit
def _start(C, alpha_beta, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        beta = alpha_beta[1]
        out[row, col] = float32(0.0) if beta == float32(0.0) else beta * C[row, col]


@cuda.jit
def _slice(A, B, alpha_beta, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        K = A.shape[1]
        chunk = (K + SLICES - 1) // SLICES
        start = cuda.blockIdx.z * chunk
        acc = float32(0.0)
        for k in range(start, min(K, start + chunk)):
            acc += A[row, k] * B[k, col]
        out[row, col] += alpha_beta[0] * acc  # BUG: SLICES blocks add into this element, not atomically


def coalesced(A, B, C, alpha_beta, out):
    M, N = out.shape
    grid = (blocks_for(N, 32), blocks_for(M, 8))
    _start[grid, (32, 8)](C, alpha_beta, out)
    _slice[(grid[0], grid[1], SLICES), (32, 8)](A, B, alpha_beta, out)
