"""The ladders: one module per family (its fp16/bf16 variants and its fusions beside it), every stage in order.

Notebooks show these kernels, the grader's answer key is these, and ``exercises/`` is generated
from them. Importing a module here imports ``workbench`` first, which chooses GPU or simulator
before numba is imported. Where an operator is listed is its ``rank`` field (see CONTRIBUTING.md).

``$WORKBENCH_SOLUTIONS_PATH`` adds folders of one's own ladder modules to this package.
"""

import os

import workbench  # noqa: F401  (must precede numba)

__path__ += [p for p in os.environ.get("WORKBENCH_SOLUTIONS_PATH", "").split(os.pathsep) if p]  # noqa: F821
