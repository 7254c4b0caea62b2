"""A submission's code: loading its file, finding a stage's launcher, and the functions it reaches.

Runs where the submission runs (the grading worker, or in-process for ``grade_function``). What it
finds about the code is sent to the grader as plain data: each function's name, file, stub lines and
a fingerprint of its bytecode, so the grader can tell the answer key's code wherever it was loaded
from (a kernel whose bytecode is the answer key's, from a file other than the submission, was
executed from the answer key's source).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import linecache
import types
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ..ladder import Operator, Stage
from ..markers import has_markers, stub_lines
from ..paths import REPO_ROOT

WORKBENCH_DIR = REPO_ROOT / "workbench"


def load_file(path) -> types.ModuleType:
    """Import a file as a fresh module (never writes next to it: no bytecode cache)."""
    path = Path(path).resolve()
    name = "submission_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:8]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def _operators_in(module) -> list[Operator]:
    """The Operators a module defines at its top level, alone or in a list (``OPERATORS = [...]``)."""
    found = []
    for value in list(vars(module).values()):
        if isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, Operator)]
        elif isinstance(value, Operator):
            found.append(value)
    return found


def find_launch(module, op_name: str, stage_name: str) -> tuple[Callable | None, str]:
    """The submission's launcher for a stage, or (None, why not).

    Looked for as a stage of an Operator named op_name in the module (alone or in a list), then as a
    module-level name equal to the stage's (a Stage or a plain function). It must be defined in the
    submission itself.
    """
    found = []
    for op in _operators_in(module):
        if op.name == op_name:
            found += [s.launch for s in op.stages if s.name == stage_name]
    attr = vars(module).get(stage_name)
    if isinstance(attr, Stage):
        found.append(attr.launch)
    elif callable(attr):
        found.append(attr)
    own = [f for f in found if getattr(f, "__module__", None) == module.__name__]
    if own:
        return own[0], ""
    if found:
        where = f"{getattr(found[0], '__module__', '?')}.{getattr(found[0], '__qualname__', '?')}"
        return None, f"`{stage_name}` in the submission is {where}, not code of its own"
    return None, (f"no stage {op_name}.{stage_name} in {getattr(module, '__file__', module.__name__)}: define "
                  f"`def {stage_name}(*inputs, out)` there, or register it with @op.stage({stage_name!r}, ...)")


# -- whose code is it? ---------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(str(WORKBENCH_DIR))
    return tuple(os.path.realpath(r) + os.sep for r in roots)


@lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """Is this code file Python's, an installed library's, or the workbench's (not a submission's)?"""
    if filename.startswith("<frozen"):
        return True
    if filename.startswith("<"):
        return False  # "<string>": code built at run time
    return os.path.realpath(filename).startswith(_library_roots())


def python_function(obj):
    """The Python function behind a kernel or device function (CUDADispatcher / FakeCUDAKernel), a
    Stage's launcher, or a plain function; else None."""
    if isinstance(obj, Stage):
        obj = obj.launch
    py = getattr(obj, "py_func", None)
    if isinstance(py, types.FunctionType):
        return py
    return obj if isinstance(obj, types.FunctionType) else None


def _referenced(func: types.FunctionType) -> list:
    """Objects a function names: its globals and closure cells, and the attributes it names of any
    module among them (``histogram.global_atomics``)."""
    names = set()
    stack = [func.__code__]
    while stack:
        code = stack.pop()
        names |= set(code.co_names)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    direct = [func.__globals__.get(name) for name in names]
    for cell in func.__closure__ or ():
        try:
            direct.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    found = []
    for obj in direct:
        if isinstance(obj, types.ModuleType):
            found += [getattr(obj, attr, None) for attr in names]
        elif obj is not None:
            found.append(obj)
    return found


def reachable_functions(launch: Callable) -> list[types.FunctionType]:
    """The launcher and every kernel, device function and helper it reaches by name, depth first,
    leaving out library code (numba, numpy, the workbench)."""
    seen: dict[int, types.FunctionType] = {}
    stack = [python_function(launch)]
    while stack:
        func = stack.pop()
        if func is None or id(func) in seen or is_library_file(func.__code__.co_filename):
            continue
        seen[id(func)] = func
        stack += [python_function(obj) for obj in _referenced(func)]
    return list(seen.values())


def fingerprint(code: types.CodeType) -> str:
    """A digest of a function's bytecode, names and constants (not its file or line numbers): the same
    source compiled anywhere gives the same fingerprint."""
    digest = hashlib.sha1()

    def feed(c: types.CodeType) -> None:
        digest.update(c.co_code)
        digest.update(repr((c.co_names, c.co_varnames, c.co_freevars)).encode())
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                feed(const)
            elif isinstance(const, frozenset):
                digest.update(repr(sorted(map(repr, const))).encode())
            else:
                digest.update(repr(const).encode())

    feed(code)
    return digest.hexdigest()[:20]


@lru_cache(maxsize=64)
def _compiled_file(filename: str) -> dict:
    """(name, first line) -> fingerprint of every function compiled from the file as it is now."""
    text = "".join(linecache.getlines(filename))
    try:
        stack = [compile(text, filename, "exec")]
    except (SyntaxError, ValueError):
        return {}
    found = {}
    while stack:
        code = stack.pop()
        found[(code.co_name, code.co_firstlineno)] = fingerprint(code)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def describe(func: types.FunctionType) -> dict:
    """Plain facts about one function, for the grader: name, file, first line, fingerprint, the lines
    still holding a TODO(exercise) stub, whether it uses shared memory, and whether its code is what
    its file says at that line (``source_matches``: False for code compiled from other text under the
    file's name; None where there is no file to read)."""
    code = func.__code__
    try:
        lines, first = inspect.getsourcelines(func)
        source = "".join(lines)
    except (OSError, TypeError):
        source, first = "", code.co_firstlineno
    matches = None
    if source:  # the file compiled as it is: is this function's code what it says at that line?
        compiled = _compiled_file(code.co_filename).get((code.co_name, code.co_firstlineno))
        matches = compiled == fingerprint(code)
    return {"qualname": func.__qualname__, "file": code.co_filename, "line": first,
            "fingerprint": fingerprint(code), "stub_lines": [first + n - 1 for n in stub_lines(source)],
            "shared_memory": "cuda.shared.array" in source or "syncthreads" in source,
            "marked": has_markers(source), "source_matches": matches}


def describe_launcher(launch: Callable) -> list[dict]:
    return [describe(f) for f in reachable_functions(launch)]
