"""Cheat: histogram.global_atomics counts on the host, moving the data through the workbench's own
helpers (``workbench.ladder.to_host`` and ``fill_from_host``) and launching an empty kernel for show.

The guards once trusted any code that lives in ``workbench/``, so a helper called from a submission
carried the workbench's privilege. Now a helper acts for its caller. Expected: refused, host-copy.
"""

import numpy as np
from numba import cuda

from workbench.ladder import fill_from_host, to_host

EXPECT = {"stage": "histogram.global_atomics", "reason": ["host-copy", "host-write"], "says": "host"}


@cuda.jit
def _for_show(out):
    pass


def global_atomics(x, out):
    counts = np.bincount(to_host(x), minlength=out.size).astype(out.dtype)
    fill_from_host(out, counts)
    _for_show[1, 1](out)
