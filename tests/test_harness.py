"""The harness itself: device choice, checks, results files, the PTX check, the CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import workbench
from workbench import results
from workbench.check import check_stage, compare, poison_like, relative_error
from workbench import registry, tables
from workbench.cli import main
from workbench.ladder import InputError, as_size
from workbench.registry import UnknownTarget, load_operators, resolve
from workbench.sizes import SizeError, check_size, parse_size
from workbench.timing import rotation_count

pytestmark = pytest.mark.sim_only
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=120)


# -- device choice -------------------------------------------------------------------------------

def test_no_gpu_here_means_simulator():
    assert workbench.MODE == "sim"
    import numba

    assert numba.config.ENABLE_CUDASIM


def test_probe_says_why_without_importing_numba():
    # device.py on its own, as workbench/__init__ runs it: before numba exists in the process.
    run = _python("import sys, importlib.util as u; s = u.spec_from_file_location('d', 'workbench/device.py'); "
                  "d = sys.modules['d'] = u.module_from_spec(s); s.loader.exec_module(d); p = d.probe(); "
                  "print(p.gpus, p.reason); assert 'numba' not in sys.modules")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("0 ")


def test_bad_mode_is_named():
    run = _python("import workbench", WORKBENCH_MODE="turbo")
    assert run.returncode != 0 and "WORKBENCH_MODE must be one of" in run.stderr


def test_gpu_mode_without_gpu_fails_loudly():
    run = _python("import workbench", WORKBENCH_MODE="gpu")
    assert run.returncode != 0 and "WORKBENCH_MODE=gpu" in run.stderr


def test_numba_imported_first_in_the_wrong_mode_is_an_error():
    run = _python("import numba; import workbench", NUMBA_ENABLE_CUDASIM="0", WORKBENCH_MODE="sim")
    assert run.returncode != 0 and "numba was imported before workbench" in run.stderr


def test_simulator_notice_is_said_once():
    run = _python("import workbench.device as d; d.choose_mode(); d.announce(); d.announce()")
    assert run.stderr.count("numba's CUDA simulator") == 1


# -- checks --------------------------------------------------------------------------------------

def test_poison_is_nan_for_floats_and_odd_for_ints():
    assert np.isnan(poison_like(np.zeros(3, np.float32))).all()
    assert (poison_like(np.zeros(3, np.int32)) == np.iinfo(np.int32).min + 7).all()


def test_compare_names_unwritten_elements():
    ref = np.random.default_rng(0).random(10)
    out = ref.astype(np.float32)
    out[6:] = poison_like(out[6:])
    r = compare("x", (10,), out, ref, 1e-5)
    assert not r.passed and r.first_bad_index == [6] and "never written" in r.message


def test_compare_tells_computed_nan_from_poison():
    ref = np.random.default_rng(0).random(10)
    out = ref.astype(np.float32)
    out[3] = np.float32("nan")  # what 0/0 in a kernel gives: an ordinary NaN, not the poison pattern
    r = compare("x", (10,), out, ref, 1e-5)
    assert not r.passed and r.first_bad_index == [3] and "never written" not in r.message


def test_compare_reports_first_wrong_index_and_worst():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((4, 5))
    out = ref.astype(np.float32)
    out[2, 3] += 10
    r = compare("x", (4, 5), out, ref, 1e-5)
    assert not r.passed and r.first_bad_index == [2, 3]
    assert r.worst[0][0] == [2, 3]


def test_compare_shape_mismatch():
    r = compare("x", (3,), np.zeros(4, np.float32), np.ones(3), 1e-5)
    assert not r.passed and "shape" in r.message


def test_a_16_bit_result_below_the_format_is_judged_by_the_format():
    """float16 GELU(-6) is -5.9e-9, under float16's smallest subnormal: 0 is the right answer (100% off
    the exact value, 1e-4 of the format's underflow scale), but 0 for -0.0036 is still wrong."""
    assert compare("x", (1,), np.array([0.0], np.float16), np.array([-5.9e-9]), 2e-3).passed
    assert not compare("x", (1,), np.array([0.0], np.float16), np.array([-0.0036]), 2e-3).passed
    assert not compare("x", (1,), np.array([0.0], np.float32), np.array([-5.9e-9]), 2e-3).passed  # float32 has room


