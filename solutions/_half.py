"""What the 16-bit ladders share: the fp16/bf16 variants of softmax.py, layernorm.py (LayerNorm and RMSNorm)
and elementwise.py (GELU(x + bias) + residual), and quantize.py (int8).

Their story, told once here and appended to each of those modules' docstrings (``SIXTEEN_BIT_STORY``);
the two formats and their conversions to float32 and back; where a row's 32-bit words are when a row
holds an odd number of halves; the pieces of the kernels that hold a row in registers; ``per_format``,
which compiles a kernel written once with the conversions left free once per format; what the
operators share (formats, sizes, validation, tolerance). From before: a block of THREADS threads per row,
ILP loads in flight per thread, the block-wide maximum and sum by warp shuffles, libdevice's conversions
(with NumPy stand-ins where the CUDA simulator has none), and a torch peer. It lives here, not in one
of those ladders, because a ladder module that imports another gets no exercise: the grader refuses the
answer key's modules while it grades.
"""

import numpy as np
from numba import cuda, float32, uint32, uint64
from numba.cuda import libdevice

from solutions._templates import instantiate
from solutions._vector_io import (  # the two formats: a 16-bit pattern becomes a float32 and back
    aligned16, bf16_to_float, f16_to_float, float_to_bf16, float_to_f16, load4, load8, store4, store8)
from workbench import library_peers as peers
from workbench.device import is_simulator
from workbench.ladder import InputError, Operator, expect_device_array

try:  # bf16 arrays on the host and on the device are NumPy arrays of ml_dtypes.bfloat16
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency; without it only fp16 is offered
    BFLOAT16 = None
FLOAT16 = np.dtype(np.float16)

THREADS = 256  # threads per row: a multiple of the 32-lane warp
WARPS = THREADS // 32
TWO_WARPS = 2 * WARPS  # a shared array's shape must be a constant: a module global
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
ILP = 8  # loads in flight per thread and pass: eight halves (widened) or eight words (packed)

LOW_PRECISION_GROUP = "Low precision: fp16 and bf16 memory-bound ladders, int8 quantization"

LAST = (ILP - 1) * THREADS  # offset of a step's last column (or word) from its first
ROW_THREADS = 128  # the rows_in_flight stages: four warps per row, twice the rows resident per multiprocessor
LOW = uint32(0xFFFF)
SIXTEEN = uint32(16)

# The 16-bit part of the lesson, the same for every family that has fp16 and bf16 variants: softmax.py,
# layernorm.py and elementwise.py each append it to their docstring (what their notebooks open with).
SIXTEEN_BIT_STORY = """

**In fp16 and bf16: half the bytes, float32 inside.** Networks keep activations in 16-bit floats: fp16
(1 sign, 5 exponent, 10 mantissa bits: about three decimal digits, largest value 65504, subnormals below
6.1e-5) or bf16 (1 sign, 8 exponent, 7 mantissa bits: float32's range with two decimal digits; it is the
top half of a float32). The fp16 and bf16 variants of this family read and write 16-bit values and
compute in float32 in between, as torch does: each element is widened to float32 when it is loaded, the
statistics (maximum, sums, mean, variance) are float32, and each result is rounded to 16 bits once, when
it is stored.

Why float32 inside (where accuracy goes): a 16-bit sum stops growing. fp16 has 11 significant bits,
so past 2048 its spacing is 2 and adding 1 does nothing: summing 4096 ones in fp16 gives 2048, and the
softmax of a constant row of 4096 comes out 1/2048, twice too large (the same sum in bf16 stops at
256). Squares overflow: LayerNorm's variance of values near 300 needs 300^2 = 90000, past fp16's
65504, so an fp16 sum of squares is inf. float32 statistics cost no memory traffic (a float32 add is
as fast as an fp16 one; what float32 costs is a conversion each way) and are exact to about 1e-7,
far below the 16-bit rounding of the output (4.9e-4 relative for fp16, 3.9e-3 for bf16), which is
where the error of a correct kernel comes from.
``tests/test_low_precision.py`` checks these numbers.

numba-cuda 0.30 has no half2 type and its cuda.fp16/cuda.bf16 functions are linked C++ (opaque calls
in the PTX until link time), so the conversions (``solutions/_vector_io.py``) are libdevice's and plain bit
operations, which compile to a few PTX instructions: fp16 -> float32 is ``cvt.f32.f16``, float32 ->
fp16 ``cvt.rn.f16.f32`` (round to nearest even, subnormals kept, overflow to inf); bf16 -> float32 is a
16-bit shift (a bf16 is a float32 with its low 16 mantissa bits dropped), float32 -> bf16 rounds to
nearest even with integer adds (five integer instructions and a select that keeps NaN a NaN: sm_90's
``cvt.rn.bf16.f32`` is not reachable from numba).

The 16-bit ladders start where the float32 ladders ended (eight loads in flight per thread; for the
row operators a block of 256 threads per row, three reads of the row with the second and third from L1)
and ask what changes:

1. ``widened``: the float32 kernel reading and writing halves. Half the bytes, so at the same speed
   per element it would take half the time; what it costs is one conversion per element each way, and
   what it lacks is bytes in flight: eight 2-byte loads a thread are half what the float32 kernel had.
2. ``packed``: loads and stores of 32-bit words, two halves each, eight words in flight per thread:
   the float32 kernel's bytes in flight with half the load instructions per element. A row of an odd
   number of columns starts in the middle of a word, so each row has a 16-bit head and tail.
"""


