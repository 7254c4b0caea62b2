"""Bug: reduction.coalesced configures its kernels' launches and never calls them.

`kernel[blocks, threads]` only makes a launch configuration; the launch is the call that follows,
`kernel[blocks, threads](x, out)`. Nothing runs, and the output keeps whatever it held. Expected:
"no kernel was launched".
"""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"stage": "reduction.coalesced", "reason": "no-kernel-launch", "says": "no kernel was launched"}
THREADS = 256


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


@cuda.jit
def _partials(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    cuda.atomic.add(out, 0, partial)


def coalesced(x, out):
    _zero[1, 1]  # BUG: a configuration, not a launch
    _partials[blocks_for(x.size, THREADS * 16), THREADS]
