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


# -- vector_tile: 16-byte loads and stores, and the fallback to big_tile --------------------------------

def _launched(stage, x_host, x_device=None, out=None):
    """Run ``stage`` on x; (the kernels it launched, by name; whether out == x.T exactly)."""
    from workbench.simulator import record_launches

    x_device = cuda.to_device(x_host) if x_device is None else x_device
    out = cuda.to_device(np.full(x_host.shape[::-1], np.nan, np.float32)) if out is None else out
    with record_launches() as launches:
        op[stage](x_device, out)
    return [f.__name__ for f, _ in launches], np.array_equal(out.copy_to_host(), x_host.T)


def _distinct(rows, cols):
    return (np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) * np.float32(0.5) + 1).astype(np.float32)


@pytest.mark.sim_only
@pytest.mark.parametrize("rows, cols", [
    (1, 1), (5, 3), (67, 130), (130, 67), (1, 37), (37, 1), (3, 2),  # a row not whole vectors: big_tile's kernel
    (1, 4), (1, 132), (3, 8), (67, 132), (130, 68),  # rows % 4 != 0: vector loads, scalar stores
    (4, 4), (36, 68), (68, 132), (132, 68), (64, 64), (128, 260),  # vectors both ways, tiles ragged or whole
])
def test_vector_tile_exact_at_awkward_shapes_and_picks_its_kernel(rows, cols):
    kernels, right = _launched("vector_tile", _distinct(rows, cols))
    assert right, (rows, cols)
    assert kernels == (["_vector_tile"] if cols % 4 == 0 else ["_big_tile"]), (rows, cols, kernels)


@pytest.mark.sim_only
def test_vector_tile_falls_back_when_an_array_is_misaligned(monkeypatch):
    """The simulator counts every array as aligned (_vector_io.aligned16), so the host test is made to
    say no: the launcher must then take big_tile's kernel, and be right. On a GPU, the real thing:
    test_vector_tile_right_on_a_misaligned_view_on_the_gpu."""
    x = _distinct(68, 132)
    seen = []
    monkeypatch.setattr(transpose, "aligned16", lambda *arrays: seen.append(len(arrays)) or False)
    kernels, right = _launched("vector_tile", x)
    assert right and kernels == ["_big_tile"] and seen == [2]  # asked about x and out both


def _misaligned_views(rows, cols):
    """x and out as views starting 4 bytes past a fresh allocation (so not on a 16-byte boundary)."""
    x = _distinct(rows, cols)
    x_buffer = cuda.to_device(np.concatenate([[np.float32(7)], x.ravel()]))
    out_buffer = cuda.to_device(np.full(rows * cols + 1, np.nan, np.float32))
    return x, x_buffer[1:].reshape(rows, cols), out_buffer[1:].reshape(cols, rows)


def test_vector_tile_right_on_a_misaligned_view():
    x, x_view, out_view = _misaligned_views(36, 68)
    op["vector_tile"](x_view, out_view)
    np.testing.assert_array_equal(out_view.copy_to_host(), x.T)


@pytest.mark.gpu
def test_vector_tile_right_on_a_misaligned_view_on_the_gpu():
    x, x_view, out_view = _misaligned_views(1000, 4100)
    assert not transpose.vector_tile_fits(x_view, out_view)
    op["vector_tile"](x_view, out_view)
    np.testing.assert_array_equal(out_view.copy_to_host(), x.T)


@pytest.mark.sim_only
@pytest.mark.parametrize("group", [2, 3, 8])
def test_vector_tile_grouped_block_order_covers_every_tile(monkeypatch, group):
    """GROUP > 1 (a sweep's setting) walks GROUP tile rows column by column; 5 tile rows leave a last
    group shorter than the others."""
    monkeypatch.setattr(transpose, "GROUP", group)
    kernels, right = _launched("vector_tile", _distinct(260, 200))
    assert right and kernels == ["_vector_tile"]


@pytest.mark.sim_only
def test_vector_tile_moves_16_bytes_a_lane_and_its_shared_accesses_do_not_conflict():
    """In the simulator's counters: every global request 16 whole sectors (512 bytes a warp), every
    shared request one wavefront (a warp takes 8 vectors of 4 rows, the tile rows are VTILE + 1 long)."""
    from workbench.simulator.counters import counting

    x = _distinct(128, 256)
    with counting() as launches:
        kernels, right = _launched("vector_tile", x)
    assert right and kernels == ["_vector_tile"]
    (counters,) = launches
    for kind in ("load", "store"):
        moved = counters.total("global", kind)
        assert moved.requests == x.size // (4 * 32) and moved.sectors == 16 * moved.requests, kind
        shared = counters.total("shared", kind)
        assert shared.requests == x.size // 32 and shared.wavefronts == shared.requests, kind


_VECTOR_PTX = """
import re
import workbench
from numba import cuda, types
from solutions import transpose
a1 = types.Array(types.float32, 1, "C")
ptx, _ = cuda.compile_ptx(transpose._vector_tile.py_func, (a1, a1, types.int64, types.int64), cc=(9, 0))
for pattern in (r"shr\\.s64", r"ld\\.global\\.v4\\.f32", r"st\\.global\\.v4\\.f32", r"ld\\.global\\.f32"):
    print(len(re.findall(pattern, ptx)))
"""


@pytest.mark.sim_only
def test_vector_tile_ptx_has_vector_accesses_and_no_signed_index_tests():
    """For sm_90: VECTORS 16-byte loads and as many 16-byte stores (the kernel's rows % 4 == 0 path),
    no 4-byte global load, and no negative-index test (every index a uint64)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _VECTOR_PTX], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    signed, loads, stores, scalar_loads = map(int, run.stdout.split())
    assert (signed, loads, stores, scalar_loads) == (0, transpose.VECTORS, transpose.VECTORS, 0)
