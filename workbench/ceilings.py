"""Ceilings measured on this device, not copied from a datasheet.

* memory: three streams, each counting every byte read plus every byte written, on buffers far larger
  than L2, timed with CUDA events (median of repeats):

  - ``read_gbps``: a sum of a large buffer (every byte read once, one number written), the best of a grid
    sized to the data and a resident grid: the ceiling of a reduction, an argmax, a histogram, a
    matrix-vector product;
  - ``copy_gbps``: one byte written per byte read, the best of a driver device-to-device copy, a
    numba copy kernel with four independent loads per thread and one copying a 16-byte vector a thread
    (at three block sizes);
  - ``read2_write1_gbps``: z = x + y, two bytes read per byte written: the ceiling of an elementwise
    kernel with a residual;

  and ``datasheet_gbps``, NVIDIA's figure for the device, shown beside them and never divided by (no
  kernel reaches it: refresh cycles, ECC and page switches take their share of the pins' rate);
* compute: the library's float32 matrix product (TF32 off), and TF32 / fp16 for the roofline's
  upper lines, through torch (or CuPy) where installed.

"% of peak" in every record divides by these: a memory-bound operator by the stream of its own
``Operator.pattern`` where it was measured (else by ``copy_gbps``), a compute-bound one by the
library GEMM in its precision (``workbench.bench.peak_key``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import cuda, float32, float64

from .device import is_simulator
from .ladder import blocks_for, sm_count
from .results import environment, now
from . import timing

COPY_BYTES = 1 << 30  # 1 GiB per buffer: ~20x an H200's L2
STREAM_THREADS = 256
STREAM_WARPS = STREAM_THREADS // 32
READ_QUADS = 4  # 16-byte loads in flight per thread in the read stream
# The one-vector-a-thread copy at each of these block sizes (the activations' small_tiles stage runs 128): the
# ceiling is the best of them, so that no elementwise kernel of another block size moves more than "copy" does.
VECTOR_COPY_THREADS = (128, 256, 512)
ADD_QUADS = 2  # quads of each input per thread in z = x + y: four 16-byte loads in flight
# z = x + y is timed with each (quads of each input a thread, threads a block): one quad a thread in blocks
# of 128, as the elementwise ladder's vector_tiles, of 256, and two quads in blocks of 256
ADD_LAYOUTS = ((1, 128), (1, STREAM_THREADS), (ADD_QUADS, STREAM_THREADS))
SAMPLES = 15

# NVIDIA's memory bandwidth for each device, in GB/s, from its product pages (nvidia.com/en-us/data-center/
# h200/, /h100/, /a100/, "GPU memory bandwidth"). Matched against the CUDA device name, first match wins:
# the driver calls an H100 SXM "NVIDIA H100 80GB HBM3" and an A100 SXM "NVIDIA A100-SXM4-80GB".
DATASHEET_GBPS = (
    (("H200",), 4800.0),
    (("H100", "PCIe"), 2000.0),
    (("H100", "NVL"), 3900.0),
    (("H100",), 3350.0),  # SXM5
    (("A100", "80GB", "PCIe"), 1935.0),
    (("A100", "80GB"), 2039.0),  # SXM4
    (("A100",), 1555.0),  # 40GB, SXM4 and PCIe
)


# How each pattern's ceiling is measured (what `workbench peaks` prints beside it).
MEASURED_BY = {"read": "sum of a 1 GiB float32 buffer", "copy": "best of memcpy and a numba copy",
               "read2_write1": "z = x + y, 1 GiB each"}


def datasheet_gbps(device_name: str) -> float | None:
    """NVIDIA's published memory bandwidth of a device (GB/s), or None for a device not in the table."""
    name = device_name.upper()
    for words, gbps in DATASHEET_GBPS:
        if all(w.upper() in name for w in words):
            return gbps
    return None


