# WRONG (launch geometry that needs a big size): elementwise.fused with cuda.grid(2) over (rows, cols)
# and the columns on the grid's y dimension, launched in one go. A grid's y dimension holds at most 65535
# blocks, 65535 x 16 = 1048560 columns: the GPU's 1 x 2097155 case cannot be launched (the solution
# launches wide matrices in slices of columns). No simulator size comes near.
"""elementwise.fused: one launch whose grid y dimension grows with the columns."""

import math

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "elementwise.fused", "class": "geometry", "verdict": "reject",
          "reasons": ["launch-limit"], "cpu": False}


@cuda.jit(device=True, inline=True)
def gelu(v):
    return float32(0.5) * v * (float32(1.0) + math.erf(v * float32(0.7071067811865476)))


@cuda.jit
def _fused(x, bias, residual, out):
    row, col = cuda.grid(2)
    if row < x.shape[0] and col < x.shape[1]:
        out[row, col] = gelu(x[row, col] + bias[col]) + residual[row, col]


def fused(x, bias, residual, out):
    rows, cols = x.shape
    _fused[(blocks_for(rows, 16), blocks_for(cols, 16)), (16, 16)](x, bias, residual, out)  # BUG: y <= 65535
