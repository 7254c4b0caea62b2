"""The stencil ladder's register_tile stage where its own structure can break (strip boundaries and the
4-row halo between strips, the 16-byte chunk and thread boundaries, the image's edges, widths that are
not a multiple of 4, one pixel), its grid of one wave, its partial sums kept in registers (the PTX),
and (``-m gpu``) the issue's target: the last stage at >= 80% of the measured copy bandwidth at
8192 x 8192."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda

from solutions import stencil
from workbench.ladder import blocks_for

op = stencil.op
STRIP = 9  # the strip height the tests ask for: strips short enough to cross several in the simulator
COLS = stencil.COLS  # output columns a thread


def _run(img, w, **options):
    out = cuda.to_device(np.full(img.shape, np.nan, np.float32))  # an output never written stays NaN
    op["register_tile"].launch(cuda.to_device(img), cuda.to_device(w), out, **options)  # launch: takes strip=
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
    (4 * STRIP + 1, 1),  # one column, five strips: each thread's neighbours' chunks lie outside
    (2 * STRIP + 3, 2 * COLS + 4),  # the vector path across two strip boundaries; a last thread half outside
    (STRIP + 1, 2 * COLS + 3),  # a last strip of one row; a width that is not a multiple of 4
    (STRIP - 1, COLS),  # one strip, shorter than STRIP; one thread, every column its own
    (STRIP, 6),  # exactly one strip
])
@pytest.mark.parametrize("strip", [STRIP, 1, None])  # None: the launcher's own height (MIN_STRIP here)
def test_register_tile_matches_the_reference(size, strip):
    img, w = _inputs(*size)
    _assert_matches(_run(img, w, strip=strip), img, w)


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
    _assert_matches(_run(img, w, strip=STRIP), img, w)


def test_scalar_path_at_a_width_that_would_take_vectors(monkeypatch):
    """Arrays that do not start on a 16-byte boundary (a view into a buffer) take the one-pixel loads
    even when the width is a multiple of 4; the simulator's arrays always count as aligned, so the
    launcher's test is forced here."""
    monkeypatch.setattr(stencil, "rows_fit_vectors", lambda *arrays: False)
    img, w = _inputs(STRIP + 5, 2 * COLS + 4, seed=1)
    _assert_matches(_run(img, w, strip=STRIP), img, w)


def test_strips_fill_one_wave(monkeypatch):
    """The launcher's strip height on an H200 (132 SMs): the grid fits in one wave of 132 * BLOCKS_PER_SM
    blocks, covers every row, and no strip is shorter than MIN_STRIP."""
    monkeypatch.setattr(stencil, "sm_count", lambda: 132)
    slots = 132 * stencil.BLOCKS_PER_SM
    for rows, cols in [(8192, 8192), (16384, 16384), (4099, 8191), (100_003, 1), (1, 100_003), (1000, 1000), (3, 5)]:
        strands = blocks_for(cols, COLS)
        across = blocks_for(strands, min(stencil.STRIP_THREADS, 32 * blocks_for(strands, 32)))
        strip = stencil.strip_rows(rows, across)
        strips = blocks_for(rows, strip)
        assert strip >= stencil.MIN_STRIP
        assert across * strips <= max(slots, across), (rows, cols, strip, across * strips)
    # the headline fills the wave (COLS 8: 8 blocks across, 82 strips of 100 rows, 656 of 660 slots)
    across = 8192 // (COLS * stencil.STRIP_THREADS)
    assert across * blocks_for(8192, stencil.strip_rows(8192, across)) >= 0.95 * slots


_REGISTER_PTX = """
import re
import workbench
from numba import cuda, types
from solutions import stencil
from workbench.ladder import blocks_for
from workbench.ptxcheck import ptx_resources
flat, matrix = types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C")
ptx, _ = cuda.compile_ptx(stencil._register_tile.py_func,
                          (flat, matrix, flat, types.int64, types.int64, types.boolean, types.int64), cc=(9, 0),
                          launch_bounds=(stencil.STRIP_THREADS, stencil.BLOCKS_PER_SM))
print(len(re.findall(r"\\.local", ptx)), len(re.findall(r"fma\\.rn\\.f32", ptx)), ptx_resources(ptx)["spill_bytes"])
"""


@pytest.mark.sim_only
def test_partial_sums_and_weights_stay_in_registers():
    """The kernel's local arrays live in registers only if every loop over them unrolls (numba has no
    #pragma unroll): no local memory in the PTX, and the row loop's body holds all 25 * COLS
    multiply-adds. Nor may the register cap that BLOCKS_PER_SM sets (launch_bounds) make the assembler
    spill them. A COLS or BLOCKS_PER_SM too large fails here, not silently on the GPU."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _REGISTER_PTX], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    local, fmas, spilled = map(int, run.stdout.split()[-3:])
    assert local == 0, "local memory in _register_tile: a loop over a local array did not unroll"
    assert fmas == stencil.DIAMETER ** 2 * COLS, fmas
    assert spilled == 0, f"{spilled} bytes spilled under launch_bounds({stencil.STRIP_THREADS}, {stencil.BLOCKS_PER_SM})"


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
