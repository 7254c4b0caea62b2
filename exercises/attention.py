# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/attention.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade attention            (or attention.<stage>; its other operators: attention[rope])
# The grader checks each stage against the operator in solutions/attention.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 166bc0d6dd99222450cd864daa7198db442c5bf189694c9d1076f2dc83e04daf
# --------------------------------------------------------------------------------------------------
"""Scaled dot-product attention in float32, from three kernels to a register-tiled FlashAttention.

out[b, h, i] = sum_j softmax_j(q[b, h, i] . k[b, h, j] / sqrt(D)) v[b, h, j], for every batch b, head
h and query i; with the causal mask, query i sees keys j <= i only. The inputs q, k, v and the output
are B x H x S x D float32 arrays, D (the head size) at most 128, and ``causal``, a one-element int32
device array (1: apply the mask), which the kernels read themselves, as the GEMM's alpha and beta, so
no launcher waits for a copy to the host. A size is B x H x S x D x CAUSAL (0 or 1).

It is two matrix products with a row softmax between them: 4 B H S^2 D flops (the count the tables
use with and without the mask, so that a causal run's TFLOP/s compares with the full one as speed). What
makes attention its own problem is the S x S matrix of scores in the middle. At 8 x 16 x 2048 x 64
it is 2 GiB of float32, sixteen times the inputs: a kernel that writes it to memory and reads it back
(stage 1) is bound by that traffic, not by its flops. The ladder gets rid of it:

1. ``naive``: three kernels, scores to memory, a row softmax in place, then P . V.
2. ``fused_row``: one block per query, its row of scores in shared memory. No S x S matrix in
   memory, but every query reads all of K and V again (from L2): S^2 D traffic, still.
3. ``flash``: tiles of 16 queries and 16 keys through shared memory with the online softmax (a
   running maximum and sum per query, the output rescaled when the maximum grows): FlashAttention.
   Each K/V element now serves 16 queries.
4. ``register_tiles``: 64 x 64 tiles, each thread a 4 x 4 block of scores and a 4 x D/16 block of the
   output in registers, 16-byte shared loads: each K/V element serves 64 queries, and each shared
   load feeds 8 multiply-adds instead of half of one.
5. ``causal_skip``: under the causal mask, tiles above the diagonal are skipped, not computed and
   masked; within a head, the blocks with the most work start first. Without the mask it is stage 4.
6. ``tensor_cores``: both products on the tensor cores in 3xTF32 (each float32 split into two TF32
   parts, three mma a product: float32 accuracy), FlashAttention-2's layout (``attention_tc.py``; the
   kernel is in ``_flash_mma.py``, which both share).

The bytes model of each stage counts what it reads from L2 or memory (``stage_bytes``): the scores
it writes and reads back (stage 1: 6 S^2 floats per head) and how often K and V are fetched (once
per query in stage 2, once per 16, 64 or 128 queries in the flash stages). The operator's own model is
the minimum, q, k and v read and out written once.

A second operator, ``attention[rope]``, takes the cos and sin tables of RoPE (rotary position
embedding, ``rope.py``) too and attends over q and k rotated by them, as a Llama layer does:

1. ``rotate_then_attend``: a RoPE kernel writes rotated copies of q and k, then stage 5 runs on them.
2. ``rotate_in_shared``: stage 5's kernel rotates Q and each K tile in shared memory, right after loading them.
3. ``on_tensor_cores``: the same rotation in stage 6's 3xTF32 kernel, as each tile lands in shared memory.
"""

import math

import numpy as np
from numba import cuda, float32, uint32

from workbench import device as _device
from workbench import library_peers as peers
from workbench.shared_memory import STATIC_LIMIT, set_max_dynamic_shared_memory
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch
from workbench.targets import against_peer

from solutions._attention_common import (draw_rope_base, attention_flops, extreme_logits, kv_fetch_bytes, naive_expression,
                                         reference, rising_logits, rope_tables, sdpa_peer)
from solutions._flash_mma import launch_3xtf32, padded_head_dim, tf32_geometry

MAX_HEAD_DIM = 128  # the largest D the kernels take (as FlashAttention's, they are built per head size)
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
# The running maximum's start: the most negative finite float32. exp2(start - m) is then 0 or 1,
# never exp2(-inf - -inf) = NaN, even while a row has seen only masked (-inf) scores.
LOWEST = np.float32(np.finfo(np.float32).min)
LOG2E = 1.4426950408889634  # the kernels compute exp(x) as exp2(x * log2 e): one ex2.approx instruction
EPS32 = float(np.finfo(np.float32).eps)


def _gpu_options(**options):
    """Compile options only the real GPU compiler takes (the simulator's cuda.jit takes none)."""
    return {} if _device.is_simulator() else options


# 16-byte alignment of the register-tiled stage's shared memory, which lets the compiler emit
# ld.shared.v4. numba's simulator refuses any alignment= argument, so there it is None.
ALIGN16 = None if _device.is_simulator() else 16


# -- the operators -------------------------------------------------------------------------------

