"""The grader's inputs and their float64 references, made once per (operator, size, draw) and kept.

Every stage of an operator is graded on the same seeded draws (``cases.plan``: stream i for the i-th
size, the adversarial sets, the speed case's draws), so what the grader computes from a draw is the same
for each of them. At a GPU's sizes that work is most of a stage's time (layernorm.naive on an H200: 47 of
61 s were making 2^27-element inputs and their float64 references), so it is made once and kept in this
process (:data:`DRAWS`), in memory bounded by bytes, and every later stage of the operator reuses it.

A kept input must never be one a submission wrote to: the arrays are made read-only before anyone sees
them (a write to one raises), the submission only ever gets copies of them (sent to its worker process,
or copied to the device), and ``check.judge`` still compares what the call left in its inputs with them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import device as _device
from ..check import adversarial_cases

SIM_BUDGET_BYTES = 256 << 20  # the simulator's sizes are a few thousand elements: a family's draws are megabytes
# On a GPU host: a stage's draws at full sizes hold up to 6 GiB for most operators (a 2^28-element float32
# input is 1 GiB, its float64 reference 2 GiB), 9-16 GiB for scan, transpose and elementwise; a quarter of
# the host's memory at most (each of --jobs' workers holds copies of its inputs and outputs besides).
GPU_BUDGET_BYTES = 16 << 30
BUDGET_VARIABLE = "WORKBENCH_GRADE_CACHE_MB"  # overrides the budget (0: keep nothing)


def _nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def read_only(value):
    """``value`` with every array in it made read-only (in place), so a kept draw cannot be changed."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, (tuple, list)):
        for v in value:
            read_only(v)
    return value


class DrawCache:
    """A least-recently-used cache bounded by the bytes of the arrays it holds, safe across the grader's
    threads (``--jobs``); each value is made once even when two threads ask for it at the same time.

    Keys are (owner, ...), the owner an operator's name. A new value pushes out the least recently used
    values of *other* operators only: an operator's stages ask for its draws in the same order each time,
    and a cache smaller than that cycle would, pushing out the oldest, lose every draw just before it was
    asked for again. Kept instead, the draws that fit are reused by every stage and only the rest are made
    again. A value larger than the whole budget is never kept."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.used = 0
        self.made = 0  # values made (misses)
        self.reused = 0  # values found (hits)
        self._values: OrderedDict = OrderedDict()  # key -> (value, bytes), least recently used first
        self._lock = threading.Lock()
        self._making: dict = {}  # key -> the lock held while it is made

    def get(self, key: tuple, make: Callable[[], object]):
        """The value kept under ``key``, or ``make()`` made read-only (and kept where it fits)."""
        found = self._found(key)
        if found is not None:
            return found[0]
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:  # another thread making the same value: wait for it rather than make it twice
            found = self._found(key)
            if found is not None:
                return found[0]
            value = read_only(make())
            with self._lock:
                self.made += 1
                self._keep(key, value)
                self._making.pop(key, None)
        return value

    def _found(self, key):
        with self._lock:
            entry = self._values.get(key)
            if entry is not None:
                self._values.move_to_end(key)
                self.reused += 1
            return entry

    def _keep(self, key: tuple, value) -> None:
        size = _nbytes(value)
        if size > self.budget or key in self._values:
            return
        owner = key[0]
        for old in [k for k in self._values if k[0] != owner]:  # oldest first
            if self.used + size <= self.budget:
                break
            self.used -= self._values.pop(old)[1]
        if self.used + size <= self.budget:
            self._values[key] = (value, size)
            self.used += size

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self.used = self.made = self.reused = 0


def budget_bytes() -> int:
    """The cache's budget here: ``$WORKBENCH_GRADE_CACHE_MB``, else small in the simulator and, on a GPU
    host, GPU_BUDGET_BYTES or a quarter of the host's memory, whichever is less."""
    if os.environ.get(BUDGET_VARIABLE):
        return int(float(os.environ[BUDGET_VARIABLE]) * (1 << 20))
    if _device.is_simulator():
        return SIM_BUDGET_BYTES
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 4 * GPU_BUDGET_BYTES
    return min(GPU_BUDGET_BYTES, memory // 4)


DRAWS = DrawCache(budget_bytes())


def reference_of(op, inputs: tuple) -> np.ndarray:
    """The operator's float64 reference, as ``check.judge`` computes it."""
    with np.errstate(all="ignore"):  # the adversarial inputs hold NaN and inf on purpose: no warnings
        return op.reference(*inputs)


@dataclass(frozen=True)
class Draw:
    """One set of inputs for an operator, and its reference: each made when first asked, then kept in DRAWS."""

    op: object
    key: tuple  # what identifies the draw within the operator: (size, seed, stream[, adversarial set])
    make: Callable[[], tuple]  # the inputs (from DRAWS: a draw's inputs are kept as such, or in their set)

    def inputs(self) -> tuple:
        return self.make()

    def reference(self) -> np.ndarray:
        return DRAWS.get((self.op.name, "reference", *self.key), lambda: reference_of(self.op, self.inputs()))


def random_draw(op, size, seed: int, stream: int) -> Draw:
    """The operator's random inputs at ``size`` from the seed's ``stream``: the same arrays for every stage."""
    key = (tuple(size), seed, stream)
    make = lambda: tuple(op.make_inputs(size, np.random.default_rng([seed, stream])))
    return Draw(op, key, lambda: DRAWS.get((op.name, "inputs", *key), make))


def adversarial_draws(op, size, seed: int, stream: int) -> list[tuple[str, Draw]]:
    """The operator's adversarial input sets at ``size`` (labelled), made once from the seed's ``stream``."""
    key = (tuple(size), seed, stream)

    def sets() -> list:
        return DRAWS.get((op.name, "adversarial", *key),
                         lambda: adversarial_cases(op, size, np.random.default_rng([seed, stream])))

    return [(label, Draw(op, (*key, k), lambda k=k: tuple(sets()[k][1]))) for k, (label, _) in enumerate(sets())]
