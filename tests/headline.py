"""The issues' "must show" figures, measured as the README's are: every stage and the library peer of
an operator timed at its headline size in one run (``workbench.bench.bench_size``)."""
import numpy as np


def headline(op, peaks=None):
    """(peaks, stage records in ladder order, the peer's record or None) at ``op.headline_size``.
    ``peaks`` defaults to the copy bandwidth measured now, on this GPU."""
    from workbench.bench import bench_size
    from workbench.peaks import copy_bandwidth
    from workbench.results import environment

    peaks = copy_bandwidth() if peaks is None else peaks
    records, failures = bench_size(op, op.stages, op.headline_size, peaks, np.random.default_rng(),
                                   environment())
    assert not failures, failures
    peer = [r for r in records if r["kind"] == "peer"]
    return peaks, [r for r in records if r["kind"] == "stage"], (peer[0] if peer else None)


def assert_each_stage_faster(stages):
    times = [(r["stage"], round(r["median_us"], 1)) for r in stages]
    assert all(a[1] > b[1] for a, b in zip(times, times[1:])), times
