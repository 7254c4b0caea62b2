"""``python -m workbench.grade_worker``: grade one stage's cases in this process (see workbench.grade).

The grader starts one of these per stage, so that a kernel that hangs or kills its process costs one
case, not the whole run. Reads a JSON job on stdin; writes one report line per event on stdout.
"""

import sys

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from workbench.grade import worker_main

if __name__ == "__main__":
    sys.exit(worker_main())
