"""SpMV ladder: the generated matrices are valid CSR with the promised shape (power-law rows up to 10^5,
empty rows in the adversarial sets); bad input refused. `-m gpu`: the issue's targets against cuSPARSE
at >= 10^7 non-zeros."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda

from solutions import spmv
from workbench.ladder import InputError, scratch

op = spmv.op


def assert_valid_csr(row_ptr, col_idx, values, x, rows):
    assert row_ptr.dtype == col_idx.dtype == np.int32 and values.dtype == x.dtype == np.float32
    assert row_ptr.shape == (rows + 1,) and row_ptr[0] == 0 and row_ptr[-1] == col_idx.size == values.size
    lengths = np.diff(row_ptr)
    assert (lengths >= 0).all()
    row = np.repeat(np.arange(rows), lengths)
    key = row.astype(np.int64) * rows + col_idx
    assert (col_idx >= 0).all() and (col_idx < rows).all()
    assert (np.diff(key) > 0).all(), "columns must be distinct and ascending within each row"


@pytest.mark.parametrize("size", [(97, 5, spmv.UNIFORM), (97, 8, spmv.BANDED), (500, 6, spmv.POWER_LAW),
                                  (3, 7, spmv.POWER_LAW), (1, 1, spmv.UNIFORM)])
def test_inputs_are_valid_csr_of_the_promised_shape(size):
    rng = np.random.default_rng(0)
    inputs = op.make_inputs(size, rng)
    assert_valid_csr(*inputs, size[0])
    lengths = np.diff(inputs[0])
    assert lengths.sum() == spmv.nnz_of(size) and op.bytes_moved(size) == 12 * lengths.sum() + 8 * size[0] + 4
    assert sorted(lengths) == sorted(spmv.row_lengths(size))
    for label, adversarial in op.adversarial_inputs(size, rng):
        assert_valid_csr(*adversarial, size[0])
        if label == "all-empty":
            assert adversarial[1].size == 0


def test_power_law_rows():
    lengths = spmv.row_lengths((2**18, 16, spmv.POWER_LAW))
    assert lengths.sum() == 16 * 2**18 and lengths.max() == spmv.LONGEST_ROW
    assert np.median(lengths) < 16 < lengths.mean() + 1e-9  # most rows short, a few very long
    banded = spmv.row_lengths((100, 7, spmv.BANDED))
    assert banded[0] == 4 and banded[50] == 7 and banded[-1] == 4


def test_must_show_sizes_have_ten_million_non_zeros():
    for size in [op.headline_size, (2**20, 16, spmv.UNIFORM)]:
        assert spmv.nnz_of(size) >= 10**7, size
        assert size in [tuple(s) for s in op.bench_sizes]


def test_bad_input_is_refused():
    row_ptr = cuda.to_device(np.array([0, 1, 1, 3], np.int32))
    col_idx = cuda.to_device(np.array([2, 0, 1], np.int32))
    values = cuda.to_device(np.ones(3, np.float32))
    x = cuda.to_device(np.ones(3, np.float32))
    stage = op["merge_path"]
    with pytest.raises(InputError, match="shape"):
        stage(row_ptr, col_idx, values, x, cuda.device_array(4, np.float32))
    with pytest.raises(InputError, match="int32"):
        stage(cuda.to_device(np.array([0, 1, 1, 3], np.int64)), col_idx, values, x, cuda.device_array(3, np.float32))
    with pytest.raises(InputError, match="values must have shape"):
        stage(row_ptr, col_idx, cuda.to_device(np.ones(2, np.float32)), x, cuda.device_array(3, np.float32))
    with pytest.raises(InputError, match="host"):
        stage(row_ptr, col_idx, np.ones(3, np.float32), x, cuda.device_array(3, np.float32))
    with pytest.raises(InputError, match="pattern"):
        spmv.row_lengths((10, 2, 4))


@pytest.mark.parametrize("stage", [s.name for s in op.stages])
def test_hand_made_matrix(stage):
    """3 x 3 with an empty middle row: [[0, 0, 2], [0, 0, 0], [-1, 3, 0]] @ [1, 2, 3] = [6, 0, 5]."""
    y = cuda.to_device(np.full(3, np.nan, np.float32))
    op[stage](cuda.to_device(np.array([0, 1, 1, 3], np.int32)), cuda.to_device(np.array([2, 0, 1], np.int32)),
              cuda.to_device(np.array([2, -1, 3], np.float32)), cuda.to_device(np.array([1, 2, 3], np.float32)), y)
    assert list(y.copy_to_host()) == [6.0, 0.0, 5.0]


@pytest.mark.parametrize("stage", [s.name for s in op.stages])
def test_nan_and_inf_reach_only_their_rows(stage):
    """x = [NaN, inf, 2, 0], column 0 referenced by no row: [[_, 0, _, _], [], [_, _, 3, _], [_, -1, 1, _]] @ x
    = [0 * inf = NaN, 0, 6, -inf]. A lane that multiplies 0 by x[0] makes row 2 NaN."""
    y = cuda.to_device(np.full(4, 7.0, np.float32))
    op[stage](cuda.to_device(np.array([0, 1, 1, 2, 4], np.int32)), cuda.to_device(np.array([1, 2, 1, 2], np.int32)),
              cuda.to_device(np.array([0, 3, -1, 1], np.float32)),
              cuda.to_device(np.array([np.nan, np.inf, 2, 0], np.float32)), y)
    got = y.copy_to_host()
    assert np.isnan(got[0]) and list(got[1:]) == [0.0, 6.0, -np.inf], got


def test_nan_inf_inputs_hold_what_they_promise():
    for size in [(5, 3, spmv.UNIFORM), (40, 12, spmv.POWER_LAW), (1000, 7, spmv.POWER_LAW)]:
        row_ptr, col_idx, values, x = dict(op.adversarial_inputs(size, np.random.default_rng(4)))["nan-inf"]
        assert np.isnan(x[0]) and not (col_idx == 0).any(), "x[0] is NaN and no row references it"
        assert np.isinf(x).sum() >= 2 and np.isinf(x[np.setdiff1d(np.arange(size[0]), col_idx)]).any()
        with np.errstate(invalid="ignore"):  # 0 * inf: the NaN is the point
            products = values.astype(np.float64) * x.astype(np.float64)[col_idx]
            ref = op.reference(row_ptr, col_idx, values, x)
        # A stored 0 times inf and a stored inf times 0 (a matrix of 5 rows may reference too few columns for both).
        zero_times_inf = ((values == 0) & np.isinf(x[col_idx])) | (np.isinf(values) & (x[col_idx] == 0))
        assert zero_times_inf.sum() >= (2 if size[0] >= 40 else 1) and np.isnan(products[zero_times_inf]).all()
        assert np.isnan(ref).any() and np.isinf(ref).any() and np.isfinite(ref).mean() > (0.5 if size[0] >= 40 else 0)
        assert (np.diff(row_ptr) == 0).any(), "some rows are empty"


# -- on a GPU -----------------------------------------------------------------------------------

def _last_stage_and_peer(size):
    from workbench.bench import bench_size
    from workbench.results import environment

    records, failures = bench_size(op, [op.stages[-1]], size, {}, np.random.default_rng(2), environment())
    assert not failures, failures
    stage = [r for r in records if r["kind"] == "stage"][0]
    peer = [r for r in records if r["kind"] == "peer"]
    assert peer, "cuSPARSE (torch.mv on a sparse CSR tensor) did not run"
    return stage, peer[0]


@pytest.mark.gpu
@pytest.mark.timing
def test_power_law_target():
    """2^20 rows, 16.8M non-zeros, rows up to 10^5 entries: the last stage at least as fast as cuSPARSE."""
    stage, peer = _last_stage_and_peer(op.headline_size)
    assert stage["median_us"] <= peer["median_us"], (stage["median_us"], peer["median_us"])


@pytest.mark.gpu
@pytest.mark.timing
def test_uniform_target():
    """2^20 rows of 16 entries (16.8M non-zeros): the last stage at >= 0.9x cuSPARSE's speed."""
    stage, peer = _last_stage_and_peer((2**20, 16, spmv.UNIFORM))
    assert stage["median_us"] <= peer["median_us"] / 0.9, (stage["median_us"], peer["median_us"])


