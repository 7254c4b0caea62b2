# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/quantize.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade quantize            (or quantize.<stage>; its other operators: dequantize)
# The grader checks each stage against the operator in solutions/quantize.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 68a30762c99c1dddf63ac166141f3b209c255926fa3583b3e0a284c5e522c24b
# --------------------------------------------------------------------------------------------------
"""int8 quantization of a float32 matrix, per row and symmetric, and back: two memory-bound ladders.

quantize: each row gets a scale, scale = max|x[r, :]| / 127 (1 for an all-zero row, whose values are
all 0 anyway: the division stays a plain division), and each element becomes
q = round-half-to-even(x / scale), saturated to [-127, 127] (-128 is never produced, so -q is always
an int8). dequantize: x' = q * scale. The error of the round trip is at most half a step, scale / 2.

The quantized matrix is one self-describing buffer, FBGEMM's "fused row-wise" layout: each row's
``cols`` int8 values followed by the 4 bytes of its float32 scale, so ``out`` is int8 of shape
(rows, cols + 4) and a checker (or a grader) sees the values and their scale together.

Exact arithmetic: float32 division is correctly rounded (IEEE), so x / scale rounds to the nearest
float32 of the true quotient; the reference divides in float64 (exact for these rounding decisions)
and rounds half to even. The two can disagree only where the true quotient lies within half a float32
ulp of a half-integer k + 1/2, and float32 division lands exactly on it: then round-half-even of the
float32 quotient is the right answer for a float32 kernel, and the reference takes it (it counts
those elements: about one in a few million random ones). Every other element must match bit for bit.
Rounding half away from zero (C's roundf, floor(v + 0.5)) is wrong on every exact tie: 2.5 must
become 2, -0.5 must become -0 (0), 126.5 must become 126. Multiplying by 127 / max instead of
dividing by the scale rounds differently often enough to fail.

Both ladders move about 5 bytes an element (4 of float32 one way, 1 of int8 the other), so they are
bound by memory: a thread per row (too few threads, uncoalesced), a block per row with the row's
maximum by warp shuffles (the second read of the row from L1), then four elements per 32-bit word of
int8 with eight words in flight per thread, then (where rows start on 16 bytes) 16-byte vectors, and for
quantize a division and a rounding rewritten as a multiply, two fmas and an add.
"""

import numpy as np
from numba import cuda, float32, int8, int32, uint8, uint32, uint64

from solutions._half import (ILP, LOW_PRECISION_GROUP, THREADS, TWO_WARPS, block_max, block_max_over, libdevice,
                            torch_peer)
from solutions._vector_io import aligned16, as_bits32, as_float32, flat_view, load4, rows_fit_vectors, store4
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch
from workbench.targets import of_ceiling

QMAX = 127
SCALE_BYTES = 4  # the float32 scale after each row's values
BLOCK_2D = (16, 16)
FOUR = uint64(4)
EIGHT = uint32(8)


# -- the layout and the reference -----------------------------------------------------------------------

def scales_of(packed: np.ndarray) -> np.ndarray:
    """The float32 scale of each row of a fused int8 buffer (rows, cols + 4), on the host."""
    return np.ascontiguousarray(packed[:, -SCALE_BYTES:]).view(np.float32).reshape(-1)


def quantize_reference(x) -> tuple[np.ndarray, np.ndarray, int]:
    """(q int8, scale float32, near-ties) of each row of x: scale = fl32(max|x| / 127) (1 for a zero row),
    q = round-half-even(x / scale) decided on the exact quotient (float64: for 24-bit x and scale the
    quotient's distance to a half-integer is never below 2^-40, far above float64's error), except
    where float32 division rounds the quotient onto a half-integer: there a correct float32 kernel
    rounds that tie to even, and so does the reference. ``near-ties`` counts those elements."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=1)
    scale = np.where(amax > 0, (amax.astype(np.float64) / QMAX).astype(np.float32), np.float32(1.0))
    exact = np.rint(x.astype(np.float64) / scale[:, None].astype(np.float64))
    with np.errstate(over="ignore", under="ignore"):
        in_float32 = np.rint(x / scale[:, None])
    near_ties = exact != in_float32
    q = np.where(near_ties, in_float32, exact)
    return np.clip(q, -QMAX, QMAX).astype(np.int8), scale.astype(np.float32), int(near_ties.sum())


def fuse(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The fused row-wise buffer: q's rows, each followed by the 4 bytes of its scale."""
    return np.concatenate([q, scale.astype(np.float32).reshape(-1, 1).view(np.int8)], axis=1)


