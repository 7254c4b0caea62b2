"""`workbench record`: the one command a GPU run needs, within a time budget.

1. The ceilings (``workbench.ceilings``) are measured again when they are stale: never measured on this
   device, missing a pattern, taken under other versions, or older than ``PEAKS_MAX_AGE_DAYS``.
2. Then the plan: every (operator, size) an operator declares (its headline size, every bench size where
   ``record_all_sizes``, the sizes its targets name), those with a stage never recorded first, then the
   headline sizes, then the stalest. Each
   item is checked and timed as `workbench bench` does (``bench.bench_size``: every stage checked against
   the float64 reference before it is timed, the eager peer and torch.compile beside it) and saved at once,
   so a run that is cut off keeps what it measured, and the next run resumes where it stopped (what it
   measured is now the freshest, so it goes last).
3. An item starts only if its estimated cost (its last run's seconds, else a model of compile and timing
   costs) fits the time left.
4. The summary: what got faster or slower than its last record beyond the noise of both records, what
   failed its check, and what is still unrecorded.

Operators `bench` cannot measure in one process on one GPU (those with ``Operator.figures_elsewhere``:
the all-reduce and its fusion) are left out of the plan; the command runs their measurement on a machine
with two GPUs or more, and says in one line that it skipped them otherwise.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from . import results
from .bench import PATTERN_PEAK
from .ladder import Operator, as_size, size_label
from .library_peers import COMPILED_NAME

PEAKS_MAX_AGE_DAYS = 30
PEAKS_KEYS = (*PATTERN_PEAK.values(), "gemm_fp32_gflops", "gemm_fp16_gflops")
PEAKS_SECONDS = 60.0  # what measuring the ceilings costs when no earlier run says (1 GiB streams, 8192^3 GEMMs)
VERSION_KEYS = ("numba_cuda", "torch", "cuda_driver")  # a ceiling taken under other versions is re-measured

# The cost model of an item never run before: compiling and checking a stage (numba compiles each
# kernel on first call; the float64 reference is computed once), torch.compile's first trace, and the
# timing itself (samples x launches per sample x the median, from earlier records where there are some).
STAGE_SECONDS = 4.0
COMPILE_PEER_SECONDS = 25.0
WARM_STAGE_SECONDS = 0.5  # a stage already compiled in this run: its check and timing at another size
NOISE_FLOOR = 0.03  # run-to-run differences under 3% are noise whatever the spread within a run says


def _days_since(date: str | None) -> float:
    if not date:
        return math.inf
    then = _dt.datetime.fromisoformat(date)
    return (_dt.datetime.now(_dt.timezone.utc) - then).total_seconds() / 86400


def peaks_stale(peaks: dict | None, env: dict) -> str | None:
    """Why the stored ceilings must be measured again, or None when they are fresh."""
    if not peaks or not peaks.get("copy_gbps"):
        return "no ceilings recorded for this device"
    missing = [k for k in PEAKS_KEYS if not peaks.get(k)]
    if missing:
        return f"{', '.join(missing)} never measured"
    then = peaks.get("environment") or {}
    changed = [k for k in VERSION_KEYS if k in then and k in env and then[k] != env[k]]
    if changed:
        return "measured under other versions (" + ", ".join(f"{k} {then[k]} -> {env[k]}" for k in changed) + ")"
    if _days_since(peaks.get("date")) > PEAKS_MAX_AGE_DAYS:
        return f"older than {PEAKS_MAX_AGE_DAYS} days ({peaks.get('date', '?')[:10]})"
    return None


@dataclass
class Item:
    """One operator at one size: everything `record` measures in one step and saves at once."""

    op: Operator
    size: tuple
    headline: bool
    missing: list[str]  # stages and peers with no record at this size
    oldest: str | None  # the oldest record's date (None: nothing recorded)
    estimate_s: float
    warm_s: float  # the estimate once the operator was measured at another size in this run
    for_target: bool = False  # a declared target reads this size: unmeasured, its verdict is unknown

    @property
    def stages_missing(self) -> bool:
        return any(name in {s.name for s in self.op.stages} for name in self.missing)

    @property
    def label(self) -> str:
        return f"{self.op.name} @ {size_label(self.size)}"


def needs_several_gpus(op: Operator) -> bool:
    """An operator measured across GPUs by its own run (the all-reduce), not by ``bench_size``."""
    return op.figures_elsewhere is not None


def declared_sizes(op: Operator) -> list[tuple]:
    """The headline size, every bench size where the operator records them all, and the targets' sizes."""
    sizes = [as_size(op.headline_size)]
    if op.record_all_sizes:
        sizes += [as_size(s) for s in op.bench_sizes]
    sizes += [t.size_of(op) for t in op.targets]
    return list(dict.fromkeys(sizes))


