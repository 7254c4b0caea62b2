"""The GEMM ladders (gemm, gemm[bias_gelu], gemm[batched]): every stage correct in the simulator at
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


# -- warp_tiles: its own 16-byte path, the cp.async ring, the block order, the fallback ---------------

@pytest.mark.parametrize("size", [(20, 12, 64),  # one block; 4 K-steps of 16 go round the ring of 3
                                  pytest.param((132, 260, 8), marks=pytest.mark.slow)])  # 2x2 blocks; K < WBK
def test_warp_tiles_exact_on_its_own_path(size, monkeypatch):
    """K and N multiples of 4, so the stage's own kernel runs (the fallbacks are removed: taking one
    would fail), every dimension different and none a multiple of the 128x256x16 tile."""
    monkeypatch.setattr(gemm, "vectorized", None)
    monkeypatch.setattr(gemm, "async_copy", None)
    A, B, C, ab = gemm._inputs(size, np.random.default_rng(7))
    poisoned = C.copy()
    poisoned[::3, ::2] = np.nan  # with beta = 0, C is not read
    for c, alpha, beta in ((C, float(ab[0]), float(ab[1])), (poisoned, 1.5, 0.0)):
        out, ref = _run_gemm(gemm.op["warp_tiles"], A, B, c, alpha, beta)
        assert np.isfinite(out).all()
        result = compare("warp_tiles", size, out, ref, gemm._tolerance(size, np.float32))
        assert result.passed, f"alpha={alpha} beta={beta}: {result.message}"


@pytest.mark.parametrize("setting", [{"FMA_ORDER": "0"}, {"FMA_ORDER": "1"}, {"FMA_ORDER": "2"},
                                     {"FMA_ORDER": "1", "WBK": "32"}, {"WBK": "32"}, {"WSTAGES": "4"}],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_warp_tiles_settings_a_sweep_may_try(setting):
    """The multiply-add orders, the K-step and the ring's depth the GPU sweep may try, applied as
    `workbench sweep` applies them (the module executed afresh
    with the setting): exact on the stage's own kernel at a size whose K is 2.5 K-steps of 16 (1.25 of
    32), with rows in both warp rows of the block tile and some of its rows empty."""
    from workbench.sweep import stage_with

    module = sys.modules["solutions.gemm"]
    try:
        stage = stage_with("gemm.warp_tiles", setting)
        fresh = sys.modules["solutions.gemm"]
        fresh.vectorized = fresh.async_copy = None  # taking a fallback would fail
        A, B, C, ab = gemm._inputs((70, 12, 40), np.random.default_rng(9))
        out, ref = _run_gemm(stage, A, B, C, float(ab[0]), float(ab[1]))
        result = compare("warp_tiles", (70, 12, 40), out, ref, gemm._tolerance((70, 12, 40), np.float32))
        assert result.passed, result.message
    finally:
        sys.modules["solutions.gemm"] = module


@pytest.mark.parametrize("size", [(9, 13, 11), (8, 6, 12), (8, 12, 6)])  # K and N odd; N % 4; K % 4
def test_warp_tiles_takes_stage_7_where_rows_are_not_16_byte_aligned(size, monkeypatch):
    """cp.async's 16-byte chunks need 16-byte aligned rows: otherwise the launcher hands the product
    to stage 7 (stage 6 in the simulator, which cannot link stage 7's CUDA C++), and the result is exact."""
    name = "vectorized" if device.is_simulator() else "async_copy"
    fallback = getattr(gemm, name)
    calls = []

    class Spy:
        def launch(self, *args):
            calls.append(name)
            fallback.launch(*args)

    monkeypatch.setattr(gemm, name, Spy())
    A, B, C, ab = gemm._inputs(size, np.random.default_rng(11))
    out, ref = _run_gemm(gemm.op["warp_tiles"], A, B, C, float(ab[0]), float(ab[1]))
    assert calls == [name]
    result = compare("warp_tiles", size, out, ref, gemm._tolerance(size, np.float32))
    assert result.passed, result.message


from numba import cuda as _cuda  # noqa: E402  (module level: the simulator swaps in its own cuda for the kernel)


@_cuda.jit
def _block_tiles(tiles):
    """Which block tile (row, column) each block of the launch gets from warp_tiles' _grouped_block."""
    row0, col0 = gemm._grouped_block()
    tiles[_cuda.blockIdx.y, _cuda.blockIdx.x, 0] = row0 // gemm.WBM
    tiles[_cuda.blockIdx.y, _cuda.blockIdx.x, 1] = col0 // gemm.WBN


@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (3, 10), (16, 32), (7, 17)])
def test_warp_tiles_block_order_covers_every_tile_once(grid):
    """_grouped_block hands out the block tiles L2_GROUP block rows at a time, column by column: every
    tile exactly once, and the first blocks of a full group walk down its rows in one column."""
    gx, gy = grid
    d_tiles = _cuda.to_device(np.full((gy, gx, 2), -1, np.int64))
    _block_tiles[grid, 1](d_tiles)
    tiles = d_tiles.copy_to_host()
    assert sorted(map(tuple, tiles.reshape(-1, 2))) == [(r, c) for r in range(gy) for c in range(gx)]
    if gy >= gemm.L2_GROUP:
        first = tiles.reshape(-1, 2)[:gemm.L2_GROUP]  # blocks 0 .. L2_GROUP - 1, in launch order
        assert [tuple(t) for t in first] == [(r, 0) for r in range(gemm.L2_GROUP)]


