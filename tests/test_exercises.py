"""exercises/ is generated from solutions/: in sync, every stub found before running and harmless when
run, a learner's edits never lost; and the interview set's own checks (inputs, bad input, PTX).

Operators and exercises are discovered, not listed: ladders that gain markers later are covered too.
"""

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from workbench import exercises as ex
from workbench.grade import (find_launch, is_exercise, load_file, prepare, run_case, solution_module_name,
                             submission_path, targets)
from workbench.ladder import InputError, as_size, load_operators

ROOT = Path(__file__).resolve().parent.parent
INTERVIEW = ("scan", "histogram", "argmax", "matvec", "stencil")

SYNTH = '''"""A synthetic ladder module."""
from numba import cuda


@cuda.jit
def _copy(x, out):
    i = cuda.grid(1)
    # HINT: vague
    # HINT: middle
    # HINT: nearly there
    # BEGIN SOLUTION
    if i < x.size:
        out[i] = x[i]
    # END SOLUTION


@cuda.jit
def _double(x, out):
    i = cuda.grid(1)
    # HINT: only one
    # BEGIN SOLUTION
    v = x[i] * 2
    # END SOLUTION
    out[i] = v


def launch(x, out):
    _copy[1, 32](x, out)
'''


# -- the generator ---------------------------------------------------------------------------------

def test_render_replaces_each_region_with_numbered_hints_and_a_stub():
    body = ex.render_body(SYNTH, "synth.py")
    assert "out[i] = x[i]" not in body and "v = x[i] * 2" not in body  # the answers are gone
    assert "BEGIN SOLUTION" not in body and "# HINT:" not in body
    assert "#   hint 1 (nudge): vague" in body
    assert "#   hint 2: middle" in body
    assert "#   hint 3 (nearly the answer): nearly there" in body
    assert "#   hint 1: only one" in body
    # `pass` where nothing after the region needs it; `return` where later code reads a name the
    # region defined (v), so the stub never reaches a NameError.
    assert "    pass  # " + ex.STUB_MARK in body
    assert "    return  # " + ex.STUB_MARK in body
    assert "def launch(x, out):\n    _copy[1, 32](x, out)" in body  # launchers are kept
    ast.parse(body)
    assert len(ex.stub_lines(body)) == 2


def test_header_records_the_hash_of_what_was_generated():
    text = ex.render(SYNTH, "synth", 0.6)
    assert ex.is_pristine(text)
    assert not ex.is_pristine(text.replace("pass  # TODO", "out[i] = x[i]  # TODO"))
    assert not ex.is_pristine(ex.render_body(SYNTH))  # no header: treated as the learner's


@pytest.mark.parametrize("bad, says", [
    ("def f():\n    # BEGIN SOLUTION\n    x = 1\n", "never closed"),
    ("def f():\n    x = 1\n    # END SOLUTION\n", "without a BEGIN"),
    ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n", "do not nest"),
    ("def f():\n    # HINT: a\n    x = 1\n", "directly followed"),
    ("def f():\n" + "    # HINT: a\n" * 4 + "    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n", "at most 3"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "inside a function"),
])
def test_malformed_markers_are_refused_with_file_and_line(bad, says):
    with pytest.raises(ex.MarkerError, match=says) as info:
        ex.find_regions(bad, "bad.py")
    assert "bad.py:" in str(info.value)


