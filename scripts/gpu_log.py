"""What every ``scripts/gpu_*.py`` run prints and keeps: lines stamped with the seconds since the run
began, and items that fail without hiding the others (each failure printed and kept with its traceback
for the run's JSON); and the check-then-time loop the family scripts share (``out`` is the run's JSON)."""

from __future__ import annotations

import time
import traceback

import numpy as np

from workbench import results
from workbench.bench import bench_size
from workbench.check import adversarial_cases, check_stage
from workbench.ladder import as_size, size_label

START = time.time()


def say(line: str) -> None:
    print(f"[{time.time() - START:6.1f}s] {line}", flush=True)


def attempt(errors: list, what: str, fn, *args):
    """``fn(*args)``, or None after printing the error and appending it to ``errors``."""
    try:
        return fn(*args)
    except Exception as exc:  # one broken item must not hide the others
        say(f"ERROR {what}: {type(exc).__name__}: {exc}")
        errors.append({"item": what, "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()[-3000:]})
        return None


def check_operator(out, op, deadline):
    """Every stage at the operator's check sizes but the largest (random inputs and the first adversarial
    set), a line each, appended to out["checks"]; items past the deadline to out["skipped"]."""
    sizes = [as_size(s) for s in op.check_sizes]
    sizes = sizes[:-1] if len(sizes) > 3 else sizes  # the largest is checked by the timing below
    rng = np.random.default_rng(14)
    for stage in op.stages:
        for size in sizes:
            if time.time() > deadline:
                out["skipped"].append(f"check {stage.key} @ {size_label(size)}")
                continue
            cases = [("random", None)] + adversarial_cases(op, size, rng)[:1]
            for label, inputs in cases:
                r = check_stage(stage, size, rng, inputs=inputs, label=label)
                out["checks"].append(r.as_dict())
                err = "n/a" if r.rel_err is None else f"{r.rel_err:.2g}"
                say(f"{r.status.upper():7s} {stage.key:34s} {size_label(size):>26s} {label:14s} err {err} "
                    f"(tol {r.tolerance if r.tolerance is not None else 0:.1g}) {r.message[:160]}")



def peaks_and_env(out):
    """(peaks, environment): the stored peaks of this device, the copy bandwidth measured if none is stored."""
    env = results.environment()
    out["device"] = env.get("device")
    peaks = results.stored_peaks(env["device"]) or {}
    if not peaks.get("copy_gbps"):
        from workbench.peaks import copy_bandwidth

        peaks = {**peaks, **copy_bandwidth()}
    out["peaks"] = {k: v for k, v in peaks.items() if isinstance(v, (int, float))}
    say(f"device {env.get('device')}; copy peak {peaks.get('copy_gbps', float('nan')):.0f} GB/s")
    return peaks, env


def time_operator(out, op, sizes, peaks, env, deadline):
    """Every stage and the peer at each size (workbench.bench.bench_size), a line each, into out."""
    rng = np.random.default_rng(7)
    for size in sizes:
        if time.time() > deadline:
            out["skipped"].append(f"time {op.name} @ {size_label(as_size(size))}")
            continue
        recs, fails = bench_size(op, op.stages, size, peaks, rng, env)
        out["records"] += recs
        out["failures"] += fails
        for f in fails:
            say(f"FAIL {f[:300]}")
        for r in recs:
            peer = r.get("peer")
            ratio = f"{peer['median_us'] / r['median_us']:5.2f}x" if peer else "   — "
            pct = r.get("pct_of_peak")
            say(f"{r['stage']:34s} {r['size_label']:>26s} {r['median_us']:9.1f} µs {r['gbps']:7.0f} GB/s "
                f"{r['gflops'] / 1e3:7.2f} TFLOP/s {'' if pct is None else f'{pct:5.1f}% peak'} "
                f"vs torch {ratio} err {r['rel_err']:.2g}")
