"""What each ladder must reach on a GPU, declared beside its sizes and judged on the recorded figures.

An operator lists its goals in ``Operator.targets``, built with the two helpers below:

* ``against_peer(at_least, peer=None)``: a stage's speed over a library call's, ``peer time / stage time``
  (for a GEMM that is its TFLOP/s over the library's); ``peer`` is a pattern of the peer's recorded name
  ("torch.matmul", "torch.batch_norm*"), "eager" the library call itself (every peer but torch.compile),
  None the fastest peer recorded at that size;
* ``of_ceiling(percent, ceiling=None)``: a stage's GB/s (or GFLOP/s) as a share of a measured ceiling of
  ``workbench peaks`` ("read_gbps", "copy_gbps", "gemm_fp16_gflops"), None the operator's own;
* ``against_stage(at_least, other)``: a stage's speed over another stage of the ladder at the same size (a
  fused epilogue against the unfused one).

Each judges the last stage by default (what a user calls), ``stage="best"`` the fastest one, at the headline
size unless ``size`` says otherwise. ``verdicts()`` reads ``results/`` and says for each target met, missed
or never measured, with the figure, the peer and the date it read: what `workbench targets` prints and what
the README's course map and the notebooks show.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass

from . import results
from .bench import peak_key
from .ladder import Operator, as_size, size_label
from .library_peers import COMPILED_NAME

MET, MISSED, NEVER = "met", "missed", "never measured"
LAST, BEST = "last", "best"
EAGER = "eager"  # a peer pattern: the library call as a user writes it, not its torch.compile


@dataclass(frozen=True)
class Target:
    """One goal: ``kind`` "peer" (a speed ratio over a library call), "stage" (a speed ratio over another
    stage) or "ceiling" (a percentage of a measured ceiling), reached when the figure is at least
    ``at_least``."""

    kind: str
    at_least: float
    peer: str | None = None  # "peer": a pattern of the peer's name, None the fastest peer; "stage": a stage's name
    ceiling: str | None = None  # "ceiling": a key of the recorded peaks; None: the operator's own
    stage: str = LAST  # "last", "best" (the fastest stage) or a stage's name
    size: tuple | None = None  # None: the operator's headline size

    def describe(self, op: Operator) -> str:
        who = {LAST: "last stage", BEST: "best stage"}.get(self.stage, self.stage)
        at = size_label(self.size_of(op))
        if self.kind == "peer":
            peer = {None: "the best peer", EAGER: "the eager peer"}.get(self.peer, self.peer)
            return f"{who} >= {self.at_least:.2f}x {peer} at {at}"
        if self.kind == "stage":
            return f"{who} >= {self.at_least:.2f}x stage {self.peer} at {at}"
        ceiling = (self.ceiling or peak_key(op) or "?").replace("_gbps", "").replace("_gflops", "")
        return f"{who} >= {self.at_least:.0f}% of the {ceiling} ceiling at {at}"

    def size_of(self, op: Operator) -> tuple:
        return as_size(self.size if self.size is not None else op.headline_size)


def against_peer(at_least: float = 1.0, peer: str | None = None, stage: str = LAST, size=None) -> Target:
    return Target("peer", at_least, peer=peer, stage=stage, size=size)


def against_stage(at_least: float, other: str, stage: str = LAST, size=None) -> Target:
    return Target("stage", at_least, peer=other, stage=stage, size=size)


def of_ceiling(percent: float, ceiling: str | None = None, stage: str = LAST, size=None) -> Target:
    if ceiling is not None and not ceiling.endswith(("_gbps", "_gflops")):
        raise ValueError(f"of_ceiling: a ceiling is a key of the recorded peaks (read_gbps, copy_gbps, "
                         f"gemm_fp16_gflops, ...); got {ceiling!r}")
    return Target("ceiling", percent, ceiling=ceiling, stage=stage, size=size)


@dataclass
class Verdict:
    op: str
    target: str
    status: str  # met, missed or never measured
    unit: str  # "x": a speed ratio over a peer; "%": a share of a ceiling
    value: float | None = None  # the ratio or the percentage the record gives
    at_least: float | None = None
    stage: str | None = None  # the stage record judged
    peer: str | None = None  # the peer (or the ceiling) it was compared with
    date: str | None = None  # the stage record's date
    why: str = ""  # what was missing, for "never measured"

    def as_dict(self) -> dict:
        return asdict(self)


def _stage_record(stages: list[dict], which: str) -> dict | None:
    if not stages:
        return None
    if which == LAST:
        return max(stages, key=lambda r: r["order"])
    if which == BEST:
        return min(stages, key=lambda r: r["median_us"])
    return next((r for r in stages if r["stage"] == which), None)


def _is_peer(name: str, pattern: str | None) -> bool:
    if pattern is None:
        return True
    if pattern == EAGER:
        return name != COMPILED_NAME
    return fnmatch.fnmatch(name, pattern)


def judge(op: Operator, target: Target, data: dict | None) -> Verdict:
    """One target against one results file (None: nothing recorded)."""
    verdict = Verdict(op.name, target.describe(op), NEVER, "%" if target.kind == "ceiling" else "x",
                      at_least=target.at_least)
    size = list(target.size_of(op))
    recs = [r for r in (data or {}).get("records", []) if r["op"] == op.name and r["size"] == size]
    stage = _stage_record([r for r in recs if r.get("kind") == "stage"], target.stage)
    if stage is None:
        verdict.why = f"no record of the {target.stage} stage at {size_label(tuple(size))}"
        return verdict
    verdict.stage, verdict.date = stage["stage"], stage["date"]
    if target.kind == "stage":
        other = _stage_record([r for r in recs if r.get("kind") == "stage"], target.peer)
        if other is None:
            verdict.why = f"no record of stage {target.peer} at {size_label(tuple(size))}"
            return verdict
        verdict.peer, verdict.value = other["stage"], other["median_us"] / stage["median_us"]
    elif target.kind == "peer":
        peers = [r for r in recs if r.get("kind") == "peer" and _is_peer(r["stage"], target.peer)]
        if not peers:
            verdict.why = f"no record of {target.peer or 'any peer'} at {size_label(tuple(size))}"
            return verdict
        peer = min(peers, key=lambda r: r["median_us"])
        verdict.peer, verdict.value = peer["stage"], peer["median_us"] / stage["median_us"]
    else:
        peaks = (data or {}).get("peaks") or {}
        key = target.ceiling or peak_key(op, peaks)
        if not peaks.get(key):
            verdict.why = f"no {key} ceiling recorded"
            return verdict
        figure = stage["gbps"] if key.endswith("_gbps") else stage["gflops"]
        verdict.peer, verdict.value = key, 100 * figure / peaks[key]
    verdict.status = MET if verdict.value >= target.at_least else MISSED
    return verdict


def verdicts(ops: list[Operator] | None = None) -> list[Verdict]:
    """Every declared target of ``ops`` (default: every operator) judged on the newest results file that
    holds the operator's records: the function the README's course map and the notebooks call."""
    from . import registry

    ops = list(registry.load_operators().values()) if ops is None else ops
    out = []
    for op in ops:
        data = results.latest_file_with(op.name) if op.targets else None
        out += [judge(op, t, data) for t in op.targets]
    return out
