"""Generate ``exercises/`` from the ladder modules: one source of truth, a learner's file never lost.

A ladder module marks what a learner should write (the syntax lives in :mod:`workbench.markers`)::

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

Which modules get an exercise is the registry's answer (every ladder module, ``$WORKBENCH_SOLUTIONS_PATH``
included) narrowed to those with markers. Every exercise goes to one folder, ``exercises/`` in the
checkout unless ``out_dir`` (``--out``) says otherwise, because that is where the grader looks.

Each generated file starts with a header whose ``generated-sha256`` is the hash of the body below
it as generated. That tells three states apart:

* **up to date**: the file is exactly what the solutions generate now;
* **stale**: the body still hashes to its header (nobody edited it) but the solutions have changed
  since: ``build`` rewrites it, ``check`` fails;
* **edited**: the body no longer hashes to its header: the learner's work. ``build`` keeps it,
  ``check`` reports it and passes; ``build --backup`` or ``reset`` give a fresh stub back, with the
  learner's version kept beside it as ``<name>.<timestamp>.bak``.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from .. import paths, registry
from ..introspect import functions_of
from ..ladder import Operator
from ..markers import (BEGIN, END, HEADER_END, HINT, MAX_HINTS, STUB_MARK, digest, has_markers, is_pristine,
                       ladder_imports, no_exercise_because, split_header)

INDEX = "README.md"

# The states of an exercise file against what the solutions generate now.
UP_TO_DATE, STALE, EDITED, MISSING = "up to date", "stale", "edited", "missing"
ORPHANED = "orphaned"  # a generated file whose ladder module is gone (split or merged into others)

# Ladder modules that were split or dissolved, and the modules that hold their stages now: a learner's
# copy of an old exercise is kept and pointed at its new home, never deleted while it has their work.
MOVED_MODULES = {"half_norms": ("softmax", "layernorm", "elementwise"),
                 "cnn": ("depthwise", "pooling", "batchnorm")}


class MarkerError(ValueError):
    """Malformed exercise markers in a ladder module; the message names the file and line."""


class ResetError(ValueError):
    """A reset that cannot be done safely; the learner's file is left untouched."""


# -- regions and stubs ------------------------------------------------------------------------------

@dataclass
class Region:
    hint_start: int  # index of the first HINT line (== begin when there are none)
    begin: int  # index of the BEGIN SOLUTION line
    end: int  # index of the END SOLUTION line
    indent: str
    hints: list = field(default_factory=list)
    function: str = "?"  # the innermost function around the region
    top_function: str = "?"  # the module-level function around it (what a stage's launcher reaches)
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