# -- libdevice, and its stand-in in the simulator ------------------------------------------------------

if is_simulator() and libdevice.int_as_float(0) is None:
    class SimulatorLibdevice:
        """This numba's CUDA simulator leaves libdevice unimplemented (each function returns None). These
        are the functions the low-precision kernels call, done by NumPy on the same bits."""

        @staticmethod
        def half2float(bits):
            return np.float32(np.int16(bits).view(np.float16))

        @staticmethod
        def float2half_rn(value):
            with np.errstate(over="ignore"):  # past 65504 rounds to inf, as cvt.rn.f16.f32 does
                return np.float16(np.float32(value)).view(np.int16)

        @staticmethod
        def int_as_float(bits):
            return np.int32(bits).view(np.float32)

        @staticmethod
        def float_as_int(value):
            return np.float32(value).view(np.int32)

        @staticmethod
        def fast_expf(value):
            with np.errstate(over="ignore", under="ignore"):
                return np.float32(np.exp(np.float64(value)))

        @staticmethod
        def float2int_rn(value):
            return np.int32(np.rint(np.float64(value)))

        @staticmethod
        def rsqrtf(value):
            return np.float32(1.0 / np.sqrt(np.float64(value)))

        @staticmethod
        def fast_fdividef(a, b):
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                return np.float32(np.float32(a) / np.float32(b))

    libdevice = SimulatorLibdevice  # noqa: F811 - the kernels call libdevice.* either way


# -- block-wide reductions (as in the float32 ladders) --------------------------------------------------

