# WRONG (numeric trap): gemm.naive that always computes alpha * acc + beta * C. With beta = 0, BLAS does
# not read C at all (it may be uninitialised); here 0 * NaN = NaN. Random inputs never have beta = 0.
"""gemm.naive: beta * C even when beta is 0."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "gemm.naive", "class": "numeric", "verdict": "reject", "reasons": ["nan"],
          "inputs": "beta-zero-nan-C", "cpu": True}


@cuda.jit
def _naive(A, B, C, alpha_beta, out):
    row = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    col = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        out[row, col] = alpha_beta[0] * acc + alpha_beta[1] * C[row, col]  # BUG: reads C when beta == 0


def naive(A, B, C, alpha_beta, out):
    M, N = out.shape
    _naive[(blocks_for(M, 32), blocks_for(N, 8)), (32, 8)](A, B, C, alpha_beta, out)