def _quantize_reference(x):
    q, scale, _ = quantize_reference(x)
    return fuse(q, scale)


def _quantize_inputs(size, rng):
    rows, cols = size
    x = rng.standard_normal(size).astype(np.float32) * rng.uniform(0.01, 100.0, (rows, 1)).astype(np.float32)
    x[2::7] = 0.0  # all-zero rows: scale 1, every q 0
    return (x,)


def _quantize_adversarial(size, rng):
    rows, cols = size
    k = rng.integers(-126, 126, size)
    ties = (k + 0.5).astype(np.float32)  # max 127 below: scale 1 exactly, so x / scale = k + 0.5, a tie
    ties[:, 0] = np.where(rng.random(rows) < 0.5, 127.0, -127.0)
    ties_scale_two = ties * np.float32(2.0)  # scale 2: the same ties after a division
    saturated = np.where(rng.random(size) < 0.5, 1.0, -1.0).astype(np.float32) * np.float32(3.75)
    saturated[:, -1] = np.float32(3.75 * 126.5 / 127)  # rounds to 126.5 of 127 steps: a tie, to 126
    # near-ties at any scale: (k + 1/2) scale rounded to float32, and its neighbours one ulp either side; the
    # quotient lands on, just below or just above a half-integer (where a division without its correction errs)
    amax = (2.0 ** rng.integers(-60, 60, (rows, 1)) * rng.uniform(1, 2, (rows, 1))).astype(np.float32)
    scale = (amax.astype(np.float64) / QMAX).astype(np.float32)
    tie = ((rng.integers(-126, 126, size) + 0.5) * scale.astype(np.float64)).astype(np.float32)
    near = np.nextafter(tie, np.where(rng.random(size) < 0.5, np.inf, -np.inf).astype(np.float32))
    near_ties = np.where(rng.random(size) < 0.3, tie, near).astype(np.float32)
    near_ties[:, 0] = amax[:, 0]
    zero = np.zeros(size, np.float32)
    zero[:, cols // 2] = np.where(np.arange(rows) % 2 == 0, 0.0, -5.0)  # zero rows and one-element rows
    subnormal = (rng.standard_normal(size) * 1e-40).astype(np.float32)  # scale subnormal too: no flush to 0
    huge = (rng.uniform(-1, 1, size) * 3e38).astype(np.float32)
    return [(label, (a,)) for label, a in
            [("ties (scale 1)", ties), ("ties (scale 2)", ties_scale_two), ("near-ties", near_ties),
             ("+-max and 126.5", saturated),
             ("zero rows", zero), ("subnormal rows", subnormal), ("huge rows", huge)]]


def _explain_quantize(inputs, out, ref):
    """Name the first wrong element: a scale, a tie rounded the wrong way, or just a wrong value."""
    (x,) = inputs
    cols = x.shape[1]
    wrong = np.argwhere(out != ref)
    if not wrong.size:
        return None
    r, j = map(int, wrong[0])
    if j >= cols:
        return (f"row {r}'s scale (its last {SCALE_BYTES} bytes) is wrong: it must be max|x| / 127 = "
                f"{scales_of(ref)[r]!r} (1.0 for an all-zero row)")
    quotient = float(x[r, j]) / float(scales_of(ref)[r])
    if abs(abs(quotient - np.trunc(quotient)) - 0.5) < 1e-9:
        return (f"x[{r}, {j}] / scale = {quotient} is a tie: round half to even gives {int(ref[r, j])}, "
                f"not {int(out[r, j])} (roundf and floor(v + 0.5) round ties away from zero)")
    return None


def _validate_quantize(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    rows, cols = x.shape
    expect_device_array("out", out, dtype=np.int8, ndim=2)
    if tuple(out.shape) != (rows, cols + SCALE_BYTES):
        raise InputError(f"out must have shape {(rows, cols + SCALE_BYTES)}: each row's {cols} int8 values, then "
                         f"the {SCALE_BYTES} bytes of its float32 scale; got {tuple(out.shape)}")


def _torch_quantize(torch, x, out):
    t = peers.as_torch(x)
    amax = t.abs().amax(dim=1, keepdim=True)
    # Divide by a tensor of 127s, not by the number 127: torch's CUDA division by a Python scalar
    # multiplies by its reciprocal, amax * fl32(1/127), which differs from the correctly rounded
    # amax / 127 in the last bit for about one row in twenty (and then the row's q differ too).
    # Tensor by tensor is div.rn.f32, what the operator defines.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, QMAX), torch.ones_like(amax))
    o = peers.as_torch(out)
    o[:, : t.shape[1]] = torch.round(t / scale).clamp(-QMAX, QMAX).to(torch.int8)
    o[:, t.shape[1]:] = scale.view(torch.int8)


ROW_SIZES = dict(
    check_sizes=[(1, 1), (3, 37), (300, 1001), (301, 1000), (300, 4097), (200, 32768), (32768, 4096)],
    # (3, 132), the quick tier's: rows on 16 bytes (vector_rows' path); the last: full unrolled steps, and two
    # of vector_rows' (8300 = 4 x 2075)
    sim_sizes=[(1, 1), (2, 5), (3, 37), (3, 132), (3, 130), (1, 8300)],
    bench_sizes=[(4096, 1024), (4096, 4096), (32768, 1024), (32768, 4096)],
    headline_size=(32768, 4096),
)

op = Operator(
    name="quantize",
    targets=[of_ceiling(85, "copy_gbps")],
    title="int8 quantization per row (symmetric, round half to even), float32 in",
    reference=_quantize_reference,
    make_inputs=_quantize_inputs,
    make_output=lambda size: np.empty((size[0], size[1] + SCALE_BYTES), np.int8),
    bytes_moved=lambda size: 4 * size[0] * size[1] + size[0] * (size[1] + SCALE_BYTES),
    flops=lambda size: 3 * size[0] * size[1],  # |x| and max, a division
    validate=_validate_quantize,
    peer=torch_peer("torch (amax, round, clamp, to int8)", _torch_quantize),
    explain=_explain_quantize,
    adversarial_inputs=_quantize_adversarial,
    rank=240,
    group=LOW_PRECISION_GROUP,
    **ROW_SIZES,
)


# -- what every quantize kernel does to one element and one scale ---------------------------------------

@cuda.jit(device=True, inline=True)
def quantize_value(v, scale):
    """round-half-even(v / scale) saturated to [-127, 127]: div.rn.f32, then cvt.rni.s32.f32 (the
    conversion rounds to nearest even itself), then a min and a max."""
    q = libdevice.float2int_rn(v / scale)
    return int8(min(max(q, int32(-QMAX)), int32(QMAX)))


@cuda.jit(device=True, inline=True)
def quantized_word(v0, v1, v2, v3, scale):
    """Four values quantized into one 32-bit word, the first in the low byte (first in memory)."""
    return (uint32(uint8(quantize_value(v0, scale))) | (uint32(uint8(quantize_value(v1, scale))) << EIGHT)
            | (uint32(uint8(quantize_value(v2, scale))) << uint32(16))
            | (uint32(uint8(quantize_value(v3, scale))) << uint32(24)))


# Dividing without a division: for a row's scale, 1 / scale once (correctly rounded), then each quotient
# v * (1 / scale), its residual v - q scale (exact in one fma), and one fma that corrects q by it: the
# correctly rounded v / scale again (Markstein's correction; the compiler's own div.rn does the same after
# computing 1 / scale for every element, plus a range check). Exact when the residual is a normal float,
# which FAST_SCALES guarantees for every quotient that can round to a nonzero integer; tests/test_low_precision
# holds it to IEEE division on near-ties. Then rounding half to even without a conversion: adding 1.5 x 2^23
# leaves round(t) in the low mantissa bits, so the int8 is the low byte of the sum's bits.
FAST_SCALES = (float32(2.0 ** -100), float32(2.0 ** 100))
ROUND_BIAS = float32(1.5 * 2 ** 23)


@cuda.jit(device=True, inline=True)
def divide(v, scale, inverse):
    """v / scale correctly rounded, given inverse = 1 / scale correctly rounded (scale in FAST_SCALES)."""
    q = v * inverse
    return libdevice.fmaf(libdevice.fmaf(-q, scale, v), inverse, q)


@cuda.jit(device=True, inline=True)
def rounded_bits(q):
    """round-half-even(q) saturated to [-127, 127], in the low byte of the result (clamping first is the
    same: the bounds are integers)."""
    return libdevice.float_as_int(min(max(q, float32(-QMAX)), float32(QMAX)) + ROUND_BIAS)


@cuda.jit(device=True, inline=True)
def quantized_word_fast(v0, v1, v2, v3, scale, inverse):
    """quantized_word without division or conversion: three byte permutes (PRMT) gather the four low bytes
    (selector 0x40: byte 0 of each of two words; 0x5410: the low two bytes of each)."""
    b0 = rounded_bits(divide(v0, scale, inverse))
    b1 = rounded_bits(divide(v1, scale, inverse))
    b2 = rounded_bits(divide(v2, scale, inverse))
    b3 = rounded_bits(divide(v3, scale, inverse))
    return uint32(libdevice.byte_perm(libdevice.byte_perm(b0, b1, 0x40), libdevice.byte_perm(b2, b3, 0x40), 0x5410))


@cuda.jit(device=True, inline=True)
def scale_of(amax):
    return amax / float32(QMAX) if amax > float32(0.0) else float32(1.0)


@cuda.jit(device=True, inline=True)
def scale_byte(scale, k):
    """Byte k (0 = least significant, first in memory) of the float32 scale's bits."""
    return uint8((uint32(libdevice.float_as_int(scale)) >> (uint32(k) * EIGHT)) & uint32(0xFF))


# -- 1. naive: a thread per row for the scales, a thread per element for the values -----------------------

@cuda.jit
def _row_scales(x, out, scales):
    row = cuda.grid(1)
    if row < x.shape[0]:
        cols = x.shape[1]
        # EXERCISE: write this part of `_row_scales`. Read the hints one at a time.
        #   hint 1 (nudge): the row's largest |x|, then scale = scale_of(it): into scales[row] and, byte k by
        #   hint 2 (nearly the answer): scale_byte(scale, k), into out[row, cols + k] for k in 0..3.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _quantize_elements(x, scales, out):
    row, col = cuda.grid(2)
    if row < x.shape[0] and col < x.shape[1]:
        # EXERCISE: write this part of `_quantize_elements`. Read the hints one at a time.
        #   hint 1: one element: quantize_value(x, the row's scale).
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("naive", """
    Two kernels. The first gives each row a thread, which walks its row for the largest |x| and
    writes the scale (into the row's last 4 bytes, and into a scratch vector for the second kernel);
    the second gives each element a thread, cuda.grid(2) as NumPy indexes, which divides by its
    row's scale and rounds half to even (cvt.rni: the conversion itself rounds that way). The
    first kernel is the slow one: a warp's 32 threads read 32 rows, 32 transactions for 128 useful
    bytes, and there are only as many threads as rows. The second's warps span 16 rows each.""")
def naive(x, out):
    rows, cols = x.shape
    scales = scratch("quantize.naive.scales", (rows,), np.float32)
    _row_scales[blocks_for(rows, THREADS), THREADS](x, out, scales)
    grid = (blocks_for(rows, BLOCK_2D[0]), blocks_for(cols, BLOCK_2D[1]))
    _quantize_elements[grid, BLOCK_2D](x, scales, out)


# -- 2. a block per row: the maximum by warp shuffles, the second read from L1 ----------------------------

@cuda.jit
def _quantize_block_per_row(x, out):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    # EXERCISE: write this part of `_quantize_block_per_row`. Read the hints one at a time.
    #   hint 1 (nudge): threads stride across the row (unsigned indices) for their largest |x|; block_max gives the row's.
    #   hint 2 (nearly the answer): a second pass (from L1) writes quantize_value(x, scale); threads 0..3 write the scale's bytes.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("block_per_row", """
    One kernel, a block of 256 threads per row. The threads stride across the row together, so
    each warp's load is one 128-byte transaction; the row's maximum meets in registers (five
    shuffle steps per warp, one shared-memory exchange, one barrier). The row (16 KB at 4096
    columns) is read a second time to quantize it, from L1 rather than memory, and the scale never
    leaves the block: the two-kernel round trip of the scales, and its launch, are gone.""")
def block_per_row(x, out):
    _quantize_block_per_row[x.shape[0], THREADS](x, out)


# -- 3. vectorized: four int8 per 32-bit store, eight words in flight -------------------------------------

@cuda.jit(device=True, inline=True)
def out_words(row, cols):
    """Row ``row``'s values are the bytes [start, end) of the flat output (each row also holds its 4
    scale bytes); its whole 32-bit words are [first, stop). The first up-to-3 bytes before ``first``
    and the last up-to-3 after ``stop`` share a word with a neighbouring row or the row's scale."""
    start = row * (cols + FOUR)
    end = start + cols
    first = (start + uint64(3)) >> uint64(2)
    stop = max(end >> uint64(2), first)
    return start, end, first, stop


@cuda.jit
def _quantize_vectorized(x, out, out32):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(8, float32)  # two words' values, loaded before either word is stored
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    start, end, first, stop = out_words(row, cols)
    last = uint64((ILP - 1) * THREADS)
    # EXERCISE: write this part of `_quantize_vectorized`. Read the hints one at a time.
    #   hint 1 (nudge): the maximum as in block_per_row, eight loads a step. Then word w of out32 takes the four
    #   hint 2: values of columns 4w - start .. + 3, packed low byte first; the row's bytes outside whole
    #   hint 3 (nearly the answer): words (before 4 first, from 4 stop on) and the 4 scale bytes are stored one byte at a time.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def flat_words(a):
    """An int8 array's bytes as 32-bit words, no copy (bytes past the last whole word belong to none)."""
    a = a if hasattr(a, "is_c_contiguous") else cuda.as_cuda_array(a)
    flat = a.reshape(a.size)
    return flat[: flat.size - flat.size % 4].view(np.uint32)


@op.stage("vectorized", """
    The output is written four values at a time: four quantized bytes packed into a 32-bit word
    and stored with one st.global.u32, a quarter of the store instructions; both passes keep eight
    float32 loads in flight per thread (the second pass loads two words' values before it stores). A row of the output is cols + 4 bytes long, so rows
    start at any byte: each row's first and last few values (at most three each) share a word with
    the neighbouring row or with the scale, and are stored a byte at a time (a word store there
    would overwrite bytes that another block writes).""")
def vectorized(x, out):
    _quantize_vectorized[x.shape[0], THREADS](x, out, flat_words(out))


# -- 4. vector_rows: 16-byte loads, no division, 128 threads a row --------------------------------------------

HELD = 2  # 16-byte vectors a thread holds per step; a row of one step (1024 floats) is read from memory once
# (holding more costs registers, so resident threads: 4 a thread at 256 threads a row, a whole 4096 row, took
# 51 registers, half the threads resident, and ran slower)
ROW_THREADS = 128  # threads a row: fewer give each thread more values to share the row's fixed costs over


@cuda.jit
def _quantize_vector_rows(x, out32, cols):
    # x: the matrix as one flat vector; cols is a multiple of 4, so row r's values start at word r (cols + 4) / 4
    # of the output, its scale is the whole word after them, and vector c / 4 of the row is word c / 4 of it.
    reduced = cuda.shared.array(TWO_WARPS, float32)
    held = cuda.local.array((HELD, 4), float32)  # the step's vectors (constant indices after unrolling: registers)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(cols)
    base = row * cols
    step = uint64(4 * HELD * ROW_THREADS)
    # EXERCISE: write this part of `_quantize_vector_rows`. Read the hints one at a time.
    #   hint 1 (nudge): two passes in steps of HELD 16-byte vectors a thread; a row that fits one step is read from memory once.
    #   hint 2: first pass: load4 every vector of a step into held (zeros past the row's end: c0 + 4 (t + k ROW_THREADS) >= cols) before taking |x|'s maximum; block_max_over (ROW_THREADS // 32 warps) and scale_of give the scale.
    #   hint 3 (nearly the answer): second pass: reload held only if cols > one step; each vector is one word of out32 (quantized_word_fast with 1 / scale where scale is in FAST_SCALES, else quantized_word); thread 0 stores the scale's bits (as_bits32) as the word after the row.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("vector_rows", """
    vectorized issues a 4-byte load per value and, per value, a division (div.rn.f32: a reciprocal, several
    fmas and a range check) and a conversion (cvt.rni, a quarter-rate instruction); and its 256 threads a
    row give each thread 16 values of a 4096 row to share the row's fixed costs (the block's maximum, its
    barrier, the scale) with. Instructions, more than bytes, set its pace. Three changes. Where the width is
    a multiple of 4, every row starts on 16 bytes in x and on a word in out (row r's values start at byte r
    (cols + 4)): 16-byte loads, two a thread a step, each vector quantized into one 32-bit word, the scale
    the word after the row, no byte stores. The arithmetic shrinks: 1/scale once a row; each quotient v
    (1/scale) corrected by one fma with its exact residual, which is IEEE division bit for bit at these
    scales (the near-ties input checks it); rounding half to even by adding 1.5 x 2^23, whose low byte is
    the int8; three byte permutes pack a word. And 128 threads a row, 32 values each. 89% of copy at
    32768x4096, against vectorized's 77%; the profiler counts 104 million warp instructions against
    vectorized's 169 million (issue slots busy 63% of cycles, not 84%). With 256 or 64 threads a row, or a
    whole 4096 row held in registers (four vectors a thread: 51 registers, half the threads resident), it
    was slower. Other widths, and views off a 16-byte boundary, run vectorized.""")
def vector_rows(x, out):
    if not (rows_fit_vectors(x) and aligned16(out)):
        vectorized(x, out)
        return
    _quantize_vector_rows[x.shape[0], ROW_THREADS](flat_view(x), flat_words(out), x.shape[1])


# ======================================================================================================
# dequantize
# ======================================================================================================

def _dequantize_inputs(size, rng):
    (x,) = _quantize_inputs(size, rng)
    q, scale, _ = quantize_reference(x)
    return (fuse(q, scale),)


def _dequantize_reference(packed):
    cols = packed.shape[1] - SCALE_BYTES
    return packed[:, :cols].astype(np.float64) * scales_of(packed).astype(np.float64)[:, None]


def _dequantize_adversarial(size, rng):
    rows, cols = size
    extremes = rng.choice(np.array([-128, -127, 127], np.int8), size)  # -128 is a valid int8 input too
    big = np.full(rows, 2.6e36, np.float32)  # 128 * 2.6e36 = 3.3e38: just inside float32
    tiny = np.full(rows, 1e-42, np.float32)  # subnormal scales: a kernel that flushes them gives 0
    return [("+-127, -128, huge scales", (fuse(extremes, big),)),
            ("subnormal scales", (fuse(rng.integers(-127, 128, size).astype(np.int8), tiny),))]


def _validate_dequantize(packed, out):
    expect_device_array("packed", packed, dtype=np.int8, ndim=2)
    rows, width = packed.shape
    if width <= SCALE_BYTES:
        raise InputError(f"packed must have at least {SCALE_BYTES + 1} columns (values, then the {SCALE_BYTES} "
                         f"bytes of the row's scale); got {width}")
    expect_device_array("out", out, dtype=np.float32, shape=(rows, width - SCALE_BYTES))


def _torch_dequantize(torch, packed, out):
    p = peers.as_torch(packed)
    cols = p.shape[1] - SCALE_BYTES
    torch.mul(p[:, :cols], p[:, cols:].contiguous().view(torch.float32), out=peers.as_torch(out))


dequantize_op = Operator(
    name="dequantize",
    targets=[of_ceiling(85, "copy_gbps")],
    title="int8 dequantization per row: q * scale, float32 out",
    reference=_dequantize_reference,
    make_inputs=_dequantize_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: size[0] * (size[1] + SCALE_BYTES) + 4 * size[0] * size[1],
    flops=lambda size: size[0] * size[1],
    validate=_validate_dequantize,
    tolerance=lambda size, dtype: 1e-6,  # one float32 rounding of an exact product
    peer=torch_peer("torch (q * scale)", _torch_dequantize),
    adversarial_inputs=_dequantize_adversarial,
    rank=241,
    group=LOW_PRECISION_GROUP,
    **ROW_SIZES,
)


@cuda.jit(device=True, inline=True)
def row_scale(packed, row, cols):
    """The float32 stored in the row's 4 bytes after its values (read a byte at a time: a row of
    cols + 4 bytes starts at any byte, so those 4 bytes need not be a whole word)."""
    bits = uint32(0)
    for k in range(SCALE_BYTES):
        bits |= uint32(uint8(packed[row, cols + uint64(k)])) << (uint32(k) * EIGHT)
    return libdevice.int_as_float(int32(bits))


# -- 1. naive: a thread per element --------------------------------------------------------------------

@cuda.jit
def _dequantize_elements(packed, out):
    row, col = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        # EXERCISE: write this part of `_dequantize_elements`. Read the hints one at a time.
        #   hint 1: out = q * the row's scale (row_scale reads it from the row's last 4 bytes).
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@dequantize_op.stage("naive", """
    A thread per element, cuda.grid(2) as NumPy indexes: each reads its int8 value and its row's
    four scale bytes (reassembled into a float32 with shifts and one mov.b32), and writes one
    float32. The scale's bytes are re-read by every thread of the row (from L1), and a warp spans
    16 rows, so each load and store instruction touches 16 different lines.""")
def dequantize_naive(packed, out):
    rows, cols = out.shape
    grid = (blocks_for(rows, BLOCK_2D[0]), blocks_for(cols, BLOCK_2D[1]))
    _dequantize_elements[grid, BLOCK_2D](packed, out)


# -- 2. vectorized: a block per row, four values per 32-bit load ----------------------------------------

@cuda.jit(device=True, inline=True)
def byte_value(word, k):
    """Byte k of a word as a signed int8, as float32: shift it to the top, shift back arithmetically."""
    return float32(int32(word << (uint32(24) - uint32(k) * EIGHT)) >> int32(24))


@cuda.jit
def _dequantize_vectorized(packed, packed32, out):
    ws = cuda.local.array(ILP, uint32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(out.shape[1])
    start, end, first, stop = out_words(row, cols)
    scale = row_scale(packed, row, cols)
    last = uint64((ILP - 1) * THREADS)
    # EXERCISE: write this part of `_dequantize_vectorized`. Read the hints one at a time.
    #   hint 1 (nudge): a block per row; word w (first <= w < stop, eight a step) holds the values of columns
    #   hint 2: 4w - start .. + 3: byte_value(word, k) * scale. Load the eight words before the first store.
    #   hint 3 (nearly the answer): the row's values outside whole words (at most 3 at each end) are read a byte at a time.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@dequantize_op.stage("vectorized", """
    A block of 256 threads per row: the scale is assembled once per thread, and the values are read
    four at a time, one 32-bit load per four int8 (each byte sign-extended by two shifts), eight
    words in flight per thread before the first store. The float32 stores of a warp cover 512
    contiguous bytes. As in quantize, each row's first and last few values share a word with a
    neighbour and are read a byte at a time.""")
def dequantize_vectorized(packed, out):
    _dequantize_vectorized[out.shape[0], THREADS](packed, flat_words(packed), out)


# -- 3. vector_rows: all of a thread's words in flight, 16-byte stores ----------------------------------------

@cuda.jit
def _dequantize_vector_rows(packed32, out, cols):
    # out: the matrix as one flat vector; cols is a multiple of 4, so row r's values are whole words from
    # word r (cols + 4) / 4 of packed, its scale the word after them, and word w's four values are the
    # 16-byte vector at column 4 w of the output row.
    ws = cuda.local.array(ILP, uint32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(cols)
    words = cols // FOUR
    first_word = row * (words + uint64(1))
    # EXERCISE: write this part of `_dequantize_vector_rows`. Read the hints one at a time.
    #   hint 1 (nudge): in steps of ILP words a thread, all of a step's loads issued before its first store.
    #   hint 2: the scale is the word after the row's values (as_float32); word w = w0 + t + u THREADS of the row (those below words) holds columns 4 w .. 4 w + 3.
    #   hint 3 (nearly the answer): each word's byte_value(word, k) * scale for k = 0..3 go out as one store4 at out[row cols + 4 w].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@dequantize_op.stage("vector_rows", """
    vectorized needs eight words a thread (a row of 8192) for its unrolled step: at 4096 columns every
    thread takes the one-word loop, one 4-byte load in flight, then four 4-byte stores. Here each step
    loads all the words a thread owns in it (up to eight, those past the row's end skipped) before
    the first store. With the width a multiple of 4, every row's values are whole words of packed and
    its scale the word after them, one load, and a word's four floats are one 16-byte store4 into an
    output row that starts on a 16-byte boundary: a quarter of the store instructions. 92% of copy at
    32768x4096, against vectorized's 81%. Other widths run vectorized.""")
def dequantize_vector_rows(packed, out):
    if not (rows_fit_vectors(out) and aligned16(packed)):
        dequantize_vectorized(packed, out)
        return
    _dequantize_vector_rows[out.shape[0], THREADS](flat_words(packed), flat_view(out), out.shape[1])


OPERATORS = [op, dequantize_op]
