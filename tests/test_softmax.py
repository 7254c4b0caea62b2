"""Softmax ladder: every stage correct in the simulator, on rows a careless kernel gets wrong; bad
input refused; every kernel compiles for sm_90 without float64. `-m gpu` adds the GPU check sizes."""

import math

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda, float32

from solutions import softmax
from workbench.check import check_stage, poison_like
from workbench.ladder import InputError

op = softmax.op
STAGES = [s.name for s in op.stages]


def run(launch, x):
    d_out = cuda.to_device(poison_like(np.empty(x.shape, np.float32)))
    launch(cuda.to_device(x), d_out)
    return d_out.copy_to_host()


def test_inputs_hold_the_adversarial_rows():
    (x,) = op.make_inputs((11, 50), np.random.default_rng(0))
    assert np.abs(x[0]).max() > 1e3  # +-1e4: overflows exp without the max subtracted
    assert np.isneginf(x[1]).sum() == 49 and np.isfinite(x[1]).sum() == 1


@pytest.mark.parametrize("stage", STAGES)
def test_adversarial_rows_exactly(stage):
    """Each kind of hard row on its own, at widths that are not multiples of any block."""
    rng = np.random.default_rng(3)
    cols = 37
    huge = rng.uniform(-1e4, 1e4, cols).astype(np.float32)
    one_hot = np.full(cols, -np.inf, np.float32)
    one_hot[29] = 1.5
    offset = (80.0 + rng.standard_normal(cols)).astype(np.float32)  # exp(80+) overflows float32
    x = np.stack([huge, one_hot, offset])
    got = run(op[stage], x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7)
    assert got[1, 29] == 1.0 and not got[1, np.arange(cols) != 29].any()


@pytest.mark.parametrize("stage", STAGES)
def test_width_one(stage):
    x = np.array([[3.0], [-1e4], [1e4]], np.float32)
    assert (run(op[stage], x) == 1.0).all()


def test_fused_streaming_path():
    """The fused stage's kernel for rows too wide for registers, run on narrow rows in the simulator."""
    rng = np.random.default_rng(5)
    for size in [(3, 1), (4, 33), (2, 1500)]:
        (x,) = op.make_inputs(size, rng)
        np.testing.assert_allclose(run(lambda x, out: softmax.fused_streaming(x, out, threads=64), x), softmax.softmax64(x), rtol=1e-5, atol=1e-7)



# by_shape's kernels, each run directly on narrow rows (the dispatch sends the simulator's sizes to
# the warp kernel only): widths not multiples of 4 (read a column at a time), several online steps
# (32 threads x 16 values = 512 columns a step), rows with NaN, +-inf and all -inf (NaN out).
BY_SHAPE_KERNELS = {"warp_rows": softmax.warp_rows, "block_rows": softmax.block_rows,
                    "online_rows": lambda x, out: softmax.online_rows(x, out, threads=32),
                    "shared_rows": lambda x, out: softmax.shared_rows(x, out, threads=64)}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the float64 reference of NaN and inf inputs, put there on purpose
