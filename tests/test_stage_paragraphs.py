"""Stage paragraphs and the module docstrings notebooks open with teach the lesson: what changed and
why it is faster. Measurement history (run dates, the files a run wrote, an issue's target, a session)
belongs in NOTES.md; a number in a paragraph is stated without a date."""

from __future__ import annotations

import inspect
import re

import pytest

from workbench import registry

HISTORY = {
    "a run date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    # an issue of the tracker ("the 50%", "issue 30"), not an instruction issued ("issues eight loads")
    "an issue or a tracker": re.compile(
        r"\bissue(?:'s| #\d+)|\(issues? \d+|\bthe issue\b(?! slots?)|\btracker\b", re.I),
    "a results file": re.compile(r"results/|\.jsonl?\b"),
    "a work session": re.compile(r"\bsession\b", re.I),
}

OPS = registry.load_operators()


def history_in(text: str) -> list[str]:
    return [f"{what} ({m.group(0)!r})" for what, pattern in HISTORY.items() if (m := pattern.search(text))]


@pytest.mark.parametrize("op", OPS.values(), ids=list(OPS))
def test_no_stage_paragraph_carries_measurement_history(op):
    found = {stage.name: history_in(stage.summary) for stage in op.stages}
    found = {name: what for name, what in found.items() if what}
    assert not found, f"{op.name}: stage paragraphs with measurement history: {found}"


@pytest.mark.parametrize("module", sorted({registry.short_module_name(op) for op in OPS.values()}))
def test_no_module_story_carries_measurement_history(module):
    op = next(op for op in OPS.values() if registry.short_module_name(op) == module)
    found = history_in(inspect.cleandoc(registry.module_of(op).__doc__ or ""))
    assert not found, f"solutions/{module}.py's docstring (a notebook's opening): {found}"


def test_the_patterns_find_history():
    assert history_in("What it measured (results/runs/x.json: the H200, 2026-11-23)") == [
        "a run date ('2026-11-23')", "a results file ('results/')"]
    assert history_in("the issue's 50%") and history_in("measured in session 8")
    assert not history_in("One block of 256 threads per row: 4096 x 1024 in 9.5 us on the H200")
    assert not history_in("each thread issues eight loads; the freed issue slots go to the FMA units")
