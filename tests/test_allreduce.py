"""What is specific to the all-reduce ladders (tests/test_ladders.py checks every stage at the operators'
simulator sizes): any number of ranks, sizes not divisible by it, the same bits on every rank, the
barriers, bad input; on a GPU the flag kernels, and on a host with several GPUs the real thing."""

import json

import numpy as np
import pytest

from workbench.check import check_stage
from workbench.ladder import InputError
from solutions import allreduce


RUNNABLE = [s for s in allreduce.op.stages if not s.gpu_only]


def test_slices_partition_the_buffer():
    for ranks in (1, 2, 3, 4, 8):
        for n in (1, 2, 3, 7, 8, 100, 1001):
            pieces = [allreduce.slice_of(n, ranks, r) for r in range(ranks)]
            assert pieces[0][0] == 0 and pieces[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
            assert all(lo <= hi for lo, hi in pieces)


def test_bus_bytes_follow_nccl_tests():
    assert allreduce.busbw_bytes((1, 1000)) == 0
    assert allreduce.busbw_bytes((2, 1000)) == 4000
    assert allreduce.busbw_bytes((8, 1000)) == 7000  # 2 * 7/8 * 4000


@pytest.mark.parametrize("stage", RUNNABLE, ids=lambda s: s.key)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_any_rank_count_and_ragged_sizes(stage, ranks):
    """N = 1..4 emulated ranks, n not a multiple of N (and n < N, where ranks own empty slices)."""
    rng = np.random.default_rng(ranks)
    for n in sorted({2, 3 * ranks + 1}):
        result = check_stage(stage, (ranks, n), rng)
        assert result.passed, result.message


@pytest.mark.slow
@pytest.mark.parametrize("stage", RUNNABLE, ids=lambda s: s.key)
def test_eight_ranks(stage):
    result = check_stage(stage, (8, 8 * 13 + 5), np.random.default_rng(8))
    assert result.passed, result.message


@pytest.mark.parametrize("stage", RUNNABLE, ids=lambda s: s.key)
def test_every_rank_holds_the_same_bits(stage):
    """Ranks add in one order, so their results are identical, not merely close."""
    from numba import cuda

    x = np.random.default_rng(5).standard_normal((3, 50)).astype(np.float32) * np.float32(1e3)
    out = cuda.device_array_like(x)
    stage(cuda.to_device(x), out)
    got = out.copy_to_host()
    assert all(np.array_equal(got[0], got[r]) for r in range(3))


def _two_shot_without_its_barrier(x, out):
    """The two-shot stage with the barrier between reduce-scatter and all-gather left out."""
    group = allreduce.Group.emulated(x, out)
    ranks, n = group.size, group.n
    group.barrier()
    for r in range(ranks):
        lo, hi = allreduce.slice_of(n, ranks, r)
        group.launch(r, allreduce._reduce_scatter, 1, allreduce.THREADS, group.peers(r, group.sends),
                     group.recvs[r], lo, hi)
        group.launch(r, allreduce._all_gather, 1, allreduce.THREADS, group.peers(r, group.recvs), r)
    group.barrier()


def test_a_missing_barrier_is_caught():
    """Emulated ranks run what they were given since the last barrier in one go, highest rank first:
    without the middle barrier, rank 2 copies slices 0 and 1 before ranks 0 and 1 have summed them."""
    stage = allreduce.op["two_shot"]
    result = check_stage(stage, (3, 30), np.random.default_rng(0), launch=_two_shot_without_its_barrier)
    assert result.failed and result.reason == "unwritten", result.message
    assert check_stage(stage, (3, 30), np.random.default_rng(0)).passed


class _GroupWithoutWaits(allreduce.Group):
    """Emulated ranks whose waits for one another do nothing."""

    def wait(self, r, s, mark):
        pass


def test_a_missing_wait_is_caught():
    """The pipelined ring without its waits: the emulated ranks run as far as their waits let them, the
    highest first, so rank 2 adds to partial sums its left neighbour has not made yet."""
    stage = allreduce.op["ring_pipelined"]

    def launch(x, out):
        allreduce.ring_pipelined_allreduce(_GroupWithoutWaits.emulated(x, out))

    result = check_stage(stage, (3, 30), np.random.default_rng(0), launch=launch)
    assert result.failed and result.reason == "unwritten", result.message
    assert check_stage(stage, (3, 30), np.random.default_rng(0)).passed


class _GroupInAnyOrder(allreduce.Group):
    """Emulated ranks that take their turns at a barrier in a random order, not the highest first."""

    rng = np.random.default_rng(0)

    def _next_turn(self, ready):
        return int(self.rng.choice(ready))


@pytest.mark.parametrize("ranks", [3, 4])
def test_the_pipelined_ring_is_right_in_any_order_its_waits_allow(ranks):
    """On GPUs the ranks run in whatever order their waits allow: a rank may run far ahead of its right
    neighbour and overwrite a partial sum there before the neighbour has read it, unless the chain of
    waits forbids it. Random turns try orders the highest-first one does not."""
    stage = allreduce.op["ring_pipelined"]

    def launch(x, out):
        allreduce.ring_pipelined_allreduce(_GroupInAnyOrder.emulated(x, out))

    for seed in range(2):
        result = check_stage(stage, (ranks, 2 * allreduce.RING_PIECES * ranks + 3), np.random.default_rng(seed),
                             launch=launch)
        assert result.passed, result.message


def test_a_wait_before_its_record_is_refused():
    """On GPUs a stream waits for an event as last recorded when the wait is given: a wait given before
    its record would pass on the previous call's. The group refuses it, emulated or not."""
    from numba import cuda

    x = cuda.to_device(np.ones((2, 8), np.float32))
    group = allreduce.Group.emulated(x, cuda.device_array((2, 8), np.float32))
    with pytest.raises(RuntimeError, match="has not recorded"):
        group.wait(1, 0, "reduced")
    group.record(0, "reduced")
    group.wait(1, 0, "reduced")
    group.barrier()
    with pytest.raises(RuntimeError, match="has not recorded"):  # a barrier forgets the marks before it
        group.wait(1, 0, "reduced")


def test_bad_input_gets_one_clear_line():
    from numba import cuda

    x = cuda.to_device(np.ones((2, 8), np.float32))
    with pytest.raises(InputError, match="out of place"):
        allreduce.two_shot(x, x)
    with pytest.raises(InputError, match="shape"):
        allreduce.two_shot(x, cuda.device_array((2, 9), np.float32))
    with pytest.raises(InputError, match="host"):
        allreduce.two_shot(np.ones((2, 8), np.float32), x)


def test_flag_stages_say_why_the_simulator_cannot_run_them():
    for stage in (allreduce.op["flags"], allreduce.op["lamport"], allreduce.fused_op["fused_flags"],
                  allreduce.fused_op["fused_lamport"]):
        assert stage.gpu_only and "one after another" in stage.gpu_only


def _exact_inputs(rng, ranks, n):
    """Multiples of 1/16 (every sum exact in float32), with a -0.0 and a NaN among them."""
    x = (rng.integers(-64, 64, (ranks, n)) / 16).astype(np.float32)
    x[0, 0] = np.float32(-0.0)
    x[-1, n // 2] = np.nan
    return x


def _rank_order_sum(x):
    total = np.zeros(x.shape[1], np.float32)
    for row in x:  # the ranks' order, in float32: the bits every rank must hold
        total = total + row
    return total


def _same_sum(got, want) -> bool:
    """The same bits where the sum is a number (so +0.0 is not -0.0), NaN where it is NaN (a GPU's NaN
    has its own bits)."""
    nan = np.isnan(want)
    return np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_lamport_mailboxes_in_the_simulator():
    """The lamport kernel's protocol on a CPU: ranks launched one after another (the simulator's order)
    with no patience (max_polls = 0). The last rank launched finds every peer's values in its mailboxes
    and holds the exact sum; the first finds its mailboxes empty and says so. A rank that did not empty
    its previous call's mailboxes would, three calls later, find stale values there and add them
    without a word: the first rank's report catches it."""
    from numba import cuda

    ranks, n = 3, 10  # 3 vectors of 4, the last one ragged
    rng = np.random.default_rng(3)
    table = cuda.to_device(np.zeros((ranks, 3, ranks, 12), np.uint32))
    boxes = tuple(table[r] for r in range(ranks))
    for epoch in range(1, 8):
        x = _exact_inputs(rng, ranks, n)
        d_x, out = cuda.to_device(x), cuda.to_device(np.full((ranks, n), np.nan, np.float32))
        statuses = [cuda.to_device(np.zeros(1, np.int32)) for _ in range(ranks)]
        order = [(epoch + k) % ranks for k in range(ranks)]
        for r in order:
            allreduce._lamport_allreduce[(1, 1), allreduce.THREADS](
                tuple(d_x[s] for s in range(ranks)), tuple(out[s] for s in range(ranks)), boxes, 0, n,
                epoch % 3, (epoch + 2) % 3, r, 0, statuses[r])
        first, last = order[0], order[-1]
        got = out.copy_to_host()[last]
        assert _same_sum(got, _rank_order_sum(x)), (got, _rank_order_sum(x))
        assert statuses[last].copy_to_host()[0] == 0
        assert statuses[first].copy_to_host()[0] != 0, f"call {epoch}: rank {first}, launched first, found values"


def test_fused_lamport_mailboxes_in_the_simulator():
    """The fused kernel's protocol, as above: ranks launched in turn; the last holds h and y of every row
    (a ragged row length: 4-wide vectors past its end), the first says its mailboxes were empty."""
    from numba import cuda

    ranks, rows, cols = 3, 2, 10
    rng = np.random.default_rng(4)
    table = cuda.to_device(np.zeros((ranks, 3, ranks, rows, 12), np.uint32))
    for epoch in range(1, 5):
        partials, residual, weight = allreduce.fused_op.make_inputs((ranks, rows, cols), rng)
        want = allreduce.fused_op.reference(partials, residual, weight)[0]
        d_p, out = cuda.to_device(partials), cuda.to_device(np.full((ranks, 2, rows, cols), np.nan, np.float32))
        d_res, d_w = cuda.to_device(residual), cuda.to_device(weight)
        statuses = [cuda.to_device(np.zeros(1, np.int32)) for _ in range(ranks)]
        order = [(epoch + k) % ranks for k in range(ranks)]
        for r in order:
            allreduce._lamport_reduce_add_norm[(1, 1), allreduce.FUSED_LAMPORT_THREADS](
                tuple(d_p[s] for s in range(ranks)), d_res, d_w, tuple(out[s] for s in range(ranks)),
                tuple(table[s] for s in range(ranks)), 0, rows, epoch % 3, (epoch + 2) % 3, r, 0, statuses[r])
        np.testing.assert_allclose(out.copy_to_host()[order[-1]], want, rtol=1e-5, atol=1e-5)
        assert statuses[order[-1]].copy_to_host()[0] == 0 and statuses[order[0]].copy_to_host()[0] != 0


def test_flag_protocol_in_the_simulator():
    """The flags kernel's protocol on a CPU, as above: ranks launched one after another with no patience
    (max_polls = 0), one block a rank (a second block would run after the first, which waits for it),
    whose slice is a full tile of THREADS * UNROLL and a ragged tail. Each rank pushes its slice into
    every rank's output, so once the last rank has run every rank holds the exact sum in rank order.
    The last rank launched finds every arrival and every rank's flag of this call and waits for nothing;
    the first finds its peers missing and says so. A rank that did not announce its arrival, or its
    finished block, would leave the last one waiting: its report catches it."""
    from numba import cuda

    ranks, blocks = 3, 1
    n = ranks * allreduce.THREADS * allreduce.UNROLL + 7
    rng = np.random.default_rng(6)
    table = cuda.to_device(np.zeros((ranks, ranks + ranks * blocks), np.int32))  # arrivals, then blocks
    flags = tuple(table[r] for r in range(ranks))
    for epoch in range(1, 4):  # flags only grow: each call's epoch is larger than the last
        x = _exact_inputs(rng, ranks, n)
        d_x, out = cuda.to_device(x), cuda.to_device(np.full((ranks, n), np.nan, np.float32))
        statuses = [cuda.to_device(np.zeros(1, np.int32)) for _ in range(ranks)]
        order = [(epoch + k) % ranks for k in range(ranks)]
        for r in order:
            allreduce._flag_allreduce[(blocks, 1), allreduce.THREADS](
                tuple(d_x[s] for s in range(ranks)), tuple(out[s] for s in range(ranks)), flags, r, epoch, 0,
                statuses[r])
        got = out.copy_to_host()
        assert all(_same_sum(got[r], _rank_order_sum(x)) for r in range(ranks))
        assert statuses[order[-1]].copy_to_host()[0] == 0, f"call {epoch}: rank {order[-1]}, launched last, waited"
        assert statuses[order[0]].copy_to_host()[0] != 0, f"call {epoch}: rank {order[0]}, launched first, found its peers"


def test_fused_flag_protocol_in_the_simulator():
    """The fused flags kernel on a CPU, ranks launched one after another with no patience, one block a
    rank, rows not divisible by the ranks and columns not by the four-column step. Each rank pushes
    only h of its rows and makes y of every row itself (another rank's after that rank's block has
    published), by the same code everywhere. So the rank launched last finds every row of h and every
    flag, and must hold h and y of every row; each rank holds its own rows with the same bits as the
    last; a rank launched earlier finds its partners missing."""
    from numba import cuda

    ranks, rows, cols = 3, 7, 4 * allreduce.THREADS + 37
    rng = np.random.default_rng(8)
    partials, residual, weight = allreduce._fused_inputs((ranks, rows, cols), rng)
    want = allreduce._fused_reference(partials, residual, weight)[0]
    chunk = -(-rows // ranks)
    table = cuda.to_device(np.zeros((ranks, ranks + ranks), np.int32))
    flags = tuple(table[r] for r in range(ranks))
    d_partials = tuple(cuda.to_device(p) for p in partials)
    out = cuda.to_device(np.full((ranks, 2, rows, cols), np.nan, np.float32))
    statuses = [cuda.to_device(np.zeros(1, np.int32)) for _ in range(ranks)]
    order = [1, 2, 0]
    for r in order:
        allreduce._flag_reduce_add_norm[(1, 1), allreduce.THREADS](
            d_partials, cuda.to_device(residual), cuda.to_device(weight), tuple(out[s] for s in range(ranks)),
            flags, r, 1, 0, statuses[r])
    got = out.copy_to_host()

    def close(a, b):
        return np.allclose(a, b, rtol=1e-5, atol=1e-5)

    last = got[order[-1]]
    assert close(last, want), "the rank launched last holds every row"
    for r in range(ranks):
        own = slice(r * chunk, min(rows, (r + 1) * chunk))
        assert np.array_equal(got[r][:, own], last[:, own]), f"rank {r}'s own rows, bit for bit as every rank's"
    assert statuses[order[-1]].copy_to_host()[0] == 0, "the rank launched last waited"
    assert statuses[order[0]].copy_to_host()[0] != 0, "the rank launched first found its partners"


def test_mailbox_words_never_look_empty():
    from solutions import _ptx

    values = np.array([-0.0, 0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e-45], np.float32)
    words = _ptx._mailbox_words(values)
    assert np.all(words != 0)
    back = (words ^ np.uint32(0x80000000)).view(np.float32)
    assert np.array_equal(back[1:], values[1:], equal_nan=True) and back[0] == 0 and not np.signbit(back[0])


# -- on a GPU ------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_flag_kernel_on_one_gpu(ranks):
    """All emulated ranks in one grid, synchronised by flags: correct, the same bits everywhere, no
    time-out, and correct again on the next call (the epochs)."""
    from numba import cuda

    rng = np.random.default_rng(ranks)
    for n in (ranks, 1000, 2**20 + 3):
        x = rng.uniform(-1, 1, (ranks, n)).astype(np.float32)
        d_x, out = cuda.to_device(x), cuda.device_array((ranks, n), np.float32)
        for _ in range(3):
            out.copy_to_device(np.full((ranks, n), np.nan, np.float32))
            group = allreduce.Group.emulated(d_x, out)
            allreduce.flag_allreduce(group)
            allreduce.check_flag_status(group, "allreduce.flag")
            got = out.copy_to_host()
            np.testing.assert_allclose(got[0], x.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)
            assert all(np.array_equal(got[0], got[r]) for r in range(ranks))


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_lamport_kernel_on_one_gpu(ranks):
    """All emulated ranks in one grid, pushing into each other's mailboxes: the exact sum in rank order on
    every rank, on calls enough to reuse each set of mailboxes twice, each with fresh inputs (a mailbox not
    emptied would hand a later call stale values), across the 4 MB chunks of a long message."""
    from numba import cuda

    rng = np.random.default_rng(ranks)
    for n in (1, ranks + 2, 1001, allreduce.LAMPORT_CHUNK + 3):
        out = cuda.device_array((ranks, n), np.float32)
        for _ in range(7):
            x = _exact_inputs(rng, ranks, n)
            out.copy_to_device(np.full((ranks, n), np.nan, np.float32))
            group = allreduce.Group.emulated(cuda.to_device(x), out)
            allreduce.lamport_allreduce(group)
            allreduce.check_flag_status(group, "allreduce.lamport")
            got = out.copy_to_host()
            assert _same_sum(got[0], _rank_order_sum(x))
            assert all(np.array_equal(got[0].view(np.uint32), got[r].view(np.uint32)) for r in range(ranks))


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(1, 3, 65), (2, 5, 4096), (3, 4, 777), (4, 600, 8192)])
def test_fused_lamport_on_one_gpu(size):
    """The fused lamport kernel, emulated ranks in one grid: h and y right and the same bits on every rank,
    call after call with fresh inputs (each set of mailboxes reused), across its 16 MB chunks of rows."""
    from numba import cuda

    rng = np.random.default_rng(size[0])
    out = cuda.device_array((size[0], 2) + size[1:], np.float32)
    for _ in range(4):
        partials, residual, weight = allreduce.fused_op.make_inputs(size, rng)
        out.copy_to_device(np.full(out.shape, np.nan, np.float32))
        group = allreduce._emulated_fused_group(cuda.to_device(partials), cuda.to_device(residual),
                                                cuda.to_device(weight), out)
        allreduce.lamport_allreduce_rmsnorm(group)
        allreduce.check_flag_status(group, "allreduce_rmsnorm.lamport")
        got = out.copy_to_host()
        np.testing.assert_allclose(got[0], allreduce.fused_op.reference(partials, residual, weight)[0],
                                   rtol=1e-4, atol=1e-4)
        assert all(np.array_equal(got[0], got[r]) for r in range(size[0]))


def _gpu_count() -> int:
    from numba import cuda

    return len(cuda.gpus) if cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(allreduce.ALGORITHMS))