COLLECTIVE = re.compile(r"syncthreads\w*|syncwarp|\w+_sync|sync")  # calls every thread (of a warp or block) must reach


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _analyse(text: str, regions: list[Region], filename: str) -> None:
    """Name each region's function, and choose its stub: `pass`, or `return` where code after the
    region reads a variable that only the region assigns (it would not exist with `pass`)."""
    try:
        tree = ast.parse(text, filename)
    except SyntaxError as exc:
        raise MarkerError(f"{filename}:{exc.lineno}: {exc.msg}") from exc
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    top_level = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for region in regions:
        first, last = region.begin + 1, region.end + 1  # 1-based lines of the markers
        owners = [f for f in functions if f.lineno < first and f.end_lineno >= last - 1]  # last - 1: the region's last line
        if not owners:
            raise MarkerError(f"{filename}:{first}: a solution region must be inside a function (a kernel)")
        func = max(owners, key=lambda f: f.lineno)  # the innermost
        region.function = func.name
        region.top_function = next((f.name for f in top_level if f.lineno <= func.lineno <= f.end_lineno), func.name)
        names = [n for n in ast.walk(func) if isinstance(n, ast.Name)]
        stored_inside = {n.id for n in names if isinstance(n.ctx, ast.Store) and first < n.lineno < last}
        read_after = {n.id for n in names if isinstance(n.ctx, ast.Load) and n.lineno > last}
        defined_before = {n.id for n in names if isinstance(n.ctx, ast.Store) and n.lineno < first}
        defined_before |= {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
        needed = (stored_inside & read_after) - defined_before
        region.stub = "return" if needed else "pass"
        if needed and len(region.indent) > func.body[0].col_offset:  # a return inside a branch or loop: divergent
            waits = sorted({_call_name(n) for n in ast.walk(func) if isinstance(n, ast.Call) and n.lineno > last
                            and COLLECTIVE.fullmatch(_call_name(n))})
            if waits:
                # A stub returning inside a branch leaves the threads that did not take it waiting at the
                # barrier or shuffle below (a deadlock in the simulator, undefined on a GPU): the learner's
                # first run would hang.
                raise MarkerError(f"{filename}:{first}: the stub would be `return` (code after the region reads "
                                  f"{', '.join(sorted(needed))}), but {', '.join(waits)} below waits for every "
                                  "thread; assign those names before the region or move their use into it")


def hint_label(k: int, total: int) -> str:
    if k == 1 and total > 1:
        return "hint 1 (nudge)"
    if k == total and total > 1:
        return f"hint {k} (nearly the answer)"
    return f"hint {k}"


@functools.lru_cache(maxsize=64)  # build, check and reset render the same sources again and again
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


DEFAULT_SPEED_BAR = next(f.default for f in fields(Operator) if f.name == "grade_speed_bar")


def speed_bar_text(operators: list[Operator]) -> str:
    """'60%', or '60% for gemm, 50% for gemm[batched]' where a module's operators differ."""
    bars = {op.name: op.grade_speed_bar for op in operators} or {"": DEFAULT_SPEED_BAR}
    if len(set(bars.values())) == 1:
        return f"{next(iter(bars.values())):.0%}"
    return ", ".join(f"{bar:.0%} for {name}" for name, bar in bars.items())


def render(text: str, module: str, *, filename: str = "<source>", source_label: str | None = None,
           operators: list[Operator] | None = None) -> str:
    """The whole exercise file: header (with the hash of the body) + body."""
    body = render_body(text, filename)
    source_label = source_label or f"solutions/{module}.py"
    names = [op.name for op in operators or []]
    others = f"; its other operators: {', '.join(names[1:])}" if len(names) > 1 else ""
    grade_what = names[0] if names else module
    header = [
        HEADER_END,
        f"# EXERCISE generated from {source_label} by `workbench exercises build`. This copy is yours:",
        "# fill in every block marked TODO(exercise), then grade it:",
        f"#     workbench grade {grade_what}            (or {grade_what}.<stage>{others})",
        f"# The grader checks each stage against the operator in {source_label} (reference, inputs,",
        "# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element",
        "# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output",
        f"# was filled with poison. On a GPU each stage must also reach {speed_bar_text(operators or [])} of the",
        "# speed of the solution's stage, measured in the same run.",
        "# `workbench exercises build` never overwrites this file once you have edited it (the line below",
        "# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back",
        "# and keeps your version beside it as a .bak file.",
        f"# generated-sha256: {digest(body)}",
        HEADER_END,
    ]
    return "\n".join(header) + "\n" + body


# -- which modules have exercises -------------------------------------------------------------------

@dataclass
class Source:
    """A ladder module with exercise markers: what its exercise is generated from."""

    module: str  # short name: reduction, gemm, ...; the exercise is <module>.py
    path: Path
    operators: list = field(default_factory=list)  # the registry's operators defined there

    @property
    def label(self) -> str:
        """How the header and the index name the file: relative to the checkout where it is inside it."""
        try:
            return self.path.resolve().relative_to(paths.REPO_ROOT).as_posix()
        except ValueError:
            return str(self.path)

    def render(self) -> str:
        return render(self.path.read_text(), self.module, filename=str(self.path), source_label=self.label,
                      operators=self.operators)


def exercise_sources() -> dict[str, Source]:
    """Every ladder module the registry finds (``$WORKBENCH_SOLUTIONS_PATH`` included) that has markers,
    except those that import another ladder module: the grader refuses the answer key's modules, so
    their exercises could not be graded (``not_offered()`` says which and why)."""
    by_module = registry.operators_by_module()
    out = {}
    for name, module in registry.ladder_modules().items():
        path = Path(module.__file__)
        text = path.read_text()
        if has_markers(text) and not ladder_imports(text):
            out[name] = Source(name, path, by_module.get(name, []))
    return out


def not_offered() -> dict[str, str]:
    """Ladder modules with exercise markers that get no exercise, and why."""
    out = {}
    for name, module in registry.ladder_modules().items():
        text = Path(module.__file__).read_text()
        if has_markers(text) and ladder_imports(text):
            out[name] = no_exercise_because(text)
    return out


def sources_from_files(files) -> dict[str, Source]:
    """Sources for ladder files outside the registry (a test's synthetic module, say): no operators."""
    return {Path(f).stem: Source(Path(f).stem, Path(f)) for f in sorted(map(Path, files)) if has_markers(Path(f).read_text())}


def select(sources: dict[str, Source], names) -> dict[str, Source]:
    """The sources named by module (``layernorm``) or by operator (``rmsnorm`` -> its module)."""
    if not names:
        return dict(sources)
    by_operator = {op.name: s.module for s in sources.values() for op in s.operators}
    chosen = {}
    for name in names:
        module = name if name in sources else by_operator.get(name)
        if module is None:
            raise registry.UnknownTarget(f"no exercise named {name!r}; exercises: {', '.join(sources) or 'none'}")
        chosen[module] = sources[module]
    return chosen


# -- the state of one exercise file ------------------------------------------------------------------

@dataclass
class ExerciseState:
    path: Path
    state: str  # UP_TO_DATE, STALE, EDITED or MISSING
    solution_changed: bool = False  # EDITED only: the solutions changed since the learner's copy was made
    edited: bool = False  # ORPHANED only: the file holds the learner's edits

    @property
    def problem(self) -> bool:
        """Something `build` must fix (a learner's edits never are)."""
        return self.state in (STALE, MISSING) or (self.state == ORPHANED and not self.edited)


def state_of(path: Path, fresh: str) -> ExerciseState:
    if not path.exists():
        return ExerciseState(path, MISSING)
    mine = path.read_text()
    if mine == fresh:
        return ExerciseState(path, UP_TO_DATE)
    if is_pristine(mine):
        return ExerciseState(path, STALE)
    recorded, _ = split_header(mine)
    return ExerciseState(path, EDITED, solution_changed=recorded != split_header(fresh)[0])


# -- build -------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    path: Path
    action: str  # "created", "updated", "unchanged", "kept" (the learner's edits), "backed-up"
    detail: str = ""


def orphans(out_dir: Path, sources: dict[str, Source]) -> list[ExerciseState]:
    """Exercise files the generator wrote for a module that no longer exists: EDITED ones (the learner's
    work, kept) and untouched ones (nothing of the learner's: `build` removes them)."""
    found = []
    for path in sorted(Path(out_dir).glob("*.py")):
        if path.stem in sources or path.stem.startswith("_"):
            continue
        text = path.read_text(errors="replace")
        if split_header(text)[0] is not None:  # generated once: it carries the generator's header
            found.append(ExerciseState(path, ORPHANED, edited=not is_pristine(text)))
    return found


def orphan_note(state: ExerciseState) -> str:
    """Where an orphaned exercise's stages went, and what happens to the file."""
    moved = MOVED_MODULES.get(state.path.stem)
    where = (f"its stages are now in {', '.join(f'exercises/{m}.py' for m in moved)}" if moved
             else "its module is gone from solutions/")
    if state.edited:  # the learner's work
        return f"{where}; it has your edits: kept, copy them over, then delete it"
    return f"{where}; it had no edits of yours: removed"


def build(out_dir: Path | None = None, *, only=None, backup: bool = False,
          sources: dict[str, Source] | None = None) -> list[BuildResult]:
    """Write ``<out_dir>/<module>.py`` for the chosen modules (``only``: names of modules or operators;
    default: all) and the index of every exercise. A learner's edited file is kept as it is; with
    ``backup`` it is copied to ``<name>.<timestamp>.bak`` first and regenerated."""
    out_dir = Path(out_dir or paths.EXERCISES_DIR)
    sources = exercise_sources() if sources is None else sources
    chosen = select(sources, only)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [build_one(source, out_dir / f"{source.module}.py", backup) for source in chosen.values()]
    for orphan in orphans(out_dir, sources) if only is None else []:
        if not orphan.edited:
            orphan.path.unlink()
        results.append(BuildResult(orphan.path, "kept" if orphan.edited else "removed", orphan_note(orphan)))
    write_index(out_dir, sources)  # always every exercise, whichever were built
    return results


def build_one(source: Source, target: Path, backup: bool) -> BuildResult:
    fresh = source.render()
    now = state_of(target, fresh)
    if now.state == UP_TO_DATE:
        return BuildResult(target, "unchanged")
    if now.state in (MISSING, STALE):
        write_atomically(target, fresh)
        return BuildResult(target, "created" if now.state == MISSING else "updated")
    if backup:
        saved = keep_beside(target)
        write_atomically(target, fresh)
        return BuildResult(target, "backed-up", f"your version is kept in {saved}")
    why = (f"its solution has changed since: `workbench exercises build --backup {source.module}` regenerates it, "
           "keeping yours as .bak") if now.solution_changed else "its solution has not changed since"
    return BuildResult(target, "kept", f"has your edits; {why}")


def backup_path(target: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = target.with_name(f"{target.name}.{stamp}.bak")
    k = 1
    while candidate.exists():
        candidate = target.with_name(f"{target.name}.{stamp}-{k}.bak")
        k += 1
    return candidate


def keep_beside(target: Path) -> Path:
    """Copy the learner's file to a new ``.bak`` beside it (the original stays until it is replaced)."""
    saved = backup_path(target)
    write_atomically(saved, target.read_text())
    return saved


def write_atomically(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: a crash leaves the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render_index(sources: dict[str, Source]) -> str:
    lines = ["# Exercises", "",
             "Generated from `solutions/` by `workbench exercises build` (do not edit this index; the exercises",
             "themselves are yours to edit, and `build` never overwrites an edited one).", "",
             "Fill in the blocks marked `TODO(exercise)` (each has numbered hints: read one at a time), then:", "",
             "```", "workbench grade OP            # every stage of OP, e.g. workbench grade scan",
             "workbench grade OP.STAGE      # one stage", "workbench grade               # everything",
             "workbench exercises check     # which files are yours (edited), which are out of date",
             "workbench exercises reset OP.STAGE   # a fresh stub for one stage; yours kept as a .bak file",
             "```", "", "| exercise | operators | from |", "|---|---|---|"]
    for module, source in sources.items():
        ops = ", ".join(op.name for op in source.operators)
        lines.append(f"| [{module}.py]({module}.py) | {ops} | {source.label} |")
    missing = not_offered()
    if missing:
        lines += ["", "Not offered yet (their stages have hints, but an exercise made from them could not be graded):", ""]
        lines += [f"- `solutions/{module}.py`: {why}" for module, why in missing.items()]
    return "\n".join(lines) + "\n"


def write_index(out_dir: Path, sources: dict[str, Source]) -> bool:
    """Write the index if it changed; True if it was written."""
    path = out_dir / INDEX
    text = render_index(sources)
    if path.exists() and path.read_text() == text:
        return False
    write_atomically(path, text)
    return True


# -- check -------------------------------------------------------------------------------------------

def check(out_dir: Path | None = None, *, sources: dict[str, Source] | None = None) -> list[ExerciseState]:
    """The state of every exercise file and of the index. Problems: stale or missing generated files;
    a learner's edited file is never one."""
    out_dir = Path(out_dir or paths.EXERCISES_DIR)
    sources = exercise_sources() if sources is None else sources
    states = [state_of(out_dir / f"{s.module}.py", s.render()) for s in sources.values()]
    states += orphans(out_dir, sources)
    index = out_dir / INDEX
    fresh_index = render_index(sources)
    if not index.exists():
        states.append(ExerciseState(index, MISSING))
    else:
        states.append(ExerciseState(index, UP_TO_DATE if index.read_text() == fresh_index else STALE))
    return states


# -- reset -------------------------------------------------------------------------------------------

@dataclass
class ResetResult:
    path: Path
    action: str  # "reset", "created", "unchanged"
    backup: Path | None = None  # where the learner's version was kept
    functions: list = field(default_factory=list)  # what was reset ([] : the whole file)


def marked_functions(stage, source_text: str, filename: str = "<source>") -> list[str]:
    """The module-level functions with exercise regions that ``stage``'s launcher reaches (its kernels,
    their device functions, the helpers it calls, the launcher itself), in file order."""
    reached = set(functions_of(stage)) | {stage.launch.__name__}
    ordered = []
    for region in find_regions(source_text, filename):
        if region.top_function in reached and region.top_function not in ordered:
            ordered.append(region.top_function)
    return ordered


def function_spans(text: str, filename: str) -> dict[str, tuple[int, int]]:
    """Module-level function name -> (first line index incl. decorators, index after its last line)."""
    try:
        tree = ast.parse(text, filename)
    except SyntaxError as exc:
        raise ResetError(f"{filename}:{exc.lineno}: {exc.msg}: your file does not parse, so one stage cannot be "
                         "picked out of it; reset the whole operator instead") from None
    spans = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans[node.name] = (first - 1, node.end_lineno)
    return spans


def replace_functions(mine: str, fresh: str, names: list[str], filename: str) -> str:
    """``mine`` with each named module-level function replaced by its text in ``fresh``."""
    my_spans = function_spans(mine, filename)
    fresh_spans = function_spans(fresh, "<generated>")
    missing = [n for n in names if n not in my_spans]
    if missing:
        raise ResetError(f"{filename}: no function {', '.join(missing)} in your file (renamed or removed?); "
                         "reset the whole operator instead")
    lines = mine.splitlines()
    fresh_lines = fresh.splitlines()
    for name in sorted(names, key=lambda n: my_spans[n][0], reverse=True):  # bottom up: spans stay valid
        start, stop = my_spans[name]
        f_start, f_stop = fresh_spans[name]
        lines[start:stop] = fresh_lines[f_start:f_stop]
    return "\n".join(lines) + "\n"


def reset(target: str, out_dir: Path | None = None, *, sources: dict[str, Source] | None = None) -> ResetResult:
    """A fresh stub for OP (its whole exercise) or OP.STAGE (only the functions holding that stage's
    regions; the learner's other work stays). The learner's version, if it had edits, is kept beside
    it as ``<name>.<timestamp>.bak`` first."""
    out_dir = Path(out_dir or paths.EXERCISES_DIR)
    op, stages = registry.resolve(target)
    sources = exercise_sources() if sources is None else sources
    module = registry.short_module_name(op)
    if module not in sources:
        raise registry.UnknownTarget(f"{op.name} has no exercise ({registry.source_file(op)} has no marked "
                                     f"regions); exercises: {', '.join(sources) or 'none'}")
    source = sources[module]
    path = out_dir / f"{module}.py"
    fresh = source.render()
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(path, fresh)
        return ResetResult(path, "created")
    mine = path.read_text()
    # Where the learner has no work in the file, or asked for the whole exercise, it is generated anew.
    whole_file = is_pristine(mine) or ("." not in target and len(source.operators) <= 1)
    names: list[str] = []
    if whole_file:
        new = fresh
    else:
        text = source.path.read_text()
        for stage in stages:
            names += [n for n in marked_functions(stage, text, str(source.path)) if n not in names]
        if not names:
            raise ResetError(f"{target} has no exercise region: nothing in {path} to reset")
        new = replace_functions(mine, fresh, names, str(path))
        if split_header(new)[1] == split_header(fresh)[1]:
            new = fresh  # nothing of the learner's is left: the file is generated again, header included
    if new == mine:
        return ResetResult(path, "unchanged", functions=names)
    saved = None if is_pristine(mine) else keep_beside(path)  # an unedited file holds nothing of the learner's
    write_atomically(path, new)
    return ResetResult(path, "reset", saved, names)


# -- CLI ---------------------------------------------------------------------------------------------

def shown(path: Path) -> str:
    """A path as a person typed it (relative to the current directory where it is below it), escaped
    for rich's markup."""
    try:
        text = str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(path)
    return escape(text)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def terminal(stderr: bool = False):
    """A rich console that never breaks a line (a path is copied whole) and colours only what we mark."""
    from ..console import console as Console

    return Console(stderr=stderr, soft_wrap=True, highlight=False)


def cmd_build(args) -> int:
    console = terminal()
    results = build(args.out, only=args.exercise or None, backup=args.backup)
    colour = {"created": "green", "updated": "green", "unchanged": "dim", "kept": "yellow", "backed-up": "yellow",
              "removed": "dim"}
    for r in results:
        console.print(f"[{colour[r.action]}]{r.action:>9}[/] {shown(r.path)}" + (f"  ({escape(r.detail)})" if r.detail else ""))
    out_dir = Path(args.out or paths.EXERCISES_DIR)
    console.print(f"[dim]index:[/] {shown(out_dir / INDEX)} lists every exercise")
    return 0


def cmd_check(args) -> int:
    console = terminal()
    states = check(args.out)
    for s in states:
        if s.state == UP_TO_DATE:
            line = f"[green]{'ok':>10}[/] {shown(s.path)}"
        elif s.state == ORPHANED:
            line = f"[yellow]{'orphaned':>10}[/] {shown(s.path)}  ({escape(orphan_note(s).replace(': removed', ': `workbench exercises build` removes it'))})"
        elif s.state == EDITED:
            note = (f"; its solution has changed since: `workbench exercises build --backup {s.path.stem}` "
                    "regenerates it, yours kept as .bak") if s.solution_changed else ""
            line = f"[yellow]{'edited':>10}[/] {shown(s.path)}  (your work: kept, never overwritten{note})"
        else:
            line = f"[red]{s.state:>10}[/] {shown(s.path)}: run `workbench exercises build`"
        console.print(line)
    problems = [s for s in states if s.problem]
    edited = sum(s.state == EDITED for s in states)
    summary = f"{len(states) - len(problems)} of {len(states)} files fine ({edited} edited by you)"
    console.print(("[red]" if problems else "[green]") + summary + "[/]")
    return 1 if problems else 0


def cmd_reset(args) -> int:
    console = terminal()
    result = reset(args.target, args.out)
    what = escape(f" ({', '.join(result.functions)})") if result.functions else ""
    if result.action == "unchanged":
        console.print(f"{shown(result.path)}{what} is already a fresh stub: nothing to reset")
    elif result.action == "created":
        console.print(f"created {shown(result.path)}")
    else:
        kept = f"; your version is kept in {shown(result.backup)}" if result.backup else ""
        console.print(f"reset {shown(result.path)}{what} to a fresh stub{kept}")
    return 0


def run_cli(func):
    """Wrap a command: a known refusal (bad name, malformed markers, an unsafe reset) is one line, exit 2."""
    def command(args) -> int:
        try:
            return func(args)
        except (registry.UnknownTarget, MarkerError, ResetError) as exc:
            terminal(stderr=True).print(f"[red]error:[/] {escape(str(exc.args[0] if exc.args else exc))}")
            return 2
    return command


def add_cli(sub) -> None:
    """``workbench exercises build|check|reset``."""
    s = sub.add_parser("exercises", help="generate exercises/ from the marked regions of solutions/; check; reset",
                       description="Your copies of the ladders, with the heart of each kernel cut out.")
    actions = s.add_subparsers(dest="action", required=True, metavar="{build,check,reset}")
    out_help = "the exercises folder (default: exercises/ in the checkout, where the grader looks)"

    b = actions.add_parser("build", help="write every exercise that is missing or out of date; never over your edits")
    b.add_argument("exercise", nargs="*", help="only these (a module like layernorm, or an operator); "
                   "default: all. The index README.md always lists every exercise")
    b.add_argument("--backup", action="store_true",
                   help="regenerate edited files too, keeping yours as <name>.<timestamp>.bak")
    b.add_argument("--out", type=Path, help=out_help)
    b.set_defaults(func=run_cli(cmd_build))

    c = actions.add_parser("check", help="exit 1 if a generated file is missing or out of date "
                           "(a file you edited is yours: reported, never a failure)")
    c.add_argument("--out", type=Path, help=out_help)
    c.set_defaults(func=run_cli(cmd_check))

    r = actions.add_parser("reset", help="a fresh stub for OP or OP.STAGE; your version kept beside it as .bak")
    r.add_argument("target", help="OP (the whole exercise) or OP.STAGE (only that stage's parts), e.g. reduction.fused")
    r.add_argument("--out", type=Path, help=out_help)
    r.set_defaults(func=run_cli(cmd_reset))


def main(argv=None) -> int:
    """``python -m workbench.generate.exercises build|check|reset ...`` (what ``workbench exercises`` runs)."""
    parser = argparse.ArgumentParser(prog="workbench")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["exercises", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
