"""What is specific to the tensor-core attention operators (attention[fp16], attention[bf16]): the inputs
they refuse, the fragment identity stage 2 rests on, the headline kernels compiled for sm_90 (slow),
and the issue's target on a GPU. Every stage at the simulator and check sizes is tested by
tests/test_ladders.py."""

from __future__ import annotations

import numpy as np
import pytest

from solutions import attention_tc
from solutions._ptx import mma_a_element, mma_c_element
from workbench.check import adversarial_cases, check_stage
from workbench.ladder import InputError, to_device

OPS = attention_tc.OPERATORS


def _device_inputs(op, size):
    inputs = op.make_inputs(size, np.random.default_rng(0))
    return [to_device(a) for a in inputs] + [to_device(op.make_output(size))]


@pytest.mark.sim_only
@pytest.mark.parametrize("D", [12, 136])
def test_refuses_a_head_size_that_is_not_a_multiple_of_8_up_to_128(D):
    q, k, v, causal, out = _device_inputs(attention_tc.op, (1, 1, 2, 16, 0))
    bad = to_device(np.zeros((1, 1, 2, D), np.float16))
    with pytest.raises(InputError, match=f"head size D = {D}"):
        attention_tc.op["async_kv"](bad, k, v, causal, out)


@pytest.mark.sim_only
def test_refuses_float32_inputs():
    q, k, v, causal, out = _device_inputs(attention_tc.op, (1, 1, 2, 16, 0))
    with pytest.raises(InputError, match="q must have dtype float16"):
        attention_tc.op["mma_scores"](to_device(np.zeros((1, 1, 2, 16), np.float32)), k, v, causal, out)


