# WRONG (a size symmetry): attention.naive, one thread per query row, splits the flat (batch, head) index
# with the batch count where it means the head count (b = bh // B, h = bh % B). Right whenever batch and
# heads are equal, which every size the simulator once graded had (1 and 1, or 2 and 2); wrong as soon as
# they differ. The grader now grades sizes whose dimensions are all different.
"""attention.naive: a row per thread, (batch, head) split by the wrong count."""

import math

from numba import cuda, float32

EXPECT = {"target": "attention.naive", "class": "symmetry", "verdict": "reject",
          "reasons": ["out-of-bounds", "wrong-values", "unwritten"], "cpu": True}

THREADS = 64
MAX_HEAD_DIM = 256


@cuda.jit
def _row_per_thread(q, k, v, causal, out):
    B, H, S, D = q.shape
    t = cuda.grid(1)
    if t < B * H * S:
        bh, i = t // S, t % S
        b, h = bh // B, bh % B  # BUG: bh // H, bh % H
        scale = float32(1.0) / math.sqrt(float32(D))
        last = i + 1 if causal[0] else S  # (a one-element device array: 1 masked, 0 not)
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
