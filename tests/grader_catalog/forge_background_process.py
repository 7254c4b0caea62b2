# WRONG (the learner's process decides its verdict): transpose.naive whose kernel writes zeros and which,
# when imported, starts a helper process that outlives grading (it sleeps, holding the grader's stdout and
# stderr open, and could print or write anything later). Grading must end it with the submission's process
# (and not wait for it): nothing the submission starts may survive grading.
"""transpose.naive: a background process started at import."""

import subprocess
import sys

from numba import cuda, float32

EXPECT = {"target": "transpose.naive", "class": "forgery", "verdict": "reject", "reasons": ["*"], "cpu": True,
          "leaves_no_process": "grader-catalog-background-sleeper"}

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "grader-catalog-background-sleeper"])


@cuda.jit
def _zeros(x, out):
    c, r = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = float32(0.0)


def naive(x, out):
    _zeros[((out.shape[1] + 31) // 32, (out.shape[0] + 7) // 8), (32, 8)](x, out)
