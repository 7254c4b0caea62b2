"""The autograder: the answer key passes, stubs are "not implemented yet", every planted bug and cheat
is rejected for its reason, nothing a submission does in its own process decides its verdict or
outlives grading, harness errors are never blamed on the learner, and reports come as text, JSON and
JUnit.

Everything runs in the simulator at small sizes; each planted file is graded by its own test, so
that pytest-xdist spreads them over the cores. Grading every exercise with the answer key is the
slow tier (``-m slow``).
"""

import argparse
import ast
import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from workbench.check import compare, is_poison, judge, poison_like
from workbench.grade import grade, grade_function
from workbench.grade.channel import Channel, ChannelGarbage
from workbench.grade.report import CaseResult, Report, StageGrade
from workbench.grade.cases import Submission
from workbench.grade.stages import Listener, grade_stage
from workbench.grade.supervisor import GraderError
from workbench.registry import UnknownTarget, resolve
from workbench.sizes import SizeError

# The planted bugs are caught by the simulator's strictness (IndexError, NaN shared memory, launch
# limits): on a GPU most of them would run silently. The GPU test at the end checks the speed bar.
pytestmark = pytest.mark.sim_only

ROOT = Path(__file__).resolve().parent.parent
PLANTED = sorted((ROOT / "tests" / "planted").glob("*.py"))
CORRECT = sorted((ROOT / "tests" / "planted" / "correct").glob("*.py"))
QUICK_TIMEOUT = 5.0  # the hanging submission's per-case timeout here


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXPECT":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no EXPECT")


def grade_planted(path: Path):
    want = expectation(path)
    if want.get("reason") == "timeout":  # one small case, a short timeout
        return grade(want["stage"], str(path), sizes=[(5,)], timeout=QUICK_TIMEOUT, jobs=1)
    if want.get("reason") == "crash":  # the whole op: the file's other stage must still be graded
        return grade(want["stage"].split(".")[0], str(path), quick=True, jobs=1)
    if "sizes" in want:  # a bug that needs a size past the quick ones
        return grade(want["stage"], str(path), sizes=[tuple(s) for s in want["sizes"]], jobs=1)
    return grade(want["stage"], str(path), quick=True, jobs=1)


def running_processes_named(text: str) -> list[str]:
    """Live processes whose name or command line contains ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in stat[:stat.rfind(")")] + cmd and stat[stat.rfind(")") + 2] not in "ZX":
            found.append(f"{pid}: {cmd}")
    return found


def test_catalog_covers_the_classic_bugs_and_the_cheats():
    reasons = set()
    for p in PLANTED:
        want = expectation(p)["reason"]
        reasons |= set(want) if isinstance(want, list) else {want}
    for reason in ("nan", "out-of-bounds", "unwritten", "all-zeros", "uninitialised", "wrong-values",
                   "no-kernel-launch", "input-modified", "launch-limit", "timeout", "crash", "answer-key",
                   "exec", "exited", "channel", "stale", "host-copy", "process", "background-process", "wrote-file",
                   "race", "thread", "tampered"):
        assert reason in reasons, reason
    assert len(PLANTED) >= 25 and len(CORRECT) >= 2


# The quick tier grades one planted file per kind of trouble (a cheat, a hang, a crash, a race, host
# computation, tampering, a side effect, a missing barrier); -m slow grades every one.
QUICK_PLANTED = {"answer_key", "hangs", "crashes", "race_between_blocks", "host_numpy", "monkeypatches_the_checks",
                 "writes_into_the_repository", "missing_syncthreads_reduction"}


def _tiered(paths, quick):
    return [pytest.param(p, id=p.stem, marks=() if p.stem in quick else pytest.mark.slow) for p in paths]


@pytest.mark.parametrize("path", _tiered(PLANTED, QUICK_PLANTED))
def test_planted_bug_is_rejected_with_its_reason(path):
    """Each file is graded in its own worker at the quick sizes; pytest-xdist spreads the files."""
    before = path.read_bytes(), path.stat().st_mtime_ns
    source = path.read_text()
    report = grade_planted(path)
    want = expectation(path)
    (stage,) = [s for s in report.stages if s.key == want["stage"]]
    assert stage.status == "failed", f"{path.name} was not rejected: {report.text()}"
    failed = [c for c in stage.cases if c.failed]
    reasons = want["reason"] if isinstance(want["reason"], list) else [want["reason"]]
    named = [c for c in failed if c.reason in reasons and want["says"] in f"{c.message} {c.advice}"]
    assert named, f"{path.name}: expected {want}, got " + "; ".join(f"{c.reason}: {c.message}" for c in failed)
    assert not report.passed
    assert report.files == [f"tests/planted/{path.name}"]  # what was graded, as the learner knows it
    if want["reason"] == "crash":  # grading went on in a fresh process: the file's correct stage passed
        statuses = {s.key: s.status for s in report.stages}  # (the file defines two of the ladder's stages)
        assert (statuses["histogram.global_atomics"], statuses["histogram.shared_privatized"]) == ("failed", "passed")
    if want["reason"] == "timeout":
        (case,) = stage.cases
        assert f"{QUICK_TIMEOUT:.0f} s" in case.message
    # Nothing it started is still running; nothing it wrote into the repository is there.
    for marker in ("planted-background-process", "plantedfork"):
        if marker in source:
            assert not running_processes_named(marker), f"{path.name} left a process behind"
    assert not (ROOT / "planted-write-into-the-repository.txt").exists()
    # Grading never writes to the submission (nor byte-compiles next to it).
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert not (path.parent / "__pycache__").exists()


@pytest.mark.parametrize("path", CORRECT, ids=[p.stem for p in CORRECT])
def test_correct_but_unusual_submission_passes(path):
    want = expectation(path)
    report = grade(want["stage"], str(path), quick=True, jobs=1)
    assert report.passed, report.text()
    (stage,) = report.stages
    if "note" in want:
        assert any(want["note"] in note for note in stage.notes), stage.notes
        assert "delete it" in report.text()


def test_what_a_submission_prints_is_its_output_never_the_protocol(tmp_path):
    """A print without a newline, protocol-looking garbage and bytes that are not UTF-8: the CLI's JSON
    report is still JSON, the stage passes, and the output is shown as the submission's."""
    path = ROOT / "tests" / "planted" / "correct" / "prints_garbage.py"
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "histogram.global_atomics", "--impl",
                           str(path), "--size", "300", "--json"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] and "Traceback" not in done.stderr
    (stage,) = report["stages"]
    printed = stage["cases"][0]["output"]
    assert "counting 300 elements..." in printed and "half a line on stderr" in printed and "done" in printed


def test_the_generated_stubs_are_not_implemented_yet_never_a_crash(tmp_path):
    from workbench.generate.exercises import build

    exercises = tmp_path / "exercises"  # as built now (whether the committed copy is stale is another test)
    build(exercises, only=["histogram", "scan"])
    junit = tmp_path / "grade.xml"
    before = {p: p.read_bytes() for p in exercises.iterdir()}
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "--impl", str(exercises), "--quick",
                           "--json", "--junit", str(junit)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert {p: p.read_bytes() for p in exercises.iterdir()} == before  # grading never writes to them
    report = json.loads(done.stdout)
    stages = sum(len(resolve(name)[0].stages) for name in ("histogram", "scan"))
    assert report["score"]["passed"] == 0 and report["score"]["judged"] == stages
    assert report["score"]["not_implemented"] == stages
    assert sorted(report["files"]) == [str(exercises / "histogram.py"), str(exercises / "scan.py")]
    for stage in report["stages"]:
        assert stage["status"] == "not-implemented", stage
        case = stage["cases"][-1]
        assert case["reason"] == "not-implemented" and "not implemented yet" in case["message"]
    suite = ElementTree.parse(junit).getroot()
    assert int(suite.get("failures")) >= 4
    assert {f.get("type") for f in suite.iter("failure")} == {"not-implemented"}


