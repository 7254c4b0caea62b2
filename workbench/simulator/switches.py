"""Switches: race checking, the simulated SM count, the thread budget."""

import operator
import os
from contextlib import contextmanager

from .core import DEFAULT_SM_COUNT, RACECHECK_ENV, SECONDS_PER_THREAD, SM_COUNT_ENV, TooManyThreads


_racecheck_override = []  # the stack of racecheck() blocks
_sm_count_override = []  # the stack of simulated_sm_count() blocks
_budgets = []  # the active thread_budget() blocks


def racecheck_enabled():
    """Is race checking on? Yes, unless ``WORKBENCH_SIM_RACECHECK=0`` or inside ``racecheck(False)``."""
    if _racecheck_override:
        return _racecheck_override[-1]
    setting = os.environ.get(RACECHECK_ENV, "1").strip().lower()
    return setting not in ("0", "off", "false", "no")


@contextmanager
def racecheck(enabled=True):
    """Turn race checking on (or off) for the launches inside the ``with`` block, whatever the
    environment says."""
    _racecheck_override.append(bool(enabled))
    try:
        yield
    finally:
        _racecheck_override.pop()


def sm_count():
    """Multiprocessors of the simulated device: 132 (an H100/H200), ``WORKBENCH_SIM_SM_COUNT``, or
    the innermost :func:`simulated_sm_count`."""
    if _sm_count_override:
        return _sm_count_override[-1]
    setting = os.environ.get(SM_COUNT_ENV, "").strip()
    if not setting:
        return DEFAULT_SM_COUNT
    try:
        count = int(setting)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{SM_COUNT_ENV} must be a whole number of multiprocessors, at least 1; got {setting!r}")
    return count


@contextmanager
def simulated_sm_count(count):
    """Simulate a device with `count` multiprocessors inside the ``with`` block.

    ``workbench.ladder.sm_count()`` and ``cuda.get_current_device().MULTIPROCESSOR_COUNT`` report it,
    so a launcher that sizes its grid from the SM count launches few blocks: with 2 SMs and 8
    blocks of 256 threads per SM, a kernel without a grid-stride loop leaves every element past
    4096 untouched.
    """
    count = operator.index(count)
    if count < 1:
        raise ValueError(f"a device needs at least 1 multiprocessor; got {count}")
    _sm_count_override.append(count)
    try:
        yield count
    finally:
        _sm_count_override.pop()


def simulated_threads(grid, block):
    """The number of CUDA threads a launch ``kernel[grid, block]`` runs (ints or 1-3 element tuples)."""
    total = 1
    for dims in (grid, block):
        for n in (dims if isinstance(dims, (tuple, list)) else (dims,)):
            total *= operator.index(n)
    return total


def estimated_seconds(threads):
    """About how long the simulator takes to run `threads` CUDA threads (see SECONDS_PER_THREAD)."""
    return threads * SECONDS_PER_THREAD


class _Budget:
    def __init__(self, max_threads):
        self.max_threads = max_threads
        self.used = 0


@contextmanager
def thread_budget(max_threads):
    """Refuse launches that would take the threads run inside the ``with`` block past `max_threads`.

    The launch that would cross the limit raises :class:`TooManyThreads` before it starts, with a
    message that says how many threads it wanted, how long that would take, and what to do (grade
    on a GPU, or size the grid from the data or from ``sm_count()``). Yields an object whose
    ``used`` attribute counts the threads run so far.
    """
    budget = _Budget(operator.index(max_threads))
    _budgets.append(budget)
    try:
        yield budget
    finally:
        _budgets.remove(budget)


def charge_budgets(kernel, grid_dim, block_dim):
    threads = simulated_threads(grid_dim, block_dim)
    for budget in _budgets:
        if budget.used + threads > budget.max_threads:
            blocks = simulated_threads(grid_dim, 1)
            before = f" (after {budget.used:,} in earlier launches)" if budget.used else ""
            raise TooManyThreads(
                f"kernel {kernel.__name__} launches {blocks:,} blocks of {simulated_threads(1, block_dim):,} "
                f"threads = {threads:,} threads{before}, past the {budget.max_threads:,} this check allows: "
                f"the simulator runs one Python thread per CUDA thread, about "
                f"{_duration(estimated_seconds(threads))} for this launch, so it cannot run it in "
                "reasonable time. Grade it on a GPU, or use a smaller grid: size it from the data, or "
                "from workbench.ladder.sm_count() (a few multiprocessors in the simulator), and loop "
                "over the rest with a grid-stride loop."
            )
    for budget in _budgets:
        budget.used += threads


def _duration(seconds):
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


def run_on_one_core(index):
    """Keep this process on one CPU core from now on: the ``index``-th of the cores it may use (modulo
    their number). Returns that core, or None where the OS cannot pin (not Linux).

    The simulator's CUDA threads are Python threads that hand the interpreter to one another at every
    barrier and warp intrinsic: one switch per lane each time. Spread over several cores, each switch
    wakes a thread on another core (a shuffle cost 43 µs per lane on a 2-core machine, a syncthreads
    32); on one core it is a switch within the core (15 and 11 µs), and a whole ladder check takes half
    the time. Only one thread runs Python at a time anyway, so a process that simulates loses nothing
    by staying on one core; processes that simulate side by side (test workers, the grader's jobs)
    each take a different ``index`` and so a core of their own. Threads started later inherit the
    core, so call this before the first launch."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    os.sched_setaffinity(0, {core})
    return core
