"""The grader against its catalog (tests/grader_catalog/): every wrong submission rejected for a reason
that teaches, every correct one accepted, and no submission able to crash ``workbench grade``, hang it,
leave a process behind or write a file; and every operator with adversarial inputs.

Each catalog file is graded as a learner grades it, ``workbench grade OP.STAGE --impl FILE --json``, in
a process (and session) of its own, and judged from the exit status and the JSON report only. Tiers:
the entries marked ``"quick"`` (one or two per class) run by default; the rest are ``-m slow`` (the
simulator is slow: the whole catalog takes the better part of an hour); ``-m gpu`` grades every entry
on a GPU, where the ones only a GPU can show (``"cpu": False``) must be rejected too.
``GRADER_CATALOG_REPORTS=DIR`` keeps each entry's JSON report (and stderr) in DIR.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.check import adversarial_cases, check_ladder
from workbench.ladder import as_size
from workbench.registry import load_operators, resolve

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "tests" / "grader_catalog"
PLANTED = ROOT / "tests" / "planted"
ENTRIES = sorted(CATALOG.glob("*.py"))
CLASSES = ("race", "geometry", "numeric", "forgery", "symmetry", "correct")
CASE_TIMEOUT_S = 120  # --timeout per case: a few SMs make every catalog kernel small
GPU_CASE_TIMEOUT_S = 40  # on a GPU every case takes seconds; the hanging entries wait this long (import too)
RUN_TIMEOUT_S = 1500  # the whole `workbench grade` run of one entry, hangs included


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXPECT":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no EXPECT")


def tier(path: Path):
    want = expectation(path)
    marks = [] if want.get("quick") else [pytest.mark.slow]
    return pytest.param(path, id=path.stem, marks=marks)


# -- the catalog itself ----------------------------------------------------------------------------

def test_catalog_covers_every_class_with_several_entries():
    by_class: dict = {}
    for path in ENTRIES:
        want = expectation(path)
        assert want["class"] in CLASSES, f"{path.name}: class {want['class']!r}"
        assert want["verdict"] == ("accept" if want["class"] == "correct" else "reject"), path.name
        assert want["verdict"] == "accept" or want.get("reasons"), f"{path.name}: say which reasons teach"
        resolve(want["target"])  # a stage that exists
        header = path.read_text().splitlines()[0]
        assert header.startswith(("# WRONG", "# CORRECT")), f"{path.name}: start with what it gets wrong (or right)"
        by_class.setdefault(want["class"], []).append(path.name)
    wrong = sum(len(v) for k, v in by_class.items() if k != "correct")
    assert wrong >= 40 and len(by_class.get("correct", [])) >= 15, {k: len(v) for k, v in by_class.items()}
    for name in CLASSES:
        assert len(by_class.get(name, [])) >= 3, f"only {by_class.get(name)} in class {name}"
    for name in CLASSES:  # the quick tier shows every class
        assert any(expectation(CATALOG / f).get("quick") for f in by_class[name]), f"no quick entry for {name}"


def _code(path: Path) -> list[str]:
    """The code lines of a file, without comments, docstring or blank lines."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.split("#")[0].strip()
        if stripped and not stripped.startswith(('"""', "EXPECT", '"')):
            lines.append(stripped)
    return lines


def test_no_catalog_entry_is_a_copy_of_a_planted_bug():
    """A copy: the same mistake (stage and reason) in nearly the same code as a file of tests/planted/."""
    planted = []
    for p in PLANTED.glob("*.py"):
        want = expectation(p)
        reasons = want["reason"] if isinstance(want["reason"], list) else [want["reason"]]
        planted.append((want["stage"], set(reasons), p.name, _code(p)))
    for path in ENTRIES:
        want, mine = expectation(path), _code(path)
        if want["class"] == "correct":
            continue
        for stage, reasons, name, theirs in planted:
            if stage == want["target"] and (reasons & set(want["reasons"]) or want["reasons"] == ["*"]):
                similarity = difflib.SequenceMatcher(None, mine, theirs).ratio()
                assert similarity < 0.8, f"{path.name} is {similarity:.0%} the code of tests/planted/{name}"


