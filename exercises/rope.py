# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/rope.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade rope            (or rope.<stage>; its other operators: rope[interleaved])
# The grader checks each stage against the operator in solutions/rope.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 1bc694aad7967fcc70c8a78cf9894d9ab3aa4bbcfcf1ecee4cf4f17be6f2be3b
# --------------------------------------------------------------------------------------------------
"""Rotary position embedding (RoPE), float32: a table of angles or sines computed on the fly, and the two
layouts models use.

RoPE rotates each pair of a query's (or key's) features by an angle that grows with the token's
position: pair i of the token at position s turns by s * inv_freq[i], inv_freq[i] = base^(-2i/D).
Which features form a pair is the model's choice, and both are in use:

* ``rope``, the half-split layout (GPT-NeoX, the Hugging Face Llama and most models since): pair i is
  (x[i], x[i + D/2]), out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i + D/2] cos + x[i] sin;
* ``rope[interleaved]`` (GPT-J, Meta's original Llama, RoFormer): pair i is (x[2i], x[2i+1]), the
  real and imaginary parts of one complex number multiplied by e^(i angle).

The input is x, S tokens x H heads x D features (the layout a projection writes before the heads are
transposed out), with the model's ``inv_freq`` (D/2 float32 values) and its cached ``cos`` and
``sin`` tables (S x D/2 float32). As in the Hugging Face models, the angle is the float32 product
float32(s) * inv_freq[i]: that rounded value is the model's definition, and the reference takes the
sine and cosine of exactly it in float64.

Each element is read once and written once for a few flops: RoPE is bound by memory. The ladder is
about what else a kernel reads or computes per element: the tables (stage 1), a sine and a cosine
per element instead (stage 2), or one sine and cosine per token and pair shared by all H heads
(stage 3), which then reads nothing but x.
"""

import math

import numpy as np
from numba import cuda, float32, uint64
from numba.cuda import libdevice

from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array

from solutions._attention_common import draw_rope_base, inverse_frequencies, rope_angles as _angles, rope_tables

THREADS = 256


def _leading_bits(x, bits):
    """x cut to its first ``bits`` significant bits (toward zero)."""
    mantissa, exponent = math.frexp(x)
    return math.ldexp(math.floor(math.ldexp(mantissa, bits)), exponent - bits)


# 2 pi as a sum of three float32 values, the first two with only 11 significant bits: n times either
# is then exact in float32 for any whole n below 2^13, so subtracting n 2 pi part by part reduces an
# angle of up to 51000 radians to [-pi, pi] with an error far below float32's rounding (Cody and
# Waite's reduction; positions past 51000 would need a third exact part).
TWO_PI_1 = np.float32(_leading_bits(2 * math.pi, 11))
TWO_PI_2 = np.float32(_leading_bits(2 * math.pi - float(TWO_PI_1), 11))
TWO_PI_3 = np.float32(2 * math.pi - float(TWO_PI_1) - float(TWO_PI_2))
INV_TWO_PI = np.float32(1 / (2 * math.pi))


# -- the operators -------------------------------------------------------------------------------

def _inputs(size, rng):
    S, H, D = size
    x = rng.normal(0.0, 1.0, (S, H, D)).astype(np.float32)
    base = draw_rope_base(rng)  # the model's: a parameter, so drawn too
    cos, sin = rope_tables(S, D, base)
    return x, inverse_frequencies(D, base), cos, sin


def _adversarial(interleaved):
    """Inputs random draws never hit: each pair's two features equal (x_a c - x_b s cancels where the
    angle nears pi/4), and values of 1e18 (a kernel that squares or normalises on the way overflows)."""
    def sets(size, rng):
        x, inv_freq, cos, sin = _inputs(size, rng)
        a, b = _pairs(size[2], interleaved)
        equal_pairs = x.copy()
        equal_pairs[..., b] = equal_pairs[..., a]
        return [("pairs-equal", (equal_pairs, inv_freq, cos, sin)),
                ("large-values", ((x * np.float32(1e18)).astype(np.float32), inv_freq, cos, sin))]
    return sets


