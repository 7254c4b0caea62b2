"""decode_attention's last stage, ``async_ring`` (cp.async copies into a ring of shared memory): a block that
takes many steps of keys, so that its ring wraps (the ladder's check sizes give each block one or two steps),
at group sizes 1, 2, 3 and 8, batch != heads and a last step cut short; the grid and the bytes at the headline; the
kernels compiled for sm_90 (slow). Every stage at the simulator and check sizes is tested by tests/test_ladders.py."""

from __future__ import annotations

import numpy as np
import pytest

from solutions import decode_attention as da
from workbench.check import adversarial_cases, check_stage
from workbench.ladder import blocks_for

HEADLINE = da.op.headline_size  # 16 x 32 x 32 x 8192 x 128
H200_SMS = 132
SHARED_PER_SM = 228 * 1024  # an H100/H200 multiprocessor's shared memory, 1 KiB of it reserved per block


@pytest.mark.sim_only
@pytest.mark.parametrize("size", [  # one in the quick tier (4 s), the others 7-15 s each in the slow tier
    pytest.param((1, 4, 2, 333, 16), id="group-2-11-steps", marks=pytest.mark.slow),
    pytest.param((2, 1, 1, 200, 128), id="group-1-D128-batch-2", marks=pytest.mark.slow),
    pytest.param((1, 3, 1, 150, 8), id="group-3-D8"),
    pytest.param((1, 8, 1, 180, 16), id="group-8", marks=pytest.mark.slow)])
def test_async_ring_wraps_its_ring(size, monkeypatch):
    """One split per head (one block takes every key), so each block's ring of RING_STEPS steps is refilled
    several times and its last step is cut short: a copy waited for too early, or put in the wrong slot,
    reads stale bytes (the simulator lands a cp.async only when its group is waited for)."""
    monkeypatch.setattr(da, "WIDE_BLOCKS_PER_SM", 0)  # fewest splits: one
    B, Hq, Hkv, S, D = size
    assert da._wide_splits(B * Hkv, S) == (1, da.STEP_KEYS * blocks_for(S, da.STEP_KEYS))
    assert blocks_for(S, da.STEP_KEYS) > da.RING_STEPS and S % da.STEP_KEYS
    rng = np.random.default_rng(33)
    st = da.op["async_ring"]
    results = [check_stage(st, size, rng)]
    results += [check_stage(st, size, inputs=i, label=l) for l, i in adversarial_cases(da.op, size, rng)]
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


@pytest.mark.sim_only
def test_async_ring_takes_a_head_size_not_a_multiple_of_8():
    """cp.async copies 16 aligned bytes: D = 20 takes stage 3's kernel, and is still right."""
    r = check_stage(da.op["async_ring"], (1, 2, 1, 5, 20), np.random.default_rng(5))
    assert r.passed, r.message


def test_async_ring_grid_fills_the_h200_at_the_headline():
    """At the headline, every multiprocessor of an H200 gets its full share of resident blocks (as many as
    its shared memory holds) several times over, and every block's chunk is deeper than its ring."""
    B, Hq, Hkv, S, D = HEADLINE
    splits, chunk = da._wide_splits(B * Hkv, S)  # the simulated device has 132 multiprocessors, as an H200
    resident = SHARED_PER_SM // (da.RING_BYTES + da.merge_shared_bytes(Hq // Hkv) + 1024)
    assert resident == 3
    assert splits * B * Hkv >= 4 * resident * H200_SMS, (splits, chunk)
    assert chunk >= 2 * da.RING_STEPS * da.STEP_KEYS and splits * chunk >= S > (splits - 1) * chunk


def test_async_ring_counts_the_cache_once():
    """Its bytes are the operator's: K and V once per KV head, plus q and out (2 bytes each); the partials
    (B Hq splits (D + 2) floats, written and read once: 0.2% more at the headline) are not counted."""
    B, Hq, Hkv, S, D = HEADLINE
    assert da.op["async_ring"].traffic(HEADLINE) == 2 * (2 * B * Hkv * S * D + 2 * B * Hq * D) == 2_147_745_792
    gqa = (16, 32, 8, 8192, 128)  # a block per KV head: a quarter of the cache stage 4 reads
    assert da.op["async_ring"].traffic(gqa) == 2 * (2 * 16 * 8 * 8192 * 128 + 2 * 16 * 32 * 128)


@pytest.mark.slow
@pytest.mark.sim_only
def test_async_ring_kernels_compile_without_spills():
    """The ring kernels at group sizes 1, 2, 4 compiled for sm_90 and linked with the cp.async helpers: no
    spills, the ring read back with ld.shared.v4, and group 1 (the headline) in at most 64 registers, so that
    shared memory, not registers, limits a multiprocessor to three blocks."""
    import os
    import subprocess
    import sys

    code = (
        "from workbench.ptxcheck import compile_kernel\n"
        "from numba import cuda\n"
        "from numba.cuda import types\n"
        "from solutions import decode_attention as da\n"
        "w = types.Array(types.uint32, 1, 'C')\n"
        "p = types.Array(types.float32, 2, 'C')\n"
        "sig = (types.Array(types.float16, 3, 'C'), w, w, p, p, types.float32, types.int64, types.int64, types.int64)\n"
        "for g in (1, 2, 4):\n"
        "    r = compile_kernel('x', 'solutions.decode_attention', f'_chunk_ring{g}', sig, True)\n"
        "    ptx, _ = cuda.compile_ptx(getattr(da, f'_chunk_ring{g}').py_func, sig, cc=(9, 0))\n"
        "    print('ring', g, r.status, r.registers, r.spill_bytes, 'v4' if 'ld.shared.v4' in ptx else 'no-v4')\n"
    )
    env = {**os.environ, "WORKBENCH_MODE": "compile", "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    lines = [ln.split()[1:] for ln in done.stdout.splitlines() if ln.startswith("ring ")]
    assert len(lines) == 3, done.stdout + done.stderr
    for group, status, registers, spills, v4 in lines:
        assert status == "passed" and spills in ("0", "None") and v4 == "v4", done.stdout
    assert int(lines[0][2]) <= 64, done.stdout