def test_score_fragments_of_two_key_tiles_are_the_a_fragment_of_p_v():
    """Stage 2's trick, against the PTX ISA's layouts (solutions/_ptx.py): register r of P V's A
    fragment at k-step j holds, for every lane, the two elements that C registers 2 (r % 2), +1 of
    key tile 2j + r // 2 hold: same row, and k = that tile's column + 8 (r // 2)."""
    for lane in range(32):
        for reg in range(4):
            for e in range(2):
                row, k = mma_a_element(lane, reg, e)
                c_row, c_col = mma_c_element(lane, 2 * (reg % 2) + e)
                assert (row, k) == (c_row, c_col + 8 * (reg // 2)), (lane, reg, e)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_the_bytes_models_count_k_and_v_once_per_query_block(op):
    """At the headline's shape, 2 bytes an element: every stage reads Q and writes the output once
    (B H S D elements each) and fetches K and V once per query block: 32 blocks of 64 queries a head in
    stages 1 to 4, 16 of 128 in the tuned stage (64 at D = 128, as stage 4). Under the mask the
    skipping stages fetch only up to each block's diagonal (block n of 64 queries: 64 (n + 1) keys)."""
    B, H, S, D = 8, 16, 2048, 64
    q_and_out = 2 * B * H * S * D * 2
    kv_per_fetch = B * H * S * 2 * D * 2  # all of K and V, once
    full, masked = (B, H, S, D, 0), (B, H, S, D, 1)
    for name in ("mma_scores", "p_in_registers", "async_kv"):
        assert op[name].traffic(full) == op[name].traffic(masked) == q_and_out + 32 * kv_per_fetch
    assert op["causal_skip"].traffic(full) == q_and_out + 32 * kv_per_fetch
    diagonal_keys = sum(64 * (n + 1) for n in range(32))  # 33792 of the 32 x 2048 keys the full walk fetches
    assert op["causal_skip"].traffic(masked) == q_and_out + kv_per_fetch * diagonal_keys // S
    assert op["tuned"].traffic(full) == q_and_out + 16 * kv_per_fetch
    assert op["tuned"].traffic(masked) == q_and_out + kv_per_fetch * sum(128 * (n + 1) for n in range(16)) // S
    wide = (4, 32, 4096, 128, 1)  # the tuned stage keeps 64 queries a block at D = 128
    assert op["tuned"].traffic(wide) == op["causal_skip"].traffic(wide)
    assert all(s.traffic(size) >= op.bytes_moved(size) for s in op.stages for size in (full, masked, wide))


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_two_query_blocks_and_key_tiles_without_the_mask(op):
    """The slow simulator sizes walk two key tiles under the mask; this walks them without it, at a
    head size not a power of two (D = 24: padded to 32, zero columns)."""
    rng = np.random.default_rng(3)
    for name in ("p_in_registers", "causal_skip", "tuned"):
        st = op[name]
        size = (1, 1, 66, 24, 0)
        results = [check_stage(st, size, rng)]
        results += [check_stage(st, size, inputs=i, label=l) for l, i in adversarial_cases(op, size, rng)]
        assert all(r.passed for r in results), [r.message for r in results if not r.passed]


@pytest.mark.slow
@pytest.mark.sim_only
def test_the_d128_kernel_compiles_with_little_spill():
    """The D = 128 kernel (the simulator's sizes build D = 16 and 64; `workbench ptx` compiles D = 64's:
    205 registers, no spill): linked with hgemm_mma.cu as at launch, no float64, and at most the 128
    bytes of spill tests/test_ladders.py allows. At 255 registers (64 output, 32 score accumulators,
    the lane offsets) ptxas 13 spills 120 bytes: a 32-key tile at D = 128 would remove it (not done).
    About two minutes: the link is NVRTC + LTO."""
    from tests.sm90 import attention_signature, compile_for_sm90

    reports, output = compile_for_sm90("solutions.attention_tc", ["_flash_tc_causal_skip_d128_f16"],
                                       attention_signature("uint16"))
    assert len(reports) == 1, output
    name, status, spills, _ = reports[0]
    assert status == "passed" and (spills == "None" or int(spills) <= 128), output


# -- on a GPU: the target ----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_best_stage_reaches_half_of_sdpa(op):
    """At 8x16x2048x64 without the mask, fp16 and bf16 each: the best stage >= 50% of torch SDPA's
    TFLOP/s at the same dtype, in one run."""
    from workbench.bench import bench_size
    from workbench.results import environment

    size = (8, 16, 2048, 64, 0)
    # verify=False: tests/test_ladders.py checks every stage beforehand at the check sizes (S = 2049
    # with and without the mask; fp16 also at the headline, its shape under the mask)
    recs, fails = bench_size(op, op.stages, size, {}, np.random.default_rng(0), environment(), verify=False)
    assert not fails, fails
    stages = {r["stage"]: r["gflops"] for r in recs if r["kind"] == "stage"}
    sdpa = [r["gflops"] for r in recs if r["kind"] == "peer"]
    assert sdpa, "no SDPA peer (torch missing?)"
    assert max(stages.values()) >= 0.5 * sdpa[0], ({k: round(v / 1e3, 1) for k, v in stages.items()}, sdpa[0] / 1e3)


# The layouts the simulator runs (each a different kernel; min_blocks only changes the register cap):
# stage 4's to TUNED one idea at a time, the largest (8 warps, 128 keys) for the two new sizes, and
# two m16 tiles a warp (32 queries: 128 a block of 4 warps, 64 a block of 2).
_SIM_GEOMETRIES = [g for g in attention_tc.SWEEP if (g.warps, g.keys, g.min_blocks, g.rows) == (4, 64, 2, 16)]
_SIM_GEOMETRIES += [attention_tc.TUNED._replace(warps=8, keys=128, min_blocks=1),
                    attention_tc.TUNED._replace(rows=32, min_blocks=2),
                    attention_tc.TUNED._replace(rows=32, warps=2, min_blocks=4)]


@pytest.mark.slow
@pytest.mark.parametrize("geometry", _SIM_GEOMETRIES, ids=lambda g: g.label().replace(" ", "-"))
def test_the_geometries_the_gpu_script_times_are_correct(geometry):
    """A run on the GPU timed these layouts of the tuned kernel side by side (results/runs/
    gpu_attention_tc.json, each checked there first); here they are checked against the float64 reference in the simulator. 133 keys:
    with 64-key tiles, under the mask, the last query block walks three tiles (the third K/V buffer
    in use, a partial tail); the 8-warp 128-key layout without the mask: two query blocks, two tiles.
    About 90 s in all (the 8-warp layout is most of it)."""
    from workbench.ladder import to_host

    op = attention_tc.op
    size = (1, 1, 133, 16, 1 if geometry.keys == 64 else 0)
    inputs = op.make_inputs(size, np.random.default_rng(5))
    out = to_device(op.make_output(size))
    attention_tc.launch_geometry(geometry)(*[to_device(a) for a in inputs], out)
    expected = op.reference(*inputs)
    err = np.max(np.abs(to_host(out).astype(np.float64) - expected)) / max(1.0, np.max(np.abs(expected)))
    assert err < attention_tc.TOLERANCE["float16"], (geometry, size, err)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1, 3, 133, 16, 1), (2, 2, 140, 16, 0)], ids=["causal-3-heads", "full-4-heads"])
