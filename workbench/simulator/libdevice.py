"""``cuda.libdevice`` for numba's CUDA simulator.

On a GPU, numba compiles ``numba.cuda.libdevice.float_as_int(x)`` (or ``cuda.libdevice...``) to a call
into NVIDIA's libdevice. In the simulator the module holds only stubs that return None, and
``cuda.libdevice`` does not exist inside kernels, so a correct kernel that uses one fails there.
:func:`install` gives every function numba declares (``numba.cuda.libdevicefuncs.functions``, 317
of them) a Python body with libdevice's meaning: arguments converted to the declared types
(float32, int32, ...), the result returned in the declared type, pointer arguments returned as
extra results, as numba does (``sincos(x)`` returns ``(sin, cos)``).

The bodies are exact where libdevice is exact: the bit casts (``float_as_int``), integer
intrinsics (``mulhi``, ``byte_perm``, ``brev``, ...), conversions and arithmetic with an explicit
rounding mode (``fadd_rz``, ``double2float_rd``, ``float2int_ru``: computed with exact rational
arithmetic, then rounded as PTX rounds, with saturation for float-to-integer conversions). The
transcendental functions (``expf``, ``erfinv``, Bessel functions, ...) are computed in float64
and rounded to the declared type, which is at least as accurate as libdevice (a few ulp);
``fast_*`` variants, approximate on a GPU, are exact here. Nothing is left out, so nothing here
raises the ``unavailable`` error install() is given; it guards functions numba may add later.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

# -- types ---------------------------------------------------------------------------------------

_NUMPY_TYPES = {
    "float32": np.float32, "float64": np.float64, "int16": np.int16, "int32": np.int32, "int64": np.int64,
}


def convert(value, kind):
    """`value` as numba would pass it to a parameter of type `kind` (integers wrap to its width)."""
    if kind in (np.float32, np.float64):
        return kind(value)
    bits = np.dtype(kind).itemsize * 8
    wrapped = int(value) & ((1 << bits) - 1)
    if wrapped >= 1 << (bits - 1):
        wrapped -= 1 << bits
    return kind(wrapped)


def _unsigned(value, bits=32):
    return int(value) & ((1 << bits) - 1)


# -- rounding exact values as PTX does ------------------------------------------------------------

# (precision in bits, smallest normal exponent, largest exponent) of each float format.
_FORMATS = {np.float32: (24, -126, 127), np.float64: (53, -1022, 1023)}


def round_exact(value: Fraction, kind, mode: str, zero_negative: bool = False) -> float:
    """The float of type `kind` nearest to `value` in rounding mode rn, rz, ru or rd.

    Subnormals are kept (no flush to zero), overflow gives infinity or the largest finite value as
    the mode says. An exact zero gets the sign `zero_negative`; a value rounded to zero keeps its own.
    """
    precision, min_exponent, max_exponent = _FORMATS[kind]
    if value == 0:
        return -0.0 if zero_negative else 0.0
    negative = value < 0
    magnitude = -value if negative else value
    num, den = magnitude.numerator, magnitude.denominator
    exponent = num.bit_length() - den.bit_length()  # floor(log2(magnitude)), or one more
    if (num << max(-exponent, 0)) < (den << max(exponent, 0)):
        exponent -= 1
    quantum = max(exponent, min_exponent) - (precision - 1)  # the value of one unit in the last place
    scaled_num = num << max(-quantum, 0)
    scaled_den = den << max(quantum, 0)
    units, remainder = divmod(scaled_num, scaled_den)
    away = _rounds_away(mode, negative, units, 2 * remainder, scaled_den)
    units += away
    largest = ((1 << precision) - 1) << (max_exponent - precision + 1)
    result = math.ldexp(units, quantum) if units else 0.0
    if units and (units << max(quantum, 0)) > (largest << max(-quantum, 0)):
        overflow_to_infinity = mode == "rn" or (mode == "ru" and not negative) or (mode == "rd" and negative)
        result = math.inf if overflow_to_infinity else math.ldexp((1 << precision) - 1, max_exponent - precision + 1)
    return -result if negative else result


def _rounds_away(mode, negative, units, twice_remainder, scale):
    """1 if rounding moves the magnitude up to the next unit, else 0."""
    if twice_remainder == 0:
        return 0
    if mode == "rn":
        return int(twice_remainder > scale or (twice_remainder == scale and units % 2 == 1))
    if mode == "rz":
        return 0
    if mode == "ru":
        return int(not negative)
    return int(negative)  # rd


def _exact(x):
    return Fraction(float(x))


def _finite(*values):
    return all(math.isfinite(float(v)) for v in values)


def _signbit(x):
    return math.copysign(1.0, float(x)) < 0


def _add(kind, mode):
    def add(x, y):
        if not _finite(x, y):
            return np.float64(x) + np.float64(y)
        total = _exact(x) + _exact(y)
        if total == 0 and float(x) == 0 and float(y) == 0 and _signbit(x) == _signbit(y):
            return round_exact(total, kind, mode, _signbit(x))
        return round_exact(total, kind, mode, mode == "rd")
    return add


def _sub(kind, mode):
    add = _add(kind, mode)
    return lambda x, y: add(x, -np.float64(y))


def _mul(kind, mode):
    def mul(x, y):
        if not _finite(x, y):
            return np.float64(x) * np.float64(y)
        return round_exact(_exact(x) * _exact(y), kind, mode, _signbit(x) != _signbit(y))
    return mul


def _div(kind, mode):
    def div(x, y):
        if not _finite(x, y) or float(y) == 0:
            return np.float64(x) / np.float64(y)
        return round_exact(_exact(x) / _exact(y), kind, mode, _signbit(x) != _signbit(y))
    return div


def _rcp(kind, mode):
    div = _div(kind, mode)
    return lambda x: div(1.0, x)


def _fma(kind, mode):
    def fma(x, y, z):
        if not _finite(x, y, z):
            return np.float64(x) * np.float64(y) + np.float64(z)
        product = _exact(x) * _exact(y)
        total = product + _exact(z)
        if total == 0:
            product_negative = _signbit(x) != _signbit(y)
            if product == 0 and float(z) == 0 and product_negative == _signbit(z):
                return round_exact(total, kind, mode, product_negative)
            return round_exact(total, kind, mode, mode == "rd")
        return round_exact(total, kind, mode)
    return fma


def _sqrt_exact(value: Fraction, kind, mode):
    """sqrt(value) rounded as the mode says: an integer square root with enough extra bits, and a
    sticky bit when it is inexact."""
    precision = _FORMATS[kind][0]
    num, den = value.numerator, value.denominator
    # sqrt(num/den) = sqrt(num * den) / den; scale by 4^k so the root has precision + 3 bits at least
    product = num * den
    shift = max(0, (2 * (precision + 3) - product.bit_length()) // 2 + 1)
    scaled = product << (2 * shift)
    root = math.isqrt(scaled)
    exact = root * root == scaled
    numerator = 2 * root + (0 if exact else 1)  # halfway to the next integer: "a bit more than root"
    return round_exact(Fraction(numerator, 2 * den << shift), kind, mode)


def _sqrt(kind, mode):
    def sqrt(x):
        x = float(x)
        if math.isnan(x) or x < 0:
            return math.nan
        if x == 0 or math.isinf(x):
            return x
        return _sqrt_exact(Fraction(x), kind, mode)
    return sqrt


def _rsqrt_rn(x):
    x = float(x)
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return math.copysign(math.inf, x)
    if math.isinf(x):
        return 0.0
    return _sqrt_exact(1 / Fraction(x), np.float32, "rn")


# -- conversions -----------------------------------------------------------------------------------

_INTEGER_RANGES = {"int": (-(2**31), 2**31 - 1), "uint": (0, 2**32 - 1),
                   "ll": (-(2**63), 2**63 - 1), "ull": (0, 2**64 - 1)}
_TO_INTEGER = {"rn": lambda x: round(x), "rz": math.trunc, "ru": math.ceil, "rd": math.floor}


def _to_integer(target, mode):
    """float -> integer as PTX's cvt does: rounded as the mode says, saturated, NaN -> 0."""
    low, high = _INTEGER_RANGES[target]

    def to_integer(x):
        x = float(x)
        if math.isnan(x):
            return 0
        if math.isinf(x):
            return high if x > 0 else low
        return min(max(_TO_INTEGER[mode](x), low), high)
    return to_integer


