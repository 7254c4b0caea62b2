"""What to grade: which stages, which file holds the submission for each, and at which sizes.

Everything here reads the answer key (``solutions/``) and the submission's *text*; nothing here
imports a submission: its code only ever runs in the grading worker.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import registry
from ..check import gpu_check_sizes
from ..ladder import Size, as_size
from ..sizes import SizeError, accepted_size
from ..markers import no_exercise_because
from ..paths import EXERCISES_DIR, REPO_ROOT
from .submission import describe_launcher, fingerprint, reachable_functions

BUILT_IN = ("exercises", "solutions")


def is_exercise(stage) -> bool:
    """Does the stage's solution code have a marked region (is it an exercise)?"""
    return any(f["marked"] for f in describe_launcher(stage.launch))


def not_an_exercise(stage) -> str | None:
    """Why the stage is not an exercise (nothing on its path for a learner to write), or None.

    Its module gets no exercise file (``markers.no_exercise_because``), or no function the stage
    reaches is marked: it is given whole. Graded from anything but the answer key, such a stage could
    only fail for a missing file or pass on code the learner never wrote, so it is listed, not run."""
    module = registry.module_of(stage.op)
    why = no_exercise_because(Path(module.__file__).read_text())
    if why:
        return f"{registry.short_module_name(stage.op)}.py {why}"
    if not is_exercise(stage):
        return "given whole: nothing on its path is marked for a learner to write"
    return None


def shared_code_of(stage) -> frozenset[str]:
    """Fingerprints of the answer key's shared code (``solutions/_*.py``) that the solution's own stage
    runs, and of the kernels those functions build: what the exercise gives a learner for this stage.
    Any other code of those modules (a whole launcher of another stage, say) is the answer key's."""
    found = set()
    for func in reachable_functions(stage.launch):
        if os.path.basename(func.__code__.co_filename).startswith("_"):
            stack = [func.__code__]
            while stack:
                code = stack.pop()
                found.add(fingerprint(code))
                stack += [c for c in code.co_consts if type(c) is type(code)]
    return frozenset(found)


def answer_key_code(op) -> dict[str, str]:
    """Fingerprint -> name of every marked function (an exercise's answer) in the module defining
    ``op``: a submission running one of these, loaded from anywhere but its own file, runs the key."""
    return dict(_answer_key_of_module(registry.module_of(op).__name__))


@lru_cache(maxsize=None)
def _answer_key_of_module(module_name: str) -> tuple:
    found = {}
    for op in registry.load_operators().values():
        if op.module == module_name:
            for stage in op.stages:
                for f in describe_launcher(stage.launch):
                    if f["marked"]:
                        found[f["fingerprint"]] = f"{module_name}.{f['qualname']}"
    return tuple(found.items())


def targets(target: str | list | None, impl: str = "exercises") -> list:
    """Stages to grade: OP.STAGE; every exercise stage of OP, or of each variant of a FAMILY (all its stages if
    none is marked); those of each of a list of such targets, in order, each once; or,
    with no target, every exercise stage of every operator (of those a folder of one's own has a file
    for, or a single file is about). Raises registry.UnknownTarget for a name it does not know."""
    if isinstance(target, (list, tuple)) and target:
        by_key = {s.key: s for one in target for s in targets(one, impl)}
        return list(by_key.values())
    if isinstance(target, str) and target:
        name, stage = registry.split_target(target)
        if stage:
            return registry.resolve(target)[1]
        # a family's name: every variant's exercise stages (all its stages where none is marked)
        return [s for op in registry.operators_named(name) for s in ([s for s in op.stages if is_exercise(s)]
                                                                      or op.stages)]
    stages = [s for op in registry.load_operators().values() for s in op.stages if is_exercise(s)]
    if impl in BUILT_IN:
        return stages
    if os.path.isdir(impl):  # a folder of one's own: the exercises it holds
        return [s for s in stages if submission_path(impl, s.op).exists()]
    names = operators_in_file(Path(impl))
    return [s for s in stages if {s.op.name, s.op.family, registry.short_module_name(s.op)} & names]


def operators_in_file(path: Path) -> set[str]:
    """Operator and module names a submission file is about, read from its text (never run): the
    ``name=`` of each ``Operator(...)`` it builds, and its own name (``histogram.py``)."""
    names = {path.stem}
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return names  # the worker reports the syntax error when it imports the file
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Operator":
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    names.add(kw.value.value)
    return names