def expected_names(op: Operator, with_compile: bool) -> list[str]:
    """What a complete record of one size holds: every stage, a peer, and torch.compile where declared."""
    names = [s.name for s in op.stages]
    if op.peer is not None:
        names.append("a peer")
    if with_compile and op.torch_expression is not None:
        names.append(COMPILED_NAME)
    return names


def _timing_seconds(recs: list[dict]) -> float:
    return sum(r.get("samples", 25) * r.get("launches_per_sample", 1) * r["median_us"] * 1e-6 for r in recs)


def _work(op: Operator, size) -> float:
    """What a size costs to run, for scaling one size's seconds to another's: flops for a compute-bound
    operator, bytes for a memory-bound one (the float64 reference on the CPU grows the same way)."""
    return float(op.flops(size) if op.bound == "compute" else op.bytes_moved(size)) or 1.0


def estimate_seconds(op: Operator, recs: list[dict], with_compile: bool, compiled: bool = False,
                     size=None, elsewhere: list[dict] = ()) -> float:
    """An item's cost: its last run's wall time where recorded, else compile and check per stage plus the
    timing the earlier records imply; ``compiled``: the operator's kernels and torch.compile already ran
    at another size in this run (measured on an H200: 23 s for reduction's first size, 1 s for each next).
    A size never recorded takes its timing (and, where known, its whole wall time) from the operator's
    most-recorded other size, ``elsewhere``, scaled by the work: attention's first run at 4x the
    headline's work was estimated at 49 s without this, and took over two minutes."""
    timed = [r["item_seconds"] for r in recs if r.get("item_seconds")]
    if timed:
        return max(timed)
    n = len(op.stages) + (op.peer is not None)
    timing, whole = _timing_seconds(recs), 0.0
    if not recs and size is not None and elsewhere:
        by_size: dict[tuple, list[dict]] = {}
        for r in elsewhere:
            by_size.setdefault(tuple(r["size"]), []).append(r)
        other, other_recs = max(by_size.items(), key=lambda kv: len(kv[1]))
        ratio = _work(op, as_size(size)) / _work(op, other)
        timing = ratio * _timing_seconds(other_recs)
        whole = ratio * max((r.get("item_seconds") or 0.0 for r in other_recs), default=0.0)
    if compiled:
        return max(n * WARM_STAGE_SECONDS + timing, whole)
    compile_peer = COMPILE_PEER_SECONDS if with_compile and op.torch_expression is not None else 0.0
    return max(n * STAGE_SECONDS + compile_peer + timing, whole)