def _from_integer(source, kind, mode):
    bits = 64 if source in ("ll", "ull") else 32
    signed = source in ("int", "ll")

    def from_integer(value):
        n = _unsigned(value, bits)
        if signed and n >= 1 << (bits - 1):
            n -= 1 << bits
        return round_exact(Fraction(n), kind, mode)
    return from_integer


def _narrow(mode):
    def narrow(x):
        if not _finite(x):
            return np.float32(x)
        return round_exact(_exact(x), np.float32, mode, _signbit(x))
    return narrow


def _bits_of(value, float_kind, int_kind):
    return np.array(value, dtype=float_kind).view(int_kind)[()]


def _float_of(value, int_kind, float_kind):
    return np.array(convert(value, int_kind), dtype=int_kind).view(float_kind)[()]


def _hiloint2double(hi, lo):
    bits = (_unsigned(hi) << 32) | _unsigned(lo)
    return np.array(bits, dtype=np.uint64).view(np.float64)[()]


# -- integer intrinsics ----------------------------------------------------------------------------

def _signed(n, bits=32):
    n &= (1 << bits) - 1
    return n - (1 << bits) if n >= 1 << (bits - 1) else n


def _brev(bits):
    return lambda x: int(format(_unsigned(x, bits), f"0{bits}b")[::-1], 2)


