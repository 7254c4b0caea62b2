"""One run on an H100/H200 that checks and times convolution's missing pieces (issue 14, session 3):
the fused conv + bias + ReLU (+ residual) epilogue, the transposed convolution, and FFT convolution.

    python scripts/gpu_conv_extra.py OUT_DIR [--budget 140] [--no-compile]

1. Correctness: every stage of conv2d_bias_relu, conv2d_bias_add_relu, conv_transpose2d and conv2d_fft at the
   operators' check sizes but the largest (odd sizes, C and K past the tiles, 3x3/4x4/5x5 filters at
   stride 1-3), random inputs and the adversarial ones (a NaN pixel, a huge bias; a corner impulse),
   against the float64 reference. One line each: PASS/FAIL, relative error, tolerance.
2. Determinism: every conv_transpose2d stage (scatter's atomics; gather, shared_tile, parity_gemm) run
   three times on the same inputs at the headline size; prints whether runs 2 and 3 are bitwise
   identical to run 1.
3. Speed (workbench.bench.bench_size: checked, then timed with CUDA events, inputs rotated past L2) at
   the issue's shapes: N32 C64 56x56 K64 3x3 (and N32 C256 14x14 K256) for the epilogue operators, with
   torch conv2d(bias) + add + relu eager (cuDNN fp32, TF32 off) and torch.compile of the same expression
   at the headline; conv_transpose2d N32 C64 28x28 -> 56x56 K64 4x4 stride 2 pad 1 (and a 3x3 one) with
   torch.conv_transpose2d and its torch.compile.
   conv2d_fft: N8 C3 256x256 images, one output channel, filters R = 3, 5, 7, 9, 11, 15, 21, 31: direct
   against fft (and torch.conv2d at 7, 15 and 31).
   The epilogue side by side (EPILOGUE lines): at N32 C64 56x56 K64 (and N32 C256 14x14 K256 for
   bias_relu), interleaved in rounds on the same inputs: conv2d's implicit GEMM alone (the floor),
   fused_epilogue (biases read once a thread), the fused kernel with the bias read at every store,
   unfused, and our implicit GEMM followed by torch's bias (+ residual) add and ReLU; each checked
   first; prints each one's µs over the floor (what the epilogue costs inside the kernel).
4. The targets: fused_epilogue against unfused (the must-show), each against eager torch and
   torch.compile, and against our implicit GEMM followed by torch's epilogue; the transposed conv's
   stages against each other and torch, and whether its last stage (parity_gemm) is the fastest; the
   smallest filter size from which the FFT stage beats direct (the must-show names it).

Everything goes to OUT_DIR/gpu_conv_extra.json. New items stop starting when --budget seconds are
spent (the default keeps the run under 3 minutes on an H200); what was skipped is listed.
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
from workbench import results  # noqa: E402
from workbench.bench import bench_size  # noqa: E402
from workbench.check import adversarial_cases, check_stage  # noqa: E402
from workbench.ladder import as_size, size_label, to_device, to_host  # noqa: E402

from solutions import conv, conv_fft, conv_transpose  # noqa: E402

OPS = [conv.bias_relu_op, conv.bias_add_relu_op, conv_transpose.op, conv_fft.op]
FFT_SWEEP = [3, 5, 7, 9, 11, 15, 21, 31]  # filter sizes R at N8 C3 256x256
OUT = {"device": None, "checks": [], "determinism": {}, "records": [], "failures": [], "errors": [],
       "skipped": [], "targets": {}}

attempt = functools.partial(gpu_log.attempt, OUT["errors"])


def check_operator(op, deadline):
    sizes = [as_size(s) for s in op.check_sizes][:-1]  # the largest is checked by the timing below
    rng = np.random.default_rng(14)
    for stage in op.stages:
        for size in sizes:
            if time.time() > deadline:
                OUT["skipped"].append(f"check {stage.key} @ {size_label(size)}")
                continue
            for label, inputs in [("random", None)] + adversarial_cases(op, size, rng)[:1]:
                r = check_stage(stage, size, rng, inputs=inputs, label=label)
                OUT["checks"].append(r.as_dict())
                err = "n/a" if r.rel_err is None else f"{r.rel_err:.2g}"
                say(f"{r.status.upper():7s} {stage.key:36s} {size_label(size):>22s} {label:22s} err {err} "
                    f"(tol {r.tolerance if r.tolerance is not None else 0:.1g}) {r.message[:160]}")


def determinism():
    from numba import cuda

    op = conv_transpose.op
    size = as_size(op.headline_size)
    inputs = [to_device(a) for a in op.make_inputs(size, np.random.default_rng(5))]
    out = to_device(op.make_output(size))
    for name in [stage.name for stage in op.stages]:
        first = None
        same = []
        for _ in range(3):
            op[name](*inputs, out)
            cuda.synchronize()
            got = to_host(out)
            if first is None:
                first = got
            else:
                same.append(bool(np.array_equal(got.view(np.uint32), first.view(np.uint32))))
        OUT["determinism"][name] = same
        say(f"DETERMINISM conv_transpose2d.{name} @ {size_label(size)}: runs 2 and 3 bitwise equal to run 1: {same}")


def peaks_and_env():
    env = results.environment()
    OUT["device"] = env.get("device")
    return (results.stored_peaks(env["device"]) or {}), env


def fft_sweep(peaks, env, deadline):
    rows = []
    for R in FFT_SWEEP:
        size = (8, 3, 256, 256, R)
        if time.time() > deadline:
            OUT["skipped"].append(f"fft sweep R={R}")
            continue
        with_peer = R in (7, 15, 31)
        recs, fails = bench_size(conv_fft.op, conv_fft.op.stages, size, peaks, np.random.default_rng(R), env,
                                 with_peer=with_peer)
        OUT["records"] += recs
        OUT["failures"] += fails
        for f in fails:
            say(f"FAIL {f[:300]}")
        t = {r["stage"]: r["median_us"] for r in recs}
        rows.append({"R": R, **t})
        torch_us = next((v for k, v in t.items() if k not in ("direct", "fft")), None)
        say(f"FFT SWEEP R={R:2d}: direct {t.get('direct', float('nan')):9.1f} µs  fft {t.get('fft', float('nan')):9.1f} µs"
            + (f"  torch {torch_us:9.1f} µs" if torch_us else ""))
    OUT["fft_sweep"] = rows
    measured = [r["R"] for r in rows if "fft" in r and "direct" in r]
    wins = [r["R"] for r in rows if r["R"] in measured and r["fft"] < r["direct"]]
    first = next((R for R in measured if all(q in wins for q in measured if q >= R)), None)  # and every larger R
    OUT["targets"]["conv2d_fft crossover"] = {"fft_wins_at": wins, "fft_wins_from_R": first}
    say(f"TARGET conv2d_fft @ 8x3x256x256: fft beats direct at R = {wins}; from R = {first} on")


EPILOGUE_ROUNDS = {(32, 64, 56, 56, 64): 3, (32, 256, 14, 14, 256): 2}


def epilogue_side_by_side(env, deadline):
    """What the epilogue costs inside the kernel, and which way of writing it is cheaper, in one run. At
    each shape, on the same rotated inputs, interleaved in rounds (so drift hits all alike): conv2d's
    implicit GEMM alone (no epilogue: the floor), fused_epilogue (the stage: biases read once a thread,
    the residual flag compiled in), the per-store variant (the bias read at each of a thread's 64
    stores: the morning's kernel but with the flag compiled in), unfused, and our implicit GEMM followed
    by torch's bias (+ residual) add and ReLU (the must-show read literally). Each checked once against
    the float64 reference first; the median of the rounds' medians is reported."""
    from workbench import peers
    from workbench.bench import rotating_arg_sets
    from workbench.check import compare
    from workbench.timing import measure

    torch = peers.torch()
    for op in (conv.bias_relu_op, conv.bias_add_relu_op):
        add = "add" in op.name
        for size, rounds in EPILOGUE_ROUNDS.items():
            if add and size != as_size(op.headline_size):
                continue  # the second shape for bias_relu only (the budget)
            if time.time() > deadline:
                OUT["skipped"].append(f"epilogue side by side {op.name} @ {size_label(size)}")
                continue
            inputs = op.make_inputs(size, np.random.default_rng(7))
            arg_sets = rotating_arg_sets(inputs, op.make_output(size), env.get("l2_bytes"))

            def ours_then_torch(x, w, bias, *rest):
                *residual, out = rest
                conv.implicit_gemm.launch(x, w, out)  # the launcher, unchecked, as the bench times stages
                o = peers.as_torch(out)
                o.add_(peers.as_torch(bias).view(1, -1, 1, 1))
                if residual:
                    o.add_(peers.as_torch(residual[0]))
                o.relu_()

            variants = {
                "conv only (implicit_gemm, no epilogue)": lambda x, w, bias, *rest: conv.implicit_gemm.launch(x, w, rest[-1]),
                "fused_epilogue (bias once a thread)": op["fused_epilogue"].launch,
                "fused, bias at every store": conv.epilogue_variant(bias_once=False, add_residual=add),
                "unfused": op["unfused"].launch,
            }
            if torch is not None:
                variants["our implicit_gemm + torch epilogue"] = ours_then_torch
            reference = op.reference(*inputs)
            checks = {}
            for name, fn in variants.items():
                if name.startswith("conv only"):
                    continue  # no epilogue: not this operator's output
                fn(*arg_sets[0])
                r = compare(name, size, to_host(arg_sets[0][-1]), reference, op.tolerance_for(size, np.float32))
                checks[name] = r.passed
                if not r.passed:
                    say(f"FAIL {op.name} {name} @ {size_label(size)}: {r.message[:200]}")
            times = {name: [] for name in variants}
            for _ in range(rounds):
                for name, fn in variants.items():
                    times[name].append(measure(fn, arg_sets, samples=10, budget_s=0.8).median_us)
            med = {name: float(np.median(v)) for name, v in times.items()}
            floor = med["conv only (implicit_gemm, no epilogue)"]
            for name, us in med.items():
                extra = "" if name.startswith("conv only") else f"  (+{us - floor:6.1f} µs over conv only)"
                say(f"EPILOGUE {op.name} @ {size_label(size)}: {name:40s} {us:8.1f} µs "
                    f"[rounds {', '.join(f'{t:.1f}' for t in times[name])}]{extra}")
            fused = med["fused_epilogue (bias once a thread)"]
            row = {"median_us": med, "rounds_us": times, "checks": checks,
                   "fused_vs_unfused": med["unfused"] / fused,
                   "bias_once_vs_per_store": med["fused, bias at every store"] / fused}
            line = (f"TARGET {op.name} @ {size_label(size)} side by side: fused_epilogue {fused:.1f} µs, "
                    f"{med['unfused'] / fused:.3f}x unfused, {row['bias_once_vs_per_store']:.3f}x the per-store "
                    f"variant, epilogue's cost in the kernel {fused - floor:+.1f} µs")
            if "our implicit_gemm + torch epilogue" in med:
                row["fused_vs_ours_then_torch"] = med["our implicit_gemm + torch epilogue"] / fused
                line += f", {row['fused_vs_ours_then_torch']:.3f}x our conv + torch's epilogue"
            OUT["targets"][f"{op.name} @ {size_label(size)} side by side"] = row
            say(line)
            peers.clear_views()


def time_operator(op, size, peaks, env, deadline, with_compile):
    if time.time() > deadline:
        OUT["skipped"].append(f"time {op.name} @ {size_label(as_size(size))}")
        return
    t0 = time.time()
    recs, fails = bench_size(op, op.stages, size, peaks, np.random.default_rng(7), env, with_compile=with_compile)
    OUT["records"] += recs
    OUT["failures"] += fails
    for f in fails:
        say(f"FAIL {f[:300]}")
    for r in recs:
        say(f"{r['stage']:40s} {r['size_label']:>24s} {r['median_us']:9.1f} µs {r['gbps']:7.0f} GB/s "
            f"{r['gflops'] / 1e3:7.2f} TFLOP/s err {r['rel_err']:.2g}")
    say(f"({op.name} @ {size_label(as_size(size))}: {time.time() - t0:.0f} s, torch.compile's compile included)")


def summarise():
    by = {}
    for r in OUT["records"]:
        by.setdefault((r["op"], r["size_label"]), []).append(r)
    for (opname, label), recs in by.items():
        stages = {r["stage"]: r["median_us"] for r in recs if r.get("kind") == "stage"}
        peers = {r["stage"]: r["median_us"] for r in recs if r.get("kind") == "peer"}
        eager = next((v for k, v in peers.items() if "compile" not in k), None)
        compiled = next((v for k, v in peers.items() if "compile" in k), None)
        row = {"stage_us": stages, "peer_us": peers}
        if not stages:
            continue
        best_name = min(stages, key=stages.get)
        best = stages[best_name]
        row.update(best_stage=best_name, best_vs_eager=eager / best if eager else None,
                   best_vs_compile=compiled / best if compiled else None)
        line = f"TARGET {opname} @ {label}: best {best_name} {best:.1f} µs"
        if "fused_epilogue" in stages and "unfused" in stages:
            row["fused_speedup_over_unfused"] = stages["unfused"] / stages["fused_epilogue"]
            row["fused_beats_unfused"] = stages["fused_epilogue"] < stages["unfused"]
            line += (f"; fused {stages['fused_epilogue']:.1f} vs unfused {stages['unfused']:.1f} µs "
                     f"({row['fused_speedup_over_unfused']:.3f}x, beats: {row['fused_beats_unfused']})")
        if "scatter" in stages:
            line += "; " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()) + " µs"
            last = list(stages)[-1]
            row["last_stage_fastest"] = last == best_name
            line += f"; last stage ({last}) fastest: {row['last_stage_fastest']}"
        if eager:
            line += f"; torch eager {eager:.1f} µs ({row['best_vs_eager']:.2f}x)"
        if compiled:
            line += f"; torch.compile {compiled:.1f} µs ({row['best_vs_compile']:.2f}x)"
        OUT["targets"][f"{opname} @ {label}"] = row
        say(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", default=".")
    parser.add_argument("--budget", type=float, default=140.0)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = START + args.budget
    check_deadline = START + args.budget / 3  # checks get the first third; timing the rest
    for op in OPS:
        attempt(f"check {op.name}", check_operator, op, check_deadline)
    attempt("determinism", determinism)
    got = attempt("peaks", peaks_and_env)
    if got:
        peaks, env = got
        # Headline sizes first (with torch.compile), then the second shapes (eager torch only).
        # The must-shows first: the epilogue pair at the headline (with torch.compile), the FFT sweep; then
        # the transposed conv's headline, then the second shapes (eager torch only).
        for op in OPS[:2]:
            attempt(f"time {op.name}", time_operator, op, op.headline_size, peaks, env, deadline, not args.no_compile)
        attempt("epilogue side by side", epilogue_side_by_side, env, deadline)
        attempt("fft sweep", fft_sweep, peaks, env, deadline)
        attempt("time conv_transpose2d", time_operator, conv_transpose.op, conv_transpose.op.headline_size, peaks,
                env, deadline, not args.no_compile)
        for op in OPS[:3]:
            for size in op.bench_sizes:
                if as_size(size) != as_size(op.headline_size):
                    attempt(f"time {op.name}", time_operator, op, size, peaks, env, deadline, False)
    attempt("summary", summarise)
    if OUT["skipped"]:
        say(f"skipped for the budget: {', '.join(OUT['skipped'])}")
    path = out_dir / "gpu_conv_extra.json"
    path.write_text(json.dumps(OUT, indent=1, default=str))
    failed = [c for c in OUT["checks"] if c["status"] == "failed"]
    say(f"wrote {path}: {len(OUT['checks'])} checks ({len(failed)} failed), {len(OUT['records'])} timings, "
        f"{len(OUT['errors'])} errors")
    return 1 if failed or OUT["errors"] or OUT["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
