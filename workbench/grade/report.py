"""The grader's report: what was graded, each case's verdict, and the score, as text, JSON and JUnit.

A stage ends in one of six states. ``passed``, ``failed`` and ``not-implemented`` (a stage that still
has its ``TODO(exercise)`` line and does not work yet) are *judged*: they make the score. ``skipped``
(the simulator cannot run it: it needs a GPU), ``not-an-exercise`` (nothing on the stage's path is for
a learner to write: given whole, or its module has no exercise) and ``error`` (the grader's own trouble,
never the submission's) are not judged, and the score says how many of each there were, and why.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from xml.sax.saxutils import escape, quoteattr

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
NOT_IMPLEMENTED, ERROR, NOT_AN_EXERCISE = "not-implemented", "error", "not-an-exercise"
JUDGED = (PASSED, FAILED, NOT_IMPLEMENTED)
OUTPUT_SHOWN = 1500  # characters of a submission's printed output kept per case
# Failure reasons that say least about the cause, ranked after all others when choosing a stage's headline.
HEADLINE_RANK = {"wrong-values": 1, "stale": 1, "nan": 1, "uninitialised": 1, "unwritten": 1, "all-zeros": 2}


@dataclass
class CaseResult:
    """One call of the submission (or one verdict about the whole stage, ``kind="stage"``)."""

    stage: str  # op.stage
    size: list
    status: str  # passed, failed or skipped
    reason: str = ""
    message: str = ""
    advice: str = ""
    inputs: str = "random"  # which inputs: "random", an adversarial set ("all-negative", ...), "again"
    rel_err: float | None = None
    tolerance: float | None = None
    first_bad_index: list | None = None
    worst: list = field(default_factory=list)  # [index, got, expected] of the largest errors
    seconds: float = 0.0
    kind: str = "correctness"  # or "speed", or "stage"
    speed: dict | None = None  # gbps, solution_gbps, ratio, bar (speed cases)
    output: str = ""  # what the submission printed during the call

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    @property
    def label(self) -> str:
        size = "x".join(map(str, self.size))
        if self.kind == "speed":
            return f"speed @ {size}"
        if self.kind == "stage":
            return "stage"
        return size if self.inputs == "random" else f"{size} {self.inputs}"

    def fail(self, reason: str, message: str, advice: str = "") -> "CaseResult":
        self.status, self.reason, self.message, self.advice = FAILED, reason, message, advice
        return self


@dataclass
class StageGrade:
    key: str
    order: int
    status: str  # passed, failed, not-implemented, skipped, error
    cases: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # what a learner should know even when it passed
    file: str = ""  # the file graded, as the learner knows it

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def judged(self) -> bool:
        return self.status in JUDGED

    @property
    def headline(self) -> "CaseResult | None":
        """The failed case that says most about the failure: a specific reason (a race, an out-of-bounds
        access, a refusal) before wrong values, and "all zeros" last (at size 1 an off-by-one bound or a
        missing element looks like nothing computed); among equals, the first."""
        bad = [c for c in self.cases if c.failed]
        return min(bad, key=lambda c: (HEADLINE_RANK.get(c.reason, 0), bad.index(c))) if bad else None

    @property
    def why_not_judged(self) -> str:
        return "; ".join(self.notes) or self.status


@dataclass
class Report:
    impl: str  # what was asked for: exercises, solutions, a path, or a function
    mode: str  # gpu or sim
    seed: int
    stages: list = field(default_factory=list)
    files: list = field(default_factory=list)  # the files graded, as the learner knows them
    not_judged: list = field(default_factory=list)  # checks this run could not make (the speed bar in sim)
    seconds: float = 0.0

    @property
    def graded(self) -> list:
        return [s for s in self.stages if s.judged]

    @property
    def skipped(self) -> list:
        return [s for s in self.stages if s.status == SKIPPED]

    @property
    def not_exercises(self) -> list:
        return [s for s in self.stages if s.status == NOT_AN_EXERCISE]

    @property
    def errors(self) -> list:
        return [s for s in self.stages if s.status == ERROR]

    @property
    def score(self) -> tuple[int, int]:
        """(stages passed, stages judged)."""
        return sum(s.passed for s in self.graded), len(self.graded)

    @property
    def passed(self) -> bool:
        done, judged = self.score
        return judged > 0 and done == judged and not self.errors

    def summary(self) -> str:
        """'57 of 59 judged stages passed; 2 skipped: gemm.tensor_core (needs a GPU: ...), ...'"""
        done, judged = self.score
        parts = [f"{done} of {judged} judged stage{'s' * (judged != 1)} passed"]
        if self.skipped:
            parts.append(f"{len(self.skipped)} skipped: " + ", ".join(
                f"{s.key} ({s.why_not_judged})" for s in self.skipped))
        if self.not_exercises:
            parts.append(f"{len(self.not_exercises)} not an exercise: "
                         + ", ".join(s.key for s in self.not_exercises))
        if self.errors:
            parts.append(f"{len(self.errors)} not graded because of a grader error (not your code): "
                         + ", ".join(s.key for s in self.errors))
        return "; ".join(parts)

    def as_dict(self) -> dict:
        done, judged = self.score
        count = {status: sum(s.status == status for s in self.stages)
                 for status in (FAILED, NOT_IMPLEMENTED, SKIPPED, NOT_AN_EXERCISE, ERROR)}
        return {"impl": self.impl, "files": self.files, "mode": self.mode, "seed": self.seed,
                "seconds": round(self.seconds, 2), "passed": self.passed, "summary": self.summary(),
                "not_judged": self.not_judged,
                "score": {"passed": done, "judged": judged, "failed": count[FAILED],
                          "not_implemented": count[NOT_IMPLEMENTED], "skipped": count[SKIPPED],
                          "not_an_exercise": count[NOT_AN_EXERCISE],
                          "errors": count[ERROR]},
                "stages": [{"key": s.key, "order": s.order, "status": s.status, "file": s.file, "notes": s.notes,
                            "cases": [asdict(c) for c in s.cases]} for s in self.stages]}

    def junit(self) -> str:
        rows = [(s, c) for s in self.stages for c in (s.cases or [None])]
        failures = sum(1 for s, c in rows if s.judged and c is not None and not c.passed)
        errors = sum(1 for s, _ in rows if s.status == ERROR)
        head = f'tests="{len(rows)}" failures="{failures}" errors="{errors}" time="{self.seconds:.3f}"'
        lines = ['<?xml version="1.0" encoding="utf-8"?>', f'<testsuites name="workbench grade" {head}>',
                 f'<testsuite name={quoteattr("grade " + self.impl)} {head}>']
        for s, c in rows:
            name = c.label if c is not None else "stage"
            case = f'<testcase classname={quoteattr(s.key)} name={quoteattr(name)} time="{c.seconds if c else 0:.3f}"'
            if s.status in (SKIPPED, NOT_AN_EXERCISE) or (c is not None and c.status == SKIPPED):
                lines.append(f"{case}><skipped message={quoteattr(s.why_not_judged)}/></testcase>")
            elif s.status == ERROR:
                message = c.message if c is not None else s.why_not_judged
                lines.append(f"{case}><error message={quoteattr(message)}/></testcase>")
            elif c is None or c.passed:
                lines.append(f"{case}/>")
            else:
                body = "\n".join(filter(None, [c.message, c.advice, worst_text(c), output_text(c)]))
                lines.append(f"{case}><failure type={quoteattr(c.reason or 'failed')} "
                             f"message={quoteattr(one_line(c))}>{escape(body)}</failure></testcase>")
        lines += ["</testsuite>", "</testsuites>"]
        return "\n".join(lines) + "\n"

    def render(self, console=None) -> None:
        """The table of cases, then each failed stage's first failure with its advice, then the score."""
        from ..console import console as Console

        console = console or Console()
        where = "simulator" if self.mode == "sim" else "GPU"
        for path in self.files:
            console.print(f"graded [bold]{_markup(path)}[/]")
        console.print(_case_table(self, f"grade: {self.impl} ({where}, seed {self.seed})"))
        for s in self.stages:
            _render_stage_details(console, s)
        for what in self.not_judged:
            console.print(f"[yellow]not judged:[/] {_markup(what)}")
        colour = "green" if self.passed else "red"
        console.print(f"[{colour}]score: {_markup(self.summary())}[/] in {self.seconds:.0f} s")

    def text(self, width: int = 120) -> str:
        from ..console import console as Console

        buf = io.StringIO()
        self.render(Console(file=buf, width=width, color_system=None, force_terminal=False, force_jupyter=False,
                            highlight=False))
        return buf.getvalue()


