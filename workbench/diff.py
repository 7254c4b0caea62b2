"""What changed from one stage to the next: the diff is the lesson.

``stage_diff(stage)`` compares the source of a stage (its launcher and every kernel and device
function it reaches, as ``Stage.source()`` shows them) with the previous stage's, line by line. The
stage's paragraph (the second argument of its ``@op.stage(...)`` decorator) is left out of both
sides: it is prose that every stage rewrites, and the notebook prints it just above. The diff renders
as plain text, as coloured text for a terminal (``workbench diff softmax.ilp``), and as HTML with
added and removed lines marked (each notebook section shows it under the stage's paragraph).

The HTML is meant to read in two places: JupyterLab keeps its inline colours (plain CSS properties,
which its sanitizer lets through in untrusted notebooks too); GitHub's notebook view
strips inline styles, so the lines sit in a ``<pre>`` (indentation and a fixed-width font survive) and
added/removed lines are ``<ins>``/``<del>`` elements, which GitHub still shows underlined and struck
through. Every line also keeps its ``+``/``-`` sign, so the diff reads even as plain text.
"""

from __future__ import annotations

import ast
import difflib
import html
from dataclasses import dataclass

from .ladder import Stage

CONTEXT_LINES = 3
PARAGRAPH_PLACEHOLDER = '"""(the paragraph above)"""'


def elide_paragraph(source: str, placeholder: str = PARAGRAPH_PLACEHOLDER) -> str:
    """``source`` with the paragraph of each ``@<op>.stage("name", "...")`` or ``@stage_of(ops, "name", "...")``
    decorator replaced by ``placeholder`` (read with ``ast``, so any quoting or layout of the decorator works)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if not isinstance(deco, ast.Call):
                continue
            if isinstance(deco.func, ast.Attribute) and deco.func.attr == "stage":  # @op.stage(name, paragraph)
                at = 1
            elif isinstance(deco.func, ast.Name) and deco.func.id == "stage_of":  # @stage_of(ops, name, paragraph)
                at = 2
            else:
                continue
            if len(deco.args) > at and isinstance(deco.args[at], ast.Constant) and isinstance(deco.args[at].value, str):
                spans.append(deco.args[at])
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast columns are UTF-8 byte offsets
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    for node in sorted(spans, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        begin, end = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        source = source[:begin] + placeholder + source[end:]
    return source


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


def stage_source(stage: Stage) -> list[str]:
    """The lines a diff compares: the stage's kernels and launcher, its paragraph elided."""
    return elide_paragraph(stage.source()).splitlines()


def stage_diff(stage: Stage, against: Stage | None = None, context: int = CONTEXT_LINES) -> StageDiff:
    """The change of ``stage``'s kernels and launcher against ``against`` (default: the previous stage)."""
    before_stage = against if against is not None else previous_stage(stage)
    after = stage_source(stage)
    if before_stage is None:
        return StageDiff(stage, None, ["+" + line for line in after])
    before = stage_source(before_stage)
    lines = list(difflib.unified_diff(before, after, lineterm="", n=context))[2:]  # drop the ---/+++ header
    return StageDiff(stage, before_stage, lines)


def as_text(d: StageDiff) -> str:
    return d.title + "\n" + "\n".join(d.lines) + "\n"


def as_markdown(d: StageDiff) -> str:
    """A fenced ```diff block (GitHub and JupyterLab colour it), under the title in bold."""
    fence = "```"
    while fence in "\n".join(d.lines):
        fence += "`"
    return f"**{d.title}**\n\n{fence}diff\n" + "\n".join(d.lines) + f"\n{fence}\n"


_RICH_STYLE = {"+": "green", "-": "red", "@": "cyan"}


def as_rich(d: StageDiff):
    """The diff as a rich Text, coloured by line kind (for a terminal)."""
    from rich.text import Text

    out = Text(d.title + "\n", style="bold")
    for line in d.lines:
        out.append(line + "\n", style=_RICH_STYLE.get(line[:1], "dim"))
    return out


# Each line kind: the element that marks it (styles stripped, it still shows) and its inline style.
_HTML_LINE = {
    "+": ("ins", "background-color:#dafbe1;color:#116329;text-decoration:none"),
    "-": ("del", "background-color:#ffebe9;color:#82071e;text-decoration:none"),
    "@": ("span", "color:#0969da;background-color:#ddf4ff"),
    " ": ("span", "color:#1f2328"),
}
_HTML_BLOCK = ("font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;"
               "line-height:1.4;border:1px solid #d0d7de;border-radius:6px;padding:6px 8px;margin:4px 0;"
               "overflow-x:auto;background-color:#ffffff;color:#1f2328")


def as_html(d: StageDiff) -> str:
    """The diff as HTML: added lines green (``<ins>``), removed lines red (``<del>``), hunk headers blue,
    in a ``<pre>`` that keeps indentation wherever the styles are stripped."""
    rows = []
    for line in d.lines:
        kind = line[:1] if line[:1] in _HTML_LINE else " "
        tag, style = _HTML_LINE[kind]
        rows.append(f'<{tag} style="{style}">{html.escape(line)}</{tag}>')
    return (f"<details open><summary><b>{html.escape(d.title)}</b></summary>"
            f'<pre style="{_HTML_BLOCK}">' + "\n".join(rows) + "</pre></details>")
