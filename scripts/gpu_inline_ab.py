"""Time chosen stages at their operator's headline size, checked first, in one process: one side of an
A/B comparison between two builds of the same code (numba's IR inlining, ``inline=True``, against
NVVM's, ``forceinline=True``). Run it once per build, alternating builds, and compare the medians.

    python3 scripts/gpu_inline_ab.py LABEL OUT.jsonl op.stage [op.stage ...]

Appends one JSON line per stage to OUT.jsonl: label, stage, median and spread in microseconds, and the
compile-and-first-call time in seconds (the first call compiles)."""
import json
import sys
import time

import numpy as np


def main() -> None:
    label, out, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    from workbench.bench import bench_size
    from workbench.registry import load_operators
    from workbench.results import environment

    ops, env = load_operators(), environment()
    for target in targets:
        op_name, stage_name = target.split(".")
        op = ops[op_name]
        stage = next(s for s in op.stages if s.name == stage_name)
        started = time.perf_counter()
        records, failures = bench_size(op, [stage], op.headline_size, {}, np.random.default_rng(0), env,
                                       with_peer=False)
        line = {"label": label, "stage": target, "failures": failures, "seconds": round(time.perf_counter() - started, 1)}
        for r in records:
            line.update({k: r[k] for k in ("median_us", "p10_us", "p90_us") if k in r})
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