def _clz(bits):
    return lambda x: bits - _unsigned(x, bits).bit_length()


def _ffs(bits):
    def ffs(x):
        n = _unsigned(x, bits)
        return (n & -n).bit_length()
    return ffs


def _popc(bits):
    return lambda x: _unsigned(x, bits).bit_count()


def _byte_perm(x, y, selector):
    """__byte_perm: result byte i is byte (selector >> 4i) & 7 of the 8 bytes of y:x."""
    source = (_unsigned(y) << 32) | _unsigned(x)
    result = 0
    for i in range(4):
        pick = (_unsigned(selector) >> (4 * i)) & 7
        result |= ((source >> (8 * pick)) & 0xFF) << (8 * i)
    return result


def _mul24(signed):
    def mul24(x, y):
        a, b = _unsigned(x, 24), _unsigned(y, 24)
        if signed:
            a, b = _signed(a, 24), _signed(b, 24)
        return a * b
    return mul24


def _mulhi(bits, signed):
    def mulhi(x, y):
        a, b = (int(x), int(y)) if signed else (_unsigned(x, bits), _unsigned(y, bits))
        return (a * b) >> bits
    return mulhi


def _halving_add(signed, round_up):
    def halving_add(x, y):
        a, b = (int(x), int(y)) if signed else (_unsigned(x), _unsigned(y))
        return (a + b + (1 if round_up else 0)) >> 1
    return halving_add


def _sad(signed):
    def sad(x, y, z):
        a, b = (int(x), int(y)) if signed else (_unsigned(x), _unsigned(y))
        return abs(a - b) + _unsigned(z)
    return sad


def _unsigned_pick(pick):
    return lambda x, y: pick(_unsigned(x), _unsigned(y))


def _unsigned_pick64(pick):
    return lambda x, y: pick(_unsigned(x, 64), _unsigned(y, 64))


