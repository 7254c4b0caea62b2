"""The profiler's counters, counted in the simulator (workbench.simulator.counters, ``workbench counters``).

Every expected figure is derived by hand from the access pattern (written beside it), not read off the
simulator: a warp of 32 float32 lanes on consecutive elements asks for 128 bytes, 4 sectors; lanes a row
apart each want their own sector; shared word w sits in bank w % 32. The last test holds the simulator to
Nsight Compute's counters recorded on a GPU (``workbench profile --counters``), and skips until they are.
"""

import functools
import json
import re
import os
import sys
import textwrap
import time

# Before numba is imported (see tests/test_simulator.py).
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numba
import numpy as np
import pytest
from numba import cuda, float32, int32

from workbench import cli, profiles, registry
from workbench.simulator import install, racecheck
from workbench.simulator import counters as counting

pytestmark = pytest.mark.sim_only
if numba.config.ENABLE_CUDASIM:
    install()

SIZE = (64, 64)  # two 32 x 32 tiles each way: every warp full, rows 256 bytes apart


def stage(key):
    return registry.resolve(key)[1][0]


@functools.lru_cache(maxsize=None)
def counted(key):
    """A transpose stage counted at SIZE, once for the tests that read it."""
    return profiles.simulated(stage(key), SIZE)


def only_kernel(counted):
    assert len(counted.kernels) == 1
    return counted.kernels[0]


def row_of(kernel, space, kind):
    (row,) = [r for r in kernel.memory.values() if r.space == space and r.kind == kind]
    return row


# -- the hardware's rules, one warp at a time ---------------------------------------------------------------


def test_sectors_of_one_warp():
    # 32 consecutive float32: bytes 0-127, sectors 0-3, one line
    assert counting.sectors_and_lines((4 * lane, 4) for lane in range(32)) == (4, 1, 4)
    # the same, 16 bytes off alignment: bytes 16-143 cross into a fifth sector and a second line
    assert counting.sectors_and_lines((16 + 4 * lane, 4) for lane in range(32)) == (5, 2, 4)
    # a column of a 64-wide float32 matrix: 256 bytes apart, a sector (and a line) each, 1 sector would do
    assert counting.sectors_and_lines((256 * lane, 4) for lane in range(32)) == (32, 32, 4)
    # every lane the same word (a broadcast): one sector, and one is the ideal
    assert counting.sectors_and_lines((0, 4) for _ in range(32)) == (1, 1, 1)


def test_wavefronts_of_one_warp():
    # words 0-31: one per bank
    assert counting.wavefronts([(lane, 4 * lane, 4) for lane in range(32)]) == (1, 1)
    # every lane word 0: a broadcast, no conflict
    assert counting.wavefronts([(lane, 0, 4) for lane in range(32)]) == (1, 1)
    # stride 2 words: banks 0, 2, ..., 30, each holding two different words
    assert counting.wavefronts([(lane, 8 * lane, 4) for lane in range(32)]) == (2, 1)
    # a column of a 32 x 32 tile: words 32 * lane, all in bank 0
    assert counting.wavefronts([(lane, 128 * lane, 4) for lane in range(32)]) == (32, 1)
    # 8-byte words, consecutive: two half-warps of 128 bytes, each conflict-free
    assert counting.wavefronts([(lane, 8 * lane, 8) for lane in range(32)]) == (2, 2)
    # 8-byte words 16 bytes apart: each half-warp spans 256 bytes, every bank twice
    assert counting.wavefronts([(lane, 16 * lane, 8) for lane in range(32)]) == (4, 2)
    # 16-byte vectors, consecutive: four quarter-warps of 128 bytes
    assert counting.wavefronts([(lane, 16 * lane, 16) for lane in range(32)]) == (4, 4)


# -- transpose: the coalescing and bank-conflict story ----------------------------------------------------------


def test_transpose_naive_reads_rows_coalesced_and_writes_columns_a_sector_a_lane():
    kernel = only_kernel(counted("transpose.naive"))
    load, store = row_of(kernel, "global", "load"), row_of(kernel, "global", "store")
    # 64 x 64 elements, 32 lanes a warp: 128 warp instructions each way
    assert load.requests == store.requests == 128
    # a warp reads 32 neighbours of a row of x: 128 bytes, 4 sectors
    assert load.sectors_per_request == 4 and load.efficiency == 1
    # and writes them down a column of out, rows 256 bytes apart: 32 sectors for 4 sectors' worth
    assert store.sectors_per_request == 32 and store.ideal_sectors / store.requests == 4
    assert store.efficiency == pytest.approx(4 / 32)
    assert kernel.barriers == 0 and not any(r.space == "shared" for r in kernel.memory.values())


