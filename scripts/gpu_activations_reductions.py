"""One run on an H100/H200 for issue 18, round 2: the activations' last stages beside torch and torch.compile.

    python scripts/gpu_activations_reductions.py OUT_DIR [--budget 145] [--no-compile] [--all]

Round 2 changed two things (solutions/activations.py): the 16-bit GELU (erf form) has a new last stage,
``short_erfc`` (libdevice's erfcf replaced by a degree-9 Chebyshev erfc, 1.2e-7 relative), and the
in_flight kernels take their block size from the launch (blockDim), 512 threads for every function but
the float32 GELU (128), where round 1 launched 256 everywhere. What this run shows, in this order:

1. The copy ceiling (``workbench.peaks.copy_bandwidth``).
2. (at most 30 seconds) the changed stages (16-bit GELU's short_erfc first, then in_flight/fast_math of
   the 16-bit GELU, SiLU, ReLU and of the seven float32 functions) at odd sizes and on their adversarial
   inputs (float64 reference).
3. Old and new side by side at 2^28 elements: each last-stage kernel launched with 128, 256 and 512
   threads (marked "round-1 last" where it is what round 1 measured as the last stage, "now" where it is
   the geometry the stage launches now), the last stage through its launcher, torch eager at the dtype and
   torch.compile, each checked on a million sampled elements; for the 16-bit GELUs the ulps of the format
   over all 65536 inputs of fast_math and short_erfc. Order: GELU fp16/bf16, SiLU fp16, ReLU bf16/fp16,
   SiLU bf16, then the float32 functions. Must show: each last stage >= torch eager and torch.compile
   (time ratios, with the round-1 figure beside it); and the fastest block size per operator.
4. (``--all``) round 1's parts: every 16-bit stage with ulps, the matrix reductions at 16384 x 16384, the
   threads sweep, the float32 ladder with ulps on [-30, 30], the vector reductions.

Writes ``OUT_DIR/gpu_activations_reductions.json``. Stops starting new items when ``--budget`` seconds
(default 145) are spent and says what it skipped. torch.compile is given at most 30 seconds of
compiling per part (``--no-compile`` skips it).
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
                 "matrix": [], "half": [], "tuning": [], "must_show": [], "skipped": [], "errors": [],
           "round2": [], "best_geometry": []}
COMPILE_SPENT = {"half": [], "matrix": [], "float32": []}  # seconds torch.compile took, by part




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

NEW_MATRIX = [op for op in reductions.OPERATORS if op.name.endswith(("_rows", "_cols")) and not op.name.startswith("sum")]


def check_all(budget: Budget, everything: bool) -> None:
    """Round 2: the stages it changed (16-bit GELU's short_erfc, every in_flight/fast_math block size) first."""
    changed = [activations.BY_NAME[n] for n in ROUND2_HALF] + activations.FLOAT32_OPERATORS
    ops = changed + (activations.HALF_OPERATORS + NEW_MATRIX if everything else [])
    if everything:
        ops += [op for op in activations.OPERATORS + reductions.OPERATORS if op not in ops]
    ops = list(dict.fromkeys(ops))
    ops.sort(key=lambda o: o.name not in ("act_gelu_fp16", "act_gelu_bf16"))
    for op in ops:
        if not budget.allows(f"odd-size checks of {op.name}"):
            return
        sizes = ODD_MATRIX if len(op.dims) == 2 else ODD_VECTOR
        rng = np.random.default_rng(18)
        stages = op.stages if everything or op not in changed else [
            s for s in op.stages if s.name in ("in_flight", "fast_math", "short_erfc")]
        for stage in stages:
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

def torch_compiled(expression, example, torch, spent: list, limit_s: float = COMPILE_BUDGET_S):
    """torch.compile of ``expression`` (a function of one tensor), compiled and warmed up on ``example`` now
    (None once ``spent`` adds up to ``limit_s``). Dynamo's caches are reset first: each compiles on its own."""
    if sum(spent) > limit_s:
        RESULTS["skipped"].append(f"torch.compile past {limit_s:.0f} s of compiling")
        return None
    t0 = time.time()
    torch.compiler.reset()
    fn = torch.compile(expression, dynamic=False, fullgraph=True)
    fn(example)
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
        compiled = attempt(f"torch.compile {op.name}", torch_compiled, lambda a: act.torch_call(torch, a),
                           torch.zeros(N, dtype=torch.float32, device="cuda"), torch, COMPILE_SPENT["float32"])
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


# -- 3. fp16 and bf16 activations at 2^28 -----------------------------------------------------------------

def every_pattern(dtype) -> np.ndarray:
    """All 65536 values of a 16-bit format (NaNs and infinities included), for an exhaustive ulp count."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)


def half_rows(op, act, x_t, index, torch, with_compile):
    from numba import cuda

    from workbench.ladder import to_device, to_host

    dtype = op.dtype
    x_sample = x_t[index].float().cpu().numpy().astype(dtype)
    ref_sample = op.reference(x_sample)
    everything = every_pattern(dtype)
    ref_everything = op.reference(everything)
    d_everything = to_device(everything)
    d_everything_out = to_device(np.zeros(everything.size, dtype))
    out_t = torch.empty_like(x_t)
    x_nb, out_nb = cuda.as_cuda_array(x_t.view(torch.int16)), cuda.as_cuda_array(out_t.view(torch.int16))
    x_nb, out_nb = x_nb.view(np.uint16).view(dtype), out_nb.view(np.uint16).view(dtype)
    tolerance = op.tolerance_for((N,), dtype)
    rows = []

    def record(name, call, args, returns, ulps):
        out_t.view(torch.int16).fill_(-1)  # 0xFFFF: a NaN in both formats, so an unwritten element shows
        got = call(*args)
        torch.cuda.synchronize()
        result = got if returns else out_t
        r = compare(f"{op.name}.{name}", (N,), result[index].float().cpu().numpy(), ref_sample, tolerance)
        us = timed(call, *args)
        row = {"op": op.name, "stage": name, "us": us, "gbps": 4 * N / us / 1e3, "passed": r.passed,
               "rel_err": r.rel_err, "message": r.message, **ulps}
        rows.append(row)
        RESULTS["half"].append(row)
        say(f"{'PASS' if r.passed else 'FAIL'} {op.name:20s} {name:14s} {us:8.1f} us {row['gbps']:6.0f} GB/s  "
            f"ulps of {activations.short_name(dtype)} over all 65536 inputs: max {ulps['ulp_max']:.3g}, "
            f"p99.99 {ulps['ulp_p9999']:.3g}")

    def ulps_of(got):
        u = activations.ulp_error(got, ref_everything, dtype)
        finite = np.isfinite(u)
        return {"ulp_max": float(np.max(u)), "ulp_p9999": float(np.percentile(u, 99.99)),
                "ulp_not_finite": int((~finite).sum())}

    for stage in op.stages:
        stage(d_everything, d_everything_out)
        ulps = ulps_of(to_host(d_everything_out))
        stage(x_nb, out_nb)  # checks the arguments once; what is timed is the launcher, as the bench does
        record(stage.name, stage.launch, (x_nb, out_nb), False, ulps)
    torch_everything = torch.as_tensor(everything.view(np.int16), device="cuda").view(x_t.dtype)
    torch_ulps = ulps_of(act.torch_call(torch, torch_everything).float().cpu().numpy())
    record("torch", lambda a: act.torch_call(torch, a), (x_t,), True, torch_ulps)
    if with_compile:
        compiled = attempt(f"torch.compile {op.name}", torch_compiled, lambda a: act.torch_call(torch, a), x_t, torch,
                           COMPILE_SPENT["half"], COMPILE_BUDGET_S / 2)
        if compiled is not None:  # (its ulps are not counted: a second shape would cost a second compilation)
            record("torch.compile", compiled, (x_t,), True, {"ulp_max": float("nan"), "ulp_p9999": float("nan"),
                                                             "ulp_not_finite": 0})
    by = {r["stage"]: r for r in rows}
    last = op.stages[-1].name
    for peer in ("torch", "torch.compile"):
        if peer in by and last in by:
            ratio = by[peer]["us"] / by[last]["us"]
            RESULTS["must_show"].append({
                "what": f"{op.name}: {last} >= {'torch eager' if peer == 'torch' else peer} (time ratio) "
                        f"[ours {by[last]['gbps']:.0f} GB/s, {peer} {by[peer]['gbps']:.0f}]",
                "value": ratio, "ok": ratio >= 1.0})


def run_half(budget: Budget, with_compile: bool) -> None:
    import torch

    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    gen = torch.Generator(device="cuda").manual_seed(21)
    index = torch.randint(0, N, (SAMPLES,), generator=gen, device="cuda")
    acts = {a.name: a for a in activations.ACTIVATIONS}
    # the transcendental ones first: they are where the 16-bit question (arithmetic per byte) is
    order = sorted(activations.HALF_OPERATORS, key=lambda o: ("relu" in o.name, o.name))
    x_by_format = {}
    for op in order:
        if not budget.allows(f"16-bit activations at 2^28: {op.name}"):
            return
        fmt = np.dtype(op.dtype).name
        if fmt not in x_by_format:
            x_by_format.clear()
            x_by_format[fmt] = (torch.randn(N, generator=gen, device="cuda") * 3.0).to(torch_dtype[fmt])
        act = acts[op.name.removeprefix("act_").rsplit("_", 1)[0]]
        attempt(op.name, half_rows, op, act, x_by_format[fmt], index, torch, with_compile)


# -- 4. max, min, mean and sum over rows and columns at 16384 x 16384 ----------------------------------------

def run_matrix_all(budget: Budget, copy_gbps: float, with_compile: bool) -> None:
    import torch
    from numba import cuda

    gen = torch.Generator(device="cuda").manual_seed(20)
    x_t = torch.rand(MATRIX, generator=gen, device="cuda", dtype=torch.float32) * 3.0 - 1.0
    x = cuda.as_cuda_array(x_t)
    x64 = x_t.double()
    last_us = {}
    matrix_ops = [o for o in reductions.OPERATORS if o.name.endswith(("_rows", "_cols"))]
    matrix_ops.sort(key=lambda o: o.name.startswith("sum"))  # the new ones first
    for op in matrix_ops:
        if not budget.allows(f"matrix reductions at 16384x16384: {op.name}"):
            break
        kind, where = op.name.split("_")
        dim = 1 if where == "rows" else 0
        ref = getattr(torch, kind)(x64, dim=dim).cpu().numpy()
        out_t = torch.empty(MATRIX[1 - dim], dtype=torch.float32, device="cuda")
        out = cuda.as_cuda_array(out_t)
        name, peer = op.peer(MATRIX)
        calls = [*((s.name, s.launch, False) for s in op.stages), (name, peer, False)]
        if with_compile and op.torch_expression is not None:
            compiled = attempt(f"torch.compile {op.name}", torch_compiled, op.torch_expression(torch, MATRIX), x_t, torch,
                               COMPILE_SPENT["matrix"], COMPILE_BUDGET_S / 2)
            if compiled is not None:
                calls.append(("torch.compile", lambda a, o, f=compiled: f(x_t), True))
        rows = {}
        for label, call, returns in calls:
            fill_poison(out_t, torch)
            got = call(x, out)
            torch.cuda.synchronize()
            result = got if returns else out_t
            r = compare(f"{op.name}.{label}", MATRIX, result.cpu().numpy(), ref, op.tolerance_for(MATRIX, np.float32))
            us = timed(call, x, out)
            gbps = 4 * MATRIX[0] * MATRIX[1] / us / 1e3
            row = {"op": op.name, "stage": label, "us": us, "gbps": gbps, "passed": r.passed,
                   "rel_err": r.rel_err, "message": r.message}
            rows[label] = row
            RESULTS["matrix"].append(row)
            say(f"{'PASS' if r.passed else 'FAIL'} {op.name:9s} {label:22s} {us:8.1f} us {gbps:7.0f} GB/s "
                f"({100 * gbps / copy_gbps:5.1f}% of copy) rel err {r.rel_err:.2g}")
        last = op.stages[-1].name
        last_us[op.name] = rows[last]["us"]
        for peer_name in (name, "torch.compile"):
            if peer_name in rows:
                ratio = rows[peer_name]["us"] / rows[last]["us"]
                RESULTS["must_show"].append({"what": f"{op.name}: {last} >= {peer_name} (time ratio)",
                                             "value": ratio, "ok": ratio >= 1.0})
    del x64
    for kind in ("sum", "amax", "amin", "mean"):
        if f"{kind}_rows" in last_us and f"{kind}_cols" in last_us:
            ratio = last_us[f"{kind}_cols"] / last_us[f"{kind}_rows"]
            RESULTS["must_show"].append({"what": f"{kind}_cols.row_bands time / {kind}_rows.warp_per_row time <= 1.2",
                                         "value": ratio, "ok": ratio <= 1.2})


# -- round 2: old and new side by side --------------------------------------------------------------------------

THREAD_CHOICES = (128, 256, 512)
ROUND1_THREADS = 256  # the in_flight kernels' block before round 2 (the last GPU run)
ROUND2_HALF = ["act_gelu_fp16", "act_gelu_bf16", "act_silu_fp16", "act_relu_bf16", "act_relu_fp16", "act_silu_bf16"]


def has(op, stage_name: str) -> bool:
    return any(s.name == stage_name for s in op.stages)


def last_kernels(op):
    """(kernel label, compiled kernel, elements a thread, the stage's threads now, was it the last stage in round 1)
    for the kernels behind the op's last stages: what is launched at each block size."""
    A = activations
    if op in A.HALF_OPERATORS:
        tag = op.name.removeprefix("act_")
        rows = []
        if has(op, "fast_math"):
            rows.append(("fast_math", getattr(A, f"_in_flight_halves_{tag}_fast"), A.HALVES_PER_THREAD, A.HALF_THREADS,
                         True))
        else:
            rows.append(("in_flight", getattr(A, f"_in_flight_halves_{tag}"), A.HALVES_PER_THREAD, A.HALF_THREADS, True))
        if has(op, "short_erfc"):
            rows.append(("short_erfc", getattr(A, f"_in_flight_halves_{tag}_short"), A.HALVES_PER_THREAD,
                         A.HALF_THREADS, False))
        return rows
    name = op.name.removeprefix("act_")
    act = next(a for a in A.ACTIVATIONS if a.name == name)
    if has(op, "fast_math"):
        return [("in_flight", getattr(A, f"_in_flight_{name}"), A.IN_FLIGHT_FLOATS, act.threads, False),
                ("fast_math", getattr(A, f"_in_flight_{name}_fast"), A.IN_FLIGHT_FLOATS, act.threads, True)]
    return [("in_flight", getattr(A, f"_in_flight_{name}"), A.IN_FLIGHT_FLOATS, act.threads, True)]


def side_by_side(op, act, x_t, index, torch, with_compile, everything_ulps):
    """Each last-stage kernel at 128/256/512 threads (round 1: 256), the stage as launched now, torch, torch.compile:
    checked on SAMPLES sampled elements and timed; for 16-bit ops with ``everything_ulps``, ulps over all 65536 inputs."""
    from numba import cuda

    from workbench.ladder import blocks_for, to_device, to_host

    half = op in activations.HALF_OPERATORS
    dtype = op.dtype if half else np.dtype(np.float32)
    x_sample = x_t[index].float().cpu().numpy().astype(dtype)
    ref_sample = op.reference(x_sample)
    out_t = torch.empty_like(x_t)
    if half:
        x_bits = cuda.as_cuda_array(x_t.view(torch.int16)).view(np.uint16)
        out_bits = cuda.as_cuda_array(out_t.view(torch.int16)).view(np.uint16)
        x_nb, out_nb = x_bits.view(dtype), out_bits.view(dtype)
        nbytes = 4 * N
    else:
        x_bits, out_bits = x_nb, out_nb = cuda.as_cuda_array(x_t), cuda.as_cuda_array(out_t)
        nbytes = 8 * N
    tolerance = op.tolerance_for((N,), dtype)
    rows = {}

    def record(label, call, args, returns, note=""):
        out_t.view(torch.int16 if half else torch.int32).fill_(-1)  # NaN in every format: an unwritten element shows
        got = call(*args)
        torch.cuda.synchronize()
        result = got if returns else out_t
        r = compare(f"{op.name}.{label}", (N,), result[index].float().cpu().numpy(), ref_sample,
                    op.stages[-1].tolerance or tolerance if label.startswith("fast_math") else tolerance)
        us = timed(call, *args)
        row = {"op": op.name, "what": label, "us": us, "gbps": nbytes / us / 1e3, "passed": r.passed,
               "rel_err": r.rel_err, "message": r.message, "note": note}
        rows[label] = row
        RESULTS["round2"].append(row)
        say(f"{'PASS' if r.passed else 'FAIL'} {op.name:18s} {label:22s} {us:8.1f} us {row['gbps']:6.0f} GB/s {note}")

    for label, kernel, per_thread, now, was_last in last_kernels(op):
        for threads in THREAD_CHOICES:
            grid = blocks_for(N, per_thread * threads)

            def launch(a, o, kernel=kernel, grid=grid, threads=threads):
                kernel[grid, threads](a, o)
            note = " ".join(w for w, c in (("round-1 last", was_last and threads == ROUND1_THREADS),
                                            ("now", threads == now)) if c)
            record(f"{label}@{threads}", launch, (x_bits, out_bits), False, note)
    last = op.stages[-1]
    last(x_nb, out_nb)  # the argument checks once; timed is the launcher
    record(f"stage {last.name}", last.launch, (x_nb, out_nb), False, "the last stage as launched now")
    record("torch", lambda a: act.torch_call(torch, a), (x_t,), True)
    if with_compile:
        compiled = attempt(f"torch.compile {op.name}", torch_compiled, lambda a: act.torch_call(torch, a), x_t, torch,
                           COMPILE_SPENT["half" if half else "float32"], COMPILE_BUDGET_S / 2)
        if compiled is not None:
            record("torch.compile", compiled, (x_t,), True)
    if half and everything_ulps:
        everything = every_pattern(dtype)
        ref = op.reference(everything)
        d_in, d_out = to_device(everything), to_device(np.zeros(everything.size, dtype))
        for stage in op.stages[2:]:
            stage(d_in, d_out)
            u = activations.ulp_error(to_host(d_out), ref, dtype)
            kept = np.abs(ref) >= np.finfo(np.float32).tiny if dtype == activations.BFLOAT16 else np.ones(u.size, bool)
            kept |= (ref == 0) | ~np.isfinite(ref)  # bf16: the fast kernels flush float32 subnormal results
            row = {"op": op.name, "stage": stage.name, "max": float(np.max(u)), "p9999": float(np.percentile(u, 99.99)),
                   "max_without_flushed": float(np.max(u[kept]))}
            RESULTS["ulps"].append(row)
            say(f"     ulps of {activations.short_name(dtype)}, all 65536 inputs, {stage.key}: max {row['max']:.3g} "
                f"(without flushed subnormals {row['max_without_flushed']:.3g}), p99.99 {row['p9999']:.3g}")
    stage_row = rows.get(f"stage {last.name}")
    old = next((r for r in rows.values() if "round-1 last" in r["note"]), None)
    if stage_row:
        for peer in ("torch", "torch.compile"):
            if peer in rows:
                ratio = rows[peer]["us"] / stage_row["us"]
                RESULTS["must_show"].append({
                    "what": f"{op.name}: {last.name} >= {'torch eager' if peer == 'torch' else peer} (time ratio) "
                            f"[now {stage_row['gbps']:.0f} GB/s, round 1 {old['gbps'] if old else float('nan'):.0f}, "
                            f"{peer} {rows[peer]['gbps']:.0f}]", "value": ratio, "ok": ratio >= 1.0})
        best = min((r for k, r in rows.items() if "@" in k), key=lambda r: r["us"])
        RESULTS["best_geometry"].append({"op": op.name, "best": best["what"], "gbps": best["gbps"],
                                         "stage_gbps": stage_row["gbps"]})


def run_round2(budget: Budget, with_compile: bool, float32_too: bool = True) -> None:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(23)
    index = torch.randint(0, N, (SAMPLES,), generator=gen, device="cuda")
    acts = {a.name: a for a in activations.ACTIVATIONS}
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    x32 = torch.randn(N, generator=gen, device="cuda") * 3.0
    xs = {}
    ops = [activations.BY_NAME[n] for n in ROUND2_HALF] + (activations.FLOAT32_OPERATORS if float32_too else [])
    for op in ops:
        if not budget.allows(f"round 2 side by side: {op.name}"):
            return
        fmt = np.dtype(op.dtype).name if op in activations.HALF_OPERATORS else "float32"
        if fmt not in xs:
            xs[fmt] = x32 if fmt == "float32" else x32.to(torch_dtype[fmt])
        name = op.name.removeprefix("act_")
        act = acts[name.rsplit("_", 1)[0] if fmt != "float32" else name]
        attempt(op.name, side_by_side, op, act, xs[fmt], index, torch, with_compile, op.name.startswith("act_gelu_")
                and "tanh" not in op.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--budget", type=float, default=145.0)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--all", action="store_true", help="also what was measured before (float32 activations, "
                        "vector reductions, every operator's odd-size checks)")
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
    attempt("odd sizes and adversarial inputs", check_all, Budget(min(args.budget, 30.0)), args.all)
    attempt("round 2 side by side", run_round2, budget, not args.no_compile)
    if args.all:  # round 1's parts (all measured on 2026-11-23, /work/notes/gpu/act_red.log)
        attempt("16-bit activations", run_half, budget, not args.no_compile)
        attempt("matrix reductions", run_matrix_all, budget, copy_gbps, not args.no_compile)
        attempt("float32 activations", run_activations, budget, copy_gbps, not args.no_compile)
        attempt("vector reductions", run_vector, budget, copy_gbps)

    print("\nmust show:")
    for m in RESULTS["must_show"]:
        print(f"  {'OK  ' if m['ok'] else 'MISS'} {m['what']}: {m['value']:.3f}")
    if RESULTS["round2"]:
        print("\nround 2 side by side at 2^28 (kernel@threads; 'round-1 last' = the last stage as measured before):")
        for r in RESULTS["round2"]:
            print(f"  {r['op']:18s} {r['what']:22s} {r['us']:8.1f} us {r['gbps']:6.0f} GB/s  {r['note']:18s}"
                  f"{'' if r['passed'] else ' FAIL ' + r['message'][:80]}")
        print("\nfastest block size per operator (kernel@threads) vs the last stage as launched now:")
        for b in RESULTS["best_geometry"]:
            print(f"  {b['op']:18s} {b['best']:22s} {b['gbps']:6.0f} GB/s  (stage now {b['stage_gbps']:.0f})")
    print("\n16-bit activations at 2^28 (GB/s; ulps of the format over all 65536 inputs, max / p99.99):")
    for r in RESULTS["half"]:
        print(f"  {r['op']:20s} {r['stage']:14s} {r['us']:8.1f} us {r['gbps']:6.0f} GB/s  "
              f"{r['ulp_max']:8.3g} / {r['ulp_p9999']:8.3g}  {'ok' if r['passed'] else 'FAIL ' + r['message'][:80]}")
    if RESULTS["tuning"]:
        print("\ntuning, in_flight threads per block (GB/s):")
        for r in RESULTS["tuning"]:
            print(f"  {r['activation']:5s} {r['format']:8s} {r['threads']:4d}: {r['gbps']:6.0f}"
                  f"{'' if r['passed'] else '  WRONG'}")
    print("\nulps against float64 (max / p99.99): 16-bit GELU stages over all 65536 inputs; with --all float32 on [-30, 30]:")
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