def test_complex_workspaces_are_poisoned_with_nan():
    from workbench.check import is_poison

    assert is_poison(poison_like(np.zeros(3, np.complex64))).all()  # an FFT's coefficients (conv2d_fft)


def test_relative_error_of_zero_reference_is_absolute():
    assert relative_error(np.array([0.5]), np.array([0.0])) == 0.5


def _reduction():
    return load_operators()["reduction"]


def test_a_stage_writing_half_its_output_fails():
    from numba import cuda

    from solutions import reduction

    @cuda.jit
    def nothing(x, out):
        pass

    def lazy(x, out):
        nothing[1, 1](x, out)

    r = check_stage(reduction.op["fused"], 100, launch=lazy)
    assert not r.passed and "never written" in r.message


def test_a_stage_that_writes_its_input_fails():
    from numba import cuda

    from solutions import reduction

    @cuda.jit
    def scribble(x):
        x[0] = 0

    def vandal(x, out):
        reduction.fused(x, out)
        scribble[1, 1](x)

    r = check_stage(reduction.op["fused"], 100, launch=vandal)
    assert not r.passed and "input 0 was modified" in r.message


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case, match", [
    ("host", "host \\(numpy\\) array"),
    ("float64", "dtype float32"),
    ("2d", "1-D"),
    ("strided", "C-contiguous"),
    ("empty", "empty"),
    ("out_shape", "shape \\(1,\\)"),
    ("list", "device array"),
])
def test_bad_input_is_named(case, match):
    from numba import cuda

    from solutions import reduction

    x = np.random.default_rng(0).random(64).astype(np.float32)
    out = cuda.device_array(1, np.float32)
    args = {
        "host": (x, out),
        "float64": (cuda.to_device(x.astype(np.float64)), out),
        "2d": (cuda.to_device(x.reshape(8, 8)), out),
        "strided": (cuda.to_device(x)[::2], out),
        "empty": (cuda.to_device(x[:0]), out),
        "out_shape": (cuda.to_device(x), cuda.device_array(2, np.float32)),
        "list": (list(x), out),
    }[case]
    with pytest.raises(InputError, match=match):
        reduction.fused(*args)


# -- registry -------------------------------------------------------------------------------------

def test_registry_orders_stages_and_resolves_targets():
    op, stages = resolve("reduction")
    assert [s.order for s in stages] == list(range(1, len(stages) + 1))
    assert resolve("reduction.fused")[1] == [op["fused"]]
    with pytest.raises(UnknownTarget, match="no stage"):
        resolve("reduction.nope")
    with pytest.raises(UnknownTarget, match="no operator"):
        resolve("nope")


def test_every_stage_explains_itself_and_shows_its_kernels():
    for op in load_operators().values():
        for stage in op.stages:
            assert len(stage.summary.split()) >= 12, f"{stage.key} needs a paragraph on what changed and why"
            src = stage.source()
            # the name of the def (a launcher instantiated from a template is renamed, its code keeps it)
            assert "def " in src and stage.launch.__code__.co_name in src


def test_sizes_parse():
    assert as_size(5) == (5,)
    assert parse_size("32768x4096") == (32768, 4096)
    assert parse_size("2**28") == (2**28,) and parse_size("2^10") == (1024,) and parse_size("1e6") == (10**6,)
    for bad in ("abc", "1.5e0", "3x", ""):
        with pytest.raises(SizeError, match="size must look like"):
            parse_size(bad)


@pytest.mark.parametrize("op_name, size, match", [
    ("reduction", (33, 65), "reduction takes N .1 number"),
    ("softmax", (7,), "softmax takes ROWSxCOLS .2 numbers"),
    ("gemm", (4, 4), "gemm takes MxNxK"),
    ("reduction", (-5,), "every number at least 1; got n=-5"),
    ("softmax", (0, 3), "got rows=0"),
    ("reduction", (2**40,), "moves 4096.0 GiB, more than"),
    ("spmv", (10, 2, 9), "third size number is the pattern"),  # refused by the operator's own model
    ("attention", (1, 1, 17, 16, 2), "causal 0 or 1 .off or on.; got causal=2"),
])
def test_sizes_of_the_wrong_form_are_refused_naming_the_form(op_name, size, match):
    with pytest.raises(SizeError, match=match):
        check_size(load_operators()[op_name], size)


