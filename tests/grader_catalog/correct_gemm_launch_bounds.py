# CORRECT (unusual): gemm.shared_tiles compiled with launch_bounds=(256, 2) (at most 256 threads a block,
# at least 2 blocks per SM: the compiler caps registers to fit) and max_registers. Compile options that
# numba-cuda takes on a GPU; the simulator must accept them (or say only a GPU can grade the stage), never
# report a wrong answer.
"""gemm.shared_tiles: 16 x 16 tiles, launch_bounds and max_registers."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "gemm.shared_tiles", "class": "correct", "verdict": "accept", "cpu": True,
          "may_need_gpu": True}

TILE = 16


@cuda.jit(launch_bounds=(256, 2), max_registers=64)
def _tiles(A, B, C, alpha_beta, out):
    As = cuda.shared.array((TILE, TILE), float32)
    Bs = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    M, K = A.shape
    N = B.shape[1]
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        As[ty, tx] = A[row, k0 + tx] if row < M and k0 + tx < K else float32(0.0)
        Bs[ty, tx] = B[k0 + ty, col] if k0 + ty < K and col < N else float32(0.0)
        cuda.syncthreads()
        for k in range(TILE):
            acc += As[ty, k] * Bs[k, tx]
        cuda.syncthreads()
    if row < M and col < N:
        alpha = alpha_beta[0]
        beta = alpha_beta[1]
        out[row, col] = alpha * acc if beta == float32(0.0) else alpha * acc + beta * C[row, col]


def shared_tiles(A, B, C, alpha_beta, out):
    M, N = out.shape
    _tiles[(blocks_for(N, TILE), blocks_for(M, TILE)), (TILE, TILE)](A, B, C, alpha_beta, out)
