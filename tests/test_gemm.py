"""The GEMM ladders (gemm, gemm_bias_gelu, gemm_batched): every stage correct in the simulator at
shapes that are not multiples of any tile, alpha/beta honoured (including beta = 0 with NaN in C),
inputs untouched, bad inputs refused by name, and every kernel compiling for sm_90 without float64.
``-m gpu`` checks the full sizes on a real GPU."""

import subprocess
import sys

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from workbench import device
from workbench.check import compare, run_once
from workbench.ladder import InputError

from solutions import gemm

ALL_STAGES = [s for o in gemm.OPERATORS for s in o.stages]
CPU_STAGES = [s for s in ALL_STAGES if not s.gpu_only]


def _run_gemm(stage, A, B, C, alpha, beta):
    ab = np.array([alpha, beta], np.float32)
    out, after = run_once(stage, (A, B, C, ab), np.empty((A.shape[0], B.shape[1]), np.float32))
    for before, now in zip((A, B, C, ab), after):
        assert np.array_equal(before, now, equal_nan=True), f"{stage.key} modified an input"
    return out, gemm._reference(A, B, C, ab)


@pytest.mark.parametrize("stage", [s for s in gemm.op.stages if not s.gpu_only], ids=lambda s: s.key)
# beta = 0 with C full of NaN is the trap (C must not be read); the other pairs in the slow tier
@pytest.mark.parametrize("alpha, beta", [pytest.param(0.0, 0.75, marks=pytest.mark.slow), (1.25, 0.0),
                                         pytest.param(1.0, 1.0, marks=pytest.mark.slow), (-2.0, 1.0)])
def test_alpha_beta_honoured(stage, alpha, beta):
    rng = np.random.default_rng(3)
    M, N, K = 9, 13, 11
    A, B, C, _ = gemm._inputs((M, N, K), rng)
    if beta == 0.0:
        C[::2, ::3] = np.nan  # BLAS: with beta = 0, C is not read; NaN must not reach the output
    out, ref = _run_gemm(stage, A, B, C, alpha, beta)
    assert np.isfinite(out).all(), f"{stage.key}: NaN in the output (C read although beta = 0?)"
    result = compare(stage.key, (M, N, K), out, ref, gemm._tolerance((M, N, K), np.float32))
    assert result.passed, f"{stage.key} alpha={alpha} beta={beta}: {result.message}"


def test_tolerance_grows_with_k():
    assert gemm._tolerance((4096, 4096, 64), np.float32) == pytest.approx(1e-5)
    assert gemm._tolerance((64, 64, 8191), np.float32) == pytest.approx(4 * gemm.EPS32 * np.sqrt(8191))


