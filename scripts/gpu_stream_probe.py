#!/usr/bin/env python3
"""Why do torch's elementwise kernels stream faster than ours? Variants of a float32 ReLU at 2^28
elements (1 GiB in, 1 GiB out), timed in one process beside torch's clamp and copy_.

    python3 scripts/gpu_stream_probe.py OUT_DIR           # ReLU
    python3 scripts/gpu_stream_probe.py OUT_DIR --chain   # GELU(x + bias) + residual at 16384 x 16384

With --chain: the elementwise ladder's chain (two streams read, one written, erff per element), its
last stage, torch eager and torch.compile, and the one-tile-a-block kernel with 1, 2 or 4 vectors a
thread (x and residual by 16-byte loads, the bias by element).

Variants: the workbench's ``act_relu.in_flight`` stage; the same one-tile-per-block kernel with 1, 2, 4 or
8 16-byte vectors a thread and 128-1024 threads a block; and with cache hints from CUDA C++ (loads that do
not allocate in L1, ``ld.global.nc.L1::no_allocate``; stores marked streaming, ``st.global.cs``, which
L2 may evict first). Each is checked against torch's result, then timed: CUDA events around 20
back-to-back launches, median of 9 samples. Writes OUT_DIR/stream_probe.json."""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import workbench  # noqa: E402,F401  (decides GPU or simulator before numba is imported)
from numba import cuda, float32, uint64  # noqa: E402

from solutions._vector_io import load4, store4  # noqa: E402

HINTS_CU = r"""
struct f32x4 { float x, y, z, w; };
extern "C" __device__ int load4_no_l1(f32x4* r, unsigned long long address)
{
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r->x), "=f"(r->y), "=f"(r->z), "=f"(r->w) : "l"(address));
    return 0;
}
extern "C" __device__ int store4_streaming(int* result, unsigned long long address, float a, float b, float c, float d)
{
    asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(address), "f"(a), "f"(b), "f"(c), "f"(d));
    *result = 0;
    return 0;
}
"""
N = 1 << 28


def relu(v):
    return v if v > float32(0.0) else float32(0.0)


relu = cuda.jit(device=True, inline=True)(relu)


def make_kernel(vectors, hints):
    """One tile a block: thread t of block b handles vectors b*V*T*4 + 4t + k*4T, k < V (no tail: N is a
    multiple of every tile)."""
    if not hints:
        @cuda.jit
        def plain(x, out):
            step = uint64(4) * uint64(cuda.blockDim.x)
            i = uint64(cuda.blockIdx.x) * step * uint64(vectors) + uint64(4) * uint64(cuda.threadIdx.x)
            vals = cuda.local.array((vectors, 4), float32)
            for k in range(vectors):
                vals[k, 0], vals[k, 1], vals[k, 2], vals[k, 3] = load4(x, i + uint64(k) * step)
            for k in range(vectors):
                store4(out, i + uint64(k) * step, relu(vals[k, 0]), relu(vals[k, 1]), relu(vals[k, 2]), relu(vals[k, 3]))
        return plain

    cu = Path(tempfile.gettempdir()) / "stream_hints.cu"
    cu.write_text(HINTS_CU)
    load = cuda.declare_device("load4_no_l1", "UniTuple(float32, 4)(uint64)", link=str(cu))
    store = cuda.declare_device("store4_streaming", "int32(uint64, float32, float32, float32, float32)", link=str(cu))

    @cuda.jit
    def hinted(x, out):
        step = uint64(4) * uint64(cuda.blockDim.x)
        i = uint64(cuda.blockIdx.x) * step * uint64(vectors) + uint64(4) * uint64(cuda.threadIdx.x)
        vals = cuda.local.array((vectors, 4), float32)
        for k in range(vectors):
            vals[k, 0], vals[k, 1], vals[k, 2], vals[k, 3] = load(x.ctypes.data + (i + uint64(k) * step) * uint64(4))
        for k in range(vectors):
            store(out.ctypes.data + (i + uint64(k) * step) * uint64(4),
                  relu(vals[k, 0]), relu(vals[k, 1]), relu(vals[k, 2]), relu(vals[k, 3]))
    return hinted


def make_chain_kernel(vectors):
    from solutions.elementwise import gelu

    @cuda.jit
    def chain(x, bias, residual, out):
        cols = uint64(bias.size)
        step = uint64(4) * uint64(cuda.blockDim.x)
        i = uint64(cuda.blockIdx.x) * step * uint64(vectors) + uint64(4) * uint64(cuda.threadIdx.x)
        xs = cuda.local.array((vectors, 4), float32)
        rs = cuda.local.array((vectors, 4), float32)
        for k in range(vectors):
            j = i + uint64(k) * step
            xs[k, 0], xs[k, 1], xs[k, 2], xs[k, 3] = load4(x, j)
            rs[k, 0], rs[k, 1], rs[k, 2], rs[k, 3] = load4(residual, j)
        for k in range(vectors):
            j = i + uint64(k) * step
            c = j % cols  # cols % 4 == 0: the four columns do not wrap
            store4(out, j, gelu(xs[k, 0] + bias[c]) + rs[k, 0], gelu(xs[k, 1] + bias[c + uint64(1)]) + rs[k, 1],
                   gelu(xs[k, 2] + bias[c + uint64(2)]) + rs[k, 2], gelu(xs[k, 3] + bias[c + uint64(3)]) + rs[k, 3])
    return chain


