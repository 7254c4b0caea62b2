"""One run on an H100/H200 that checks and times the SpMV, COO->CSR and top-k ladders (issue 18, parts 3-4).

    python scripts/gpu_spmv_topk.py OUT_DIR [--budget 170]

In this order, each item on its own (a failure is reported and the run goes on):

1. The copy bandwidth (``workbench.peaks.copy_bandwidth``), for "% of copy" in the table.
2. Correctness of every stage at odd sizes (not multiples of any block or tile) and on the
   operators' adversarial inputs (empty CSR rows, a dense row, no entries at all; NaN, +-inf, -0.0,
   constant rows, long ties, ascending rows), through ``workbench.check.check_stage``: the float64
   reference, the poisoned output, inputs unchanged. One line per stage: how many checks passed, and
   the first failure's message.
3. Speed (``workbench.bench.bench_size``: each stage checked on the timed inputs first, inputs rotated
   through 3x L2, CUDA events, median), every stage and the peer in the same run, at the issue's
   sizes: SpMV with 2^20 rows and 16.8M non-zeros, uniform, power-law (rows up to 10^5 entries) and
   banded, against cuSPARSE (torch.mv on a sparse CSR tensor); COO->CSR at the same sizes, against
   torch's to_sparse_csr (its first stage left out on the power-law matrix: it sorts a row of 10^5
   entries with one thread); top-k at (4096, 32000, 50) and (4096, 128256, 50) against torch.topk (the
   full sort is left out at 128,256 columns: it takes seconds and teaches nothing new there).

4. A tuning run, if time is left: the last stages of SpMV and top-k with other module constants
   (top-k's SELECT_THREADS back at 256 at both shapes; SpMV's CHUNK and launch bound), each a fresh copy
   of the module, timed without the peer.

Prints a compact table (µs, GB/s by the operator's bytes model, % of copy, the peer's time divided
by the stage's: > 1 means faster than the library) and the issue's targets with PASS/FAIL, and writes
everything to ``OUT_DIR/gpu_spmv_topk.json``. New items stop being started once ``--budget`` seconds
(default 150: an item started then ends within 3 minutes) are spent; the JSON says what was skipped.
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
from workbench import device  # noqa: E402
from workbench.bench import bench_size  # noqa: E402
from workbench.check import adversarial_cases, check_stage  # noqa: E402
from workbench.ladder import size_label  # noqa: E402
from workbench.registry import load_operators  # noqa: E402
from workbench.results import environment  # noqa: E402

RESULTS = {"device": None, "peaks": {}, "checks": [], "records": [], "targets": [], "errors": [], "skipped": []}

CHECKS = {  # odd sizes; adversarial inputs at the middle one
    "spmv": [(1, 1, 1), (33, 5, 3), (1000, 7, 2), (65_537, 16, 1), (65_537, 31, 3), (2**17 + 1, 16, 2)],
    # (COO: no large power-law size: the first stage sorts a row of 10^5 entries with one thread)
    "coo_to_csr": [(1, 1, 1), (33, 5, 3), (1000, 7, 2), (65_537, 16, 1), (65_537, 31, 3)],
    "topk": [(1, 1, 1), (3, 129, 128), (64, 1000, 50), (257, 32000, 50), (128, 128_256, 128)],
}
VARIANTS = [  # a tuning run, last and within the budget: (module, stage, size, module constants changed)
    # bitonic_select now runs 128 threads a block (the last run's variant): the old 256 at both shapes, to confirm
    ("topk", "bitonic_select", (4096, 128_256, 50), {"SELECT_THREADS": 256}),
    ("topk", "bitonic_select", (4096, 32000, 50), {"SELECT_THREADS": 256}),
    # merge_path_chunked (new): tiles a warp walks, and a launch bound (the default, none, is 56 registers)
    ("spmv", "merge_path_chunked", (2**20, 16, 2), {"CHUNKED_BLOCKS_PER_SM": 6}),
    ("spmv", "merge_path_chunked", (2**20, 16, 2), {"CHUNK": 8}),
    ("spmv", "merge_path_chunked", (2**20, 16, 1), {"CHUNK": 2}),
    ("spmv", "merge_path_chunked", (2**20, 16, 1), {"CHUNKED_BLOCKS_PER_SM": 8}),
    ("topk", "bitonic_select", (4096, 32000, 50), {"SELECT_THREADS": 128, "ITEMS": 8, "SLOTS": 4096}),
]
TIMED = [  # (operator, size, stages to leave out): the four targets first
    ("spmv", (2**20, 16, 2), ()),
    ("spmv", (2**20, 16, 1), ()),
    ("topk", (4096, 32000, 50), ()),
    ("topk", (4096, 128_256, 50), ("full_sort",)),
    ("spmv", (2**20, 16, 3), ()),
    ("coo_to_csr", (2**20, 16, 1), ()),
    ("coo_to_csr", (2**20, 16, 2), ("atomic_scatter",)),
]




attempt = functools.partial(gpu_log.attempt, RESULTS["errors"])  # fn(*args), or None with the error kept


def check_op(op, sizes):
    rng = np.random.default_rng(11)
    mid = sizes[len(sizes) // 2]
    for stage in op.stages:
        results = [check_stage(stage, size, rng) for size in sizes]
        results += [check_stage(stage, mid, inputs=inputs, label=label)
                    for label, inputs in adversarial_cases(op, mid, rng)]
        failed = [r for r in results if not r.passed]
        for r in results:
            RESULTS["checks"].append({"stage": stage.key, "size": r.size, "inputs": r.inputs, "status": r.status,
                                      "rel_err": r.rel_err, "message": r.message[:500]})
        first = "" if not failed else (f": {size_label(tuple(failed[0].size))} ({failed[0].inputs}) "
                                       f"{failed[0].message[:200]}")
        say(f"{'PASS' if not failed else 'FAIL'} {stage.key:28s} {len(results) - len(failed)}/{len(results)} checks{first}")


def time_op(op, size, leave_out, peaks, env):
    stages = [s for s in op.stages if s.name not in leave_out]
    records, failures = bench_size(op, stages, size, peaks, np.random.default_rng(5), env,
                                   progress=lambda line: say(f"  timing {line}"))
    for f in failures:
        say(f"FAIL (not timed) {f[:300]}")
        RESULTS["errors"].append({"item": f"{op.name} @ {size_label(size)}", "error": f[:1000]})
    RESULTS["records"].extend(records)
    peer = next((r for r in records if r["kind"] == "peer"), None)
    say(f"{op.name} @ {size_label(size)}  ({', '.join(op.dims)})")
    say(f"    {'stage':22s} {'µs':>10s} {'GB/s':>8s} {'% copy':>7s} {'peer/stage':>10s}")
    for r in records:
        pct = f"{r['pct_of_peak']:.0f}" if r.get("pct_of_peak") is not None else "-"
        ratio = f"{peer['median_us'] / r['median_us']:.2f}x" if peer else "-"
        say(f"    {r['stage']:22s} {r['median_us']:10.1f} {r['gbps']:8.0f} {pct:>7s} {ratio:>10s}")
    return records


def variant_module(module, changes):
    """A fresh copy of a ladder module with some of its module constants changed (its kernels are
    compiled anew): what a tuning run compares, without editing the file."""
    import inspect
    import re
    import types

    source = inspect.getsource(module)
    for name, value in changes.items():
        source, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {value!r}  ", source, count=1, flags=re.M)
        if n != 1:
            raise ValueError(f"{module.__name__} has no module constant {name}")
    copy = types.ModuleType(f"{module.__name__}_variant")
    copy.__file__ = module.__file__
    exec(compile(source, module.__file__, "exec"), copy.__dict__)
    return copy


def time_variant(module_name, stage_name, size, changes, env):
    import importlib

    copy = variant_module(importlib.import_module(f"solutions.{module_name}"), changes)
    stage = copy.op[stage_name]
    records, failures = bench_size(copy.op, [stage], size, {}, np.random.default_rng(5), env, with_peer=False)
    for f in failures:
        say(f"FAIL (not timed) variant {changes}: {f[:300]}")
    for r in records:
        r["variant"] = changes
        RESULTS.setdefault("variants", []).append(r)
        say(f"VARIANT {module_name}.{stage_name} @ {size_label(size)} {changes}: {r['median_us']:.1f} µs")


def target(name, records, need_ratio):
    """The last stage's speed against the peer's: PASS when peer_time / stage_time >= need_ratio."""
    stages = [r for r in records if r["kind"] == "stage"]
    peer = next((r for r in records if r["kind"] == "peer"), None)
    if not stages or peer is None:
        say(f"TARGET {name}: not measured")
        RESULTS["targets"].append({"target": name, "passed": None})
        return
    last = stages[-1]
    ratio = peer["median_us"] / last["median_us"]
    ok = ratio >= need_ratio
    RESULTS["targets"].append({"target": name, "stage": last["stage"], "stage_us": last["median_us"],
                               "peer": peer["stage"], "peer_us": peer["median_us"], "ratio": ratio,
                               "need": need_ratio, "passed": ok})
    say(f"TARGET {'PASS' if ok else 'FAIL'} {name}: {last['stage']} {last['median_us']:.1f} µs, {peer['stage']} "
        f"{peer['median_us']:.1f} µs: {ratio:.2f}x (need >= {need_ratio}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--budget", type=float, default=150.0)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_file = args.out_dir / "gpu_spmv_topk.json"
    if device.is_simulator():
        raise SystemExit("no GPU: this script measures an H100/H200")
    ops = load_operators()
    env = environment()
    RESULTS["device"] = env.get("device")
    say(f"device: {env.get('device')}")

    from workbench.peaks import copy_bandwidth

    peaks = attempt("copy bandwidth", copy_bandwidth) or {}
    RESULTS["peaks"] = peaks
    say(f"copy bandwidth: {peaks.get('copy_gbps', float('nan')):.0f} GB/s")

    def over(what):
        if time.time() - START > args.budget:
            say(f"SKIP {what}: past the {args.budget:.0f} s budget")
            RESULTS["skipped"].append(what)
            return True
        return False

    for name, sizes in CHECKS.items():
        if name in ops and not over(f"checks of {name}"):
            attempt(f"checks of {name}", lambda: check_op(ops[name], sizes))
    measured = {}
    for name, size, leave_out in TIMED:
        if name in ops and not over(f"timing {name} @ {size_label(size)}"):
            measured[(name, size)] = attempt(f"timing {name} @ {size_label(size)}",
                                             lambda: time_op(ops[name], size, leave_out, peaks, env)) or []
        json.dump(RESULTS, open(out_file, "w"), indent=1, default=str)  # what there is so far, in case of a cut

    say("the issue's targets:")
    target("SpMV power-law (2^20 rows, 16.8M nnz) >= cuSPARSE", measured.get(("spmv", (2**20, 16, 2)), []), 1.0)
    target("SpMV uniform (2^20 rows, 16.8M nnz) >= 0.9x cuSPARSE", measured.get(("spmv", (2**20, 16, 1)), []), 0.9)
    target("top-k (4096, 32000, 50) >= torch.topk", measured.get(("topk", (4096, 32000, 50)), []), 1.0)
    target("top-k (4096, 128256, 50) >= torch.topk", measured.get(("topk", (4096, 128_256, 50)), []), 1.0)
    for module_name, stage_name, size, changes in VARIANTS:
        what = f"variant {module_name}.{stage_name} @ {size_label(size)} {changes}"
        if not over(what):
            attempt(what, lambda: time_variant(module_name, stage_name, size, changes, env))
    RESULTS["seconds"] = time.time() - START
    json.dump(RESULTS, open(out_file, "w"), indent=1, default=str)
    say(f"wrote {out_file}")


if __name__ == "__main__":
    main()
