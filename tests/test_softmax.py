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
BY_SHAPE_KERNELS = {"small_rows": softmax.small_rows, "warp_rows": softmax.warp_rows, "block_rows": softmax.block_rows,
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
    narrow, vector_rows = softmax.NARROW_ROW_COLS, softmax.VECTOR_ROWS_COLS  # 0: that kernel takes no rows
    small = softmax.small_rows if softmax.SMALL_ROW_COLS >= 1024 else softmax.warp_rows  # it hands on the many rows
    assert softmax.kernel_for(1) is (softmax.narrow_vector_rows if narrow else small)
    assert softmax.kernel_for(1024) is (softmax.narrow_vector_rows if narrow >= 1024 else small)
    assert softmax.kernel_for(1025) is (softmax.float_vector_rows if vector_rows else softmax.block_rows)
    assert softmax.kernel_for(max(vector_rows, 1025)) is (softmax.float_vector_rows if vector_rows else softmax.block_rows)
    assert softmax.kernel_for(vector_rows + 1) is softmax.block_rows and softmax.kernel_for(16384) is softmax.block_rows
    assert softmax.kernel_for(16385) is softmax.shared_rows and softmax.kernel_for(32768) is softmax.shared_rows
    widest = softmax.SHARED_ROW_MAX_COLS
    assert softmax.kernel_for(widest) is softmax.shared_rows and softmax.kernel_for(widest + 1) is softmax.online_rows
    assert softmax.kernel_for(128256) is softmax.online_rows
    assert softmax.block_row_threads(4096) == 256 and softmax.block_row_threads(12288) == 768
    assert softmax.block_row_threads(16384) == 1024 and softmax.block_row_threads(33) == 32
    wide = cuda.device_array((1, softmax.WARP_ROW_COLS + 4), np.float32)
    with pytest.raises(InputError, match="at most 1024"):
        softmax.warp_rows(wide, wide)


# by_shape's kernel for few narrow rows (small_rows: a block a row, one 16-byte vector a thread, one reduction of
# (max, sum of exp) pairs), run directly with its fallbacks made to fail.
def no_small_fallback(monkeypatch):
    for name in ("warp_rows", "float_vector_rows"):
        monkeypatch.setattr(softmax, name, None)


SMALL_SIZES = [(3, 1024), (5, 1000), (3, 516), (5, 200), (3, 300), (9, 40), (8, 128), (2, 4)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the float64 reference of NaN and inf inputs
@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_small_rows(size, monkeypatch):
    """Widths of whole vectors of 4: 1024 (256 threads, 8 warps merged through shared memory; the rows fill the
    launch: the kernel without bounds checks), 1000 and 516 (the last threads of the row hold nothing: their pair
    is (LOWEST, 0)), 5 rows of 200 (2 warps a row, 4 rows a block, the second block all but one row past the last),
    3 of 300 (4 warps, 2 rows a block), 9 rows of 40 (8 rows of a warp to a block, the second block all but one
    row past the last), 8 of 128 (one block of 8 one-warp rows that fill it), 4 (one thread holds the row). The
    module's rows (+-1e4, -inf but one), a NaN row, a +inf, an all -inf row (NaN out, as the float64 reference);
    no fallback."""
    no_small_fallback(monkeypatch)
    (x,) = op.make_inputs(size, np.random.default_rng(size[1]))
    if size[0] > 2:
        x[-1, 3] = np.nan
        x[2, size[1] - 1] = np.inf
        x[0] = -np.inf
    got = run(softmax.small_rows, x)
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7, equal_nan=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_small_rows_with_bounds_checks_everywhere(monkeypatch):
    """small_rows with SMALL_WHOLE_ROWS off (the simulator reads the module's constants as it runs): the same rows
    as test_small_rows at 1024 (8 warps), 200 (2 warps a row, rows past the last) and 300 (4 warps)."""
    no_small_fallback(monkeypatch)
    monkeypatch.setattr(softmax, "SMALL_WHOLE_ROWS", False)
    for size in [(3, 1024), (5, 200), (3, 300)]:
        (x,) = op.make_inputs(size, np.random.default_rng(size[1]))
        x[-1, 3] = np.nan
        x[2, size[1] - 1] = np.inf
        x[0] = -np.inf
        got = run(softmax.small_rows, x)
        np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7, equal_nan=True)


def test_small_rows_without_bounds_checks_only_where_rows_fill_the_launch(monkeypatch):
    """The kernel compiled with whole_row (no bounds checks) takes rows that fill their launch exactly (4 x the
    threads a row wide, a multiple of the rows a block); the rest take the kernel with the checks."""
    taken = []

    class Watched:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(softmax, name)

        def __getitem__(self, config):
            taken.append(self.name)
            return self.kernel[config]

    no_small_fallback(monkeypatch)
    for name in ("_softmax_small_rows", "_softmax_small_whole_rows"):
        monkeypatch.setattr(softmax, name, Watched(name))
    for size in [(2, 1024), (2, 1000), (8, 128), (9, 128), (4, 256)]:
        (x,) = op.make_inputs(size, np.random.default_rng(1))
        np.testing.assert_allclose(run(softmax.small_rows, x), softmax.softmax64(x), rtol=1e-5, atol=1e-7)
    assert taken == ["_softmax_small_whole_rows", "_softmax_small_rows", "_softmax_small_whole_rows",
                     "_softmax_small_rows", "_softmax_small_whole_rows"]


@pytest.mark.slow
@pytest.mark.sim_only
def test_small_rows_kernel_for_whole_rows_reads_no_row_count():
    """Compiled as the GPU launches them (two 1-D arrays, rows, cols): both kernels make one 16-byte load and one
    16-byte store a thread; the one for rows that fill the launch never reads rows (parameter 14, after the
    arrays' seven values each): no bounds check is left in it."""
    import os
    import subprocess
    import sys

    program = (
        "import re, workbench\n"
        "from numba import cuda, types\n"
        "import solutions.softmax as S\n"
        "sig = (types.float32[::1], types.float32[::1], types.int64, types.int64)\n"
        "for name in ('_softmax_small_rows', '_softmax_small_whole_rows'):\n"
        "    ptx, _ = cuda.compile_ptx(getattr(S, name).py_func, sig, cc=(9, 0))\n"
        "    used = sorted(set(re.findall(r'ld\\.param\\.\\w+\\s+%\\w+, \\[\\w+_param_(\\d+)\\]', ptx)), key=int)\n"
        "    print(name, ptx.count('ld.global.v4.f32'), ptx.count('st.global.v4.f32'), ','.join(used))\n")
    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line.startswith("_softmax")}
    for name in ("_softmax_small_rows", "_softmax_small_whole_rows"):
        assert found[name][:2] == ["1", "1"], done.stdout
    assert "14" in found["_softmax_small_rows"][2].split(","), done.stdout
    assert "14" not in found["_softmax_small_whole_rows"][2].split(","), done.stdout