def test_transpose_tiled_moves_the_waste_into_a_32_way_bank_conflict_and_padding_removes_it():
    tiled = only_kernel(counted("transpose.tiled"))
    padded = only_kernel(counted("transpose.padded"))
    for kernel in (tiled, padded):
        # both global sides are whole rows now: 4 sectors a request
        assert row_of(kernel, "global", "load").sectors_per_request == 4
        assert row_of(kernel, "global", "store").sectors_per_request == 4
        # the tile is written by rows (tile[ty, tx], words 32 ty + tx or 33 ty + tx: every bank once)
        assert row_of(kernel, "shared", "store").wavefronts_per_request == 1
        # one barrier per block, 4 blocks of 32 warps
        assert kernel.barriers == 4 and kernel.barrier_warps == 4 * 32
    # read by columns (tile[tx, ty]): word 32 tx + ty is bank ty for every lane, 32 words in one bank
    column = row_of(tiled, "shared", "load")
    assert column.wavefronts_per_request == 32 and column.conflicts == 31 * column.requests
    # padded, word 33 tx + ty is bank (tx + ty) % 32: 32 different banks, one wavefront
    column = row_of(padded, "shared", "load")
    assert column.wavefronts_per_request == 1 and column.conflicts == 0


def test_the_change_from_tiled_to_padded_is_the_column_read():
    before = profiles.simulated_as_dict(counted("transpose.tiled"))
    after = profiles.simulated_as_dict(counted("transpose.padded"))
    (change,) = profiles.counter_changes(before, after)
    assert change.source == "out[out_row, out_col] = tile[tx, ty]" and change.what == "shared load"
    assert (change.before["per_request"], change.after["per_request"]) == (32, 1)
    assert not change.edited  # the line reads the same: the tile's shape changed, above it
    assert change.sentence() == ("`out[out_row, out_col] = tile[tx, ty]` (shared load): 32.0 -> 1.0 wavefronts "
                                 "per request")
    # naive -> tiled: the column store is gone, the tile's loads and stores are new
    naive = profiles.simulated_as_dict(counted("transpose.naive"))
    changes = {(c.source, c.what): c for c in profiles.counter_changes(naive, before)}
    assert changes[("out[col, row] = x[row, col]", "global store")].after is None
    assert changes[("out[out_row, out_col] = tile[tx, ty]", "shared load")].before is None


# -- toy kernels: divergence, barriers, atomics ----------------------------------------------------------------------


@cuda.jit
def _odd_even(out):
    i = cuda.threadIdx.x
    if i % 2 == 0:
        out[i] = 1.0
    else:
        out[i] = 2.0


@cuda.jit
def _by_warp(out):
    i = cuda.threadIdx.x
    if i < 32:
        out[i] = 1.0
    else:
        out[i] = 2.0


def test_a_branch_that_splits_every_warp_is_divergent_and_halves_the_lanes():
    out = np.zeros(64, np.float32)
    with counting.counting() as launches:
        _odd_even[1, 64](out)
    (kernel,) = counting.merge_by_kernel(launches)
    (branch,) = kernel.branches.values()
    assert (branch.executed, branch.divergent) == (2, 2)  # each of the 2 warps splits
    assert kernel.uniform_branch_pct == 0
    # per warp: `i = ...` and `if` on 32 lanes, each store on 16: (32 + 32 + 16 + 16) / 4 instructions
    assert kernel.threads_per_instruction == 24
    # even lanes store every other float32: 16 lanes x 4 bytes over 128 bytes, 4 sectors for 2
    stores = [r for r in kernel.memory.values() if r.kind == "store"]
    assert [(r.requests, r.lanes, r.sectors, r.ideal_sectors) for r in stores] == [(2, 32, 8, 4)] * 2


def test_a_branch_taken_warp_by_warp_is_uniform():
    out = np.zeros(64, np.float32)
    with counting.counting() as launches:
        _by_warp[1, 64](out)
    (kernel,) = counting.merge_by_kernel(launches)
    (branch,) = kernel.branches.values()
    assert (branch.executed, branch.divergent) == (2, 0)
    assert kernel.uniform_branch_pct == 100 and kernel.threads_per_instruction == 32


@cuda.jit
def _block_sum(x, total):
    partial = cuda.shared.array(1, int32)
    if cuda.threadIdx.x == 0:
        partial[0] = 0
    cuda.syncthreads()
    cuda.atomic.add(partial, 0, x[cuda.threadIdx.x])
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(total, 0, partial[0])


