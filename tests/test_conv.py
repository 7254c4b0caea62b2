"""The convolution family (solutions/conv.py, solutions/depthwise.py): what is specific to it. Every stage's
correctness in the simulator and its sm_90 compile are tests/test_ladders.py's; here: bad inputs refused
with one line that names the problem, the geometry arithmetic, and on a GPU the issue's layers."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from workbench.check import check_stage, relative_error
from workbench.ladder import InputError, to_device

from solutions import conv, conv_fft, conv_transpose, depthwise


def _device_args(*arrays):
    return [to_device(np.ascontiguousarray(a)) for a in arrays]


def test_conv2d_refuses_filters_other_than_3x3():
    x, w5, out = _device_args(np.ones((1, 2, 6, 6), np.float32), np.ones((3, 2, 5, 5), np.float32),
                              np.empty((1, 3, 6, 6), np.float32))
    with pytest.raises(InputError, match=r"3x3 filters.*conv2d\[general\]"):
        conv.winograd(x, w5, out)


def test_conv2d_refuses_mismatched_channels():
    x, w, out = _device_args(np.ones((1, 2, 6, 6), np.float32), np.ones((3, 4, 3, 3), np.float32),
                             np.empty((1, 3, 6, 6), np.float32))
    with pytest.raises(InputError, match="C = 2"):
        conv.direct(x, w, out)


@pytest.mark.parametrize("geometry, message", [([3, 1, 1], "stride <= 2"), ([1, 0, 4], "reach"),
                                               ([0, 1, 1], "stride >= 1")])
def test_conv2d_general_refuses_geometry_it_cannot_take(geometry, message):
    x, w, g, out = _device_args(np.ones((1, 2, 9, 9), np.float32), np.ones((3, 2, 3, 3), np.float32),
                                np.array(geometry, np.int32), np.empty((1, 3, 3, 3), np.float32))
    with pytest.raises(InputError, match=message):
        conv.general_implicit_gemm(x, w, g, out)


def test_conv2d_general_names_the_output_shape_it_expects():
    x, w, g, out = _device_args(np.ones((1, 2, 9, 9), np.float32), np.ones((3, 2, 3, 3), np.float32),
                                np.array([2, 1, 1], np.int32), np.empty((1, 3, 9, 9), np.float32))
    with pytest.raises(InputError, match=r"\(1, 3, 5, 5\)"):
        conv.general_direct(x, w, g, out)


@pytest.mark.parametrize("H, R, stride, pad, dilation, expected", [
    (56, 3, 1, 1, 1, 56), (56, 3, 2, 1, 1, 28), (224, 7, 2, 3, 1, 112), (9, 3, 1, 2, 2, 9), (5, 1, 1, 0, 1, 5)])
def test_output_size_matches_torch_formula(H, R, stride, pad, dilation, expected):
    assert conv.output_hw(H, H, R, R, stride, pad, dilation) == (expected, expected)


# -- Winograd's accuracy: where its transforms lose it -------------------------------------------------

def _bright_pixels_under_a_zero_tap(H=12, W=12):
    """One image, one channel, one filter: pixels at 1e4 on a sparse grid amid uniform(-1, 1) noise, and a
    filter whose bottom-right tap is 0. Also the mask of the outputs whose window holds a bright pixel
    under that tap only: exactly, they never see it."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.0, 1.0, (1, 1, H, W)).astype(np.float32)
    bright = np.zeros((H, W), bool)
    bright[1::4, 1::4] = True
    x[0, 0][bright] = 1e4
    w = rng.uniform(0.5, 1.0, (1, 1, 3, 3)).astype(np.float32)
    w[0, 0, 2, 2] = 0.0
    padded = np.pad(bright, 1)  # tap (r, s) of output (h, c) reads padded[h + r, c + s]
    unseen = padded[2:2 + H, 2:2 + W].copy()
    for r, s in np.ndindex(3, 3):
        if (r, s) != (2, 2):
            unseen &= ~padded[r:r + H, s:s + W]
    return x, w, unseen


