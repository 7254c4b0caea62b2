"""The fp16/bf16 variants of softmax, LayerNorm, RMSNorm and GELU (solutions/softmax.py, layernorm.py,
elementwise.py; what they share is solutions/_half.py) and int8 quantization (solutions/quantize.py): what is
specific to them. Every stage's correctness at the simulator sizes, on the adversarial inputs, and its
sm_90 compile are in tests/test_ladders.py; here: the conversions bit for bit, the numbers the 16-bit story
(solutions/_half.py) quotes, the row-edge cases of the packed kernels, the quantize reference's rounding rules,
bad input, and (``-m gpu``) the issue's speed targets."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda

from solutions import _half, elementwise, layernorm, quantize, softmax
from workbench.check import adversarial_cases, check_stage, poison_like
from workbench.ladder import InputError

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALF_OPERATORS = [*softmax.HALF_OPERATORS, *layernorm.HALF_LAYERNORMS, *layernorm.HALF_RMSNORMS,
                  *elementwise.HALF_OPERATORS]
OPS = {op.name: op for op in HALF_OPERATORS + quantize.OPERATORS}


# -- the conversions, against NumPy's and ml_dtypes' (both round to nearest even) ---------------------

def _patterns():
    """Every 5th 16-bit pattern, and every pattern near zero, the subnormal/normal border and inf."""
    edges = [*range(0, 16), *range(0x03F0, 0x0410), *range(0x7BF0, 0x7C10), *range(0x7F70, 0x7F90)]
    return sorted({*range(0, 1 << 16, 5), *edges, *(e | 0x8000 for e in edges)})


@pytest.mark.parametrize("fmt, widen", [(F16, _half.f16_to_float), (BF16, _half.bf16_to_float)],
                         ids=["fp16", "bf16"])
def test_widening_is_exact(fmt, widen):
    bits = np.array(_patterns(), np.uint16)
    want = bits.view(fmt).astype(np.float32)
    got = np.array([widen.py_func(np.uint32(b)) for b in bits], np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), [(hex(b), g, w) for b, g, w in zip(bits[~same], got[~same], want[~same])][:5]


def _float32_samples():
    rng = np.random.default_rng(0)
    spread = (rng.standard_normal(3000) * 10.0 ** rng.uniform(-9, 6, 3000)).astype(np.float32)
    f16_ties = (np.arange(1, 200, dtype=np.float32) * 2.0 ** -11 + 1).astype(np.float32)  # halfway at odd steps
    bf16_ties = (np.float32(1) + np.arange(1, 200, dtype=np.float32) * np.float32(2.0 ** -8)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 1e5, 6e-8, 2.9e-8, 3.0e-8,
                        1e-40, 3.4e38, -3.4e38, np.finfo(np.float32).max], np.float32)
    return np.concatenate([spread, f16_ties, -f16_ties, bf16_ties, -bf16_ties, special])


@pytest.mark.parametrize("fmt, narrow", [(F16, _half.float_to_f16), (BF16, _half.float_to_bf16)],
                         ids=["fp16", "bf16"])
def test_narrowing_rounds_to_nearest_even(fmt, narrow):
    values = _float32_samples()
    with np.errstate(over="ignore"):
        want = values.astype(fmt)
    got = np.array([narrow.py_func(v) for v in values], np.uint32).astype(np.uint16).view(fmt)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got.astype(np.float32)) & np.isnan(values))
    assert same.all(), [(v, g, w) for v, g, w in zip(values[~same], got[~same], want[~same])][:5]


def test_the_docstrings_accuracy_numbers():
    """fp16 sums stall at 2048, bf16 at 256; an fp16 square of 300 overflows; the rounding of a result to
    16 bits is at most 2^-11 (fp16) or 2^-8 (bf16) relative: what the module docstring says."""
    assert np.add.accumulate(np.ones(4096, F16))[-1] == 2048
    assert np.add.accumulate(np.ones(4096, BF16))[-1] == 256
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(300) * np.float16(300))
    x = np.random.default_rng(1).uniform(1, 2, 10000)
    assert np.abs(x.astype(F16).astype(np.float64) / x - 1).max() <= 2.0 ** -11
    assert np.abs(x.astype(BF16).astype(np.float64) / x - 1).max() <= 2.0 ** -8
    assert _half.TOLERANCE["float16"] > 2.0 ** -11 and _half.TOLERANCE["bfloat16"] > 2.0 ** -8


def test_a_float16_sum_of_a_constant_row_gives_twice_the_softmax():
    """What the float32 statistics are for: the softmax of 4096 equal logits with the sum kept in fp16."""
    e = np.ones(4096, F16)  # exp(x - max) of a constant row
    fp16_sum = np.add.accumulate(e)[-1]
    assert float(e[0] / fp16_sum) == 1 / 2048  # twice the right answer, 1/4096


# -- the packed kernels' row edges ------------------------------------------------------------------------

def run(stage, *inputs):
    op = stage.op
    d_out = cuda.to_device(poison_like(op.make_output(inputs[0].shape)))
    stage(*[cuda.to_device(a) for a in inputs], d_out)
    return d_out.copy_to_host()


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_packed_rows_of_one_and_two_columns(fmt):
    """Every row of one column is an edge element; with two, odd rows start in a word's high half."""
    op = OPS[f"rmsnorm[{fmt}]"]
    for stage in ("packed", "rows_in_flight", "in_registers", "vector_rows"):
        for cols in (1, 2):
            result = check_stage(op[stage], (3, cols), np.random.default_rng(cols))
            assert result.passed, (stage, result.message)


