"""Cheat: attention.naive runs the answer key's whole tensor-core attention kernel, imported from one of
its shared modules (``solutions/_flash_mma.py``), which exercises may import for their helpers.

The shared modules were once trusted as if they were the learner's own code. Now only the shared code
the solution's own stage runs is given; the rest is the answer key. Expected: refused, answer-key.
"""

from solutions._flash_mma import launch_3xtf32

EXPECT = {"stage": "attention.naive", "reason": "answer-key", "says": "shared code"}


def naive(q, k, v, causal, out):
    launch_3xtf32(q, k, v, causal, out)