# -- special functions -----------------------------------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _erfcx(x):
    """exp(x^2) * erfc(x), without overflow for large x (an asymptotic series past 25)."""
    x = float(x)
    if math.isnan(x):
        return math.nan
    if x < 25:
        with np.errstate(over="ignore"):
            return float(np.exp(np.float64(x) * x) * math.erfc(x))
    inverse = 1 / (2 * x * x)
    term, total = 1.0, 1.0
    for k in range(1, 12):
        term *= -(2 * k - 1) * inverse
        total += term
    return total / (x * math.sqrt(math.pi))


def _erfcinv(y):
    """x with erfc(x) = y: Newton's method on log(erfc), which stays accurate for tiny y."""
    y = float(y)
    if math.isnan(y) or y < 0 or y > 2:
        return math.nan
    if y == 0:
        return math.inf
    if y == 2:
        return -math.inf
    if y > 1:
        return -_erfcinv(2 - y)
    if y == 1:
        return 0.0
    x = math.sqrt(-math.log(y)) if y < 0.5 else (1 - y) * math.sqrt(math.pi) / 2
    target = math.log(y)
    for _ in range(100):
        erfcx = _erfcx(x)
        step = (math.log(erfcx) - x * x - target) * math.sqrt(math.pi) * erfcx / -2
        x -= step
        if abs(step) <= 1e-16 * abs(x):
            break
    return x


def _erfinv(y):
    y = float(y)
    if math.isnan(y) or abs(y) > 1:
        return math.nan
    if abs(y) == 1:
        return math.copysign(math.inf, y)
    if abs(y) >= 0.5:
        return math.copysign(_erfcinv(1 - abs(y)), y)
    x = y * math.sqrt(math.pi) / 2
    for _ in range(100):
        step = (math.erf(x) - y) / (_TWO_OVER_SQRT_PI * math.exp(-x * x))
        x -= step
        if abs(step) <= 1e-17 * max(abs(x), 1e-300):
            break
    return x


def _gamma(function):
    def gamma(x):
        try:
            return function(float(x))
        except OverflowError:
            return math.inf
        except ValueError:  # a pole: 0 or a negative integer
            if function is math.lgamma:
                return math.inf
            return math.copysign(math.inf, float(x)) if float(x) == 0 else math.nan
    return gamma


def _bessel_j(n, x):
    """J_n(x): the power series where it does not cancel, else the trapezoid rule on Bessel's
    integral over a full period (which converges exponentially)."""
    n, x = int(n), float(x)
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return 0.0
    sign = 1.0
    if n < 0:
        n, sign = -n, (-1.0) ** n
    if (x / 2) ** 2 <= n + 1:
        half = x / 2
        term = half**n / math.factorial(n)
        total, k = 0.0, 0
        while True:
            total += term
            k += 1
            term *= -(half * half) / (k * (k + n))
            if abs(term) <= 1e-17 * abs(total) or k > 500:
                return sign * total
    points = int(2 * (abs(x) + n)) + 64
    tau = 2 * np.pi * np.arange(points) / points
    return sign * float(np.mean(np.cos(n * tau - x * np.sin(tau))))


def _bessel_y(n, x):
    """Y_n(x) from its integral representation, by Gauss-Legendre quadrature."""
    n, x = int(n), float(x)
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    if math.isinf(x):
        return 0.0
    sign = 1.0
    if n < 0:
        n, sign = -n, (-1.0) ** n
    nodes, weights = np.polynomial.legendre.leggauss(min(int(abs(x) + n) + 80, 2000))
    theta = (nodes + 1) * (np.pi / 2)
    first = np.pi / 2 * np.sum(weights * np.sin(x * np.sin(theta) - n * theta))
    end = 1.0
    while x * math.sinh(end) - n * end < 50:
        end *= 1.5
    t = (nodes + 1) * (end / 2)
    with np.errstate(over="ignore", under="ignore"):
        decay = np.exp(n * t - x * np.sinh(t)) + (-1) ** n * np.exp(-n * t - x * np.sinh(t))
        second = end / 2 * np.sum(weights * decay)
    return sign * float((first - second) / np.pi)


# -- plain float functions -------------------------------------------------------------------------

