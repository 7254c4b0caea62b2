"""One run on an H100/H200: the float32 attention's 3xTF32 kernel (attention.tensor_cores, which runs
``_flash_mma.launch_3xtf32``) in each layout of ``_flash_mma.TF32_SWEEP``, side by side with torch's
float32 SDPA (3xTF32 on tensor cores too), at 8x16x2048x64 without the mask; with --wide, the layouts
of ``_flash_mma.TF32_SWEEP_WIDE`` at 4x32x4096x128 (D = 128).

    python scripts/gpu_attention_3xtf32.py OUT_DIR [--wide]

Each layout is checked first (float64 reference at 1x2x333x64, causal and not; SDPA's output at the
headline), then timed (workbench.timing.measure: CUDA events after warm-up, median of 10 samples):
us, TFLOP/s, ratio to SDPA, registers and local bytes. Then the fastest, and the line to paste into
solutions/flash.py if it is not the tuned layout. Everything goes to OUT_DIR/gpu_attention_3xtf32[_wide].json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_log import say  # noqa: E402  (scripts/: the folder of the script being run)

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)
from workbench import peers, results  # noqa: E402
from workbench.ladder import size_label, to_device, to_host  # noqa: E402
from workbench.timing import measure  # noqa: E402

import solutions._flash_mma as flash  # noqa: E402
from solutions import attention  # noqa: E402
from solutions._attention_common import attention_flops  # noqa: E402

WIDE = "--wide" in sys.argv[1:]
SIZE = (4, 32, 4096, 128, 0) if WIDE else (8, 16, 2048, 64, 0)
CHECK = (1, 2, 333, SIZE[3])
SWEEP = flash.TF32_SWEEP_WIDE if WIDE else flash.TF32_SWEEP
DP = flash.padded_head_dim(SIZE[3])


def main(out_dir: Path) -> None:
    import torch

    out = {"device": results.environment(), "sweep": []}
    op = attention.op
    rng = np.random.default_rng(11)
    q, k, v, causal = (to_device(a) for a in op.make_inputs(SIZE, rng))
    result = to_device(op.make_output(SIZE))
    t = peers.as_torch
    expected = torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v)).cpu().numpy()
    sdpa = measure(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c),
                   [(t(q), t(k), t(v))], samples=10, budget_s=2.0)
    flops = attention_flops(SIZE)
    out["sdpa_us"] = sdpa.median_us
    say(f"{size_label(SIZE)}: torch SDPA float32 {sdpa.median_us:8.1f} us {flops / sdpa.median_us / 1e6:6.1f} TFLOP/s")
    small = [op.make_inputs(CHECK + (c,), rng) for c in (0, 1)]
    for g in SWEEP:
        row = {"label": g.label(), "geometry": g._asdict(), "tuned": g == flash.tf32_geometry(DP),
               "status": "failed"}
        out["sweep"].append(row)
        t0 = time.time()
        try:
            run = lambda *a, g=g: flash.launch_3xtf32(*a, geometry=g)  # noqa: E731
            for inputs in small:
                o = to_device(op.make_output(inputs[0].shape))
                run(*[to_device(a) for a in inputs], o)
                ref = op.reference(*inputs)
                err = float(np.max(np.abs(to_host(o) - ref)) / max(1.0, np.max(np.abs(ref))))
                tol = op.tolerance(CHECK + (int(inputs[3][0]),), np.float32)
                if not err < tol:
                    raise AssertionError(f"wrong at {size_label(CHECK)}: err {err:.3g} (tol {tol:.3g})")
            run(q, k, v, causal, result)
            err = float(np.max(np.abs(to_host(result) - expected)) / max(1.0, np.max(np.abs(expected))))
            if not err < 1e-4:
                raise AssertionError(f"differs from SDPA at the headline by {err:.3g}")
            (compiled,) = flash.build_3xtf32(DP, True, g).overloads.values()
            m = measure(run, [(q, k, v, causal, result)], samples=10, budget_s=2.0)
            row.update(status="ok", median_us=m.median_us, p10_us=m.p10_us, p90_us=m.p90_us, err_vs_sdpa=err,
                       tflops=flops / m.median_us / 1e6, vs_sdpa=sdpa.median_us / m.median_us,
                       registers=int(compiled.regs_per_thread), local_bytes=int(compiled.local_mem_per_thread))
        except Exception as exc:  # a layout that does not compile, launch or check: note it, go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        row["seconds"] = time.time() - t0
        say(f"{row['status'].upper():6s} {row['label']:24s}"
            + (f" {row['median_us']:8.1f} us {row['tflops']:5.1f} TFLOP/s {row['vs_sdpa']:.2f}x SDPA"
               f"  regs {row['registers']} local {row['local_bytes']}" if row["status"] == "ok" else " " + row["error"][:300])
            + ("  <- tuned" if row["tuned"] else "") + f"  ({row['seconds']:.0f}s)")
    ok = [r for r in out["sweep"] if r["status"] == "ok"]
    if ok:
        best = min(ok, key=lambda r: r["median_us"])
        out["best"] = best["label"]
        say(f"fastest: {best['label']} ({best['tflops']:.1f} TFLOP/s, {best['vs_sdpa']:.2f}x SDPA)")
        if not best["tuned"]:
            fields = ", ".join(f"{k}={v!r}" for k, v in best["geometry"].items())
            say(f"paste into solutions/flash.py: TF32Geometry({fields})")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"gpu_attention_3xtf32{'_wide' if WIDE else ''}.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(Path(paths[0] if paths else "."))
