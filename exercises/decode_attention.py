# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/decode_attention.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade decode_attention            (or decode_attention.<stage>)
# The grader checks each stage against the operator in solutions/decode_attention.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 3f51e71b6b041a4f1830c0ad6c0f98a4c76b0a9b7a3a3c788dfe6f2f4db2ca37
# --------------------------------------------------------------------------------------------------
"""Decode attention: one new query token per sequence against its KV cache (fp16 cache, fp32 arithmetic).

When a language model generates, each step has one query per (sequence, head), and it attends to
every key and value cached so far: out[b, h] = softmax(q[b, h] . K[b, g]^T / sqrt(D)) V[b, g]. Here
q is B x Hq x D, the cache K, V is B x Hkv x S x D, all float16, and query head h reads the cache of
KV head g = h // (Hq / Hkv): with Hkv < Hq (grouped-query attention, GQA) several query heads share
one KV head. The arithmetic is float32; the output is float16.

Each cached element is used for 2 flops per query head that reads it: decode attention is bound by
reading the cache, and is measured in GB/s of K and V read (the operator's bytes model counts the
cache once, plus q and out). The ladder:

1. ``block_per_head``: one block per (sequence, query head); its 4 warps take every 4th key, lanes
   split the head's D features, online softmax per warp, the warps merged at the end.
2. ``split_kv``: flash-decoding. With 512 heads a block each there are not enough warps in flight to
   cover memory latency: the keys are split into chunks, a block per chunk writes a partial (max,
   sum, output), and a second kernel merges the partial softmaxes.
3. ``keys_in_flight``: each warp loads four keys (and their values) before it uses any: four times
   the bytes in flight per warp, one rescale per four keys.
4. ``gqa_shared_kv``: a block serves all the query heads of one KV head, so with GQA each cached
   element is read once per group instead of once per query head.
"""

import math

import numpy as np
from numba import cuda, float32, uint64
from numba.types import float16

from workbench import peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch, sm_count

MAX_HEAD_DIM = 128
PER_LANE = MAX_HEAD_DIM // 32  # a lane owns features lane, lane + 32, lane + 64, lane + 96
MAX_GROUP = 8  # query heads per KV head the GQA stage serves at once (Hq / Hkv <= 8)
WARPS = 4
THREADS = 32 * WARPS
FULL_MASK = 0xFFFFFFFF
LOWEST = np.float32(np.finfo(np.float32).min)  # a running maximum's start: exp2(LOWEST - m) is 0, not NaN
LOG2E = 1.4426950408889634


# -- the operator ---------------------------------------------------------------------------------

def _inputs(size, rng):
    B, Hq, Hkv, S, D = size
    q = rng.normal(0.0, 1.0, (B, Hq, D)).astype(np.float16)
    k = rng.normal(0.0, 1.0, (B, Hkv, S, D)).astype(np.float16)
    v = rng.normal(0.0, 1.0, (B, Hkv, S, D)).astype(np.float16)
    return q, k, v


def _reference(q, k, v):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    out = np.empty((B, Hq, D))
    for b in range(B):
        for h in range(Hq):
            g = h // group
            s = k[b, g].astype(np.float64) @ q[b, h].astype(np.float64) / math.sqrt(D)
            p = np.exp(s - s.max())
            out[b, h] = p @ v[b, g].astype(np.float64) / p.sum()
    return out


def _adversarial(size, rng):
    """Logits in the thousands (a softmax without the running maximum overflows), every one of them."""
    q, k, v = _inputs(size, rng)
    return [("large-logits", ((q * np.float16(8.0)).astype(np.float16), (k * np.float16(8.0)).astype(np.float16), v))]