def test_every_head_and_query_block_is_computed_once(size):
    """block_order maps a grid of (B H, query blocks) to (head, first query) in two orders (heaviest query
    block of every head first under the mask; a head's blocks together without it): several heads and
    query blocks, each output row checked against the float64 reference."""
    st = attention_tc.op["tuned"]
    rng = np.random.default_rng(6)
    results = [check_stage(st, size, rng)]
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


@pytest.mark.sim_only
def test_the_tuned_stage_runs_its_geometry():
    """What the tuned stage launches is TUNED (TUNED_WIDE at D = 128), and the sweep starts at stage 4's."""
    assert attention_tc.STAGE_SWITCHES["tuned"][3][64] == attention_tc.TUNED
    assert attention_tc.STAGE_SWITCHES["tuned"][3][128] == attention_tc.TUNED_WIDE
    assert attention_tc.SWEEP[0] == attention_tc.STAGE_SWITCHES["causal_skip"][3]
    assert attention_tc.TUNED in attention_tc.SWEEP


# -- the Hopper stage (wgmma, TMA, mbarriers, warp specialisation) ---------------------------------------

@pytest.mark.sim_only
@pytest.mark.parametrize("op", [pytest.param(o, id=o.name, marks=() if o.dtype == np.float16 else pytest.mark.slow)
                                for o in OPS])  # bf16's kernels are fp16's with other conversions: slow tier
@pytest.mark.parametrize("size", [  # the first wraps the three-slot ring (520 keys): ~50 s a case, slow tier
    pytest.param((1, 2, 520, 64, 0), marks=pytest.mark.slow, id="d64-full-2-heads"),
    pytest.param((2, 1, 200, 128, 1), id="d128-causal")])
@pytest.mark.parametrize("stage", [pytest.param("wgmma", marks=pytest.mark.slow),  # pingpong's kernel holds
                                   pytest.param("overlap_softmax", marks=pytest.mark.slow), "pingpong",  # theirs
                                   "lean_loop", "persistent"])
def test_the_hopper_stages_run_their_kernel_at_sizes_not_multiples_of_its_tiles(op, size, stage):
    """The stage's own kernel (not the tuned fallback) in the emulated wgmma, TMA and mbarriers: 520 keys
    are five 128-key tiles, the last partial, through a ring of three slots (the producer waits on two
    slots' "empty" barriers); two heads read each other's rows past S through the 2-D tensor maps
    (masked); under the mask at D = 128 two query blocks of 128, the second with 72 queries."""
    from workbench.simulator import record_launches

    with record_launches() as launches:
        results = [check_stage(op[stage], size, np.random.default_rng(7))]
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]
    kind = "f16" if op is attention_tc.op else "bf16"
    assert {f.__name__ for f, _ in launches} == {f"_flash_{stage}_d{size[3]}_{kind}"}


@pytest.mark.sim_only
@pytest.mark.parametrize("size", [
    (1, 1, 300, 64, 1),  # three query blocks: the first tile masked; one unmasked then the diagonal; two
                         # unmasked then a tile both diagonal and past S (300 = 2 x 128 + 44)
    (1, 1, 300, 64, 0),  # two unmasked tiles, then the tail
    (1, 1, 256, 64, 0),  # no masked tile at all
    (1, 2, 1, 64, 1)],  # one key: tile 0 masked, the loop never runs
    ids=["causal-300", "full-300", "full-256", "one-key"])
def test_the_lean_loop_masks_only_its_diagonal_and_tail_tiles(size):
    """lean_loop's key loop masks a tile only from the first one with a key past S or past a row (the
    tiles before it skip the mask): every boundary between the two, and none."""
    from workbench.simulator import record_launches

    with record_launches() as launches:
        result = check_stage(attention_tc.op["lean_loop"], size, np.random.default_rng(11))
    assert result.passed, result.message
    assert {f.__name__ for f, _ in launches} == {"_flash_lean_loop_d64_f16"}


