"""The float64 references and random inputs of the row and elementwise ladders, float32 and fp16/bf16 alike.

softmax.py, layernorm.py and elementwise.py judge their float32 stages with these and their fp16 and
bf16 variants' stages with the same ones (on the inputs widened to float64), and draw both from the
same generators; activations.py's GELU shares erfc64. They live here, not in one ladder, because a
ladder module that imports another gets no exercise: the grader refuses the answer key's modules while
it grades. ``gelu`` is the float32 device function every GELU kernel, float32 or 16-bit, calls.
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import cuda, float32

EPS = np.float32(1e-5)  # LayerNorm's and RMSNorm's eps; a float32 global: numba types it float32, no float64 creeps in


# -- softmax -----------------------------------------------------------------------------------------

def softmax64(x):
    """softmax of each row in float64, the row maximum subtracted first."""
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# -- LayerNorm and RMSNorm ---------------------------------------------------------------------------

def layernorm_rows(size, rng):
    """Random rows with their own mean and spread, and rows a careless kernel gets wrong."""
    rows, cols = size
    mean = rng.uniform(-2.0, 2.0, (rows, 1))
    std = rng.uniform(0.5, 2.0, (rows, 1))
    x = (mean + std * rng.standard_normal((rows, cols))).astype(np.float32)
    for r in range(0, rows, 8):  # mean 1e4, std 1: E[x^2] - E[x]^2 cancels catastrophically
        x[r] = (1e4 + rng.standard_normal(cols)).astype(np.float32)
    for r in range(3, rows, 8):  # constant: variance 0, the output must be exactly the bias
        x[r] = np.float32(rng.uniform(-100.0, 100.0))
    return x


def layernorm64(h, weight, bias):
    """LayerNorm of each row in float64: (h - mean) / sqrt(var + eps) * weight + bias."""
    h = h.astype(np.float64)
    mean = h.mean(axis=1, keepdims=True)
    var = ((h - mean) ** 2).mean(axis=1, keepdims=True)
    return (h - mean) / np.sqrt(var + float(EPS)) * weight.astype(np.float64) + bias.astype(np.float64)


def rmsnorm64(x, weight):
    """RMSNorm of each row in float64: x / sqrt(mean(x^2) + eps) * weight."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + float(EPS)) * weight.astype(np.float64)


# -- GELU(x + bias) + residual -----------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def gelu(v):
    """Exact GELU, in float32: math.erf on a float32 value calls libdevice's erff."""
    return float32(0.5) * v * (float32(1.0) + math.erf(v * float32(0.7071067811865476)))


def gelu_bias_residual_inputs(size, rng):
    rows, cols = size
    # x spans every regime of GELU: the linear right tail, the curved middle and the left tail where
    # it goes to -0 (x + bias reaches about +-7, where erf is saturated in float32). The residual is
    # positive and GELU is never below -0.17, so y stays >= 0.08: no sum cancels to near zero, where
    # a correct float32 result could miss the relative tolerance (a 1 x 1 check would then fail by chance).
    x = rng.uniform(-6.0, 6.0, (rows, cols)).astype(np.float32)
    bias = rng.uniform(-1.0, 1.0, cols).astype(np.float32)
    residual = rng.uniform(0.25, 1.25, (rows, cols)).astype(np.float32)
    return x, bias, residual


# Cephes (S. L. Moshier, public domain) rational approximations of erf and erfc: float64 to ~1e-16
# relative; numpy has no erf and the workbench does not depend on SciPy.
_ERF_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
          7.00332514112805075473e3, 5.55923013010394962768e4)
_ERF_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
          2.26290000613890934246e4, 4.92673942608635921086e4)
_ERFC_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
           4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
           9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_ERFC_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
           9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
           1.65666309194161350182e3, 5.57535340817727675546e2)
_ERFC_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
           6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_ERFC_S = (1.0, 2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
           1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0)


def _poly(coefficients, z):
    acc = np.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        acc *= z
        acc += c
    return acc


def erfc64(z: np.ndarray) -> np.ndarray:
    """erfc in float64, without the cancellation of 1 - erf(z) for large z."""
    a = np.abs(z)
    z_near = np.clip(z, -1.0, 1.0)  # the series is used for |z| <= 1 only: clipped, huge z cannot overflow it
    z2 = z_near * z_near
    near = 1.0 - z_near * _poly(_ERF_T, z2) / _poly(_ERF_U, z2)
    a_far = np.clip(a, 1.0, 27.0)  # erfc(27) underflows: clamp keeps exp() quiet
    tail = np.where(a_far < 8.0, _poly(_ERFC_P, a_far) / _poly(_ERFC_Q, a_far),
                    _poly(_ERFC_R, a_far) / _poly(_ERFC_S, a_far)) * np.exp(-a_far * a_far)
    tail = np.where(a > 27.0, 0.0, tail)
    far = np.where(z > 0, tail, 2.0 - tail)
    return np.where(a <= 1.0, near, far)


def gelu64(v: np.ndarray) -> np.ndarray:
    """Exact GELU in float64: v * Phi(v), Phi(v) = erfc(-v / sqrt 2) / 2 (accurate in both tails)."""
    out = np.empty_like(v)
    flat_in, flat_out = v.reshape(-1), out.reshape(-1)
    chunk = 1 << 16  # numpy releases the GIL: a 2^28-element reference takes seconds, not a minute

    def work(start):
        part = flat_in[start:start + chunk]
        flat_out[start:start + chunk] = part * (0.5 * erfc64(part * -np.sqrt(0.5)))

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(work, range(0, flat_in.size, chunk)))
    return out


def gelu_bias_residual64(x, bias, residual):
    """GELU(x + bias) + residual in float64."""
    return gelu64(x.astype(np.float64) + bias.astype(np.float64)) + residual
