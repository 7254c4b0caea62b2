# WRONG (a switch exercised only where it cannot matter): attention.naive, one thread per query row,
# applies the causal mask whatever the CAUSAL flag says. The only simulator size the grader once used
# with the mask off had a sequence of length 1, where masking changes nothing; the grader now grades
# every switch both off and on at a size where it changes the answer.
"""attention.naive: a row per thread, always causal."""

import math

from numba import cuda, float32

EXPECT = {"target": "attention.naive", "class": "symmetry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": True}

THREADS = 64
MAX_HEAD_DIM = 256


@cuda.jit
def _row_per_thread(q, k, v, causal, out):
    B, H, S, D = q.shape
    t = cuda.grid(1)
    if t < B * H * S:
        bh, i = t // S, t % S
        b, h = bh // H, bh % H
        scale = float32(1.0) / math.sqrt(float32(D))
        last = i + 1  # BUG: i + 1 only when causal, else S
        m = float32(-math.inf)
        for j in range(last):
            dot = float32(0.0)
            for d in range(D):
                dot += q[b, h, i, d] * k[b, h, j, d]
            m = max(m, dot * scale)
        acc = cuda.local.array(MAX_HEAD_DIM, float32)
        for d in range(D):
            acc[d] = float32(0.0)
        total = float32(0.0)
        for j in range(last):
            dot = float32(0.0)
            for d in range(D):
                dot += q[b, h, i, d] * k[b, h, j, d]
            p = math.exp(dot * scale - m)
            total += p
            for d in range(D):
                acc[d] += p * v[b, h, j, d]
        for d in range(D):
            out[b, h, i, d] = acc[d] / total


def naive(q, k, v, causal, out):
    B, H, S, _ = q.shape
    _row_per_thread[(B * H * S + THREADS - 1) // THREADS, THREADS](q, k, v, causal, out)