SLOW = pytest.mark.slow
UNROLLED = [("softmax[bf16]", "packed"), ("layernorm[fp16]", "widened"), ("layernorm[bf16]", "rows_in_flight"), ("quantize", "vectorized"),
            ("dequantize", "vectorized"), ("quantize", "vector_rows"), ("dequantize", "vector_rows"),
            *(pytest.param(*case, marks=SLOW) for case in [
                ("softmax[fp16]", "widened"), ("softmax[fp16]", "fast_exp"), ("layernorm[bf16]", "packed"),
                ("rmsnorm[fp16]", "packed"), ("softmax[fp16]", "rows_in_flight"),
                ("rmsnorm[bf16]", "rows_in_flight"), ("elementwise[fp16]", "widened"), ("elementwise[bf16]", "packed"),
                ("rmsnorm[fp16]", "in_registers")])]


@pytest.mark.parametrize("name, stage", UNROLLED)
def test_full_unrolled_steps(name, stage):
    """The quick tier's sizes are too small for a whole unrolled step (eight loads a thread across a
    256-thread block); each operator's last simulator size runs them, with a remainder and odd edges."""
    op = OPS[name]
    result = check_stage(op[stage], op.sim_sizes[-1], np.random.default_rng(6))
    assert result.passed, result.message


@pytest.mark.parametrize("stage, cols", [("rows_in_flight", 3278), ("vector_rows", 3280)])  # vector_rows: whole vectors
def test_layernorm_subtracts_x0_before_the_mean(stage, cols):
    """The GPU run's fp16 LayerNorm failure at 32768 columns (relative error 0.0024-0.0035): rows of mean 1e4
    are near-constant in fp16 (1e4 + N(0, 1) rounds to steps of 8), and (x0 + mean) rounded to float32 (steps
    of 2^-10 at 1e4) moved every element by up to 1% of such a row's spread. This row (one element 8 above
    the rest, 3278 columns: the mean 8/3278 falls between float32 steps) gave 0.0035 that way; x - x0 - mean
    gives the output's own rounding, 0.0002. The vector kernel keeps x - x0 before the mean too."""
    op = OPS["layernorm[fp16]"]
    x = np.full((1, cols), 10000.0, np.float16)
    x[0, 1] = 10008.0
    inputs = (x, np.ones(cols, np.float16), np.zeros(cols, np.float16))
    result = check_stage(op[stage], (1, cols), inputs=inputs, label="one element 8 above 1e4")
    assert result.passed and result.rel_err < 1e-3, result.message