def _round_half_away(x):
    """round(): halfway cases away from zero (rint rounds them to even)."""
    x = float(x)
    if not math.isfinite(x):
        return x
    whole = float(math.trunc(x))
    if abs(x - whole) >= 0.5:
        whole += math.copysign(1.0, x)
    return math.copysign(whole, x)


def _ilogb(x):
    x = float(x)
    if x == 0 or math.isnan(x):
        return -(2**31)
    if math.isinf(x):
        return 2**31 - 1
    return math.frexp(x)[1] - 1


def _logb(x):
    x = float(x)
    if math.isnan(x):
        return x
    if x == 0:
        return -math.inf
    if math.isinf(x):
        return math.inf
    return float(math.frexp(x)[1] - 1)


def _remainder(x, y):
    try:
        return math.remainder(float(x), float(y))
    except ValueError:
        return math.nan


def _remquo(x, y):
    """(IEEE remainder, the quotient's sign and 3 low bits): all C's remquo promises."""
    remainder = _remainder(x, y)
    if not _finite(x, y, remainder) or float(y) == 0:
        return remainder, 0
    quotient = int((_exact(x) - Fraction(remainder)) / _exact(y))
    return remainder, abs(quotient) % 8 * (1 if quotient >= 0 else -1)


def _pi_scaled(function):
    """sin(pi x) or cos(pi x), reducing x modulo 2 exactly first."""
    def scaled(x):
        x = float(x)
        if not math.isfinite(x):
            return math.nan
        return function(math.pi * math.fmod(x, 2.0))
    return scaled


def _saturate(x):
    x = float(x)
    return 0.0 if math.isnan(x) else min(max(x, 0.0), 1.0)


def _fdim(x, y):
    if math.isnan(float(x)) or math.isnan(float(y)):
        return math.nan
    return np.float64(x) - np.float64(y) if x > y else 0.0


def _finite_test(test):
    return lambda x: int(test(float(x)))


def _llround(x):
    return _to_integer("ll", "rz")(_round_half_away(x))


_UNARY = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh, "atan": np.arctan,
    "atanh": np.arctanh, "cbrt": np.cbrt, "ceil": np.ceil, "cos": np.cos, "cosh": np.cosh,
    "cospi": _pi_scaled(math.cos), "erf": math.erf, "erfc": math.erfc, "erfcinv": _erfcinv,
    "erfcx": _erfcx, "erfinv": _erfinv, "exp": np.exp, "exp10": lambda x: np.power(10.0, np.float64(x)),
    "exp2": np.exp2, "expm1": np.expm1, "fabs": np.fabs, "floor": np.floor,
    "j0": lambda x: _bessel_j(0, x), "j1": lambda x: _bessel_j(1, x), "lgamma": _gamma(math.lgamma),
    "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2, "logb": _logb,
    "nearbyint": np.rint, "normcdf": lambda x: 0.5 * math.erfc(-float(x) / math.sqrt(2)),
    "normcdfinv": lambda p: -math.sqrt(2) * _erfcinv(2 * float(p)),
    "rcbrt": lambda x: 1 / np.cbrt(np.float64(x)), "rint": np.rint, "round": _round_half_away,
    "rsqrt": lambda x: 1 / np.sqrt(np.float64(x)), "sin": np.sin, "sinh": np.sinh,
    "sinpi": _pi_scaled(math.sin), "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh,
    "tgamma": _gamma(math.gamma), "trunc": np.trunc,
    "y0": lambda x: _bessel_y(0, x), "y1": lambda x: _bessel_y(1, x),
}

_BINARY = {
    "atan2": np.arctan2, "copysign": np.copysign, "fdim": _fdim, "fmax": np.fmax, "fmin": np.fmin,
    "fmod": np.fmod, "hypot": np.hypot, "nextafter": np.nextafter, "pow": np.power, "remainder": _remainder,
}


