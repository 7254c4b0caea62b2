"""Tools of the trade (issue 17): prepared launches, the streams ladder, ``workbench profile`` and
``workbench sanitize``.

Without a GPU: the parsers on sample outputs, the commands' no-GPU behaviour, the plan cache and the
streams ladder in the simulator. The sample outputs below were WRITTEN BY HAND from NVIDIA's documented
formats (Nsight Compute's ``--csv --page raw``, compute-sanitizer's report blocks in the current and the
older form); they are not captured from a run. On a GPU (``-m gpu``): the issue's must-show targets.
"""

from __future__ import annotations

import ctypes
import json
import textwrap

import numpy as np
import pytest

from workbench import cli, prepared, profiles, sanitizer_reports, tables
from workbench.ladder import InputError

# -- Nsight Compute ------------------------------------------------------------------------------------

# Written from the documented `ncu --csv --page raw --print-units base` layout: a header of fixed
# columns and metric names, a row of units, then a row per profiled kernel; ncu's own messages
# (==PROF==) and the program's output interleaved. Not captured from a run.
NCU_SAMPLE = textwrap.dedent('''\
    ==PROF== Connected to process 4242 (/usr/bin/python3.12)
    ==PROF== Profiling "_row_means": 0%....50%....100% - 38 passes
    ==PROF== Profiling "_normalize": 0%....50%....100% - 38 passes
    ran launch_overhead.dispatch @ 4096x1024: correct
    ==PROF== Disconnected from process 4242
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","launch__registers_per_thread","launch__shared_mem_per_block_static","lts__t_sector_hit_rate.pct","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__inst_executed.sum"
    "","","","","","","","","","","","byte","%","ns","register/thread","byte","%","%","ratio","ratio","inst"
    "0","4242","python3.12","127.0.0.1","cudapy::solutions::launch_overhead::_row_means[abi:v1,cw51cXTLSUwv1sCUt9Ww0FEw09RRQPKzLTg4gaGKFsG2oMQGEYakJSQB1PQBk0Bynm21OizTKJFQuB8QgV5LBkpjkLN3FiyGEXIhKI2FgDjUDIbJcOeCLRVAA_3d_3d](Array<float, 2, C, mutable, aligned>, Array<float, 2, C, mutable, aligned>)","1","7","(256, 1, 1)","(512, 1, 1)","0","9.0","16,803,840","61.2","7,520","29","0","3.1","91.5","18.2","0.4","1,056,768"
    "1","4242","python3.12","127.0.0.1","cudapy::solutions::launch_overhead::_normalize[abi:v1,cw51cXTLSUwv1sCUt9Ww0FEw09RRQPKzLTg4gaGKFsG2oMQGEYakJSQB1PQBk0Bynm21OizTKJFQuB8QgV5LBkpjkLN3FiyGEXIhKI2FgDjUDIbJcOeCLRVAA_3d_3d](Array<float, 2, C, mutable, aligned>, Array<float, 2, C, mutable, aligned>, Array<float, 1, C, mutable, aligned>, Array<float, 1, C, mutable, aligned>, Array<float, 2, C, mutable, aligned>)","1","7","(256, 1, 1)","(4, 4096, 1)","0","9.0","16,810,112","83.7","9,184","40","0","12.5","88.0","9.6","0","3,211,264"
    ''')


def test_ncu_csv_is_parsed_into_kernels_with_metrics_and_stalls():
    kernels = profiles.parse_ncu_csv(NCU_SAMPLE)
    assert [k["kernel"] for k in kernels] == ["_row_means", "_normalize"]
    first = kernels[0]["metrics"]
    assert first["duration_ns"] == 7520 and first["registers"] == 29 and first["dram_read_bytes"] == 16803840
    assert first["dram_pct_of_peak"] == pytest.approx(61.2) and first["occupancy_pct"] == pytest.approx(91.5)
    assert kernels[0]["stalls"] == {"long_scoreboard": pytest.approx(18.2), "barrier": pytest.approx(0.4)}
    assert kernels[1]["metrics"]["instructions"] == 3211264