def test_barriers_and_atomics_are_counted_per_block_and_per_warp():
    x, total = np.arange(1, 65, dtype=np.int32), np.zeros(1, np.int32)
    with racecheck(False), counting.counting() as launches:  # counting turns the access hooks on itself
        _block_sum[3, 64](x, total)
    assert total[0] == 3 * 64 * 65 // 2
    (kernel,) = counting.merge_by_kernel(launches)
    assert (kernel.barriers, kernel.barrier_warps) == (6, 12)  # 2 barriers in each of 3 blocks of 2 warps
    shared_atomics = kernel.total("shared", "atomic")
    assert (shared_atomics.requests, shared_atomics.lanes) == (6, 192)  # every warp, every lane
    global_atomics = kernel.total("global", "atomic")
    assert (global_atomics.requests, global_atomics.lanes) == (3, 3)  # thread 0 of each block


@counting.vector_access
@cuda.jit(device=True)
def _load_quad(a, i):  # as solutions/_vector_io.py's load4 in the simulator: one ld.v4 on a GPU
    return a[i], a[i + 1], a[i + 2], a[i + 3]


@counting.vector_access
@cuda.jit(device=True)
def _store_quad(a, i, v0, v1, v2, v3):  # store4: one st.v4
    a[i] = v0
    a[i + 1] = v1
    a[i + 2] = v2
    a[i + 3] = v3


@cuda.jit
def _quads(x, out):
    tile = cuda.shared.array(128, float32)
    i = 4 * cuda.threadIdx.x
    v0, v1, v2, v3 = _load_quad(x, i)
    _store_quad(tile, i, v0, v1, v2, v3)
    cuda.syncwarp()
    w0, w1, w2, w3 = _load_quad(tile, i)
    out[cuda.threadIdx.x] = w0 + w1 + w2 + w3


@cuda.jit
def _scalar_quads(x, out):
    i = 4 * cuda.threadIdx.x
    out[cuda.threadIdx.x] = x[i] + x[i + 1] + x[i + 2] + x[i + 3]


def test_a_declared_vector_access_is_one_16_byte_access():
    x, out = np.arange(128, dtype=np.float32), np.zeros(32, np.float32)
    with counting.counting() as launches:
        _quads[1, 32](x, out)
    (kernel,) = counting.merge_by_kernel(launches)
    load = kernel.total("global", "load")
    # one 16-byte load a lane (ld.global.v4, as load4 on a GPU): 512 bytes, 16 sectors, all of them used
    assert (load.requests, load.sectors, load.ideal_sectors) == (1, 16, 16)
    # in shared memory, four quarter-warps of 8 lanes x 16 bytes, each over all 32 banks: 4 wavefronts,
    # where four separate 4-byte reads 16 bytes apart would each take 4 (words 4 l: 8 banks, 4 words each)
    for kind in ("store", "load"):
        shared = kernel.total("shared", kind)
        assert (shared.requests, shared.wavefronts, shared.conflicts) == (1, 4, 0)
    assert counting.wavefronts([(lane, 16 * lane, 4) for lane in range(32)]) == (4, 1)


def test_neighbouring_elements_read_by_plain_code_stay_separate_requests():
    """The compiler issues a vector load only where it can prove the alignment (the H200 ran gemm's
    alpha_beta[0], alpha_beta[1] as two loads): four 4-byte reads 16 bytes apart are four requests."""
    x, out = np.arange(128, dtype=np.float32), np.zeros(32, np.float32)
    with counting.counting() as launches:
        _scalar_quads[1, 32](x, out)
    (kernel,) = counting.merge_by_kernel(launches)
    load = kernel.total("global", "load")
    assert (load.requests, load.sectors) == (4, 64)  # each request: 32 lanes 16 bytes apart, 16 sectors


@cuda.jit
def _streaming_copy(x, out):
    i = cuda.threadIdx.x
    out[i] = cuda.ldcs(x, i)


def test_a_load_with_a_cache_hint_counts_on_the_kernels_line():
    x, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    with counting.counting() as launches:
        _streaming_copy[1, 32](x, out)
    (kernel,) = counting.merge_by_kernel(launches)
    load = kernel.total("global", "load")
    assert (load.requests, load.sectors) == (1, 4)
    (row,) = [r for r in kernel.memory.values() if r.kind == "load"]
    assert row.file == __file__ and row.line == _streaming_copy.py_func.__code__.co_firstlineno + 3


