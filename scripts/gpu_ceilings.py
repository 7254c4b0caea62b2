"""One run on an H100/H200 that measures the memory ceilings by access pattern (issue 16, item 1).

    python3 scripts/gpu_ceilings.py OUT_DIR

1. The three streams workbench.peaks measures (each kernel checked against numpy first): read-only (a sum
   of 1 GiB), copy (the best of memcpy and the numba copy, as recorded since the first run) and two reads
   per write (z = x + y, 1 GiB each), beside NVIDIA's datasheet figure; each twice, to show the spread.
2. The same three patterns done by torch (torch.sum, a device-to-device copy_, torch.add(out=)), timed the
   same way: a stream kernel well below its torch counterpart would make a ceiling too low.
3. What the new ceilings change: for every memory-bound operator whose pattern is not copy, its best
   stage and its library peer at the headline size as recorded in results/, "% of peak" against copy
   (today's figure) and against its own pattern's ceiling just measured.

Prints a compact table; everything goes to OUT_DIR/gpu_ceilings.json. Nothing is written to results/:
`python3 -m workbench peaks --measure` records the ceilings. About a minute on an H200.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_log  # noqa: E402  (scripts/: the folder of the script being run)
from gpu_log import say  # noqa: E402

import workbench  # noqa: E402,F401  (chooses the GPU before numba is imported)
from workbench import bench, peaks, registry, results  # noqa: E402

GIB = 1 << 30


def ceilings(errors: list) -> list[dict]:
    runs = []
    for k in range(2):
        got = gpu_log.attempt(errors, f"stream ceilings, run {k + 1}", peaks.stream_ceilings)
        if got:
            runs.append(got)
            say(f"run {k + 1}: read {got['read_gbps']:.0f}  copy {got['copy_gbps']:.0f} "
                f"(memcpy {got['copy_detail_gbps']['memcpy']:.0f}, numba copy {got['copy_detail_gbps']['numba_copy4']:.0f})  "
                f"2 reads + 1 write {got['read2_write1_gbps']:.0f} GB/s; datasheet {got['datasheet_gbps']}")
    return runs


def torch_patterns() -> dict:
    out = peaks.library_streams(GIB)
    for key, gbps in out.items():
        say(f"torch {key}: {gbps:.0f} GB/s")
    return out


def what_changes(measured: dict, device: str) -> list[dict]:
    path = results.path_for(device)
    if not path.exists():
        say(f"no recorded results for {device}: nothing to compare")
        return []
    data = results.load(path)
    rows = []
    for op in sorted(registry.load_operators().values(), key=lambda o: (o.rank, o.name)):
        if op.bound != "memory" or op.pattern == "copy":
            continue
        recs = results.headline(results.records_for(op.name, data), op.headline_size)
        best = max((r for r in recs if r.get("kind") == "stage"), key=lambda r: r["gbps"], default=None)
        for r in [best] + [r for r in recs if r.get("kind") == "peer"]:
            if r is None:
                continue
            key = bench.PATTERN_PEAK[op.pattern]
            rows.append({"op": op.name, "pattern": op.pattern, "stage": r["stage"], "size": r["size_label"],
                         "gbps": r["gbps"], "pct_of_copy": 100 * r["gbps"] / measured["copy_gbps"],
                         "pct_of_own": 100 * r["gbps"] / measured[key], "ceiling_key": key})
    return rows


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out/gpu_ceilings")
    out_dir.mkdir(parents=True, exist_ok=True)
    errors: list = []
    env = results.environment()
    say(f"device {env.get('device')}, numba-cuda {env.get('numba_cuda')}, torch {env.get('torch')}")
    runs = ceilings(errors)
    library = gpu_log.attempt(errors, "torch patterns", torch_patterns) or {}
    best = {k: max(r[k] for r in runs) for k in ("read_gbps", "copy_gbps", "read2_write1_gbps")} if runs else {}
    changes = gpu_log.attempt(errors, "what changes", what_changes, best, env["device"]) if best else []
    if best:
        sheet = runs[0]["datasheet_gbps"]
        print(f"\n{'pattern':<14}{'GB/s (runs)':>22}{'% datasheet':>13}")
        for key in ("read_gbps", "copy_gbps", "read2_write1_gbps"):
            spread = " / ".join(f"{r[key]:.0f}" for r in runs)
            print(f"{key[:-5]:<14}{spread:>22}{(100 * best[key] / sheet if sheet else float('nan')):>12.0f}%")
        print(f"{'datasheet':<14}{sheet or float('nan'):>22.0f}")
    if changes:
        print(f"\n{'operator':<16}{'stage':<28}{'GB/s':>7}{'% copy':>8}{'% own':>8}  own ceiling")
        for c in changes:
            print(f"{c['op']:<16}{c['stage'][:27]:<28}{c['gbps']:>7.0f}{c['pct_of_copy']:>8.0f}{c['pct_of_own']:>8.0f}"
                  f"  {c['pattern']}")
    result = {"environment": env, "runs": runs, "best": best, "torch_gbps": library, "changes": changes or [],
              "errors": errors}
    (out_dir / "gpu_ceilings.json").write_text(json.dumps(result, indent=1, default=str))
    say(f"wrote {out_dir / 'gpu_ceilings.json'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
