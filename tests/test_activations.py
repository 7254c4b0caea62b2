"""What is specific to the activation operators (every stage's correctness at the simulator sizes, on the
adversarial specials, and its sm_90 compilation are tests/test_ladders.py's)."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

from solutions import activations
from workbench.check import check_stage
from workbench.ladder import InputError, to_device

FAST = {"sigmoid", "tanh", "gelu", "gelu_tanh", "silu"}


def test_seven_functions_each_its_own_operator_and_fast_math_only_where_there_is_a_transcendental():
    names = [op.name for op in activations.OPERATORS]
    assert names == ["act_relu", "act_leaky_relu", "act_sigmoid", "act_tanh", "act_gelu", "act_gelu_tanh", "act_silu"]
    for act, op in zip(activations.ACTIVATIONS, activations.OPERATORS):
        stages = [s.name for s in op.stages]
        assert stages[:4] == ["thread_per_element", "grid_stride", "vector4", "in_flight"]
        assert (stages[4:] == ["fast_math"]) == (act.name in FAST), op.name
    # tanh.approx.f32 is 2^-11 relative: only its fast-math stage gets a looser tolerance
    loose = {s.key: s.tolerance for op in activations.OPERATORS for s in op.stages if s.tolerance is not None}
    assert loose == {"act_tanh.fast_math": 1e-3}


def test_references_take_the_limits_and_propagate_nan():
    x = np.array([-np.inf, np.inf, np.nan, -20.0, 0.0, 2.0], np.float32)
    ref = {name: activations.reference_of(name)(x) for name in activations.REFERENCES}
    for name in ("gelu", "gelu_tanh", "silu", "relu"):
        assert ref[name][0] == 0.0 and ref[name][1] == np.inf, name  # x * 0 at -inf would be NaN
    assert ref["sigmoid"][0] == 0.0 and ref["sigmoid"][1] == 1.0
    assert ref["tanh"][0] == -1.0 and ref["leaky_relu"][0] == -np.inf
    assert all(np.isnan(r[2]) for r in ref.values())
    # the tails keep their digits: GELU(-20) and SiLU(-20) are tiny, not 0 (1 + erf(x) would cancel)
    assert ref["silu"][3] == pytest.approx(-20.0 / (1.0 + np.exp(20.0)), rel=1e-12)
    assert ref["gelu"][3] == pytest.approx(-10.0 * math.erfc(20.0 / math.sqrt(2.0)), rel=1e-12)
    assert ref["gelu_tanh"][5] == pytest.approx(2.0 * 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (2 + 0.044715 * 8))))


def test_ulp_error_counts_float32_steps():
    one = np.float32(1.0)
    got = np.array([one, np.nextafter(one, np.float32(2)), np.nan, np.inf, np.float32(3.0)], np.float32)
    ref = np.array([1.0, 1.0, np.nan, np.inf, np.inf])
    assert list(activations.ulp_error(got, ref)) == [0.0, 1.0, 0.0, 0.0, np.inf]


@pytest.mark.parametrize("stage_name", ["vector4", "in_flight", "fast_math"])
def test_a_view_that_starts_mid_buffer_is_right(stage_name):
    """(In the simulator every array counts as aligned; on a GPU such a view takes the scalar kernel,
    test_every_stage_right_on_a_misaligned_view_on_the_gpu.)"""
    op = activations.BY_NAME["silu"]
    x = (3 * np.random.default_rng(0).standard_normal(1030)).astype(np.float32)
    d_x, d_out = to_device(x), to_device(np.zeros(1030, np.float32))
    x_view, out_view = d_x[1:], d_out[1:]  # 4 bytes past a 16-byte boundary
    op[stage_name](x_view, out_view)
    np.testing.assert_allclose(d_out.copy_to_host()[1:], op.reference(x[1:]), rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("name", ["relu", "gelu_tanh"])
def test_in_flight_main_body_and_last_block(name):
    """The simulator sizes (3, 1029) are smaller than one in_flight block (4096 floats), so only its
    checked path runs there: 4096 + 1029 gives one block through the unchecked four-load body, a last
    block through the checked loop and a tail of one, on the specials."""
    op = activations.BY_NAME[name]
    (x,) = activations.OPERATORS[0].adversarial_inputs((5125,), np.random.default_rng(3))[0][1]
    for stage in op.stages[3:]:  # in_flight, and fast_math (the same kernel) where there is one
        result = check_stage(stage, (5125,), inputs=(x,), label="specials")
        assert result.passed, result.message


def test_bad_inputs_are_refused_in_one_line():
    op = activations.BY_NAME["gelu"]
    x = cuda.to_device(np.ones(8, np.float64))
    with pytest.raises(InputError, match="x must have dtype float32"):
        op["vector4"](x, cuda.to_device(np.ones(8, np.float32)))
    with pytest.raises(InputError, match=r"out must have shape \(8,\)"):
        op["vector4"](cuda.to_device(np.ones(8, np.float32)), cuda.to_device(np.ones(9, np.float32)))


@pytest.mark.slow
@pytest.mark.sim_only
def test_vector_stages_compile_to_16_byte_accesses_and_fast_tanh_to_one_instruction():
    program = (
        "import workbench, re\n"
        "from numba import cuda, types\n"
        "import solutions.activations as A\n"
        "arr = types.Array(types.float32, 1, 'C')\n"
        "plain, _ = cuda.compile_ptx(A._vector4_gelu.py_func, (arr, arr), cc=(9, 0))\n"
        "flight, _ = cuda.compile_ptx(A._in_flight_gelu.py_func, (arr, arr), cc=(9, 0))\n"
        "fast, _ = cuda.compile_ptx(A._in_flight_tanh_fast.py_func, (arr, arr), cc=(9, 0), fastmath=True)\n"
        "exact, _ = cuda.compile_ptx(A._in_flight_tanh.py_func, (arr, arr), cc=(9, 0))\n"
        "print('v4', 'ld.global.v4.f32' in plain and 'st.global.v4.f32' in plain)\n"
        "accesses = re.findall(r'(ld|st)\\.global\\.v4\\.f32', flight)\n"
        "print('in flight', ''.join(accesses[:5]))\n"
        "print('approx', 'tanh.approx.f32' in fast, 'tanh.approx.f32' in exact)\n")
    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "v4 True" in run.stdout and "approx True False" in run.stdout, run.stdout
    # in_flight: four 16-byte loads before its first 16-byte store
    assert "in flight ldldldldst" in run.stdout, run.stdout


# -- on a GPU: the targets --------------------------------------------------------------------

def _headline(act, op):
    """(last stage's GB/s, torch's GB/s, copy GB/s) at 2^28, each checked on a million sampled elements."""
    import torch

    from tests.headline import copy_peaks
    from workbench.check import compare
    from workbench.timing import measure

    n = op.headline_size[0]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x_t = 3.0 * torch.randn(n, generator=gen, device="cuda")
    out_t = torch.empty_like(x_t)
    index = torch.randint(0, n, (1 << 20,), generator=gen, device="cuda")
    ref = op.reference(x_t[index].cpu().numpy())
    last = op.stages[-1]
    x, out = cuda.as_cuda_array(x_t), cuda.as_cuda_array(out_t)
    last(x, out)
    tolerance = last.tolerance or op.tolerance_for((n,), np.float32)
    assert compare(last.key, (n,), out_t[index].cpu().numpy(), ref, tolerance).passed
    stage_us = measure(last, [(x, out)]).median_us
    torch_us = measure(lambda a: act.torch_call(torch, a), [(x_t,)]).median_us
    return 8 * n / stage_us / 1e3, 8 * n / torch_us / 1e3, copy_peaks()["copy_gbps"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", [a.name for a in activations.ACTIVATIONS])
def test_last_stage_at_85_percent_of_copy_and_at_least_torch(name):
    act = next(a for a in activations.ACTIVATIONS if a.name == name)
    stage_gbps, torch_gbps, copy_gbps = _headline(act, activations.BY_NAME[name])
    assert stage_gbps >= 0.85 * copy_gbps, (stage_gbps, copy_gbps)
    assert stage_gbps >= torch_gbps, (stage_gbps, torch_gbps)


@pytest.mark.gpu
def test_every_stage_right_on_a_misaligned_view_on_the_gpu():
    for op in activations.OPERATORS:
        for stage in op.stages:
            def offset_launch(x, out, stage=stage):
                big_x = cuda.device_array(x.size + 1, np.float32)
                big_out = cuda.device_array(x.size + 1, np.float32)
                big_x[1:].copy_to_device(x)
                stage(big_x[1:], big_out[1:])
                out.copy_to_device(big_out[1:])
            result = check_stage(stage, (100_003,), np.random.default_rng(5), launch=offset_launch)
            assert result.passed, result.message
