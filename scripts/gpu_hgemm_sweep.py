"""Which geometry makes hgemm's tensor-core kernel fastest? One H100/H200 run that answers it.

    python scripts/gpu_hgemm_sweep.py [--budget 220] [--only N]

Every tensor-core stage of ``solutions/hgemm.py`` is one kernel source built by
``hgemm.build_kernel(Geometry(...))``: block tile, K-step, warp tile (hence threads per block),
cp.async stages, launch bounds and the rasterised launch order are constants it is compiled with.
This script builds the fp16 kernel for each candidate in ``CANDIDATES`` (most promising first) and,
for each one on its own (a compile error or a wrong answer is reported and the sweep goes on):

1. checks it at odd shapes (M, N, K not multiples of any tile) and at 8192^3 on 256 sampled rows,
   against a float64 reference (relative error in norm, tolerance 2e-3 as the hgemm operator's);
2. times it at 8192^3 (``workbench.timing.measure``: CUDA events, warm-up, median), with its
   registers, local memory (spills) and shared memory per block.

cuBLAS fp16 (``torch.matmul``) is timed in the same run, and so are qlinear's unfused and fused
stages (the fused one with its new epilogue, which applies the scales fragment by fragment). No
candidate is started past ``--budget`` seconds. The sorted table is printed, with the line to paste
into solutions/hgemm.py for the fastest correct geometry (``TUNED = Geometry(...)``, and a
``PIPELINE = Geometry(...)`` line if a 128x128 tile of 64x32 warps beat stage 5's). Everything goes
to ``$OUT/hgemm_sweep.json`` (``$OUT`` unset: the current directory), rewritten after every candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)
from workbench import device  # noqa: E402
from workbench.check import check_stage, compare  # noqa: E402
from workbench.ladder import to_device, to_host  # noqa: E402
from workbench.timing import measure  # noqa: E402

from solutions import hgemm, int8_gemm  # noqa: E402
from solutions.hgemm import Geometry  # noqa: E402

HEADLINE = (8192, 8192, 8192)
ODD_SIZES = [(200, 264, 168), (4097, 1000, 336)]  # K, N multiples of 8: the cp.async kernel being swept
SAMPLED_ROWS = 256
TOLERANCE = hgemm.TOLERANCE["float16"]

_BIG = Geometry(bm=128, bn=256, bk=32, wm=64, wn=64, stages=4, min_blocks=1, raster=8)
_SMALL = Geometry(bm=128, bn=128, bk=32, wm=64, wn=32, stages=4, min_blocks=2, raster=8)
CANDIDATES = [
    hgemm.TUNED,  # as shipped
    replace(_BIG, raster=1),  # the measured 238 TFLOP/s geometry, new code, no rasterised order
    replace(_BIG, bk=64, stages=3),  # 144 KiB: half the barriers per flop
    replace(_BIG, stages=3),
    Geometry(bm=256, bn=128, bk=32, wm=64, wn=64, stages=4, min_blocks=1, raster=8),
    replace(_BIG, wn=32),  # 16 warps of 64x32: <= 128 registers, twice the warps to hide latency
    replace(_SMALL, wn=64),  # 4 warps of 64x64, two (or three) blocks per SM
    _SMALL,  # stage 5's tile with the rasterised order
    replace(_SMALL, bk=64, stages=3),  # 96 KiB x 2 blocks
    hgemm.PIPELINE,  # as shipped
    replace(_BIG, raster=16),
    replace(_BIG, raster=4),
    Geometry(bm=256, bn=128, bk=32, wm=64, wn=32, stages=4, min_blocks=1, raster=8),  # 16 warps
    Geometry(bm=256, bn=128, bk=64, wm=64, wn=64, stages=3, min_blocks=1, raster=8),
    replace(_SMALL, wn=64, stages=3, min_blocks=3),  # 48 KiB, three 128-thread blocks per SM
    replace(_BIG, bk=64, stages=4),  # 192 KiB
    replace(_SMALL, stages=3),
    replace(_SMALL, raster=16),
]
QLINEAR_AFTER = 4  # qlinear's two stages are timed after this many candidates

RESULTS = {"device": None, "cublas_tflops": None, "candidates": [], "qlinear": [], "errors": []}
START = time.time()


def say(line):
    print(f"[{time.time() - START:6.1f}s] {line}", flush=True)


def save(out_dir: Path):
    RESULTS["elapsed_s"] = time.time() - START
    (out_dir / "hgemm_sweep.json").write_text(json.dumps(RESULTS, indent=1, default=float))


def rate(us):
    return 2 * np.prod(HEADLINE, dtype=np.float64) / (us * 1e-6) / 1e12


def resources(kernel):
    """Registers, local memory (spills, stack) and static shared memory per block of the compiled kernel."""
    try:
        (compiled,) = kernel.overloads.values()
        return {"registers": int(compiled.regs_per_thread), "local_bytes": int(compiled.local_mem_per_thread)}
    except Exception as exc:  # informative only
        return {"resources_error": f"{type(exc).__name__}: {exc}"}


def headline_data(rng):
    from numba import cuda

    M, N, K = HEADLINE
    A = rng.uniform(-1.0, 1.0, (M, K)).astype(np.float16)
    B = rng.uniform(-1.0, 1.0, (K, N)).astype(np.float16)
    rows = np.sort(rng.choice(M, SAMPLED_ROWS, replace=False))
    ref = A[rows].astype(np.float64) @ B.astype(np.float64)
    return to_device(A), to_device(B), cuda.device_array((M, N), np.float16), rows, ref


def check_odd(geometry):
    from numba import cuda

    rng = np.random.default_rng(7)
    for M, N, K in ODD_SIZES:
        A = rng.uniform(-1.0, 1.0, (M, K)).astype(np.float16)
        B = rng.uniform(-1.0, 1.0, (K, N)).astype(np.float16)
        out = cuda.device_array((M, N), np.float16)
        hgemm.launch_tensor_core(geometry, to_device(A), to_device(B), out)
        r = compare("candidate", (M, N, K), to_host(out), A.astype(np.float64) @ B.astype(np.float64), TOLERANCE)
        if not r.passed:
            return f"wrong at {M}x{N}x{K}: rel err {r.rel_err:.3g} (tol {TOLERANCE:g}): {r.message[:200]}"
    return None


def check_headline(geometry, data):
    from numba import cuda

    A, B, out, rows, ref = data
    hgemm.launch_tensor_core(geometry, A, B, out)
    cuda.synchronize()
    r = compare("candidate", HEADLINE, to_host(out)[rows], ref, TOLERANCE)
    return None if r.passed else f"wrong at 8192^3 (sampled rows): rel err {r.rel_err:.3g}: {r.message[:200]}"


def try_candidate(geometry, data):
    row = {"label": geometry.label(), "geometry": asdict(geometry), "threads": geometry.threads,
           "smem_bytes": geometry.smem_bytes, "status": "failed"}
    RESULTS["candidates"].append(row)
    t0 = time.time()
    try:
        problems = geometry.problems()
        if problems:
            row["error"] = "; ".join(problems)
            return row
        wrong = check_odd(geometry)  # the first launch compiles
        row["compile_and_check_s"] = time.time() - t0
        row.update(resources(hgemm.build_kernel(geometry, False, True)))
        wrong = wrong or check_headline(geometry, data)
        if wrong:
            row["status"], row["error"] = "wrong", wrong
            return row
        A, B, out = data[:3]
        t = measure(lambda A, B, out: hgemm.launch_tensor_core(geometry, A, B, out), [(A, B, out)],
                    samples=10, budget_s=1.5)
        row.update(status="ok", median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, tflops=rate(t.median_us))
        if RESULTS["cublas_tflops"]:
            row["of_cublas"] = row["tflops"] / RESULTS["cublas_tflops"]
    except Exception as exc:  # a candidate that does not compile or launch: note it, go on
        row["error"] = f"{type(exc).__name__}: {exc}"[:1500]
        row["traceback"] = traceback.format_exc()[-3000:]
    finally:
        row["seconds"] = time.time() - t0
        say(f"{row['status'].upper():6s} {row['label']:48s} "
            + (f"{row['tflops']:7.1f} TFLOP/s  regs {row.get('registers')} local {row.get('local_bytes')}"
               if row["status"] == "ok" else row.get("error", "")[:300])
            + f"  ({row['seconds']:.0f}s)")
    return row


def time_cublas(data):
    torch = __import__("torch")
    A, B, out = (torch.as_tensor(x, device="cuda") for x in data[:3])
    t = measure(lambda A, B, out: torch.matmul(A, B, out=out), [(A, B, out)], samples=10, budget_s=1.5)
    RESULTS["cublas_tflops"] = rate(t.median_us)
    say(f"cuBLAS fp16 (torch.matmul) at 8192^3: {RESULTS['cublas_tflops']:.1f} TFLOP/s")


def time_qlinear():
    """qlinear's stages: correct at an odd shape, then timed at 8192^3 (fused should beat unfused)."""
    from numba import cuda

    op = int8_gemm.qlinear_op
    rng = np.random.default_rng(9)
    host = op.make_inputs(HEADLINE, rng)
    args = [to_device(a) for a in host] + [cuda.device_array(HEADLINE[:2], np.float32)]
    for stage in op.stages:
        r = check_stage(stage, (127, 129, 131), np.random.default_rng(5))
        r2 = check_stage(stage, (200, 264, 336), np.random.default_rng(5))
        row = {"stage": stage.key, "odd_shapes_passed": r.passed and r2.passed}
        if row["odd_shapes_passed"]:
            t = measure(stage, [tuple(args)], samples=10, budget_s=1.5)
            row.update(median_us=t.median_us, tops=rate(t.median_us))
        if stage.key.endswith("fused") and not stage.key.endswith("unfused"):
            row.update(resources(int8_gemm.FUSED_KERNEL))
        RESULTS["qlinear"].append(row)
        say(f"QLINEAR {stage.key:18s} odd shapes {'PASS' if row['odd_shapes_passed'] else 'FAIL'}  "
            + (f"{row['tops']:7.1f} TOPS" if "tops" in row else "")
            + (f"  regs {row.get('registers')} local {row.get('local_bytes')}" if "registers" in row else ""))


