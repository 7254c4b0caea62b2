"""Ceilings by access pattern: the Operator field, which measured ceiling "% of peak" divides by, the
stream kernels that measure them (at tiny sizes in the simulator), and `workbench peaks` without a GPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
from numba import cuda

from workbench import bench, ceilings, plots, registry, results, tables
from workbench.cli import main
from workbench.ladder import MEMORY_PATTERNS, Operator
from workbench.timing import Timing

PEAKS = {"copy_gbps": 4000.0, "read_gbps": 4250.0, "read2_write1_gbps": 4100.0, "gemm_fp32_gflops": 50000.0}
OLD_PEAKS = {"copy_gbps": 4000.0, "gemm_fp32_gflops": 50000.0}  # a file recorded before the three streams


def make_op(**fields) -> Operator:
    return Operator("probe", "a probe", lambda x: x, None, lambda s: np.empty(s, np.float32),
                    bytes_moved=lambda s: 4 * s[0], flops=lambda s: s[0], validate=lambda *a: None,
                    check_sizes=[(8,)], sim_sizes=[(8,)], bench_sizes=[(8,)], headline_size=(8,), **fields)


def figures(op, peaks_):
    timing = Timing(median_us=1000.0, p10_us=1.0, p90_us=1.0, min_us=1.0, samples=1, launches_per_sample=1,
                    host_call_us=1.0)
    return bench._figures(op, (1 << 30,), timing, 4 << 30, peaks_)  # 4 GiB in 1 ms: 4295 GB/s


def test_pattern_defaults_to_copy_and_a_bad_one_is_one_clear_error():
    assert make_op().pattern == "copy"
    assert set(MEMORY_PATTERNS) == set(bench.PATTERN_PEAK)
    with pytest.raises(ValueError, match=r"probe: pattern='reads'.*'read', 'copy', 'read2_write1'"):
        make_op(pattern="reads")


@pytest.mark.parametrize("pattern, key", [("read", "read_gbps"), ("copy", "copy_gbps"),
                                          ("read2_write1", "read2_write1_gbps")])
def test_figures_divide_by_the_ceiling_of_the_operators_own_pattern(pattern, key):
    rec = figures(make_op(pattern=pattern), PEAKS)
    assert rec["peak_kind"] == key
    assert rec["pct_of_peak"] == pytest.approx(100 * rec["gbps"] / PEAKS[key])


@pytest.mark.parametrize("pattern", ["read", "read2_write1"])
def test_figures_fall_back_to_copy_where_the_pattern_was_never_measured(pattern):
    rec = figures(make_op(pattern=pattern), OLD_PEAKS)
    assert rec["peak_kind"] == "copy_gbps"
    assert rec["pct_of_peak"] == pytest.approx(100 * rec["gbps"] / OLD_PEAKS["copy_gbps"])
    assert figures(make_op(pattern=pattern), {})["pct_of_peak"] is None


def test_compute_bound_operators_ignore_the_pattern():
    rec = figures(make_op(bound="compute", pattern="read"), PEAKS)
    assert rec["peak_kind"] == "gemm_fp32_gflops"
    assert rec["pct_of_peak"] == pytest.approx(100 * rec["gflops"] / PEAKS["gemm_fp32_gflops"])


def test_tables_and_plots_name_the_ceiling_they_divide_by():
    op = make_op(pattern="read")
    assert tables.peak_caption(op, PEAKS) == "% of peak is of the measured read-only bandwidth, 4250 GB/s"
    assert tables.peak_caption(op, OLD_PEAKS) == "% of peak is of the measured copy bandwidth, 4000 GB/s"
    assert plots.peak_of(op, PEAKS) == (4250.0, "read-only stream")
    assert plots.memory_ceiling(make_op(bound="compute", pattern="read"), PEAKS) == (4000.0, "copy")
    recs = [{"bytes": 4250 * 1000, "flops": 0}]
    assert plots.time_floor(op, PEAKS, recs) == [(4250 * 1000, pytest.approx(1.0))]  # 1 µs at the read ceiling


def test_the_floor_lies_under_every_size_that_moves_the_same_bytes():
    """Attention causal or not moves the same bytes for half the flops: the floor there is the causal
    size's, or a causal measurement could sit below a line no stage can cross."""
    op = make_op(bound="compute", pattern="read")
    flops = PEAKS["gemm_fp32_gflops"] * 1e3  # 1 µs of flops at the compute peak
    recs = [{"bytes": 1000, "flops": 2 * flops}, {"bytes": 1000, "flops": flops}]  # non-causal, causal
    assert plots.time_floor(op, PEAKS, recs) == [(1000, pytest.approx(1.0))]


