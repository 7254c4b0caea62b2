"""One run on an H100/H200 for issue 16, item 2: softmax, LayerNorm and RMSNorm against torch and
torch.compile at every shape of the issue's table, and which of by_shape's kernels wins where.

    python scripts/gpu_norm_shapes.py OUT_DIR [--budget 130] [--no-compile]

For each (operator, shape) of SHAPES, in one process:

1. inputs from the operator's own ``make_inputs`` (its hard rows included: +-1e4, masked -inf rows,
   mean-1e4 rows, constant rows), the reference computed by the operator's torch expression in
   float64 on the GPU (numpy's float64 reference at 4096 x 128256 takes ~15 s and ~20 GB of memory);
2. every candidate checked first against it (NaN/inf where the reference has them, then the relative
   error in the norm, as ``workbench.check.compare`` judges, against the operator's tolerance): the
   last stage (by_shape), the stage it replaced as the last (softmax/layernorm ``ilp``, rmsnorm
   ``l1_reuse``), each register-resident kernel that takes that width (``warp_rows`` up to 1024
   columns, ``block_rows`` up to 16384, softmax's ``online_rows`` at any width from 1025) and the
   round-2 variants beside them (see ``table_kernels``: register caps, rows a block, layernorm
   block_rows with one barrier, the online softmax at 512 threads), torch eager (the operator's peer)
   and torch.compile of its torch expression
   (``workbench.peers.compiled_peer``: dynamic=False, fullgraph=True, one compile per shape, as the
   issue's figures were taken);
3. each candidate that passed timed with ``workbench.timing.measure`` (CUDA events, the inputs rotated
   through copies worth 3 L2 caches).

Prints one line per shape: by_shape's time, the fastest kernel of the table, ilp/l1_reuse, torch,
torch.compile, the winner, and MET/MISSED for the must-show (by_shape <= the faster of torch and
torch.compile); then a table of the main candidates' times, and every candidate and variant of each
shape ranked fastest first. Writes ``OUT_DIR/gpu_norm_shapes.json``.
Stops starting new shapes when ``--budget`` seconds are spent (default 130) and says which it skipped.
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
from workbench import device, peers  # noqa: E402
from workbench.results import environment  # noqa: E402
from workbench.timing import measure, rotation_count  # noqa: E402

from solutions import layernorm, softmax  # noqa: E402

# The issue's table (H200, torch 2.11, us): ours (the last stage then), torch, torch.compile.
SHAPES = [
    ("softmax", (32768, 4096), (292, 483, 319)), ("softmax", (65536, 2048), (299, 368, 441)),
    ("softmax", (8192, 32000), (1014, 860, 1114)), ("softmax", (4096, 128256), (2102, 2034, 2251)),
    ("softmax", (32768, 1024), (134, 82, 146)), ("softmax", (4096, 1024), (21.9, 18.8, 22.8)),
    ("layernorm", (32768, 4096), (287, 356, 255)), ("layernorm", (8192, 4096), (79, 98, 73)),
    ("layernorm", (4096, 12288), (165, 172, 162)), ("layernorm", (32768, 1024), (141, 106, 312)),
    ("layernorm", (4096, 1024), (22.9, 18.9, 43.7)),
    ("rmsnorm", (32768, 4096), (316, 359, 253)), ("rmsnorm", (16384, 8192), (412, 387, 316)),
    ("rmsnorm", (4096, 12288), (188, 155, 136)), ("rmsnorm", (32768, 1024), (115, 76, 159)),
]
OPERATORS = {"softmax": softmax.op, "layernorm": layernorm.op, "rmsnorm": layernorm.rmsnorm_op}
# The stage by_shape replaced as the last one, for each operator.
PREVIOUS_LAST = {"softmax": "ilp", "layernorm": "ilp", "rmsnorm": "l1_reuse"}


def table_kernels(name: str, cols: int) -> list[tuple[str, object]]:
    """Each kernel by_shape's table can pick that takes rows of this width, and the round-2 variants
    beside them, as (name, launch). Suffixes: _rN the kernel compiled with at most N registers a
    thread; _wN N rows (warps) a block; _uncapped layernorm's block_rows as ptxas compiles it (68
    registers, the kernel timed in round 1); _1bar its one-barrier variant; online_rows_512 the online
    softmax at round 1's 512 threads (the default is now 1024)."""
    if name == "softmax":
        found = [("warp_rows", softmax.warp_rows, softmax.WARP_ROW_COLS),
                 ("warp_rows_w1", lambda x, out: softmax.warp_rows(x, out, warps=1), softmax.WARP_ROW_COLS),
                 ("warp_rows_w8", lambda x, out: softmax.warp_rows(x, out, warps=8), softmax.WARP_ROW_COLS),
                 ("warp_rows_r48", lambda x, out: softmax.warp_rows(x, out, registers=48), softmax.WARP_ROW_COLS),
                 ("block_rows", softmax.block_rows, softmax.BLOCK_ROW_COLS),
                 ("block_rows_r48", lambda x, out: softmax.block_rows(x, out, registers=48), softmax.BLOCK_ROW_COLS),
                 ("online_rows", softmax.online_rows, None),
                 ("online_rows_512", lambda x, out: softmax.online_rows(x, out, threads=512), None)]
        if cols <= softmax.BLOCK_ROW_COLS:  # round 1: 1.8x to 13x slower than block_rows/warp_rows there
            found = [f for f in found if not f[0].startswith("online")]
    elif name == "layernorm":
        ln, limit = layernorm, layernorm.BLOCK_ROW_COLS
        found = [("warp_rows", ln.warp_rows, ln.WARP_ROW_COLS),
                 ("block_rows", ln.block_rows, limit)]
        if cols > ln.WARP_ROW_COLS:  # the variants where block_rows lost to ilp
            found += [("block_rows_r64", lambda *a: ln.block_rows(*a, registers=64), limit),
                      ("block_rows_uncapped", lambda *a: ln.block_rows(*a, registers=None), limit),
                      ("block_rows_1bar", lambda *a: ln.block_rows(*a, registers=None, one_barrier=True), limit),
                      ("block_rows_1bar_r64", lambda *a: ln.block_rows(*a, registers=64, one_barrier=True), limit)]
        if cols > 8192:  # 768 threads a row at 12288: 2 blocks fit on an SM only at <= 42 registers
            found.append(("block_rows_r40", lambda *a: ln.block_rows(*a, registers=40), limit))
    else:
        ln, limit = layernorm, layernorm.BLOCK_ROW_COLS
        found = [("warp_rows", ln.rmsnorm_warp_rows, ln.WARP_ROW_COLS),
                 ("block_rows", ln.rmsnorm_block_rows, limit)]
        if cols > ln.WARP_ROW_COLS:
            found += [("block_rows_r64", lambda *a: ln.rmsnorm_block_rows(*a, registers=64), limit),
                      ("block_rows_r48", lambda *a: ln.rmsnorm_block_rows(*a, registers=48), limit)]
        if cols > 8192:
            found.append(("block_rows_r40", lambda *a: ln.rmsnorm_block_rows(*a, registers=40), limit))
    return [(k, launch) for k, launch, limit in found if limit is None or cols <= limit]


