"""Record every figure in README and the notebooks in one run on a GPU: the device's peaks, then every
ladder (the main ladders at all their sizes, the rest at their headline size). Run from the repository
root: `python scripts/record_all.py` (about 7 minutes on an H200), then `workbench table --update-readme`,
`workbench plot OP` and `workbench notebooks build --execute --recorded`."""
import time

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from workbench.cli import main
full = ["reduction", "elementwise", "transpose", "softmax", "layernorm", "gemm", "gemm_bias_gelu", "gemm_batched"]
quick = ["rmsnorm", "residual_layernorm", "bias_relu_layernorm", "argmax", "histogram", "matvec", "scan", "stencil"]
t0 = time.time()
status = main(["peaks"])
for op in full + quick:
    print(f"=== {op} ({time.time() - t0:.0f} s)", flush=True)
    status |= main(["bench", op] + (["--quick"] if op in quick else []))
print(f"done in {time.time() - t0:.0f} s, status {status}")
raise SystemExit(status)
