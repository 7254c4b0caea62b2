# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/activations.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade activation[relu]            (or activation[relu].<stage>; its other operators: activation[leaky_relu], activation[sigmoid], activation[tanh], activation[gelu], activation[gelu_tanh], activation[silu], activation[relu,fp16], activation[leaky_relu,fp16], activation[sigmoid,fp16], activation[tanh,fp16], activation[gelu,fp16], activation[gelu_tanh,fp16], activation[silu,fp16], activation[relu,bf16], activation[leaky_relu,bf16], activation[sigmoid,bf16], activation[tanh,bf16], activation[gelu,bf16], activation[gelu_tanh,bf16], activation[silu,bf16])
# The grader checks each stage against the operator in solutions/activations.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: af9a95bb2ab6e533a406413a983939c68d4e6f73b8226c1f86cc8ab70dda918f
# --------------------------------------------------------------------------------------------------
"""Activation functions on a float32, fp16 or bf16 vector, from a thread per element to 16-byte loads and fast math.

ReLU, Leaky ReLU, Sigmoid, Tanh, GELU (the erf form and the tanh approximation) and SiLU (Swish):
each reads one float32 and writes one, 8 bytes per element, and does between one and a few dozen
instructions on it. So every one of them should run at the speed of a copy, and the ladder is about
what stands between a one-line kernel and that speed, and what speed costs in accuracy:

1. ``thread_per_element``: one thread per element, the kernel anyone writes first.
2. ``grid_stride``: a grid sized to the machine, each thread four elements a step (all four loads
   issued before the first store), unsigned indices.
3. ``vector4``: 16-byte loads and stores (``ld.global.v4.f32``), four elements per instruction.
4. ``in_flight``: a grid that covers the vector once, each thread four 16-byte loads issued before
   any of them is used (64 bytes in flight), the bounds checked once per thread, not per access.
5. ``small_tiles``: a thread per 16-byte vector, 128-thread blocks: fewer bytes in flight a thread,
   and on the H200 2-6% faster than in_flight, within 1% of torch's kernel (GELU excepted).
6. ``fast_math`` (only where there is a transcendental function): the small_tiles kernel (in_flight
   for GELU) compiled with ``fastmath=True``, which swaps libdevice's accurate ``expf``/``tanhf`` for
   the hardware's approximate ``ex2.approx``/``tanh.approx.f32`` and the division for an approximate one.

Each activation is its own operator (``activation[relu]``, ``activation[gelu]``, ...): the kernels are written once
below, with the activation as a name (``activation``) they call, and compiled once per function
(``solutions/_templates.py``), the way a C++ template is instantiated once per functor. torch and
``torch.compile`` are the peers (``workbench bench`` times both beside every stage).

**Accuracy.** Each stage is measured in ulps (units in the last place of the float32 result) against a
float64 reference, beside its speed (``ulp_error`` here; the GPU script prints the table). What the
CUDA documentation guarantees for the functions the stages call:

| function | stages 1-5 (libdevice) | ``fast_math`` | acceptable? |
|---|---|---|---|
| ReLU, Leaky ReLU | exact (0 ulp) | no fast-math stage: nothing to approximate | yes |
| Sigmoid, SiLU, GELU (tanh form) | ``expf`` 2 ulp, IEEE division | ``__expf``: 2 + floor(1.17 \\|x\\|) ulp, division 2 ulp, subnormals flushed | yes for activations: tens of ulps only where \\|x\\| is large and the result saturated |
| Tanh | ``tanhf`` 2 ulp | ``tanh.approx.f32``: relative error 2^-10.99, about 1000 ulps | not in float32 (its check tolerance is loosened to 1e-3 and says so); in bf16 yes (at most 0.13 of a step), in fp16 no (up to a whole step) |
| GELU (erf form) | ``erfcf`` 4 ulp | ``erfcf`` stays (there is no fast erfc); subnormals flushed | yes |

Two choices keep the tails right. GELU is computed as ``0.5 x erfc(-x / sqrt 2)``, not
``0.5 x (1 + erf(x / sqrt 2))``: below x = -5.5 the float32 erf is -1 exactly and the erf form
returns 0 where the answer is -6e-9 at x = -6 (every digit lost; the GPU script's ulp table shows
whether torch's kernel does). The tanh approximation 0.5 x (1 + tanh(u)) is computed as
x / (1 + exp(-2u)), the same function (1 + tanh u = 2 / (1 + e^-2u)) without the cancellation of
1 + tanh u near -1, and with one exp and one division instead of a tanh. At -inf, x * 0 would be
NaN where the limit is 0: GELU and SiLU return 0 there (a kernel that multiplies x by a factor
tending to 0 returns NaN). NaN propagates through every function, as in torch. And SiLU and
GELU-tanh multiply x by the logistic without forming e^-|z| itself (``times_logistic``), which
fastmath's flush to zero would turn to 0 for |z| > 87.3 where the product is still a normal number
(the 16-bit fast_math paragraph).

**fp16 and bf16** (``activation[relu,fp16]``, ``activation[gelu,bf16]``, ...: all seven functions, in each format).
The same float32 functions, with each element widened to float32 when it is loaded and rounded to 16
bits once, when it is stored (as torch computes them): half the bytes of the float32 operators, so at
a copy's speed half the time. Three stages: ``widened`` (a thread per element, 2-byte loads),
``in_flight`` (16-byte loads of eight halves, four per thread issued before any is used: the float32
ladder's last kernel at 16 bits), ``fast_math`` (where there is an exp, an erfc or a tanh: at 2 bytes
an element the arithmetic per byte doubles, and the approximations' error, tens of float32 ulps, is a
thousandth of a 16-bit result's rounding). Accuracy is counted in ulps of the 16-bit result
(``ulp_error(got, ref, dtype)``): a correct kernel is within half an ulp plus the float32 function's
error, 0.501 at most (the GPU test allows 0.51: ``HALF_ULPS``). One exception, Tanh: fast math swaps
tanhf for tanh.approx.f32, whose documented relative error, 2^-10.987, is up to 0.13 of a bf16 step
(results within 0.63 ulp: always one of the two bf16 numbers around the answer) but up to a whole fp16
step (results up to 1.5 ulps away, no longer a rounding): activation[tanh,bf16] has a fast_math stage,
activation[tanh,fp16] has none. The 16-bit Leaky ReLU, Sigmoid and Tanh have not been timed yet (ReLU, both
GELUs and SiLU have).
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint16, uint64
from numba.cuda import libdevice

from solutions._half import BFLOAT16, CONVERSIONS, bits16, short_name
from solutions._half import FORMATS as HALF_FORMATS, TOLERANCE as HALF_TOLERANCE
from solutions._references import erfc64
from solutions._templates import instantiate
from solutions._vector_io import (HALVES_PER_VECTOR, aligned16, high_half, load4, load8, low_half, pack, store4,
                                 store8)
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array, sm_count
from workbench.targets import against_peer, of_ceiling


THREADS = 256  # threads per block: a multiple of the 32-lane warp
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 threads, all a Hopper multiprocessor holds
ELEMENTS_PER_THREAD = 8  # a grid-stride grid is never larger than it takes to give each thread this many
VECTORS_PER_THREAD = 4  # in_flight: four 16-byte loads per thread, all issued before the first is used
IN_FLIGHT_FLOATS = 4 * VECTORS_PER_THREAD  # in_flight: 16 floats (64 bytes) a thread; the block size is per function

ZERO = float32(0.0)
HALF = float32(0.5)
ONE = float32(1.0)
NEG_INF = float32(-np.inf)
LEAKY_SLOPE = float32(0.01)  # torch.nn.functional.leaky_relu's default negative_slope
SQRT_HALF = float32(0.7071067811865476)  # 1 / sqrt(2)
GELU_TANH_C = float32(2.0 * 0.7978845608028654)  # 2 sqrt(2 / pi): the 2 of exp(-2u) folded in
GELU_TANH_K = float32(0.044715)


# -- the activations, float32 on the device ----------------------------------------------------------

@cuda.jit(device=True, inline=True)
def relu(v):
    # v < 0 is false for NaN, so NaN passes through (max(v, 0) might return 0 for it)
    return ZERO if v < ZERO else v


@cuda.jit(device=True, inline=True)
def leaky_relu(v):
    return v if v >= ZERO else LEAKY_SLOPE * v


@cuda.jit(device=True, inline=True)
def logistic(z):
    """1 / (1 + e^-z) without overflow: e = e^-|z| lies in (0, 1], and for z < 0 the answer is
    e / (1 + e). The plain 1 / (1 + e^-z) overflows e^-z to inf below z = -88, which rounds the result
    to 0 instead of the (tiny, representable) e^z; this form keeps every digit there. Under fastmath=True
    e is flushed to 0 once it is subnormal (|z| > 87.3): right for the sigmoid, whose result is then as
    small, not for a product with it (times_logistic)."""
    e = math.exp(-abs(z))
    r = ONE / (ONE + e)
    return r if z >= ZERO else e * r


@cuda.jit(device=True, inline=True)
def times_logistic(v, z):
    """v * logistic(z), with no intermediate far smaller than the product. Under fastmath=True every
    float32 result below 1.2e-38 (a subnormal) is flushed to zero: e^-|z| is, once |z| > 87.3, and
    v * logistic(z) would then be 0 where it is a normal number (SiLU(-90) = -7.4e-38). So the exp is
    taken of half the exponent, h = e^(-|z|/2) (normal to |z| = 174), e^-|z| = h * h is needed only
    in 1 + e^-|z| (where 0 is right to the rounding), and for z < 0 the product is ((v h) r) h: each
    partial product at least as large as the answer, so none is flushed unless the answer is."""
    h = math.exp(-HALF * abs(z))
    r = ONE / (ONE + h * h)
    return v * r if z >= ZERO else v * h * r * h  # left to right: ((v * h) * r) * h


@cuda.jit(device=True, inline=True)
def sigmoid(v):
    return logistic(v)


@cuda.jit(device=True, inline=True)
def tanh(v):
    return math.tanh(v)


@cuda.jit(device=True, inline=True)
def gelu(v):
    # x * Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: accurate in the negative tail, where 1 + erf(x)
    # cancels to 0. (0.5 * v) first: v * erfc(..) would overflow to inf for v near float32's maximum.
    g = HALF * v * math.erfc(-v * SQRT_HALF)
    return ZERO if v == NEG_INF else g  # -inf * 0 is NaN; the limit is 0


# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + |z| / 2), P of degree 9: the Chebyshev fit of Numerical
# Recipes (Press et al., 2nd ed., section 6.2, erfcc), relative error below 1.2e-7 for every z.
ERFC_P = [float32(c) for c in (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                               -1.13520398, 1.48851587, -0.82215223, 0.17087277)]
P0, P1, P2, P3, P4, P5, P6, P7, P8, P9 = ERFC_P
TWO = float32(2.0)


@cuda.jit(device=True, inline=True)
def _erfc_of(z, a, t):
    """erfc(z) = t exp(-a^2 + P(t)), a = |z|, t = 1 / (1 + a / 2): the formula, given t."""
    p = P0 + t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * (P5 + t * (P6 + t * (P7 + t * (P8 + t * P9))))))))
    r = t * math.exp(p - a * a)  # a * a overflows to inf past 1.8e19: exp(-inf) = 0, erfc(inf) = 0
    return r if z >= ZERO else TWO - r


@cuda.jit(device=True, inline=True)
def short_erfc(z):
    """erfc to 1.2e-7 relative (about 2 float32 ulps; a 16-bit result's rounding is 2^-12 or 2^-9):
    one reciprocal, nine multiply-adds and one exp, no branch but the sign's select. NaN gives NaN."""
    a = abs(z)
    return _erfc_of(z, a, ONE / (ONE + HALF * a))


@cuda.jit(device=True, inline=True)
def short_erfc_approx_reciprocal(z):
    """short_erfc with t from div.approx.f32 (MUFU.RCP and a multiply, 2 ulps): fastmath=True alone
    leaves numba's 1 / d an IEEE division (a reciprocal, a Newton step, a range check and a call to a
    slow path). Past d = 2^126 (|z| > 1.7e38) div.approx gives 0: erfc is 0 or 2 there all the same."""
    a = abs(z)
    return _erfc_of(z, a, libdevice.fast_fdividef(ONE, ONE + HALF * a))


@cuda.jit(device=True, inline=True)
def gelu_short_erfc(v):
    # gelu with short_erfc for libdevice's erfcf: activation[gelu,fp16]/bf16.short_erfc
    g = HALF * v * short_erfc(-v * SQRT_HALF)
    return ZERO if v == NEG_INF else g


@cuda.jit(device=True, inline=True)
def gelu_approx_reciprocal(v):
    # gelu_short_erfc with div.approx's reciprocal: activation[gelu].short_erfc (float32)
    g = HALF * v * short_erfc_approx_reciprocal(-v * SQRT_HALF)
    return ZERO if v == NEG_INF else g


@cuda.jit(device=True, inline=True)
def gelu_tanh(v):
    # 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3), is v * logistic(2u): the same function
    # (1 + tanh u = 2 / (1 + e^-2u)) with one exp and one division, and no cancellation of 1 + tanh(u)
    # for v far below 0. times_logistic, not v * logistic(..): see there (flush to zero under fastmath).
    g = times_logistic(v, GELU_TANH_C * (v + GELU_TANH_K * v * v * v))
    return ZERO if v == NEG_INF else g  # -inf * 0 is NaN; the limit is 0


@cuda.jit(device=True, inline=True)
def silu(v):
    g = times_logistic(v, v)  # v * logistic(v), kept right where logistic(v) alone would flush to 0
    return ZERO if v == NEG_INF else g


# -- the same functions in float64, for the reference ---------------------------------------------------
# (erfc64: Cephes' rational approximations of erfc, shared with the elementwise GELU's reference)

def _at_minus_inf_zero(v, y):
    return np.where(v == -np.inf, 0.0, y)


def _sigmoid64(v):
    e = np.exp(-np.abs(v))  # as on the device: never overflows
    return np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


REFERENCES = {
    "relu": lambda v: np.where(v < 0, 0.0, v),
    "leaky_relu": lambda v: np.where(v >= 0, v, 0.01 * v),
    "sigmoid": _sigmoid64,
    "tanh": np.tanh,
    "gelu": lambda v: _at_minus_inf_zero(v, 0.5 * v * erfc64(-v * np.sqrt(0.5))),
    "gelu_tanh": lambda v: _at_minus_inf_zero(
        v, v * _sigmoid64(2.0 * np.sqrt(2.0 / np.pi) * (v + 0.044715 * v * v * v))),
    "silu": lambda v: _at_minus_inf_zero(v, v * _sigmoid64(v)),
}


def reference_of(name):
    def reference(x):
        if x.dtype.itemsize == 2:  # float16/bfloat16: 65536 possible inputs, each evaluated once
            return _reference_table(name, x.dtype)[np.ascontiguousarray(x).view(np.uint16)]
        with np.errstate(all="ignore"):  # exp overflowing to inf is the intended limit
            return np.asarray(REFERENCES[name](x.astype(np.float64)), np.float64)
    return reference


@functools.lru_cache(maxsize=None)
def _reference_table(name, dtype) -> np.ndarray:
    """The float64 reference of every 16-bit pattern of ``dtype``, indexed by the pattern: at 2^28
    elements a lookup is a second where evaluating erfc64 again was a minute of CPU."""
    every_value = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCES[name](every_value.astype(np.float64)), np.float64)