def test_nothing_is_counted_unless_asked():
    assert counting.new_launch(_by_warp, (1, 1, 1), (64, 1, 1)) is None
    with counting.counting() as launches:
        assert counting.new_launch(_by_warp, (1, 1, 1), (64, 1, 1)) is not None
    _by_warp[1, 64](np.zeros(64, np.float32))
    assert launches == [] and sys.gettrace() is None


@pytest.mark.slow  # (8 s)
def test_counting_costs_at_most_a_few_seconds_more_than_checking():
    from workbench.check import check_stage

    padded, size = stage("transpose.padded"), profiles.counter_size(registry.operator("transpose"))

    def cpu_seconds(run):
        """The fewer of two runs' CPU seconds (every thread's: the machine's other jobs inflate wall time
        more; on a machine loaded far past its cores, CPU time too, by the same factor for both)."""
        times = []
        for _ in range(2):
            start = time.process_time()
            assert run().status == "passed"
            times.append(time.process_time() - start)
        return min(times)

    checked = cpu_seconds(lambda: check_stage(padded, size, np.random.default_rng(0)))
    counted = cpu_seconds(lambda: profiles.simulated(padded, size))
    # measured on the 2-core machine: 0.9 s to check, 1.7 s to count (2026-11-29)
    assert counted <= max(checked + 4.0, 3 * checked), f"counting took {counted:.1f} s of CPU, checking {checked:.1f} s"


# -- where it is shown ------------------------------------------------------------------------------------------------


