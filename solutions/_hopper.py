"""Hopper's own instructions (sm_90a) as device functions numba kernels call: ``wgmma``, TMA, ``mbarrier``,
``setmaxnreg``, and those of thread-block clusters (TMA multicast, another block's mbarrier, the cluster
barrier).

On a GPU each one is a numba ``@intrinsic`` whose code is one ``llvmlite`` ``InlineAsm`` call: the PTX
instruction written out, its operands bound to LLVM values. No CUDA C++ is linked, and the kernel that
calls them stays Python. ``wgmma_m64n256k16`` takes the 128 float32 accumulators of a thread as a
``cuda.local.array``: the intrinsic loads them, passes them to the instruction as 128 ``"=f"`` outputs
tied to 128 inputs, and stores the results back; with constant indices LLVM keeps the whole array in
registers, so the accumulators never touch memory. Every other access to them must be at constant
indices too, so ``zero_accumulators`` and ``store_accumulators_*`` (the epilogue: round to the half type,
mask the edges, store) are intrinsics as well: a Python loop over the array would index it at run time
and send it to local memory for the whole kernel.

FlashAttention (``attention_tc.py``'s Hopper stages) uses sized variants, named in ``SIZED_WGMMA``:
m64n64k16 and m64n128k16 with a thread's n / 2 accumulators in a local array of any shape, A from a
descriptor (S = Q K^T, with B K-major: K's rows as stored) or from four 32-bit registers per thread
(O += P V: P stays where the softmax left it, in mma.sync's A-fragment layout, warp w holding rows
16w..16w+15), and scale-d as a run-time value (0: overwrite, so S needs no zeroing). After a wait,
``wgmma_fence_operands_N`` (an empty asm statement that rewrites N registers) keeps the compiler from
moving reads of the accumulators above the wait. ``named_barrier_sync`` / ``_arrive`` (bar.sync /
bar.arrive with an id and a thread count) let two warpgroups take turns.

``setmaxnreg`` takes effect only when ptxas compiles the kernel as a whole program: numba links kernels
with nvJitLink and link-time optimisation where nvJitLink is installed (its default), and then it does;
PTX linked without LTO is compiled as relocatable code, and ptxas ignores the instruction (C7504).

In numba's CUDA simulator each name is a Python emulation, as ``_ptx.py`` does for ``mma.sync``:

* ``wgmma`` gathers the 128 threads of the warpgroup, reads its A (64 x 16) and B (16 x 256) tiles out of
  shared memory *through the matrix descriptors*, applying the swizzle the descriptor declares, and
  scatters the product into each thread's accumulators in the PTX fragment layout. A descriptor with a
  wrong stride or swizzle reads the wrong elements there as it would on the GPU. (The one difference: a
  GPU descriptor holds a 14-bit shared-memory address; the simulator's shared arrays live anywhere in
  the process, so its descriptor keeps the address in bits 64 and up of a Python int.)
* ``mbarrier`` is a phase counter with pending arrivals and a transaction count; ``mbarrier_wait``
  blocks until the phase of the given parity has completed.
* a TMA copy (``tma_load_2d``) reads its box of the global tensor when it is issued (zero outside the
  tensor, swizzled as the tensor map says) and counts its bytes against the barrier, but the bytes land
  in shared memory only when a thread *waits* on the barrier and sees the copy's phase complete. A
  kernel that reads a TMA buffer before waiting on its barrier reads stale data.
* the sized wgmma reads B through its descriptor as K-major (n rows of 16 k) or MN-major, and A from
  the descriptor or from the 128 threads' registers, gathered by the fragment layout;
* a named barrier counts arrivals per block and id; bar.sync waits for its generation to complete;
* ``setmaxnreg`` and the fences do nothing (the simulator has no registers and one memory proxy);
* a cluster's blocks run side by side (``launch_in_clusters``; ``workbench.simulator.launches.in_clusters``),
  each with its own shared memory at the same alignment: ``cluster_ctarank`` is the block's rank,
  ``cluster_sync`` a barrier of all their threads, ``mbarrier_arrive_cluster`` arrives on the barrier at the
  same offset in another block's shared memory (PTX's ``mapa``), and ``tma_load_2d_multicast`` lands its box
  at the same offset in every block of its mask, counted off each block's own barrier.

Host side, :func:`tensor_map` builds the 128-byte ``CUtensorMap`` of a 2-D array with the driver's
``cuTensorMapEncodeTiled`` and copies it to a device buffer; ``cp.async.bulk.tensor`` takes its global
address (no ``__grid_constant__`` kernel parameter needed). Not a ladder (its name starts with ``_``).
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np
from numba import cuda, int32, uint32, uint64

from workbench import device as _device

WARPGROUP = 128
SWIZZLE_128B = 1  # the descriptor's 2-bit layout field (bits 62-63): 1 = 128-byte swizzle
SWIZZLE_BYTES = 128  # the rows of a 128B-swizzled tile; 8 of them (1024 bytes) make one swizzle atom


def swizzle_128b(address):
    """Where the 16-byte chunk at ``address`` really sits in a 128B-swizzled tile: address bits 4-6 (the
    chunk in its 128-byte row) XOR bits 7-9 (the row in its 8-row, 1024-byte atom). Tiles must start
    on 1024-byte boundaries for the kernel's offsets and the hardware's to agree."""
    return address ^ (((address >> 7) & 7) << 4)


def descriptor_fields(start, leading_bytes, stride_bytes, swizzle=SWIZZLE_128B):
    """The 64-bit shared-memory matrix descriptor of wgmma (PTX ISA, "Matrix Descriptor Format"):
    bits 0-13 the start address / 16, 16-29 the leading-dimension byte offset / 16, 32-45 the
    stride-dimension byte offset / 16, 62-63 the swizzle mode (base offset, bits 49-51, stays 0: tiles
    are 1024-byte aligned)."""
    return (((start & 0x3FFFF) >> 4) | ((leading_bytes >> 4) << 16) | ((stride_bytes >> 4) << 32)
            | (swizzle << 62))


# -- device functions the Hopper kernels share -------------------------------------------------------

@cuda.jit(device=True, forceinline=True)
def tile_of_block(tiles_m, tiles_n, raster):
    """(tile row, tile column) of this block of a 1-D grid: the tile rows in bands of ``raster``, each band
    walked column by column (hgemm's block_tile), in 32-bit unsigned arithmetic. Numba computes in 64
    bits, and ptxas implements a 64-bit division by a run-time number as a call to a subroutine; a call
    anywhere in a kernel makes ptxas serialise its wgmma (warning C7509). Unsigned 32-bit operands,
    zero-extended, let LLVM divide in 32 bits, inline."""
    block = uint32(cuda.blockIdx.x)
    per_group = uint32(uint32(raster) * uint32(tiles_n))
    first_row = uint32(block // per_group) * uint32(raster)
    rows = uint32(min(uint32(tiles_m) - first_row, uint32(raster)))
    within = uint32(block % per_group)
    return int32(first_row + within % rows), int32(within // rows)


@cuda.jit(device=True, forceinline=True)
def tile_pad(smem):
    """Bytes from the start of dynamic shared memory to its first 1024-byte boundary, where 128B-swizzled
    tiles must start (the swizzle is a function of address bits 7-9)."""
    at = smem.ctypes.data
    return int32(((at + uint64(1023)) & ~uint64(1023)) - at)


@cuda.jit(device=True, forceinline=True)
def advance_descriptor(desc, nbytes):
    """A shared-memory descriptor moved ``nbytes`` (a multiple of 16, >= 0) further: its start-address
    field is the address / 16 in bits 0-13, and a tile of shared memory (below 256 KiB) never carries
    out of them, so one addition replaces the cvta and the four bit operations of shared_descriptor."""
    return desc + uint64(nbytes >> 4)


# -- the simulator's emulations ----------------------------------------------------------------------

def _read(address, nbytes):
    return np.frombuffer(ctypes.string_at(int(address), int(nbytes)), np.uint8)


def _sim_descriptor(generic, leading_bytes, stride_bytes):
    # The start-address field left 0 and the process address kept above bit 64 (see the docstring).
    return descriptor_fields(0, int(leading_bytes), int(stride_bytes)) | (int(generic) >> 4 << 64)


def _sim_advance_descriptor(desc, nbytes):
    return int(desc) + (int(nbytes) >> 4 << 64)  # the simulator's start address lives above bit 64


def _decode(desc):
    desc = int(desc)
    start = (desc >> 64) << 4
    leading = ((desc >> 16) & 0x3FFF) << 4
    stride = ((desc >> 32) & 0x3FFF) << 4
    return start, leading, stride, (desc >> 62) & 3


def _values_at(addresses, dtype):
    """The values of ``dtype`` at an array of byte addresses, each read through the 128B swizzle."""
    dtype = np.dtype(dtype)
    out = np.empty(addresses.shape, dtype)
    for index, a in np.ndenumerate(addresses):
        out[index] = _read(swizzle_128b(int(a)), dtype.itemsize).view(dtype)[0]
    return out


def kmajor_addresses(desc, rows, k, elem):
    """Byte addresses (before the swizzle) of the rows x k tile a K-major descriptor points at: 8-row
    groups ``stride`` bytes apart, rows of one group 128 bytes apart (a swizzle atom), k contiguous in
    elements of ``elem`` bytes. (The leading-dimension offset is unused for a swizzled K-major operand.)"""
    start, _, stride, mode = _decode(desc)
    if mode != SWIZZLE_128B:
        raise ValueError(f"the emulated wgmma reads 128B-swizzled tiles; the descriptor says mode {mode}")
    r = np.arange(rows)[:, None]
    kk = np.arange(k)[None, :]
    return start + (r // 8) * stride + (r % 8) * SWIZZLE_BYTES + elem * kk


def a_tile_addresses(desc):
    """The 64 x 16 A tile (16-bit elements) of a wgmma m64nNk16."""
    return kmajor_addresses(desc, 64, 16, 2)


def b_tile_addresses(desc, n=256):
    """Byte addresses (before the swizzle) of the 16 x n B tile an MN-major descriptor points at (B
    row-major, read transposed): rows of 64 n-values (128 bytes) one after another, 8 k-rows an atom,
    atoms ``stride`` bytes apart along k and ``leading`` bytes apart along n (CUTLASS's canonical
    ((8, 8, n/64), (8, 2)) : ((1, 8, LBO), (64, SBO)) layout, in 16-bit elements)."""
    start, leading, stride, mode = _decode(desc)
    if mode != SWIZZLE_128B:
        raise ValueError(f"the emulated wgmma reads 128B-swizzled tiles; the descriptor says mode {mode}")
    k = np.arange(16)[:, None]
    col = np.arange(n)[None, :]
    return start + (col // 64) * leading + (k // 8) * stride + (k % 8) * SWIZZLE_BYTES + 2 * (col % 64)


def accumulator_place(thread, i):
    """(row, column) in the warpgroup's 64 x N tile of accumulator i of thread (0..127) of the
    warpgroup: warp w owns rows 16w..16w+15, and in each 8-column slice the thread holds what mma.sync's
    C fragment holds (rows g and g + 8, columns 2q and 2q + 1; g = lane // 4, q = lane % 4)."""
    warp, lane = thread // 32, thread % 32
    g, q = lane // 4, lane % 4
    return 16 * warp + g + 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * q + i % 2


_ACC_ROWS, _ACC_COLS = np.array([[accumulator_place(t, i) for i in range(128)] for t in range(WARPGROUP)]).transpose(2, 0, 1)


def _sim_wgmma(bf16):
    def values(bits):
        if bf16:
            return (bits.astype(np.uint32) << 16).view(np.float32)
        return bits.view(np.float16).astype(np.float32)

    def combine(threads):
        acc_arrays = [t[0] for t in threads]
        _, desc_a, desc_b = threads[0]
        if any(t[1] != desc_a or t[2] != desc_b for t in threads):
            raise RuntimeError("the threads of a warpgroup passed different descriptors to one wgmma")
        A = values(_values_at(a_tile_addresses(desc_a), np.uint16))
        B = values(_values_at(b_tile_addresses(desc_b), np.uint16))
        D = np.zeros((64, 256), np.float32)
        D[_ACC_ROWS, _ACC_COLS] = np.array([a[:128] for a in acc_arrays], np.float32)
        D = (D + A @ B).astype(np.float32)
        for t, acc in enumerate(acc_arrays):
            acc[:128] = D[_ACC_ROWS[t], _ACC_COLS[t]]
        return [None] * WARPGROUP

    def wgmma(acc, desc_a, desc_b):
        from solutions._ptx import group_collective
        group_collective((acc, int(desc_a), int(desc_b)), combine, WARPGROUP)
    return wgmma


def _sim_wgmma_s8(acc, desc_a, desc_b):
    """wgmma m64n256k32 .s32.s8.s8: both operands K-major (an 8-bit wgmma has no transpose), A 64 x 32
    and B as 256 rows (n) of 32 k; int32 accumulators, wrapping as the hardware's do."""
    def combine(threads):
        _, da, db = threads[0]
        if any(t[1] != da or t[2] != db for t in threads):
            raise RuntimeError("the threads of a warpgroup passed different descriptors to one wgmma")
        A = _values_at(kmajor_addresses(da, 64, 32, 1), np.int8).astype(np.int64)
        B = _values_at(kmajor_addresses(db, 256, 32, 1), np.int8).astype(np.int64)
        D = np.zeros((64, 256), np.int64)
        D[_ACC_ROWS, _ACC_COLS] = np.array([t[0][:128] for t in threads], np.int64)
        D = (D + A @ B.T).astype(np.int32)  # two's-complement wrap, as int32 accumulators do
        for t, thread in enumerate(threads):
            thread[0][:128] = D[_ACC_ROWS[t], _ACC_COLS[t]]
        return [None] * WARPGROUP

    from solutions._ptx import group_collective
    group_collective((acc, int(desc_a), int(desc_b)), combine, WARPGROUP)


def _sim_wgmma_sized(bf16, n, a_in_registers, b_transposed):
    """wgmma m64n{n}k16 with float32 accumulators (a thread's n / 2, any array shape, C order), A from a
    K-major descriptor or from registers (four 32-bit registers a thread: mma.sync's A fragment of its
    warp's 16 rows), B K-major (n rows of 16 k, as K's rows are for Q K^T) or MN-major (16 rows of n, as
    V's are for P V). ``accumulate`` 0 overwrites the accumulators (scale-d false)."""
    def values(bits):
        bits = np.asarray(bits, np.uint16)
        if bf16:
            return (bits.astype(np.uint32) << 16).view(np.float32)
        return bits.view(np.float16).astype(np.float32)

    rows, cols = _ACC_ROWS[:, :n // 2], _ACC_COLS[:, :n // 2]

    def a_from_registers(registers):
        """The 64 x 16 A tile from every thread's four registers: thread t of warp w, lane (g, q), holds
        rows 16w + g (registers 0, 2) and 16w + g + 8 (1, 3), k 2q, 2q + 1 (+ 8 in registers 2, 3), the
        lower k in the low 16 bits."""
        A = np.zeros((64, 16), np.uint16)
        for t, regs in enumerate(registers):
            g, q = (t % 32) // 4, t % 4
            for r, word in enumerate(regs):
                row, k = 16 * (t // 32) + g + 8 * (r % 2), 2 * q + 8 * (r // 2)
                A[row, k], A[row, k + 1] = int(word) & 0xFFFF, int(word) >> 16
        return A

    def combine(threads):
        shared = slice(2 if a_in_registers else 1, None)  # what every thread must pass alike
        if any(t[shared] != threads[0][shared] for t in threads):
            raise RuntimeError("the threads of a warpgroup passed different operands to one wgmma")
        _, a, desc_b, accumulate = threads[0]
        if a_in_registers:
            A = values(a_from_registers([t[1] for t in threads]))
        else:
            A = values(_values_at(a_tile_addresses(a), np.uint16))
        if b_transposed:
            B = values(_values_at(b_tile_addresses(desc_b, n), np.uint16))
        else:
            B = values(_values_at(kmajor_addresses(desc_b, n, 16, 2), np.uint16)).T
        D = np.zeros((64, n), np.float32)
        if accumulate:
            D[rows, cols] = np.array([t[0].reshape(-1) for t in threads], np.float32)
        D = (D + A @ B).astype(np.float32)
        for t, thread in enumerate(threads):
            thread[0].reshape(-1)[:] = D[rows[t], cols[t]]
        return [None] * WARPGROUP

    from solutions._ptx import group_collective
    if a_in_registers:
        def wgmma(acc, a0, a1, a2, a3, desc_b, accumulate):
            group_collective((acc, (int(a0), int(a1), int(a2), int(a3)), int(desc_b), int(accumulate)), combine,
                             WARPGROUP)
    else:
        def wgmma(acc, desc_a, desc_b, accumulate):
            group_collective((acc, int(desc_a), int(desc_b), int(accumulate)), combine, WARPGROUP)
    return wgmma


def _sim_store_accumulators_s32(acc, address, pitch, rows_left, cols_left):
    address, pitch, rows_left, cols_left = int(address), int(pitch), int(rows_left), int(cols_left)
    for j in range(32):
        for h in range(2):
            for e in range(2):
                if 8 * h < rows_left and 8 * j + e < cols_left:
                    value = np.int32(acc[4 * j + 2 * h + e])
                    ctypes.memmove(address + 8 * h * pitch + 32 * j + 4 * e, value.tobytes(), 4)


def _nothing(*_args):
    return None


def _sim_zero_accumulators(acc):
    acc[:128] = 0


def _sim_store_accumulators(pack):
    def store(acc, address, pitch, rows_left, cols_left, pairs):
        address, pitch, rows_left, cols_left = int(address), int(pitch), int(rows_left), int(cols_left)
        for j in range(32):
            for h in range(2):
                if 8 * h < rows_left and 8 * j < cols_left:
                    packed = int(pack(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]))
                    at = address + 8 * h * pitch + 16 * j
                    if pairs or 8 * j + 1 < cols_left:
                        ctypes.memmove(at, packed.to_bytes(4, "little"), 4)
                    else:
                        ctypes.memmove(at, packed.to_bytes(4, "little"), 2)
    return store


class _Barrier:
    """One mbarrier: ``pending`` arrivals and ``tx`` transaction bytes still owed by the current phase,
    and the copies waiting for their phase to be observed complete before they land."""

    def __init__(self, count):
        self.count = self.pending = int(count)
        self.tx = 0
        self.phase = 0  # phases completed so far
        self.copies = {}  # phase -> [(shared address, bytes)] to land when a waiter sees it complete
        # For the race checker: what the current phase's arrivals released (an arrive is a release), and
        # what all completed phases released (a wait that sees a phase complete acquires it)
        self.arrived = self.released = None


_BARRIERS: dict = {}
_BARRIERS_CHANGED = threading.Condition()
_WAIT_SECONDS = 300


def _barrier(address):
    from solutions._ptx import block_key
    return _barrier_of(block_key(), int(address))


def _barrier_of(block, address):
    try:
        return _BARRIERS[(id(block), address)]
    except KeyError:
        raise RuntimeError(f"mbarrier at {address:#x} used before mbarrier_init") from None


def _aborted():
    """Has the calling thread's block failed (another of its cluster did, or one of its own threads)?"""
    return getattr(getattr(threading.current_thread(), "sim_block", None), "failure", None) is not None


def _raise_if_aborted():
    if _aborted():
        raise RuntimeError("stopped: another thread of the block or cluster failed")


def _complete_if_done(bar):
    if bar.pending == 0 and bar.tx == 0:
        bar.phase += 1
        bar.pending = bar.count
        if bar.arrived is not None:
            bar.released = bar.arrived if bar.released is None else bar.released.merged(bar.arrived)
            bar.arrived = None
        _BARRIERS_CHANGED.notify_all()


def _release_at(bar):
    """mbarrier.arrive has release semantics: what the arriving thread (and its block, up to its last
    syncthreads) did before it happens before whatever a thread does after waiting for the phase, so the
    race checker must not call a shared-memory write before the arrive and a read after the wait a race."""
    from workbench.simulator.races import Knowledge, NOTHING, current
    clock = current.clock
    if clock is None:  # race checking is off
        return
    clock.fences += 1  # as a fence: the thread's accesses so far are the ones released
    own = Knowledge({clock.block: (current.block.barrier_generation, {clock.tid: clock.fences})})
    mine = clock.known.merged(own) if clock.known is not NOTHING else own
    bar.arrived = mine if bar.arrived is None else bar.arrived.merged(mine)


def _acquire_from(bar):
    from workbench.simulator.races import current
    if current.clock is not None and bar.released is not None:
        current.clock.acquire(bar.released)


def _sim_mbarrier_init(address, count):
    from solutions._ptx import block_key
    with _BARRIERS_CHANGED:
        _BARRIERS[(id(block_key()), int(address))] = _Barrier(count)


def _sim_mbarrier_arrive_expect_tx(address, nbytes):
    with _BARRIERS_CHANGED:
        bar = _barrier(address)
        bar.tx += int(nbytes)
        bar.pending -= 1
        _release_at(bar)
        _complete_if_done(bar)


def _sim_mbarrier_arrive(address):
    with _BARRIERS_CHANGED:
        bar = _barrier(address)
        bar.pending -= 1
        _release_at(bar)
        _complete_if_done(bar)


def _sim_mbarrier_wait(address, parity):
    """Block until the phase of parity ``parity`` has completed (the current phase's parity differs: a
    barrier in phase 0 is past 'the phase of parity 1', so that wait returns at once, as on the GPU),
    then land the copies of every completed phase."""
    with _BARRIERS_CHANGED:
        bar = _barrier(address)
        if not _BARRIERS_CHANGED.wait_for(lambda: bar.phase % 2 != int(parity) % 2 or _aborted(), _WAIT_SECONDS):
            raise RuntimeError(f"mbarrier_wait(parity {int(parity)}) waited {_WAIT_SECONDS} s: a missing arrive, "
                               "or a transaction count that never reaches zero")
        _raise_if_aborted()
        _acquire_from(bar)
        for phase in sorted(p for p in bar.copies if p < bar.phase):
            for dst, data in bar.copies.pop(phase):
                ctypes.memmove(dst, data, len(data))


_NAMED: dict = {}  # (block, barrier id) -> [threads arrived in this generation, generations completed]


def _named_arrive(barrier, count):
    """One thread arrives at named barrier ``barrier`` of its block; the count-th arrival completes the
    generation. Returns (the state, the generation this thread arrived in)."""
    from solutions._ptx import block_key
    return _named_arrive_at((id(block_key()), int(barrier)), count)


def _named_arrive_at(key, count):
    state = _NAMED.setdefault(key, [0, 0])
    generation = state[1]
    state[0] += 1
    if state[0] == int(count):
        state[0] = 0
        state[1] += 1
        _BARRIERS_CHANGED.notify_all()
    return state, generation


def _sim_named_barrier_sync(barrier, count):
    """bar.sync: arrive, then wait until ``count`` threads (this one included) have arrived."""
    with _BARRIERS_CHANGED:
        state, generation = _named_arrive(barrier, count)
        if not _BARRIERS_CHANGED.wait_for(lambda: state[1] != generation, _WAIT_SECONDS):
            raise RuntimeError(f"bar.sync {int(barrier)}, {int(count)} waited {_WAIT_SECONDS} s: fewer threads "
                               "arrived than the count")


def _sim_named_barrier_arrive(barrier, count):
    """bar.arrive: count towards the barrier's generation without waiting for it."""
    with _BARRIERS_CHANGED:
        _named_arrive(barrier, count)


# The simulator's tensor map: 16 uint64 words instead of the driver's opaque 128 bytes. Word 0 names the
# global array (a handle into _SIM_TENSORS: a simulated device array's address may not be read on the
# host), then the element size, the two dimensions (inner first), the outer stride in bytes and the box.
_SIM_TENSORS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def _box_as_landed(dst, tensor_map, inner, outer):
    """The bytes a TMA copy of the box at (inner, outer) writes from shared address ``dst`` on: the box read
    from the global tensor (zero outside it), each 16-byte chunk at its 128B-swizzled place."""
    words = np.frombuffer(ctypes.string_at(int(tensor_map), 128), np.uint64)
    handle, elem, dim0, dim1, stride1, box0, box1 = (int(w) for w in words[:7])
    array = _SIM_TENSORS[handle]
    base = array.ctypes.data  # inside a kernel: the simulated device memory, as the copy engine reads it
    inner, outer = int(inner), int(outer)
    row_bytes = box0 * elem
    box = np.zeros((box1, row_bytes), np.uint8)
    for r in range(box1):
        y = outer + r
        if 0 <= y < dim1:
            lo, hi = max(inner, 0), min(inner + box0, dim0)  # zero outside the tensor, as the copy engine fills
            if hi > lo:
                box[r, (lo - inner) * elem:(hi - inner) * elem] = _read(base + y * stride1 + lo * elem, (hi - lo) * elem)
    landed = np.empty(box1 * row_bytes, np.uint8)
    dst = int(dst)
    for r in range(box1):  # 128B swizzle: each 16-byte chunk at its swizzled address
        for c in range(row_bytes // 16):
            at = swizzle_128b(dst + r * row_bytes + 16 * c) - dst
            landed[at:at + 16] = box[r, 16 * c:16 * c + 16]
    return landed.tobytes()


def _land_later(bar, dst, data):
    """Count a copy's bytes off ``bar``'s current phase; the bytes land when a waiter sees that phase complete."""
    bar.copies.setdefault(bar.phase, []).append((dst, data))
    bar.tx -= len(data)
    _complete_if_done(bar)


def _sim_tma_load_2d(dst, tensor_map, inner, outer, bar_address):
    data = _box_as_landed(dst, tensor_map, inner, outer)
    with _BARRIERS_CHANGED:
        _land_later(_barrier(bar_address), int(dst), data)


# -- thread-block clusters ------------------------------------------------------------------------------
#
# The simulator runs the blocks of a cluster side by side (workbench.simulator's in_clusters), each with its
# own shared memory at the same alignment, so "the same offset in block r's shared memory" (PTX's mapa) is
# an address computed from the two blocks' bases.

def _cluster_of_caller():
    """(the calling thread's block, its cluster's blocks by rank): a block launched without a cluster is a
    cluster of one."""
    block = threading.current_thread().sim_block
    cluster = getattr(block, "cluster", None)
    return block, (cluster.blocks if cluster is not None else [block])


def _in_block(address, rank):
    """(block, address) of ``address`` (a shared address of the calling block) mapped into the shared memory
    of block ``rank`` of its cluster, as mapa.shared::cluster does."""
    block, blocks = _cluster_of_caller()
    rank = int(rank)
    if not 0 <= rank < len(blocks):
        raise RuntimeError(f"block rank {rank} is outside the cluster of {len(blocks)} blocks")
    own = block.sim_shared_base
    if own is None:
        return block, int(address)
    return blocks[rank], int(address) - own + blocks[rank].sim_shared_base


def _sim_cluster_ctarank():
    block, _ = _cluster_of_caller()
    return uint32(getattr(block, "cluster_rank", 0))


def _sim_cluster_sync():
    """barrier.cluster.arrive.release + wait.acquire: every thread of every block of the cluster arrives,
    then waits for the others (a launch without clusters: the threads of the block)."""
    block, blocks = _cluster_of_caller()
    key = ("cluster", id(blocks[0]))
    with _BARRIERS_CHANGED:
        state, generation = _named_arrive_at(key, sum(len(b.threads) for b in blocks))
        if not _BARRIERS_CHANGED.wait_for(lambda: state[1] != generation or _aborted(), _WAIT_SECONDS):
            raise RuntimeError(f"barrier.cluster waited {_WAIT_SECONDS} s: a thread of the cluster never arrived")
        _raise_if_aborted()


def _sim_mbarrier_arrive_cluster(address, rank):
    """mbarrier.arrive on the barrier at the same offset in block ``rank``'s shared memory (mapa)."""
    block, at = _in_block(address, rank)
    with _BARRIERS_CHANGED:
        bar = _barrier_of(block, at)
        bar.pending -= 1
        _release_at(bar)
        _complete_if_done(bar)


def _sim_tma_load_2d_multicast(dst, tensor_map, inner, outer, bar_address, mask):
    """One copy of a box into the shared memory of every block of the cluster whose bit is set in ``mask``,
    each at the same offset, each counting the bytes off its own barrier at bar_address's offset."""
    data = _box_as_landed(dst, tensor_map, inner, outer)
    _, blocks = _cluster_of_caller()
    with _BARRIERS_CHANGED:
        for rank in range(len(blocks)):
            if int(mask) >> rank & 1:
                block, at = _in_block(dst, rank)
                _land_later(_barrier_of(block, _in_block(bar_address, rank)[1]), at, data)


# -- host side: tensor maps -----------------------------------------------------------------------------

_MAPS: dict = {}  # (address, shape, strides, box) -> device buffer: built once per buffer and box


def tensor_map(array, box_inner, box_outer):
    """A device buffer holding the tensor map of the 2-D row-major array ``array`` of 8- or 16-bit
    elements, copied by boxes of ``box_outer`` rows x ``box_inner`` elements (128 bytes: the 128B
    swizzle's row), 128B-swizzled, zero-filled outside the array. Rows must be a multiple of 16 bytes
    long and the array 16-byte aligned (the copy engine's rule; launchers check :func:`tma_ok`)."""
    from numba import cuda

    rows, cols = array.shape
    elem = np.dtype(array.dtype).itemsize
    if _device.is_simulator():
        key = (id(array), array.shape, box_inner, box_outer)
        # Registered on every call: a map cached for an array since freed may come back for a new array
        # that got the same id, and must then read the new one.
        _SIM_TENSORS[id(array)] = array
        if key not in _MAPS:
            words = np.zeros(16, np.uint64)
            words[:7] = [id(array), elem, cols, rows, elem * cols, box_inner, box_outer]
            _MAPS[key] = cuda.to_device(words.view(np.uint8))
        return _MAPS[key]
    address = array.__cuda_array_interface__["data"][0]
    key = (address, array.shape, box_inner, box_outer)
    if key not in _MAPS:
        from cuda.bindings import driver

        kind = {1: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,
                2: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16}[elem]
        err, encoded = driver.cuTensorMapEncodeTiled(
            kind, 2, address, [driver.cuuint64_t(cols), driver.cuuint64_t(rows)], [driver.cuuint64_t(elem * cols)],
            [driver.cuuint32_t(box_inner), driver.cuuint32_t(box_outer)], [driver.cuuint32_t(1)] * 2,
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed: {err.name}")
        raw = np.frombuffer(ctypes.string_at(encoded.getPtr(), 128), np.uint8).copy()
        _MAPS[key] = cuda.to_device(raw)
    return _MAPS[key]


# -- host side: launching in clusters ----------------------------------------------------------------------

def launch_in_clusters(kernel, blocks_a_cluster, grid, threads, shared_bytes, args):
    """``kernel[grid, threads, 0, shared_bytes](*args)`` with its blocks grouped in thread-block clusters of
    ``blocks_a_cluster`` consecutive blocks along x (grid a multiple of it). numba's launch has no cluster
    parameter: on the GPU the launch is the driver's cuLaunchKernelEx with the cluster-dimension attribute
    (workbench.prepared.KernelLaunch); the simulator runs each cluster's blocks side by side."""
    if _device.is_simulator():
        from workbench.simulator.launches import in_clusters

        with in_clusters(blocks_a_cluster):
            kernel[grid, threads, 0, shared_bytes](*args)
        return
    from workbench.prepared import KernelLaunch

    KernelLaunch.of(kernel, grid, threads, args, shared_bytes, cluster=blocks_a_cluster).launch()


_ACTIVE_CLUSTERS: dict = {}


def clusters_that_fit(kernel, blocks_a_cluster, threads, shared_bytes, args, simulated):
    """How many clusters of ``blocks_a_cluster`` blocks the GPU runs at once (cuOccupancyMaxActiveClusters:
    a cluster's blocks must find room on SMs of one GPC together), the grid of a persistent kernel of
    clusters; ``simulated`` in the simulator."""
    if _device.is_simulator():
        return simulated
    from workbench.prepared import KernelLaunch

    key = (id(kernel), blocks_a_cluster, threads, shared_bytes)
    if key not in _ACTIVE_CLUSTERS:
        launch = KernelLaunch.of(kernel, blocks_a_cluster, threads, args, shared_bytes, cluster=blocks_a_cluster)
        _ACTIVE_CLUSTERS[key] = launch.max_active_clusters()
    return _ACTIVE_CLUSTERS[key]


def tma_ok(*arrays) -> bool:
    """Can the copy engine read these 2-D arrays: rows a multiple of 16 bytes, 16-byte aligned?"""
    from solutions._tile_layout import aligned
    return all(a.shape[1] * np.dtype(a.dtype).itemsize % 16 == 0 for a in arrays) and aligned(16, *arrays)


# The sized wgmma variants FlashAttention uses (solutions/attention_tc.py's Hopper stage), by name:
# (bf16, n, A from registers, B transposed). S = Q K^T: A (Q) and B (K, n keys) from K-major tiles;
# O += P V: A (P) from registers, B (V, n = the head size) MN-major, as hgemm's B.
SIZED_WGMMA = {f"wgmma_{'bf16' if bf16 else 'f16'}_{what}_n{n}": (bf16, n, what == "rs", what == "rs")
               for bf16 in (False, True) for what in ("ss", "rs") for n in (64, 128)}
# S = Q K^T at key tiles of 96 or 112 (the persistent kernel's PERSISTENT_BKV_D64, swept)
SIZED_WGMMA.update({f"wgmma_{'bf16' if bf16 else 'f16'}_ss_n{n}": (bf16, n, False, False)
                    for bf16 in (False, True) for n in (96, 112)})
FENCED_COUNTS = (32, 48, 56, 64)  # wgmma_fence_operands_N: accumulator arrays of N float32 (n64, n96, n112, n128)
# setmaxnreg_dec_N / setmaxnreg_inc_N besides the 40 / 232 pair of setmaxnreg_producer / _consumer: a producer
# and three consumer warpgroups (attention's persistent kernel at D = 64: 32 + 3 x 160 = 4 x 128; 24 swept)
SETMAXNREG_COUNTS = (24, 32, 160)


# -- on the GPU: one inline-asm instruction each ------------------------------------------------------

def _gpu_intrinsics():
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    SHARED = "{ .reg .u64 s; cvta.to.shared.u64 s, $0; "  # generic address -> shared window, then the op

    def asm(builder, text, constraints, args=(), result=ir.VoidType()):
        fty = ir.FunctionType(result, [a.type for a in args])
        return builder.call(ir.InlineAsm(fty, text, constraints, side_effect=True), list(args))

    def statement(text, constraints="~{memory}"):
        """An intrinsic of no arguments that issues ``text``."""
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, sig, args):
                asm(builder, text, constraints)
                return context.get_dummy_value()
            return types.none(), codegen
        return op

    @intrinsic
    def shared_descriptor(typingctx, generic, leading_bytes, stride_bytes):
        """descriptor_fields of the shared-memory address of ``generic`` (uint64)."""
        def codegen(context, builder, sig, args):
            g, lead, stride = (context.cast(builder, v, t, types.uint64) for v, t in zip(args, sig.args))
            shared = asm(builder, "cvta.to.shared.u64 $0, $1;", "=l,l", [g], i64)
            desc = builder.lshr(builder.and_(shared, i64(0x3FFFF)), i64(4))
            desc = builder.or_(desc, builder.shl(builder.lshr(lead, i64(4)), i64(16)))
            desc = builder.or_(desc, builder.shl(builder.lshr(stride, i64(4)), i64(32)))
            return builder.or_(desc, i64(SWIZZLE_128B << 62))
        return types.uint64(generic, leading_bytes, stride_bytes), codegen

    def wgmma(kind):
        n = 128  # accumulators a thread: m64n256 / 128 threads
        regs = ", ".join(f"${i}" for i in range(n))
        if kind == "s8":  # an 8-bit wgmma takes both operands K-major and has no scale or transpose flags
            shape, tail, reg = "m64n256k32.s32.s8.s8", "p", "r"
        else:  # scale-d true (accumulate), A and B scaled by 1, A K-major, B transposed (MN-major)
            shape, tail, reg = f"m64n256k16.f32.{kind}.{kind}", "p, 1, 1, 0, 1", "f"
        text = ("{ .reg .pred p; setp.ne.b32 p, 1, 0; "
                f"wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, ${2 * n}, ${2 * n + 1}, {tail}; }}")
        constraints = ",".join([f"={reg}"] * n + [str(i) for i in range(n)] + ["l", "l"])
        element = i32 if kind == "s8" else f32

        @intrinsic
        def op(typingctx, acc, desc_a, desc_b):
            def codegen(context, builder, sig, args):
                arr = context.make_array(sig.args[0])(context, builder, args[0])
                places = [builder.gep(arr.data, [i64(i)]) for i in range(n)]
                values = [builder.load(p) for p in places]
                da, db = (context.cast(builder, v, t, types.uint64) for v, t in zip(args[1:], sig.args[1:]))
                out = asm(builder, text, constraints, values + [da, db], ir.LiteralStructType([element] * n))
                for i, p in enumerate(places):
                    builder.store(builder.extract_value(out, i), p)
                return context.get_dummy_value()
            return types.none(acc, desc_a, desc_b), codegen
        return op

    def wgmma_sized(kind, n, a_in_registers, b_transposed):
        """wgmma m64n{n}k16 .f32 with a thread's n / 2 accumulators in a local array (any shape, C order),
        A from a descriptor or from four 32-bit registers, B from a descriptor, K-major or transposed
        (MN-major); ``accumulate`` (an int at run time) is the scale-d predicate: 0 overwrites."""
        m = n // 2
        regs = ", ".join(f"${i}" for i in range(m))
        if a_in_registers:  # no transpose flag for A in registers: imm-scale-a, imm-scale-b, imm-trans-b
            a_text = f"{{${2 * m}, ${2 * m + 1}, ${2 * m + 2}, ${2 * m + 3}}}"
            extra, tail = 4, f"1, 1, {int(b_transposed)}"
        else:
            a_text, extra, tail = f"${2 * m}", 1, f"1, 1, 0, {int(b_transposed)}"
        b_at, flag_at = 2 * m + extra, 2 * m + extra + 1
        text = (f"{{ .reg .pred p; setp.ne.b32 p, ${flag_at}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
                f"{{{regs}}}, {a_text}, ${b_at}, p, {tail}; }}")
        constraints = ",".join(["=f"] * m + [str(i) for i in range(m)] + (["r"] * 4 if a_in_registers else ["l"])
                               + ["l", "r"])

        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            places = [builder.gep(arr.data, [i64(i)]) for i in range(m)]
            values = [builder.load(p) for p in places]
            if a_in_registers:
                a = [context.cast(builder, args[i], sig.args[i], types.uint32) for i in range(1, 5)]
            else:
                a = [context.cast(builder, args[1], sig.args[1], types.uint64)]
            b = context.cast(builder, args[-2], sig.args[-2], types.uint64)
            flag = context.cast(builder, args[-1], sig.args[-1], types.int32)
            out = asm(builder, text, constraints, values + a + [b, flag], ir.LiteralStructType([f32] * m))
            for i, p in enumerate(places):
                builder.store(builder.extract_value(out, i), p)
            return context.get_dummy_value()

        if a_in_registers:
            @intrinsic
            def op(typingctx, acc, a0, a1, a2, a3, desc_b, accumulate):
                return types.none(acc, a0, a1, a2, a3, desc_b, accumulate), codegen
        else:
            @intrinsic
            def op(typingctx, acc, desc_a, desc_b, accumulate):
                return types.none(acc, desc_a, desc_b, accumulate), codegen
        return op

    def fence_operands(n):
        """An empty inline-asm statement that takes n float32 values and gives them back ("+f"): placed
        after a wgmma wait, it makes every later use of the accumulators depend on something that comes
        after the wait, so the compiler cannot move a read of them above it (CUTLASS's
        warpgroup_fence_operand). No instruction is emitted."""
        constraints = ",".join(["=f"] * n + [str(i) for i in range(n)])

        @intrinsic
        def op(typingctx, acc):
            def codegen(context, builder, sig, args):
                arr = context.make_array(sig.args[0])(context, builder, args[0])
                places = [builder.gep(arr.data, [i64(i)]) for i in range(n)]
                out = asm(builder, "", constraints, [builder.load(p) for p in places], ir.LiteralStructType([f32] * n))
                for i, p in enumerate(places):
                    builder.store(builder.extract_value(out, i), p)
                return context.get_dummy_value()
            return types.none(acc), codegen
        return op

    def named_barrier(text):
        @intrinsic
        def op(typingctx, barrier, count):
            def codegen(context, builder, sig, args):
                b, n = (context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args))
                asm(builder, text, "r,r,~{memory}", [b, n])
                return context.get_dummy_value()
            return types.none(barrier, count), codegen
        return op

    def on_barrier(text, with_value):
        @intrinsic
        def op(typingctx, address, value):
            def codegen(context, builder, sig, args):
                a = context.cast(builder, args[0], sig.args[0], types.uint64)
                v = context.cast(builder, args[1], sig.args[1], types.uint32)
                asm(builder, SHARED + text + " }", "l,r,~{memory}", [a, v])
                return context.get_dummy_value()
            return types.none(address, value), codegen

        @intrinsic
        def op1(typingctx, address):
            def codegen(context, builder, sig, args):
                a = context.cast(builder, args[0], sig.args[0], types.uint64)
                asm(builder, SHARED + text + " }", "l,~{memory}", [a])
                return context.get_dummy_value()
            return types.none(address), codegen
        return op if with_value else op1

    @intrinsic
    def tma_load_2d(typingctx, dst, tensor_map_address, inner, outer, bar):
        def codegen(context, builder, sig, args):
            d, m, b = (context.cast(builder, args[i], sig.args[i], types.uint64) for i in (0, 1, 4))
            x, y = (context.cast(builder, args[i], sig.args[i], types.int32) for i in (2, 3))
            asm(builder, "{ .reg .u64 d, b; cvta.to.shared.u64 d, $0; cvta.to.shared.u64 b, $4; "
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [d], [$1, {$2, $3}], [b]; }",
                "l,l,r,r,l,~{memory}", [d, m, x, y, b])
            return context.get_dummy_value()
        return types.none(dst, tensor_map_address, inner, outer, bar), codegen

    @intrinsic
    def tma_load_2d_multicast(typingctx, dst, tensor_map_address, inner, outer, bar, mask):
        """tma_load_2d into every block of the cluster whose bit is set in ``mask`` (16 bits), at the same
        shared-memory offset in each, completing on the barrier at the same offset in each."""
        def codegen(context, builder, sig, args):
            d, m, b = (context.cast(builder, args[i], sig.args[i], types.uint64) for i in (0, 1, 4))
            x, y = (context.cast(builder, args[i], sig.args[i], types.int32) for i in (2, 3))
            bits = context.cast(builder, args[5], sig.args[5], types.uint16)
            asm(builder, "{ .reg .u64 d, b; cvta.to.shared.u64 d, $0; cvta.to.shared.u64 b, $4; "
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                "[d], [$1, {$2, $3}], [b], $5; }", "l,l,r,r,l,h,~{memory}", [d, m, x, y, b, bits])
            return context.get_dummy_value()
        return types.none(dst, tensor_map_address, inner, outer, bar, mask), codegen

    @intrinsic
    def cluster_ctarank(typingctx):
        """This block's rank in its cluster (%cluster_ctarank): 0 .. blocks a cluster - 1."""
        def codegen(context, builder, sig, args):
            return asm(builder, "mov.u32 $0, %cluster_ctarank;", "=r", [], i32)
        return types.uint32(), codegen

    @intrinsic
    def zero_accumulators(typingctx, acc):
        """acc[0..127] = 0, as 128 stores at constant indices (a loop would index the array at run time,
        and an array indexed at run time lives in local memory, not registers)."""
        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            zero = context.get_constant(sig.args[0].dtype, 0)
            for i in range(128):
                builder.store(zero, builder.gep(arr.data, [i64(i)]))
            return context.get_dummy_value()
        return types.none(acc), codegen

    def store_accumulators(kind):
        @intrinsic
        def op(typingctx, acc, address, pitch, rows_left, cols_left, pairs):
            """The 128 accumulators of a thread to the 16-bit matrix whose element (row, col) of this thread's
            accumulator 0 is at generic ``address`` (row pitch ``pitch`` bytes), rounded to the half type:
            accumulators 4j + 2h, 4j + 2h + 1 go to row 8h, columns 8j, 8j + 1 from there, stored only where
            8h < rows_left and 8j (+ 1) < cols_left; as one 32-bit word where ``pairs`` (N even: the pair is
            aligned), else as two 16-bit halves. Straight-line code at constant indices, as in zero_accumulators."""
            def codegen(context, builder, sig, args):
                arr = context.make_array(sig.args[0])(context, builder, args[0])
                base, row_pitch = (context.cast(builder, args[i], sig.args[i], types.uint64) for i in (1, 2))
                rows, cols = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (3, 4))
                as_pairs = context.cast(builder, args[5], sig.args[5], types.boolean)
                for j in range(32):
                    for h in range(2):
                        inside = builder.and_(builder.icmp_signed(">", rows, i64(8 * h)),
                                              builder.icmp_signed(">", cols, i64(8 * j)))
                        with builder.if_then(inside):
                            lo, hi = (builder.load(builder.gep(arr.data, [i64(4 * j + 2 * h + e)])) for e in (0, 1))
                            packed = asm(builder, f"cvt.rn.{kind}x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], i32)
                            at = builder.add(base, builder.add(builder.mul(row_pitch, i64(8 * h)), i64(16 * j)))
                            with builder.if_else(as_pairs) as (word, halves):
                                with word:
                                    builder.store(packed, builder.inttoptr(at, i32.as_pointer()))
                                with halves:
                                    i16 = ir.IntType(16)
                                    builder.store(builder.trunc(packed, i16), builder.inttoptr(at, i16.as_pointer()))
                                    with builder.if_then(builder.icmp_signed(">", cols, i64(8 * j + 1))):
                                        builder.store(builder.trunc(builder.lshr(packed, i32(16)), i16),
                                                      builder.inttoptr(builder.add(at, i64(2)), i16.as_pointer()))
                return context.get_dummy_value()
            return types.none(acc, address, pitch, rows_left, cols_left, pairs), codegen
        return op

    @intrinsic
    def store_accumulators_s32(typingctx, acc, address, pitch, rows_left, cols_left):
        """store_accumulators for int32 accumulators into an int32 matrix: accumulators 4j + 2h + e go to
        row 8h, column 8j + e from the thread's (row, col) at ``address``, where inside."""
        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            base, row_pitch = (context.cast(builder, args[i], sig.args[i], types.uint64) for i in (1, 2))
            rows, cols = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (3, 4))
            for j in range(32):
                for h in range(2):
                    for e in range(2):
                        inside = builder.and_(builder.icmp_signed(">", rows, i64(8 * h)),
                                              builder.icmp_signed(">", cols, i64(8 * j + e)))
                        with builder.if_then(inside):
                            value = builder.load(builder.gep(arr.data, [i64(4 * j + 2 * h + e)]))
                            at = builder.add(base, builder.add(builder.mul(row_pitch, i64(8 * h)), i64(32 * j + 4 * e)))
                            builder.store(value, builder.inttoptr(at, i32.as_pointer()))
            return context.get_dummy_value()
        return types.none(acc, address, pitch, rows_left, cols_left), codegen

    def pack(kind):
        @intrinsic
        def op(typingctx, lo, hi):
            def codegen(context, builder, sig, args):
                a, b = (context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args))
                return asm(builder, f"cvt.rn.{kind}x2.f32 $0, $2, $1;", "=r,f,f", [a, b], i32)
            return types.uint32(lo, hi), codegen
        return op

    return dict(
        shared_descriptor=shared_descriptor,
        **{f"wgmma_fence_operands_{n}": fence_operands(n) for n in FENCED_COUNTS},
        **{name: wgmma_sized("bf16" if bf16 else "f16", n, regs, trans)
           for name, (bf16, n, regs, trans) in SIZED_WGMMA.items()},
        wgmma_f16=wgmma("f16"), wgmma_bf16=wgmma("bf16"), wgmma_s8=wgmma("s8"),
        store_accumulators_s32=store_accumulators_s32,
        wgmma_fence=statement("wgmma.fence.sync.aligned;"),
        named_barrier_sync=named_barrier("bar.sync $0, $1;"), named_barrier_arrive=named_barrier("bar.arrive $0, $1;"),
        wgmma_commit=statement("wgmma.commit_group.sync.aligned;"),
        wgmma_wait0=statement("wgmma.wait_group.sync.aligned 0;"),
        wgmma_wait1=statement("wgmma.wait_group.sync.aligned 1;"),
        fence_proxy_async=statement("fence.proxy.async.shared::cta;"),
        setmaxnreg_producer=statement("setmaxnreg.dec.sync.aligned.u32 40;"),
        setmaxnreg_consumer=statement("setmaxnreg.inc.sync.aligned.u32 232;"),
        **{f"setmaxnreg_{way}_{n}": statement(f"setmaxnreg.{way}.sync.aligned.u32 {n};")
           for n in SETMAXNREG_COUNTS for way in ("dec", "inc")},
        mbarrier_init=on_barrier("mbarrier.init.shared::cta.b64 [s], $1;", True),
        mbarrier_arrive_expect_tx=on_barrier("mbarrier.arrive.expect_tx.shared::cta.b64 _, [s], $1;", True),
        mbarrier_arrive=on_barrier("mbarrier.arrive.shared::cta.b64 _, [s];", False),
        # try_wait suspends the thread for a while inside the instruction; the loop retries until the
        # phase of that parity has completed (braces scope the labels: the function is inlined many times)
        mbarrier_wait=on_barrier(".reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [s], $1; "
                                 "@!p bra WAIT;", True),
        tma_load_2d=tma_load_2d,
        tma_load_2d_multicast=tma_load_2d_multicast,
        cluster_ctarank=cluster_ctarank,
        # every thread of every block of the cluster: arrive (releasing what it wrote), then wait (acquiring
        # what the others wrote); .aligned: all threads of a warp execute it together
        cluster_sync=statement("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"),
        # makes mbarrier_init visible to the other blocks of the cluster (and their copies) before they use it
        fence_mbarrier_init=statement("fence.mbarrier_init.release.cluster;"),
        # mapa: this shared address's place in block $1's shared memory; arrive there. The default semantics
        # (release at CTA scope, as CUTLASS's ClusterBarrier) suffice: what the arrival publishes is that this
        # block's wgmma are done reading the slot, and they completed before the wait that precedes it;
        # .release.cluster would put a GPU-wide memory barrier (MEMBAR.ALL.GPU) before every arrival.
        mbarrier_arrive_cluster=on_barrier(".reg .u32 a, r; cvt.u32.u64 a, s; mapa.shared::cluster.u32 r, a, $1; "
                                           "mbarrier.arrive.shared::cluster.b64 _, [r];", True),
        pack_f16x2=pack("f16"), pack_bf16x2=pack("bf16"),
        zero_accumulators=zero_accumulators,
        store_accumulators_f16=store_accumulators("f16"), store_accumulators_bf16=store_accumulators("bf16"),
    )


