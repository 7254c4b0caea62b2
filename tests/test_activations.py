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
from workbench.check import check_stage, relative_error
from workbench.ladder import InputError, to_device, to_host

FAST = {"sigmoid", "tanh", "gelu", "gelu_tanh", "silu"}


def test_seven_functions_each_its_own_operator_and_fast_math_only_where_there_is_a_transcendental():
    names = [op.name for op in activations.FLOAT32_OPERATORS]
    assert names == ["activation[relu]", "activation[leaky_relu]", "activation[sigmoid]", "activation[tanh]", "activation[gelu]", "activation[gelu_tanh]", "activation[silu]"]
    for act, op in zip(activations.ACTIVATIONS, activations.FLOAT32_OPERATORS):
        stages = [s.name for s in op.stages]
        assert stages[:5] == ["thread_per_element", "grid_stride", "vector4", "in_flight", "small_tiles"]
        expected = (["fast_math"] if act.name in FAST else []) + (["short_erfc"] if act.name == "gelu" else [])
        assert stages[5:] == expected, op.name
    # tanh.approx.f32 is 2^-11 relative: only its fast-math stage gets a looser tolerance
    loose = {s.key: s.tolerance for op in activations.FLOAT32_OPERATORS for s in op.stages if s.tolerance is not None}
    assert loose == {"activation[tanh].fast_math": 1e-3}


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


@pytest.mark.parametrize("stage_name", ["vector4", "in_flight", "small_tiles", "fast_math"])
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
    for stage in op.stages[3:]:  # in_flight, small_tiles, and fast_math where there is one
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
        "fast, _ = cuda.compile_ptx(A._small_tiles_tanh_fast.py_func, (arr, arr), cc=(9, 0), fastmath=True)\n"
        "exact, _ = cuda.compile_ptx(A._small_tiles_tanh.py_func, (arr, arr), cc=(9, 0))\n"
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
@pytest.mark.timing
@pytest.mark.parametrize("name", [a.name for a in activations.ACTIVATIONS])
def test_last_stage_at_85_percent_of_copy_and_at_least_torch(name):
    act = next(a for a in activations.ACTIVATIONS if a.name == name)
    stage_gbps, torch_gbps, copy_gbps = _headline(act, activations.BY_NAME[name])
    assert stage_gbps >= 0.85 * copy_gbps, (stage_gbps, copy_gbps)
    assert stage_gbps >= torch_gbps, (stage_gbps, torch_gbps)


@pytest.mark.gpu
def test_every_stage_right_on_a_misaligned_view_on_the_gpu():
    for op in activations.FLOAT32_OPERATORS:
        for stage in op.stages:
            def offset_launch(x, out, stage=stage):
                big_x = cuda.device_array(x.size + 1, np.float32)
                big_out = cuda.device_array(x.size + 1, np.float32)
                big_x[1:].copy_to_device(x)
                stage(big_x[1:], big_out[1:])
                out.copy_to_device(big_out[1:])
            result = check_stage(stage, (100_003,), np.random.default_rng(5), launch=offset_launch)
            assert result.passed, result.message


# -- fp16 and bf16 ----------------------------------------------------------------------------------------

HALF = activations.HALF_OPERATORS