def submission_path(impl: str, op) -> Path:
    """The file that holds ``impl``'s version of ``op``'s stages."""
    short = registry.short_module_name(op)
    if impl == "solutions":
        return registry.source_file(op)
    if impl == "exercises":
        return EXERCISES_DIR / f"{short}.py"
    path = Path(impl)
    return path / f"{short}.py" if path.is_dir() else path


def display_path(filename: str | os.PathLike | None) -> str:
    """A file name as a learner knows it: relative to the repository or here, or 'your notebook cell'."""
    if not filename:
        return "?"
    filename = str(filename)
    if "ipykernel" in filename or filename.startswith("<"):
        return "your notebook cell"
    path = os.path.abspath(filename)
    for base in (os.getcwd(), str(REPO_ROOT)):
        rel = os.path.relpath(path, base)
        if not rel.startswith(".."):
            return rel
    return path


def _one_more_in_each(op, size: Size) -> Size:
    """``size`` with each dimension one larger where the operator accepts it: a switch (attention's
    CAUSAL) stays 0 or 1, query heads stay a multiple of the KV heads (decode attention), a
    tensor-core head size a multiple of 8. Adding 1 everywhere had made sizes the operator refuses, on
    which the grader ran the answer key out of bounds."""
    key = (op.name, tuple(size))
    if key not in _ONE_MORE:
        bumped = tuple(size)
        for i in range(len(bumped)):
            trial = bumped[:i] + (bumped[i] + 1,) + bumped[i + 1:]
            try:  # validated on inputs built at that size: the grader builds them anyway
                bumped = accepted_size(op, trial, build_up_to=GRADE_SIZE_BUILD_BYTES)
            except SizeError:
                pass
        _ONE_MORE[key] = bumped
    return _ONE_MORE[key]


GRADE_SIZE_BUILD_BYTES = 1 << 28
_ONE_MORE: dict = {}  # (operator, size) -> its grading size one larger: computed once per process


def switches(op) -> list[int]:
    """The dimensions that are on/off switches (attention's CAUSAL): declared only as 0 or 1."""
    declared = [as_size(z) for z in (*op.sim_sizes, *op.check_sizes, *op.bench_sizes, op.headline_size)]
    return [i for i in range(len(op.dims)) if all(z[i] in (0, 1) for z in declared) and any(z[i] == 0 for z in declared)]


SIZE_CAP = 8  # a symmetry-breaking size has at most this many times the elements of the largest check size
SEARCH = 8  # how far past its target a dimension's value is tried when the operator refuses the target


def _accepted(op, size) -> bool:
    try:
        accepted_size(op, size, build_up_to=GRADE_SIZE_BUILD_BYTES)
        return True
    except Exception:  # a SizeError, or the operator's own builders failing there (a negative output size)
        return False


def distinct_size(op, base: Size, descending: bool, caps: Size | None = None) -> Size | None:
    """``base`` with its dimensions made unequal to each other and none of them 1 (where the operator
    accepts it), their values ascending in the order of the dimensions, or descending: together the two
    show each pair of dimensions in both orientations (rows < cols and rows > cols, R < S and R > S), so
    that code confusing two of them (batch for heads, rows for columns, a square filter) cannot pass.
    Switches are kept as they are. Each dimension takes the first value from its target up that the
    operator accepts (a head size a multiple of 8, query heads a multiple of KV heads); None where no
    dimension could be changed. ``caps``: the largest value each dimension may take (the simulator's cost
    grows with the blocks a launch takes, which a batch or a head count multiplies)."""
    key = (op.name, tuple(base), descending, caps)
    if key in _DISTINCT:
        return _DISTINCT[key]
    fixed = set(switches(op))
    free = [i for i in range(len(base)) if i not in fixed]
    targets_ = []
    for value in sorted(max(2, base[i]) for i in free):
        targets_.append(max(value, targets_[-1] + 1) if targets_ else value)
    if descending:
        targets_.reverse()
    size = list(base)
    for k, (i, target) in enumerate(zip(free, targets_)):
        taken = {size[j] for j in free[:k]}  # (the dimensions after this one move next)
        start = min(target, caps[i]) if caps else target
        top = min(start + SEARCH, caps[i] + 1) if caps else start + SEARCH
        for value in [*range(start, top), *range(start - 1, 1, -1)]:  # up from the target, then down
            trial = size[:i] + [value] + size[i + 1:]
            if value not in taken and _accepted(op, trial):
                size = trial
                break
    _DISTINCT[key] = None if size == list(base) else tuple(size)
    return _DISTINCT[key]


_DISTINCT: dict = {}  # computed once per process: the operator's validation builds inputs


