"""What changed from one stage to the next: the diff is the lesson.

``stage_diff(stage)`` compares the source of a stage (its launcher and every kernel and device
function it reaches, as ``Stage.source()`` shows them) with the previous stage's, line by line. It
renders as plain text, as coloured text for a terminal (``workbench diff softmax.ilp``), and as HTML
with added and removed lines marked (each notebook section shows it under the stage's paragraph).
"""

from __future__ import annotations

import difflib
import html
from dataclasses import dataclass

from .ladder import Stage

CONTEXT_LINES = 3


@dataclass
class StageDiff:
    stage: Stage
    previous: Stage | None
    lines: list[str]  # unified-diff lines without the ---/+++ header: "@@ ...", " kept", "-removed", "+added"

    @property
    def added(self) -> int:
        return sum(1 for line in self.lines if line.startswith("+"))

    @property
    def removed(self) -> int:
        return sum(1 for line in self.lines if line.startswith("-"))

    @property
    def title(self) -> str:
        if self.previous is None:
            return f"{self.stage.key}: the first stage ({self.added} lines)"
        return (f"{self.previous.key} -> {self.stage.key}: "
                f"{self.added} line(s) added, {self.removed} removed")


def previous_stage(stage: Stage) -> Stage | None:
    earlier = [s for s in stage.op.stages if s.order < stage.order]
    return earlier[-1] if earlier else None


def stage_diff(stage: Stage, against: Stage | None = None, context: int = CONTEXT_LINES) -> StageDiff:
    """The change of ``stage``'s kernels and launcher against ``against`` (default: the previous stage)."""
    before_stage = against if against is not None else previous_stage(stage)
    after = stage.source().splitlines()
    if before_stage is None:
        return StageDiff(stage, None, ["+" + line for line in after])
    before = before_stage.source().splitlines()
    lines = list(difflib.unified_diff(before, after, lineterm="", n=context))[2:]  # drop the ---/+++ header
    return StageDiff(stage, before_stage, lines)


def as_text(d: StageDiff) -> str:
    return d.title + "\n" + "\n".join(d.lines) + "\n"


_RICH_STYLE = {"+": "green", "-": "red", "@": "cyan"}


def as_rich(d: StageDiff):
    """The diff as a rich Text, coloured by line kind (for a terminal)."""
    from rich.text import Text

    out = Text(d.title + "\n", style="bold")
    for line in d.lines:
        out.append(line + "\n", style=_RICH_STYLE.get(line[:1], "dim"))
    return out


_HTML_STYLE = {
    "+": "background:#e6ffec;color:#1a4d2a",
    "-": "background:#ffebe9;color:#6e1d1d",
    "@": "color:#57606a;background:#f6f8fa",
    " ": "color:#24292f",
}


def as_html(d: StageDiff) -> str:
    """The diff as a block of HTML: added lines green, removed lines red, as in a code review."""
    rows = []
    for line in d.lines:
        kind = line[:1] if line[:1] in _HTML_STYLE else " "
        rows.append(f'<div style="{_HTML_STYLE[kind]};white-space:pre">{html.escape(line) or "&nbsp;"}</div>')
    return (f'<details open><summary><b>{html.escape(d.title)}</b></summary>'
            f'<div style="font-family:monospace;font-size:12px;line-height:1.35;border:1px solid #d0d7de;'
            f'border-radius:6px;padding:4px 0;overflow-x:auto">{"".join(rows)}</div></details>')