def test_registered_patterns_are_valid_and_reductions_read():
    ops = registry.load_operators()
    assert all(op.pattern in MEMORY_PATTERNS for op in ops.values())
    assert ops["reduction"].pattern == "read"


@pytest.mark.parametrize("n", [3, 1003])
def test_stream_kernels_compute_what_they_claim(n):
    """The kernels behind read_gbps and read2_write1_gbps, at sizes not a multiple of a quad or a block;
    a one-block grid makes the grid-stride loops take several trips."""
    rng = np.random.default_rng(n)
    x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    for blocks in (ceilings.stream_blocks(n, ceilings.READ_QUADS), 1):
        total = cuda.to_device(np.zeros(1))
        ceilings._read_sum[blocks, ceilings.STREAM_THREADS](cuda.to_device(x), total)
        assert total.copy_to_host()[0] == pytest.approx(x.sum(dtype=np.float64), rel=1e-6)
    for quads, threads in ceilings.ADD_LAYOUTS:  # every layout the read2_write1 ceiling is the best of
        z = cuda.device_array(n, np.float32)
        ceilings.add(cuda.to_device(x), cuda.to_device(y), z, quads, threads)
        np.testing.assert_array_equal(z.copy_to_host(), x + y)
    total = cuda.to_device(np.zeros(1))
    ceilings.read_sum_resident(cuda.to_device(x), total)
    assert total.copy_to_host()[0] == pytest.approx(x.sum(dtype=np.float64), rel=1e-6)
    copied = cuda.device_array(n, np.float32)
    ceilings._copy_vectors[-(-n // 4 // 128) or 1, 128](cuda.to_device(x), copied)
    np.testing.assert_array_equal(copied.copy_to_host(), x)


@pytest.mark.slow
def test_stream_kernels_compile_for_sm90():
    from tests.sm90 import compile_for_sm90

    reports, output = compile_for_sm90("workbench.ceilings", ["_copy_vectors", "_copy4"],
                                       "(types.Array(types.float32, 1, 'C'), types.Array(types.float32, 1, 'C'))")
    assert len(reports) == 2 and all(status == "passed" for _, status, *_ in reports), output[-2000:]


def test_datasheet_figures_by_device_name():
    assert ceilings.datasheet_gbps("NVIDIA H200") == 4800
    assert ceilings.datasheet_gbps("NVIDIA H100 80GB HBM3") == 3350  # the SXM's driver name
    assert ceilings.datasheet_gbps("NVIDIA H100 PCIe") == 2000
    assert ceilings.datasheet_gbps("NVIDIA A100-SXM4-80GB") == 2039
    assert ceilings.datasheet_gbps("NVIDIA A100-PCIE-40GB") == 1555
    assert ceilings.datasheet_gbps("Tesla T4") is None


def _write_results(tmp_path, monkeypatch, stored: dict) -> None:
    from rich.console import Console

    from workbench import cli

    monkeypatch.setattr(cli, "console", Console(width=200))  # one table row a line
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    data = results.empty("NVIDIA H200")
    data["peaks"] = {"date": "2026-11-23T10:00:00+00:00", "environment": {"device": "NVIDIA H200"}, **stored,
                     "copy_detail_gbps": {"memcpy": 4000.0, "numba_copy4": 3600.0}}
    results.write_atomic(results.path_for("NVIDIA H200"), data)


def test_workbench_peaks_prints_the_recorded_ceilings_without_a_gpu(tmp_path, monkeypatch, capsys):
    _write_results(tmp_path, monkeypatch, PEAKS)
    assert main(["peaks"]) == 0
    out = capsys.readouterr().out
    assert "recorded on NVIDIA H200, 2026-11-23" in out
    rows = [" ".join(line.replace("│", " ").split()) for line in out.splitlines()]
    for row in ("read sum of a 1 GiB float32 buffer 4250 89", "copy best of memcpy 4000, numba_copy4 3600 4000 83",
                "read2_write1 z = x + y, 1 GiB each 4100 85", "datasheet NVIDIA's figure (not a ceiling) 4800 100"):
        assert row in rows, (row, rows)
    assert "not measured" not in out
    assert main(["peaks", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["read_gbps"] == 4250.0


def test_workbench_peaks_says_which_ceilings_an_old_file_lacks(tmp_path, monkeypatch, capsys):
    _write_results(tmp_path, monkeypatch, OLD_PEAKS)
    assert main(["peaks"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "read and read2_write1: not measured" in out and "workbench peaks --measure" in out


def test_workbench_peaks_measure_needs_a_gpu(tmp_path, monkeypatch, capsys):
    _write_results(tmp_path, monkeypatch, PEAKS)
    assert main(["peaks", "--measure"]) == 2
    assert "needs a real GPU" in " ".join(capsys.readouterr().err.split())


def test_percent_of_peak_divides_by_the_precision_the_arithmetic_runs_in():
    """qlinear takes float32 and returns float32, but its GEMM is int8: dividing its rate by the fp32 cuBLAS
    rate gave "800% of peak". With no int8 rate measured, it has no % of peak at all."""
    peak_key, percent_of_peak = bench.peak_key, bench.percent_of_peak
    peaks = {"gemm_fp32_gflops": 51_000.0, "gemm_fp16_gflops": 661_000.0, "copy_gbps": 4000.0}
    qlinear, gemm = registry.operator("qlinear"), registry.operator("gemm")
    assert peak_key(qlinear, peaks) is None and percent_of_peak(qlinear, 1.0, 400_000.0, peaks) is None
    assert peak_key(gemm, peaks) == "gemm_fp32_gflops"
    assert percent_of_peak(gemm, 1.0, 25_500.0, peaks) == 50.0


def test_records_above_their_ceiling_are_named_by_workbench_peaks(tmp_path, monkeypatch, capsys):
    """A record that moved more than its ceiling shows the ceiling is wrong: `workbench peaks` names it."""
    below = {"op": "reduction", "stage": "one_pass", "size_label": "268435456", "date": "2026-11-24T00:00:00",
             "gbps": 4200.0, "peak_kind": "read_gbps"}
    above = {**below, "op": "activation[gelu]", "stage": "short_erfc", "gbps": 4040.0, "peak_kind": "copy_gbps"}
    compute = {**below, "op": "gemm", "stage": "warp_tiles", "gbps": 9000.0, "peak_kind": "gemm_fp32_gflops"}
    assert ceilings.records_above(PEAKS, [below, above, compute]) == [(above, "copy_gbps", pytest.approx(1.01))]
    _write_results(tmp_path, monkeypatch, PEAKS)
    data = results.load(results.path_for("NVIDIA H200"))
    data["records"] = [below, above, compute]
    results.write_atomic(results.path_for("NVIDIA H200"), data)
    assert main(["peaks"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 records moved more than their ceiling" in out
    assert "activation[gelu].short_erfc at 268435456 (2026-11-24): 4040 GB/s, 101.0% of copy" in out


def test_a_ceiling_only_rises_and_says_which_run_measured_it():
    """A slower H200 measured later does not lower a ceiling that records of a faster one reached."""
    stored = {"date": "2026-11-24T11:00:00+00:00", "read_gbps": 4581.0, "copy_gbps": 4258.0, "gemm_fp16_gflops": 710e3}
    measured = {"date": "2026-12-01T03:00:00+00:00", "read_gbps": 4396.0, "copy_gbps": 4288.0, "gemm_fp16_gflops": 746e3}
    best = ceilings.keep_best(stored, measured)
    assert (best["read_gbps"], best["copy_gbps"], best["gemm_fp16_gflops"]) == (4581.0, 4288.0, 746e3)
    assert best["kept"] == {"read_gbps": {"date": "2026-11-24T11:00:00+00:00", "value": 4581.0}}
    again = ceilings.keep_best(best, {**measured, "date": "2026-12-02T00:00:00+00:00"})
    assert again["kept"]["read_gbps"]["date"] == "2026-11-24T11:00:00+00:00"  # the run that measured it
    assert ceilings.keep_best(None, measured) == {**measured, "kept": {}}


def _fake_streams(monkeypatch, copy_now: float):
    """The copy stream "measured now" at copy_now GB/s (no GPU here: the functions are stand-ins)."""
    calls = []

    def copy_bandwidth(nbytes):
        calls.append(nbytes)
        return {"copy_gbps": copy_now, "copy_detail_gbps": {"numba_vector_128": copy_now}, "copy_bytes": 8}

    monkeypatch.setitem(ceilings.STREAMS, "copy_gbps", copy_bandwidth)
    monkeypatch.setattr(ceilings, "library_streams", lambda nbytes, keys: {})
    return calls


GELU = {"op": "activation[gelu]", "stage": "short_erfc", "size_label": "268435456", "date": "2026-12-01T00:00:00",
        "gbps": 4299.0, "peak_kind": "copy_gbps", "pct_of_peak": 100.3}
STORED = {"date": "2026-12-01T03:39:02+00:00", "copy_gbps": 4288.0, "read_gbps": 4581.0,
          "kept": {"read_gbps": {"date": "2026-11-24T11:35:49+00:00", "value": 4581.0}}}


def test_a_record_above_its_ceiling_has_that_stream_measured_again_in_the_same_run(monkeypatch):
    calls = _fake_streams(monkeypatch, copy_now=4310.0)
    said = []
    below = {**GELU, "stage": "in_flight", "gbps": 4100.0}
    peaks = ceilings.check_ceilings([GELU, below], STORED, said.append)
    assert len(calls) == 1  # one stream, once, however many records beat it
    assert peaks["copy_gbps"] == 4310.0 and "copy_gbps" not in peaks["kept"]
    assert peaks["kept"]["read_gbps"] == STORED["kept"]["read_gbps"]  # the others untouched
    assert peaks["remeasured"]["copy_gbps"]["because"] == ("activation[gelu].short_erfc at 268435456 moved "
                                                          "4299 GB/s, above 4288")
    assert GELU["pct_of_peak"] == pytest.approx(100 * 4299 / 4310)  # the records divide by the new ceiling
    assert said[0].startswith("activation[gelu].short_erfc moved 4299 GB/s, above the copy ceiling of 4288")
    assert said[1] == "  copy now 4310 GB/s"
    # a later full measurement that is slower keeps the ceiling, dated by the run that measured it
    best = ceilings.keep_best(peaks, {"date": "2026-12-05T00:00:00+00:00", "copy_gbps": 4200.0, "read_gbps": 4600.0})
    assert best["kept"]["copy_gbps"] == {"date": peaks["remeasured"]["copy_gbps"]["date"], "value": 4310.0}


def test_a_stream_measured_again_slower_keeps_the_ceiling_and_says_the_record_is_still_above(monkeypatch):
    _fake_streams(monkeypatch, copy_now=4250.0)
    said = []
    record = dict(GELU)
    peaks = ceilings.check_ceilings([record], STORED, said.append)
    assert peaks["copy_gbps"] == 4288.0
    assert peaks["kept"]["copy_gbps"] == {"date": STORED["date"], "value": 4288.0}
    assert peaks["copy_detail_gbps"] == {"numba_vector_128": 4250.0}  # this run's measurement, shown beside
    assert said[1] == "  copy now 4288 GB/s; still above it: short_erfc"
    assert ceilings.check_ceilings([], STORED, said.append) is STORED  # nothing beaten: nothing measured


def test_workbench_peaks_says_when_a_stream_was_measured_again(tmp_path, monkeypatch, capsys):
    _fake_streams(monkeypatch, copy_now=4310.0)
    peaks = ceilings.check_ceilings([dict(GELU)], {**PEAKS, "date": "2026-11-30T00:00:00"}, lambda line: None)
    _write_results(tmp_path, monkeypatch, peaks)
    assert main(["peaks"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "measured again on" in out and "activation[gelu].short_erfc at 268435456 moved 4299 GB/s" in out


def test_record_measures_a_beaten_stream_again_and_saves_the_ceiling(tmp_path, monkeypatch):
    """`workbench record`'s measuring step: a record above its ceiling has the stream measured again, the
    new ceiling saved to the results file at once and used for the next items."""
    from workbench import record

    _fake_streams(monkeypatch, copy_now=4310.0)
    _write_results(tmp_path, monkeypatch, STORED)
    seen = []

    def bench_size(op, stages, size, peaks, rng, env, with_compile=True):
        seen.append(peaks["copy_gbps"])
        return [dict(GELU)], []

    monkeypatch.setattr(bench, "bench_size", bench_size)
    measure = record.gpu_measure_item(STORED, {"device": "NVIDIA H200"})
    item = type("Item", (), {"op": type("Op", (), {"stages": []})(), "size": (1,)})()
    recs, fails = measure(item)
    assert not fails and recs[0]["pct_of_peak"] == pytest.approx(100 * 4299 / 4310)
    assert results.load(results.path_for("NVIDIA H200"))["peaks"]["copy_gbps"] == 4310.0
    measure(item)
    assert seen == [4288.0, 4310.0]
