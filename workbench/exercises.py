"""Generate ``exercises/`` from ``solutions/``: one source of truth, the learner's edits never lost.

A solutions module marks what a learner should write::

    # HINT: a nudge                       (1 to 3 hint lines, vague -> specific, directly before BEGIN)
    # HINT: more specific
    # HINT: nearly the answer
    # BEGIN SOLUTION
    ...the code...
    # END SOLUTION

``exercises/<module>.py`` is the module with each marked region replaced by a stub: the hints,
numbered, and one line ``pass  # TODO(exercise): not implemented yet ...`` (``return`` instead of
``pass`` where later code needs a variable the region defines, so the kernel stops before using
it). Everything else is kept as is: signatures, docstrings, shared-memory declarations, launchers,
and the ``op = Operator(...)`` that registers the exercise's stages under the solution's names.
The grader never trusts that copy of the operator: it judges with the one in ``solutions/``.

A stub kernel runs without crashing and leaves its output unwritten (poison), but the grader does
not rely on that: it finds the ``TODO(exercise)`` line in the source of every kernel a stage
reaches and reports "not implemented yet" without running anything (on a real GPU a kernel cannot
report an error unless compiled with debug=True).

Each generated file starts with a header whose ``generated-sha256`` is the hash of what was
generated. ``build`` compares it with the file on disk: a file the learner has edited is never
overwritten; ``backup=True`` first moves it aside to ``<name>.<timestamp>.bak``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .markers import BEGIN, END, HINT, MAX_HINTS, STUB_MARK, has_markers

HASH_LINE = re.compile(r"^# generated-sha256: (?P<hash>[0-9a-f]{64})\s*$", re.M)
HEADER_END = "# " + "-" * 98


class MarkerError(ValueError):
    """Malformed exercise markers in a solutions module; the message names the file and line."""


@dataclass
class Region:
    hint_start: int  # index of the first HINT line (== begin when there are none)
    begin: int  # index of the BEGIN SOLUTION line
    end: int  # index of the END SOLUTION line
    indent: str
    hints: list = field(default_factory=list)
    function: str = "?"
    stub: str = "pass"


def find_regions(text: str, filename: str = "<source>") -> list[Region]:
    """The marked regions of a module, checked: paired, not nested, hints directly before BEGIN."""
    lines = text.splitlines()
    regions: list[Region] = []
    open_region: Region | None = None
    for i, line in enumerate(lines):
        if BEGIN.match(line):
            if open_region is not None:
                raise MarkerError(f"{filename}:{i + 1}: BEGIN SOLUTION inside the region opened at line "
                                  f"{open_region.begin + 1} (regions do not nest)")
            indent = BEGIN.match(line)["indent"]
            start = i
            while start > 0 and HINT.match(lines[start - 1]):
                start -= 1
            hints = [HINT.match(lines[k])["text"] for k in range(start, i)]
            if len(hints) > MAX_HINTS:
                raise MarkerError(f"{filename}:{start + 1}: {len(hints)} HINT lines before BEGIN SOLUTION; "
                                  f"at most {MAX_HINTS} (vague -> specific)")
            for k in range(start, i):
                if HINT.match(lines[k])["indent"] != indent:
                    raise MarkerError(f"{filename}:{k + 1}: HINT indented differently from its BEGIN SOLUTION")
            open_region = Region(start, i, -1, indent, hints)
        elif END.match(line):
            if open_region is None:
                raise MarkerError(f"{filename}:{i + 1}: END SOLUTION without a BEGIN SOLUTION")
            if END.match(line)["indent"] != open_region.indent:
                raise MarkerError(f"{filename}:{i + 1}: END SOLUTION indented differently from the BEGIN SOLUTION "
                                  f"at line {open_region.begin + 1}")
            if i == open_region.begin + 1:
                raise MarkerError(f"{filename}:{i + 1}: empty solution region")
            open_region.end = i
            regions.append(open_region)
            open_region = None
        elif HINT.match(line):
            k = i + 1
            while k < len(lines) and HINT.match(lines[k]):
                k += 1
            if k >= len(lines) or not BEGIN.match(lines[k]):
                raise MarkerError(f"{filename}:{i + 1}: a HINT line must be directly followed by more HINT lines "
                                  "and then BEGIN SOLUTION")
    if open_region is not None:
        raise MarkerError(f"{filename}:{open_region.begin + 1}: BEGIN SOLUTION is never closed by END SOLUTION")
    _analyse(text, regions, filename)
    return regions


def _names(nodes, ctx) -> set:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _analyse(text: str, regions: list[Region], filename: str) -> None:
    """Name each region's function, and choose its stub: `pass`, or `return` where code after the
    region reads a variable that only the region assigns (it would not exist with `pass`)."""
    try:
        tree = ast.parse(text, filename)
    except SyntaxError as exc:
        raise MarkerError(f"{filename}:{exc.lineno}: {exc.msg}") from exc
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for region in regions:
        first, last = region.begin + 1, region.end + 1  # 1-based lines of the markers
        owners = [f for f in functions if f.lineno < first and f.end_lineno >= last - 1]  # last - 1: the region's last line
        if not owners:
            raise MarkerError(f"{filename}:{first}: a solution region must be inside a function (a kernel)")
        func = max(owners, key=lambda f: f.lineno)  # the innermost
        region.function = func.name
        body = [n for n in ast.walk(func) if isinstance(n, ast.stmt) and n is not func]
        inside = [n for n in body if first < n.lineno < last]
        before = [n for n in body if n.lineno < first and n.end_lineno < first]
        after = [n for n in body if n.lineno > last]
        defined_before = _names(before, ast.Store) | {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
        needed = (_names(inside, ast.Store) & _names(after, ast.Load)) - defined_before
        region.stub = "return" if needed else "pass"


def hint_label(k: int, total: int) -> str:
    if k == 1 and total > 1:
        return "hint 1 (nudge)"
    if k == total and total > 1:
        return f"hint {k} (nearly the answer)"
    return f"hint {k}"


def render_body(text: str, filename: str = "<source>") -> str:
    """The exercise's text, without its header: each marked region replaced by its stub."""
    regions = find_regions(text, filename)
    lines = text.splitlines()
    for region in reversed(regions):
        ind = region.indent
        stub = [f"{ind}# EXERCISE: write this part of `{region.function}`. Read the hints one at a time."]
        for k, hint in enumerate(region.hints, 1):
            stub.append(f"{ind}#   {hint_label(k, len(region.hints))}: {hint}")
        stub.append(f"{ind}{region.stub}  # {STUB_MARK}: replace this line with your code")
        lines[region.hint_start:region.end + 1] = stub
    return "\n".join(lines) + "\n"


def digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def render(text: str, module: str, speed_bar: float, filename: str = "<source>") -> str:
    """The whole exercise file: header (with the hash of the body) + body."""
    body = render_body(text, filename)
    header = [
        HEADER_END,
        f"# EXERCISE generated from solutions/{module}.py by `workbench exercises build`. This copy is yours:",
        "# fill in every block marked TODO(exercise), then grade it:",
        f"#     workbench grade {module}            (or {module}.<stage>; `workbench grade --help`)",
        f"# The grader checks each stage against the operator in solutions/{module}.py (reference, inputs,",
        "# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element",
        "# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output",
        f"# was filled with poison. On a GPU each stage must also reach {speed_bar:.0%} of the bandwidth of the",
        "# solution's stage, measured in the same run.",
        "# `workbench exercises build` never overwrites this file once you have edited it (the line below",
        "# tells it whether you have); `--backup` moves your copy aside first.",
        f"# generated-sha256: {digest(body)}",
        HEADER_END,
    ]
    return "\n".join(header) + "\n" + body


def split_header(text: str) -> tuple[str | None, str]:
    """(the hash recorded in the header, the body after it); (None, text) if there is no header."""
    match = HASH_LINE.search(text)
    if match is None:
        return None, text
    end = text.find(HEADER_END + "\n", match.end())
    if end < 0:
        return None, text
    return match["hash"], text[end + len(HEADER_END) + 1:]


def is_pristine(text: str) -> bool:
    """Is this exactly what the generator wrote (no learner edits below the header)?"""
    recorded, body = split_header(text)
    return recorded is not None and digest(body) == recorded


# -- build ----------------------------------------------------------------------------------------

def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def solution_sources(solutions_dir: Path | None = None) -> dict[str, Path]:
    """solutions/<module>.py files with exercise markers, by module name."""
    solutions_dir = solutions_dir or repo_root() / "solutions"
    return {p.stem: p for p in sorted(solutions_dir.glob("*.py"))
            if not p.name.startswith("_") and has_markers(p.read_text())}


def speed_bar_for(module: str) -> float:
    """The fraction of the solution's bandwidth a stage must reach on a GPU (GRADE_SPEED_BAR in the module)."""
    from .grade import DEFAULT_SPEED_BAR

    path = repo_root() / "solutions" / f"{module}.py"
    match = re.search(r"^GRADE_SPEED_BAR\s*=\s*([0-9.]+)", path.read_text(), re.M) if path.exists() else None
    return float(match.group(1)) if match else DEFAULT_SPEED_BAR


@dataclass
class BuildResult:
    path: Path
    action: str  # "created", "updated", "unchanged", "kept" (edited, solution unchanged), "refused", "backed-up"
    detail: str = ""


