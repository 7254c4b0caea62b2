"""The autograder: the answer key passes, stubs are "not implemented yet", every planted bug is
rejected for its reason, hangs and crashes cost one case, reports come as text, JSON and JUnit.

Everything runs in the simulator at the grader's quick sizes; each planted file is graded in its own
subprocess by its own test, so that pytest-xdist spreads them over the cores.
"""

import ast
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from workbench.check import compare, is_poison, poison_like
from workbench.grade import grade, grade_function

# The planted bugs are caught by the simulator's strictness (IndexError, NaN shared memory, launch
# limits): on a GPU most of them would run silently. The GPU test at the end checks the speed bar.
pytestmark = pytest.mark.sim_only

ROOT = Path(__file__).resolve().parent.parent
PLANTED = sorted((ROOT / "tests" / "planted").glob("*.py"))
QUICK_TIMEOUT = 8.0  # the hanging submission's per-case timeout here


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXPECT":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no EXPECT")


def grade_planted(path: Path):
    want = expectation(path)
    if want["reason"] == "timeout":  # one small case, a short timeout
        return grade(want["stage"], str(path), sizes=[(5,)], timeout=QUICK_TIMEOUT, jobs=1)
    if want["reason"] == "crash":  # the whole op: the file's other stage must still be graded
        return grade(want["stage"].split(".")[0], str(path), quick=True, jobs=1)
    return grade(want["stage"], str(path), quick=True, jobs=1)


def test_catalog_covers_the_classic_bugs():
    reasons = set()
    for p in PLANTED:
        want = expectation(p)["reason"]
        reasons |= set(want) if isinstance(want, list) else {want}
    for reason in ("nan", "out-of-bounds", "unwritten", "all-zeros", "uninitialised", "wrong-values",
                   "no-kernel-launch", "input-modified", "launch-limit", "timeout", "crash", "answer-key"):
        assert reason in reasons
    assert len(PLANTED) >= 12


@pytest.mark.parametrize("path", PLANTED, ids=[p.stem for p in PLANTED])
def test_planted_bug_is_rejected_with_its_reason(path):
    """Each file is graded in its own subprocess at the quick sizes; pytest-xdist spreads the files."""
    before = path.read_bytes(), path.stat().st_mtime_ns
    report = grade_planted(path)
    want = expectation(path)
    (stage,) = [s for s in report.stages if s.key == want["stage"]]
    assert stage.status == "fail", f"{path.name} was not rejected"
    failed = [c for c in stage.cases if not c.passed]
    reasons = want["reason"] if isinstance(want["reason"], list) else [want["reason"]]
    named = [c for c in failed if c.reason in reasons and want["says"] in f"{c.message} {c.advice}"]
    assert named, f"{path.name}: expected {want}, got " + "; ".join(f"{c.reason}: {c.message}" for c in failed)
    assert not report.passed
    if want["reason"] == "crash":  # grading went on: the file's correct stage passed after the crash
        assert {s.key: s.status for s in report.stages} == {
            "histogram.global_atomics": "fail", "histogram.shared_privatized": "pass"}
    if want["reason"] == "timeout":
        (case,) = stage.cases
        assert f"{QUICK_TIMEOUT:.0f} s" in case.message
    # Grading never writes to the submission (nor byte-compiles next to it).
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert not (path.parent / "__pycache__").exists()


def test_the_answer_key_passes_every_exercise():
    report = grade(None, "solutions", quick=True)
    graded = report.graded
    assert len(graded) >= 10
    failed = [f"{s.key}: {c.reason} {c.message}" for s in graded for c in s.cases if not c.passed]
    assert not failed, "\n".join(failed)
    assert report.passed
    for name in ("scan", "histogram", "argmax", "matvec", "stencil"):
        assert sum(s.key.startswith(name + ".") for s in graded) >= 2


def test_the_generated_stubs_are_not_implemented_yet_never_a_crash(tmp_path):
    from workbench.exercises import build

    exercises = tmp_path / "exercises"  # as built now (whether the committed copy is stale is another test)
    build(exercises)
    junit = tmp_path / "grade.xml"
    before = {p: p.read_bytes() for p in exercises.iterdir()}
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "--impl", str(exercises), "--quick", "--json",
                           "--junit", str(junit)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert {p: p.read_bytes() for p in exercises.iterdir()} == before  # grading never writes to them
    report = json.loads(done.stdout)
    assert report["score"]["passed"] == 0 and report["score"]["total"] >= 10
    for stage in report["stages"]:
        if stage["status"] == "skipped":
            continue
        assert stage["status"] == "not-implemented", stage
        (case,) = stage["cases"]
        assert case["reason"] == "not-implemented" and "not implemented yet" in case["message"]
    suite = ElementTree.parse(junit).getroot()
    assert int(suite.get("failures")) == report["score"]["total"]
    assert all(f.get("type") == "not-implemented" for f in suite.iter("failure"))


