"""The stencil ladder's register_tile stage where its own structure can break (strip boundaries and the
4-row halo between strips, the 16-byte chunk and thread boundaries, the image's edges, widths that are
not a multiple of 4, one pixel, images taller than one launch's grid), its partial sums kept in
registers (the PTX), and (``-m gpu``) the issue's target: the last stage at >= 80% of the measured copy
bandwidth at 8192 x 8192."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda

from solutions import stencil

op = stencil.op
STRIP = stencil.STRIP
COLS = stencil.COLS  # output columns a thread


def _run(stage, img, w):
    out = cuda.to_device(np.full(img.shape, np.nan, np.float32))  # an output never written stays NaN
    op[stage](cuda.to_device(img), cuda.to_device(w), out)
    return out.copy_to_host()


def _assert_matches(got, img, w):
    ref = stencil._reference(img, w)
    assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} outputs never written"
    bad = ~np.isclose(got, ref, rtol=1e-5, atol=1e-5)
    assert not bad.any(), f"wrong at (row, col) {np.argwhere(bad)[:8].tolist()}"


def _inputs(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1.0, 2.0, (rows, cols)).astype(np.float32),
            rng.uniform(-1.0, 1.0, (5, 5)).astype(np.float32))


@pytest.mark.parametrize("size", [
    (1, 1),  # one pixel: every tap but the centre is outside
    (1, 9), (2, 4),  # one and two rows: the halo rows above and below are all outside
    (70, 1),  # one column, three strips: each thread's neighbours' chunks lie outside
    (2 * STRIP + 3, 2 * COLS + 4),  # the vector path across two strip boundaries; a last thread half outside
    (STRIP + 1, 2 * COLS + 3),  # a last strip of one row; a width that is not a multiple of 4
    (max(STRIP - 1, 1), COLS),  # one strip, shorter than STRIP; one thread, every column its own
    (STRIP, 6),  # exactly one strip
])
def test_register_tile_matches_the_reference(size):
    img, w = _inputs(*size)
    _assert_matches(_run("register_tile", img, w), img, w)


@pytest.mark.parametrize("cols", [2 * COLS + 4, 2 * COLS + 3])
def test_impulses_at_strip_chunk_and_image_boundaries(cols):
    """Single bright pixels on the rows either side of a strip boundary, on both sides of a 4-column
    chunk boundary and in the corners: each output patch must be w read backwards around its pixel, so
    a halo row taken from the wrong strip, a neighbour's columns from the wrong chunk or thread, or a
    clamped edge shows at an exact place."""
    rows = 2 * STRIP + 2
    img = np.zeros((rows, cols), np.float32)
    for r, c in [(0, 0), (STRIP - 2, 3), (STRIP - 1, 4), (STRIP, COLS - 1), (STRIP + 1, COLS), (STRIP + 3, COLS + 1),
                 (2 * STRIP, cols - 1), (rows - 1, cols - 1), (rows - 1, 0)]:
        img[r, c] = 1.0 + r + 0.5 * c  # distinct heights, so two impulses swapped would show
    w = np.arange(1, 26, dtype=np.float32).reshape(5, 5) / 25  # no symmetry: a flip or transpose shows
    _assert_matches(_run("register_tile", img, w), img, w)


def test_scalar_path_at_a_width_that_would_take_vectors(monkeypatch):
    """Arrays that do not start on a 16-byte boundary (a view into a buffer) take the one-pixel loads
    even when the width is a multiple of 4; the simulator's arrays always count as aligned, so the
    launcher's test is forced here."""
    monkeypatch.setattr(stencil, "rows_fit_vectors", lambda *arrays: False)
    img, w = _inputs(STRIP + 5, 2 * COLS + 4, seed=1)
    _assert_matches(_run("register_tile", img, w), img, w)


def test_an_image_taller_than_one_grid_takes_several_launches(monkeypatch):
    """gridDim.y is limited (65535 strips, 2 million rows): beyond it the launcher launches again from
    the next strip on. With the limit set to 2, five strips take three launches."""
    monkeypatch.setattr(stencil, "MAX_GRID_Y", 2)
    launches = []
    kernel = stencil._register_tile

    class Counting:
        def __getitem__(self, config):
            launches.append(config)
            return kernel[config]

    monkeypatch.setattr(stencil, "_register_tile", Counting())
    img, w = _inputs(4 * STRIP + 3, 5, seed=2)
    _assert_matches(_run("register_tile", img, w), img, w)
    assert [blocks[1] for blocks, _ in launches] == [2, 2, 1]


_REGISTER_PTX = """
import re
import workbench
from numba import cuda, types
from solutions import stencil
flat, matrix = types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C")
ptx, _ = cuda.compile_ptx(stencil._register_tile.py_func,
                          (flat, matrix, flat, types.int64, types.int64, types.boolean, types.int64), cc=(9, 0))
print(len(re.findall(r"\\.local", ptx)), len(re.findall(r"fma\\.rn\\.f32", ptx)))
"""


@pytest.mark.sim_only
def test_partial_sums_and_weights_stay_in_registers():
    """The kernel's local arrays live in registers only if every loop over them unrolls (numba has no
    #pragma unroll): no local memory in the PTX, and the row loop's body holds all 25 * COLS
    multiply-adds. A COLS too large for the compiler to unroll fails here, not silently on the GPU."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _REGISTER_PTX], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    local, fmas = map(int, run.stdout.split()[-2:])
    assert local == 0, "local memory in _register_tile: a loop over a local array did not unroll"
    assert fmas == stencil.DIAMETER ** 2 * COLS, fmas


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_must_show():
    """At 8192 x 8192 (8 bytes a pixel: the image read once, the output written once) the last stage
    runs at >= 80% of the copy bandwidth measured now, on this GPU."""
    from tests.headline import headline

    peaks, stages, _ = headline(op)
    last = stages[-1]
    assert last["gbps"] >= 0.80 * peaks["copy_gbps"], (
        [(r["stage"], round(r["median_us"], 1), round(r["gbps"])) for r in stages], peaks["copy_gbps"])
