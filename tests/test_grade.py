"""The autograder: the answer key passes, stubs are "not implemented yet", every planted bug is
rejected for its reason, hangs and crashes cost one case, reports come as text, JSON and JUnit.

Everything runs in the simulator at the grader's quick sizes; the planted catalog is graded in
parallel subprocesses once per session (the `planted` fixture) and each file's verdict is a test.
"""

import ast
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from workbench.check import compare, is_poison, poison_like
from workbench.grade import grade, grade_function

ROOT = Path(__file__).resolve().parent.parent
PLANTED = sorted((ROOT / "tests" / "planted").glob("*.py"))
QUICK_TIMEOUT = 8.0  # the hanging submission's per-case timeout here


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXPECT":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no EXPECT")


def snapshot(*dirs) -> dict:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for d in dirs for p in sorted(Path(d).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def planted():
    """Grade every planted file (2 at a time); also record that no learner file changed meanwhile."""
    before = snapshot(ROOT / "tests" / "planted", ROOT / "exercises")

    def one(path):
        want = expectation(path)
        if want["reason"] == "timeout":  # one small case, a short timeout
            return path, grade(want["stage"], str(path), sizes=[(5,)], timeout=QUICK_TIMEOUT, jobs=1)
        if want["reason"] == "crash":  # the whole op: the file's other stage must still be graded
            return path, grade(want["stage"].split(".")[0], str(path), quick=True, jobs=1)
        return path, grade(want["stage"], str(path), quick=True, jobs=1)

    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(pool.map(one, PLANTED))
    after = snapshot(ROOT / "tests" / "planted", ROOT / "exercises")
    return reports, before == after


def test_catalog_covers_the_classic_bugs():
    reasons = {expectation(p)["reason"] for p in PLANTED}
    for reason in ("nan", "out-of-bounds", "unwritten", "all-zeros", "uninitialised", "wrong-values",
                   "no-kernel-launch", "input-modified", "launch-limit", "timeout", "crash", "answer-key"):
        assert reason in reasons
    assert len(PLANTED) >= 12


@pytest.mark.parametrize("path", PLANTED, ids=[p.stem for p in PLANTED])
def test_planted_bug_is_rejected_with_its_reason(planted, path):
    reports, _ = planted
    want = expectation(path)
    report = reports[path]
    (stage,) = [s for s in report.stages if s.key == want["stage"]]
    assert stage.status == "fail", f"{path.name} was not rejected"
    failed = [c for c in stage.cases if not c.passed]
    named = [c for c in failed if c.reason == want["reason"] and want["says"] in f"{c.message} {c.advice}"]
    assert named, f"{path.name}: expected {want}, got " + "; ".join(f"{c.reason}: {c.message}" for c in failed)
    assert not report.passed


def test_grading_goes_on_after_a_crash(planted):
    reports, _ = planted
    report = reports[ROOT / "tests" / "planted" / "crashes.py"]
    status = {s.key: s.status for s in report.stages}
    assert status == {"histogram.global_atomics": "fail", "histogram.shared_privatized": "pass"}


def test_a_hang_fails_its_case_after_the_timeout(planted):
    reports, _ = planted
    (stage,) = reports[ROOT / "tests" / "planted" / "hangs.py"].stages
    (case,) = stage.cases
    assert case.reason == "timeout" and f"{QUICK_TIMEOUT:.0f} s" in case.message


def test_grading_never_writes_to_the_submissions(planted):
    _, unchanged = planted
    assert unchanged
    assert not (ROOT / "tests" / "planted" / "__pycache__").exists()


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
    junit = tmp_path / "grade.xml"
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "--quick", "--json", "--junit", str(junit)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
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