def _validate(q, k, v, out):
    expect_device_array("q", q, dtype=np.float16, ndim=3)
    B, Hq, D = q.shape
    expect_device_array("k", k, dtype=np.float16, ndim=4)
    Hkv, S = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D:
        raise InputError(f"k must be B x Hkv x S x D = {B} x Hkv x S x {D} (q is B x Hq x D), got {tuple(k.shape)}")
    if Hq % Hkv or Hq // Hkv > MAX_GROUP:
        raise InputError(f"Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads, at most {MAX_GROUP} per "
                         "KV head")
    if D > MAX_HEAD_DIM:
        raise InputError(f"the head size D = {D} is more than {MAX_HEAD_DIM}, the largest these kernels take")
    expect_device_array("v", v, dtype=np.float16, shape=(B, Hkv, S, D))
    expect_device_array("out", out, dtype=np.float16, shape=(B, Hq, D))


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    F = torch.nn.functional
    B, Hq, Hkv, S, D = size

    def sdpa(q, k, v, out):
        t = peers.as_torch
        o = F.scaled_dot_product_attention(t(q).view(B, Hq, 1, D), t(k), t(v), enable_gqa=Hq != Hkv)
        return o.view(B, Hq, D)

    sdpa.returns_output = True
    return "torch SDPA", sdpa


def _bytes(size):
    B, Hq, Hkv, S, D = size
    return 2 * (2 * B * Hkv * S * D + 2 * B * Hq * D)  # the cache once, q in and out, 2 bytes each


def _per_query_head_bytes(size):
    """What the stages that give each query head its own block read: the cache once per query head."""
    B, Hq, Hkv, S, D = size
    return 2 * (2 * B * Hq * S * D + 2 * B * Hq * D)


def _flops(size):
    B, Hq, Hkv, S, D = size
    return 4 * B * Hq * S * D


op = Operator(
    name="decode_attention",
    title="Decode attention: one query token against an fp16 KV cache (GQA)",
    reference=_reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty((size[0], size[1], size[4]), np.float16),
    bytes_moved=_bytes,
    flops=_flops,
    validate=_validate,
    tolerance=lambda size, dtype: 2e-3,  # float16 output: half an ulp is 4.9e-4 of each value
    peer=_peer,
    adversarial_inputs=_adversarial,
    dtype=np.float16,
    size_names=("batch", "q_heads", "kv_heads", "kv_len", "head_dim"),
    check_sizes=[(1, 1, 1, 1, 64), (3, 4, 2, 17, 128), (2, 8, 8, 1000, 64), (4, 32, 8, 4097, 128),
                 (2, 32, 32, 32768, 128)],
    # S = 37 makes two chunks of keys (stages 2-4); D = 24 leaves lanes without features; Hq = 2 Hkv.
    sim_sizes=[(1, 2, 2, 1, 16), (1, 2, 1, 37, 24), (1, 2, 1, 5, 128)],
    bench_sizes=[(16, 32, 32, 1024, 128), (16, 32, 32, 8192, 128), (16, 32, 8, 8192, 128),
                 (4, 32, 8, 32768, 128)],
    headline_size=(16, 32, 32, 8192, 128),
    rank=310,
    group="Attention: from three kernels to FlashAttention",
)


def _scale_log2e(D):
    return np.float32(LOG2E / math.sqrt(D))


def _rows(a):
    """A B x H x S x D cache as a (B H S) x D matrix (a view): one row index instead of three."""
    return a.reshape(a.shape[0] * a.shape[1] * a.shape[2], a.shape[3])


# -- shared device functions ----------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _warp_sum(x):
    for offset in (16, 8, 4, 2, 1):
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
    return x


@cuda.jit(device=True, inline=True)
def _load_query(q, b, h, D, scale_log2e, qr):
    """This lane's features of q[b, h], times the scale (so scores come out in base 2)."""
    lane = cuda.threadIdx.x % 32
    for u in range(PER_LANE):
        d = lane + 32 * u
        qr[u] = float32(q[b, h, d]) * scale_log2e if d < D else float32(0.0)


