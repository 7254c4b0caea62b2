"""Softmax, LayerNorm, RMSNorm and GELU(x + bias) + residual in fp16 and bf16: half the bytes, fp32 inside.

Networks keep activations in 16-bit floats: fp16 (1 sign, 5 exponent, 10 mantissa bits: about three
decimal digits, largest value 65504, subnormals below 6.1e-5) or bf16 (1 sign, 8 exponent, 7 mantissa
bits: float32's range with two decimal digits; it is the top half of a float32). Every operator here
reads and writes 16-bit values and computes in float32 in between, as torch does: each element is
widened to float32 when it is loaded, the statistics (maximum, sums, mean, variance) are float32, and
each result is rounded to 16 bits once, when it is stored.

Why float32 inside (where accuracy goes): a 16-bit sum stops growing. fp16 has 11 significant bits,
so past 2048 its spacing is 2 and adding 1 does nothing: summing 4096 ones in fp16 gives 2048, and the
softmax of a constant row of 4096 comes out 1/2048, twice too large (the same sum in bf16 stops at
256). Squares overflow: LayerNorm's variance of values near 300 needs 300^2 = 90000, past fp16's
65504, so an fp16 sum of squares is inf. float32 statistics cost no memory traffic (a float32 add is
as fast as an fp16 one; what float32 costs is a conversion each way) and are exact to about 1e-7,
far below the 16-bit rounding of the output (4.9e-4 relative for fp16, 3.9e-3 for bf16), which is
where the error of a correct kernel comes from.
``tests/test_low_precision.py`` checks these numbers.

The ladders start where the float32 ladders ended (a block of 256 threads per row, three reads of the
row with the second and third from L1, eight loads in flight per thread) and ask what changes:

1. ``widened``: the float32 kernel reading and writing halves. Half the bytes, so at the same speed
   per element it would take half the time; what it costs is one conversion per element each way, and
   what it lacks is bytes in flight: eight 2-byte loads a thread are half what the float32 kernel had.
2. ``packed``: loads and stores of 32-bit words, two halves each, eight words in flight per thread:
   the float32 kernel's bytes in flight with half the load instructions per element. A row of an odd
   number of columns starts in the middle of a word, so each row has a 16-bit head and tail.
3. (softmax) ``fast_exp``: at 2 bytes an element each element gets half the instructions it had in
   float32, and libdevice's exact expf was most of them; the hardware's approximate exp2 is accurate
   to a thousandth of a half's rounding.

numba-cuda 0.30 has no half2 type and its cuda.fp16/cuda.bf16 functions are linked C++ (opaque calls
in the PTX until link time), so the conversions here are libdevice's and plain bit operations, which
compile to a few PTX instructions: fp16 -> float32 is ``cvt.f32.f16``, float32 -> fp16 ``cvt.rn.f16.f32``
(round to nearest even, subnormals kept, overflow to inf); bf16 -> float32 is a 16-bit shift (a bf16
is a float32 with its low 16 mantissa bits dropped), float32 -> bf16 rounds to nearest even with
integer adds (five integer instructions and a select that keeps NaN a NaN: sm_90's
``cvt.rn.bf16.f32`` is not reachable from numba).
"""

import math

import numpy as np
from numba import cuda, float32, int16, int32, uint16, uint32, uint64

from solutions._half import (
    ILP, LOW_PRECISION_GROUP, NEG_INF, THREADS, TWO_WARPS, block_max, block_max_over, block_sum, block_sum_over,
    libdevice, torch_peer, warp_max, warp_sum)
from solutions._references import (
    EPS, gelu, gelu_bias_residual64, gelu_bias_residual_inputs, layernorm64, layernorm_rows, rmsnorm64, softmax64)
from solutions._vector_io import aligned16, load4, store4
from workbench import library_peers as peers
from workbench.device import is_simulator
from workbench.ladder import InputError, Operator, expect_device_array, sm_count
from workbench.targets import against_peer, of_ceiling

try:  # bf16 arrays on the host and on the device are NumPy arrays of ml_dtypes.bfloat16
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency; without it only fp16 is offered
    BFLOAT16 = None
FLOAT16 = np.dtype(np.float16)

# THREADS (256 a row), ILP, the block-wide maximum and sum (block_max, block_sum, ..._over) and libdevice
# are in solutions/_half.py, shared with quantize.py; the float64 references, the float32 ladders' inputs
# and the float32 gelu device function in solutions/_references.py, shared with softmax.py, layernorm.py
# and elementwise.py. (A ladder module that imports another gets no exercise.)
TORCH_EPS = float(EPS)  # eps for torch expressions: torch.compile traces float() of a numpy scalar as data-dependent and fails
ILP_SPAN = ILP * THREADS  # columns (widened) or words (packed) a block covers per unrolled step
LAST = (ILP - 1) * THREADS  # offset of a step's last column (or word) from its first
LOW = uint32(0xFFFF)
SIXTEEN = uint32(16)
ROW_THREADS = 128  # the rows_in_flight stages: four warps per row, twice the rows resident per multiprocessor
ELEMENTWISE_GRID_FACTOR = 4  # GELU stages: blocks per multiprocessor's worth of threads (see the launcher)


# -- the two formats: a 16-bit pattern becomes a float32 and back ------------------------------------

@cuda.jit(device=True, inline=True)
def f16_to_float(bits):
    """The fp16 whose 16 bits are the low half of ``bits``, as a float32: one ``cvt.f32.f16``."""
    return libdevice.half2float(int16(bits & LOW))


@cuda.jit(device=True, inline=True)
def float_to_f16(value):
    """float32 -> fp16 bits (round to nearest even, subnormals kept, past 65504 inf): ``cvt.rn.f16.f32``."""
    return uint32(uint16(libdevice.float2half_rn(value)))


@cuda.jit(device=True, inline=True)
def bf16_to_float(bits):
    """The bf16 in the low half of ``bits`` as a float32: its 16 bits become a float32's top half."""
    return libdevice.int_as_float(int32(bits << SIXTEEN))


@cuda.jit(device=True, inline=True)
def float_to_bf16(value):
    """float32 -> bf16 bits, rounded to nearest, ties to even: add 0x7FFF plus the lowest bit kept, then
    drop the low 16 bits (a carry rounds up, into the exponent if need be, up to inf). A NaN stays a
    NaN: rounding could carry its payload into inf."""
    bits = uint32(libdevice.float_as_int(value))
    rounded = uint32(bits + uint32(0x7FFF) + ((bits >> SIXTEEN) & uint32(1)))
    return uint32(rounded >> SIXTEEN) if value == value else uint32(0x7FC0)


@cuda.jit(device=True, inline=True)
def pack(low, high):
    """Two halves' bits in one 32-bit word, ``low`` first in memory (little-endian): ``mov.b32 {lo, hi}``."""
    return uint32(low | (high << SIXTEEN))


def is_bf16(a) -> bool:
    return BFLOAT16 is not None and np.dtype(a.dtype) == BFLOAT16


def as_numba(a):
    """A numba view of a device array (a torch/CuPy tensor is looked at through numba)."""
    return a if hasattr(a, "is_c_contiguous") else cuda.as_cuda_array(a)


def bits16(a):
    """The 16-bit patterns of a half array, same shape, no copy: kernels widen them themselves."""
    return as_numba(a).view(np.uint16)


def flat_bits16(a):
    a = bits16(a)
    return a.reshape(a.size)


def words(a):
    """The array as 32-bit words, two halves each, no copy: word w holds elements 2w (low 16 bits) and
    2w + 1 (high). An odd last element belongs to no word."""
    flat = flat_bits16(a)
    return flat[: flat.size - flat.size % 2].view(np.uint32)


# -- where a row's words are ---------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def row_words(row, cols):
    """Row ``row`` holds the flat elements [start, end) and the whole words [first, stop). When start is
    odd, element start shares its word with the row before; when end is odd, element end - 1 shares its
    word with the row after. Those two edge elements are loaded and stored 16 bits at a time: a 32-bit
    store there would also write the neighbouring row's half, which another block owns."""
    start = row * cols
    end = start + cols
    return start, end, (start + uint64(1)) >> uint64(1), end >> uint64(1)


@cuda.jit(device=True, inline=True)
def edge_element(t, start, end):
    """The edge element thread t looks after: thread 0 the row's odd first element, thread 1 its odd
    last one; ``end`` (no element) for every other thread, or when that edge is word-aligned."""
    if t == uint64(0) and start & uint64(1):
        return start
    if t == uint64(1) and end & uint64(1):
        return end - uint64(1)
    return end


# -- rows held in registers (the in_registers and paired_convert stages) -----------------------------------

VECTOR = 8  # halves in one 16-byte load (load4 of four words)
CHUNKS = 4  # 16-byte vectors each thread holds: 32 halves in 16 registers
HELD = 4 * CHUNKS  # words each thread holds
GROUP_SLOTS = 2 * 32  # two reductions' partial results, one per warp of a block of up to 1024 threads
MIN_BLOCK = 128  # narrow rows share a block: a block of 32 threads would leave multiprocessors half full