def test_build_never_overwrites_a_learners_edits(tmp_path):
    sols, out = tmp_path / "solutions", tmp_path / "exercises"
    sols.mkdir()
    (sols / "synth.py").write_text(SYNTH)
    (sols / "plain.py").write_text("x = 1\n")  # no markers: no exercise
    assert [(r.path.name, r.action) for r in ex.build(out, solutions_dir=sols)] == [("synth.py", "created")]
    assert not (out / "plain.py").exists()
    assert ex.build(out, solutions_dir=sols)[0].action == "unchanged"

    mine = (out / "synth.py").read_text().replace(f"pass  # {ex.STUB_MARK}", "if i < x.size: out[i] = x[i]  #")
    (out / "synth.py").write_text(mine)
    # Solution unchanged: the edited file is kept as it is.
    assert ex.build(out, solutions_dir=sols)[0].action == "kept"
    assert (out / "synth.py").read_text() == mine
    # Solution changed: refused, the learner's file untouched, the reason names the file.
    (sols / "synth.py").write_text(SYNTH.replace("# HINT: vague", "# HINT: vaguer"))
    result = ex.build(out, solutions_dir=sols)[0]
    assert result.action == "refused" and "synth.py" in result.detail and "--backup" in result.detail
    assert (out / "synth.py").read_text() == mine
    # --backup: the learner's file moves to a timestamped .bak first, then the new exercise is written.
    result = ex.build(out, solutions_dir=sols, backup=True)[0]
    assert result.action == "backed-up"
    (backup,) = out.glob("synth.py.*.bak")
    assert backup.read_text() == mine
    assert "hint 1 (nudge): vaguer" in (out / "synth.py").read_text()
    assert ex.is_pristine((out / "synth.py").read_text())
    # An unedited exercise follows its solution.
    (sols / "synth.py").write_text(SYNTH.replace("# HINT: middle", "# HINT: middle, reworded"))
    assert ex.build(out, solutions_dir=sols)[0].action == "updated"


def test_cli_build_keeps_an_edited_exercise(tmp_path):
    run = [sys.executable, "-m", "workbench.cli", "exercises", "build", "scan", "--out", str(tmp_path)]
    assert subprocess.run(run, cwd=ROOT, capture_output=True, text=True).returncode == 0
    edited = (tmp_path / "scan.py").read_text() + "\n# my notes\n"
    (tmp_path / "scan.py").write_text(edited)
    done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept" in done.stdout
    assert (tmp_path / "scan.py").read_text() == edited


# -- the committed exercises -------------------------------------------------------------------------

def test_committed_exercises_are_up_to_date():
    problems = ex.stale()
    assert not problems, "; ".join(problems) + ": run `workbench exercises build`"


def exercise_modules():
    return sorted({solution_module_name(s.op) for s in targets(None)})


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """exercises/ as `build` writes it now: the tests below check the generator, not whether the
    committed copy is stale (that is the test above)."""
    out = tmp_path_factory.mktemp("exercises")
    ex.build(out)
    return out


def test_every_marked_solution_has_an_exercise_and_the_interview_set_is_there(fresh):
    modules = exercise_modules()
    for name in INTERVIEW:
        assert f"solutions.{name}" in modules
    for module in modules:
        assert (fresh / (module.split(".")[-1] + ".py")).exists()


def test_each_exercise_registers_its_own_operator_with_the_solutions_stages(fresh):
    from workbench.ladder import Operator

    ops = load_operators()
    for module in exercise_modules():
        loaded = load_file(fresh / (module.split(".")[-1] + ".py"))
        mine = {v.name: v for v in vars(loaded).values() if isinstance(v, Operator)}
        theirs = {name: op for name, op in ops.items() if solution_module_name(op) == module}
        assert set(mine) == set(theirs), module
        for name, op in theirs.items():
            assert mine[name] is not op
            assert [s.name for s in mine[name].stages] == [s.name for s in op.stages]
            for stage in mine[name].stages:
                assert stage.launch.__module__ == loaded.__name__  # the exercise's own launchers


def test_every_exercise_stage_is_found_not_implemented_before_running(fresh):
    stages = targets(None)
    assert len(stages) >= 2 * len(INTERVIEW)
    for stage in stages:
        launch, verdict, _ = prepare(stage, str(fresh))
        assert launch is None and verdict is not None, stage.key
        assert verdict.reason == "not-implemented", (stage.key, verdict.message)
        assert "not implemented yet" in verdict.message and str(fresh) in verdict.message


