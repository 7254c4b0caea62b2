"""One run on an H100/H200 for issue 12 item 2: the fp16/bf16 softmax, LayerNorm and RMSNorm at the ceiling.

    python scripts/gpu_half_norms.py OUT_DIR [--budget 170] [--no-compile]

In this order, each item on its own (a failure is reported and the run goes on):

1. The copy ceiling (``workbench.peaks.copy_bandwidth``): what "% of copy" divides by.
2. (at most 60 s, compiling every kernel on the way) Every stage of the six norm operators and the two
   GELU operators at odd sizes (columns not a multiple of 8, rows of 32768 columns and of 32776, past
   what the in_registers kernels hold, which take the rows_in_flight kernel) and on the adversarial
   inputs, against the float64 reference (``workbench.check.check_stage``).
3. At 32768 x 4096: every stage of each norm operator, torch eager at the dtype and torch.compile of the
   operator's torch expression, checked on 256 sampled rows against float64 and timed
   (``workbench.timing.measure``, 10 samples). One table per operator: us, GB/s, % of copy, x torch,
   x torch.compile. Must show: the last stage >= 85% of copy and >= 1.2x torch at the dtype.
4. Diagnostics at 32768 x 4096, each operator's in_registers kernel (a stage of RMSNorm only; for softmax
   and LayerNorm the candidate ``h.softmax_in_registers``/``h.layernorm_in_registers``, slower than
   rows_in_flight in the first H200 run) next to the ladder's last stage: as it is, with the output
   rounded by integer operations (two conversions a word) instead of cvt.rn.{f16,bf16}x2.f32, and with
   the registers capped at 48 and 40 a thread (more groups resident per multiprocessor: the occupancy
   explanation of the stage's paragraph), and with 8 or 16 vectors a thread (64 or 32 threads a 4096-column
   row: fewer threads, so fewer registers a row, more rows resident), from a copy of the module with
   CHUNKS changed (LayerNorm's CHUNKS 8 and 16 kernels keep the held words in local memory, ld.local in
   their sm_90 PTX, where softmax's stay in registers: 87 and 130 a thread). A variant faster than rows_in_flight says the stage can come back for softmax/LayerNorm
   in that form; every variant is checked against float64 before it is timed. Order: softmax and
   LayerNorm first (the open question), RMSNorm last.
5. GELU(x + bias) + residual fp16/bf16 at 16384 x 16384: every stage, torch, torch.compile.

Writes ``OUT_DIR/gpu_half_norms.json``. Stops starting new items when ``--budget`` seconds (default 130)
are spent, and says what it skipped (about 150 s in all on an H200); torch.compile gets at most 60 s of compilation in all.
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
from workbench.check import adversarial_cases, check_stage, compare  # noqa: E402
from workbench.ladder import to_device, to_host  # noqa: E402
from workbench.results import environment  # noqa: E402
from workbench.timing import measure  # noqa: E402

from solutions import half_norms as h  # noqa: E402

HEADLINE = (32768, 4096)
GELU_SIZE = (16384, 16384)
ODD = [(3, 5), (37, 1000), (301, 1001), (5, 32768), (2, 32776)]
SAMPLED_ROWS = 256
COMPILE_BUDGET_S = 60.0
NORMS = ["layernorm_bf16", "layernorm_fp16", "softmax_bf16", "rmsnorm_bf16", "rmsnorm_fp16", "softmax_fp16"]
OPS = {op.name: op for op in h.OPERATORS}

HEADLINES: dict = {}  # op name -> its Headline at 32768 x 4096, made once (inputs on the device)
RESULTS: dict = {"device": None, "peaks": None, "checks": [], "timings": [], "diagnostics": [], "must_show": [],
                 "registers": {}, "skipped": [], "errors": []}
attempt = functools.partial(gpu_log.attempt, RESULTS["errors"])


class Budget:
    def __init__(self, seconds: float):
        self.deadline = START + seconds

    def allows(self, what: str) -> bool:
        if time.time() < self.deadline:
            return True
        RESULTS["skipped"].append(what)
        say(f"SKIPPED (budget spent) {what}")
        return False


def timed(fn, args) -> float:
    return measure(fn, [tuple(args)], samples=10, budget_s=0.8).median_us


# -- 2. correctness at odd sizes ------------------------------------------------------------------------

def check_all(budget: Budget) -> None:
    for op in h.OPERATORS:
        if not budget.allows(f"odd-size checks of {op.name}"):
            return
        rng = np.random.default_rng(12)
        for stage in op.stages:
            results = [check_stage(stage, size, rng) for size in ODD]
            results += [check_stage(stage, (37, 1000), inputs=inputs, label=label)
                        for label, inputs in adversarial_cases(op, (37, 1000), rng)]
            bad = [r for r in results if not r.passed]
            RESULTS["checks"] += [{"stage": r.key, "size": r.size, "inputs": r.inputs, "status": r.status,
                                   "rel_err": r.rel_err, "message": r.message} for r in results]
            say(f"{'PASS' if not bad else 'FAIL'} {stage.key:34s} {len(results)} checks"
                + "".join(f"\n      {r.size} {r.inputs}: {r.message[:240]}" for r in bad))


# -- 3. the headline: every stage, torch, torch.compile --------------------------------------------------

class Headline:
    """One operator's inputs at a size on the device and the float64 reference of sampled rows."""

    def __init__(self, op, size):
        self.op, self.size = op, size
        rng = np.random.default_rng(5)
        host = op.make_inputs(size, rng)
        self.rows = np.sort(rng.choice(size[0], SAMPLED_ROWS, replace=False))
        sampled = (host[0][self.rows],) + tuple(a[self.rows] if a.ndim == 2 else a for a in host[1:])
        self.ref = np.asarray(op.reference(*sampled), np.float64)
        self.inputs = [to_device(a) for a in host]
        template = op.make_output(size)
        self.out = to_device(template)  # (bf16 included: to_device copies through the 16-bit pattern)
        self.bytes = op.bytes_moved(size)
        self.tol = h.TOLERANCE[np.dtype(op.dtype).name]

    def check(self, name, launch) -> bool:
        from numba import cuda

        returned = launch(*self.inputs, self.out)
        cuda.synchronize()
        got = peers.to_host(returned) if getattr(launch, "returns_output", False) else to_host(self.out)
        result = compare(name, self.size, np.asarray(got)[self.rows], self.ref, self.tol)
        if not result.passed:
            say(f"FAIL {name} at {self.size}: {result.message[:300]}")
        return result.passed

    def row(self, name, launch, kind, copy_gbps) -> dict | None:
        if not self.check(name, launch):
            RESULTS["timings"].append({"op": self.op.name, "name": name, "kind": kind, "passed": False})
            return None
        us = timed(launch, self.inputs + [self.out])
        gbps = self.bytes / (us * 1e-6) / 1e9
        rec = {"op": self.op.name, "size": list(self.size), "name": name, "kind": kind, "passed": True,
               "median_us": us, "gbps": gbps, "pct_of_copy": 100 * gbps / copy_gbps}
        RESULTS["timings"].append(rec)
        return rec