def _inputs(size, rng):
    B, H, S, D, causal = size
    # Unit-variance q and k: the scores q.k / sqrt(D) are then about N(0, 1), a softmax that is
    # neither uniform nor one-hot, so a wrong scale or a missing rescale shows.
    q = rng.normal(0.0, 1.0, (B, H, S, D)).astype(np.float32)
    k = rng.normal(0.0, 1.0, (B, H, S, D)).astype(np.float32)
    v = rng.normal(0.0, 1.0, (B, H, S, D)).astype(np.float32)
    return q, k, v, np.array([causal], np.int32)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader):
    one set with its even query rows' logits in the hundreds and its odd ones' every logit near -150
    (``extreme_logits`` says what each catches), and one whose logits rise with the key, so that every
    key tile raises every running maximum (``rising_logits``: a missing rescale fails on every draw)."""
    q, k, v, causal = _inputs(size, rng)
    q, k = extreme_logits(q, k, size[3], rng)
    sets = [("extreme-logits", (q, k, v, causal))]
    q, k, v, causal = _inputs(size, rng)
    q, k = rising_logits(q, k, size[3], rng)
    return sets + [("rising-logits", (q, k, v, causal))]


def _validate(q, k, v, causal, out):
    expect_device_array("q", q, dtype=np.float32, ndim=4)
    B, H, S, D = q.shape
    if D > MAX_HEAD_DIM:
        raise InputError(f"the head size D = {D} is more than {MAX_HEAD_DIM}, the largest these kernels take "
                         "(q is B x H x S x D)")
    for name, a in (("k", k), ("v", v), ("out", out)):
        expect_device_array(name, a, dtype=np.float32, shape=(B, H, S, D))
    expect_device_array("causal", causal, dtype=np.int32, shape=(1,))


def _tolerance(size, dtype):
    # Each score is a D-term float32 dot product and each output an S-term weighted mean: rounding
    # errors grow like sqrt(D) and sqrt(S) ulps. The exponentials use ex2.approx (2 ulp). A wrong
    # index, a missing rescale or a wrong scale is off by O(1).
    B, H, S, D, causal = size
    return max(3e-5, 4 * EPS32 * math.sqrt(S + D))


def _io_bytes(size):
    B, H, S, D, causal = size
    return 4 * B * H * S * D * 4  # q, k, v read and out written once, float32


def _kv_bytes(size, queries_per_fetch, skips_masked=False):
    """Bytes of float32 K and V fetched when every group of ``queries_per_fetch`` queries reads the keys
    it needs once (``kv_fetch_bytes``)."""
    return kv_fetch_bytes(size, queries_per_fetch, skips_masked, itemsize=4)


def _naive_bytes(size):
    B, H, S, D, causal = size
    # scores written (1), read three times and written by the softmax (4), read by P . V (1)
    return _io_bytes(size) + 6 * B * H * S * S * 4


# On a GPU (tests/test_ladders.py, the grader): every S of 1, 17, 1000 and 2049 (one key, a multiple of
# no tile, several query blocks, one past a power of two) at both head sizes the kernels are built for
# (64 and 128), with and without the mask. The middle one also gets the adversarial inputs there.
CHECK_SIZES = [(2, 3, 1, 64, 1), (2, 3, 1, 128, 0), (1, 4, 17, 64, 1), (2, 3, 17, 128, 0), (1, 2, 1000, 128, 0),
               (1, 4, 1000, 64, 1), (1, 2, 2049, 64, 1), (1, 2, 2049, 128, 1), (1, 2, 2049, 64, 0)]
# In the simulator, tiny sizes: it runs each of a block's 256 threads as a Python thread. The quick tier
# checks the middle one (S = 17 under the mask: two of stage 3's tiles, a multiple of no tile); the
# sm_90 compile check runs the third. tests/test_attention.py checks more tiles (slow).
SIM_SIZES = [(1, 1, 1, 16, 0), (1, 1, 17, 16, 1), (1, 1, 2, 16, 1)]
BENCH_SIZES = [(16, 16, 1024, 64, 0), (8, 16, 2048, 64, 0), (8, 16, 2048, 64, 1), (4, 32, 4096, 128, 0),
               (4, 32, 4096, 128, 1)]
HEADLINE = (8, 16, 2048, 64, 1)

op = Operator(
    name="attention",
    targets=[against_peer(1.0, "torch SDPA", stage="best", size=(8, 16, 2048, 64, 0))],  # without the mask
    title="Scaled dot-product attention, float32, causal or not",
    reference=reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size[:4], np.float32),
    bytes_moved=_io_bytes,
    flops=attention_flops,
    validate=_validate,
    tolerance=_tolerance,
    peer=sdpa_peer,
    torch_expression=naive_expression,
    adversarial_inputs=_adversarial,
    bound="compute",
    size_names=("batch", "heads", "seq", "head_dim", "causal"),
    check_sizes=CHECK_SIZES,
    sim_sizes=SIM_SIZES,
    bench_sizes=BENCH_SIZES,
    headline_size=HEADLINE,
    record_all_sizes=True,
    rank=300,
    group="Attention: from three kernels to FlashAttention",
)


def _scale_log2e(q):
    """1/sqrt(D) * log2(e) as a float32 value: the kernels' scores are in base 2, exp2(s * this)."""
    return np.float32(LOG2E / math.sqrt(q.shape[3]))


# -- shared helpers ------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _half_warp_max(x):
    """The maximum over the 16 lanes of this half-warp (lanes 0-15 or 16-31), in all 16."""
    for offset in (8, 4, 2, 1):
        x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, offset))
    return x


@cuda.jit(device=True, inline=True)
def _half_warp_sum(x):
    for offset in (8, 4, 2, 1):
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
    return x


@cuda.jit(device=True, inline=True)
def _masked(i, j, S, causal):
    """Is key j hidden from query i? Past the end of the sequence, or in the future under a causal mask."""
    return j >= S or (causal and j > i)


# -- 1. naive: three kernels, the scores through memory ----------------------------------------

NAIVE_THREADS = 256


@cuda.jit
def _scores(q, k, scores, scale, causal):
    # One thread per score; threadIdx.x walks keys j, so a warp reads 32 different rows of k.
    bh = cuda.blockIdx.z
    H = q.shape[1]
    b = bh // H
    h = bh % H
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    S = q.shape[2]
    if i < S and j < S:
        # EXERCISE: write this part of `_scores`. Read the hints one at a time.
        #   hint 1 (nudge): the dot product of query row i and key row j over the head size, times scale.
        #   hint 2 (nearly the answer): a masked key (j > i under the causal mask) gets -inf: exp(-inf) = 0 in the softmax.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _softmax_rows(scores):
    # One thread per row of scores, three passes: the maximum, the sum of exponentials, the division.
    row = cuda.grid(1)
    if row < scores.shape[0] * scores.shape[1]:
        bh = row // scores.shape[1]
        i = row % scores.shape[1]
        S = scores.shape[2]
        m = LOWEST
        for j in range(S):
            m = max(m, scores[bh, i, j])
        total = float32(0.0)
        for j in range(S):
            total += math.exp(scores[bh, i, j] - m)
        inverse = float32(1.0) / total
        for j in range(S):
            scores[bh, i, j] = math.exp(scores[bh, i, j] - m) * inverse


@cuda.jit
def _weighted_values(p, v, out):
    # One thread per output element; threadIdx.x walks d, so a warp reads a row of v in one go.
    bh = cuda.blockIdx.z
    H = v.shape[1]
    b = bh // H
    h = bh % H
    d = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if i < v.shape[2] and d < v.shape[3]:
        acc = float32(0.0)
        for j in range(v.shape[2]):
            acc += p[bh, i, j] * v[b, h, j, d]
        out[b, h, i, d] = acc


def _three_kernels(q, k, v, causal, out):
    B, H, S, D = q.shape
    scores = scratch("attention.scores", (B * H, S, S))  # S^2 floats a head: the traffic to get rid of
    _scores[(blocks_for(S, 32), blocks_for(S, 8), B * H), (32, 8)](
        q, k, scores, np.float32(1.0 / math.sqrt(D)), causal)
    _softmax_rows[blocks_for(B * H * S, NAIVE_THREADS), NAIVE_THREADS](scores)
    _weighted_values[(blocks_for(D, 32), blocks_for(S, 8), B * H), (32, 8)](scores, v, out)


NAIVE_PARAGRAPH = """
    Attention as the formula writes it, three kernels: one thread per score computes q_i . k_j /
    sqrt(D) and writes it to an S x S matrix in memory; a row softmax (one thread per row: maximum,
    sum of exponentials, division) rewrites it in place; one thread per output element sums the
    weighted rows of V. Correct, and bound by the matrix in the middle: per head it moves 6 S^2
    floats (written, read three times and rewritten by the softmax, read by P . V) against 4 S D
    for the inputs and output, 48x more at S = 2048, D = 64, and the softmax's thread-per-row reads
    are uncoalesced on top. Under the causal mask half the scores are -inf, and still computed,
    written and read."""


