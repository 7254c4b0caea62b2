# WRONG (numeric trap): elementwise.fused with the tanh approximation of GELU (as in GPT-2) where the
# operator is the exact erf GELU. The two differ by a few 1e-4 in the curved middle (about 7e-5 relative
# over a random matrix, seven times the tolerance): a different function, not a rounding error.
"""elementwise.fused: the tanh GELU instead of the erf GELU."""

import math

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "elementwise.fused", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "cpu": True}

SQRT_2_OVER_PI = float32(0.7978845608028654)


@cuda.jit(device=True, inline=True)
def gelu_tanh(v):
    return float32(0.5) * v * (float32(1.0) + math.tanh(SQRT_2_OVER_PI * (v + float32(0.044715) * v * v * v)))


@cuda.jit
def _fused(x, bias, residual, out):
    row, col = cuda.grid(2)
    if row < x.shape[0] and col < x.shape[1]:
        out[row, col] = gelu_tanh(x[row, col] + bias[col]) + residual[row, col]  # BUG: not the erf GELU


def fused(x, bias, residual, out):
    rows, cols = x.shape
    _fused[(blocks_for(rows, 16), blocks_for(cols, 16)), (16, 16)](x, bias, residual, out)
