"""The elementwise ladder (GELU(x + bias) + residual): every stage correct in the simulator, compilable for
sm_90 in float32, bad input refused, and (on a GPU) fast."""

import numpy as np
import pytest
from numba import cuda

from solutions import elementwise
from workbench.check import check_stage
from workbench.ladder import InputError

op = elementwise.op
STAGES = [s.name for s in op.stages]


def _run(stage, x, bias, residual):
    out = cuda.to_device(np.full(x.shape, np.nan, np.float32))
    stage(cuda.to_device(x), cuda.to_device(bias), cuda.to_device(residual), out)
    return out.copy_to_host()


@pytest.mark.parametrize("stage", STAGES)
def test_tails_and_zero_of_gelu(stage):
    """GELU's regimes side by side in one row: far left (-> -0), zero, far right (-> identity), and a
    residual that dominates where GELU vanishes."""
    x = np.array([[-30.0, -8.0, -3.0, -0.5, 0.0, 1e-6, 0.5, 3.0, 8.0, 30.0, -1.0]], np.float32)
    bias = np.zeros(x.shape[1], np.float32)
    bias[-1] = 1.0  # x + bias = 0 exactly: GELU(0) = 0
    residual = np.linspace(-1, 1, x.size, dtype=np.float32).reshape(x.shape)
    got = _run(op[stage], x, bias, residual)
    ref = op.reference(x, bias, residual)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6)


def test_reference_matches_math_erfc():
    import math

    from solutions._references import gelu64

    v = np.concatenate([np.linspace(-12, 12, 2401), [-40.0, 0.0, 40.0, 1e-8]])
    # GELU(v) = v (1 + erf(v / sqrt 2)) / 2 = v erfc(-v / sqrt 2) / 2: the second form keeps the left tail
    exact = np.array([0.5 * t * math.erfc(-t / math.sqrt(2)) for t in v])
    np.testing.assert_allclose(gelu64(v), exact, rtol=1e-13, atol=1e-300)


def test_wide_matrices_take_several_launches(monkeypatch):
    """The 2-D stages split columns across launches when the y grid would pass 65535 blocks."""
    monkeypatch.setattr(elementwise, "MAX_GRID_Y", 2)  # 2 blocks of 16 columns per launch
    for stage in ("unfused", "fused"):
        result = check_stage(op[stage], (3, 101))
        assert result.passed, result.message


def _good(rows=4, cols=5):
    rng = np.random.default_rng(0)
    x, bias, residual = op.make_inputs((rows, cols), rng)
    return [cuda.to_device(x), cuda.to_device(bias), cuda.to_device(residual),
            cuda.to_device(np.empty((rows, cols), np.float32))]


@pytest.mark.parametrize("which, bad, match", [
    (0, lambda: cuda.to_device(np.ones(20, np.float32)), "x must be 2-D"),
    (0, lambda: cuda.to_device(np.ones((4, 5), np.float64)), "x must have dtype float32"),
    (0, lambda: np.ones((4, 5), np.float32), "x is a host"),
    (0, lambda: cuda.to_device(np.ones((5, 4), np.float32).T), "x must be C-contiguous"),
    (1, lambda: cuda.to_device(np.ones(4, np.float32)), r"bias must have shape \(5,\)"),
    (1, lambda: cuda.to_device(np.ones((1, 5), np.float32)), r"bias must have shape \(5,\)"),
    (2, lambda: cuda.to_device(np.ones((5, 4), np.float32)), r"residual must have shape \(4, 5\)"),
    (2, lambda: cuda.to_device(np.ones((4, 5), np.int32)), "residual must have dtype float32"),
    (3, lambda: cuda.to_device(np.ones((4, 6), np.float32)), r"out must have shape \(4, 5\)"),
    (3, lambda: np.ones((4, 5), np.float32), "out is a host"),
])
def test_bad_input_is_refused_with_a_clear_error(which, bad, match):
    args = _good()
    args[which] = bad()
    with pytest.raises(InputError, match=match):
        op.stages[-1](*args)


def test_bytes_models():
    assert op.bytes_moved((16384, 16384)) == 4 * (3 * 2**28 + 16384)
    assert op["unfused"].traffic((16384, 16384)) == 4 * (7 * 2**28 + 16384)
    assert all(s.traffic((8, 8)) == op.bytes_moved((8, 8)) for s in op.stages[1:])


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_must_show():
    """At 16384 x 16384: each stage faster than the one before, the last >= 85% of measured copy
    bandwidth (counting the op's minimum 12 bytes per element) and >= 2.5x the three-kernel chain."""
    from tests.headline import headline

    peaks, stages, _ = headline(op)
    times = [r["median_us"] for r in stages]
    assert all(a > b for a, b in zip(times, times[1:])), times
    assert stages[-1]["gbps"] >= 0.85 * peaks["copy_gbps"]
    assert times[0] >= 2.5 * times[-1]


_UNSIGNED_PTX = """
import re, sys
import workbench
from numba import cuda, types
from solutions import elementwise
a1 = types.Array(types.float32, 1, "C")
ptx, _ = cuda.compile_ptx(elementwise._ilp8_unsigned.py_func, (a1, a1, a1, a1), cc=(9, 0))
print(len(re.findall(r"shr\\.s64", ptx)))
"""


@pytest.mark.sim_only
def test_last_stage_indices_stay_unsigned():
    """A signed index brings back numba's negative-index test (shr.s64 by 63, and, add) on every
    access: the last stage's PTX must have none."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _UNSIGNED_PTX], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "0", "signed 64-bit index arithmetic in _ilp8_unsigned"
