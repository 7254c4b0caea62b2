"""The CLI as a new user meets it: every defect found by trying it (a traceback, a wrong verdict, a silent
substitution) reproduced here first, then fixed; and `sweep` / `bench --against`, which replaced scripts."""

from __future__ import annotations

import json
import shutil

import pytest

from workbench import check, ptxcheck, registry, sweep, tables
from workbench.cli import build_parser, main


def run(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `workbench ARGV`, whether argparse or the command ended it."""
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return status, out, err


def test_a_negative_seed_is_one_line_not_a_traceback(capsys):
    status, _, err = run(capsys, "check", "reduction", "--seed", "-1")
    assert status == 2 and "seed must be a whole number from 0" in err


def test_sanitize_parse_of_a_missing_file_or_another_kind_of_file_is_refused(capsys, tmp_path):
    status, _, err = run(capsys, "sanitize", "--parse", str(tmp_path / "nothing.log"), "--tool", "memcheck")
    assert status == 2 and "no such file" in err
    other = tmp_path / "passwd"
    other.write_text("root:x:0:0:root:/root:/bin/bash\n")
    status, out, err = run(capsys, "sanitize", "--parse", str(other), "--tool", "memcheck")
    assert status == 2 and "not a compute-sanitizer log" in err and "no errors found" not in out


def test_a_size_the_operator_refuses_is_refused_before_anything_runs(capsys):
    status, out, err = run(capsys, "check", "attention", "--size", "1x1x1x100000x0")
    assert status == 2 and "head size D = 100000" in err and "FAIL" not in out


def test_run_takes_a_size_and_a_bad_one_is_answered_by_run_itself(capsys):
    status, _, err = run(capsys, "run", "reduction", "--size", "12x")
    assert status == 2 and "workbench run" in err and "size must look like" in err


def test_check_with_a_size_keeps_the_operators_adversarial_inputs(capsys):
    status, out, _ = run(capsys, "check", "reduction.fused", "--size", "1000", "--json", "--seed", "3")
    labels = {r["inputs"] for r in json.loads(out)}
    assert status == 0 and "random" in labels and len(labels) > 1


def test_diff_shows_the_paragraph_its_placeholder_points_at(capsys):
    status, out, _ = run(capsys, "diff", "reduction.fused", "--plain")
    stage = registry.resolve("reduction.fused")[1][0]
    assert status == 0 and "(the paragraph above)" in out
    assert out.index(" ".join(stage.summary.split()[:6])) < out.index("(the paragraph above)")


def test_plot_says_why_a_latency_plot_is_missing_and_where_allreduce_is_recorded(capsys, tmp_path):
    status, out, err = run(capsys, "plot", "stencil", "--out", str(tmp_path))  # recorded at one size only
    assert status == 0 and "latency" in out + err and "one size" in out + err
    status, out, err = run(capsys, "plot", "allreduce", "--out", str(tmp_path))
    assert "workbench bench allreduce" not in out + err
    assert "workbench record" in out + err and "two GPUs" in out + err


def test_profile_without_a_gpu_does_not_show_another_sizes_record(capsys):
    status, out, err = run(capsys, "profile", "softmax", "--size", "64x64")
    assert status == 1 and "64x64" in err and "recorded at" in err


def test_the_launch_overhead_table_shows_the_host_time_it_teaches():
    op = registry.operator("launch_overhead")
    rec = {"op": op.name, "size": [4096, 1024], "size_label": "4096x1024", "dtype": "float32", "date": "2026-11-23",
           "versions": {}, "gbps": 600.0, "gflops": 500.0}
    data = {"device": "GPU", "peaks": {}, "records": [
        {**rec, "stage": s.name, "order": s.order, "kind": "stage", "median_us": 54.2, "host_call_us": host}
        for s, host in zip(op.stages, (132.1, 133.0, 63.5, 58.6, 31.0))]}
    text = tables.ladder_table(op, data)
    assert "host call µs" in text and "| 132.1 |" in text and "| 63.5 |" in text
    # a ladder whose lesson is GPU time keeps the table it had
    reduction = registry.operator("reduction")
    data = {"device": "GPU", "peaks": {}, "records": [
        {**rec, "op": "reduction", "size": [1 << 28], "stage": s.name, "order": s.order, "kind": "stage",
         "median_us": 1000.0 / s.order, "host_call_us": 1000.0 / s.order + 10} for s in reduction.stages]}
    assert "host call" not in tables.ladder_table(reduction, data)


def test_one_size_parser_one_status_vocabulary_one_registration_path(capsys):
    messages = set()
    for command in (["check", "reduction"], ["profile", "reduction"], ["sanitize", "reduction"], ["bench", "reduction"],
                    ["run", "reduction"]):
        status, _, err = run(capsys, *command, "--size", "12x")
        assert status == 2
        messages.add(err.strip().splitlines()[-1].split("error: ", 1)[1])
    assert len(messages) == 1, messages
    assert (ptxcheck.OK, ptxcheck.FAILED, ptxcheck.SKIPPED) == (check.PASSED, check.FAILED, check.SKIPPED)
    parser = build_parser()
    commands = next(a for a in parser._subparsers._group_actions).choices
    assert {"record", "targets", "sweep", "profile", "sanitize", "grade"} <= set(commands)
    assert all(name in parser.epilog for name in commands)


# -- sweep and bench --against --------------------------------------------------------------------------

def test_sweep_settings_are_every_combination_and_a_bad_one_is_one_line(capsys):
    assert sweep.parse_settings(["A=1,2", "B=x"]) == [{"A": "1", "B": "x"}, {"A": "2", "B": "x"}]
    with pytest.raises(sweep.SweepError, match="NAME=VALUE"):
        sweep.parse_settings(["A"])
    status, _, err = run(capsys, "sweep", "scan.decoupled_lookback", "NO_SUCH_CONSTANT=1")
    assert status == 2 and "NO_SUCH_CONSTANT is assigned 0 times" in err
    status, _, err = run(capsys, "sweep", "scan", "ONE_PASS_THREADS=128")
    assert status == 2 and "OP.STAGE" in err
    status, _, err = run(capsys, "sweep", "scan.decoupled_lookback", "ONE_PASS_THREADS=128")
    assert status == 2 and "needs a real GPU" in err + _


def test_sweep_runs_the_stage_from_its_module_with_the_constant_replaced():
    import sys

    stage = sweep.stage_with("reduction.fused", {"THREADS": "128"})
    fresh = sys.modules[stage.launch.__module__]
    try:
        assert fresh.THREADS == 128 and fresh.WARPS == 4  # a constant derived from it follows
        assert check.check_stage(stage, (1000,)).passed
    finally:
        import importlib

        importlib.reload(fresh)  # the committed module back for the other tests
    with pytest.raises(sweep.SweepError, match="exactly once"):
        sweep.patched_source("A = 1\nA = 2\n", "m.py", {"A": "3"})


def test_bench_against_compares_two_stages_of_one_operator(capsys):
    status, _, err = run(capsys, "bench", "reduction", "--against", "naive")
    assert status == 2 and "OP.STAGE" in err
    status, _, err = run(capsys, "bench", "reduction.fused", "--against", "nope")
    assert status == 2 and "nope" in err
    status, out, err = run(capsys, "bench", "reduction.fused", "--against", "naive")
    assert status == 2 and "needs a real GPU" in out + err


def test_bench_against_checks_each_stage_in_the_first_round_and_only_times_it_after(monkeypatch):
    from types import SimpleNamespace

    from workbench import bench

    calls = []

    def fake_bench_size(op, stages, size, peaks, rng, env, with_peer=True, verify=True):
        calls.append((stages[0], verify))
        return [{"median_us": 1.0}], (["bad @ 8: wrong"] if stages[0] is bad else [])

    monkeypatch.setattr(bench, "bench_size", fake_bench_size)
    a, b, bad = (SimpleNamespace(name=name) for name in ("a", "b", "bad"))
    by_stage, failures = bench.alternate(None, [a, b], 8, {}, None, {}, rounds=3)
    assert calls == [(a, True), (b, True), (a, False), (b, False), (a, False), (b, False)]
    assert by_stage == {"a": [{"median_us": 1.0}] * 3, "b": [{"median_us": 1.0}] * 3} and not failures
    calls.clear()
    _, failures = bench.alternate(None, [a, bad], 8, {}, None, {}, rounds=3)
    assert len(calls) == 2 and failures == ["bad @ 8: wrong"]  # a stage that fails is not timed again


def test_middle_record_of_rounds_takes_the_median_and_widens_the_spread():
    from workbench.bench import middle_record

    rounds = [{"median_us": m, "p10_us": m - 1, "p90_us": m + 1} for m in (10.0, 30.0, 20.0)]
    assert middle_record(rounds) == {"median_us": 20.0, "p10_us": 9.0, "p90_us": 31.0}


@pytest.mark.skipif(shutil.which("compute-sanitizer") is not None, reason="checks the answer without the tool")
def test_sanitize_without_the_tool_is_refused(capsys):
    status, _, err = run(capsys, "sanitize", "reduction.fused")
    assert status == 2