def gpu_error(torch, got, ref) -> tuple[float, str]:
    """(relative error in the norm over the finite reference, '' or why it fails outright), as
    workbench.check.compare judges, computed on the GPU (the largest shape is 525 M elements)."""
    got = got.double()
    special = ~torch.isfinite(ref)
    same = (torch.isnan(ref) & torch.isnan(got)) | (ref == got)
    if bool((special & ~same).any()):
        return float("nan"), "differs where the reference is NaN/inf"
    finite = ~special
    if bool((~torch.isfinite(got) & finite).any()):
        return float("nan"), "NaN/inf where the reference is finite"
    diff = torch.where(finite, got - ref, torch.zeros((), dtype=ref.dtype, device=ref.device))
    scale = torch.linalg.vector_norm(torch.where(finite, ref, torch.zeros((), dtype=ref.dtype, device=ref.device)))
    return float(torch.linalg.vector_norm(diff) / scale), ""


def run_shape(name: str, size: tuple, issue: tuple, env: dict, with_compile: bool) -> dict:
    from numba import cuda

    torch = peers.torch()
    op = OPERATORS[name]
    t0 = time.time()
    host = op.make_inputs(size, np.random.default_rng(16))
    inputs = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in host]
    del host
    ref = op.torch_expression(torch, size)(*[a.double() for a in inputs])
    tol = op.tolerance_for(size, op.dtype)
    per_set = sum(a.numel() * 4 for a in inputs) + inputs[0].numel() * 4
    n_sets = rotation_count(per_set, env.get("l2_bytes") or 60 << 20, max_sets=16)
    sets_t = [inputs + [torch.empty_like(inputs[0])]]
    sets_t += [[a.clone() for a in inputs] + [torch.empty_like(inputs[0])] for _ in range(n_sets - 1)]
    arg_sets = [tuple(cuda.as_cuda_array(a) for a in s) for s in sets_t]

    stage = {s.name: s for s in op.stages}
    candidates = [("by_shape", stage["by_shape"].launch),
                  (PREVIOUS_LAST[name], stage[PREVIOUS_LAST[name]].launch)]
    candidates += table_kernels(name, size[1])
    peer = op.peer(size)
    if peer is not None:
        candidates.append(("torch", peer[1]))
    if with_compile:
        compiled = peers.compiled_peer(op, size)
        if compiled is not None:
            candidates.append(("torch.compile", compiled[1]))

    row = {"op": name, "size": list(size), "issue_us": dict(zip(("last_stage_then", "torch", "compile"), issue)),
           "tolerance": tol, "rotation_sets": n_sets, "candidates": {}, "failures": []}
    for label, launch in candidates:
        try:
            out_t = sets_t[0][-1]
            out_t.fill_(float("nan"))
            returned = launch(*arg_sets[0])
            torch.cuda.synchronize()
            got = (returned if isinstance(returned, torch.Tensor) else peers.as_torch(returned)) \
                if getattr(launch, "returns_output", False) else out_t
            err, why = gpu_error(torch, got, ref)
            if why or not err <= tol:
                row["failures"].append(f"{label}: {why or f'relative error {err:.2e} > {tol:.0e}'}")
                say(f"  FAIL {name} {size[0]}x{size[1]} {label}: {why or f'relative error {err:.2e}'}")
                continue
            timing = measure(launch, arg_sets, samples=10, budget_s=1.0)
            row["candidates"][label] = {"median_us": timing.median_us, "rel_err": err,
                                        "gbps": op.bytes_moved(size) / timing.median_us / 1e3}
        except Exception as exc:  # a compile error, an input a kernel refuses: one line, the run goes on
            row["failures"].append(f"{label}: {type(exc).__name__}: {str(exc).strip()[:300]}")
            say(f"  ERROR {name} {size[0]}x{size[1]} {label}: {type(exc).__name__}: {str(exc).strip()[:200]}")
    peers.clear_views()
    del sets_t, arg_sets, inputs, ref
    torch.cuda.empty_cache()
    row["seconds"] = round(time.time() - t0, 1)
    summarize(row)
    return row


