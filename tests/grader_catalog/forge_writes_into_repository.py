# WRONG (the learner's process decides its verdict): elementwise.unfused whose kernel writes zeros and which,
# when imported, writes a file into the repository (here a harmless marker; it could as well be a
# sitecustomize.py, a conftest.py or an edited solution). The repository must be read-only to the submission.
"""elementwise.unfused: writes into the repository."""

from pathlib import Path

from numba import cuda, float32

import workbench

EXPECT = {"target": "elementwise.unfused", "class": "forgery", "verdict": "reject", "reasons": ["*"], "cpu": True,
          "leaves_no_file": "grader-catalog-forged-marker.txt"}

try:
    (Path(workbench.__file__).resolve().parent.parent / "grader-catalog-forged-marker.txt").write_text(
        "written by tests/grader_catalog/forge_writes_into_repository.py while it was being graded\n")
except OSError:
    pass  # refused: as it should be


@cuda.jit
def _zeros(out):
    r, c = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = float32(0.0)


def unfused(x, bias, residual, out):
    _zeros[((out.shape[0] + 15) // 16, (out.shape[1] + 15) // 16), (16, 16)](out)