@pytest.mark.parametrize("label", ["random", "one-dense-row", "empty-rows"])
def test_chunked_carries_between_warps(label):
    """merge_path_chunked with one tile a warp: a 40-row matrix (520 merge-path steps) spreads over three
    warps, so the carries between tiles of a warp and between warps are both exercised in the simulator."""
    size = (40, 12, spmv.POWER_LAW)
    rng = np.random.default_rng(3)
    inputs = op.make_inputs(size, rng) if label == "random" else dict(op.adversarial_inputs(size, rng))[label]
    for tiles_per_warp in (1, 2):
        y = cuda.to_device(np.full(size[0], np.nan, np.float32))
        spmv.merge_path_in_chunks(*(cuda.to_device(a) for a in inputs), y, tiles_per_warp)
        ref = op.reference(*inputs)
        np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-5, atol=1e-5)


# The stages that split the non-zeros evenly, each with a launcher that takes the block's thread count.
SPLIT_LAUNCHERS = {"nonzero_split": spmv.nonzero_split_with, "shared_row_map": spmv.shared_row_map_with}


def run_split(stage, inputs, y, threads):
    """The stage's launcher on host inputs, its carry buffers first filled with row 0 and 1000: wrong
    wherever a block leaves its carry's row or value unwritten (the buffers are reused between calls, so
    what an earlier call left there could otherwise pass for it)."""
    nnz = inputs[2].size
    blocks = max(1, -(-nnz // (threads * 8)))  # 8 non-zeros a thread in both stages
    scratch(f"spmv.{stage}.carry_rows", blocks, np.int32).copy_to_device(np.zeros(blocks, np.int32))
    scratch(f"spmv.{stage}.carry_values", blocks, np.float32).copy_to_device(np.full(blocks, 1e3, np.float32))
    SPLIT_LAUNCHERS[stage](*(cuda.to_device(a) for a in inputs), y, threads)


@pytest.mark.parametrize("stage", SPLIT_LAUNCHERS)
@pytest.mark.parametrize("label", ["random", "one-dense-row", "empty-rows", "all-empty", "nan-inf"])
@pytest.mark.parametrize("size", [(133, 6, spmv.POWER_LAW), (61, 7, spmv.UNIFORM), (45, 5, spmv.BANDED)])
def test_nonzero_split_carries_between_blocks(label, size, stage):
    """nonzero_split and shared_row_map with blocks of one and two warps: a matrix of a few hundred
    non-zeros spreads over several blocks (256 or 512 non-zeros each), so the carries between threads,
    warps and blocks, and a block whose rows are all empty or all one row, are exercised in the simulator.
    nnz is no multiple of 4 or 8 here (the matrix's last, partial group of four)."""
    rng = np.random.default_rng(5)
    inputs = op.make_inputs(size, rng) if label == "random" else dict(op.adversarial_inputs(size, rng))[label]
    ref = op.reference(*inputs)
    for threads in (32, 64):
        y = cuda.to_device(np.full(size[0], 7.0, np.float32))
        run_split(stage, inputs, y, threads)
        np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stage", SPLIT_LAUNCHERS)
def test_nonzero_split_leading_and_trailing_empty_rows(stage):
    """Rows that end at 0 (before any non-zero: block 0's first thread finishes them) and rows after the
    last non-zero, with a row cut between the two blocks of 32 threads (256 non-zeros each)."""
    lengths = np.array([0, 0, 0, 250, 0, 10, 3, 0, 0, 260, 0, 0], np.int64)
    rng = np.random.default_rng(6)
    row_ptr, col = spmv.csr_from_lengths(lengths, 300, rng)
    values = rng.uniform(-1, 1, col.size).astype(np.float32)
    x = rng.uniform(-1, 1, 300).astype(np.float32)
    ref = op.reference(row_ptr, col, values, x)
    y = cuda.to_device(np.full(lengths.size, 7.0, np.float32))
    run_split(stage, (row_ptr, col, values, x), y, 32)
    np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stage", SPLIT_LAUNCHERS)
@pytest.mark.parametrize("threads", [32, 64])
def test_split_rows_longer_than_blocks_and_one_row(stage, threads):
    """A row of 700 entries (three blocks of 32 threads: a block with no row ending in it, whose carry
    goes on to a row that started two blocks back), a row ending exactly at a block's last non-zero
    (256), then a 1-row matrix of 300 entries and a 1-row, 1-entry matrix."""
    rng = np.random.default_rng(7)
    for lengths in ([3, 253, 700, 0, 0, 5], [300], [1]):
        lengths = np.array(lengths, np.int64)
        cols = max(int(lengths.max()), 8)
        row_ptr, col = spmv.csr_from_lengths(lengths, cols, rng)
        values = rng.uniform(-1, 1, col.size).astype(np.float32)
        x = rng.uniform(-1, 1, cols).astype(np.float32)
        ref = op.reference(row_ptr, col, values, x)
        y = cuda.to_device(np.full(lengths.size, 7.0, np.float32))
        run_split(stage, (row_ptr, col, values, x), y, threads)
        np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stage", SPLIT_LAUNCHERS)
@pytest.mark.parametrize("seed", range(4))
def test_nonzero_split_runs_of_empty_rows(seed, stage):
    """Mostly empty rows in runs of up to 40, between rows of 1 to 20 entries: a thread's eight non-zeros
    cross runs (the jump past them), and whole blocks of 32 threads may own nothing but a run's end."""
    rng = np.random.default_rng(seed)
    rows = 400
    lengths = np.where(rng.random(rows) < 0.25, rng.integers(1, 21, rows), 0)
    lengths[rng.integers(0, rows - 40, 3)[:, None] + np.arange(40)] = 0  # three long runs
    row_ptr, col = spmv.csr_from_lengths(lengths.astype(np.int64), rows, rng)
    values = rng.uniform(-1, 1, col.size).astype(np.float32)
    x = rng.uniform(-1, 1, rows).astype(np.float32)
    ref = op.reference(row_ptr, col, values, x)
    for threads in (32, 64):
        y = cuda.to_device(np.full(rows, 7.0, np.float32))
        run_split(stage, (row_ptr, col, values, x), y, threads)
        np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-5, atol=1e-5)