@cuda.jit(device=True, inline=True)
def warp_max(value):
    offset = 16
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def warp_sum(value):
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def block_max_over(value, reduced, warps):
    """Maximum over a block of ``warps`` warps, in every thread; reduced: TWO_WARPS floats of shared memory."""
    lane = cuda.threadIdx.x % 32
    value = warp_max(value)
    if lane == 0:
        reduced[cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    return warp_max(reduced[lane] if lane < warps else NEG_INF)


@cuda.jit(device=True, inline=True)
def block_sum_over(value, reduced, slot, warps):
    """Sum over a block of ``warps`` warps, in every thread. Use a different slot (0, 1) per sum of a row,
    so that no barrier is needed between reading one result and writing the next partials."""
    lane = cuda.threadIdx.x % 32
    value = warp_sum(value)
    if lane == 0:
        reduced[slot * warps + cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    return warp_sum(reduced[slot * warps + lane] if lane < warps else float32(0.0))


@cuda.jit(device=True, inline=True)
def block_max(value, reduced):
    """Maximum over a block of THREADS threads, in every thread."""
    return block_max_over(value, reduced, WARPS)


@cuda.jit(device=True, inline=True)
def block_sum(value, reduced, slot):
    """Sum over a block of THREADS threads, in every thread (slot: 0 or 1, see block_sum_over)."""
    return block_sum_over(value, reduced, slot, WARPS)


@cuda.jit(device=True, inline=True)
def rsqrt(value):
    """1 / sqrt(value) in one instruction, rsqrt.approx.f32 (relative error below 2^-22): IEEE's sqrt and
    division each bring a slow path, a called subroutine whose registers count against every thread."""
    return libdevice.rsqrtf(value)


@cuda.jit(device=True, inline=True)
def reciprocal(value):
    """1 / value as div.approx.f32 (libdevice's fast_fdividef: a reciprocal and a multiply, 2 ulp) where
    IEEE division would bring a called slow path; exact enough for value in [2^-126, 2^126]."""
    return libdevice.fast_fdividef(float32(1.0), value)


def torch_peer(name, call, returns=False):
    """peer(size) for ``call(torch, *device arrays)``, or None where torch is not installed. With
    ``returns``, the call allocates and returns its result (torch's norms have no out=): the bench
    checks and times what it returns."""
    def peer(size):
        torch = peers.torch()
        if torch is None:
            return None

        def run(*arrays):
            return call(torch, *arrays)
        run.returns_output = returns
        return name, run
    return peer




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


# -- rows held in registers (RMSNorm's in_registers; softmax's and LayerNorm's kernels of the same idea) ---

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

# rsqrt and reciprocal as one instruction each, with subnormals flushed (.ftz): rsqrt.approx.f32 and div.approx.f32
# without it scale a subnormal input first, three instructions more (a compare and two predicated multiplies) in a
# chain that waits on each. Where the input is never subnormal (a variance plus EPS; a softmax's sum, at least 1,
# or 0) the results are the same bits. numba asks libdevice for neither, so they are inline PTX; the simulator runs
# rsqrt and reciprocal.
if is_simulator():
    rsqrt_ftz = rsqrt
    reciprocal_ftz = reciprocal
else:
    def _float_op(instruction):
        @intrinsic
        def float_op(typingctx, value):
            def codegen(context, builder, signature, args):
                x = context.cast(builder, args[0], signature.args[0], types.float32)
                asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.FloatType()]), f"{instruction} $0, $1;", "=f,f")
                return builder.call(asm, [x])

            return types.float32(value), codegen
        return float_op

    rsqrt_ftz = _float_op("rsqrt.approx.ftz.f32")
    reciprocal_ftz = _float_op("rcp.approx.ftz.f32")

# -- vector_rows: rows held as 16-byte vectors, two-dimensional blocks (the 16-bit norms' and softmax's) -----
# How many vectors a thread holds (VECTORS) and how many threads rows share a block (BLOCK_ROWS_THREADS) are
# each ladder's own constants, passed in here: `workbench sweep` varies the constants of the stage's module.

