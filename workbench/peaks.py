"""Ceilings measured on this device, not copied from a datasheet.

* memory: the best of a driver device-to-device copy and a numba copy kernel with four independent
  loads per thread, counting bytes read plus bytes written, on buffers far larger than L2;
* compute: the library's float32 matrix product (TF32 off), and TF32 / fp16 for the roofline's
  upper lines, through torch (or CuPy) where installed.

"% of peak" in every record divides by these.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .ladder import sm_count
from .results import environment, now
from .timing import measure

COPY_BYTES = 1 << 30  # 1 GiB per buffer: ~20x an H200's L2


@cuda.jit
def _copy4(src, dst):
    """Grid-stride copy, four independent loads in flight per thread."""
    n = src.size
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + 3 * stride < n:
        a = src[i]
        b = src[i + stride]
        c = src[i + 2 * stride]
        d = src[i + 3 * stride]
        dst[i] = a
        dst[i + stride] = b
        dst[i + 2 * stride] = c
        dst[i + 3 * stride] = d
        i += 4 * stride
    while i < n:
        dst[i] = src[i]
        i += stride


def _memcpy(src, dst):
    dst.copy_to_device(src)


def copy_bandwidth(nbytes: int = COPY_BYTES) -> dict:
    n = nbytes // 4
    src = cuda.to_device(np.random.default_rng(0).random(n, dtype=np.float32))
    dst = cuda.device_array(n, np.float32)
    moved = 2 * n * 4
    t_memcpy = measure(_memcpy, [(src, dst)], samples=15)
    blocks = sm_count() * 8

    def kernel_copy(s, d):
        _copy4[blocks, 256](s, d)

    t_kernel = measure(kernel_copy, [(src, dst)], samples=15)
    if not np.array_equal(dst.copy_to_host()[:1000], src.copy_to_host()[:1000]):
        raise RuntimeError("copy kernel produced wrong data; peak not recorded")
    gbps = {"memcpy": moved / t_memcpy.median_us / 1e3, "numba_copy4": moved / t_kernel.median_us / 1e3}
    return {"copy_gbps": max(gbps.values()), "copy_detail_gbps": gbps, "copy_bytes": moved}


def gemm_rates(n: int = 8192) -> dict:
    """fp32 / TF32 / fp16 GEMM rates of the library (GFLOP/s), if torch or CuPy is installed."""
    from . import peers

    torch = peers.torch()
    if torch is None:
        return {}
    flops = 2 * n**3
    out = {}
    for label, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True), ("fp16", torch.float16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        t = measure(lambda x, y, z: torch.matmul(x, y, out=z), [(a, b, c)], samples=7, budget_s=2.0)
        out[f"gemm_{label}_gflops"] = flops / t.median_us / 1e3
    torch.backends.cuda.matmul.allow_tf32 = False
    out["gemm_library"] = f"torch {torch.__version__} (cuBLAS), {n}^3"
    return out


def measure_peaks() -> dict:
    peaks = {"date": now(), "environment": environment()}
    peaks.update(copy_bandwidth())
    peaks.update(gemm_rates())
    return peaks