def test_tiny_outputs_have_no_cancellation():
    """Below 64 outputs beta C is given the sign of alpha AB: no element's terms cancel."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        A, B, C, ab = gemm._inputs((3, 5, 2), rng)
        product = ab[0] * (A.astype(np.float64) @ B)
        assert (np.sign(product) == np.sign(ab[1] * C)).all()


# -- bad inputs ------------------------------------------------------------------------------------

def _device_args(*arrays):
    from numba import cuda

    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def _gemm_args(M=5, N=7, K=3):
    rng = np.random.default_rng(0)
    A, B, C, ab = gemm._inputs((M, N, K), rng)
    return A, B, C, ab, np.empty((M, N), np.float32)


def test_host_arrays_refused():
    with pytest.raises(InputError, match="host .numpy. array"):
        gemm.vectorized(*_gemm_args())


@pytest.mark.parametrize("change, message", [
    (lambda a: (a[0].astype(np.float64),) + a[1:], "A must have dtype float32"),
    (lambda a: (a[0], a[1][:2]) + a[2:], "inner dimensions differ"),
    (lambda a: a[:2] + (a[2][:, :3],) + a[3:], r"C must have shape \(5, 7\)"),
    (lambda a: a[:3] + (np.ones(1, np.float32),) + a[4:], r"alpha_beta must have shape \(2,\)"),
    (lambda a: a[:4] + (np.empty((7, 5), np.float32),), r"out must have shape \(5, 7\)"),
    (lambda a: (a[0].ravel(),) + a[1:], "A must be 2-D"),
])
def test_bad_gemm_inputs_named(change, message):
    args = _device_args(*change(_gemm_args()))
    with pytest.raises(InputError, match=message):
        gemm.register_tile(*args)


def test_non_contiguous_refused():
    A, B, C, ab, out = _device_args(*_gemm_args(M=6, N=7, K=3))
    with pytest.raises(InputError, match="C-contiguous"):
        gemm.naive(A[::2], B, C[::2], ab, out[::2])


def test_bad_bias_and_batch_inputs_named():
    rng = np.random.default_rng(0)
    A, B, bias = gemm._bias_gelu_inputs((4, 6, 5), rng)
    args = _device_args(A, B, bias[:5], np.empty((4, 6), np.float32))
    with pytest.raises(InputError, match=r"bias must have shape \(6,\)"):
        gemm.fused(*args)
    A, B = gemm._batched_inputs((3, 4, 6, 5), rng)
    args = _device_args(A, B[:2], np.empty((3, 4, 6), np.float32))
    with pytest.raises(InputError, match="same number of matrices"):
        gemm.one_launch(*args)
    args = _device_args(A, B[:, :4], np.empty((3, 4, 6), np.float32))
    with pytest.raises(InputError, match="inner dimensions differ"):
        gemm.one_launch(*args)


def test_tensor_core_stage_says_why_it_is_skipped():
    stage = gemm.op["tensor_core"]
    assert stage.gpu_only and "link=" in stage.gpu_only
    if device.is_simulator():
        with pytest.raises(RuntimeError, match="needs a real GPU"):
            stage(*_device_args(*_gemm_args()))


# -- compiled for sm_90 ----------------------------------------------------------------------------

_PTX_SCRIPT = """
import re
import workbench
from numba import cuda, float32, types
from solutions import gemm
a2, a1 = types.Array(float32, 2, "C"), types.Array(float32, 1, "C")
ptx, _ = cuda.compile_ptx(gemm._vectorized.py_func, (a2, a2, a2, a1, a2), cc=(9, 0))
print(len(re.findall(r"ld\\.shared\\.v4\\.f32", ptx)), len(re.findall(r"ld\\.shared\\.f32", ptx)))
"""


@pytest.mark.slow  # compiles the stage for sm_90 (NVVM): seconds
def test_vectorized_stage_emits_128_bit_shared_loads():
    """Stage 6's lesson, checked: its shared reads compile to ld.shared.v4 (4 per K-step), none scalar."""
    import os

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _PTX_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    v4, scalar = map(int, run.stdout.split()[-2:])
    assert v4 >= 4 and scalar == 0, f"ld.shared.v4: {v4}, scalar ld.shared.f32: {scalar}"


# -- on a GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.timing
def test_headline_targets():
    """At 4096^3, in one run: each stage faster than the one before; the best CUDA-core stage at
    >= 70% of cuBLAS fp32 (torch.addmm, TF32 off) and the tensor-core stage at >= 1.2x it."""
    from tests.headline import assert_each_stage_faster, headline

    _, stages, peer = headline(gemm.op)
    assert_each_stage_faster(stages)
    if peer is not None:
        by_name = {r["stage"]: r["gflops"] for r in stages}
        tensor_core_stages = {"tensor_core", "tensor_core_deep"}  # the TF32 stages: not CUDA cores
        cuda_core = max(g for name, g in by_name.items() if name not in tensor_core_stages)
        assert cuda_core >= 0.70 * peer["gflops"], (by_name, peer["gflops"])
        assert by_name["tensor_core"] >= 1.2 * peer["gflops"], (by_name, peer["gflops"])


@pytest.mark.gpu
@pytest.mark.timing
def test_fused_epilogue_beats_separate_kernels():
    """Where the stage's paragraph says the fusion matters, a product short enough that the separate
    kernel's round trip of the output is a visible share: at 2048^3 (recorded: fused 576 against 683 µs).
    At the 4096^3 headline the round trip is 1-2% of the GEMM (recorded: 4399 against 4470 µs), within
    the spread of two suite runs (4467 against 4444 in one of 2026-11-24): there the fused stage is held
    to no slower than 2%, never to a margin smaller than the noise."""
    from workbench.bench import bench_size
    from workbench.results import environment
    from tests.headline import headline

    op = gemm.bias_gelu_op
    records, failures = bench_size(op, op.stages, (2048, 2048, 2048), {}, np.random.default_rng(0), environment(),
                                   with_peer=False)
    assert not failures, failures
    times = {r["stage"]: r["median_us"] for r in records}
    assert times["fused"] < 0.95 * times["separate"], times
    _, stages, _ = headline(op)
    at_headline = {r["stage"]: r["median_us"] for r in stages}
    assert at_headline["fused"] <= 1.02 * at_headline["separate"], at_headline
