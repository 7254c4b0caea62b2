"""Kernels the PTX check must reject or accept (imported by module name in a subprocess)."""

import numpy as np
from numba import cuda, float32

from workbench.ladder import Operator, expect_device_array

op = Operator(
    name="ptx_samples", title="kernels for the PTX check's tests",
    reference=lambda x: 2.0 * x.astype(np.float64),
    make_inputs=lambda size, rng: (rng.standard_normal(size[0]).astype(np.float32),),
    make_output=lambda size: np.empty(size[0], np.float32),
    bytes_moved=lambda size: 8 * size[0], flops=lambda size: size[0],
    validate=lambda x, out: (expect_device_array("x", x, dtype=np.float32, ndim=1),
                             expect_device_array("out", out, dtype=np.float32, shape=x.shape)),
    check_sizes=[33], sim_sizes=[33], bench_sizes=[33], headline_size=(33,),
)


@cuda.jit
def _double_f32(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = float32(2.0) * x[i]


@cuda.jit
def _double_promoted(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2.0 * x[i] * 1.0000001  # bare Python floats: float64 arithmetic


@cuda.jit
def _double_list(x, out):
    i = cuda.grid(1)
    if i < x.size:
        factors = [2.0]  # a reflected list: the simulator runs it, the CUDA compiler refuses it
        out[i] = x[i] * factors[0]


@op.stage("clean", "float32 all the way")
def clean(x, out):
    _double_f32[1, 64](x, out)


@op.stage("promoted", "bare float literals")
def promoted(x, out):
    _double_promoted[1, 64](x, out)


@op.stage("uncompilable", "a list inside a kernel")
def uncompilable(x, out):
    _double_list[1, 64](x, out)
