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
import json
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType

from . import curriculum
from .ladder import AXES, Operator, Stage, variant_name
from .results import RENAMED, write_atomic

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


def families() -> dict[str, list[Operator]]:
    """Family name -> its variants (operators), in listing order: ``softmax`` -> softmax, softmax[fp16], ..."""
    out: dict[str, list[Operator]] = {}
    for op in load_operators().values():
        out.setdefault(op.family, []).append(op)
    return out


_NAME = re.compile(r"^(?P<family>[A-Za-z0-9_]+)(?:\[(?P<values>[^\[\]]*)\])?$")


def renamed_hint(name: str) -> str:
    """'; it is now called 'softmax[fp16]'' for an operator's old name (results.RENAMED), else ''."""
    old = split_target(name)[0]
    return f"; it is now called {RENAMED[old]!r}" if old in RENAMED else ""


def canonical_name(name: str) -> str:
    """A variant's name as the registry keys it: the values in the axes' order, defaults dropped
    ('reduction[rows,max]' -> 'reduction[max,rows]', 'softmax[fp32]' -> 'softmax'). Raises UnknownTarget
    naming the family's variants for a value none of them has."""
    match = _NAME.match(name.strip())
    if not match:
        raise UnknownTarget(f"{name!r} is not an operator's name: FAMILY or FAMILY[VALUE,...], e.g. softmax[bf16]")
    family, values = match["family"], match["values"]
    variants = families().get(family)
    if variants is None:
        raise UnknownTarget(f"no operator {name!r}{renamed_hint(name)}; families: {', '.join(families()) or 'none'}")
    if values is None:
        return family
    axis_of = {value: axis for op in variants for axis, value in op.variant.items()}
    axis_of.update({default: axis for axis, default in AXES.items() if default})
    chosen: dict[str, str] = {}
    for value in filter(None, (v.strip() for v in values.split(","))):
        if value not in axis_of or axis_of[value] in chosen:
            raise UnknownTarget(f"no variant {name!r}; {family}'s variants: {', '.join(op.name for op in variants)}")
        chosen[axis_of[value]] = value
    return variant_name(family, chosen)


def operator(name: str) -> Operator:
    """An operator by its name, 'softmax' or 'softmax[bf16]' (values in any order, defaults optional)."""
    ops = load_operators()
    key = canonical_name(name)
    if key not in ops:
        variants = families()[key.partition("[")[0]]
        raise UnknownTarget(f"no operator {name!r}; {variants[0].family}'s variants: "
                            f"{', '.join(op.name for op in variants)}")
    return ops[key]


def operators_named(target: str) -> list[Operator]:
    """A family's name -> all its variants; a variant's name -> that operator (for commands taking FAMILY)."""
    key = canonical_name(target)
    return families()[key] if key in families() and "[" not in target else [operator(key)]


def stages_served(ops: list[Operator]) -> list[tuple[str, list[Operator]]]:
    """Each stage name among ``ops`` (a family's variants, a chapter's operators) with the variants that have
    a stage of that name, in ladder order: which variants each stage serves."""
    served: dict[str, list[Operator]] = {}
    for op in ops:
        for stage in op.stages:
            served.setdefault(stage.name, []).append(op)
    return list(served.items())


def split_target(target: str) -> tuple[str, str]:
    """'softmax[bf16].rows_in_flight' -> ('softmax[bf16]', 'rows_in_flight'); no stage -> (name, '')."""
    close = target.find("]")
    dot = target.find(".", close + 1 if close >= 0 else 0)
    return (target, "") if dot < 0 else (target[:dot], target[dot + 1:])


def resolve(target: str) -> tuple[Operator, list[Stage]]:
    """'reduction' -> the operator and all its stages; 'softmax[bf16].packed' -> that stage only."""
    op_name, stage_name = split_target(target)
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


def family_elsewhere(ch: curriculum.Chapter) -> list[tuple[str, list[curriculum.Chapter]]]:
    """(family, the other chapters that teach its variants) for each family of ``ch`` that spans chapters.

    A chapter walks ladders that fit one sitting; a family whose variants need a ladder of their own (GEMM on
    CUDA cores, on tensor cores, in int8) continues in another chapter, and each chapter says where."""
    ops = load_operators()
    out = []
    for family in dict.fromkeys(ops[name].family for name in ch.operators if name in ops):
        others = [c for c in chapters() if c.number != ch.number
                  and any(name in ops and ops[name].family == family for name in c.operators)]
        if others:
            out.append((family, others))
    return out


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


def stages_out_of_place(records: list[dict]) -> list[dict]:
    """The stage records whose ``order`` is not their stage's place in its ladder today. Inserting a
    stage moves the ones after it, and records measured before keep the old places, which tables, plots
    and the "last stage" targets read: `renumber_recorded_stages` puts them right. Profile records carry
    no kind; peers' records are not stages; a stage no longer in its ladder keeps its place."""
    orders = {(op.name, s.name): s.order for op in load_operators().values() for s in op.stages}
    return [r for r in records if r.get("kind", "stage") == "stage"
            and orders.get((r.get("op"), r.get("stage")), r.get("order")) != r.get("order")]


def renumber_recorded_stages(paths) -> int:
    """Give every stage record in the results files ``paths`` its stage's place today; the count changed."""
    orders = {(op.name, s.name): s.order for op in load_operators().values() for s in op.stages}
    changed = 0
    for path in map(Path, paths):
        data = json.loads(path.read_text())
        for r in stages_out_of_place(data.get("records", [])):
            r["order"] = orders[r["op"], r["stage"]]
            changed += 1
        write_atomic(path, data)
    return changed