def symmetry_sizes(op, base: list[Size]) -> list[Size]:
    """Sizes that break the symmetries of the simulator's small sizes: its second smallest with every
    dimension distinct, in both orientations, each switch both off and on at the first (a mask at a
    length where it changes the answer); none much larger than the largest size already graded."""
    if len(op.dims) < 2:
        return []
    # From the second smallest size: small enough that six heads where there was one stay cheap, past the
    # first (often all ones).
    by_elements = sorted(base, key=lambda s: int(np.prod([max(1, n) for n in s])))
    middle = by_elements[min(1, len(base) - 1)]
    largest = max(int(np.prod(s)) for s in base)
    # The simulator's time grows with the blocks a launch takes, which a batch, a head count or a rank count
    # multiplies: a dimension stays within twice its largest value (at least 3); of an operator of at most
    # three, within 8 if another dimension reaches that (so that rows can outnumber columns where every
    # size had fewer).
    widest = min(8, max(max(s) for s in base)) if len(middle) <= 3 else 0
    caps = tuple(max(3, 2 * max(s[i] for s in base), widest) for i in range(len(middle)))
    found = []
    for descending in (False, True):
        size = distinct_size(op, middle, descending, caps)
        if size is None:
            continue
        found.append(size)
        for i in switches(op) if not descending else ():  # (each switch both ways once is enough)
            flipped = size[:i] + (1 - size[i],) + size[i + 1:]
            if _accepted(op, flipped):
                found.append(flipped)
    return [s for s in dict.fromkeys(found) if int(np.prod([max(1, n) for n in s])) <= SIZE_CAP * max(largest, 1)]


def _elements(size: Size) -> int:
    return int(np.prod([max(1, n) for n in size]))


def boundary_sizes(stage, base: list[Size]) -> list[Size]:
    """Sizes at the boundaries ``stage`` declares (``Stage.boundaries``: where its blocks, tiles, chunks
    or unrolled steps end along a dimension), each hit exactly and missed by one either side: a loop
    bound off by one (``<=`` for ``<``, a tail of one element dropped, a ceiling division rounded the
    wrong way) is right everywhere else, and the declared sizes, chosen not to be multiples of any block,
    never land there. Each from the second smallest of ``base`` with that one dimension changed, kept
    only where the operator accepts it and within SIZE_CAP times the largest of ``base``."""
    if not stage.boundaries:
        return []
    op = stage.op
    start = sorted(base, key=_elements)[min(1, len(base) - 1)]  # past the first (often all ones)
    largest = max(_elements(s) for s in base)
    found = []
    for dim, ends in stage.boundaries.items():
        i = op.dims.index(dim)
        for end in ends:
            for value in (end - 1, end, end + 1):
                size = start[:i] + (value,) + start[i + 1:]
                if value >= 1 and _elements(size) <= SIZE_CAP * max(largest, 1) and _accepted(op, size):
                    found.append(size)
    return list(dict.fromkeys(found))


def grade_sizes(op, mode: str, quick: bool = False, stage=None) -> list[Size]:
    """The operator's check sizes for this mode (on a GPU, as the GPU suite checks ``stage``: a first stage
    skips the largest, ``check.gpu_check_sizes``), plus its extra grading sizes (``Operator.grade_sizes``;
    by default one more than the middle and the largest size in every dimension, so that no size is
    a multiple of a block), plus the sizes that break its symmetries (``symmetry_sizes``), plus, for a
    ``stage``, the sizes at its declared boundaries (``boundary_sizes``). Quick: the smallest size, the
    first extra one, the first size that breaks the symmetries and the first boundary's three."""
    if mode == "sim":
        base = [as_size(s) for s in op.sim_sizes]
    else:  # a first stage skips the largest, where the answer key's own run may take minutes
        base = gpu_check_sizes(stage) if stage is not None else [as_size(s) for s in op.check_sizes]
    declared = (op.grade_sizes or {}).get("sim" if mode == "sim" else "gpu")
    if declared:
        extra = [as_size(s) for s in declared]
    else:
        middle = base[len(base) // 2]
        largest = max(base, key=lambda s: int(np.prod(s)))
        extra = [_one_more_in_each(op, middle), _one_more_in_each(op, largest)]
    symmetric = symmetry_sizes(op, base)
    edges = boundary_sizes(stage, base) if stage is not None else []
    chosen = [base[0], extra[0], *symmetric[:1], *edges[:3]] if quick else base + extra + symmetric + edges
    return list(dict.fromkeys(chosen))  # in order, without repeats