def plan(ops: list[Operator], data: dict, with_compile: bool = True) -> list[Item]:
    """Every item of ``ops``, never-recorded first (a size a target reads before the rest), the headline
    before other sizes, then the stalest."""
    items = []
    for op in ops:
        if needs_several_gpus(op):
            continue
        target_sizes = {t.size_of(op) for t in op.targets}
        own = results.records_for(op.name, data)
        for size in declared_sizes(op):
            recs = [r for r in own if r["size"] == list(size)]
            have = {r["stage"] for r in recs} | ({"a peer"} if any(r.get("kind") == "peer" for r in recs) else set())
            missing = [n for n in expected_names(op, with_compile) if n not in have]
            oldest = min((r["date"] for r in recs), default=None)
            elsewhere = [r for r in own if r["size"] != list(size) and r.get("kind") == "stage"]
            items.append(Item(op, size, size == as_size(op.headline_size), missing, oldest,
                              estimate_seconds(op, recs, with_compile, size=size, elsewhere=elsewhere),
                              estimate_seconds(op, recs, with_compile, compiled=True, size=size,
                                               elsewhere=elsewhere), size in target_sizes))
    # A stage never recorded goes first; a peer missing alone does not (a torch.compile that fails its
    # check at some size would otherwise come back first in every run): that size waits its turn by date.
    # Among those, a size a target reads goes before the rest: until it is measured its verdict is unknown.
    return sorted(items, key=lambda i: (not i.stages_missing, not (i.for_target and i.stages_missing),
                                        not i.headline, i.oldest or ""))


def _spread(r: dict) -> float:
    return (r["p90_us"] - r["p10_us"]) / r["median_us"] if r.get("median_us") else 0.0


def change(old: dict, new: dict) -> float | None:
    """``old time / new time - 1`` where it exceeds both records' spread (and NOISE_FLOOR), else None."""
    speedup = old["median_us"] / new["median_us"] - 1
    return speedup if abs(speedup) > max(_spread(old), _spread(new), NOISE_FLOOR) else None


@dataclass
class Summary:
    measured: list[str] = field(default_factory=list)  # items recorded in this run
    changes: list[tuple[str, str, float, float, float]] = field(default_factory=list)  # (item, name, old, new, change)
    failures: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)  # items with stages never recorded, left for a next run
    skipped: list[str] = field(default_factory=list)  # one line each: what did not run and why

    def lines(self) -> list[str]:
        out = [f"recorded {len(self.measured)} item(s)"]
        faster = [c for c in self.changes if c[4] > 0]
        slower = [c for c in self.changes if c[4] < 0]
        for title, rows in (("faster", faster), ("slower", slower)):
            if rows:
                out.append(f"{title} than the last record, beyond its noise:")
                out += [f"  {item} {name}: {old:.1f} -> {new:.1f} µs ({ch:+.0%})" for item, name, old, new, ch in rows]
        if not self.changes:
            out.append("nothing changed beyond the noise of its last record")
        out += [f"FAIL {f}" for f in self.failures]
        out += [f"skipped: {s}" for s in self.skipped]
        if self.unrecorded:
            out.append(f"still unrecorded ({len(self.unrecorded)}): " + ", ".join(self.unrecorded))
        else:
            out.append("every declared size of these operators has a record")
        return out


def compare_records(label: str, before: list[dict], after: list[dict]) -> list[tuple]:
    old = {results.record_key(r): r for r in before}
    rows = []
    for r in after:
        prior = old.get(results.record_key(r))
        ch = change(prior, r) if prior else None
        if ch is not None:
            rows.append((label, r["stage"], prior["median_us"], r["median_us"], ch))
    return rows


class OverBudget(BaseException):
    """The budget ran out while an item was being measured (a BaseException: the measuring step's own
    ``except Exception``, which keeps one broken operator from ending the run, must not swallow it)."""