# -- adversarial inputs: every operator has them, and the checks run them ---------------------------

SPARSE_INPUTS = {"spmv", "coo_to_csr"}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the float64 reference of NaN and inf inputs, put there on purpose
@pytest.mark.parametrize("op", list(load_operators().values()), ids=lambda op: op.name)
def test_every_operator_has_adversarial_inputs(op):
    """Sets at every simulator size, shaped and typed like the random inputs, with a finite reference
    (unless the set's inputs hold NaN or inf themselves)."""
    rng = np.random.default_rng(0)
    for size in op.sim_sizes:
        size = as_size(size)
        sets = adversarial_cases(op, size, rng)
        assert sets, f"{op.name}: no adversarial input sets at {size} (Operator.adversarial_inputs)"
        labels = [label for label, _ in sets]
        assert len(set(labels)) == len(labels) and "random" not in labels, labels
        model = op.make_inputs(size, rng)
        for label, inputs in sets:
            assert len(inputs) == len(model), f"{op.name} {label}: {len(inputs)} inputs, not {len(model)}"
            for got, want in zip(inputs, model):
                # a sparse matrix's arrays are as long as its non-zeros: a set may differ in length there
                same_shape = got.shape == want.shape or (got.ndim == want.ndim and op.name in SPARSE_INPUTS)
                assert same_shape and got.dtype == want.dtype, (op.name, label, got.shape, want.shape)
            # NaN or inf in the reference only where an input carries them on purpose (NaN propagation):
            # check.compare then demands the same NaN or inf in the output, computed, not the poison
            reference_finite = np.isfinite(np.asarray(op.reference(*inputs), dtype=np.float64)).all()
            assert reference_finite or not all(_all_finite(a) for a in inputs), (op.name, label, size)


def _all_finite(array) -> bool:
    array = np.asarray(array)
    return array.dtype.kind not in "fc" and array.dtype.name != "bfloat16" or bool(np.isfinite(array.astype(np.float64)).all())


def test_check_ladder_runs_the_adversarial_sets_beside_the_random_inputs():
    op = load_operators()["argmax"]
    size = as_size(op.sim_sizes[0])
    results = check_ladder(op, stages=[op.stages[0]], sizes=[size], seed=0)
    labels = {r.inputs for r in results}
    assert labels == {"random"} | {label for label, _ in adversarial_cases(op, size, np.random.default_rng(0))}
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


# -- what the GPU run will compile ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.sim_only
def test_every_catalog_kernel_compiles_for_sm90(monkeypatch):
    """The GPU test must reject the wrong entries for their mistake, not because a kernel does not
    compile: every kernel an entry launches (forgeries aside: their point is the process) is run once
    in the simulator (on a 2-SM device, as when grading) and compiled for sm_90 with those types."""
    from workbench.ptxcheck import FAILED, CompileProcess
    from workbench.simulator import record_launches, simulated_sm_count

    from workbench.check import check_stage
    from workbench.ladder import clear_scratch

    monkeypatch.syspath_prepend(str(CATALOG))  # the entries import by their file names, here and there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(CATALOG), os.environ.get("PYTHONPATH")])))
    items, problems = [], []
    for path in ENTRIES:
        want = expectation(path)
        if want["class"] == "forgery":
            continue
        _, (stage,) = resolve(want["target"])
        module = __import__(path.stem)
        size = as_size(stage.op.sim_sizes[min(2, len(stage.op.sim_sizes) - 1)])
        clear_scratch()
        with simulated_sm_count(2), record_launches() as launches:
            check_stage(stage, size, np.random.default_rng(0), launch=getattr(module, stage.name))
        kernels = {(f.__module__, f.__qualname__, tuple(types)) for f, types in launches}
        if not kernels:
            problems.append(f"{path.name}: launched no kernel in the simulator")
        items += [(want["target"], m, q, types, False) for m, q, types in sorted(kernels, key=str)]
    compiler = CompileProcess()
    try:
        compiler.send(items)
        reports = compiler.receive()
    finally:
        compiler.close()
    problems += [f"{r.kernel} {r.signature}: {r.message}" for r in reports if r.status == FAILED]
    assert not problems, "\n".join(problems)


