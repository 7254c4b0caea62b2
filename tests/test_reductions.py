"""What is specific to the reductions beyond the sum (every stage's correctness at the simulator sizes, on
the adversarial inputs, and its sm_90 compilation are tests/test_ladders.py's)."""

import numpy as np
import pytest
from numba import cuda

from solutions import reductions
from tests.load4_calls import record_load4
from workbench.check import adversarial_cases, check_stage
from workbench.ladder import InputError, scratch, to_device

VECTOR = [op for op in reductions.OPERATORS if op.variant.get("axis", "vector") == "vector"]


@pytest.mark.parametrize("where", [0, 2, 1028])
@pytest.mark.parametrize("name", ["reduction[max]", "reduction[min]"])
def test_nan_wins_wherever_it_is_as_torch_amax_does(name, where):
    """a > b is false for NaN on either side: a maximum written that way drops a NaN that arrives as its
    first argument, so the answer would depend on where the NaN sits in the tree."""
    op = reductions.BY_NAME[name]
    x = np.random.default_rng(where).uniform(-1.0, 2.0, 1029).astype(np.float32)
    x[where] = np.nan  # first element, inside the first vector, the scalar tail
    for stage in op.stages:
        result = check_stage(stage, (1029,), inputs=(x,), label=f"nan-at-{where}")
        assert result.passed, result.message


@pytest.mark.parametrize("name", ["reduction[max]", "reduction[sumsq]"])
def test_one_pass_four_vector_loop(name):
    """At the quick simulator size (1029) one_pass's four-vector loop never runs (one block of 256
    threads needs more than 768 vectors); at 4095 threads 0-254 take it once, thread 255 the
    one-vector loop three times, and threads 0-2 the tail. A NaN inside the four-vector loop's reach."""
    op = reductions.BY_NAME[name]
    x = np.random.default_rng(4).uniform(-1.0, 2.0, 4095).astype(np.float32)
    assert check_stage(op["one_pass"], (4095,), inputs=(x,), label="random").passed
    x[4 * (256 * 2 + 7) + 1] = np.nan  # the third vector (w + 2 stride) of thread 7
    result = check_stage(op["one_pass"], (4095,), inputs=(x,), label="nan-in-the-four-vector-loop")
    assert result.passed, result.message


def test_identities_are_the_operations_own():
    by_kind = {op.name: op for op in VECTOR}
    x = -np.random.default_rng(1).uniform(1.0, 2.0, 33).astype(np.float32)  # all negative: 0 would win a max
    for name in ("reduction[max]", "reduction[min]"):  # (a sum's identity, 0, is every random check's)
        for stage in by_kind[name].stages:
            assert check_stage(stage, (33,), inputs=(x,), label="all-negative").passed, stage.key


def _misaligned_view_is_right(name, n):
    op = reductions.BY_NAME[name]
    x = np.random.default_rng(2).uniform(-1.0, 2.0, n).astype(np.float32)
    d_x = to_device(x)
    out = to_device(np.zeros(1, np.float32))
    op["one_pass"](d_x[1:], out)  # 4 bytes past a 16-byte boundary: on a GPU, the two-pass kernels
    np.testing.assert_allclose(out.copy_to_host(), op.reference(x[1:]), rtol=1e-5)


@pytest.mark.parametrize("name", ["reduction[max]", "reduction[sumsq]"])
def test_a_vector_view_that_starts_mid_buffer_is_right(name):
    _misaligned_view_is_right(name, 1030)  # in the simulator every array counts as aligned


@pytest.mark.gpu
@pytest.mark.parametrize("name", [op.name for op in VECTOR])
def test_a_misaligned_vector_takes_the_two_pass_kernels_on_the_gpu(name):
    _misaligned_view_is_right(name, 1_000_003)


def test_bad_inputs_are_refused_in_one_line():
    with pytest.raises(InputError, match="x must be 1-D"):
        reductions.BY_NAME["reduction[max]"]["one_pass"](cuda.to_device(np.ones((2, 3), np.float32)),
                                                      cuda.to_device(np.ones(1, np.float32)))
    with pytest.raises(InputError, match=r"out must have shape \(3,\)"):
        reductions.BY_NAME["reduction[cols]"]["row_bands"](cuda.to_device(np.ones((2, 3), np.float32)),
                                                    cuda.to_device(np.ones(2, np.float32)))


def test_column_bands_cover_every_row_once():
    """The band split: bands x band_rows covers the rows, each band at least MIN_BAND_ROWS rows, and
    enough bands to fill the GPU when the columns alone do not."""
    for rows, strips in [(1, 1), (70, 1), (16384, 512), (100_000, 2)]:
        band_rows, bands = reductions.band_split(rows, strips)
        assert band_rows >= reductions.MIN_BAND_ROWS
        assert (bands - 1) * band_rows < rows <= bands * band_rows


# -- on a GPU: the targets --------------------------------------------------------------------

def _time(fn, *args):
    from workbench.timing import measure

    return measure(fn, [args]).median_us