def chain_main(out_dir):
    import torch

    from solutions import elementwise

    rows = cols = 16384
    n = rows * cols
    g = torch.Generator(device="cuda").manual_seed(0)
    x_t = torch.randn(rows, cols, device="cuda", generator=g)
    b_t = torch.randn(cols, device="cuda", generator=g)
    r_t = torch.randn(rows, cols, device="cuda", generator=g)
    y_t = torch.empty_like(x_t)
    expr = lambda x, b, r: torch.nn.functional.gelu(x + b) + r  # noqa: E731
    want = expr(x_t, b_t, r_t)
    compiled = torch.compile(expr)
    x, b, r, y = (cuda.as_cuda_array(t) for t in (x_t, b_t, r_t, y_t))
    xf, rf, yf = (a.reshape(a.size) for a in (x, r, y))
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    rows_out = []

    def record(name, launch, produces=True):
        y_t.fill_(float("nan"))
        got = launch()
        cuda.synchronize()
        result = got if got is not None else y_t
        ok = bool(torch.allclose(result, want, rtol=1e-5, atol=1e-5)) if produces else None
        med, lo, hi = time_us(launch, start, end, reps=10)
        rows_out.append({"variant": name, "correct": ok, "median_us": med, "min_us": lo, "max_us": hi,
                         "gbps": 12 * n / med / 1e3})
        print(f"{name:<44} {med:8.1f} us {12 * n / med / 1e3:7.0f} GB/s  correct={ok}", flush=True)

    record("torch eager", lambda: expr(x_t, b_t, r_t))
    record("torch.compile", lambda: compiled(x_t, b_t, r_t))
    record("workbench elementwise.ilp8_unsigned", lambda: elementwise.ilp8_unsigned.launch(x, b, r, y))
    for vectors in (1, 2, 4):
        kernel = make_chain_kernel(vectors)
        for threads in (128, 256, 512):
            blocks = n // (4 * vectors * threads)
            record(f"chain tile V={vectors} T={threads}", lambda k=kernel, bl=blocks, t=threads: k[bl, t](xf, b, rf, yf))
    record("torch.compile again", lambda: compiled(x_t, b_t, r_t))
    (out_dir / "chain_probe.json").write_text(json.dumps({"shape": [rows, cols], "device": torch.cuda.get_device_name(),
                                                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                          "rows": rows_out}, indent=1))


def time_us(launch, start, end, reps=20, samples=9):
    launch()
    cuda.synchronize()
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(reps):
            launch()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) * 1000 / reps)
    return float(np.median(times)), float(min(times)), float(max(times))


def main() -> None:
    import torch

    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out/stream_probe")
    out_dir.mkdir(parents=True, exist_ok=True)
    if "--chain" in sys.argv:
        chain_main(out_dir)
        sys.stdout.flush()
        os._exit(0)
    x_t = torch.randn(N, device="cuda")
    y_t = torch.empty_like(x_t)
    want = torch.clamp(x_t, min=0)
    x, y = cuda.as_cuda_array(x_t), cuda.as_cuda_array(y_t)
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    rows = []

    def record(name, launch, check=True):
        y_t.fill_(float("nan"))
        launch()
        cuda.synchronize()
        ok = bool(torch.equal(y_t, want)) if check else None
        med, lo, hi = time_us(launch, start, end)
        rows.append({"variant": name, "correct": ok, "median_us": med, "min_us": lo, "max_us": hi,
                     "gbps": 2 * 4 * N / med / 1e3})
        print(f"{name:<44} {med:8.1f} us {2 * 4 * N / med / 1e3:7.0f} GB/s  correct={ok}", flush=True)

    record("torch.clamp(min=0, out=)", lambda: torch.clamp(x_t, min=0, out=y_t))
    record("torch copy_", lambda: y_t.copy_(x_t), check=False)
    from workbench.registry import load_operators
    stage = load_operators()["act_relu"]["in_flight"]
    record("workbench act_relu.in_flight", lambda: stage.launch(x, y))
    for hints in (False, True):
        for vectors in (1, 2, 4, 8):
            kernel = make_kernel(vectors, hints)
            for threads in (128, 256, 512, 1024):
                blocks = N // (4 * vectors * threads)
                record(f"tile V={vectors} T={threads}{' hints' if hints else ''}",
                       lambda k=kernel, b=blocks, t=threads: k[b, t](x, y))
    record("torch.clamp(min=0, out=) again", lambda: torch.clamp(x_t, min=0, out=y_t))
    (out_dir / "stream_probe.json").write_text(json.dumps({"n": N, "device": torch.cuda.get_device_name(),
                                                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                           "rows": rows}, indent=1))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