def test_across_gpus(name):
    """Every algorithm with one rank per GPU (peer pointers, events or flags), at a ragged size."""
    from numba import cuda

    gpus = list(range(_gpu_count()))
    if len(gpus) < 2:
        pytest.skip("needs two GPUs of one host")
    rng = np.random.default_rng(7)
    n = 1_000_003
    x = rng.uniform(-1, 1, (len(gpus), n)).astype(np.float32)
    sends, recvs = [], []
    for r, g in enumerate(gpus):
        with cuda.gpus[g]:
            sends.append(cuda.to_device(x[r]))
            recvs.append(cuda.to_device(np.full(n, np.nan, np.float32)))
    group = allreduce.Group.on_gpus(sends, recvs, gpus)
    for _ in range(2):
        allreduce.ALGORITHMS[name](group)
        if name in allreduce.WAITING:
            allreduce.check_flag_status(group, allreduce.WAITING[name])
        group.synchronize()
    want = x.astype(np.float64).sum(axis=0)
    results = []
    for r, g in enumerate(gpus):
        with cuda.gpus[g]:
            results.append(recvs[r].copy_to_host())
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(results[0], got) for got in results)


def test_readme_table_comes_from_the_recorded_multi_gpu_run(tmp_path, monkeypatch):
    """`workbench bench` runs one GPU: the README's AllReduce figures are those of the run `workbench record`
    makes on several GPUs (workbench/tools/allreduce.py), read from results/runs/ and rendered by
    workbench/tables.py; without that file the table says how to record them."""
    from workbench import registry, results, tables

    ops = registry.load_operators()
    run = results.results_dir() / "runs" / "gpu_allreduce.json"
    if run.exists():
        text = tables.recorded_table(ops["allreduce"])
        assert "| 1 GB |" in text and "NCCL" in text and "`workbench record` on 2 GPUs" in text
        assert "NCCL+torch" in tables.recorded_table(ops["allreduce[rmsnorm]"])
        # The course map's best stage: the fastest at the run's largest message, against NCCL there.
        recorded = json.loads(run.read_text())
        largest = max(recorded["sizes"])
        times = {r["stage"]: r["gpu_us"] for r in recorded["stages"] if r["bytes"] == largest and "gpu_us" in r}
        nccl = next(r["gpu_us"] for r in recorded["nccl"]["allreduce"] if r["bytes"] == largest)
        found = tables.best_against_peer(ops["allreduce"])
        assert found["stage"] == min(times, key=times.get) and found["peer"] == "NCCL"
        assert found["ratio"] == pytest.approx(nccl / min(times.values()))
        assert 0 < found["percent"] <= 105
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    assert "no recorded figures for allreduce" in tables.recorded_table(ops["allreduce"])


def test_the_run_says_in_one_line_what_it_needs(tmp_path):
    """The multi-GPU tool without a GPU, and its --redraw without a recorded run: one line each, exit 2,
    no traceback; --redraw of a recorded run draws both figures there."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from workbench import results

    def run(*args):
        return subprocess.run([sys.executable, "-m", "workbench.tools.allreduce", *args], capture_output=True,
                              text=True, env={**os.environ, "WORKBENCH_MODE": "sim"},
                              cwd=Path(__file__).resolve().parents[1])

    for args, says in ((["--budget", "5", "--out", str(tmp_path)], "this machine has none"),
                       (["--redraw", str(tmp_path / "nothing")], "no recorded run at")):
        done = run(*args)
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    recorded = results.results_dir() / "runs" / "gpu_allreduce.json"
    if recorded.exists():
        shutil.copy(recorded, tmp_path / "gpu_allreduce.json")
        done = run("--redraw", str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert {p.name for p in tmp_path.glob("*.png")} == {"allreduce_sizes.png", "allreduce-rmsnorm_shapes.png"}
