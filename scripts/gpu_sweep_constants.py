"""On a GPU: one stage's module constants swept, each setting checked and timed as `workbench bench` does.

    python scripts/gpu_sweep_constants.py OUT.jsonl OP.STAGE SIZE "NAME=VALUE,NAME=VALUE" ["..." ...]

Each setting runs in a fresh process (numba reads a module's constants when it compiles a kernel): the
ladder's source is executed with those assignments replaced (``NAME = ...`` at the start of a line, which
must exist exactly once), so constants derived from them follow. The stage is then checked against the
float64 reference and timed at SIZE beside the operator's eager peer (``bench.bench_size``, nothing saved
to results/). An empty setting ("") times the module as it is. One JSON line per setting.

    python scripts/gpu_sweep_constants.py sweep.jsonl scan.decoupled_lookback 2**28 \\
        "" "ONE_PASS_THREADS=128,VECTORS=8" "ONE_PASS_THREADS=256,VECTORS=8"
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, re, sys, types
sys.path.insert(0, {root!r})
import workbench  # noqa: F401  (GPU or simulator, before numba)
import numpy as np
import solutions

op_name, stage_name = {target!r}.split(".")
from workbench import registry
op, _ = registry.resolve(op_name)
module = sys.modules[op.stages[0].launch.__module__]
path = module.__file__
source = open(path).read()
for assignment in {setting!r}.split(","):
    if not assignment:
        continue
    name, value = assignment.split("=", 1)
    source, count = re.subn(r"^" + name.strip() + r" = [^#\n]*", name.strip() + " = " + value.strip() + " ", source,
                            flags=re.M)
    assert count == 1, f"{{name}} is assigned {{count}} times at the start of a line in {{path}}"
fresh = types.ModuleType(module.__name__)
fresh.__file__ = path
sys.modules[module.__name__] = fresh
exec(compile(source, path, "exec"), fresh.__dict__)
op = next(o for o in vars(fresh).values() if getattr(o, "name", None) == op_name and hasattr(o, "stages"))
stage = next(s for s in op.stages if s.name == stage_name)
from workbench.bench import bench_size
from workbench.results import environment, stored_peaks
from workbench.sizes import check_size, parse_size
env = environment()
size = check_size(op, parse_size({size!r}))
records, failures = bench_size(op, [stage], size, stored_peaks(env["device"]) or {{}}, np.random.default_rng(0), env)
rows = [dict(stage=r["stage"], kind=r["kind"], median_us=r["median_us"], p10_us=r["p10_us"], p90_us=r["p90_us"],
             gbps=r.get("gbps"), gflops=r.get("gflops"), rel_err=r.get("rel_err")) for r in records]
print("ROW", json.dumps(dict(setting={setting!r}, size=list(size), records=rows, failures=failures)))
"""


def main() -> int:
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    out, target, size, settings = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    for setting in settings:
        done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), target=target, size=size,
                                                                  setting=setting)],
                              capture_output=True, text=True, timeout=300)
        rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if rows:
            row = json.loads(rows[0])
            summary = "  ".join(f"{r['stage']} {r['median_us']:.1f} us" + (f" {r['gbps']:.0f} GB/s" if r["gbps"] else "")
                                for r in row["records"])
            print(f"[{setting or 'as committed'}] {summary}" + (f"  FAILED {row['failures']}" if row["failures"] else ""),
                  flush=True)
        else:
            row = {"setting": setting, "error": (done.stdout + done.stderr)[-1500:]}
            print(f"[{setting}] failed\n{row['error']}", flush=True)
        with out.open("a") as f:
            f.write(json.dumps({"target": target, **row}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
