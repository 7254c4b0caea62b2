# WRONG (the learner's process decides its verdict): matvec.warp_per_row whose module ends its own process
# with exit status 0 the moment it is imported: a grader that takes "exited 0" for "all went well" passes it.
"""matvec.warp_per_row: os._exit(0) at import."""

import os

EXPECT = {"target": "matvec.warp_per_row", "class": "forgery", "verdict": "reject", "reasons": ["*"], "cpu": True}

os._exit(0)  # CHEAT


def warp_per_row(a, x, y):
    raise AssertionError("never reached")
