"""What the tensor-core FlashAttention kernels share (``attention_tc.py``'s fp16 and bf16 ladders and
``attention.py``'s float32 stage ``tensor_cores``), and that float32 kernel itself: 3xTF32 on mma.sync.

Not a ladder (its name starts with ``_``, so the registry skips it): shared code lives here because a
ladder module may not import another (the grader refuses the answer key's modules while grading an
exercise). The pieces:

* swizzled tiles in shared memory (``tile_offset``), their cp.async copies (``issue_async``) and
  ldmatrix loads (``ldsm``, ``ldsm_trans``), in 16-byte chunks: the same bytes for a k16 step of
  halves and a k8 step of float32;
* the online softmax on mma accumulator fragments (``online_softmax``): FlashAttention-2's, where a
  lane holds 2 rows x 16 keys of a 16 x 64 tile and a row's other keys are in its quad;
* the order blocks start in (``block_order``): under the causal mask, the heaviest query block of every
  head first;
* the float32 kernel (``launch_3xtf32``): every product in three TF32 mma (see its section); built
  with RoPE's tables, the same body rotates Q and each K tile as they land (attention[rope]'s last stage).
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from workbench import device as _device
from workbench.shared_memory import STATIC_LIMIT, set_max_dynamic_shared_memory
from workbench.ladder import blocks_for

from solutions._ptx import (cp_async_chunk16, cp_async_chunk16_s32, cp_async_commit, cp_async_wait_pending,
                            ex2_approx_ftz, ldmatrix_x4, ldmatrix_x4_s32, ldmatrix_x4_trans, ldmatrix_x4_trans_s32,
                            mma_3xtf32, shared_address32, split_tf32, split_tf32_bits)
from solutions._vector_io import aligned16

NEG_INF = np.float32(-np.inf)
# The running maximum's start: the most negative finite float32, so that exp2(start - m) is 0 or 1,
# never exp2(-inf - -inf) = NaN, while a row has seen only masked keys (as in solutions/attention.py).
LOWEST = np.float32(np.finfo(np.float32).min)
LOG2E = 1.4426950408889634
FULL_MASK = 0xFFFFFFFF
ALIGN16 = None if _device.is_simulator() else 16  # the simulator refuses alignment=
HEAD_DIM_STEPS = (16, 32, 64, 128)  # the kernels are built for D padded to one of these
ROPE_GROUP = 4  # rows whose RoPE table loads a thread has in flight at once (rotate_tile_f32)


def _gpu_options(**options):
    """Compile options only the real GPU compiler takes (the simulator's cuda.jit accepts none)."""
    return {} if _device.is_simulator() else options


def padded_head_dim(D):
    return next(dp for dp in HEAD_DIM_STEPS if D <= dp)


@cuda.jit(device=True, inline=True)
def tile_offset(row, chunk, chunks_per_row, swizzle):
    """Byte offset of 16-byte chunk ``chunk`` of a tile's row ``row``. Swizzled, the chunk index is
    XORed with row % 8: the 8 rows one ldmatrix phase reads, at one logical chunk, land in 8 different
    16-byte bank groups (rows of 128 or 256 bytes). Shorter rows (D <= 32, the simulator's sizes) XOR
    with row % chunks_per_row: still a permutation of the row."""
    if swizzle:
        chunk = chunk ^ (row % min(chunks_per_row, 8))
    return (row * chunks_per_row + chunk) * 16


@cuda.jit(device=True, inline=True)
def block_order(heaviest_first, BQ):
    """(batch x head, first query) of this block, from a grid of (B H, query blocks). The GPU starts
    blocks in order, x fastest. Without the causal mask every block has the same work, and a head's
    query blocks go together: running at once, they share its K and V in L2. Under the mask a query
    block's work grows with its position, and the heaviest query block of every head goes first: the
    long blocks start at once and the short ones fill in behind them, where a head's blocks, heavy and
    light, one head after another, left the last heads' long blocks running alone at the end. On the
    H200 at 8x16x2048x64 under the mask (one machine, alternating builds,
    results/runs/gpu_block_order_ab_2026-11-24.jsonl): the float32 tensor_cores stage 2045-2063 us
    against 2464-2468, the fp16 tuned stage 349-356 against 375-406."""
    heads = cuda.gridDim.x
    blocks = cuda.gridDim.y
    n = cuda.blockIdx.y * heads + cuda.blockIdx.x  # the order the GPU starts blocks in
    if heaviest_first:
        return n % heads, (blocks - 1 - n // heads) * BQ
    return n // blocks, (n % blocks) * BQ


@cuda.jit(device=True, inline=True)
def ldsm(address, A32):
    """ldmatrix.x4 at a shared address: a 32-bit window address (A32) or a generic one."""
    if A32:
        return ldmatrix_x4_s32(address)
    return ldmatrix_x4(address)


@cuda.jit(device=True, inline=True)
def ldsm_trans(address, A32):
    if A32:
        return ldmatrix_x4_trans_s32(address)
    return ldmatrix_x4_trans(address)


@cuda.jit(device=True, inline=True)
def exp2_of(x, FAST):
    """2^x: one MUFU.EX2 (FAST), or libdevice's exp2f (a subnormal-result fix-up around it)."""
    if FAST:
        return ex2_approx_ftz(x)
    return math.exp2(x)


@cuda.jit(device=True, inline=True)
def issue_async(src, bh, row0, rows, S, D, base, at, DP, THREADS, A32, E):
    """Start copying rows row0 .. row0 + rows - 1 of src[b, h] (E-byte elements) to the swizzled tile at
    byte ``at``: 16 bytes a cp.async, zero-filled past S and D, landing when cp_async_wait_pending
    retires their group."""
    CPR = DP * E // 16
    PER = 16 // E  # elements a chunk
    for j in range((rows * CPR + THREADS - 1) // THREADS):
        c = cuda.threadIdx.x + j * THREADS
        # (a test compiled away where the block's threads divide the tile's chunks: no branch)
        if (rows * CPR) % THREADS == 0 or c < rows * CPR:
            r = c // CPR
            chunk = c % CPR
            inside = row0 + r < S and chunk * PER < D
            src_at = src.ctypes.data
            if inside:
                if A32:  # the tile's first row once, then a 32-bit offset the thread keeps every tile
                    src_at += uint64((bh * S + row0) * D * E) + uint64(int32(r * D + chunk * PER) * E)
                else:
                    src_at += uint64(((bh * S + row0 + r) * D + chunk * PER) * E)
            dst = base + uint64(at + tile_offset(r, chunk, CPR, True))
            if A32:
                cp_async_chunk16_s32(dst, src_at, 16 if inside else 0)
            else:
                cp_async_chunk16(dst, src_at, 16 if inside else 0)


@cuda.jit(device=True, inline=True)
def online_softmax(s, o, m_run, l_run, i0, j0, S, scale_log2e, masked, causal, DP, BKV, FAST):
    """Scores -> probabilities against each row's new running maximum; the running sum and the output
    rows rescaled by how much the maximum grew (softmax_tile, then rescale_rows)."""
    alpha = cuda.local.array(2, float32)
    softmax_tile(s, alpha, m_run, l_run, i0, j0, S, scale_log2e, masked, causal, BKV, FAST)
    rescale_rows(o, alpha, DP)


@cuda.jit(device=True, inline=True)
def rescale_rows(o, alpha, DP):
    """The output rows' accumulators (row i0: o[:, 0:2], i0 + 8: o[:, 2:4]) times their alpha."""
    for half in range(2):
        for c in range(DP // 8):
            o[c, 2 * half] *= alpha[half]
            o[c, 2 * half + 1] *= alpha[half]


@cuda.jit(device=True, inline=True)
def softmax_tile(s, alpha, m_run, l_run, i0, j0, S, scale_log2e, masked, causal, BKV, FAST):
    """online_softmax without the output: scores -> probabilities against each row's new running
    maximum, the running sum updated, and alpha[half] = how much the row's output must shrink (the
    caller rescales it when it is ready: the Hopper stage, after the P V still running on it). This
    lane: rows i0 (s[:, 0:2]) and i0 + 8 (s[:, 2:4]), keys j0 + 8n + 2q + e; a row's other keys are in
    the lanes 1 and 2 away (its quad). FAST keeps the scores and the maximum unscaled and scales inside
    the exponent: exp2(s scale - m scale) is one fused multiply-add (the scale is positive: the maximum
    of the scaled scores is the scaled maximum); otherwise the scores are scaled first (a multiply of 1
    is no instruction)."""
    factor = float32(1.0) if FAST else scale_log2e  # applied to the scores now
    scale = scale_log2e if FAST else float32(1.0)  # applied inside exp2
    for half in range(2):
        i = i0 + 8 * half
        tile_max = NEG_INF
        for n in range(BKV // 8):
            for e in range(2):
                x = s[n, 2 * half + e] * factor
                j = j0 + 8 * n + 2 * (cuda.threadIdx.x % 4) + e
                if masked and (j >= S or (causal and j > i)):
                    x = NEG_INF
                s[n, 2 * half + e] = x
                tile_max = max(tile_max, x)
        tile_max = max(tile_max, cuda.shfl_xor_sync(FULL_MASK, tile_max, 1))
        tile_max = max(tile_max, cuda.shfl_xor_sync(FULL_MASK, tile_max, 2))
        m_new = max(m_run[half], tile_max)
        row_alpha = exp2_of((m_run[half] - m_new) * scale, FAST)
        m_run[half] = m_new
        shift = m_new * scale
        total = float32(0.0)
        for n in range(BKV // 8):
            for e in range(2):
                p = exp2_of(s[n, 2 * half + e] * scale - shift, FAST)
                s[n, 2 * half + e] = p
                total += p
        l_run[half] = l_run[half] * row_alpha + total
        alpha[half] = row_alpha


# == 3xTF32: the float32 attention on tensor cores (stage 6 of solutions/attention.py's ladder) =======
#
# torch's SDPA in float32 does not run on the CUDA cores: on sm_80 and later its memory-efficient
# kernel (CUTLASS's) multiplies on the tensor cores in "3xTF32" (OpMultiplyAddFastF32). A TF32 tensor
# core reads only 10 of a float32's 23 mantissa bits; split each input as x = big + small, both TF32,
# and a b = big_a big_b + big_a small_b + small_a big_b (+ small_a small_b, 2^-22 of it, dropped):
# three TF32 mma give about float32 accuracy, at a third of the TF32 rate. This kernel is the fp16
# one's FlashAttention-2 with that product: m16n8k8 TF32 fragments instead of m16n8k16 halves, the
# same online softmax on the same C fragments, float32 tiles (a k8 step is again 32 bytes of a row,
# so the ldmatrix addresses of Q and K are the same bytes: ldmatrix moves 32-bit words, and an 8x4
# block of float32 is what it hands a TF32 A or B fragment).
#
# P V needs one more idea. The C fragment of key tile n gives lane (g, q) keys 2q and 2q + 1 of rows
# g and g + 8; a TF32 A fragment wants k = q and q + 4. But a product's k order is free as long as A
# and B agree: read k = q as key 2q and k = q + 4 as key 2q + 1, and the C fragment is the A fragment,
# P stays in registers. B must then be V's rows 2q and 2q + 1 at column g: two 4-byte shared loads a
# lane (the swizzle keeps them in 32 different banks), where ldmatrix.trans would split the floats.

class TF32Geometry(NamedTuple):
    """The 3xTF32 kernel's layout (Geometry's fields of the same names): two K/V buffers always."""
    warps: int = 4
    rows: int = 16  # queries a warp: one m16 tile or two (32: each K and V fragment, and its split, serves both)
    keys: int = 64  # keys a tile
    min_blocks: int = 2  # launch_bounds: the register cap

    @property
    def queries(self):
        return self.rows * self.warps

    def label(self):
        return f"{self.queries}q{self.warps}w{self.rows}r k{self.keys} lb{self.min_blocks}"


TF32_BASE = TF32Geometry()
# Timed side by side at 8x16x2048x64 without the mask (D = 64): results/runs/gpu_attention_3xtf32_2026-11-24.json.
TF32_SWEEP = [TF32_BASE, TF32_BASE._replace(min_blocks=1), TF32_BASE._replace(rows=32, keys=32),
              TF32_BASE._replace(rows=32, keys=32, min_blocks=1), TF32_BASE._replace(rows=32, min_blocks=1),
              TF32_BASE._replace(keys=32, min_blocks=3)]
# The fastest of them on an H200 (2026-11-24): 3724.5 us, 36.9 TFLOP/s, 1.07x torch's float32 SDPA
# (3987.7 us) in the same run, where TF32_BASE took 6376.1 (255 registers and 160 bytes of local
# memory a thread; this layout 253 and none). Two m16 tiles a warp share every K and V fragment and
# its split (half the ldmatrix, shared loads and cvt per mma), and 32-key tiles keep the two tiles'
# scores in 32 registers.
TF32_TUNED = TF32_BASE._replace(rows=32, keys=32)
# At D = 128 two tiles' output accumulators alone are 128 registers (ptxas spilled 808 bytes): one m16
# tile a warp, 32-key tiles (255 registers, no spill); --wide times the alternatives at 4x32x4096x128.
TF32_TUNED_WIDE = TF32_BASE._replace(keys=32)
TF32_SWEEP_WIDE = [TF32_BASE, TF32_TUNED_WIDE, TF32_TUNED._replace(min_blocks=1)]


def tf32_geometry(DP):
    """The 3xTF32 kernel's layout for head sizes up to DP."""
    return TF32_TUNED_WIDE if DP > 64 else TF32_TUNED


def smem_bytes_3xtf32(DP, g):
    """Dynamic shared memory of the 3xTF32 kernel: the Q tile and two buffers of K and V, float32."""
    return 4 * DP * (g.queries + 2 * 2 * g.keys)


@cuda.jit(device=True, inline=True)
def _split4(r0, r1, r2, r3):
    """Four float32 (as bits, from ldmatrix) split into their TF32 big and small parts."""
    b0, s0 = split_tf32_bits(r0)
    b1, s1 = split_tf32_bits(r1)
    b2, s2 = split_tf32_bits(r2)
    b3, s3 = split_tf32_bits(r3)
    return (b0, b1, b2, b3), (s0, s1, s2, s3)


@cuda.jit(device=True, inline=True)
def _mma3(acc, n, a, a_small, b0, b1, b0_small, b1_small):
    """acc[n] += A B, float32-accurate, by three TF32 mma (a, a_small: the A fragment's parts)."""
    d = mma_3xtf32(a[0], a[1], a[2], a[3], a_small[0], a_small[1], a_small[2], a_small[3],
                   b0, b1, b0_small, b1_small, acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
    acc[n, 0] = d[0]
    acc[n, 1] = d[1]
    acc[n, 2] = d[2]
    acc[n, 3] = d[3]


@cuda.jit(device=True, inline=True)
def _scores_3xtf32(base, k_at, s, s2, q_lane, k_lane, DP, BKV, TWO):
    """s = this warp's 16 queries . the tile's BKV keys, k8 step by k8 step of the head size: Q's A
    fragment by ldmatrix (split once for the whole step), K's B fragments of two key tiles per
    ldmatrix.x4 (K's rows are B's columns, as stored). TWO: the next 16 queries into s2, from the
    same K fragments."""
    for n in range(BKV // 8):
        for e in range(4):
            s[n, e] = float32(0.0)
            if TWO:
                s2[n, e] = float32(0.0)
    for st in range(DP // 8):
        r = ldsm(base + uint64(q_lane[st]), True)
        a, a_small = _split4(r[0], r[1], r[2], r[3])
        if TWO:
            r = ldsm(base + uint64(q_lane[st] + 64 * DP), True)  # 16 rows further: 64 DP bytes
            c, c_small = _split4(r[0], r[1], r[2], r[3])
        for p in range(BKV // 16):
            r = ldsm(base + uint64(k_at + k_lane[st] + p * 64 * DP), True)  # 16 keys further
            b, b_small = _split4(r[0], r[1], r[2], r[3])
            _mma3(s, 2 * p, a, a_small, b[0], b[1], b_small[0], b_small[1])
            _mma3(s, 2 * p + 1, a, a_small, b[2], b[3], b_small[2], b_small[3])
            if TWO:
                _mma3(s2, 2 * p, c, c_small, b[0], b[1], b_small[0], b_small[1])
                _mma3(s2, 2 * p + 1, c, c_small, b[2], b[3], b_small[2], b_small[3])


@cuda.jit(device=True, inline=True)
def _p_fragment_3xtf32(s, n):
    """Key tile n's C fragment (keys 2q, 2q + 1 of rows g and g + 8) as the TF32 A fragment of k8 step n,
    k = q read as key 2q and k = q + 4 as key 2q + 1: (a0, a1, a2, a3) = (s0, s2, s1, s3), split."""
    big0, small0 = split_tf32(s[n, 0])
    big1, small1 = split_tf32(s[n, 2])
    big2, small2 = split_tf32(s[n, 1])
    big3, small3 = split_tf32(s[n, 3])
    return (big0, big1, big2, big3), (small0, small1, small2, small3)


@cuda.jit(device=True, inline=True)
def _p_times_v_3xtf32(smem_f, v_at, s, s2, o, o2, v_lo, v_hi, DP, BKV, TWO):
    """o += P V, P from its C fragments (_p_fragment_3xtf32); B is then V's rows 2q, 2q + 1 at column g
    of each n8 tile of the head size (v_lo, v_hi: this lane's byte offsets in the tile, for key tile 0).
    TWO: the next 16 queries' P (s2) into o2, from the same V fragments."""
    for n in range(BKV // 8):
        a, a_small = _p_fragment_3xtf32(s, n)
        if TWO:
            c2, c2_small = _p_fragment_3xtf32(s2, n)
        for c in range(DP // 8):
            at = v_at + n * 32 * DP  # 8 keys further: 32 DP bytes (the swizzle depends on row % 8 only)
            b0, b0_small = split_tf32(smem_f[(at + v_lo[c]) // 4])
            b1, b1_small = split_tf32(smem_f[(at + v_hi[c]) // 4])
            _mma3(o, c, a, a_small, b0, b1, b0_small, b1_small)
            if TWO:
                _mma3(o2, c, c2, c2_small, b0, b1, b0_small, b1_small)


@cuda.jit(device=True, inline=True)
def _load_plain_f32(src, bh, row0, rows, S, D, smem_f, at, DP, THREADS):
    """Rows row0 .. row0 + rows - 1 of src[b, h] into the swizzled float32 tile at byte ``at``, one
    element a thread and step, zero past S and D: the path for rows that are not whole 16-byte chunks
    (D not a multiple of 4) or arrays not 16-byte aligned, where cp.async cannot go."""
    H = src.shape[1]
    b = bh // H
    h = bh % H
    for e in range(cuda.threadIdx.x, rows * DP, THREADS):
        r = e // DP
        c = e % DP
        value = float32(0.0)
        if row0 + r < S and c < D:
            value = src[b, h, row0 + r, c]
        smem_f[(at + tile_offset(r, c // 4, DP // 4, True) + (c % 4) * 4) // 4] = value


@cuda.jit(device=True, inline=True)
def _store_rows_f32(out, bh, i0, o, l_run, DP):
    """Rows i0 and i0 + 8 of out[b, h] (this lane's columns 8c + 2q, + 1): o divided by the row's sum."""
    H = out.shape[1]
    S = out.shape[2]
    D = out.shape[3]
    b = bh // H
    h = bh % H
    lane = cuda.threadIdx.x % 32
    for half in range(2):
        total = l_run[half]
        total += cuda.shfl_xor_sync(FULL_MASK, total, 1)
        total += cuda.shfl_xor_sync(FULL_MASK, total, 2)
        inverse = float32(1.0) / total
        i = i0 + 8 * half
        for c in range(DP // 8):
            col = 8 * c + 2 * (lane % 4)
            if i < S and col < D:
                out[b, h, i, col] = o[c, 2 * half] * inverse
            if i < S and col + 1 < D:
                out[b, h, i, col + 1] = o[c, 2 * half + 1] * inverse


@cuda.jit(device=True, inline=True)
def rotate_tile_f32(cos, sin, row0, rows, S, D, smem_f, at, DP, THREADS):
    """RoPE on the swizzled float32 tile at byte ``at`` that has just landed (its rows are positions row0 ..
    row0 + rows - 1; half-split pairs, attention[rope]'s): a thread rotates pair p (features p and
    p + D/2) of every STEP-th row, both read before either is written (the thread owns the pair: no
    barrier between). At D >= 64 a warp takes 32 pairs of one row: 32 different banks whatever the
    swizzle, and one 128-byte line of each table. The rows go ROPE_GROUP at a time, the group's table loads first,
    so that their trips to L2 overlap instead of waiting one after another. 32-bit offsets throughout."""
    HP = DP // 2  # pairs a padded row; THREADS is a multiple of it (128 threads, DP <= 128)
    STEP = THREADS // HP
    t = uint32(cuda.threadIdx.x)
    p = t % uint32(HP)
    r_first = t // uint32(HP)
    half = uint32(D // 2)
    second = p + half
    # tile_offset's swizzle, in floats: chunk (p // 4) ^ (row % SW), word p % 4
    SW = uint32(min(DP // 4, 8))
    for g0 in range(0, rows // STEP, ROPE_GROUP):
        c = cuda.local.array(ROPE_GROUP, float32)
        sn = cuda.local.array(ROPE_GROUP, float32)
        for u in range(ROPE_GROUP):
            r = r_first + uint32((g0 + u) * STEP)
            if g0 + u < rows // STEP and row0 + r < S and p < half:
                c[u] = cos[row0 + r, p]
                sn[u] = sin[row0 + r, p]
        for u in range(ROPE_GROUP):
            r = r_first + uint32((g0 + u) * STEP)
            if g0 + u < rows // STEP and row0 + r < S and p < half:
                row_at = uint32(at // 4) + r * uint32(DP)
                first_at = uint32(row_at + ((p // 4) ^ (r % SW)) * 4 + p % 4)
                second_at = uint32(row_at + ((second // 4) ^ (r % SW)) * 4 + second % 4)
                x = smem_f[first_at]
                y = smem_f[second_at]
                smem_f[first_at] = x * c[u] - y * sn[u]
                smem_f[second_at] = y * c[u] + x * sn[u]


@cuda.jit(device=True, inline=True)
def _flash_3xtf32(q, k, v, out, scale_log2e, causal, cos, sin, smem, smem_f, s, o, m_run, l_run, second, q_lane,
                  k_lane, v_lo, v_hi, DP, ASYNC, BQ, BKV, THREADS, ROWS):
    """The 3xTF32 flash loop. cos, sin: RoPE's tables (attention[rope]: Q and each K tile rotated in shared
    memory once landed, rotate_tile_f32), or None (plain attention: numba prunes the branch by its type)."""
    TWO = ROWS == 32  # two m16 tiles a warp: s, o, m_run, l_run and the second's
    s2, o2, m_run2, l_run2 = second
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    S = q.shape[2]
    D = q.shape[3]
    is_causal = causal[0] != 0
    bh, q0 = block_order(is_causal, BQ)
    CPR = DP // 4  # 16-byte chunks per float32 row
    TILE_BYTES = BKV * DP * 4
    k_at = BQ * DP * 4  # after the Q tile
    v_at = k_at + 2 * TILE_BYTES
    base = uint64(shared_address32(smem.ctypes.data))
    # ldmatrix row addresses (as the fp16 kernel's: a k8 step of float32 is 32 bytes, two chunks)
    for st in range(DP // 8):
        q_lane[st] = tile_offset(ROWS * warp + lane % 16, 2 * st + lane // 16, CPR, True)
        k_lane[st] = tile_offset(lane % 8 + 8 * (lane // 16), 2 * st + (lane // 8) % 2, CPR, True)
    g = lane // 4
    for c in range(DP // 8):  # V's rows 2q and 2q + 1 at column 8c + g
        v_lo[c] = tile_offset(2 * (lane % 4), (8 * c + g) // 4, CPR, True) + ((8 * c + g) % 4) * 4
        v_hi[c] = tile_offset(2 * (lane % 4) + 1, (8 * c + g) // 4, CPR, True) + ((8 * c + g) % 4) * 4
    for half in range(2):
        m_run[half] = LOWEST
        l_run[half] = float32(0.0)
        m_run2[half] = LOWEST
        l_run2[half] = float32(0.0)
    for c in range(DP // 8):
        for e in range(4):
            o[c, e] = float32(0.0)
            o2[c, e] = float32(0.0)

    end = min(S, q0 + BQ) if is_causal else S  # the block's last query sees no key past it
    tiles = (end + BKV - 1) // BKV
    i0 = q0 + ROWS * warp + lane // 4
    if ASYNC:
        issue_async(q, bh, q0, BQ, S, D, base, 0, DP, THREADS, True, 4)
        if tiles > 0:
            issue_async(k, bh, 0, BKV, S, D, base, k_at, DP, THREADS, True, 4)
            issue_async(v, bh, 0, BKV, S, D, base, v_at, DP, THREADS, True, 4)
        cp_async_commit()
    else:
        _load_plain_f32(q, bh, q0, BQ, S, D, smem_f, 0, DP, THREADS)
    for tile in range(tiles):
        j0 = tile * BKV
        buffer = tile % 2
        if ASYNC:
            cp_async_wait_pending(0)  # tile `tile` has landed (for this thread) ...
            cuda.syncthreads()  # ... for every thread, and every warp is done with tile - 1's buffer
            if tile + 1 < tiles:
                into = 1 - buffer
                issue_async(k, bh, j0 + BKV, BKV, S, D, base, k_at + into * TILE_BYTES, DP, THREADS, True, 4)
                issue_async(v, bh, j0 + BKV, BKV, S, D, base, v_at + into * TILE_BYTES, DP, THREADS, True, 4)
            cp_async_commit()
        else:
            cuda.syncthreads()
            _load_plain_f32(k, bh, j0, BKV, S, D, smem_f, k_at + buffer * TILE_BYTES, DP, THREADS)
            _load_plain_f32(v, bh, j0, BKV, S, D, smem_f, v_at + buffer * TILE_BYTES, DP, THREADS)
            cuda.syncthreads()
        if cos is not None:  # rotate what just landed (Q with the first tile), then one more barrier
            if tile == 0:
                rotate_tile_f32(cos, sin, q0, BQ, S, D, smem_f, 0, DP, THREADS)
            rotate_tile_f32(cos, sin, j0, BKV, S, D, smem_f, k_at + buffer * TILE_BYTES, DP, THREADS)
            cuda.syncthreads()
        _scores_3xtf32(base, k_at + buffer * TILE_BYTES, s, s2, q_lane, k_lane, DP, BKV, TWO)
        masked = j0 + BKV > S or (is_causal and j0 + BKV > q0)  # the tail tile, the diagonal tiles
        online_softmax(s, o, m_run, l_run, i0, j0, S, scale_log2e, masked, is_causal, DP, BKV, True)
        if TWO:
            online_softmax(s2, o2, m_run2, l_run2, i0 + 16, j0, S, scale_log2e, masked, is_causal, DP, BKV, True)
        _p_times_v_3xtf32(smem_f, v_at + buffer * TILE_BYTES, s, s2, o, o2, v_lo, v_hi, DP, BKV, TWO)
    _store_rows_f32(out, bh, i0, o, l_run, DP)
    if TWO:
        _store_rows_f32(out, bh, i0 + 16, o2, l_run2, DP)


_BUILT_3XTF32: dict = {}


def build_3xtf32(DP, use_async, geometry=None, rope=False):
    """The 3xTF32 kernel for head sizes up to DP, with cp.async tiles or plain loads, in ``geometry``
    (tf32_geometry(DP) unless given; made once per combination). ``rope``: the kernel takes RoPE's cos
    and sin tables after its first six arguments and rotates Q and K as they land (attention[rope])."""
    g = tf32_geometry(DP) if geometry is None else geometry
    key = (DP, bool(use_async), g, bool(rope))
    if key in _BUILT_3XTF32:
        return _BUILT_3XTF32[key]
    if g.rows not in (16, 32) or g.keys % 16:
        raise ValueError(f"no 3xTF32 kernel with {g}: 16 or 32 rows a warp, keys a multiple of 16")
    ASYNC = bool(use_async)
    STEPS = DP // 8
    S_SHAPE = (g.keys // 8, 4)  # shapes computed here: numba takes a closure's tuple as a constant
    O_SHAPE = (DP // 8, 4)
    BQ, BKV, THREADS, ROWS = g.queries, g.keys, 32 * g.warps, g.rows

    @cuda.jit(device=True, inline=True)
    def attend(q, k, v, out, scale_log2e, causal, cos, sin):
        smem = cuda.shared.array(0, uint32, alignment=ALIGN16)  # the same bytes, seen as bits ...
        smem_f = cuda.shared.array(0, float32, alignment=ALIGN16)  # ... and as float32
        s = cuda.local.array(S_SHAPE, float32)
        o = cuda.local.array(O_SHAPE, float32)
        m_run = cuda.local.array(2, float32)
        l_run = cuda.local.array(2, float32)
        # The warp's second m16 tile (rows = 32); with one, these are only zeroed, and compile away.
        s2 = cuda.local.array(S_SHAPE, float32)
        o2 = cuda.local.array(O_SHAPE, float32)
        m_run2 = cuda.local.array(2, float32)
        l_run2 = cuda.local.array(2, float32)
        q_lane = cuda.local.array(STEPS, int32)
        k_lane = cuda.local.array(STEPS, int32)
        v_lo = cuda.local.array(STEPS, int32)
        v_hi = cuda.local.array(STEPS, int32)
        _flash_3xtf32(q, k, v, out, scale_log2e, causal, cos, sin, smem, smem_f, s, o, m_run, l_run,
                      (s2, o2, m_run2, l_run2), q_lane, k_lane, v_lo, v_hi, DP, ASYNC, BQ, BKV, THREADS, ROWS)

    if rope:
        def kernel(q, k, v, out, scale_log2e, causal, cos, sin):
            attend(q, k, v, out, scale_log2e, causal, cos, sin)
    else:
        def kernel(q, k, v, out, scale_log2e, causal):
            attend(q, k, v, out, scale_log2e, causal, None, None)

    name = f"_flash_3xtf32_d{DP}_{'async' if ASYNC else 'plain'}{'_rope' if rope else ''}"
    if g != tf32_geometry(DP):
        name += "_" + "_".join(str(int(x)) for x in g)
    kernel.__name__ = kernel.__qualname__ = name
    compiled = cuda.jit(**_gpu_options(launch_bounds=(THREADS, g.min_blocks)))(kernel)
    globals()[name] = _BUILT_3XTF32[key] = compiled
    return compiled


def launch_3xtf32(q, k, v, causal, out, *tables, geometry=None):
    """float32 attention by the 3xTF32 kernel (the fp32 ladder's tensor_cores stage launches this): one
    block per g.queries queries of each (batch, head). q, k, v, out: B x H x S x D float32, D <= 128.
    ``tables``: RoPE's cos and sin (S x D/2 float32), for attention[rope]'s kernel, which rotates Q and
    K as they land in shared memory; none for plain attention."""
    B, H, S, D = q.shape
    DP = padded_head_dim(D)
    g = tf32_geometry(DP) if geometry is None else geometry
    use_async = D % 4 == 0 and aligned16(q, k, v)  # whole 16-byte chunks a row, aligned: cp.async
    kernel = build_3xtf32(DP, use_async, g, rope=bool(tables))
    args = (q, k, v, out, np.float32(LOG2E / math.sqrt(D)), causal, *tables)
    nbytes = smem_bytes_3xtf32(DP, g)
    if nbytes > STATIC_LIMIT:
        set_max_dynamic_shared_memory(kernel, args, nbytes)
    kernel[(B * H, blocks_for(S, g.queries)), 32 * g.warps, 0, nbytes](*args)


for _dp in HEAD_DIM_STEPS:  # built at import: tools that compile kernels by name find them
    for _async in (False, True):
        for _rope in (False, True):
            build_3xtf32(_dp, _async, rope=_rope)