def test_winograd_loses_accuracy_where_a_bright_pixel_meets_a_zero_tap():
    """On random data Winograd F(2x2, 3x3) is as accurate as a direct sum (the H200 recorded a smaller
    error than the implicit GEMM's at every layer). Its transforms lose accuracy when an output is small
    beside the values its tile combines: a 1e4 pixel under a zero tap cancels out of the exact output, but
    the rounded intermediates (halved sums of taps times the pixel) are as large as the pixel. The ladder's
    own check, a norm over the whole output, does not see it."""
    x, w, unseen = _bright_pixels_under_a_zero_tap()
    assert unseen.sum() >= 4
    ref = conv.op.reference(x, w)
    local, whole = {}, {}
    for stage in (conv.direct, conv.winograd):
        xd, wd, out = _device_args(x, w, np.empty_like(x))
        stage(xd, wd, out)
        got = out.copy_to_host()
        local[stage.name] = relative_error(got[0, 0][unseen], ref[0, 0][unseen])
        whole[stage.name] = relative_error(got, ref)
    assert local["direct"] < 1e-6, local
    assert local["winograd"] > 1e-4 and local["winograd"] > 100 * local["direct"], local
    assert whole["winograd"] < conv._tolerance((1, 1, 12, 12, 1), np.float32), whole


# F(m x m, 3x3) as Y = A^T [(G g G^T) * (B^T d B)] A: conv.py's F(2x2, 3x3), and F(4x4, 3x3) (Lavin & Gray,
# interpolation points 0, +-1, +-2, +-1/2), whose transforms hold 1/24 and 8.
_F2 = (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
       np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]),
       np.array([[1, 1, 1, 0], [0, 1, -1, -1]]))
_F4 = (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                 [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
       np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                 [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
       np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]))


