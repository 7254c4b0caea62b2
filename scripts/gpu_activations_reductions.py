"""One run on an H100/H200 for issue 18 parts 1-2: activations and reductions beyond the sum.

    python scripts/gpu_activations_reductions.py OUT_DIR [--budget 170] [--no-compile]

In this order, each item on its own (a failure is reported and the run goes on):

1. The copy ceiling (``workbench.peaks.copy_bandwidth``): what "% of copy" divides by.
2. (first 70 seconds at most, compiling every kernel on the way) Correctness of every stage of every operator of ``solutions/activations.py`` and
   ``solutions/reductions.py`` at odd sizes and on the operators' adversarial inputs (NaN, +-inf,
   subnormals, all-negative vectors, ...), with ``workbench.check.check_stage`` (float64 reference).
3. Activations at 2^28 float32: every stage, torch eager and ``torch.compile`` (the default inductor
   backend), checked on a million sampled elements against the float64 reference, then timed
   (``workbench.timing.measure``); and each stage's accuracy in ulps on a sweep of 2^20 inputs over
   [-30, 30] (max and 99.99th percentile; ``activations.ulp_error``; torch eager too). Must show: the last stage >= 85%
   of the copy ceiling, at least as fast as torch eager (tests/test_activations.py's target) and at least as
   fast as torch.compile; each must-show line gives torch eager's and torch.compile's GB/s beside ours.
4. The vector reductions at 2^28 (max, min, mean, sum of squares) against torch.amax/amin/mean/dot;
   must show: the last stage >= its torch peer.
5. The matrix sums at 16384 x 16384 over rows and over columns against torch.sum(dim=1/0); must
   show: the column sum's last stage within 1.2x of the row sum's time.

Prints one table per part and the must-show verdicts; writes everything to
``OUT_DIR/gpu_activations_reductions.json``. Stops starting new items when ``--budget`` seconds
(default 170) are spent, and says what it skipped. ``torch.compile`` is given at most 60 seconds of
compilation in all (``--no-compile`` skips it).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_log  # noqa: E402  (scripts/: the folder of the script being run)
from gpu_log import START, say  # noqa: E402

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)
from workbench import peers  # noqa: E402
from workbench.check import adversarial_cases, check_stage, compare, poison_value  # noqa: E402
from workbench.results import environment  # noqa: E402
from workbench.timing import measure  # noqa: E402

from solutions import activations, reductions  # noqa: E402

N = 2**28
MATRIX = (16384, 16384)
SAMPLES = 1 << 20
ODD_VECTOR = [1, 3, 1029, 1_000_003]
ODD_MATRIX = [(1, 1), (3, 5), (37, 1000), (1000, 37), (4097, 4099)]
COMPILE_BUDGET_S = 60.0

RESULTS: dict = {"device": None, "peaks": None, "checks": [], "activations": [], "ulps": [], "vector": [],
                 "matrix": [], "must_show": [], "skipped": [], "errors": []}




attempt = functools.partial(gpu_log.attempt, RESULTS["errors"])  # fn(*args), or None with the error kept


class Budget:
    def __init__(self, seconds: float):
        self.deadline = START + seconds

    def allows(self, what: str) -> bool:
        if time.time() < self.deadline:
            return True
        RESULTS["skipped"].append(what)
        say(f"SKIPPED (budget spent) {what}")
        return False


def timed(fn, *args) -> float:
    return measure(fn, [args], samples=15, budget_s=1.5).median_us


# -- 2. correctness at odd sizes and on adversarial inputs ---------------------------------------------

def check_all(budget: Budget) -> None:
    ops = activations.OPERATORS + reductions.OPERATORS
    for op in ops:
        if not budget.allows(f"odd-size checks of {op.name}"):
            return
        sizes = ODD_MATRIX if len(op.dims) == 2 else ODD_VECTOR
        rng = np.random.default_rng(18)
        for stage in op.stages:
            results = [check_stage(stage, size, rng) for size in sizes]
            mid = sizes[len(sizes) // 2]
            results += [check_stage(stage, mid, inputs=inputs, label=label)
                        for label, inputs in adversarial_cases(op, mid, rng)]
            bad = [r for r in results if not r.passed]
            RESULTS["checks"] += [{"stage": r.key, "size": r.size, "inputs": r.inputs, "status": r.status,
                                   "rel_err": r.rel_err, "message": r.message} for r in results]
            say(f"{'PASS' if not bad else 'FAIL'} {stage.key:34s} {len(results)} checks"
                + "".join(f"\n      {r.size} {r.inputs}: {r.message[:240]}" for r in bad))


# -- 3. activations at 2^28 ------------------------------------------------------------------------------

def torch_compiled(act, torch, spent: list):
    """torch.compile of the activation's torch call, compiled and warmed up now (None past the budget)."""
    if sum(spent) > COMPILE_BUDGET_S:
        return None
    t0 = time.time()
    fn = torch.compile(lambda x: act.torch_call(torch, x), dynamic=False)
    fn(torch.zeros(N, dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    spent.append(time.time() - t0)
    return fn


def fill_poison(t, torch) -> None:
    """Fill a float32 tensor with the checker's poison NaN: an element never written shows as such."""
    t.view(torch.int32).fill_(int(poison_value(np.float32).view(np.int32)))


def ulp_row(op_name, stage_name, got, ref) -> dict:
    ulps = activations.ulp_error(got, ref)
    row = {"op": op_name, "stage": stage_name, "max": float(np.max(ulps)),
           "p9999": float(np.percentile(ulps, 99.99)), "mean": float(np.mean(ulps))}
    RESULTS["ulps"].append(row)
    return row


def activation_rows(act, op, x_sample, index, x_t, out_t, sweep, sweep_out, copy_gbps, torch, spent, with_compile):
    """Check on SAMPLES sampled elements, time, and measure ulps: every stage, torch, torch.compile."""
    from numba import cuda

    ref_sample = op.reference(x_sample)
    sweep_ref = op.reference(sweep.copy_to_host())
    x_nb, out_nb = cuda.as_cuda_array(x_t), cuda.as_cuda_array(out_t)
    rows = []

    def record(name, call, args, tolerance, returns):
        fill_poison(out_t, torch)
        got = call(*args)
        torch.cuda.synchronize()
        result = got if returns else out_t
        r = compare(f"{op.name}.{name}", (N,), result[index].cpu().numpy(), ref_sample, tolerance)
        us = timed(call, *args)
        gbps = 8 * N / us / 1e3
        rows.append({"op": op.name, "stage": name, "us": us, "gbps": gbps, "pct_copy": 100 * gbps / copy_gbps,
                     "passed": r.passed, "rel_err": r.rel_err, "message": r.message})

    for stage in op.stages:
        tolerance = stage.tolerance if stage.tolerance is not None else op.tolerance_for((N,), np.float32)
        stage(x_nb, out_nb)  # checks the arguments once; what is timed is the launcher, as the bench does
        record(stage.name, stage.launch, (x_nb, out_nb), tolerance, returns=False)
        stage(sweep, sweep_out)
        ulp_row(op.name, stage.name, sweep_out.copy_to_host(), sweep_ref)
    default_tolerance = op.tolerance_for((N,), np.float32)
    record("torch", lambda a: act.torch_call(torch, a), (x_t,), default_tolerance, returns=True)
    ulp_row(op.name, "torch", act.torch_call(torch, torch.as_tensor(sweep, device="cuda")).cpu().numpy(), sweep_ref)
    if with_compile:
        compiled = attempt(f"torch.compile {op.name}", torch_compiled, act, torch, spent)
        if compiled is not None:
            record("torch.compile", compiled, (x_t,), default_tolerance, returns=True)
    return rows


def run_activations(budget: Budget, copy_gbps: float, with_compile: bool) -> None:
    import torch
    from numba import cuda

    gen = torch.Generator(device="cuda").manual_seed(18)
    x = torch.randn(N, generator=gen, device="cuda", dtype=torch.float32) * 3.0
    out = torch.empty_like(x)
    index = torch.randint(0, N, (SAMPLES,), generator=gen, device="cuda")
    x_sample = x[index].cpu().numpy()
    sweep = cuda.to_device(np.linspace(-30.0, 30.0, SAMPLES, dtype=np.float32))
    sweep_out = cuda.device_array(SAMPLES, np.float32)
    spent: list = []
    for act, op in zip(activations.ACTIVATIONS, activations.OPERATORS):
        if not budget.allows(f"activations at 2^28: {op.name}"):
            return
        rows = attempt(op.name, activation_rows, act, op, x_sample, index, x, out, sweep, sweep_out, copy_gbps,
                       torch, spent, with_compile)
        for row in rows or []:
            RESULTS["activations"].append(row)
            ulp = next((u for u in RESULTS["ulps"] if u["op"] == op.name and u["stage"] == row["stage"]), None)
            ulp_text = f"max {ulp['max']:9.3g} ulp, p99.99 {ulp['p9999']:7.3g}" if ulp else ""
            say(f"{'PASS' if row['passed'] else 'FAIL'} {op.name:16s} {row['stage']:19s} {row['us']:8.1f} us "
                f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}% copy  {ulp_text}")
        by = {r["stage"]: r for r in rows or []}
        last = op.stages[-1].name
        if last in by:
            ours = by[last]["gbps"]
            peers_text = ", ".join(f"{p} {by[p]['gbps']:.0f}" for p in ("torch", "torch.compile") if p in by)
            beside = f" [ours {ours:.0f} GB/s; {peers_text} GB/s]"
            verdict = {"what": f"{op.name}: {last} >= 85% of copy{beside}", "value": by[last]["pct_copy"],
                       "ok": by[last]["pct_copy"] >= 85.0}
            RESULTS["must_show"].append(verdict)
            for peer in ("torch", "torch.compile"):  # torch: the target tests/test_activations.py asserts
                if peer in by:
                    ratio = by[peer]["us"] / by[last]["us"]
                    label = "torch eager" if peer == "torch" else peer
                    RESULTS["must_show"].append({"what": f"{op.name}: {last} >= {label} (time ratio){beside}",
                                                 "value": ratio, "ok": ratio >= 1.0})


# -- 4. vector reductions at 2^28 --------------------------------------------------------------------------

def run_vector(budget: Budget, copy_gbps: float) -> None:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(19)
    x = torch.rand(N, generator=gen, device="cuda", dtype=torch.float32) * 3.0 - 1.0
    x64 = x.double()
    truth = {"max": x64.max(), "min": x64.min(), "mean": x64.mean(), "sumsq": (x64 * x64).sum()}
    del x64
    from numba import cuda

    out_t = torch.empty(1, dtype=torch.float32, device="cuda")
    x, out = cuda.as_cuda_array(x), cuda.as_cuda_array(out_t)
    for op in reductions.OPERATORS[:4]:
        kind = op.name.removeprefix("reduce_")
        if not budget.allows(f"vector reductions at 2^28: {op.name}"):
            return
        ref = np.array([float(truth[kind])])
        name, peer = op.peer((N,))
        rows = {}
        for label, call in [*((s.name, s.launch) for s in op.stages), (name, peer)]:
            fill_poison(out_t, torch)
            call(x, out)
            torch.cuda.synchronize()
            r = compare(f"{op.name}.{label}", (N,), out_t.cpu().numpy(), ref, op.tolerance_for((N,), np.float32))
            us = timed(call, x, out)
            row = {"op": op.name, "stage": label, "us": us, "gbps": 4 * N / us / 1e3, "passed": r.passed,
                   "rel_err": r.rel_err, "message": r.message}
            rows[label] = row
            RESULTS["vector"].append(row)
            say(f"{'PASS' if r.passed else 'FAIL'} {op.name:14s} {label:18s} {us:8.1f} us {row['gbps']:7.0f} GB/s "
                f"({100 * row['gbps'] / copy_gbps:5.1f}% of copy) rel err {r.rel_err:.2g}")
        last = op.stages[-1].name
        ratio = rows[name]["us"] / rows[last]["us"]
        RESULTS["must_show"].append({"what": f"{op.name}: {last} >= {name} (time ratio)", "value": ratio,
                                     "ok": ratio >= 1.0})


# -- 5. matrix sums at 16384 x 16384 -------------------------------------------------------------------------

def run_matrix(budget: Budget, copy_gbps: float) -> None:
    import torch

    if not budget.allows("matrix sums at 16384x16384"):
        return
    from numba import cuda

    gen = torch.Generator(device="cuda").manual_seed(20)
    x_t = torch.rand(MATRIX, generator=gen, device="cuda", dtype=torch.float32) * 3.0 - 1.0
    x = cuda.as_cuda_array(x_t)
    last_us = {}
    for op in reductions.OPERATORS[4:]:
        dim = 1 if op.name == "sum_rows" else 0
        ref = x_t.double().sum(dim=dim).cpu().numpy()
        out_t = torch.empty(MATRIX[1 - dim], dtype=torch.float32, device="cuda")
        out = cuda.as_cuda_array(out_t)
        name, peer = op.peer(MATRIX)
        for label, call in [*((s.name, s.launch) for s in op.stages), (name, peer)]:
            fill_poison(out_t, torch)
            call(x, out)
            torch.cuda.synchronize()
            r = compare(f"{op.name}.{label}", MATRIX, out_t.cpu().numpy(), ref, op.tolerance_for(MATRIX, np.float32))
            us = timed(call, x, out)
            gbps = 4 * MATRIX[0] * MATRIX[1] / us / 1e3
            RESULTS["matrix"].append({"op": op.name, "stage": label, "us": us, "gbps": gbps, "passed": r.passed,
                                      "rel_err": r.rel_err, "message": r.message})
            say(f"{'PASS' if r.passed else 'FAIL'} {op.name:9s} {label:18s} {us:8.1f} us {gbps:7.0f} GB/s "
                f"({100 * gbps / copy_gbps:5.1f}% of copy) rel err {r.rel_err:.2g}")
            if label == op.stages[-1].name:
                last_us[op.name] = us
    if len(last_us) == 2:
        ratio = last_us["sum_cols"] / last_us["sum_rows"]
        RESULTS["must_show"].append({"what": "sum_cols.row_bands time / sum_rows.warp_per_row time <= 1.2",
                                     "value": ratio, "ok": ratio <= 1.2})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--budget", type=float, default=170.0)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    if workbench.MODE != "gpu" or peers.torch() is None:
        print("needs a CUDA GPU and torch")
        return 2
    env = environment()
    RESULTS["device"] = env
    say(f"device: {env.get('device')}")
    from workbench.peaks import copy_bandwidth

    peaks = attempt("copy ceiling", copy_bandwidth) or {}
    RESULTS["peaks"] = peaks
    copy_gbps = peaks.get("copy_gbps") or float("nan")
    say(f"copy ceiling {copy_gbps:.0f} GB/s")
    attempt("odd sizes and adversarial inputs", check_all, Budget(min(args.budget, 70.0)))
    attempt("activations", run_activations, budget, copy_gbps, not args.no_compile)
    attempt("vector reductions", run_vector, budget, copy_gbps)
    attempt("matrix sums", run_matrix, budget, copy_gbps)

    print("\nmust show:")
    for m in RESULTS["must_show"]:
        print(f"  {'OK  ' if m['ok'] else 'MISS'} {m['what']}: {m['value']:.3f}")
    print("\nulps against float64, sweep of [-30, 30] (max / p99.99):")
    for u in RESULTS["ulps"]:
        print(f"  {u['op']:16s} {u['stage']:19s} {u['max']:10.3g} / {u['p9999']:8.3g}")
    if RESULTS["skipped"]:
        print("skipped:", "; ".join(RESULTS["skipped"]))
    path = args.out_dir / "gpu_activations_reductions.json"
    path.write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"wrote {path} in {time.time() - START:.0f} s; {len(RESULTS['errors'])} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
