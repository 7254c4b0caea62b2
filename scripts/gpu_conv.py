"""One run on an H100/H200 that checks and times the convolution family (issue 14).

    python scripts/gpu_conv.py OUT_DIR [--budget 170]

1. Correctness: every stage of conv2d, conv2d_general, depthwise3x3, maxpool2d, batchnorm_train and batchnorm_infer at the
   operators' odd check sizes (padding at the borders, stride 2, dilation, C and K past the tiles, 1x1
   and 7x7 filters), random and adversarial inputs, against the float64 reference. One line each:
   PASS/FAIL, the relative error and the tolerance.
2. Speed at the issue's layers (workbench.bench.bench_size: each stage checked, then timed with CUDA
   events, inputs rotated past L2), with torch (cuDNN fp32, TF32 off) in the same run: µs, GB/s,
   TFLOP/s, % of the copy peak (memory-bound operators), and the speed-up over torch.
3. A summary of the issue's targets: best conv2d stage against cuDNN on both 3x3 layers; Winograd
   against the implicit GEMM, with both relative errors; the memory-bound final stages' % of copy and
   ratio to torch.

Everything goes to OUT_DIR/gpu_conv.json. New items stop starting when --budget seconds are spent (the
default keeps the run under 3 minutes on an H200); what was skipped is listed.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_log  # noqa: E402  (scripts/: the folder of the script being run)
from gpu_log import START, say  # noqa: E402

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)

from solutions import cnn, conv  # noqa: E402

OUT = {"device": None, "checks": [], "records": [], "failures": [], "errors": [], "skipped": [], "targets": {}}




attempt = functools.partial(gpu_log.attempt, OUT["errors"])  # fn(*args), or None with the error kept


# -- 1-2. correctness at the odd shapes, then speed: the loop the family scripts share (gpu_log) ----------

check_operator = functools.partial(gpu_log.check_operator, OUT)
peaks_and_env = functools.partial(gpu_log.peaks_and_env, OUT)
time_operator = functools.partial(gpu_log.time_operator, OUT)


# -- 3. the targets --------------------------------------------------------------------------------------

def summarise():
    by = {}
    for r in OUT["records"]:
        by.setdefault((r["op"], r["size_label"]), []).append(r)
    targets = OUT["targets"]
    for (opname, label), recs in by.items():
        peer = next((r for r in recs if r.get("kind") == "peer"), None)
        stages = {r["stage"]: r for r in recs if r.get("kind") == "stage"}
        if not stages:
            continue
        best = min(stages.values(), key=lambda r: r["median_us"])
        row = {"best_stage": best["stage"], "best_us": best["median_us"],
               "peer_us": peer["median_us"] if peer else None,
               "vs_peer": peer["median_us"] / best["median_us"] if peer else None,
               "stage_us": {k: v["median_us"] for k, v in stages.items()},
               "faster_one_after_another": all(a["median_us"] > b["median_us"] for a, b in
                                               zip(sorted(stages.values(), key=lambda r: r["order"]),
                                                   sorted(stages.values(), key=lambda r: r["order"])[1:]))}
        last = max(stages.values(), key=lambda r: r["order"])
        row["last_stage_pct_of_copy"] = last.get("pct_of_peak") if opname in ("depthwise3x3", "maxpool2d",
                                                                                "batchnorm_train",
                                                                                "batchnorm_infer") else None
        row["last_vs_peer"] = peer["median_us"] / last["median_us"] if peer else None
        if "winograd" in stages and "implicit_gemm" in stages:
            w, i = stages["winograd"], stages["implicit_gemm"]
            row["winograd_vs_implicit_gemm"] = i["median_us"] / w["median_us"]
            row["winograd_rel_err"] = w["rel_err"]
            row["implicit_gemm_rel_err"] = i["rel_err"]
        targets[f"{opname} @ {label}"] = row
        extra = ""
        if "winograd_vs_implicit_gemm" in row:
            extra = (f"; winograd {row['winograd_vs_implicit_gemm']:.2f}x implicit GEMM, error "
                     f"{row['winograd_rel_err']:.2g} vs {row['implicit_gemm_rel_err']:.2g}")
        if row["last_stage_pct_of_copy"] is not None:
            extra += f"; last stage {row['last_stage_pct_of_copy']:.0f}% of copy"
        vs = f"{row['vs_peer']:.2f}x torch" if row["vs_peer"] else "no torch"
        say(f"TARGET {opname} @ {label}: best {best['stage']} {best['median_us']:.1f} µs ({vs}); stages faster "
            f"one after another: {row['faster_one_after_another']}{extra}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", default=".")
    parser.add_argument("--budget", type=float, default=170.0)
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = START + args.budget
    ops = [*conv.OPERATORS, *cnn.OPERATORS]
    # Checks get the first third of the budget; timing the rest.
    check_deadline = START + args.budget / 3
    for op in ops:
        attempt(f"check {op.name}", lambda: check_operator(op, check_deadline))
    got = attempt("peaks", peaks_and_env)
    if got:
        peaks, env = got
        plan = [(conv.op, conv.op.bench_sizes), (cnn.bn_op, cnn.bn_op.bench_sizes),
                (cnn.depthwise_op, cnn.depthwise_op.bench_sizes), (cnn.maxpool_op, cnn.maxpool_op.bench_sizes),
                (conv.general_op, [conv.general_op.headline_size])]
        for op, sizes in plan:
            attempt(f"time {op.name}", lambda: time_operator(op, sizes, peaks, env, deadline))
    attempt("summary", summarise)
    if OUT["skipped"]:
        say(f"skipped for the budget: {', '.join(OUT['skipped'])}")
    path = out_dir / "gpu_conv.json"
    path.write_text(json.dumps(OUT, indent=1, default=str))
    failed = [c for c in OUT["checks"] if c["status"] == "failed"]
    say(f"wrote {path}: {len(OUT['checks'])} checks ({len(failed)} failed), {len(OUT['records'])} timings, "
        f"{len(OUT['errors'])} errors")
    return 1 if failed or OUT["errors"] or OUT["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