# -- grading an entry ------------------------------------------------------------------------------

def _processes_holding(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return [pid for pid in found if pid != os.getpid()]


def _fingerprint(path: Path) -> tuple:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


GPU_MAX_ELEMENTS = 1 << 25  # on a GPU, the catalog grades at the grader's sizes up to this many elements


def gpu_sizes(target: str) -> list[str]:
    """The grader's GPU sizes for ``target`` up to GPU_MAX_ELEMENTS, as --size arguments. Every entry's
    mistake shows there (one full resident grid of an H200 is about 270 thousand threads; a float32
    running total stalls on the large-first-element inputs, which the grader builds at the largest of
    these sizes too); the 2^28 sizes only made the catalog take minutes an entry."""
    from workbench.grade.targets import grade_sizes

    _, (stage,) = resolve(target)
    sizes = [s for s in grade_sizes(stage.op, "gpu", stage=stage) if int(np.prod(s)) <= GPU_MAX_ELEMENTS]
    return ["x".join(map(str, s)) for s in sizes]


def grade_entry(path: Path, want: dict, on_gpu: bool = False) -> tuple[int, dict | None, str, float]:
    """`workbench grade TARGET --impl PATH --json` in a session of its own: (exit status, report, stderr,
    seconds). Quick entries at the grader's quick sizes, the others at its full sizes (on a GPU: those
    up to GPU_MAX_ELEMENTS)."""
    command = [sys.executable, "-m", "workbench.cli", "grade", want["target"], "--impl", str(path), "--json",
               "--timeout", str(GPU_CASE_TIMEOUT_S if on_gpu else CASE_TIMEOUT_S), "--jobs", "1",
               "--no-speed"]  # the catalog is about verdicts on correctness; test_grade.py tests the speed bar
    if want.get("quick"):
        command.append("--quick")
    elif on_gpu:
        for size in gpu_sizes(want["target"]):
            command += ["--size", size]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a submission that kills its grader's group misses pytest
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"`workbench grade` was still running after {RUN_TIMEOUT_S} s")
    seconds = time.monotonic() - t0
    keep = os.environ.get("GRADER_CATALOG_REPORTS")  # a folder: keep each run's output there to read later
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"{path.stem}.json").write_text(stdout)
        (Path(keep) / f"{path.stem}.stderr").write_text(stderr)
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        report = None
    return proc.returncode, report, stderr, seconds


def _stage(report: dict, key: str) -> dict:
    found = [s for s in report["stages"] if s["key"] == key]
    assert len(found) == 1, f"the report has {len(found)} stages named {key}: {[s['key'] for s in report['stages']]}"
    return found[0]


def _describe(stage: dict) -> str:
    rows = [f"{c['inputs']} @ {c['size']}: {c['status']} {c['reason']}: {c['message'][:200]}" for c in stage["cases"]]
    return f"{stage['key']} {stage['status']} {stage.get('notes')}\n  " + "\n  ".join(rows)