def _winograd_numpy(x, w, transforms, dtype):
    """3x3 convolution, stride 1, padding 1, by Winograd F(m x m, 3x3), every step rounded to dtype; the
    sum over channels in order, one channel at a time, as the GPU's GEMM accumulates."""
    BT, G, AT = (np.asarray(t, dtype) for t in transforms)
    m = AT.shape[0]
    N, C, H, W = x.shape
    tiles_h, tiles_w = -(-H // m), -(-W // m)
    padded = np.zeros((N, C, tiles_h * m + 2, tiles_w * m + 2), dtype)
    padded[:, :, 1:H + 1, 1:W + 1] = x
    windows = np.lib.stride_tricks.sliding_window_view(padded, (m + 2, m + 2), axis=(2, 3))[:, :, ::m, ::m]
    U = (G @ w.astype(dtype) @ G.T).astype(dtype)  # K, C, m+2, m+2
    V = (BT @ windows @ BT.T).astype(dtype)  # N, C, tiles_h, tiles_w, m+2, m+2
    M = np.zeros((N, w.shape[0], tiles_h, tiles_w, m + 2, m + 2), dtype)
    for c in range(C):
        M += U[None, :, c, None, None] * V[:, c, None]
    Y = AT @ M @ AT.T  # N, K, tiles_h, tiles_w, m, m
    return Y.transpose(0, 1, 2, 4, 3, 5).reshape(N, -1, tiles_h * m, tiles_w * m)[:, :, :H, :W]


def test_winograd_f4x4_loses_more_accuracy_than_f2x2_on_random_data():
    """Why libraries' float32 Winograd keeps to small tiles: F(4x4, 3x3) (36 multiplies for 16 outputs
    instead of 144) has transform entries from 1/24 to 8, and its error on plain uniform data is several
    times F(2x2, 3x3)'s. Both are exact in float64 (the matrices are right)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, (1, 64, 16, 16)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (8, 64, 3, 3)).astype(np.float32)
    ref = conv.op.reference(x, w)
    for transforms in (_F2, _F4):
        assert relative_error(_winograd_numpy(x, w, transforms, np.float64), ref) < 1e-12
    f2 = relative_error(_winograd_numpy(x, w, _F2, np.float32), ref)
    f4 = relative_error(_winograd_numpy(x, w, _F4, np.float32), ref)
    assert f4 > 3 * f2, (f2, f4)




def test_async_gather_exact_past_every_tile_edge():
    """The operator's simulator sizes all have C < K_STEP: every K-step there takes the copy path with a
    test per element. C = 19 adds a whole step (the test-free path) and a step of 3 channels; 9 x 17
    pixels in two images are two 128-pixel tiles, the second mostly past the last pixel; K = 66 two
    64-channel tiles, the second with 2 rows; H, W, C, K all different and multiples of no tile."""
    assert conv.K_STEP < 19 < 2 * conv.K_STEP
    rng = np.random.default_rng(7)
    x = rng.uniform(-1.0, 1.0, (2, 19, 9, 17)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (66, 19, 3, 3)).astype(np.float32)
    xd, wd, out = _device_args(x, w, np.full((2, 66, 9, 17), np.nan, np.float32))
    conv.async_gather(xd, wd, out)
    got = out.copy_to_host()
    ref = conv._conv64(x, w, 1, 1, 1)
    assert relative_error(got, ref) < conv._tolerance((2, 19, 9, 17, 66), np.float32)


@pytest.mark.parametrize("size", [
    (1, 19, 9, 15, 66, 1, 1, 1, 0, 1),  # the headline's 1x1: a whole K-step and one of 3 channels, 2 x 2 tiles
    (1, 19, 11, 13, 5, 3, 3, 2, 2, 2),  # stride 2, dilation 2, padding 2: taps past every border
    pytest.param((1, 3, 9, 11, 3, 7, 7, 2, 3, 1), marks=pytest.mark.slow),  # 49 taps, a partial K-step each
], ids=lambda s: "x".join(map(str, s)))
def test_general_async_gather_exact_at_awkward_geometries(size, monkeypatch):
    """conv2d[general]'s async_gather: async_gather's main loop given the geometry at run time (its own
    kernel at every C here, as a sweep of GATHER_MIN_CHANNELS=0 would run it; the simulator sizes of the
    operator, all C < K_STEP, check the fallback). Random inputs and the constant image (every border
    the stride, padding and dilation move)."""
    monkeypatch.setattr(conv, "GATHER_MIN_CHANNELS", 0)
    rng = np.random.default_rng(13)
    stage = conv.general_op["async_gather"]
    cases = [("random", conv.general_op.make_inputs(size, rng)), *conv.general_op.adversarial_inputs(size, rng)]
    for label, inputs in cases:
        result = check_stage(stage, size, inputs=inputs, label=label)
        assert result.passed, (label, result.message)


ISSUE_LAYERS = [(32, 64, 56, 56, 64), (32, 256, 14, 14, 256)]


@pytest.mark.gpu
@pytest.mark.parametrize("size", ISSUE_LAYERS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("stage", ["implicit_gemm", "winograd", "async_gather"])
def test_fast_conv_stages_correct_at_the_issue_layers(stage, size):
    result = check_stage(conv.op[stage], size, np.random.default_rng(0))
    assert result.passed, result.message


@pytest.mark.parametrize("key, size", [
    ("depthwise3x3.stepped_addresses", (2, 3, 17, 5)),  # H not a multiple of STRIP, W below a warp
    ("depthwise3x3.stepped_addresses", (1, 2, 1, 1)),  # a one-pixel image: every tap off it but the centre
    ("depthwise3x3.quad_columns", (2, 3, 17, 8)),  # H not a multiple of QUAD_STRIP, two quads a row
    ("depthwise3x3.quad_columns", (1, 2, 1, 4)),  # one quad, one row: no column or row beside it
    ("depthwise3x3.quad_columns", (1, 1, 6, 12)),  # three quads: the middle one has both neighbours
    ("depthwise3x3.quad_columns", (2, 3, 5, 7)),  # W not a multiple of 4: stepped_addresses' kernel
    ("depthwise3x3[nhwc].window_in_flight", (2, 7, 1, 8)),  # H not a multiple of NHWC_STRIP, one column
    ("depthwise3x3[nhwc].window_in_flight", (1, 5, 3, 12)),  # three quads: channels 0-11 kept apart
    ("depthwise3x3[nhwc].window_in_flight", (1, 6, 4, 6)),  # C not a multiple of 4: the strips fallback
    ("depthwise3x3[nhwc].channel_pairs", (2, 7, 4, 6)),  # H not a multiple of PAIR_STRIP, W of PAIR_PIXELS
    ("depthwise3x3[nhwc].channel_pairs", (1, 3, 3, 2)),  # one pixel group, one channel pair
    ("depthwise3x3[nhwc].channel_pairs", (1, 2, 1, 10)),  # one column: a group with one pixel on the image
    ("depthwise3x3[nhwc].channel_pairs", (1, 4, 5, 3)),  # C odd: the strips fallback
])
def test_depthwise_last_stages_exact_at_awkward_sizes(key, size):
    op_name, stage_name = key.rsplit(".", 1)
    op = next(o for o in depthwise.OPERATORS if o.name == op_name)
    result = check_stage(op[stage_name], size, np.random.default_rng(1))
    assert result.passed, result.message


@pytest.mark.slow
@pytest.mark.parametrize("kernel, load, store, loads, stores", [
    ("_depthwise_quad_columns", "ld.global.v4.f32", "st.global.v4.f32",
     depthwise.QUAD_WINDOW_ROWS, depthwise.QUAD_STRIP),
    ("_depthwise_nhwc_channel_pairs", "ld.global.v2.f32", "st.global.v2.f32",  # the window, then 9 of weights
     depthwise.PAIR_WINDOW_ROWS * depthwise.PAIR_WINDOW_COLS + 9, depthwise.PAIR_STRIP * depthwise.PAIR_PIXELS),
], ids=["quad_columns", "channel_pairs"])
def test_depthwise_vector_kernels_keep_their_window_in_registers(kernel, load, store, loads, stores):
    """On sm_90 the last stages' window loads and output stores are vector instructions, every one of them
    in the straight-line code (the loops unrolled), and nothing goes to local memory: a strip too long for
    the compiler to unroll leaves the window in a stack array (QUAD_STRIP = 8 did)."""
    import os
    import subprocess
    import sys

    code = f"""
import workbench
from numba import cuda
from numba.cuda import types
from solutions import depthwise
f32 = types.Array(types.float32, 1, "C")
ptx, _ = cuda.compile_ptx(depthwise.{kernel}.py_func, (f32, f32, f32) + (types.int64,) * 4, cc=(9, 0))
print(ptx)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "WORKBENCH_MODE": "compile"})
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = done.stdout
    assert ptx.count(load) == loads, ptx[-3000:]
    assert ptx.count(store) == stores, ptx[-3000:]
    assert ".local" not in ptx, "the window went to local memory"