def _persistent_against_lean_loop(op, size, blocks):
    """The persistent kernel on ``blocks`` blocks and lean_loop's on its grid, on the same inputs: their
    outputs (as bits) and the persistent launch's grid."""
    from workbench.ladder import to_host
    from workbench.simulator import record_launches

    q, k, v, causal, out = _device_inputs(op, size)
    attention_tc.launch_hopper("lean_loop", q, k, v, causal, out)
    expected = to_host(out).view(np.uint16)
    out2 = _device_inputs(op, size)[-1]
    with record_launches() as launches:
        attention_tc.launch_persistent(q, k, v, causal, out2, blocks=blocks)
    kind = "bf16" if op.dtype != np.float16 else "f16"
    assert [f.__name__ for f, _ in launches] == [f"_flash_persistent_d{size[3]}_{kind}"]
    return expected, to_host(out2).view(np.uint16), launches


@pytest.mark.sim_only
@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("size", [
    (1, 3, 300, 64, 1),  # nine items of 1 to 3 tiles, heaviest first: a block's items differ in length
    pytest.param((1, 3, 300, 64, 0), marks=pytest.mark.slow),  # nine items of 3 tiles: the ring wraps mid-item
    pytest.param((1, 2, 130, 64, 0), id="tail-2-heads")],  # 130 = 128 + 2: every item ends on a masked tail
    ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else None)
def test_the_persistent_grid_gives_lean_loops_bits_on_one_or_two_blocks(size, blocks):
    """The persistent kernel runs many items on a forced grid of 1 or 2 blocks: its ring, its "Q empty"
    barrier and its consumers' turns carried from item to item, and every item's output bit for bit
    what lean_loop's block of the same query block computes."""
    expected, got, _ = _persistent_against_lean_loop(attention_tc.op, size, blocks)
    np.testing.assert_array_equal(got, expected)
    # The item counter and the count of blocks done are back at zero for the next launch
    assert attention_tc.item_claims().copy_to_host().tolist() == [0, 0]


@pytest.mark.sim_only
def test_the_persistent_blocks_claim_every_item_once_in_the_heaviest_first_order(monkeypatch):
    """Items are claimed from the counter in _item_order32's order: a block that claims item n computes
    that order's n-th query block. With a counter that starts past the first item, as a broken reset
    would leave it, items are skipped: the output keeps its poison there (the check would fail)."""
    from workbench.ladder import to_host

    size = (1, 2, 300, 64, 1)  # two items a head: queries 0..191 and 192..299 (three consumers), or three
    q, k, v, causal, _ = _device_inputs(attention_tc.op, size)
    out = to_device(np.full(size[:4], np.nan, np.float16))
    claims = attention_tc.item_claims()
    claims.copy_to_device(np.array([1, 0], np.uint32))  # item 0 (the heaviest) "already taken"
    attention_tc.launch_persistent(q, k, v, causal, out, blocks=2)
    got = to_host(out)
    assert claims.copy_to_host().tolist() == [0, 0]
    # Item 0 under the mask is the heaviest: the last query block (rows 192..299 or 256..299) of head 0
    last = (size[2] - 1) // attention_tc.persistent_shape(64)[1] * attention_tc.persistent_shape(64)[1]
    assert np.isnan(got[0, 0, last:].astype(np.float32)).all()
    assert not np.isnan(got[0, 0, :last].astype(np.float32)).any() and not np.isnan(got[0, 1].astype(np.float32)).any()


@pytest.mark.sim_only
@pytest.mark.slow  # the simulator at D = 128 and in bf16: about a minute each
@pytest.mark.parametrize("op", [pytest.param(o, id=o.name) for o in OPS])
@pytest.mark.parametrize("size", [(1, 2, 200, 128, 1), (2, 1, 150, 128, 0)], ids=["d128-causal", "d128-full"])
def test_the_persistent_grid_at_d128_and_odd_sizes(op, size):
    """Odd sizes at D = 128 (fp16 and bf16), four items on two blocks: lean_loop's bits."""
    expected, got, _ = _persistent_against_lean_loop(op, size, 2)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.sim_only
def test_three_consumers_take_their_turns_round_robin():
    """At D = 64 a persistent item is 192 queries, one block of three consumer warpgroups: at 130 queries
    under the mask one item, the third consumer with two rows, two key tiles, of which the first
    consumer's rows see only the first (it takes its turn for the second and frees its slot: the
    ring's turns go 0, 1, 2, 0, ...; a turn left over or missing hangs the simulator). lean_loop's
    bits, row for row."""
    assert attention_tc.persistent_shape(64) == (3, 192, 128) and attention_tc.persistent_threads(64) == 512
    expected, got, launches = _persistent_against_lean_loop(attention_tc.op, (1, 1, 130, 64, 1), 1)
    np.testing.assert_array_equal(got, expected)