@contextlib.contextmanager
def stopped_when_spent(seconds_left: float, real_clock: bool = True):
    """Raise OverBudget in the main thread once ``seconds_left`` have passed (SIGALRM), so that an item
    whose estimate was wrong (a size never run, a slow float64 reference) cannot carry the run past its
    budget; a no-op off the main thread, without SIGALRM, or under a test's clock."""
    if not real_clock or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def spent(signum, frame):
        raise OverBudget()

    previous = signal.signal(signal.SIGALRM, spent)
    signal.setitimer(signal.ITIMER_REAL, max(seconds_left, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def record(ops: list[Operator], budget_s: float, device: str, measure_item: Callable[[Item], tuple[list, list]],
           say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
           with_compile: bool = True, started: float | None = None) -> Summary:
    """Measure the plan of ``ops`` within ``budget_s`` seconds (counted from ``started``, default now),
    saving each item's records to ``device``'s results file as soon as it is measured.
    ``measure_item(item) -> (records, failures)`` does the measuring (``gpu_measure_item`` on a GPU)."""
    t0 = clock() if started is None else started
    path = results.path_for(device)
    data = results.load(path) if path.exists() else results.empty(device)
    summary = Summary()
    items = plan(ops, data, with_compile)
    say(f"plan: {len(items)} item(s), {sum(bool(i.missing) for i in items)} never fully recorded; budget {budget_s:.0f} s")
    compiled = set()  # operators measured at some size in this run: their kernels are compiled
    for n, item in enumerate(items, 1):
        left = budget_s - (clock() - t0)
        estimate = item.warm_s if item.op.name in compiled else item.estimate_s
        if estimate > left:
            summary.skipped.append(f"{item.label} (needs ~{estimate:.0f} s, {max(left, 0):.0f} s left)")
            if item.missing:
                summary.unrecorded.append(item.label)
            continue
        why = f"never recorded: {', '.join(item.missing)}" if item.missing else f"last recorded {item.oldest[:10]}"
        say(f"[{clock() - t0:5.0f} s] {n}/{len(items)} {item.label} ({why}; ~{estimate:.0f} s)")
        compiled.add(item.op.name)
        began = clock()
        try:
            with stopped_when_spent(budget_s - (began - t0), real_clock=clock is time.monotonic):
                recs, fails = measure_item(item)
        except OverBudget:
            say(f"  the budget ran out {clock() - began:.0f} s into {item.label}: its measurements are dropped")
            summary.skipped.append(f"{item.label} (cut off when the budget ran out; estimated ~{estimate:.0f} s)")
            summary.unrecorded.append(item.label)
            break
        seconds = clock() - began
        for r in recs:
            r["item_seconds"] = round(seconds, 1)
        if recs:
            before = [r for r in results.records_for(item.op.name, data) if r["size"] == list(item.size)]
            summary.changes += compare_records(item.label, before, recs)
            data = results.load(results.save_records(device, recs))
            summary.measured.append(item.label)
        summary.failures += fails
        for f in fails:
            say(f"  FAIL {f}")
        for r in recs:
            peer = r.get("peer")
            ratio = f"  {peer['median_us'] / r['median_us']:.2f}x {peer['name']}" if peer else ""
            say(f"  {r['stage']:<28} {r['median_us']:10.1f} µs {r['gbps']:8.0f} GB/s {r['gflops'] / 1e3:8.2f} TFLOP/s{ratio}")
        have = {r["stage"] for r in recs}
        if any(s.name not in have for s in item.op.stages):
            summary.unrecorded.append(item.label)
    return summary


def gpu_measure_item(peaks: dict, env: dict, seed: int | None = None,
                     with_compile: bool = True) -> Callable[[Item], tuple[list, list]]:
    """The measuring step on a GPU: ``bench.bench_size`` at the item's size, every stage and peer."""
    import numpy as np

    from .bench import bench_size
    from .ceilings import check_ceilings

    rng = np.random.default_rng(seed)
    ceilings = dict(peaks)

    def measure_item(item: Item) -> tuple[list, list]:
        nonlocal ceilings
        try:
            recs, fails = bench_size(item.op, item.op.stages, item.size, ceilings, rng, env, with_compile=with_compile)
            checked = check_ceilings(recs, ceilings, print)
            if checked is not ceilings:  # a stream measured again: saved at once, as `peaks --measure` does
                ceilings = checked
                results.save_records(env["device"], [], peaks=ceilings)
            return recs, fails
        except Exception as exc:  # one operator that cannot run (a missing library, ...) must not end the run
            return [], [f"{item.label}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"]

    return measure_item