def _implementations():
    """Python bodies by libdevice name (without the __nv_ prefix)."""
    table = {}
    for name, function in _UNARY.items():
        table[name] = table[name + "f"] = lambda x, f=function: f(np.float64(x))
    for name, function in _BINARY.items():
        table[name] = lambda x, y, f=function: f(np.float64(x), np.float64(y))
    for name, function in _BINARY.items():  # nextafterf steps in float32, so these keep their type
        table[name + "f"] = lambda x, y, f=function: f(x, y) if f is np.nextafter else f(np.float64(x), np.float64(y))
    table.update({
        "fmaf": _fma(np.float32, "rn"), "fma": _fma(np.float64, "rn"), "saturatef": _saturate,
        "frexp": np.frexp, "frexpf": np.frexp, "modf": np.modf, "modff": np.modf,
        "remquo": _remquo, "remquof": _remquo,
        "sincos": lambda x: (np.sin(np.float64(x)), np.cos(np.float64(x))),
        "sincospi": lambda x: (_pi_scaled(math.sin)(x), _pi_scaled(math.cos)(x)),
        "ilogb": _ilogb, "ilogbf": _ilogb,
        "llrint": lambda x: _to_integer("ll", "rn")(x), "llrintf": lambda x: _to_integer("ll", "rn")(x),
        "llround": _llround, "llroundf": _llround,
        "isfinited": _finite_test(math.isfinite), "finitef": _finite_test(math.isfinite),
        "isinfd": _finite_test(math.isinf), "isinff": _finite_test(math.isinf),
        "isnand": _finite_test(math.isnan), "isnanf": _finite_test(math.isnan),
        "signbitd": _finite_test(lambda x: math.copysign(1.0, x) < 0),
        "signbitf": _finite_test(lambda x: math.copysign(1.0, x) < 0),
        "jn": _bessel_j, "jnf": _bessel_j, "yn": _bessel_y, "ynf": _bessel_y,
        "ldexp": lambda x, n: np.ldexp(x, int(n)), "ldexpf": lambda x, n: np.ldexp(x, int(n)),
        "scalbn": lambda x, n: np.ldexp(x, int(n)), "scalbnf": lambda x, n: np.ldexp(x, int(n)),
        "powi": lambda x, n: np.power(np.float64(x), float(n)),
        "powif": lambda x, n: np.power(np.float64(x), float(n)),
        # bit casts
        "float_as_int": lambda x: _bits_of(x, np.float32, np.int32),
        "int_as_float": lambda n: _float_of(n, np.int32, np.float32),
        "double_as_longlong": lambda x: _bits_of(x, np.float64, np.int64),
        "longlong_as_double": lambda n: _float_of(n, np.int64, np.float64),
        "double2hiint": lambda x: _unsigned(_bits_of(x, np.float64, np.int64), 64) >> 32,
        "double2loint": lambda x: _unsigned(_bits_of(x, np.float64, np.int64), 32),
        "hiloint2double": _hiloint2double,
        "float2half_rn": lambda x: np.array(x, dtype=np.float32).astype(np.float16).view(np.int16)[()],
        "half2float": lambda h: np.array(convert(h, np.int16)).view(np.float16).astype(np.float32)[()],
        "frsqrt_rn": _rsqrt_rn,
        # integers
        "abs": abs, "llabs": abs, "brev": _brev(32), "brevll": _brev(64), "byte_perm": _byte_perm,
        "clz": _clz(32), "clzll": _clz(64), "ffs": _ffs(32), "ffsll": _ffs(64),
        "popc": _popc(32), "popcll": _popc(64),
        "hadd": _halving_add(True, False), "rhadd": _halving_add(True, True),
        "uhadd": _halving_add(False, False), "urhadd": _halving_add(False, True),
        "max": lambda x, y: max(int(x), int(y)), "min": lambda x, y: min(int(x), int(y)),
        "llmax": lambda x, y: max(int(x), int(y)), "llmin": lambda x, y: min(int(x), int(y)),
        "umax": _unsigned_pick(max), "umin": _unsigned_pick(min),
        "ullmax": _unsigned_pick64(max), "ullmin": _unsigned_pick64(min),
        "mul24": _mul24(True), "umul24": _mul24(False),
        "mulhi": _mulhi(32, True), "umulhi": _mulhi(32, False),
        "mul64hi": _mulhi(64, True), "umul64hi": _mulhi(64, False),
        "sad": _sad(True), "usad": _sad(False),
    })
    for fast in ("cosf", "exp10f", "expf", "log10f", "log2f", "logf", "powf", "sincosf", "sinf", "tanf"):
        table["fast_" + fast] = table[fast] if fast != "sincosf" else table["sincos"]
    table["sincosf"] = table["sincos"]
    table["sincospif"] = table["sincospi"]
    table["fast_fdividef"] = lambda x, y: np.float64(x) / np.float64(y)
    for mode in ("rn", "rz", "ru", "rd"):
        for prefix, kind in (("d", np.float64), ("f", np.float32)):
            table[f"{prefix}add_{mode}"] = _add(kind, mode)
            table[f"{prefix}mul_{mode}"] = _mul(kind, mode)
            table[f"{prefix}div_{mode}"] = _div(kind, mode)
            table[f"{prefix}rcp_{mode}"] = _rcp(kind, mode)
            table[f"{prefix}sqrt_{mode}"] = _sqrt(kind, mode)
        table[f"fsub_{mode}"] = _sub(np.float32, mode)
        table[f"fma_{mode}"] = _fma(np.float64, mode)
        table[f"fmaf_{mode}"] = _fma(np.float32, mode)
        table[f"double2float_{mode}"] = _narrow(mode)
        for source in ("double", "float"):
            for target in ("int", "uint", "ll", "ull"):
                table[f"{source}2{target}_{mode}"] = _to_integer(target, mode)
        for source in ("int", "uint", "ll", "ull"):
            table[f"{source}2float_{mode}"] = _from_integer(source, np.float32, mode)
            table[f"{source}2double_{mode}"] = _from_integer(source, np.float64, mode)
    return table