def test_row_words_cover_each_element_once():
    for cols in (1, 2, 3, 4, 37):
        seen = []
        for row in range(5):
            start, end, first, stop = _half.row_words.py_func(np.uint64(row), np.uint64(cols))
            edges = [_half.edge_element.py_func(np.uint64(t), start, end) for t in range(4)]
            seen += [int(e) for e in edges if e < end]
            seen += [e for w in range(int(first), int(stop)) for e in (2 * w, 2 * w + 1)]
        assert sorted(seen) == list(range(5 * cols)), cols


# -- vector_rows: the row held as 16-byte vectors, 2-D blocks ---------------------------------------------

NORMS16 = [f"{kind}[{fmt}]" for kind in ("layernorm", "rmsnorm") for fmt in ("fp16", "bf16")]
VECTOR_ROWS16 = NORMS16 + ["softmax[fp16]", "softmax[bf16]"]


def _vector_rows_failures(name, size, seed):
    stage = OPS[name]["vector_rows"]
    rng = np.random.default_rng(seed)
    results = [check_stage(stage, size, rng)]
    results += [check_stage(stage, size, inputs=inputs, label=label)
                for label, inputs in adversarial_cases(stage.op, size, rng)]
    return [f"{r.key} @ {size} ({r.inputs}): {r.message}" for r in results if r.failed]