def _pairs(D, interleaved):
    """The feature indices (first, second) of each of the D/2 pairs in a layout."""
    i = np.arange(D // 2)
    return (2 * i, 2 * i + 1) if interleaved else (i, i + D // 2)


def _reference(x, inv_freq, cos, sin, interleaved=False):
    S, H, D = x.shape
    angles = _angles(S, inv_freq).astype(np.float64)[:, None, :]  # the float32 angles, exactly
    c, s = np.cos(angles), np.sin(angles)
    a, b = _pairs(D, interleaved)
    x = x.astype(np.float64)
    out = np.empty_like(x)
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def _even_head_size(D):
    if D % 2:
        raise InputError(f"the head size D = {D} must be even: RoPE rotates pairs of features (x is S x H x D)")


def _validate(x, inv_freq, cos, sin, out):
    expect_device_array("x", x, dtype=np.float32, ndim=3)
    S, H, D = x.shape
    _even_head_size(D)
    expect_device_array("inv_freq", inv_freq, dtype=np.float32, shape=(D // 2,))
    expect_device_array("cos", cos, dtype=np.float32, shape=(S, D // 2))
    expect_device_array("sin", sin, dtype=np.float32, shape=(S, D // 2))
    expect_device_array("out", out, dtype=np.float32, shape=(S, H, D))


def _tolerance(size, dtype):
    # sin/cos of arguments up to S radians: libdevice's sinf/cosf are within 2 ulp after an exact
    # range reduction, the tables within half an ulp. A wrong angle or pair is off by O(1).
    return 2e-6


def _model_code(interleaved):
    """torch_expression: RoPE as a model writes it, on tensors. The eager peer runs it as it is, and the
    bench times it again under torch.compile, which fuses the slices, products and the cat into one kernel."""
    def expression(torch, size):
        def rope(x, inv_freq, cos, sin):
            # x * cos + rotate(x) * sin, with the tables broadcast over the heads.
            c, s = cos[:, None, :], sin[:, None, :]
            if interleaved:
                even, odd = x[..., 0::2], x[..., 1::2]
                return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)
            first, second = x.chunk(2, dim=-1)
            return torch.cat((first * c - second * s, second * c + first * s), dim=-1)
        return rope
    return expression


def _peer(interleaved):
    def peer(size):
        torch = peers.torch()
        if torch is None:
            return None
        rope = _model_code(interleaved)(torch, size)

        def rope_torch(x, inv_freq, cos, sin, out):
            return rope(*(peers.as_torch(a) for a in (x, inv_freq, cos, sin)))

        rope_torch.returns_output = True
        return "torch (model code)", rope_torch
    return peer


def _io_bytes(size):
    S, H, D = size
    _even_head_size(D)  # the model refuses what the kernels refuse, at sizes too large to build and validate
    return 2 * 4 * S * H * D  # x read, out written


def _table_bytes(size):
    S, H, D = size
    return _io_bytes(size) + 2 * 4 * S * (D // 2)  # and the cos and sin tables, once from memory


def _flops(size):
    S, H, D = size
    return 3 * S * H * D  # two multiplies and an add per output


def _make_operator(title, interleaved, rank):
    return Operator(
        name="rope", variant={"pairs": "interleaved"} if interleaved else {},
        title=title,
        reference=lambda x, inv_freq, cos, sin: _reference(x, inv_freq, cos, sin, interleaved),
        make_inputs=_inputs,
        make_output=lambda size: np.empty(size, np.float32),
        bytes_moved=_io_bytes,
        flops=_flops,
        validate=_validate,
        tolerance=_tolerance,
        peer=_peer(interleaved),
        torch_expression=_model_code(interleaved),
        adversarial_inputs=_adversarial(interleaved),
        size_names=("tokens", "heads", "head_dim"),
        check_sizes=[(1, 1, 2), (17, 3, 64), (1000, 8, 128), (4097, 32, 128), (8192, 32, 128)],
        sim_sizes=[(1, 1, 2), (5, 3, 34), (9, 2, 16)],
        bench_sizes=[(1024, 32, 128), (8192, 32, 128), (32768, 32, 128)],
        headline_size=(32768, 32, 128),
        rank=rank,
        group="Attention: from three kernels to FlashAttention",
    )


op = _make_operator("RoPE, half-split layout (GPT-NeoX, Hugging Face Llama), float32", False, 305)
interleaved_op = _make_operator("RoPE, interleaved layout (GPT-J, Meta Llama), float32",
                                True, 306)


@cuda.jit(device=True, inline=True)
def _cos_sin(angle):
    """cos and sin of a float32 angle (|angle| up to about 10^5), in float32 arithmetic only: the
    angle is reduced to [-pi, pi] by subtracting n 2 pi in three parts, then the hardware's
    sin.approx and cos.approx (error below 1e-6 on [-pi, pi]) take over. libdevice's sinf and cosf
    would do the same, but keep a double-precision path for huge arguments that this never needs."""
    n = libdevice.rintf(angle * INV_TWO_PI)
    r = angle - n * TWO_PI_1  # exact: n * TWO_PI_1 is, and the two are within a factor of 2
    r = r - n * TWO_PI_2
    r = r - n * TWO_PI_3
    return libdevice.fast_cosf(r), libdevice.fast_sinf(r)


@cuda.jit(device=True, inline=True)
def _pair_features(i, half, interleaved):
    """The two features of pair i: (i, i + D/2) half-split, (2i, 2i + 1) interleaved."""
    if interleaved:
        return uint64(2) * i, uint64(2) * i + uint64(1)
    return i, i + half


# -- 1. table: a thread per pair, the cached cos and sin read from memory -------------------------

@cuda.jit
def _rotate_from_table(x, cos, sin, out, interleaved):
    n = uint64(cuda.grid(1))
    half = uint64(x.shape[2] // 2)
    heads = uint64(x.shape[1])
    if n < uint64(x.shape[0]) * heads * half:
        i = n % half  # consecutive threads, consecutive pairs of one head: coalesced
        h = (n // half) % heads
        s = n // (half * heads)
        a, b = _pair_features(i, half, interleaved)
        c = cos[s, i]
        t = sin[s, i]
        xa = x[s, h, a]
        xb = x[s, h, b]
        out[s, h, a] = xa * c - xb * t
        out[s, h, b] = xb * c + xa * t


def _launch_table(x, cos, sin, out, interleaved):
    S, H, D = x.shape
    _rotate_from_table[blocks_for(S * H * (D // 2), THREADS), THREADS](x, cos, sin, out, interleaved)


TABLE_PARAGRAPH = """
    One thread per pair of features: it reads the pair, the pair's cosine and sine from the tables
    the model caches (one row per position), and writes the rotated pair. Consecutive threads take
    consecutive pairs of one head, so every access is coalesced. The tables add 8 bytes per pair
    and token to the traffic, H times over through L2 (once per head), once from memory."""


@op.stage("table", TABLE_PARAGRAPH, bytes_moved=_table_bytes)
def table(x, inv_freq, cos, sin, out):
    _launch_table(x, cos, sin, out, False)


@interleaved_op.stage("table", TABLE_PARAGRAPH + """ In this layout a pair's two features are
    neighbours, so a warp's two loads each use every other float of the same cache lines.""",
                      bytes_moved=_table_bytes)
def interleaved_table(x, inv_freq, cos, sin, out):
    _launch_table(x, cos, sin, out, True)


# -- 2. on_the_fly: the sine and cosine computed, no table -----------------------------------------

@cuda.jit
def _rotate_on_the_fly(x, inv_freq, out, interleaved):
    n = uint64(cuda.grid(1))
    half = uint64(x.shape[2] // 2)
    heads = uint64(x.shape[1])
    if n < uint64(x.shape[0]) * heads * half:
        i = n % half
        h = (n // half) % heads
        s = n // (half * heads)
        a, b = _pair_features(i, half, interleaved)
        # EXERCISE: write this part of `_rotate_on_the_fly`. Read the hints one at a time.
        #   hint 1 (nudge): the angle is float32(s) * inv_freq[i], the float32 product the model computes.
        #   hint 2 (nearly the answer): _cos_sin(angle) gives its cosine and sine, accurate at angles of thousands of radians.
        return  # TODO(exercise): not implemented yet: replace this line with your code
        xa = x[s, h, a]
        xb = x[s, h, b]
        out[s, h, a] = xa * c - xb * t
        out[s, h, b] = xb * c + xa * t


def _launch_on_the_fly(x, inv_freq, out, interleaved):
    S, H, D = x.shape
    _rotate_on_the_fly[blocks_for(S * H * (D // 2), THREADS), THREADS](x, inv_freq, out, interleaved)


ON_THE_FLY_PARAGRAPH = """
    No table: each thread computes its angle, float32(s) * inv_freq[i] (the same rounded product the
    model computes, so the result matches the table), and its sine and cosine. Memory traffic is
    now x in and out only; the price is instructions. The hardware's fast sine (sin.approx) is only
    accurate near zero, and long contexts reach angles of thousands of radians, so the angle is first
    reduced to [-pi, pi] (n 2 pi subtracted in three float32 parts, the first two short enough that
    their products with n are exact): about a dozen instructions a pair, and every head of a token computes the same values again, H
    times."""


@op.stage("on_the_fly", ON_THE_FLY_PARAGRAPH)
def on_the_fly(x, inv_freq, cos, sin, out):
    _launch_on_the_fly(x, inv_freq, out, False)


@interleaved_op.stage("on_the_fly", ON_THE_FLY_PARAGRAPH)
def interleaved_on_the_fly(x, inv_freq, cos, sin, out):
    _launch_on_the_fly(x, inv_freq, out, True)


# -- 3. heads_share_angles: one sine and cosine per token and pair, for all heads ------------------

HEADS_AT_ONCE = 4  # heads whose loads a thread issues before it rotates any


@cuda.jit
def _rotate_all_heads(x, inv_freq, out, interleaved):
    n = uint64(cuda.grid(1))
    half = uint64(x.shape[2] // 2)
    heads = uint64(x.shape[1])
    xa = cuda.local.array(HEADS_AT_ONCE, float32)
    xb = cuda.local.array(HEADS_AT_ONCE, float32)
    if n < uint64(x.shape[0]) * half:
        i = n % half
        s = n // half
        a, b = _pair_features(i, half, interleaved)
        c, t = _cos_sin(float32(s) * inv_freq[i])
        # EXERCISE: write this part of `_rotate_all_heads`. Read the hints one at a time.
        #   hint 1 (nudge): rotate pair i in every head h of token s with the same c and t.
        #   hint 2 (nearly the answer): HEADS_AT_ONCE heads a step: load all their pairs into xa, xb first, then store, so the loads are in flight together.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


def _launch_all_heads(x, inv_freq, out, interleaved):
    S, H, D = x.shape
    _rotate_all_heads[blocks_for(S * (D // 2), THREADS), THREADS](x, inv_freq, out, interleaved)


SHARED_ANGLES_PARAGRAPH = """
    The angle depends on the token and the pair, not on the head: one thread per token and pair now
    computes its sine and cosine once and rotates that pair in all H heads (32 in the headline), so
    the sines cost 1/H of what they did and nothing but x is read. A warp still covers consecutive
    pairs of one head at each step, so the accesses stay coalesced; the thread loads the pairs of
    four heads before it writes any, four loads in flight instead of one (a store to out could
    alias x, so the compiler would not move the next load above it on its own)."""


@op.stage("heads_share_angles", SHARED_ANGLES_PARAGRAPH)
def heads_share_angles(x, inv_freq, cos, sin, out):
    _launch_all_heads(x, inv_freq, out, False)


@interleaved_op.stage("heads_share_angles", SHARED_ANGLES_PARAGRAPH)
def interleaved_heads_share_angles(x, inv_freq, cos, sin, out):
    _launch_all_heads(x, inv_freq, out, True)


OPERATORS = [op, interleaved_op]