def compiled_launch(op, size, torch, spent):
    if sum(spent) > COMPILE_BUDGET_S:
        say(f"torch.compile of {op.name} skipped: {COMPILE_BUDGET_S:.0f} s of compilation spent")
        return None
    made = peers.compiled_peer(op, size)
    return made[1] if made else None


def run_operator(op, size, copy_gbps, torch, spent, with_compile, must_show) -> None:
    bench = HEADLINES[op.name] = Headline(op, size)
    rows = []
    made = op.peer(size) if op.peer else None
    eager = bench.row("torch", made[1], "peer", copy_gbps) if made else None
    compiled = None
    if with_compile:
        launch = compiled_launch(op, size, torch, spent)
        if launch is not None:
            t0 = time.time()
            ok = attempt(f"torch.compile {op.name}", bench.check, "torch.compile", launch)
            spent.append(time.time() - t0)
            if ok:
                compiled = bench.row("torch.compile", launch, "peer", copy_gbps)
    for stage in op.stages:
        rec = attempt(f"{stage.key} at {size}", bench.row, stage.name, stage.launch, "stage", copy_gbps)
        if rec:
            rows.append(rec)
    say(f"{op.name} at {size[0]}x{size[1]} (copy ceiling {copy_gbps:.0f} GB/s)")
    for rec in [r for r in (eager, compiled) if r] + rows:
        vs = "".join(f"  x{p['median_us'] / rec['median_us']:5.2f} {p['name']}" for p in (eager, compiled)
                     if p and rec["kind"] == "stage")
        say(f"   {rec['name']:16s} {rec['median_us']:8.1f} us {rec['gbps']:7.0f} GB/s {rec['pct_of_copy']:5.1f}%{vs}")
        if rec["kind"] == "stage":
            rec.update({f"x_{p['name']}": p["median_us"] / rec["median_us"] for p in (eager, compiled) if p})
    if must_show and rows:
        last = rows[-1]
        RESULTS["must_show"].append({"what": f"{op.name}.{last['name']} % of copy >= 85", "value": last["pct_of_copy"],
                                     "ok": last["pct_of_copy"] >= 85.0})
        if eager:
            x = eager["median_us"] / last["median_us"]
            RESULTS["must_show"].append({"what": f"{op.name}.{last['name']} x torch >= 1.2", "value": x, "ok": x >= 1.2})
        if compiled:
            x = compiled["median_us"] / last["median_us"]
            RESULTS["must_show"].append({"what": f"{op.name}.{last['name']} x torch.compile (>= 1 wins)", "value": x,
                                         "ok": x >= 1.0})