def vector_rows_shape(rows, cols, vectors, block_threads, vector=VECTOR):
    """(blocks, (threads a row, rows a block)): the fewest threads a row, a power of two from 32, whose
    ``vectors`` vectors of ``vector`` elements (8 halves; float32's 4) each cover it; rows share a block up
    to ``block_threads`` threads."""
    threads = 32
    while threads * vectors * vector < cols:
        threads *= 2
    per_block = max(1, min(block_threads // threads, rows))
    return -(-rows // per_block), (threads, per_block)


def fills_launch(rows, cols, block, vector_elements):
    """Do the rows fill a vector_rows launch of ``block`` (threads a row, rows a block) exactly, each thread's
    ``vector_elements`` elements inside its row and no row past the last (whole_row's launches)?"""
    threads, per_block = block
    return cols == threads * vector_elements and rows % per_block == 0


def fits_vector_rows(cols, vectors, *arrays, vector=VECTOR):
    """Every row starts on 16 bytes (a width that is a multiple of the ``vector`` elements of 16 bytes,
    arrays that start on 16 bytes) and 1024 threads of ``vectors`` vectors hold it."""
    return cols % vector == 0 and cols <= 1024 * vectors * vector and aligned16(*arrays)


@cuda.jit(device=True, inline=True)
def vector_row(rows, cols):
    """Where this thread's row starts (flat element) and its width: blockDim.x threads a row, blockDim.y rows a
    block. A row past the last gets width 0: its threads load and store nothing but meet the barriers."""
    row = uint32(cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y)
    return uint64(row) * uint64(cols), uint32(cols) if row < uint32(rows) else uint32(0)


# whole_row's width: every column a thread of a whole-rows launch computes (a multiple of 4 below 2^32) is below it.
PAST_EVERY_COLUMN = uint32(0xFFFFFFFF)


@cuda.jit(device=True, inline=True)
def whole_row(rows, cols):
    """vector_row for a launch whose rows fill it exactly: every thread's vectors inside its row (cols = threads x
    vectors x VECTOR) and no row past the last (rows a multiple of blockDim.y). Its width is a constant every column
    is below, so the compiler drops the bounds checks: the loads and stores are not predicated, and nothing waits
    on rows or cols but the row's address."""
    row = uint32(cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y)
    return uint64(row) * uint64(cols), PAST_EVERY_COLUMN


@cuda.jit(device=True, inline=True)
def add(a, b):
    return a + b


@cuda.jit(device=True, inline=True)
def larger(a, b):
    return max(a, b)


@cuda.jit(device=True, inline=True)
def row_reduce(value, partials, slot, combine):
    """combine (add, larger) over the threads of this thread's row, in each of them: shuffles in each warp,
    then (a row of several warps) each warp's result through shared memory and log2(warps) shuffles more.
    Slot 0 or 1: a row's second reduction writes where its first was not read, so one barrier each.
    (Unsigned 32-bit arithmetic throughout: numba's // and % on signed values are 64-bit with a floor
    correction.)"""
    offset = 16
    while offset > 0:
        value = combine(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    warps = uint32(cuda.blockDim.x) >> uint32(5)
    if warps == uint32(1):
        return value
    t = uint32(cuda.threadIdx.x)
    lane = t & uint32(31)
    first = uint32(slot * 32) + uint32(cuda.threadIdx.y) * warps
    if lane == uint32(0):
        partials[first + (t >> uint32(5))] = value
    cuda.syncthreads()
    value = partials[first + (lane & (warps - uint32(1)))]
    offset = uint32(warps >> uint32(1))
    while offset > uint32(0):
        value = combine(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset = uint32(offset >> uint32(1))
    return value


@cuda.jit(device=True, inline=True)
def row_reduce_direct(value, partials, slot, combine, most_warps):
    """row_reduce with its second step read from shared memory: after the barrier every thread reads each of
    its row's warps' results (broadcast reads, up to ``most_warps`` of them, a constant: the loop unrolls) and
    combines them itself, where row_reduce reads one and shuffles log2(warps) times, each shuffle waiting on
    the one before. The loads are issued together; the combines are a few cycles each."""
    offset = 16
    while offset > 0:
        value = combine(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    warps = uint32(cuda.blockDim.x) >> uint32(5)
    if warps == uint32(1):
        return value
    t = uint32(cuda.threadIdx.x)
    first = uint32(slot * 32) + uint32(cuda.threadIdx.y) * warps
    if t & uint32(31) == uint32(0):
        partials[first + (t >> uint32(5))] = value
    cuda.syncthreads()
    value = partials[first]
    for j in range(1, most_warps):
        if uint32(j) < warps:
            value = combine(value, partials[first + uint32(j)])
    return value


@cuda.jit(device=True, inline=True)
def row_sum(value, partials, slot):
    """The sum over this thread's row (row_reduce); partials: GROUP_SLOTS floats of shared memory."""
    return row_reduce(value, partials, slot, add)


@cuda.jit(device=True, inline=True)
def row_max(value, partials, slot):
    """The maximum over this thread's row (row_reduce)."""
    return row_reduce(value, partials, slot, larger)


@cuda.jit(device=True, inline=True)
def column(first, step, k):
    """The first column of a thread's vector k, first + k * step, in 32 bits (numba widens a sum of two
    32-bit integers to 64 bits, and an int64 range variable with a uint32 to float64)."""
    return uint32(first + uint32(k) * step)


# What the vector_rows templates (softmax's and the norms') ask of a format: load_vector, element, value_at and
# store_vector, and the constants VECTOR (elements in 16 bytes), VECTORS, HELD_WORDS, HELD_VALUES and WORD. The
# 16-bit formats' are these; float32's, a vector of four floats, follow (float_format).

@cuda.jit(device=True, inline=True)
def load_vector(words, k, a, i):
    """Halves i .. i + 7 of a, one 16-byte load8, as words 4k .. 4k + 3 of a held array."""
    words[4 * k], words[4 * k + 1], words[4 * k + 2], words[4 * k + 3] = load8(a, i)


@cuda.jit(device=True, inline=True)
def element(words, i, widen):
    """Half i of a held array (of words, two halves each) as a float32; i is a constant once unrolled."""
    return widen(words[i // 2] >> SIXTEEN) if i % 2 else widen(words[i // 2])


@cuda.jit(device=True, inline=True)
def value_at(a, i, widen):
    """Element i of a 16-bit array in memory, as a float32."""
    return widen(uint32(a[i]))


@cuda.jit(device=True, inline=True)
def store_vector(a, i, values, k, narrow2):
    """values[8k .. 8k + 7] rounded to halves, a pair an instruction, and stored at a[i] in one 16-byte store8."""
    v = VECTOR * k
    store8(a, i, narrow2(values[v], values[v + 1]), narrow2(values[v + 2], values[v + 3]),
           narrow2(values[v + 4], values[v + 5]), narrow2(values[v + 6], values[v + 7]))


@cuda.jit(device=True, inline=True)
def load_floats(held, k, a, i):
    """Elements i .. i + 3 of a float32 array, one 16-byte load4, as floats 4k .. 4k + 3 of a held array."""
    held[4 * k], held[4 * k + 1], held[4 * k + 2], held[4 * k + 3] = load4(a, i)


@cuda.jit(device=True, inline=True)
def float_element(held, i, widen):
    """Float i of a held array: it is one already (widen, the 16-bit formats' conversion, is not called)."""
    return held[i]


@cuda.jit(device=True, inline=True)
def float_value_at(a, i, widen):
    return a[i]


@cuda.jit(device=True, inline=True)
def store_floats(a, i, values, k, narrow2):
    """values[4k .. 4k + 3] stored at a[i] in one 16-byte store4 (narrow2 is not called)."""
    store4(a, i, values[4 * k], values[4 * k + 1], values[4 * k + 2], values[4 * k + 3])


def float_format(vectors, **constants):
    """The names a vector_rows template leaves to a format, bound for float32: a vector of four floats (16
    bytes), ``vectors`` of them a thread, held as floats. ``constants``: the ladder's own for its float32
    kernel (the norms' WEIGHTS_AHEAD). A template instantiated with ``dict(globals(), **float_format(...))``
    (solutions._templates.instantiate) is the float32 kernel; widen and narrow2 are passed as None."""
    return dict(VECTOR=4, VECTORS=vectors, HELD_WORDS=4 * vectors, HELD_VALUES=4 * vectors, WORD=float32,
                load_vector=load_floats, element=float_element, value_at=float_value_at, store_vector=store_floats,
                **constants)


# -- one kernel per format: a template instantiated with the format's conversions -------------------------

# The names a kernel template leaves free, bound per format: widen (16 bits -> float32), narrow (float32 ->
# 16 bits), narrow2 (two float32 -> one word of two halves, one instruction on sm_80+).
CONVERSIONS = {
    FLOAT16: dict(widen=f16_to_float, narrow=float_to_f16, narrow2=cvt_pair_f16),
    BFLOAT16: dict(widen=bf16_to_float, narrow=float_to_bf16, narrow2=cvt_pair_bf16),
}
KERNEL_SUFFIX = {FLOAT16: "f16", BFLOAT16: "bf16"}  # _softmax_packed_f16, _softmax_packed_bf16


def per_format(template, **jit):
    """Compile ``template`` (a kernel whose ``widen``, ``narrow`` and ``narrow2`` are free names) once per
    format with those names bound to the format's conversions (``solutions._templates.instantiate``,
    ``cuda.jit(**jit)``), each kernel named ``<template>_f16`` or ``<template>_bf16``: what the PTX
    check, profiles and sanitizer reports call it. Returns the template with ``kernels``, {dtype:
    kernel}, from which a launcher picks ``template.kernels[x.dtype]``. Used as a decorator. The
    template stays a plain function of its module (the grader and the notebooks read it there); each
    kernel sees the module's globals as they are when the template is defined."""
    template.kernels = {
        dtype: instantiate(template, dict(template.__globals__, **CONVERSIONS[dtype]),
                           f"{template.__name__}_{KERNEL_SUFFIX[dtype]}", jit=jit)
        for dtype in FORMATS}
    return template


# -- what the operators share: formats, sizes, validation, tolerance --------------------------------

FORMATS = [FLOAT16] + ([BFLOAT16] if BFLOAT16 is not None else [])
# ‖out − ref‖ / ‖ref‖ of a correct kernel is the rounding of its output to 16 bits: at most 2^-11
# (fp16) or 2^-8 (bf16) per element, about half that on average. float32 statistics add ~1e-7.
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}

ROW_SIZES = dict(
    check_sizes=[(300, 1), (300, 33), (301, 1001), (300, 4097), (200, 32768), (32768, 4096)],
    sim_sizes=[(1, 1), (2, 5), (2, 40), (2, 37), (1, 4103)],  # the middle (quick tier, PTX check): rows of whole
    # 16-byte vectors, which the vector_rows kernels need; 37: odd rows; the last: full unrolled steps
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
