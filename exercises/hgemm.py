# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/hgemm.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade hgemm            (or hgemm.<stage>; its other operators: hgemm_bf16)
# The grader checks each stage against the operator in solutions/hgemm.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 39c0a3e763067e2594dcb318be9f4fa1d27cb18b8927fa42175d82b731da65f8
# --------------------------------------------------------------------------------------------------
"""Half-precision GEMM on tensor cores: out = A B with A (M x K) and B (K x N) in fp16 or bf16,
accumulated in float32, written in the inputs' precision (what ``torch.matmul`` does at that dtype).

Layout: row-major A, B and out, as torch stores them, so the peer (cuBLAS through torch.matmul) reads
the very same buffers. B row-major means its columns, which the tensor core wants as consecutive k,
are strided in memory: the ``ldmatrix`` stage loads them with ``.trans`` (the int8 GEMM, whose
weights come as N x K, shows the other layout). Any M, N, K: tiles are zero-filled past the edges.

Two operators share every stage: ``hgemm`` (fp16) and ``hgemm_bf16``. bf16 keeps float32's 8-bit
exponent and only 8 bits of mantissa (fp16: 5 and 11): the same tensor-core speed, a wider range,
four times coarser rounding.

The ladder, and what each rung changes:

1. ``cuda_core``: the float32 register-tile GEMM with halves converted on their way into shared
   memory. Half the bytes of float32, the same FMA units: no faster than the float32 ladder.
2. ``mma``: the multiply-adds go to the tensor cores, one ``mma.sync.m16n8k16`` (a 16x8x16 product,
   4096 flops) per warp-instruction, from CUDA C++ linked into numba (numba-cuda has no tensor-core
   API). Tiles travel global -> shared by ``cp.async``, double-buffered; each lane builds its
   fragments from shared memory one 16-bit element at a time.
3. ``ldmatrix``: one ``ldmatrix.x4`` loads four 8x8 matrices, a whole m16k16 A fragment (or, with
   ``.trans``, two n8k16 B fragments), for the warp: 4x fewer shared-memory instructions, but the
   unpadded row-major tiles put the 8 rows it reads in the same banks (4- and 8-way conflicts).
4. ``swizzle``: the 16-byte chunks of each tile row are XOR-permuted by the row number, so the 8
   rows an ``ldmatrix`` phase reads (and the chunks ``cp.async`` writes) land in 8 different bank
   groups, with no padding bytes lost.
5. ``pipeline``: four stages of tiles in flight instead of two: 64 KiB of dynamic shared memory,
   past the 48 KiB a block gets by default (``workbench.shared_memory.set_max_dynamic_shared_memory``).
   ``cp.async.wait_group 2`` lets the copies of the next two K-steps run while this one computes.
   Recorded on the H200 it is no faster than ``swizzle`` (fp16 2.6% slower, bf16 2% faster): its
   paragraph says why that is likely.
6. ``tuned``: a 128x256 block tile of 8 warps, each 64x64 (4x8 mma tiles), K-step 64, three stages in 144 KiB:
   each fragment loaded from shared memory feeds twice the mma of stage 5's 64x32 warp tiles.

Why not ``wgmma`` and TMA, what cuBLAS runs on Hopper? ``wgmma.mma_async`` is a warpgroup-wide (128
threads), asynchronous instruction that reads its B operand (and optionally A) straight from shared
memory through a 64-bit *matrix descriptor*, and TMA copies whole tiles with one thread through a
*tensor map* built on the host (``cuTensorMapEncodeTiled``) and a shared-memory ``mbarrier``. From
numba, the C++ side could issue the instructions, but the kernel around them cannot be written:
numba cannot pass a 128-byte ``CUtensorMap`` as a ``__grid_constant__`` kernel parameter, cannot
launch thread-block clusters, cannot declare the ``setmaxnreg`` register split between producer and
consumer warpgroups, and its accumulators live in a local array that must stay in registers across
the asynchronous wgmma (``wgmma.fence``/``commit_group``/``wait_group``) — without control of the
register allocation that would spill. ``mma.sync`` is Ampere's synchronous warp-level instruction,
which Hopper still runs, at about half of its tensor-core peak per SM: each warp waits for its own
product, operands go through registers, and ldmatrix must feed them. That is the cost: the best
mma.sync kernels reach about 60-70% of cuBLAS fp16 on an H100/H200 (cuBLAS 661 TFLOP/s on our
H200); this ladder aims at 50-60%.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, int32, uint16, uint32, uint64

from workbench import device as _device
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array
from workbench.shared_memory import SM90_OPTIN_LIMIT, STATIC_LIMIT, set_max_dynamic_shared_memory
from workbench.targets import against_peer

from solutions._ptx import (cp_async_chunk16, cp_async_commit, cp_async_wait_pending, ldmatrix_x4,
                            ldmatrix_x4_trans, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2)
from solutions._tile_layout import aligned, chunk_offset

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # numba-cuda takes bf16 arrays from ml_dtypes; without it there is no bf16 operator
    BF16 = None


def _gpu_options(**options):
    """Compile options only the real GPU compiler takes (the simulator's cuda.jit accepts none)."""
    return {} if _device.is_simulator() else options


ALIGN16 = None if _device.is_simulator() else 16  # the simulator refuses alignment=


# -- the operators --------------------------------------------------------------------------------

def _inputs_for(dtype):
    def make(size, rng):
        M, N, K = size
        # Both signs, so sums cancel and an indexing error cannot hide in a large mean. The values are
        # exactly representable in the half type: the reference sees what the kernel sees.
        A = rng.uniform(-1.0, 1.0, (M, K)).astype(dtype)
        B = rng.uniform(-1.0, 1.0, (K, N)).astype(dtype)
        return A, B
    return make


def _adversarial_for(dtype):
    def adversarial(size, rng):
        """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
        A, B = _inputs_for(dtype)(size, rng)
        K = size[2]
        # A large product first (16 x 16 = 256) that the last one cancels: the answer is the small
        # rest. An accumulator in the half type holds 256 to within 0.125 (fp16) or 1 (bf16), so the
        # small terms added to it are rounded away; float32 accumulation keeps them.
        A[:, 0], B[0, :] = 16, 16
        if K > 1:
            A[:, K - 1], B[K - 1, :] = 16, -16
        return [("cancelling-large-products", (A, B))]
    return adversarial


def _reference(A, B):
    return A.astype(np.float64) @ B.astype(np.float64)


def _validator_for(dtype):
    def validate(A, B, out):
        expect_device_array("A", A, dtype=dtype, ndim=2)
        expect_device_array("B", B, dtype=dtype, ndim=2)
        if A.shape[1] != B.shape[0]:
            raise InputError(f"inner dimensions differ: A is {tuple(A.shape)} (M x K) but B is {tuple(B.shape)}; "
                             f"B must have K = {A.shape[1]} rows")
        expect_device_array("out", out, dtype=dtype, shape=(A.shape[0], B.shape[1]))
    return validate


# The output is rounded to the half type once: its relative error is about 2^-11 / sqrt(3) (fp16) or
# 2^-8 / sqrt(3) (bf16) per element, 3e-4 or 2e-3 in norm; float32 accumulation adds ~sqrt(K) 6e-8.
# The tolerances (2e-3 and 1e-2) leave margin; a wrong index or a dropped tile is off by O(1).
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}


def _torch_view(a):
    """A torch tensor on the same buffer, at the same half type (torch cannot read ml_dtypes' bf16
    typestr, so bf16 goes through an int16 view)."""
    torch = peers.torch()

    def make(a):
        arr = a if hasattr(a, "is_c_contiguous") else cuda.as_cuda_array(a)
        if np.dtype(arr.dtype) == np.float16:
            return torch.as_tensor(arr, device="cuda")
        return torch.as_tensor(arr.view(np.int16), device="cuda").view(torch.bfloat16)

    return peers.cached("torch-half", a, make)


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def matmul(A, B, out):
        torch.matmul(_torch_view(A), _torch_view(B), out=_torch_view(out))

    return "torch.matmul", matmul


def _operator(name, dtype, title, rank):
    bytes_per = np.dtype(dtype).itemsize
    return Operator(
        name=name,
        targets=[against_peer(0.80, "torch.matmul", stage="best")],
        title=title,
        reference=_reference,
        make_inputs=_inputs_for(dtype),
        make_output=lambda size: np.empty(size[:2], dtype),
        bytes_moved=lambda size: bytes_per * (size[0] * size[2] + size[2] * size[1] + size[0] * size[1]),
        flops=lambda size: 2 * size[0] * size[1] * size[2],
        validate=_validator_for(dtype),
        tolerance=lambda size, _dtype: TOLERANCE[np.dtype(dtype).name],
        peer=_peer,
        bound="compute",
        dtype=dtype,
        adversarial_inputs=_adversarial_for(dtype),
        # Odd shapes: not multiples of any tile, K not a multiple of 16 (nor of 8: the scalar copy path)
        check_sizes=[(1, 1, 1), (17, 33, 65), (33, 40, 24), (127, 129, 131), (200, 264, 168), (1000, 1000, 1000),
                     (4097, 1000, 336), (2048, 2048, 2048), (4096, 4096, 4096)],
        sim_sizes=[(1, 1, 1), (5, 7, 3), (17, 24, 40), (33, 9, 19)],
        bench_sizes=[(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                     (8192, 8192, 8192)],
        headline_size=(8192, 8192, 8192),
        rank=rank,
        group="Half-precision GEMM on tensor cores (fp16, bf16)",
        record_all_sizes=True,
    )


op = _operator("hgemm", np.float16, "fp16 GEMM on tensor cores: out = A B (float32 accumulation)", 250)
bf16_op = _operator("hgemm_bf16", BF16, "bf16 GEMM on tensor cores: out = A B (float32 accumulation)", 251) \
    if BF16 is not None else None
OPERATORS = [o for o in (op, bf16_op) if o is not None]


def _stage(name, summary, **options):
    """Register one launcher as the same stage of both operators (fp16 and bf16)."""
    def register(launch):
        stages = [o.stage(name, summary, **options)(launch) for o in OPERATORS]
        return stages[0]
    return register


def _bits(a):
    """The raw 16-bit patterns of a half array (the mma stages only move bits; the tensor core
    interprets them)."""
    arr = a if hasattr(a, "is_c_contiguous") else cuda.as_cuda_array(a)
    return arr.view(np.uint16)


def _is_bf16(a) -> bool:
    return np.dtype(a.dtype) != np.float16


# -- 1. CUDA cores ------------------------------------------------------------------------------------

CBM, CBN, CBK = 64, 64, 16  # block tile and K-step; 256 threads, each a 4x4 set of outputs
CTHREADS = 256


@cuda.jit(**_gpu_options(launch_bounds=(CTHREADS, 2)))
def _cuda_core(A, B, out):
    As = cuda.shared.array((CBK, CBM), float32)  # A transposed: a thread's 4 rows at one k are neighbours
    Bs = cuda.shared.array((CBK, CBN), float32)
    acc = cuda.local.array((4, 4), float32)
    a = cuda.local.array(4, float32)
    b = cuda.local.array(4, float32)
    t = cuda.threadIdx.x
    ty = t // 16  # rows ty + 16 m, columns tx + 16 n: interleaved, so a warp's shared reads hit
    tx = t % 16  # 16 neighbouring floats (no bank conflicts)
    row0 = cuda.blockIdx.y * CBM
    col0 = cuda.blockIdx.x * CBN
    M, K = A.shape
    N = B.shape[1]
    for m in range(4):
        for n in range(4):
            acc[m, n] = float32(0.0)
    for k0 in range(0, K, CBK):
        for i in range(CBM * CBK // CTHREADS):  # 4 elements of each tile per thread, zero outside
            e = t + i * CTHREADS
            r = e // CBK
            c = e % CBK
            # the conversion to float32 happens once per element, on the way into shared memory
            As[c, r] = float32(A[row0 + r, k0 + c]) if row0 + r < M and k0 + c < K else float32(0.0)
            r = e // CBN
            c = e % CBN
            Bs[r, c] = float32(B[k0 + r, col0 + c]) if k0 + r < K and col0 + c < N else float32(0.0)
        cuda.syncthreads()
        for k in range(CBK):
            for m in range(4):
                a[m] = As[k, ty + 16 * m]
            for n in range(4):
                b[n] = Bs[k, tx + 16 * n]
            for m in range(4):
                for n in range(4):
                    acc[m, n] += a[m] * b[n]
        cuda.syncthreads()
    for m in range(4):
        for n in range(4):
            row = row0 + ty + 16 * m
            col = col0 + tx + 16 * n
            if row < M and col < N:
                out[row, col] = acc[m, n]  # rounded to the half type (nearest even) by the store


@_stage("cuda_core", """
    The float32 register-tile GEMM on half inputs: each element is converted to float32 once, on its
    way into shared memory, and everything after runs on the FMA units in float32. The inputs are half
    the bytes of float32, but GEMM is bound by arithmetic, not bytes: this runs at float32 speed (a
    small tile, 4x4 outputs a thread). The tensor cores, not the narrower type, are what makes half
    precision fast.""")
def cuda_core(A, B, out):
    M, N = out.shape
    _cuda_core[(blocks_for(N, CBN), blocks_for(M, CBM)), CTHREADS](A, B, out)


# == the tensor-core stages ============================================================================
#
# Every stage from 2 on is one kernel source, ``_tensor_core_gemm``, compiled with different constants:
# a block tile BM x BN, a K-step BK, warp tiles WM x WN (the block's (BM / WM) x (BN / WN) warps), a ring
# of STAGES tile buffers, and two switches (fragments by ldmatrix or element by element; swizzled tiles
# or not). :func:`build_kernel` makes a kernel from a :class:`Geometry` and the switches: numba treats
# the variables a kernel closes over as compile-time constants, so every loop over tiles has a constant
# trip count, is unrolled, and the accumulators stay in registers.
#
# Fragments (PTX ISA "Matrix Fragments for mma.m16n8k16", f16/bf16; solutions/_ptx.py writes them out
# as functions, tests/test_hgemm.py checks these kernels against them). Lane l, g = l // 4, q = l % 4:
#   A (16x16, row): register r holds the two halves at row g + 8 (r % 2), k = 2q, 2q + 1 (+ 8 if r >= 2)
#   B (16x8, col):  register r holds the two halves at k = 2q, 2q + 1 (+ 8 r), column g
#   C (16x8):       c0, c1 at row g, columns 2q, 2q + 1; c2, c3 at row g + 8
# ldmatrix.x4: lane l addresses row l % 8 of 8x8 matrix l // 8. For A at (m0, k0) the four matrices
# are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15): registers a0..a3
# in order, and lane l addresses row m0 + l % 16, column k0 + 8 (l // 16). For B at (k0, n0), .trans,
# they are (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15): b0, b1 of n8 tile n0 and
# b0, b1 of tile n0 + 8, and lane l addresses row k0 + l % 16, column n0 + 8 (l // 16). Same formula.


@dataclass(frozen=True)
class Geometry:
    """The constants one tensor-core kernel is compiled with (``scripts/gpu_hgemm_sweep.py`` times many)."""

    bm: int = 128  # block tile: rows of out
    bn: int = 128  # block tile: columns of out
    bk: int = 32  # K-step in halves: 32 (A tile rows of 64 bytes) or 64 (128 bytes)
    wm: int = 64  # warp tile rows: wm / 16 m16 tiles
    wn: int = 32  # warp tile columns: wn / 8 n8 tiles (a multiple of 16: one ldmatrix.x4.trans loads two)
    stages: int = 2  # K-steps of tiles in the cp.async ring
    min_blocks: int = 2  # launch_bounds: blocks per SM the register budget must leave room for
    raster: int = 1  # tile rows one group of blocks walks together (1: the grid row by row); see block_tile

    @property
    def threads(self) -> int:
        return 32 * (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def step_bytes(self) -> int:
        """One ring buffer: an A tile (bm x bk) and a B tile (bk x bn) of 16-bit elements."""
        return 2 * (self.bm * self.bk + self.bk * self.bn)

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.step_bytes

    def problems(self) -> list:
        """What makes this geometry impossible (an empty list: none)."""
        found = []
        if self.bm % self.wm or self.bn % self.wn:
            found.append(f"the warp tile {self.wm}x{self.wn} must divide the block tile {self.bm}x{self.bn}")
        if self.wm % 16 or self.wn % 16:
            found.append(f"warp tile sides must be multiples of 16 (got {self.wm}x{self.wn})")
        if self.bk not in (32, 64):
            found.append(f"bk must be 32 or 64 (the swizzle patterns are for 64- and 128-byte rows), got {self.bk}")
        if self.bn % 64:
            found.append(f"bn must be a multiple of 64 (B tile rows of whole 128-byte lines), got {self.bn}")
        if not 32 <= self.threads <= 1024:
            found.append(f"{self.threads} threads per block (1 to 32 warps allowed)")
        if not 2 <= self.stages <= 8:
            found.append(f"stages must be 2 to 8 (cp.async.wait_group takes 0 to 6), got {self.stages}")
        if self.smem_bytes > SM90_OPTIN_LIMIT:
            found.append(f"{self.smem_bytes} bytes of shared memory, past the {SM90_OPTIN_LIMIT} an sm_90 block may have")
        if self.min_blocks < 1 or self.raster < 1:
            found.append("min_blocks and raster must be at least 1")
        return found

    def label(self) -> str:
        return (f"{self.bm}x{self.bn}x{self.bk} warp {self.wm}x{self.wn} {self.threads}t {self.stages}st "
                f"{self.smem_bytes // 1024}KiB lb{self.min_blocks} r{self.raster}")


# The device functions below are inlined by NVVM (forceinline=True: each compiled once, then inlined
# into the kernel) rather than by numba (inline=True, as elsewhere, copies the function's IR into
# every call site, then copies the scope of all its variables again for each block of it). Here that
# copying took 15 s of a 16 s compile per kernel variant on the 2-core machine; NVVM's inlining
# compiles the same kernels in 1-5 s, with the same registers, spills and shared memory for every
# stage (workbench ptx hgemm). It is not a free swap elsewhere: in gemm's TF32 stage and elementwise's
# ILP stages it halved the speed on the H200 (NOTES.md), so those keep numba's inlining.

@cuda.jit(device=True, forceinline=True)
def element_offset(row, col, chunks_per_row, swizzle):
    """Byte offset of the 16-bit element (row, col) of a tile: its 16-byte chunk, placed by
    ``chunk_offset`` (solutions/_tile_layout.py, shared with int8_gemm: chunk c of row r sits at
    c XOR (r % 8), or c XOR ((r // 2) % 4) for rows of 4 chunks), plus its place in the chunk."""
    return chunk_offset(row, col // 8, chunks_per_row, swizzle) + (col % 8) * 2


@cuda.jit(device=True, forceinline=True)
def block_tile(block, tiles_m, tiles_n, raster):
    """(tile row, tile column) of out computed by the ``block``-th block of a 1-D grid.

    raster = 1: row after row. raster = G: the tile rows in groups of G, each group walked column by
    column. The ~130 blocks running at once then cover a G-row band of out: they share G panels of A
    and about 130 / G panels of B, which stay in L2, where row after row they would stream all of B
    from memory for every tile row."""
    per_group = raster * tiles_n
    first_row = (block // per_group) * raster
    rows = min(tiles_m - first_row, raster)  # the last group may have fewer rows
    within = block % per_group
    return first_row + within % rows, within // rows


@cuda.jit(device=True, forceinline=True)
def _issue_copies(A, B, smem, a_at, b_at, row0, col0, k0, t, threads, bm, bn, bk, vec, swizzle):
    """Start copying K-step k0's A tile (bm x bk) to byte offset a_at of smem, and B's (bk x bn) to b_at.
    vec (K and N multiples of 8, 16-byte aligned bases): cp.async, 16 bytes (8 halves) a chunk,
    zero-filled outside the matrices, landing later. Otherwise plain 16-bit loads and stores, now."""
    M, K = A.shape
    N = B.shape[1]
    a_chunks = bk // 8
    b_chunks = bn // 8
    if vec:
        base = smem.ctypes.data
        for j in range((bm * a_chunks + threads - 1) // threads):  # chunks of A per thread
            c = t + j * threads
            if (bm * a_chunks) % threads == 0 or c < bm * a_chunks:  # the test folds away when it divides
                r = c // a_chunks
                kc = c % a_chunks
                inside = row0 + r < M and k0 + kc * 8 < K
                src = A.ctypes.data + uint64(((row0 + r) * K + k0 + kc * 8) * 2) if inside else A.ctypes.data
                cp_async_chunk16(base + uint64(a_at + chunk_offset(r, kc, a_chunks, swizzle)), src,
                                 16 if inside else 0)
        for j in range((bk * b_chunks + threads - 1) // threads):  # chunks of B per thread
            c = t + j * threads
            if (bk * b_chunks) % threads == 0 or c < bk * b_chunks:
                k = c // b_chunks
                nc = c % b_chunks
                inside = k0 + k < K and col0 + nc * 8 < N
                src = B.ctypes.data + uint64(((k0 + k) * N + col0 + nc * 8) * 2) if inside else B.ctypes.data
                cp_async_chunk16(base + uint64(b_at + chunk_offset(k, nc, b_chunks, swizzle)), src,
                                 16 if inside else 0)
    else:
        for j in range((bm * bk + threads - 1) // threads):
            e = t + j * threads
            if e < bm * bk:
                r = e // bk
                c = e % bk
                v = A[row0 + r, k0 + c] if row0 + r < M and k0 + c < K else uint16(0)
                smem[(a_at + element_offset(r, c, a_chunks, swizzle)) // 2] = v
        for j in range((bk * bn + threads - 1) // threads):
            e = t + j * threads
            if e < bk * bn:
                k = e // bn
                c = e % bn
                v = B[k0 + k, col0 + c] if k0 + k < K and col0 + c < N else uint16(0)
                smem[(b_at + element_offset(k, c, b_chunks, swizzle)) // 2] = v


@cuda.jit(device=True, forceinline=True)
def _pair(smem, at):
    """Two neighbouring halves of shared memory (byte offset at), packed: the first in the low 16 bits."""
    return uint32(smem[at // 2]) | (uint32(smem[at // 2 + 1]) << uint32(16))


@cuda.jit(device=True, forceinline=True)
def _fragments_by_element(smem, a_at, b_at, kk, wr, wc, lane, mt, nt, bk, bn, swizzle, a, b):
    """This lane's fragments for k = kk .. kk + 15 of the warp tile, assembled 16 bits at a time."""
    g = lane // 4
    q = lane % 4
    # EXERCISE: write this part of `_fragments_by_element`. Read the hints one at a time.
    #   hint 1 (nudge): the fragment table above the Geometry class, with g = lane // 4 and q = lane % 4: fill a[4 i + r] for every m16 tile i of the warp tile and b[2 j + r] for every n8 tile j.
    #   hint 2: A register r of tile i: row wr + 16 i + g + 8 (r % 2), columns k and k + 1 for k = kk + 2q + 8 (r // 2): neighbours in a row, so _pair(smem, a_at + element_offset(row, k, bk // 8, swizzle)).
    #   hint 3 (nearly the answer): B register r of tile j: column wc + 8 j + g, rows k and k + 1 for k = kk + 2q + 8r: two rows of B's tile, so two smem[(b_at + element_offset(k, col, bn // 8, swizzle)) // 2], packed lo | hi << 16.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit(device=True, forceinline=True)
def _ldmatrix_lane_offsets(a_lane, b_lane, wr, wc, lane, bk, bn, wn, swizzle):
    """Where this lane's ldmatrix rows are in a ring buffer's tiles, computed once per kernel, outside
    the K loop (byte offsets; the lane addressing is in the comment above):
    a_lane[s]: the warp's m16 tile 0 at k16 step s. Tile i is 16 i rows further down, 32 i bk bytes:
    the swizzle depends on row % 8 or (row // 2) % 4, which adding 16 rows does not change.
    b_lane[p]: n8 tiles 2p and 2p + 1 at k16 step 0; step s is 16 s rows of B further, 32 s bn bytes."""
    row_in = col_in = 0  # (until written: every lane at the tile's corner, a wrong address but a safe one)
    # EXERCISE: write this part of `_ldmatrix_lane_offsets`. Read the hints one at a time.
    #   hint 1 (nudge): ldmatrix.x4: lane l gives the address of row l % 8 of 8x8 matrix l // 8, and the four matrices become registers 0-3 of every lane.
    #   hint 2: A's fragment is (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) in register order (the table above the Geometry class): which row and column of the m16k16 tile is lane l's?
    #   hint 3 (nearly the answer): lanes 0-15 address rows 0-15 at column 0, lanes 16-31 the same rows at column 8; B's tile, loaded with .trans, takes the same formula (k for rows, n for columns).
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    for s in range(bk // 16):
        a_lane[s] = element_offset(wr + row_in, 16 * s + col_in, bk // 8, swizzle)
    for p in range(wn // 16):
        b_lane[p] = element_offset(row_in, wc + 16 * p + col_in, bn // 8, swizzle)


@cuda.jit(device=True, forceinline=True)
def _fragments_by_ldmatrix(smem, a_at, b_at, s, a_lane, b_lane, mt, nt, bk, bn, a, b):
    """This lane's fragments for k16 step s of the tiles at a_at, b_at: one ldmatrix.x4 per m16 tile of
    A, one ldmatrix.x4.trans per two n8 tiles of B. Each address is a precomputed lane offset plus a
    constant: no index arithmetic between the mma."""
    base = smem.ctypes.data
    for i in range(mt):
        regs = ldmatrix_x4(base + uint64(a_at + a_lane[s] + 32 * bk * i))
        a[4 * i] = regs[0]
        a[4 * i + 1] = regs[1]
        a[4 * i + 2] = regs[2]
        a[4 * i + 3] = regs[3]
    for p in range(nt // 2):
        regs = ldmatrix_x4_trans(base + uint64(b_at + b_lane[p] + 32 * bn * s))
        b[4 * p] = regs[0]
        b[4 * p + 1] = regs[1]
        b[4 * p + 2] = regs[2]
        b[4 * p + 3] = regs[3]


@cuda.jit(device=True, forceinline=True)
def _mma_all(a, b, acc, mt, nt, bf16):
    """The warp tile's mt x nt mma.sync for one k16 step: acc[i, j] += A tile i @ B tile j."""
    for i in range(mt):
        for j in range(nt):
            if bf16:
                d = mma_bf16(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3], b[2 * j], b[2 * j + 1],
                             acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
            else:
                d = mma_f16(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3], b[2 * j], b[2 * j + 1],
                            acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
            acc[i, j, 0] = d[0]  # constant tuple indices: d[e] in a loop would go through memory
            acc[i, j, 1] = d[1]
            acc[i, j, 2] = d[2]
            acc[i, j, 3] = d[3]


@cuda.jit(device=True, forceinline=True)
def _k16_step(smem, a_at, b_at, s, wr, wc, lane, a_lane, b_lane, mt, nt, bk, bn, bf16, ldmatrix, swizzle, a, b,
              acc):
    """k16 step s of the K-step whose tiles are at a_at, b_at: load the fragments, issue the mma."""
    if ldmatrix:
        _fragments_by_ldmatrix(smem, a_at, b_at, s, a_lane, b_lane, mt, nt, bk, bn, a, b)
    else:
        _fragments_by_element(smem, a_at, b_at, 16 * s, wr, wc, lane, mt, nt, bk, bn, swizzle, a, b)
    _mma_all(a, b, acc, mt, nt, bf16)


@cuda.jit(device=True, forceinline=True)
def _store(out, acc, row0, col0, lane, mt, nt, bf16):
    """acc to out, rounded to the half type two at a time (c0, c1 and c2, c3 are column neighbours)."""
    M, N = out.shape
    g = lane // 4
    q = lane % 4
    for i in range(mt):
        for j in range(nt):
            col = col0 + 8 * j + 2 * q
            for h in range(2):
                row = row0 + 16 * i + g + 8 * h
                if bf16:
                    packed = pack_bf16x2(acc[i, j, 2 * h], acc[i, j, 2 * h + 1])
                else:
                    packed = pack_f16x2(acc[i, j, 2 * h], acc[i, j, 2 * h + 1])
                if row < M and col < N:
                    out[row, col] = uint16(packed & uint32(0xFFFF))
                if row < M and col + 1 < N:
                    out[row, col + 1] = uint16(packed >> uint32(16))


@cuda.jit(device=True, forceinline=True)
def _tensor_core_gemm(A, B, out, smem, acc, a, b, a_lane, b_lane,
                      bm, bn, bk, wm, wn, stages, raster, bf16, vec, ldmatrix, swizzle):
    """The kernel every tensor-core stage runs; the stages differ in the constants they pass.

    ``stages`` buffers of (A tile, B tile), a ring: at K-step kt the copies of steps kt + 1 ..
    kt + stages - 1 are in flight. One barrier per K-step: after it, step kt has landed for everyone
    and everyone has finished computing step kt - 1, whose buffer the next copy then reuses."""
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    threads = 32 * (bm // wm) * (bn // wn)
    mt = wm // 16
    nt = wn // 8
    wr = (warp // (bn // wn)) * wm  # this warp's tile inside the block's
    wc = (warp % (bn // wn)) * wn
    M, K = A.shape
    N = B.shape[1]
    tile_row, tile_col = block_tile(cuda.blockIdx.x, (M + bm - 1) // bm, (N + bn - 1) // bn, raster)
    row0 = tile_row * bm
    col0 = tile_col * bn
    a_bytes = 2 * bm * bk
    step_bytes = a_bytes + 2 * bk * bn
    for i in range(mt):
        for j in range(nt):
            for e in range(4):
                acc[i, j, e] = float32(0.0)
    if ldmatrix:
        _ldmatrix_lane_offsets(a_lane, b_lane, wr, wc, lane, bk, bn, wn, swizzle)
    steps = (K + bk - 1) // bk
    for s in range(stages - 1):  # fill the pipeline
        if s < steps:
            _issue_copies(A, B, smem, s * step_bytes, s * step_bytes + a_bytes, row0, col0, s * bk, t, threads,
                          bm, bn, bk, vec, swizzle)
        cp_async_commit()  # one group per step, empty or not: the wait count below stays exact
    for kt in range(steps):
        # EXERCISE: write this part of `_tensor_core_gemm`. Read the hints one at a time.
        #   hint 1 (nudge): first make step kt's tiles readable by everyone: wait until its copy group has landed, then a barrier.
        #   hint 2: cp_async_wait_pending(n) waits until at most n newer groups are still in flight: here stages - 2. The barrier also says everyone has finished computing step kt - 1.
        #   hint 3 (nearly the answer): so step kt - 1's buffer, (kt + stages - 1) % stages, is free: issue step kt + stages - 1's copies into it (if that step exists, as the fill above does), then commit a group, even an empty one, so the wait count stays exact.
        pass  # TODO(exercise): not implemented yet: replace this line with your code
        a_at = (kt % stages) * step_bytes
        b_at = a_at + a_bytes
        # The k16 steps written out rather than looped: numba's loop would stay a loop in the compiled
        # code, and the next step's fragment loads could not start while this step's mma run.
        _k16_step(smem, a_at, b_at, 0, wr, wc, lane, a_lane, b_lane, mt, nt, bk, bn, bf16, ldmatrix, swizzle, a, b, acc)
        _k16_step(smem, a_at, b_at, 1, wr, wc, lane, a_lane, b_lane, mt, nt, bk, bn, bf16, ldmatrix, swizzle, a, b, acc)
        if bk == 64:
            _k16_step(smem, a_at, b_at, 2, wr, wc, lane, a_lane, b_lane, mt, nt, bk, bn, bf16, ldmatrix, swizzle,
                      a, b, acc)
            _k16_step(smem, a_at, b_at, 3, wr, wc, lane, a_lane, b_lane, mt, nt, bk, bn, bf16, ldmatrix, swizzle,
                      a, b, acc)
    _store(out, acc, row0 + wr, col0 + wc, lane, mt, nt, bf16)


_BUILT: dict = {}


def build_kernel(geometry: Geometry, bf16: bool, vec: bool, ldmatrix: bool = True, swizzle: bool = True):
    """A kernel ``(A bits, B bits, out bits)`` for one geometry, element type and copy path. Launch it with
    :func:`launch_tensor_core` (a 1-D grid, ``geometry.threads`` threads, ``geometry.smem_bytes`` of
    dynamic shared memory). Kernels are made once per set of arguments."""
    key = (geometry, bf16, vec, ldmatrix, swizzle)
    if key in _BUILT:
        return _BUILT[key]
    problems = geometry.problems()
    if problems:
        raise ValueError(f"impossible tensor-core geometry {geometry}: " + "; ".join(problems))
    # Plain ints and bools the kernel closes over: numba compiles them in as constants.
    BM, BN, BK, WM, WN = geometry.bm, geometry.bn, geometry.bk, geometry.wm, geometry.wn
    STAGES, RASTER = geometry.stages, geometry.raster
    MT, NT = WM // 16, WN // 8
    A_REGS, B_REGS = 4 * MT, 2 * NT
    K16_STEPS, B_PAIRS = BK // 16, WN // 16
    BF16, VEC, LDMATRIX, SWIZZLE = bool(bf16), bool(vec), bool(ldmatrix), bool(swizzle)

    def kernel(A, B, out):
        smem = cuda.shared.array(0, uint16, alignment=ALIGN16)  # the ring, in dynamic shared memory
        acc = cuda.local.array((MT, NT, 4), float32)  # [m16 tile, n8 tile, c0..c3]
        a = cuda.local.array(A_REGS, uint32)
        b = cuda.local.array(B_REGS, uint32)
        a_lane = cuda.local.array(K16_STEPS, int32)
        b_lane = cuda.local.array(B_PAIRS, int32)
        _tensor_core_gemm(A, B, out, smem, acc, a, b, a_lane, b_lane,
                          BM, BN, BK, WM, WN, STAGES, RASTER, BF16, VEC, LDMATRIX, SWIZZLE)

    # A module-level name of its own, so that tools which find a kernel by module and name (workbench
    # ptx, the exercises' compile checks) find this one, e.g. _tc_128x256x32_w64x64_s4_lb1_r8_f16_vec_ldm_swz.
    name = (f"_tc_{BM}x{BN}x{BK}_w{WM}x{WN}_s{STAGES}_lb{geometry.min_blocks}_r{RASTER}_{'bf16' if BF16 else 'f16'}"
            f"_{'vec' if VEC else 'scalar'}{'_ldm' if LDMATRIX else ''}{'_swz' if SWIZZLE else ''}")
    kernel.__name__ = kernel.__qualname__ = name
    compiled = cuda.jit(**_gpu_options(launch_bounds=(geometry.threads, geometry.min_blocks)))(kernel)
    globals()[name] = _BUILT[key] = compiled
    return compiled


def _vec_ok(A, B) -> bool:
    """cp.async copies 16 aligned bytes: rows of A and B must start on 16-byte boundaries."""
    K, N = A.shape[1], B.shape[1]
    return K % 8 == 0 and N % 8 == 0 and aligned(16, A, B)


def launch_tensor_core(geometry: Geometry, A, B, out, ldmatrix: bool = True, swizzle: bool = True):
    """Run the tensor-core kernel of ``geometry`` on half arrays (fp16 or bf16): picks the kernel for
    (bf16?, cp.async path?), raises the shared-memory limit past 48 KiB where needed, launches one
    block per block tile of out."""
    bf16 = _is_bf16(A)
    A, B, out = _bits(A), _bits(B), _bits(out)
    kernel = build_kernel(geometry, bf16, _vec_ok(A, B), ldmatrix, swizzle)
    M, N = out.shape
    blocks = blocks_for(M, geometry.bm) * blocks_for(N, geometry.bn)
    nbytes = geometry.smem_bytes
    if nbytes > STATIC_LIMIT:
        set_max_dynamic_shared_memory(kernel, (A, B, out), nbytes)
    kernel[blocks, geometry.threads, 0, nbytes](A, B, out)


# -- the stages' geometries ----------------------------------------------------------------------------------
# Stages 2-5: a 128 x 128 block tile of 8 warps as 2 x 4, each 64 x 32 (4 x 4 mma tiles). Stage 2's
# element-wise fragments need > 128 registers (one block per SM); stages 3-5 fit two blocks per SM.

MMA_GEOMETRY = Geometry(stages=2, min_blocks=1)
LDMATRIX_GEOMETRY = Geometry(stages=2, min_blocks=2)
PIPELINE = Geometry(stages=4, min_blocks=2)  # 64 KiB: past the 48 KiB default

# Stage 6. To apply a result of scripts/gpu_hgemm_sweep.py, replace this line with the one it prints.
TUNED = Geometry(bm=128, bn=256, bk=64, wm=64, wn=64, stages=3, min_blocks=1, raster=8)

# Stage name -> (geometry, ldmatrix, swizzle)
TENSOR_CORE_STAGES = {
    "mma": (MMA_GEOMETRY, False, False),
    "ldmatrix": (LDMATRIX_GEOMETRY, True, False),
    "swizzle": (LDMATRIX_GEOMETRY, True, True),
    "pipeline": (PIPELINE, True, True),
    "tuned": (TUNED, True, True),
}


def _run_stage(name, A, B, out):
    geometry, ldmatrix, swizzle = TENSOR_CORE_STAGES[name]
    launch_tensor_core(geometry, A, B, out, ldmatrix, swizzle)


# -- 2. mma.sync, fragments element by element ---------------------------------------------------------

@_stage("mma", """
    The multiply-adds move to the tensor cores: mma.sync.m16n8k16 multiplies a 16x16 half tile by a
    16x8 one into float32 accumulators for the whole warp, 4096 flops in one instruction, where a
    warp-wide FMA does 64. numba has no tensor-core API, so four lines of CUDA C++ (hgemm_mma.cu)
    issue it, linked with cuda.declare_device(..., link=) and inlined at link time. A block computes a
    128x128 tile with 8 warps of 64x32 (4x4 mma tiles); the tiles travel by cp.async, double-buffered,
    zero-filled past the edges (and by plain 16-bit loads when K or N is not a multiple of 8). Each
    lane builds its fragments from shared memory 16 bits at a time, as the PTX fragment layout says: 24
    shared loads per 16 mma, and B's pairs come from two different rows. Their addresses crowd the
    registers: at 255 a thread ptxas still spills 184 bytes to local memory.""")
def mma(A, B, out):
    _run_stage("mma", A, B, out)


# -- 3. ldmatrix ----------------------------------------------------------------------------------------

@_stage("ldmatrix", """
    ldmatrix.x4 is the load made for mma: the warp reads four 8x8 matrices of 16-bit elements, each
    lane giving the address of one 16-byte row, and each lane receives exactly its fragment registers.
    One instruction loads a whole m16k16 A fragment; with .trans, one loads the B fragments of two n8
    tiles straight from B's row-major tile (the transpose the tensor core needs happens in the load).
    6 shared-memory instructions per 16 mma instead of 40, and each lane's addresses are computed once,
    before the K loop. What remains is bank conflicts: the tiles are plain row-major, so the 8 rows of
    one matrix (64 or 256 bytes apart) fall in the same banks.""")
def ldmatrix(A, B, out):
    _run_stage("ldmatrix", A, B, out)


# -- 4. swizzled shared layout ----------------------------------------------------------------------------

@_stage("swizzle", """
    The same kernel with the tiles' 16-byte chunks permuted: chunk c of row r is stored at position
    c XOR (r mod 8) (for A's 64-byte rows, two to a 128-byte line: c XOR (r/2 mod 4)). An ldmatrix
    phase reads one chunk from each of 8 consecutive rows: after the XOR those 8 chunks are in 8
    different bank groups, so the 4- and 8-way conflicts of the last stage are gone, and the cp.async
    writes stay conflict-free too. Padding each row would do the same at the cost of shared memory;
    the XOR costs two integer instructions per address and no bytes.""")
def swizzle(A, B, out):
    _run_stage("swizzle", A, B, out)


# -- 5. a deeper pipeline in dynamic shared memory ----------------------------------------------------------

@_stage("pipeline", """
    Two buffers let one K-step's copy overlap one K-step's arithmetic; at tensor-core speed a 16 KiB
    step computes in less time than global memory takes to answer, so the warps wait at every barrier.
    Four buffers keep three steps in flight: cp.async.wait_group 2 waits only for the oldest. The four
    take 64 KiB, past the 48 KiB a block gets by default: workbench.shared_memory.set_max_dynamic_shared_memory
    raises the kernel's limit through the driver (numba-cuda has no call for it) before the launch asks
    for them as dynamic shared memory. Two 64 KiB blocks still fit on an SM (227 KiB). Measured, it
    bought nothing: at 8192^3 on an H200 it ran within 2-3% of swizzle, either way. The likely reason,
    not profiled: swizzle already runs two blocks per SM, and while one waits at its barrier the other's
    warps compute, so the second block hides most of the copy latency the deeper ring was meant to hide;
    the ring's 128 KiB of shared memory per SM also leaves the L1 cache less room.""")
def pipeline(A, B, out):
    _run_stage("pipeline", A, B, out)


# -- 6. the tuned tile ------------------------------------------------------------------------------------

@_stage("tuned", """
    A bigger tile and a launch order for the cache. The warp tile grows from 64x32 to 64x64 (4 x 8 mma
    tiles, 128 float32 accumulators a lane) and the block tile to 128x256: per k16 step a warp issues 8
    ldmatrix for 32 mma where stage 5 issued 6 for 16, a third less shared-memory traffic per flop, and
    each block reads A once for 256 columns instead of 128; the K-step doubles to 64, so a block waits
    on half as many barriers. The price is registers (about 250 a thread: one block per SM) and fewer
    warps to hide latency, covered by three stages of 48 KiB in flight (144 KiB). The blocks are
    launched in bands of 8 tile rows walked column by column (block_tile), so the blocks on the GPU at
    one time share their A and B panels in L2 instead of streaming B from memory for every tile row. The
    numbers (tile, warp tile, K-step, stages, band) are TUNED, chosen among many by
    scripts/gpu_hgemm_sweep.py on an H200: 305 TFLOP/s at 8192^3 fp16, 41% of cuBLAS's 745 in the same
    run.""")
def tuned(A, B, out):
    _run_stage("tuned", A, B, out)


def stage_kernels(name):
    """{(bf16, vec): kernel} of a tensor-core stage (for the tests' compile checks and the GPU scripts)."""
    geometry, ldmatrix, swizzle = TENSOR_CORE_STAGES[name]
    return {(bf16, vec): build_kernel(geometry, bf16, vec, ldmatrix, swizzle)
            for bf16 in (False, True) for vec in (True, False)}


# The kernels every stage launches, by stage name, and the stages past 48 KiB of shared memory.
KERNELS = {"cuda_core": {None: _cuda_core}, **{name: stage_kernels(name) for name in TENSOR_CORE_STAGES}}
DYNAMIC_BYTES = {name: g.smem_bytes for name, (g, _, _) in TENSOR_CORE_STAGES.items() if g.smem_bytes > STATIC_LIMIT}
