"""One run on an H100/H200 that checks and times the CNN layers of issue 14 (items 3-4).

    python scripts/gpu_cnn.py OUT_DIR [--budget 165]

Operators: depthwise3x3, depthwise3x3_nhwc, maxpool2d, batchnorm_train, batchnorm_infer (solutions/cnn.py), avgpool2d,
global_avgpool (solutions/pooling.py), conv_bn_folded (solutions/conv_bn.py: conv -> BN -> ReLU, unfolded
against folded; its two stages' relative errors are the fold's accuracy difference).

1. Correctness: every stage at the operators' check sizes but the largest (odd H and W, C past a tile,
   borders), a random input and the first adversarial one (NaN, channels at 1e4, constant images),
   against the float64 reference: one PASS/FAIL line each with the relative error and tolerance.
2. Speed at 128x64x56x56 (the issue's bandwidth-bound layer) and a second shape per operator
   (workbench.bench.bench_size: each stage checked, timed with CUDA events, inputs rotated past L2),
   torch (eager, fp32, TF32 off for convolutions) in the same run: µs, GB/s, % of the operator's own
   memory ceiling (copy, or read for global_avgpool), and x torch.
3. TARGET lines: best stage, last stage's % of peak and x torch per operator and shape. The issue wants
   the final depthwise/pooling/BatchNorm stages >= 85% of copy and >= 1.0x torch at N128, and
   batchnorm_train >= 1.5x torch. For conv_bn_folded the line adds both stages' relative errors.

Everything goes to OUT_DIR/gpu_cnn.json. New items stop starting when --budget seconds are spent (the
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

from solutions import cnn, conv_bn, pooling  # noqa: E402

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
        row["last_stage_pct_of_peak"] = last.get("pct_of_peak")
        row["last_vs_peer"] = peer["median_us"] / last["median_us"] if peer else None
        if "folded_weights" in stages and "conv_then_bn" in stages:
            f, u = stages["folded_weights"], stages["conv_then_bn"]
            row["folded_vs_unfolded"] = u["median_us"] / f["median_us"]
            row["folded_rel_err"], row["unfolded_rel_err"] = f["rel_err"], u["rel_err"]
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
        if "folded_vs_unfolded" in row:
            extra += (f"; folded {row['folded_vs_unfolded']:.2f}x conv_then_bn, error {row['folded_rel_err']:.2g} "
                      f"vs {row['unfolded_rel_err']:.2g}")
        if row["last_stage_pct_of_peak"] is not None:
            extra += (f"; last stage {last['stage']} {row['last_stage_pct_of_peak']:.0f}% of its pattern's peak, "
                      f"{row['last_vs_peer'] or float('nan'):.2f}x torch")
        vs = f"{row['vs_peer']:.2f}x torch" if row["vs_peer"] else "no torch"
        say(f"TARGET {opname} @ {label}: best {best['stage']} {best['median_us']:.1f} µs ({vs}); stages faster "
            f"one after another: {row['faster_one_after_another']}{extra}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", default=".")
    parser.add_argument("--budget", type=float, default=165.0)
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = START + args.budget
    ops = [*cnn.OPERATORS, *pooling.OPERATORS, *conv_bn.OPERATORS]
    # Checks get the first third of the budget; timing the rest.
    check_deadline = START + args.budget / 3
    for op in ops:
        attempt(f"check {op.name}", lambda: check_operator(op, check_deadline))
    got = attempt("peaks", peaks_and_env)
    if got:
        peaks, env = got
        head = cnn.HEADLINE
        # The must-show shapes first (N128), then one more shape per operator while the budget lasts.
        plan = [(cnn.bn_op, [head]), (cnn.bn_infer_op, [head]), (cnn.depthwise_op, [head]), (cnn.depthwise_nhwc_op, [(128, 56, 56, 64)]),
                (cnn.maxpool_op, [head]), (pooling.avg_op, [head + (2,), head + (3,)]),
                (pooling.gap_op, [head, (128, 512, 7, 7)]), (conv_bn.op, [conv_bn.op.headline_size]),
                (cnn.bn_op, [(32, 256, 14, 14)]), (cnn.bn_infer_op, [(32, 256, 14, 14)])]
        for op, sizes in plan:
            attempt(f"time {op.name}", lambda: time_operator(op, sizes, peaks, env, deadline))
    attempt("summary", summarise)
    if OUT["skipped"]:
        say(f"skipped for the budget: {', '.join(OUT['skipped'])}")
    path = out_dir / "gpu_cnn.json"
    path.write_text(json.dumps(OUT, indent=1, default=str))
    failed = [c for c in OUT["checks"] if c["status"] == "failed"]
    say(f"wrote {path}: {len(OUT['checks'])} checks ({len(failed)} failed), {len(OUT['records'])} timings, "
        f"{len(OUT['errors'])} errors")
    return 1 if failed or OUT["errors"] or OUT["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