@pytest.mark.sim_only
def test_stub_kernels_run_without_crashing_and_leave_the_output_wrong(fresh):
    """The second line of defence: run anyway (as a learner might, by hand), a stub neither crashes
    nor produces a right answer."""
    for stage in targets(None):
        if stage.gpu_only:
            continue
        path = submission_path(str(fresh), stage.op)
        launch, _ = find_launch(load_file(path), stage.op.name, stage.name)
        case = run_case(stage, launch, stage.op.sim_sizes[1], np.random.default_rng(0), submission_file=str(path))
        # Never a crash. (Not always a wrong answer: a stubbed warp max in a softmax changes only the
        # shift, to which softmax is blind. The grader's static check is what reports every stub.)
        assert case.passed or case.reason in ("unwritten", "all-zeros", "wrong-values", "nan"), (stage.key, case.message)
        if stage.op.name in INTERVIEW + ("reduction",) and stage.op.sim_sizes[1] != 1:
            assert not case.passed, stage.key


def test_solution_markers_are_found_per_stage():
    ops = load_operators()
    for name in INTERVIEW:
        for stage in ops[name].stages:
            assert is_exercise(stage), stage.key


# -- the interview set ------------------------------------------------------------------------------

def test_argmax_inputs_always_tie_at_the_maximum():
    op = load_operators()["argmax"]
    rng = np.random.default_rng(1)
    for n in (2, 31, 1000):
        (x,) = op.make_inputs((n,), rng)
        assert (x == x.max()).sum() >= 2
        assert op.reference(x)[0] == np.flatnonzero(x == x.max())[0]


def test_histogram_inputs_are_skewed_and_counts_are_exact():
    from workbench.check import compare

    op = load_operators()["histogram"]
    (x,) = op.make_inputs((4000,), np.random.default_rng(2))
    ref = op.reference(x)
    assert ref.max() > 1500 and ref.sum() == 4000  # a hot bin
    out = ref.astype(np.int32)
    assert compare("h", (4000,), out, ref, 0.0).passed
    out[7] += 1
    result = compare("h", (4000,), out, ref, 1.0)  # the tolerance is ignored for integer outputs
    assert not result.passed and result.reason == "wrong-values" and result.first_bad_index == [7]


@pytest.mark.parametrize("name, make_bad, says", [
    ("scan", lambda x, y: (x, cuda.to_device(np.zeros(3, np.float32))), "shape"),
    ("scan", lambda x, y: (x.copy_to_host(), y), "host"),
    ("histogram", lambda x, out: (cuda.to_device(x.copy_to_host().astype(np.int32)), out), "uint8"),
    ("histogram", lambda x, out: (x, cuda.to_device(np.zeros(255, np.int32))), r"\(256,\)"),
    ("argmax", lambda x, out: (x, cuda.to_device(np.zeros(1, np.int64))), "int32"),
    ("matvec", lambda a, x, y: (a, cuda.to_device(np.zeros(a.shape[0], np.float32)), y), "shape"),
    ("stencil", lambda img, w, out: (img, cuda.to_device(np.zeros((3, 3), np.float32)), out), r"\(5, 5\)"),
])
def test_bad_input_names_what_was_expected(name, make_bad, says):
    op = load_operators()[name]
    size = as_size(op.sim_sizes[2])
    inputs = [cuda.to_device(a) for a in op.make_inputs(size, np.random.default_rng(0))]
    out = cuda.to_device(op.make_output(size))
    bad = make_bad(*inputs, out)
    with pytest.raises(InputError, match=says):
        op.stages[0](*bad)


@pytest.mark.sim_only
def test_interview_stages_compile_for_sm90_in_float32():
    from workbench.ptxcheck import check_stages

    ops = load_operators()
    reports = check_stages([s for name in INTERVIEW for s in ops[name].stages])
    bad = [f"{r.stage} {r.kernel}: {r.message}" for r in reports if not r.ok]
    assert not bad, "\n".join(bad)
    assert {r.stage for r in reports} == {s.key for name in INTERVIEW for s in ops[name].stages}