@pytest.mark.gpu
@pytest.mark.parametrize("op", depthwise.OPERATORS, ids=lambda o: o.name)
def test_depthwise_final_stages_correct_at_the_headline(op):
    result = check_stage(op.stages[-1], op.headline_size, np.random.default_rng(0))
    assert result.passed, result.message


# -- the fused epilogue (conv2d[bias_relu], conv2d[bias_add_relu]) ------------------------------------------

def test_fused_epilogue_refuses_a_bias_per_pixel():
    x, w, bias, out = _device_args(np.ones((1, 2, 6, 6), np.float32), np.ones((3, 2, 3, 3), np.float32),
                                   np.ones(6, np.float32), np.empty((1, 3, 6, 6), np.float32))
    with pytest.raises(InputError, match=r"bias must have shape \(3,\)"):
        conv.fused_epilogue(x, w, bias, out)


def test_fused_epilogue_refuses_a_residual_of_another_shape():
    x, w, bias, res, out = _device_args(np.ones((1, 2, 6, 6), np.float32), np.ones((3, 2, 3, 3), np.float32),
                                        np.ones(3, np.float32), np.ones((1, 2, 6, 6), np.float32),
                                        np.empty((1, 3, 6, 6), np.float32))
    with pytest.raises(InputError, match="residual must have shape"):
        conv.add_fused_epilogue(x, w, bias, res, out)


def _epilogue_cases(op, size, seed):
    rng = np.random.default_rng(seed)
    return [("random", op.make_inputs(size, rng)), *op.adversarial_inputs(size, rng)]


@pytest.mark.parametrize("op", [pytest.param(conv.bias_relu_op, marks=pytest.mark.slow), conv.bias_add_relu_op],
                         ids=lambda o: o.name)