@pytest.mark.parametrize("name", VECTOR_ROWS16)
@pytest.mark.parametrize("size", [(1, 8), (5, 40), (3, 1032)])
def test_vector_rows_at_awkward_sizes(name, size):
    """One vector, one warp, one row (1 x 8); four one-warp rows a block, a second block with three empty
    rows, five of a warp's 32 lanes holding a vector (5 x 40); two-warp rows two a block, the last block's
    second row empty but at its barriers, one lane holding a vector more (3 x 1032); each on the random
    rows and the family's adversarial ones (norms: constant, subnormal, mean-1e4, past-65504; softmax:
    constant, huge logits, tiny probabilities, subnormal inputs, -inf but one)."""
    assert not _vector_rows_failures(name, size, size[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", VECTOR_ROWS16)
def test_vector_rows_row_of_eight_warps_with_one_vector_over(name):
    """513 vectors: 256 threads, eight warps a row, thread 0 alone with a fifth vector at 4096..4103."""
    assert not _vector_rows_failures(name, (1, 4104), 4)


@pytest.mark.parametrize("module", [layernorm, softmax])
def test_vector_rows_shape_threads_a_row_and_rows_a_block(module):
    """The shape and fit test are _half's, one for every vector_rows ladder, given that ladder's constants."""
    assert module.VECTORS == 4 and module.BLOCK_ROWS_THREADS == 128  # the figures below assume these

    def shape(rows, cols):
        return _half.vector_rows_shape(rows, cols, module.VECTORS, module.BLOCK_ROWS_THREADS)
    assert shape(32768, 4096) == (32768, (128, 1))  # the headline: 512 vectors, 128 threads of four
    assert shape(5, 40) == (2, (32, 4)) and shape(1, 8) == (1, (32, 1)) and shape(3, 1032) == (2, (64, 2))
    assert shape(7, 32768) == (7, (1024, 1))
    assert _half.fits_vector_rows(4096, module.VECTORS) and not _half.fits_vector_rows(4100, module.VECTORS)
    assert _half.fits_vector_rows(32768, module.VECTORS) and not _half.fits_vector_rows(32768 + 8, module.VECTORS)


@pytest.mark.sim_only
@pytest.mark.parametrize("name, cols, kernel", [("layernorm[bf16]", 40, "_layernorm_vectors_bf16"),
                                                ("layernorm[fp16]", 37, "_layernorm_rows_in_flight_f16"),
                                                ("rmsnorm[fp16]", 40, "_rmsnorm_vectors_f16"),
                                                ("rmsnorm[bf16]", 37, "_rmsnorm_registers_bf16"),
                                                ("softmax[fp16]", 40, "_softmax_vectors_f16"),
                                                ("softmax[bf16]", 37, "_softmax_rows_bf16")])
def test_vector_rows_takes_the_stage_before_for_rows_not_on_16_bytes(name, cols, kernel):
    """A width that is not a multiple of 8 halves puts rows off 16-byte boundaries: the launcher takes
    the stage before (rows_in_flight for LayerNorm and softmax, in_registers for RMSNorm, which has a
    head and tail)."""
    from workbench.simulator import record_launches

    with record_launches() as launches:
        result = check_stage(OPS[name]["vector_rows"], (3, cols), np.random.default_rng(0))
    assert result.passed, result.message
    assert {f.__name__ for f, _ in launches} == {kernel}


NORM_SETTINGS = [{"WEIGHTS_AHEAD": "1"}, {"WEIGHTS_AHEAD": "4"}, {"VECTORS": "2"},
                 {"VECTORS": "1", "BLOCK_ROWS_THREADS": "64", "WEIGHTS_AHEAD": "1"}]
SOFTMAX_SETTINGS = [{"VECTORS": "2"}, {"VECTORS": "1", "BLOCK_ROWS_THREADS": "64"}]  # softmax.py's own constants
SWEEP_CASES = ([(layernorm, name, setting) for name in ("layernorm[bf16]", "rmsnorm[fp16]") for setting in NORM_SETTINGS]
               + [(softmax, "softmax[bf16]", setting) for setting in SOFTMAX_SETTINGS])


@pytest.mark.slow
@pytest.mark.parametrize("module, name, setting", SWEEP_CASES,
                         ids=[f"{name}-" + ",".join(f"{k}={v}" for k, v in setting.items())
                              for _, name, setting in SWEEP_CASES])
def test_vector_rows_settings_a_sweep_may_try(monkeypatch, module, name, setting):
    """The module constants the GPU sweeps vary (each ladder's own VECTORS and BLOCK_ROWS_THREADS: the shared
    helpers take them as arguments), applied as `workbench sweep` applies them (the module executed afresh
    with the setting), each correct at the awkward sizes."""
    import sys

    from workbench.sweep import stage_with

    monkeypatch.setitem(sys.modules, module.__name__, module)  # put back after stage_with's fresh module
    stage = stage_with(f"{name}.vector_rows", setting)
    rng = np.random.default_rng(5)
    for size in [(5, 40), (3, 1032)]:
        results = [check_stage(stage, size, rng)]
        results += [check_stage(stage, size, inputs=inputs, label=label)
                    for label, inputs in adversarial_cases(stage.op, size, rng)]
        assert not [r.message for r in results if r.failed], (setting, size)


@pytest.mark.parametrize("module, kind", [(layernorm, "layernorm"), (layernorm, "rmsnorm"), (softmax, "softmax")])
def test_vector_rows_on_a_view_off_16_bytes_takes_the_stage_before(monkeypatch, module, kind):
    """On a GPU a view 2 bytes past a 16-byte boundary would fault in a 16-byte load: the launcher asks
    aligned16 (told here to say no, as the simulator counts every array aligned) and never launches the
    vector kernel."""
    class Refused:
        def __getitem__(self, config):
            raise AssertionError("the 16-byte kernel was launched on a misaligned view")

    template = getattr(module, f"_{kind}_vectors")
    monkeypatch.setattr(_half, "aligned16", lambda *arrays: False)  # fits_vector_rows asks it
    monkeypatch.setattr(layernorm, "aligned16", lambda *arrays: False)  # in_registers (RMSNorm's stage before)
    monkeypatch.setattr(template, "kernels", {dtype: Refused() for dtype in template.kernels})
    op = OPS[f"{kind}[bf16]"]
    result = check_stage(op["vector_rows"], (2, 40), np.random.default_rng(1))
    assert result.passed, result.message


def test_softmax_vector_rows_large_logits_and_minus_inf_rows():
    """Rows the vector kernel must not turn into NaN or inf: logits near each format's largest value
    (exp overflows unless the row maximum is subtracted first), -inf everywhere but one element (a max of
    -inf would make -inf - -inf = NaN), and a row of -inf but one beside a row of +-1e4 in one block."""
    for fmt, big in (("fp16", 6.0e4), ("bf16", 3.0e38)):
        op = OPS[f"softmax[{fmt}]"]
        dtype = F16 if fmt == "fp16" else BF16
        x = np.full((4, 40), -np.inf, np.float32)
        x[0, 7] = 0.0
        x[1] = np.linspace(-big, big, 40)
        x[2, :] = big
        x[3] = np.random.default_rng(2).uniform(-1e4, 1e4, 40)
        result = check_stage(op["vector_rows"], (4, 40), inputs=(x.astype(dtype),), label="large and -inf rows")
        assert result.passed, (fmt, result.message)


# -- quantize: the reference's rounding rules and the fused layout ---------------------------------------

def test_quantize_rounds_ties_to_even_and_keeps_scale_exact():
    x = np.array([[127.0, 2.5, -2.5, 0.5, -0.5, 126.5, 1.5, -127.0], [0.0] * 8], np.float32)
    q, scale, near_ties = quantize.quantize_reference(x)
    assert q[0].tolist() == [127, 2, -2, 0, 0, 126, 2, -127]
    assert scale.tolist() == [1.0, 1.0] and not q[1].any()  # an all-zero row: scale 1, every q 0
    assert near_ties == 0
    packed = quantize.fuse(q, scale)
    assert packed.shape == (2, 12) and packed.dtype == np.int8
    np.testing.assert_array_equal(quantize.scales_of(packed), scale)


def test_quantize_reference_only_bends_to_float32_on_near_ties():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((64, 4096)) * 3).astype(np.float32)
    q, scale, near_ties = quantize.quantize_reference(x)
    exact = np.clip(np.rint(x.astype(np.float64) / scale[:, None]), -127, 127)
    differ = q != exact
    assert differ.sum() == near_ties
    quotient = x[differ].astype(np.float64) / np.repeat(scale, 4096).reshape(64, 4096)[differ]
    assert (np.abs(np.abs(quotient - np.trunc(quotient)) - 0.5) < 1e-5).all()


def test_division_by_the_reciprocal_and_one_fma_is_ieee_division():
    """quantize's divide (v * (1 / scale), corrected by its exact residual) gives float32 division's quotient bit
    for bit, at scales across FAST_SCALES' range, on quotients at, one ulp below and one above half-integers."""
    rng = np.random.default_rng(11)
    for _ in range(3000):
        scale = np.float32(2.0 ** rng.integers(-100, 100) * rng.uniform(1, 2))
        tie = np.float32((rng.integers(-127, 127) + 0.5) * np.float64(scale))
        for v in (tie, np.nextafter(tie, np.float32(np.inf)), np.nextafter(tie, np.float32(-np.inf)),
                  np.float32(rng.uniform(-127, 127) * np.float64(scale))):
            got = quantize.divide.py_func(v, scale, np.float32(1) / scale)
            assert np.float32(got) == v / scale, (v, scale)


def test_rounding_by_adding_one_and_a_half_times_2_to_the_23_is_half_to_even_saturated():
    q = np.array([-200, -127.5, -126.5, -2.5, -0.5, -0.49, 0, 0.5, 1.5, 2.5, 126.5, 126.51, 127.4, 1e30], np.float32)
    low_bytes = [np.int8(np.uint8(int(quantize.rounded_bits.py_func(v)) & 0xFF)) for v in q]
    assert low_bytes == [-127, -127, -126, -2, 0, 0, 0, 0, 2, 2, 126, 127, 127, 127]


def test_dequantize_reference_is_q_times_scale():
    x = np.random.default_rng(5).standard_normal((4, 9)).astype(np.float32)
    (packed,) = (quantize.fuse(*quantize.quantize_reference(x)[:2]),)
    back = quantize.dequantize_op.reference(packed)
    assert np.abs(back - x).max() <= quantize.scales_of(packed).max() / 2 * (1 + 1e-6)


def test_quantize_explains_a_tie_rounded_away_from_zero():
    x = np.array([[127.0, 2.5, -1.0]], np.float32)
    ref = quantize.op.reference(x)
    wrong = ref.copy()
    wrong[0, 1] = 3
    assert "round half to even gives 2" in quantize.op.explain((x,), wrong, ref)
    wrong = ref.copy()
    wrong[0, 3] ^= 1
    assert "scale" in quantize.op.explain((x,), wrong, ref)


@pytest.mark.parametrize("stage", ["block_per_row", "vectorized", "vector_rows"])
def test_quantize_short_rows_and_unaligned_rows(stage):
    """Rows of 1 to 5 values: each starts at another byte of a word, some within one word; rows of 4 and 8
    (vector_rows' path: one or two vectors, the scale a word)."""
    for cols in (1, 4, 5, 8):
        x = np.random.default_rng(cols).standard_normal((3, cols)).astype(np.float32)
        np.testing.assert_array_equal(run(quantize.op[stage], x), quantize.op.reference(x))


@pytest.mark.parametrize("op_name, kernel", [("quantize", "_quantize_vector_rows"), ("dequantize", "_dequantize_vector_rows")])
def test_quantize_vector_rows_off_16_bytes_takes_vectorized(monkeypatch, op_name, kernel):
    """A width that is not a multiple of 4, or (told here, as the simulator counts every array aligned) a view
    off a 16-byte boundary, never launches the 16-byte kernel: vectorized runs, and the values are right."""
    class Refused:
        def __getitem__(self, config):
            raise AssertionError("the 16-byte kernel was launched on rows off 16 bytes")

    monkeypatch.setattr(quantize, kernel, Refused())
    assert check_stage(OPS[op_name]["vector_rows"], (3, 37), np.random.default_rng(0)).passed
    monkeypatch.setattr(quantize, "aligned16", lambda *arrays: False)
    monkeypatch.setattr(quantize, "rows_fit_vectors", lambda *arrays: False)
    assert check_stage(OPS[op_name]["vector_rows"], (3, 132), np.random.default_rng(0)).passed


# -- bad input ---------------------------------------------------------------------------------------------

def test_bad_input_names_what_was_expected():
    x32 = cuda.to_device(np.ones((2, 3), np.float32))
    x16 = cuda.to_device(np.ones((2, 3), F16))
    with pytest.raises(InputError, match="dtype float16"):
        OPS["softmax[fp16]"]["packed"](x32, cuda.device_array((2, 3), np.float32))
    with pytest.raises(InputError, match="dtype bfloat16"):
        OPS["softmax[bf16]"]["packed"](x16, cuda.device_array((2, 3), F16))
    with pytest.raises(InputError, match="one entry per column"):
        OPS["rmsnorm[fp16]"]["packed"](x16, cuda.to_device(np.ones(4, F16)), cuda.device_array((2, 3), F16))
    with pytest.raises(InputError, match=r"shape \(2, 7\).*scale"):
        quantize.op["vectorized"](x32, cuda.device_array((2, 3), np.int8))
    with pytest.raises(InputError, match="host"):
        quantize.dequantize_op["vectorized"](np.ones((2, 7), np.int8), cuda.device_array((2, 3), np.float32))


def test_every_low_precision_operator_is_grouped_and_ranked_after_the_float32_ladders():
    for op in OPS.values():
        assert op.group == _half.LOW_PRECISION_GROUP and op.rank >= 200
        assert op.adversarial_inputs is not None
    assert all(s.dtype == np.float32 for op in HALF_OPERATORS for s in op.stages)  # f64 refused in PTX


def test_one_launcher_serves_every_format_of_a_family_through_stage_of():
    """workbench.ladder.stage_of registers one launcher as the same stage of each variant: same name,
    paragraph and function; each Stage keeps its dtype (float32 where the stages say so, else the
    operator's own); the module-level name stays the plain launcher, which takes either format."""
    from solutions import hgemm

    for fp16, bf16 in (softmax.HALF_OPERATORS, layernorm.HALF_LAYERNORMS, layernorm.HALF_RMSNORMS,
                       elementwise.HALF_OPERATORS, hgemm.OPERATORS):
        assert [s.name for s in fp16.stages] == [s.name for s in bf16.stages]
        for a, b in zip(fp16.stages, bf16.stages):
            assert a.launch is b.launch and a.summary == b.summary and a.order == b.order
    assert all(s.dtype == np.float32 for op in HALF_OPERATORS for s in op.stages)
    assert {np.dtype(s.dtype) for s in hgemm.op.stages} == {F16}
    assert {np.dtype(s.dtype) for s in hgemm.bf16_op.stages} == {BF16}
    assert softmax.softmax_packed is OPS["softmax[bf16]"]["packed"].launch
    x = cuda.to_device(np.random.default_rng(0).normal(size=(3, 5)).astype(BF16))
    out = cuda.device_array((3, 5), BF16)
    softmax.softmax_packed(x, out)  # the plain launcher, given bf16: no fp16 validation in the way
    got = out.copy_to_host().astype(np.float64)
    assert np.allclose(got.sum(axis=1), 1.0, atol=3e-2)


def test_each_per_format_kernel_is_one_template_instantiated_per_format():
    """One mechanism specialises the 16-bit kernels by format: a template whose widen, narrow (and narrow2)
    are free names, compiled once per format by _half.per_format under the names the PTX check, profiles
    and sanitizer reports use (``_softmax_packed_f16``, ``_softmax_packed_bf16``); no kernel is written
    out by hand per format."""
    import ast
    from pathlib import Path

    templates = []
    for module in (softmax, layernorm, elementwise):
        defined = [node.name for node in ast.parse(Path(module.__file__).read_text()).body
                   if isinstance(node, ast.FunctionDef)]
        assert not [name for name in defined if name.endswith(("_f16", "_bf16"))], module.__name__
        assert len(set(defined)) == len(defined), module.__name__  # a template's name hides no other function
        for name in defined:
            template = getattr(module, name)
            if not hasattr(template, "kernels"):
                continue
            templates.append(name)
            assert list(template.kernels) == _half.FORMATS == [F16, BF16]
            for dtype, kernel in template.kernels.items():
                assert kernel.__name__ == f"{name}_{_half.KERNEL_SUFFIX[dtype]}"
                assert getattr(module, kernel.__name__) is kernel  # where the PTX check looks it up
                assert kernel.py_func.__code__ is template.__code__
    # softmax: widened, packed, fast, rows, registers, vectors; LayerNorm and RMSNorm five each; GELU two
    assert len(templates) == 18, templates


def test_the_grader_reaches_each_16_bit_stages_exercise_through_its_template():
    """A launcher names its template, a plain function of its module, so the grader (which follows the
    names a function uses, not the values of a dict) reaches the device function holding the exercise;
    a {dtype: kernel} mapping alone would have made every 16-bit stage "not an exercise"."""
    from workbench.grade.targets import not_an_exercise

    for op in HALF_OPERATORS:
        for stage in op.stages:
            assert not_an_exercise(stage) is None, stage.key


@pytest.mark.sim_only
@pytest.mark.parametrize("fmt", [F16, BF16], ids=["fp16", "bf16"])
def test_a_launcher_runs_the_kernel_of_its_inputs_format(fmt):
    from workbench.simulator import record_launches

    x = cuda.to_device(np.random.default_rng(0).normal(size=(2, 5)).astype(fmt))
    out = cuda.device_array((2, 5), fmt)
    with record_launches() as launches:
        softmax.softmax_widened(x, out)
    assert [kernel.__name__ for kernel, _ in launches] == [f"_softmax_widened_{_half.KERNEL_SUFFIX[fmt]}"]
    assert np.allclose(out.copy_to_host().astype(np.float64).sum(axis=1), 1.0, atol=3e-2)


def test_the_low_precision_ladders_import_no_other_ladder_so_they_get_exercises():
    """The grader refuses the answer key's modules, so a ladder that imports another gets no exercise:
    what the 16-bit variants of softmax.py, layernorm.py, elementwise.py and quantize.py share lives in
    solutions/_half.py and solutions/_references.py."""
    from pathlib import Path

    from workbench.markers import ladder_imports

    for module in (softmax, layernorm, elementwise, quantize):
        assert ladder_imports(Path(module.__file__).read_text()) == [], module.__name__


@pytest.mark.slow
def test_packed_kernels_compile_to_word_loads_and_hardware_conversions():
    """What the paragraphs say the PTX does (compiles here, ~30 s a kernel on a busy CPU)."""
    import subprocess
    import sys

    code = """
import workbench
from numba import cuda
from numba.cuda import types
from solutions import softmax
a16, a32 = types.Array(types.uint16, 1, "C"), types.Array(types.uint32, 1, "C")
ptx, _ = cuda.compile_ptx(softmax._softmax_fast_f16.py_func, (a16, a32, a16, a32, types.int64), cc=(9, 0))
print(ptx)
"""
    run_ = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "WORKBENCH_MODE": "compile"})
    ptx = run_.stdout
    assert run_.returncode == 0, run_.stderr[-2000:]
    for instruction in ("ld.global.u32", "st.global.u32", "cvt.f32.f16", "cvt.rn.f16.f32", "ex2.approx"):
        assert instruction in ptx, instruction
    assert ".f64" not in ptx


