"""The harness's layers (CONTRIBUTING.md): imports go one way, and private names stay home.

    cli                        on top: parses arguments, calls everything below
    rooms                      grade/ (the autograder), tools/ (profile, sanitize), generate/exercises,
                               generate/notebooks:
                               programs of their own, never importing each other
    presentation               tables, plots, nb (what notebook cells call), console, screens
    model                      device, ladder, registry, check, timing, bench, results, ... (below)

Read from the source with ``ast`` (function-local imports included), so a cycle hidden inside a
function fails here too; then every module is imported in a fresh interpreter in two orders.
"""

from __future__ import annotations

import ast
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "workbench"

MODEL = {"device", "ladder", "registry", "curriculum", "paths", "sizes", "markers", "check", "timing", "bench", "results",
         "ceilings", "library_peers", "simulator", "introspect", "ptxcheck", "diff", "shared_memory", "prepared",
         "profiles", "sanitizer_reports", "record", "targets", "sweep", "gpulock"}
PRESENTATION = {"tables", "plots", "nb", "console", "screens"}
TOP = {"cli", "__main__"}
LAYER_NAMES = ["model", "presentation", "room", "cli"]


def module_names() -> list[str]:
    """Dotted names under workbench/ ('check', 'grade.report', 'generate.notebooks', ...)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out.append(".".join(parts))
    return out


def room_of(name: str) -> str | None:
    """'grade.cases' -> 'grade'; 'generate.exercises' -> 'generate.exercises'; model modules -> None."""
    parts = name.split(".")
    if parts[0] in ("grade", "tools"):
        return parts[0]
    if parts[0] == "generate" and len(parts) > 1:
        return "generate." + parts[1]
    return None


def layer_of(name: str) -> int:
    top = name.split(".")[0]
    if name in TOP:
        return 3
    if room_of(name) or name == "generate":
        return 2
    if top in PRESENTATION:
        return 1
    if top in MODEL:
        return 0
    raise AssertionError(f"workbench/{name.replace('.', '/')}.py has no layer: add it to MODEL, PRESENTATION "
                         "or a room in tests/test_layers.py, and to the layout in CONTRIBUTING.md")


def source_of(name: str) -> Path:
    path = PACKAGE.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _resolve(name: str, node: ast.ImportFrom) -> str:
    """The absolute dotted name (without 'workbench.') that a relative import refers to."""
    is_package = source_of(name).name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join(base + ([node.module] if node.module else []))
    return (node.module or "")[len("workbench."):] if (node.module or "").startswith("workbench.") else ""


def imports_of(name: str) -> list[tuple[str, list[str], int]]:
    """(imported workbench module, names imported from it, line) for every import in the module."""
    tree = ast.parse(source_of(name).read_text())
    known = set(module_names())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if not node.level and not (node.module or "").startswith("workbench"):
                continue
            target = _resolve(name, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                if sub in known:  # `from . import results`: the module itself
                    out.append((sub, [], node.lineno))
                elif target in known or target == "":
                    out.append((target, [alias.name], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("workbench."):
                    out.append((alias.name[len("workbench."):], [], node.lineno))
    return [(t, names, line) for t, names, line in out if t and t in known]


def graph() -> dict[str, set[str]]:
    return {name: {t for t, _, _ in imports_of(name) if t != name} for name in module_names()}


def test_every_module_has_a_layer():
    for name in module_names():
        layer_of(name)


def test_no_import_cycle():
    edges = graph()
    # A package's __init__ may gather its own modules; the cycle rule is about modules importing each other.
    for name in list(edges):
        if source_of(name).name == "__init__.py":
            edges[name] = {t for t in edges[name] if not t.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_imports_point_down():
    wrong = []
    for name in module_names():
        for target, _, line in imports_of(name):
            if target == name or target.startswith(name + "."):
                continue
            mine, theirs = layer_of(name), layer_of(target)
            if theirs > mine:
                wrong.append(f"workbench/{name} ({LAYER_NAMES[mine]}) imports {target} ({LAYER_NAMES[theirs]}) at line {line}")
            elif mine == theirs == 2 and room_of(name) != room_of(target) and target != "generate":
                wrong.append(f"room {room_of(name)} imports room {room_of(target)} (workbench/{name}, line {line})")
    assert not wrong, "\n".join(wrong)


def _python_files() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "solutions").glob("*.py"), *(ROOT / "scripts").glob("*.py")])


def test_no_private_name_crosses_a_module():
    """`from x import _y`, or `x._y` where x is a workbench/solutions module, outside x itself."""
    ours = {n.split(".")[-1] for n in module_names()} | {p.stem for p in (ROOT / "solutions").glob("*.py")}
    wrong = []
    for path in _python_files():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                own = (node.module or "").split(".")[0] in ("workbench", "solutions") or node.level
                for alias in node.names:
                    if own and alias.name.startswith("_") and not alias.name.startswith("__"):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports private {alias.name}")
                    if alias.name in ours:
                        aliases[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ("workbench", "solutions"):
                        aliases[alias.asname or alias.name.split(".")[-1]] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_no_private_attribute_of_a_library_object():
    """Reaching into a library's internals (matplotlib's legend._loc, ...) breaks on its next release."""
    suspicious = ("._loc", "._ncols", "._legend", "._VIEWS", "._SCRATCH")  # whole names: self._lock is fine
    wrong = [f"{p.relative_to(ROOT)}: {s}" for p in _python_files() for s in suspicious
             if re.search(re.escape(s) + r"\b", p.read_text())]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_every_module_imports_in_any_order(order):
    names = [f"workbench.{n}" for n in module_names() if n != "__main__"]
    names = names[::-1] if order == "reversed" else random.Random(7).sample(names, len(names))
    code = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"WORKBENCH_MODE": "sim", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert run.returncode == 0, run.stderr[-3000:]