# -- 4. diagnostics: what each idea of the in_registers stage is worth ------------------------------------

def registers_of(kernel) -> int | None:
    try:
        return min(kernel.get_regs_per_thread().values()) if kernel.overloads else None
    except Exception:  # an older numba-cuda: no register query
        return None


def variant_kernels(name, max_registers=None, integer_rounding=False):
    """The operator's in_registers kernel rebuilt from its row function: integer rounding (two
    conversions a word) instead of the paired cvt, and/or a register cap."""
    from numba import cuda

    jit = cuda.jit(max_registers=max_registers) if max_registers else cuda.jit
    bf16 = name.endswith("bf16")
    widen, narrow = (h.bf16_to_float, h.float_to_bf16) if bf16 else (h.f16_to_float, h.float_to_f16)
    pair = (h.narrow_pair_bf16 if bf16 else h.narrow_pair_f16) if integer_rounding else (
        h.cvt_pair_bf16 if bf16 else h.cvt_pair_f16)
    if name.startswith("softmax"):
        @jit
        def kernel(x16, x32, out16, out32, rows, cols, threads):
            h.softmax_registers_row(x16, x32, out16, out32, rows, cols, threads, widen, narrow, pair)

        def launch(x, out):
            rows, cols = x.shape
            threads = h.registers_threads(cols)
            blocks, block = h.registers_grid(rows, threads)
            kernel[blocks, block](h.flat_bits16(x), h.words(x), h.flat_bits16(out), h.words(out), rows, cols, threads)
    elif name.startswith("layernorm"):
        @jit
        def kernel(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads):
            h.layernorm_registers_row(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads, widen,
                                      narrow, pair)

        def launch(x, w, b, out):
            rows, cols = x.shape
            threads = h.registers_threads(cols)
            blocks, block = h.registers_grid(rows, threads)
            kernel[blocks, block](h.flat_bits16(x), h.words(x), h.bits16(w), h.words(w), h.bits16(b), h.words(b),
                                  h.flat_bits16(out), h.words(out), rows, cols, threads)
    else:
        @jit
        def kernel(x16, x32, w16, w32, out16, out32, rows, cols, threads):
            h.rmsnorm_registers_row(x16, x32, w16, w32, out16, out32, rows, cols, threads, widen, narrow, pair)

        def launch(x, w, out):
            rows, cols = x.shape
            threads = h.registers_threads(cols)
            blocks, block = h.registers_grid(rows, threads)
            kernel[blocks, block](h.flat_bits16(x), h.words(x), h.bits16(w), h.words(w), h.flat_bits16(out),
                                  h.words(out), rows, cols, threads)
    return kernel, launch


CANDIDATES = {"softmax": "softmax_in_registers", "layernorm": "layernorm_in_registers"}  # not stages
LAUNCHERS = {"softmax": "softmax_in_registers", "layernorm": "layernorm_in_registers", "rmsnorm": "rmsnorm_in_registers"}
DIAGNOSED = ["softmax_fp16", "layernorm_fp16", "softmax_bf16", "layernorm_bf16", "rmsnorm_fp16", "rmsnorm_bf16"]