def test_small_rows_large_logits_and_minus_inf_rows(monkeypatch):
    """Rows that must not come out NaN: -inf but one element, in the last thread's vector and in one whose
    neighbours hold only -inf (their pair (LOWEST, 0) merged with a finite one), logits near float32's largest
    (exp overflows unless the maximum is subtracted first), a row of one value 3e38, +-1e4."""
    no_small_fallback(monkeypatch)
    cols = 1000
    x = np.full((6, cols), -np.inf, np.float32)
    x[0, 999] = 1.5
    x[1, 130] = -2.0e4
    x[2] = np.linspace(-3.0e38, 3.0e38, cols)
    x[3, :] = 3.0e38
    x[4] = np.random.default_rng(2).uniform(-1e4, 1e4, cols)
    x[5, ::97] = np.random.default_rng(3).uniform(-1e4, -9e3, x[5, ::97].size)
    got = run(softmax.small_rows, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7)
    assert got[0, 999] == 1.0 and got[1, 130] == 1.0 and got[0].sum() == 1.0 and got[1].sum() == 1.0


def test_small_rows_hand_on(monkeypatch):
    """Rows small_rows cannot hold as whole vectors (a width not a multiple of 4, a view off 16 bytes), and more than
    SMALL_MAX_ROWS rows, go to the kernel the table gives without it: warp_rows (float_vector_rows past 1024)."""
    class Refused:
        def __getitem__(self, config):
            raise AssertionError("small_rows' kernel was launched")

    taken = []
    monkeypatch.setattr(softmax, "_softmax_small_rows", Refused())
    for name in ("warp_rows", "float_vector_rows"):
        monkeypatch.setattr(softmax, name, lambda x, out, name=name, launch=getattr(softmax, name):
                            taken.append(name) or launch(x, out))
    rng = np.random.default_rng(6)
    (odd,) = op.make_inputs((3, 42), rng)
    np.testing.assert_allclose(run(softmax.small_rows, odd), softmax.softmax64(odd), rtol=1e-5, atol=1e-7)
    monkeypatch.setattr(softmax, "SMALL_MAX_ROWS", 2)
    (many,) = op.make_inputs((3, 40), rng)
    np.testing.assert_allclose(run(softmax.small_rows, many), softmax.softmax64(many), rtol=1e-5, atol=1e-7)
    (wide,) = op.make_inputs((3, 1036), rng)  # small_rows reached past 1024 columns (SMALL_ROW_COLS swept up)
    np.testing.assert_allclose(run(softmax.small_rows, wide), softmax.softmax64(wide), rtol=1e-5, atol=1e-7)
    monkeypatch.setattr(softmax, "SMALL_MAX_ROWS", 4096)
    from solutions import _half
    monkeypatch.setattr(_half, "aligned16", lambda *arrays: False)  # fits_vector_rows asks it
    (x,) = op.make_inputs((3, 40), rng)
    np.testing.assert_allclose(run(softmax.small_rows, x), softmax.softmax64(x), rtol=1e-5, atol=1e-7)
    assert taken == ["warp_rows", "warp_rows", "float_vector_rows", "warp_rows"]


