"""The issues' "must show" figures, measured as the README's are: every stage and the library peer of
an operator timed at its headline size in one run (``workbench.bench.bench_size``).

One timing run per operator per test session: every headline test of an operator reads the same
records, and the copy bandwidth is measured once, so the whole GPU suite fits one device call."""
import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def copy_peaks() -> dict:
    from workbench.peaks import copy_bandwidth

    return copy_bandwidth()


@functools.lru_cache(maxsize=None)
def _measured(op_name: str):
    from workbench.bench import bench_size
    from workbench.registry import operator
    from workbench.results import environment

    op = operator(op_name)
    peaks = copy_peaks() if op.bound == "memory" else {}
    records, failures = bench_size(op, op.stages, op.headline_size, peaks, np.random.default_rng(), environment())
    assert not failures, failures
    peer = [r for r in records if r["kind"] == "peer"]
    return peaks, [r for r in records if r["kind"] == "stage"], (peer[0] if peer else None)


def headline(op):
    """(peaks, stage records in ladder order, the peer's record or None) at ``op.headline_size``; peaks
    hold the copy bandwidth measured now, on this GPU, for a memory-bound operator."""
    return _measured(op.name)


def assert_each_stage_faster(stages):
    times = [(r["stage"], round(r["median_us"], 1)) for r in stages]
    assert all(a[1] > b[1] for a, b in zip(times, times[1:])), times