@functools.lru_cache(maxsize=None)
def module_with_chunks(chunks: int):
    """A second copy of solutions/half_norms.py whose in_registers kernels hold ``chunks`` 16-byte vectors a
    thread (CHUNKS; 4 in the module): 8 puts a 4096-column row on 64 threads, 16 on one warp. numba reads
    the module's globals when it compiles, so setting them before the first launch is enough."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"half_norms_chunks{chunks}", h.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.CHUNKS, module.HELD = chunks, 4 * chunks
    return module


def registers_kernel(module, name):
    """The in_registers kernel of operator ``name`` (softmax_fp16 -> _softmax_registers_f16) in ``module``."""
    kind, fmt = name.split("_")
    return getattr(module, f"_{kind}_registers_{fmt.replace('fp', 'f')}")


def chunk_variant(name, chunks):
    module = module_with_chunks(chunks)
    return registers_kernel(module, name), getattr(module, LAUNCHERS[name.split("_")[0]])


def run_diagnostics(budget, copy_gbps) -> None:
    for name in DIAGNOSED:
        if not budget.allows(f"diagnostics of {name}"):
            return
        op = OPS[name]
        kind = name.split("_")[0]
        bench = HEADLINES.get(name) or Headline(op, HEADLINE)
        last = op.stages[-1]
        ladder = attempt(f"{last.key}", bench.row, last.name, last.launch, "diagnostic", copy_gbps)
        candidate = CANDIDATES.get(kind)
        base = ladder if candidate is None else attempt(
            f"{name} in_registers candidate", bench.row, "in_registers (not a stage)", getattr(h, candidate),
            "diagnostic", copy_gbps)
        say(f"DIAG {name:15s} {last.name + ' (last stage)':34s} {ladder['median_us'] if ladder else float('nan'):8.1f} us")
        if candidate is not None and base:
            say(f"DIAG {name:15s} {'in_registers (not a stage)':34s} {base['median_us']:8.1f} us "
                f"{base['pct_of_copy']:5.1f}% of copy, {registers_of(registers_kernel(h, name))} registers")
        variants = [("integer rounding", functools.partial(variant_kernels, name, integer_rounding=True)),
                    ("64 threads a row (CHUNKS 8)", functools.partial(chunk_variant, name, 8)),
                    ("32 threads a row (CHUNKS 16)", functools.partial(chunk_variant, name, 16))]
        if candidate is not None:  # the occupancy explanation: fewer registers, more rows resident
            variants += [("max 48 registers", functools.partial(variant_kernels, name, max_registers=48)),
                         ("max 40 registers", functools.partial(variant_kernels, name, max_registers=40))]
        for label, make in variants:
            made = attempt(f"{name} {label}", make)
            if made is None:
                continue
            kernel, launch = made
            rec = attempt(f"{name} {label}", bench.row, f"in_registers, {label}", launch, "diagnostic", copy_gbps)
            if rec:
                rec["registers"] = registers_of(kernel)
                rec["op"] = name
                RESULTS["diagnostics"].append(rec)
                refs = [ladder] if candidate is None else [ladder, base]
                vs = "".join(f"  x{r['median_us'] / rec['median_us']:5.2f} {r['name']}" for r in refs if r)
                say(f"DIAG {name:15s} {label:34s} {rec['median_us']:8.1f} us "
                    f"{rec['pct_of_copy']:5.1f}% of copy, {rec['registers']} registers{vs}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--budget", type=float, default=130.0)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    torch = peers.torch()
    if workbench.MODE != "gpu" or torch is None:
        print("needs a CUDA GPU and torch")
        return 2
    RESULTS["device"] = environment()
    say(f"device: {RESULTS['device'].get('device')}")
    from workbench.peaks import copy_bandwidth

    peaks = attempt("copy ceiling", copy_bandwidth) or {}
    RESULTS["peaks"] = peaks
    copy_gbps = peaks.get("copy_gbps") or float("nan")
    say(f"copy ceiling {copy_gbps:.0f} GB/s")
    attempt("odd sizes and adversarial inputs", check_all, Budget(min(args.budget, 60.0)))
    spent: list = []
    for name in NORMS:
        if budget.allows(f"{name} at {HEADLINE}"):
            attempt(name, run_operator, OPS[name], HEADLINE, copy_gbps, torch, spent, not args.no_compile, True)
    attempt("diagnostics", run_diagnostics, budget, copy_gbps)
    for name in NORMS:  # (softmax's and LayerNorm's compiled only if the diagnostics launched them)
        RESULTS["registers"][name] = registers_of(registers_kernel(h, name))
    say(f"in_registers kernels' registers per thread: {RESULTS['registers']}")
    for name in ("gelu_bf16", "gelu_fp16"):
        if budget.allows(f"{name} at {GELU_SIZE}"):
            attempt(name, run_operator, OPS[name], GELU_SIZE, copy_gbps, torch, spent, not args.no_compile, False)

    print("\nmust show (issue 12, at 32768x4096):")
    for m in RESULTS["must_show"]:
        print(f"  {'OK  ' if m['ok'] else 'MISS'} {m['what']}: {m['value']:.3f}")
    failed = [c for c in RESULTS["checks"] if c["status"] not in ("passed", "skipped")]
    print(f"odd-size checks: {len(RESULTS['checks']) - len(failed)} of {len(RESULTS['checks'])} passed")
    if RESULTS["skipped"]:
        print("skipped:", "; ".join(RESULTS["skipped"]))
    path = args.out_dir / "gpu_half_norms.json"
    path.write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"wrote {path} in {time.time() - START:.0f} s; {len(RESULTS['errors'])} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