def test_counters_command_prints_the_worst_line_first_and_json(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["counters", "transpose.tiled", "--size", "64x64"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("line: source"):]
    worst = table.splitlines()[2]
    assert re.match(r"\d+: out\[out_row, out_col\]", worst.strip()), worst  # the 32-way conflict first
    assert "shared load" in worst and "32.00" in worst
    assert cli.main(["counters", "transpose.naive", "--size", "64x64", "--json"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    (kernel,) = document["kernels"]
    assert document["check"] == "passed" and document["bytes_model"] == document["unique_global_bytes"] == 8 * 64 * 64
    assert kernel["global_store_sectors_per_request"] == 32 and kernel["global_load_sectors_per_request"] == 4
    assert kernel["lines"][0]["what"] == "global store" and len(kernel["lines"][0]["example"]) == 32


def test_counters_command_refuses_bad_input_in_one_line(capsys):
    assert cli.main(["counters", "no_such_op"]) == 2
    assert "no_such_op" in capsys.readouterr().err
    assert cli.main(["counters", "transpose", "--size", "0x5"]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


@pytest.mark.slow  # (6 s)
def test_notebook_shows_the_table_the_diagram_and_what_the_change_did(capsys):
    from workbench import nb

    padded = stage("transpose.padded")
    nb.simulated_counters(padded, SIZE)
    out = capsys.readouterr().out
    assert "_padded at 64x64, counted in the simulator" in out and "1.00 wavefronts" in out
    # padded wastes nothing at 64x64: no warp is called "most wasteful"; tiled's column read is drawn
    assert "Every access at its ideal" in out and "most wasteful" not in out
    nb.simulated_counters(stage("transpose.tiled"), SIZE)
    assert "<figure: transpose.tiled: one warp of its most wasteful access>" in capsys.readouterr().out
    nb.counter_changes(padded, SIZE)
    out = capsys.readouterr().out
    assert "• `out[out_row, out_col] = tile[tx, ty]` (shared load): 32.0 -> 1.0 wavefronts per request" in out
    assert "<figure: transpose.tiled; transpose.padded>" in out
    nb.counter_changes(stage("transpose.naive"), SIZE)
    assert "the first stage" in capsys.readouterr().out


# -- held to the hardware ------------------------------------------------------------------------------------------

# Where the simulator and Nsight Compute disagree for a reason the simulator does not model, the reason:
# {(OP.STAGE, figure): why}. Filled in from the recorded comparison, never to hide a figure nobody explained.
KNOWN_DIFFERENCES: dict = {}

RECORD_COMMAND = ("python3 -m workbench profile --counters transpose.naive transpose.tiled transpose.padded "
                  "transpose.rows_per_thread transpose.big_tile reduction.naive reduction.coalesced "
                  "reduction.shared_tree reduction.warp_shuffle softmax.naive softmax.coalesced softmax.shared_tree "
                  "gemm.naive gemm.coalesced gemm.shared_tiles histogram.global_atomics histogram.shared_privatized")


def test_fake_ncu_that_lacks_a_metric_still_gives_the_others(tmp_path):
    """`workbench profile --counters` on an ncu that does not know one metric: that one is left out."""
    from workbench.tools import profile

    fake = tmp_path / "ncu"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        args = sys.argv[1:]
        metrics = args[args.index("--metrics") + 1].split(",")
        log = args[args.index("--log-file") + 1]
        if "smsp__inst_executed_op_barrier.sum" in metrics:
            print("==ERROR== Failed to find metric smsp__inst_executed_op_barrier.sum")
            sys.exit(1)
        with open(log, "w") as f:
            f.write(",".join(f'"{{n}}"' for n in ["ID", "Kernel Name"] + metrics) + "\\n")
            f.write(",".join(f'"{{v}}"' for v in ["0", "cudapy::solutions::transpose::_naive(Array)"]
                                                      + ["7"] * len(metrics)) + "\\n")
        """))
    fake.chmod(0o755)
    kernels, why = profile.profile_stage(str(fake), "transpose.naive", (64, 64), counters=True)
    assert why == "" and kernels[0]["kernel"] == "_naive"
    assert kernels[0]["metrics"]["global_load_sectors"] == 7 and "barriers" not in kernels[0]["metrics"]
    assert kernels[0]["metrics"]["instructions"] == 7  # smsp__inst_executed.sum is not the barrier's metric


@pytest.mark.slow  # (19 s)
def test_simulator_counters_agree_with_nsight_compute():
    recorded = profiles.recorded_counters()
    if not recorded:
        pytest.skip("no Nsight Compute counters recorded in results/profiles/counters/ yet: on a GPU, "
                    f"`{RECORD_COMMAND}` records them")
    rows, unexplained = [], []
    for (op_name, stage_name, size), metrics in sorted(recorded.items()):
        counted_stage = stage(f"{op_name}.{stage_name}")
        if counted_stage.gpu_only:
            continue
        for row in profiles.compare_counters(profiles.simulated(counted_stage, size), metrics):
            rows.append(row)
            if not row["agree"] and (row["stage"], row["figure"]) not in KNOWN_DIFFERENCES:
                unexplained.append(f"{row['stage']} @ {size}: {row['figure']} {row['simulator']:.2f} in the "
                                   f"simulator, {row['recorded']:.2f} recorded on {metrics['device']}")
    stages = {row["stage"] for row in rows}
    assert len(stages) >= 12, f"counters compared for {len(stages)} stages, the issue asks for 12: {RECORD_COMMAND}"
    assert not unexplained, "the simulator and the GPU disagree, and no reason is named:\n" + "\n".join(unexplained)


def test_the_comparison_with_recorded_counters_says_which_figures_agree(tmp_path, monkeypatch, capsys):
    """Records written by hand as `workbench profile --counters` writes them (not from a GPU run)."""
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    naive = {"global_load_requests": 128, "global_load_sectors": 512, "global_store_requests": 128,
             "global_store_sectors": 4096 + 300}  # 34.3 sectors a store: 7% more than the simulator's 32
    tiled = {"global_load_requests": 128, "global_load_sectors": 512, "shared_load_requests": 128,
             "shared_load_bank_conflicts": 128 * 31, "shared_store_requests": 128,
             "shared_store_bank_conflicts": 128 * 3, "barriers": None}  # 3 conflicts a store where 0 are due
    profiles.save("NVIDIA H200", [
        {"op": "transpose", "stage": name, "order": order, "size": [64, 64], "kernel": f"_{name}", "launch": 0,
         "metrics": metrics, "stalls": {}, "date": "2026-11-29", "ncu": "test"}
        for name, order, metrics in (("naive", 1, naive), ("tiled", 2, tiled))], counters=True)
    assert profiles.recorded("transpose") == (None, [])  # apart from the profiles at benchmark sizes
    assert cli.main(["counters", "transpose", "--against-recorded"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| transpose")]
    assert rows == [
        "| transpose.naive | 64x64 | global load sectors/request | 4.00 | 4.00 | yes |",
        "| transpose.naive | 64x64 | global store sectors/request | 32.00 | 34.34 | yes |",
        "| transpose.tiled | 64x64 | global load sectors/request | 4.00 | 4.00 | yes |",
        "| transpose.tiled | 64x64 | shared load bank conflicts/request | 31.00 | 31.00 | yes |",
        "| transpose.tiled | 64x64 | shared store bank conflicts/request | 0.00 | 3.00 | no |",
    ]
