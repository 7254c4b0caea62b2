"""On a GPU: the tools-of-the-trade checks and measurements of issue 17, in one run (under 3 minutes on an H200).

    python scripts/gpu_tools.py OUT_DIR

1. launch_overhead: every stage checked, then host time per call (a loop of calls, then one
   synchronize) at 1x1024 and 4096x1024, beside torch's layer_norm; and the harness's records
   (GPU time, host_call_us) at the headline size (not saved to results/).
2. The fast calling path: ``prepared.PreparedCall`` on reduction.fused (two arrays) with numba arrays and
   torch tensors, against the stage called directly and torch's ``x.add_(1)``; graphs of 100 launches
   (a ReLU of 1024 floats: what a graph node costs; reduction.fused: a kernel that takes 2.6 µs itself).
3. streams: each stage at 2^26 floats (checked), the link measured, % of it reached; the Gantt charts.
4. ``workbench profile softmax`` (every stage, headline size) and the sentences explaining the largest steps.
5. ``workbench sanitize`` on the planted shared-memory race and out-of-bounds write (tests/planted).

Prints a compact table per section and writes OUT_DIR/gpu_tools.json (plus streams_timeline.png and
the recorded profile). A section that fails prints its error and the run goes on; exit status 1 if any
did, or if a must-show target was missed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import workbench  # noqa: E402,F401  (GPU or simulator, before numba)

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from workbench import prepared, profiles, results, sanitizer  # noqa: E402

REPORT: dict = {"sections": {}, "targets": {}, "errors": {}}


def section(name):
    def run(fn):
        t0 = time.perf_counter()
        print(f"\n== {name} ==", flush=True)
        try:
            REPORT["sections"][name] = fn()
        except Exception as exc:  # keep going: the other sections still tell something
            REPORT["errors"][name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
        return fn
    return run


def target(name: str, value, ok: bool) -> None:
    REPORT["targets"][name] = {"value": value, "met": bool(ok)}
    print(f"   target {'MET ' if ok else 'MISSED'} {name}: {value}")


def torch_or_none():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out/gpu_tools")
OUT.mkdir(parents=True, exist_ok=True)
ENV = results.environment()
print(f"device: {ENV['device']}, numba-cuda {ENV.get('numba_cuda')}, torch {ENV.get('torch')}")


@section("launch_overhead")
def launch_section():
    from workbench.bench import bench_size
    from workbench.check import check_stage
    from solutions import launch_overhead as lo

    rng = np.random.default_rng(0)
    out = {"checks": [], "host": [], "records": []}
    for stage in lo.op.stages:
        for size in [(1, 1024), (300, 33), (4096, 1024)]:
            r = check_stage(stage, size, rng)
            out["checks"].append({"stage": stage.name, "size": list(size), "passed": r.passed, "message": r.message})
            if not r.passed:
                print(f"   FAIL {stage.key} @ {size}: {r.message}")
    torch = torch_or_none()
    print(f"   {'stage':<12} {'size':>9} {'enqueue µs/call':>16} {'call+sync µs':>13}")
    for size in [(1, 1024), (4096, 1024)]:
        inputs = lo.op.make_inputs(size, rng)
        args = tuple(cuda.to_device(a) for a in inputs) + (cuda.device_array(size, np.float32),)
        rows = [(s.name, s.launch) for s in lo.op.stages]
        if torch is not None:
            tx, tw, tb = (torch.as_tensor(a, device="cuda") for a in inputs)
            rows.append(("torch", lambda *a: torch.nn.functional.layer_norm(tx, (size[1],), tw, tb, 1e-5)))
        for name, fn in rows:
            cost = prepared.host_time_per_call(fn, args, calls=100, repeats=3)
            out["host"].append({"stage": name, "size": list(size), **cost})
            print(f"   {name:<12} {size[0]}x{size[1]:>4} {cost['enqueue_us']:>16.1f} {cost['call_sync_us']:>13.1f}")
    big = {r["stage"]: r["enqueue_us"] for r in out["host"] if r["size"] == [4096, 1024]}
    target("3-kernel LayerNorm at 4096x1024: graph faster than one by one (µs/call)",
           {"graph": big.get("graph"), "dispatch": big.get("dispatch")},
           big.get("graph") is not None and big["graph"] < big["dispatch"])
    peaks = results.stored_peaks(ENV["device"]) or {}
    records, failures = bench_size(lo.op, lo.op.stages, lo.op.headline_size, peaks, rng, ENV)
    out["records"], out["bench_failures"] = records, failures
    for r in records:
        print(f"   bench {r['stage']:<32} GPU {r['median_us']:8.1f} µs   host_call {r['host_call_us']:7.1f} µs")
    lo.clear_plans()
    return out


@section("fast calling path")
def calling_section():
    from solutions import reduction

    out = {}
    torch = torch_or_none()
    x, o = cuda.to_device(np.ones(1024, np.float32)), cuda.device_array(1, np.float32)
    kinds = {"numba": (x, o)}
    if torch is not None:
        kinds["torch"] = (torch.ones(1024, device="cuda"), torch.empty(1, device="cuda"))
    for kind, args in kinds.items():
        call = prepared.PreparedCall(reduction.fused)
        launcher = reduction.fused.launch
        if kind == "torch":  # a launcher takes numba arrays: a torch caller pays for the view on each call
            def launcher(x, o):
                reduction.fused.launch(cuda.as_cuda_array(x), cuda.as_cuda_array(o))
        rows = {"stage called (validates each call)": reduction.fused, "stage launcher (no checks)": launcher,
                "PreparedCall (graph)": call,
                "PreparedCall (launches)": prepared.PreparedCall(reduction.fused, use_graph=False)}
        for name, fn in rows.items():
            cost = prepared.host_time_per_call(fn, args)
            out[f"{kind}: {name}"] = cost
            print(f"   {kind:<6} {name:<38} {cost['enqueue_us']:7.2f} µs/call  (call+sync {cost['call_sync_us']:.1f})")
        got = float(cuda.as_cuda_array(args[1]).copy_to_host()[0])
        target(f"reduction.fused (2 arrays) through PreparedCall, {kind} arrays: ≤ 8 µs/call (and sums right)",
               round(out[f"{kind}: PreparedCall (graph)"]["enqueue_us"], 2),
               out[f"{kind}: PreparedCall (graph)"]["enqueue_us"] <= 8.0 and got == 1024.0)
    if torch is not None:
        t = torch.ones(1024, device="cuda")
        cost = prepared.host_time_per_call(lambda t: t.add_(1), (t,))
        out["torch x.add_(1)"] = cost
        print(f"   torch  {'x.add_(1)':<38} {cost['enqueue_us']:7.2f} µs/call")

    # A graph of 100 launches, replayed: the GPU's time per kernel. Of a kernel that does almost nothing
    # (ReLU of 1024 floats), that is what a graph node costs; of reduction.fused (its last block waits on
    # an atomic ticket), it is mostly the kernel's own run.
    from workbench import registry

    _, (relu,) = registry.resolve("act_relu.small_tiles")
    tiny = cuda.to_device(np.linspace(-1, 1, 1024, dtype=np.float32)), cuda.device_array(1024, np.float32)
    for name, launch, args in (("ReLU of 1024 floats", relu.launch, tiny), ("reduction.fused", reduction.fused.launch, (x, o))):
        def hundred(*a, launch=launch):
            for _ in range(100):
                launch(*a)
        cost = prepared.host_time_per_call(prepared.PreparedCall(hundred, validate=lambda *a: None), args, calls=20)
        out[f"graph of 100 launches: {name}"] = cost
        print(f"   graph of 100 launches of {name:<20} GPU {cost['gpu_us'] / 100:6.2f} µs a kernel, "
              f"host {cost['enqueue_us'] / 100:6.2f} µs a kernel")
    cost = out["graph of 100 launches: ReLU of 1024 floats"]
    target("graph replay per kernel ≤ 1.5 µs (GPU time, events)", round(cost["gpu_us"] / 100, 3), cost["gpu_us"] / 100 <= 1.5)
    return out


@section("streams")
def streams_section():
    from solutions import streams

    result = streams.run_ladder(1 << 26, repeats=2)
    link = result["link"]
    print(f"   link: H2D {link['h2d_gbps']:.1f} GB/s, D2H {link['d2h_gbps']:.1f} GB/s, both ways at once "
          f"{link['both_ways_gbps']:.1f} GB/s ({link['both_ways_ms']:.2f} ms)")
    for r in result["runs"]:
        pct = streams.percent_of_link(r, link)
        print(f"   {r.stage:<11} {r.total_ms:7.2f} ms  {r.gbps:6.1f} GB/s  {pct:5.1f}% of link  "
              f"{'ok' if r.passed else 'WRONG'} (rel err {r.rel_err:.1e})")
    streams.draw_timelines(result["runs"], OUT / "streams_timeline.png", link)
    last = result["runs"][-1]
    pct = streams.percent_of_link(last, link)
    target("streams: overlapped stage ≥ 80% of the measured link (both ways)", round(pct, 1), last.passed and pct >= 80)
    return {"link": link, "runs": [r.as_dict() for r in result["runs"]]}


@section("profile softmax")
def profile_section():
    run = subprocess.run([sys.executable, "-m", "workbench", "profile", "softmax"], capture_output=True, text=True,
                         timeout=110, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    print(run.stdout[-6000:])
    print(run.stderr[-1500:])
    device, records = profiles.recorded("softmax")
    path = profiles.path_for(ENV["device"])
    if path.exists():
        shutil.copy(path, OUT / path.name)
    from workbench import registry

    stages = {r["stage"] for r in records}
    want = {s.name for s in registry.resolve("softmax")[0].stages}
    target("profile softmax: counters for every stage", sorted(stages), run.returncode == 0 and stages == want)
    return {"returncode": run.returncode, "explanations": profiles.explain_steps(records) if records else []}


@section("sanitize planted bugs")
def sanitize_section():
    from workbench import registry
    from workbench.tools import sanitize

    tool_path = sanitize.find_sanitizer()
    if tool_path is None:
        raise RuntimeError("no compute-sanitizer found")
    out = {}
    for planted, stage_key, tool, line_text in [
            ("missing_syncthreads_reduction.py", "reduction.shared_tree", "racecheck", "partials[t] += partials[t + half]"),
            ("missing_bounds_check.py", "matvec.thread_per_row", "memcheck", "acc += a[row, col] * x[col]")]:
        op, (stage,) = registry.resolve(stage_key)
        findings, output = sanitize.run_tool(tool_path, tool, stage, sanitize.default_size(op),
                                             str(ROOT / "tests" / "planted" / planted))
        lines = [sanitizer.teach(f) for f in findings]
        for line in lines[:3]:
            print(f"   {line}")
        if not findings:
            print(output[-3000:])
        out[planted] = {"lines": lines, "raw_tail": output[-4000:]}
        target(f"sanitize {tool} catches {planted} and names `{line_text}`", len(lines),
               any(line_text in l for l in lines))
    return out


(OUT / "gpu_tools.json").write_text(json.dumps({"environment": ENV, **REPORT}, indent=1, default=str))
missed = [k for k, v in REPORT["targets"].items() if not v["met"]]
print(f"\nwrote {OUT / 'gpu_tools.json'}; targets missed: {missed or 'none'}; section errors: {list(REPORT['errors']) or 'none'}")
sys.exit(1 if missed or REPORT["errors"] else 0)
