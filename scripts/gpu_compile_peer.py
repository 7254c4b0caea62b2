"""One run on an H100/H200 that times torch.compile beside eager torch as a peer (issue 16, item 3).

    python scripts/gpu_compile_peer.py OUT_DIR [--budget 165]

1. End to end, as `workbench bench softmax --quick` does: every softmax stage and both peers at the
   headline size (``bench_size(..., with_compile=True)``), each checked against the float64 reference
   before it is timed; each stage's "vs" names the strongest peer.
2. Peers only, at each operator's headline size, for every operator with a ``torch_expression``: the
   eager peer and torch.compile of the expression, each checked first, then timed as the stages are
   (CUDA events, inputs rotated past L2). Beside them the best stage recorded in results/ (the H200 run
   of 2026-11-23), so the table says whether torch.compile changes "the ladder against the library".
   The seconds each operator took (torch.compile's first call compiles inside them) are printed too.

Failures (a compile error, a wrong result) are one line each and the run goes on. The run stops
starting operators when ``--budget`` seconds are spent (default 165: within 3 minutes); what it skipped
says so. Everything goes to ``OUT_DIR/gpu_compile_peer.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_log  # noqa: E402  (scripts/: the folder of the script being run)
from gpu_log import START, say  # noqa: E402

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)
from workbench import device, peers, registry, results  # noqa: E402
from workbench.bench import bench_size  # noqa: E402
from workbench.ladder import size_label  # noqa: E402

# The fused and memory-bound operators first (issue 16's question), the rest after: a budget cut
# drops the end of this list.
ORDER = ["softmax", "layernorm", "rmsnorm", "residual_layernorm", "bias_relu_layernorm", "elementwise",
         "softmax_bf16", "layernorm_bf16", "rmsnorm_bf16", "gelu_bf16", "rope", "rope_interleaved",
         "batchnorm_infer", "maxpool2d", "attention", "softmax_fp16", "layernorm_fp16", "rmsnorm_fp16",
         "gelu_fp16", "batchnorm_train", "depthwise3x3"]


def recorded_best(op) -> dict | None:
    """The fastest stage recorded in results/ at the headline size (None if none was)."""
    data = results.latest_file_with(op.name)
    if data is None:
        return None
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    stages = [r for r in recs if r.get("kind") == "stage" and list(r["size"]) == list(op.headline_size)]
    return min(stages, key=lambda r: r["median_us"], default=None)


def end_to_end(peaks, env, out: dict) -> None:
    op = registry.operator("softmax")
    t0 = time.time()
    records, failures = bench_size(op, op.stages, op.headline_size, peaks, np.random.default_rng(7), env,
                                   with_compile=True)
    say(f"softmax, every stage and both peers at {size_label(op.headline_size)} ({time.time() - t0:.0f} s):")
    for r in records:
        vs = f"  vs {r['peer']['name']}: {r['peer']['median_us'] / r['median_us']:.2f}x" if r.get("peer") else ""
        say(f"  {r['kind']:5} {r['stage']:22} {r['median_us']:9.1f} us {r['gbps']:6.0f} GB/s{vs}")
    for f in failures:
        say(f"  FAIL {f}")
    out["end_to_end"] = {"records": records, "failures": failures}


def peers_of(op, peaks, env) -> dict:
    t0 = time.time()
    records, failures = bench_size(op, [], op.headline_size, peaks, np.random.default_rng(7), env,
                                   with_compile=True)
    by_name = {r["stage"]: r for r in records}
    eager = next((r for r in records if r["stage"] != peers.COMPILED_NAME), None)
    compiled = by_name.get(peers.COMPILED_NAME)
    best = recorded_best(op)
    row = {"op": op.name, "size": size_label(op.headline_size), "seconds": round(time.time() - t0, 1),
           "eager": eager and {k: eager[k] for k in ("stage", "median_us", "gbps", "host_call_us", "rel_err")},
           "compiled": compiled and {k: compiled[k] for k in ("median_us", "gbps", "host_call_us", "rel_err")},
           "recorded_best_stage": best and {k: best[k] for k in ("stage", "median_us", "gbps", "date")},
           "failures": failures, "records": records}
    fmt = lambda r: f"{r['median_us']:9.1f} us {r['gbps']:6.0f} GB/s" if r else f"{'—':>21}"  # noqa: E731
    speedup = f"{eager['median_us'] / compiled['median_us']:5.2f}x" if eager and compiled else "    —"
    versus = (f"{best['stage']} {best['median_us']:.1f} us: vs strongest "
              f"{min(r['median_us'] for r in (eager, compiled) if r) / best['median_us']:.2f}x"
              if best and (eager or compiled) else "")
    say(f"{op.name:20} {row['size']:14} eager {fmt(eager)} | compile {fmt(compiled)} | compile/eager "
        f"{speedup} | {row['seconds']:5.1f} s | recorded best {versus}")
    for f in failures:
        say(f"  FAIL {f}")
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--budget", type=float, default=165.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if device.is_simulator() or peers.torch() is None:
        say("needs a GPU with torch (torch.compile): nothing measured")
        return 2
    env = results.environment()
    peaks = results.stored_peaks(env["device"]) or {}
    out = {"device": env["device"], "versions": env, "rows": [], "skipped": [], "errors": []}
    say(f"{env['device']}, torch {env.get('torch')}; budget {args.budget:.0f} s")
    gpu_log.attempt(out["errors"], "softmax end to end", end_to_end, peaks, env, out)
    ops = registry.load_operators()
    names = ORDER + sorted(n for n, op in ops.items() if op.torch_expression and n not in ORDER)
    say("peers at the headline size; compile/eager > 1: torch.compile is faster; 'vs strongest' > 1: "
        "the recorded best stage is faster than both peers")
    for name in names:
        if time.time() - START > args.budget:
            out["skipped"].append(name)
            continue
        row = gpu_log.attempt(out["errors"], name, peers_of, ops[name], peaks, env)
        if row is not None:
            out["rows"].append(row)
    if out["skipped"]:
        say(f"skipped for the budget: {', '.join(out['skipped'])}")
    failures = [f for row in out["rows"] for f in row["failures"]] + out.get("end_to_end", {}).get("failures", [])
    say(f"{len(out['rows'])} operators measured, {len(failures)} failure lines, {len(out['errors'])} errors")
    (args.out / "gpu_compile_peer.json").write_text(json.dumps(out, indent=1, default=str))
    say(f"wrote {args.out / 'gpu_compile_peer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