def build(out_dir: Path | None = None, *, backup: bool = False, solutions_dir: Path | None = None,
          modules: list[str] | None = None, dry_run: bool = False) -> list[BuildResult]:
    """Write exercises/<module>.py for every marked solutions module. Never overwrites learner edits.

    An existing exercise is overwritten only if it is exactly what the generator wrote earlier. An
    edited one is left alone when its solution has not changed since (its recorded hash equals the new
    one), refused otherwise, or with ``backup`` moved to ``<name>.<timestamp>.bak`` and regenerated.
    """
    out_dir = Path(out_dir or repo_root() / "exercises")
    sources = solution_sources(solutions_dir)
    if modules:
        unknown = sorted(set(modules) - set(sources))
        if unknown:
            raise KeyError(f"no marked solutions module {', '.join(unknown)}; marked: {', '.join(sources) or 'none'}")
        sources = {m: sources[m] for m in modules}
    results = []
    if not dry_run:
        out_dir.mkdir(parents=True, exist_ok=True)
    for module, src in sources.items():
        new = render(src.read_text(), module, speed_bar_for(module), str(src))
        target = out_dir / f"{module}.py"
        if not target.exists():
            if not dry_run:
                _write(target, new)
            results.append(BuildResult(target, "created"))
            continue
        old = target.read_text()
        if old == new:
            results.append(BuildResult(target, "unchanged"))
            continue
        if is_pristine(old):
            if not dry_run:
                _write(target, new)
            results.append(BuildResult(target, "updated"))
            continue
        recorded, _ = split_header(old)
        if recorded is not None and recorded == split_header(new)[0]:
            results.append(BuildResult(target, "kept", "has your edits; its solution has not changed since"))
            continue
        if not backup:
            results.append(BuildResult(
                target, "refused",
                f"{target} has your edits and its solution changed: not overwritten. "
                "Run `workbench exercises build --backup` to move your copy to a .bak file and regenerate."))
            continue
        saved = _backup_name(target)
        if not dry_run:
            os.replace(target, saved)
            _write(target, new)
        results.append(BuildResult(target, "backed-up", f"your copy was moved to {saved}"))
    if not dry_run:
        _write_index(out_dir, sources)
    return results


def _backup_name(target: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = target.with_name(f"{target.name}.{stamp}.bak")
    k = 1
    while candidate.exists():
        candidate = target.with_name(f"{target.name}.{stamp}-{k}.bak")
        k += 1
    return candidate


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_index(out_dir: Path, sources: dict[str, Path]) -> None:
    lines = ["# Exercises", "",
             "Generated from `solutions/` by `workbench exercises build` (do not edit this index; the exercises",
             "themselves are yours to edit, and `build` never overwrites an edited one).", "",
             "Fill in the blocks marked `TODO(exercise)` (each has numbered hints: read one at a time), then:", "",
             "```", "workbench grade OP            # every stage of OP, e.g. workbench grade scan",
             "workbench grade OP.STAGE      # one stage", "workbench grade               # everything",
             "```", "", "| exercise | from |", "|---|---|"]
    for module, src in sources.items():
        lines.append(f"| [{module}.py]({module}.py) | solutions/{src.name} |")
    text = "\n".join(lines) + "\n"
    path = out_dir / "README.md"
    if not path.exists() or path.read_text() != text:
        _write(path, text)


def stale(out_dir: Path | None = None, solutions_dir: Path | None = None) -> list[str]:
    """Exercises that differ from what ``build`` would write now (edited ones included)."""
    import tempfile

    out_dir = Path(out_dir or repo_root() / "exercises")
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), solutions_dir=solutions_dir)
        problems = []
        for fresh in sorted(Path(tmp).iterdir()):
            committed = out_dir / fresh.name
            if not committed.exists():
                problems.append(f"{committed} is missing")
            elif committed.read_text() != fresh.read_text():
                problems.append(f"{committed} is out of date")
    return problems


# -- CLI ------------------------------------------------------------------------------------------

def cmd_exercises(args) -> int:
    from rich.console import Console

    console = Console()
    if args.action == "check":
        problems = stale(Path(args.out) if args.out else None)
        for p in problems:
            console.print(f"[red]{p}[/]: run `workbench exercises build`")
        if not problems:
            console.print("exercises/ is up to date with solutions/")
        return 1 if problems else 0
    try:
        results = build(Path(args.out) if args.out else None, backup=args.backup, modules=args.module or None)
    except MarkerError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    colour = {"created": "green", "updated": "green", "unchanged": "dim", "kept": "yellow",
              "refused": "red", "backed-up": "yellow"}
    for r in results:
        console.print(f"[{colour[r.action]}]{r.action:>9}[/] {r.path}" + (f"  ({r.detail})" if r.detail else ""))
    return 1 if any(r.action == "refused" for r in results) else 0


def add_cli(sub) -> None:
    s = sub.add_parser("exercises", help="generate exercises/ from the marked regions of solutions/")
    s.add_argument("action", choices=["build", "check"],
                   help="build: write exercises/ (never over your edits); check: exit 1 if exercises/ is stale")
    s.add_argument("module", nargs="*", help="only these solutions modules (default: all with markers)")
    s.add_argument("--backup", action="store_true",
                   help="move an edited exercise to <name>.<timestamp>.bak before regenerating it")
    s.add_argument("--out", help="directory to write (default: exercises/ in the repository)")
    s.set_defaults(func=cmd_exercises)
