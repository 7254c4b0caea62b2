"""Check, then time, each stage of a ladder at each size; turn the times into records.

A stage is timed only after it passed its check on the same inputs at the same size: a fast wrong
kernel gets no figure. Each record carries the device, versions and date, so a figure in the README
or a notebook can always say where it came from.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import library_peers
from .check import compare, poison_like
from .ladder import Operator, Size, Stage, as_size, fill_from_host, size_label, to_device, to_host
from .results import now
from . import timing as _timing_module
from .timing import Timing, rotation_count


def rotating_arg_sets(inputs: tuple, out_template: np.ndarray, l2_bytes: int | None,
                      max_sets: int = 64) -> list[tuple]:
    """Device copies of (inputs..., poisoned output), enough of them that cycling through the sets
    touches at least three L2 caches' worth of memory (see timing.rotation_count)."""
    host = [np.ascontiguousarray(a) for a in inputs]
    bytes_per_set = sum(a.nbytes for a in host) + out_template.nbytes
    n_sets = rotation_count(bytes_per_set, l2_bytes or 60 << 20, max_sets=max_sets)
    return [tuple(to_device(a) for a in host) + (to_device(poison_like(out_template)),)
            for _ in range(n_sets)]


# The measured peak "% of peak" divides by: for a memory-bound operator, the bandwidth of the stream
# its `pattern` names (read only, copy, two reads per write), or the copy bandwidth where a results file
# has no measure of that stream (files recorded before `workbench peaks` measured all three); for a
# compute-bound one, the library GEMM at its precision (bf16 against cuBLAS's fp16 rate, which
# `workbench peaks` measures; there is no int8 peak yet).
PATTERN_PEAK = {"read": "read_gbps", "copy": "copy_gbps", "read2_write1": "read2_write1_gbps"}
COMPUTE_PEAK = {"float32": "gemm_fp32_gflops", "tf32": "gemm_tf32_gflops", "float16": "gemm_fp16_gflops",
                "bfloat16": "gemm_fp16_gflops"}


def stage_precision(op: Operator, stage: str | None) -> str | None:
    """The precision stage ``stage`` (a name) of ``op`` declares for its arithmetic, if any (``Stage.precision``)."""
    found = next((s for s in op.stages if s.name == stage), None) if stage else None
    return found.precision if found else None


def peak_key(op: Operator, peaks: dict | None = None, stage: str | None = None) -> str | None:
    """The key in a results file's ``peaks`` that this operator's "% of peak" is a fraction of (for its
    stage ``stage`` where it names one computing in another precision: TF32's rate for a TF32 stage).
    Without ``peaks``, the key it would ideally use; with them, falling back to copy_gbps where its own
    pattern's ceiling was never measured."""
    if op.bound == "compute":
        return COMPUTE_PEAK.get(stage_precision(op, stage) or np.dtype(op.compute_dtype or op.dtype).name)
    own = PATTERN_PEAK[op.pattern]
    return own if peaks is None or peaks.get(own) else "copy_gbps"


def percent_of_peak(op: Operator, gbps: float, gflops: float, peaks: dict, stage: str | None = None) -> float | None:
    key = peak_key(op, peaks, stage)
    if not key or not peaks.get(key):
        return None
    return 100 * (gbps if key in PATTERN_PEAK.values() else gflops) / peaks[key]


def _figures(op: Operator, size: Size, timing: Timing, traffic: int, peaks: dict, stage: str | None = None) -> dict:
    bytes_min = int(op.bytes_moved(size))
    flops = int(op.flops(size))
    gbps = bytes_min / timing.median_us / 1e3
    gflops = flops / timing.median_us / 1e3
    pct = percent_of_peak(op, gbps, gflops, peaks, stage)
    peak_kind = peak_key(op, peaks, stage) if pct is not None else None
    return {
        **timing.as_dict(),
        "bytes": bytes_min, "stage_bytes": int(traffic), "flops": flops,
        "gbps": gbps, "stage_gbps": traffic / timing.median_us / 1e3, "gflops": gflops,
        "pct_of_peak": pct, "peak_kind": peak_kind,
    }


def peer_launches(op: Operator, size: Size, with_compile: bool) -> list[tuple[str, Callable]]:
    """The libraries a size is compared with, as (name, launch): the operator's own peer (eager torch,
    else CuPy) first, then its torch expression under torch.compile where it gives one, then its other
    peers (cuda.compute's algorithm) where installed. Records keep
    this order, so the first peer record is still the eager one that the GPU tests' targets name."""
    found = [op.peer(size) if op.peer else None, library_peers.compiled_peer(op, size) if with_compile else None,
             *(op.other_peers(size) if op.other_peers else [])]
    return [p for p in found if p is not None]


def strongest_peer(peer_records: list[dict]) -> dict | None:
    """The summary a stage record carries of the fastest peer (lowest median): its name and figures."""
    if not peer_records:
        return None
    best = min(peer_records, key=lambda r: r["median_us"])
    summary = {k: best[k] for k in ("median_us", "gbps", "gflops", "host_call_us")}
    return {"name": best["stage"], **summary}


def first_call(launch: Callable, args: tuple):
    """The call whose output is checked before timing (it compiles the kernels, too), synchronized. A
    function of its own so that the GPU suite can hold the GPU shared around it (tests/conftest.py): a
    naive stage's first call at the headline size runs for up to half a second, and must not run while
    another worker measures."""
    from numba import cuda

    returned = launch(*args)
    cuda.synchronize()
    return returned


def measure(fn: Callable, arg_sets: list) -> Timing:
    """``workbench.timing.measure``, looked up at each call: the GPU suite wraps it so that each
    measurement holds the GPU alone (tests/conftest.py)."""
    return _timing_module.measure(fn, arg_sets)