def paste_line(name, geometry):
    fields = ", ".join(f"{k}={v}" for k, v in asdict(geometry).items())
    return f"{name} = Geometry({fields})"


def report():
    ok = sorted((r for r in RESULTS["candidates"] if r["status"] == "ok"), key=lambda r: -r["tflops"])
    print("\n| rank | geometry | TFLOP/s | of cuBLAS | regs | local B | compile+check s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for i, r in enumerate(ok, 1):
        print(f"| {i} | {r['label']} | {r['tflops']:.1f} | {100 * r.get('of_cublas', float('nan')):.1f}% | "
              f"{r.get('registers')} | {r.get('local_bytes')} | {r.get('compile_and_check_s', 0):.0f} |")
    for r in RESULTS["candidates"]:
        if r["status"] != "ok":
            print(f"| - | {r['label']} | {r['status']}: {r.get('error', '')[:120]} | | | | |")
    if not ok:
        print("\nNo candidate ran correctly: keep TUNED as it is.")
        return
    best = Geometry(**ok[0]["geometry"])
    RESULTS["best"] = paste_line("TUNED", best)
    print(f"\nFastest correct geometry: {ok[0]['tflops']:.1f} TFLOP/s. In solutions/hgemm.py, set\n    {RESULTS['best']}")
    pipeline_like = [r for r in ok if (r["geometry"]["bm"], r["geometry"]["bn"], r["geometry"]["wm"],
                                       r["geometry"]["wn"]) == (128, 128, 64, 32)]
    shipped = next((r for r in ok if Geometry(**r["geometry"]) == hgemm.PIPELINE), None)
    if pipeline_like and shipped and pipeline_like[0] is not shipped and pipeline_like[0]["tflops"] < ok[0]["tflops"]:
        RESULTS["pipeline"] = paste_line("PIPELINE", Geometry(**pipeline_like[0]["geometry"]))
        print(f"and, for stage 5 (same 128x128 tile of 64x32 warps, {pipeline_like[0]['tflops']:.1f} against "
              f"{shipped['tflops']:.1f} TFLOP/s as shipped; it must stay slower than TUNED):\n    {RESULTS['pipeline']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=220.0, help="seconds after which no new candidate starts")
    parser.add_argument("--only", type=int, default=None, help="the first N candidates only")
    args = parser.parse_args(argv)
    if device.is_simulator():
        print("No CUDA GPU here: this script times hgemm's tensor-core kernel on an H100/H200.")
        return 2
    from numba import cuda

    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    name = cuda.get_current_device().name
    RESULTS["device"] = name.decode() if isinstance(name, bytes) else str(name)
    say(f"device: {RESULTS['device']}")
    data = headline_data(np.random.default_rng(3))
    say("inputs and the sampled float64 reference ready")
    try:
        time_cublas(data)
    except Exception as exc:
        RESULTS["errors"].append(f"cuBLAS timing: {type(exc).__name__}: {exc}")
        say(f"ERROR cuBLAS timing: {exc}")
    candidates = CANDIDATES[:args.only] if args.only else CANDIDATES
    seen = set()
    slowest = 0.0
    for n, geometry in enumerate(candidates):
        if n == QLINEAR_AFTER:
            try:
                time_qlinear()
            except Exception as exc:
                RESULTS["errors"].append(f"qlinear: {type(exc).__name__}: {exc}")
                say(f"ERROR qlinear: {type(exc).__name__}: {exc}")
            save(out_dir)
        if geometry in seen:
            continue
        seen.add(geometry)
        left = args.budget - (time.time() - START)
        if left < max(10.0, 0.8 * slowest):
            say(f"budget: {len(candidates) - n} candidates not started ({left:.0f}s left)")
            RESULTS["errors"].append(f"{len(candidates) - n} candidates not started: out of time")
            break
        row = try_candidate(geometry, data)
        slowest = max(slowest, row["seconds"])
        save(out_dir)
    report()
    save(out_dir)
    say(f"wrote {out_dir / 'hgemm_sweep.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
