# WRONG (forgery): attention.fused_row hands its inputs to the answer key's whole tensor-core attention
# launcher, `launch_3xtf32` of solutions/_flash_mma.py. The answer key's shared modules (`_*.py`) may be
# imported, since exercises import their helpers, and their code was once taken as the learner's own.
# Only the shared code the solution's own stage runs is given now; this launcher is another stage's.
"""attention.fused_row: the answer key's 3xTF32 flash kernel, from a shared module."""

from solutions import _flash_mma

EXPECT = {"target": "attention.fused_row", "class": "forgery", "verdict": "reject", "reasons": ["answer-key"],
          "cpu": True}


def fused_row(q, k, v, causal, out):
    _flash_mma.launch_3xtf32(q, k, v, causal, out)