@cuda.jit(device=True, inline=True)
def _attend_key(k, v, row, D, qr, o, m, l):
    """One key (row of the flattened cache) into this warp's running (max m, sum l, output o):
    the score is the warp's sum of its lanes' products; returns the new (m, l)."""
    lane = cuda.threadIdx.x % 32
    x = float32(0.0)
    for u in range(PER_LANE):
        d = lane + 32 * u
        if d < D:
            x += qr[u] * float32(k[row, d])
    x = _warp_sum(x)
    m_new = max(m, x)
    alpha = math.exp2(m - m_new)
    p = math.exp2(x - m_new)
    for u in range(PER_LANE):
        d = lane + 32 * u
        if d < D:
            o[u] = o[u] * alpha + p * float32(v[row, d])
    return m_new, l * alpha + p


@cuda.jit(device=True, inline=True)
def _merge_warps(m, l, o, D, wm, wl, wo):
    """Combine the block's per-warp (m, l, o) into one: each warp rescales to the largest maximum.
    Returns (l, o in wo[0]) ready to divide; every thread may then read wo[0, d]."""
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if lane == 0:
        wm[warp] = m
        wl[warp] = l
    cuda.syncthreads()
    top = wm[0]
    for w in range(1, WARPS):
        top = max(top, wm[w])
    scale = math.exp2(m - top)
    for u in range(PER_LANE):
        d = lane + 32 * u
        if d < D:
            wo[warp, d] = o[u] * scale
    total = float32(0.0)
    for w in range(WARPS):
        total += wl[w] * math.exp2(wm[w] - top)
    cuda.syncthreads()
    for d in range(cuda.threadIdx.x, D, THREADS):
        acc = wo[0, d]
        for w in range(1, WARPS):
            acc += wo[w, d]
        wo[0, d] = acc
    cuda.syncthreads()
    return top, total


# -- 1. block_per_head: a block per (sequence, query head) ------------------------------------------

@cuda.jit
def _block_per_head(q, k, v, out, scale_log2e, S, Hkv):
    wm = cuda.shared.array(WARPS, float32)
    wl = cuda.shared.array(WARPS, float32)
    wo = cuda.shared.array((WARPS, MAX_HEAD_DIM), float32)
    qr = cuda.local.array(PER_LANE, float32)
    o = cuda.local.array(PER_LANE, float32)
    b = cuda.blockIdx.y
    h = cuda.blockIdx.x
    D = q.shape[2]
    g = h // (q.shape[1] // Hkv)  # the KV head this query head reads
    first_row = uint64((b * Hkv + g) * S)
    _load_query(q, b, h, D, scale_log2e, qr)
    for u in range(PER_LANE):
        o[u] = float32(0.0)
    m = LOWEST
    l = float32(0.0)
    # EXERCISE: write this part of `_block_per_head`. Read the hints one at a time.
    #   hint 1: warp w takes keys w, w + WARPS, ...: _attend_key(k, v, first_row + j, ...) updates (m, l, o).
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    top, total = _merge_warps(m, l, o, D, wm, wl, wo)
    for d in range(cuda.threadIdx.x, D, THREADS):
        out[b, h, d] = float16(wo[0, d] / total)


@op.stage("block_per_head", """
    One block of 4 warps per (sequence, query head). The 32 lanes of a warp split the head's features
    (lane, lane + 32, ...), so each key's row of K is one coalesced read and its score one warp sum
    (5 shuffles); warp w takes keys w, w + 4, ..., keeping a running maximum, sum and output as the
    online softmax does, and the 4 warps merge at the end through shared memory. Correct, and slow:
    512 heads make 2048 warps, 16 per multiprocessor, each waiting for one key's loads at a time: far
    too few bytes in flight to cover the latency of memory.""", bytes_moved=_per_query_head_bytes)
def block_per_head(q, k, v, out):
    B, Hq, D = q.shape
    _block_per_head[(Hq, B), THREADS](q, _rows(k), _rows(v), out, _scale_log2e(D), k.shape[2], k.shape[1])