@op.stage("naive", NAIVE_PARAGRAPH, bytes_moved=_naive_bytes)
def naive(q, k, v, causal, out):
    _three_kernels(q, k, v, causal, out)


# -- 2. fused_row: one block per query, its scores in shared memory ---------------------------

ROW_THREADS = 64
ROW_WARPS = ROW_THREADS // 32


@cuda.jit(device=True, inline=True)
def _block_max(x, exchange):
    """The maximum of x over the block, in every thread (a warp shuffle tree, then one exchange)."""
    for offset in (16, 8, 4, 2, 1):
        x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, offset))
    cuda.syncthreads()  # exchange may still be read from the previous reduction
    if cuda.threadIdx.x % 32 == 0:
        exchange[cuda.threadIdx.x // 32] = x
    cuda.syncthreads()
    x = exchange[0]
    for w in range(1, ROW_WARPS):
        x = max(x, exchange[w])
    return x


@cuda.jit(device=True, inline=True)
def _block_sum(x, exchange):
    for offset in (16, 8, 4, 2, 1):
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
    cuda.syncthreads()
    if cuda.threadIdx.x % 32 == 0:
        exchange[cuda.threadIdx.x // 32] = x
    cuda.syncthreads()
    x = exchange[0]
    for w in range(1, ROW_WARPS):
        x += exchange[w]
    return x


@cuda.jit
def _fused_row(q, k, v, out, scale_log2e, causal):
    row = cuda.shared.array(0, float32)  # dynamic: the S scores of this query, then its D values of q
    exchange = cuda.shared.array(ROW_WARPS, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x
    bh = cuda.blockIdx.y
    H = q.shape[1]
    b = bh // H
    h = bh % H
    S = q.shape[2]
    D = q.shape[3]
    for d in range(t, D, ROW_THREADS):
        row[S + d] = q[b, h, i, d]
    cuda.syncthreads()
    keys = i + 1 if causal[0] != 0 else S  # under the causal mask the later keys are never computed
    # EXERCISE: write this part of `_fused_row`. Read the hints one at a time.
    #   hint 1 (nudge): scores of keys t, t + ROW_THREADS, ... (dot of the shared q with a row of k, times scale_log2e) into row[j].
    #   hint 2: the block's maximum m (_block_max), then row[j] = exp2(row[j] - m) and the block's sum l (_block_sum).
    #   hint 3 (nearly the answer): thread t then owns output columns d = t, t + ROW_THREADS, ...: sum over j of row[j] * v[.., j, d], over l.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _launch_fused_row(q, k, v, causal, out):
    B, H, S, D = q.shape
    nbytes = 4 * (S + D)
    if nbytes > STATIC_LIMIT:  # past S = 12000 or so the row needs the opt-in (up to 227 KiB: S < 58000)
        set_max_dynamic_shared_memory(_fused_row, (q, k, v, out, _scale_log2e(q), causal), nbytes)
    _fused_row[(S, B * H), ROW_THREADS, 0, nbytes](q, k, v, out, _scale_log2e(q), causal)


FUSED_ROW_PARAGRAPH = """
    One block of 64 threads per query, and the whole computation in one kernel: the block computes
    the query's S scores into shared memory, takes their maximum and sum with warp shuffles, turns
    them into probabilities in place, and each thread then sums one output column over the keys.
    The S x S matrix never reaches memory. But K and V are read again for every query: S^2 D
    floats per head from L2 (half with the causal mask, where the later keys are never computed),
    where the minimum is S D. Exponentials are base 2 with the scale folded in (exp(x) =
    exp2(x log2 e), a single ex2.approx instruction)."""


@op.stage("fused_row", FUSED_ROW_PARAGRAPH,
          bytes_moved=lambda size: _io_bytes(size) // 2 + _kv_bytes(size, 1, skips_masked=True))
def fused_row(q, k, v, causal, out):
    _launch_fused_row(q, k, v, causal, out)


# -- 3. flash: tiles through shared memory, the online softmax ---------------------------------

TILE = 16  # stage 3: 16 queries x 16 keys per tile, one thread per score
ROW = MAX_HEAD_DIM + 1  # padded row: column d of the 16 rows of K falls in 16 different banks


@cuda.jit
def _flash_shared(q, k, v, out, scale_log2e, causal):
    Qs = cuda.shared.array((TILE, ROW), float32)
    Ks = cuda.shared.array((TILE, ROW), float32)
    Vs = cuda.shared.array((TILE, MAX_HEAD_DIM), float32)
    Os = cuda.shared.array((TILE, MAX_HEAD_DIM), float32)  # the 16 output rows, rescaled as we go
    Ps = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x  # the key of the tile this thread scores (and a column when loading)
    ty = cuda.threadIdx.y  # the query row of the tile this thread works on
    bh = cuda.blockIdx.y
    H = q.shape[1]
    b = bh // H
    h = bh % H
    S = q.shape[2]
    D = q.shape[3]
    i = cuda.blockIdx.x * TILE + ty
    is_causal = causal[0] != 0
    for d in range(tx, D, TILE):
        Qs[ty, d] = q[b, h, i, d] if i < S else float32(0.0)
        Os[ty, d] = float32(0.0)
    m_run = LOWEST  # the running maximum of row i's scores (base 2), the same in its 16 threads
    l_part = float32(0.0)  # this thread's share of the running sum of exp2(score - m_run)
    for j0 in range(0, S, TILE):
        j = j0 + ty  # as a loader, this thread copies row ty of the K and V tiles
        for d in range(tx, D, TILE):
            Ks[ty, d] = k[b, h, j, d] if j < S else float32(0.0)
            Vs[ty, d] = v[b, h, j, d] if j < S else float32(0.0)
        cuda.syncthreads()
        x = float32(0.0)
        for d in range(D):
            x += Qs[ty, d] * Ks[tx, d]
        x *= scale_log2e
        if _masked(i, j0 + tx, S, is_causal):
            x = NEG_INF
        alpha = float32(1.0)  # what the running sums and the output rows are rescaled by
        p = float32(0.0)  # this score's weight, relative to the running maximum
        # EXERCISE: write this part of `_flash_shared`. Read the hints one at a time.
        #   hint 1 (nudge): the row's new maximum m_new takes this tile's 16 scores into account (_half_warp_max).
        #   hint 2: everything summed so far was relative to m_run: it shrinks by alpha = exp2(m_run - m_new).
        #   hint 3 (nearly the answer): p = exp2(x - m_new) joins the sum: l_part = l_part * alpha + p; then m_run = m_new.
        pass  # TODO(exercise): not implemented yet: replace this line with your code
        Ps[ty, tx] = p
        cuda.syncthreads()
        for d in range(tx, D, TILE):  # O = alpha O + P V, for this thread's columns of row ty
            acc = Os[ty, d] * alpha
            for c in range(TILE):
                acc += Ps[ty, c] * Vs[c, d]
            Os[ty, d] = acc
        cuda.syncthreads()  # before the next tile overwrites Ks, Vs and Ps
    inverse = float32(1.0) / _half_warp_sum(l_part)
    if i < S:
        for d in range(tx, D, TILE):
            out[b, h, i, d] = Os[ty, d] * inverse


def _launch_flash_shared(q, k, v, causal, out):
    B, H, S, D = q.shape
    _flash_shared[(blocks_for(S, TILE), B * H), (TILE, TILE)](q, k, v, out, _scale_log2e(q), causal)


FLASH_PARAGRAPH = """
    FlashAttention: a block takes 16 queries and walks the keys in tiles of 16, copying each K and
    V tile into shared memory once for all 16 queries, so K and V are read S/16 times per head
    instead of S times. One thread per score of the 16 x 16 tile. The softmax is online: each query
    keeps a running maximum m and sum l; a tile whose scores raise the maximum to m' scales the sum
    and the output row so far by exp2(m - m') before adding its own exp2(s - m') terms, so no score
    is ever stored beyond its tile and nothing is read twice. The output rows live in shared memory
    and are divided by l at the end. Each multiply-add still needs two shared-memory loads. Under
    the causal mask the tiles past the diagonal are computed in full, then thrown away."""


@op.stage("flash", FLASH_PARAGRAPH, bytes_moved=lambda size: _io_bytes(size) // 2 + _kv_bytes(size, TILE),
          boundaries={"seq": (TILE,)})
def flash(q, k, v, causal, out):
    _launch_flash_shared(q, k, v, causal, out)


# -- 4. register_tiles: 64 x 64 tiles, 4 x 4 scores and 4 rows of the output per thread --------

BR = 64  # queries per block
BC = 64  # keys per tile
THREADS = 256  # 16 x 16: thread (ty, tx) owns query rows ty + 16 m and keys tx + 16 n, m, n < 4
PAD = 4  # floats added to each shared row: rows 16 apart start 4 banks apart, and stay 16-byte aligned
PS = BC + PAD  # row stride of the P tile


@cuda.jit(device=True, inline=True)
def _load_tile(src, b, h, row0, S, D, smem, at, RS, DP):
    """Rows row0 .. row0 + 63 of src[b, h] into the shared tile at ``at`` (row stride RS), zero past
    the sequence and past the head size (the kernels work on DP >= D columns, a multiple of 64)."""
    t = cuda.threadIdx.y * 16 + cuda.threadIdx.x
    for it in range(BR * DP // THREADS):
        e = it * THREADS + t  # consecutive threads, consecutive columns: coalesced
        r = e // DP
        c = e % DP
        value = float32(0.0)
        if row0 + r < S and c < D:
            value = src[b, h, row0 + r, c]
        smem[uint32(at + r * RS + c)] = value


@cuda.jit(device=True, inline=True)
def _tile_scores(smem, q_at, k_at, RS, DP, s, qr, kr):
    """s[m, n] = (row ty + 16m of the Q tile) . (row tx + 16n of the K tile), four columns a step: each
    step is 8 16-byte shared loads (4 rows of Q, 4 of K) and 64 multiply-adds from registers."""
    for m in range(4):
        for n in range(4):
            s[m, n] = float32(0.0)
    for d in range(0, DP, 4):
        ud = uint32(d)
        for m in range(4):
            for u in range(4):
                qr[m, u] = smem[q_at + uint32(16 * m * RS + u) + ud]
        for n in range(4):
            for u in range(4):
                kr[n, u] = smem[k_at + uint32(16 * n * RS + u) + ud]
        for m in range(4):
            for n in range(4):
                for u in range(4):
                    s[m, n] += qr[m, u] * kr[n, u]


@cuda.jit(device=True, inline=True)
def _online_softmax(s, o, m_run, l_part, i0, j0, S, scale_log2e, masked, causal, OC):
    """Turn this thread's 4 x 4 scores into probabilities against the rows' new maxima, and rescale its
    running sums and output rows by how much each maximum grew. ``masked``: apply the mask (the tile
    holds keys past S, or, with ``causal``, keys after some of its queries)."""
    for m in range(4):
        i = i0 + 16 * m
        tile_max = NEG_INF
        for n in range(4):
            x = s[m, n] * scale_log2e
            if masked and _masked(i, j0 + 16 * n, S, causal):
                x = NEG_INF
            s[m, n] = x
            tile_max = max(tile_max, x)
        m_new = max(m_run[m], _half_warp_max(tile_max))
        alpha = math.exp2(m_run[m] - m_new)
        m_run[m] = m_new
        total = float32(0.0)
        for n in range(4):
            p = math.exp2(s[m, n] - m_new)
            s[m, n] = p
            total += p
        l_part[m] = l_part[m] * alpha + total
        for c in range(4 * OC):
            o[m, c] *= alpha


@cuda.jit(device=True, inline=True)
def _pv_columns(smem, p_at, v_at, RS, DP, c, o, pr, vr):
    """o[m, 4c + w] += sum over the tile's keys j of P[row ty + 16m, j] V[j, 64c + 4tx + w], four keys a
    step: 16-byte loads of 4 rows of P and of this thread's 4 columns in 4 rows of V, 64 multiply-adds.
    ``c`` is a constant at each call, so o stays in registers (an index the compiler cannot resolve
    would move the whole array to local memory). With D <= 32, the lanes past the columns rest."""
    if 4 * cuda.threadIdx.x + 64 * c >= DP:
        return
    for j in range(0, BC, 4):
        uj = uint32(j)
        for m in range(4):
            for u in range(4):
                pr[m, u] = smem[p_at + uint32(16 * m * PS + u) + uj]
        for u in range(4):
            for w in range(4):
                vr[u, w] = smem[v_at + uint32(u * RS + 64 * c + w) + uj * uint32(RS)]
        for m in range(4):
            for u in range(4):
                for w in range(4):
                    o[m, 4 * c + w] += pr[m, u] * vr[u, w]


@cuda.jit(device=True, inline=True)
def _flash_tile(k, v, b, h, q0, j0, S, D, smem, RS, DP, OC, scale_log2e, masked, causal,
                s, o, m_run, l_part, left, right):
    """One tile of BC keys for the block's BR queries (from q0): load K and V, the scores, the online
    softmax, O += P V. ``left`` and ``right`` are the 4 x 4 operand registers of both products."""
    cuda.syncthreads()  # the previous tile's P (which lives where K goes) and V have been read
    _load_tile(k, b, h, j0, S, D, smem, BR * RS, RS, DP)
    _load_tile(v, b, h, j0, S, D, smem, BR * RS + max(BC * RS, BR * PS), RS, DP)
    cuda.syncthreads()
    _attend_loaded_tile(q0, j0, S, smem, RS, DP, OC, scale_log2e, masked, causal, s, o, m_run, l_part, left, right)


@cuda.jit(device=True, inline=True)
def _attend_loaded_tile(q0, j0, S, smem, RS, DP, OC, scale_log2e, masked, causal, s, o, m_run, l_part, left, right):
    """The scores of the K tile in shared memory, the online softmax, O += P V with the V tile."""
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    k_at = BR * RS
    v_at = k_at + max(BC * RS, BR * PS)  # P takes the K tile's place: room for the larger of the two
    _tile_scores(smem, uint32(ty * RS), uint32(k_at + tx * RS), RS, DP, s, left, right)
    _online_softmax(s, o, m_run, l_part, q0 + ty, j0 + tx, S, scale_log2e, masked, causal, OC)
    cuda.syncthreads()  # every thread is done with the K tile: P takes its place
    for m in range(4):
        for n in range(4):
            smem[uint32(k_at + (ty + 16 * m) * PS + tx + 16 * n)] = s[m, n]
    cuda.syncthreads()
    p_at = uint32(k_at + ty * PS)
    _pv_columns(smem, p_at, uint32(v_at + 4 * tx), RS, DP, 0, o, left, right)
    if OC > 1:  # D > 64: the second 64 columns
        _pv_columns(smem, p_at, uint32(v_at + 4 * tx), RS, DP, 1, o, left, right)


@cuda.jit(device=True, inline=True)
def _start_rows(q, b, h, q0, S, D, smem, RS, DP, OC, o, m_run, l_part):
    """The block's Q tile into shared memory (it stays for every key tile); empty running sums."""
    _empty_rows(OC, o, m_run, l_part)
    _load_tile(q, b, h, q0, S, D, smem, 0, RS, DP)


@cuda.jit(device=True, inline=True)
def _empty_rows(OC, o, m_run, l_part):
    for m in range(4):
        m_run[m] = LOWEST
        l_part[m] = float32(0.0)
        for c in range(4 * OC):
            o[m, c] = float32(0.0)


@cuda.jit(device=True, inline=True)
def _finish_rows(out, b, h, q0, S, D, OC, o, l_part):
    """out = O / l for this thread's 4 rows and 4 OC columns (l summed over the row's 16 threads)."""
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    for m in range(4):
        inverse = float32(1.0) / _half_warp_sum(l_part[m])
        i = q0 + ty + 16 * m
        for c in range(OC):
            for w in range(4):
                d = 64 * c + 4 * tx + w
                if i < S and d < D:
                    out[b, h, i, d] = o[m, 4 * c + w] * inverse


@cuda.jit(device=True, inline=True)
def _flash_register_tiles(q, k, v, out, scale_log2e, causal, smem, s, o, m_run, l_part, left, right, RS, DP, OC):
    bh = cuda.blockIdx.y
    H = q.shape[1]
    b = bh // H
    h = bh % H
    S = q.shape[2]
    D = q.shape[3]
    q0 = cuda.blockIdx.x * BR
    is_causal = causal[0] != 0
    _start_rows(q, b, h, q0, S, D, smem, RS, DP, OC, o, m_run, l_part)
    for j0 in range(0, S, BC):  # every key tile, masked ones included: the mask zeroes their weights
        _flash_tile(k, v, b, h, q0, j0, S, D, smem, RS, DP, OC, scale_log2e, True, is_causal,
                    s, o, m_run, l_part, left, right)
    _finish_rows(out, b, h, q0, S, D, OC, o, l_part)


# The register-tiled kernels are built for D padded to one of these (zero columns past D): a thread
# owns 4 output columns in each 64, so below 64 some lanes have none (the simulator's small sizes).
HEAD_DIM_STEPS = (16, 32, 64, 128)
_BUILT: dict = {}


def _register(name, kernel):
    """Compile a register-tiled kernel built for one head size and keep it under ``name``, also as a
    module-level name, so that tools that find kernels by module and name (the PTX check) find it."""
    kernel.__name__ = kernel.__qualname__ = name
    globals()[name] = _BUILT[name] = cuda.jit(**_gpu_options(launch_bounds=(THREADS, 2)))(kernel)


def _padded_head_dim(D):
    return next(dp for dp in HEAD_DIM_STEPS if D <= dp)


def _tile_bytes(DP):
    """Dynamic shared memory of the register-tiled kernels: the Q, K (then P) and V tiles."""
    RS = DP + PAD
    return 4 * (BR * RS + max(BC * RS, BR * PS) + BC * RS)


def _register_tiles_kernel(DP):
    """The stage-4 kernel for head sizes up to DP (64 or 128): the loops over the head size and the
    output's columns then have constant trip counts, which lets the compiler unroll them and keep
    the accumulators in registers (made once per DP, as FlashAttention builds one per head size)."""
    name = f"_register_tiles_d{DP}"
    if name not in _BUILT:
        RS, OC = DP + PAD, (DP + 63) // 64  # closed-over ints: numba compiles them in as constants
        O_SHAPE = (4, 4 * OC)  # a local array's shape must be such a constant, not an expression

        def kernel(q, k, v, out, scale_log2e, causal):
            smem = cuda.shared.array(0, float32, alignment=ALIGN16)
            s = cuda.local.array((4, 4), float32)
            o = cuda.local.array(O_SHAPE, float32)
            m_run = cuda.local.array(4, float32)
            l_part = cuda.local.array(4, float32)
            left = cuda.local.array((4, 4), float32)
            right = cuda.local.array((4, 4), float32)
            _flash_register_tiles(q, k, v, out, scale_log2e, causal, smem, s, o, m_run, l_part, left, right,
                                  RS, DP, OC)

        _register(name, kernel)
    return _BUILT[name]


def _launch_tiles(kernel, q, k, v, causal, out, *tables):
    """``tables``: arguments the kernel takes after its first six (RoPE's cos and sin: attention[rope])."""
    B, H, S, D = q.shape
    args = (q, k, v, out, _scale_log2e(q), causal, *tables)
    nbytes = _tile_bytes(_padded_head_dim(D))
    set_max_dynamic_shared_memory(kernel, args, nbytes)  # 51 KiB (D <= 64) or 99 KiB: past the default 48
    kernel[(blocks_for(S, BR), B * H), (16, 16), 0, nbytes](*args)





REGISTER_TILES_PARAGRAPH = """
    The flash kernel with the GEMM ladder's register tiling. A block takes 64 queries and walks the
    keys 64 at a time; each of its 256 threads owns 4 query rows (ty + 16m) and 4 keys (tx + 16n): a
    4 x 4 block of scores, built four columns at a time from 16-byte shared loads of 4 rows of Q and
    4 rows of K (8 loads feed 64 multiply-adds, against 2 loads per multiply-add in stage 3), and the
    same 4 rows of the output, 4 x D/16 values, kept in registers across all key tiles. A row's 16
    threads are 16 lanes of one warp, so its maximum is 4 shuffles and its sum waits until the end.
    P goes through shared memory into the space of the K tile (no longer needed), and P V uses the
    same 16-byte loads. K and V are now fetched once per 64 queries. The kernel is compiled for D
    padded to 64 or 128 so its loops unroll; 51 KiB (99 KiB) of shared memory need the opt-in.
    Under the causal mask every key tile is still computed, the half above the diagonal only to
    give weights of zero."""


@op.stage("register_tiles", REGISTER_TILES_PARAGRAPH,
          bytes_moved=lambda size: _io_bytes(size) // 2 + _kv_bytes(size, BR), boundaries={"seq": (BC,)})
def register_tiles(q, k, v, causal, out):
    _launch_tiles(_register_tiles_kernel(_padded_head_dim(q.shape[3])), q, k, v, causal, out)


# -- 5. causal_skip: the tiles above the diagonal are never loaded ------------------------------

@cuda.jit(device=True, inline=True)
def _flash_causal_tiles(q, k, v, out, scale_log2e, causal, smem, s, o, m_run, l_part, left, right, RS, DP, OC):
    bh = cuda.blockIdx.y
    H = q.shape[1]
    b = bh // H
    h = bh % H
    S = q.shape[2]
    D = q.shape[3]
    is_causal = causal[0] != 0
    # EXERCISE: write this part of `_flash_causal_tiles`. Read the hints one at a time.
    #   hint 1 (nudge): block x = 0 should take the LAST query block of its head (the most key tiles): within a head it
    #   hint 2: starts first and the short blocks follow it. Query i sees keys up to i: which tiles can it skip?
    #   hint 3 (nearly the answer): under the mask, tiles j0 = 0, 64, ... below q0 + BR; only those with j0 + BC > q0 (or > S) need the mask.
    return  # TODO(exercise): not implemented yet: replace this line with your code
    _finish_rows(out, b, h, q0, S, D, OC, o, l_part)


def _causal_skip_kernel(DP):
    """The stage-5 kernel for head sizes up to DP (see _register_tiles_kernel)."""
    name = f"_causal_skip_d{DP}"
    if name not in _BUILT:
        RS, OC = DP + PAD, (DP + 63) // 64
        O_SHAPE = (4, 4 * OC)

        def kernel(q, k, v, out, scale_log2e, causal):
            smem = cuda.shared.array(0, float32, alignment=ALIGN16)
            s = cuda.local.array((4, 4), float32)
            o = cuda.local.array(O_SHAPE, float32)
            m_run = cuda.local.array(4, float32)
            l_part = cuda.local.array(4, float32)
            left = cuda.local.array((4, 4), float32)
            right = cuda.local.array((4, 4), float32)
            _flash_causal_tiles(q, k, v, out, scale_log2e, causal, smem, s, o, m_run, l_part, left, right,
                                RS, DP, OC)

        _register(name, kernel)
    return _BUILT[name]


@op.stage("causal_skip", """
    Stage 4 computed every key tile and masked half of them away. Here a block stops at the
    diagonal: the 64 queries from q0 see no key past q0 + 63, so the tiles after it are never
    loaded or multiplied, and only the diagonal tile is masked (the ones before it are wholly
    visible). Half the work and half the K/V traffic disappear. The blocks now have unequal work
    (the last query block walks all S/64 tiles, the first one), so the query blocks are walked
    backwards: within a head, the longest block starts first and the short ones follow it. Only
    within a head: the grid is (query blocks, B H) and the GPU starts blocks x fastest, so it starts
    all of one head's blocks, long and short, then the next head's, and the last heads' long blocks
    can still run alone at the end. The tensor_cores stage starts the longest block of every head
    first instead (block_order in _flash_mma.py); this stage keeps the simpler order, not timed
    against that one. Without the mask this is stage 4.""",
          bytes_moved=lambda size: _io_bytes(size) // 2 + _kv_bytes(size, BR, skips_masked=True))
def causal_skip(q, k, v, causal, out):
    _launch_tiles(_causal_skip_kernel(_padded_head_dim(q.shape[3])), q, k, v, causal, out)


for _dp in HEAD_DIM_STEPS:  # built at import: tools that compile kernels by name find them
    _register_tiles_kernel(_dp)
    _causal_skip_kernel(_dp)


# -- 6. tensor_cores: float32 products on the tensor cores, in three TF32 parts -------------------------

def _tf32_block_queries(size):
    """Queries a block of the 3xTF32 kernel takes (each fetches K and V once): 128, or 64 at D > 64."""
    return tf32_geometry(padded_head_dim(size[3])).queries


@op.stage("tensor_cores", """
    What torch's SDPA does in float32 on this GPU: the two products go to the tensor cores in "3xTF32"
    (CUTLASS's OpMultiplyAddFastF32). A TF32 tensor core reads only 10 of a float32's 23 mantissa bits,
    about 3 decimal digits. Split every input into two TF32 numbers, x = big + small (big: x rounded to
    TF32; small: the rest, rounded too), and a b = big_a big_b + big_a small_b + small_a big_b, dropping
    small_a small_b (2^-22 of the product): three mma give close to float32 accuracy, at a third of the
    TF32 rate, still more than the CUDA cores' FMAs reach. The kernel (in _flash_mma.py) is the fp16
    ladder's FlashAttention-2 with m16n8k8 TF32 fragments: key tiles by cp.async (double-buffered,
    swizzled), Q and K fragments by ldmatrix (an 8x4 block of float32 is what it hands a TF32 fragment),
    the online softmax on the accumulator fragments, P kept in registers: the C fragment of 8 keys
    becomes the A fragment of P V once its k order is read as keys 2q, 2q + 1, with V's rows loaded in
    that order. Each warp owns 32 queries, two m16 tiles that share every K and V fragment and its
    split, and the key tiles are 32 wide so that both tiles' scores fit in registers: in a sweep of
    layouts on an H200 this one ran at SDPA's speed, where 16 queries a warp and 64-key tiles ran at
    0.63x (255 registers and 160 bytes of spill). At D = 128 a warp keeps 16 queries (two tiles' outputs
    would spill). Tiles past the diagonal are skipped as in stage 5, and under the mask the heaviest
    query block of every head starts first (not one head's blocks after another: about 17% faster at the
    headline on an H200); rows that are not whole 16-byte chunks (D not a multiple of 4) are loaded
    element by element instead of by cp.async.""",
          bytes_moved=lambda size: _io_bytes(size) // 2 + _kv_bytes(size, _tf32_block_queries(size),
                                                                      skips_masked=True))
def tensor_cores(q, k, v, causal, out):
    launch_3xtf32(q, k, v, causal, out)



# == RoPE fused into the flash kernel's loads (a second operator: attention[rope]) ====================
#
# Models rotate q and k by their positions (RoPE, rope.py) right before attention. The rotation is a
# pass over Q and K through memory; a flash kernel already loads both tile by tile, so it can rotate
# each tile once it is in shared memory. Half-split layout (the Hugging Face Llama's): feature i pairs with i + D/2,
# by the cached tables cos, sin (S x D/2 float32) that the model keeps.

def _rope_inputs(size, rng):
    q, k, v, causal = _inputs(size, rng)
    return (q, k, v, causal, *rope_tables(size[2], size[3], draw_rope_base(rng)))


def _rope_adversarial(size, rng):
    """attention's extreme logits, with the tables (not its rising logits: rotated by their positions, q
    and k no longer score higher with every key)."""
    q, k, v, causal = _inputs(size, rng)
    q, k = extreme_logits(q, k, size[3], rng)
    return [("extreme-logits", (q, k, v, causal, *rope_tables(size[2], size[3], draw_rope_base(rng))))]


def _rotated64(x, cos, sin):
    """x rotated by RoPE in float64 (x is B x H x S x D; cos, sin S x D/2 broadcast over B and H)."""
    half = x.shape[3] // 2
    x = x.astype(np.float64)
    c, s = cos.astype(np.float64), sin.astype(np.float64)
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * c - second * s, second * c + first * s], axis=-1)


def _rope_reference(q, k, v, causal, cos, sin):
    return reference(_rotated64(q, cos, sin), _rotated64(k, cos, sin), v, causal)


def _rope_validate(q, k, v, causal, cos, sin, out):
    _validate(q, k, v, causal, out)
    S, D = q.shape[2], q.shape[3]
    if D % 2:
        raise InputError(f"the head size D = {D} must be even: RoPE rotates pairs of features (q is B x H x S x D)")
    expect_device_array("cos", cos, dtype=np.float32, shape=(S, D // 2))
    expect_device_array("sin", sin, dtype=np.float32, shape=(S, D // 2))


def _rope_sdpa_peer(size):
    """What a model runs: q and k rotated as the Hugging Face Llama does (q cos + rotate_half(q) sin, with
    the tables repeated to D columns once), then torch SDPA."""
    torch = peers.torch()
    if torch is None:
        return None
    F = torch.nn.functional
    t = peers.as_torch

    def rope_sdpa(q, k, v, causal, cos, sin, out):
        is_causal = peers.cached("attention.causal", causal, lambda a: bool(cuda.as_cuda_array(a).copy_to_host()[0]))
        c = peers.cached("attention_rope.cos", cos, lambda a: torch.cat((t(a), t(a)), dim=-1))
        s = peers.cached("attention_rope.sin", sin, lambda a: torch.cat((t(a), t(a)), dim=-1))

        def rotate(x):
            first, second = x.chunk(2, dim=-1)
            return x * c + torch.cat((-second, first), dim=-1) * s
        return F.scaled_dot_product_attention(rotate(t(q)), rotate(t(k)), t(v), is_causal=is_causal)

    rope_sdpa.returns_output = True
    return "torch RoPE + SDPA", rope_sdpa


def _rope_expression(torch, size):
    """torch_expression: the rotation and the attention formula, for torch.compile to fuse what it can."""
    attend = naive_expression(torch, size)

    def rope_attention(q, k, v, causal_flag, cos, sin):
        c, s = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

        def rotate(x):
            first, second = x.chunk(2, dim=-1)
            return x * c + torch.cat((-second, first), dim=-1) * s
        return attend(rotate(q), rotate(k), v, causal_flag)
    return rope_attention


def _table_bytes(size):
    B, H, S, D, causal = size
    return 2 * S * (D // 2) * 4  # cos and sin, read once from memory (they stay in L2 for every head)


def _rotation_pass_bytes(size):
    B, H, S, D, causal = size
    return 4 * B * H * S * D * 4  # q and k read, rotated q and k written


rope_op = Operator(
    name="attention", variant={"fusion": "rope"},
    title="Attention with RoPE (rotary positions), float32, causal or not",
    reference=_rope_reference,
    make_inputs=_rope_inputs,
    make_output=lambda size: np.empty(size[:4], np.float32),
    bytes_moved=lambda size: _io_bytes(size) + _table_bytes(size),
    flops=attention_flops,
    validate=_rope_validate,
    tolerance=_tolerance,
    peer=_rope_sdpa_peer,
    torch_expression=_rope_expression,
    adversarial_inputs=_rope_adversarial,
    bound="compute",
    size_names=("batch", "heads", "seq", "head_dim", "causal"),
    check_sizes=CHECK_SIZES,
    sim_sizes=SIM_SIZES,
    bench_sizes=[(8, 16, 2048, 64, 0), (8, 16, 2048, 64, 1), (4, 32, 4096, 128, 1)],
    headline_size=HEADLINE,
    rank=301,
    group="Attention: from three kernels to FlashAttention",
)


# -- 1. rotate_then_attend: a RoPE pass through memory, then stage 5 ------------------------------

@cuda.jit
def _rotate_rows(x, cos, sin, out):
    """out = x rotated by RoPE, one thread per pair (feature p and p + D/2 of one row of x)."""
    B, H, S, D = x.shape
    half = D // 2
    i = cuda.grid(1)
    if i < B * H * S * half:
        p = i % half  # consecutive threads, consecutive features: coalesced
        row = i // half
        s = row % S
        h = (row // S) % H
        b = row // (S * H)
        first, second = x[b, h, s, p], x[b, h, s, p + half]
        c, sn = cos[s, p], sin[s, p]
        out[b, h, s, p] = first * c - second * sn
        out[b, h, s, p + half] = second * c + first * sn


def _rotate(x, cos, sin, out):
    B, H, S, D = x.shape
    _rotate_rows[blocks_for(B * H * S * (D // 2), NAIVE_THREADS), NAIVE_THREADS](x, cos, sin, out)


@rope_op.stage("rotate_then_attend", """
    What a model does when the attention kernel knows nothing of positions: one kernel rotates q and
    k (a thread per pair of features, the tables read from memory) into two new buffers, and stage
    5 of the attention ladder (64 x 64 register tiles, the causal tiles above the diagonal skipped)
    attends over the rotated copies. The rotation pass reads Q and K and writes them again, and the
    flash kernel reads the copies: four passes over arrays the size of Q, 2 x 4 B H S D bytes more
    memory traffic than attention alone, and two launches more.""",
    bytes_moved=lambda size: (_io_bytes(size) // 2 + _kv_bytes(size, BR, skips_masked=True)
                              + _rotation_pass_bytes(size) + _table_bytes(size)))
def rotate_then_attend(q, k, v, causal, cos, sin, out):
    q_rotated = scratch("attention_rope.q", q.shape)
    k_rotated = scratch("attention_rope.k", k.shape)
    _rotate(q, cos, sin, q_rotated)
    _rotate(k, cos, sin, k_rotated)
    _launch_tiles(_causal_skip_kernel(_padded_head_dim(q.shape[3])), q_rotated, k_rotated, v, causal, out)


# -- 2. rotate_in_shared: the flash kernel rotates each Q and K tile in shared memory -----------------

@cuda.jit(device=True, inline=True)
def _rotate_tile(cos, sin, row0, S, D, smem, at, RS, DP):
    """Rotate by RoPE, in shared memory, the tile just loaded at ``at`` (its rows are positions row0 ..
    row0 + 63): a thread per pair of features, x[p] cos - x[p + D/2] sin and x[p + D/2] cos + x[p] sin.
    A pass over shared memory after the load, not inside it: rotating while loading kept three more
    global loads in flight per element and spilled 1.7 KB of registers."""
    t = cuda.threadIdx.y * 16 + cuda.threadIdx.x
    half = D // 2
    for it in range(BR * (DP // 2) // THREADS):
        e = it * THREADS + t
        r = e // (DP // 2)
        p = e % (DP // 2)
        if row0 + r < S and p < half:
            # EXERCISE: write this part of `_rotate_tile`. Read the hints one at a time.
            #   hint 1 (nudge): the tables are indexed by the row's position and the pair; both features of the pair
            #   hint 2 (nearly the answer): are read before either is written (this thread owns the pair: no barrier needed between).
            pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit(device=True, inline=True)
def _flash_rotated_tiles(q, k, v, out, scale_log2e, causal, cos, sin, smem, s, o, m_run, l_part, left, right,
                         RS, DP, OC):
    """_flash_causal_tiles with Q and each K tile rotated once loaded (V is not rotated)."""
    bh = cuda.blockIdx.y
    H = q.shape[1]
    b = bh // H
    h = bh % H
    S = q.shape[2]
    D = q.shape[3]
    is_causal = causal[0] != 0
    q0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BR
    _empty_rows(OC, o, m_run, l_part)
    _load_tile(q, b, h, q0, S, D, smem, 0, RS, DP)
    cuda.syncthreads()  # a pair's two features were loaded by different threads
    _rotate_tile(cos, sin, q0, S, D, smem, 0, RS, DP)
    end = min(S, q0 + BR) if is_causal else S
    for j0 in range(0, end, BC):
        masked = j0 + BC > S or (is_causal and j0 + BC > q0)
        cuda.syncthreads()  # the previous tile's P (which lives where K goes) and V have been read
        _load_tile(k, b, h, j0, S, D, smem, BR * RS, RS, DP)
        _load_tile(v, b, h, j0, S, D, smem, BR * RS + max(BC * RS, BR * PS), RS, DP)
        cuda.syncthreads()
        _rotate_tile(cos, sin, j0, S, D, smem, BR * RS, RS, DP)
        cuda.syncthreads()
        _attend_loaded_tile(q0, j0, S, smem, RS, DP, OC, scale_log2e, masked, is_causal,
                            s, o, m_run, l_part, left, right)
    _finish_rows(out, b, h, q0, S, D, OC, o, l_part)


def _rotate_in_shared_kernel(DP):
    """The fused kernel for head sizes up to DP (see _register_tiles_kernel)."""
    name = f"_rotate_in_shared_d{DP}"
    if name not in _BUILT:
        RS, OC = DP + PAD, (DP + 63) // 64
        O_SHAPE = (4, 4 * OC)

        def kernel(q, k, v, out, scale_log2e, causal, cos, sin):
            smem = cuda.shared.array(0, float32, alignment=ALIGN16)
            s = cuda.local.array((4, 4), float32)
            o = cuda.local.array(O_SHAPE, float32)
            m_run = cuda.local.array(4, float32)
            l_part = cuda.local.array(4, float32)
            left = cuda.local.array((4, 4), float32)
            right = cuda.local.array((4, 4), float32)
            _flash_rotated_tiles(q, k, v, out, scale_log2e, causal, cos, sin, smem, s, o, m_run, l_part,
                                 left, right, RS, DP, OC)

        _register(name, kernel)
    return _BUILT[name]


@rope_op.stage("rotate_in_shared", """
    The flash kernel already brings Q once per block and every K tile it needs into shared memory:
    here it rotates them there, right after each load, and the rotated copies never exist in memory.
    A thread takes a pair of features of a row (p and p + D/2), reads the row's cos and sin (S x D/2
    tables, 2 x 4 S D/2 bytes, which stay in L2 for all B x H heads) and writes the pair back
    rotated: one more pass over the tile in shared memory and one more barrier per tile. (Rotating
    inside the load loop, as each element arrives, kept three more global loads in flight per
    element and spilled 1.7 KB of registers at D = 64.) The four passes over Q-sized arrays and the
    two launches of stage 1 are gone. The price: a K tile is loaded once per query block, so each
    key is rotated S/64 times instead of once. In compute-bound attention the memory pass it saves
    is small; in decoding, where attention is all memory traffic, it is not. The table says which
    wins here.""",
    bytes_moved=lambda size: _io_bytes(size) // 2 + _kv_bytes(size, BR, skips_masked=True) + _table_bytes(size))
def rotate_in_shared(q, k, v, causal, cos, sin, out):
    _launch_tiles(_rotate_in_shared_kernel(_padded_head_dim(q.shape[3])), q, k, v, causal, out, cos, sin)


for _dp in HEAD_DIM_STEPS:
    _rotate_in_shared_kernel(_dp)


# -- 3. on_tensor_cores: the same rotation, in the 3xTF32 tensor-core kernel's tiles ----------------------

@rope_op.stage("on_tensor_cores", """
    Stage 2's rotation in stage 6's kernel: the products move to the tensor cores (3xTF32), and the
    rotation stays in shared memory, right after each tile lands. One kernel body in _flash_mma.py
    serves both ladders; built with the tables (cos and sin after its first six arguments, as stage
    2's kernel takes them), it rotates Q with the first key tile, and each K tile once the barrier
    says its cp.async copy has landed, while the next tile's copy is already on its way into the
    other buffer; one more barrier, then the scores. A thread owns pair p (features p and p + D/2)
    of every fourth row at D = 64: the tiles are swizzled (a 16-byte chunk's place is XORed with its
    row), but a warp's 32 pairs are one row, 32 different banks and one 128-byte line of each table,
    and a thread starts the table loads of four rows before it touches shared memory, so that their
    trips to L2 overlap. V is not rotated. Nothing else changes from stage 2: the flash loop, the
    causal skip, and the rotation's price (each K tile rotated once per query block, a block now of
    128 queries at D = 64 where stage 2's had 64: half as often). What gets faster is the products:
    stage 2's 4 x 4 register tiles of FMAs become m16n8k8 TF32 mma, three a product, the step that
    takes the plain ladder from stage 5 to stage 6. On an H200 at 8x16x2048x64 under the mask:
    2359.3 us against 2669.0 for torch's RoPE followed by SDPA in the same run (1.13x), where stage 2
    took twice SDPA's time.""",
    bytes_moved=lambda size: (_io_bytes(size) // 2 + _kv_bytes(size, _tf32_block_queries(size), skips_masked=True)
                              + _table_bytes(size)))
def on_tensor_cores(q, k, v, causal, cos, sin, out):
    launch_3xtf32(q, k, v, causal, out, cos, sin)


OPERATORS = [op, rope_op]
