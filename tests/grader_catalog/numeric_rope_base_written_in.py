# WRONG (a parameter taken as a constant): rope.on_the_fly ignores the inv_freq it is given and rebuilds
# the frequencies from base 10000, written into the launcher. The base is the model's (Llama 3 uses
# 500000): while every input the grader drew used 10000, the rebuilt frequencies were exactly the given
# ones. The grader now draws the base too.
"""rope.on_the_fly: the frequencies rebuilt from a base written into the code."""

import math

import numpy as np
from numba import cuda, float32

EXPECT = {"target": "rope.on_the_fly", "class": "numeric", "verdict": "reject", "reasons": ["wrong-values"],
          "cpu": True, "quick": True}

THREADS = 128


@cuda.jit
def _rotate(x, inv_freq, out):
    n = cuda.grid(1)
    S, H, D = x.shape
    half = D // 2
    if n < S * H * half:
        i = n % half
        h = (n // half) % H
        s = n // (half * H)
        angle = float32(s) * inv_freq[i]
        c, t = math.cos(angle), math.sin(angle)
        xa, xb = x[s, h, i], x[s, h, i + half]
        out[s, h, i] = xa * c - xb * t
        out[s, h, i + half] = xb * c + xa * t


def on_the_fly(x, inv_freq, cos, sin, out):
    S, H, D = x.shape
    mine = (1.0 / (np.float32(10000.0) ** (np.arange(0, D, 2, dtype=np.float32) / np.float32(D)))).astype(np.float32)
    _rotate[(S * H * (D // 2) + THREADS - 1) // THREADS, THREADS](x, cuda.to_device(mine), out)  # BUG: inv_freq