def test_ncu_output_without_csv_gives_no_kernels_and_other_csv_is_refused():
    assert profiles.parse_ncu_csv("==PROF== Connected\n==ERROR== Failed to find metric foo\n") == []
    with pytest.raises(ValueError, match="Kernel Name"):
        profiles.parse_ncu_csv('"a","b"\n"1","2"\n')


def _record(stage, order, ns, dram_pct, occupancy, instructions, stall, kernel="_k", size=(64, 64)):
    return {"op": "toy", "stage": stage, "order": order, "size": list(size), "kernel": kernel, "launch": 0,
            "date": "2026-11-23T00:00:00+00:00", "stalls": {stall: 20.0},
            "metrics": {"duration_ns": ns, "dram_pct_of_peak": dram_pct, "occupancy_pct": occupancy,
                        "instructions": instructions, "registers": 32, "dram_read_bytes": 1000, "dram_write_bytes": 1000}}


TOY = [_record("naive", 1, 100_000, 8.0, 20.0, 9e6, "long_scoreboard"),
       _record("coalesced", 2, 20_000, 60.0, 85.0, 9e6, "long_scoreboard"),
       _record("shared", 3, 19_000, 62.0, 85.0, 8.9e6, "barrier"),
       _record("fused", 4, 10_000, 90.0, 90.0, 3e6, "long_scoreboard")]


def test_the_largest_steps_are_explained_by_the_counters_that_moved():
    sentences = profiles.explain_steps(TOY, largest=2)
    assert len(sentences) == 2
    assert sentences[0].startswith("2. coalesced is 5.00x faster than 1. naive")
    assert "DRAM throughput 8% of peak -> 60% of peak" in sentences[0]
    assert sentences[1].startswith("4. fused is 1.90x faster than 3. shared") and "3.0x fewer instructions" in sentences[1]


def test_a_profiled_peer_is_listed_after_the_stages_and_held_to_the_fastest_stage():
    peer = {**_record("torch.compile", 0, 8_000, 95.0, 60.0, 1e6, "long_scoreboard"), "kind": "peer"}
    records = TOY + [peer]
    rows = profiles.stage_totals(records)
    assert [r["stage"] for r in rows] == ["naive", "coalesced", "shared", "fused", "torch.compile"]
    assert tables.profile_rows(records)[-1][0] == "torch.compile (library)"
    assert profiles.explain_steps(records, largest=2) == profiles.explain_steps(TOY, largest=2)  # not a step
    (sentence,) = profiles.explain_against_peers(records)
    assert sentence.startswith("4. fused is 0.80x slower than torch.compile (library)")
    assert "3.0x more instructions" in sentence and "achieved occupancy 60% -> 90%" in sentence
    assert profiles.explain_against_peers(TOY) == []


def test_a_peer_is_named_by_the_tables_name_or_a_part_naming_one(monkeypatch):
    from workbench import bench, registry
    from workbench.tools import target

    op, _ = registry.resolve("layernorm")
    peers = [("torch F.layer_norm", lambda *a: None), ("torch.compile", lambda *a: None)]
    monkeypatch.setattr(bench, "peer_launches", lambda op, size, with_compile: peers)
    assert target.peer_launcher(op, (4, 8), "TORCH.COMPILE")[0] == "torch.compile"
    assert target.peer_launcher(op, (4, 8), "layer_norm")[0] == "torch F.layer_norm"
    with pytest.raises(SystemExit, match="more than one peer named 'torch'.*'torch F.layer_norm', 'torch.compile'"):
        target.peer_launcher(op, (4, 8), "torch")
    with pytest.raises(SystemExit, match="no peer named 'cudnn'"):
        target.peer_launcher(op, (4, 8), "cudnn")


