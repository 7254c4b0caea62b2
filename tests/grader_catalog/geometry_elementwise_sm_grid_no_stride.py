# WRONG (launch geometry that needs a big size): elementwise.coalesced on a flat view with a grid of
# 2 blocks per multiprocessor and one element per thread. Right for every matrix up to 2 x SMs x 256
# elements (67584 on an H200); the rest of a bigger matrix is never written (the output keeps its poison).
"""elementwise.coalesced: a machine-sized grid without the grid-stride loop."""

import math

from numba import cuda, float32

from workbench.ladder import sm_count

EXPECT = {"target": "elementwise.coalesced", "class": "geometry", "verdict": "reject",
          "reasons": ["unwritten"], "cpu": True}

THREADS = 256


@cuda.jit(device=True, inline=True)
def gelu(v):
    return float32(0.5) * v * (float32(1.0) + math.erf(v * float32(0.7071067811865476)))


@cuda.jit
def _one_each(x, bias, residual, out):
    i = cuda.grid(1)
    cols = bias.size
    if i < x.size:  # BUG: one element per thread
        out[i] = gelu(x[i] + bias[i % cols]) + residual[i]


def coalesced(x, bias, residual, out):
    n = x.shape[0] * x.shape[1]
    _one_each[sm_count() * 2, THREADS](x.reshape(n), bias, residual.reshape(n), out.reshape(n))