# -- the tensor-core stages' index math (they link CUDA C++: no simulator run) ----------------------

def test_fragment_place_covers_the_block_tile_once():
    """Every epilogue of the tensor-core stages stores acc[i, j, e] of thread t at _fragment_place:
    the 256 threads' 64 accumulators must cover the 128x128 block tile exactly once, each where the
    PTX ISA's m16n8 accumulator layout (_ptx.mma_c_element) puts it within the warp's 64x32 tile."""
    from solutions._ptx import mma_c_element

    hits = np.zeros((gemm.TBM, gemm.TBN), int)
    for t in range(gemm.THREADS):
        warp, lane = divmod(t, 32)
        for i in range(4):
            for j in range(4):
                for e in range(4):
                    r, c = gemm._fragment_place.py_func(t, i, j, e)
                    hits[r, c] += 1
                    row, col = mma_c_element(lane, e)
                    assert (r, c) == ((warp // 4) * 64 + 16 * i + row, (warp % 4) * 32 + 8 * j + col)
    assert (hits == 1).all()


SLOTS = gemm.BLOCKS_PER_SM * 132  # an H100/H200


@pytest.mark.parametrize("M", [1, 17, 128, 129, 512, 1000, 1024, 2048, 4097])
@pytest.mark.parametrize("N", [1, 33, 128, 512, 1024, 4096])
@pytest.mark.parametrize("K", [1, 3, 15, 16, 19, 64, 65, 333, 512, 1000, 1024, 8191])
def test_split_k_slices_cover_k_once(M, N, K):
    """The split-K stage's plan and its kernel's slice bounds (_split_steps): each slice non-empty,
    the slices' K ranges disjoint and covering 0..K, no more blocks than the GPU holds at once
    (unless unsplit), and the tiles alone left unsplit once they fill the GPU."""
    splits, per_split = gemm._split_k_plan(M, N, K, SLOTS)
    tiles = -(-M // gemm.TBM) * -(-N // gemm.TBN)
    steps = -(-K // gemm.TBK)
    assert 1 <= splits <= gemm.SPLIT_K_MAX
    assert splits == 1 or tiles * splits <= SLOTS
    if 2 * tiles > SLOTS:
        assert splits == 1
    covered = []
    for z in range(splits):
        first, end = gemm._split_steps.py_func(z, per_split, K)
        assert first < end, f"slice {z} of {splits} is empty"
        covered += range(first * gemm.TBK, min(end * gemm.TBK, K))
    assert covered == list(range(K))
    if splits == 1:
        assert per_split == steps


@pytest.mark.parametrize("size, plan", [((512, 512, 512), (8, 4)), ((1024, 1024, 1024), (4, 16)),
                                        ((2048, 2048, 2048), (1, 128)), ((4096, 4096, 4096), (1, 256))])
def test_split_k_plan_at_the_bench_sizes(size, plan):
    """What the stage's paragraph promises: 512^3 in 8 slices, 1024^3 in 4, stage 10 unchanged from 2048^3."""
    assert gemm._split_k_plan(*size, SLOTS) == plan


@pytest.mark.parametrize("size, beta", [((9, 13, 70), 0.0), ((9, 13, 70), -0.75), ((130, 3, 33), 1.5)])
def test_split_k_sums_match_the_reference(size, beta):
    """The split-K stage's partial products (computed here in NumPy over the slices _split_steps gives,
    at sizes with a ragged K) summed by its _sum_splits kernel in the simulator: alpha and beta
    applied once, C not read when beta = 0 (it holds NaN there)."""
    from numba import cuda

    M, N, K = size
    rng = np.random.default_rng(7)
    A, B, C, ab = gemm._inputs(size, rng)
    ab[1] = beta
    if beta == 0.0:
        C[::2] = np.nan
    splits, per_split = gemm._split_k_plan(M, N, K, SLOTS)
    assert splits > 1  # these sizes must take the split path
    partial = np.empty((splits, M, N), np.float32)
    for z in range(splits):
        first, end = gemm._split_steps.py_func(z, per_split, K)
        k = slice(first * gemm.TBK, min(end * gemm.TBK, K))
        partial[z] = A[:, k] @ B[k, :]
    d_out = cuda.device_array((M, N), np.float32)
    threads = gemm.SUM_THREADS
    gemm._sum_splits[-(-M * N // threads), threads](cuda.to_device(partial), cuda.to_device(C),
                                                    cuda.to_device(ab), d_out)
    out = d_out.copy_to_host()
    assert np.isfinite(out).all()
    result = compare("split_k", size, out, gemm._reference(A, B, C, ab), gemm._tolerance(size, np.float32))
    assert result.passed, result.message


def test_tensor_core_stages_say_why_they_are_skipped():
    stages = [gemm.op["tensor_core"], gemm.op["tensor_core_deep"], gemm.op["split_k"],
              gemm.bias_gelu_op["tensor_core_fused"], gemm.batched_op["tensor_core_batch"]]
    for stage in stages:
        assert stage.gpu_only and "link=" in stage.gpu_only
        assert stage.tolerance == 2e-3  # TF32's (see gemm's tensor_core stage)


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


_SUM_SPLITS_SCRIPT = """
import re
import workbench
from numba import cuda, float32, types
from solutions import gemm
a3, a2, a1 = types.Array(float32, 3, "C"), types.Array(float32, 2, "C"), types.Array(float32, 1, "C")
ptx, _ = cuda.compile_ptx(gemm._sum_splits.py_func, (a3, a2, a1, a2), cc=(9, 0))
print(len(re.findall(r"\\.f64\\b", ptx)), len(re.findall(r"ld\\.global", ptx)))
"""


@pytest.mark.slow  # NVVM: seconds
def test_split_k_sum_kernel_compiles_for_sm90():
    """`workbench ptx gemm` compiles the kernels a launcher launches in the simulator, and there the
    split-K stage stops at its first kernel (it links CUDA C++): its second, _sum_splits, is compiled here."""
    import os

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _SUM_SPLITS_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    f64, loads = map(int, run.stdout.split()[-2:])
    assert f64 == 0 and loads >= 3, f".f64 instructions: {f64}, global loads: {loads}"


# -- on a GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.timing
def test_headline_targets():
    """At 4096^3, in one run: each stage up to tensor_core_deep faster than the one before; the best
    CUDA-core stage at >= 70% of cuBLAS fp32 (torch.addmm, TF32 off) and the tensor-core stage at >=
    1.2x it. split_k launches tensor_core_deep's kernel unchanged at 4096^3 (the tiles fill the GPU):
    there it is held to within 2% of it, not to a margin two runs of one kernel cannot show."""
    from tests.headline import assert_each_stage_faster, headline

    _, stages, peer = headline(gemm.op)
    assert [r["stage"] for r in stages][-2:] == ["tensor_core_deep", "split_k"]
    assert_each_stage_faster(stages[:-1])
    us = {r["stage"]: r["median_us"] for r in stages}
    assert us["split_k"] <= 1.02 * us["tensor_core_deep"], us
    if peer is not None:
        by_name = {r["stage"]: r["gflops"] for r in stages}
        tensor_core_stages = {"tensor_core", "tensor_core_deep", "split_k"}  # the TF32 stages: not CUDA cores
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



def _bench(op, stages, size, with_peer=True):
    from workbench.bench import bench_size
    from workbench.results import environment

    records, failures = bench_size(op, stages, size, {}, np.random.default_rng(0), environment(), with_peer=with_peer)
    assert not failures, failures
    peer = [r for r in records if r["kind"] == "peer"]
    return {r["stage"]: r for r in records if r["kind"] == "stage"}, (peer[0] if peer else None)


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("n", [512, 1024])
def test_small_products_reach_cublas(n):
    """The issue's target for small problems: GEMM at 512^3 and 1024^3 >= 0.8x cuBLAS fp32 (torch.addmm,
    TF32 off), with the last stage (split_k). Recorded before it: tensor_core_deep 49.0 against 18.7 µs
    at 512^3 (16 blocks for 132 SMs), 71.7 against 68.1 at 1024^3."""
    stages, peer = _bench(gemm.op, [gemm.op.stages[-1]], (n, n, n))
    if peer is None:
        pytest.skip("no torch: no cuBLAS to compare with")
    last = stages[gemm.op.stages[-1].name]
    assert last["gflops"] >= 0.8 * peer["gflops"], (last["median_us"], peer["median_us"])


@pytest.mark.gpu
@pytest.mark.timing
def test_fused_epilogue_costs_at_most_5_percent_on_tensor_cores():
    """The issue's target for the epilogue: the fused tensor-core stage at the 4096^3 headline takes at
    most 5% longer than the plain tensor-core GEMM it is built on (gemm's tensor_core_deep, alpha = 1,
    beta = 0), timed here on the same A and B."""
    from numba import cuda

    from workbench.timing import measure
    from tests.headline import headline

    op = gemm.bias_gelu_op
    _, stages, _ = headline(op)
    fused_us = {r["stage"]: r["median_us"] for r in stages}["tensor_core_fused"]
    M, N, K = op.headline_size
    A, B, _ = op.make_inputs(op.headline_size, np.random.default_rng(0))
    args = (cuda.to_device(A), cuda.to_device(B), cuda.device_array((M, N), np.float32),
            cuda.to_device(np.array([1.0, 0.0], np.float32)), cuda.device_array((M, N), np.float32))
    plain_us = measure(gemm.op["tensor_core_deep"], [args]).median_us
    assert fused_us <= 1.05 * plain_us, (fused_us, plain_us)


@pytest.mark.gpu
@pytest.mark.timing
def test_batched_tensor_cores_match_bmm():
    """The issue's target for batched GEMM: the last stage no slower than torch.bmm (TF32 off) at
    4096 x (128x128x64), where the CUDA-core one_launch took 471.7 against bmm's 289.8 µs (measured on an
    H200 while the stage was written: 275.4 against 287.1-287.3 µs, twice). At the 1024-matrix headline
    it measured 79.6-79.7 against 77.1-77.4: there the issue sets no target, and none is asserted."""
    op = gemm.batched_op
    last = op.stages[-1]
    stages, peer = _bench(op, [last], (4096, 128, 128, 64))
    if peer is None:
        pytest.skip("no torch: no torch.bmm to compare with")
    assert stages[last.name]["median_us"] <= peer["median_us"], (stages[last.name]["median_us"], peer["median_us"])