def ulp_error(got: np.ndarray, ref: np.ndarray, dtype=np.float32) -> np.ndarray:
    """|got - ref| in units of the ``dtype`` spacing at the reference (0 where both are the same NaN or inf,
    inf where only one is): how many steps of the result's format a result is from the exact answer.
    At the format's largest finite value the step is the one below it (the one above is inf)."""
    dtype = np.dtype(dtype)
    ref = np.asarray(ref, np.float64)
    got64 = np.asarray(got).astype(np.float64)
    with np.errstate(all="ignore"):
        magnitude = np.abs(ref).astype(dtype)
        spacing = np.spacing(magnitude).astype(np.float64)
        largest = np.array(_largest(dtype), dtype)
        top_step = float(largest.astype(np.float64) - _previous(largest).astype(np.float64))
        spacing = np.where(np.isfinite(magnitude.astype(np.float64)) & ~np.isfinite(spacing), top_step, spacing)
        err = np.abs(got64 - ref) / spacing
    same_special = (np.isnan(got64) & np.isnan(ref)) | (np.isinf(ref) & (got64 == ref))
    err = np.where(same_special, 0.0, err)
    return np.where(np.isfinite(ref) | same_special, err, np.inf)


def _largest(dtype):
    import ml_dtypes  # (a dependency: bfloat16's limits)

    return ml_dtypes.finfo(dtype).max if dtype == BFLOAT16 else np.finfo(dtype).max