# -- 16-byte loads and stores -------------------------------------------------------------------
# numba has no float4 and will not merge four neighbouring x[i] loads into one vector load (it cannot
# prove the alignment). The same two intrinsics as solutions/_vector_io.py (which the model cannot
# import: it is the answer key's): one LLVM `load <4 x float>, align 16`, i.e. `ld.global.v4.f32`.
# The caller promises i % 4 == 0 and a 16-byte aligned array (a fresh allocation is). In the simulator,
# plain element-by-element functions with the same meaning.

if is_simulator():
    @cuda.jit(device=True)
    def _load4(a, i):
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    @cuda.jit(device=True)
    def _store4(a, i, v):
        a[i], a[i + 1], a[i + 2], a[i + 3] = v[0], v[1], v[2], v[3]

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _vector_pointer(context, builder, array_type, array, index):
        data = context.make_array(array_type)(context, builder, value=array).data
        vector = ir.VectorType(context.get_value_type(array_type.dtype), 4)
        return builder.bitcast(builder.gep(data, [index]), vector.as_pointer())

    @intrinsic
    def _load4(typingctx, array, index):
        sig = types.UniTuple(array.dtype, 4)(array, index)

        def codegen(context, builder, signature, args):
            vector = builder.load(_vector_pointer(context, builder, signature.args[0], *args), align=16)
            parts = [builder.extract_element(vector, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, parts)

        return sig, codegen

    @intrinsic
    def _store4(typingctx, array, index, values):
        sig = types.void(array, index, values)

        def codegen(context, builder, signature, args):
            pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
            vector = ir.Constant(pointer.type.pointee, ir.Undefined)
            for k in range(4):
                vector = builder.insert_element(vector, builder.extract_value(args[2], k),
                                                ir.Constant(ir.IntType(32), k))
            builder.store(vector, pointer, align=16)
            return context.get_dummy_value()

        return sig, codegen


# -- the three streams ----------------------------------------------------------------------------

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


@cuda.jit
def _copy_vectors(src, dst):
    """One 16-byte vector a thread on a grid sized to the data: the fastest streaming layout the stream
    probe found on the H200 (results/runs/gpu_stream_probe_2026-11-24.json)."""
    quads = src.size // 4
    q = cuda.grid(1)
    if q < quads:
        _store4(dst, 4 * q, _load4(src, 4 * q))
    tail = 4 * quads + q  # the last size % 4 elements, one per thread
    if tail < src.size:
        dst[tail] = src[tail]


@cuda.jit(device=True, inline=True)
def _sum4(v):
    return (v[0] + v[1]) + (v[2] + v[3])


@cuda.jit
def _read_sum(src, total):
    """total[0] += sum(src). Grid-stride over 16-byte quads, four (READ_QUADS) in flight per thread; then
    a warp sum (shuffles), a block sum (shared memory) and one float64 atomic per block."""
    quads = src.size // 4
    stride = cuda.gridsize(1)
    q = cuda.grid(1)
    acc = float32(0)
    while q + 3 * stride < quads:
        a = _load4(src, 4 * q)
        b = _load4(src, 4 * (q + stride))
        c = _load4(src, 4 * (q + 2 * stride))
        d = _load4(src, 4 * (q + 3 * stride))
        acc += (_sum4(a) + _sum4(b)) + (_sum4(c) + _sum4(d))
        q += 4 * stride
    while q < quads:
        acc += _sum4(_load4(src, 4 * q))
        q += stride
    tail = 4 * quads + cuda.grid(1)  # the last size % 4 elements, one per thread
    if tail < src.size:
        acc += src[tail]
    offset = 16
    while offset > 0:
        acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, offset)
        offset //= 2
    warp_sums = cuda.shared.array(STREAM_WARPS, float32)
    warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
    if lane == 0:
        warp_sums[warp] = acc
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        block = float64(0)
        for w in range(STREAM_WARPS):
            block += warp_sums[w]
        cuda.atomic.add(total, 0, block)


