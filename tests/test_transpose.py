"""The transpose ladder: every stage correct in the simulator on odd and degenerate shapes, compilable for
sm_90 in float32, bad input refused, and (on a GPU) fast."""

import numpy as np
import pytest
from numba import cuda

from solutions import transpose
from workbench.ladder import InputError

op = transpose.op
STAGES = [s.name for s in op.stages]


@pytest.mark.parametrize("stage", STAGES)
def test_exact_and_distinct_values(stage):
    """Every element distinct, so any swapped or repeated index shows; a transpose must be exact."""
    x = (np.arange(9 * 70, dtype=np.float32).reshape(9, 70) * np.float32(1.5) + 1).astype(np.float32)
    out = cuda.to_device(np.full((70, 9), np.nan, np.float32))
    op[stage](cuda.to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), x.T)


def test_tiles_cover_the_matrix():
    for rows, cols in [(1, 1), (1, 37), (37, 1), (33, 65), (64, 64), (65, 33)]:
        assert transpose._tiles(rows, cols, 32) == -(-rows // 32) * -(-cols // 32)
        assert transpose._tiles(rows, cols, 8) == -(-rows // 8) * -(-cols // 32)


def _good(rows=4, cols=5):
    return [cuda.to_device(np.ones((rows, cols), np.float32)), cuda.to_device(np.empty((cols, rows), np.float32))]


@pytest.mark.parametrize("which, bad, match", [
    (0, lambda: cuda.to_device(np.ones(20, np.float32)), "x must be 2-D"),
    (0, lambda: cuda.to_device(np.ones((4, 5), np.float64)), "x must have dtype float32"),
    (0, lambda: np.ones((4, 5), np.float32), "x is a host"),
    (0, lambda: cuda.to_device(np.ones((5, 4), np.float32).T), "x must be C-contiguous"),
    (1, lambda: cuda.to_device(np.empty((4, 5), np.float32)), r"out must have shape \(5, 4\)"),
    (1, lambda: cuda.to_device(np.empty((5, 4), np.float64)), "out must have dtype float32"),
    (1, lambda: np.empty((5, 4), np.float32), "out is a host"),
])
def test_bad_input_is_refused_with_a_clear_error(which, bad, match):
    args = _good()
    args[which] = bad()
    with pytest.raises(InputError, match=match):
        op.stages[-1](*args)


@pytest.fixture
def headline():
    """Every stage timed at 16384 x 16384 in one run (once per process: tests.headline caches it), with the
    measured copy bandwidth. Function-scoped so that it runs under the timing lock (tests/conftest.py)."""
    from tests.headline import headline as measure_headline

    peaks, stages, _ = measure_headline(op)
    return peaks, stages


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_each_stage_faster_and_beats_torch(headline):
    """At 16384 x 16384: each stage faster than the one before, the last >= 2.5x torch's
    x.t().contiguous()."""
    from workbench import library_peers
    from workbench.timing import measure

    _, stages = headline
    times = [r["median_us"] for r in stages]
    assert all(a > b for a, b in zip(times, times[1:])), times
    torch = library_peers.torch()
    if torch is not None:
        x = torch.rand(op.headline_size, device="cuda")
        contiguous = measure(lambda a: a.t().contiguous(), [(x,)])
        assert contiguous.median_us >= 2.5 * times[-1]


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_last_stage_at_85_percent_of_copy(headline):
    peaks, stages = headline
    assert stages[-1]["gbps"] >= 0.85 * peaks["copy_gbps"], (stages[-1]["gbps"], peaks["copy_gbps"])


_UNSIGNED_PTX = """
import re
import workbench
from numba import cuda, types
from solutions import transpose
a2 = types.Array(types.float32, 2, "C")
for kernel in (transpose._unsigned, transpose._big_tile):
    ptx, _ = cuda.compile_ptx(kernel.py_func, (a2, a2), cc=(9, 0))
    print(len(re.findall(r"shr\\.s64", ptx)))
"""


@pytest.mark.sim_only
def test_unsigned_stages_have_no_negative_index_tests():
    """A signed index brings back numba's negative-index test (shr.s64 by 63, and, add) on every
    access: the unsigned stages' PTX must have none."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _UNSIGNED_PTX], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["0", "0"], "signed 64-bit index arithmetic in an unsigned stage"