def _wake_waiters():
    with _BARRIERS_CHANGED:
        _BARRIERS_CHANGED.notify_all()


if _device.is_simulator():
    from solutions._ptx import pack_bf16x2, pack_f16x2  # the simulator's conversions
    from workbench.simulator.blocks import ON_CLUSTER_ABORT

    if _wake_waiters not in ON_CLUSTER_ABORT:
        ON_CLUSTER_ABORT.append(_wake_waiters)

    zero_accumulators = _sim_zero_accumulators
    store_accumulators_f16 = _sim_store_accumulators(pack_f16x2)
    store_accumulators_bf16 = _sim_store_accumulators(pack_bf16x2)

    shared_descriptor = _sim_descriptor
    advance_descriptor = _sim_advance_descriptor
    globals().update({name: _sim_wgmma_sized(*spec) for name, spec in SIZED_WGMMA.items()})
    globals().update({f"wgmma_fence_operands_{n}": _nothing for n in FENCED_COUNTS})
    wgmma_f16 = _sim_wgmma(bf16=False)
    wgmma_bf16 = _sim_wgmma(bf16=True)
    wgmma_s8 = _sim_wgmma_s8
    store_accumulators_s32 = _sim_store_accumulators_s32
    wgmma_fence = wgmma_commit = wgmma_wait0 = wgmma_wait1 = fence_proxy_async = _nothing
    setmaxnreg_producer = setmaxnreg_consumer = _nothing
    globals().update({f"setmaxnreg_{way}_{n}": _nothing for n in SETMAXNREG_COUNTS for way in ("dec", "inc")})
    mbarrier_init = _sim_mbarrier_init
    named_barrier_sync = _sim_named_barrier_sync
    named_barrier_arrive = _sim_named_barrier_arrive
    mbarrier_arrive_expect_tx = _sim_mbarrier_arrive_expect_tx
    mbarrier_arrive = _sim_mbarrier_arrive
    mbarrier_wait = _sim_mbarrier_wait
    tma_load_2d = _sim_tma_load_2d
    tma_load_2d_multicast = _sim_tma_load_2d_multicast
    cluster_ctarank = _sim_cluster_ctarank
    cluster_sync = _sim_cluster_sync
    fence_mbarrier_init = _nothing
    mbarrier_arrive_cluster = _sim_mbarrier_arrive_cluster
else:
    globals().update(_gpu_intrinsics())