def test_sixteen_bit_operators_all_seven_functions_per_format_float32_inside():
    assert [op.name for op in HALF] == [f"activation[{a},{f}]" for f in ("fp16", "bf16")
                                        for a in ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu")]
    for op in HALF:
        stages = [s.name for s in op.stages]
        # fast_math where there is a transcendental function, but not for fp16 tanh (tanh.approx.f32's error
        # is up to a whole fp16 step)
        has_fast = op.variant["function"] in FAST and op.name != "activation[tanh,fp16]"
        expected = ["widened", "in_flight"] + (["fast_math"] if has_fast else [])
        expected += ["short_erfc"] if op.variant["function"] == "gelu" else []
        assert stages == expected, op.name
        assert all(s.dtype == np.float32 for s in op.stages)  # the PTX check then refuses f64 in them
        assert op.tolerance_for((1,), np.float32) == (2e-3 if op.variant["dtype"] == "fp16" else 1e-2)
        assert op.torch_expression is not None  # torch.compile beside eager torch at the dtype


def test_float_to_bf16_rounds_to_nearest_even_and_keeps_nan():
    """The integer rounding of float32 -> bf16 against ml_dtypes' conversion: ties to even both ways, a
    carry into the exponent, overflow to inf, NaN kept a NaN, subnormals."""
    from solutions._vector_io import bf16_to_float, float_to_bf16

    @cuda.jit
    def round_trip(x, bits, back):
        i = cuda.grid(1)
        if i < x.size:
            bits[i] = float_to_bf16(x[i])
            back[i] = bf16_to_float(bits[i])

    one = np.float32(1.0).view(np.uint32)
    x = np.array([1.0, -1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-40, 3e-45, 65504.0],
                 np.float32)
    ties = np.array([one + 0x8000, one + 0x18000, one + 0x7FFF, one + 0x8001, 0x7F7FFFFF], np.uint32).view(np.float32)
    x = np.concatenate([x, ties, np.random.default_rng(0).standard_normal(15).astype(np.float32) * 1e3])
    bits = cuda.to_device(np.zeros(x.size, np.uint16))
    back = cuda.to_device(np.zeros(x.size, np.float32))
    round_trip[1, x.size](cuda.to_device(x), bits, back)
    expected = x.astype(activations.BFLOAT16)
    got = bits.copy_to_host().view(activations.BFLOAT16)
    same = (got.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(got.astype(np.float32)) & np.isnan(x))
    assert same.all(), list(zip(x[~same], got[~same], expected[~same]))
    np.testing.assert_array_equal(back.copy_to_host(), got.astype(np.float32))


@pytest.mark.parametrize("name", ["activation[gelu,fp16]", "activation[silu,bf16]", "activation[leaky_relu,fp16]", "activation[leaky_relu,bf16]",
                                  "activation[sigmoid,fp16]", "activation[sigmoid,bf16]", "activation[tanh,fp16]", "activation[tanh,bf16]"])
def test_sixteen_bit_results_within_half_an_ulp_of_the_format_on_the_specials(name):
    """Elementwise, not in norm: every result is the float64 answer rounded to 16 bits, give or take the
    float32 function's error (far below a 16-bit step): at most 0.5 ulp of the format, plus a hair."""
    op = activations.BY_NAME[name]
    (x,) = op.adversarial_inputs((203,), np.random.default_rng(7))[0][1]
    ref = op.reference(x)
    for stage in op.stages[:2]:  # widened, in_flight (fast_math is the same kernel compiled differently)
        d_out = to_device(np.zeros(203, op.dtype))
        stage(to_device(x), d_out)
        ulps = activations.ulp_error(to_host(d_out), ref, op.dtype)
        assert np.max(ulps) <= 0.501, (stage.key, x[np.argmax(ulps)], to_host(d_out)[np.argmax(ulps)])


def _short_erfc_in_float32(z, t_steps=0):
    """short_erfc's arithmetic in numpy float32, step for step (exp is numpy's: exact to the rounding);
    t_steps moves the reciprocal t that many float32 steps (div.approx's error: up to 2)."""
    f = np.float32
    a = np.abs(z.astype(f))
    t = f(1) / (f(1) + f(0.5) * a)
    for _ in range(abs(t_steps)):
        t = np.nextafter(t, f(np.inf) if t_steps > 0 else f(0))
    p = activations.ERFC_P[-1]
    for c in activations.ERFC_P[-2::-1]:
        p = p * t + c
    with np.errstate(all="ignore"):
        r = t * np.exp(p - a * a)
    return np.where(z >= 0, r, f(2) - r).astype(f)


def test_short_erfc_is_within_its_stated_error_and_gelu_with_it_rounds_every_16_bit_input_right():
    """The formula of activation[gelu,fp16]/bf16.short_erfc: relative error below 1.2e-7 against the float64 erfc
    (in float64 arithmetic), and in float32 arithmetic every one of the 65536 inputs of each format
    within 0.501 ulp of the format (the rounding alone; bf16 results below float32's smallest normal
    left out, as the fast kernels flush them)."""
    z = np.linspace(-6.0, 12.0, 180_001)
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    p = np.polyval([float(c) for c in activations.ERFC_P[::-1]], t)
    r = np.where(z >= 0, t * np.exp(p - a * a), 2.0 - t * np.exp(p - a * a))
    assert np.max(np.abs(r / activations.erfc64(z) - 1.0)) < 1.2e-7
    for op in (activations.BY_NAME["activation[gelu,fp16]"], activations.BY_NAME["activation[gelu,bf16]"]):
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(op.dtype)
        v = x.astype(np.float32)
        with np.errstate(all="ignore"):
            g = np.float32(0.5) * v * _short_erfc_in_float32(-v * activations.SQRT_HALF)
        got = np.where(v == -np.inf, np.float32(0), g).astype(op.dtype)
        ref = op.reference(x)
        ulps = activations.ulp_error(got, ref, op.dtype)
        kept = (np.abs(ref) >= np.finfo(np.float32).tiny) | (ref == 0) | ~np.isfinite(ref)
        worst = int(np.argmax(np.where(kept, ulps, 0)))
        assert ulps[worst] <= 0.501, (op.name, x[worst], got[worst], ref[worst])


def test_float32_gelu_short_erfc_costs_a_few_ulps_beside_the_rounding_of_its_argument():
    """activation[gelu].short_erfc's formula in float32 arithmetic against the float64 GELU, beside the best
    any erfc of a float32 argument can do (the exact erfc of z = -x / sqrt 2 rounded to float32, what the
    erfcf stages come close to): far below 0 both are hundreds of ulps off (the rounding of z); the
    formula, its reciprocal up to 2 ulps off (div.approx), stays within 1.6 times that plus 12 ulps
    (this replay rounds p - a * a twice, where the GPU fuses it: a little pessimistic)."""
    f = np.float32
    v = np.concatenate([np.linspace(-13.0, 13.0, 400_001), 3.0 * np.random.default_rng(0).standard_normal(400_000)])
    v = v.astype(f)
    ref = activations.reference_of("gelu")(v)
    z = (-v * activations.SQRT_HALF).astype(f)
    rounded_z = (f(0.5) * v * activations.erfc64(z.astype(np.float64)).astype(f)).astype(f)
    normal = np.abs(ref) >= np.finfo(f).tiny  # the fast kernel flushes subnormal results
    for t_steps in (-2, 0, 2):  # the reciprocal is div.approx's: within 2 ulps
        with np.errstate(all="ignore"):
            formula = (f(0.5) * v * _short_erfc_in_float32(z, t_steps)).astype(f)
        for low, high in [(-13, -5), (-5, -1), (-1, 1), (1, 13)]:
            band = normal & (v >= low) & (v < high)
            best = np.max(activations.ulp_error(rounded_z[band], ref[band]))
            got = np.max(activations.ulp_error(formula[band], ref[band]))
            assert got <= 1.6 * best + 12, (t_steps, low, high, got, best)
        assert relative_error(formula, ref) < 1e-6  # the float32 tolerance is 1e-5


def _flush(x):
    """What fastmath=True does to every float32 result (the .ftz of each instruction): a subnormal, below
    2^-126 = 1.2e-38, becomes a zero of its sign."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def _logistic_times_v_flushed(v, z):
    """v * logistic(z) under fastmath, step for step, each result flushed (exp is numpy's, exact to the
    rounding; ex2.approx's error is far below a 16-bit step): the formula SiLU and GELU-tanh had."""
    f = np.float32
    e = _flush(np.exp(_flush(-np.abs(z))))
    r = _flush(f(1) / _flush(f(1) + e))
    return _flush(v * np.where(z >= 0, r, _flush(e * r)))


def _times_logistic_flushed(v, z):
    """activations.times_logistic under fastmath, step for step, each result flushed."""
    f = np.float32
    h = _flush(np.exp(_flush(f(-0.5) * np.abs(z))))
    r = _flush(f(1) / _flush(f(1) + _flush(h * h)))
    return np.where(z >= 0, _flush(v * r), _flush(_flush(_flush(v * h) * r) * h))


@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
def test_fast_math_flush_to_zero_loses_no_16_bit_result_that_is_a_normal_float32(name):
    """Without a GPU: every one of the 65536 inputs of each format through the fast kernels' float32
    arithmetic with a flush to zero after every operation. times_logistic keeps every result that is at
    least float32's smallest normal within 0.501 ulp of the format; v * logistic(z), the formula it
    replaced, loses bf16 results hundreds of ulps (e^-|z| flushed while the product is normal: the H200
    measured 245 ulps for SiLU at x = -90.5, 155 for GELU-tanh at x = -10.06; this replay finds the same),
    which is what makes this test able to fail. fp16's range ends long before: both are right there."""
    f = np.float32
    for op in (activations.BY_NAME[f"activation[{name},fp16]"], activations.BY_NAME[f"activation[{name},bf16]"]):
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(op.dtype)
        ref = op.reference(x)
        kept = (np.abs(ref) >= np.finfo(f).tiny) | (ref == 0) | ~np.isfinite(ref)
        worst = {}
        with np.errstate(all="ignore"):
            v = _flush(x.astype(f))  # .ftz flushes inputs too: a bf16 subnormal is 0 to the kernel
            if name == "silu":
                z = v
            else:  # GELU_TANH_C * (v + GELU_TANH_K * v * v * v), left to right
                cube = _flush(_flush(_flush(activations.GELU_TANH_K * v) * v) * v)
                z = _flush(activations.GELU_TANH_C * _flush(v + cube))
            for form in (_logistic_times_v_flushed, _times_logistic_flushed):
                got = np.where(v == -np.inf, f(0), form(v, z)).astype(op.dtype)
                ulps = np.where(kept, activations.ulp_error(got, ref, op.dtype), 0.0)
                at = int(np.argmax(ulps))
                worst[form] = (float(ulps[at]), float(x[at]))
        assert worst[_times_logistic_flushed][0] <= 0.501, (op.name, worst[_times_logistic_flushed])
        replaced = worst[_logistic_times_v_flushed]
        if op.dtype == activations.BFLOAT16:
            assert replaced[0] > 100 and -92 < replaced[1] < -10, (op.name, replaced)
        else:
            assert replaced[0] <= 0.501, (op.name, replaced)


def test_fast_tanh_bound_in_ulps_of_each_format():
    """tanh.approx.f32's documented relative error, 2^-10.987, replayed over all 65536 inputs of each format:
    the exact tanh, rounded to float32, moved by up to that error either way, then rounded to 16 bits. In bf16
    every result stays within activation[tanh,bf16].fast_math's bound (0.5 + 0.127 ulp) and some pass 0.51, which is
    why that stage has a bound of its own; in fp16 results land more than a step away, which is why
    activation[tanh,fp16] has no fast_math stage."""
    error = 2.0**-10.987
    worst = {}
    for op in (activations.BY_NAME["activation[tanh,fp16]"], activations.BY_NAME["activation[tanh,bf16]"]):
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(op.dtype)
        ref = op.reference(x)
        with np.errstate(invalid="ignore"):  # the NaN patterns
            exact = np.tanh(x.astype(np.float64)).astype(np.float32).astype(np.float64)
            moved = [(exact * (1.0 + k * error)).astype(np.float32).astype(op.dtype) for k in (-1, -0.5, 0.5, 1)]
            worst[op.name] = max(float(np.max(activations.ulp_error(got, ref, op.dtype))) for got in moved)
    assert activations.HALF_ULPS < worst["activation[tanh,bf16]"] <= activations.ulps_allowed("activation[tanh,bf16].fast_math"), worst
    assert worst["activation[tanh,fp16]"] > 1.0, worst
    assert "fast_math" not in [s.name for s in activations.BY_NAME["activation[tanh,fp16]"].stages]


def test_ulp_error_counts_steps_of_the_format():
    h = np.array([1.0, 2048.0, 65504.0, 6e-8], np.float16)
    got = np.array([np.nextafter(h[0], np.float16(2)), h[1], h[2], 0.0], np.float16)
    ulps = activations.ulp_error(got, np.array([1.0, 2049.0, 65504.0 - 16.0, 6e-8]), np.float16)
    # 2049 lies half-way between fp16 steps of 2; at 65504 the step is the one below it (32); 6e-8 is one
    # subnormal step (5.96e-8) from 0
    np.testing.assert_allclose(ulps, [1.0, 0.5, 0.5, 6e-8 / 2.0**-24], rtol=1e-6)


@pytest.mark.slow  # 8395 halves in the simulator: seconds a stage
@pytest.mark.parametrize("name", ["activation[gelu,fp16]", "activation[silu,bf16]"])
def test_sixteen_bit_in_flight_main_body_and_last_block(name):
    """Past the simulator sizes: 8192 + 203 halves give one block through the unchecked four-vector
    body and a last block through the checked loop and a tail of three, on the specials."""
    op = activations.BY_NAME[name]
    (x,) = op.adversarial_inputs((8395,), np.random.default_rng(3))[0][1]
    result = check_stage(op["in_flight"], (8395,), inputs=(x,), label="specials")
    assert result.passed, result.message


def test_sixteen_bit_bad_inputs_are_refused_in_one_line():
    op = activations.BY_NAME["activation[gelu,fp16]"]
    with pytest.raises(InputError, match="x must have dtype float16, got float32"):
        op["in_flight"](cuda.to_device(np.ones(8, np.float32)), cuda.to_device(np.ones(8, np.float16)))
    with pytest.raises(InputError, match=r"out must have shape \(8,\)"):
        op["widened"](cuda.to_device(np.ones(8, np.float16)), cuda.to_device(np.ones(9, np.float16)))


@pytest.mark.slow
@pytest.mark.sim_only
def test_sixteen_bit_in_flight_compiles_to_16_byte_accesses_and_no_float64():
    program = (
        "import workbench, re\n"
        "from numba import cuda, types\n"
        "import solutions.activations as A\n"
        "arr = types.Array(types.uint16, 1, 'C')\n"
        "for name in ('_in_flight_halves_gelu_bf16', '_in_flight_halves_silu_fp16'):\n"
        "    ptx, _ = cuda.compile_ptx(getattr(A, name).py_func, (arr, arr), cc=(9, 0))\n"
        "    accesses = re.findall(r'(ld|st)\\.global\\.v4\\.[bu]32', ptx)\n"
        "    print(name, ''.join(accesses[:5]), bool(re.search(r'\\.f64\\b', ptx)))\n")
    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # four 16-byte loads before the first 16-byte store, and no double precision anywhere
    assert run.stdout.count("ldldldldst False") == 2, run.stdout


@pytest.mark.gpu
def test_every_sixteen_bit_stage_right_on_a_misaligned_view_on_the_gpu():
    for op in HALF:
        for stage in op.stages:
            def offset_launch(x, out, stage=stage):
                big_x = cuda.device_array(x.size + 1, np.uint16).view(x.dtype)  # bf16 travels as its bits
                big_out = cuda.device_array(x.size + 1, np.uint16).view(x.dtype)
                big_x[1:].copy_to_device(x)
                stage(big_x[1:], big_out[1:])  # 2 bytes past a 16-byte boundary: the widened kernel
                out.copy_to_device(big_out[1:])
            result = check_stage(stage, (100_003,), np.random.default_rng(5), launch=offset_launch)
            assert result.passed, result.message


@pytest.mark.gpu
@pytest.mark.parametrize("name", [op.name for op in activations.HALF_OPERATORS])
def test_every_16_bit_input_within_half_an_ulp_on_the_gpu(name):
    """All 65536 inputs of the format (NaNs, infinities, subnormals included), every stage: within half
    an ulp of the format and a hair (the float32 function's own error) of the float64 answer, 0.63 for
    activation[tanh,bf16].fast_math (activations.ulps_allowed). fast_math flushes float32 subnormal results to
    zero, which only bf16 can hold: those are left out for it."""
    op = activations.BY_NAME[name]
    everything = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(op.dtype)
    ref = op.reference(everything)
    for stage in op.stages:
        out = to_device(np.zeros(everything.size, op.dtype))
        stage(to_device(everything), out)
        ulps = activations.ulp_error(to_host(out), ref, op.dtype)
        if stage.name in ("fast_math", "short_erfc") and op.dtype == activations.BFLOAT16:
            ulps = ulps[np.abs(ref) >= np.finfo(np.float32).tiny]
        worst = int(np.argmax(ulps))
        assert ulps[worst] <= activations.ulps_allowed(stage.key), (stage.key, float(ulps[worst]))
