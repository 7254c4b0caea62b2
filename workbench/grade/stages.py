"""One stage, start to verdict: is it there, is it the submission's own code, does it still have its
stub line, then its cases in order, then (on a GPU) the speed bar.

A stage that still has a ``TODO(exercise)`` line is judged by what runs: at its first failed case it
is "not implemented yet"; if every case passes it passes, with a note to delete the leftover line,
unless its file is the exercise exactly as generated: then no code of the learner's ran, the stub is not
on the stage's path (its only TODO is in a helper it never calls), and it is "not an exercise", never a pass.
"""

from __future__ import annotations

from dataclasses import replace

from .. import device as _device
from ..markers import is_pristine
from .cases import Case, Submission, foreign_code, run_case, speed_case, stale_if_repeat
from .reasons import ADVICE, advice_for
from .report import ERROR, FAILED, NOT_AN_EXERCISE, NOT_IMPLEMENTED, PASSED, SKIPPED, CaseResult, StageGrade
from .supervisor import GraderError
from .targets import shared_code_of


# Cases after one of these are not run (they would hang or die the same way, a fresh process each).
ABORTED = {"timeout": "it timed out", "crash": "the process running it died", "exited": "it exited",
           "channel": "it wrote to the grader's channel"}


class Listener:
    """What the grader says while it works (the CLI draws progress bars from it)."""

    def file_started(self, shown_as: str, stages: int) -> None: ...

    def stage_started(self, key: str, cases: int) -> None: ...

    def case_done(self, key: str, result: CaseResult) -> None: ...

    def stage_done(self, grade: StageGrade) -> None: ...


def stage_verdict(stage, status: str, reason: str, message: str, *, file: str = "",
                  advice: str | None = None, notes=()) -> StageGrade:
    """A stage judged as a whole, without cases (not there, not importable, not its own code, ...)."""
    case = CaseResult(stage.key, [], SKIPPED if status == SKIPPED else FAILED, reason, message,
                      ADVICE.get(reason, "") if advice is None else advice, kind="stage")
    return StageGrade(stage.key, stage.order, status, [case], list(notes), file)


def _load_verdict(stage, loaded: dict, submission: Submission) -> StageGrade | None:
    if loaded.get("ok"):
        refused = loaded.get("refusals") or []
        if refused:  # it imported, but tried what it may not while doing so
            reason = refused[0]["reason"]
            return stage_verdict(stage, FAILED, reason, f"while importing: refused: {refused[0]['what']}",
                                 file=submission.shown_as)
        return None
    reason = loaded.get("reason", "import-error")
    if any(r["reason"] == "answer-key" for r in loaded.get("refusals") or []):
        reason = "answer-key"
    if reason == "needs-gpu":
        return stage_verdict(stage, SKIPPED, reason, loaded.get("message", ""), file=submission.shown_as,
                             notes=[f"needs a GPU: {loaded.get('message', '')}"])
    message = loaded.get("message", "")
    if loaded.get("printed"):
        message += f"\nit printed: {loaded['printed'].strip()[:500]}"
    return stage_verdict(stage, FAILED, reason, message, file=submission.shown_as)


def grade_stage(stage, session, cases: list[Case], submission: Submission, *, seed: int, speed: bool,
                listener: Listener, key) -> StageGrade:
    """The stage's grade; the grader's own failures become status "error", never the learner's. ``key``
    runs the answer key's stage for the speed bar (``cases.speed_case``)."""
    try:
        return _grade_stage(stage, session, cases, submission, seed=seed, speed=speed, listener=listener, key=key)
    except GraderError as exc:  # the worker's side of the grader failed
        message = str(exc)
    except Exception as exc:  # this side failed (making inputs, the reference, ...): never the submission
        message = f"{type(exc).__name__}: {exc}"
    return stage_verdict(stage, ERROR, "grader-error", f"grader error (not your code): {message}",
                         file=submission.shown_as)


def _grade_stage(stage, session, cases, submission: Submission, *, seed, speed, listener, key) -> StageGrade:
    if stage.gpu_only and _device.is_simulator():
        return stage_verdict(stage, SKIPPED, "needs-gpu", stage.gpu_only, file=submission.shown_as,
                             notes=[f"needs a GPU: {stage.gpu_only}"])
    verdict = _load_verdict(stage, session.loaded(), submission)
    if verdict:
        return verdict
    prepared = session.prepare(stage.op.name, stage.name)
    if not prepared.get("ok"):
        return stage_verdict(stage, FAILED, "missing", prepared.get("message", "") + submission.hint_missing,
                             file=submission.shown_as)
    functions = prepared["functions"]
    if not submission.own_dirs:  # (the answer key itself owns its shared modules)
        submission = replace(submission, shared_code=shared_code_of(stage))
    foreign = foreign_code(functions, submission)
    if foreign:
        return stage_verdict(stage, FAILED, *foreign, file=submission.shown_as)
    stubs = sorted({f"{submission.shown_as}, line {line}, in `{f['qualname']}`"
                    for f in functions for line in f["stub_lines"]})
    grade = StageGrade(stage.key, stage.order, PASSED, file=submission.shown_as)
    listener.stage_started(stage.key, len(cases))
    for i, case in enumerate(cases):
        result = run_case(stage, session, case, i, functions=functions, submission=submission)
        grade.cases.append(result)
        listener.case_done(stage.key, result)
        if result.reason == "needs-gpu":
            grade.status = SKIPPED
            grade.notes.append(f"needs a GPU: {result.message}")
            return grade
        if stubs and result.failed:
            return _not_implemented(grade, stubs, result)
        if result.reason in ABORTED:  # the next cases would go the same way: say so instead of waiting
            grade.notes.append(f"the cases after {result.label} were not run: {ABORTED[result.reason]}")
            break
    stale_if_repeat(grade.cases)
    if all(c.passed for c in grade.cases) and speed and not _device.is_simulator():
        grade.cases.append(speed_case(stage, session, key, stage.op.grade_speed_bar, seed))
    grade.status = PASSED if all(c.passed for c in grade.cases) else FAILED
    if stubs and grade.passed and _untouched(submission):
        return StageGrade(stage.key, stage.order, NOT_AN_EXERCISE, file=submission.shown_as, notes=[
            "it passes with the exercise untouched: its TODO(exercise) stub is in code the stage never runs, "
            "so nothing on its path is for a learner to write (" + "; ".join(stubs) + ")"])
    if stubs:
        grade.notes.append("it runs, but still has its TODO(exercise) line: delete it (" + "; ".join(stubs) + ")")
    return grade


def _untouched(submission: Submission) -> bool:
    """Is the submission's file a generated exercise nobody has edited?"""
    try:
        with open(submission.file or "", encoding="utf-8") as f:
            return is_pristine(f.read())
    except OSError:
        return False


def _not_implemented(grade: StageGrade, stubs: list[str], first: CaseResult) -> StageGrade:
    grade.status = NOT_IMPLEMENTED
    first.reason = "not-implemented"
    first.message = (f"not implemented yet: {'; '.join(stubs)} still has the TODO(exercise) stub line, and "
                     f"{first.label} fails ({first.message.splitlines()[0] if first.message else first.reason})")
    first.advice = advice_for("not-implemented")
    return grade