def _previous(value: np.ndarray) -> np.ndarray:
    """The representable number just below a positive finite value (its bit pattern minus one)."""
    unsigned = {2: np.uint16, 4: np.uint32}[value.dtype.itemsize]
    return (value.view(unsigned) - unsigned(1)).view(value.dtype)


# -- the operator's model -----------------------------------------------------------------------------

def _inputs(size, rng):
    (n,) = size
    # Normal, standard deviation 3: both signs, most of the mass where the functions bend, tails to +-15.
    return ((3.0 * rng.standard_normal(n)).astype(np.float32),)


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-40, -1e-40, 1e-30, -20.0, -90.0,
                     -100.0, 20.0, 90.0, 1e13, -1e13], np.float32)


def _adversarial(size, rng):
    """The values random draws never hit: NaN, +-inf, +-0, near float32's largest, subnormals, the far
    tails (where 1 + erf and 1 + tanh cancel, and exp overflows), every third element."""
    (x,) = _inputs(size, rng)
    x[::3] = np.resize(SPECIALS, x[::3].size)
    return [("specials", (x,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=1)
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape))


def _torch_peer(name, call):
    def peer(size):
        torch = peers.torch()
        if torch is None:
            return None

        def run(x, out):
            return call(torch, peers.as_torch(x))
        run.returns_output = True  # torch.nn.functional's activations have no out=: the result is checked
        return name, run
    return peer


def _machine_grid(n, elements_per_thread):
    """A grid that fills the GPU once (BLOCKS_PER_SM blocks per multiprocessor), never more blocks than
    it takes to give each thread ``elements_per_thread`` elements."""
    return min(blocks_for(n, THREADS * elements_per_thread), sm_count() * BLOCKS_PER_SM)


# -- the kernels: written once, compiled once per activation (solutions/_templates.py) ----------------
# `activation` is not defined in this module: each instantiation binds it to one of the functions above.

# -- 1. thread_per_element ----------------------------------------------------------------------------

def _thread_per_element(x, out):
    i = cuda.grid(1)
    # EXERCISE: write this part of `_thread_per_element`. Read the hints one at a time.
    #   hint 1 (nudge): One thread per element: apply activation to x[i] and store it in out[i].
    #   hint 2 (nearly the answer): The grid is rounded up to whole blocks, so threads past the end of x must do nothing.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def thread_per_element(x, out):
    _thread_per_element[blocks_for(x.size, THREADS), THREADS](x, out)


# -- 2. grid_stride -------------------------------------------------------------------------------------

def _grid_stride(x, out):
    # Unsigned from the start: numba honours negative indices, so a signed index costs a sign test and
    # an add on every access; and uint64 combined with an int64 (a bare literal too) is an int64 again.
    n = uint64(x.size)
    stride = uint64(cuda.gridsize(1))
    i = uint64(cuda.grid(1))
    s2 = stride + stride
    s3 = s2 + stride
    s4 = s2 + s2
    # EXERCISE: write this part of `_grid_stride`. Read the hints one at a time.
    #   hint 1 (nudge): Each step handles four elements a grid stride apart: i, i + stride, i + s2, i + s3; then i += s4.
    #   hint 2: Load all four before the first store (a store to out might alias x, so the compiler will not move a load above it); finish the last elements one stride at a time.
    #   hint 3 (nearly the answer): while i + s3 < n: v0 = x[i]; ...; v3 = x[i + s3]; out[i] = activation(v0); ...; i += s4. Then while i < n: out[i] = activation(x[i]); i += stride
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def grid_stride(x, out):
    _grid_stride[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)


# -- 3. vector4 ---------------------------------------------------------------------------------------

def _vector4(x, out):
    n = uint64(x.size)
    four = uint64(4)
    vectors = n // four  # whole 16-byte vectors; the last n % 4 elements are the tail
    stride = uint64(cuda.gridsize(1))
    t = uint64(cuda.grid(1))
    # EXERCISE: write this part of `_vector4`. Read the hints one at a time.
    #   hint 1 (nudge): Vector w holds elements 4w .. 4w + 3: a, b, c, d = load4(x, four * w) reads them in one 16-byte load, store4(out, four * w, ...) writes four.
    #   hint 2: Walk the vectors with a grid stride (two vectors a step keeps 32 bytes in flight per thread), then let threads 0 .. n % 4 - 1 each take one element of the tail.
    #   hint 3 (nearly the answer): w = t; while w + stride < vectors: load two vectors (w and w + stride), store both, w += stride + stride. Then one more if w < vectors. Tail: e = four * vectors + t; if e < n: out[e] = activation(x[e])
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def vector4(x, out):
    if not aligned16(x, out):  # a view starting mid-buffer: a 16-byte load there would fault
        _grid_stride[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)
        return
    _vector4[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)


