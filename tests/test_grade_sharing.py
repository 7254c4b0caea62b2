"""What the grader shares: an operator's draws and their float64 references across its stages (made once,
never writable by a submission), and the GPU across parallel jobs and processes (calls shared, timing alone).

All of it runs in the simulator: the lock is tested on its own files, in two processes."""

import collections
import dataclasses
import hashlib
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from workbench.gpulock import GpuLock
from workbench.grade import grade, grade_function
from workbench.grade.draws import DRAWS, DrawCache, random_draw
from workbench.registry import resolve

pytestmark = pytest.mark.sim_only

ROOT = Path(__file__).resolve().parent.parent


def _fingerprint(inputs) -> str:
    digest = hashlib.sha1()
    for a in inputs:
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


def test_the_reference_is_computed_once_for_every_stage_of_an_operator(monkeypatch):
    op, _ = resolve("reduction")
    computed = collections.Counter()
    reference = op.reference

    def counted(*inputs):
        computed[_fingerprint(inputs)] += 1
        return reference(*inputs)

    monkeypatch.setattr(op, "reference", counted)
    DRAWS.clear()
    report = grade("reduction[fp32]", "solutions", quick=True, jobs=1, seed=424242)  # its 5 stages
    stages = [s for s in report.stages if s.key.startswith("reduction.")]
    assert len(stages) >= 3 and all(s.status == "passed" for s in stages), report.text()
    assert computed and max(computed.values()) == 1, computed.most_common(3)  # each draw's reference once
    # ...and each stage judged every case against one (as many references used as there were cases).
    assert sum(len(s.cases) for s in stages) > len(computed) * 2


def test_a_kept_input_is_read_only_and_a_submission_that_writes_its_input_still_fails():
    seed = 515151
    solution = grade("scan.hillis_steele", "solutions", quick=True, jobs=1, seed=seed)
    assert solution.passed, solution.text()
    op, (stage,) = resolve("scan.hillis_steele")
    size = solution.stages[0].cases[0].size
    kept = random_draw(op, size, seed, 0).inputs()
    with pytest.raises(ValueError, match="read-only"):
        kept[0][0] = 1  # the grader's own code cannot change a kept draw either
    reused = DRAWS.reused
    planted = ROOT / "tests" / "planted" / "mutates_input.py"
    report = grade("scan.hillis_steele", str(planted), quick=True, jobs=1, seed=seed)  # in its worker
    assert DRAWS.reused > reused  # graded on the very inputs kept for the solution...
    (graded,) = report.stages
    assert graded.status == "failed" and "input-modified" in {c.reason for c in graded.cases}, report.text()

    import importlib.util

    spec = importlib.util.spec_from_file_location("planted_mutates_input", planted)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    here = grade_function("scan.hillis_steele", module.hillis_steele, quick=True, seed=seed, show=False)
    assert here.stages[0].status == "failed" and "input-modified" in {c.reason for c in here.stages[0].cases}
    # ...which neither run changed: they are still the seed's draw, bit for bit.
    fresh = op.make_inputs(size, np.random.default_rng([seed, 0]))
    assert _fingerprint(kept) == _fingerprint(fresh)


def test_the_cache_keeps_within_its_bytes_and_pushes_out_other_operators_first():
    cache = DrawCache(budget_bytes=3000)
    block = lambda: np.zeros(1000, np.uint8)
    made = collections.Counter()

    def get(key):
        return cache.get(key, lambda: (made.update([key]), block())[1])

    for key in [("a", 1), ("a", 2), ("b", 1)]:
        get(key)
    assert cache.used == 3000
    get(("a", 3))  # pushes out b's draw, not a's own older ones
    assert cache.used == 3000 and ("b", 1) not in cache._values
    get(("a", 4))  # no room without pushing out a's own: made, not kept
    for key in [("a", 1), ("a", 2), ("a", 3)]:
        get(key)
    assert made[("a", 1)] == made[("a", 2)] == made[("a", 3)] == 1
    get(("a", 4))
    assert made[("a", 4)] == 2
    assert cache.get(("c", 1), lambda: np.zeros(4000, np.uint8)).nbytes == 4000 and cache.used <= 3000