# -- 2. split_kv: flash-decoding, partial softmaxes merged by a second kernel ---------------------

MIN_CHUNK = 32  # keys per block at least (8 per warp): a partial result costs D + 2 floats to write and merge


def _chunk(B, Hq, S, blocks_wanted):
    """Keys per block so that B Hq blocks become about ``blocks_wanted`` (never below MIN_CHUNK)."""
    splits = max(1, min(blocks_for(S, MIN_CHUNK), blocks_for(blocks_wanted, B * Hq)))
    return blocks_for(S, splits)


@cuda.jit(device=True, inline=True)
def _write_partial(m, l, o, D, wm, wl, wo, part_o, part_ml, slot):
    top, total = _merge_warps(m, l, o, D, wm, wl, wo)
    for d in range(cuda.threadIdx.x, D, THREADS):
        part_o[slot, d] = wo[0, d]
    if cuda.threadIdx.x == 0:
        part_ml[slot, 0] = top
        part_ml[slot, 1] = total


@cuda.jit
def _chunk_per_block(q, k, v, part_o, part_ml, scale_log2e, S, Hkv, chunk):
    wm = cuda.shared.array(WARPS, float32)
    wl = cuda.shared.array(WARPS, float32)
    wo = cuda.shared.array((WARPS, MAX_HEAD_DIM), float32)
    qr = cuda.local.array(PER_LANE, float32)
    o = cuda.local.array(PER_LANE, float32)
    split = cuda.blockIdx.x
    h = cuda.blockIdx.y
    b = cuda.blockIdx.z
    Hq = q.shape[1]
    D = q.shape[2]
    g = h // (Hq // Hkv)
    first_row = uint64((b * Hkv + g) * S)
    _load_query(q, b, h, D, scale_log2e, qr)
    for u in range(PER_LANE):
        o[u] = float32(0.0)
    m = LOWEST
    l = float32(0.0)
    end = uint64(min(S, (split + 1) * chunk))
    j = uint64(split * chunk + cuda.threadIdx.x // 32)
    while j < end:
        m, l = _attend_key(k, v, first_row + j, D, qr, o, m, l)
        j += uint64(WARPS)
    _write_partial(m, l, o, D, wm, wl, wo, part_o, part_ml, (b * Hq + h) * cuda.gridDim.x + split)


@cuda.jit
def _merge_splits(part_o, part_ml, out, splits):
    # One block per (sequence, query head): out = sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), M the
    # largest of the splits' maxima.
    b = cuda.blockIdx.y
    h = cuda.blockIdx.x
    first = (b * out.shape[1] + h) * splits
    # EXERCISE: write this part of `_merge_splits`. Read the hints one at a time.
    #   hint 1 (nudge): M = the largest part_ml[first + s, 0]; each split's weight is exp2(part_ml[.., 0] - M).
    #   hint 2 (nearly the answer): the denominator sums part_ml[.., 1] times the weights, each output column part_o[.., d] times the weights.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _launch_split(kernel, q, k, v, out, blocks_per_head_group=1):
    B, Hq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    heads = Hq // blocks_per_head_group if blocks_per_head_group > 1 else Hq
    chunk = _chunk(B, heads, S, 8 * sm_count())  # about 8 blocks (32 warps) per multiprocessor
    splits = blocks_for(S, chunk)
    part_o = scratch("decode_attention.part_o", (B * Hq * splits, D))
    part_ml = scratch("decode_attention.part_ml", (B * Hq * splits, 2))
    kernel[(splits, heads, B), THREADS](q, _rows(k), _rows(v), part_o, part_ml, _scale_log2e(D), S, Hkv, chunk)
    _merge_splits[(Hq, B), THREADS](part_o, part_ml, out, splits)


@op.stage("split_kv", """
    Flash-decoding: the keys of each head are split into chunks (at least 32 keys, enough chunks
    for about 8 blocks per multiprocessor), one block per chunk. Each block runs stage 1's loop over
    its chunk and writes a partial result, its maximum m, sum l and unnormalised output o, to a
    workspace; a second kernel merges a head's partials: out = sum_s o_s 2^(m_s - M) / sum_s l_s
    2^(m_s - M), M the largest m_s (the same rescaling that merges two warps or two tiles). The
    partials are D + 2 floats per chunk against 512 bytes of cache per key: the merge costs little,
    and four times as many warps are now waiting on memory.""", bytes_moved=_per_query_head_bytes)
def split_kv(q, k, v, out):
    _launch_split(_chunk_per_block, q, k, v, out)


# -- 3. keys_in_flight: four keys loaded before any is used ------------------------------------------

KEYS_AT_ONCE = 4


@cuda.jit(device=True, inline=True)
def _attend_keys(k, v, row, step, D, qr, o, m, l, kr, vr, x):
    """KEYS_AT_ONCE keys (rows row, row + step, ...) at once: all their K and V loads are issued
    before the first score is reduced, then one rescale for the group. Returns the new (m, l)."""
    lane = cuda.threadIdx.x % 32
    for key in range(KEYS_AT_ONCE):
        for u in range(PER_LANE):
            d = lane + 32 * u
            kr[key, u] = float32(0.0)
            vr[key, u] = float32(0.0)
            if d < D:
                kr[key, u] = float32(k[row + uint64(key) * step, d])
                vr[key, u] = float32(v[row + uint64(key) * step, d])
    m_new = m
    for key in range(KEYS_AT_ONCE):
        partial = float32(0.0)
        for u in range(PER_LANE):
            if lane + 32 * u < D:
                partial += qr[u] * kr[key, u]
        x[key] = _warp_sum(partial)
        m_new = max(m_new, x[key])
    alpha = math.exp2(m - m_new)
    l = l * alpha
    for u in range(PER_LANE):
        o[u] *= alpha
    for key in range(KEYS_AT_ONCE):
        p = math.exp2(x[key] - m_new)
        l += p
        for u in range(PER_LANE):
            o[u] += p * vr[key, u]
    return m_new, l


@cuda.jit
def _chunk_keys_in_flight(q, k, v, part_o, part_ml, scale_log2e, S, Hkv, chunk):
    wm = cuda.shared.array(WARPS, float32)
    wl = cuda.shared.array(WARPS, float32)
    wo = cuda.shared.array((WARPS, MAX_HEAD_DIM), float32)
    qr = cuda.local.array(PER_LANE, float32)
    o = cuda.local.array(PER_LANE, float32)
    kr = cuda.local.array((KEYS_AT_ONCE, PER_LANE), float32)
    vr = cuda.local.array((KEYS_AT_ONCE, PER_LANE), float32)
    x = cuda.local.array(KEYS_AT_ONCE, float32)
    split = cuda.blockIdx.x
    h = cuda.blockIdx.y
    b = cuda.blockIdx.z
    Hq = q.shape[1]
    D = q.shape[2]
    g = h // (Hq // Hkv)
    first_row = uint64((b * Hkv + g) * S)
    _load_query(q, b, h, D, scale_log2e, qr)
    for u in range(PER_LANE):
        o[u] = float32(0.0)
    m = LOWEST
    l = float32(0.0)
    end = uint64(min(S, (split + 1) * chunk))
    # EXERCISE: write this part of `_chunk_keys_in_flight`. Read the hints one at a time.
    #   hint 1 (nudge): warp w takes keys j, j + WARPS, ..., KEYS_AT_ONCE of them a step (_attend_keys with step WARPS).
    #   hint 2: the step's last key is j + (KEYS_AT_ONCE - 1) * WARPS: while it is < end, take a whole step;
    #   hint 3 (nearly the answer): the keys left over go one at a time through _attend_key, as in stage 2.
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    _write_partial(m, l, o, D, wm, wl, wo, part_o, part_ml, (b * Hq + h) * cuda.gridDim.x + split)


@op.stage("keys_in_flight", """
    Stage 2's warps each had one key's loads outstanding at a time: issue its 4 loads, wait, reduce,
    update. Now a warp loads four keys and their values (its keys j, j + 4, j + 8, j + 12) into
    registers before it reduces any score, so four times the bytes are in flight per warp; the
    four scores' warp sums are independent chains the scheduler interleaves, and the running
    output is rescaled once per four keys instead of once per key. Keys left over at the end of a
    chunk go one at a time.""", bytes_moved=_per_query_head_bytes)
def keys_in_flight(q, k, v, out):
    _launch_split(_chunk_keys_in_flight, q, k, v, out)


# -- 4. gqa_shared_kv: a block serves every query head of its KV head ------------------------------

@cuda.jit
def _chunk_per_group(q, k, v, part_o, part_ml, scale_log2e, S, Hkv, chunk):
    wm = cuda.shared.array(WARPS, float32)
    wl = cuda.shared.array(WARPS, float32)
    wo = cuda.shared.array((WARPS, MAX_HEAD_DIM), float32)
    qr = cuda.local.array((MAX_GROUP, PER_LANE), float32)
    o = cuda.local.array((MAX_GROUP, PER_LANE), float32)
    m = cuda.local.array(MAX_GROUP, float32)
    l = cuda.local.array(MAX_GROUP, float32)
    kr = cuda.local.array(PER_LANE, float32)
    vr = cuda.local.array(PER_LANE, float32)
    row_o = cuda.local.array(PER_LANE, float32)
    split = cuda.blockIdx.x
    g = cuda.blockIdx.y  # the KV head: this block serves its query heads g * group ... (g + 1) * group - 1
    b = cuda.blockIdx.z
    Hq = q.shape[1]
    D = q.shape[2]
    group = Hq // Hkv
    lane = cuda.threadIdx.x % 32
    first_row = uint64((b * Hkv + g) * S)
    for i in range(MAX_GROUP):
        m[i] = LOWEST
        l[i] = float32(0.0)
        for u in range(PER_LANE):
            d = lane + 32 * u
            qr[i, u] = float32(q[b, g * group + i, d]) * scale_log2e if i < group and d < D else float32(0.0)
            o[i, u] = float32(0.0)
    end = uint64(min(S, (split + 1) * chunk))
    j = uint64(split * chunk + cuda.threadIdx.x // 32)
    # EXERCISE: write this part of `_chunk_per_group`. Read the hints one at a time.
    #   hint 1 (nudge): load key j's features of K and V into kr, vr ONCE, then for each query head i < group do
    #   hint 2 (nearly the answer): stage 1's update (score = warp sum of qr[i] . kr, then m[i], l[i], o[i]).
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    for i in range(MAX_GROUP):
        if i < group:
            for u in range(PER_LANE):
                row_o[u] = o[i, u]
            _write_partial(m[i], l[i], row_o, D, wm, wl, wo, part_o, part_ml,
                           (b * Hq + g * group + i) * cuda.gridDim.x + split)
            cuda.syncthreads()  # wo is reused by the next head


@op.stage("gqa_shared_kv", """
    With grouped-query attention, Hq / Hkv query heads read the same cached K and V, and stages 1-3
    read them once per query head (the repeats hit L2 only if the blocks of a group run together).
    Here a block serves all the query heads of one KV head: each lane loads its features of a key
    and value once and updates up to 8 heads' running softmaxes with them. The cache is read once
    per KV head, as the operator's bytes model counts it; with Hq = Hkv it is stage 2 again, one key
    at a time (the keys-in-flight trick would need 4x the registers with 8 heads).""")
def gqa_shared_kv(q, k, v, out):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    _launch_split(_chunk_per_group, q, k, v, out, blocks_per_head_group=Hq // Hkv)