# -- 4. in_flight --------------------------------------------------------------------------------------

def _in_flight(x, out):
    n = uint64(x.size)
    four = uint64(4)
    body = n - n % four  # the elements in whole 16-byte vectors; the last n % 4 are the tail
    s1 = four * uint64(cuda.blockDim.x)  # elements between one thread's vectors: each warp-wide load one 512-byte run
    s2 = s1 + s1
    s3 = s2 + s1
    i = uint64(cuda.blockIdx.x) * (s2 + s2) + four * uint64(cuda.threadIdx.x)  # a block owns 4 x s1 elements
    # EXERCISE: write this part of `_in_flight`. Read the hints one at a time.
    #   hint 1 (nudge): Block b owns elements b * 4 * s1 onwards (s1 = 4 * blockDim.x); thread t reads the vectors at i, i + s1, i + s2, i + s3 (i = that start + 4t): no loop, the grid covers the vector once.
    #   hint 2: Issue all four load4 before the first store4: 64 bytes in flight per thread. One test per thread (does the vector at i + s3 lie inside body?) replaces a test per access; only the last block fails it.
    #   hint 3 (nearly the answer): if i + s3 < body: four load4, then four store4 of activation(...). else: while i < body: load4, store4, i += s1. Then the tail as in vector4: e = body + cuda.grid(1); if e < n: ...
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def in_flight(x, out):
    if not aligned16(x, out):  # a view starting mid-buffer: a 16-byte load there would fault
        _grid_stride[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)
        return
    # IN_FLIGHT_THREADS, bound per function (the Activation table): 512, or 128 for GELU (erf form)
    _in_flight[blocks_for(x.size, IN_FLIGHT_FLOATS * IN_FLIGHT_THREADS), IN_FLIGHT_THREADS](x, out)  # noqa: F821


# -- 5. small_tiles ---------------------------------------------------------------------------------------

SMALL_TILE_THREADS = 128  # a block: 128 vectors, 2 KB of x (the H200 probe: 128 and 256 tie, 512 1% slower)


