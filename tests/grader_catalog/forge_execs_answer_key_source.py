# WRONG (the learner's process decides its verdict): histogram.shared_privatized taken from the answer key's
# source, read from disk and executed in this module's namespace: every kernel and launcher then claims to
# be defined here (its __module__ is this file's), so "is it the submission's own code?" says yes.
"""histogram.shared_privatized: the answer key's source, exec'd here."""

from pathlib import Path

import workbench

EXPECT = {"target": "histogram.shared_privatized", "class": "forgery", "verdict": "reject", "reasons": ["*"],
          "cpu": True}

_source = Path(workbench.__file__).resolve().parent.parent / "solutions" / "histogram.py"
_namespace = {"__name__": __name__}
exec(compile(_source.read_text(), __file__, "exec"), _namespace)

shared_privatized = _namespace["shared_privatized"].launch
