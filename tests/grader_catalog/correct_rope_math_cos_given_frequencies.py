# CORRECT (unusual): rope.on_the_fly with math.cos and math.sin of the float32 angle (libdevice's cosf and
# sinf, not the solution's own range reduction), from the inv_freq it is given, whatever base made it.
"""rope.on_the_fly: math.cos and math.sin of the given frequencies' angles."""

import math

from numba import cuda, float32

EXPECT = {"target": "rope.on_the_fly", "class": "correct", "verdict": "accept", "cpu": True}

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
    _rotate[(S * H * (D // 2) + THREADS - 1) // THREADS, THREADS](x, inv_freq, out)
