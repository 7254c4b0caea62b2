"""One run on an H100/H200 that checks and times every low-precision GEMM stage (issue 12).

    python scripts/gpu_low_precision.py [--budget 240] [--quick]

In this order, each item on its own (a failure is reported and the run goes on):

1. ``set_max_dynamic_shared_memory``: a 100 KiB dynamic shared-memory launch sums correctly after the
   opt-in; 228 KiB is refused naming the limit.
2. Correctness of every stage of hgemm (fp16), hgemm_bf16, int8_gemm, qlinear and gemm's two TF32
   tensor-core stages, against a float64 (int64) reference: at odd shapes (M, N, K not multiples of
   any tile, K not a multiple of 16; K odd takes the kernels' scalar copy path), and at 8192^3 on 256
   sampled rows. One line per stage and size: the relative error (norm), the tolerance, PASS/FAIL.
3. Speed at 8192^3 (workbench.timing.measure: CUDA events, warm-up, median): every stage, and the
   peers in the same run: cuBLAS through torch.matmul at fp16 and bf16, torch._int_mm, torch.addmm
   in TF32. TFLOP/s (TOPS for int8) and the fraction of the peer.
4. The quantized linear layer's error against the float32 layer x Wᵀ (float64 reference), next to
   its speed and cuBLAS fp16's error on the same layer.

Everything goes to ``$OUT/gpu_low_precision.json`` (``$OUT`` unset: the current directory). The
run stops starting new items when ``--budget`` seconds (default 240) are spent; what it skipped says
so. Kernel compilation is most of the time: a first run compiles about 40 kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)
from workbench import device  # noqa: E402
from workbench.check import check_stage, compare  # noqa: E402
from workbench.launch import SharedMemoryError, set_max_dynamic_shared_memory  # noqa: E402
from workbench.timing import measure  # noqa: E402
from workbench.ladder import to_device, to_host  # noqa: E402

from solutions import gemm, hgemm, int8_gemm  # noqa: E402

HEADLINE = (8192, 8192, 8192)
ODD_SIZES = [(33, 40, 24), (200, 264, 168), (127, 129, 131), (4097, 1000, 336)]
SAMPLED_ROWS = 256
ROW_INPUTS = {"gemm": (0, 2)}  # which inputs are indexed by the output's row (default: the first)

RESULTS = {"device": None, "checks": [], "timings": [], "qlinear_error": None, "launch": None, "errors": []}
START = time.time()


def say(line):
    print(f"[{time.time() - START:6.1f}s] {line}", flush=True)


class Budget:
    def __init__(self, seconds):
        self.deadline = START + seconds

    def left(self):
        return self.deadline - time.time()


def attempt(what, fn):
    """Run one item; report (never raise) a failure."""
    try:
        return fn()
    except Exception as exc:  # keep going: one broken stage must not hide the others
        say(f"ERROR {what}: {type(exc).__name__}: {exc}")
        RESULTS["errors"].append({"item": what, "error": f"{type(exc).__name__}: {exc}",
                                  "traceback": traceback.format_exc()[-3000:]})
        return None


# -- 1. dynamic shared memory --------------------------------------------------------------------------

def check_launch():
    from numba import cuda, float32

    @cuda.jit
    def fill_and_sum(out):
        smem = cuda.shared.array(0, float32)
        n = 100 * 1024 // 4
        for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
            smem[i] = float32(1.0)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            total = float32(0.0)
            for i in range(n):
                total += smem[i]
            out[0] = total

    out = cuda.device_array(1, np.float32)
    set_max_dynamic_shared_memory(fill_and_sum, (out,), 100 * 1024)
    fill_and_sum[1, 256, 0, 100 * 1024](out)
    total = float(out.copy_to_host()[0])
    try:
        set_max_dynamic_shared_memory(fill_and_sum, (out,), 228 * 1024)
        refused = "NOT refused"
    except SharedMemoryError as exc:
        refused = str(exc)
    ok = total == 100 * 1024 / 4 and refused != "NOT refused"
    RESULTS["launch"] = {"sum": total, "expected": 100 * 1024 / 4, "over_limit": refused, "passed": ok}
    say(f"{'PASS' if ok else 'FAIL'} set_max_dynamic_shared_memory: 100 KiB launch summed {total:.0f} "
        f"(want {100 * 1024 // 4}); 228 KiB: {refused}")


# -- 2. correctness ---------------------------------------------------------------------------------------

def record_check(stage, size, rel_err, tolerance, passed, message=""):
    RESULTS["checks"].append({"stage": stage.key, "size": list(size), "rel_err": rel_err, "tolerance": tolerance,
                              "passed": passed, "message": message})
    err = "n/a" if rel_err is None else f"{rel_err:.3g}"
    say(f"{'PASS' if passed else 'FAIL'} {stage.key:28s} {'x'.join(map(str, size)):>16s}  rel err {err}  "
        f"(tol {tolerance:.1g}) {message[:200]}")


def check_odd(stage):
    for size in ODD_SIZES:
        r = check_stage(stage, size, np.random.default_rng(7))
        record_check(stage, size, r.rel_err, r.tolerance or 0.0, r.passed, "" if r.passed else r.message)


def headline_inputs(op, rng):
    """Device inputs at 8192^3 and the float64 reference of SAMPLED_ROWS rows of the output."""
    from numba import cuda

    host = op.make_inputs(HEADLINE, rng)
    rows = np.sort(rng.choice(HEADLINE[0], SAMPLED_ROWS, replace=False))
    by_row = ROW_INPUTS.get(op.name, (0,))  # the inputs with one row per output row (A; gemm's C too)
    sampled = tuple(a[rows] if i in by_row else a for i, a in enumerate(host))
    ref = np.asarray(op.reference(*sampled), np.float64)
    return [to_device(a) for a in host], rows, ref


def check_headline(stage, device_inputs, rows, ref):
    from numba import cuda

    op = stage.op
    out = cuda.device_array(op.make_output(HEADLINE).shape, op.make_output(HEADLINE).dtype)
    stage(*device_inputs, out)
    cuda.synchronize()
    got = to_host(out)[rows]
    tol = stage.tolerance if stage.tolerance is not None else op.tolerance_for(HEADLINE, stage.dtype)
    r = compare(stage.key, HEADLINE, got, ref if np.issubdtype(got.dtype, np.floating) or got.dtype.kind == "V"
                else ref.astype(np.int64), tol)
    record_check(stage, HEADLINE, r.rel_err, tol, r.passed, "sampled rows" + ("" if r.passed else ": " + r.message))
    return out


# -- 3. speed ---------------------------------------------------------------------------------------------

def time_call(label, fn, args, flops, peer_of=None, kind="stage"):
    t = measure(fn, [tuple(args)], samples=10, budget_s=1.5)
    rate = flops / (t.median_us * 1e-6) / 1e12
    row = {"label": label, "kind": kind, "median_us": t.median_us, "tflops": rate, "samples": t.samples}
    RESULTS["timings"].append(row)
    say(f"TIME {label:34s} {t.median_us:10.1f} us  {rate:7.1f} TFLOP/s")
    return row


def peer_call(op):
    return op.peer(HEADLINE) if op.peer else None


def ladder(op, budget, skip_stages=()):
    """Check (odd sizes, 8192^3) and time every stage of op, then its peer, in one run."""
    if device.is_simulator():
        raise RuntimeError("no GPU: this script measures an H100/H200")
    rng = np.random.default_rng(3)
    device_inputs, rows, ref = headline_inputs(op, rng)
    flops = op.flops(HEADLINE)
    stage_rows = []
    for stage in op.stages:
        if stage.name in skip_stages:
            continue
        if budget.left() < 10:
            say(f"SKIP {stage.key}: out of time")
            RESULTS["errors"].append({"item": stage.key, "error": "skipped: out of time"})
            continue
        attempt(f"{stage.key} odd sizes", lambda: check_odd(stage))
        out = attempt(f"{stage.key} at 8192^3", lambda: check_headline(stage, device_inputs, rows, ref))
        if out is not None:
            row = attempt(f"{stage.key} timing", lambda: time_call(stage.key, stage, device_inputs + [out], flops))
            if row:
                stage_rows.append(row)
    made = attempt(f"{op.name} peer", lambda: peer_call(op))
    if made:
        name, fn = made
        from numba import cuda

        out = cuda.device_array(op.make_output(HEADLINE).shape, op.make_output(HEADLINE).dtype)
        peer = attempt(f"{op.name} peer timing", lambda: time_call(f"{op.name}: {name}", fn, device_inputs + [out], flops,
                                                                   kind="peer"))
        if peer:
            for row in stage_rows:
                row["of_peer"] = row["tflops"] / peer["tflops"]
                say(f"     {row['label']:34s} {100 * row['of_peer']:5.1f}% of {name}")
    for a, b in zip(stage_rows, stage_rows[1:]):
        if b["median_us"] >= a["median_us"]:
            say(f"NOTE {b['label']} is not faster than {a['label']}")


# -- 4. the quantized layer's error ------------------------------------------------------------------------

def qlinear_error():
    from numba import cuda

    torch = __import__("torch") if __import__("importlib").util.find_spec("torch") else None
    M, N, K = HEADLINE
    rng = np.random.default_rng(9)
    x = rng.standard_normal((M, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    Wq, w_scale = int8_gemm.quantize_rows_reference(W)
    rows = np.sort(rng.choice(M, SAMPLED_ROWS, replace=False))
    exact = x[rows].astype(np.float64) @ W.astype(np.float64).T  # the float32 layer, in float64
    out = cuda.device_array((M, N), np.float32)
    args = [to_device(a) for a in (x, Wq, w_scale)] + [out]
    int8_gemm.qlinear_op["fused"](*args)
    cuda.synchronize()
    y = to_host(out)[rows]
    err = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    report = {"int8_rel_err_vs_fp32": err, "sampled_rows": SAMPLED_ROWS}
    if torch is not None:
        xh = torch.as_tensor(x, device="cuda").half()
        wh = torch.as_tensor(W, device="cuda").half()
        yh = (xh @ wh.t()).float().cpu().numpy()[rows]
        report["fp16_rel_err_vs_fp32"] = float(np.linalg.norm(yh - exact) / np.linalg.norm(exact))
    RESULTS["qlinear_error"] = report
    say(f"QLINEAR error against the float32 layer at {M}x{N}x{K}: int8 {err:.3g}"
        + (f", cuBLAS fp16 {report['fp16_rel_err_vs_fp32']:.3g}" if "fp16_rel_err_vs_fp32" in report else ""))


def tf32_pair(budget):
    """gemm's TF32 tensor-core stage with two buffers and with four, checked and timed together."""
    from numba import cuda

    op = gemm.op
    rng = np.random.default_rng(4)
    device_inputs, rows, ref = headline_inputs(op, rng)
    flops = op.flops(HEADLINE)
    for name in ("tensor_core", "tensor_core_deep"):
        if budget.left() < 10:
            say(f"SKIP gemm.{name}: out of time")
            continue
        stage = op[name]
        attempt(f"{stage.key} odd sizes", lambda: check_odd(stage))
        out = attempt(f"{stage.key} at 8192^3", lambda: check_headline(stage, device_inputs, rows, ref))
        if out is not None:
            attempt(f"{stage.key} timing", lambda: time_call(stage.key, stage, device_inputs + [out], flops))
    made = op.peer(HEADLINE) if op.peer else None
    torch = __import__("torch") if made else None
    if torch is not None:
        A, B, C, ab = device_inputs
        out = cuda.device_array((HEADLINE[0], HEADLINE[1]), np.float32)

        def tf32(A, B, C, ab, out):
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.matmul(torch.as_tensor(A, device="cuda"), torch.as_tensor(B, device="cuda"),
                         out=torch.as_tensor(out, device="cuda"))

        attempt("cuBLAS TF32 timing", lambda: time_call("gemm: torch.matmul (TF32)", tf32, [A, B, C, ab, out], flops,
                                                        kind="peer"))
        torch.backends.cuda.matmul.allow_tf32 = False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=240.0, help="seconds after which no new item starts")
    parser.add_argument("--quick", action="store_true", help="fp16 hgemm and int8 only (no bf16, qlinear, TF32)")
    args = parser.parse_args(argv)
    budget = Budget(args.budget)
    if device.is_simulator():
        print("No CUDA GPU here: this script checks and times the low-precision GEMMs on an H100/H200.")
        return 2
    from numba import cuda

    RESULTS["device"] = cuda.get_current_device().name.decode() if isinstance(
        cuda.get_current_device().name, bytes) else str(cuda.get_current_device().name)
    say(f"device: {RESULTS['device']}")
    attempt("set_max_dynamic_shared_memory", check_launch)
    attempt("hgemm", lambda: ladder(hgemm.op, budget))
    attempt("int8_gemm", lambda: ladder(int8_gemm.op, budget))
    if not args.quick:
        attempt("qlinear", lambda: ladder(int8_gemm.qlinear_op, budget))
        attempt("qlinear error", qlinear_error)
        attempt("gemm TF32", lambda: tf32_pair(budget))
        if hgemm.bf16_op is not None:
            attempt("hgemm_bf16", lambda: ladder(hgemm.bf16_op, budget, skip_stages=("mma", "ldmatrix")))
    failed = [c for c in RESULTS["checks"] if not c["passed"]]
    RESULTS["elapsed_s"] = time.time() - START
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_low_precision.json"
    path.write_text(json.dumps(RESULTS, indent=1, default=float))
    say(f"{len(RESULTS['checks']) - len(failed)} of {len(RESULTS['checks'])} checks passed, "
        f"{len(RESULTS['errors'])} errors; wrote {path}")
    return 1 if failed or RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