@cuda.jit
def _add(x, y, z):
    """z = x + y. Grid-stride over 16-byte quads: two (ADD_QUADS) of each input per thread, four loads in
    flight (four of each would take 41 registers, for no more bandwidth: 64 bytes in flight per thread,
    2048 threads an SM, already cover the memory latency many times over)."""
    quads = x.size // 4
    stride = cuda.gridsize(1)
    q = cuda.grid(1)
    while q + stride < quads:
        i, j = 4 * q, 4 * (q + stride)
        xi, xj, yi, yj = _load4(x, i), _load4(x, j), _load4(y, i), _load4(y, j)
        _store4(z, i, (xi[0] + yi[0], xi[1] + yi[1], xi[2] + yi[2], xi[3] + yi[3]))
        _store4(z, j, (xj[0] + yj[0], xj[1] + yj[1], xj[2] + yj[2], xj[3] + yj[3]))
        q += 2 * stride
    if q < quads:
        a, b = _load4(x, 4 * q), _load4(y, 4 * q)
        _store4(z, 4 * q, (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]))
    tail = 4 * quads + cuda.grid(1)
    if tail < x.size:
        z[tail] = x[tail] + y[tail]


def stream_blocks(n: int, quads_per_thread: int) -> int:
    """A grid sized to the data: each thread loads its quads once (the kernels' grid-stride loops make one
    trip). Tens of thousands of blocks on a large buffer, so the last partial wave costs nothing, whatever
    number of blocks an SM holds at the kernel's register count."""
    return blocks_for(n, STREAM_THREADS * quads_per_thread * 4)


def read_sum(src, total) -> None:
    """total[0] += sum(src) for a float32 device vector src (16-byte aligned) and a float64 total."""
    _read_sum[stream_blocks(src.size, READ_QUADS), STREAM_THREADS](src, total)


