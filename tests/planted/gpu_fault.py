"""Bug, as a GPU reports it: histogram.global_atomics reads past the end of its input, and the driver
raises CUDA_ERROR_ILLEGAL_ADDRESS at the next synchronisation. (The simulator names the line of an
out-of-bounds access itself; this file raises the driver's error the way a GPU would, so that what
follows is checked on a CPU: the fault is the learner's, with its likely cause, never "grader error",
and the next case runs in a fresh process because the first one's CUDA context is lost.)
"""

from numba import cuda, int32
from numba.cuda.cudadrv.driver import CudaAPIError

EXPECT = {"stage": "histogram.global_atomics", "reason": "gpu-fault", "says": "missing bounds check"}


@cuda.jit
def _count(x, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, x[i], int32(1))


def global_atomics(x, out):
    _count[1, 32](x, out)
    raise CudaAPIError(700, "Call to cuCtxSynchronize results in CUDA_ERROR_ILLEGAL_ADDRESS")
