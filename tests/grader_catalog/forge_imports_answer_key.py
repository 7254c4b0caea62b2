# WRONG (the learner's process decides its verdict): reduction.warp_shuffle that imports the answer key and
# calls its launcher. The launcher is "the submission's own" function, and the kernel it launches has no
# marked solution region of its own (the marked part is in a device function it calls).
"""reduction.warp_shuffle: the answer key's launcher behind a function of one's own."""

from solutions.reduction import warp_shuffle as _answer

EXPECT = {"target": "reduction.warp_shuffle", "class": "forgery", "verdict": "reject", "reasons": ["*"],
          "cpu": True}


def warp_shuffle(x, out):
    _answer.launch(x, out)
