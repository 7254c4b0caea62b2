# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/attention_tc.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade attention[fp16]            (or attention[fp16].<stage>; its other operators: attention[bf16])
# The grader checks each stage against the operator in solutions/attention_tc.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 6513fd6b01130d772b571f0f347374e1f806e5171ac2a8d39092b9a334996946
# --------------------------------------------------------------------------------------------------
"""FlashAttention on tensor cores, fp16 and bf16: FlashAttention-2's forward pass on mma.sync, then
FlashAttention-3's on Hopper's wgmma, TMA and warp specialisation.

out[b, h, i] = sum_j softmax_j(q[b, h, i] . k[b, h, j] / sqrt(D)) v[b, h, j], with the causal mask
(query i sees keys j <= i) when ``causal[0]`` is 1: the float32 ``attention`` ladder's operator, with
q, k, v and out B x H x S x D arrays in fp16 (``attention[fp16]``) or bf16 (``attention[bf16]``), the
scores, the softmax statistics and the output accumulated in float32, the output rounded once to
the inputs' type (what torch's SDPA does at these dtypes). A size is B x H x S x D x CAUSAL; D is a
multiple of 8 up to 128 (16-byte rows for cp.async; the kernels are built for D padded to 16, 32, 64
or 128, as FlashAttention builds one per head size). 4 B H S^2 D flops (S (S + 1) / 2 pairs under
the mask), the count the float32 ladder uses.

Both products of attention go to the tensor cores, through the same CUDA C++ helpers as the HGEMM
ladder (``solutions/hgemm_mma.cu``; in the simulator, ``solutions/_ptx.py`` emulates them, so these
kernels run on a CPU too). A block of 4 warps owns 64 queries, 16 per warp, and walks the keys 64 at
a time; every warp is a FlashAttention of its own 16 rows against the block's shared K and V tiles.

Fragments (PTX ISA "Matrix Fragments for mma.m16n8k16", as in hgemm.py). Lane l, g = l // 4,
q = l % 4. The scores of key n8-tile n are a C fragment: s[n, 0], s[n, 1] at row g, keys 8n + 2q,
8n + 2q + 1; s[n, 2], s[n, 3] at row g + 8. So a lane holds 2 rows x 16 keys of each 16 x 64 tile,
and a row's other 48 keys are in the 3 other lanes of its quad (shfl_xor 1 and 2 reach them).

1. ``mma_scores``: S = Q K^T by mma.sync (K's rows are the B operand's columns: ldmatrix, no
   transpose), the online softmax on the accumulator fragments, P written to shared memory in the
   half type and loaded back by ldmatrix as the A operand of P V (V through ldmatrix.trans).
2. ``p_in_registers``: FlashAttention-2's register trick. The C fragments of S for key tiles 2j and
   2j + 1 hold exactly the elements the A fragment of P V's k-step j wants: packed in pairs, they
   are that fragment. No shared-memory round trip for P; the Q fragments stay in registers too.
3. ``async_kv``: K and V tiles by cp.async, double-buffered (the next tile's copies are in flight
   while this one computes), in a swizzled layout (no bank conflicts for ldmatrix), past 48 KiB of
   shared memory at D = 128.
4. ``causal_skip``: under the mask a block stops at its diagonal tile (the only one masked) and the
   heaviest blocks start first. Without the mask, stage 3.
5. ``tuned``: stage 4 with 32 queries a warp (two m16 tiles share every K and V fragment), exp2 as
   one MUFU instruction (the scale folded into its argument), 32-bit shared addresses, copy addresses
   computed once a tile; its geometry picked from alternatives timed side by side.

Then Hopper's instructions (sm_90a, ``solutions/_hopper.py``), FlashAttention-3's structure, at D = 64
and 128 (other head sizes run the tuned kernel):

6. ``wgmma``: a block of a producer warpgroup (TMA copies of Q, K and V into a ring of slots on
   mbarriers) and two consumer warpgroups of 64 queries: S = Q K^T by wgmma from shared-memory
   descriptors, the same online softmax on its accumulators, O += P V by wgmma with P from registers.
7. ``overlap_softmax``: tile t's softmax runs while tile t - 1's P V is still on the tensor cores.
8. ``pingpong``: the two consumers take turns to issue their wgmma (named barriers), so that one's
   softmax runs while the other's products do.
9. ``lean_loop``: the same kernel with half the instructions in its key loop: the mask only on the
   tiles that need it, descriptors moved by constants, the ring's slot and parity carried.
10. ``persistent``: lean_loop's kernel on one block an SM, each claiming query blocks from a counter
    in global memory as it frees up: barriers set up once, the next item's Q and first K/V tiles
    copied while the current item finishes. At D = 64 three consumer warpgroups (192 queries an item,
    160 registers a consumer thread).

The bytes model of each stage (``stage_traffic``) counts what it reads from L2 or memory: Q read and the
output written once, K and V fetched once per query block (64 queries; 128 in the tuned stage up to
D = 64), and under the mask, from stage 4 on, only up to each block's diagonal. The operator's own
model is the minimum, q, k and v read and out written once.
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, uint16, uint32, uint64

from workbench import device as _device
from workbench.shared_memory import STATIC_LIMIT, set_max_dynamic_shared_memory
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, stage_of
from workbench.targets import against_peer

from solutions._attention_common import (attention_flops, extreme_logits, kv_fetch_bytes, naive_expression, reference,
                                         sdpa_peer)
from solutions._flash_mma import (ALIGN16, FULL_MASK, HEAD_DIM_STEPS, LOG2E, LOWEST, NEG_INF, block_order,
                                  issue_async, ldsm, ldsm_trans, online_softmax, padded_head_dim, rescale_rows,
                                  softmax_tile, tile_offset)
from solutions._ptx import cp_async_commit, cp_async_wait_pending, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2, \
    shared_address32
from solutions._hopper import (fence_proxy_async, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init,
                               mbarrier_wait, setmaxnreg_consumer, setmaxnreg_producer, shared_descriptor, tile_pad,
                               advance_descriptor,
                               named_barrier_arrive, named_barrier_sync, tma_load_2d, wgmma_commit, wgmma_fence,
                               wgmma_wait0, wgmma_wait1)
from solutions._hopper import tensor_map as host_tensor_map, tma_ok  # (host side: the kernels take a map)
import solutions._hopper as hopper  # its wgmma of each tile shape, looked up by name (SIZED_WGMMA)
from solutions._vector_io import aligned16

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # numba-cuda takes bf16 arrays from ml_dtypes; without it there is no bf16 operator
    BF16 = None

MAX_HEAD_DIM = 128


def _gpu_options(**options):
    """Compile options only the real GPU compiler takes (the simulator's cuda.jit accepts none)."""
    return {} if _device.is_simulator() else options




# -- the operators -------------------------------------------------------------------------------

def _inputs_for(dtype):
    def make(size, rng):
        B, H, S, D, causal = size
        # Unit-variance q and k: scores about N(0, 1), a softmax neither uniform nor one-hot. Drawn in
        # float32 and rounded to the half type: the reference sees exactly what the kernels see.
        q, k, v = (rng.normal(0.0, 1.0, (B, H, S, D)).astype(np.float32).astype(dtype) for _ in range(3))
        return q, k, v, np.array([causal], np.int32)
    return make


def _adversarial_for(dtype):
    def adversarial(size, rng):
        """attention's extreme logits (``extreme_logits``), rounded to the half type."""
        q, k, v, causal = (a.astype(np.float32) for a in _inputs_for(np.float32)(size, rng))
        q, k = extreme_logits(q, k, size[3], rng)
        return [("extreme-logits", (q.astype(dtype), k.astype(dtype), v.astype(dtype), causal.astype(np.int32)))]
    return adversarial


def _validator_for(dtype):
    def validate(q, k, v, causal, out):
        expect_device_array("q", q, dtype=dtype, ndim=4)
        B, H, S, D = q.shape
        if D > MAX_HEAD_DIM or D % 8:
            raise InputError(f"the head size D = {D} must be a multiple of 8 up to {MAX_HEAD_DIM} (q is B x H x S x D; "
                             "cp.async moves rows in 16-byte pieces)")
        for name, a in (("k", k), ("v", v), ("out", out)):
            expect_device_array(name, a, dtype=dtype, shape=(B, H, S, D))
        expect_device_array("causal", causal, dtype=np.int32, shape=(1,))
    return validate


# The output is rounded to the half type once (relative error 2^-12 fp16, 2^-9 bf16 on average), and
# so is P before P V (the same again, averaged over the keys); float32 does the rest. A wrong index,
# a missing rescale or a wrong scale is off by O(1).
TOLERANCE = {"float16": 3e-3, "bfloat16": 2e-2}


CHECK_SIZES = [(2, 3, 1, 64, 1), (2, 3, 1, 128, 0), (1, 4, 17, 64, 1), (2, 2, 17, 128, 0), (1, 2, 1000, 64, 0),
               (1, 2, 1000, 128, 1), (1, 2, 2049, 64, 1), (1, 1, 2049, 128, 0), (1, 2, 2049, 64, 0)]
# In the simulator every lane is a Python thread and every mma a meeting of 32 of them: tiny sizes.
# The quick tier runs the middle one (S = 5: one partial key tile, masked; D = 16: the kernels for
# one k16 step). The slow tier adds two query blocks x two key tiles under the mask (the online
# rescale across tiles, the cp.async double buffer, the skip) and D = 64, the headline's kernels,
# which `workbench ptx` compiles for sm_90 (tests/test_attention_tc.py compiles D = 128's).
SIM_SIZES = [(1, 1, 70, 16, 1), (1, 1, 5, 16, 1), (1, 1, 3, 64, 0)]
BENCH_SIZES = [(16, 16, 1024, 64, 0), (8, 16, 2048, 64, 0), (8, 16, 2048, 64, 1), (4, 32, 4096, 128, 0),
               (4, 32, 4096, 128, 1)]
HEADLINE = (8, 16, 2048, 64, 1)


def _io_bytes(size):
    B, H, S, D, causal = size
    return 4 * B * H * S * D * 2  # q, k, v read and out written once, 2 bytes an element


def _operator(short, dtype, title, rank):
    return Operator(
        name="attention", variant={"dtype": short},
        # mma.sync's ladder set out for half of SDPA; on Hopper's instructions (wgmma, TMA, warp
        # specialisation) the aim is SDPA itself, at both shapes FlashAttention-3 is judged at
        targets=[against_peer(0.5, "torch SDPA", stage="best"), against_peer(1.0, "torch SDPA", stage="best"),
                 against_peer(1.0, "torch SDPA", stage="best", size=(4, 32, 4096, 128, 1))],
        title=title,
        reference=reference,
        make_inputs=_inputs_for(dtype),
        make_output=lambda size: np.empty(size[:4], dtype),
        bytes_moved=_io_bytes,
        flops=attention_flops,
        validate=_validator_for(dtype),
        tolerance=lambda size, _dtype: TOLERANCE[np.dtype(dtype).name],
        peer=sdpa_peer,
        torch_expression=naive_expression,
        adversarial_inputs=_adversarial_for(dtype),
        bound="compute",
        dtype=dtype,
        size_names=("batch", "heads", "seq", "head_dim", "causal"),
        check_sizes=CHECK_SIZES,
        sim_sizes=SIM_SIZES,
        bench_sizes=BENCH_SIZES,
        headline_size=HEADLINE,
        record_all_sizes=True,
        rank=rank,
        group="Attention on tensor cores (fp16, bf16): FlashAttention-2 on mma.sync",
    )


op = _operator("fp16", np.float16, "FlashAttention on tensor cores, fp16 (float32 softmax)", 302)
bf16_op = _operator("bf16", BF16, "FlashAttention on tensor cores, bf16 (float32 softmax)", 303) \
    if BF16 is not None else None
OPERATORS = [o for o in (op, bf16_op) if o is not None]


def _stage(name, summary):
    """One launcher registered as the same stage of both operators (fp16 and bf16), with its traffic model."""
    return stage_of(OPERATORS, name, summary, bytes_moved=lambda size: stage_traffic(name, size))


def stage_traffic(stage, size):
    """What ``stage`` reads from L2 or memory at ``size``: each block reads its queries and writes their
    output once, and fetches K and V once for all its queries (the stage's geometry: 64, or 128 in the
    tuned stage up to D = 64); a stage that skips the tiles past the diagonal fetches, under the mask,
    only the keys up to its last query."""
    if stage in HOPPER_STAGE_NAMES:  # 128 queries a block where their kernel runs, the tuned stage's elsewhere
        if size[3] in HOPPER_HEAD_DIMS:  # (persistent: its item's queries, 192 at D = 64)
            queries = persistent_shape(size[3])[1] if stage == "persistent" else HOPPER_BQ
            return _io_bytes(size) // 2 + kv_fetch_bytes(size, queries, True, itemsize=2)
        stage = "tuned"
    _, _, skip, geometry = STAGE_SWITCHES[stage]
    if isinstance(geometry, dict):  # a geometry per padded head size
        geometry = geometry[padded_head_dim(size[3])]
    return _io_bytes(size) // 2 + kv_fetch_bytes(size, geometry.queries, skip, itemsize=2)


# == the kernel =====================================================================================
#
# Every stage is one kernel source, ``_flash_tc``, compiled with different switches (P_REGS: P and Q
# stay in registers; ASYNC: cp.async pipelined, swizzled tiles; SKIP: stop at the diagonal) and a
# geometry (warps a block, keys a tile, pipeline stages, how exp2 and shared addresses are done) for
# one padded head size DP: numba compiles the ints and bools a kernel closes over as constants, so
# every loop over fragments has a constant trip count, is unrolled, and the accumulators stay in
# registers (an index the compiler cannot resolve would move the whole array to local memory).

class Geometry(NamedTuple):
    """How a kernel is laid out: stages 1 to 4 use the defaults; ``tuned`` uses TUNED below, and
    the alternatives were timed side by side (``launch_geometry``; results/runs/gpu_attention_tc.json)."""
    warps: int = 4  # a block's warps; each owns `rows` queries (a block: rows x warps queries)
    keys: int = 64  # keys a tile (a multiple of 16)
    stages: int = 2  # K/V buffers in flight (cp.async stages; 1 without cp.async)
    fast_exp: bool = False  # ex2.approx.ftz with the scale folded into its argument, or libdevice exp2f
    addr32: bool = False  # shared addresses in 32 bits (cvta once), copy addresses once a tile; or 64-bit sums
    min_blocks: int = 2  # launch_bounds(32 warps, min_blocks): the register cap
    rows: int = 16  # queries a warp: one m16 tile, or two (32: every K and V fragment feeds twice the mma)
    q_regs: bool = True  # Q's fragments in registers for the whole key loop (up to D = 64), or ldmatrix a tile

    @property
    def queries(self):
        return self.rows * self.warps

    def label(self):
        return (f"{self.queries}q{self.warps}w{self.rows}r{'' if self.q_regs else 'Qs'} k{self.keys} s{self.stages} "
                f"{'ex2' if self.fast_exp else 'exp2f'} {'a32' if self.addr32 else 'a64'} lb{self.min_blocks}")


BASE = Geometry()
# The tuned stage's layout of 2026-11-23: the fastest of the sweep then (623 us, 220.5 TFLOP/s, 49% of
# SDPA's 454.5 at fp16 8x16x2048x64 without the mask); 16 queries a warp, three K/V buffers, three blocks
# an SM under a 168-register cap (the same layout capped for two blocks took 802 us, stage 4's 865).
ONE_TILE = Geometry(warps=4, keys=64, stages=3, fast_exp=True, addr32=True, min_blocks=3)
# The tuned stage's geometry, the fastest of SWEEP timed side by side on an H200 (2026-11-24,
# fp16 8x16x2048x64, no mask): 593.7 us, 231.5 TFLOP/s, 51% of SDPA's 303.6 us in the same run, where
# ONE_TILE took 686.0 us. Two m16 tiles a warp (128 queries a block of 4 warps), Q read from its shared
# tile each k16 step (249 registers, no spill; with Q's 32 registers kept, 255 and 24 bytes spilled),
# two K/V buffers, two blocks an SM.
TUNED = Geometry(warps=4, keys=64, stages=2, fast_exp=True, addr32=True, min_blocks=2, rows=32, q_regs=False)
# At D = 128 two m16 tiles' output accumulators alone would be 128 registers: one tile a warp, and two
# K/V buffers (a third would take the block to 112 KiB: one block an SM, not two).
TUNED_WIDE = ONE_TILE._replace(stages=2, min_blocks=2)
# What was timed side by side at the headline (fp16 8x16x2048x64, no mask; results/runs/gpu_attention_tc.json),
# each one change from its neighbour: stage 4's geometry, then one idea added at a time up to ONE_TILE,
# ONE_TILE's layout changed one way at a time, then two m16 tiles a warp in several layouts.
_FAST = BASE._replace(fast_exp=True)
SWEEP = [
    BASE,  # stage 4 (causal_skip), as the tuned kernel builds it
    _FAST,  # + exp2 as one ex2.approx.ftz, the scale inside its argument
    _FAST._replace(addr32=True),  # + 32-bit shared addresses
    ONE_TILE._replace(min_blocks=2),  # + three K/V buffers, two blocks an SM
    ONE_TILE,  # three blocks an SM (12 warps): ptxas fits 168 registers, 16 bytes spilled
    ONE_TILE._replace(keys=128),  # 128 keys a tile: twice the mma between softmax reductions
    ONE_TILE._replace(warps=8, min_blocks=1),  # 128 queries a block (8 warps): each K/V tile serves twice the queries
    ONE_TILE._replace(warps=8, keys=128, min_blocks=1),  # FlashAttention-2's 128 x 128 tiles
    ONE_TILE._replace(warps=8, stages=2, min_blocks=1),
    # 32 queries a warp (two m16 tiles): each K and V fragment loaded by ldmatrix feeds four mma, not
    # two (at 16 queries a warp, ldmatrix moves 512 bytes for every 8192 flops: the shared-memory
    # pipe's 128 bytes a clock caps an SM near 2048 flops a clock, about half what its tensor cores do)
    ONE_TILE._replace(rows=32, min_blocks=2),  # 128 queries a block of 4 warps, three K/V buffers
    ONE_TILE._replace(rows=32, min_blocks=2, stages=2),
    ONE_TILE._replace(rows=32, keys=32, min_blocks=3),  # half the score registers: three blocks an SM
    ONE_TILE._replace(rows=32, warps=2, min_blocks=4),  # 64 queries a block of 2 warps, four blocks an SM
    ONE_TILE._replace(rows=32, warps=8, min_blocks=1),  # 256 queries a block
    # the same without Q's 32 fragment registers (two more ldmatrix a k16 step, from the Q tile)
    ONE_TILE._replace(rows=32, min_blocks=2, q_regs=False),
    TUNED,  # ... with two K/V buffers
    ONE_TILE._replace(rows=32, keys=32, min_blocks=3, q_regs=False),
]
BQ = BASE.queries  # stages 1 to 4: queries per block
BKV = BASE.keys  # keys per tile
THREADS = 32 * BASE.warps


@cuda.jit(device=True, inline=True)
def _load_plain(src, bh, row0, rows, S, D, smem, at, DP, THREADS):
    """Rows row0 .. row0 + rows - 1 of src[b, h] (16-bit bits) into the tile at byte ``at``, row-major,
    one element per thread and step, zero past S and past D (a zero key row scores 0 and is masked; a
    zero value row adds nothing: never garbage, which could be NaN, times a weight of 0)."""
    H = src.shape[1]
    b = bh // H
    h = bh % H
    for e in range(cuda.threadIdx.x, rows * DP, THREADS):
        r = e // DP
        c = e % DP
        value = uint16(0)
        if row0 + r < S and c < D:
            value = src[b, h, row0 + r, c]
        smem[at // 2 + r * DP + c] = value


@cuda.jit(device=True, inline=True)
def _mma(acc, n, a0, a1, a2, a3, b0, b1, bf16):
    """acc[n] += A B for one m16n8k16 tile (acc[n, 0..3]: the C fragment)."""
    if bf16:
        d = mma_bf16(a0, a1, a2, a3, b0, b1, acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
    else:
        d = mma_f16(a0, a1, a2, a3, b0, b1, acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
    acc[n, 0] = d[0]  # constant tuple indices: d[e] in a loop would go through memory
    acc[n, 1] = d[1]
    acc[n, 2] = d[2]
    acc[n, 3] = d[3]


@cuda.jit(device=True, inline=True)
def _pack(lo, hi, bf16):
    """Two float32 values rounded to the half type, packed in 32 bits (lo in the low half)."""
    if bf16:
        return pack_bf16x2(lo, hi)
    return pack_f16x2(lo, hi)


@cuda.jit(device=True, inline=True)
def _q_fragment(base, q_at, qf, st, q_lane, DP, Q_REGS, A32):
    """The A fragment of Q (16 queries) for k16 step st: from registers, or by ldmatrix from its tile."""
    if Q_REGS:
        return qf[4 * st], qf[4 * st + 1], qf[4 * st + 2], qf[4 * st + 3]
    return ldsm(base + uint64(q_at + q_lane[st]), A32)


@cuda.jit(device=True, inline=True)
def _scores(base, q_at, k_at, qf, qf2, s, s2, q_lane, k_lane, DP, BKV, Q_REGS, bf16, A32, TWO):
    """s = this warp's 16 queries . the tile's BKV keys: BKV / 8 n8 tiles of keys x DP / 16 k16 steps.
    An ldmatrix.x4 of K gives the B fragments of two key tiles (K's rows are B's columns, as stored).
    TWO: the warp's second 16 queries (s2, from qf2 or 16 rows further down the Q tile) take the
    same K fragments: one ldmatrix for four mma instead of two."""
    for n in range(BKV // 8):
        for e in range(4):
            s[n, e] = float32(0.0)
            if TWO:
                s2[n, e] = float32(0.0)
    for st in range(DP // 16):
        a0, a1, a2, a3 = _q_fragment(base, q_at, qf, st, q_lane, DP, Q_REGS, A32)
        if TWO:
            c0, c1, c2, c3 = _q_fragment(base, q_at + 32 * DP, qf2, st, q_lane, DP, Q_REGS, A32)
        for p in range(BKV // 16):
            b = ldsm(base + uint64(k_at + k_lane[st] + p * 32 * DP), A32)  # 16 rows further: 32 DP bytes
            _mma(s, 2 * p, a0, a1, a2, a3, b[0], b[1], bf16)
            _mma(s, 2 * p + 1, a0, a1, a2, a3, b[2], b[3], bf16)
            if TWO:
                _mma(s2, 2 * p, c0, c1, c2, c3, b[0], b[1], bf16)
                _mma(s2, 2 * p + 1, c0, c1, c2, c3, b[2], b[3], bf16)


@cuda.jit(device=True, inline=True)
def _p_to_shared(smem, p_at, s, warp, bf16):
    """Stage 1: P (this warp's 16 x 64 probabilities) to shared memory in the half type, two at a time."""
    lane = cuda.threadIdx.x % 32
    for n in range(BKV // 8):
        for half in range(2):
            row = 16 * warp + lane // 4 + 8 * half
            packed = _pack(s[n, 2 * half], s[n, 2 * half + 1], bf16)
            at = (p_at + (row * BKV + 8 * n + 2 * (lane % 4)) * 2) // 2
            smem[at] = uint16(packed & uint32(0xFFFF))
            smem[at + 1] = uint16(packed >> uint32(16))


@cuda.jit(device=True, inline=True)
def _p_fragment(s, kj, bf16):
    """FlashAttention-2's register trick: the A fragment of P V's k-step kj (keys 16 kj .. 16 kj + 15),
    made from the scores' C fragments where they are, without a trip through shared memory. Lane
    (g, q): s[n, 0], s[n, 1] are row g, keys 8n + 2q and 8n + 2q + 1; s[n, 2], s[n, 3] the same keys
    of row g + 8. The A fragment wants a0: row g, k 2q and 2q + 1; a1: row g + 8, the same k; a2, a3:
    the same 8 further along k, each register two halves, the lower k in the low 16 bits."""
    a0 = a1 = a2 = a3 = uint32(0)  # (until written: probabilities of 0, which add nothing to P V)
    # EXERCISE: write this part of `_p_fragment`. Read the hints one at a time.
    #   hint 1 (nudge): k-step kj covers key tiles 2kj (its first 8 keys) and 2kj + 1 (the next 8): a0 and a1 come from tile 2kj, a2 and a3 from 2kj + 1.
    #   hint 2: within a tile, row g is s[n, 0], s[n, 1] and row g + 8 is s[n, 2], s[n, 3]: exactly the pairs a register holds.
    #   hint 3 (nearly the answer): each register is _pack(lo, hi, bf16): the two float32 probabilities rounded to the half type, lo the lower key.
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    return a0, a1, a2, a3


@cuda.jit(device=True, inline=True)
def _p_times_v(base, p_at, v_at, s, s2, o, o2, p_lane, v_lane, DP, BKV, P_REGS, bf16, A32, TWO):
    """o += P V over the tile's BKV keys: BKV / 16 k16 steps; an ldmatrix.x4.trans of V gives the B
    fragments of two n8 tiles of the head size (V is stored key-major: .trans turns it into B's layout).
    TWO: the second 16 queries' P (s2) takes the same V fragments into o2."""
    for kj in range(BKV // 16):
        if P_REGS:
            a0, a1, a2, a3 = _p_fragment(s, kj, bf16)
        else:
            a0, a1, a2, a3 = ldsm(base + uint64(p_at + p_lane + kj * 32), A32)  # 16 keys further: 32 bytes
        if TWO:
            c0, c1, c2, c3 = _p_fragment(s2, kj, bf16)
        for p in range(DP // 16):
            b = ldsm_trans(base + uint64(v_at + v_lane[p] + kj * 32 * DP), A32)
            _mma(o, 2 * p, a0, a1, a2, a3, b[0], b[1], bf16)
            _mma(o, 2 * p + 1, a0, a1, a2, a3, b[2], b[3], bf16)
            if TWO:
                _mma(o2, 2 * p, c0, c1, c2, c3, b[0], b[1], bf16)
                _mma(o2, 2 * p + 1, c0, c1, c2, c3, b[2], b[3], bf16)


@cuda.jit(device=True, inline=True)
def _flash_tc(q, k, v, out, scale_log2e, causal, smem, qf, s, o, m_run, l_run, second, q_lane, k_lane, v_lane,
              DP, BF16, P_REGS, ASYNC, SKIP, BQ, BKV, THREADS, STAGES, FAST, A32, ROWS, Q_IN_REGS):
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    S = q.shape[2]
    D = q.shape[3]
    is_causal = causal[0] != 0
    # When skipping under the mask, the heaviest query block of every head first (block_order)
    bh, q0 = block_order(SKIP and is_causal, BQ)
    TWO = ROWS == 32  # a warp's queries: one m16 tile (qf, s, o, m_run, l_run) or two (and the second's)
    # (one tuple: a Python call of more than 30 arguments compiles to *args, which numba cannot inline)
    qf2, s2, o2, m_run2, l_run2 = second
    CPR = DP // 8  # 16-byte chunks per row of Q, K, V
    TILE_BYTES = BKV * DP * 2
    # Q's fragments in registers from stage 2 on, up to D = 64: at D = 128 the 32 more registers (on
    # top of 64 output and 32 score accumulators) push ptxas past 255 into spills, and an ldmatrix
    # per k16 step from the Q tile (conflict-free once swizzled) is the cheaper price.
    Q_REGS = P_REGS and Q_IN_REGS and DP <= 64
    k_at = BQ * DP * 2  # after the Q tile
    v_at = k_at + STAGES * TILE_BYTES
    p_at = v_at + STAGES * TILE_BYTES  # stage 1's P tile (BQ x BKV halves, row-major)
    if A32:
        base = uint64(shared_address32(smem.ctypes.data))  # one conversion; the sums below stay 32-bit
    else:
        base = uint64(smem.ctypes.data)

    # Each lane's ldmatrix row addresses, computed once (byte offsets in a tile; lane l addresses row
    # l % 8 of matrix l // 8). Q (A operand, k16 step st): rows ROWS warp + l % 16, chunk 2 st + l // 16.
    # K (two key tiles, non-trans): key l % 8 + 8 (l // 16), chunk 2 st + (l // 8) % 2. V (.trans,
    # head-size tiles 2p, 2p + 1): key l % 16, chunk 2p + l // 16. 16 rows further is 32 DP bytes
    # for any swizzle (it depends on row % 8 only).
    for st in range(DP // 16):
        q_lane[st] = tile_offset(ROWS * warp + lane % 16, 2 * st + lane // 16, CPR, ASYNC)
        k_lane[st] = tile_offset(lane % 8 + 8 * (lane // 16), 2 * st + (lane // 8) % 2, CPR, ASYNC)
        v_lane[st] = tile_offset(lane % 16, 2 * st + lane // 16, CPR, ASYNC)
    p_lane = ((16 * warp + lane % 16) * BKV + 8 * (lane // 16)) * 2
    for half in range(2):
        m_run[half] = LOWEST
        l_run[half] = float32(0.0)
        m_run2[half] = LOWEST
        l_run2[half] = float32(0.0)
    for c in range(DP // 8):
        for e in range(4):
            o[c, e] = float32(0.0)
            o2[c, e] = float32(0.0)

    end = S
    if SKIP and is_causal:
        end = min(S, q0 + BQ)  # the block's last query sees no key past it
    tiles = (end + BKV - 1) // BKV
    i0 = q0 + ROWS * warp + lane // 4  # this lane's rows: i0 and i0 + 8 (and i0 + 16, i0 + 24 if TWO)
    if ASYNC:
        # The prologue: Q with key tile 0 in one group, then tiles 1 .. STAGES - 2 a group each (a
        # group is committed even when empty, so that "all but the newest STAGES - 2" counts tiles).
        issue_async(q, bh, q0, BQ, S, D, base, 0, DP, THREADS, A32, 2)
        for ahead in range(STAGES - 1):
            if ahead < tiles:
                issue_async(k, bh, ahead * BKV, BKV, S, D, base, k_at + ahead * TILE_BYTES, DP, THREADS, A32, 2)
                issue_async(v, bh, ahead * BKV, BKV, S, D, base, v_at + ahead * TILE_BYTES, DP, THREADS, A32, 2)
            cp_async_commit()
    else:
        _load_plain(q, bh, q0, BQ, S, D, smem, 0, DP, THREADS)
    buffer = 0  # tile % STAGES, counted (a 64-bit modulo of the tile index costs a dozen instructions)
    for tile in range(tiles):
        j0 = tile * BKV
        if ASYNC:
            # Tile `tile` has landed for every thread (the newest STAGES - 2 groups may still be in
            # flight), and every warp is done with tile - 1, whose buffer the next copies reuse: one
            # barrier for both.
            cp_async_wait_pending(STAGES - 2)
            cuda.syncthreads()
            nxt = tile + STAGES - 1
            if nxt < tiles:
                into = buffer - 1 if buffer > 0 else STAGES - 1  # nxt % STAGES: the buffer tile - 1 used
                issue_async(k, bh, nxt * BKV, BKV, S, D, base, k_at + into * TILE_BYTES, DP, THREADS, A32, 2)
                issue_async(v, bh, nxt * BKV, BKV, S, D, base, v_at + into * TILE_BYTES, DP, THREADS, A32, 2)
            cp_async_commit()
        else:
            cuda.syncthreads()  # every warp is done with the previous K and V tiles
            _load_plain(k, bh, j0, BKV, S, D, smem, k_at, DP, THREADS)
            _load_plain(v, bh, j0, BKV, S, D, smem, v_at, DP, THREADS)
            cuda.syncthreads()
        if Q_REGS and tile == 0:  # the Q fragments, once, into registers for the whole key loop
            _q_to_registers(base, 0, qf, q_lane, DP, A32)
            if TWO:
                _q_to_registers(base, 32 * DP, qf2, q_lane, DP, A32)  # 16 rows further
        kt_at = k_at + buffer * TILE_BYTES
        vt_at = v_at + buffer * TILE_BYTES
        _scores(base, 0, kt_at, qf, qf2, s, s2, q_lane, k_lane, DP, BKV, Q_REGS, BF16, A32, TWO)
        # Only the tail tile (keys past S) and, under the mask, tiles reaching past the block's first
        # query need the mask; the stages before causal_skip mask every tile. (A warp whose queries all
        # come before a tile's first key could skip it: timed in one run, no faster; not done.)
        masked = (not SKIP) or j0 + BKV > S or (is_causal and j0 + BKV > q0)
        online_softmax(s, o, m_run, l_run, i0, j0, S, scale_log2e, masked, is_causal, DP, BKV, FAST)
        if TWO:
            online_softmax(s2, o2, m_run2, l_run2, i0 + 16, j0, S, scale_log2e, masked, is_causal, DP, BKV, FAST)
        if not P_REGS:
            _p_to_shared(smem, p_at, s, warp, BF16)
            cuda.syncwarp()  # each warp reads back only its own 16 rows of P
        _p_times_v(base, p_at, vt_at, s, s2, o, o2, p_lane, v_lane, DP, BKV, P_REGS, BF16, A32, TWO)
        if not P_REGS:
            cuda.syncwarp()  # read before the next tile's P overwrites it
        buffer = buffer + 1 if buffer + 1 < STAGES else 0

    _store_rows(out, bh, i0, o, l_run, DP, BF16)
    if TWO:
        _store_rows(out, bh, i0 + 16, o2, l_run2, DP, BF16)


@cuda.jit(device=True, inline=True)
def _q_to_registers(base, q_at, qf, q_lane, DP, A32):
    """The A fragments of 16 queries of the Q tile at q_at, every k16 step, into qf (4 registers a step)."""
    for st in range(DP // 16):
        a = ldsm(base + uint64(q_at + q_lane[st]), A32)
        qf[4 * st] = a[0]
        qf[4 * st + 1] = a[1]
        qf[4 * st + 2] = a[2]
        qf[4 * st + 3] = a[3]


@cuda.jit(device=True, inline=True)
def _store_rows(out, bh, i0, o, l_run, DP, BF16):
    """Rows i0 and i0 + 8 of out[b, h] (this lane's columns): o divided by the row's sum, rounded to the
    half type two at a time."""
    H = out.shape[1]
    S = out.shape[2]
    D = out.shape[3]
    b = bh // H
    h = bh % H
    lane = cuda.threadIdx.x % 32
    for half in range(2):
        total = l_run[half]  # the row's sum: this lane's share plus its quad's
        total += cuda.shfl_xor_sync(FULL_MASK, total, 1)
        total += cuda.shfl_xor_sync(FULL_MASK, total, 2)
        inverse = float32(1.0) / total
        i = i0 + 8 * half
        for c in range(DP // 8):
            col = 8 * c + 2 * (lane % 4)
            packed = _pack(o[c, 2 * half] * inverse, o[c, 2 * half + 1] * inverse, BF16)
            if i < S and col < D:  # D is a multiple of 8: col + 1 < D too
                out[b, h, i, col] = uint16(packed & uint32(0xFFFF))
                out[b, h, i, col + 1] = uint16(packed >> uint32(16))


# Stage name -> (P_REGS, ASYNC, SKIP, geometry)
STAGE_SWITCHES = {
    "mma_scores": (False, False, False, BASE._replace(stages=1)),
    "p_in_registers": (True, False, False, BASE._replace(stages=1)),
    "async_kv": (True, True, False, BASE),
    "causal_skip": (True, True, True, BASE),
    "tuned": (True, True, True, {16: TUNED, 32: TUNED, 64: TUNED, 128: TUNED_WIDE}),
}
_BUILT: dict = {}


def smem_bytes(p_regs, geometry, DP):
    """Dynamic shared memory of a kernel: Q, its K and V buffers, stage 1's P tile."""
    g = geometry
    return 2 * (g.queries * DP + 2 * g.stages * g.keys * DP + (0 if p_regs else g.queries * g.keys))


def build_kernel(stage, DP, bf16, geometry=None):
    """The kernel of ``stage`` (its switches; its geometry unless one is given) for head sizes up to DP,
    fp16 or bf16 (made once per combination)."""
    P_REGS, ASYNC, SKIP, own = STAGE_SWITCHES[stage]
    own = own[DP] if isinstance(own, dict) else own  # a geometry per head size
    g = own if geometry is None else geometry
    key = (P_REGS, ASYNC, SKIP, DP, bool(bf16), g)  # tuned in stage 4's geometry is stage 4's kernel
    if key in _BUILT:
        return _BUILT[key]
    if g.keys % 16 or g.rows not in (16, 32) or (not P_REGS and (g.warps, g.keys, g.rows) != (BASE.warps, BASE.keys,
                                                                                             BASE.rows)):
        raise ValueError(f"no kernel for {stage} with {g}: keys a multiple of 16, 16 or 32 rows a warp "
                         "(stage 1: the base geometry)")
    BF16 = bool(bf16)
    QF = max(1, 4 * DP // 16)  # A-fragment registers of Q: 4 per k16 step
    STEPS = DP // 16
    O_SHAPE = (DP // 8, 4)  # the output rows' C fragments: one per n8 tile of the head size
    S_SHAPE = (g.keys // 8, 4)  # the scores' C fragments: one per n8 tile of keys
    BQ_, BKV_, THREADS_, STAGES_, FAST, A32 = g.queries, g.keys, 32 * g.warps, g.stages, g.fast_exp, g.addr32
    ROWS, Q_IN_REGS = g.rows, g.q_regs

    def kernel(q, k, v, out, scale_log2e, causal):
        smem = cuda.shared.array(0, uint16, alignment=ALIGN16)
        qf = cuda.local.array(QF, uint32)
        s = cuda.local.array(S_SHAPE, float32)
        o = cuda.local.array(O_SHAPE, float32)
        m_run = cuda.local.array(2, float32)
        l_run = cuda.local.array(2, float32)
        # The warp's second m16 tile (rows = 32); with one, these are only zeroed, and compile away.
        qf2 = cuda.local.array(QF, uint32)
        s2 = cuda.local.array(S_SHAPE, float32)
        o2 = cuda.local.array(O_SHAPE, float32)
        m_run2 = cuda.local.array(2, float32)
        l_run2 = cuda.local.array(2, float32)
        q_lane = cuda.local.array(STEPS, int32)
        k_lane = cuda.local.array(STEPS, int32)
        v_lane = cuda.local.array(STEPS, int32)
        _flash_tc(q, k, v, out, scale_log2e, causal, smem, qf, s, o, m_run, l_run, (qf2, s2, o2, m_run2, l_run2),
                  q_lane, k_lane, v_lane, DP, BF16, P_REGS, ASYNC, SKIP, BQ_, BKV_, THREADS_, STAGES_, FAST, A32, ROWS,
                  Q_IN_REGS)

    # A module-level name of its own, for the tools that find kernels by module and name (workbench ptx).
    name = f"_flash_tc_{stage}_d{DP}_{'bf16' if BF16 else 'f16'}"
    if g != own:
        name += "_" + "_".join(str(int(x)) for x in g)
    kernel.__name__ = kernel.__qualname__ = name
    compiled = cuda.jit(**_gpu_options(launch_bounds=(32 * g.warps, g.min_blocks)))(kernel)
    globals()[name] = _BUILT[key] = compiled
    return compiled


def _bits(a):
    """The raw 16-bit patterns of a half array (the kernels move bits; the tensor cores interpret them)."""
    arr = a if hasattr(a, "is_c_contiguous") else cuda.as_cuda_array(a)
    return arr.view(np.uint16)


def launch(stage, q, k, v, causal, out, geometry=None):
    """Run ``stage``'s kernel (in another geometry if one is given): one block per 16 warps queries of
    each (batch, head)."""
    B, H, S, D = q.shape
    bf16 = np.dtype(q.dtype) != np.float16
    DP = padded_head_dim(D)
    P_REGS, ASYNC, _, own = STAGE_SWITCHES[stage]
    own = own[DP] if isinstance(own, dict) else own
    g = own if geometry is None else geometry
    if ASYNC and not aligned16(q, k, v):
        raise InputError("q, k and v must start on 16-byte boundaries (cp.async copies 16 aligned bytes)")
    kernel = build_kernel(stage, DP, bf16, geometry)
    args = (_bits(q), _bits(k), _bits(v), _bits(out), np.float32(LOG2E / math.sqrt(D)), causal)
    nbytes = smem_bytes(P_REGS, g, DP)
    if nbytes > STATIC_LIMIT:
        set_max_dynamic_shared_memory(kernel, args, nbytes)
    kernel[(B * H, blocks_for(S, g.queries)), 32 * g.warps, 0, nbytes](*args)


def launch_geometry(geometry):
    """A launcher of the tuned stage's kernel in ``geometry`` (the script's side-by-side sweep)."""
    def run(q, k, v, causal, out):
        _validator_for(np.dtype(q.dtype))(q, k, v, causal, out)
        launch("tuned", q, k, v, causal, out, geometry)
    return run


# -- 1. mma_scores -------------------------------------------------------------------------------

@_stage("mma_scores", """
    Both products on the tensor cores. A block of 4 warps owns 64 queries (16 a warp) and walks the
    keys 64 at a time: Q, K and V tiles in shared memory (plain 16-bit loads, zero past S and D). A
    warp's 16 x 64 scores are 8 mma.sync.m16n8k16 accumulators per k16 step of the head size, the
    B fragments of two key tiles coming from one ldmatrix.x4 (K's rows are B's columns as stored, no
    transpose). The online softmax works on the accumulator fragments where they are: a lane holds 2
    rows x 16 keys, so a row's maximum and sum take two shuffles within its quad (xor 1 and 2). P is
    written to shared memory in the half type, one warp's rows each, and loaded back by ldmatrix as
    the A operand of P V; V's B fragments come through ldmatrix.trans (V is stored key-major).
    Softmax statistics and both accumulators stay float32; exp2 with the scale folded in.""")
def mma_scores(q, k, v, causal, out):
    launch("mma_scores", q, k, v, causal, out)


# -- 2. p_in_registers ---------------------------------------------------------------------------

@_stage("p_in_registers", """
    FlashAttention-2's register trick. The C fragment of key tile n holds rows g and g + 8, keys 2q and
    2q + 1; the A fragment of P V's k-step j wants rows g and g + 8, keys 2q, 2q + 1 and 8 more: the
    C fragments of key tiles 2j and 2j + 1, rounded to halves and packed in pairs, are that A fragment.
    P never leaves the registers: no shared-memory stores, no ldmatrix, no warp barrier between the
    softmax and P V. Up to D = 64 the Q fragments are loaded once, before the key loop, and stay in
    registers (4 per k16 step) instead of an ldmatrix per tile; at D = 128 those 32 registers, beside
    64 output and 32 score accumulators, would push ptxas past 255 into spills, so Q is still read
    from its shared tile.""")
def p_in_registers(q, k, v, causal, out):
    launch("p_in_registers", q, k, v, causal, out)


# -- 3. async_kv ---------------------------------------------------------------------------------

@_stage("async_kv", """
    The tiles arrive by cp.async, 16 bytes a copy, two buffers of K and V: the copies of key tile t + 1
    are issued before tile t's math and land while it runs, so one barrier per tile is all the
    waiting (it also tells every warp that the buffer the next copies reuse is free). The tiles are
    swizzled: chunk c of row r is stored at c XOR (r mod 8), so the 8 rows one ldmatrix phase reads
    are in 8 different bank groups (stages 1 and 2 read 8 rows 128 or 256 bytes apart, all in the
    same banks). At D = 128 the Q tile and two K and V buffers take 80 KiB: past the 48 KiB default,
    raised with set_max_dynamic_shared_memory (two blocks still fit an SM). The loads were what
    stages 1 and 2 waited on, not the tensor cores: on an H200 at 8x16x2048x64 fp16 without the
    mask, p_in_registers took 11.3 ms, moving K and V 2 bytes a load, and this stage 1.02 ms.""")
def async_kv(q, k, v, causal, out):
    launch("async_kv", q, k, v, causal, out)


# -- 4. causal_skip ------------------------------------------------------------------------------

@_stage("causal_skip", """
    Under the causal mask, stages 1 to 3 compute every key tile and mask half of them away. Here a
    block stops at its diagonal: its 64 queries from q0 see no key past q0 + 63, so later tiles are
    never copied or multiplied, and only the tiles that reach past q0 (the diagonal one) or past S
    are masked (the test is skipped on the others). The blocks now have unequal work, so they are
    started heaviest first: the last query block of every head, then the one before it, and so on
    (block_order in _flash_mma.py), so that the long blocks start at once and the short ones fill in
    at the end. Without the mask this is stage 3.""")
def causal_skip(q, k, v, causal, out):
    launch("causal_skip", q, k, v, causal, out)



# -- 5. tuned ------------------------------------------------------------------------------------

@_stage("tuned", """
    Stage 4 with fewer instructions around the mma and twice the queries a warp; the ideas are the ones
    FlashAttention-2 implementations use, and the mix (TUNED) is picked from the alternatives timed
    side by side on an H200 (Geometry: warps a block, queries a warp, keys a tile,
    pipeline depth, exp2, addressing, register cap). Each warp now owns 32 queries, two m16 tiles:
    every K fragment an ldmatrix brings feeds four mma instead of two, and so does every V fragment.
    At 16 queries a warp, ldmatrix moved 512 bytes of shared memory for each 8192 flops, and an SM's
    shared memory gives 128 bytes a clock: that capped the SM near 2048 flops a clock, under what its
    tensor cores do. The price is registers: two tiles' scores and outputs take 128, so Q's fragments
    are read from its shared tile each k16 step instead of kept (249 registers, no spill; kept, 255
    and a spill), and two blocks of 4 warps share an SM. exp2 is one ex2.approx.ftz (libdevice's
    exp2f wraps the same MUFU.EX2 in a test and two multiplies for subnormal results, which a weight
    below 2^-126 next to the row maximum's 1 never needs), and the scale moves into its argument: the
    scores and the maximum stay unscaled, exp2(s scale - m scale) is one fused multiply-add. Shared
    addresses are converted to the 32-bit shared window once (cvta) and every ldmatrix and cp.async
    offset is added in 32 bits, where stage 4 added 64-bit generic addresses (an add-with-carry pair
    each); a copy's global address is the tile's first row, once a tile, plus an offset the thread
    keeps. On the H200 (fp16, 8x16x2048x64, no mask) this layout ran in 593.7 us, 231.5 TFLOP/s,
    51% of SDPA's 303.6 in the same run; 16 queries a warp with the same ideas (three K/V buffers,
    three blocks an SM, the layout this stage had before) took 686.0. At D = 128 two tiles' output
    accumulators alone would be 128 registers: there a warp keeps 16 queries. Same fragments, same
    online softmax, same skip under the mask.""")
def tuned(q, k, v, causal, out):
    launch("tuned", q, k, v, causal, out)


# == the Hopper stage (sm_90a): FlashAttention-3's structure ========================================
#
# A block of three warpgroups (384 threads) owns 128 queries of one (batch, head). Warpgroup 0 is the
# producer: one of its threads issues every copy, by TMA (cp.async.bulk.tensor through tensor maps of
# q, k and v seen as 2-D (B H S) x D arrays, boxes of 64 columns, 128-byte swizzled), into a ring of
# K and V slots in shared memory; each copy completes on an mbarrier ("full"). Warpgroups 1 and 2 are
# the consumers, 64 queries each, and walk the key tiles: S = Q K^T by wgmma from two descriptors (Q and
# K both K-major: a key's row of D elements is the B operand's column), the online softmax on S's
# accumulators where they are (a wgmma accumulator tile is, warp by warp, mma.sync's C fragment, so
# online_softmax of the mma.sync stages runs unchanged), P packed to halves in registers (the same
# _p_fragment: the C fragments of two n8 key tiles are the A fragment of a k16 step), then O += P V by
# wgmma with A from those registers and V's tile from a transposed (MN-major) descriptor. Each consumer
# then arrives on the slot's "empty" barrier, and the producer refills a slot once both have.
#
# Shared memory from the first 1024-byte boundary (every tile in 64-column blocks of rows x 128 bytes,
# the 128B swizzle's layout, each block 1024-aligned): Q (128 rows), STAGES K slots, STAGES V slots
# (BKV rows each), then the barriers: Q's, STAGES "K full", STAGES "V full", STAGES "empty".

WG_QUERIES = 64  # a consumer warpgroup's queries: wgmma's m64
HOPPER_CONSUMERS = 2
HOPPER_BQ = WG_QUERIES * HOPPER_CONSUMERS  # queries a block
HOPPER_BKV = 128  # keys a tile: S is 64 x 128 a warpgroup, 64 float32 accumulators a thread
HOPPER_STAGES = 3  # K and V slots in the ring (D = 128: Q's 32 KiB and 3 x 64 KiB, within an SM's 227 KiB)
HOPPER_THREADS = 128 * (1 + HOPPER_CONSUMERS)
HOPPER_HEAD_DIMS = (64, 128)  # whole 128-byte rows of the swizzle; other head sizes run the tuned kernel


def hopper_layout(DP):
    """Byte offsets (from the 1024-aligned start) of Q, the K and V slots and the barriers, and the
    dynamic shared memory a block asks for (1 KiB more, to reach the 1024-byte boundary)."""
    q_bytes = HOPPER_BQ * DP * 2
    tile = HOPPER_BKV * DP * 2
    k_at = q_bytes
    v_at = k_at + HOPPER_STAGES * tile
    bars = v_at + HOPPER_STAGES * tile
    return q_bytes, tile, k_at, v_at, bars, bars + 8 * (1 + 3 * HOPPER_STAGES) + 1024


def hopper_usable(q, k, v, D):
    """The Hopper kernel's preconditions: a head size of whole 128-byte rows, TMA-readable arrays."""
    return D in HOPPER_HEAD_DIMS and tma_ok(*(_bits(a).reshape(-1, D) for a in (q, k, v)))


GROUP_BLOCKS = 128  # under the mask, the heads whose blocks go together: about one wave of an H200's 132 SMs


@cuda.jit(device=True, inline=True)
def _item_order32(n, heads, blocks, heaviest_first):
    """(batch x head, query block) of item n (uint32) of heads x blocks, in 32-bit unsigned arithmetic (a
    64-bit division by a run-time number is a call to a subroutine in the compiled code, and any call in
    a kernel makes ptxas serialise its wgmma, as hgemm's tile_of_block says). Without the mask,
    block_order's: a head's query blocks together. Under the mask, heaviest first, but within groups of
    heads of about GROUP_BLOCKS blocks: block_order's heaviest-first over *all* heads starts the last
    query block of every head at once, and every one of them reads its whole head's K and V (128 heads
    x 2 MiB at 4x32x4096x128, far past the 50 MB L2): each head's K and V came from DRAM once for each
    of its query blocks. A group's blocks run together and share their few heads' K and V in L2."""
    if not heaviest_first:
        return int32(n // blocks), int32(n % blocks)
    group = uint32(uint32(GROUP_BLOCKS + blocks - uint32(1)) // blocks)  # heads a group
    per_group = uint32(group * blocks)
    first_head = uint32(uint32(n // per_group) * group)
    size = uint32(min(group, uint32(heads - first_head)))  # the last group may hold fewer heads
    within = uint32(n % per_group)
    return int32(first_head + within % size), int32(uint32(blocks - uint32(1) - uint32(within // size)))


@cuda.jit(device=True, inline=True)
def _order32(heaviest_first):
    """_item_order32 of this block in a grid of (batch x head, query block): item blockIdx.y x heads +
    blockIdx.x."""
    heads = uint32(cuda.gridDim.x)
    blocks = uint32(cuda.gridDim.y)
    n = uint32(uint32(cuda.blockIdx.y) * heads + uint32(cuda.blockIdx.x))
    return _item_order32(n, heads, blocks, heaviest_first)


@cuda.jit(device=True, inline=True)
def _tma_tile(tile_at, tensor_map, row, bar, rows, DP):
    """One thread: the copies of rows row .. row + rows - 1 of a (B H S) x D array into the tile at
    tile_at, a 64-column box at a time, completing on ``bar``, which first expects their bytes."""
    mbarrier_arrive_expect_tx(bar, rows * DP * 2)
    for cb in range(DP // 64):
        tma_load_2d(tile_at + uint64(cb * rows * 128), tensor_map, 64 * cb, row, bar)


@cuda.jit(device=True, inline=True)
def _store_rows_hopper(out32, row0, i0, o, l_run, S, DP, BF16):
    """Rows i0 and i0 + 8 (of S) of one head of out, whose row 0 is out32's row row0 (out32: out as
    32-bit words, (B H S) x D / 2): o over the row's sum, rounded in pairs, one 32-bit store a pair."""
    lane = cuda.threadIdx.x % 32
    for half in range(2):
        total = l_run[half]
        total += cuda.shfl_xor_sync(FULL_MASK, total, 1)
        total += cuda.shfl_xor_sync(FULL_MASK, total, 2)
        inverse = float32(1.0) / total
        i = i0 + 8 * half
        if i < S:
            for c in range(DP // 8):
                out32[row0 + i, 4 * c + lane % 4] = _pack(o[c, 2 * half] * inverse, o[c, 2 * half + 1] * inverse, BF16)


@cuda.jit(device=True, inline=True)
def _store_rows_unsigned(out32, row0, i0, o, l_run, S, DP, BF16):
    """_store_rows_hopper with unsigned indices: a signed index makes numba add the dimension to it when
    negative (Python's wraparound), a compare and a select of a 64-bit value a column, and in the
    persistent kernel ptxas hoists those of the constant columns out of its item loop, where at D = 128
    they no longer fit in the registers (42 words spilled)."""
    lane = cuda.threadIdx.x % 32
    for half in range(2):
        total = l_run[half]
        total += cuda.shfl_xor_sync(FULL_MASK, total, 1)
        total += cuda.shfl_xor_sync(FULL_MASK, total, 2)
        inverse = float32(1.0) / total
        i = i0 + 8 * half
        if i < S:
            for c in range(DP // 8):
                out32[uint64(row0 + i), uint64(4 * c + lane % 4)] = _pack(o[c, 2 * half] * inverse,
                                                                          o[c, 2 * half + 1] * inverse, BF16)


@cuda.jit(device=True, inline=True)
def _q_k_descriptors(q_at, k_tile, st, BQ, BKV):
    """The descriptors of k16 step st of Q (the warpgroup's 64 rows at q_at) and of a K tile: 32 bytes a
    step into the 128-byte rows of 64-column block st // 4 (blocks BQ or BKV rows x 128 bytes apart)."""
    inside = uint64(32 * (st % 4))
    return (shared_descriptor(q_at + uint64((st // 4) * BQ * 128) + inside, 16, 1024),
            shared_descriptor(k_tile + uint64((st // 4) * BKV * 128) + inside, 16, 1024))


@cuda.jit(device=True, inline=True)
def _v_descriptor(v_tile, kj, BKV):
    """V's k16 step kj (16 keys: 16 rows of 128 bytes further), MN-major: its 64-column blocks of the head
    size BKV x 128 bytes apart (the leading offset), 8-key atoms 1024 apart (the stride offset)."""
    return shared_descriptor(v_tile + uint64(kj * 16 * 128), BKV * 128, 1024)


@cuda.jit(device=True, inline=True)
def _mask_tile(s, i0, j0, S, causal, BKV):
    """-inf for this lane's scores of keys past S or (causal) past their row, in 32-bit arithmetic: per
    row, how many keys from the lane's first one the row may see, then one compare a score against a
    constant (8n + e). Rows i0 (s[:, 0:2]) and i0 + 8 (s[:, 2:4]), keys j0 + 8n + 2q + e."""
    first = int32(j0 + int32(2 * (cuda.threadIdx.x % 4)))
    for half in range(2):
        seen = int32(S - first)
        if causal:
            seen = min(seen, int32(int32(i0 + 8 * half + 1) - first))
        for n in range(BKV // 8):
            for e in range(2):
                if 8 * n + e >= seen:
                    s[n, 2 * half + e] = NEG_INF


def _hopper_device_functions(DP, BF16, PINGPONG, CONSUMERS=HOPPER_CONSUMERS, BKV=HOPPER_BKV):
    """The Hopper kernels' device functions for head size DP, fp16 or bf16, CONSUMERS consumer warpgroups
    of 64 queries and key tiles of BKV (the turns of the consumers only with PINGPONG): my_turn,
    your_turn, issue_scores, issue_scores_from, issue_values, issue_values_from, pack_p, fence_s, fence_o."""
    BQ_, BKV_ = WG_QUERIES * CONSUMERS, BKV
    KIND = "bf16" if BF16 else "f16"
    scores_mma = getattr(hopper, f"wgmma_{KIND}_ss_n{BKV_}")  # S = Q K^T: n = the tile's keys
    values_mma = getattr(hopper, f"wgmma_{KIND}_rs_n{DP}")  # O += P V: n = the head size
    fence_s = getattr(hopper, f"wgmma_fence_operands_{BKV_ // 2}")
    fence_o = getattr(hopper, f"wgmma_fence_operands_{DP // 2}")
    TURN_THREADS = 2 * 128  # a turn's named barrier: one consumer syncs on it, the one before it arrives

    @cuda.jit(device=True, inline=True)
    def my_turn(c):
        """Wait until the consumer before this one has issued its wgmma (named barrier 1 + c; 0 is
        syncthreads')."""
        if PINGPONG:
            named_barrier_sync(1 + c, TURN_THREADS)

    @cuda.jit(device=True, inline=True)
    def your_turn(c):
        """Hand the turn on to the next consumer, round robin (with two: the other one)."""
        if PINGPONG:
            if CONSUMERS == 2:
                named_barrier_arrive(2 - c, TURN_THREADS)
            else:
                named_barrier_arrive(c + 2 if c != CONSUMERS - 1 else 1, TURN_THREADS)

    @cuda.jit(device=True, inline=True)
    def issue_scores(s, q_at, k_tile):
        """S = Q K^T for one key tile, as one wgmma group (the first k16 step overwrites S)."""
        for st in range(DP // 16):
            desc_q, desc_k = _q_k_descriptors(q_at, k_tile, st, BQ_, BKV_)
            scores_mma(s, desc_q, desc_k, 1 if st > 0 else 0)
        wgmma_commit()

    @cuda.jit(device=True, inline=True)
    def issue_scores_from(s, q_desc, k_desc):
        """issue_scores from the descriptors of Q's and the K tile's first k16 step, each step's moved by
        a constant (32 bytes a step, the next 64-column block BQ or BKV rows x 128 bytes further)."""
        for st in range(DP // 16):
            scores_mma(s, advance_descriptor(q_desc, (st // 4) * BQ_ * 128 + 32 * (st % 4)),
                       advance_descriptor(k_desc, (st // 4) * BKV_ * 128 + 32 * (st % 4)), 1 if st > 0 else 0)
        wgmma_commit()

    @cuda.jit(device=True, inline=True)
    def issue_values_from(o, pf, v_desc):
        """issue_values from the descriptor of the V tile's first k16 step (16 rows of 128 bytes a step)."""
        for kj in range(BKV_ // 16):
            values_mma(o, pf[4 * kj], pf[4 * kj + 1], pf[4 * kj + 2], pf[4 * kj + 3],
                       advance_descriptor(v_desc, kj * 16 * 128), 1)
        wgmma_commit()

    @cuda.jit(device=True, inline=True)
    def pack_p(pf, s):
        """P's halves, packed in the A registers of P V (_p_fragment's pairing, k-step by k-step)."""
        for kj in range(BKV_ // 16):
            a0, a1, a2, a3 = _p_fragment(s, kj, BF16)
            pf[4 * kj] = a0
            pf[4 * kj + 1] = a1
            pf[4 * kj + 2] = a2
            pf[4 * kj + 3] = a3

    @cuda.jit(device=True, inline=True)
    def issue_values(o, pf, v_tile):
        """O += P V for one key tile, as one wgmma group: A from pf (which must stay untouched until the
        group is waited for: the tensor cores read registers asynchronously too)."""
        for kj in range(BKV_ // 16):
            desc_v = _v_descriptor(v_tile, kj, BKV_)
            values_mma(o, pf[4 * kj], pf[4 * kj + 1], pf[4 * kj + 2], pf[4 * kj + 3], desc_v, 1)
        wgmma_commit()

    return (my_turn, your_turn, issue_scores, issue_scores_from, issue_values, issue_values_from, pack_p, fence_s,
            fence_o)


def _lean_key_loop(DP, BF16, RELEASE_Q, PINGPONG=True, CONSUMERS=HOPPER_CONSUMERS, BKV=HOPPER_BKV):
    """lean_loop's key loop, for one consumer and one block of queries: the lean_loop kernel runs it once,
    the persistent kernel once an item. Tile 0's S and softmax, then each step issues tile t's S and
    tile t - 1's P V, waits for S only and runs tile t's softmax while P V is still on the tensor cores;
    then the last P V. The mask only on tiles from ``whole`` on (_mask_tile, in 32 bits); the
    descriptors made once by the caller and moved by the slot's offset; the slot and the parity of its
    "full" phase carried in and out (the caller's are those of the tile before this block's first).
    RELEASE_Q: once the last S has completed, every thread arrives on ``q_empty`` (the persistent
    kernel's Q buffer may take the next item's Q). PINGPONG: the CONSUMERS consumers take turns to issue,
    round robin. BKV: keys a tile."""
    BKV_, STAGES_ = BKV, HOPPER_STAGES
    TILE = BKV * DP * 2
    LAST = CONSUMERS - 1
    (my_turn, your_turn, _, issue_scores_from, _, issue_values_from, pack_p, fence_s,
     fence_o) = _hopper_device_functions(DP, BF16, PINGPONG, CONSUMERS, BKV)

    @cuda.jit(device=True, inline=True)
    def key_loop(s, o, pf, alpha, m_run, l_run, q_desc, k_desc, v_desc, k_full, v_full, empty, q_empty, slot, phase,
                 tiles, whole, i0, S32, is_causal, scale_log2e, c, more_turns):
        slot = int32(slot + 1)
        if slot == STAGES_:
            slot = int32(0)
            phase = int32(phase ^ 1)
        mbarrier_wait(k_full + uint64(8 * slot), phase)
        my_turn(c)
        wgmma_fence()
        issue_scores_from(s, q_desc, advance_descriptor(k_desc, slot * TILE))
        your_turn(c)
        wgmma_wait0()
        fence_s(s)
        if whole == 0:
            _mask_tile(s, i0, int32(0), S32, is_causal, BKV_)
        softmax_tile(s, alpha, m_run, l_run, i0, 0, S32, scale_log2e, False, is_causal, BKV_, True)
        pack_p(pf, s)
        for tile in range(int32(1), tiles):
            before = slot
            before_phase = phase
            slot = int32(slot + 1)
            if slot == STAGES_:
                slot = int32(0)
                phase = int32(phase ^ 1)
            mbarrier_wait(k_full + uint64(8 * slot), phase)
            mbarrier_wait(v_full + uint64(8 * before), before_phase)
            my_turn(c)
            wgmma_fence()
            issue_scores_from(s, q_desc, advance_descriptor(k_desc, slot * TILE))
            issue_values_from(o, pf, advance_descriptor(v_desc, before * TILE))
            your_turn(c)
            wgmma_wait1()  # S is ready; P V may still run
            fence_s(s)
            if tile >= whole:  # a branch around the mask, not a select per score
                _mask_tile(s, i0, int32(tile * BKV_), S32, is_causal, BKV_)
            softmax_tile(s, alpha, m_run, l_run, i0, 0, S32, scale_log2e, False, is_causal, BKV_, True)
            wgmma_wait0()  # P V is done: its slot may be refilled, pf rewritten, O rescaled
            fence_o(o)
            if cuda.threadIdx.x % 128 == 0:
                mbarrier_arrive(empty + uint64(8 * before))
            rescale_rows(o, alpha, DP)
            pack_p(pf, s)
        if RELEASE_Q:
            # Every thread arrives, not one a warpgroup: each read the item's number, and its arrival
            # (a release) is what orders that read before the producer's next write.
            mbarrier_arrive(q_empty)
        mbarrier_wait(v_full + uint64(8 * slot), phase)
        my_turn(c)
        wgmma_fence()
        issue_values_from(o, pf, advance_descriptor(v_desc, slot * TILE))
        # (the last consumer answers at the next block's or item's start, if any, unless more_turns: it
        # has turns left in this item, without tiles of its own; with two, c == 0 as it has always been)
        if (c == 0) if CONSUMERS == 2 else (c != LAST or more_turns):
            your_turn(c)
        wgmma_wait0()
        fence_o(o)
        if cuda.threadIdx.x % 128 == 0:
            mbarrier_arrive(empty + uint64(8 * slot))
        return slot, phase

    return key_loop


def _hopper_kernel_source(DP, BF16, OVERLAP, PINGPONG, LEAN=False):
    """The Hopper stages' kernel for head size DP (64 or 128), fp16 or bf16; OVERLAP: the softmax of a
    tile runs while the previous tile's P V is still on the tensor cores (the overlap_softmax stage);
    PINGPONG: the two consumers take turns to issue their wgmma (the pingpong stage); LEAN (with both):
    the key loop without the integer work the others repeat every tile (the lean_loop stage)."""
    Q_BYTES, TILE, K_AT, V_AT, BARS, _ = hopper_layout(DP)
    BQ_, BKV_, STAGES_ = HOPPER_BQ, HOPPER_BKV, HOPPER_STAGES
    S_SHAPE = (BKV_ // 8, 4)  # S's accumulators: mma.sync's C fragment of each 8-key slice
    O_SHAPE = (DP // 8, 4)
    P_REGS = BKV_ // 4  # P's A registers: 4 a k16 step of keys
    (my_turn, your_turn, issue_scores, _, issue_values, _, pack_p, fence_s,
     fence_o) = _hopper_device_functions(DP, BF16, PINGPONG)
    key_loop = _lean_key_loop(DP, BF16, False) if LEAN else None

    def kernel(q, k, v, out32, scale_log2e, causal, map_q, map_k, map_v):
        smem = cuda.shared.array(0, uint16, alignment=ALIGN16)
        s = cuda.local.array(S_SHAPE, float32)
        o = cuda.local.array(O_SHAPE, float32)
        pf = cuda.local.array(P_REGS, uint32)
        m_run = cuda.local.array(2, float32)
        l_run = cuda.local.array(2, float32)
        alpha = cuda.local.array(2, float32)
        t = cuda.threadIdx.x
        wg = t // 128
        S = q.shape[2]
        is_causal = causal[0] != 0
        bh, qb = _order32(is_causal)
        q0 = qb * BQ_
        row0 = bh * S  # the head's first row in the (B H S) x D views
        tiles_at = smem.ctypes.data + uint64(tile_pad(smem))
        q_bar = tiles_at + uint64(BARS)
        k_full = q_bar + uint64(8)
        v_full = k_full + uint64(8 * STAGES_)
        empty = v_full + uint64(8 * STAGES_)
        end = min(S, q0 + BQ_) if is_causal else S  # under the mask the block's last query sees no key past it
        # At least one tile (q0 < S, but the compiler cannot know): a path around the loop would make
        # ptxas serialise every wgmma (C7515, as in hgemm's warp_specialized).
        tiles = max((end + BKV_ - 1) // BKV_, 1)
        if t == 0:
            mbarrier_init(q_bar, 1)
            for st in range(STAGES_):
                mbarrier_init(k_full + uint64(8 * st), 1)
                mbarrier_init(v_full + uint64(8 * st), 1)
                mbarrier_init(empty + uint64(8 * st), HOPPER_CONSUMERS)
            fence_proxy_async()  # the copy engine must see the initialised barriers
        cuda.syncthreads()
        if wg == 0:  # the producer: one thread keeps the ring full
            setmaxnreg_producer()
            if t == 0 and LEAN:
                _tma_tile(tiles_at, map_q.ctypes.data, row0 + q0, q_bar, BQ_, DP)
                slot = int32(0)
                wrapped = int32(0)  # the parity of the "empty" phase to wait for: 0 in the ring's second round
                for tile in range(tiles):
                    if tile >= STAGES_:  # both consumers are done with the slot's previous tiles
                        mbarrier_wait(empty + uint64(8 * slot), wrapped)
                    j = row0 + tile * BKV_
                    _tma_tile(tiles_at + uint64(K_AT + slot * TILE), map_k.ctypes.data, j, k_full + uint64(8 * slot),
                              BKV_, DP)
                    _tma_tile(tiles_at + uint64(V_AT + slot * TILE), map_v.ctypes.data, j, v_full + uint64(8 * slot),
                              BKV_, DP)
                    slot = int32(slot + 1)
                    if slot == STAGES_:
                        slot = int32(0)
                        if tile >= STAGES_:
                            wrapped = int32(wrapped ^ 1)
            elif t == 0:
                _tma_tile(tiles_at, map_q.ctypes.data, row0 + q0, q_bar, BQ_, DP)
                for tile in range(tiles):
                    slot = tile % STAGES_
                    if tile >= STAGES_:  # both consumers are done with the slot's previous tiles
                        mbarrier_wait(empty + uint64(8 * slot), (tile // STAGES_ - 1) % 2)
                    j = row0 + tile * BKV_
                    _tma_tile(tiles_at + uint64(K_AT + slot * TILE), map_k.ctypes.data, j, k_full + uint64(8 * slot),
                              BKV_, DP)
                    _tma_tile(tiles_at + uint64(V_AT + slot * TILE), map_v.ctypes.data, j, v_full + uint64(8 * slot),
                              BKV_, DP)
        else:  # a consumer: 64 queries, FlashAttention on wgmma
            setmaxnreg_consumer()
            c = wg - 1
            lane = t % 32
            i0 = q0 + WG_QUERIES * c + 16 * ((t % 128) // 32) + lane // 4  # this lane's rows: i0, i0 + 8
            q_at = tiles_at + uint64(WG_QUERIES * c * 128)  # the warpgroup's 64 rows of each Q column block
            for half in range(2):
                m_run[half] = LOWEST
                l_run[half] = float32(0.0)
            for n in range(DP // 8):
                for e in range(4):
                    o[n, e] = float32(0.0)
            mbarrier_wait(q_bar, 0)
            if PINGPONG and c == 1:
                your_turn(c)  # consumer 0 goes first
            if LEAN:
                # overlap_softmax's and pingpong's schedule. Three things the loop no longer does every
                # tile: the mask (only tiles from `whole` on have keys past S or past a row: the
                # diagonal one, the tail; there _mask_tile, in 32 bits, before an unmasked softmax),
                # the descriptors (made once, then moved by constants and by the slot's offset), the
                # slot and the phase parity (carried, not divided out of the tile's index in 64 bits).
                S32 = int32(S)
                whole = int32(int32(min(S32, int32(q0)) if is_causal else S32) // BKV_)  # unmasked tiles
                key_loop(s, o, pf, alpha, m_run, l_run, shared_descriptor(q_at, 16, 1024),
                         shared_descriptor(tiles_at + uint64(K_AT), 16, 1024),
                         shared_descriptor(tiles_at + uint64(V_AT), BKV_ * 128, 1024), k_full, v_full, empty,
                         uint64(0), int32(STAGES_ - 1), int32(1), tiles, whole, int32(i0), S32, is_causal,
                         scale_log2e, c, False)
            elif OVERLAP:
                # Tile 0's S and softmax first; then each step issues tile t's S = Q K^T and tile t - 1's
                # O += P V as two groups, waits for the first only (wgmma_wait1: groups finish in order),
                # and runs tile t's softmax while P V is still on the tensor cores. O's rescale by alpha
                # waits for that P V (it was computed against the previous maximum), then P is repacked.
                mbarrier_wait(k_full, 0)
                my_turn(c)
                wgmma_fence()
                issue_scores(s, q_at, tiles_at + uint64(K_AT))
                your_turn(c)
                wgmma_wait0()
                fence_s(s)  # nothing reads S's registers before the wait (see _hopper's wgmma_fence_operands)
                masked = BKV_ > S or (is_causal and BKV_ > q0)
                softmax_tile(s, alpha, m_run, l_run, i0, 0, S, scale_log2e, masked, is_causal, BKV_, True)
                pack_p(pf, s)
                for tile in range(1, tiles):
                    slot = tile % STAGES_
                    before = (tile - 1) % STAGES_
                    mbarrier_wait(k_full + uint64(8 * slot), (tile // STAGES_) % 2)
                    mbarrier_wait(v_full + uint64(8 * before), ((tile - 1) // STAGES_) % 2)
                    my_turn(c)
                    wgmma_fence()
                    issue_scores(s, q_at, tiles_at + uint64(K_AT + slot * TILE))
                    issue_values(o, pf, tiles_at + uint64(V_AT + before * TILE))
                    your_turn(c)
                    wgmma_wait1()  # S is ready; P V may still run
                    fence_s(s)
                    j0 = tile * BKV_
                    masked = j0 + BKV_ > S or (is_causal and j0 + BKV_ > q0)  # the tail tile, the diagonal one
                    softmax_tile(s, alpha, m_run, l_run, i0, j0, S, scale_log2e, masked, is_causal, BKV_, True)
                    wgmma_wait0()  # P V is done: its slot may be refilled, pf rewritten, O rescaled
                    fence_o(o)
                    if t % 128 == 0:
                        mbarrier_arrive(empty + uint64(8 * before))
                    rescale_rows(o, alpha, DP)
                    pack_p(pf, s)
                last = (tiles - 1) % STAGES_
                mbarrier_wait(v_full + uint64(8 * last), ((tiles - 1) // STAGES_) % 2)
                my_turn(c)
                wgmma_fence()
                issue_values(o, pf, tiles_at + uint64(V_AT + last * TILE))
                if c == 0:  # (consumer 1's last arrival would have no turn to answer it)
                    your_turn(c)
                wgmma_wait0()
                fence_o(o)
                if t % 128 == 0:
                    mbarrier_arrive(empty + uint64(8 * last))
            else:
                for tile in range(tiles):
                    slot = tile % STAGES_
                    parity = (tile // STAGES_) % 2
                    mbarrier_wait(k_full + uint64(8 * slot), parity)
                    wgmma_fence()
                    issue_scores(s, q_at, tiles_at + uint64(K_AT + slot * TILE))
                    wgmma_wait0()
                    fence_s(s)
                    j0 = tile * BKV_
                    masked = j0 + BKV_ > S or (is_causal and j0 + BKV_ > q0)  # the tail tile, the diagonal one
                    online_softmax(s, o, m_run, l_run, i0, j0, S, scale_log2e, masked, is_causal, DP, BKV_, True)
                    pack_p(pf, s)
                    mbarrier_wait(v_full + uint64(8 * slot), parity)
                    wgmma_fence()
                    issue_values(o, pf, tiles_at + uint64(V_AT + slot * TILE))
                    wgmma_wait0()
                    fence_o(o)
                    if t % 128 == 0:
                        mbarrier_arrive(empty + uint64(8 * slot))
            _store_rows_hopper(out32, row0, i0, o, l_run, S, DP, BF16)
    return kernel


PERSISTENT_TURNS = True  # the consumers take turns to issue their wgmma (pingpong's named barriers)
# At D = 64 an item is 64 queries a consumer warpgroup: three (FlashAttention-3's D = 64 shape) load each
# K and V tile once for 192 queries, and give the SM three S / P V chains to interleave. At D = 128
# two: O's 64 accumulators leave no room in 160 registers a thread.
PERSISTENT_CONSUMERS_D64 = 3
PERSISTENT_BKV_D64 = 128  # keys a tile at D = 64 (a multiple of 16; wgmma's n: see hopper.SIZED_WGMMA)
# setmaxnreg with three consumers (128 registers a thread at launch, 512 threads): the producer's
# warpgroup gives up what the consumers take, 32 + 3 x 160 = 4 x 128 (24 also leaves the consumers
# 160, the most a multiple of 8 can be).
THREE_CONSUMER_PRODUCER_REGISTERS = 32
# With three consumers each walks the key tiles its own rows need (under the mask, up to its own last
# row; one tile if all its rows are past S) and only takes its turns and frees its slots for the item's remaining tiles:
# at 8x16x2048x64 under the mask 192-query items would otherwise compute 11% more scores than
# 128-query ones (the rows' masked keys), as much as they save in K and V copies.
OWN_TILES_D64 = True


def persistent_shape(DP):
    """(consumer warpgroups, queries an item, keys a tile) of the persistent kernel at head size DP."""
    if DP == 64:
        return PERSISTENT_CONSUMERS_D64, WG_QUERIES * PERSISTENT_CONSUMERS_D64, PERSISTENT_BKV_D64
    return HOPPER_CONSUMERS, HOPPER_BQ, HOPPER_BKV


def persistent_threads(DP):
    """A persistent block's threads: the producer's warpgroup and the consumers'."""
    return 128 * (1 + persistent_shape(DP)[0])


def persistent_layout(DP):
    """hopper_layout's for the persistent kernel's shape (persistent_shape: Q of an item's queries, K and
    V slots of its key tiles), then after its barriers one more, "Q empty", and the number of the item
    whose Q is in the buffer (8 bytes each)."""
    _, BQ_, BKV_ = persistent_shape(DP)
    q_bytes = BQ_ * DP * 2
    tile = BKV_ * DP * 2
    k_at = q_bytes
    v_at = k_at + HOPPER_STAGES * tile
    bars = v_at + HOPPER_STAGES * tile
    return q_bytes, tile, k_at, v_at, bars, bars + 8 * (1 + 3 * HOPPER_STAGES) + 1024 + 16


def _persistent_kernel_source(DP, BF16):
    """The persistent stage's kernel for head size DP (64 or 128), fp16 or bf16: lean_loop's block, which
    runs items (a head's query block of 64 a consumer: persistent_shape's) one after the other, each
    claimed from a counter in global memory (claims[0]: the next item of _item_order32's order) when its
    producer is ready for one, with its barriers initialised once and its ring of K and V slots running
    on from one item to the next. The last block to find the items exhausted zeroes the counters
    (claims[1]: blocks done) for the next launch."""
    Q_BYTES, TILE, K_AT, V_AT, BARS, _ = persistent_layout(DP)
    CONSUMERS, BQ_, BKV_ = persistent_shape(DP)
    STAGES_ = HOPPER_STAGES
    LAST = CONSUMERS - 1
    S_SHAPE = (BKV_ // 8, 4)
    O_SHAPE = (DP // 8, 4)
    P_REGS = BKV_ // 4
    my_turn, your_turn = _hopper_device_functions(DP, BF16, PERSISTENT_TURNS, CONSUMERS, BKV_)[:2]
    key_loop = _lean_key_loop(DP, BF16, True, PERSISTENT_TURNS, CONSUMERS, BKV_)
    OWN_TILES = OWN_TILES_D64 and CONSUMERS == 3
    if CONSUMERS == 2:
        producer_registers, consumer_registers = setmaxnreg_producer, setmaxnreg_consumer
    else:
        producer_registers = getattr(hopper, f"setmaxnreg_dec_{THREE_CONSUMER_PRODUCER_REGISTERS}")
        consumer_registers = hopper.setmaxnreg_inc_160

    def kernel(q, k, v, out32, scale_log2e, causal, map_q, map_k, map_v, claims):
        smem = cuda.shared.array(0, uint16, alignment=ALIGN16)
        s = cuda.local.array(S_SHAPE, float32)
        o = cuda.local.array(O_SHAPE, float32)
        pf = cuda.local.array(P_REGS, uint32)
        m_run = cuda.local.array(2, float32)
        l_run = cuda.local.array(2, float32)
        alpha = cuda.local.array(2, float32)
        t = cuda.threadIdx.x
        wg = t // 128
        S = q.shape[2]
        S32 = int32(S)
        is_causal = causal[0] != 0
        heads = uint32(q.shape[0] * q.shape[1])
        blocks = uint32(uint32(S32 + int32(BQ_ - 1)) // uint32(BQ_))
        items = uint32(heads * blocks)
        grid = uint32(cuda.gridDim.x)
        pad = tile_pad(smem)
        tiles_at = smem.ctypes.data + uint64(pad)
        q_bar = tiles_at + uint64(BARS)
        k_full = q_bar + uint64(8)
        v_full = k_full + uint64(8 * STAGES_)
        empty = v_full + uint64(8 * STAGES_)
        q_empty = empty + uint64(8 * STAGES_)
        item_at = uint32(uint32(pad + BARS + 8 * (2 + 3 * STAGES_)) // uint32(2))  # smem's uint16s: the item's number
        if t == 0:  # once for all the block's items
            mbarrier_init(q_bar, 1)
            mbarrier_init(q_empty, 128 * CONSUMERS)  # every consumer thread: each has read the item's number
            for st in range(STAGES_):
                mbarrier_init(k_full + uint64(8 * st), 1)
                mbarrier_init(v_full + uint64(8 * st), 1)
                mbarrier_init(empty + uint64(8 * st), CONSUMERS)
            fence_proxy_async()
        cuda.syncthreads()
        if wg == 0:  # the producer: one thread keeps the ring full, item after item
            producer_registers()
            if t == 0:
                slot = int32(0)
                # Two parities in one register (the producer has 32 a thread with three consumers, and
                # one more value in its item loop is one spilled to local memory): bit 0, the "empty"
                # phase's to wait for, 1 in the ring's first round (a fresh barrier is past its phase of
                # parity 1: the wait returns at once), then 0, 1, ... as it wraps; bit 1, the items'.
                parities = int32(1)
                n = cuda.atomic.add(claims, 0, uint32(1))  # this block's first item
                while n < items:
                    bh, qb = _item_order32(n, heads, blocks, is_causal)
                    q0 = int32(qb * BQ_)
                    row0 = bh * S
                    end = min(S32, int32(q0 + BQ_)) if is_causal else S32
                    tiles = max(int32(int32(end + int32(BKV_ - 1)) // BKV_), int32(1))
                    for tile in range(tiles):
                        mbarrier_wait(empty + uint64(8 * slot), parities & 1)
                        j = row0 + tile * BKV_
                        _tma_tile(tiles_at + uint64(K_AT + slot * TILE), map_k.ctypes.data, j, k_full + uint64(8 * slot),
                                  BKV_, DP)
                        _tma_tile(tiles_at + uint64(V_AT + slot * TILE), map_v.ctypes.data, j, v_full + uint64(8 * slot),
                                  BKV_, DP)
                        if tile == 0:  # the item's first K and V are on their way: now its Q, once the last
                            # item's (one buffer) is read by every consumer (the first item's wait returns at once),
                            # and its number, which the consumers read once Q has landed
                            mbarrier_wait(q_empty, ((parities >> 1) & 1) ^ 1)
                            smem[item_at] = uint16(n & uint32(0xFFFF))
                            smem[item_at + uint32(1)] = uint16(n >> uint32(16))
                            _tma_tile(tiles_at, map_q.ctypes.data, row0 + q0, q_bar, BQ_, DP)
                        slot = int32(slot + 1)
                        if slot == STAGES_:
                            slot = int32(0)
                            parities = int32(parities ^ 1)
                    parities = int32(parities ^ 2)
                    n = cuda.atomic.add(claims, 0, uint32(1))  # the next item not yet claimed by any block
                # No item left: the consumers wake to an item number past the last (an arrival with no copy)
                mbarrier_wait(q_empty, ((parities >> 1) & 1) ^ 1)
                smem[item_at] = uint16(n & uint32(0xFFFF))
                smem[item_at + uint32(1)] = uint16(n >> uint32(16))
                mbarrier_arrive(q_bar)
                # Every block claims past the end once and then never again: the last to do so zeroes both
                # counters for the next launch (which starts after this one ends).
                if cuda.atomic.add(claims, 1, uint32(1)) == grid - uint32(1):
                    claims[0] = uint32(0)
                    claims[1] = uint32(0)
        else:  # a consumer: 64 queries of each item
            consumer_registers()
            # Which consumer, from a warp vote: uniform in ptxas' eyes, so the item loop with its named
            # barriers of id 1 + c is not compiled as divergent code (threadIdx-derived, it was).
            c = 1 if cuda.ballot_sync(FULL_MASK, wg == 2) != 0 else 0
            if CONSUMERS == 3:
                c = 2 if cuda.ballot_sync(FULL_MASK, wg == 3) != 0 else c
            lane = t % 32
            row = WG_QUERIES * c + 16 * ((t % 128) // 32) + lane // 4  # this lane's rows of an item: row, row + 8
            q_desc = advance_descriptor(shared_descriptor(tiles_at, 16, 1024), c * (WG_QUERIES * 128))
            k_desc = shared_descriptor(tiles_at + uint64(K_AT), 16, 1024)
            v_desc = shared_descriptor(tiles_at + uint64(V_AT), BKV_ * 128, 1024)
            slot = int32(STAGES_ - 1)  # the last tile's slot and its "full" phase's parity, across items
            phase = int32(1)
            item_phase = int32(0)
            while True:
                mbarrier_wait(q_bar, item_phase)  # the item's Q has landed, and its number beside it
                n = uint32(smem[item_at]) | (uint32(smem[item_at + uint32(1)]) << uint32(16))
                if n >= items:
                    break
                bh, qb = _item_order32(n, heads, blocks, is_causal)
                q0 = int32(qb * BQ_)
                row0 = bh * S
                i0 = int32(q0 + row)
                end = min(S32, int32(q0 + BQ_)) if is_causal else S32
                tiles = max(int32(int32(end + int32(BKV_ - 1)) // BKV_), int32(1))  # (no path around the loop)
                whole = int32(int32(min(S32, q0) if is_causal else S32) // BKV_)
                for half in range(2):
                    m_run[half] = LOWEST
                    l_run[half] = float32(0.0)
                for d in range(DP // 8):
                    for e in range(4):
                        o[d, e] = float32(0.0)
                if c == LAST:
                    your_turn(c)  # consumer 0 goes first, in every item
                mine = tiles
                if OWN_TILES:  # the tiles this consumer's rows see (at least one: no path around the loop)
                    first_row = int32(q0 + WG_QUERIES * c)
                    mine_end = int32(min(S32, int32(first_row + WG_QUERIES)) if is_causal else S32)
                    if first_row >= S32:
                        mine_end = int32(1)
                    mine = max(int32(int32(mine_end + int32(BKV_ - 1)) // BKV_), int32(1))
                slot, phase = key_loop(s, o, pf, alpha, m_run, l_run, q_desc, k_desc, v_desc, k_full, v_full, empty,
                                       q_empty, slot, phase, mine, whole, i0, S32, is_causal, scale_log2e, c,
                                       mine < tiles)
                if OWN_TILES:
                    # The item's other tiles: the turns (the ring goes round every consumer) and the
                    # slots' release, each once the slot holds the tile (else the arrival would count
                    # toward the release of the tile before it).
                    for tile in range(mine, tiles):
                        slot = int32(slot + 1)
                        if slot == STAGES_:
                            slot = int32(0)
                            phase = int32(phase ^ 1)
                        mbarrier_wait(k_full + uint64(8 * slot), phase)
                        mbarrier_wait(v_full + uint64(8 * slot), phase)
                        my_turn(c)
                        if c != LAST or tile + 1 < tiles:
                            your_turn(c)
                        if t % 128 == 0:
                            mbarrier_arrive(empty + uint64(8 * slot))
                _store_rows_unsigned(out32, row0, i0, o, l_run, S, DP, BF16)
                item_phase = int32(item_phase ^ 1)
    return kernel


# Hopper stage -> (OVERLAP, PINGPONG[, LEAN])
HOPPER_STAGES_OVERLAP = {"wgmma": (False, False), "overlap_softmax": (True, False), "pingpong": (True, True),
                         "lean_loop": (True, True, True)}
HOPPER_STAGE_NAMES = (*HOPPER_STAGES_OVERLAP, "persistent")  # persistent: _persistent_kernel_source's


def build_hopper_kernel(stage, DP, bf16):
    """The kernel of Hopper stage ``stage`` for head size DP, fp16 or bf16 (made once, named for
    `workbench ptx`)."""
    key = ("hopper", stage, DP, bool(bf16))
    if key in _BUILT:
        return _BUILT[key]
    if stage == "persistent":
        kernel = _persistent_kernel_source(DP, bool(bf16))
    else:
        kernel = _hopper_kernel_source(DP, bool(bf16), *HOPPER_STAGES_OVERLAP[stage])
    name = f"_flash_{stage}_d{DP}_{'bf16' if bf16 else 'f16'}"
    kernel.__name__ = kernel.__qualname__ = name
    threads = persistent_threads(DP) if stage == "persistent" else HOPPER_THREADS
    compiled = cuda.jit(**_gpu_options(launch_bounds=(threads, 1)))(kernel)
    globals()[name] = _BUILT[key] = compiled
    return compiled


def launch_hopper(stage, q, k, v, causal, out):
    """A Hopper stage: its kernel where hopper_usable, else the tuned stage's."""
    B, H, S, D = q.shape
    if not hopper_usable(q, k, v, D):
        return launch("tuned", q, k, v, causal, out)
    q2, k2, v2 = (_bits(a).reshape(B * H * S, D) for a in (q, k, v))  # kept alive for the simulator's maps
    out32 = _bits(out).reshape(B * H * S, D).view(np.uint32)
    maps = (host_tensor_map(q2, 64, HOPPER_BQ), host_tensor_map(k2, 64, HOPPER_BKV),
            host_tensor_map(v2, 64, HOPPER_BKV))
    kernel = build_hopper_kernel(stage, D, np.dtype(q.dtype) != np.float16)
    args = (_bits(q), _bits(k), _bits(v), out32, np.float32(LOG2E / math.sqrt(D)), causal) + maps
    nbytes = hopper_layout(D)[-1]
    set_max_dynamic_shared_memory(kernel, args, nbytes)
    kernel[(B * H, blocks_for(S, HOPPER_BQ)), HOPPER_THREADS, 0, nbytes](*args)


SIM_PERSISTENT_BLOCKS = 2  # the simulator's "SMs": few, so that each block runs several items


def persistent_blocks(items):
    """The persistent stage's grid: one block an SM (the simulator: SIM_PERSISTENT_BLOCKS), never more
    blocks than items."""
    sms = SIM_PERSISTENT_BLOCKS if _device.is_simulator() else cuda.get_current_device().MULTIPROCESSOR_COUNT
    return max(1, min(items, sms))


_CLAIMS = {}  # device -> the persistent kernel's two counters (next item, blocks done), zero between launches


def item_claims():
    """The persistent kernel's counters on the current device: zeroed once here, then by the kernel's last
    block at the end of every launch."""
    key = 0 if _device.is_simulator() else cuda.get_current_device().id
    if key not in _CLAIMS:
        _CLAIMS[key] = cuda.to_device(np.zeros(2, np.uint32))
    return _CLAIMS[key]


def launch_persistent(q, k, v, causal, out, blocks=None):
    """The persistent stage: its kernel on ``blocks`` blocks (persistent_blocks' by default) where
    hopper_usable, else the tuned stage's."""
    B, H, S, D = q.shape
    if not hopper_usable(q, k, v, D):
        return launch("tuned", q, k, v, causal, out)
    q2, k2, v2 = (_bits(a).reshape(B * H * S, D) for a in (q, k, v))
    out32 = _bits(out).reshape(B * H * S, D).view(np.uint32)
    _, BQ_, BKV_ = persistent_shape(D)
    maps = (host_tensor_map(q2, 64, BQ_), host_tensor_map(k2, 64, BKV_), host_tensor_map(v2, 64, BKV_))
    kernel = build_hopper_kernel("persistent", D, np.dtype(q.dtype) != np.float16)
    args = (_bits(q), _bits(k), _bits(v), out32, np.float32(LOG2E / math.sqrt(D)), causal) + maps + (item_claims(),)
    nbytes = persistent_layout(D)[-1]
    set_max_dynamic_shared_memory(kernel, args, nbytes)
    items = B * H * blocks_for(S, BQ_)
    grid = persistent_blocks(items) if blocks is None else min(int(blocks), items)
    kernel[grid, persistent_threads(D), 0, nbytes](*args)


# -- 6. wgmma --------------------------------------------------------------------------------------

@_stage("wgmma", """
    FlashAttention-3's structure on Hopper's own instructions. A block is three warpgroups: one
    producer and two consumers of 64 queries each (128 a block). One producer thread copies Q once and
    then K and V tiles of 128 keys by TMA (cp.async.bulk.tensor, through tensor maps of q, k and v seen
    as (B H S) x D matrices) into a ring of three slots, each copy completing on its slot's "full"
    mbarrier; the consumers arrive on an "empty" one when done with a slot, and only then is it
    refilled. No thread computes a copy address and no block-wide barrier stands in the key loop. Each
    consumer multiplies S = Q K^T with wgmma m64n128k16 from two shared-memory descriptors (Q's rows and
    K's rows are both K-major: a key's D elements are the B operand's column, no transpose), D / 16
    instructions a tile, the first overwriting S (scale-d false) so it is never zeroed. A wgmma
    accumulator tile is, warp by warp, mma.sync's C fragment, so the online softmax of the earlier
    stages runs unchanged on S's 64 registers, and so does the register trick: P's halves, packed in
    place, are the A operand of O += P V, a wgmma m64nDk16 with A from registers and V's tile from a
    transposed (MN-major) descriptor, as hgemm reads B. setmaxnreg gives the producer's registers to
    the consumers (40 and 232 a thread). The kernel needs a head size of whole 128-byte rows, the
    swizzle's: D = 64 or 128; other head sizes (and arrays the copy engine cannot read: rows of a
    16-byte multiple, 16-byte aligned) run the tuned stage's kernel. Under the mask the blocks start
    heaviest first within groups of about 128 blocks of a few heads, not across all heads: started
    across all heads, the first wave held the last query block of every head, each reading its whole
    head's K and V (2 MiB a head at 4x32x4096x128, 256 MiB for the wave, five times the L2), so K and V
    came from DRAM again for nearly every query block; a group's blocks share their heads' K and V in
    L2 (with a third K/V slot, added in the same change: 1520 down to 1387 us at that size, fp16;
    at 8x16x2048x64, where fp16 and bf16 had differed by a fifth, both 374). On the H200 at 4x32x4096x128 under the mask: 1387 us,
    396 TFLOP/s, in fp16 and in bf16 (0.79x and 0.72x SDPA in the same run; the tuned stage took
    2154 us in bf16); at 8x16x2048x64 under the mask 374 us, 184 TFLOP/s, 0.49x SDPA, slower than the
    tuned stage: at D = 64 a tile's products are short (four k16 steps for S) beside its softmax, and
    each consumer waits for its S, computes the softmax with its tensor cores idle, then waits for its
    P V.""")
def wgmma(q, k, v, causal, out):
    launch_hopper("wgmma", q, k, v, causal, out)


# -- 7. overlap_softmax ----------------------------------------------------------------------------

@_stage("overlap_softmax", """
    In the wgmma stage a consumer waits for S, then does its softmax while its tensor cores idle, then
    waits for P V. FlashAttention-3 overlaps the two inside one warpgroup: each step issues tile t's S =
    Q K^T and tile t - 1's O += P V as two wgmma groups, waits only for the first (groups complete in
    order: wgmma_wait1), and computes tile t's softmax while P V still runs. Two things have to wait
    for that P V: the rescale of O by alpha (the softmax of tile t is split from the rescale for this:
    softmax_tile, then rescale_rows after wgmma_wait0) and the repacking of P, because a wgmma reads
    its A registers asynchronously too, so P's registers stay untouched until its group is done. The
    price is P's 32 registers held across the softmax (S, P and O live together). On the H200 under
    the mask at 8x16x2048x64: 337 us in fp16 and in bf16, 204 TFLOP/s, 0.54x SDPA (the wgmma stage
    374); at 4x32x4096x128 it is slower than the wgmma stage, 1488 us against 1387 (370 TFLOP/s),
    for a reason not found: ptxas reports no spill, and the products are the same.""")
def overlap_softmax(q, k, v, causal, out):
    launch_hopper("overlap_softmax", q, k, v, causal, out)


# -- 8. pingpong -----------------------------------------------------------------------------------

@_stage("pingpong", """
    The two consumers of a block still compete for one SM's tensor cores and its exp2 unit, and when
    both reach their softmax at once the tensor cores idle. FlashAttention-3 schedules them: they take
    turns to issue their wgmma, ordered by two named barriers (bar.sync / bar.arrive with an id of
    their own; syncthreads uses barrier 0). A consumer waits for its turn (bar.sync on its barrier,
    which the other consumer arrives at), issues tile t's S and tile t - 1's P V, and hands the turn
    over (bar.arrive on the other's barrier): its products queue on the tensor cores behind the other
    consumer's, and its softmax runs while the other's products are being computed. Consumer 0 goes
    first; the turns balance (each consumer syncs as often as the other arrives), so no arrival is left
    over when the block ends. On the H200 under the mask: at 4x32x4096x128 1243 us fp16 (442 TFLOP/s,
    0.88x SDPA's 1091 in the same run) and 1293 us bf16 (425, 0.77x SDPA's 1002); at 8x16x2048x64
    319 us fp16 and 312 us bf16 (215 and 220 TFLOP/s, 0.57x and 0.58x SDPA's 181), about a tenth
    faster than the tuned stage's last figures there (354 and 352). SDPA stays ahead, and Nsight
    Compute says why at 8x16x2048x64: both kernels issue about two instructions a clock with the
    same 384 threads and 168 registers an SM, but this one executes 148 million warp instructions
    where cuDNN's executes 77 million, and its busiest pipe is the integer one (49%). The next stage
    finds them.""")
def pingpong(q, k, v, causal, out):
    launch_hopper("pingpong", q, k, v, causal, out)


# -- 9. lean_loop ----------------------------------------------------------------------------------

@_stage("lean_loop", """
    pingpong's schedule with fewer instructions a tile. Both this kernel and cuDNN's (SDPA's) issue
    about two instructions a clock, so the kernel is bound by how many it issues, and pingpong's key
    loop issued about twice cuDNN's: per consumer warp and 128-key tile, 1021 instructions at D = 64
    (1111 at D = 128), of which about 340 are the softmax's arithmetic with O's rescale and P's
    packing, and 12 the wgmma. The rest was integer work the loop redid every tile, in 64-bit
    arithmetic (numba's integers): the mask, written per score (`if masked and (j >= S or j > i)`) and
    turned by the compiler into compares and a select for every score of every tile, masked or not
    (290 ISETP, 64 FSEL); the wgmma descriptors, rebuilt from addresses at every k-step (cvta, mask,
    shift, or); the ring's slot and phase parity, divided out of the tile's index by 3 (a 64-bit
    multiply-high sequence, about 80 instructions). Now only the tiles that need it are masked: from
    the first tile with a key past S or past a row (under the mask, with 128-query blocks and 128-key
    tiles, a block's last tile, the diagonal one; without it, the tail when S is not a multiple of
    128), behind one branch, in 32 bits (per row, how many of the lane's keys it may see; then one
    compare a score against a constant). The descriptors are made once and moved by adding constants
    (shared memory stays below 256 KiB: the address field never carries), and the slot and the parity
    are carried from tile to tile. The SASS (ptxas 13, sm_90a): 425 instructions a tile at D = 64
    (473 at D = 128), plus about 130 on a masked tile; the same 168 registers, no spill. On the H200
    under the mask: at 8x16x2048x64 215 us fp16 and 214 us bf16 (320 TFLOP/s, pingpong's 319 and 312),
    0.84x SDPA's 181 in the same run; at 4x32x4096x128 945 us fp16 (582 TFLOP/s), 1.01x SDPA's 956,
    and 951 us bf16, 0.96x SDPA's 909. What is left at D = 64 is outside the loop: 2048 blocks of 128
    queries, one an SM (15.5 waves), each initialising its barriers, loading Q and filling the ring
    with nothing to overlap, and a block's loop is short (8.5 tiles on average under the mask);
    cuDNN's kernel runs a persistent grid of 132 blocks.""")
def lean_loop(q, k, v, causal, out):
    launch_hopper("lean_loop", q, k, v, causal, out)


# -- 10. persistent --------------------------------------------------------------------------------

@_stage("persistent", """
    lean_loop's kernel on a persistent grid. At 8x16x2048x64 under the mask lean_loop launches 2048 blocks
    of 128 queries, one an SM at a time, and each walks only 8.5 key tiles on average; every one of them
    pays, besides its tiles, the same fixed costs: it initialises its barriers, its producer loads Q and
    fills the ring of K and V slots while the consumers wait with nothing to overlap, and after its last
    tile the consumers store their rows while the tensor cores idle until the next block starts. cuDNN's
    kernel (SDPA's) launches one block an SM instead, and so does this stage: 132 blocks on an H200, each
    running items (a head's block of 128 queries; 192 at D = 64, below) one after the other. Which items
    matters. Dealt out in turn (block b items b, b + 132, ...) in the grid's old order (heaviest first
    within groups of heads), the busiest block gets 200 key tiles where the average is 132, and the kernel
    takes 272 us, slower than lean_loop: under the mask items differ sixteenfold, and the hardware's block
    scheduler, which hands a freed SM the next block, had been balancing them for free. So the producer
    claims each item from a counter in global memory (an atomic add: the next item not yet taken) when it
    is ready for one, as a freed SM took the next block; the last block to find the items gone zeroes the
    counter for the next launch. It writes the item's number beside Q, and the consumers read it once Q
    has landed. The barriers are initialised once. The ring runs on from item to item: the producer issues
    the next item's first K and V tiles as soon as slots free up, while the consumers are still on the
    last tiles of the current one. Q has one buffer and a barrier more, "Q empty", on which every consumer
    thread arrives once its item's last S = Q K^T has completed; the producer waits for it before copying
    the next item's Q (and number), which then overlaps the current item's last P V and its stores. The
    consumers' turns stay balanced per item, so no arrival is left over when a block ends. Two things
    matter to ptxas in the item loop: which consumer a warpgroup is comes from a warp vote (ballot_sync),
    not from threadIdx (derived from threadIdx, the named barriers of id 1 + c made ptxas compile the
    whole loop as divergent code, 60 instructions more a tile), and there is still no path around the key
    loop. On the H200 under the mask: at 8x16x2048x64 189 us in fp16 and 190 in bf16 (363 TFLOP/s), 1.13x
    lean_loop, 0.96x and 0.95x SDPA's 181 and 180 in the same run; at 4x32x4096x128 955 us fp16 (576
    TFLOP/s) and 901 us bf16 (611), 1.11x and 1.09x SDPA. At the smaller size the kernel now executes
    fewer instructions than cuDNN's (67 million warp instructions against 77) and is no longer bound by
    issuing them (issue slots busy 39% of cycles): Nsight Compute's largest stalls are waits on
    fixed-latency results and on the named barriers of the turns, and the tensor pipe is busy 41% of the
    time. cuDNN's kernel, profiled beside it, has the same grid and shape (132 blocks of 384 threads, 168
    registers) and keeps the tensor pipe busy 46% of the time, issuing on 49% of cycles: the same products
    with fewer idle cycles between them, which is the 4% between the two. All these figures are of the
    kernel with two consumers. At D = 64 the block now has three consumer warpgroups, FlashAttention-3's
    shape there: an item is 192 queries, so each K and V tile is copied into shared memory once for 192
    queries instead of 128 (a third fewer copies, and fewer "full" and "empty" waits a query), and the SM
    has three independent chains of S, softmax and P V to interleave instead of two: while one consumer
    runs its softmax, the other two can have products on the tensor cores. The turns go round robin:
    consumer c waits on named barrier 1 + c and hands on to the next one's, and the last consumer opens
    each item's first turn for consumer 0. Under the mask a taller item has more keys past its rows'
    diagonal: if all three consumers walked all of an item's tiles, 8x16x2048x64 would compute 11% more
    scores than with 128-query items. So each consumer walks only the tiles its own 64 rows see (one if
    they are all past S), and for the item's remaining tiles only takes its turns and frees each slot once
    the tile has landed (an earlier arrival would count toward the previous tile's release). The price is
    registers: 512 threads get 128 each at launch, and setmaxnreg moves them to 32 for the producer and
    160 for each consumer (32 + 3 x 160 = 4 x 128), against 232 with two consumers. A consumer holds S (64
    values a thread at 128 keys), P (32) and O (32) and fits in 160 with no spill; the producer fits in 32
    once its two phase parities share a register. At D = 128 O's 64 accumulators leave no room, so it
    keeps two consumers. On the H200 at 8x16x2048x64 under the mask, each setting in its own process
    (`workbench sweep`): three consumers 181.9 us in fp16 against two consumers' 190.5 (1.05x), bf16
    181.1 against 190.2; every consumer walking every tile of its item (OWN_TILES_D64 = False) 193.4
    against 183.4; key tiles of 96 or 112 (PERSISTENT_BKV_D64) 187.2 and 191.5 against 182.3. With SDPA
    in the same run: fp16 181.4 us (379 TFLOP/s) against 180.2, bf16 180.2 against 179.0: 0.99x both,
    level within 1%. A fourth slot in the K/V ring (HOPPER_STAGES = 4) gives 183.4 against 182.7, two
    slots 212.6; the producer at 24 registers 183.2 against 182.6; FlashAttention-4's lazy rescale (a
    row's maximum moved only when it grows past 2^8, a warp whose rows all kept theirs skipping O's
    rescale) 186.7 against 183.2: the vote and the branch cost more than the 32 multiplies they save. Without the mask, at 4x32x4096x128
    (two consumers): fp16 1831 us (600 TFLOP/s) against SDPA's 1895 in the same run, 1.03x; bf16 1729
    us (636 TFLOP/s) against 1771, 1.02x.""")
def persistent(q, k, v, causal, out):
    launch_persistent(q, k, v, causal, out)


for _stage_name in STAGE_SWITCHES:  # built at import: tools that compile kernels by name find them
    for _dp in HEAD_DIM_STEPS:
        for _bf16 in (False, True):
            build_kernel(_stage_name, _dp, _bf16)
for _stage_name in HOPPER_STAGE_NAMES:
    for _dp in HOPPER_HEAD_DIMS:
        for _bf16 in (False, True):
            build_hopper_kernel(_stage_name, _dp, _bf16)