def registers_threads(cols):
    """Threads per row for the in_registers kernels: the smallest power of two from 32 whose CHUNKS vectors
    each cover the row, or None when a row is wider than 1024 threads hold (32768 columns)."""
    vectors = -(-cols // VECTOR)
    threads = 32
    while threads * CHUNKS < vectors:
        threads *= 2
    return threads if threads <= 1024 else None


def registers_grid(rows, threads):
    """(blocks, threads per block): several rows a block when a row needs fewer than MIN_BLOCK threads
    (never more groups than rows)."""
    per_block = max(1, min(MIN_BLOCK // threads, rows))
    return -(-rows // per_block), per_block * threads


@cuda.jit(device=True, inline=True)
def group_row(rows, cols, threads):
    """Where this thread works: a group of ``threads`` threads per row, blockDim.x // threads rows a block.
    Returns t (the thread's place in its group) and the row's pieces: elements [start, end); the head
    [start, head_end) before the row's first 16-byte boundary; whole vectors [first, stop), vector v
    being elements 8v .. 8v + 7; the tail [tail, end). Head and tail hold at most 7 elements each.
    A group past the last row gets an empty row: its threads still meet the barriers, doing nothing."""
    row = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x // threads) + uint64(cuda.threadIdx.x // threads)
    t = uint64(cuda.threadIdx.x % threads)
    start = row * cols
    end = start + cols if row < rows else start
    first = (start + uint64(VECTOR - 1)) // uint64(VECTOR)
    stop = end // uint64(VECTOR)
    head_end = min(first * uint64(VECTOR), end)
    tail = max(stop * uint64(VECTOR), head_end)
    return t, start, end, head_end, first, stop, tail


@cuda.jit(device=True, inline=True)
def load_held(x32, held, first, stop, t, threads):
    """Vectors first + t, first + t + threads, ... (CHUNKS of them, those before stop) into held, four
    words each: every load of the row is issued before any value is used."""
    for k in range(CHUNKS):
        v = first + t + uint64(k) * threads
        if v < stop:
            w0, w1, w2, w3 = load4(x32, v * uint64(4))
            held[4 * k] = w0
            held[4 * k + 1] = w1
            held[4 * k + 2] = w2
            held[4 * k + 3] = w3


@cuda.jit(device=True, inline=True)
def vector_at(a16, a32, c, aligned):
    """Halves c .. c + 7 of a vector (weight, bias) as four words: one 16-byte load when c is a multiple
    of 8 (``aligned``), else eight 16-bit loads packed in pairs."""
    if aligned:
        return load4(a32, c // uint64(2))
    return (pack(uint32(a16[c]), uint32(a16[c + uint64(1)])),
            pack(uint32(a16[c + uint64(2)]), uint32(a16[c + uint64(3)])),
            pack(uint32(a16[c + uint64(4)]), uint32(a16[c + uint64(5)])),
            pack(uint32(a16[c + uint64(6)]), uint32(a16[c + uint64(7)])))


@cuda.jit(device=True, inline=True)
def group_max(value, reduced, warps):
    """Maximum over a row's group of ``warps`` warps, in each of its threads (several groups a block)."""
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    value = warp_max(value)
    if lane == 0:
        reduced[warp] = value
    cuda.syncthreads()
    return warp_max(reduced[warp // warps * warps + lane] if lane < warps else NEG_INF)


@cuda.jit(device=True, inline=True)
def group_sum(value, reduced, slot, warps):
    """Sum over a row's group of ``warps`` warps, in each of its threads; slot 0 or 1 as in block_sum_over."""
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    value = warp_sum(value)
    if lane == 0:
        reduced[slot * 32 + warp] = value
    cuda.syncthreads()
    return warp_sum(reduced[slot * 32 + warp // warps * warps + lane] if lane < warps else float32(0.0))


@cuda.jit(device=True, inline=True)
def narrow_pair_f16(low, high):
    """Two float32 results rounded to fp16 and packed in a word, one conversion each."""
    return pack(float_to_f16(low), float_to_f16(high))


@cuda.jit(device=True, inline=True)
def narrow_pair_bf16(low, high):
    """Two float32 results rounded to bf16 and packed in a word: two rounds of integer rounding."""
    return pack(float_to_bf16(low), float_to_bf16(high))


# sm_80+ converts two float32 to a pair of halves in one instruction, cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32
# (d = {a, b}: a goes to the high half). numba exposes neither; an intrinsic (numba.cuda.extending, as in
# _vector_io) emits it as inline PTX. The simulator runs the two-conversion functions above: same bits.
if is_simulator():
    cvt_pair_f16 = narrow_pair_f16
    cvt_pair_bf16 = narrow_pair_bf16
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _cvt_pair(instruction):
        @intrinsic
        def cvt_pair(typingctx, low, high):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, signature, args):
                low_value, high_value = (context.cast(builder, a, t, types.float32)
                                         for a, t in zip(args, signature.args))
                asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()]),
                                   f"{instruction} $0, $1, $2;", "=r,f,f")
                return builder.call(asm, [high_value, low_value])

            return sig, codegen
        return cvt_pair

    cvt_pair_f16 = _cvt_pair("cvt.rn.f16x2.f32")
    cvt_pair_bf16 = _cvt_pair("cvt.rn.bf16x2.f32")


IN_REGISTERS = """
    The row is read from memory once and held in registers: each thread issues all its loads at once,
    16 bytes (eight halves) a load, four of them (32 halves in 16 registers), so a 4096-column row is
    one group of 128 threads with every byte of it in flight together, and the statistics and the
    output come from registers: no second or third pass over L1, one load instruction per eight
    elements instead of one per two, one 16-byte store per eight results. Each pair of results is
    rounded by one instruction, cvt.rn.f16x2.f32 or cvt.rn.bf16x2.f32 (sm_80+, round to nearest
    even; numba exposes neither, so a numba intrinsic emits it as inline PTX): for bf16 it replaces
    about a dozen integer instructions a word (add, shift, and, NaN test and select per half, the
    pack), and at 2 bytes an element the H200 must convert about four elements a cycle per
    multiprocessor, where integer instructions issue at half the float32 rate. Narrow rows share a
    block (groups of 32 or 64 threads), with reductions per group. A row that does not start on 16
    bytes (columns not a multiple of 8) has a head and a tail of at most 7 elements, read and written
    16 bits at a time by the group's first threads; rows wider than 32768 columns, or arrays that do
    not start on 16 bytes, take the rows_in_flight kernel."""


# -- what the operators share: formats, sizes, validation, tolerance --------------------------------

FORMATS = [FLOAT16] + ([BFLOAT16] if BFLOAT16 is not None else [])
# ‖out − ref‖ / ‖ref‖ of a correct kernel is the rounding of its output to 16 bits: at most 2^-11
# (fp16) or 2^-8 (bf16) per element, about half that on average. float32 statistics add ~1e-7.
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}

ROW_SIZES = dict(
    check_sizes=[(300, 1), (300, 33), (301, 1001), (300, 4097), (200, 32768), (32768, 4096)],
    sim_sizes=[(1, 1), (2, 5), (2, 37), (2, 300), (1, 4103)],  # the last: full unrolled steps
    bench_sizes=[(4096, 1024), (4096, 4096), (32768, 1024), (32768, 4096), (4096, 32768)],
    headline_size=(32768, 4096),
)


def short_name(dtype) -> str:
    return "fp16" if np.dtype(dtype) == FLOAT16 else "bf16"


def a_matrix(dtype) -> str:
    """'an fp16 matrix', 'a bf16 matrix' (as the names are read aloud)."""
    return "an fp16 matrix" if np.dtype(dtype) == FLOAT16 else "a bf16 matrix"


def half_operator(dtype, **fields) -> Operator:
    """An operator whose inputs and output are ``dtype`` (fp16 or bf16) and whose stages compute in
    float32 (each stage says so: the PTX check then refuses float64 in them)."""
    return Operator(make_output=lambda size: np.empty(size, dtype), dtype=dtype,
                    tolerance=lambda size, _: TOLERANCE[np.dtype(dtype).name], group=LOW_PRECISION_GROUP,
                    **fields)


def each(ops, name, summary, **kwargs):
    """Register the decorated launcher as stage ``name`` of every operator in ``ops``: the fp16 and the
    bf16 ladder of a computation share their launchers, and each launcher picks its input's kernel."""
    def register(launch):
        for op in ops:
            op.stage(name, summary, dtype=np.float32, **kwargs)(launch)
        return launch
    return register


def expect_rows(dtype, *named):
    """Every named matrix a device array of ``dtype`` with the first one's shape."""
    (name0, x), *rest = named
    expect_device_array(name0, x, dtype=dtype, ndim=2)
    for name, a in rest:
        expect_device_array(name, a, dtype=dtype, ndim=2)
        if tuple(a.shape) != tuple(x.shape):
            raise InputError(f"{name} must have the shape of {name0}, {tuple(x.shape)}; got {tuple(a.shape)}")


def expect_vectors(dtype, x, *named):
    """Every named vector a device array of ``dtype`` with one entry per column of x."""
    cols = x.shape[1]
    for name, v in named:
        expect_device_array(name, v, dtype=dtype, ndim=1)
        if v.shape[0] != cols:
            raise InputError(f"{name} must have one entry per column of x ({cols}); got length {v.shape[0]}")


def as_float64(*arrays):
    return tuple(np.asarray(a).astype(np.float64) for a in arrays)




# ======================================================================================================
# Softmax
# ======================================================================================================

def _softmax_inputs(dtype):
    def make(size, rng):
        # softmax's own inputs (normal(0, 2), rows of +-1e4, rows of -inf but one), with the trap rows
        # moved off the first two: a two-row check then still sees ordinary rows.
        rows, cols = size
        x = rng.normal(0.0, 2.0, size).astype(np.float32)
        for r in range(3, rows, 5):
            x[r] = rng.uniform(-1e4, 1e4, cols)
        for r in range(4, rows, 5):
            x[r] = -np.inf
            x[r, rng.integers(cols)] = rng.normal(0.0, 2.0)
        return (x.astype(dtype),)
    return make


def _softmax_adversarial(dtype):
    big = 6.0e4 if dtype == FLOAT16 else 1.0e30

    def cases(size, rng):
        rows, cols = size
        constant = np.full(size, rng.uniform(-3, 3), np.float32)  # sum of exps = cols: an fp16 sum stalls at 2048
        huge = rng.uniform(-big, big, size).astype(np.float32)  # exp overflows unless the max is subtracted
        tiny = np.full(size, -14.0, np.float32)  # e^-14 against a 0 in each row: fp16 subnormal outputs
        tiny[np.arange(rows), rng.integers(cols, size=rows)] = 0.0
        subnormal = rng.uniform(-3e-6, 3e-6, size).astype(np.float32)  # fp16 subnormal inputs
        one_hot = np.full(size, -np.inf, np.float32)  # -inf - -inf is NaN: the maximum must be finite
        one_hot[np.arange(rows), rng.integers(cols, size=rows)] = rng.normal(0.0, 2.0, rows)
        return [(label, (a.astype(dtype),)) for label, a in
                [("constant rows", constant), ("huge logits", huge), ("tiny probabilities", tiny),
                 ("subnormal inputs", subnormal), ("-inf but one", one_hot)]]
    return cases


def _softmax_op(dtype, rank):
    return half_operator(
        dtype,
        name="softmax", variant={"dtype": short_name(dtype)},
        targets=[of_ceiling(85, "copy_gbps"), against_peer(1.2, "eager")],
        title=f"Softmax over the rows of {a_matrix(dtype)}, float32 inside",
        reference=lambda x: softmax64(*as_float64(x)),
        make_inputs=_softmax_inputs(dtype),
        bytes_moved=lambda size: 2 * dtype.itemsize * size[0] * size[1],  # read x once, write out once
        flops=lambda size: 4 * size[0] * size[1],
        validate=lambda x, out: expect_rows(dtype, ("x", x), ("out", out)),
        peer=torch_peer(f"torch.softmax ({short_name(dtype)})",
                        lambda torch, x, out: torch.softmax(peers.as_torch(x), 1, out=peers.as_torch(out))),
        torch_expression=lambda torch, size: lambda x: torch.softmax(x, dim=-1),  # for torch.compile
        rank=rank,
        adversarial_inputs=_softmax_adversarial(dtype),
        record_all_sizes=True,
        **ROW_SIZES,
    )


SOFTMAX = [_softmax_op(dtype, 200 + i) for i, dtype in enumerate(FORMATS)]


@cuda.jit(device=True, inline=True)
def exact_exp(v):
    """libdevice's expf: accurate to 2 ulp of float32, about a dozen instructions."""
    return math.exp(v)


@cuda.jit(device=True, inline=True)
def fast_exp(v):
    """e^v as 2^(v log2 e) with the hardware's approximate exp2: ``mul.f32`` and ``ex2.approx.f32``,
    relative error about 2^-22, a thousandth of an fp16's rounding."""
    return libdevice.fast_expf(v)


# -- 1. widened: the float32 kernel, reading and writing halves ----------------------------------------

@cuda.jit(device=True, inline=True)
def softmax_widened_row(x, out, widen, narrow):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(ILP, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    # HINT: softmax's ilp kernel (three passes, eight columns a step, then the rest one by one), with
    # HINT: each load x[row, j] (16 bits) widened to float32 first: widen(x[row, j]).
    # HINT: the write pass stores narrow(value), the 16 bits of the rounded result.
    # BEGIN SOLUTION
    m = NEG_INF
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            m = max(m, widen(uint32(x[row, j + uint64(u * THREADS)])))
        j += uint64(ILP_SPAN)
    while j < cols:
        m = max(m, widen(uint32(x[row, j])))
        j += uint64(THREADS)
    m = block_max(m, reduced)
    s = float32(0.0)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            s += math.exp(widen(uint32(x[row, j + uint64(u * THREADS)])) - m)
        j += uint64(ILP_SPAN)
    while j < cols:
        s += math.exp(widen(uint32(x[row, j])) - m)
        j += uint64(THREADS)
    inverse = float32(1.0) / block_sum(s, reduced, 1)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            xs[u] = widen(uint32(x[row, j + uint64(u * THREADS)]))
        for u in range(ILP):
            out[row, j + uint64(u * THREADS)] = uint16(narrow(math.exp(xs[u] - m) * inverse))
        j += uint64(ILP_SPAN)
    while j < cols:
        out[row, j] = uint16(narrow(math.exp(widen(uint32(x[row, j])) - m) * inverse))
        j += uint64(THREADS)
    # END SOLUTION


@cuda.jit
def _softmax_widened_f16(x, out):
    softmax_widened_row(x, out, f16_to_float, float_to_f16)


@cuda.jit
def _softmax_widened_bf16(x, out):
    softmax_widened_row(x, out, bf16_to_float, float_to_bf16)


@each(SOFTMAX, "widened", """
    The float32 ladder's last kernel with 16-bit loads and stores: a block of 256 threads per row,
    three passes (maximum, sum of exponentials, output), eight loads in flight per thread. Each
    element is widened to float32 as it is loaded and rounded to 16 bits once, as it is stored, so
    the maximum and the sum are float32. The bytes halve, but not the instructions: each element
    still takes a load per pass, one conversion each way (fp16: cvt.f32.f16 and cvt.rn.f16.f32; bf16:
    a shift in, five integer instructions and a NaN select out), and eight 2-byte loads a thread
    keep half as many bytes in flight as the float32 kernel's eight 4-byte ones.""")
def softmax_widened(x, out):
    kernel = _softmax_widened_bf16 if is_bf16(x) else _softmax_widened_f16
    kernel[x.shape[0], THREADS](bits16(x), bits16(out))


# -- 2. packed: two halves per load and store -----------------------------------------------------------

@cuda.jit(device=True, inline=True)
def softmax_packed_row(x16, x32, out16, out32, cols, widen, narrow, exp, threads):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    ws = cuda.local.array(ILP, uint32)
    t = uint64(cuda.threadIdx.x)
    last = uint64((ILP - 1) * threads)  # offset of a step's last word from its first
    span = uint64(ILP * threads)  # words a block covers per unrolled step
    warps = threads // 32
    start, end, first, stop = row_words(uint64(cuda.blockIdx.x), uint64(cols))
    edge = edge_element(t, start, end)
    # HINT: the widened kernel over the row's words: word w holds two halves, widen(w) and widen(w >> 16).
    # HINT: words first + t, first + t + threads, ... up to stop, eight a step (last, span); the odd edge element (if
    # HINT: edge < end) through the 16-bit arrays. exp is passed in; store a word as pack(narrow(a), narrow(b)).
    # BEGIN SOLUTION
    m = NEG_INF
    if edge < end:
        m = widen(uint32(x16[edge]))
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            word = x32[w + uint64(u * threads)]
            m = max(m, max(widen(word), widen(word >> SIXTEEN)))
        w += span
    while w < stop:
        word = x32[w]
        m = max(m, max(widen(word), widen(word >> SIXTEEN)))
        w += uint64(threads)
    m = block_max_over(m, reduced, warps)
    s = float32(0.0)
    if edge < end:
        s = exp(widen(uint32(x16[edge])) - m)
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            word = x32[w + uint64(u * threads)]
            s += exp(widen(word) - m) + exp(widen(word >> SIXTEEN) - m)
        w += span
    while w < stop:
        word = x32[w]
        s += exp(widen(word) - m) + exp(widen(word >> SIXTEEN) - m)
        w += uint64(threads)
    inverse = float32(1.0) / block_sum_over(s, reduced, 1, warps)
    if edge < end:
        out16[edge] = uint16(narrow(exp(widen(uint32(x16[edge])) - m) * inverse))
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            ws[u] = x32[w + uint64(u * threads)]
        for u in range(ILP):
            low = narrow(exp(widen(ws[u]) - m) * inverse)
            high = narrow(exp(widen(ws[u] >> SIXTEEN) - m) * inverse)
            out32[w + uint64(u * threads)] = pack(low, high)
        w += span
    while w < stop:
        word = x32[w]
        low = narrow(exp(widen(word) - m) * inverse)
        high = narrow(exp(widen(word >> SIXTEEN) - m) * inverse)
        out32[w] = pack(low, high)
        w += uint64(threads)
    # END SOLUTION


@cuda.jit
def _softmax_packed_f16(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, f16_to_float, float_to_f16, exact_exp, THREADS)


@cuda.jit
def _softmax_packed_bf16(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, bf16_to_float, float_to_bf16, exact_exp, THREADS)


@each(SOFTMAX, "packed", """
    The same three passes over 32-bit words, two halves each: one load instruction brings two
    elements (ld.global.u32, then a free split of the register and a conversion per half), one
    store writes two (the two rounded halves packed with mov.b32 {lo, hi}), and eight words in
    flight per thread are the float32 kernel's 32 bytes again. The matrix is seen flat: when the
    number of columns is odd, every other row starts in the middle of a word, so each row has at most
    one 16-bit element at each end, loaded and stored on its own: a 32-bit store there would also
    write the neighbouring row's half, which another block is writing at the same time.""")
def softmax_packed(x, out):
    kernel = _softmax_packed_bf16 if is_bf16(x) else _softmax_packed_f16
    kernel[x.shape[0], THREADS](flat_bits16(x), words(x), flat_bits16(out), words(out), x.shape[1])




# -- 3. fast_exp: an exponential as accurate as a half needs ---------------------------------------------

@cuda.jit
def _softmax_fast_f16(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, f16_to_float, float_to_f16, fast_exp, THREADS)


@cuda.jit
def _softmax_fast_bf16(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, bf16_to_float, float_to_bf16, fast_exp, THREADS)


@each(SOFTMAX, "fast_exp", """
    The packed kernel with a cheaper exponential. At 2 bytes an element, memory delivers twice as
    many elements per second as in float32, so each element gets half the instructions it had, and
    the exponential was most of them: libdevice's expf (about a dozen instructions, two per
    element) is accurate to float32's last bits, which rounding the result to 16 bits then throws
    away. The hardware's approximate exp2 (ex2.approx, via libdevice.fast_expf: a multiply by log2 e
    and one instruction) is off by about 2^-22, a thousandth of an fp16 rounding step, so the output
    is the same to within one rounding; only the kernel's instruction count changes.""")
def softmax_fast_exp(x, out):
    kernel = _softmax_fast_bf16 if is_bf16(x) else _softmax_fast_f16
    kernel[x.shape[0], THREADS](flat_bits16(x), words(x), flat_bits16(out), words(out), x.shape[1])


# -- 4. rows_in_flight: four warps per row ----------------------------------------------------------------

@cuda.jit
def _softmax_rows_f16(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, f16_to_float, float_to_f16, fast_exp, ROW_THREADS)


@cuda.jit
def _softmax_rows_bf16(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, bf16_to_float, float_to_bf16, fast_exp, ROW_THREADS)


@each(SOFTMAX, "rows_in_flight", """
    The fast_exp kernel in blocks of 128 threads per row instead of 256. A block's time on a row is mostly
    fixed latency (the first pass's loads, two barriers, the reductions), whatever the row's bytes;
    at 2 bytes an element a 4096-column row is 8 KB where the float32 kernel's was 16 KB, so 256-
    thread blocks (eight per multiprocessor at 32 registers) keep 64 KB of rows moving per
    multiprocessor where the float32 ilp kernel kept 96 KB (six blocks of 16 KB): about half its
    bandwidth, which is what the packed stage measured. Blocks of 128 threads fit sixteen to a
    multiprocessor: 128 KB of rows in flight, each thread two unrolled steps of eight words a pass
    (the float32 kernel's shape again), and the reductions cross four warps instead of eight.""")
def softmax_rows_in_flight(x, out):
    kernel = _softmax_rows_bf16 if is_bf16(x) else _softmax_rows_f16
    kernel[x.shape[0], ROW_THREADS](flat_bits16(x), words(x), flat_bits16(out), words(out), x.shape[1])


# -- 5. in_registers: the row read once, 16 bytes a load, two results rounded by one instruction --------------------------------------------------

@cuda.jit(device=True, inline=True)
def softmax_registers_row(x16, x32, out16, out32, rows, cols, threads, widen, narrow, narrow2):
    reduced = cuda.shared.array(GROUP_SLOTS, float32)
    held = cuda.local.array(HELD, uint32)
    results = cuda.local.array(4, uint32)
    t, start, end, head_end, first, stop, tail = group_row(uint64(rows), uint64(cols), uint64(threads))
    head, tail = start + t, tail + t  # this thread's head and tail element, if they are in the row
    warps = threads // 32
    # HINT: load_held brings the thread's CHUNKS vectors at once; word i of held is in the row when its
    # HINT: vector first + t + (i // 4) * threads is before stop. Head and tail elements come 16 bits at a time.
    # HINT: maximum and sum from the registers (group_max, group_sum), then one store4 per vector: narrow2 packs a word.
    # BEGIN SOLUTION
    load_held(x32, held, first, stop, t, uint64(threads))
    x_head = widen(uint32(x16[head])) if head < head_end else NEG_INF
    x_tail = widen(uint32(x16[tail])) if tail < end else NEG_INF
    m = max(x_head, x_tail)
    for i in range(HELD):
        if first + t + uint64(i // 4) * uint64(threads) < stop:
            m = max(m, max(widen(held[i]), widen(held[i] >> SIXTEEN)))
    m = group_max(m, reduced, warps)
    s = float32(0.0)
    if head < head_end:
        s = fast_exp(x_head - m)
    if tail < end:
        s += fast_exp(x_tail - m)
    for i in range(HELD):
        if first + t + uint64(i // 4) * uint64(threads) < stop:
            s += fast_exp(widen(held[i]) - m) + fast_exp(widen(held[i] >> SIXTEEN) - m)
    s = group_sum(s, reduced, 1, warps)
    inverse = float32(1.0) / s if start < end else float32(0.0)  # an empty row (past the last) has no sum
    for k in range(CHUNKS):
        v = first + t + uint64(k) * uint64(threads)
        if v < stop:
            for j in range(4):
                word = held[4 * k + j]
                results[j] = narrow2(fast_exp(widen(word) - m) * inverse, fast_exp(widen(word >> SIXTEEN) - m) * inverse)
            store4(out32, v * uint64(4), results[0], results[1], results[2], results[3])
    if head < head_end:
        out16[head] = uint16(narrow(fast_exp(x_head - m) * inverse))
    if tail < end:
        out16[tail] = uint16(narrow(fast_exp(x_tail - m) * inverse))
    # END SOLUTION


@cuda.jit
def _softmax_registers_f16(x16, x32, out16, out32, rows, cols, threads):
    softmax_registers_row(x16, x32, out16, out32, rows, cols, threads, f16_to_float, float_to_f16, cvt_pair_f16)


@cuda.jit
def _softmax_registers_bf16(x16, x32, out16, out32, rows, cols, threads):
    softmax_registers_row(x16, x32, out16, out32, rows, cols, threads, bf16_to_float, float_to_bf16, cvt_pair_bf16)


def softmax_registers_launch(f16_kernel, bf16_kernel, x, out):
    """Launch one of the row-in-registers kernels; a row wider than 1024 threads hold, or an array that
    starts off a 16-byte boundary (a view mid-buffer), takes the rows_in_flight kernel instead."""
    rows, cols = x.shape
    threads = registers_threads(cols)
    if threads is None or not aligned16(x, out):
        return softmax_rows_in_flight(x, out)
    blocks, block = registers_grid(rows, threads)
    kernel = bf16_kernel if is_bf16(x) else f16_kernel
    kernel[blocks, block](flat_bits16(x), words(x), flat_bits16(out), words(out), rows, cols, threads)


def softmax_in_registers(x, out):
    """Not a stage: RMSNorm's in_registers idea applied to softmax, measured slower than rows_in_flight on an
    H200 at 32768 x 4096 (fp16 266.7 us against 165.3, bf16 206.8 against 189.0; see RMSNORM_ONLY).
    scripts/gpu_half_norms.py times it with its registers capped, to test the occupancy explanation."""
    softmax_registers_launch(_softmax_registers_f16, _softmax_registers_bf16, x, out)


# ======================================================================================================
# LayerNorm and RMSNorm
# ======================================================================================================

def _norm_rows(dtype):
    """layernorm's rows (random means and spreads, mean-1e4 rows, constant rows), in ``dtype``."""
    def rows(size, rng):
        x = layernorm_rows(size, rng)
        return x.astype(dtype)
    return rows


def _vector(cols, rng, low, high, dtype):
    return rng.uniform(low, high, cols).astype(np.float32).astype(dtype)


def _norm_adversarial(dtype, with_bias):
    """Rows whose squares pass 65504 (an fp16 sum of squares is inf), subnormal rows (a kernel that
    flushes them to zero divides 0 by sqrt(eps)), constant rows (variance 0) and rows of mean 1e4."""
    big = 3.0e4 if dtype == FLOAT16 else 1.0e15
    small = 3.0e-6 if dtype == FLOAT16 else 3.0e-39  # subnormal in the format itself

    def cases(size, rng):
        rows, cols = size
        vectors = (_vector(cols, rng, 0.5, 1.5, dtype),) + ((_vector(cols, rng, -1, 1, dtype),) if with_bias else ())
        big_rows = rng.uniform(-big, big, size).astype(np.float32)
        subnormal = rng.uniform(-small, small, size).astype(np.float32)
        constant = np.repeat(rng.uniform(-100, 100, (rows, 1)), cols, axis=1).astype(np.float32)
        offset = (1e4 + rng.standard_normal(size)).astype(np.float32)
        return [(label, (a.astype(dtype),) + vectors) for label, a in
                [("squares past 65504", big_rows), ("subnormal rows", subnormal), ("constant rows", constant),
                 ("mean 1e4", offset)]]
    return cases


def _layernorm_op(dtype, rank):
    rows = _norm_rows(dtype)
    return half_operator(
        dtype,
        name="layernorm", variant={"dtype": short_name(dtype)},
        targets=[of_ceiling(85, "copy_gbps"), against_peer(1.2, "eager")],
        title=f"LayerNorm over the rows of {a_matrix(dtype)}, float32 inside",
        reference=lambda x, w, b: layernorm64(*as_float64(x, w, b)),
        make_inputs=lambda size, rng: (rows(size, rng), _vector(size[1], rng, 0.5, 1.5, dtype),
                                       _vector(size[1], rng, -1, 1, dtype)),
        bytes_moved=lambda size: dtype.itemsize * (2 * size[0] * size[1] + 2 * size[1]),
        flops=lambda size: 7 * size[0] * size[1],
        validate=lambda x, w, b, out: (expect_rows(dtype, ("x", x), ("out", out)),
                                       expect_vectors(dtype, x, ("weight", w), ("bias", b))),
        peer=torch_peer(f"torch.nn.functional.layer_norm ({short_name(dtype)})", lambda torch, x, w, b, out:
                        torch.nn.functional.layer_norm(peers.as_torch(x), (x.shape[1],), peers.as_torch(w),
                                                       peers.as_torch(b), float(EPS)), returns=True),
        torch_expression=lambda torch, size: lambda x, w, b: torch.nn.functional.layer_norm(
            x, (size[1],), w, b, TORCH_EPS),
        rank=rank,
        adversarial_inputs=_norm_adversarial(dtype, with_bias=True),
        **ROW_SIZES,
    )


def _rmsnorm_op(dtype, rank):
    rows = _norm_rows(dtype)
    return half_operator(
        dtype,
        name="rmsnorm", variant={"dtype": short_name(dtype)},
        targets=[of_ceiling(85, "copy_gbps"), against_peer(1.2, "eager")],
        title=f"RMSNorm over the rows of {a_matrix(dtype)}, float32 inside",
        reference=lambda x, w: rmsnorm64(*as_float64(x, w)),
        make_inputs=lambda size, rng: (rows(size, rng), _vector(size[1], rng, 0.5, 1.5, dtype)),
        bytes_moved=lambda size: dtype.itemsize * (2 * size[0] * size[1] + size[1]),
        flops=lambda size: 4 * size[0] * size[1],
        validate=lambda x, w, out: (expect_rows(dtype, ("x", x), ("out", out)), expect_vectors(dtype, x, ("weight", w))),
        peer=torch_peer(f"torch.nn.functional.rms_norm ({short_name(dtype)})", lambda torch, x, w, out:
                        torch.nn.functional.rms_norm(peers.as_torch(x), (x.shape[1],), peers.as_torch(w),
                                                     float(EPS)), returns=True),
        torch_expression=lambda torch, size: lambda x, w: torch.nn.functional.rms_norm(x, (size[1],), w, TORCH_EPS),
        rank=rank,
        adversarial_inputs=_norm_adversarial(dtype, with_bias=False),
        **ROW_SIZES,
    )


LAYERNORM = [_layernorm_op(dtype, 210 + i) for i, dtype in enumerate(FORMATS)]
RMSNORM = [_rmsnorm_op(dtype, 220 + i) for i, dtype in enumerate(FORMATS)]


# -- 1. widened -----------------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def layernorm_widened_row(x, weight, bias, out, widen, narrow):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(ILP, float32)  # the write pass's loads, all issued before the first store
    ws = cuda.local.array(ILP, float32)
    bs = cuda.local.array(ILP, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    x0 = widen(uint32(x[row, 0]))  # every element is shifted by the row's first: see layernorm.py
    # HINT: layernorm's ilp kernel (mean of x - x0, mean squared deviation, then the output), each 16-bit
    # HINT: load widened first (widen(x[row, j]), widen(weight[j]), ...), the output stored as narrow(value).
    # BEGIN SOLUTION
    total = float32(0.0)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            total += widen(uint32(x[row, j + uint64(u * THREADS)])) - x0
        j += uint64(ILP_SPAN)
    while j < cols:
        total += widen(uint32(x[row, j])) - x0
        j += uint64(THREADS)
    mean = block_sum(total, reduced, 0) / float32(cols)
    squares = float32(0.0)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            d = widen(uint32(x[row, j + uint64(u * THREADS)])) - x0 - mean
            squares += d * d
        j += uint64(ILP_SPAN)
    while j < cols:
        d = widen(uint32(x[row, j])) - x0 - mean
        squares += d * d
        j += uint64(THREADS)
    rstd = float32(1.0) / math.sqrt(block_sum(squares, reduced, 1) / float32(cols) + EPS)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            c = j + uint64(u * THREADS)
            xs[u] = widen(uint32(x[row, c]))
            ws[u] = widen(uint32(weight[c]))
            bs[u] = widen(uint32(bias[c]))
        for u in range(ILP):
            out[row, j + uint64(u * THREADS)] = uint16(narrow((xs[u] - x0 - mean) * rstd * ws[u] + bs[u]))
        j += uint64(ILP_SPAN)
    while j < cols:
        value = (widen(uint32(x[row, j])) - x0 - mean) * rstd * widen(uint32(weight[j])) + widen(uint32(bias[j]))
        out[row, j] = uint16(narrow(value))
        j += uint64(THREADS)
    # END SOLUTION


@cuda.jit
def _layernorm_widened_f16(x, weight, bias, out):
    layernorm_widened_row(x, weight, bias, out, f16_to_float, float_to_f16)


@cuda.jit
def _layernorm_widened_bf16(x, weight, bias, out):
    layernorm_widened_row(x, weight, bias, out, bf16_to_float, float_to_bf16)


@each(LAYERNORM, "widened", """
    layernorm's last float32 kernel with 16-bit loads and stores: a block of 256 threads per row,
    three passes (mean, mean squared deviation, output), eight loads in flight per thread, every
    element shifted by the row's first one. Each half is widened as it is loaded, so the sums are
    float32: in fp16 a sum of squares past 65504 would be inf, and any fp16 sum past 2048 stops
    counting ones. Half the bytes of the float32 kernel, the same instructions per element plus a
    conversion each way, and half the bytes in flight per thread.""")
def layernorm_widened(x, weight, bias, out):
    kernel = _layernorm_widened_bf16 if is_bf16(x) else _layernorm_widened_f16
    kernel[x.shape[0], THREADS](bits16(x), bits16(weight), bits16(bias), bits16(out))


# -- 2. packed ------------------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def layernorm_packed_row(x16, x32, weight, bias, out16, out32, cols, widen, narrow, threads):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    ws = cuda.local.array(ILP, uint32)
    t = uint64(cuda.threadIdx.x)
    last = uint64((ILP - 1) * threads)  # offset of a step's last word from its first
    span = uint64(ILP * threads)  # words a block covers per unrolled step
    warps = threads // 32
    start, end, first, stop = row_words(uint64(cuda.blockIdx.x), uint64(cols))
    edge = edge_element(t, start, end)
    x0 = widen(uint32(x16[start]))
    # HINT: the widened kernel over the row's words (two halves each, eight words a step) plus its edge
    # HINT: element (if edge < end). The column of element e is e - start: weight and bias are read a
    # HINT: half at a time, since a word of x need not line up with a word of weight.
    # BEGIN SOLUTION
    total = float32(0.0)
    if edge < end:
        total = widen(uint32(x16[edge])) - x0
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            word = x32[w + uint64(u * threads)]
            total += (widen(word) - x0) + (widen(word >> SIXTEEN) - x0)
        w += span
    while w < stop:
        word = x32[w]
        total += (widen(word) - x0) + (widen(word >> SIXTEEN) - x0)
        w += uint64(threads)
    mean = block_sum_over(total, reduced, 0, warps) / float32(cols)
    squares = float32(0.0)
    if edge < end:
        d = widen(uint32(x16[edge])) - x0 - mean
        squares = d * d
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            word = x32[w + uint64(u * threads)]
            d_low = widen(word) - x0 - mean
            d_high = widen(word >> SIXTEEN) - x0 - mean
            squares += d_low * d_low + d_high * d_high
        w += span
    while w < stop:
        word = x32[w]
        d_low = widen(word) - x0 - mean
        d_high = widen(word >> SIXTEEN) - x0 - mean
        squares += d_low * d_low + d_high * d_high
        w += uint64(threads)
    rstd = float32(1.0) / math.sqrt(block_sum_over(squares, reduced, 1, warps) / float32(cols) + EPS)
    # x - x0 - mean, never x - (x0 + mean): x0 + mean rounds to float32 at x0's size (2^-10 at 1e4), which
    # on a row of mean 1e4 and spread 0.1 (fp16 rounds 1e4 + N(0, 1) to steps of 8) is 1% of the spread.
    if edge < end:
        c = edge - start
        value = (widen(uint32(x16[edge])) - x0 - mean) * rstd * widen(uint32(weight[c])) + widen(uint32(bias[c]))
        out16[edge] = uint16(narrow(value))
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            ws[u] = x32[w + uint64(u * threads)]
        for u in range(ILP):
            c = (w + uint64(u * threads)) * uint64(2) - start
            low = (widen(ws[u]) - x0 - mean) * rstd * widen(uint32(weight[c])) + widen(uint32(bias[c]))
            c += uint64(1)
            high = (widen(ws[u] >> SIXTEEN) - x0 - mean) * rstd * widen(uint32(weight[c])) + widen(uint32(bias[c]))
            out32[w + uint64(u * threads)] = pack(narrow(low), narrow(high))
        w += span
    while w < stop:
        word = x32[w]
        c = w * uint64(2) - start
        low = (widen(word) - x0 - mean) * rstd * widen(uint32(weight[c])) + widen(uint32(bias[c]))
        c += uint64(1)
        high = (widen(word >> SIXTEEN) - x0 - mean) * rstd * widen(uint32(weight[c])) + widen(uint32(bias[c]))
        out32[w] = pack(narrow(low), narrow(high))
        w += uint64(threads)
    # END SOLUTION


@cuda.jit
def _layernorm_packed_f16(x16, x32, weight, bias, out16, out32, cols):
    layernorm_packed_row(x16, x32, weight, bias, out16, out32, cols, f16_to_float, float_to_f16, THREADS)


@cuda.jit
def _layernorm_packed_bf16(x16, x32, weight, bias, out16, out32, cols):
    layernorm_packed_row(x16, x32, weight, bias, out16, out32, cols, bf16_to_float, float_to_bf16, THREADS)


@each(LAYERNORM, "packed", """
    The three passes over 32-bit words of x, two halves a load, eight words in flight per thread: the
    float32 kernel's 32 bytes in flight, with half the load instructions per element. The output is
    stored a word at a time, each row's odd edge elements 16 bits at a time. Weight and bias are read a
    half at a time: when the columns are odd, a word of x starts at an odd column in every other row,
    where it does not line up with a word of weight. They are 8 KB each at 4096 columns, read by every
    row, so they come from L1 and cost instructions, not bandwidth. On an H200 at 32768 x 4096 it made
    bf16 about 14% faster; fp16's timings spread too widely (p10 to p90) to tell it from widened in one
    run, and another run had it 24% faster.""")
def layernorm_packed(x, weight, bias, out):
    kernel = _layernorm_packed_bf16 if is_bf16(x) else _layernorm_packed_f16
    kernel[x.shape[0], THREADS](flat_bits16(x), words(x), bits16(weight), bits16(bias), flat_bits16(out),
                                words(out), x.shape[1])


# -- 3. rows_in_flight: four warps per row ----------------------------------------------------------------

@cuda.jit
def _layernorm_rows_f16(x16, x32, weight, bias, out16, out32, cols):
    layernorm_packed_row(x16, x32, weight, bias, out16, out32, cols, f16_to_float, float_to_f16, ROW_THREADS)


@cuda.jit
def _layernorm_rows_bf16(x16, x32, weight, bias, out16, out32, cols):
    layernorm_packed_row(x16, x32, weight, bias, out16, out32, cols, bf16_to_float, float_to_bf16, ROW_THREADS)


@each(LAYERNORM, "rows_in_flight", """
    The packed kernel in blocks of 128 threads per row instead of 256. A block's time on a row is mostly
    fixed latency (the first pass's loads, two barriers, the reductions), whatever the row's bytes;
    at 2 bytes an element a 4096-column row is 8 KB where the float32 kernel's was 16 KB, so 256-
    thread blocks (eight per multiprocessor at 32 registers) keep 64 KB of rows moving per
    multiprocessor where the float32 ilp kernel kept 96 KB (six blocks of 16 KB): about half its
    bandwidth, which is what the packed stage measured. Blocks of 128 threads fit sixteen to a
    multiprocessor: 128 KB of rows in flight, each thread two unrolled steps of eight words a pass
    (the float32 kernel's shape again), and the reductions cross four warps instead of eight.""")
def layernorm_rows_in_flight(x, weight, bias, out):
    kernel = _layernorm_rows_bf16 if is_bf16(x) else _layernorm_rows_f16
    kernel[x.shape[0], ROW_THREADS](flat_bits16(x), words(x), bits16(weight), bits16(bias), flat_bits16(out),
                                    words(out), x.shape[1])


# -- 4. in_registers: the row read once, 16 bytes a load, two results rounded by one instruction ----------

@cuda.jit(device=True, inline=True)
def layernorm_registers_row(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads, widen, narrow, narrow2):
    reduced = cuda.shared.array(GROUP_SLOTS, float32)
    held = cuda.local.array(HELD, uint32)
    results = cuda.local.array(4, uint32)
    t, start, end, head_end, first, stop, tail = group_row(uint64(rows), uint64(cols), uint64(threads))
    head, tail = start + t, tail + t  # this thread's head and tail element, if they are in the row
    warps = threads // 32
    # HINT: softmax's in_registers row: load_held, then the mean of x - x0 and the mean squared deviation
    # HINT: from the held words and the head/tail elements (group_sum, slots 0 and 1).
    # HINT: weight and bias of vector v: vector_at(w16, w32, 8v - start, start % 8 == 0).
    # BEGIN SOLUTION
    load_held(x32, held, first, stop, t, uint64(threads))
    x0 = widen(uint32(x16[start])) if start < end else float32(0.0)  # the shift of the float32 ladder
    x_head = widen(uint32(x16[head])) - x0 if head < head_end else float32(0.0)
    x_tail = widen(uint32(x16[tail])) - x0 if tail < end else float32(0.0)
    total = x_head + x_tail
    for i in range(HELD):
        if first + t + uint64(i // 4) * uint64(threads) < stop:
            total += (widen(held[i]) - x0) + (widen(held[i] >> SIXTEEN) - x0)
    mean = group_sum(total, reduced, 0, warps) / float32(cols)
    squares = float32(0.0)
    if head < head_end:
        squares = (x_head - mean) * (x_head - mean)
    if tail < end:
        squares += (x_tail - mean) * (x_tail - mean)
    for i in range(HELD):
        if first + t + uint64(i // 4) * uint64(threads) < stop:
            d_low = widen(held[i]) - x0 - mean
            d_high = widen(held[i] >> SIXTEEN) - x0 - mean
            squares += d_low * d_low + d_high * d_high
    rstd = float32(1.0) / math.sqrt(group_sum(squares, reduced, 1, warps) / float32(cols) + EPS)
    aligned = start % uint64(VECTOR) == uint64(0)  # then a vector of x lines up with one of weight
    for k in range(CHUNKS):
        v = first + t + uint64(k) * uint64(threads)
        if v < stop:
            c = v * uint64(VECTOR) - start
            ws = vector_at(w16, w32, c, aligned)
            bs = vector_at(b16, b32, c, aligned)
            for j in range(4):
                word = held[4 * k + j]
                low = (widen(word) - x0 - mean) * rstd * widen(ws[j]) + widen(bs[j])
                high = (widen(word >> SIXTEEN) - x0 - mean) * rstd * widen(ws[j] >> SIXTEEN) + widen(bs[j] >> SIXTEEN)
                results[j] = narrow2(low, high)
            store4(out32, v * uint64(4), results[0], results[1], results[2], results[3])
    if head < head_end:
        c = head - start
        out16[head] = uint16(narrow((x_head - mean) * rstd * widen(uint32(w16[c])) + widen(uint32(b16[c]))))
    if tail < end:
        c = tail - start
        out16[tail] = uint16(narrow((x_tail - mean) * rstd * widen(uint32(w16[c])) + widen(uint32(b16[c]))))
    # END SOLUTION


@cuda.jit
def _layernorm_registers_f16(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads):
    layernorm_registers_row(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads,
                            f16_to_float, float_to_f16, cvt_pair_f16)


@cuda.jit
def _layernorm_registers_bf16(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads):
    layernorm_registers_row(x16, x32, w16, w32, b16, b32, out16, out32, rows, cols, threads,
                            bf16_to_float, float_to_bf16, cvt_pair_bf16)


def layernorm_in_registers(x, weight, bias, out):
    """Not a stage: RMSNorm's in_registers idea applied to LayerNorm (the mean of x - x0 and the mean squared
    deviation from the held halves), measured slower than rows_in_flight on an H200 at 32768 x 4096 (fp16
    215.0 us against 181.4, bf16 215.7 against 207.8; see RMSNORM_ONLY). scripts/gpu_half_norms.py times
    it with its registers capped."""
    rows, cols = x.shape
    threads = registers_threads(cols)
    if threads is None or not aligned16(x, weight, bias, out):
        return layernorm_rows_in_flight(x, weight, bias, out)
    blocks, block = registers_grid(rows, threads)
    kernel = _layernorm_registers_bf16 if is_bf16(x) else _layernorm_registers_f16
    kernel[blocks, block](flat_bits16(x), words(x), bits16(weight), words(weight), bits16(bias), words(bias),
                          flat_bits16(out), words(out), rows, cols, threads)


# -- RMSNorm: 1. widened --------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def rmsnorm_widened_row(x, weight, out, widen, narrow):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(ILP, float32)
    ws = cuda.local.array(ILP, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    # HINT: two passes: the sum of squares of the widened values (float32: fp16 squares overflow past 255),
    # HINT: then out = narrow(x * rstd * weight), eight columns a step with loads before stores.
    # BEGIN SOLUTION
    squares = float32(0.0)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            v = widen(uint32(x[row, j + uint64(u * THREADS)]))
            squares += v * v
        j += uint64(ILP_SPAN)
    while j < cols:
        v = widen(uint32(x[row, j]))
        squares += v * v
        j += uint64(THREADS)
    rstd = float32(1.0) / math.sqrt(block_sum(squares, reduced, 0) / float32(cols) + EPS)
    j = t
    while j + uint64(LAST) < cols:
        for u in range(ILP):
            xs[u] = widen(uint32(x[row, j + uint64(u * THREADS)]))
            ws[u] = widen(uint32(weight[j + uint64(u * THREADS)]))
        for u in range(ILP):
            out[row, j + uint64(u * THREADS)] = uint16(narrow(xs[u] * rstd * ws[u]))
        j += uint64(ILP_SPAN)
    while j < cols:
        out[row, j] = uint16(narrow(widen(uint32(x[row, j])) * rstd * widen(uint32(weight[j]))))
        j += uint64(THREADS)
    # END SOLUTION


@cuda.jit
def _rmsnorm_widened_f16(x, weight, out):
    rmsnorm_widened_row(x, weight, out, f16_to_float, float_to_f16)


@cuda.jit
def _rmsnorm_widened_bf16(x, weight, out):
    rmsnorm_widened_row(x, weight, out, bf16_to_float, float_to_bf16)


@each(RMSNORM, "widened", """
    A block of 256 threads per row, two passes (the sum of squares, then the output, from L1),
    eight 16-bit loads in flight per thread, everything in float32 between the load and the store.
    It has to be: an fp16 square overflows past 255 (256^2 = 65536), so an fp16 sum of squares of
    ordinary activations is inf, and the output would be zero.""")
def rmsnorm_widened(x, weight, out):
    kernel = _rmsnorm_widened_bf16 if is_bf16(x) else _rmsnorm_widened_f16
    kernel[x.shape[0], THREADS](bits16(x), bits16(weight), bits16(out))


# -- RMSNorm: 2. packed ---------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def rmsnorm_packed_row(x16, x32, weight, out16, out32, cols, widen, narrow, threads):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    ws = cuda.local.array(ILP, uint32)
    t = uint64(cuda.threadIdx.x)
    last = uint64((ILP - 1) * threads)  # offset of a step's last word from its first
    span = uint64(ILP * threads)  # words a block covers per unrolled step
    warps = threads // 32
    start, end, first, stop = row_words(uint64(cuda.blockIdx.x), uint64(cols))
    edge = edge_element(t, start, end)
    # HINT: the widened kernel over words plus the row's edge element; weight read a half at a time
    # HINT: at column e - start of element e.
    # BEGIN SOLUTION
    squares = float32(0.0)
    if edge < end:
        v = widen(uint32(x16[edge]))
        squares = v * v
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            word = x32[w + uint64(u * threads)]
            low = widen(word)
            high = widen(word >> SIXTEEN)
            squares += low * low + high * high
        w += span
    while w < stop:
        word = x32[w]
        low = widen(word)
        high = widen(word >> SIXTEEN)
        squares += low * low + high * high
        w += uint64(threads)
    rstd = float32(1.0) / math.sqrt(block_sum_over(squares, reduced, 0, warps) / float32(cols) + EPS)
    if edge < end:
        out16[edge] = uint16(narrow(widen(uint32(x16[edge])) * rstd * widen(uint32(weight[edge - start]))))
    w = first + t
    while w + last < stop:
        for u in range(ILP):
            ws[u] = x32[w + uint64(u * threads)]
        for u in range(ILP):
            c = (w + uint64(u * threads)) * uint64(2) - start
            low = widen(ws[u]) * rstd * widen(uint32(weight[c]))
            high = widen(ws[u] >> SIXTEEN) * rstd * widen(uint32(weight[c + uint64(1)]))
            out32[w + uint64(u * threads)] = pack(narrow(low), narrow(high))
        w += span
    while w < stop:
        word = x32[w]
        c = w * uint64(2) - start
        low = widen(word) * rstd * widen(uint32(weight[c]))
        high = widen(word >> SIXTEEN) * rstd * widen(uint32(weight[c + uint64(1)]))
        out32[w] = pack(narrow(low), narrow(high))
        w += uint64(threads)
    # END SOLUTION


@cuda.jit
def _rmsnorm_packed_f16(x16, x32, weight, out16, out32, cols):
    rmsnorm_packed_row(x16, x32, weight, out16, out32, cols, f16_to_float, float_to_f16, THREADS)


@cuda.jit
def _rmsnorm_packed_bf16(x16, x32, weight, out16, out32, cols):
    rmsnorm_packed_row(x16, x32, weight, out16, out32, cols, bf16_to_float, float_to_bf16, THREADS)


@each(RMSNORM, "packed", """
    Both passes over 32-bit words, two halves a load and a store, eight words in flight per thread,
    each row's odd edge elements 16 bits at a time; the weight is read a half at a time from L1
    (a word of x and a word of weight line up only in rows that start at an even element).""")
def rmsnorm_packed(x, weight, out):
    kernel = _rmsnorm_packed_bf16 if is_bf16(x) else _rmsnorm_packed_f16
    kernel[x.shape[0], THREADS](flat_bits16(x), words(x), bits16(weight), flat_bits16(out), words(out), x.shape[1])


# -- RMSNorm: 3. rows_in_flight ------------------------------------------------------------------------

@cuda.jit
def _rmsnorm_rows_f16(x16, x32, weight, out16, out32, cols):
    rmsnorm_packed_row(x16, x32, weight, out16, out32, cols, f16_to_float, float_to_f16, ROW_THREADS)


@cuda.jit
def _rmsnorm_rows_bf16(x16, x32, weight, out16, out32, cols):
    rmsnorm_packed_row(x16, x32, weight, out16, out32, cols, bf16_to_float, float_to_bf16, ROW_THREADS)


@each(RMSNORM, "rows_in_flight", """
    The packed kernel in blocks of 128 threads per row instead of 256 (RMSNorm has one reduction,
    one barrier fewer than LayerNorm, which is why its packed stage was already at 83% of copy).
    A block's time on a row is mostly
    fixed latency (the first pass's loads, two barriers, the reductions), whatever the row's bytes;
    at 2 bytes an element a 4096-column row is 8 KB where the float32 kernel's was 16 KB, so 256-
    thread blocks (eight per multiprocessor at 32 registers) keep 64 KB of rows moving per
    multiprocessor where the float32 ilp kernel kept 96 KB (six blocks of 16 KB): about half its
    bandwidth, which is what the packed stage measured. Blocks of 128 threads fit sixteen to a
    multiprocessor: 128 KB of rows in flight, each thread two unrolled steps of eight words a pass
    (the float32 kernel's shape again), and the reductions cross four warps instead of eight.""")
def rmsnorm_rows_in_flight(x, weight, out):
    kernel = _rmsnorm_rows_bf16 if is_bf16(x) else _rmsnorm_rows_f16
    kernel[x.shape[0], ROW_THREADS](flat_bits16(x), words(x), bits16(weight), flat_bits16(out), words(out),
                                    x.shape[1])


# -- RMSNorm: 4. in_registers ----------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def rmsnorm_registers_row(x16, x32, w16, w32, out16, out32, rows, cols, threads, widen, narrow, narrow2):
    reduced = cuda.shared.array(GROUP_SLOTS, float32)
    held = cuda.local.array(HELD, uint32)
    results = cuda.local.array(4, uint32)
    t, start, end, head_end, first, stop, tail = group_row(uint64(rows), uint64(cols), uint64(threads))
    head, tail = start + t, tail + t  # this thread's head and tail element, if they are in the row
    warps = threads // 32
    # HINT: layernorm's in_registers row with one statistic: the sum of squares of the held halves.
    # BEGIN SOLUTION
    load_held(x32, held, first, stop, t, uint64(threads))
    x_head = widen(uint32(x16[head])) if head < head_end else float32(0.0)
    x_tail = widen(uint32(x16[tail])) if tail < end else float32(0.0)
    squares = x_head * x_head + x_tail * x_tail
    for i in range(HELD):
        if first + t + uint64(i // 4) * uint64(threads) < stop:
            low = widen(held[i])
            high = widen(held[i] >> SIXTEEN)
            squares += low * low + high * high
    rstd = float32(1.0) / math.sqrt(group_sum(squares, reduced, 0, warps) / float32(cols) + EPS)
    aligned = start % uint64(VECTOR) == uint64(0)
    for k in range(CHUNKS):
        v = first + t + uint64(k) * uint64(threads)
        if v < stop:
            ws = vector_at(w16, w32, v * uint64(VECTOR) - start, aligned)
            for j in range(4):
                word = held[4 * k + j]
                results[j] = narrow2(widen(word) * rstd * widen(ws[j]), widen(word >> SIXTEEN) * rstd * widen(ws[j] >> SIXTEEN))
            store4(out32, v * uint64(4), results[0], results[1], results[2], results[3])
    if head < head_end:
        out16[head] = uint16(narrow(x_head * rstd * widen(uint32(w16[head - start]))))
    if tail < end:
        out16[tail] = uint16(narrow(x_tail * rstd * widen(uint32(w16[tail - start]))))
    # END SOLUTION


@cuda.jit
def _rmsnorm_registers_f16(x16, x32, w16, w32, out16, out32, rows, cols, threads):
    rmsnorm_registers_row(x16, x32, w16, w32, out16, out32, rows, cols, threads, f16_to_float, float_to_f16, cvt_pair_f16)


@cuda.jit
def _rmsnorm_registers_bf16(x16, x32, w16, w32, out16, out32, rows, cols, threads):
    rmsnorm_registers_row(x16, x32, w16, w32, out16, out32, rows, cols, threads, bf16_to_float, float_to_bf16,
                          cvt_pair_bf16)


RMSNORM_ONLY = """
    Only RMSNorm has this stage. The same kernels for softmax and LayerNorm (softmax_in_registers,
    layernorm_in_registers above) were slower than their rows_in_flight stage on an H200 at 32768 x
    4096 (softmax fp16 266.7 us against 165.3, bf16 206.8 against 189.0; LayerNorm fp16 215.0 against
    181.4, bf16 215.7 against 207.8), while RMSNorm's ran at 94% of copy. Holding 32 halves a thread
    costs 52 to 62 registers (rows_in_flight needs 32), so a multiprocessor holds about 8 or 9 groups of
    128 threads instead of 16: half the rows in flight. RMSNorm has one reduction between its loads and
    its stores; softmax and LayerNorm have two, each a barrier, and more arithmetic per element in
    between (two exponentials, two subtractions), so each resident row spends longer without a load in
    flight and the halved occupancy shows. (That is the explanation the register count suggests;
    scripts/gpu_half_norms.py times those kernels with their registers capped, which tests it.)"""


@each(RMSNORM, "in_registers", IN_REGISTERS + """
    Here: the sum of squares from the held halves, then the output with the weight in 16-byte loads
    from L1 when the row starts on 16 bytes.""" + RMSNORM_ONLY)
def rmsnorm_in_registers(x, weight, out):
    rows, cols = x.shape
    threads = registers_threads(cols)
    if threads is None or not aligned16(x, weight, out):
        return rmsnorm_rows_in_flight(x, weight, out)
    blocks, block = registers_grid(rows, threads)
    kernel = _rmsnorm_registers_bf16 if is_bf16(x) else _rmsnorm_registers_f16
    kernel[blocks, block](flat_bits16(x), words(x), bits16(weight), words(weight), flat_bits16(out), words(out),
                          rows, cols, threads)


# ======================================================================================================
# GELU(x + bias) + residual
# ======================================================================================================

def _gelu_inputs(dtype):
    def make(size, rng):
        return tuple(a.astype(dtype) for a in gelu_bias_residual_inputs(size, rng))
    return make


def _gelu_adversarial(dtype):
    big = 3.0e4 if dtype == FLOAT16 else 1.0e30  # x + bias + residual stays inside the format
    # Subnormal x (below 6.1e-5 in fp16, 1.2e-38 in bf16) on a small normal bias: x moves x + bias by
    # several roundings of the output, so a kernel that flushes subnormals to zero is caught, while the
    # output itself stays normal (a subnormal output would carry fewer bits than the tolerance assumes).
    small, bias = (3.0e-6, 1.0e-3) if dtype == FLOAT16 else (1.1e-38, 2.0e-37)

    def cases(size, rng):
        rows, cols = size
        large = (rng.uniform(-big, big, size), rng.uniform(-big / 30, big / 30, cols), rng.uniform(0, big / 30, size))
        subnormal = (rng.uniform(-small, small, size), np.full(cols, bias), np.zeros(size))
        return [(label, tuple(a.astype(np.float32).astype(dtype) for a in arrays)) for label, arrays in
                [("large values", large), ("subnormal x, small bias", subnormal)]]
    return cases


def _gelu_peer(torch, x, bias, residual, out):
    gelu = torch.nn.functional.gelu  # approximate="none": the erf GELU
    torch.add(gelu(peers.as_torch(x) + peers.as_torch(bias)), peers.as_torch(residual), out=peers.as_torch(out))


def _gelu_op(dtype, rank):
    def validate(x, bias, residual, out):
        expect_rows(dtype, ("x", x), ("residual", residual), ("out", out))
        expect_vectors(dtype, x, ("bias", bias))

    return half_operator(
        dtype,
        name="elementwise", variant={"dtype": short_name(dtype)},
        title=f"GELU(x + bias) + residual on {a_matrix(dtype)}, float32 inside",
        reference=lambda x, bias, residual: gelu_bias_residual64(*as_float64(x, bias, residual)),
        make_inputs=_gelu_inputs(dtype),
        bytes_moved=lambda size: dtype.itemsize * (3 * size[0] * size[1] + size[1]),
        pattern="read2_write1",  # x and residual read, out written: the two-reads-one-write ceiling
        flops=lambda size: 8 * size[0] * size[1],
        validate=validate,
        peer=torch_peer(f"torch (gelu(x + bias) + residual, {short_name(dtype)})", _gelu_peer),
        # Eager torch rounds x + bias and the GELU to the half format between its three kernels;
        # Inductor fuses them and, by default, keeps the intermediates in float32, as the stages do.
        torch_expression=lambda torch, size: lambda x, bias, residual: (
            torch.nn.functional.gelu(x + bias) + residual),
        rank=rank,
        adversarial_inputs=_gelu_adversarial(dtype),
        check_sizes=[(1, 1), (1, 37), (37, 1), (1, 2**21 + 3), (33, 65), (1001, 4097), (16384, 16384)],
        sim_sizes=[(1, 1), (2, 5), (3, 37), (9, 65), (65, 67)],  # the last: full unrolled steps
        bench_sizes=[(1024, 1024), (4096, 4096), (8192, 8192), (16384, 16384)],
        headline_size=(16384, 16384),
    )


GELU = [_gelu_op(dtype, 230 + i) for i, dtype in enumerate(FORMATS)]
GELU_BLOCKS_PER_SM = 8  # the float32 ladder's best grid for its eight-in-flight kernel


def gelu_grid(items):
    """Blocks for a grid-stride loop over ``items``: enough for ILP items a thread, at most 8 blocks per
    multiprocessor (the float32 ladder's best for eight loads in flight)."""
    return max(1, min(-(-items // (THREADS * ILP)), sm_count() * GELU_BLOCKS_PER_SM))


@cuda.jit(device=True, inline=True)
def wrap(col, cols):
    """col + step for a step < cols lands below 2 cols: one compare brings it back into range."""
    return col - cols if col >= cols else col


# -- 1. widened: the float32 kernel on halves -------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def gelu_widened_flat(x, bias, residual, out, widen, narrow):
    xs = cuda.local.array(ILP, float32)
    rs = cuda.local.array(ILP, float32)
    bs = cuda.local.array(ILP, float32)
    n = uint64(x.size)
    cols = uint64(bias.size)
    stride = uint64(cuda.gridsize(1))
    i = uint64(cuda.grid(1))
    # HINT: elementwise's ilp8_unsigned loop over the flat arrays: eight elements a stride apart, their
    # HINT: column walked with wrap(col + step, cols); every 16-bit load widened, the result narrowed.
    # BEGIN SOLUTION
    col = i % cols
    step = stride % cols
    span = stride * uint64(ILP)
    while i + span - stride < n:
        c = col
        for u in range(ILP):
            k = i + uint64(u) * stride
            xs[u] = widen(uint32(x[k]))
            rs[u] = widen(uint32(residual[k]))
            bs[u] = widen(uint32(bias[c]))
            c = wrap(c + step, cols)
        for u in range(ILP):
            out[i + uint64(u) * stride] = uint16(narrow(gelu(xs[u] + bs[u]) + rs[u]))
        col = c
        i += span
    while i < n:
        out[i] = uint16(narrow(gelu(widen(uint32(x[i])) + widen(uint32(bias[col]))) + widen(uint32(residual[i]))))
        col = wrap(col + step, cols)
        i += stride
    # END SOLUTION


@cuda.jit
def _gelu_widened_f16(x, bias, residual, out):
    gelu_widened_flat(x, bias, residual, out, f16_to_float, float_to_f16)


@cuda.jit
def _gelu_widened_bf16(x, bias, residual, out):
    gelu_widened_flat(x, bias, residual, out, bf16_to_float, float_to_bf16)


@each(GELU, "widened", """
    elementwise's last float32 kernel with 16-bit loads and stores: the matrix walked flat, eight
    elements a grid stride apart per thread, unsigned indices, each column one compare from the
    last. x, bias and residual are widened as they are loaded, x + bias, the erf GELU and the
    residual add are float32, and the sum is rounded to 16 bits once: 6 bytes an element instead of
    12. torch computes the same chain as three kernels, each rounding its result to 16 bits.""")
def gelu_widened(x, bias, residual, out):
    kernel = _gelu_widened_bf16 if is_bf16(x) else _gelu_widened_f16
    kernel[gelu_grid(x.shape[0] * x.shape[1]), THREADS](flat_bits16(x), bits16(bias), flat_bits16(residual),
                                                         flat_bits16(out))


# -- 2. packed: words of two halves -------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def gelu_packed_flat(x16, x32, bias, r16, r32, out16, out32, widen, narrow):
    xs = cuda.local.array(ILP, uint32)
    rs = cuda.local.array(ILP, uint32)
    cs = cuda.local.array(ILP, uint64)
    n = uint64(x16.size)
    words_n = uint64(x32.size)
    cols = uint64(bias.size)
    stride = uint64(cuda.gridsize(1))
    w = uint64(cuda.grid(1))
    # HINT: a grid-stride loop over words, eight a step: word w holds elements 2w and 2w + 1, in columns
    # HINT: col = 2w % cols and wrap(col + 1, cols); the next word's column is wrap(col + 2 stride % cols).
    # HINT: when n is odd its last element belongs to no word: thread 0 does it through the 16-bit arrays.
    # BEGIN SOLUTION
    col = (w * uint64(2)) % cols
    step = (stride * uint64(2)) % cols
    one = uint64(1) % cols  # the next column: 1, or 0 when there is only one column
    span = stride * uint64(ILP)
    while w + span - stride < words_n:
        c = col
        for u in range(ILP):
            k = w + uint64(u) * stride
            xs[u] = x32[k]
            rs[u] = r32[k]
            cs[u] = c
            c = wrap(c + step, cols)
        for u in range(ILP):
            c_high = wrap(cs[u] + one, cols)
            low = gelu(widen(xs[u]) + widen(uint32(bias[cs[u]]))) + widen(rs[u])
            high = gelu(widen(xs[u] >> SIXTEEN) + widen(uint32(bias[c_high]))) + widen(rs[u] >> SIXTEEN)
            out32[w + uint64(u) * stride] = pack(narrow(low), narrow(high))
        col = c
        w += span
    while w < words_n:
        word, r = x32[w], r32[w]
        low = gelu(widen(word) + widen(uint32(bias[col]))) + widen(r)
        high = gelu(widen(word >> SIXTEEN) + widen(uint32(bias[wrap(col + one, cols)]))) + widen(r >> SIXTEEN)
        out32[w] = pack(narrow(low), narrow(high))
        col = wrap(col + step, cols)
        w += stride
    if cuda.grid(1) == 0 and n & uint64(1):
        last = n - uint64(1)
        value = gelu(widen(uint32(x16[last])) + widen(uint32(bias[last % cols]))) + widen(uint32(r16[last]))
        out16[last] = uint16(narrow(value))
    # END SOLUTION


@cuda.jit
def _gelu_packed_f16(x16, x32, bias, r16, r32, out16, out32):
    gelu_packed_flat(x16, x32, bias, r16, r32, out16, out32, f16_to_float, float_to_f16)


@cuda.jit
def _gelu_packed_bf16(x16, x32, bias, r16, r32, out16, out32):
    gelu_packed_flat(x16, x32, bias, r16, r32, out16, out32, bf16_to_float, float_to_bf16)


@each(GELU, "packed", """
    The same loop over 32-bit words: one load brings two elements of x, one two of the residual, one
    store writes two results, and eight words in flight per thread are the float32 kernel's bytes in
    flight again. Seen flat, a word may hold the last column of one row and the first of the next, so
    each half finds its own bias column (col, then col + 1 wrapped); the bias, one row shared by all, is
    read a half at a time from L1. An odd last element, in no word, is thread 0's. On an H200 at 16384 x
    16384 it was slower than widened: within the noise for fp16, 9% slower for bf16. The likely reason,
    not yet checked with a profile: at about half the bandwidth (47-54%) this kernel is bound by
    instructions more than by bytes (the erf alone is about 25 an element, bf16's rounding six more),
    and packing saves only load and store instructions while adding a second bias column (a wrap), the
    shifts and the pack to every word, and a column index per word held in flight.""")
def gelu_packed(x, bias, residual, out):
    kernel = _gelu_packed_bf16 if is_bf16(x) else _gelu_packed_f16
    kernel[gelu_grid(x.shape[0] * x.shape[1] // 2), THREADS](
        flat_bits16(x), words(x), bits16(bias), flat_bits16(residual), words(residual), flat_bits16(out), words(out))


OPERATORS = [*SOFTMAX, *LAYERNORM, *RMSNORM, *GELU]