# by_shape's float32 vector_rows kernels (the fp16/bf16 ladders' template, four floats a vector), run directly:
# FLOAT_VECTORS vectors a thread (float_vector_rows) and one (narrow_vector_rows, off in the table by default).
FLOAT_VECTOR_ROWS = {"float_vector_rows": softmax.float_vector_rows, "narrow_vector_rows": softmax.narrow_vector_rows}


def no_fallback(monkeypatch):
    """The kernels the float32 vector launchers hand rows they cannot hold to: reaching one fails the test."""
    for name in ("warp_rows", "block_rows", "shared_rows"):
        monkeypatch.setattr(softmax, name, None)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the float64 reference of NaN and inf inputs
@pytest.mark.parametrize("kernel", FLOAT_VECTOR_ROWS)
@pytest.mark.parametrize("size", [(3, 1032), (5, 4100), (9, 40), (2, 4)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_float_vector_rows(kernel, size, monkeypatch):
    """At widths of whole vectors of 4: 1032 (the last vector of most threads past the row), 4100 (512 threads
    a row of FLOAT_VECTORS = 4, one vector in 256 threads with one: a row of several warps, reduced through
    shared memory), 9 rows of 40 (8 rows a block, the second block all but one row past the last), 4 (one
    thread holds the row). The module's rows (+-1e4, -inf but one), a NaN row and an inf; no fallback."""
    if kernel == "narrow_vector_rows" and size[1] > 1024 * 4 * softmax.NARROW_FLOAT_VECTORS:
        pytest.skip("wider than 1024 threads of NARROW_FLOAT_VECTORS vectors hold")
    no_fallback(monkeypatch)
    (x,) = op.make_inputs(size, np.random.default_rng(size[1]))
    if size[0] > 2:
        x[-1, 3] = np.nan  # a NaN makes its row NaN, as in the float64 reference
        x[2, size[1] - 1] = np.inf
    got = run(FLOAT_VECTOR_ROWS[kernel], x)
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("kernel", FLOAT_VECTOR_ROWS)
def test_float_vector_rows_large_logits_and_minus_inf_rows(kernel, monkeypatch):
    """Rows that must not come out NaN or inf: -inf but one element (one-hot), logits near float32's largest
    (exp overflows unless the maximum is subtracted first), +-1e4, all of it in one block of rows."""
    no_fallback(monkeypatch)
    cols = 1032
    x = np.full((4, cols), -np.inf, np.float32)
    x[0, 1029] = 1.5
    x[1] = np.linspace(-3.0e38, 3.0e38, cols)
    x[2, :] = 3.0e38
    x[3] = np.random.default_rng(2).uniform(-1e4, 1e4, cols)
    got = run(FLOAT_VECTOR_ROWS[kernel], x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, softmax.softmax64(x), rtol=1e-5, atol=1e-7)
    assert got[0, 1029] == 1.0 and not got[0, np.arange(cols) != 1029].any()


@pytest.mark.parametrize("kernel", FLOAT_VECTOR_ROWS)
def test_float_vector_rows_fall_back(kernel, monkeypatch):
    """A width not a multiple of 4 never reaches the float32 vector kernels (its rows are not whole vectors)."""
    monkeypatch.setattr(softmax, "_softmax_float_vectors", None)
    monkeypatch.setattr(softmax, "_softmax_narrow_vectors", None)
    for size in [(3, 42), (2, 1030)]:  # 1030: past WARP_ROW_COLS, so the narrow kernel hands it to float_vector_rows
        (x,) = op.make_inputs(size, np.random.default_rng(3))
        np.testing.assert_allclose(run(FLOAT_VECTOR_ROWS[kernel], x), softmax.softmax64(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kernel", FLOAT_VECTOR_ROWS)
def test_float_vector_rows_never_launch_on_a_view_off_16_bytes(kernel, monkeypatch):
    """On a GPU a view 4 bytes past a 16-byte boundary would fault in a 16-byte load: the launchers ask aligned16
    (told here to say no, as the simulator counts every array aligned) and take the kernel the table gives."""
    class Refused:
        def __getitem__(self, config):
            raise AssertionError("the 16-byte kernel was launched on a misaligned view")

    from solutions import _half
    monkeypatch.setattr(_half, "aligned16", lambda *arrays: False)  # fits_vector_rows asks it
    monkeypatch.setattr(softmax, "_softmax_float_vectors", Refused())
    monkeypatch.setattr(softmax, "_softmax_narrow_vectors", Refused())
    (x,) = op.make_inputs((3, 40), np.random.default_rng(4))
    np.testing.assert_allclose(run(FLOAT_VECTOR_ROWS[kernel], x), softmax.softmax64(x), rtol=1e-5, atol=1e-7)


# Settings the GPU sweep may try for by_shape (the module executed afresh with them), each with the kernel the table
# gives 40 columns: WARP_ROW_COLS = 8 with SMALL_ROW_COLS = 0 sends rows from 9 columns to float_vector_rows;
# SMALL_MAX_ROWS = 0 leaves them to small_rows, which hands them on to warp_rows.
TO_VECTOR_ROWS = {"SMALL_ROW_COLS": "0", "WARP_ROW_COLS": "8"}
BY_SHAPE_SETTINGS = [({"NARROW_ROW_COLS": "1024"}, "narrow_vector_rows"), (TO_VECTOR_ROWS, "float_vector_rows"),
                     ({**TO_VECTOR_ROWS, "FLOAT_VECTORS": "2", "FLOAT_BLOCK_ROWS_THREADS": "128"}, "float_vector_rows"),
                     ({**TO_VECTOR_ROWS, "FLOAT_VECTORS": "8", "FLOAT_EXP": "fast_exp"}, "float_vector_rows"),
                     ({"NARROW_ROW_COLS": "1024", "NARROW_FLOAT_VECTORS": "2"}, "narrow_vector_rows"),
                     ({"SMALL_MAX_ROWS": "0"}, "small_rows"), ({"FLOAT_EXP": "fast_exp"}, "small_rows"),
                     ({"SMALL_VECTORS": "2", "SMALL_BLOCK_THREADS": "128"}, "small_rows"),
                     ({"SMALL_WHOLE_ROWS": "False"}, "small_rows")]


@pytest.mark.slow
@pytest.mark.parametrize("setting, kernel", BY_SHAPE_SETTINGS,
                         ids=[",".join(f"{k}={v}" for k, v in s.items()) for s, _ in BY_SHAPE_SETTINGS])
def test_by_shape_settings_a_sweep_may_try(setting, kernel, monkeypatch):
    import sys

    from workbench.check import adversarial_cases
    from workbench.sweep import stage_with

    monkeypatch.setitem(sys.modules, softmax.__name__, softmax)  # put back after stage_with's fresh module
    stage = stage_with("softmax.by_shape", setting)
    fresh = sys.modules[softmax.__name__]
    assert fresh.kernel_for(40) is getattr(fresh, kernel)
    rng = np.random.default_rng(5)
    for size in [(5, 40), (3, 42), (3, 1032)]:  # 42: not whole vectors, the fallback
        results = [check_stage(stage, size, rng)]
        results += [check_stage(stage, size, inputs=inputs, label=label)
                    for label, inputs in adversarial_cases(stage.op, size, rng)]
        assert not [r.message for r in results if r.failed], (setting, size)


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
