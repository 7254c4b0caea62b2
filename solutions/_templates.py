"""Kernels written once and compiled once per operation, as a C++ template is instantiated per functor.

A template here is a plain Python function that calls names its module does not define (``activation``,
``combine``, ``IDENTITY``, ...). :func:`instantiate` makes a copy of it that sees those names bound to
one operation's functions and constants, and compiles the copy with ``cuda.jit`` (or leaves it a plain
function: a launcher). numba compiles each copy separately, so every operation gets its own specialised
machine code and nothing is decided at run time. It is the one way a kernel is specialised: per activation
(``activations.py``), per group size (``decode_attention.py``), and per 16-bit format through
``solutions._half.per_format``, which binds ``widen``, ``narrow`` and ``narrow2`` to each format's conversions.

The copy keeps the template's code (``inspect.getsource`` of it shows the template, which is what
notebooks and ``workbench diff`` print) and is also made a global of the template's module under its
own name (``_vector4_gelu``), which is where the PTX check looks a kernel up by its qualified name.
Not a ladder (its name starts with ``_``).
"""

from __future__ import annotations

import sys
import types

from numba import cuda


def instantiate(template, namespace: dict, name: str, *, jit: dict | None = None):
    """``template`` with its global names looked up in ``namespace``, named ``name``; compiled with
    ``cuda.jit(**jit)`` when ``jit`` is given (``{}`` for a kernel, ``{"device": True}`` for a device
    function), else returned as a plain function."""
    fn = types.FunctionType(template.__code__, namespace, name, template.__defaults__)
    fn.__qualname__ = name
    fn.__doc__ = template.__doc__
    made = fn if jit is None else cuda.jit(**jit)(fn)
    module = sys.modules.get(template.__module__)
    if module is not None:  # a file loaded without a sys.modules entry (a learner's, by a test) has none
        setattr(module, name, made)
    namespace[name] = made
    return made