def read_sum_resident(src, total) -> None:
    """The same sum on a grid the GPU holds at once (eight blocks an SM), each thread looping over many
    quads: the layout of the reductions' one-pass kernels. On the H200 it read 1 GiB at 4581 GB/s against
    the data-sized grid's 4277 (`workbench peaks --measure`, 2026-11-24)."""
    _read_sum[min(stream_blocks(src.size, READ_QUADS), sm_count() * 2048 // STREAM_THREADS), STREAM_THREADS](
        src, total)


def add(x, y, z, quads_per_thread: int = ADD_QUADS, threads: int = STREAM_THREADS) -> None:
    """z = x + y for float32 device vectors of one size (16-byte aligned), on a grid sized to the data:
    ``quads_per_thread`` quads of each input a thread, ``threads`` a block."""
    _add[blocks_for(x.size, threads * quads_per_thread * 4), threads](x, y, z)


def _random_vector(n: int, seed: int, normal: bool = False):
    """n random float32 on the device: uniform in [0, 1), or ``normal`` (standard normal, as most operators'
    inputs). What is written costs HBM more or less by its bits: on the H200 the same copy kernel moved
    uniform floats at 4245 GB/s and normal ones at 4267, where GELU on the normal ones moved 4270 (one
    process, 2026-12-01). So the streams that write copy normal data, and a ceiling is not lowered by the
    data it happens to carry."""
    rng = np.random.default_rng(seed)
    return cuda.to_device(rng.standard_normal(n, dtype=np.float32) if normal else rng.random(n, dtype=np.float32))


def _memcpy(src, dst):
    dst.copy_to_device(src)


def copy_bandwidth(nbytes: int = COPY_BYTES) -> dict:
    n = nbytes // 4
    src = _random_vector(n, 0, normal=True)
    dst = cuda.device_array(n, np.float32)
    moved = 2 * n * 4
    t_memcpy = timing.measure(_memcpy, [(src, dst)], samples=SAMPLES)
    blocks = sm_count() * 8

    def kernel_copy(s, d):
        _copy4[blocks, 256](s, d)

    t_kernel = timing.measure(kernel_copy, [(src, dst)], samples=SAMPLES)
    if not np.array_equal(dst.copy_to_host()[:1000], src.copy_to_host()[:1000]):
        raise RuntimeError("copy kernel produced wrong data; peak not recorded")

    gbps = {"memcpy": moved / t_memcpy.median_us / 1e3, "numba_copy4": moved / t_kernel.median_us / 1e3}
    want = src.copy_to_host()
    poison = np.full(n, np.nan, np.float32)
    for threads in VECTOR_COPY_THREADS:
        def vector_copy(s, d, threads=threads):
            _copy_vectors[blocks_for(-(-s.size // 4), threads), threads](s, d)

        dst.copy_to_device(poison)  # the last copy's output would pass the check below
        vector_copy(src, dst)
        if not np.array_equal(dst.copy_to_host(), want):
            raise RuntimeError(f"vector copy kernel ({threads} threads) produced wrong data; peak not recorded")
        gbps[f"numba_vector_{threads}"] = moved / timing.measure(vector_copy, [(src, dst)], samples=SAMPLES).median_us / 1e3
    return {"copy_gbps": max(gbps.values()), "copy_detail_gbps": gbps, "copy_bytes": moved}


def read_bandwidth(nbytes: int = COPY_BYTES) -> dict:
    """The read-only stream: the sum of an nbytes float32 buffer, checked against numpy's."""
    n = nbytes // 4
    src = _random_vector(n, 1)
    want = float(np.sum(src.copy_to_host(), dtype=np.float64))
    moved = n * 4 + 8
    gbps = {}
    for name, kernel in (("data_sized_grid", read_sum), ("resident_grid", read_sum_resident)):
        total = cuda.to_device(np.zeros(1, np.float64))
        kernel(src, total)
        got = total.copy_to_host()[0]
        if not abs(got - want) <= 1e-4 * abs(want):
            raise RuntimeError(f"read kernel ({name}) summed {got}, numpy {want}; peak not recorded")
        gbps[name] = moved / timing.measure(kernel, [(src, total)], samples=SAMPLES).median_us / 1e3
    return {"read_gbps": max(gbps.values()), "read_detail_gbps": gbps, "read_bytes": moved}


def read2_write1_bandwidth(nbytes: int = COPY_BYTES) -> dict:
    """Two streams read, one written: z = x + y on nbytes float32 buffers each, checked element by element,
    in each of ADD_LAYOUTS (the best of them)."""
    n = nbytes // 4
    x, y = _random_vector(n, 2, normal=True), _random_vector(n, 3, normal=True)
    z = cuda.device_array(n, np.float32)
    want = x.copy_to_host() + y.copy_to_host()
    moved = 3 * n * 4
    gbps = {}
    poison = np.full(n, np.nan, np.float32)
    for quads, threads in ADD_LAYOUTS:
        z.copy_to_device(poison)  # the other layout's output would pass the check
        add(x, y, z, quads, threads)
        if not np.array_equal(z.copy_to_host(), want):
            raise RuntimeError("z = x + y kernel produced wrong data; peak not recorded")
        t = timing.measure(lambda a, b, c: add(a, b, c, quads, threads), [(x, y, z)], samples=SAMPLES)
        gbps[f"add_{quads}x{threads}"] = moved / t.median_us / 1e3
    return {"read2_write1_gbps": max(gbps.values()), "read2_write1_detail_gbps": gbps, "read2_write1_bytes": moved}


# Each memory ceiling's key and the function that measures our streams of that pattern.
STREAMS = {"read_gbps": read_bandwidth, "copy_gbps": copy_bandwidth, "read2_write1_gbps": read2_write1_bandwidth}


def library_streams(nbytes: int = COPY_BYTES, keys: tuple[str, ...] = tuple(STREAMS)) -> dict:
    """The same patterns (those of ``keys``) done by torch, if installed (torch.sum, Tensor.copy_,
    torch.add), in GB/s. On the H200 (2026-11-23) each beat our stream kernel by 1-5%: a ceiling is the
    best measured here."""
    from . import library_peers

    torch = library_peers.torch()
    if torch is None:
        return {}
    n = nbytes // 4
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    z, s = torch.empty(n, device="cuda"), torch.empty((), device="cuda")
    out = {}
    for key, fn, args, moved in (("read_gbps", lambda a, o: torch.sum(a, dim=0, out=o), (x, s), 4 * n),
                                 ("copy_gbps", lambda a, o: o.copy_(a), (x, z), 8 * n),
                                 ("read2_write1_gbps", lambda a, b, o: torch.add(a, b, out=o), (x, y, z), 12 * n)):
        if key in keys:
            out[key] = moved / timing.measure(fn, [args], samples=SAMPLES).median_us / 1e3
    return out


def stream_ceilings(nbytes: int = COPY_BYTES) -> dict:
    """The three memory ceilings and the datasheet figure beside them. Each ceiling is the best of our
    stream kernel (and memcpy for copy) and torch's call of the same pattern: the figure "% of peak"
    divides by must be one a kernel reached on this machine, and no lower than the best one did."""
    out = {**read_bandwidth(nbytes), **copy_bandwidth(nbytes), **read2_write1_bandwidth(nbytes)}
    library = library_streams(nbytes)
    out["stream_detail_gbps"] = {key: {"workbench": out[key], "torch": library.get(key)} for key in library}
    for key, gbps in library.items():
        out[key] = max(out[key], gbps)
    out["datasheet_gbps"] = datasheet_gbps(environment()["device"])
    return out


def _ceiling_keys() -> tuple[str, ...]:
    """Every ceiling a record divides by: the memory patterns' streams and the library GEMM rates (bench's tables)."""
    from .bench import COMPUTE_PEAK, PATTERN_PEAK

    return (*PATTERN_PEAK.values(), *dict.fromkeys(COMPUTE_PEAK.values()))


def keep_best(stored: dict | None, measured: dict) -> dict:
    """The ceilings after a new measurement: each the best of this one and those before it on this device
    model. One H200 read 1 GiB at 4581 GB/s on one day and another at 4396 on another; records taken on the
    faster one would sit above the slower one's ceiling, and a ceiling a kernel beats is wrong. So a ceiling
    only rises; ``kept`` says which came from an earlier run, with that run's date."""
    best = dict(measured)
    kept = {}
    for key in _ceiling_keys():
        before = (stored or {}).get(key)
        if before and before > (measured.get(key) or 0):
            best[key] = before
            again = (stored.get("remeasured") or {}).get(key) or {}
            when = again["date"] if again.get("gbps") == before else stored.get("date")  # the stream measured again
            kept[key] = ((stored.get("kept") or {}).get(key) or {"date": when}) | {"value": before}
    best["kept"] = kept
    return best


def records_above(peaks: dict, records: list[dict]) -> list[tuple[dict, str, float]]:
    """The records that moved more bytes a second than the ceiling they are divided by: (record, that
    ceiling's key, record / ceiling). A kernel above a measured ceiling shows the ceiling is wrong (measured
    on another day's clocks, or by a slower layout than the kernel's), not that the kernel beat the memory."""
    above = []
    for rec in records:
        key = rec.get("peak_kind") or ""
        ceiling = peaks.get(key) if key.endswith("_gbps") else None
        if ceiling and (rec.get("gbps") or 0) > ceiling:
            above.append((rec, key, rec["gbps"] / ceiling))
    return sorted(above, key=lambda a: -a[2])


def beaten_ceilings(peaks: dict, records: list[dict]) -> list[str]:
    """The memory ceilings that records of this run moved more than (their keys, each once)."""
    return list(dict.fromkeys(key for _rec, key, _ratio in records_above(peaks, records)))


def remeasure_stream(stored: dict, key: str, beaten_by: dict, nbytes: int = COPY_BYTES) -> dict:
    """The ceilings after measuring the stream ``key`` again now, because ``beaten_by`` (a record of this
    run) moved more than it. A ceiling measured on another day, or another machine of the model, can sit
    below what today's machine moves (the H200s here differ by up to 4%); measured in the same process as
    the record, the stream and the kernel share the machine's state. keep_best's rule holds: the ceiling
    only rises. ``remeasured`` says when and why; a record still above afterwards moved more than every
    stream layout this module knows, which ``workbench peaks`` lists."""
    fresh = STREAMS[key](nbytes)
    library = library_streams(nbytes, keys=(key,))
    peaks = {**stored, "kept": dict(stored.get("kept") or {})}
    if library:
        peaks["stream_detail_gbps"] = {**(stored.get("stream_detail_gbps") or {}),
                                       key: {"workbench": fresh[key], "torch": library[key]}}
        fresh[key] = max(fresh[key], library[key])
    before = stored.get(key) or 0
    if fresh[key] > before:
        peaks.update(fresh)
        peaks["kept"].pop(key, None)
    else:
        peaks.update({k: v for k, v in fresh.items() if k != key})  # this run's detail, the earlier best
        peaks["kept"][key] = peaks["kept"].get(key) or {"date": stored.get("date"), "value": before}
    peaks["remeasured"] = {**(stored.get("remeasured") or {}), key: {
        "date": now(), "gbps": fresh[key], "because": f"{beaten_by['op']}.{beaten_by['stage']} at "
        f"{beaten_by['size_label']} moved {beaten_by['gbps']:.0f} GB/s, above {before:.0f}"}}
    return peaks


def gemm_rates(n: int = 8192) -> dict:
    """fp32 / TF32 / fp16 GEMM rates of the library (GFLOP/s), if torch or CuPy is installed."""
    from . import library_peers

    torch = library_peers.torch()
    if torch is None:
        return {}
    flops = 2 * n**3
    out = {}
    for label, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True), ("fp16", torch.float16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        t = timing.measure(lambda x, y, z: torch.matmul(x, y, out=z), [(a, b, c)], samples=7, budget_s=2.0)
        out[f"gemm_{label}_gflops"] = flops / t.median_us / 1e3
    torch.backends.cuda.matmul.allow_tf32 = False
    out["gemm_library"] = f"torch {torch.__version__} (cuBLAS), {n}^3"
    return out


def measure_peaks() -> dict:
    peaks = {"date": now(), "environment": environment()}
    peaks.update(stream_ceilings())
    peaks.update(gemm_rates())
    return peaks


def check_ceilings(records: list[dict], peaks: dict, say: Callable[[str], None]) -> dict:
    """The ceilings after this run's records: where one moved more bytes a second than its pattern's
    ceiling, that stream is measured again now, in this process (``remeasure_stream``), and every
    record's "% of peak" divided by the ceiling that results."""
    from .bench import PATTERN_PEAK

    for key in beaten_ceilings(peaks, records):
        rec = next(r for r, k, _ in records_above(peaks, records) if k == key)
        pattern = key.replace("_gbps", "")
        say(f"{rec['op']}.{rec['stage']} moved {rec['gbps']:.0f} GB/s, above the {pattern} ceiling of "
            f"{peaks[key]:.0f}: measuring the {pattern} stream again now")
        peaks = remeasure_stream(peaks, key, rec)
        still = [r for r, k, _ in records_above(peaks, records) if k == key]
        say(f"  {pattern} now {peaks[key]:.0f} GB/s" + (f"; still above it: {', '.join(r['stage'] for r in still)}"
                                                          if still else ""))
    for r in records:
        key = r.get("peak_kind")
        if key in PATTERN_PEAK.values() and peaks.get(key):
            r["pct_of_peak"] = 100 * r["gbps"] / peaks[key]
    return peaks
