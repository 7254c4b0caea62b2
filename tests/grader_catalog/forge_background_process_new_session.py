# WRONG (the learner's process decides its verdict): transpose.tiled whose kernel writes zeros and which
# starts a helper in a session of its own (setsid: out of the grader's process group, so killing the group
# does not reach it). It must not survive grading either.
"""transpose.tiled: a background process in its own session."""

import subprocess
import sys

from numba import cuda, float32

EXPECT = {"target": "transpose.tiled", "class": "forgery", "verdict": "reject", "reasons": ["*"], "cpu": True,
          "leaves_no_process": "grader-catalog-detached-sleeper"}

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "grader-catalog-detached-sleeper"],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)


@cuda.jit
def _zeros(x, out):
    c, r = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = float32(0.0)


def tiled(x, out):
    _zeros[((out.shape[1] + 31) // 32, (out.shape[0] + 7) // 8), (32, 8)](x, out)