def test_three_consumers_fetch_k_and_v_once_per_192_queries_at_d64():
    """The persistent stage's traffic at D = 64: K and V once per 192 queries (up to each item's last
    query under the mask); at D = 128 once per 128, as the other Hopper stages."""
    op = attention_tc.op
    B, H, S, D = 1, 2, 768, 64
    q_and_out = 2 * B * H * S * D * 2
    kv_per_fetch = B * H * S * 2 * D * 2
    assert op["persistent"].traffic((B, H, S, D, 0)) == q_and_out + 4 * kv_per_fetch
    causal_keys = sum(192 * (n + 1) for n in range(4))  # item n's queries see keys up to 192 (n + 1)
    assert op["persistent"].traffic((B, H, S, D, 1)) == q_and_out + kv_per_fetch * causal_keys // S
    assert op["persistent"].traffic((B, H, S, 128, 1)) == op["lean_loop"].traffic((B, H, S, 128, 1))


@pytest.mark.sim_only
@pytest.mark.parametrize("consumers, keys, own_tiles, size", [
    (2, 128, True, (1, 2, 300, 64, 1)),  # the two-consumer kernel of 128-query items, as before
    (3, 96, True, (1, 2, 520, 64, 1)),  # 96-key tiles: 520 = 5 x 96 + 40 (the ring wraps; 192 = 2 tiles)
    (3, 128, False, (1, 2, 250, 64, 1)),  # every consumer walks all the item's tiles
    pytest.param(3, 112, True, (1, 1, 250, 64, 0), marks=pytest.mark.slow)],  # 112: 192 is no whole tile
    ids=["2-consumers", "3-consumers-96-keys", "3-consumers-all-tiles", "3-consumers-112-keys"])
def test_the_persistent_kernel_at_each_setting_a_sweep_may_pick(monkeypatch, consumers, keys, own_tiles, size):
    """PERSISTENT_CONSUMERS_D64, PERSISTENT_BKV_D64 and OWN_TILES_D64 as `workbench sweep` sets them:
    checked against the float64 reference at sizes not multiples of the item or the key tile (other
    tiles round differently from lean_loop, so not bit for bit)."""
    monkeypatch.setattr(attention_tc, "PERSISTENT_CONSUMERS_D64", consumers)
    monkeypatch.setattr(attention_tc, "PERSISTENT_BKV_D64", keys)
    monkeypatch.setattr(attention_tc, "OWN_TILES_D64", own_tiles)
    monkeypatch.setattr(attention_tc, "_BUILT", {k: f for k, f in attention_tc._BUILT.items() if k[1] != "persistent"})
    result = check_stage(attention_tc.op["persistent"], size, np.random.default_rng(5))
    assert result.passed, result.message
    assert attention_tc.item_claims().copy_to_host().tolist() == [0, 0]


def test_the_persistent_grid_is_one_block_an_sm_and_never_more_than_the_items(monkeypatch):
    """persistent_blocks: the simulator's few "SMs", capped by the items (a head's query block each)."""
    monkeypatch.setattr(attention_tc, "SIM_PERSISTENT_BLOCKS", 2)
    monkeypatch.setattr(attention_tc._device, "is_simulator", lambda: True)
    assert attention_tc.persistent_blocks(1) == 1
    assert attention_tc.persistent_blocks(9) == 2


@pytest.mark.sim_only
def test_the_wgmma_stage_hands_other_head_sizes_to_the_tuned_kernel():
    """D = 16 is not a whole 128-byte row of the swizzle: the tuned stage's kernel runs it."""
    from workbench.simulator import record_launches

    with record_launches() as launches:
        result = check_stage(attention_tc.op["wgmma"], (1, 1, 5, 16, 1), np.random.default_rng(8))
    assert result.passed, result.message
    assert [f.__name__ for f, _ in launches] == ["_flash_tc_tuned_d16_f16"]