def bench_size(op: Operator, stages: list[Stage], size, peaks: dict, rng: np.random.Generator,
               env: dict, progress: Callable[[str], None] | None = None, with_peer: bool = True,
               with_compile: bool = False, verify: bool = True) -> tuple[list[dict], list[str]]:
    """Records for every stage and every peer at one size, and a list of failures. Each stage record's
    ``peer`` is the strongest peer's summary. ``with_compile`` adds the torch.compile peer (`workbench
    bench` does, unless --no-compile): off by default, so that the GPU tests and scripts that call this
    keep comparing with the eager peer alone and pay no compilation. ``verify=False`` times without
    checking each output against the float64 reference first: only for a caller that has checked every
    stage at this size already (the GPU suite's timing tests, whose checks run beforehand in parallel);
    its records carry ``rel_err`` None."""
    from numba import cuda

    size = as_size(size)
    inputs = op.make_inputs(size, rng)
    ref = op.reference(*inputs) if verify else None
    out_template = op.make_output(size)
    arg_sets = rotating_arg_sets(inputs, out_template, env.get("l2_bytes"))
    n_sets = len(arg_sets)
    bytes_per_set = sum(a.nbytes for a in inputs) + out_template.nbytes
    base = {"device": env["device"], "versions": env, "date": now(), "op": op.name, "size": list(size),
            "size_label": size_label(size), "dtype": np.dtype(op.dtype).name,
            "rotation_sets": n_sets, "working_set_bytes": n_sets * bytes_per_set}
    records, failures = [], []

    def check_and_time(name: str, launch: Callable, tol: float, traffic: int, stage: str | None = None) -> dict | None:
        d_out = arg_sets[0][-1]
        fill_from_host(d_out, poison_like(out_template))
        returned = first_call(launch, arg_sets[0])
        # A peer with no out= (torch.nn.functional.layer_norm, ...) may allocate and return its result
        # instead, marked by a `returns_output` attribute: copying into out would time a second pass.
        if getattr(launch, "returns_output", False):
            got = library_peers.to_host(returned)
        else:
            got = to_host(d_out)
        rel_err = None
        if verify:
            result = compare(name, size, got, ref, tol)
            if not result.passed:
                failures.append(f"{name} @ {size_label(size)}: {result.message}")
                return None
            rel_err = result.rel_err
        timing = measure(launch, arg_sets)
        if 2 * timing.starved_samples > timing.samples:
            failures.append(f"{name} @ {size_label(size)}: the GPU waited for Python in {timing.starved_samples} of "
                            f"{timing.samples} samples (each call {timing.host_call_us:.0f} us on the host): a time "
                            "of the host, not of the kernels; not recorded")
            return None
        return {**base, "rel_err": rel_err, **_figures(op, size, timing, traffic, peaks, stage)}

    peer_records = []
    for name, launch in (peer_launches(op, size, with_compile) if with_peer else []):
        if progress:
            progress(f"{op.name} · {name} @ {size_label(size)}")
        try:
            rec = check_and_time(name, launch, op.tolerance_for(size, op.dtype), int(op.bytes_moved(size)))
        except Exception as exc:  # torch.compile that cannot compile the expression, ...: one line, no crash
            failures.append(f"{name} @ {size_label(size)}: {type(exc).__name__}: "
                            f"{(str(exc).strip().splitlines() or [''])[0][:300]}")
            continue
        if rec is not None:
            rec.update(stage=name, order=0, kind="peer")
            records.append(rec)
            peer_records.append(rec)
    peer_summary = strongest_peer(peer_records)
    for stage in stages:
        if progress:
            progress(f"{stage.key} @ {size_label(size)}")
        tol = stage.tolerance if stage.tolerance is not None else op.tolerance_for(size, stage.dtype)
        rec = check_and_time(stage.key, stage.launch, tol, stage.traffic(size), stage.name)
        if rec is not None:
            rec.update(stage=stage.name, order=stage.order, kind="stage", summary=stage.summary, peer=peer_summary)
            records.append(rec)
    library_peers.clear_views()  # the views keep this size's buffers alive
    return records, failures



def alternate(op: Operator, stages: list[Stage], size, peaks: dict, rng: np.random.Generator, env: dict,
              rounds: int = 3, progress: Callable[[str], None] | None = None) -> tuple[dict[str, list[dict]], list[str]]:
    """An A/B comparison: each stage checked and timed in turn, ``rounds`` times (A B A B ...), in one
    process on the same GPU, so that a drift of the machine (clocks, a neighbour) falls on both. Each
    stage is checked against the float64 reference in the first round; later rounds only time it (at a
    headline size the reference and the comparison take seconds of host time a round). Returns each
    stage's records by name, and the failures."""
    by_stage: dict[str, list[dict]] = {s.name: [] for s in stages}
    failures: list[str] = []
    for round_ in range(rounds):
        if failures:  # a stage that failed its check is not timed again
            break
        for stage in stages:
            if progress:
                progress(f"round {round_ + 1}/{rounds}: {stage.key} @ {size_label(as_size(size))}")
            recs, fails = bench_size(op, [stage], size, peaks, rng, env, with_peer=False, verify=round_ == 0)
            by_stage[stage.name] += recs
            failures += fails
    return by_stage, failures


def middle_record(recs: list[dict]) -> dict:
    """Of several rounds' records of one stage, the one with the median time, its spread widened to the
    rounds' (the lowest p10 and highest p90): what an A/B compares."""
    ordered = sorted(recs, key=lambda r: r["median_us"])
    middle = dict(ordered[len(ordered) // 2])
    middle["p10_us"] = min(r["p10_us"] for r in recs)
    middle["p90_us"] = max(r["p90_us"] for r in recs)
    return middle
