"""int8 GEMM (int32 accumulation) and the quantized linear layer built on it.

``gemm[int8]``: out = A Wᵀ with A (M x K) and W (N x K) int8, out (M x N) int32, exact. The weights
come N x K, as a linear layer stores them (``torch.nn.Linear.weight``) and as ``torch._int_mm(A, W.t())``
wants them: both operands are then contiguous along k, which is what the int8 tensor core wants (four
consecutive k in each 32-bit fragment register), and an ``ldmatrix`` without ``.trans`` (which has no
8-bit form on sm_90) loads both.

``qlinear``: y = dequant(quant(x) · Wqᵀ), the int8 linear layer. x (M x K float32 activations) is
quantized per row, symmetrically: scale = max|x[m, :]| / 127, q = round-half-even(x / scale) saturated
to [-127, 127] (float32 arithmetic, as the kernels do it: the reference reproduces it bit for bit).
Wq (N x K int8) and w_scale (N) are the weights, quantized the same way once, ahead of time
(:func:`quantize_rows_reference` on the host). The product's int32 sums come back to float32 as
acc * x_scale[m] * w_scale[n]. The operator's reference is that pipeline in exact arithmetic (a
kernel must match it to float32 rounding); what quantization itself costs, against the float32 layer
x Wᵀ, was measured on an H200 (NOTES.md): at 8192³ a relative error of 0.0128, where
cuBLAS in fp16 has 0.00036 (on an H200; the fused stage's paragraph says more).
"""

import numpy as np
from numba import cuda, float32, int8, int32, uint8, uint32, uint64
from numba.cuda import libdevice

from workbench import device as _device
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch
from workbench.shared_memory import set_max_dynamic_shared_memory
from workbench.targets import against_peer

from solutions._hopper import (fence_proxy_async, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init,
                               mbarrier_wait, setmaxnreg_consumer, setmaxnreg_producer, shared_descriptor,
                               store_accumulators_s32, tensor_map, tile_of_block, tile_pad, tma_load_2d, tma_ok,
                               wgmma_commit, wgmma_fence, wgmma_s8, wgmma_wait0, wgmma_wait1, zero_accumulators)
from solutions._ptx import cp_async_chunk16, cp_async_commit, cp_async_wait_pending, dp4a_s8, ldmatrix_x4, mma_s8
from solutions._tile_layout import aligned, chunk_offset


def _gpu_options(**options):
    return {} if _device.is_simulator() else options


ALIGN16 = None if _device.is_simulator() else 16


# == int8_gemm ==========================================================================================

def _inputs(size, rng):
    M, N, K = size
    # The full int8 range, -128 included: a kernel that treats bytes as unsigned is off everywhere.
    A = rng.integers(-128, 128, (M, K), dtype=np.int8)
    W = rng.integers(-128, 128, (N, K), dtype=np.int8)
    return A, W


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    M, N, K = size
    # The extremes of int8 everywhere: -128 * 127 = -16256 per term (a byte read as unsigned, 128,
    # flips every sign) and -128 * -128 = 16384 per term, the largest sums there are (an int16
    # accumulator overflows from K = 2 or 3).
    A = np.full((M, K), -128, np.int8)
    return [("int8-extremes", (A, np.full((N, K), 127, np.int8))),
            ("all-minus-128", (A, np.full((N, K), -128, np.int8)))]


def exact_int8_products(A, W):
    """A @ W.T of int8 matrices, exactly, through float64 BLAS: numpy has no BLAS for integers (an int64
    matmul at 4096^3 took 131 s on two cores), and in float64 every partial sum here is an integer below
    K * 2^14 < 2^53, so every product and addition is exact whatever order BLAS adds in."""
    return (A.astype(np.float64) @ W.astype(np.float64).T).astype(np.int64)


def _reference(A, W):
    return exact_int8_products(A, W)


def _check_operands(A, W):
    expect_device_array("A", A, dtype=np.int8, ndim=2)
    expect_device_array("W", W, dtype=np.int8, ndim=2)
    if A.shape[1] != W.shape[1]:
        raise InputError(f"A is {tuple(A.shape)} (M x K) and W is {tuple(W.shape)}: W must be N x K with "
                         f"K = {A.shape[1]} (the weights of a linear layer, out_features x in_features)")
    return A.shape[0], W.shape[0]


def _validate(A, W, out):
    M, N = _check_operands(A, W)
    expect_device_array("out", out, dtype=np.int32, shape=(M, N))


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def int_mm(A, W, out):
        # torch._int_mm wants M > 16 and K, N multiples of 8; the bench sizes are.
        torch._int_mm(peers.as_torch(A), peers.as_torch(W).t(), out=peers.as_torch(out))

    return "torch._int_mm", int_mm


op = Operator(
    name="gemm", variant={"dtype": "int8"},
    title="int8 GEMM: out = A Wᵀ (int8 in, int32 out)",
    reference=_reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size[:2], np.int32),
    bytes_moved=lambda size: size[0] * size[2] + size[1] * size[2] + 4 * size[0] * size[1],
    flops=lambda size: 2 * size[0] * size[1] * size[2],  # integer multiply-adds: "TOPS"
    validate=_validate,
    tolerance=lambda size, dtype: 0.0,  # integer sums: exact, every element
    peer=_peer,
    adversarial_inputs=_adversarial,
    bound="compute",
    dtype=np.int8,
    size_names=("M", "N", "K"),
    check_sizes=[(1, 1, 1), (17, 33, 65), (33, 40, 48), (127, 129, 131), (200, 264, 336), (1000, 1000, 1000),
                 (4097, 1000, 336), (4096, 4096, 4096)],
    sim_sizes=[(1, 1, 1), (5, 7, 3), (17, 24, 96), (33, 9, 37)],
    quick_size=(5, 7, 48),  # two k32 steps, the second ragged, and K % 16 == 0: the wgmma stage takes its TMA path
    bench_sizes=[(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)],
    headline_size=(8192, 8192, 8192),
    targets=[against_peer(0.75, "torch._int_mm", stage="best")],
    rank=260,
    group="INT8: GEMM and the quantized linear layer",
    record_all_sizes=True,
)