def _markup(text: str) -> str:
    from rich.markup import escape as escape_markup

    return escape_markup(text)


VERDICT = {PASSED: "[green]ok[/]", FAILED: "[red]FAIL[/]", SKIPPED: "[yellow]skip[/]",
           NOT_IMPLEMENTED: "[yellow]todo[/]", ERROR: "[magenta]error[/]",
           NOT_AN_EXERCISE: "[dim]not an exercise[/]"}


def _case_table(report: Report, title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("stage", "case", "result", "detail"):
        table.add_column(col, overflow="fold")
    for s in report.stages:
        if not s.cases:
            table.add_row(s.key, "", VERDICT[s.status], _markup(s.why_not_judged))
        said: dict = {}  # reason -> the case whose row said it: a repeat says so in a few words
        for c in s.cases:
            status = s.status if s.status in (NOT_IMPLEMENTED, ERROR) and not c.passed else c.status
            if c.kind == "speed":
                detail = speed_text(c)
            elif c.passed:
                detail = ""
            elif c.reason in said:
                detail = f"{c.reason} again (as at {said[c.reason]})"
            else:
                detail, said[c.reason] = one_line(c), c.label
            table.add_row(s.key, c.label, VERDICT[status], _markup(detail))
    return table


def _render_stage_details(console, s: StageGrade) -> None:
    for note in s.notes:
        if s.status not in (SKIPPED, NOT_AN_EXERCISE):
            console.print(f"[bold]{s.key}[/] [cyan]note:[/] {_markup(note)}")
    bad = [c for c in s.cases if c.failed]
    if s.status == NOT_AN_EXERCISE:
        return  # its table row says why
    if not bad or s.status == ERROR:
        for c in bad:
            console.print(f"[bold]{s.key}[/] [magenta]grader error (not your code):[/] {_markup(c.message)}")
        return
    c = s.headline
    at = "" if c.kind == "stage" else f" at {_markup(c.label)}"
    console.print(f"[bold]{s.key}[/] failed{at}: {_markup(c.message)}")
    if c.advice:
        console.print(f"  [cyan]advice:[/] {_markup(c.advice)}")
    for extra in (worst_text(c), output_text(c)):
        if extra:
            console.print(_markup("  " + extra.replace("\n", "\n  ")))


def one_line(c: CaseResult) -> str:
    return c.message.splitlines()[0] if c.message else c.reason


def worst_text(c: CaseResult) -> str:
    if not c.worst:
        return ""
    rows = [f"index {idx}: got {got!r}, expected {want!r}" for idx, got, want in c.worst]
    extra = []
    if c.first_bad_index is not None:
        extra.append(f"first wrong index {c.first_bad_index}")
    if c.rel_err is not None and c.kind == "correctness":
        extra.append(f"relative error {c.rel_err:.3g} (tolerance {c.tolerance:.1g})" if c.tolerance is not None
                     else f"relative error {c.rel_err:.3g}")
    try:
        extra.append(f"max abs error {max(abs(float(g) - float(w)) for _, g, w in c.worst):.3g}")
    except (TypeError, ValueError):
        pass
    return "; ".join(extra) + "\nworst elements:\n  " + "\n  ".join(rows)


def output_text(c: CaseResult, max_lines: int = 8) -> str:
    lines = c.output.rstrip().splitlines()
    if not lines:
        return ""
    more = [f"... ({len(lines) - max_lines} more lines)"] if len(lines) > max_lines else []
    return "your code printed:\n  " + "\n  ".join([line[:200] for line in lines[:max_lines]] + more)


def speed_text(c: CaseResult) -> str:
    s = c.speed or {}
    if not s:
        return c.message
    best = f", the best of {s['attempts']} timings" if s.get("attempts", 1) > 1 else ""
    return (f"{s['gbps']:.0f} GB/s vs solution {s['solution_gbps']:.0f} GB/s = {100 * s['ratio']:.0f}% "
            f"(bar {100 * s['bar']:.0f}%{best})" + ("" if c.passed else f": {c.message}"))