def check_verdict(path: Path, want: dict, returncode: int, report: dict | None, stderr: str,
                  on_gpu: bool = False) -> None:
    assert "Traceback" not in stderr, f"`workbench grade` printed a traceback:\n{stderr[-3000:]}"
    assert report is not None, f"no JSON report (exit status {returncode}):\n{stderr[-3000:]}"
    stage = _stage(report, want["target"])
    if want["verdict"] == "accept":
        if want.get("may_need_gpu") and stage["status"] == "skipped":
            notes = " ".join(stage["notes"]) + " ".join(c["message"] for c in stage["cases"])
            assert "GPU" in notes, f"skipped without saying it needs a GPU: {_describe(stage)}"
            return
        assert stage["status"] == "passed", f"a correct submission was not accepted:\n{_describe(stage)}"
        assert returncode == 0, f"exit status {returncode} for a passing stage"
        return
    assert stage["status"] == "failed", f"a wrong submission was not rejected:\n{_describe(stage)}"
    assert returncode == 1, f"exit status {returncode} for a failed stage"
    failed = [c for c in stage["cases"] if c["status"] == "failed"]
    reasons = want.get("gpu_reasons", want["reasons"]) if on_gpu else want["reasons"]
    if reasons != ["*"]:
        failed = [c for c in failed if c["reason"] in reasons]
        assert failed, f"rejected, but not for {reasons}:\n{_describe(stage)}"
    inputs = want.get("gpu_inputs", want.get("inputs")) if on_gpu else want.get("inputs")
    if inputs:
        assert any(c["inputs"] == inputs for c in failed), (
            f"not caught on the {inputs!r} inputs:\n{_describe(stage)}")
    teaching = [c for c in failed if c["message"].strip() and c["advice"].strip()]
    assert teaching, f"no failed case says what went wrong and what to look at:\n{_describe(stage)}"


def check_side_effects(path: Path, want: dict, before: tuple) -> None:
    assert _fingerprint(path) == before, f"grading changed {path.name}"
    assert not (CATALOG / "__pycache__").exists(), "grading byte-compiled next to the submission"
    marker = want.get("leaves_no_process")
    if marker:
        left = _processes_holding(marker)
        for pid in left:  # started by this test's grading run: stop them before failing
            os.kill(pid, signal.SIGKILL)
        assert not left, f"{len(left)} process(es) started by the submission outlived grading"
    name = want.get("leaves_no_file")
    if name:
        written = ROOT / name
        existed = written.exists()
        written.unlink(missing_ok=True)
        assert not existed, f"the submission wrote {name} into the repository"


def grade_and_check(path: Path, on_gpu: bool) -> float:
    want = expectation(path)
    before = _fingerprint(path)
    returncode, report, stderr, seconds = grade_entry(path, want, on_gpu)
    check_side_effects(path, want, before)
    if want.get("cpu", True) or on_gpu:
        check_verdict(path, want, returncode, report, stderr, on_gpu)
    else:  # only a GPU shows this one: on CPU, grading must survive it and say something
        assert "Traceback" not in stderr and report is not None and returncode in (0, 1), stderr[-3000:]
    return seconds


@pytest.mark.sim_only
@pytest.mark.parametrize("path", [tier(p) for p in ENTRIES])
def test_catalog_entry_gets_its_verdict_in_the_simulator(path):
    grade_and_check(path, on_gpu=False)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ENTRIES, ids=lambda p: p.stem)
def test_catalog_entry_gets_its_verdict_on_a_gpu(path):
    grade_and_check(path, on_gpu=True)


# -- a boundary missed by one: passed by every size graded before stages declared their boundaries ------

@pytest.mark.slow  # (17 s on two cores: every size graded before, in full; the entry's quick verdict is quick)
@pytest.mark.sim_only
def test_a_step_bound_wrong_only_at_a_boundary_passed_before_and_fails_now():
    """softmax.ilp with its unrolled step's bound written <= is right at every size the grader derived
    before stages declared where their chunks end (the operator's sizes, no stage's), and wrong at the
    boundary its stage declares, missed by one (its verdict at the quick sizes: the entry's own test)."""
    from workbench.grade import grade
    from workbench.grade.targets import boundary_sizes, grade_sizes

    path = CATALOG / "symmetry_softmax_ilp_step_bound_inclusive.py"
    op, (stage,) = resolve("softmax.ilp")
    before = grade(stage.key, str(path), sizes=grade_sizes(op, "sim"), jobs=1, speed=False)
    assert before.passed, before.text()
    edges = boundary_sizes(stage, [as_size(s) for s in op.sim_sizes])
    (now,) = grade(stage.key, str(path), sizes=edges, jobs=1, speed=False).stages
    assert now.status == "failed" and now.headline.reason == "out-of-bounds", now