def test_a_value_asked_for_by_two_threads_at_once_is_made_once():
    cache = DrawCache(budget_bytes=1 << 20)
    made = []

    def make():
        made.append(1)
        time.sleep(0.2)
        return np.ones(10)

    threads = [threading.Thread(target=cache.get, args=(("op", "x"), make)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1


# -- the GPU lock -------------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from workbench.gpulock import GpuLock
    stem, kind, rounds, hold, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    lock = GpuLock(stem)
    with open(log, "a") as out:
        for _ in range(rounds):
            with getattr(lock, kind)():
                start = time.monotonic()
                time.sleep(hold)
                out.write(f"{start} {time.monotonic()}\\n")
                out.flush()
""")


def _held_in_two_processes(tmp_path, kinds, rounds, hold) -> list[tuple[float, float]]:
    stem = str(tmp_path / "gpu")
    logs = [tmp_path / f"held-{i}.txt" for i in range(len(kinds))]
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, stem, kind, str(rounds), str(hold), str(log)], cwd=ROOT)
             for kind, log in zip(kinds, logs)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    return [[tuple(map(float, line.split())) for line in log.read_text().splitlines()] for log in logs]


def _overlaps(a, b) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


def test_the_exclusive_section_is_never_entered_by_two_processes_at_once(tmp_path):
    first, second = _held_in_two_processes(tmp_path, ["exclusive", "exclusive"], rounds=8, hold=0.05)
    assert len(first) == len(second) == 8
    assert _overlaps(first, second) == 0
    first, second = _held_in_two_processes(tmp_path, ["exclusive", "shared"], rounds=8, hold=0.05)
    assert _overlaps(first, second) == 0  # a run never beside a measurement
    # The check can fail: two shared holders (kernels running side by side) do overlap.
    first, second = _held_in_two_processes(tmp_path, ["shared", "shared"], rounds=1, hold=1.0)
    assert _overlaps(first, second) == 1


def test_two_threads_of_one_process_exclude_each_other_too(tmp_path):
    """flock belongs to an open file: each of the grader's --jobs threads opens its own."""
    lock, held, overlapped = GpuLock(str(tmp_path / "gpu")), [], []

    def measure():
        for _ in range(5):
            with lock.exclusive():
                overlapped.append(bool(held))
                held.append(1)
                time.sleep(0.02)
                with lock.shared():  # inside its own hold: re-entrant, never a wait for itself
                    pass
                held.pop()

    threads = [threading.Thread(target=measure) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(overlapped) == 10 and not any(overlapped)
    with lock.shared(), pytest.raises(RuntimeError, match="deadlock"):
        with lock.exclusive():
            pass


def test_on_a_gpu_calls_hold_the_gpu_shared_and_the_speed_case_times_both_stages_alone(monkeypatch, tmp_path):
    """The grader's side, the GPU faked: what a call and the timings hold when they run. The submission
    and the answer key are each timed in a session of their own (a worker each, on a GPU)."""
    from workbench import results
    from workbench.gpulock import LOCK_VARIABLE, gpu_lock
    from workbench.grade import cases
    from workbench.grade.report import PASSED

    monkeypatch.setenv(LOCK_VARIABLE, str(tmp_path / "gpu"))
    monkeypatch.setattr(cases, "_device", SimpleNamespace(is_simulator=lambda: False))
    held = {}
    op, (stage,) = resolve("reduction.naive")
    size = (1000,)
    op = dataclasses.replace(op, grade_speed_size=size)
    stage = dataclasses.replace(stage, op=op)

    def answer(draw):
        return op.reference(*draw).astype(op.make_output(size).dtype)

    class Session:
        def __init__(self, who):
            self.who = who

        def prepare(self, op_name, name):
            held[f"{self.who} prepared"] = gpu_lock().holding
            return {"ok": True}

        def call(self, name, case_id, inputs, out, limit=None, sm_count=None):
            from workbench.grade.supervisor import CallReply

            held["call"] = gpu_lock().holding
            return CallReply(None, [{"file": "x"}], [], 0.0, answer(inputs), list(inputs))

        def ready_to_time(self, name, draws, out):
            held[f"{self.who} copied"], self.draws = gpu_lock().holding, draws

        def time(self, name, keep=True):
            held[f"{self.who} timed"] = gpu_lock().holding
            held[f"{self.who} keeps its copies"] = keep
            return (10.0 if self.who == "submission" else 12.0), None

        def after_timing(self, name):
            held[f"{self.who} checked"], draws = gpu_lock().holding, self.draws
            return [answer(draws[(i + 1) % len(draws)]) for i in range(len(draws))], None

    monkeypatch.setattr(results, "environment", lambda: {})
    monkeypatch.setattr(cases, "foreign_code", lambda launches, submission: None)
    (case,) = [c for c in cases.plan(op, [size], seed=1) if c.inputs == "random"]
    result = cases.run_case(stage, Session("submission"), case, 0, functions=[], submission=None)
    speed = cases.speed_case(stage, Session("submission"), Session("solution"), bar=0.6, seed=1)
    assert (result.status, speed.status) == (PASSED, PASSED), (result.message, speed.message)
    assert held == {"call": "shared", "solution prepared": "shared", "submission copied": "shared",
                    "solution copied": "shared", "submission timed": "exclusive", "solution timed": "exclusive",
                    "submission keeps its copies": True, "solution keeps its copies": False,
                    "submission checked": "shared"}
    assert speed.speed["ratio"] == pytest.approx(1.2)  # the solution's time over the submission's
    assert gpu_lock().holding is None


def test_a_speed_under_the_bar_is_timed_again_and_each_stages_best_time_kept(monkeypatch, tmp_path):
    """A process whose launches were stalled by the host once (the answer key at 0.28 of its own speed on a
    loaded H200) is timed again, both stages, and passes; a submission slow every time still fails, after
    1 + SPEED_RETAKES timings; one at the bar from the start is timed once."""
    from workbench import results
    from workbench.gpulock import LOCK_VARIABLE
    from workbench.grade import cases

    monkeypatch.setenv(LOCK_VARIABLE, str(tmp_path / "gpu"))
    monkeypatch.setattr(cases, "_device", SimpleNamespace(is_simulator=lambda: False))
    monkeypatch.setattr(results, "environment", lambda: {})
    op, (stage,) = resolve("reduction.naive")
    size = (1000,)
    op = dataclasses.replace(op, grade_speed_size=size)
    stage = dataclasses.replace(stage, op=op)

    class Session:
        def __init__(self, times):
            self.times, self.readied = list(times), 0

        def prepare(self, op_name, name):
            return {"ok": True}

        def ready_to_time(self, name, draws, out):
            self.readied, self.draws = self.readied + 1, draws

        def time(self, name, keep=True):
            return self.times.pop(0), None

        def after_timing(self, name):
            return [op.reference(*self.draws[(i + 1) % len(self.draws)]).astype(np.float32)
                    for i in range(len(self.draws))], None

    def speed(mine, theirs):
        submission, key = Session(mine), Session(theirs)
        case = cases.speed_case(stage, submission, key, bar=0.6, seed=1)
        return case, key.readied

    case, readied = speed([35.0, 10.0], [10.0, 11.0])  # stalled once: 0.29, then 10 against 10
    assert case.passed and case.speed["attempts"] == 2 and readied == 2
    assert (case.speed["median_us"], case.speed["solution_median_us"]) == (10.0, 10.0)
    case, readied = speed([30.0, 31.0, 29.0], [10.0, 10.0, 10.0])  # slow every time
    assert case.reason == "too-slow" and case.speed["attempts"] == 1 + cases.SPEED_RETAKES == readied
    case, readied = speed([16.0], [10.0])  # 0.62: over the bar at once
    assert case.passed and case.speed["attempts"] == 1 and readied == 1


def test_the_answer_key_failing_to_be_timed_is_a_grader_error_not_the_submissions(monkeypatch, tmp_path):
    """The speed bar's answer key runs in a worker of its own: that worker stopping, or the key raising,
    is the grader's failure (status "error"), never a verdict on the submission."""
    from workbench.gpulock import LOCK_VARIABLE
    from workbench.grade import cases
    from workbench.grade.supervisor import CaseAborted, GraderError

    monkeypatch.setenv(LOCK_VARIABLE, str(tmp_path / "gpu"))
    monkeypatch.setattr(cases, "_device", SimpleNamespace(is_simulator=lambda: False))
    op, (stage,) = resolve("reduction.naive")
    stage = dataclasses.replace(stage, op=dataclasses.replace(op, grade_speed_size=(1000,)))

    class Submission:
        def ready_to_time(self, name, draws, out):
            return None

        def time(self, name, keep=True):
            return 10.0, None

    class Key:
        def __init__(self, failure):
            self.failure = failure

        def prepare(self, op_name, name):
            return {"ok": True}

        def ready_to_time(self, name, draws, out):
            if self.failure == "stopped":
                raise CaseAborted("crash", "the process died")
            return None

        def time(self, name, keep=True):
            return None, {"reason": "exception", "message": "RuntimeError: boom"}

    for failure, said in (("stopped", "the process died"), ("raised", "RuntimeError: boom")):
        with pytest.raises(GraderError, match=said):
            cases.speed_case(stage, Submission(), Key(failure), bar=0.6, seed=1)


def test_each_operator_of_a_file_is_a_job_of_its_own(monkeypatch):
    """--jobs runs operators in parallel, not files: activations.py alone holds 21 operators (79 stages)."""
    from workbench.grade import api
    from workbench.registry import operators_named, source_file

    jobs = []
    monkeypatch.setattr(api, "_grade_file", lambda path, stages, impl, **kw: jobs.append(
        (path, {s.op.name for s in stages}, kw["heading"])) or [])
    api.grade("rmsnorm", "solutions", jobs=2)
    ops = operators_named("rmsnorm")
    assert len({source_file(op) for op in ops}) == 1 and len(ops) >= 3  # one file, several operators...
    assert sorted(name for _, (name,), _ in jobs) == sorted(op.name for op in ops)  # ...a job each
    assert all(heading.endswith(f"({name})") for _, (name,), heading in jobs)


def test_the_worker_is_made_ready_to_time_timed_and_checked_in_three_requests():
    """Copies and the compiling call under the shared hold, the timing alone under the exclusive one, the
    calls after timing shared again: three requests. (The simulator has no timer: the timing gets as far as
    the timer and says so.)"""
    from workbench.grade.api import _answer_key_dirs
    from workbench.grade.supervisor import WorkerSession
    from workbench.registry import source_file

    op, (stage,) = resolve("reduction.naive")
    job = {"type": "job", "submission": str(source_file(op)), "guard_answer_key": False,
           "answer_key_dirs": _answer_key_dirs(), "sm_count": 2, "max_threads": None}
    session = WorkerSession(job, 60)
    try:
        assert session.loaded()["ok"] and session.prepare(op.name, stage.name)["ok"]
        draws = [op.make_inputs((1000,), np.random.default_rng(k)) for k in range(2)]
        assert session.ready_to_time(stage.name, draws, op.make_output((1000,))) is None
        median, error = session.time(stage.name)
        assert median is None and "event_elapsed_time" in error["message"], error
        assert session.ready_to_time(stage.name, draws, op.make_output((1000,))) is None
        outputs, error = session.after_timing(stage.name)  # (the calls after timing need no timer)
        assert error is None and len(outputs) == 2
        for i, out in enumerate(outputs):  # output i is of draw i + 1, in the buffers draw i was timed in
            assert np.allclose(out, op.reference(*draws[(i + 1) % 2]), rtol=1e-4)
    finally:
        session.close()


@pytest.mark.slow  # (6 s)
def test_several_targets_are_graded_in_one_run_each_stage_once(capsys):
    """A GPU session grades groups of families in one process (one cache, one --jobs across them)."""
    import json

    from workbench.cli import main

    code = main(["grade", "reduction[max]", "scan.hillis_steele", "reduction[max].one_pass", "--impl", "solutions",
                 "--quick", "--jobs", "2", "--json"])
    keys = [s["key"] for s in json.loads(capsys.readouterr().out)["stages"]]
    assert code == 0 and sorted(keys) == ["reduction[max].one_pass", "reduction[max].two_pass", "scan.hillis_steele"]
    assert main(["grade", "scan", "nosuchop", "--impl", "solutions"]) == 2
    assert "no operator 'nosuchop'" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.timing(whole=True)  # (the grader's own lock orders its jobs inside)
def test_parallel_jobs_on_a_gpu_keep_the_speed_bar_honest():
    """--jobs 4 on one GPU: the calls run side by side, each speed case's two measurements alone, so the
    answer key timed against itself stays near 100% (graded ten operators at a time with no lock, its
    ratios ranged from 21% to 229%, and six stages failed their own bar)."""
    from workbench.registry import operator

    targets = [operator(name).stages[-1].key for name in ("scan", "histogram", "argmax", "matvec", "stencil")]
    report = grade(targets, "solutions", quick=True, jobs=4)
    assert report.passed, report.text()
    ratios = {s.key: c.speed["ratio"] for s in report.graded for c in s.cases if c.kind == "speed"}
    assert len(ratios) == len(targets) and all(0.8 < r < 1.25 for r in ratios.values()), ratios


def test_the_speed_bars_answer_key_is_a_worker_of_the_key_file_even_for_a_learners_file(monkeypatch, tmp_path):
    """Graded from a file of one's own, the submission's worker runs that file and the key's worker the
    answer key's, unguarded; neither is started before a request needs it (the simulator never times)."""
    from workbench.grade import api
    from workbench.registry import source_file

    mine = tmp_path / "reductions.py"
    mine.write_text(source_file(resolve("reduction.naive")[0]).read_text())
    seen = []
    monkeypatch.setattr(api, "grade_stage", lambda stage, session, cases, submission, **kw: seen.append(
        (session, kw["key"])) or api.stage_verdict(stage, "passed", "", ""))
    _, (stage,) = resolve("reduction.naive")
    sessions = []
    api._grade_file(mine, [stage], str(mine), sizes=[(100,)], quick=True, seed=1, timeout=60, speed=True,
                    listener=api.Listener(), sessions=sessions, heading="mine")
    (session, key), = seen
    assert session.job["submission"] == str(mine.resolve()) and session.job["guard_answer_key"]
    assert key.job["submission"] == str(source_file(stage.op).resolve()) and not key.job["guard_answer_key"]
    assert sessions == [session, key] and session.worker is None and key.worker is None and key.closed


def test_a_thread_pinned_to_a_gpu_takes_that_gpus_lock(monkeypatch, tmp_path):
    """`grade --jobs N` on a host of several GPUs: a job's thread holds its own GPU's lock (the stem a
    process pinned to that GPU by CUDA_VISIBLE_DEVICES takes too), other threads keep the process's."""
    import threading

    from workbench.gpulock import LOCK_VARIABLE, default_stem, gpu_lock, pinned

    monkeypatch.delenv(LOCK_VARIABLE, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    alone = default_stem()  # a process started on GPU 1 alone
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    process = default_stem()
    with pinned("1"):
        assert default_stem() == alone != process
        with pinned(None):  # (no change)
            assert default_stem() == alone
        seen = []
        other = threading.Thread(target=lambda: seen.append(default_stem()))
        other.start(), other.join()
        assert seen == [process]  # another thread: the process's lock
    assert default_stem() == process
    monkeypatch.setenv(LOCK_VARIABLE, str(tmp_path / "gpu"))
    with pinned("1"):
        assert gpu_lock().stem == str(tmp_path / "gpu") + "-1"


def test_on_a_host_of_several_gpus_the_jobs_take_turns_over_them(monkeypatch, tmp_path):
    """Each job's slot picks a GPU (slot % GPUs): its workers see that GPU alone (CUDA_VISIBLE_DEVICES in
    their environment) and its thread is pinned to it; one GPU, or --jobs 1, changes nothing."""
    import threading

    from workbench.grade import api, cases
    from workbench.gpulock import pinned_gpu
    from workbench.grade.supervisor import WorkerProcess

    seen, lock = [], threading.Lock()

    def fake_grade_file(path, stages, impl, **kw):
        with lock:
            seen.append((kw["gpu"], cases.job_gpu(), pinned_gpu()))
        return []

    from contextlib import nullcontext

    from numba import cuda

    from workbench.registry import operators_named

    monkeypatch.setattr(api, "_grade_file", fake_grade_file)
    monkeypatch.setattr(api._device, "mode", lambda: "gpu")
    monkeypatch.setattr(api, "visible_gpus", lambda: ["GPU-aa", "GPU-bb"])
    monkeypatch.setattr(cuda, "gpus", [nullcontext(), nullcontext()])  # (numba's current device, faked)
    api.grade("reduction", "solutions", jobs=4)
    assert len(seen) == len(operators_named("reduction")) > 2  # a job an operator
    assert {gpu for gpu, _, _ in seen} == {"GPU-aa", "GPU-bb"}
    assert all(job == (["GPU-aa", "GPU-bb"].index(gpu), gpu) and pinned == gpu for gpu, job, pinned in seen)
    seen.clear()
    api.grade("reduction", "solutions", jobs=1)
    assert {(gpu, job, pinned) for gpu, job, pinned in seen} == {(None, None, None)}
    monkeypatch.setattr(api, "visible_gpus", lambda: ["0"])
    seen.clear()
    api.grade("reduction", "solutions", jobs=4)
    assert {(gpu, job, pinned) for gpu, job, pinned in seen} == {(None, None, None)}

    worker = WorkerProcess.__new__(WorkerProcess)  # the worker of a job on GPU-bb sees GPU-bb alone
    worker.job, worker.token, worker.tmp = {"gpu": "GPU-bb"}, "t", tmp_path
    assert worker._environment()["CUDA_VISIBLE_DEVICES"] == "GPU-bb"


def test_the_runaway_limit_times_the_answer_key_on_the_jobs_own_gpu(monkeypatch):
    """The limit is worked out in a thread of its own (supervisor._LimitInBackground): the answer key's
    run there is on the GPU of the job that asked, under that GPU's lock."""
    import threading
    from contextlib import nullcontext

    from numba import cuda

    from workbench.gpulock import pinned_gpu
    from workbench.grade import cases

    monkeypatch.setattr(cuda, "gpus", [nullcontext(), nullcontext()])
    ran_on = []
    monkeypatch.setattr(cases, "solution_seconds", lambda *args: ran_on.append((cases.job_gpu(), pinned_gpu()))
                        or (1.0, 1.0))
    _, (stage,) = resolve("reduction.naive")
    with cases.on_gpu((1, "GPU-bb")):
        limit = cases.runaway_limit(stage, (100,), ())
    worker = threading.Thread(target=limit)
    worker.start(), worker.join()
    assert ran_on == [((1, "GPU-bb"), "GPU-bb")] and cases.job_gpu() is None
