"""Source of a stage: the launcher and every kernel and device function it reaches.

Notebooks show the kernel read from ``solutions/`` (never pasted), and the PTX check needs to know
which module-level kernels a stage owns.
"""

from __future__ import annotations

import inspect
import textwrap


def _is_kernel(obj) -> bool:
    # CUDADispatcher on a GPU, FakeCUDAKernel in the simulator: both keep the Python function.
    return hasattr(obj, "py_func") and type(obj).__name__ in {"CUDADispatcher", "FakeCUDAKernel"}


def _same_or_shared(obj, func) -> bool:
    """Is ``obj`` a function of ``func``'s module, or of a shared kernel module (``solutions._*``, such as
    ``_flash_mma``, whose launcher a stage calls)?"""
    module = obj.__module__ or ""
    return module == func.__module__ or module.startswith("solutions._")


def _table_entries(name: str, obj) -> list[tuple[str, object]]:
    """What a dispatch table holds (a list, tuple or dict of kernels and launchers, one level of tuples
    deep: softmax's ``BY_SHAPE = [(1024, warp_rows), ...]``), each named as the module names it."""
    values = list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple)) else []
    entries = []
    for value in values:
        inner = list(value) if isinstance(value, tuple) else [value]
        entries += [(getattr(v, "__name__", name), v) for v in inner]
    return entries


def _launcher(obj):
    """A stage (``Stage``: a previous stage's launcher that a dispatcher calls) as its launch function."""
    launch = getattr(obj, "launch", None)
    return launch if type(obj).__name__ == "Stage" and inspect.isfunction(launch) else obj


def _reachable(func, seen: dict, helpers: dict | None = None, defaults: bool = True) -> None:
    """Collect the kernels/device functions referenced by name from ``func``, depth first; with
    ``helpers``, also follow (and collect) plain functions of the same module that a launcher calls,
    such as a recursive scan's, and the kernels they launch, directly, as an earlier stage, or through
    a dispatch table (a list or dict of them: what a ``by_shape`` stage chooses from)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions / comprehensions
        if hasattr(const, "co_names"):
            names |= set(const.co_names)
    candidates = [(name, func.__globals__.get(name)) for name in sorted(names)]
    # A default argument may be the table (layernorm's ``kernel_for(cols, table=BY_SHAPE)``), unless the
    # caller named a table of its own (rmsnorm's ``kernel_for(cols, RMSNORM_BY_SHAPE)``): then it is that one.
    if defaults:
        candidates += [("", value) for value in (func.__defaults__ or ()) + tuple((func.__kwdefaults__ or {}).values())]
    names_a_table = any(_table_entries(name, obj) for name, obj in candidates if name)
    for name, obj in candidates:
        for found_name, found in [(name, _launcher(obj))] + _table_entries(name, obj):
            if not found_name:
                continue
            found = _launcher(found)
            if _is_kernel(found) and found_name not in seen:
                seen[found_name] = found
                _reachable(found.py_func, seen, helpers)
            elif (helpers is not None and inspect.isfunction(found) and _same_or_shared(found, func)
                  and found_name not in helpers and found is not func):
                helpers[found_name] = found
                _reachable(found, seen, helpers, defaults=not names_a_table)


def _launches(helper) -> bool:
    """Does ``helper`` launch a kernel (name one, or a dispatch table holding one), or make one (a kernel
    factory, such as the Hopper stages' ``_*_kernel_source``: its nested kernel names device functions)?"""
    for name in helper.__code__.co_names:
        obj = helper.__globals__.get(name)
        if _is_kernel(obj) or any(_is_kernel(v) for _, v in _table_entries(name, obj)):
            return True
    nested = [const for const in helper.__code__.co_consts if hasattr(const, "co_names")]
    return any(_is_kernel(helper.__globals__.get(name)) for code in nested for name in code.co_names)


def kernels_of(stage) -> dict:
    """Module-level kernels and device functions that ``stage``'s launcher reaches, by name."""
    seen: dict = {}
    _reachable(stage.launch, seen, {})
    return seen


def functions_of(stage) -> dict:
    """Everything of ``stage``'s module (or a shared one) that its launcher reaches, by name: kernels,
    device functions, and the plain helpers it calls (an all-reduce's ring schedule), where a learner's
    exercise region may also sit."""
    seen: dict = {}
    helpers: dict = {}
    _reachable(stage.launch, seen, helpers)
    return {**seen, **helpers}


def stage_source(stage) -> str:
    parts = []
    # In file order, so helpers read before the kernels that use them.
    seen: dict = {}
    helpers: dict = {}
    _reachable(stage.launch, seen, helpers)
    # Helpers are shown only where they launch kernels (a recursive scan's driver, say), not every
    # grid-size calculation.
    launching = [h for h in helpers.values() if _launches(h)]
    funcs = [k.py_func for k in seen.values()] + launching
    for func in sorted(funcs, key=lambda f: f.__code__.co_firstlineno):
        parts.append(textwrap.dedent(inspect.getsource(func)))
    parts.append(textwrap.dedent(inspect.getsource(stage.launch)))
    return "\n\n".join(p.rstrip() for p in parts) + "\n"
