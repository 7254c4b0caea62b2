"""Finding the operators: every module of the ``solutions`` package is a ladder file.

A module defines its operator as ``op`` and may define more (a fused variant with its own reference,
say) in ``OPERATORS``. Nothing else is looked up by name: an operator's place in the listings and the
grader's settings are fields of its :class:`~workbench.ladder.Operator`.

``$WORKBENCH_SOLUTIONS_PATH`` (directories separated by ``os.pathsep``) adds folders to the package, so
an operator written in a folder of one's own is listed, checked, exercised and put in a notebook like
the built-in ones (``solutions/__init__.py`` extends the package's path with it).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

from . import curriculum
from .ladder import Operator, Stage

PACKAGE = "solutions"


class UnknownTarget(LookupError):
    """An operator or stage name that the registry does not know; the message lists the known ones."""


def ladder_modules() -> dict[str, ModuleType]:
    """Every ladder module, imported, by its short name (``reduction``, ``gemm``, ...)."""
    package = importlib.import_module(PACKAGE)
    modules = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            modules[info.name] = importlib.import_module(f"{PACKAGE}.{info.name}")
    return modules


def _operators_of(module: ModuleType) -> list[Operator]:
    found = [getattr(module, "op", None), *getattr(module, "OPERATORS", ())]
    unique = {id(op): op for op in found if isinstance(op, Operator)}
    return list(unique.values())


def load_operators() -> dict[str, Operator]:
    """Every operator by name, in listing order: by ``rank``, then name."""
    ops: dict[str, Operator] = {}
    for module in ladder_modules().values():
        for op in _operators_of(module):
            if op.name in ops and ops[op.name] is not op:
                raise ValueError(f"two operators are named {op.name!r}: in {ops[op.name].module} and {module.__name__}")
            op.module = module.__name__
            ops[op.name] = op
    return dict(sorted(ops.items(), key=lambda kv: (kv[1].rank, kv[0])))


def operator(name: str) -> Operator:
    ops = load_operators()
    if name not in ops:
        raise UnknownTarget(f"no operator {name!r}; known: {', '.join(ops) or 'none'}")
    return ops[name]


def resolve(target: str) -> tuple[Operator, list[Stage]]:
    """'reduction' -> the operator and all its stages; 'reduction.fused' -> that stage only."""
    op_name, _, stage_name = target.partition(".")
    op = operator(op_name)
    if not stage_name:
        return op, list(op.stages)
    try:
        return op, [op[stage_name]]
    except KeyError as exc:
        raise UnknownTarget(exc.args[0]) from None


def module_of(op: Operator) -> ModuleType:
    """The ladder module that defines ``op``."""
    if op.module is None:
        load_operators()
    return sys.modules[op.module] if op.module in sys.modules else importlib.import_module(op.module)


def short_module_name(op: Operator) -> str:
    """'solutions.layernorm' -> 'layernorm': the name of its file, exercise and import."""
    return module_of(op).__name__.rpartition(".")[2]


def source_file(op: Operator) -> Path:
    return Path(module_of(op).__file__)


def chapters() -> list[curriculum.Chapter]:
    """The course's chapters (workbench/curriculum.py) holding the operators found, then any unfiled ones."""
    return curriculum.chapters_for(load_operators())


def chapter_of(op: Operator) -> curriculum.Chapter:
    return next(ch for ch in chapters() if op.name in ch.operators)


def chapter(target: str) -> curriculum.Chapter:
    """A chapter by number ('21'), slug ('softmax') or notebook stem ('21_softmax')."""
    found = chapters()
    for ch in found:
        if target in (str(ch.number), ch.slug, ch.stem):
            return ch
    raise UnknownTarget(f"no chapter {target!r}; known: {', '.join(ch.stem for ch in found)}")


def notebook_name(op: Operator) -> str:
    """NN_<chapter>.ipynb: the notebook of the operator's chapter, NN its declared number."""
    return chapter_of(op).notebook


def operators_by_module() -> dict[str, list[Operator]]:
    """Short module name -> the operators it defines, in listing order."""
    out: dict[str, list[Operator]] = {}
    for op in load_operators().values():
        out.setdefault(short_module_name(op), []).append(op)
    return out