def summarize(row: dict) -> None:
    c = {k: v["median_us"] for k, v in row["candidates"].items()}
    libraries = [c[k] for k in ("torch", "torch.compile") if k in c]
    kernels = {k: v for k, v in c.items() if k not in ("by_shape", "torch", "torch.compile", "ilp", "l1_reuse")}
    best_kernel = min(kernels, key=kernels.get) if kernels else None
    row["winner"] = min(c, key=c.get) if c else None
    row["best_table_kernel"] = best_kernel
    ours = c.get("by_shape")
    row["must_show"] = ("MET" if ours is not None and libraries and ours <= min(libraries) else
                        "MISSED" if ours is not None and libraries else "UNKNOWN")
    fmt = lambda k: f"{c[k]:8.1f}" if k in c else f"{'-':>8}"  # noqa: E731
    prev = PREVIOUS_LAST[row["op"]]
    say(f"{row['op']:9} {row['size'][0]:>6}x{row['size'][1]:<6} by_shape {fmt('by_shape')} | best kernel "
        f"{best_kernel or '-'}:{fmt(best_kernel) if best_kernel else '-'} | {prev} {fmt(prev)} | torch "
        f"{fmt('torch')} | compile {fmt('torch.compile')} | winner {row['winner']} | {row['must_show']}"
        f" ({row['seconds']:.0f} s)")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--budget", type=float, default=130.0)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if device.is_simulator() or peers.torch() is None:
        say("needs a GPU with torch: nothing measured")
        return 2
    env = environment()
    out = {"device": env["device"], "versions": env, "rows": [], "skipped": [], "errors": []}
    say(f"{env['device']}, torch {env.get('torch')}; budget {args.budget:.0f} s; times in us (CUDA events)")
    for name, size, issue in SHAPES:
        if time.time() - START > args.budget:
            out["skipped"].append(f"{name} {size[0]}x{size[1]}")
            continue
        row = gpu_log.attempt(out["errors"], f"{name} {size}", run_shape, name, size, issue, env,
                              not args.no_compile)
        if row is not None:
            out["rows"].append(row)
    say("every candidate (us; '-' not run at this width or failed):")
    names = ["by_shape", "warp_rows", "block_rows", "online_rows", "online_rows_512", "ilp", "l1_reuse",
             "torch", "torch.compile"]
    say(f"{'shape':26}" + "".join(f"{n[:12]:>13}" for n in names))
    for row in out["rows"]:
        c = row["candidates"]
        say(f"{row['op'] + ' ' + 'x'.join(map(str, row['size'])):26}"
            + "".join(f"{c[n]['median_us']:13.1f}" if n in c else f"{'-':>13}" for n in names))
    say("every candidate and variant, fastest first (us):")
    for row in out["rows"]:
        ranked = sorted(row["candidates"].items(), key=lambda kv: kv[1]["median_us"])
        say(f"{row['op'] + ' ' + 'x'.join(map(str, row['size'])):26}"
            + " < ".join(f"{k} {v['median_us']:.1f}" for k, v in ranked))
    met = sum(r["must_show"] == "MET" for r in out["rows"])
    say(f"must show (by_shape <= min(torch, torch.compile)): {met} of {len(out['rows'])} shapes met"
        + (f"; skipped for the budget: {', '.join(out['skipped'])}" if out["skipped"] else ""))
    (args.out / "gpu_norm_shapes.json").write_text(json.dumps(out, indent=1, default=str))
    say(f"wrote {args.out / 'gpu_norm_shapes.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
