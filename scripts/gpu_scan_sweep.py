"""On a GPU: the decoupled look-back scan's block shape, swept (threads a block x 16-byte vectors a thread).

    python scripts/gpu_scan_sweep.py OUT.jsonl [THREADSxVECTORS ...]

Each configuration runs in a fresh process (numba reads the module's constants when it compiles), checks
the scan at 2^28 + 3 against a float64 cumsum, and times it at 2^28 beside torch.cumsum and a copy
(workbench.timing.measure, inputs rotated beyond L2). One JSON line per configuration.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys
sys.path.insert(0, {root!r})
import workbench  # noqa: F401  (GPU or simulator, before numba)
import numpy as np
from numba import cuda
from solutions import scan
scan.ONE_PASS_THREADS, scan.VECTORS = {threads}, {vectors}
scan.ONE_PASS_WARPS = scan.ONE_PASS_THREADS // 32
scan.VALUES = 4 * scan.VECTORS
scan.ROW = 4 * scan.ONE_PASS_THREADS
scan.ONE_PASS_TILE = scan.VECTORS * scan.ROW
from workbench import timing
from workbench.peers import torch

rng = np.random.default_rng(0)
n = 2**28
x = rng.standard_normal(n + 3).astype(np.float32)
dx, dy = cuda.to_device(x), cuda.device_array(n + 3, np.float32)
scan.decoupled_lookback.launch(dx, dy)
want = np.cumsum(x, dtype=np.float64)
err = float(np.linalg.norm(dy.copy_to_host() - want) / np.linalg.norm(want))
sets = [(cuda.to_device(x[:n]), cuda.device_array(n, np.float32)) for _ in range(2)]
t = timing.measure(scan.decoupled_lookback.launch, sets, samples=15)
row = dict(threads={threads}, vectors={vectors}, tile=scan.ONE_PASS_TILE, rel_err=err, median_us=t.median_us,
           p10_us=t.p10_us, p90_us=t.p90_us, gbps=8 * n / t.median_us / 1e3)
tc = torch()
if tc is not None:
    tx = [tc.as_tensor(s[0], device="cuda") for s in sets]
    ty = tc.empty(n, device="cuda")
    row["torch_cumsum_us"] = timing.measure(lambda a: tc.cumsum(a, 0, out=ty), [(a,) for a in tx], samples=15).median_us
print("ROW", json.dumps(row))
"""


def main() -> int:
    out = Path(sys.argv[1])
    configs = sys.argv[2:] or ["256x4", "128x4", "512x4", "256x2", "256x8", "128x8", "512x2"]
    for config in configs:
        threads, vectors = (int(v) for v in config.split("x"))
        done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), threads=threads, vectors=vectors)],
                              capture_output=True, text=True, timeout=300)
        rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if rows:
            row = json.loads(rows[0])
            print(f"{config:>6}: {row['median_us']:8.1f} us  {row['gbps']:6.0f} GB/s  err {row['rel_err']:.1e}  "
                  f"torch.cumsum {row.get('torch_cumsum_us', float('nan')):.1f} us", flush=True)
        else:
            row = {"threads": threads, "vectors": vectors, "error": (done.stdout + done.stderr)[-1500:]}
            print(f"{config:>6}: failed\n{row['error']}", flush=True)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
