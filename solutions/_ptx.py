"""The PTX instructions numba lacks, as device functions the low-precision GEMM kernels call.

On a GPU each name is a foreign function declared from CUDA C++ (``hgemm_mma.cu``, ``int8_gemm.cu``)
with ``cuda.declare_device(..., link=)``: one PTX instruction, inlined at link time. In numba's CUDA
simulator, which cannot link C++, each name is instead a Python emulation of what the instruction
does, so the tensor-core kernels run on a CPU too and every address, edge and pipeline step of them
is checked there:

* the warp-wide instructions (``mma.sync``, ``ldmatrix``) gather the 32 lanes of the calling warp at
  a barrier, compute the whole warp's result from the fragment layouts of the PTX ISA (written out
  once below, in :func:`mma_a_element` and friends), and hand each lane its share;
* ``cp.async`` is emulated *asynchronously*: a copy is recorded when issued and lands in shared memory
  only when ``cp_async_wait_pending`` retires its group, so a kernel that reads a buffer before
  waiting for it reads stale data in the simulator as it would on the GPU;
* addresses are the integers a kernel computes (``array.ctypes.data`` + byte offset), read and written
  with ``ctypes``: the simulator's arrays are NumPy arrays in this process.

This module is shared by ``gemm[fp16]``, ``gemm[int8]``, ``gemm`` (its deep-pipeline TF32 stage) and the
tensor-core attention (``_flash_mma``: fp16/bf16, and float32 in 3xTF32: ``split_tf32``, ``mma_3xtf32``)
and the all-reduce's one-shot push (``mailbox_*`` from ``mailbox.cu``: volatile 16-byte loads and stores);
it is not a ladder (its name starts with ``_``, so the registry skips it).
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from workbench import device as _device

HERE = os.path.dirname(os.path.abspath(__file__))
HGEMM_CU = os.path.join(HERE, "hgemm_mma.cu")
INT8_CU = os.path.join(HERE, "int8_gemm.cu")
MAILBOX_CU = os.path.join(HERE, "mailbox.cu")

WARP = 32


# -- the fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" and "... m16n8k32") -------------
# Lane l of a warp, g = l // 4 (its "group"), q = l % 4 (its place in the group). Each register holds
# two 16-bit elements (f16/bf16; element 0 in the low half) or four 8-bit ones (s8; element 0 in the
# low byte), consecutive along k. These functions are the hardware's contract; the kernels in
# hgemm.py / int8_gemm.py compute their own addresses, and tests/test_hgemm.py checks the two agree.

def mma_a_element(lane, reg, e, per_reg=2):
    """(row, k) of element e of A-fragment register reg (0..3) of lane, for an m16 x k(8 * per_reg) tile:
    reg 0: row g, reg 1: row g + 8, reg 2: row g and k + 8 per_reg / 2... i.e. registers 2, 3 are the
    second half of the k range."""
    g, q = lane // 4, lane % 4
    row = g + 8 * (reg % 2)
    k = per_reg * q + e + 4 * per_reg * (reg // 2)
    return row, k


def mma_b_element(lane, reg, e, per_reg=2):
    """(k, col) of element e of B-fragment register reg (0..1): column g, k = per_reg q + e (+ 4 per_reg)."""
    g, q = lane // 4, lane % 4
    return per_reg * q + e + 4 * per_reg * reg, g


def mma_c_element(lane, i):
    """(row, col) of accumulator i (0..3) of lane in the 16x8 tile: c0, c1 on row g, c2, c3 on row g + 8,
    columns 2q and 2q + 1."""
    g, q = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * q + i % 2


# -- the emulations ------------------------------------------------------------------------------------

class _Meeting:
    """One warp-wide instruction: the 32 lanes' operands, and the results the last lane to arrive computes."""

    def __init__(self, width=WARP):
        self.inputs = [None] * width
        self.arrived = 0
        self.outputs = None
        self.error = None
        self.done = threading.Event()


_MEETINGS: dict = {}  # warp key -> the meeting its lanes are gathering at now
_MEETINGS_LOCK = threading.Lock()
_COPIES = threading.local()  # this simulated thread's cp.async state
_WAIT_SECONDS = 300  # a lane that never arrives (a missing .sync.aligned call) ends the wait with an error


def block_key():
    """The calling simulated thread's block: the simulator's block object where there is one, so that
    state a failed launch left half built is never joined by a later launch's block with the same index."""
    t = threading.current_thread()
    if getattr(t, "thread_id", None) is None:
        raise RuntimeError("a warp-wide instruction was called outside a simulated kernel")
    return getattr(t, "sim_block", None) or tuple(t.blockIdx)