@pytest.mark.parametrize("argv", [
    ["check", "reduction", "--size", "1000", "--size", "33x65"],
    ["check", "softmax", "--size", "7"],
    ["check", "reduction", "--size", "-5"],
    ["check", "softmax", "--size", "-5x3"],  # not a plain negative number: argparse took it for an option
    ["check", "reduction", "--size", "2**40"],
    ["check", "reduction", "--size", "0"],
    ["check", "spmv", "--size", "10x2x9"],
    ["check", "attention[rope]", "--size", "1x1x17x16x2"],
    ["profile", "attention.nosuchstage"],
    ["sanitize", "nosuchop"],
    ["check", "nosuchop"],
    ["check", "reduction.nosuchstage"],
    ["table", "nosuchop"],
    ["diff", "reduction"],
    ["plot", "nosuchop"],
])
def test_cli_refuses_bad_targets_and_sizes_in_one_line(argv, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, captured.err


def test_cli_refuses_unparseable_sizes_before_running(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", "reduction", "--size", "abc"])
    assert exit_.value.code == 2
    assert "size must look like" in capsys.readouterr().err


def test_a_missing_argument_names_the_stage_and_its_signature():
    from numba import cuda

    with pytest.raises(InputError, match=r"reduction.fused takes fused\(x, out\).*'out'"):
        load_operators()["reduction"]["fused"](cuda.to_device(np.ones(3, np.float32)))


def test_skipped_is_its_own_state(capsys):
    """A stage the simulator cannot run is 'skipped' in the table and the JSON, never passed."""
    if not load_operators()["gemm"]["tensor_core"].gpu_only or workbench.MODE != "sim":
        pytest.skip("only in the simulator")
    assert main(["check", "gemm.tensor_core", "--size", "17x33x19", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)  # the random inputs and each adversarial set
    assert records and all(r["status"] == "skipped" and "passed" not in r and r["rel_err"] is None for r in records)


def test_rotation_covers_three_l2s():
    assert rotation_count(1 << 30, 60 << 20) == 1
    assert rotation_count(16 << 20, 60 << 20) == 12
    assert rotation_count(4, 60 << 20) == 64


# -- results ---------------------------------------------------------------------------------------

def _record(stage="fused", size=(10,), us=1.0):
    return {"op": "reduction", "stage": stage, "size": list(size), "dtype": "float32", "median_us": us,
            "date": "2026-01-01T00:00:00+00:00"}


def test_results_merge_replaces_same_key_and_keeps_others(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    results.save_records("Test GPU", [_record("a"), _record("b")])
    results.save_records("Test GPU", [_record("a", us=2.0)])
    data = results.load(tmp_path / "test-gpu.json")
    assert data["schema"] == results.SCHEMA
    assert sorted((r["stage"], r["median_us"]) for r in data["records"]) == [("a", 2.0), ("b", 1.0)]


def test_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    path = results.save_records("Test GPU", [_record("a")])
    before = path.read_text()
    with pytest.raises(TypeError):
        results.save_records("Test GPU", [{**_record("b"), "median_us": object()}])  # not JSON: dies mid-write
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["test-gpu.json"]


def test_other_schema_is_refused(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": 999, "records": []}))
    with pytest.raises(ValueError, match="schema 999"):
        results.load(p)


# -- PTX check --------------------------------------------------------------------------------------

def test_ptx_check_flags_float64_and_uncompilable_kernels():
    from tests import ptx_samples
    from workbench.ptxcheck import check_stages

    reports = {r.stage: r for r in check_stages(ptx_samples.op.stages)}
    assert reports["ptx_samples.clean"].ok, reports["ptx_samples.clean"].message
    assert not reports["ptx_samples.promoted"].ok
    assert "float64 instructions" in reports["ptx_samples.promoted"].message
    assert not reports["ptx_samples.uncompilable"].ok
    assert "does not compile" in reports["ptx_samples.uncompilable"].message


# -- CLI ---------------------------------------------------------------------------------------------

def test_cli_list_json(capsys):
    assert main(["list", "--json"]) == 0
    ops = {o["op"]: o for o in json.loads(capsys.readouterr().out)}
    assert [s["name"] for s in ops["reduction"]["stages"]][:1] == ["naive"]


def test_cli_check_json_and_exit_code(capsys):
    assert main(["check", "reduction.fused", "--size", "33", "--size", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in out if r["inputs"] == "random"] == [[33], [1]]
    assert all(r["status"] == "passed" for r in out)


def test_every_command_prints_its_help(capsys):
    """`workbench --help` and each `workbench CMD --help` render (a bare % in a help string once made
    argparse raise a traceback at the first thing a newcomer types)."""
    import argparse
    from workbench.cli import build_parser
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for argv in [[]] + [[name] for name in subcommands.choices]:
        with pytest.raises(SystemExit) as exit_:
            main(argv + ["--help"])
        assert exit_.value.code == 0, argv
        assert "usage:" in capsys.readouterr().out, argv


def test_cli_bench_refuses_in_simulator():
    assert main(["bench", "reduction"]) == 2


def test_cli_unknown_target_exits_nonzero():
    assert main(["check", "reduction.nope"]) == 2


def test_cli_doctor_warns_about_simulator(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environment"]["mode"] == "sim"
    assert any("simulator" in w for w in report["warnings"])


def test_a_ladder_table_names_its_stages_and_device_and_sits_on_its_chapter_page():
    data = results.latest_file_with("reduction")
    if data is None:
        pytest.skip("no recorded reduction figures")
    table = tables.ladder_table(load_operators()["reduction"], data)
    assert "| 5 | fused |" in table and data["device"] in table
    assert table in tables.chapter_page(registry.chapter("11"))


def test_plots_draw_from_recorded_results(tmp_path):
    data = results.latest_file_with("reduction")
    if data is None:
        pytest.skip("no recorded reduction figures")
    assert main(["plot", "reduction", "--out", str(tmp_path)]) == 0
    # no roofline: every stage of the reduction sits at one intensity (plots.roofline_says_something);
    # the manifest records the records each figure was drawn from
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "drawn_from.json", "reduction_latency.png", "reduction_staircase.png"]


def test_doctor_warns_about_numpy_25_with_numba_cuda_030(monkeypatch):
    import numpy

    from workbench import cli

    monkeypatch.setattr(numpy, "__version__", "2.5.2")
    monkeypatch.setattr(results, "environment", lambda: {"numba_cuda": "0.30.4", "mode": "sim", "device": "simulator"})
    _, warnings = cli.doctor_report()
    assert any("numpy 2.5.2 with numba-cuda 0.30.4" in w and "numpy<2.5" in w for w in warnings)


def test_readme_opens_with_the_two_setup_commands_ci_runs():
    text = open(os.path.join(ROOT, "README.md")).read()
    block = text.split("<!-- setup -->", 1)[1].split("<!-- /setup -->", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.startswith("python")]
    assert "venv" in lines[0]  # where to install, first
    commands = [ln for ln in lines if ln.startswith("python -m pip install")]
    assert len(commands) == 2 and lines[1:] == commands
    assert "workbench run" in commands[0]
    assert commands[1] == 'python -m pip install -e ".[test]" && python -m pytest -n auto'
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "<!-- setup -->" in ci and "pytest" in ci  # .ci/run runs the README's own test line


def test_the_parts_of_the_exhaustive_tests_are_disjoint_and_cover_them_all():
    """`--part K/N` (tests/conftest.py): what .ci/run runs a third of at a time."""
    from tests.conftest import part_of

    ids = [f"tests/test_ladders.py::test_x[op{i}.stage{j}]" for i in range(7) for j in range(5)]
    for n in (1, 2, 3, 4):
        parts = [part_of(ids, k, n) for k in range(1, n + 1)]
        assert set().union(*parts) == set(ids)
        assert sum(len(p) for p in parts) == len(ids)
        assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