def test_cli_report_names_the_file_the_first_wrong_index_and_the_worst_elements(tmp_path):
    junit = tmp_path / "j.xml"
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "stencil.naive", "--impl",
                           "tests/planted/transposed_weights.py", "--size", "9x13", "--junit", str(junit)],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 1, done.stderr
    text = " ".join(done.stdout.split())
    assert "graded tests/planted/transposed_weights.py" in text and "solutions.stencil" not in text
    assert "FAIL" in text and "first wrong index" in text and "worst elements" in text and "max abs error" in text
    assert "w[i, j]" in text  # the operator's own hint, not eaten as markup
    assert "score: 0 of 1 judged stage passed" in text
    assert "not judged: the speed bar" in text  # no GPU here: said, not hidden
    case = next(ElementTree.parse(junit).getroot().iter("testcase"))
    assert case.get("classname") == "stencil.naive" and case.find("failure").get("type") == "wrong-values"


def test_missing_stage_and_broken_file_are_reported(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def global_atomics(x, out):\n    return (\n")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    for path, reason, says in ((broken, "import-error", "line 2"), (empty, "missing", "no stage")):
        (stage,) = grade("histogram.global_atomics", str(path), sizes=[(5,)], jobs=1).stages
        assert stage.status == "failed" and stage.cases[0].reason == reason, stage.cases[0].message
        assert path.name in stage.cases[0].message and says in stage.cases[0].message, stage.cases[0].message


def test_a_launch_too_big_for_the_simulator_needs_a_gpu_and_is_not_a_wrong_answer(tmp_path):
    """A persistent grid sized for a real H200 (132 SMs x 32 blocks) is more threads than the simulator
    runs in a case's time: refused up front, "needs a GPU", with what to do; not failed, not a hang."""
    mine = tmp_path / "persistent.py"
    mine.write_text(
        "from numba import cuda, int32\n\n\n"
        "@cuda.jit\n"
        "def _count(x, out):\n"
        "    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):\n"
        "        cuda.atomic.add(out, x[i], int32(1))\n\n\n"
        "def global_atomics(x, out):\n"
        "    _count[132 * 32, 256](x, out)  # (and never zeroes out: not what this test is about)\n")
    report = grade("histogram.global_atomics", str(mine), sizes=[(100,)], jobs=1)
    (stage,) = report.stages
    assert stage.status == "skipped" and not report.graded, report.text()
    assert "needs a GPU" in report.summary() and "grid-stride" in report.summary()


def test_a_stage_the_simulator_cannot_run_is_skipped_and_counted_apart():
    report = grade("gemm.tensor_core", "solutions", jobs=1)
    (stage,) = report.stages
    assert stage.status == "skipped" and not stage.judged
    assert report.score == (0, 0) and not report.passed
    assert "1 skipped: gemm.tensor_core (needs a GPU" in report.summary()
    assert report.as_dict()["score"]["skipped"] == 1


# -- harness errors are the grader's, never the learner's -----------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["histogram", "--size", "-5"], "at least 1"),
    (["histogram", "--size", "2**40"], "more than"),
    (["histogram", "--size", "ten"], "size must look like"),
    (["histogram.nosuchstage"], "no stage 'nosuchstage'"),
    (["nosuchop"], "no operator 'nosuchop'"),
])
def test_bad_input_is_one_line_before_anything_runs(argv, says, capsys):
    from workbench.cli import main

    try:
        code = main(["grade", *argv, "--impl", "solutions"])
    except SystemExit as exc:  # argparse refuses a --size it cannot parse
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and not out.strip()
    (line,) = [line for line in err.splitlines() if "error" in line]  # (argparse adds its usage)
    assert says in line and "crash" not in err, err


def test_bad_size_from_the_real_command_line_is_one_line_no_traceback():
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "grade", "histogram", "--size", "33x65"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and not done.stdout.strip()
    assert "histogram takes N" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "grading" not in done.stderr  # refused before anything ran


def test_sizes_and_targets_are_refused_by_the_api_too():
    with pytest.raises(SizeError, match="histogram takes N"):
        grade("histogram", "solutions", sizes=[(3, 4)])
    with pytest.raises(UnknownTarget):
        grade("histogram.nope", "solutions")


def test_an_internal_error_is_one_line_and_not_the_learners(monkeypatch, capsys):
    from workbench.grade import cli

    def broken(*args, **kwargs):
        raise RuntimeError("something inside the grader")

    monkeypatch.setattr(cli, "grade", broken)
    args = argparse.Namespace(target="histogram", impl="solutions", size=None, quick=True, seed=None, timeout=None,
                              jobs=1, no_speed=True, json=True, junit=None)
    assert cli.cmd_grade(args) == 2
    err = capsys.readouterr().err
    assert "grader error (not your code): RuntimeError: something inside the grader" in " ".join(err.split())
    assert "Traceback" not in err


class _BrokenSession:
    """A worker whose grader side fails: the stage is an error, not a failed stage of the learner."""

    def loaded(self):
        return {"ok": True}

    def prepare(self, op, stage):
        raise GraderError("the worker could not describe the stage")


def test_a_grader_error_is_not_counted_against_the_submission():
    _, (stage,) = resolve("histogram.global_atomics")
    grade_ = grade_stage(stage, _BrokenSession(), [], Submission(None, "mine.py"), seed=1, speed=False, key=None,
                         listener=Listener())
    assert grade_.status == "error" and not grade_.judged
    report = Report("mine.py", "sim", 1, stages=[grade_, StageGrade("histogram.shared_privatized", 2, "passed")])
    assert report.score == (1, 1) and not report.passed
    assert "grader error (not your code)" in report.summary() and "grader error (not your code)" in report.text()
    assert "<error" in report.junit()


def test_progress_bars_follow_stages_and_cases():
    import io

    from rich.console import Console
    from rich.progress import Progress

    from workbench.grade.cli import ProgressBars
    from workbench.grade.report import CaseResult

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Progress(console=console, transient=True) as progress:
        bars = ProgressBars(progress, total_stages=2)
        bars.file_started("exercises/histogram.py", 2)
        for key in ("histogram.global_atomics", "histogram.shared_privatized"):
            bars.stage_started(key, 3)
            for _ in range(3):
                bars.case_done(key, CaseResult(key, [5], "passed"))
            (task,) = [t for t in progress.tasks if t.description.strip() == key]
            assert task.completed == 3
            bars.stage_done(StageGrade(key, 1, "passed"))
        (overall,) = progress.tasks
        assert overall.completed == 2
    assert "grading exercises/histogram.py" in console.file.getvalue()


def test_summary_counts_skipped_apart():
    stages = [StageGrade("a.x", 1, "passed"), StageGrade("a.y", 2, "failed"),
              StageGrade("a.z", 3, "skipped", notes=["needs a GPU: links CUDA C++"]),
              StageGrade("a.w", 4, "not-implemented"), StageGrade("a.v", 5, "not-an-exercise", notes=["given whole"])]
    report = Report("exercises", "sim", 1, stages=stages)
    assert report.summary() == ("1 of 3 judged stages passed; 1 skipped: a.z (needs a GPU: links CUDA C++); "
                                "1 not an exercise: a.v")
    assert report.as_dict()["score"] == {"passed": 1, "judged": 3, "failed": 1, "not_implemented": 1,
                                         "skipped": 1, "not_an_exercise": 1, "errors": 0}


# -- the channel ----------------------------------------------------------------------------------

def test_channel_carries_arrays_and_refuses_garbage():
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    arrays = [np.arange(7, dtype=np.float32), np.zeros((2, 3), np.int64), np.array(3, np.uint8)]
    left.send({"type": "call", "id": 4}, arrays)
    header, got = right.receive()
    assert header == {"type": "call", "id": 4}
    assert all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(arrays, got))
    for garbage in (b"@@workbench-grade@@ {\"passed\": true}\n", b"WBG1" + (10).to_bytes(8, "little") + b"not json!!"):
        a.sendall(garbage)
        with pytest.raises(ChannelGarbage):
            right.receive()
        a.close(), b.close()
        a, b = socket.socketpair()
        left, right = Channel(a), Channel(b)
    forged = b'{"arrays": [{"dtype": "O", "shape": [1]}]}'
    a.sendall(b"WBG1" + len(forged).to_bytes(8, "little") + forged)
    with pytest.raises(ChannelGarbage):  # never an object array (nothing is unpickled)
        right.receive()