def _small_tiles(x, out):
    n = uint64(x.size)
    four = uint64(4)
    i = four * uint64(cuda.grid(1))  # this thread's vector: elements i .. i + 3
    # EXERCISE: write this part of `_small_tiles`. Read the hints one at a time.
    #   hint 1 (nudge): Thread t owns elements 4t .. 4t + 3: if all four exist, one load4 and one store4 of activation(...). No loop: the grid has a thread per vector.
    #   hint 2 (nearly the answer): Else, if 4t < n, this is the last thread with elements: take the n % 4 left over one at a time.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def small_tiles(x, out):
    if not aligned16(x, out):  # a view starting mid-buffer: a 16-byte load there would fault
        _grid_stride[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)
        return
    _small_tiles[blocks_for(-(-x.size // 4), SMALL_TILE_THREADS), SMALL_TILE_THREADS](x, out)


# -- 6. fast_math -----------------------------------------------------------------------------------------

def fast_math(x, out):
    # _fast is the function's fast-math base kernel (small_tiles, or in_flight for GELU: the Activation
    # table) compiled with fastmath=True (see _make_operator): the only change is the flag
    if not aligned16(x, out):  # the accurate grid-stride kernel, as in stages 3 to 5
        _grid_stride[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)
        return
    if FAST_ON_IN_FLIGHT:  # noqa: F821
        _fast[blocks_for(x.size, IN_FLIGHT_FLOATS * IN_FLIGHT_THREADS), IN_FLIGHT_THREADS](x, out)  # noqa: F821
    else:
        _fast[blocks_for(-(-x.size // 4), SMALL_TILE_THREADS), SMALL_TILE_THREADS](x, out)  # noqa: F821


# -- 7. short_erfc (GELU, erf form, only) -------------------------------------------------------------------

SHORT_ERFC_THREADS = 128  # the block (on in_flight, 512 was the cheap functions' block)
SHORT_ERFC_ON_SMALL_TILES = True  # build on small_tiles (a vector a thread); False: on in_flight


def short_erfc_float32(x, out):
    # _short is the fast_math kernel (in_flight, or small_tiles: SHORT_ERFC_ON_SMALL_TILES) with gelu_approx_reciprocal
    if not aligned16(x, out):  # the accurate grid-stride kernel, as in stages 3 to 6
        _grid_stride[_machine_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)
        return
    if SHORT_ERFC_ON_SMALL_TILES:
        _short[blocks_for(-(-x.size // 4), SHORT_ERFC_THREADS), SHORT_ERFC_THREADS](x, out)  # noqa: F821
    else:
        _short[blocks_for(x.size, IN_FLIGHT_FLOATS * SHORT_ERFC_THREADS), SHORT_ERFC_THREADS](x, out)  # noqa: F821


# -- the stages' paragraphs --------------------------------------------------------------------------------

THREAD_PER_ELEMENT = """
    One thread per element: thread i applies the activation to x[i] and writes out[i]. Neighbouring
    threads read neighbouring floats, so every load is coalesced, and for a function this cheap that
    is most of the work. What it costs is blocks: one 256-thread block per 256 elements (a million
    blocks at 2^28), each thread doing one load and one store and retiring, and a signed int64 index
    that numba tests for negativity on every access."""

GRID_STRIDE = """
    The grid is sized to the machine (8 blocks of 256 threads per multiprocessor, all it holds) and
    each thread walks the vector with a grid stride, four elements a step: the four loads are issued
    before the first store, so each thread has four requests in flight (a store to out may alias x,
    and the compiler will not move a load above it on its own). The indices are uint64, which drops
    numba's negative-index test from every access."""

VECTOR4 = """
    16-byte vector loads and stores: ld.global.v4.f32 moves four floats with one instruction and one
    address, so the load/store instructions per element drop fourfold, and each thread has two
    vectors (32 bytes) in flight. numba has no float4 and will not merge four scalar loads (it cannot
    prove 16-byte alignment), so load4/store4 (solutions/_vector_io.py) emit the vector access; the
    launcher checks that x and out start on a 16-byte boundary (a view that does not falls back to
    the grid-stride kernel) and the last n % 4 elements are a scalar tail."""

IN_FLIGHT = """
    Bytes in flight, the rest of the way to a copy's speed. The vector4 loop keeps two vectors (32
    bytes) per thread in flight and then waits for them: its next loads cannot move above its stores
    (out may alias x). Here there is no loop: the grid covers the vector once (16 floats a thread, the
    hardware starting a new block wherever one finishes), and each thread issues four 16-byte loads, 64
    bytes, before it uses any, which is how torch's vectorized elementwise kernel keeps the memory
    system full. The bounds are tested once per thread (are all four of its vectors inside the vector?),
    not per access; only the last block fails the test and takes a checked loop. On an H200 at 2^28
    floats the vector4 and fast_math stages before this one stayed 10-20% behind torch. The block size
    is the function's: a sweep of this kernel on the H200 gave ReLU 4001, 3992, 4045 GB/s and GELU 3924,
    3852, 3762 GB/s at 128, 256, 512 threads, so GELU (erfcf, the costliest) launches 128 and the others
    512 (a difference of 1-3%, which the GPU script times again side by side)."""

SMALL_TILES = """
    Fewer bytes in flight a thread, and faster: a thread per 16-byte vector (one load, one store) in
    128-thread blocks of 2 KB, the grid covering the vector once (524,288 blocks at 2^28 floats).
    in_flight's four loads a thread were not what the memory system lacked: with 2048 threads on a
    multiprocessor, one 16-byte load each is already 32 KB in flight per SM. A probe of ReLU at 2^28 on
    an H200 measured one vector a thread fastest, at copy speed and torch.clamp's, and two, four or
    eight vectors a thread 1-6% slower. The probe does not show why; a
    likely cause is that DRAM serves nearby addresses faster (a row already open), and small blocks,
    retired and replaced in order, keep the requests in flight within a narrower range of addresses than
    large tiles do. Cache hints made every layout slower (loads that skip L1, stores marked streaming:
    3843-4197). GELU (erf form) is the exception: erfcf is a few dozen instructions, and with one vector
    a thread there is too little independent work to hide them (the bench: 613 against in_flight's 575
    µs), so its fast_math stage builds on in_flight."""

SHORT_ERFC_FLOAT32 = """
    A cheaper erfc. The fast_math stage stayed about 10% behind torch's GELU at 2^28: the sass of its
    kernel is about 56 instructions an element, most of them libdevice's erfcf (three MUFU calls,
    twenty multiply-adds), and at a copy's speed a multiprocessor has about 64 instruction slots an
    element: erfcf, not memory, sets the pace. Here erfcf gives way to the Numerical Recipes form the
    16-bit operators use (short_erfc below: one reciprocal, nine multiply-adds, one ex2.approx), in
    small_tiles' kernel (one 16-byte vector a thread, 128-thread blocks) compiled with fastmath=True.
    The reciprocal is asked for as div.approx
    (libdevice.fast_fdividef): fastmath=True leaves numba's 1 / d an IEEE division, with a range check
    and a slow path, which alone cost as much as the polynomial. The sass is about 38 instructions an
    element. Built on in_flight's kernel (four vectors a thread, 512-thread blocks) it took 520.5 us on
    an H200 at 2^28 floats, 0.97x torch's GELU. Nsight Compute, at 2^26, put the two kernels side by
    side: the same instructions (59 M), the same wait for loads (19 cycles an instruction), but ours
    80% of the warp slots filled against torch's 84%, in blocks of 512 threads that each end when their
    slowest thread ends. On small_tiles' kernel, as torch runs it (a vector a thread, small blocks),
    the same code took 128.4 us at 2^26 against 133.1 (1.04x, one sweep); at 2^28 it takes 499.7 us,
    at the copy ceiling, against torch's 505.7 and torch.compile's 505.0 in the same run (1.01x).
    What accuracy does that cost? Less than it seems: the erfcf stages are not 4 ulps from the exact
    GELU either, because -x/sqrt 2 is rounded to float32 before erfc sees it, and far below 0 that
    rounding, multiplied by the derivative of log erfc (about 2|z|^2 relative per unit of relative
    error in z), is what dominates: hundreds of ulps near x = -12, tens between -5 and -1, a couple
    near 0. The polynomial's 1.2e-7, div.approx's 2 ulps and ex2.approx's few add to that: a float32
    replay of this formula (tests/test_activations.py) is within 12 ulps for |x| < 1 and within 1.6
    times the rounding's own error beyond, the float32 tolerance (1e-5 of the result's norm) holds
    with room to spare, and the tail keeps its digits (no 1 + erf cancellation)."""

FAST_MATH_INTRO = """
    The small_tiles kernel (in_flight for GELU) compiled with fastmath=True: libdevice's accurate
    functions give way to the hardware's approximations, subnormal results flush to zero, and division
    becomes approximate (div.full.f32, 2 ulps). On an H200 at 2^28 floats (built then on the in_flight
    kernel) this stage ran within 4% of in_flight either way, for every function: the kernel waits on
    memory, not on arithmetic, so fewer instructions buy nothing here, and the accuracy is the price.
    Fast math pays where arithmetic is the bottleneck: half-precision data (half the bytes per element)
    or an activation fused into a GEMM."""


# -- the seven operators --------------------------------------------------------------------------------

class Activation:
    """One row of the table the operators are made from."""

    def __init__(self, name, title, device, torch_name, torch_call, flops, fast=None, fast_tolerance=None,
                 threads=512, fast_on="small_tiles"):
        self.name, self.title, self.device = name, title, device
        self.threads = threads  # the float32 in_flight block: 512, 128 where the function is costly (IN_FLIGHT)
        self.fast_on = fast_on  # the kernel fast_math compiles with fastmath=True: the function's fastest accurate one
        self.torch_name, self.torch_call = torch_name, torch_call
        self.flops = flops  # arithmetic per element, a transcendental counted as one
        self.fast = fast  # what fastmath=True changes for this function; None: no fast-math stage
        self.fast_tolerance = fast_tolerance


ACTIVATIONS = [
    Activation("relu", "ReLU", relu, "torch.relu", lambda t, x: t.relu(x), 1),
    Activation("leaky_relu", "Leaky ReLU (slope 0.01)", leaky_relu, "torch.nn.functional.leaky_relu",
               lambda t, x: t.nn.functional.leaky_relu(x, 0.01), 2),
    Activation("sigmoid", "Sigmoid", sigmoid, "torch.sigmoid", lambda t, x: t.sigmoid(x), 4, fast="""
        Here math.exp becomes ex2.approx (the documented error of __expf is 2 + 1.17|x| ulps, so tens of
        ulps only where |x| is large and the result saturated) and the division 1 / (1 + e) is
        approximate; libdevice's expf alone is about twenty instructions of the few dozen per element."""),
    Activation("tanh", "Tanh", tanh, "torch.tanh", lambda t, x: t.tanh(x), 1, fast="""
        Here math.tanh becomes one instruction, tanh.approx.f32, in place of libdevice's tanhf (an exp,
        a division and a polynomial). Its documented relative error is 2^-10.99: about a thousand
        float32 ulps. That is not acceptable for a float32 result (this stage's tolerance is 1e-3 instead
        of 1e-5, and this is why). Rounded to bf16 it is at most 0.13 of a step, which is where the
        instruction earns its place (activation[tanh,bf16].fast_math); rounded to fp16 it is up to a whole step,
        so activation[tanh,fp16] keeps tanhf.""", fast_tolerance=1e-3),
    Activation("gelu", "GELU (erf form)", gelu, "torch.nn.functional.gelu",
               lambda t, x: t.nn.functional.gelu(x), 6, threads=128, fast_on="in_flight", fast="""
        There is no hardware erfc: libdevice's erfcf stays, compiled with subnormals flushed and
        approximate division. Expect little change: this is where fast math has nothing to offer, and
        the tanh approximation (activation[gelu_tanh]) is the cheaper function."""),
    Activation("gelu_tanh", "GELU (tanh approximation)", gelu_tanh, "torch.nn.functional.gelu(approximate='tanh')",
               lambda t, x: t.nn.functional.gelu(x, approximate="tanh"), 9, fast="""
        Here math.exp becomes ex2.approx and the division is approximate: a few ulps more for |x| of a
        few units, more only where the result has saturated to x or to 0."""),
    Activation("silu", "SiLU / Swish", silu, "torch.nn.functional.silu", lambda t, x: t.nn.functional.silu(x), 4,
               fast="""
        Here math.exp becomes ex2.approx (2 + 1.17|x| ulps) and the division is approximate, as for
        the sigmoid."""),
]

STAGES = [
    # (launcher template, stage name, paragraph)
    (thread_per_element, "thread_per_element", THREAD_PER_ELEMENT),
    (grid_stride, "grid_stride", GRID_STRIDE),
    (vector4, "vector4", VECTOR4),
    (in_flight, "in_flight", IN_FLIGHT),
    (small_tiles, "small_tiles", SMALL_TILES),
]
KERNEL_TEMPLATES = [_thread_per_element, _grid_stride, _vector4, _in_flight, _small_tiles]


def _make_operator(act: Activation, rank: float) -> Operator:
    op = Operator(
        name="activation", variant={"function": act.name},
        targets=[of_ceiling(85, "copy_gbps"), against_peer(1.0, "eager")],
        title=f"{act.title}, float32",
        reference=reference_of(act.name),
        make_inputs=_inputs,
        make_output=lambda size: np.empty(size, np.float32),
        bytes_moved=lambda size: 8 * size[0],  # read x, write out, once each
        flops=lambda size, f=act.flops: f * size[0],
        validate=_validate,
        peer=_torch_peer(act.torch_name, act.torch_call),
        torch_expression=lambda torch, size, call=act.torch_call: lambda x: call(torch, x),  # for torch.compile
        adversarial_inputs=_adversarial,
        check_sizes=[1, 3, 1029, 65_539, 1_000_003],  # the GPU suite is shared: 2^28 is the script's
        sim_sizes=[3, 1029],  # 1029: the unrolled loops and a tail of one; 3: the tail alone
        bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
        headline_size=(2**28,),
        rank=rank,
        group="Activations: ReLU, Leaky ReLU, Sigmoid, Tanh, GELU, SiLU (float32)",
    )
    # One namespace per activation: the module's names, with `activation` and the stage kernels bound
    # to this activation's instantiations.
    namespace = dict(globals(), activation=act.device, IN_FLIGHT_THREADS=act.threads,
                     FAST_ON_IN_FLIGHT=act.fast_on == "in_flight")
    for template in KERNEL_TEMPLATES:
        namespace[template.__name__] = instantiate(template, namespace, f"{template.__name__}_{act.name}", jit={})
    if act.fast:
        base = _in_flight if act.fast_on == "in_flight" else _small_tiles
        namespace["_fast"] = instantiate(base, namespace, f"{base.__name__}_{act.name}_fast", jit={"fastmath": True})
    for launcher, name, summary in STAGES:
        op.stage(name, summary)(instantiate(launcher, namespace, f"{name}_{act.name}"))
    if act.fast:
        op.stage("fast_math", FAST_MATH_INTRO + act.fast, tolerance=act.fast_tolerance)(
            instantiate(fast_math, namespace, f"fast_math_{act.name}"))
    if act.name == "gelu":  # the fast kernel with a cheaper erfc: a namespace of its own
        short = dict(namespace, activation=gelu_approx_reciprocal)
        base = _small_tiles if SHORT_ERFC_ON_SMALL_TILES else _in_flight
        namespace["_short"] = instantiate(base, short, f"{base.__name__}_{act.name}_short", jit={"fastmath": True})
        op.stage("short_erfc", SHORT_ERFC_FLOAT32)(instantiate(short_erfc_float32, namespace, f"short_erfc_{act.name}"))
    return op


OPERATORS = FLOAT32_OPERATORS = [_make_operator(act, 350 + k) for k, act in enumerate(ACTIVATIONS)]
op = OPERATORS[0]
BY_NAME = {act.name: o for act, o in zip(ACTIVATIONS, OPERATORS)}


# ======================================================================================================
# fp16 and bf16: half the bytes, float32 inside
# ======================================================================================================
# bf16 arrays are ml_dtypes.bfloat16 on the host and held as their 16-bit patterns on the device
# (workbench.ladder.to_device): every kernel here takes the 16-bit patterns (uint16) of its arrays, and
# `widen` / `narrow`, bound per format, turn a pattern into a float32 and a float32 into a pattern.

HALF_ACTIVATIONS = ["relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu"]  # all seven
NOT_TIMED_HALF = {"leaky_relu", "sigmoid", "tanh"}  # added 2026-11-24, not yet timed on a GPU
# Element by element, in ulps of the 16-bit result: its rounding (0.5) plus the float32 function's error,
# a few float32 ulps (libdevice) or tens (ex2.approx at large |x|), 2^-13 of an fp16 step and 2^-16 of a
# bf16 one each: 0.51 leaves room for all of them. tanh.approx.f32 is the exception (relative error
# 2^-10.987: 0.127 of a bf16 step at most, for a result just below a power of two, where the step is
# 2^-7 of it), so activation[tanh,bf16].fast_math may be 0.5 + 0.127 ulp away; in fp16 the same error is up to
# a whole step, so activation[tanh,fp16] has no fast_math stage (NO_FAST_HALF). tests/test_activations.py
# replays that bound over every 16-bit input.
HALF_ULPS = 0.51
HALF_ULPS_OF = {"activation[tanh,bf16].fast_math": 0.63}


def ulps_allowed(stage_key: str) -> float:
    """The most ulps of its 16-bit format a result of this 16-bit stage may be from the float64 answer."""
    return HALF_ULPS_OF.get(stage_key, HALF_ULPS)


HALVES_PER_THREAD = HALVES_PER_VECTOR * VECTORS_PER_THREAD  # in_flight: 32 halves (64 bytes) a thread
HALF_THREADS = 512  # in_flight's block for every 16-bit function (the H200 sweep: IN_FLIGHT_HALVES, the paragraph)


# -- the 16-bit kernels: `activation`, `widen` and `narrow` are bound per (function, format) -------------

def _apply_word(word):
    """The activation of both halves of a 32-bit word, each widened to float32 and rounded back."""
    low = narrow(activation(widen(low_half(word))))  # noqa: F821 - bound per instantiation
    high = narrow(activation(widen(high_half(word))))  # noqa: F821
    return pack(low, high)


# -- 16-bit 1. widened

def _widened(x, out):
    i = cuda.grid(1)
    # EXERCISE: write this part of `_widened`. Read the hints one at a time.
    #   hint 1: x and out hold 16-bit patterns: widen(x[i]) is the float32 value, narrow(v) the pattern of v rounded to 16 bits.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def widened(x, out):
    x16, out16 = bits16(x), bits16(out)
    _widened[blocks_for(x16.size, THREADS), THREADS](x16, out16)  # noqa: F821


# -- 16-bit 2. in_flight

def _in_flight_halves(x, out):
    n = uint64(x.size)
    eight = uint64(HALVES_PER_VECTOR)
    body = n - n % eight  # the halves in whole 16-byte vectors; the last n % 8 are the tail
    s1 = eight * uint64(cuda.blockDim.x)  # halves between one thread's vectors: each warp load one 512-byte run
    s2 = s1 + s1
    s3 = s2 + s1
    i = uint64(cuda.blockIdx.x) * (s2 + s2) + eight * uint64(cuda.threadIdx.x)  # a block owns 4 x s1 halves
    # EXERCISE: write this part of `_in_flight_halves`. Read the hints one at a time.
    #   hint 1 (nudge): As the float32 in_flight stage, with load8 / store8: one 16-byte access is eight halves, four 32-bit words of two halves each.
    #   hint 2: Four load8 (i, i + s1, i + s2, i + s3) before the first store8; _apply_word(w) computes both halves of a word.
    #   hint 3 (nearly the answer): if i + s3 < body: four load8, four store8 of _apply_word of each word. else: while i < body: one vector at a time, i += s1. Tail: e = body + cuda.grid(1); if e < n: out[e] = uint16(narrow(activation(widen(x[e]))))
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def in_flight_halves(x, out):
    x16, out16 = bits16(x), bits16(out)
    if not aligned16(x16, out16):  # a view starting mid-buffer: a 16-byte load there would fault
        _widened[blocks_for(x16.size, THREADS), THREADS](x16, out16)  # noqa: F821
        return
    _in_flight_halves[blocks_for(x16.size, HALVES_PER_THREAD * HALF_THREADS), HALF_THREADS](x16, out16)  # noqa: F821


# -- 16-bit 3. fast_math

def fast_math_halves(x, out):
    # _in_flight_halves_fast is _in_flight_halves compiled with fastmath=True: the only change is the flag
    x16, out16 = bits16(x), bits16(out)
    if not aligned16(x16, out16):
        _widened[blocks_for(x16.size, THREADS), THREADS](x16, out16)  # noqa: F821
        return
    _in_flight_halves_fast[blocks_for(x16.size, HALVES_PER_THREAD * HALF_THREADS), HALF_THREADS](x16, out16)  # noqa: F821


# -- 16-bit 4. short_erfc (GELU, erf form, only)

def short_erfc_halves(x, out):
    # _in_flight_halves_short is the fast_math kernel with gelu_short_erfc as its activation
    x16, out16 = bits16(x), bits16(out)
    if not aligned16(x16, out16):
        _widened[blocks_for(x16.size, THREADS), THREADS](x16, out16)  # noqa: F821
        return
    _in_flight_halves_short[blocks_for(x16.size, HALVES_PER_THREAD * HALF_THREADS), HALF_THREADS](x16, out16)  # noqa: F821


WIDENED = """
    The float32 ladder's first kernel on 16-bit data: one thread per element, which loads the
    element's 16 bits, widens them to float32 (fp16: one cvt.f32.f16; bf16: a 16-bit shift, since a
    bf16 is the top half of a float32), computes the activation in float32 exactly as the float32
    operator does, and rounds the result to 16 bits once, when it is stored (fp16: cvt.rn.f16.f32;
    bf16: round to nearest even with integer adds, NaN kept a NaN). Half the bytes of float32, the
    same instructions per element: a warp's load is 64 bytes, half a cache line."""

IN_FLIGHT_HALVES = """
    The float32 ladder's fastest kernel at 16 bits: a grid that covers the vector once, each thread four
    16-byte loads issued before any is used (load8: ld.global.v4.b32, eight halves each, 32 halves and
    64 bytes in flight per thread), each 32-bit word taken apart into its two halves, both computed in
    float32 and packed back, four 16-byte stores; the bounds tested once per thread and a scalar tail of
    n % 8. The bytes in flight per thread are the float32 kernel's; the arithmetic per byte is twice
    its, which is what the next stage is about. Blocks of 512 threads: the bf16 SiLU kernel ran at 3352,
    3300, 3393 GB/s with 128, 256, 512 on an H200."""

FAST_MATH_HALVES = """
    The same kernel compiled with fastmath=True. In float32 this bought nothing (the float32 kernels
    wait on memory); at 16 bits each byte carries twice the arithmetic, and the approximations cost
    nothing in accuracy: ex2.approx's error, tens of float32 ulps where |x| is large, is 2^13 times
    smaller than a fp16 step (2^16 times a bf16 step), so the result should round to the same 16
    bits except at a near tie (the GPU script and tests count the ulps over all 65536 inputs). fastmath
    also flushes to zero: every float32 result below 2^-126 = 1.2e-38, intermediate or final, becomes 0
    (the .ftz of each instruction; ex2.approx.ftz for exp), and bf16, which has float32's exponents
    (fp16's range ends long before), holds results that small. A result below 1.2e-38 coming out 0 is
    the price; a normal result whose intermediate is subnormal coming out 0 is a trap: SiLU(-90.5) =
    -90.5 e^-90.5 = -4.5e-38 is normal, e^-90.5 = 5e-40 is not, so v * e / (1 + e) gave -0 on an H200,
    245 bf16 ulps away (GELU-tanh 155 at x = -10.06). So these kernels never form e^-|z|: they take
    h = e^-|z|/2 (normal down to |z| = 174) and multiply v by h, 1 / (1 + h h) and h in turn, each
    partial product at least the answer (times_logistic), and tests/test_activations.py replays that
    arithmetic with a flush after every operation over all 65536 inputs. """

HALF_FAST = {  # what fastmath=True changes for each function, after FAST_MATH_HALVES
    "gelu": """There is no fast erfc: libdevice's erfcf stays (its divisions approximate); erfcf is
        the costliest function of the four, so this is where the arithmetic per byte is highest.""",
    "gelu_tanh": """Here math.exp becomes ex2.approx and the division 1 / (1 + h h) an approximate one;
        the flush, as above, would have cost the bf16 result at x = -10.06 (e^-88.8 = 2.8e-39 is
        subnormal, the answer -2.9e-38 is not).""",
    "silu": """Here math.exp becomes ex2.approx and the division 1 / (1 + h h) an approximate one;
        the flush, as above, would have cost the bf16 results for x from -91.5 to -87.5.""",
    "sigmoid": """Here math.exp becomes ex2.approx and the division 1 / (1 + e) an approximate one. The
        sigmoid does form e = e^-|z| (logistic), and here that is right: for z < 0 the result e / (1 + e)
        is smaller than e, so e is flushed only where the result is too (bf16 results below 1.2e-38
        come out 0). Not timed yet.""",
    "tanh": """Here math.tanh becomes one instruction, tanh.approx.f32, in place of libdevice's tanhf (an
        exp, a division and a polynomial). Its documented relative error, 2^-10.987, is not tens of
        float32 ulps but about a thousand: at most 0.13 of a bf16 step (the step is 2^-8 to 2^-7 of the
        result), so a result may be 0.63 steps from the exact answer instead of 0.5: still one of the
        two bf16 numbers around it, one step off only near a rounding tie (tests/test_activations.py
        replays the bound over all 65536 inputs: 0.62 at worst). Rounded to fp16 (a step of 2^-11 to
        2^-10 of the result) the same error is up to a whole step and the replay finds results 1.5
        steps away, which is no longer a rounding: activation[tanh,fp16] has no fast_math stage. Not timed yet.""",
}
# (function, format) with no fast_math stage although the function has one: why, at the end of in_flight's paragraph
NO_FAST_HALF = {("tanh", "float16"): """ activation[tanh,fp16] ends here: the fast_math stage of the others would swap tanhf for
    tanh.approx.f32, whose relative error of 2^-10.987 is up to a whole fp16 step (activation[tanh,bf16].fast_math
    keeps it: there it is 0.13 of a step)."""}
NOT_TIMED_NOTE = """ This operator has not been timed yet: the figures above are the other functions'."""

SHORT_ERFC = """
    A cheaper erfc, where a 16-bit result allows one. On an H200 at 2^28 the fast_math stage of GELU ran
    at 60% of torch's rate: libdevice's erfcf, a few dozen instructions with a branch, is the bottleneck
    once the bytes are halved, and fastmath=True leaves it as it is. Here it is replaced by erfc(z) = t
    exp(-z^2 + P(t)), t = 1 / (1 + |z|/2), P a degree-9 polynomial (the Chebyshev fit of Numerical
    Recipes' erfcc): one reciprocal, nine multiply-adds, one exp (ex2.approx under fastmath), and a
    relative error below 1.2e-7 for every z, the tail included, so GELU keeps its digits far below 0 as
    the erfcf form does. That is about 2 float32 ulps, plus ex2.approx's few: nothing in a fp16 result
    (2^-11 a step) or a bf16 one (2^-8), a little for a float32 one (activation[gelu].short_erfc
    weighs it). The accuracy is counted, not assumed: tests/test_activations.py takes every one of the 65536
    inputs of each format through the float32 arithmetic of this formula (within 0.501 ulp of the
    format: the rounding alone), and the GPU test and script take them through the kernel."""

HALF_SPECIALS = {  # the values random draws never hit, per format (float32's 3e38 is inf in fp16)
    "float16": [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, -65504.0, 6e-8, -6e-8, 1e-5, -10.0, -16.0,
                -20.0, 11.0, 300.0, -300.0],
    "bfloat16": [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-40, -1e-40, 1e-30, -20.0, -90.0,
                 -100.0, 20.0, 1e13, -1e13],
}


def _half_inputs(dtype):
    def make(size, rng):
        (n,) = size
        return ((3.0 * rng.standard_normal(n)).astype(np.float32).astype(dtype),)
    return make


def _half_adversarial(dtype):
    def make(size, rng):
        (x,) = _half_inputs(dtype)(size, rng)
        x[::3] = np.resize(np.array(HALF_SPECIALS[np.dtype(dtype).name], np.float32).astype(dtype), x[::3].size)
        return [("specials", (x,))]
    return make


def _half_validate(dtype):
    def validate(x, out):
        expect_device_array("x", x, dtype=dtype, ndim=1)
        expect_device_array("out", out, dtype=dtype, shape=tuple(x.shape))
    return validate


def _make_half_operator(act: Activation, dtype, rank: float) -> Operator:
    fmt = np.dtype(dtype).name
    short = short_name(dtype)
    op = Operator(
        name="activation", variant={"function": act.name, "dtype": short},
        title=f"{act.title}, {short}",
        reference=reference_of(act.name),
        make_inputs=_half_inputs(dtype),
        make_output=lambda size: np.empty(size, dtype),
        bytes_moved=lambda size: 4 * size[0],  # read 2 bytes, write 2, once each
        flops=lambda size, f=act.flops: f * size[0],
        validate=_half_validate(dtype),
        dtype=dtype,
        tolerance=lambda size, _: HALF_TOLERANCE[fmt],
        peer=_torch_peer(f"{act.torch_name} ({short})", act.torch_call),
        torch_expression=lambda torch, size, call=act.torch_call: lambda x: call(torch, x),
        adversarial_inputs=_half_adversarial(dtype),
        check_sizes=[1, 7, 1029, 65_543, 1_000_003],
        # quick: 203 (one block: the checked vector loop and a tail of 3); slow: 1 (the tail alone). The
        # unchecked four-vector body needs more than one 8192-half block: tests/test_activations.py runs it
        # (8395 halves cost seconds a stage in the simulator, too many for every stage of eight operators)
        sim_sizes=[1, 203],
        bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
        headline_size=(2**28,),
        rank=rank,
        group="Activations in fp16 and bf16: ReLU, Leaky ReLU, Sigmoid, Tanh, GELU, SiLU (float32 inside)",
    )
    namespace = dict(globals(), activation=act.device, **CONVERSIONS[np.dtype(dtype)])  # widen, narrow
    tag = f"{act.name}_{short}"
    namespace["_apply_word"] = instantiate(_apply_word, namespace, f"_apply_word_{tag}",
                                           jit={"device": True, "inline": True})
    for template in (_widened, _in_flight_halves):
        namespace[template.__name__] = instantiate(template, namespace, f"{template.__name__}_{tag}", jit={})
    fast = act.name in HALF_FAST and (act.name, fmt) not in NO_FAST_HALF
    in_flight_summary = IN_FLIGHT_HALVES + NO_FAST_HALF.get((act.name, fmt), "")
    in_flight_summary += NOT_TIMED_NOTE if act.name in NOT_TIMED_HALF else ""
    stages = [(widened, "widened", WIDENED), (in_flight_halves, "in_flight", in_flight_summary)]
    if fast:
        namespace["_in_flight_halves_fast"] = instantiate(_in_flight_halves, namespace,
                                                          f"_in_flight_halves_{tag}_fast", jit={"fastmath": True})
        stages.append((fast_math_halves, "fast_math", FAST_MATH_HALVES + HALF_FAST[act.name]))
    if act.name == "gelu":  # the same fast kernel with a cheaper erfc: a namespace of its own
        short = dict(namespace, activation=gelu_short_erfc)
        short["_apply_word"] = instantiate(_apply_word, short, f"_apply_word_{tag}_short",
                                           jit={"device": True, "inline": True})
        namespace["_in_flight_halves_short"] = instantiate(_in_flight_halves, short, f"_in_flight_halves_{tag}_short",
                                                           jit={"fastmath": True})
        stages.append((short_erfc_halves, "short_erfc", SHORT_ERFC))
    for launcher, name, summary in stages:
        op.stage(name, summary, dtype=np.float32)(instantiate(launcher, namespace, f"{name}_{tag}"))
    return op


HALF_OPERATORS = [_make_half_operator(act, dtype, 357 + 0.1 * k)
                  for k, (dtype, act) in enumerate((d, a) for d in HALF_FORMATS
                                                   for a in ACTIVATIONS if a.name in HALF_ACTIVATIONS)]
OPERATORS = FLOAT32_OPERATORS + HALF_OPERATORS
BY_NAME.update({o.name: o for o in HALF_OPERATORS})
