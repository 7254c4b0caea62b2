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


def _reachable(func, seen: dict, helpers: dict | None = None) -> None:
    """Collect the kernels/device functions referenced by name from ``func``, depth first; with
    ``helpers``, also follow (and collect) plain functions of the same module that a launcher calls,
    such as a recursive scan's, and the kernels they launch."""
    code = getattr(func, "__code__", None)
    if code is None:
        return
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions / comprehensions
        if hasattr(const, "co_names"):
            names |= set(const.co_names)
    for name in sorted(names):
        obj = func.__globals__.get(name)
        if _is_kernel(obj) and name not in seen:
            seen[name] = obj
            _reachable(obj.py_func, seen, helpers)
        elif (helpers is not None and inspect.isfunction(obj) and _same_or_shared(obj, func)
              and name not in helpers and obj is not func):
            helpers[name] = obj
            _reachable(obj, seen, helpers)


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
    launching = [h for h in helpers.values() if any(_is_kernel(h.__globals__.get(n)) for n in h.__code__.co_names)]
    funcs = [k.py_func for k in seen.values()] + launching
    for func in sorted(funcs, key=lambda f: f.__code__.co_firstlineno):
        parts.append(textwrap.dedent(inspect.getsource(func)))
    parts.append(textwrap.dedent(inspect.getsource(stage.launch)))
    return "\n\n".join(p.rstrip() for p in parts) + "\n"