@pytest.mark.gpu
@pytest.mark.timing
def test_column_sum_within_1_2x_of_the_row_sum_at_16384_squared():
    import torch

    x_t = torch.rand((16384, 16384), device="cuda")
    x = cuda.as_cuda_array(x_t)
    out = cuda.device_array(16384, np.float32)
    rows = _time(reductions.BY_NAME["reduction[rows]"]["warp_per_row"], x, out)
    cols = _time(reductions.BY_NAME["reduction[cols]"]["row_bands"], x, out)
    assert cols <= 1.2 * rows, (cols, rows)


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("name", [op.name for op in VECTOR])
def test_last_stage_at_least_its_torch_peer_at_2_28(name):
    import torch

    op = reductions.BY_NAME[name]
    x = cuda.as_cuda_array(torch.rand(2**28, device="cuda") * 3.0 - 1.0)
    out = cuda.device_array(1, np.float32)
    _, peer = op.peer((2**28,))
    assert _time(op.stages[-1], x, out) <= _time(peer, x, out)


# -- max, min and mean over rows and columns -------------------------------------------------------------

MATRIX = [op for op in reductions.OPERATORS if op.variant.get("axis") in ("rows", "cols")]


def test_matrix_operators_every_operation_in_both_orientations():
    assert [op.name for op in MATRIX] == [f"reduction[{where}]" if combine == "sum" else f"reduction[{combine},{where}]"
                                          for combine in ("sum", "max", "min", "mean") for where in ("rows", "cols")]
    for op in MATRIX:
        assert [s.name for s in op.stages] == (["thread_per_row", "warp_per_row"] if op.variant["axis"] == "rows"
                                               else ["thread_per_column", "row_bands", "column_vectors"])


@pytest.mark.parametrize("name", ["reduction[max,rows]", "reduction[max,cols]", "reduction[min,cols]"])
def test_a_nan_anywhere_wins_its_row_or_column_and_the_identity_is_the_operations(name):
    """All values of one sign (an identity of 0 would win every row or column), a NaN on the first row,
    inside the band kernel's unrolled reach (row 9 of 33) and at the last row and column."""
    op = reductions.BY_NAME[name]
    sign = -1.0 if name.startswith("amax") else 1.0
    x = sign * np.random.default_rng(6).uniform(1.0, 2.0, (33, 20)).astype(np.float32)
    x[0, 3] = x[9, 7] = x[32, 19] = np.nan
    for stage in op.stages:
        result = check_stage(stage, (33, 20), inputs=(x,), label="nans")
        assert result.passed, result.message


def test_mean_divides_once_by_the_length_it_covers():
    x = np.full((37, 5), 3.0, np.float32)  # each row's mean 3, each column's mean 3
    x[:, 0] = 1.0  # row means (1 + 4 * 3) / 5 = 2.6; column 0's mean 1
    for name, expected in [("reduction[mean,rows]", np.full(37, 2.6)), ("reduction[mean,cols]", np.array([1.0, 3, 3, 3, 3]))]:
        op = reductions.BY_NAME[name]
        for stage in op.stages:
            out = to_device(np.zeros(expected.size, np.float32))
            stage(to_device(x), out)
            np.testing.assert_allclose(out.copy_to_host(), expected, rtol=1e-6, err_msg=stage.key)


def test_matrix_bad_inputs_are_refused_in_one_line():
    with pytest.raises(InputError, match=r"out must have shape \(2,\)"):
        reductions.BY_NAME["reduction[max,rows]"]["warp_per_row"](cuda.to_device(np.ones((2, 3), np.float32)),
                                                        cuda.to_device(np.ones(3, np.float32)))
    with pytest.raises(InputError, match="x must have dtype float32"):
        reductions.BY_NAME["reduction[mean,cols]"]["row_bands"](cuda.to_device(np.ones((2, 3), np.float64)),
                                                     cuda.to_device(np.ones(3, np.float32)))


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("kind", ["amax", "amin", "mean"])
def test_column_reduction_within_1_2x_of_the_row_reduction_at_16384_squared(kind):
    import torch

    x_t = torch.rand((16384, 16384), device="cuda")
    x = cuda.as_cuda_array(x_t)
    out = cuda.device_array(16384, np.float32)
    rows = _time(reductions.BY_NAME[f"{kind}_rows"]["warp_per_row"], x, out)
    cols = _time(reductions.BY_NAME[f"{kind}_cols"]["row_bands"], x, out)
    assert cols <= 1.2 * rows, (cols, rows)


# -- column_vectors: 16-byte loads of four columns, the bands folded in the same launch ---------------------

COLUMNS = [op for op in MATRIX if op.variant["axis"] == "cols"]


def _column_failures(op, size, seed):
    rng = np.random.default_rng(seed)
    stage = op["column_vectors"]
    results = [check_stage(stage, size, rng)]
    results += [check_stage(stage, size, inputs=inputs, label=label)
                for label, inputs in adversarial_cases(op, size, rng)]
    return [f"{r.key} @ {size} ({r.inputs}): {r.message}" for r in results if r.failed]