IMPLEMENTATIONS = _implementations()


# -- installing ------------------------------------------------------------------------------------

def _type_name(numba_type):
    return str(numba_type)


def make_function(name, return_type, arguments, unavailable=RuntimeError):
    """A Python function with libdevice function `name`'s signature and meaning."""
    takes = [_NUMPY_TYPES[_type_name(a.ty)] for a in arguments if not a.is_ptr]
    gives = ([] if _type_name(return_type) == "none" else [_NUMPY_TYPES[_type_name(return_type)]])
    gives += [_NUMPY_TYPES[_type_name(a.ty)] for a in arguments if a.is_ptr]
    body = IMPLEMENTATIONS.get(name)
    signature = f"{name}({', '.join(t.__name__ for t in takes)})"

    def function(*values):
        if body is None:
            raise unavailable(f"libdevice.{name} has no simulator version: run this kernel on a GPU")
        if len(values) != len(takes):
            raise TypeError(f"libdevice.{signature} takes {len(takes)} argument(s), got {len(values)}")
        with np.errstate(all="ignore"):
            result = body(*(convert(value, kind) for value, kind in zip(values, takes)))
            if len(gives) == 1:
                return convert(result, gives[0])
            return tuple(convert(part, kind) for part, kind in zip(result, gives))

    function.__name__ = name
    function.__qualname__ = name
    function.__doc__ = f"libdevice's __nv_{name}, in Python for the simulator: {signature}."
    return function


def install(unavailable=RuntimeError):
    """Give every stub of ``numba.cuda.libdevice`` a body (in place); return the module.

    `unavailable` is the exception a function without a simulator version raises (none today).
    """
    from numba.cuda import libdevice
    from numba.cuda.libdevicefuncs import functions

    for long_name, (return_type, arguments) in functions.items():
        name = long_name[len("__nv_"):]
        setattr(libdevice, name, make_function(name, return_type, arguments, unavailable))
    return libdevice
