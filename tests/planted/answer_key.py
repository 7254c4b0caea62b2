"""Cheat: histogram.global_atomics that launches the answer key's kernel.

The launcher is the submission's own, the kernel is solutions.histogram._global_atomics. The answer
key cannot be imported while grading. Expected: "answer key".
"""

from solutions.histogram import THREADS, _global_atomics, _grid, _zero_bins

EXPECT = {"stage": "histogram.global_atomics", "reason": "answer-key", "says": "answer key"}


def global_atomics(x, out):
    _zero_bins[1, 256](out)
    _global_atomics[_grid(x.size), THREADS](x, out)