# -- 1. dp4a on the CUDA cores ------------------------------------------------------------------------

DBM, DBN, DWORDS = 128, 128, 8  # block tile; K-step of 8 words = 32 int8
DTHREADS = 256


@cuda.jit(device=True, inline=True)
def _word(X, X32, row, kw, words):
    """Bytes 4 kw .. 4 kw + 3 of row ``row`` of X as one 32-bit word (zero past the edges). words: X32 is
    X viewed as 32-bit words (K a multiple of 4), one load; else four byte loads, packed."""
    rows, K = X.shape
    if row >= rows:
        return uint32(0)
    if words:
        return X32[row, kw] if kw < X32.shape[1] else uint32(0)
    w = uint32(0)
    for i in range(4):
        k = 4 * kw + i
        if k < K:
            w |= uint32(uint8(X[row, k])) << uint32(8 * i)
    return w


@cuda.jit(device=True, inline=True)
def _dp4a_gemm(A, W, A32, W32, out, words):
    As = cuda.shared.array((DWORDS, DBM), uint32)  # word-major: a thread's rows at one k are neighbours
    Ws = cuda.shared.array((DWORDS, DBN), uint32)
    acc = cuda.local.array((8, 8), int32)
    a = cuda.local.array(8, uint32)
    b = cuda.local.array(8, uint32)
    t = cuda.threadIdx.x
    ty = t // 16  # rows ty + 16 m, columns tx + 16 n (interleaved: conflict-free shared reads)
    tx = t % 16
    row0 = cuda.blockIdx.y * DBM
    col0 = cuda.blockIdx.x * DBN
    M, K = A.shape
    N = W.shape[0]
    for m in range(8):
        for n in range(8):
            acc[m, n] = int32(0)
    for kw0 in range(0, (K + 3) // 4, DWORDS):
        for j in range(DBM * DWORDS // DTHREADS):
            e = t + j * DTHREADS
            r = e // DWORDS
            w = e % DWORDS
            As[w, r] = _word(A, A32, row0 + r, kw0 + w, words)
            Ws[w, r] = _word(W, W32, col0 + r, kw0 + w, words)
        cuda.syncthreads()
        # HINT: for each of the DWORDS words of the K-step: this thread's 8 words of A and 8 of W into registers a[] and b[], then the 8 x 8 outer product.
        # HINT: the thread's rows are ty + 16 m and its columns tx + 16 n (m, n = 0..7); the tiles are word-major: As[w, row in the tile], Ws[w, column in the tile].
        # HINT: acc[m, n] = dp4a_s8(a[m], b[n], acc[m, n]): four signed byte products of one k-word, added to the int32.
        # BEGIN SOLUTION
        for w in range(DWORDS):
            for m in range(8):
                a[m] = As[w, ty + 16 * m]
            for n in range(8):
                b[n] = Ws[w, tx + 16 * n]
            for m in range(8):
                for n in range(8):
                    acc[m, n] = dp4a_s8(a[m], b[n], acc[m, n])  # 4 multiply-adds in one instruction
        # END SOLUTION
        cuda.syncthreads()
    for m in range(8):
        for n in range(8):
            row = row0 + ty + 16 * m
            col = col0 + tx + 16 * n
            if row < M and col < N:
                out[row, col] = acc[m, n]


@cuda.jit(**_gpu_options(launch_bounds=(DTHREADS, 2)))
def _dp4a_words(A, W, A32, W32, out):
    _dp4a_gemm(A, W, A32, W32, out, True)


@cuda.jit(**_gpu_options(launch_bounds=(DTHREADS, 2)))
def _dp4a_bytes(A, W, A32, W32, out):
    _dp4a_gemm(A, W, A32, W32, out, False)


@op.stage("dp4a", """
    Integer arithmetic on the CUDA cores: dp4a multiplies four signed bytes of one 32-bit word by four
    of another and adds the four products to an int32, one instruction for 8 integer operations. The
    tiles travel as words (4 consecutive k of a row; four byte loads packed into one where K is not a
    multiple of 4), stored word-major in shared memory, and each thread computes an 8x8 patch of a
    128x128 block tile: 16 shared loads feed 64 dp4a. Four times the work of a float32 FMA per
    instruction, and exact: int32 cannot overflow for K below 2^17.""")
def dp4a(A, W, out):
    M, N = out.shape
    if A.shape[1] % 4 == 0 and aligned(4, A, W):  # rows of whole, aligned words
        kernel, A32, W32 = _dp4a_words, A.view(np.uint32), W.view(np.uint32)
    else:  # the bytes kernel never reads its word views: any 2-D uint32 array will do
        unused = scratch("int8_gemm.unused_words", (1, 1), np.uint32)
        kernel, A32, W32 = _dp4a_bytes, unused, unused
    kernel[(blocks_for(N, DBN), blocks_for(M, DBM)), DTHREADS](A, W, A32, W32, out)


# -- 2. mma.sync m16n8k32 on the tensor cores ------------------------------------------------------------
#
# Block tile 128 x 256, K-step 64 bytes, 8 warps as 2 x 4, each 64 x 64 (4 m16 x 8 n8 tiles), four
# stages of (A 8 KiB + W 16 KiB) in flight: the geometry of hgemm's tuned stage, in bytes. Fragments
# (PTX ISA, m16n8k32 .s8; solutions/_ptx.py): lane l, g = l // 4, q = l % 4,
#   A register r: row g + 8 (r % 2), k = 4q .. 4q + 3 (+ 16 if r >= 2)
#   B register r: k = 4q .. 4q + 3 (+ 16 r), column g   -- W's row g, the same four bytes
# ldmatrix.x4 (16-bit elements, i.e. byte pairs) delivers exactly these. For A at (m0, k0) lane l
# addresses row m0 + l % 16, byte k0 + 16 (l // 16); for W at (n0, k0) the four matrices are (n 0-7,
# k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31): b0, b1 of tile n0 and of tile n0 + 8,
# and lane l addresses row n0 + l % 8 + 8 (l // 16), byte k0 + 16 ((l // 8) % 2).

IBM, IBN, IBK = 128, 256, 64
ITHREADS = 256
ISTAGES = 4
ROW_CHUNKS = IBK // 16  # 4 chunks of 16 bytes per tile row, A's and W's alike
I_A_BYTES = IBM * IBK
I_STEP_BYTES = I_A_BYTES + IBN * IBK  # 24 KiB
I_SMEM_BYTES = ISTAGES * I_STEP_BYTES  # 96 KiB


@cuda.jit(device=True, inline=True)
def _issue_int8_copies(A, W, smem, a_at, w_at, row0, col0, k0, t, vec):
    """K-step k0's A tile (IBM x IBK bytes) to a_at and W tile (IBN x IBK) to w_at, swizzled. vec (K a
    multiple of 16, 16-byte aligned bases): cp.async of 16-byte chunks, zero-filled past the edges;
    else byte by byte, now."""
    M, K = A.shape
    N = W.shape[0]
    if vec:
        base = smem.ctypes.data
        for j in range(IBM * ROW_CHUNKS // ITHREADS):  # 2 chunks of A per thread
            c = t + j * ITHREADS
            r = c // ROW_CHUNKS
            kc = c % ROW_CHUNKS
            inside = row0 + r < M and k0 + 16 * kc < K
            src = A.ctypes.data + uint64((row0 + r) * K + k0 + 16 * kc) if inside else A.ctypes.data
            cp_async_chunk16(base + uint64(a_at + chunk_offset(r, kc, ROW_CHUNKS, True)), src, 16 if inside else 0)
        for j in range(IBN * ROW_CHUNKS // ITHREADS):  # 4 chunks of W per thread
            c = t + j * ITHREADS
            r = c // ROW_CHUNKS
            kc = c % ROW_CHUNKS
            inside = col0 + r < N and k0 + 16 * kc < K
            src = W.ctypes.data + uint64((col0 + r) * K + k0 + 16 * kc) if inside else W.ctypes.data
            cp_async_chunk16(base + uint64(w_at + chunk_offset(r, kc, ROW_CHUNKS, True)), src, 16 if inside else 0)
    else:
        for j in range(IBM * IBK // ITHREADS):
            e = t + j * ITHREADS
            r = e // IBK
            k = e % IBK
            v = A[row0 + r, k0 + k] if row0 + r < M and k0 + k < K else int8(0)
            smem[a_at + chunk_offset(r, k // 16, ROW_CHUNKS, True) + k % 16] = uint8(v)
        for j in range(IBN * IBK // ITHREADS):
            e = t + j * ITHREADS
            r = e // IBK
            k = e % IBK
            v = W[col0 + r, k0 + k] if col0 + r < N and k0 + k < K else int8(0)
            smem[w_at + chunk_offset(r, k // 16, ROW_CHUNKS, True) + k % 16] = uint8(v)


@cuda.jit(device=True, inline=True)
def _int8_fragments(smem, a_at, w_at, kk, wr, wc, lane, a, b):
    base = smem.ctypes.data
    # HINT: one ldmatrix_x4 per m16 tile i of A (a[4 i .. 4 i + 3]) and one per pair of n8 tiles 2 jj, 2 jj + 1 of W (b[4 jj .. 4 jj + 3]); lane l gives the address of row l % 8 of matrix l // 8, a 16-byte row.
    # HINT: A (the comment above IBM): lane l addresses row wr + 16 i + l % 16 at byte kk + 16 (l // 16); the byte offset in the tile is chunk_offset(row, byte // 16, ROW_CHUNKS, True).
    # HINT: W: matrices (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31), so lane l addresses row wc + 16 jj + l % 8 + 8 (l // 16) at byte kk + 16 ((l // 8) % 2).
    # BEGIN SOLUTION
    for i in range(4):
        at = a_at + chunk_offset(wr + 16 * i + lane % 16, (kk + 16 * (lane // 16)) // 16, ROW_CHUNKS, True)
        regs = ldmatrix_x4(base + uint64(at))
        a[4 * i] = regs[0]
        a[4 * i + 1] = regs[1]
        a[4 * i + 2] = regs[2]
        a[4 * i + 3] = regs[3]
    for jj in range(4):
        n = wc + 16 * jj + lane % 8 + 8 * (lane // 16)
        at = w_at + chunk_offset(n, (kk + 16 * ((lane // 8) % 2)) // 16, ROW_CHUNKS, True)
        regs = ldmatrix_x4(base + uint64(at))
        b[4 * jj] = regs[0]
        b[4 * jj + 1] = regs[1]
        b[4 * jj + 2] = regs[2]
        b[4 * jj + 3] = regs[3]
    # END SOLUTION


@cuda.jit(device=True, inline=True)
def _int8_tensor_core(A, W, smem, vec, acc):
    """acc[i, j, :] (int32, this lane's fragments of the warp's 64x64 tile) = its share of A Wᵀ."""
    a = cuda.local.array(16, uint32)
    b = cuda.local.array(16, uint32)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    wr = (warp // 4) * 64
    wc = (warp % 4) * 64
    row0 = cuda.blockIdx.y * IBM
    col0 = cuda.blockIdx.x * IBN
    K = A.shape[1]
    for i in range(4):
        for j in range(8):
            for e in range(4):
                acc[i, j, e] = int32(0)
    steps = (K + IBK - 1) // IBK
    for s in range(ISTAGES - 1):
        if s < steps:
            _issue_int8_copies(A, W, smem, s * I_STEP_BYTES, s * I_STEP_BYTES + I_A_BYTES, row0, col0, s * IBK, t,
                               vec)
        cp_async_commit()
    for kt in range(steps):
        cp_async_wait_pending(ISTAGES - 2)
        cuda.syncthreads()
        ahead = kt + ISTAGES - 1
        if ahead < steps:
            at = (ahead % ISTAGES) * I_STEP_BYTES
            _issue_int8_copies(A, W, smem, at, at + I_A_BYTES, row0, col0, ahead * IBK, t, vec)
        cp_async_commit()
        a_at = (kt % ISTAGES) * I_STEP_BYTES
        for kk in range(0, IBK, 32):
            _int8_fragments(smem, a_at, a_at + I_A_BYTES, kk, wr, wc, lane, a, b)
            for i in range(4):
                for j in range(8):
                    d = mma_s8(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3], b[2 * j], b[2 * j + 1],
                               acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
                    acc[i, j, 0] = d[0]
                    acc[i, j, 1] = d[1]
                    acc[i, j, 2] = d[2]
                    acc[i, j, 3] = d[3]


@cuda.jit(device=True, inline=True)
def _int8_gemm_int32_out(A, W, out, vec):
    acc = cuda.local.array((4, 8, 4), int32)
    _int8_tensor_core(A, W, cuda.shared.array(0, uint8, alignment=ALIGN16), vec, acc)
    M, N = out.shape
    t = cuda.threadIdx.x
    lane = t % 32
    r0 = cuda.blockIdx.y * IBM + (t // 32 // 4) * 64 + lane // 4
    c0 = cuda.blockIdx.x * IBN + (t // 32 % 4) * 64 + 2 * (lane % 4)
    for i in range(4):
        for j in range(8):
            for e in range(4):
                row = r0 + 16 * i + 8 * (e // 2)
                col = c0 + 8 * j + e % 2
                if row < M and col < N:
                    out[row, col] = acc[i, j, e]


@cuda.jit(**_gpu_options(launch_bounds=(ITHREADS, 1)))
def _mma_vec(A, W, out):
    _int8_gemm_int32_out(A, W, out, True)


@cuda.jit(**_gpu_options(launch_bounds=(ITHREADS, 1)))
def _mma_bytes(A, W, out):
    _int8_gemm_int32_out(A, W, out, False)


def _int8_vec_ok(A, W) -> bool:
    return A.shape[1] % 16 == 0 and aligned(16, A, W)


def _launch_int8(vec_kernel, bytes_kernel, A, W, *rest):
    """Launch one of the tensor-core kernels over the 128 x 256 block tiles of the M x N output."""
    M, N = A.shape[0], W.shape[0]
    kernel = vec_kernel if _int8_vec_ok(A, W) else bytes_kernel
    args = (A, W) + rest
    set_max_dynamic_shared_memory(kernel, args, I_SMEM_BYTES)
    kernel[(blocks_for(N, IBN), blocks_for(M, IBM)), ITHREADS, 0, I_SMEM_BYTES](*args)


@op.stage("mma", """
    The int8 tensor core: mma.sync.m16n8k32 multiplies a 16x32 tile of int8 by a 32x8 one into int32
    accumulators, 8192 integer operations per warp-instruction (twice an fp16 mma's). Everything else
    is hgemm's best stage in bytes: a 128x256 block tile of 8 warps of 64x64, four cp.async stages in
    96 KiB of dynamic shared memory, XOR-swizzled 64-byte rows, and ldmatrix.x4 for both operands:
    with W stored N x K both are contiguous along k, so no .trans is needed (there is none for bytes
    on sm_90). K not a multiple of 16 takes a byte-by-byte copy path.""")
def mma(A, W, out):
    _launch_int8(_mma_vec, _mma_bytes, A, W, out)


# -- 3. wgmma, TMA and warp specialisation (sm_90a) ------------------------------------------------------
#
# hgemm's warp_specialized stage in bytes (solutions/hgemm.py draws the 128-byte swizzle and explains the
# pieces): a 128 x 256 block tile, K-steps of 128 bytes, a producer warpgroup issuing TMA into a 4-slot
# ring on full/empty mbarriers, two consumer warpgroups each computing 64 x 256 with wgmma m64n256k32
# .s32.s8.s8. An 8-bit wgmma reads both operands K-major, which is how A and W are stored: W's tile is
# 256 rows (n) of 128 bytes, described exactly like A's (8-row atoms 1024 bytes apart, a k32 slice 32
# bytes further along the rows).

WBM, WBN, WBK = 128, 256, 128  # block tile and K-step (bytes of k)
W_A_TILE = WBM * WBK  # 16 KiB
W_STEP = W_A_TILE + WBN * WBK  # 48 KiB
W_STAGES = 4
W_SMEM_BYTES = W_STAGES * W_STEP + 1024 + 16 * W_STAGES  # the ring, 1 KiB to align it, two mbarriers a slot
W_RASTER = 8


@cuda.jit(device=True, forceinline=True)
def _tma_int8_step(map_a, map_w, tiles, bar, row0, col0, k0):
    mbarrier_arrive_expect_tx(bar, W_STEP)  # both boxes count whole, the zeros past the edges too
    tma_load_2d(tiles, map_a, k0, row0, bar)
    tma_load_2d(tiles + uint64(W_A_TILE), map_w, k0, col0, bar)


@cuda.jit(device=True, forceinline=True)
def _int8_ring(A, W, smem):
    """This block's 128 x 256 tile and its ring: (row0, col0, tiles, full, empty, steps), the "full" and
    "empty" mbarriers of each slot initialised (a barrier before returning). Shared by gemm[int8]'s wgmma
    kernel and qlinear's, which differ only in their epilogue."""
    M, K = A.shape
    N = W.shape[0]
    tile_row, tile_col = tile_of_block((M + WBM - 1) // WBM, (N + WBN - 1) // WBN, W_RASTER)
    tiles = smem.ctypes.data + uint64(tile_pad(smem))
    full = tiles + uint64(W_STAGES * W_STEP)
    empty = full + uint64(8 * W_STAGES)
    steps = max((K + WBK - 1) // WBK, 1)  # at least one: see hgemm's warp_specialized (C7515)
    if cuda.threadIdx.x == 0:
        for s in range(W_STAGES):
            mbarrier_init(full + uint64(8 * s), 1)
            mbarrier_init(empty + uint64(8 * s), 2)
        fence_proxy_async()
    cuda.syncthreads()
    return tile_row * WBM, tile_col * WBN, tiles, full, empty, steps


@cuda.jit(device=True, forceinline=True)
def _int8_producer(map_a, map_w, tiles, full, empty, row0, col0, steps):
    """Warpgroup 0: gives its registers away; one thread keeps the ring full with TMA copies."""
    setmaxnreg_producer()
    if cuda.threadIdx.x == 0:
        a_map = map_a.ctypes.data
        w_map = map_w.ctypes.data
        for kt in range(steps):
            slot = kt % W_STAGES
            if kt >= W_STAGES:
                mbarrier_wait(empty + uint64(8 * slot), (kt // W_STAGES - 1) % 2)
            _tma_int8_step(a_map, w_map, tiles + uint64(slot * W_STEP), full + uint64(8 * slot), row0, col0,
                           kt * WBK)


@cuda.jit(device=True, forceinline=True)
def _int8_consumer(acc, tiles, full, empty, steps, c):
    """Consumer warpgroup c (0 or 1): the block tile's rows 64 c.. times all 256 columns into acc, each
    slot released once its products are done; returns with every product finished. The caller's
    epilogue follows in the same branch: acc must not outlive it into the producer's path, where
    setmaxnreg has left 40 registers (ptxas would spill it, and serialise the wgmma: C7512)."""
    setmaxnreg_consumer()
    zero_accumulators(acc)
    for kt in range(steps):
        slot = kt % W_STAGES
        mbarrier_wait(full + uint64(8 * slot), (kt // W_STAGES) % 2)
        a_tile = tiles + uint64(slot * W_STEP)
        wgmma_fence()
        for s in range(WBK // 32):
            wgmma_s8(acc, shared_descriptor(a_tile + uint64(64 * 128 * c + 32 * s), 16, 1024),
                     shared_descriptor(a_tile + uint64(W_A_TILE + 32 * s), 16, 1024))
        wgmma_commit()
        wgmma_wait1()
        if kt > 0 and cuda.threadIdx.x % 128 == 0:
            mbarrier_arrive(empty + uint64(8 * ((kt - 1) % W_STAGES)))
    wgmma_wait0()


@cuda.jit(device=True, forceinline=True)
def _accumulator_origin(row0, col0, c):
    """(row, column) of a consumer thread's accumulator 0 in the output: accumulators 4j + 2h + e belong to
    row + 8h, column + 8j + e (mma.sync's C fragment, once per n8 tile)."""
    t = cuda.threadIdx.x % 128
    lane = t % 32
    return row0 + 64 * c + 16 * (t // 32) + lane // 4, col0 + 2 * (lane % 4)


@cuda.jit(**_gpu_options(launch_bounds=(384, 1)))
def _wgmma_int8(A, W, out, map_a, map_w):
    smem = cuda.shared.array(0, uint8, alignment=ALIGN16)
    acc = cuda.local.array(128, int32)
    row0, col0, tiles, full, empty, steps = _int8_ring(A, W, smem)
    wg = cuda.threadIdx.x // 128
    if wg == 0:
        _int8_producer(map_a, map_w, tiles, full, empty, row0, col0, steps)
    else:
        _int8_consumer(acc, tiles, full, empty, steps, wg - 1)
        row, col = _accumulator_origin(row0, col0, wg - 1)
        M, N = out.shape
        store_accumulators_s32(acc, out.ctypes.data + uint64((row * N + col) * 4), 4 * N, M - row, N - col)


@op.stage("wgmma", """
    Hopper's instructions, as hgemm's warp_specialized stage uses them: one producer warpgroup keeps a
    ring of four 48 KiB slots full with cp.async.bulk.tensor (TMA) copies of 128x128-byte A boxes and
    256x128-byte W boxes, counted on "full" mbarriers; two consumer warpgroups wait on them and issue
    wgmma.mma_async m64n256k32 .s32.s8.s8 (64x256x32, 16 times the work of one mma.sync m16n8k32) from
    shared-memory descriptors, keep one group in flight and release each slot on its "empty" barrier;
    setmaxnreg gives the consumers the registers for their 128 int32 accumulators. An 8-bit wgmma reads
    both operands K-major: W stored N x K is already that, so W's tile is described like A's. K must be
    a multiple of 16 (rows of whole 16-byte units, the copy engine's rule); other shapes run the mma
    stage's kernel. At 8192^3 on the H200: 844 us, 1303 TOPS, 1.41x torch._int_mm (1187 us), which
    runs Ampere-style kernels for int8 on Hopper.""")
def wgmma(A, W, out):
    M, N = A.shape[0], W.shape[0]
    if not tma_ok(A, W):
        _launch_int8(_mma_vec, _mma_bytes, A, W, out)
        return
    args = (A, W, out, tensor_map(A, WBK, WBM), tensor_map(W, WBK, WBN))
    set_max_dynamic_shared_memory(_wgmma_int8, args, W_SMEM_BYTES)
    blocks = blocks_for(M, WBM) * blocks_for(N, WBN)
    _wgmma_int8[blocks, 384, 0, W_SMEM_BYTES](*args)


# == qlinear: quantize -> int8 GEMM -> dequantize ==========================================================

QMAX = 127  # symmetric int8: -127 .. 127 (-128 is never produced, so negation stays exact)


def quantize_rows_reference(x):
    """(q int8, scale float32) of each row of x, in float32 arithmetic as the kernels do it:
    scale = max|x| / 127, q = round-half-even(x / scale) saturated to [-127, 127]; an all-zero row has
    scale 1 (its q is 0)."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=1).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(QMAX), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(x / scale[:, None]), -QMAX, QMAX).astype(np.int8)
    return q, scale


def _qlinear_inputs(size, rng):
    M, N, K = size
    x = rng.standard_normal((M, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    Wq, w_scale = quantize_rows_reference(W)  # the weights are quantized once, ahead of time
    return x, Wq, w_scale


def _qlinear_adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    M, N, K = size
    _, Wq, w_scale = _qlinear_inputs(size, rng)
    # Rows whose largest magnitude is 127 (scale exactly 1) and whose other values are halves: x / scale
    # lands exactly on .5, where rounding half to even (2.5 -> 2, -0.5 -> -0) and rounding half away
    # from zero (floor(v + 0.5): 2.5 -> 3) part ways.
    halves = np.resize(np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5], np.float32), K)
    ties = np.tile(halves, (M, 1))
    ties[:, 0] = 127.0
    # Rows of zeros among ordinary ones: amax = 0, the scale is 1 and the output 0 (amax / 127 as the
    # scale would divide 0 by 0).
    zeros = rng.standard_normal((M, K)).astype(np.float32)
    zeros[::2] = 0.0
    return [("half-way-ties", (ties, Wq, w_scale)), ("zero-rows", (zeros, Wq, w_scale))]


def _qlinear_reference(x, Wq, w_scale):
    xq, x_scale = quantize_rows_reference(x)
    acc = exact_int8_products(xq, Wq)
    return acc * x_scale.astype(np.float64)[:, None] * w_scale.astype(np.float64)[None, :]


def _qlinear_validate(x, Wq, w_scale, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    expect_device_array("Wq", Wq, dtype=np.int8, ndim=2)
    if x.shape[1] != Wq.shape[1]:
        raise InputError(f"x is {tuple(x.shape)} (M x K) and Wq is {tuple(Wq.shape)}: Wq must be N x K with "
                         f"K = {x.shape[1]} (out_features x in_features)")
    M, N = x.shape[0], Wq.shape[0]
    expect_device_array("w_scale", w_scale, dtype=np.float32, shape=(N,))
    expect_device_array("out", out, dtype=np.float32, shape=(M, N))


def _qlinear_peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def torch_int8_linear(x, Wq, w_scale, out):
        # The same layer in torch operations: quantize, torch._int_mm (cuBLASLt int8), dequantize.
        tx = peers.as_torch(x)
        amax = tx.abs().amax(dim=1, keepdim=True)
        # amax / 127 with a Python number would multiply by a rounded 1/127 (torch's division by a scalar),
        # a scale one ulp off the layer's amax / 127 in some rows: divide by a tensor for the same scale.
        scale = torch.where(amax > 0, amax / torch.full_like(amax, QMAX), torch.ones_like(amax))
        xq = torch.clamp(torch.round(tx / scale), -QMAX, QMAX).to(torch.int8)
        acc = torch._int_mm(xq, peers.as_torch(Wq).t())
        torch.mul(acc * scale, peers.as_torch(w_scale), out=peers.as_torch(out))

    return "torch (quantize + _int_mm + dequantize)", torch_int8_linear


def _qlinear_tolerance(size, dtype):
    # The float32 epilogue rounds once or twice (acc to float32, two products): ~1e-7 relative per
    # element. A quantized value off by one (x / scale rounded the other way) is off by 1/127 of one
    # term of K: 1e-5 lets no such error through at these sizes, and no wrong index.
    return 1e-5


qlinear_op = Operator(
    name="qlinear",
    title="int8 linear layer: y = dequant(quant(x) Wqᵀ) (float32 in and out)",
    reference=_qlinear_reference,
    make_inputs=_qlinear_inputs,
    make_output=lambda size: np.empty(size[:2], np.float32),
    # x read once (float32), the weights (int8) and their scales once, y written once (float32)
    bytes_moved=lambda size: 4 * size[0] * size[2] + size[1] * size[2] + 4 * size[1] + 4 * size[0] * size[1],
    flops=lambda size: 2 * size[0] * size[1] * size[2],
    validate=_qlinear_validate,
    tolerance=_qlinear_tolerance,
    peer=_qlinear_peer,
    adversarial_inputs=_qlinear_adversarial,
    bound="compute",
    compute_dtype=np.int8,  # its GEMM is int8: "% of peak" is of an int8 rate (none measured yet: —)
    size_names=("M", "N", "K"),
    check_sizes=[(1, 1, 1), (17, 33, 65), (33, 40, 48), (127, 129, 131), (1000, 1000, 1000), (4096, 4096, 4096)],
    sim_sizes=[(1, 1, 1), (5, 7, 3), (17, 24, 96), (33, 9, 37)],
    quick_size=(5, 7, 48),  # two k32 steps, the second ragged, and K % 16 == 0: the wgmma stage takes its TMA path
    bench_sizes=[(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192)],
    headline_size=(8192, 8192, 8192),
    rank=261,
    group="INT8: GEMM and the quantized linear layer",
)

QTHREADS = 256


@cuda.jit
def _quantize_rows(x, xq, x_scale):
    """One block per row: the row's max |x| (a shared-memory tree), then every element quantized."""
    amax = cuda.shared.array(QTHREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    K = x.shape[1]
    m = float32(0.0)
    for k in range(t, K, QTHREADS):
        m = max(m, abs(x[row, k]))
    amax[t] = m
    cuda.syncthreads()
    half = QTHREADS // 2
    while half > 0:
        if t < half:
            amax[t] = max(amax[t], amax[t + half])
        cuda.syncthreads()
        half //= 2
    scale = amax[0] / float32(QMAX) if amax[0] > float32(0.0) else float32(1.0)
    for k in range(t, K, QTHREADS):
        v = libdevice.float2int_rn(x[row, k] / scale)  # cvt.rni: half to even, as the reference
        xq[row, k] = int8(min(max(v, int32(-QMAX)), int32(QMAX)))  # saturate
    if t == 0:
        x_scale[row] = scale


@cuda.jit
def _dequantize(acc, x_scale, w_scale, out):
    i = cuda.grid(1)
    if i < out.size:
        row = i // out.shape[1]
        col = i % out.shape[1]
        out[row, col] = float32(acc[row, col]) * x_scale[row] * w_scale[col]


def _quantize(x):
    M, K = x.shape
    xq = scratch("qlinear.xq", (M, K), np.int8)
    x_scale = scratch("qlinear.x_scale", M, np.float32)
    _quantize_rows[M, QTHREADS](x, xq, x_scale)
    return xq, x_scale


@qlinear_op.stage("unfused", """
    Three kernels, as three library calls would be: quantize x per row (a max reduction, then each
    element divided, rounded half-to-even and saturated), the int8 GEMM of int8_gemm's mma stage
    writing int32 sums to memory, and a dequantize kernel that reads them back and scales each by
    x_scale[m] w_scale[n]. The int32 round trip costs 8 M N bytes and a launch.""")
def unfused(x, Wq, w_scale, out):
    M, N = out.shape
    xq, x_scale = _quantize(x)
    acc = scratch("qlinear.acc", (M, N), np.int32)
    _launch_int8(_mma_vec, _mma_bytes, xq, Wq, acc)
    _dequantize[blocks_for(M * N, 256), 256](acc, x_scale, w_scale, out)


@cuda.jit(device=True, inline=True)
def _scale_at(scales, i, n):
    """scales[i], or 0 past the end (an edge tile's rows or columns outside the output)."""
    return scales[i] if i < n else float32(0.0)


@cuda.jit(device=True, inline=True)
def _put(out, row, col, value, M, N):
    if row < M and col < N:
        out[row, col] = value


@cuda.jit(device=True, inline=True)
def _dequantize_fragments(out, acc, j, r0, c0, x_scale, w_scale, M, N):
    """The four m16 fragments of n8 tile j, scaled and stored: the scales of the two columns are loaded
    once for the four fragments, those of each fragment's two rows once for its four values."""
    col = c0 + 8 * j
    w_left = _scale_at(w_scale, col, N)
    w_right = _scale_at(w_scale, col + 1, N)
    for i in range(4):
        # HINT: the accumulator layout of an m16n8 tile: c0, c1 at row g, columns 2q and 2q + 1; c2, c3 at row g + 8 (r0 and c0 already hold this lane's g and 2q).
        # HINT: m16 tile i starts 16 i rows below r0: load the x_scale of its two rows once (_scale_at, 0 past the end), then scale each of the four values by its row's and its column's scale.
        # HINT: _put(out, row, col, float32(acc[i, j, e]) * x_scale of the row * w_scale of the column, M, N) for e = 0..3: rows row, row, row + 8, row + 8; columns col, col + 1, col, col + 1.
        # BEGIN SOLUTION
        row = r0 + 16 * i
        x_top = _scale_at(x_scale, row, M)
        x_bottom = _scale_at(x_scale, row + 8, M)
        _put(out, row, col, float32(acc[i, j, 0]) * x_top * w_left, M, N)
        _put(out, row, col + 1, float32(acc[i, j, 1]) * x_top * w_right, M, N)
        _put(out, row + 8, col, float32(acc[i, j, 2]) * x_bottom * w_left, M, N)
        _put(out, row + 8, col + 1, float32(acc[i, j, 3]) * x_bottom * w_right, M, N)
        # END SOLUTION


@cuda.jit(device=True, inline=True)
def _int8_gemm_dequantized(A, W, x_scale, w_scale, out, vec):
    acc = cuda.local.array((4, 8, 4), int32)
    _int8_tensor_core(A, W, cuda.shared.array(0, uint8, alignment=ALIGN16), vec, acc)
    M, N = out.shape
    t = cuda.threadIdx.x
    lane = t % 32
    r0 = cuda.blockIdx.y * IBM + (t // 32 // 4) * 64 + lane // 4
    c0 = cuda.blockIdx.x * IBN + (t // 32 % 4) * 64 + 2 * (lane % 4)
    # The eight n8 tiles written out, not looped. A loop over them (with two scale loads per value, as
    # this epilogue had) was too big for the compiler to unroll; left rolled, it indexed acc with a
    # variable, and that put all 128 accumulators in a 512-byte stack frame in local memory. Each call
    # below has a constant j, so every acc index is a constant and acc stays in registers.
    _dequantize_fragments(out, acc, 0, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 1, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 2, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 3, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 4, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 5, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 6, r0, c0, x_scale, w_scale, M, N)
    _dequantize_fragments(out, acc, 7, r0, c0, x_scale, w_scale, M, N)


@cuda.jit(**_gpu_options(launch_bounds=(ITHREADS, 1)))
def _fused_vec(A, W, x_scale, w_scale, out):
    _int8_gemm_dequantized(A, W, x_scale, w_scale, out, True)


FUSED_KERNEL = _fused_vec  # the fused stage's main kernel, for scripts that report its registers


@cuda.jit(**_gpu_options(launch_bounds=(ITHREADS, 1)))
def _fused_bytes(A, W, x_scale, w_scale, out):
    _int8_gemm_dequantized(A, W, x_scale, w_scale, out, False)


@qlinear_op.stage("fused", """
    The dequantization moves into the GEMM's epilogue: the int32 accumulators are scaled by x_scale[m]
    and w_scale[n] while still in registers and stored once as float32. Two launches instead of three,
    and the M x N int32 intermediate never exists. (Quantizing x stays its own pass: its scale is the
    max over a whole row, which no GEMM block sees before it starts.) At 8192^3 on an H200 it took 2561
    µs against the unfused stage's 2773 and torch's quantize + _int_mm + dequantize's 2516. What int8
    costs in accuracy: against the float32 layer x Wᵀ (computed in float64), with x standard normal and
    W standard normal / sqrt(K), the output's relative error (norm of the difference over norm of the
    exact layer, on sampled rows) was 0.0128 at 8192^3, where cuBLAS in fp16 on the same layer had
    0.00036 (on an H200): about 36 times fp16's error. What it buys, in the
    same recording as the times above: cuBLAS's int8 GEMM (torch._int_mm, 920 TOPS at 8192^3) runs 1.37
    times its fp16 GEMM (torch.matmul, 671 TFLOP/s).""")
def fused(x, Wq, w_scale, out):
    xq, x_scale = _quantize(x)
    _launch_int8(_fused_vec, _fused_bytes, xq, Wq, x_scale, w_scale, out)


# -- 3. the epilogue on wgmma (sm_90a) ---------------------------------------------------------------------

@cuda.jit(device=True, forceinline=True)
def _dequantize_wgmma_columns(out, acc, j0, row, col, x_top, x_bottom, w_scale, M, N):
    """n8 tiles j0..j0 + 3 of a consumer thread's wgmma accumulators, scaled and stored: accumulators 4j
    and 4j + 1 are row ``row``, columns col + 8j and col + 8j + 1; 4j + 2 and 4j + 3 the same columns of
    row + 8. x_top and x_bottom are the two rows' scales, loaded once; each column pair's once per tile."""
    for jj in range(4):  # unrolled by the compiler: with j0 a constant every acc index is one
        j = j0 + jj
        left = col + 8 * j
        w_left = _scale_at(w_scale, left, N)
        w_right = _scale_at(w_scale, left + 1, N)
        _put(out, row, left, float32(acc[4 * j]) * x_top * w_left, M, N)
        _put(out, row, left + 1, float32(acc[4 * j + 1]) * x_top * w_right, M, N)
        _put(out, row + 8, left, float32(acc[4 * j + 2]) * x_bottom * w_left, M, N)
        _put(out, row + 8, left + 1, float32(acc[4 * j + 3]) * x_bottom * w_right, M, N)


@cuda.jit(**_gpu_options(launch_bounds=(384, 1)))
def _wgmma_qlinear(A, W, x_scale, w_scale, out, map_a, map_w):
    """gemm[int8]'s wgmma kernel with the fused stage's epilogue: the same ring, producer and consumers."""
    smem = cuda.shared.array(0, uint8, alignment=ALIGN16)
    acc = cuda.local.array(128, int32)
    row0, col0, tiles, full, empty, steps = _int8_ring(A, W, smem)
    wg = cuda.threadIdx.x // 128
    if wg == 0:
        _int8_producer(map_a, map_w, tiles, full, empty, row0, col0, steps)
    else:
        _int8_consumer(acc, tiles, full, empty, steps, wg - 1)
        row, col = _accumulator_origin(row0, col0, wg - 1)
        M, N = out.shape
        x_top = _scale_at(x_scale, row, M)
        x_bottom = _scale_at(x_scale, row + 8, M)
        # The 32 n8 tiles in eight calls of four, each with a constant j0: a loop over all 32 would index
        # acc at run time and move the 128 accumulators to local memory (see _int8_gemm_dequantized).
        _dequantize_wgmma_columns(out, acc, 0, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 4, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 8, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 12, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 16, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 20, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 24, row, col, x_top, x_bottom, w_scale, M, N)
        _dequantize_wgmma_columns(out, acc, 28, row, col, x_top, x_bottom, w_scale, M, N)


@qlinear_op.stage("wgmma_epilogue", """
    The GEMM moves to gemm[int8]'s wgmma kernel (a producer warpgroup issuing TMA copies into a four-slot
    ring, two consumer warpgroups on wgmma m64n256k32 .s32.s8.s8) and the fused stage's epilogue moves
    with it: each consumer thread's 128 int32 sums, still in registers after the last wgmma_wait, are
    converted to float32, multiplied by their row's x_scale and their column's w_scale and stored once.
    The two kernels share the ring, the producer and the consumers' main loop; only what happens to the accumulators after
    it differs, so the int32 product never reaches memory. The epilogue runs at constant accumulator
    indices, as the int32 store does: eight calls of four n8 tiles, each a small loop the compiler
    unrolls. Quantizing x stays the pass before it (a row's scale needs the whole row). Why it is faster:
    the fused stage's GEMM is the mma.sync kernel, which took 2401 us at 8192^3 on the H200 as gemm[int8]'s
    mma stage; the wgmma kernel took 844 us there (1.41x torch._int_mm), and the epilogue adds the same
    float32 stores the fused stage makes. The whole layer, quantizing x included, took 1125 us at 8192^3
    (977 int8 TOPS), where the fused stage took 2561 us. K must be a multiple of 16 (the copy engine's rule for the int8
    rows); other shapes run the fused stage.""")
def wgmma_epilogue(x, Wq, w_scale, out):
    M, N = out.shape
    xq, x_scale = _quantize(x)
    if not tma_ok(xq, Wq):
        _launch_int8(_fused_vec, _fused_bytes, xq, Wq, x_scale, w_scale, out)
        return
    args = (xq, Wq, x_scale, w_scale, out, tensor_map(xq, WBK, WBM), tensor_map(Wq, WBK, WBN))
    set_max_dynamic_shared_memory(_wgmma_qlinear, args, W_SMEM_BYTES)
    _wgmma_qlinear[blocks_for(M, WBM) * blocks_for(N, WBN), 384, 0, W_SMEM_BYTES](*args)


OPERATORS = [op, qlinear_op]
