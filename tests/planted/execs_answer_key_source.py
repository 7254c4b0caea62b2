"""Cheat: histogram.global_atomics run from the answer key's source, read and executed at import.

The submission cannot import the answer key, so it reads solutions/histogram.py and executes it.
The answer key is not readable while grading (and a kernel compiled from it is recognised by its
bytecode wherever it comes from). Expected: "answer key".
"""

from workbench.paths import SOLUTIONS_DIR

EXPECT = {"stage": "histogram.global_atomics", "reason": "answer-key", "says": "answer key"}

_key: dict = {}
exec(compile((SOLUTIONS_DIR / "histogram.py").read_text(), "histogram.py", "exec"), _key)


def global_atomics(x, out):
    _key["_zero_bins"][1, 256](out)
    _key["_global_atomics"][_key["_grid"](x.size), 256](x, out)