@pytest.mark.parametrize("size", [(1, 8), (37, 4), (29, 1), (3, 5), (40, 132)])
@pytest.mark.parametrize("name", [op.name for op in COLUMNS])
def test_column_vectors_at_awkward_shapes(name, size):
    """Every operation, random and adversarial (NaN, +-inf) inputs: one row; one column of 4-column
    vectors and rows not a multiple of the row lanes; one column and a width of 5 (not a multiple of 4:
    the row_bands kernels); two strips, the second holding one vector of four columns."""
    assert not _column_failures(reductions.BY_NAME[name], size, size[0] * size[1])


@pytest.mark.slow
@pytest.mark.parametrize("size", [(130, 136), (200, 36)])
@pytest.mark.parametrize("name", [op.name for op in COLUMNS])
def test_column_vectors_over_several_bands(name, size):
    """Two strips x three bands (the last of two rows), and one strip of four bands: the last band of
    each strip to finish folds the strip's partials."""
    assert not _column_failures(reductions.BY_NAME[name], size, size[0] + size[1])


def _launcher_globals(name):
    """The namespace an operation's column_vectors launcher (an instantiated template) looks its names up in."""
    return reductions.BY_NAME[name]["column_vectors"].launch.__globals__


@pytest.mark.parametrize("shape", [(37, 20), (70, 132)])
def test_column_vectors_read_every_element_once_in_16_byte_vectors(monkeypatch, shape):
    """Every load4 starts on a multiple of 4 elements and together they cover the matrix, each element
    once: every row of every band, every vector of four columns of every strip."""
    calls = record_load4(lambda load4: monkeypatch.setitem(_launcher_globals("reduction[cols]"), "load4", load4))
    rows, cols = shape
    x = np.random.default_rng(5).uniform(-1.0, 2.0, shape).astype(np.float32)
    out = to_device(np.zeros(cols, np.float32))
    reductions.BY_NAME["reduction[cols]"]["column_vectors"](to_device(x), out)
    assert sorted(calls) == list(range(0, rows * cols, 4))
    np.testing.assert_allclose(out.copy_to_host(), x.astype(np.float64).sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("name", ["reduction[cols]", "reduction[mean,cols]"])
def test_a_matrix_that_starts_mid_buffer_takes_the_row_bands_kernels(monkeypatch, name):
    """On a GPU a matrix 4 bytes past a 16-byte boundary would fault in a 16-byte load: the launcher asks
    aligned16 and takes row_bands. (The simulator counts every array as aligned: here aligned16 is told to
    say no, and the vector kernel to fail if it is launched.)"""
    class Refused:
        def __getitem__(self, config):
            raise AssertionError("the 16-byte kernel was launched on a misaligned matrix")

    names = _launcher_globals(name)
    monkeypatch.setitem(names, "aligned16", lambda *arrays: False)
    monkeypatch.setitem(names, "_column_vectors", Refused())
    op = reductions.BY_NAME[name]
    x = np.random.default_rng(8).uniform(-1.0, 2.0, 33 * 20 + 1).astype(np.float32)
    out = to_device(np.zeros(20, np.float32))
    op["column_vectors"](to_device(x)[1:].reshape(33, 20), out)
    np.testing.assert_allclose(out.copy_to_host(), op.reference(x[1:].reshape(33, 20)), rtol=1e-5)


def test_column_vectors_ticket_counters_reset_between_calls():
    """The last band of each strip resets the strip's counter, so the next call (another shape, another
    grid) again finds its last bands."""
    op = reductions.BY_NAME["reduction[max,cols]"]
    rng = np.random.default_rng(9)
    for shape in [(70, 136), (5, 8), (70, 136), (66, 4)]:
        x = rng.uniform(-1.0, 2.0, shape).astype(np.float32)
        out = to_device(np.zeros(shape[1], np.float32))
        op["column_vectors"](to_device(x), out)
        np.testing.assert_array_equal(out.copy_to_host(), x.max(axis=0))
        strips = -(-shape[1] // reductions.STRIP_COLS)
        counters = scratch("reductions.reduction[max,cols].bands_done", strips, np.int32, zeroed=True)
        assert not counters.copy_to_host().any()


@pytest.mark.gpu
@pytest.mark.parametrize("name", [op.name for op in COLUMNS])
def test_a_misaligned_matrix_takes_the_row_bands_kernels_on_the_gpu(name):
    op = reductions.BY_NAME[name]
    x = np.random.default_rng(2).uniform(-1.0, 2.0, 1000 * 132 + 1).astype(np.float32)
    out = to_device(np.zeros(132, np.float32))
    op["column_vectors"](to_device(x)[1:].reshape(1000, 132), out)  # 4 bytes past a 16-byte boundary
    np.testing.assert_allclose(out.copy_to_host(), op.reference(x[1:].reshape(1000, 132)), rtol=1e-5)