def _whoami(width=WARP):
    """(group key, place in the group) of the calling simulated thread (one Python thread per CUDA
    thread), for groups of ``width`` consecutive threads: a warp (32), a warpgroup (128)."""
    block = block_key()
    tid = threading.current_thread().thread_id
    return (block, width, tid // width), tid % width


def _warp_collective(value, combine):
    return group_collective(value, combine, WARP)


def group_collective(value, combine, width):
    """Every thread of the calling group of ``width`` threads (a warp, or the warpgroup of wgmma) passes
    ``value``; ``combine(values of threads 0..width-1)`` returns their results, of which each thread gets
    its own. All of them must call (as .sync.aligned requires).

    One wait per lane: the last lane to arrive takes the meeting out of ``_MEETINGS`` (a lane that goes
    straight on to its next instruction starts a new one and overwrites nothing a slower lane still
    reads), computes every lane's result and wakes the others."""
    key, lane = _whoami(width)
    with _MEETINGS_LOCK:
        meeting = _MEETINGS.get(key)
        if meeting is None:
            meeting = _MEETINGS[key] = _Meeting(width)
        meeting.inputs[lane] = value
        meeting.arrived += 1
        last = meeting.arrived == width
        if last:
            del _MEETINGS[key]
    if last:
        try:
            meeting.outputs = combine(meeting.inputs)
        except BaseException as error:
            meeting.error = error
            raise
        finally:
            meeting.done.set()
    else:
        _wait_for_the_group(meeting, lane, width)
    if meeting.error is not None:
        raise RuntimeError(f"lane {lane}: the warp-wide instruction failed in another lane") from meeting.error
    return meeting.outputs[lane]


_GROUP_POLL_SECONDS = 0.05


def _wait_for_the_group(meeting, lane, width):
    """Wait for the last lane of the meeting, or stop at once if the block has failed meanwhile (another of
    its threads raised, or another block of its cluster did): a thread left waiting here would run on
    after its launch has returned."""
    block = getattr(threading.current_thread(), "sim_block", None)
    waited = 0.0
    while not meeting.done.wait(_GROUP_POLL_SECONDS):
        waited += _GROUP_POLL_SECONDS
        if getattr(block, "failure", None) is not None:
            raise RuntimeError(f"lane {lane}: stopped, another thread of the block or cluster failed")
        if waited >= _WAIT_SECONDS:
            raise RuntimeError(f"lane {lane}: the other threads of its group did not all reach this {width}-thread "
                               f"instruction within {_WAIT_SECONDS} s (all {width} must call it)")


def _read(address, nbytes):
    return np.frombuffer(ctypes.string_at(int(address), int(nbytes)), np.uint8)


def _halves(words):
    """32-bit registers -> their 16-bit elements (low half first), as uint16."""
    return np.asarray(words, np.uint32).view(np.uint16)


def _bytes(words):
    return np.asarray(words, np.uint32).view(np.int8)


def _f16_values(bits):
    return bits.view(np.float16).astype(np.float32)


def _bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fragment_places(element, registers, per_reg):
    """Index arrays (rows, cols), each lanes x (registers * per_reg), of a fragment's elements in its tile:
    the tables above, evaluated once, so that a warp's fragments are scattered with one NumPy assignment."""
    places = [[element(lane, reg, e) for reg in range(registers) for e in range(per_reg)] for lane in range(WARP)]
    places = np.array(places)
    return places[..., 0], places[..., 1]


_A_PLACES = {per_reg: _fragment_places(lambda l, r, e, p=per_reg: mma_a_element(l, r, e, p), 4, per_reg)
             for per_reg in (1, 2, 4)}  # 1: TF32, one 32-bit element a register (m16n8k8)
_B_PLACES = {per_reg: _fragment_places(lambda l, r, e, p=per_reg: mma_b_element(l, r, e, p), 2, per_reg)
             for per_reg in (1, 2, 4)}
_C_PLACES = _fragment_places(lambda l, i, _: mma_c_element(l, i), 4, 1)


def _emulate_mma(regs_of_lanes, per_reg, decode, acc_dtype):
    """The product of one m16n8k(8 per_reg) mma from 32 lanes' (a regs, b regs, c values). ``decode``
    turns registers (an array of uint32 words, one row per lane) into their elements, in register order."""
    K = 8 * per_reg
    A = np.zeros((16, K), np.float64)
    B = np.zeros((K, 8), np.float64)
    C = np.zeros((16, 8), np.float64)
    a_regs, b_regs, c_values = zip(*regs_of_lanes)
    A[_A_PLACES[per_reg]] = decode(np.array(a_regs).astype(np.uint32))
    B[_B_PLACES[per_reg]] = decode(np.array(b_regs).astype(np.uint32))
    C[_C_PLACES] = np.array(c_values, np.float64).reshape(WARP, 4)
    if acc_dtype == np.int32:
        D = (A.astype(np.int64) @ B.astype(np.int64) + C.astype(np.int64)).astype(np.int32)
    else:
        D = (A.astype(np.float32) @ B.astype(np.float32) + C.astype(np.float32)).astype(np.float32)
    return [tuple(lane) for lane in D[_C_PLACES]]


def _sim_mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_collective(((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)),
                            lambda lanes: _emulate_mma(lanes, 2, lambda w: _f16_values(_halves(w)), np.float32))


def _sim_mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_collective(((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)),
                            lambda lanes: _emulate_mma(lanes, 2, lambda w: _bf16_values(_halves(w)), np.float32))


def _sim_mma_s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_collective(((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)),
                            lambda lanes: _emulate_mma(lanes, 4, lambda w: _bytes(w).astype(np.float64),
                                                       np.int32))


def _tf32_values(words):
    """float32 bit patterns (uint32) as a TF32 tensor core reads them: the low 13 mantissa bits ignored."""
    return (np.asarray(words, np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def _float_bits(values):
    return np.asarray(values, np.float32).view(np.uint32)


def _round_to_tf32(x):
    """cvt.rna.tf32.f32: x rounded to 10 mantissa bits, ties away from zero (finite x)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _sim_split_tf32(x):
    x = np.float32(x)
    big = _round_to_tf32(x)
    return big, _round_to_tf32(np.float32(x - big))


def _sim_split_tf32_bits(bits):
    return _sim_split_tf32(np.array(bits, np.uint32).view(np.float32))


def _sim_mma_3xtf32(a0, a1, a2, a3, as0, as1, as2, as3, b0, b1, bs0, bs1, c0, c1, c2, c3):
    def product(lanes):  # each lane: (a big, a small, b big, b small, c)
        def mma(a, b, c):  # one TF32 mma of every lane's fragments a, b (positions in the lane's tuple)
            return _emulate_mma([(_float_bits(lane[a]), _float_bits(lane[b]), acc) for lane, acc in zip(lanes, c)],
                                1, _tf32_values, np.float32)
        c = [lane[4] for lane in lanes]
        c = mma(1, 2, c)  # a_small b_big
        c = mma(0, 3, c)  # a_big b_small
        return mma(0, 2, c)  # a_big b_big
    return _warp_collective(((a0, a1, a2, a3), (as0, as1, as2, as3), (b0, b1), (bs0, bs1), (c0, c1, c2, c3)),
                            product)


def _emulate_ldmatrix(addresses, trans):
    """Lane l addressed row l % 8 of matrix l // 8; lane t gets, of each matrix, the 32-bit pair at
    row t // 4, columns 2 (t % 4), +1 (of the transposed matrix with trans). Row-major, those pairs are
    the 8x8 matrix read as 32 little-endian words, word t for lane t."""
    words = np.empty((WARP, 4), np.uint32)
    for j in range(4):
        m = np.stack([_read(addresses[8 * j + r], 16).view(np.uint16) for r in range(8)])
        if trans:
            m = m.T
        words[:, j] = np.ascontiguousarray(m).view(np.uint32).reshape(WARP)
    return [tuple(lane) for lane in words]


def _sim_ldmatrix_x4(shared_row):
    return _warp_collective(int(shared_row), lambda lanes: _emulate_ldmatrix(lanes, False))


def _sim_ldmatrix_x4_trans(shared_row):
    return _warp_collective(int(shared_row), lambda lanes: _emulate_ldmatrix(lanes, True))


def _copy_state():
    if not hasattr(_COPIES, "issued"):
        _COPIES.issued = []  # copies not yet committed to a group
        _COPIES.groups = []  # committed groups, oldest first
    return _COPIES


def _sim_cp_async(shared_dst, global_src, src_bytes, size):
    data = np.zeros(size, np.uint8)
    if src_bytes:
        data[:src_bytes] = _read(global_src, src_bytes)  # global memory does not change during a kernel
    _copy_state().issued.append((int(shared_dst), data.tobytes()))
    return 0


def _sim_cp_async_chunk16(shared_dst, global_src, src_bytes):
    return _sim_cp_async(shared_dst, global_src, src_bytes, 16)


def _sim_cp_async_chunk4(shared_dst, global_src, src_bytes):
    return _sim_cp_async(shared_dst, global_src, src_bytes, 4)


def _sim_cp_async_commit():
    state = _copy_state()
    state.groups.append(state.issued)
    state.issued = []
    return 0


def _sim_cp_async_wait_pending(pending):
    state = _copy_state()
    while len(state.groups) > pending:  # the oldest groups land; the newest `pending` stay in flight
        for dst, data in state.groups.pop(0):
            ctypes.memmove(dst, data, len(data))
    return 0


def _sim_pack_f16x2(lo, hi):
    bits = np.array([lo, hi], np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    return np.uint32(bits[0] | (bits[1] << 16))


def round_to_bf16_bits(x):
    """float32 values -> bfloat16 bit patterns (uint32), rounded to nearest, ties to even (finite x)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32)


def _sim_pack_bf16x2(lo, hi):
    bits = round_to_bf16_bits(np.array([lo, hi], np.float32))
    return np.uint32(bits[0] | (bits[1] << 16))


def _sim_dp4a_s8(a, b, c):
    # Plain integers: called once per multiply-add of four bytes, NumPy's per-call cost would dominate.
    a, b, total = int(a) & 0xFFFFFFFF, int(b) & 0xFFFFFFFF, int(c)
    for shift in (0, 8, 16, 24):
        x, y = (a >> shift) & 0xFF, (b >> shift) & 0xFF
        total += (x - ((x & 0x80) << 1)) * (y - ((y & 0x80) << 1))  # the bytes as signed int8
    return np.int32(total)


def _sim_ex2_approx_ftz(x):
    """2^x in float32, subnormal inputs and results flushed to zero (the hardware's is ~2 ulp from it)."""
    x = np.float32(x)
    if abs(x) < np.finfo(np.float32).tiny:
        x = np.float32(0.0)
    with np.errstate(over="ignore", under="ignore"):
        r = np.exp2(x, dtype=np.float32)
    return np.float32(0.0) if abs(r) < np.finfo(np.float32).tiny else r


def _sim_shared_address32(generic):
    # The simulator's shared arrays are NumPy arrays anywhere in this process: no 32-bit shared window.
    # Its "shared address" is the process address, which the *_s32 emulations below read and write;
    # kernels only ever add offsets to it (never truncate it), so they behave the same on both.
    return int(generic)


def _mailbox_words(values):
    """mailbox.cu's encoding: a float32 with its sign bit flipped, -0.0 first turned into +0.0."""
    v = np.asarray(values, np.float32) + np.float32(0.0)
    return v.view(np.uint32) ^ np.uint32(0x80000000)


def _sim_mailbox_store_f32x4(address, a, b, c, d):
    ctypes.memmove(int(address), _mailbox_words([a, b, c, d]).tobytes(), 16)
    return np.int32(0)


def _sim_mailbox_clear_f32x4(address):
    ctypes.memset(int(address), 0, 16)
    return np.int32(0)


def _sim_mailbox_wait_f32x4(address, max_polls):
    # The simulator runs one block at a time, so a word a later block writes never arrives while this
    # one waits: poll as the GPU would, then give up.
    for _ in range(int(max_polls) + 1):
        words = np.frombuffer(ctypes.string_at(int(address), 16), np.uint32)
        if np.all(words != 0):
            break
    values = (words ^ np.uint32(0x80000000)).view(np.float32)
    return (*(np.float32(v) for v in values), np.float32(0.0 if np.all(words != 0) else 1.0))


# -- what the kernels call -----------------------------------------------------------------------------

if _device.is_simulator():
    mma_f16 = _sim_mma_f16
    mma_bf16 = _sim_mma_bf16
    mma_s8 = _sim_mma_s8
    ldmatrix_x4 = _sim_ldmatrix_x4
    ldmatrix_x4_trans = _sim_ldmatrix_x4_trans
    cp_async_chunk16 = _sim_cp_async_chunk16
    cp_async_commit = _sim_cp_async_commit
    cp_async_wait_pending = _sim_cp_async_wait_pending
    pack_f16x2 = _sim_pack_f16x2
    pack_bf16x2 = _sim_pack_bf16x2
    dp4a_s8 = _sim_dp4a_s8
    ex2_approx_ftz = _sim_ex2_approx_ftz
    shared_address32 = _sim_shared_address32
    ldmatrix_x4_s32 = _sim_ldmatrix_x4
    ldmatrix_x4_trans_s32 = _sim_ldmatrix_x4_trans
    cp_async_chunk16_s32 = _sim_cp_async_chunk16
    cp_async_chunk4_s32 = _sim_cp_async_chunk4
    split_tf32 = _sim_split_tf32
    split_tf32_bits = _sim_split_tf32_bits
    mma_3xtf32 = _sim_mma_3xtf32
    mailbox_store_f32x4 = _sim_mailbox_store_f32x4
    mailbox_clear_f32x4 = _sim_mailbox_clear_f32x4
    mailbox_wait_f32x4 = _sim_mailbox_wait_f32x4
else:
    from numba import cuda

    _MMA_HALF = "UniTuple(float32, 4)(uint32, uint32, uint32, uint32, uint32, uint32, float32, float32, float32, float32)"
    mma_f16 = cuda.declare_device("mma_f16_m16n8k16", _MMA_HALF, link=HGEMM_CU)
    mma_bf16 = cuda.declare_device("mma_bf16_m16n8k16", _MMA_HALF, link=HGEMM_CU)
    mma_s8 = cuda.declare_device(
        "mma_s8_m16n8k32",
        "UniTuple(int32, 4)(uint32, uint32, uint32, uint32, uint32, uint32, int32, int32, int32, int32)",
        link=INT8_CU)
    ldmatrix_x4 = cuda.declare_device("ldmatrix_x4", "UniTuple(uint32, 4)(uint64)", link=HGEMM_CU)
    ldmatrix_x4_trans = cuda.declare_device("ldmatrix_x4_trans", "UniTuple(uint32, 4)(uint64)", link=HGEMM_CU)
    cp_async_chunk16 = cuda.declare_device("cp_async_chunk16", "int32(uint64, uint64, int32)", link=HGEMM_CU)
    cp_async_commit = cuda.declare_device("cp_async_commit", "int32()", link=HGEMM_CU)
    cp_async_wait_pending = cuda.declare_device("cp_async_wait_pending", "int32(int32)", link=HGEMM_CU)
    pack_f16x2 = cuda.declare_device("pack_f16x2", "uint32(float32, float32)", link=HGEMM_CU)
    pack_bf16x2 = cuda.declare_device("pack_bf16x2", "uint32(float32, float32)", link=HGEMM_CU)
    dp4a_s8 = cuda.declare_device("dp4a_s8", "int32(uint32, uint32, int32)", link=INT8_CU)
    ex2_approx_ftz = cuda.declare_device("ex2_approx_ftz", "float32(float32)", link=HGEMM_CU)
    shared_address32 = cuda.declare_device("shared_address32", "uint32(uint64)", link=HGEMM_CU)
    ldmatrix_x4_s32 = cuda.declare_device("ldmatrix_x4_s32", "UniTuple(uint32, 4)(uint64)", link=HGEMM_CU)
    ldmatrix_x4_trans_s32 = cuda.declare_device("ldmatrix_x4_trans_s32", "UniTuple(uint32, 4)(uint64)",
                                                link=HGEMM_CU)
    cp_async_chunk16_s32 = cuda.declare_device("cp_async_chunk16_s32", "int32(uint64, uint64, int32)",
                                               link=HGEMM_CU)
    cp_async_chunk4_s32 = cuda.declare_device("cp_async_chunk4_s32", "int32(uint64, uint64, int32)",
                                              link=HGEMM_CU)
    split_tf32 = cuda.declare_device("split_tf32", "UniTuple(float32, 2)(float32)", link=HGEMM_CU)
    split_tf32_bits = cuda.declare_device("split_tf32_bits", "UniTuple(float32, 2)(uint32)", link=HGEMM_CU)
    mma_3xtf32 = cuda.declare_device("mma_3xtf32_m16n8k8", "UniTuple(float32, 4)(" + ", ".join(["float32"] * 16) + ")",
                                     link=HGEMM_CU)
    mailbox_store_f32x4 = cuda.declare_device("mailbox_store_f32x4", "int32(uint64, float32, float32, float32, float32)",
                                              link=MAILBOX_CU)
    mailbox_clear_f32x4 = cuda.declare_device("mailbox_clear_f32x4", "int32(uint64)", link=MAILBOX_CU)
    mailbox_wait_f32x4 = cuda.declare_device("mailbox_wait_f32x4", "UniTuple(float32, 5)(uint64, int32)",
                                             link=MAILBOX_CU)