@pytest.mark.slow
def test_in_registers_kernels_compile_to_vector_loads_and_paired_conversions():
    """The in_registers paragraph's PTX: 16-byte loads and stores, one cvt.rn.bf16x2.f32 per pair, no float64."""
    import subprocess
    import sys

    code = """
import workbench
from numba import cuda
from numba.cuda import types
from solutions import layernorm
a16, a32 = types.Array(types.uint16, 1, "C"), types.Array(types.uint32, 1, "C")
sig = (a16, a32, a16, a32, a16, a32, a16, a32, types.int64, types.int64, types.int64)
ptx, _ = cuda.compile_ptx(layernorm._layernorm_registers_bf16.py_func, sig, cc=(9, 0))
print(ptx)
"""
    run_ = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "WORKBENCH_MODE": "compile"})
    ptx = run_.stdout
    assert run_.returncode == 0, run_.stderr[-2000:]
    for instruction in ("ld.global.v4.u32", "st.global.v4.u32", "cvt.rn.bf16x2.f32"):
        assert instruction in ptx, instruction
    assert ".f64" not in ptx


# -- on a GPU: the targets ---------------------------------------------------------------------------

NORMS = [f"{kind}_{fmt}" for kind in ("softmax", "layernorm", "rmsnorm") for fmt in ("fp16", "bf16")]


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("name", NORMS)
def test_fp16_bf16_norms_reach_85_percent_of_copy_and_beat_torch_by_1_2x(name):
    """At 32768 x 4096, in one run: the last stage at >= 85% of the copy bandwidth measured now and
    >= 1.2x torch at the same dtype."""
    from tests.headline import headline

    peaks, stages, peer = headline(OPS[name])
    best = stages[-1]
    assert best["gbps"] >= 0.85 * peaks["copy_gbps"], (best["stage"], best["gbps"], peaks["copy_gbps"])
    assert peer is not None, "torch is needed for the comparison"
    assert peer["median_us"] >= 1.2 * best["median_us"], (peer["stage"], peer["median_us"], best["median_us"])


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("name", ["quantize", "dequantize"])
def test_quantize_and_dequantize_reach_85_percent_of_copy(name):
    from tests.headline import headline

    peaks, stages, _ = headline(OPS[name])
    best = stages[-1]
    assert best["gbps"] >= 0.85 * peaks["copy_gbps"], (best["stage"], best["gbps"], peaks["copy_gbps"])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, widen", [(F16, _half.f16_to_float), (BF16, _half.bf16_to_float)],
                         ids=["fp16", "bf16"])
def test_widening_on_the_gpu_is_exact_for_every_pattern(fmt, widen):
    @cuda.jit
    def widen_all(out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = widen(np.uint32(i))

    d = cuda.device_array(1 << 16, np.float32)
    widen_all[256, 256](d)
    got, want = d.copy_to_host(), np.arange(1 << 16, dtype=np.uint16).view(fmt).astype(np.float32)
    assert ((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))).all()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, narrow", [(F16, _half.float_to_f16), (BF16, _half.float_to_bf16)],
                         ids=["fp16", "bf16"])
def test_narrowing_on_the_gpu_rounds_to_nearest_even(fmt, narrow):
    @cuda.jit
    def narrow_all(values, out):
        i = cuda.grid(1)
        if i < values.size:
            out[i] = narrow(values[i])

    values = _float32_samples()
    d = cuda.device_array(values.size, np.uint32)
    narrow_all[(values.size + 255) // 256, 256](cuda.to_device(values), d)
    got = d.copy_to_host().astype(np.uint16)
    with np.errstate(over="ignore"):
        want = values.astype(fmt).view(np.uint16)
    nan = np.isnan(values)
    assert (got[~nan] == want[~nan]).all() and np.isnan(got[nan].view(fmt).astype(np.float32)).all()