def test_the_wgmma_stage_fetches_k_and_v_once_per_128_queries():
    """At the headline (D = 64) 16 query blocks of 128 a head fetch K and V; under the mask, up to each
    block's diagonal. At D = 16 (the tuned kernel) the tuned stage's traffic."""
    op = attention_tc.op
    B, H, S, D = 8, 16, 2048, 64
    q_and_out = 2 * B * H * S * D * 2
    kv_per_fetch = B * H * S * 2 * D * 2
    assert op["wgmma"].traffic((B, H, S, D, 0)) == q_and_out + 16 * kv_per_fetch
    assert op["wgmma"].traffic((B, H, S, D, 1)) == q_and_out + kv_per_fetch * sum(128 * (n + 1) for n in range(16)) // S
    assert op["wgmma"].traffic((1, 1, 100, 16, 1)) == op["tuned"].traffic((1, 1, 100, 16, 1))


_HOPPER_SCRIPT = r"""
import json, re
import workbench
from cuda.core import Linker, LinkerOptions
from numba import cuda
from numba.cuda import types
from solutions import attention_tc
from workbench.ptxcheck import as_object_code, parse_assembler_log

half, b1 = types.Array(types.uint16, 4, "C"), types.Array(types.uint8, 1, "C")
sig = (half,) * 3 + (types.Array(types.uint32, 2, "C"), types.float32, types.Array(types.int32, 1, "C")) + (b1,) * 3
claims = (types.Array(types.uint32, 1, "C"),)  # the persistent kernel's item counters
out = {}
for key, kernel in attention_tc._BUILT.items():
    if key[0] != "hopper":
        continue
    sig = sig[:9] + (claims if key[1] == "persistent" else ())
    bounds = kernel.targetoptions.get("launch_bounds")
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0, "a"), launch_bounds=bounds)
    count = lambda pattern: len(re.findall(pattern, ptx))
    codes, _ = cuda.compile_all(kernel.py_func, sig, device=False, abi="numba", cc=(9, 0, "a"), output="ltoir",
                                launch_bounds=bounds)
    linker = Linker(*[as_object_code(c, "flash.ltoir") for c in codes],
                    options=LinkerOptions(arch="sm_90a", verbose=True, link_time_optimization=True))
    linker.link("cubin")
    log = linker.get_info_log() or ""
    out[kernel.__name__] = dict(head_dim=key[2], wgmma=count(r"wgmma\.mma_async"),
                                tma=count(r"cp\.async\.bulk\.tensor"), setmaxnreg=count(r"setmaxnreg"),
                                f64=count(r"\.f64\b"),
                                warnings=sorted(set(re.findall(r"C75\d\d", log))), **parse_assembler_log(log))
print(json.dumps(out))
"""


@pytest.mark.sim_only
@pytest.mark.slow  # NVVM and nvJitLink on twenty kernels: about three minutes on two cores
def test_the_wgmma_kernels_compile_for_sm90a_with_their_instructions():
    """Each Hopper kernel (both stages, D = 64 and 128, fp16 and bf16) compiles for sm_90a with every wgmma
    of a tile unrolled, its TMA copies and both setmaxnreg, no spill, and none of
    ptxas' warnings that it serialised the wgmma or ignored setmaxnreg (C75xx)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", _HOPPER_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(found) == {f"_flash_{stage}_d{d}_{t}" for stage in attention_tc.HOPPER_STAGE_NAMES for d in (64, 128)
                          for t in ("f16", "bf16")}, found
    for name, r in found.items():
        # a tile's S (D / 16 k-steps) and P V (128 keys / 16), unrolled; the overlapping stages issue
        # each in two places (tile 0's S before their loop, the last tile's P V after it)
        per_tile = r["head_dim"] // 16 + 128 // 16
        assert r["wgmma"] == per_tile * (1 if "_wgmma_" in name else 2), (name, r)
        assert r["tma"] > 0 and r["setmaxnreg"] == 2 and not r["f64"], (name, r)
        assert not r["warnings"], (name, r)
        assert r["spill_bytes"] == 0, (name, r)


@pytest.mark.sim_only
def test_under_the_mask_the_hopper_blocks_walk_groups_of_heads_each_once(monkeypatch):
    """_order32's groups of heads: with GROUP_BLOCKS = 4 and two query blocks a head, heads 0 and 1 form a
    group and head 2 a group of its own (the last group is short). Every output row checked."""
    monkeypatch.setattr(attention_tc, "GROUP_BLOCKS", 4)
    result = check_stage(attention_tc.op["wgmma"], (1, 3, 200, 64, 1), np.random.default_rng(9))
    assert result.passed, result.message