def test_profile_with_peers_runs_each_peer_of_the_operator_and_records_it_beside_the_stage(tmp_path, monkeypatch,
                                                                                          capsys):
    import types

    from workbench import bench
    from workbench.tools import profile

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(profile, "_device", types.SimpleNamespace(is_simulator=lambda: False))  # ncu's side only
    monkeypatch.setattr(profile, "find_ncu", lambda: "/opt/ncu")
    monkeypatch.setattr(profile, "_ncu_version", lambda ncu: "2025.3")
    monkeypatch.setattr(profile, "environment", lambda: {"device": "NVIDIA H200"})
    monkeypatch.setattr(bench, "peer_launches", lambda op, size, with_compile: [("torch.compile", None)])
    ran = []

    def fake_profile_stage(ncu, target, size, impl=None, counters=False, peer=None):
        ran.append((target, size, peer))
        ns = 8_000 if peer else 10_000
        return [{"kernel": "_k", "metrics": {"duration_ns": ns, "dram_pct_of_peak": 90.0}, "stalls": {}}], ""

    monkeypatch.setattr(profile, "profile_stage", fake_profile_stage)
    assert cli.main(["profile", "layernorm.ilp", "--size", "64x96", "--peers"]) == 0
    assert ran == [("layernorm.ilp", (64, 96), None), ("layernorm", (64, 96), "torch.compile")]
    _, records = profiles.recorded("layernorm")
    assert {(r["stage"], r["order"], r.get("kind")) for r in records} == {("ilp", 7, None), ("torch.compile", 0, "peer")}
    out = capsys.readouterr().out
    assert "torch.compile (library)" in out and "7. ilp is 0.80x slower than torch.compile (library)" in out