def test_async_epilogue_exact_past_every_tile_edge(op):
    """The operator's simulator sizes have C < K_STEP, one block of pixels and K <= 64 but for the slow
    tier's last. C = 19: a whole K-step (the test-free copies) and a step of 3 channels; 9 x 15 pixels:
    two 128-pixel tiles, the second 7 pixels and 121 columns past the last (the residual's dropped
    loads); K = 66: two 64-channel tiles, the second with 2 rows. Random inputs, then the NaN pixel and
    the +-1e4 biases."""
    size = (1, 19, 9, 15, 66)
    for label, inputs in _epilogue_cases(op, size, 11):
        result = check_stage(op["async_epilogue"], size, inputs=inputs, label=label)
        assert result.passed, (label, result.message)


@pytest.mark.parametrize("setting", [{"RESIDUAL_FIRST": False}, {"RESIDUAL_COLUMNS": 4}, {"RESIDUAL_COLUMNS": 8}],
                         ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_async_epilogue_residual_settings_a_sweep_may_take(setting, monkeypatch):
    """The residual's other settings (the simulator reads module constants at each call): stage 2's
    read at each store, and the loads in batches of 4 and 8 columns, at a size with a partial K-step,
    rows past K and pixels past the last."""
    for name, value in setting.items():
        monkeypatch.setattr(conv, name, value)
    size = (1, 3, 7, 9, 5)
    for label, inputs in _epilogue_cases(conv.bias_add_relu_op, size, 12):
        result = check_stage(conv.bias_add_relu_op["async_epilogue"], size, inputs=inputs, label=label)
        assert result.passed, (label, result.message)


def test_epilogue_reference_keeps_nan_through_relu():
    x = np.zeros((1, 1, 3, 3), np.float32)
    x[0, 0, 1, 1] = np.nan
    ref = conv._epilogue_reference(x, np.ones((2, 1, 3, 3), np.float32), np.array([-5, 5], np.float32))
    assert np.isnan(ref).all()  # every 3x3 window of a 3x3 image (padding 1) holds the centre


# -- conv_transpose2d ----------------------------------------------------------------------------------------

def _transpose_by_definition(x, w, stride, pad):
    """The definition, one input pixel and tap at a time (float64): what the reference must equal."""
    N, C, H, W = x.shape
    _, K, R, S = w.shape
    Ho, Wo = conv_transpose.output_hw(H, W, R, S, stride, pad)
    out = np.zeros((N, K, Ho, Wo))
    for n, c, h, col, r, s in np.ndindex(N, C, H, W, R, S):
        ho, wo = h * stride - pad + r, col * stride - pad + s
        if 0 <= ho < Ho and 0 <= wo < Wo:
            out[n, :, ho, wo] += float(x[n, c, h, col]) * w[c, :, r, s].astype(np.float64)
    return out


@pytest.mark.parametrize("size", [(1, 2, 3, 4, 3, 3, 3, 2, 1), (2, 3, 4, 5, 2, 4, 4, 2, 1),
                                  (1, 2, 3, 3, 2, 5, 5, 1, 2), (1, 1, 4, 3, 2, 3, 3, 3, 0)])
def test_conv_transpose_reference_is_the_definition(size):
    x, w, geometry = conv_transpose._inputs(size, np.random.default_rng(3))
    np.testing.assert_allclose(conv_transpose._reference(x, w, geometry),
                               _transpose_by_definition(x, w, *size[7:]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("H, R, stride, pad, expected", [(28, 4, 2, 1, 56), (14, 3, 2, 1, 27), (7, 5, 1, 2, 7)])
def test_conv_transpose_output_size_matches_torch_formula(H, R, stride, pad, expected):
    assert conv_transpose.output_hw(H, H, R, R, stride, pad) == (expected, expected)


@pytest.mark.parametrize("geometry, w_shape, message", [([5, 1], (2, 3, 3, 3), "stride 1..4"),
                                                         ([2, 3], (2, 3, 3, 3), "padding must be 0..2"),
                                                         ([2, 1], (3, 2, 3, 3), "C = 2")])
def test_conv_transpose_refuses_what_it_cannot_take(geometry, w_shape, message):
    x, w, g, out = _device_args(np.ones((1, 2, 4, 4), np.float32), np.ones(w_shape, np.float32),
                                np.array(geometry, np.int32), np.empty((1, 3, 7, 7), np.float32))
    with pytest.raises(InputError, match=message):
        conv_transpose.gather(x, w, g, out)


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("op", [conv.bias_relu_op, conv.bias_add_relu_op], ids=lambda o: o.name)
def test_fused_epilogue_beats_unfused_at_the_headline(op):
    """The must-show: at N32 C64 56x56 K64, the fused epilogue is faster than the implicit GEMM followed
    by a bias (+ residual) + ReLU kernel, in one run."""
    from tests.headline import headline

    _, stages, _ = headline(op)
    times = {r["stage"]: r["median_us"] for r in stages}
    assert times["fused_epilogue"] < times["unfused"], times


@pytest.mark.gpu
@pytest.mark.timing
def test_conv_transpose_parity_gemm_is_the_fastest_stage():
    """The last stage is the fastest at the headline (N32 C64 28x28 -> 56x56, K64 4x4 stride 2). Not that
    gather beats scatter: on the H200 it did not (3933 against 3781 µs), the atomics landing in L2."""
    from tests.headline import headline

    _, stages, _ = headline(conv_transpose.op)
    times = {r["stage"]: r["median_us"] for r in stages}
    assert times["parity_gemm"] < min(v for k, v in times.items() if k != "parity_gemm"), times


@pytest.mark.parametrize("H, W, R, stride, pad", [(28, 28, 4, 2, 1), (14, 14, 3, 2, 1), (5, 4, 5, 1, 2),
                                                   (3, 2, 2, 3, 0), (4, 7, 3, 4, 2), (1, 1, 3, 2, 1)])
def test_parity_gemm_grid_is_sized_for_the_true_stride(H, W, R, stride, pad):
    """The launcher reads no geometry: it infers the largest stride the shapes allow, and its grid must
    hold every class's blocks for the true one."""
    Ho, Wo = conv_transpose.output_hw(H, W, R, R, stride, pad)
    assert conv_transpose.largest_stride(H, W, Ho, Wo, R, R) >= stride


@pytest.mark.slow
def test_parity_gemm_class_spread_over_several_blocks():
    """Each of the 4 parity classes of 2 x 12 x 12 outputs (stride 2) holds 288 pixels: 3 blocks of 128
    each, the last partial; the blocks must find their class and their place in it."""
    result = check_stage(conv_transpose.op["parity_gemm"], (2, 1, 12, 12, 3, 4, 4, 2, 1), np.random.default_rng(4))
    assert result.passed, result.message


# -- conv2d_fft ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("H, W, R, P", [(256, 256, 31, 512), (256, 200, 1, 256), (250, 7, 7, 256), (1, 1, 1, 1),
                                        (17, 13, 7, 32)])
def test_fft_length_leaves_no_wrap_around(H, W, R, P):
    assert conv_fft.fft_length(H, W, R) == P and P >= max(H, W) + R - 1


def test_conv_fft_refuses_even_filters_and_lines_past_one_block():
    x, w4, out = _device_args(np.ones((1, 2, 8, 8), np.float32), np.ones((2, 4, 4), np.float32),
                              np.empty((1, 8, 8), np.float32))
    with pytest.raises(InputError, match="R odd"):
        conv_fft.fft(x, w4, out)
    x, w, out = _device_args(np.ones((1, 1, 1000, 2), np.float32), np.ones((1, 31, 31), np.float32),
                             np.empty((1, 1000, 2), np.float32))
    with pytest.raises(InputError, match="at most 1024"):
        conv_fft.direct(x, w, out)


@pytest.mark.gpu
@pytest.mark.timing
def test_fft_beats_direct_at_31x31():
    """The must-show: at N8 C3 256x256 with a 31x31 filter the FFT stage is faster than direct."""
    from tests.headline import headline

    _, stages, _ = headline(conv_fft.op)
    times = {r["stage"]: r["median_us"] for r in stages}
    assert times["fft"] < times["direct"], times