def test_cli_report_names_the_first_wrong_index_and_the_worst_elements(tmp_path):
    junit = tmp_path / "j.xml"
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "stencil.naive", "--impl",
                           "tests/planted/transposed_weights.py", "--size", "9x13", "--junit", str(junit)],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 1
    text = " ".join(done.stdout.split())
    assert "FAIL" in text and "first wrong index" in text and "worst elements" in text and "max abs error" in text
    assert "w[i, j]" in text  # the operator's own hint, not eaten as markup
    assert "score: 0/1" in text
    (case,) = ElementTree.parse(junit).getroot().iter("testcase")
    assert case.get("classname") == "stencil.naive" and case.find("failure").get("type") == "wrong-values"


def test_missing_stage_and_broken_file_are_reported(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def global_atomics(x, out):\n    return (\n")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    for path, reason in ((broken, "import-error"), (empty, "missing")):
        (stage,) = grade("histogram.global_atomics", str(path), sizes=[(5,)], jobs=1).stages
        assert stage.status == "fail" and stage.cases[0].reason == reason, stage.cases[0].message


# -- in a notebook: the same checks in-process ---------------------------------------------------

@cuda.jit
def _count(x, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(out, x[i], 1)


@cuda.jit
def _zero(out):
    out[cuda.grid(1)] = 0


def my_histogram(x, out):
    _zero[1, 256](out)
    _count[4, 128](x, out)


def my_histogram_forgets_to_zero(x, out):
    _count[4, 128](x, out)


def test_grade_function_grades_a_launcher_defined_here(capsys):
    report = grade_function("histogram.global_atomics", my_histogram, quick=True)
    assert report.passed
    assert "score: 1/1" in capsys.readouterr().out
    report = grade_function("histogram.global_atomics", my_histogram_forgets_to_zero, sizes=[(100,)], show=False)
    assert not report.passed and report.stages[0].cases[0].reason == "uninitialised"


# -- check.compare on the kinds of output the grader sees -----------------------------------------

def test_compare_tells_unwritten_from_computed_nan():
    ref = np.arange(1.0, 7.0)
    out = poison_like(np.zeros(6, np.float32))
    assert is_poison(out).all()
    out[:4] = ref[:4]
    result = compare("k", (6,), out, ref, 1e-5)
    assert result.reason == "unwritten" and result.first_bad_index == [4]
    out[4:] = np.float32(np.nan) * np.float32(0)  # a NaN the kernel computed: not the poison's bits
    result = compare("k", (6,), out, ref, 1e-5)
    assert result.reason == "nan" and "syncthreads" in result.message


def test_compare_integers_exactly():
    ref = np.array([3, 0, 5], np.int64)
    assert compare("k", (3,), np.array([3, 0, 5], np.int32), ref, 0.5).passed
    zeros = compare("k", (3,), np.zeros(3, np.int32), ref, 0.5)
    assert zeros.reason == "all-zeros"
    poisoned = poison_like(np.zeros(3, np.int32))
    assert compare("k", (3,), poisoned, ref, 0.0).reason == "unwritten"
    assert compare("k", (3,), poisoned + ref.astype(np.int32), ref, 0.0).reason == "uninitialised"
    off = compare("k", (3,), np.array([3, 1, 5], np.int32), ref, 0.0)
    assert off.reason == "wrong-values" and off.first_bad_index == [1] and off.worst[0] == [[1], 1, 0]


def test_the_grading_notebook_is_committed_with_its_cpu_outputs():
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "90_grade_yourself.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "mode: sim" in text
    for says in ("out-of-bounds access", "zeroed first", "score: 1/1", "cuda.syncthreads()", "not implemented yet"):
        assert says in text, says
    assert "/tmp/" not in text  # cells are named as the learner knows them


@pytest.mark.parametrize("module", ["histogram", "stencil"])
def test_an_exercise_filled_in_with_the_answers_passes(module, tmp_path):
    """What a learner gets is enough: the exercise's own declarations and launchers, with each stub
    line replaced by the code that was marked, pass the grader (and the learner's file is untouched)."""
    from workbench import exercises as ex

    solution = (ROOT / "solutions" / f"{module}.py").read_text()
    answers = [solution.splitlines()[r.begin + 1:r.end] for r in ex.find_regions(solution)]
    lines = ex.render(solution, module, 0.6).splitlines()
    for stub, answer in reversed(list(zip(ex.stub_lines("\n".join(lines)), answers))):
        lines[stub - 1:stub] = answer
    mine = tmp_path / f"{module}.py"
    mine.write_text("\n".join(lines) + "\n")
    written = mine.read_text()
    report = grade(module, str(mine), quick=True, jobs=1)
    assert report.passed, report.text()
    assert mine.read_text() == written and not (tmp_path / "__pycache__").exists()


@pytest.mark.gpu
def test_the_answer_key_meets_its_own_speed_bar_on_a_gpu():
    """On a GPU every stage ends with a speed case: the solution timed against itself is ~100%."""
    for name in ("scan", "histogram", "argmax", "matvec", "stencil"):
        report = grade(name, "solutions", quick=True)
        assert report.passed, report.text()
        for stage in report.graded:
            speed = [c for c in stage.cases if c.kind == "speed"]
            assert speed and speed[0].speed["ratio"] > 0.6, (stage.key, speed)