def test_profile_without_a_gpu_prints_the_recorded_profile(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")  # the whole table on one line a row
    assert cli.main(["profile", "launch_overhead"]) == 1  # nothing recorded yet
    assert "no recorded profile" in capsys.readouterr().err
    records = [{**r, "op": "launch_overhead", "stage": s, "order": i + 1}
               for i, (r, s) in enumerate(zip(TOY, ["dispatch", "configured", "prepared", "graph"]))]
    path = profiles.save("NVIDIA H200", records)
    assert path == tmp_path / "profiles" / "nvidia-h200.json" and json.loads(path.read_text())["schema"] == 1
    profiles.save("NVIDIA H200", records[:1])  # replaced, not duplicated
    assert len(profiles.recorded("launch_overhead")[1]) == 4
    assert cli.main(["profile", "launch_overhead.configured"]) == 0
    out = capsys.readouterr()
    assert "recorded on NVIDIA H200" in out.err and "configured" in out.out and "dispatch" not in out.out


def test_a_notebook_shows_the_recorded_counters_and_explains_the_largest_steps(tmp_path, monkeypatch, capsys):
    from workbench import nb, registry
    from workbench.generate import notebooks

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    op, _ = registry.resolve("launch_overhead")
    cell = "nb.counters(op)"
    assert not any(cell in "".join(c["source"]) for c in notebooks.build_notebook(registry.chapter_of(op)).cells)  # nothing recorded
    nb.counters(op)
    assert "No counters recorded for launch_overhead" in capsys.readouterr().out
    profiles.save("NVIDIA H200", [{**r, "op": "launch_overhead", "stage": s, "order": i + 1}
                                  for i, (r, s) in enumerate(zip(TOY, ["dispatch", "configured", "prepared", "graph"]))])
    assert any(cell in "".join(c["source"]) for c in notebooks.build_notebook(registry.chapter_of(op)).cells)
    nb.counters(op)
    out = capsys.readouterr().out
    assert "Recorded on a GPU (NVIDIA H200, 2026-11-23)" in out and "4. graph" in out
    assert "• 2. configured is 5.00x faster than 1. dispatch" in out


# -- compute-sanitizer ---------------------------------------------------------------------------------

KERNEL = ("cudapy::learner_missing_bounds_check::_rows[abi:v1,cw51cXTLSUwv1sCUt9Ww0FEw09RRQPKzLTg4gaGKFsG2oMQGEYak]"
          "(Array<float, 2, C, mutable, aligned>, Array<float, 1, C, mutable, aligned>, Array<float, 1, C, mutable, aligned>)")


def _source(tmp_path):
    """A learner's file, so a finding can quote its line."""
    path = tmp_path / "learner.py"
    path.write_text("\n".join(f"# line {i}" for i in range(1, 40)) + "\n")
    lines = path.read_text().splitlines()
    lines[24] = "    y[row] = acc"
    lines[30] = "            partials[t] += partials[t + half]"
    lines[29] = "            partials[t] = partial"
    path.write_text("\n".join(lines) + "\n")
    return path


# The sample reports: written by hand from compute-sanitizer's documented output (not captured).
def memcheck_new(path):
    return textwrap.dedent(f'''\
        ========= COMPUTE-SANITIZER
        ========= Invalid __global__ write of size 4 bytes
        =========     at {KERNEL}+0x3f0 in {path}:25
        =========     by thread (231,0,0) in block (3,0,0)
        =========     Address 0x7f3a1c000fa0 is out of bounds
        =========     and is 1 bytes after the nearest allocation at 0x7f3a1c000000 of size 4000 bytes
        =========     Saved host backtrace up to driver entry point at kernel launch time
        =========         Host Frame: [0x2f5b3f] in libcuda.so.1
        =========         Host Frame: cuLaunchKernel [0x1a2b] in libcuda.so.1
        =========
        ========= Invalid __global__ write of size 4 bytes
        =========     at {KERNEL}+0x3f0 in {path}:25
        =========     by thread (232,0,0) in block (3,0,0)
        =========     Address 0x7f3a1c000fa4 is out of bounds
        =========
        ran matvec.thread_per_row @ 1000x33: WRONG: relative error ...
        ========= ERROR SUMMARY: 25 errors
        ''')


def memcheck_old(path):
    return textwrap.dedent(f'''\
        ========= COMPUTE-SANITIZER
        ========= Invalid __global__ read of size 4 bytes
        =========     at 0x00000150 in {path}:25:{KERNEL}
        =========     by thread (7,0,0) in block (0,0,0)
        =========     Address 0x7f3a1c010000 is out of bounds
        =========
        ========= ERROR SUMMARY: 1 error
        ''')


def racecheck_hazard(path):
    return textwrap.dedent(f'''\
        ========= COMPUTE-SANITIZER
        ========= Error: Potential RAW hazard detected at __shared__ 0x10 in block (2,0,0) :
        =========     Write Thread (4,0,0) at cudapy::learner::_tree[abi:v1,cw51cXTLSUwv1](Array<float, 1, C, mutable, aligned>)+0x2c0 in {path}:30
        =========     Read Thread (0,0,0) at cudapy::learner::_tree[abi:v1,cw51cXTLSUwv1](Array<float, 1, C, mutable, aligned>)+0x310 in {path}:31
        =========     Current Value : 0, Incoming Value : 1065353216
        =========     Saved host backtrace up to driver entry point at kernel launch time
        =========
        ========= Error: Potential RAW hazard detected at __shared__ 0x14 in block (2,0,0) :
        =========     Write Thread (5,0,0) at cudapy::learner::_tree[abi:v1,cw51cXTLSUwv1](Array<float, 1, C, mutable, aligned>)+0x2c0 in {path}:30
        =========     Read Thread (1,0,0) at cudapy::learner::_tree[abi:v1,cw51cXTLSUwv1](Array<float, 1, C, mutable, aligned>)+0x310 in {path}:31
        =========     Current Value : 0, Incoming Value : 1065353216
        =========
        ========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
        ''')


RACECHECK_ANALYSIS = textwrap.dedent('''\
    ========= COMPUTE-SANITIZER
    ========= Error: Race reported between Write access at _tree+0x2c0 in /home/me/tree.py:30
    =========     and Read access at _tree+0x310 in /home/me/tree.py:31 [1020 hazards]
    =========
    ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
    ''')

SYNCCHECK = textwrap.dedent('''\
    ========= COMPUTE-SANITIZER
    ========= Barrier error detected. Divergent thread(s) in block.
    =========     at _bad_barrier+0x90 in /home/me/sync.py:12
    =========     by thread (0,0,0) in block (0,0,0)
    =========
    ========= ERROR SUMMARY: 1 error
    ''')

INITCHECK = textwrap.dedent('''\
    ========= COMPUTE-SANITIZER
    ========= Uninitialized __global__ memory read of size 4 bytes
    =========     at _accumulate+0x70 in /home/me/init.py:8
    =========     by thread (3,0,0) in block (1,0,0)
    =========     Address 0x7f3a1c000010
    =========
    ========= ERROR SUMMARY: 1 error
    ''')


def test_memcheck_out_of_bounds_names_the_line_the_thread_and_the_cause(tmp_path):
    path = _source(tmp_path)
    findings = sanitizer_reports.parse(memcheck_new(path), "memcheck")
    assert len(findings) == 1  # the same write at the same line: folded
    f = findings[0]
    assert (f.kind, f.access, f.kernel, f.line, f.thread, f.block) == ("out-of-bounds", "write", "_rows", 25,
                                                                      (231, 0, 0), (3, 0, 0))
    line = sanitizer_reports.teach(f)
    assert "line 25 of learner.py (`y[row] = acc`)" in line and "thread (231,0,0) of block (3,0,0)" in line
    assert "bounds check" in line
    assert sanitizer_reports.error_count(memcheck_new(path)) == 25
    old = sanitizer_reports.parse(memcheck_old(path), "memcheck")[0]
    assert (old.kind, old.access, old.kernel, old.line, old.thread) == ("out-of-bounds", "read", "_rows", 25, (7, 0, 0))


def test_racecheck_names_both_threads_and_both_lines(tmp_path):
    path = _source(tmp_path)
    findings = sanitizer_reports.parse(racecheck_hazard(path), "racecheck")
    assert len(findings) == 1
    f = findings[0]
    assert (f.kind, f.access, f.kernel, f.line, f.other_line, f.thread, f.other_thread, f.block) == (
        "race", "RAW", "_tree", 30, 31, (4, 0, 0), (0, 0, 0), (2, 0, 0))
    line = sanitizer_reports.teach(f)
    assert "`partials[t] = partial`" in line and "line 31 (`partials[t] += partials[t + half]`)" in line
    assert "syncthreads" in line
    analysis = sanitizer_reports.parse(RACECHECK_ANALYSIS, "racecheck")[0]
    assert (analysis.kind, analysis.access, analysis.line, analysis.other_line) == ("race", "Write", 30, 31)


def test_synccheck_and_initcheck_findings():
    sync = sanitizer_reports.parse(SYNCCHECK, "synccheck")[0]
    assert (sync.kind, sync.line, sync.kernel) == ("barrier", 12, "_bad_barrier")
    assert "inside an `if`" in sanitizer_reports.teach(sync)
    init = sanitizer_reports.parse(INITCHECK, "initcheck")[0]
    assert (init.kind, init.line, init.thread, init.block) == ("uninitialized", 8, (3, 0, 0), (1, 0, 0))
    assert sanitizer_reports.parse("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", "memcheck") == []


def test_sanitize_command_parses_a_saved_log_and_refuses_without_a_gpu(tmp_path, capsys):
    log = tmp_path / "memcheck.log"
    log.write_text(memcheck_new(_source(tmp_path)))
    assert cli.main(["sanitize", "--parse", str(log), "--tool", "memcheck"]) == 1
    assert "line 25 of learner.py" in capsys.readouterr().out
    assert cli.main(["sanitize", "--parse", str(log)]) == 2  # which tool wrote it?
    assert cli.main(["sanitize", "reduction.fused"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


# -- prepared launches ------------------------------------------------------------------------------------

def test_pack_lays_out_arguments_as_cuda_core_passes_them():
    params, holders = prepared.pack([7, True, ctypes.c_float(1.5), ctypes.c_int32(-3), 2.0])
    sizes = [ctypes.sizeof(h) for h in holders]
    assert sizes == [8, 1, 4, 4, 8]
    values = [ctypes.cast(params[i], ctypes.POINTER(type(h))).contents.value for i, h in enumerate(holders)]
    assert values == [7, True, 1.5, -3, 2.0]
    with pytest.raises(prepared.PreparedCallError, match="cannot pack"):
        prepared.pack(["a string"])


def test_kernel_launches_compare_by_what_they_launch():
    a = prepared.KernelLaunch(0, 4, 256, [0, 0, 10, 4, 1234, 10, 4])
    b = prepared.KernelLaunch(0, (4, 1, 1), (256,), [0, 0, 10, 4, 1234, 10, 4])
    c = prepared.KernelLaunch(0, 4, 256, [0, 0, 10, 4, 9999, 10, 4])
    assert a.same_as(b) and not a.same_as(c)
    assert not a.same_as(prepared.KernelLaunch(0, 4, 256, [0, 0, 10, 4, 1234, 10, 4], cluster=2))


def test_a_cluster_launch_carries_its_cluster_shape_as_a_launch_attribute():
    """cuLaunchKernelEx's configuration: the grid in blocks (not clusters), the cluster shape as the
    CLUSTER_DIMENSION attribute, the dynamic shared memory; built without a GPU."""
    from cuda.bindings import driver

    config = prepared.KernelLaunch(0, 132, 384, [], 197696, cluster=2).launch_config()
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (132, 1, 1)
    assert (config.blockDimX, config.sharedMemBytes, config.numAttrs) == (384, 197696, 1)
    attribute = config.attrs[0]
    assert attribute.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z) == (2, 1, 1)


class _Tensor:
    """Stands in for a torch tensor: identity plus a data pointer that in-place ops may change."""

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


def test_plan_cache_is_keyed_by_the_argument_objects():
    cache = prepared.PlanCache(max_plans=2)
    x, y, z = _Tensor(1), _Tensor(2), _Tensor(3)
    made = []
    plan = lambda args: cache.get(args, lambda: made.append(args) or len(made))  # noqa: E731
    assert plan((x, y)) == 1 and plan((x, y)) == 1  # the same objects: the same plan
    assert plan((y, x)) == 2  # other objects (order matters)
    x.ptr = 10  # new storage in place: the old plan would launch on freed memory
    assert plan((x, y)) == 3
    assert plan((x, z)) == 4 and len(cache) == 2  # the oldest plan went
    equal_copy = _Tensor(2)
    assert plan((x, equal_copy)) == 5  # an equal but different object is not the same buffer


def test_prepared_call_in_the_simulator_checks_and_runs_the_stage():
    from numba import cuda

    from solutions import reduction

    call = prepared.PreparedCall(reduction.fused)
    x = np.random.default_rng(0).uniform(-1, 2, 1000).astype(np.float32)
    out = cuda.to_device(np.zeros(1, np.float32))
    call(cuda.to_device(x), out)
    assert out.copy_to_host()[0] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5)
    with pytest.raises(InputError, match="host"):
        call(x, out)


# -- the streams ladder ------------------------------------------------------------------------------------

def test_streams_ladder_is_correct_in_the_simulator(tmp_path):
    from solutions import streams

    result = streams.run_ladder(1003, repeats=1)  # not a multiple of the 8 chunks
    runs = result["runs"]
    assert [r.stage for r in runs] == ["pageable", "pinned", "overlapped"] and all(r.passed for r in runs)
    overlapped = runs[-1]
    assert {s.kind for s in overlapped.spans} == {"copy in", "kernel", "copy out"}
    assert len({s.lane for s in overlapped.spans}) == streams.STREAMS and len(overlapped.spans) == 3 * streams.CHUNKS
    streams.draw_timelines(runs, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def test_a_wrong_stage_fails_its_check():
    from solutions import streams

    def forgets_the_last_chunk(x, out, ws, tl):
        streams.overlapped(x[:-1], out[:-1], ws, tl)

    stage = streams.Stage("broken", 9, "forgets the last element", forgets_the_last_chunk, pinned=True)
    x, out = streams.host_arrays(100, True)
    assert not streams.run_stage(stage, x, out, streams.Workspace(100)).passed


# -- on a GPU: the must-show targets ----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.timing(whole=True)
@pytest.mark.parametrize("kind", ["numba", "torch"])
def test_a_prepared_stage_of_two_arrays_costs_at_most_8_us_a_call(kind):
    from numba import cuda

    from solutions import reduction

    x, out = cuda.to_device(np.ones(1024, np.float32)), cuda.device_array(1, np.float32)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        x, out = torch.ones(1024, device="cuda"), torch.empty(1, device="cuda")
    call = prepared.PreparedCall(reduction.fused)
    cost = prepared.host_time_per_call(call, (x, out))
    assert float(cuda.as_cuda_array(out).copy_to_host()[0]) == 1024.0
    assert cost["enqueue_us"] <= 8.0, cost


@pytest.mark.gpu
@pytest.mark.timing(whole=True)
def test_graph_replay_costs_at_most_1_5_us_a_kernel():
    """100 launches of a kernel that does almost nothing (ReLU of 1024 floats: two blocks, one 16-byte
    vector a thread), captured once and replayed: the GPU's time per kernel is then what a graph node
    costs. (A heavier kernel measures itself: 100 launches of reduction.fused, whose last block waits
    on an atomic ticket, replay at 2.65 us each on an H200, about what it takes launched back to back.)"""
    from numba import cuda

    from workbench import registry

    _, (relu,) = registry.resolve("activation[relu].small_tiles")
    x, out = cuda.to_device(np.linspace(-1, 1, 1024, dtype=np.float32)), cuda.device_array(1024, np.float32)

    def hundred_launches(x, out):
        for _ in range(100):
            relu.launch(x, out)
    call = prepared.PreparedCall(hundred_launches, validate=lambda *a: None)
    cost = prepared.host_time_per_call(call, (x, out), calls=20)
    assert np.array_equal(out.copy_to_host(), np.maximum(x.copy_to_host(), 0))
    # The GPU's own time per replayed kernel (events, the replays queued behind a sleep): the host loop's
    # figure ("enqueue_us") grows when other processes deschedule the host, as in the GPU suite.
    assert cost["gpu_us"] / 100 <= 1.5, cost


@pytest.mark.gpu
@pytest.mark.timing(whole=True)
def test_the_three_kernel_layernorm_is_faster_as_a_graph_at_4096x1024():
    from numba import cuda

    from solutions import launch_overhead as lo

    inputs = lo.op.make_inputs((4096, 1024), np.random.default_rng(0))
    args = tuple(cuda.to_device(a) for a in inputs) + (cuda.device_array((4096, 1024), np.float32),)
    one_by_one = prepared.host_time_per_call(lo.dispatch.launch, args, calls=50)
    as_graph = prepared.host_time_per_call(lo.graph.launch, args, calls=50)
    assert np.allclose(args[-1].copy_to_host(), lo.op.reference(*inputs), atol=1e-3)
    assert as_graph["enqueue_us"] < one_by_one["enqueue_us"], (as_graph, one_by_one)


@pytest.mark.gpu
@pytest.mark.timing(whole=True)
def test_overlapped_streams_reach_80_percent_of_the_link():
    from solutions import streams

    result = streams.run_ladder(1 << 26, repeats=3)
    last = result["runs"][-1]
    assert last.passed and streams.percent_of_link(last, result["link"]) >= 80.0, (last.total_ms, result["link"])


@pytest.mark.gpu
@pytest.mark.parametrize("planted, target, tool, line_text", [
    ("missing_syncthreads_reduction.py", "reduction.shared_tree", "racecheck", "partials[t] += partials[t + half]"),
    ("missing_bounds_check.py", "matvec.thread_per_row", "memcheck", "acc += a[row, col] * x[col]"),
])
def test_sanitize_catches_the_planted_bugs_and_names_the_line(planted, target, tool, line_text):
    """memcheck stops the missing-bounds kernel at its first access past the end: the read of a row that does
    not exist, before `y[row] = acc` is reached."""
    from pathlib import Path

    from workbench import registry
    from workbench.tools import sanitize

    path = sanitize.find_sanitizer()
    if path is None:
        pytest.skip("no compute-sanitizer on this machine")
    file = str(Path(__file__).parent / "planted" / planted)
    op, (stage,) = registry.resolve(target)
    findings, output = sanitize.run_tool(path, tool, stage, sanitize.default_size(op), file)
    assert findings, output[-2000:]
    assert any(line_text in sanitizer_reports.teach(f) for f in findings), [sanitizer_reports.teach(f) for f in findings]


def test_a_report_naming_the_file_bare_still_quotes_the_code_of_the_file_that_ran(tmp_path, monkeypatch):
    import subprocess
    import types

    from workbench import registry
    from workbench.tools import sanitize

    path = _source(tmp_path)
    report = memcheck_new("learner.py")  # the directory left out, as debug info may print it

    def fake_run(*args, **kwargs):
        return types.SimpleNamespace(stdout=report, stderr="", returncode=0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    op, (stage,) = registry.resolve("matvec.thread_per_row")
    findings, _ = sanitize.run_tool("compute-sanitizer", "memcheck", stage, (1000, 33), str(path))
    assert "(`y[row] = acc`)" in sanitizer_reports.teach(findings[0])