@pytest.mark.parametrize("kernel", BY_SHAPE_KERNELS)
@pytest.mark.parametrize("size", [(3, 7), (2, 100), (2, 1100)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_by_shape_kernels(kernel, size):
    if kernel == "warp_rows" and size[1] > softmax.WARP_ROW_COLS:
        pytest.skip("warp_rows takes rows up to WARP_ROW_COLS wide (32 values a lane)")
    rng = np.random.default_rng(11)
    (x,) = op.make_inputs(size, rng)
    x[-1, 3] = np.nan  # a NaN makes its row NaN, as in the float64 reference
    x[0, size[1] - 1] = np.inf if size[1] > 7 else x[0, 0]
    got = run(BY_SHAPE_KERNELS[kernel], x)
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7, equal_nan=True)


def test_by_shape_table():
    """The dispatch table picks the kernel its thresholds name, and the wider kernels can take any row."""
    assert softmax.kernel_for(1) is softmax.warp_rows and softmax.kernel_for(1024) is softmax.warp_rows
    assert softmax.kernel_for(1025) is softmax.block_rows and softmax.kernel_for(16384) is softmax.block_rows
    assert softmax.kernel_for(16385) is softmax.shared_rows and softmax.kernel_for(32768) is softmax.shared_rows
    widest = softmax.SHARED_ROW_MAX_COLS
    assert softmax.kernel_for(widest) is softmax.shared_rows and softmax.kernel_for(widest + 1) is softmax.online_rows
    assert softmax.kernel_for(128256) is softmax.online_rows
    assert softmax.block_row_threads(4096) == 256 and softmax.block_row_threads(12288) == 768
    assert softmax.block_row_threads(16384) == 1024 and softmax.block_row_threads(33) == 32
    wide = cuda.device_array((1, softmax.WARP_ROW_COLS + 4), np.float32)
    with pytest.raises(InputError, match="at most 1024"):
        softmax.warp_rows(wide, wide)


@pytest.mark.parametrize("stage", ["shared_rows"])
def test_adversarial_rows_shared(stage):
    """test_adversarial_rows_exactly's rows through by_shape's shared-memory kernel (no stage runs it at the
    simulator's widths)."""
    rng = np.random.default_rng(3)
    cols = 37
    huge = rng.uniform(-1e4, 1e4, cols).astype(np.float32)
    one_hot = np.full(cols, -np.inf, np.float32)
    one_hot[29] = 1.5
    offset = (80.0 + rng.standard_normal(cols)).astype(np.float32)
    x = np.stack([huge, one_hot, offset])
    got = run(BY_SHAPE_KERNELS[stage], x)
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7)
    assert got[1, 29] == 1.0 and not got[1, np.arange(cols) != 29].any()


def test_by_shape_unaligned_view():
    """A matrix that starts mid-buffer (not on 16 bytes) takes the column-at-a-time path, not load4."""
    x = op.make_inputs((3, 64), np.random.default_rng(2))[0]
    buffer = cuda.to_device(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    view = buffer[1:].reshape(3, 64)
    d_out = cuda.to_device(poison_like(np.empty(x.shape, np.float32)))
    softmax.by_shape(view, d_out)
    np.testing.assert_allclose(d_out.copy_to_host(), softmax.softmax64(x), rtol=1e-5, atol=1e-7)


@cuda.jit
def _no_max_subtracted(x, out):
    row = cuda.grid(1)
    if row < x.shape[0]:
        s = float32(0.0)
        for j in range(x.shape[1]):
            s += math.exp(x[row, j])
        for j in range(x.shape[1]):
            out[row, j] = math.exp(x[row, j]) / s


def test_inputs_catch_a_kernel_without_the_max():
    result = check_stage(op["naive"], (4, 33), np.random.default_rng(1),
                         launch=lambda x, out: _no_max_subtracted[1, 32](x, out))
    assert not result.passed


def test_bad_input():
    x = cuda.to_device(np.ones((4, 5), np.float32))
    out = cuda.device_array((4, 5), np.float32)
    with pytest.raises(InputError, match="2-D"):
        op["fused"](cuda.to_device(np.ones(5, np.float32)), cuda.device_array(5, np.float32))
    with pytest.raises(InputError, match="dtype float32"):
        op["fused"](cuda.to_device(np.ones((4, 5))), out)
    with pytest.raises(InputError, match="host"):
        op["fused"](np.ones((4, 5), np.float32), out)
    with pytest.raises(InputError, match="shape of x"):
        op["fused"](x, cuda.device_array((4, 6), np.float32))
    with pytest.raises(InputError, match="contiguous"):
        op["fused"](cuda.to_device(np.ones((5, 4), np.float32)).T, out)
    with pytest.raises(InputError, match="empty"):
        op["fused"](cuda.device_array((0, 5), np.float32), cuda.device_array((0, 5), np.float32))


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_targets():
    """At 32768 x 4096, in one run: each stage faster than the one before, the last at >= 85% of the
    copy bandwidth measured now and >= 1.5x torch.softmax."""
    from tests.headline import assert_each_stage_faster, headline

    peaks, stages, peer = headline(softmax.op)
    assert_each_stage_faster(stages)
    assert stages[-1]["gbps"] >= 0.85 * peaks["copy_gbps"], (stages[-1]["gbps"], peaks["copy_gbps"])
    if peer is not None:
        assert peer["median_us"] >= 1.5 * stages[-1]["median_us"], (peer["median_us"], stages[-1]["median_us"])