def test_a_messages_arrays_may_arrive_after_its_deadline_at_a_busy_hosts_pace(monkeypatch):
    """The deadline is for the message to start: its arrays then get the time moving them takes at
    SLOW_HOST_BYTES_PER_S (a 1-GB reply on a loaded H200 host was taken for a call that never returned),
    and a sender slower than that still times out."""
    import threading
    import time

    from workbench.grade import channel
    from workbench.grade.channel import ChannelTimeout

    monkeypatch.setattr(channel, "SLOW_HOST_BYTES_PER_S", 1e6)  # 1 MB/s: 400 kB may take 0.4 s more
    array = np.arange(100_000, dtype=np.float32)  # 400 kB

    def received_in_pieces(pause_s: float):
        a, b = socket.socketpair()
        left, right = Channel(a), Channel(b)
        data = array.view(np.uint8)

        def send():
            header = {"type": "x", "arrays": [{"dtype": "<f4", "shape": [array.size]}]}
            blob = json.dumps(header).encode()
            a.sendall(b"WBG1" + len(blob).to_bytes(8, "little") + blob)
            for k in range(4):  # four pieces, a pause before each
                time.sleep(pause_s)
                a.sendall(data[k * data.size // 4:(k + 1) * data.size // 4])

        sender = threading.Thread(target=send)
        sender.start()
        try:
            return right.receive(time.monotonic() + 0.1)
        finally:
            sender.join()
            a.close(), b.close()

    header, (got,) = received_in_pieces(0.05)  # 0.2 s in all: past the deadline, within the bytes' time
    assert header == {"type": "x"} and np.array_equal(got, array)
    with pytest.raises(ChannelTimeout):
        received_in_pieces(0.2)  # 0.8 s in all: a trickle


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


def my_histogram_on_the_host(x, out):
    counts = np.bincount(x.copy_to_host(), minlength=256).astype(np.int32)
    _zero[1, 256](out)
    out.copy_to_device(counts)


def test_grade_function_grades_a_launcher_defined_here(capsys):
    report = grade_function("histogram.global_atomics", my_histogram, quick=True)
    assert report.passed
    assert "score: 1 of 1 judged stage passed" in " ".join(capsys.readouterr().out.split())
    report = grade_function("histogram.global_atomics", my_histogram_forgets_to_zero, sizes=[(100,)], show=False)
    assert not report.passed and report.stages[0].cases[0].reason == "uninitialised"
    report = grade_function("histogram.global_atomics", my_histogram_on_the_host, sizes=[(100,)], show=False)
    assert report.stages[0].cases[0].reason == "host-copy"
    assert cuda.to_device(np.ones(3)).copy_to_host().sum() == 3  # the guard is gone after the call


def test_grade_function_rejects_the_answer_key():
    from solutions import histogram

    report = grade_function("histogram.global_atomics", lambda x, out: histogram.global_atomics.launch(x, out),
                            sizes=[(100,)], show=False)
    (case,) = report.stages[0].cases  # judged before anything runs
    assert case.reason == "answer-key" and "answer key" in case.message and "_global_atomics" in case.message


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


@pytest.mark.parametrize("module", ["histogram", pytest.param("stencil", marks=pytest.mark.slow)])
def test_an_exercise_filled_in_with_the_answers_passes(module, tmp_path):
    """What a learner gets is enough: the exercise's own declarations and launchers, with each stub
    line replaced by the code that was marked, pass the grader (and the learner's file is untouched)."""
    from workbench.generate.exercises import build, find_regions
    from workbench.markers import stub_lines

    solution = (ROOT / "solutions" / f"{module}.py").read_text()
    answers = [solution.splitlines()[r.begin + 1:r.end] for r in find_regions(solution)]
    build(tmp_path, only=[module])
    mine = tmp_path / f"{module}.py"
    lines = mine.read_text().splitlines()
    stubs = stub_lines("\n".join(lines))
    assert len(stubs) == len(answers)
    for stub, answer in reversed(list(zip(stubs, answers))):
        lines[stub - 1:stub] = answer
    mine.write_text("\n".join(lines) + "\n")
    written = mine.read_text()
    report = grade(module, str(mine), quick=True, jobs=1)
    assert report.passed, report.text()
    assert not any(s.notes for s in report.stages)  # no leftover TODO line
    assert mine.read_text() == written and not (tmp_path / "__pycache__").exists()


@pytest.mark.slow
def test_the_answer_key_passes_every_exercise():
    report = grade(None, "solutions", quick=True)
    graded = report.graded
    assert len(graded) >= 10
    failed = [f"{s.key}: {c.reason} {c.message}" for s in graded for c in s.cases if not c.passed]
    assert not failed, "\n".join(failed)
    assert report.passed and not report.errors
    for name in ("scan", "histogram", "argmax", "matvec", "stencil"):
        assert sum(s.key.startswith(name + ".") for s in graded) >= 2


@pytest.mark.gpu
@pytest.mark.timing(whole=True, early=True)  # the speed bar is measured in the grader's worker process
def test_the_answer_key_meets_its_own_speed_bar_on_a_gpu():
    """On a GPU every stage ends with a speed case: the solution timed against itself is ~100%. The last
    stage of five operators (grading whole ladders here took two minutes of the GPU suite's eight)."""
    from workbench.registry import operator

    for name in ("scan", "histogram", "argmax", "matvec", "stencil"):
        report = grade(operator(name).stages[-1].key, "solutions", quick=True)
        assert report.passed, report.text()
        for stage in report.graded:
            speed = [c for c in stage.cases if c.kind == "speed"]
            assert speed and speed[0].speed["ratio"] > 0.6, (stage.key, speed)


@pytest.mark.gpu
def test_planted_cheats_are_rejected_on_a_gpu_too():
    """The trust boundary does not depend on the simulator: host copies go through numba's driver."""
    for name in ("host_numpy", "host_numpy_asarray", "answer_key", "writes_into_the_repository", "caches_by_shape"):
        path = ROOT / "tests" / "planted" / f"{name}.py"
        want = expectation(path)
        report = grade(want["stage"], str(path), quick=True, jobs=1, speed=False)
        (stage,) = report.stages
        reasons = want["reason"] if isinstance(want["reason"], list) else [want["reason"]]
        assert stage.status == "failed" and any(c.reason in reasons for c in stage.cases), report.text()


def test_the_answer_key_is_refused_by_name_where_the_worker_cannot_even_find_it(tmp_path):
    """Where the package is not installed (the GPU machine puts the checkout on PYTHONPATH, which the worker
    drops), `from solutions.x import ...` must still be refused as the answer key, not end as a plain
    ModuleNotFoundError that reads like the learner's typo."""
    import subprocess
    import sys

    (tmp_path / "workbench").symlink_to(ROOT / "workbench", target_is_directory=True)
    script = f"""
import sys
import time
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]  # as if not pip-installed
sys.path[:0] = [{str(tmp_path)!r}]
try:
    import solutions
    raise SystemExit("solutions importable: this test needs it not to be")
except ImportError:
    pass
from workbench.grade.guards import Guard
guard = Guard([{str(ROOT / "solutions")!r}])
guard.install()
import solutions._templates  # a shared helper stays importable
try:
    from solutions.histogram import THREADS
except ImportError as exc:
    print([r.reason for r in guard.take()], exc)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("['answer-key']") and "cannot be imported while grading" in run.stdout, run.stdout


# -- what a GPU shows differently: launch limits, races by their effect, large adversarial sizes -------

def test_a_launch_past_the_grid_y_limit_is_refused_naming_the_limit():
    """On a GPU the driver answers CUDA_ERROR_INVALID_VALUE; the grader's watch says which limit."""
    from workbench.grade.watch import check_launch_limits
    from workbench.simulator import LaunchLimitError

    check_launch_limits((2**31 - 1, 65535, 65535), (32, 32, 1))  # at the limits: fine
    with pytest.raises(LaunchLimitError, match="gridDim.y = 187501 exceeds its limit of 65535"):
        check_launch_limits((1, 187501), (16, 16))
    with pytest.raises(LaunchLimitError, match="1024 threads per block"):
        check_launch_limits(1, (64, 32))


class _Replies:
    """A session whose second call of a case returns ``second``."""

    def __init__(self, second):
        self.second = second

    def call(self, stage, case_id, inputs, out, limit=None, sm_count=None):
        from workbench.grade.supervisor import CallReply

        return CallReply(None, [], [], 0.0, self.second, list(inputs))


def test_a_second_run_that_differs_is_named_a_race():
    from workbench.grade.cases import Case, second_run_differs
    from workbench.grade.draws import random_draw

    _, (stage,) = resolve("histogram.global_atomics")
    case = Case((1000,), "random", random_draw(stage.op, (1000,), 0, 0))
    first = np.arange(256, dtype=np.int32)
    changed = first.copy()
    changed[7] += 1
    said = second_run_differs(stage, _Replies(changed), case, 0, (), first, 0.0)
    assert "second run on the same inputs gave a different output" in said and "[7]" in said
    assert second_run_differs(stage, _Replies(first.copy()), case, 0, (), first, 0.0) == ""
    _, (stage,) = resolve("reduction.naive")
    total = np.array([1000.0], np.float32)  # floats: a difference inside the tolerance is atomics' order
    case = Case((1000,), "random", random_draw(stage.op, (1000,), 0, 0))
    assert second_run_differs(stage, _Replies(total * np.float32(1 + 1e-6)), case, 0, (), total, 1e-5) == ""


def test_the_adversarial_sets_also_run_at_a_large_size():
    """Past one full resident grid (a missing grid-stride loop, a float32 running total), below 2^28; in
    the simulator too, whose largest sizes are a few thousand elements (a float32 running total of 4100
    after a large first element passed there while the sets ran only at the two smallest sizes)."""
    from workbench.grade.cases import ADVERSARIAL_LARGE_MAX_ELEMENTS, plan

    op, _ = resolve("reduction")
    sizes = [(1,), (31,), (1000,), (ADVERSARIAL_LARGE_MAX_ELEMENTS * 2,)]
    adversarial = lambda cases: [c.size for c in cases if not c.inputs.startswith(("random", "again, new inputs"))]
    assert set(adversarial(plan(op, sizes, 0))) == {(1,), (31,), (1000,)}


def test_the_answer_key_itself_imports_its_helpers_where_it_is_not_installed(tmp_path):
    """Grading the answer key (no guard), where the package is not installed: its modules import the
    package's helpers (`from solutions._templates import instantiate`), which the worker's path, without the
    repository, did not find ("No module named 'solutions'" on the GPU machine, 2026-11-24)."""
    import subprocess
    import sys

    (tmp_path / "workbench").symlink_to(ROOT / "workbench", target_is_directory=True)
    script = f"""
import sys
import time
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]  # as if not pip-installed
sys.path[:] = [p for p in sys.path if p not in ("", {str(ROOT)!r})]
sys.path[:0] = [{str(tmp_path)!r}]
try:
    import solutions
    raise SystemExit("solutions importable: this test needs it not to be")
except ImportError:
    pass
from workbench.grade.worker import answer_key_importable
answer_key_importable([{str(ROOT / "solutions")!r}])
from solutions._templates import instantiate
print("imported", instantiate.__module__)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("imported solutions._templates"), run.stdout


# -- a stub never passes; what is not an exercise says so --------------------------------------------

@pytest.mark.parametrize("target, says", [
    ("conv2d.direct", "conv.py imports the ladder module"),  # its module gets no exercise file
    ("attention.tensor_cores", "given whole"),  # nothing on its path is marked
])
def test_a_stage_that_is_no_exercise_is_listed_never_failed(target, says):
    report = grade(target, "exercises", jobs=1)
    (stage,) = report.stages
    assert stage.status == "not-an-exercise" and not stage.judged and not stage.cases, report.text()
    assert says in stage.notes[0] and report.score == (0, 0)
    assert f"1 not an exercise: {target}" in report.summary() and "not an exercise" in report.text()
    assert report.files == []  # no file was looked for, so none is missing


def test_the_answer_key_still_grades_every_stage_no_exercise_or_not():
    assert grade("attention.tensor_cores", "solutions", sizes=[(1, 2, 5, 8, 0)], jobs=1).passed


def test_a_pristine_exercise_that_passes_never_ran_learner_code(tmp_path):
    """The stage's only TODO is in a helper it never calls (as attention[fp16].mma_scores' was): in an
    exercise nobody edited, a pass means no learner code ran. It is "not an exercise", never a pass."""
    from workbench.markers import HEADER_END, digest

    correct = (ROOT / "tests" / "planted" / "correct" / "leftover_todo_line.py").read_text()
    body = correct.replace("    pass  # TODO(exercise)", "    # (moved below)\n    # TODO(exercise)") + (
        "\n\nUSE_HELPER = False\n\n\n"
        "def _helper(out):\n"
        "    pass  # TODO(exercise): not implemented yet: replace this line with your code\n\n\n"
        "def global_atomics_with_helper(x, out):\n"
        "    global_atomics(x, out)\n"
        "    if USE_HELPER:\n"
        "        _helper(out)\n")
    body = body.replace("def global_atomics(x, out):", "def _global_atomics(x, out):").replace(
        "    global_atomics(x, out)\n", "    _global_atomics(x, out)\n").replace(
        "def global_atomics_with_helper(", "def global_atomics(")
    pristine = tmp_path / "histogram.py"
    pristine.write_text(f"{HEADER_END}\n# generated-sha256: {digest(body)}\n{HEADER_END}\n{body}")
    (stage,) = grade("histogram.global_atomics", str(pristine), quick=True, jobs=1).stages
    assert stage.status == "not-an-exercise" and "never runs" in stage.notes[0], stage
    edited = tmp_path / "edited" / "histogram.py"  # the same code, edited by its learner: a pass
    edited.parent.mkdir()
    edited.write_text(pristine.read_text() + "# mine\n")
    (stage,) = grade("histogram.global_atomics", str(edited), quick=True, jobs=1).stages
    assert stage.status == "passed" and "TODO(exercise) line" in stage.notes[-1]


@pytest.mark.parametrize("options, says", [
    (["--timeout", "-5"], "--timeout -5.0: seconds per case, a number greater than 0"),
    (["--timeout", "0"], "--timeout 0.0: seconds per case"),  # not a silent "the default"
    (["--jobs", "0"], "--jobs 0: operators graded in parallel"),
    (["--seed", "-1"], "--seed -1: a seed is a whole number from 0"),  # not a grader error
    (["--impl", "README.md"], "--impl README.md: not a Python file"),
    (["--impl", "no/such/place"], "--impl no/such/place: no such file or folder"),
    (["--junit", "{tmp}/not/made/yet/report.xml"], "not/made/yet does not exist"),
    (["--impl", "{tmp}"], "the folder has no histogram.py for histogram"),  # one line, not a FAIL per stage
])
def test_every_option_is_checked_with_one_line_before_anything_runs(options, says, tmp_path, capsys):
    from workbench.cli import main

    code = main(["grade", "histogram", "--size", "5", *[o.replace("{tmp}", str(tmp_path)) for o in options]])
    out, err = capsys.readouterr()
    assert code == 2 and not out.strip(), err
    assert err.count("error:") == 1, err  # one message (rich may wrap it to the terminal's width)
    assert says.replace("{tmp}", str(tmp_path)) in " ".join(err.split()), err
    assert "grader error" not in err and "grading" not in err
    assert not (tmp_path / "not").exists()  # no folder was made


def test_the_api_refuses_the_same_options():
    from workbench.grade.api import BadOption

    for options in (dict(timeout=0), dict(timeout=-5.0), dict(jobs=0), dict(seed=-1)):
        with pytest.raises(BadOption):
            grade("histogram", "solutions", sizes=[(5,)], **options)


def test_a_kernel_that_never_ends_is_stopped_after_a_multiple_of_the_solutions_time(monkeypatch):
    """With the default timeout (300 s a case in the simulator), not after it: a few times the answer
    key's own time at that size, at least RUNAWAY_FLOOR_S (2 s here rather than 10, to keep the tier quick)."""
    from workbench.grade import cases, supervisor

    RUNAWAY_FLOOR_S = 2.0
    monkeypatch.setattr(supervisor, "RUNAWAY_FLOOR_S", RUNAWAY_FLOOR_S)
    monkeypatch.setattr(cases, "RUNAWAY_FLOOR_S", RUNAWAY_FLOOR_S)
    t0 = time.monotonic()
    report = grade("scan.hillis_steele", str(ROOT / "tests" / "planted" / "hangs.py"), sizes=[(5,)], jobs=1)
    took = time.monotonic() - t0
    (stage,) = report.stages
    case = stage.cases[0]
    assert case.reason == "timeout" and "times the solution's" in case.message, case.message
    assert took < RUNAWAY_FLOOR_S + 45, took  # the floor, starting the worker, and stopping it


def test_a_call_that_compiles_is_allowed_the_time_the_solution_took_to_compile(monkeypatch):
    """On the H200, graded beside other files, qlinear.fused's call at 33x40x48 (a size that needs another
    kernel) compiled for 29 s and was stopped as "a loop that never ends" after 10. The limit adds what the
    solution's own first call at that size took beyond its later ones: compiling, on this machine, now."""
    from workbench.grade import cases
    from workbench.grade.supervisor import RUNAWAY_FLOOR_S

    compiled = []

    def run_once(stage, inputs, template):  # the first call compiles (0.5 s here), later ones run (10 ms)
        time.sleep(0.01 if compiled else 0.5)
        compiled.append(True)

    monkeypatch.setattr(cases, "run_once", run_once)
    monkeypatch.setattr(cases._device, "is_simulator", lambda: False)
    _, (stage,) = resolve("scan.hillis_steele")
    allowed, why = cases.runaway_limit(stage, (12345,), ())()
    assert RUNAWAY_FLOOR_S + 0.4 < allowed < RUNAWAY_FLOOR_S + 1, allowed
    assert "to compile" in why


@pytest.mark.slow
def test_every_fresh_stub_fails_and_what_is_no_exercise_says_so(tmp_path):
    """`grade` on exercises as generated now: every stage `todo`, `not an exercise` or skipped (needs a
    GPU); none passes without learner code, none FAILs (the conv family once failed: no conv.py)."""
    from workbench.generate.exercises import build

    exercises = tmp_path / "exercises"
    build(exercises)
    report = grade(None, str(exercises), quick=True)
    statuses = {s.key: s.status for s in report.stages}
    assert set(statuses.values()) <= {"not-implemented", "not-an-exercise", "skipped"}, [
        (s.key, s.status, s.cases[-1].message if s.cases else s.notes) for s in report.stages
        if s.status not in ("not-implemented", "not-an-exercise", "skipped")]
    for key in ("attention[fp16].mma_scores", "attention[bf16].mma_scores"):  # (a folder: conv has no file there)
        assert statuses[key] == "not-an-exercise", key
    assert sum(s == "not-implemented" for s in statuses.values()) > 250


def test_a_fault_on_the_gpu_is_the_learners_in_every_case_never_a_grader_error():
    report = grade("histogram.global_atomics", str(ROOT / "tests" / "planted" / "gpu_fault.py"), quick=True, jobs=1)
    (stage,) = report.stages
    assert stage.status == "failed" and not report.errors, report.text()
    assert len(stage.cases) > 2 and {c.reason for c in stage.cases} == {"gpu-fault"}  # a fresh worker each time
    assert "illegal memory address" in stage.cases[0].message and "global_atomics" in report.text()


# -- diagnoses that point the right way ---------------------------------------------------------------

def test_a_shared_memory_race_says_barrier_first_and_its_detail_once():
    report = grade("reduction.shared_tree", str(ROOT / "tests" / "planted" / "missing_syncthreads_reduction.py"),
                   quick=True, jobs=1)
    (stage,) = report.stages
    races = [c for c in stage.cases if c.reason == "race"]
    assert races and stage.headline is races[0], report.text()  # (a race outranks the wrong values it causes)
    advice = races[0].advice
    assert advice.index("syncthreads") < advice.index("atomic"), advice
    assert "Fix:" not in races[0].message  # (the simulator's own fix, atomics first, is the advice's now)
    text = " ".join(report.text(width=400).split())
    # said in its first row and under the table; every other row says "the same again"
    assert text.count("both access partials") == 2, text
    assert text.count(f"race again (as at {races[0].label})") == len(races) - 1, text


def test_the_headline_is_the_most_informative_failure_not_the_smallest():
    """An off-by-one bound: at size 1 nothing is written (all zeros), at 1000 the tail is unwritten."""
    cases = [CaseResult("reduction.naive", [1], "failed", "all-zeros", "the output is all zeros", inputs="random"),
             CaseResult("reduction.naive", [1000], "failed", "unwritten", "3 of 1000 never written"),
             CaseResult("reduction.naive", [33], "failed", "unwritten", "1 of 33 never written")]
    stage = StageGrade("reduction.naive", 1, "failed", cases)
    assert stage.headline is cases[1]
    report = Report("mine.py", "sim", 1, stages=[stage])
    assert "reduction.naive failed at 1000: 3 of 1000 never written" in " ".join(report.text(width=300).split())
    assert StageGrade("x.y", 1, "passed", [CaseResult("x.y", [1], "passed")]).headline is None


def test_a_time_faster_than_the_memory_allows_is_refused():
    from workbench.grade.cases import below_roofline

    assert "cannot be the stage's own" in below_roofline(10**9, 10.0, "NVIDIA H200")  # 100 TB/s
    assert below_roofline(10**9, 1000.0, "NVIDIA H200") == ""  # 1 TB/s: possible
    assert below_roofline(10**9, 10.0, "a GPU nobody lists") == ""  # unknown: not judged


# -- tile and chunk boundaries hit exactly and missed by one -------------------------------------------

def test_a_stage_declares_its_boundaries_along_dimensions_the_operator_has():
    import dataclasses

    op = dataclasses.replace(resolve("softmax")[0], stages=[])
    with pytest.raises(ValueError, match="a boundary is a dimension of rows, cols"):
        op.stage("mine", "a paragraph", boundaries={"width": (256,)})
    with pytest.raises(ValueError, match="whole numbers"):
        op.stage("mine", "a paragraph", boundaries={"cols": (0,)})
    stage = op.stage("mine", "a paragraph", boundaries={"cols": [256]})(lambda x, out: None)
    assert stage.boundaries == {"cols": (256,)}


def test_grading_sizes_land_on_each_declared_boundary_and_one_either_side():
    """softmax.ilp's unrolled step ends every ILP_SPAN columns: the grader grades a row of exactly one
    step and one column short and past it, in the simulator and on a GPU, quick or not. Without the
    declaration none of those sizes is graded (every declared size misses a block's end on purpose)."""
    import dataclasses

    from solutions.softmax import ILP_SPAN
    from workbench.grade.targets import grade_sizes

    op, (stage,) = resolve("softmax.ilp")
    widths = (ILP_SPAN - 1, ILP_SPAN, ILP_SPAN + 1)
    for mode in ("sim", "gpu"):
        for quick in (False, True):
            cols = [c for _, c in grade_sizes(op, mode, quick, stage)]
            assert all(w in cols for w in widths), (mode, quick, cols)
        undeclared = dataclasses.replace(stage, boundaries=None)
        assert not set(widths) & {c for _, c in grade_sizes(op, mode, stage=undeclared)}


def test_a_boundary_size_is_capped_and_never_one_the_operator_refuses():
    import dataclasses

    from workbench.grade.targets import SIZE_CAP, boundary_sizes

    op, (stage, *_) = resolve("pool2d[mean]")  # its window K is 2 or 3: a boundary at 3 may not grade K = 4
    base = [tuple(s) for s in op.sim_sizes]
    sizes = boundary_sizes(dataclasses.replace(stage, boundaries={"K": (3,)}), base)
    assert {s[-1] for s in sizes} == {2, 3}, sizes
    op, (stage,) = resolve("softmax.ilp")
    base = [tuple(s) for s in op.sim_sizes]
    largest = max(int(np.prod(s)) for s in base)
    far = dataclasses.replace(stage, boundaries={"cols": (SIZE_CAP * largest,)})
    assert boundary_sizes(far, base) == []  # a few rows of that width: past the cap



def test_on_a_gpu_a_first_stage_is_graded_as_the_gpu_suite_checks_it_not_at_its_largest_size():
    """On the H200 one job stalled all eight for ten minutes: coo_to_csr.atomic_scatter (one thread sorts each
    row) was graded at its largest check size, a power-law matrix with a row of 10^5 entries, and the
    answer key's own run there (the runaway limit's measure, in the grader's process) never ended in time.
    The GPU suite skips a first stage's largest size; the grader takes the same sizes."""
    from solutions.spmv import POWER_LAW
    from workbench.check import gpu_check_sizes
    from workbench.grade.targets import grade_sizes
    from workbench.ladder import as_size
    from workbench.registry import load_operators

    op = load_operators()["coo_to_csr"]
    atomic_scatter, radix_sort = op.stages
    assert (2**18, 16, POWER_LAW) not in grade_sizes(op, "gpu", stage=atomic_scatter)
    assert (2**18, 16, POWER_LAW) in grade_sizes(op, "gpu", stage=radix_sort)
    for op in load_operators().values():
        first = op.stages[0]
        left_out = {as_size(s) for s in op.check_sizes} - set(gpu_check_sizes(first))
        assert len(left_out) == (len(op.check_sizes) > 2), op.name
        assert not left_out & set(grade_sizes(op, "gpu", stage=first)), op.name


# -- the speed bar's defences: fresh inputs, and only work done when the call's stream is -----------------

def _load_planted(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"planted_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed_then_checked(launcher, op, size):
    """What the worker does around the speed bar, minus the timer (the simulator cannot time): the
    rotating sets made from distinct draws, every set called as the timer calls them, then the calls on
    fresh inputs in the same buffers, judged as the grader judges them."""
    from workbench.grade.cases import fresh_output_wrong
    from workbench.grade.watch import FRESH_DRAWS, fresh_outputs, timing_arg_sets

    draws = [op.make_inputs(size, np.random.default_rng([7, k])) for k in range(FRESH_DRAWS)]
    arg_sets = timing_arg_sets(draws, op.make_output(size), None)
    assert len(arg_sets) >= FRESH_DRAWS
    assert not np.array_equal(draws[0][0], draws[1][0])  # distinct inputs, not copies of one
    for args in arg_sets * 2:
        launcher(*args)
    return fresh_output_wrong(op.stages[0], size, draws, fresh_outputs(launcher, arg_sets, draws))


def test_after_timing_a_result_kept_by_buffer_is_stale_and_work_left_to_a_thread_is_not_done():
    import threading

    op, (stage,) = resolve("histogram.global_atomics")
    size = (1000,)
    assert _timed_then_checked(stage.launch, op, size) is None  # the answer key: right on every fresh input
    kept = _load_planted(ROOT / "tests" / "planted" / "timing" / "caches_by_buffer.py")
    reason, message = _timed_then_checked(kept.global_atomics, op, size)
    assert reason == "stale" and kept.EXPECT["says"] in message, message

    later = []

    def everything_later(x, out):  # the whole stage left to a thread: nothing written when the call returns
        later.append(threading.Thread(target=lambda: (time.sleep(0.5), stage.launch(x, out)), daemon=True))
        later[-1].start()

    reason, message = _timed_then_checked(everything_later, op, size)
    assert reason == "not-done" and "never written" in message, message
    for thread in later:  # their launches done here: left running, they launched into the next test's
        thread.join()     # simulated kernels, and a block of that test waited at a barrier for ever


@pytest.mark.gpu
@pytest.mark.timing(whole=True)
def test_timing_cheats_are_refused_on_a_gpu():
    """The speed case on a GPU: a result kept by buffer is stale; a kernel left to a thread is refused."""
    for path in (ROOT / "tests" / "planted" / "timing" / "caches_by_buffer.py",
                 ROOT / "tests" / "planted" / "offloads_to_a_thread.py"):
        want = expectation(path)
        report = grade(want["stage"], str(path), quick=True, jobs=1)
        (stage,) = report.stages
        assert stage.status == "failed" and any(c.reason == want["reason"] for c in stage.cases), report.text()


def test_without_a_terminal_each_verdict_is_a_line_as_it_comes():
    """A log cut off mid-run (a GPU session's time limit) still says which stages passed, and why the first
    failed case of a stage failed (on the H200 three cut-off stages said only "1 of 18 cases failed")."""
    import io

    from rich.console import Console

    from workbench.grade.cli import Lines
    from workbench.grade.report import CaseResult, StageGrade

    buf = io.StringIO()
    lines = Lines(Console(file=buf, width=200))
    ok = CaseResult("scan.naive", [7], "passed", "", "")
    bad = CaseResult("scan.naive", [9], "failed", "wrong-values", "wrong")
    lines.stage_done(StageGrade("scan.naive", 1, "failed", [ok, bad]))
    lines.stage_done(StageGrade("scan.fused", 2, "passed", [ok]))
    assert buf.getvalue().splitlines() == ["  scan.naive: failed (1 of 2 cases failed; 9: wrong-values)",
                                           "  scan.fused: passed (1 cases)"]


def test_each_verdict_line_says_how_long_its_stage_took_and_its_speed():
    """A GPU session plans its next call from the stages' times, and a speed bar is judged by its ratio: a log
    cut off before the JSON report (which has both) still says them, stage by stage (jobs run in threads)."""
    import io

    from rich.console import Console

    from workbench.grade.cli import Lines
    from workbench.grade.report import CaseResult, StageGrade

    now = [100.0]
    buf = io.StringIO()
    lines = Lines(Console(file=buf, width=200), clock=lambda: now[0])
    ok = CaseResult("gemm.naive", [7], "passed", "", "")
    timed = CaseResult("gemm.naive", [4096], "passed", "", "", kind="speed", speed={"ratio": 0.987})
    lines.stage_started("gemm.naive", 2)
    now[0] = 105.0
    lines.stage_started("scan.naive", 1)  # another job's stage, begun meanwhile
    now[0] = 141.4
    lines.stage_done(StageGrade("gemm.naive", 1, "passed", [ok, timed]))
    now[0] = 150.0
    lines.stage_done(StageGrade("scan.naive", 1, "passed", [ok]))
    assert buf.getvalue().splitlines() == ["  gemm.naive: passed (2 cases; 41 s; speed 0.99)",
                                           "  scan.naive: passed (1 cases; 45 s)"]


def test_with_json_each_verdict_is_still_a_line_on_stderr_as_it_comes(monkeypatch, capsys):
    """`grade --json` stopped by a time limit (a GPU session's) printed nothing at all: the JSON comes at the
    end. Each verdict is a line on stderr as it comes; stdout stays the JSON report alone."""
    from workbench.grade import cli
    from workbench.grade.report import CaseResult, Report, StageGrade

    def one_stage(target, impl, *, listener, **options):
        passed = CaseResult("scan.hillis_steele", [7], "passed", "", "")
        grade = StageGrade("scan.hillis_steele", 1, "passed", [passed])
        listener.stage_done(grade)
        return Report(impl, "sim", 1, stages=[grade])

    monkeypatch.setattr(cli, "grade", one_stage)
    args = argparse.Namespace(target="scan.hillis_steele", impl="solutions", size=None, quick=True, seed=None,
                              timeout=None, jobs=1, no_speed=True, json=True, junit=None)
    assert cli.cmd_grade(args) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["passed"]
    assert "  scan.hillis_steele: passed (1 cases)" in err.splitlines()


STUCK_GRADE = """
import argparse, signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from workbench.grade import cli

signal.signal(signal.SIGINT, signal.default_int_handler)  # (started in the background, SIGINT came ignored)

def stuck(target, impl, *, listener, **options):  # a job waiting for what never comes (a kernel, a lock)
    ThreadPoolExecutor(1).submit(threading.Event().wait)
    print("grading", file=sys.stderr, flush=True)
    time.sleep(60)

cli.grade = stuck
sys.exit(cli.cmd_grade(argparse.Namespace(target="scan.hillis_steele", impl="solutions", size=None, quick=True,
         seed=None, timeout=None, jobs=1, no_speed=True, json=True, junit=None)))
"""


def test_an_interrupted_grade_ends_at_once_even_with_a_job_stuck():
    """On the H200 `timeout -s INT` stopped `grade` (it printed "interrupted"), but the process lived on until
    it was killed: Python's exit joined the pool's threads, one of them waiting for a kernel that ran for
    minutes. Interrupted, `grade` ends now with 130, whatever its threads are doing."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), WORKBENCH_MODE="sim")
    proc = subprocess.Popen([sys.executable, "-c", STUCK_GRADE], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # (after whatever importing the registry says)
            if line.strip() == "grading":
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    finally:
        proc.kill()
    assert "interrupted" in proc.stderr.read()


def test_bfloat16_travels_to_and_from_the_device_as_its_bits(monkeypatch):
    """numba-cuda refuses to copy ml_dtypes' bfloat16 ("cannot include dtype 'E' in a buffer"): on the H200 every
    gemm[bf16] stage was a grader error. The grader's own copies move it as its 16-bit patterns, as
    ladder.to_device does. Here the simulator's copies are made to refuse it as a GPU's do."""
    import ml_dtypes

    from workbench.grade import watch
    from workbench.grade.guards import Guard

    bf16 = np.dtype(ml_dtypes.bfloat16)
    own = watch.take_primitives()
    to_device, to_host = own.to_device, own.copy_to_host

    def refused(array):
        if array.dtype == bf16:
            raise ValueError("cannot include dtype 'E' in a buffer")
        return array

    monkeypatch.setattr(own, "to_device", lambda host, *a, **k: to_device(refused(host), *a, **k))
    monkeypatch.setattr(own, "copy_to_host", lambda dev, *a, **k: to_host(refused(dev), *a, **k))
    monkeypatch.setattr("workbench.ladder.moved_as_bits", lambda dtype: np.dtype(dtype) == bf16)
    op, (stage,) = resolve("softmax[bf16].widened")
    size = (3, 37)
    inputs = op.make_inputs(size, np.random.default_rng(1))
    outcome = watch.run_watched(stage.launch, inputs, poison_like(op.make_output(size)), Guard(), None)
    assert outcome.error is None, outcome.error
    assert outcome.out.dtype == bf16 and not judge(stage, size, inputs, outcome.out, outcome.inputs_after).failed


def test_a_race_in_shared_memory_gets_the_barrier_advice_even_when_it_is_a_read_modify_write():
    """Which of a tree's races the simulator meets first varies from run to run: a `+=` on a shared slot
    is still most likely a missing barrier, so its advice names cuda.syncthreads() before atomics."""
    from workbench.grade.reasons import race_kind

    both = "threads (0,0,0) and (1,0,0) both access partials[3] (shared memory): a read-modify-write raced"
    assert race_kind(both) == "shared"
    assert race_kind("bins[7] (global memory): a read-modify-write raced") == "update"


def test_the_time_a_launch_spends_compiling_is_not_counted_against_the_runaway_limit(monkeypatch):
    """On the H200 qlinear.fused's first call compiled for longer than the limit and was stopped as "a loop that
    never ends". The worker says when a launch starts compiling and how long it took (the launch itself
    returns at once), and the supervisor holds the limit while it compiles and moves it by that much."""
    import socket
    import threading

    from workbench.grade import supervisor
    from workbench.grade.channel import Channel

    monkeypatch.setattr(supervisor, "RUNAWAY_FLOOR_S", 0.3)

    def request(notices: bool):
        ours, theirs = socket.socketpair()
        worker = supervisor.WorkerProcess.__new__(supervisor.WorkerProcess)
        worker.channel, child = Channel(ours), Channel(theirs)
        worker.printed, worker.stop = (lambda: ""), (lambda: None)

        def serve():  # a call whose launch compiles for 0.8 s, then runs its kernel for 0.1 s
            child.receive(time.monotonic() + 5)
            if notices:
                child.send({"type": "compiling"})
            time.sleep(0.8)
            if notices:
                child.send({"type": "compiled", "seconds": 0.8})
            time.sleep(0.1)
            child.send({"type": "called", "id": 1})

        threading.Thread(target=serve, daemon=True).start()
        return worker.request({"type": "call"}, [], 30.0, "running this case", lambda: (0.3, "runaway"))

    header, _ = request(notices=True)
    assert header == {"type": "called", "id": 1}
    with pytest.raises(supervisor.CaseAborted, match="runaway"):
        request(notices=False)


def test_the_time_a_launch_spends_compiling_is_not_counted_against_the_cases_timeout(monkeypatch):
    """On a loaded H200 host attention[fp16].causal_skip's first call compiled for over a minute, and its
    tiny first case failed "no result after 60 s". The timeout is for running the call: a compile the
    worker announces has a limit of its own (COMPILE_TIMEOUT_S, for all of a call's compiles together)."""
    import socket
    import threading

    from workbench.grade import supervisor
    from workbench.grade.channel import Channel

    def request(compile_s: float, notices: bool):
        ours, theirs = socket.socketpair()
        worker = supervisor.WorkerProcess.__new__(supervisor.WorkerProcess)
        worker.channel, child = Channel(ours), Channel(theirs)
        worker.printed, worker.stop = (lambda: ""), (lambda: None)

        def serve():  # a call whose launch compiles, then runs its kernel for 0.1 s
            child.receive(time.monotonic() + 5)
            if notices:
                child.send({"type": "compiling"})
            time.sleep(compile_s)
            try:
                if notices:
                    child.send({"type": "compiled", "seconds": compile_s})
                time.sleep(0.1)
                child.send({"type": "called", "id": 1})
            except OSError:
                pass  # stopped meanwhile: the supervisor closed its end

        threading.Thread(target=serve, daemon=True).start()
        return worker.request({"type": "call"}, [], 0.5, "running this case")

    monkeypatch.setattr(supervisor, "COMPILE_TIMEOUT_S", 2.0)
    assert request(1.0, notices=True)[0] == {"type": "called", "id": 1}  # 1.1 s in all, the timeout 0.5 s
    with pytest.raises(supervisor.CaseAborted, match="no result after 0 s"):
        request(1.0, notices=False)
    with pytest.raises(supervisor.CaseAborted, match="2 s compiling"):
        request(3.0, notices=True)  # a compile past its own limit


def test_a_solution_slow_to_time_never_holds_a_case_beyond_its_timeout(monkeypatch):
    """The runaway limit times the answer key at the case's size once the call is late. On the H200 that
    run took minutes (coo_to_csr's first stage, a one-thread sort of a 10^5-entry row) and every job
    waited behind it. The limit is worked out beside the call now: a call that never returns is still
    stopped at the case's timeout, and one that returns meanwhile is taken as it comes."""
    import socket
    import threading

    from workbench.grade import supervisor
    from workbench.grade.channel import Channel

    monkeypatch.setattr(supervisor, "RUNAWAY_FLOOR_S", 0.2)

    def request(reply_after: float | None, timeout: float):
        ours, theirs = socket.socketpair()
        worker = supervisor.WorkerProcess.__new__(supervisor.WorkerProcess)
        worker.channel, child = Channel(ours), Channel(theirs)
        worker.printed, worker.stop = (lambda: ""), (lambda: None)

        def serve():
            child.receive(time.monotonic() + 5)
            if reply_after is not None:
                time.sleep(reply_after)
                child.send({"type": "called", "id": 1})

        def slow_limit():  # the answer key's own run at this size: far longer than the case's timeout
            time.sleep(30)
            return 1.0, "runaway"

        threading.Thread(target=serve, daemon=True).start()
        return worker.request({"type": "call"}, [], timeout, "running this case", slow_limit)

    t0 = time.monotonic()
    with pytest.raises(supervisor.CaseAborted, match="no result after 2 s"):
        request(reply_after=None, timeout=2.0)
    assert time.monotonic() - t0 < 4
    t0 = time.monotonic()
    header, _ = request(reply_after=1.0, timeout=20.0)
    assert header == {"type": "called", "id": 1} and time.monotonic() - t0 < 3


def test_a_compile_says_so_before_and_after_and_one_already_done_says_nothing(monkeypatch):
    """Every compile goes through the dispatcher's compile (a launch's, and set_max_dynamic_shared_memory's
    before it: qlinear's kernels compiled there on the H200, where a hook on the launch never heard of it);
    a kernel's compile compiles its device functions inside it, and only the outermost speaks."""
    from numba import types
    from numba.cuda import dispatcher

    from workbench.grade import watch

    class Kernel:
        specialized = False

        def __init__(self, inner=None):
            self.overloads, self.inner = {}, inner

    def slow_compile(disp, sig):  # numba compiling: the kernel's device function inside it first
        if disp.inner is not None:
            dispatcher.CUDADispatcher.compile(disp.inner, sig)
        time.sleep(0.3)
        disp.overloads[tuple(sig)] = "kernel"

    monkeypatch.setattr(dispatcher.CUDADispatcher, "compile", slow_compile, raising=False)  # (the simulator has none)
    monkeypatch.setattr(dispatcher.CUDADispatcher, "call", lambda disp, args, config: None, raising=False)
    monkeypatch.setattr(watch._device, "is_simulator", lambda: False)
    heard, kernel = [], Kernel(inner=Kernel())
    with watch.Watch(heard.append):
        dispatcher.CUDADispatcher.compile(kernel, (types.float64, types.int64))
        dispatcher.CUDADispatcher.compile(kernel, (types.float64, types.int64))  # compiled already: nothing
    assert len(heard) == 2 and heard[0] is None and 0.5 < heard[1] < 3, heard


def test_on_a_gpu_prepared_launches_and_graphs_count_as_launches(monkeypatch):
    """launch_overhead's prepared, graph and fused stages launch through ``cuLaunchKernel`` and
    ``cuGraphLaunch`` themselves (workbench.prepared), not numba's dispatcher: on the H200 the grader heard
    no launch and failed all three answer keys with "no kernel was launched". The watch hears them, each
    as its kernel's Python function, with the launch limits checked as for any launch."""
    from numba.cuda import dispatcher

    from workbench import prepared
    from workbench.grade import watch
    from workbench.simulator import LaunchLimitError

    class Driver:  # the CUDA driver's answers: every launch succeeds
        def cuLaunchKernel(self, *args):
            return (0,)

        def cuGraphLaunch(self, *args):
            return (0,)

    def first(x):
        pass

    def second(x):
        pass

    monkeypatch.setattr(prepared, "_driver", Driver)
    monkeypatch.setattr(dispatcher.CUDADispatcher, "call", lambda disp, args, config: None, raising=False)
    monkeypatch.setattr(dispatcher.CUDADispatcher, "compile", lambda disp, sig: None, raising=False)
    monkeypatch.setattr(watch._device, "is_simulator", lambda: False)
    one = prepared.KernelLaunch(0, 4, 128, [], py_func=first)
    two = prepared.KernelLaunch(0, 4, 128, [], py_func=second)
    graph = object.__new__(prepared.Graph)  # as captured: its launches, and what cuGraphLaunch takes
    graph.launches, graph.exec, graph.default_stream = [one, two], None, 0
    with watch.Watch() as seen:
        one()
        graph()
    assert seen.kernels == [first, first, second]
    with watch.Watch():
        with pytest.raises(LaunchLimitError, match="blockDim.x = 2048"):
            prepared.KernelLaunch(0, 4, 2048, [], py_func=first)()
    one()  # outside a watch: launched, heard by nobody
    assert seen.kernels == [first, first, second]


def test_grading_sizes_too_large_to_validate_are_still_ones_the_operator_takes():
    """On the H200 the grader bumped rope's largest size (8192, 32, 128) to (8193, 33, 129): too large to
    build and validate (over GRADE_SIZE_BUILD_BYTES), and an odd head size, which make_inputs cannot
    build: a grader error on every stage graded there. The operator's bytes model refuses what its
    validation refuses, so the bump keeps D at 128."""
    from workbench import registry
    from workbench.grade.targets import grade_sizes

    rope = registry.load_operators()["rope"]
    for stage in rope.stages:
        sizes = grade_sizes(rope, "gpu", stage=stage)
        assert all(d % 2 == 0 for _, _, d in sizes), (stage.name, sizes)
        assert (8193, 33, 128) in sizes or stage is rope.stages[0]


BUSY_STAGES = {"reduction.py": "naive", "scan.py": "hillis_steele", "histogram.py": "global_atomics"}


def test_an_interrupted_grade_still_reports_the_stages_it_graded(tmp_path):
    """`timeout -s INT` ends a GPU session's `grade --json` at its time limit: the JSON report on stdout
    still holds every stage graded before it (marked interrupted), not nothing."""
    (tmp_path / "histogram.py").write_text((ROOT / "tests" / "planted" / "correct" / "prints_garbage.py").read_text())
    (tmp_path / "reduction.py").write_text("import time\n\n\ndef naive(*args):\n    time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), WORKBENCH_MODE="sim",
               WORKBENCH_GRADE_STACKS=str(tmp_path / "stacks.txt"))
    main = "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); " \
           "runpy.run_module('workbench', run_name='__main__')"
    proc = subprocess.Popen([sys.executable, "-c", main, "grade", "histogram.global_atomics", "reduction.naive",
                             "--impl", str(tmp_path), "--jobs", "2", "--no-speed", "--size", "300", "--json"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "histogram.global_atomics: passed" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "1 stage graded before it" in err and "reduction.naive" not in err
    assert "Current thread" in (tmp_path / "stacks.txt").read_text()  # WORKBENCH_GRADE_STACKS: where each thread was
    report = json.loads(out)
    assert report["interrupted"] and [s["key"] for s in report["stages"]] == ["histogram.global_atomics"]
    assert report["stages"][0]["status"] == "passed"


def test_an_interrupted_grade_kills_its_busy_workers_at_once(tmp_path):
    """Interrupted, `grade` stopped its workers one after another, giving each 2 s to say goodbye and then
    waiting for it to go: on the H200, eight workers inside kernels kept `timeout -s INT -k 30` from
    ending the run before its KILL. Now every worker is killed at once, none waited for. Three jobs, each
    worker busy in a call that never returns: the run ends well inside one worker's goodbye time, and no
    worker outlives it."""
    for name, stage in BUSY_STAGES.items():
        (tmp_path / name).write_text(f"import time\n\n\ndef {stage}(*args):\n    time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), WORKBENCH_MODE="sim")
    targets = [f"{name[:-3]}.{stage}" for name, stage in BUSY_STAGES.items()]
    # `python -m workbench grade ...`, with SIGINT's handler restored (started in the background, it came ignored)
    main = "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); " \
           "runpy.run_module('workbench', run_name='__main__')"
    proc = subprocess.Popen([sys.executable, "-c", main, "grade", *targets, "--impl", str(tmp_path), "--jobs", "3",
                             "--no-speed", "--quick"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        started = 0
        for line in proc.stderr:
            started += line.startswith("grading ")
            if started == len(BUSY_STAGES):
                break
        time.sleep(3)  # every worker inside its call
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        assert time.perf_counter() - t0 < 1.5, "waited for its workers"
    finally:
        proc.kill()
    assert len(workers) == len(BUSY_STAGES)
    time.sleep(0.5)
    alive = [w for w in workers if os.path.exists(f"/proc/{w}") and "Z" not in open(f"/proc/{w}/stat").read().split()[2]]
    assert not alive
