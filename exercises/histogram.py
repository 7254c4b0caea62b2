# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/histogram.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade histogram            (or histogram.<stage>)
# The grader checks each stage against the operator in solutions/histogram.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 395376d5034b69443418c6813e954b5d49b6c696ab4b0888afff80a593ca8559
# --------------------------------------------------------------------------------------------------
"""Histogram of a uint8 vector into 256 int32 bins: out[b] = number of i with x[i] == b.

The interview question: many threads want to increment the same counter at once. Atomic adds make
that correct; the lesson is where the atomics land. Thousands of threads hammering 256 global
counters queue up behind each other (worst when the data is skewed: an image that is mostly
background sends most elements to one bin). Giving every block a private copy of the bins in
shared memory moves the contention to fast on-chip atomics, and each block then adds its 256
counts to the global bins once. Reading 16 bytes a load, with a sub-histogram per warp, then leaves
the shared atomics as the limit: on skewed data the hardware already folds a warp's equal bytes
into one update, so what costs is the number of distinct counters each instruction touches. Giving
each lane counters of its own, all in its own bank, makes every update one wavefront whatever the data.

A histogram reads each byte once and writes 256 counts: n + 1 KiB of traffic, one increment per
element. Counts are integers: they must be exact (the grader compares with tolerance 0).

Constraints: x is uint8, 1-D, contiguous, n >= 1 (any n up to 2^31 - 1); out is int32 of shape
(256,). The stage overwrites out (it must zero it first); x is never written.
"""

import numpy as np
from numba import cuda, int32, uint32

from solutions._vector_io import VECTOR_BYTES, aligned16, byte_of, load4, shared_add_at, shared_offset
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array, sm_count
from workbench.shared_memory import set_max_dynamic_shared_memory
from workbench.targets import of_ceiling

BINS = 256
THREADS = 256
ELEMENTS_PER_THREAD = 16  # the grid is sized so that each thread counts about this many elements

# Stage 3 (16-byte loads, a sub-histogram per warp):
VECTOR_THREADS = 256  # threads a block
QUADS_IN_FLIGHT = 4  # 16-byte loads a thread issues before counting any: 64 bytes a thread a step
SUB_HISTOGRAMS = VECTOR_THREADS // 32  # per block: one per warp
THREADS_PER_SUB_HISTOGRAM = VECTOR_THREADS // SUB_HISTOGRAMS  # neighbouring threads share one
SUB_HISTOGRAM_STRIDE = BINS + 1  # one counter of padding: copy h of bin b lies in bank (b + h) % 32
BLOCK_BINS = SUB_HISTOGRAMS * SUB_HISTOGRAM_STRIDE  # a block's shared counters (about 8 KiB)
BLOCKS_PER_SM = 2048 // VECTOR_THREADS  # a resident grid: every block runs at once, no second wave
BYTE = uint32(0xFF)

# Stage 4 (private counters per lane, each lane's in its own bank):
LANE_COUNTER_BITS = 32  # 32: 32 KiB of counters a warp; 16: two counters a word, 16 KiB, flushed before they fill
LANE_WARPS = 7  # warps a block: 7 x 32 KiB of counters fill an SM (16-bit counters: two such blocks)
LANE_THREADS = 32 * LANE_WARPS
LANE_QUADS_IN_FLIGHT = 12  # 16-byte loads a thread keeps in flight while it counts the previous ones
LANE_COUNTER_ATOMIC = True  # bump a lane's counter word with a shared atomic (False: a plain load, add, store)
COUNTER_MAX = (1 << LANE_COUNTER_BITS) - 1  # what one counter holds
LANE_FLUSH_QUADS = COUNTER_MAX // VECTOR_BYTES  # quads a lane may count between flushes (16 bits: 4095)
COUNTERS_PER_WORD = 32 // LANE_COUNTER_BITS
WORD_OF = COUNTERS_PER_WORD - 1  # bin b lies in the lane's word b >> WORD_OF, its half b & WORD_OF
LANE_WORDS = BINS // COUNTERS_PER_WORD  # a lane's counter words, 32 words apart: all in the lane's bank
WARP_WORDS = 32 * LANE_WORDS
BLOCK_WORDS = LANE_WARPS * WARP_WORDS  # the block's counters; its 256 bin totals follow them
LANE_SHARED_BYTES = 4 * (BLOCK_WORDS + BINS)  # a block's dynamic shared memory
SM_SHARED_BYTES = 228 * 1024  # shared memory of an sm_90 SM; each resident block also takes 1 KiB of it
LOW16 = uint32(0xFFFF)


def _inputs(size, rng):
    (n,) = size
    # Skewed like real data: half the elements fall in one hot bin (contention), the rest are
    # uniform over all 256 values (so bins 0 and 255 are exercised too).
    x = rng.integers(0, BINS, n, dtype=np.uint8)
    hot = rng.random(n) < 0.5
    x[hot] = rng.integers(0, BINS)
    return (x,)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    (n,) = size
    # Only the two edge values, 0 and 255: a table of 255 bins, or a loop over bins that stops one
    # early (zeroing, flushing), gets bin 255 wrong.
    edges = rng.choice(np.array([0, BINS - 1], np.uint8), n)
    # Every element in one bin: every increment of the launch contends for the same counter.
    one_bin = np.full(n, rng.integers(0, BINS), np.uint8)
    return [("edge-bins", (edges,)), ("all-one-bin", (one_bin,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.uint8, ndim=1)
    expect_device_array("out", out, dtype=np.int32, shape=(BINS,))


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        def run(x, out):
            peers.as_torch(out).copy_(torch.bincount(peers.as_torch(x), minlength=BINS))
        return "torch.bincount", run
    cupy = peers.cupy()
    if cupy is not None:
        def run_cupy(x, out):
            peers.as_cupy(out)[...] = cupy.bincount(peers.as_cupy(x), minlength=BINS)
        return "cupy.bincount", run_cupy
    return None


op = Operator(
    name="histogram",
    targets=[of_ceiling(70, "read_gbps", stage="best")],
    title="256-bin histogram of a uint8 vector",
    reference=lambda x: np.bincount(x, minlength=BINS).astype(np.int64),
    make_inputs=_inputs,
    make_output=lambda size: np.empty(BINS, np.int32),
    bytes_moved=lambda size: size[0] + 4 * BINS,
    pattern="read",  # every input byte read once, a few bins written: the read-only ceiling
    flops=lambda size: size[0],
    validate=_validate,
    tolerance=lambda size, dtype: 0.0,  # counts are exact
    peer=_peer,
    torch_expression=lambda torch, size: lambda x: torch.bincount(x, minlength=BINS),  # for torch.compile
    adversarial_inputs=_adversarial,
    dtype=np.int32,
    check_sizes=[1, 31, 1000, 1_000_003, 2**24 + 1, 2**28],
    sim_sizes=[1, 31, 33, 1000, 4099],
    bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
    headline_size=(2**28,),
    rank=130,
    group="The interview set: scan, histogram, argmax, matrix-vector, stencil",
    grade_sizes={"sim": [(1025,), (8195,)], "gpu": [(2**20 + 3,), (255,), (132 * 8 * 4096 + 1,)]},
)


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def _grid(n):
    """Blocks for about ELEMENTS_PER_THREAD elements per thread, never more than fill the GPU."""
    return min(blocks_for(n, THREADS * ELEMENTS_PER_THREAD), sm_count() * (2048 // THREADS))


# -- 1. global atomics ---------------------------------------------------------------------------

@cuda.jit
def _global_atomics(x, out):
    # EXERCISE: write this part of `_global_atomics`. Read the hints one at a time.
    #   hint 1 (nudge): Walk the input with a grid-stride loop; each element adds 1 to the bin its value names.
    #   hint 2: Many threads hit the same bin at once: a plain out[b] += 1 loses updates. cuda.atomic.add(array, index, value) does not.
    #   hint 3 (nearly the answer): for i in range(cuda.grid(1), x.size, cuda.gridsize(1)): cuda.atomic.add(out, x[i], int32(1))
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("global_atomics", """
    Zero the 256 bins, then every thread walks the input with a grid-stride loop (coalesced reads)
    and adds 1 to its element's bin with an atomic add in global memory. Correct for any data, but
    every increment is a round trip to the L2 cache, and increments to the same bin are serialised
    there: with half the data in one hot bin, the whole GPU waits on one address.""",
    boundaries={"n": (THREADS * ELEMENTS_PER_THREAD,)})
def global_atomics(x, out):
    _zero_bins[1, BINS](out)
    _global_atomics[_grid(x.size), THREADS](x, out)


# -- 2. shared-memory privatisation --------------------------------------------------------------

@cuda.jit
def _shared_privatized(x, out):
    bins = cuda.shared.array(BINS, int32)  # this block's private histogram (starts as garbage)
    t = cuda.threadIdx.x
    # EXERCISE: write this part of `_shared_privatized`. Read the hints one at a time.
    #   hint 1 (nudge): Three phases, separated by barriers: zero the block's shared bins, count into them, add them to the global bins.
    #   hint 2: Shared memory starts as garbage: zero bins[t] first, and cuda.syncthreads() before any thread counts (and again before the flush, so every count is in).
    #   hint 3 (nearly the answer): bins[t] = 0 (THREADS == BINS); syncthreads; grid-stride: cuda.atomic.add(bins, x[i], int32(1)); syncthreads; if bins[t] != 0: cuda.atomic.add(out, t, bins[t]).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("shared_privatized", """
    Each block counts into its own 256 bins in shared memory (zeroed first: shared memory starts as
    garbage), then adds its non-zero counts to the global bins: one global atomic per bin per block
    instead of one per element. Shared-memory atomics are resolved on the multiprocessor, many
    times faster than a trip to L2, and the hot bin is now contended only within a block, never
    across the whole GPU.""",
    boundaries={"n": (THREADS * ELEMENTS_PER_THREAD,)})
def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _shared_privatized[_grid(x.size), THREADS](x, out)


# -- 3. 16-byte loads, a sub-histogram per warp --------------------------------------------------

@cuda.jit(device=True, inline=True)
def _add_word(hist, base, word):
    """Count the four bytes of a 32-bit word (little-endian: the lowest byte is the first element).
    Unsigned indices: numba adds no negative-index wraparound to them."""
    cuda.atomic.add(hist, base + (word & BYTE), int32(1))
    cuda.atomic.add(hist, base + ((word >> uint32(8)) & BYTE), int32(1))
    cuda.atomic.add(hist, base + ((word >> uint32(16)) & BYTE), int32(1))
    cuda.atomic.add(hist, base + (word >> uint32(24)), int32(1))


@cuda.jit(device=True, inline=True)
def _zero_sub_histograms(hist):
    for b in range(cuda.threadIdx.x, BLOCK_BINS, VECTOR_THREADS):
        hist[b] = 0
    cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def _merge_sub_histograms(hist, out):
    """After the block's last count: add up the sub-histograms bin by bin, one global atomic a bin."""
    cuda.syncthreads()
    for b in range(cuda.threadIdx.x, BINS, VECTOR_THREADS):
        count = 0
        for h in range(SUB_HISTOGRAMS):
            count += hist[h * SUB_HISTOGRAM_STRIDE + b]
        if count != 0:
            cuda.atomic.add(out, b, count)


@cuda.jit
def _per_warp_vectors(x, words, head, out):
    """x[:head] lies before the first 16-byte boundary, then words (x's bytes from there, four to a
    uint32) holds whole 16-byte quads, then fewer than 16 bytes are left over at the end."""
    hist = cuda.shared.array(BLOCK_BINS, int32)
    # where this warp's sub-histogram starts (unsigned, as _add_word's indices)
    base = uint32(cuda.threadIdx.x // THREADS_PER_SUB_HISTOGRAM * SUB_HISTOGRAM_STRIDE)
    _zero_sub_histograms(hist)
    quads = words.size // 4
    tail = head + 16 * quads  # the first byte after the last whole quad
    g = cuda.grid(1)
    stride = cuda.gridsize(1)
    # EXERCISE: write this part of `_per_warp_vectors`. Read the hints one at a time.
    #   hint 1 (nudge): Read x 16 bytes at a time: load4(words, 4 * q) gives quad q as four uint32 words; issue QUADS_IN_FLIGHT of them, a grid stride apart, before counting any.
    #   hint 2: Count each byte of each word into this warp's sub-histogram (hist[base + byte], a shared atomic); then the quads left over one stride at a time, and the bytes before `head` and from `tail` on one per thread.
    #   hint 3 (nearly the answer): quad = cuda.local.array((QUADS_IN_FLIGHT, 4), uint32); q = g; while q + (QUADS_IN_FLIGHT - 1) * stride < quads: quad[k, 0..3] = load4(words, 4 * (q + k * stride)) for each k; then _add_word(hist, base, quad[k, j]) for each; q += QUADS_IN_FLIGHT * stride. Then while q < quads: one quad. Then if g < head: x[g]; if g < x.size - tail: x[tail + g].
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    _merge_sub_histograms(hist, out)


def _head(x):
    """Bytes before x's first 16-byte boundary (0 for a fresh allocation; 1 to 15 for a view that starts
    mid-buffer), at most x.size."""
    if aligned16(x):
        return 0
    address = x.__cuda_array_interface__["data"][0]
    return min((VECTOR_BYTES - address % VECTOR_BYTES) % VECTOR_BYTES, x.size)


def _as_quads(x, head):
    """x as a device array, then its bytes from x[head] on, whole 16-byte quads of them, seen as uint32
    words (a view: no copy), and the number of quads."""
    x = x if hasattr(x, "is_c_contiguous") else cuda.as_cuda_array(x)
    quads = (x.size - head) // VECTOR_BYTES
    return x, x[head:head + VECTOR_BYTES * quads].view(np.uint32), quads


def per_warp_vectors_with(x, out, head):
    """Zero out, then count x with x[:head] read one byte at a time (tests choose head) and the bytes
    from there on, whole quads of them, seen as uint32 words (a view: no copy)."""
    x, words, quads = _as_quads(x, head)
    blocks = max(1, min(blocks_for(quads, VECTOR_THREADS * QUADS_IN_FLIGHT), sm_count() * BLOCKS_PER_SM))
    _zero_bins[1, BINS](out)
    _per_warp_vectors[blocks, VECTOR_THREADS](x, words, head, out)


@op.stage("per_warp_vectors", """
    Three changes that cut what each element costs. Each thread reads sixteen bytes with one
    instruction (load4 on a uint32 view of x: four words of four bytes) and issues four such loads,
    a grid stride apart, before counting any, so enough requests are in flight to stream at full
    bandwidth; the grid is resident (as many blocks as the SMs hold at once), so each block zeroes
    and merges its bins once for millions of elements. And each warp counts into its own
    sub-histogram in shared memory, so a hot bin is shared by the 32 lanes of one warp, not by
    every thread of the block; the block adds its sub-histograms bin by bin, one global atomic per
    bin. A view that starts between 16-byte boundaries counts its first bytes singly, as does
    every size's last few. No match_any_sync here: ptxas compiles an atomic add of the constant 1
    into ATOMS.POPC.INC, which finds the lanes of a warp that hit the same counter and adds their
    number once. The warp aggregation is done in hardware, and doing it by hand (a match_any_sync
    per byte, then one atomic per group) costs far more than it saves. So the more a warp's bytes
    repeat, the fewer counter updates: one bin is cheapest, skewed data next, uniform bytes (about
    32 distinct counters per instruction) the dearest.""")
def per_warp_vectors(x, out):
    per_warp_vectors_with(x, out, _head(x))


# -- 4. private counters per lane, in the lane's own bank ---------------------------------------

@cuda.jit(device=True, inline=True)
def _bump(counters, mine, lane_at, b):
    """Count byte b in this lane's counters: bin b is counter b & WORD_OF (with 16-bit counters, the
    low or high half) of word (b >> WORD_OF) * 32 + lane, in the lane's own bank whatever b is. The
    word's shared address is the lane's first word's (lane_at) plus (b >> WORD_OF) * 128 bytes: one
    shift-and-add (LEA) a byte, where an array index costs a shift-and-or and another LEA to scale it
    by 4 and add the array's base."""
    one = uint32(1) << ((b & uint32(WORD_OF)) << uint32(4))  # 1, or 1 << 16 for a high half
    if LANE_COUNTER_ATOMIC:
        shared_add_at(counters, lane_at + ((b >> uint32(WORD_OF)) << uint32(7)), one)  # the thread does not wait
    else:
        counters[mine | ((b >> uint32(WORD_OF)) << uint32(5))] += one  # no other lane writes this word


@cuda.jit(device=True, inline=True)
def _bump_word(counters, mine, lane_at, w):
    for k in range(4):
        _bump(counters, mine, lane_at, byte_of(w, k))


@cuda.jit(device=True, inline=True)
def _bump_quads(counters, mine, lane_at, quads):
    for k in range(LANE_QUADS_IN_FLIGHT):
        for i in range(4):
            _bump_word(counters, mine, lane_at, quads[k, i])


@cuda.jit(device=True, inline=True)
def _load_quads(words, q, stride, quads):
    """Quads q, q + stride, ... (LANE_QUADS_IN_FLIGHT of them) into quads: registers, as every index is
    a constant once the loops are unrolled."""
    for k in range(LANE_QUADS_IN_FLIGHT):
        quads[k, 0], quads[k, 1], quads[k, 2], quads[k, 3] = load4(words, 4 * (q + k * stride))


@cuda.jit(device=True, inline=True)
def _flush_lane_counters(counters, warp, lane, bins, again):
    """Add the warp's counters into the block's 32-bit bins (and zero them if counting goes on). Lane L
    sums the 32 lanes' copies of words L, L + 32, ..., reading lane L ^ i's copy at step i, so that the
    32 lanes read 32 different banks."""
    cuda.syncwarp()  # every lane's counts are in
    for j in range(LANE_WORDS // 32):
        row = warp + (lane + uint32(32 * j)) * uint32(32)  # the 32 lanes' copies of word lane + 32 j
        low = uint32(0)
        high = uint32(0)
        for i in range(32):
            at = (row | lane) ^ uint32(i)  # row + (lane ^ i)
            w = counters[at]
            if again:
                counters[at] = uint32(0)
            if COUNTERS_PER_WORD == 1:
                low += w
            else:
                low += w & LOW16  # summed apart: 32 lanes' halves overflow 16 bits
                high += w >> uint32(16)
        first = uint32(COUNTERS_PER_WORD) * (lane + uint32(32 * j))  # the word's first bin
        if low != 0:
            cuda.atomic.add(bins, first, low)
        if high != 0:
            cuda.atomic.add(bins, first + uint32(1), high)
    cuda.syncwarp()  # the zeros are in before any lane counts again


@cuda.jit
def _per_lane_counters(x, words, head, flush_quads, out):
    """As _per_warp_vectors, but each lane counts into counters of its own, added into the block's bins
    every flush_quads quads a lane (before a 16-bit counter could reach 65,536) and at the end."""
    shared = cuda.shared.array(0, uint32)  # dynamic: LANE_WARPS warps' counters, then 256 bins
    counters = shared[:BLOCK_WORDS]
    bins = shared[BLOCK_WORDS:BLOCK_WORDS + BINS]
    t = cuda.threadIdx.x
    lane = uint32(t % 32)
    warp = uint32(t // 32 * WARP_WORDS)  # where this warp's counters start
    mine = warp + lane  # this lane's first word; its others are 32, 64, ... words on, in the same bank
    at = mine
    while at < warp + uint32(WARP_WORDS):  # (a while loop on uint32: numba's range() costs 10 instructions a store here)
        counters[at] = uint32(0)
        at += uint32(32)
    for b in range(t, BINS, LANE_THREADS):
        bins[b] = 0
    cuda.syncthreads()
    quads = words.size // 4
    tail = head + 16 * quads
    g = cuda.grid(1)
    stride = cuda.gridsize(1)
    # EXERCISE: write this part of `_per_lane_counters`. Read the hints one at a time.
    #   hint 1 (nudge): Stage 3's loop, counting into this lane's own counters: with lane_at = shared_offset(counters, mine) (the shared address of the lane's first counter, taken once), _bump(counters, mine, lane_at, b) adds byte b to word b * 32 + lane, in the lane's bank; _bump_word and _bump_quads do it for each byte of a word, of a batch. When your quads are counted, _flush_lane_counters(counters, warp, lane, bins, again) adds the warp's counters into the block's bins.
    #   hint 2: Counters fill (16-bit ones after 65,535 bytes a lane): count in rounds of at most flush_quads quads a lane, the same rounds in every thread (start = 0, flush_quads * stride, ... while start < quads) so a warp flushes with all its lanes, after each round. Keep LANE_QUADS_IN_FLIGHT quads loading (_load_quads) while you count the previous ones (_bump_quads).
    #   hint 3 (nearly the answer): Each round: first = start + g; mine_quads = min(flush_quads, (quads - 1 - first) // stride + 1) if first < quads, else 0; _load_quads(words, first, stride, cur); then two batches a turn: load nxt, _bump_quads(cur), load cur, _bump_quads(nxt); the leftover quads one by one; start += flush_quads * stride; flush with again = start < quads. Finally x[g] if g < head and x[tail + g] if g < x.size - tail: cuda.atomic.add(bins, byte, uint32(1)).
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    cuda.syncthreads()
    for b in range(t, BINS, LANE_THREADS):
        count = bins[b]
        if count != 0:
            cuda.atomic.add(out, b, int32(count))


def lane_blocks_per_sm():
    """Blocks of _per_lane_counters an SM holds at once: its shared memory (and 2048 threads) decide."""
    return max(1, min(SM_SHARED_BYTES // (LANE_SHARED_BYTES + 1024), 2048 // LANE_THREADS, 32))


def per_lane_counters_with(x, out, head, flush_quads=None, blocks=None):
    """Zero out, then count x as per_warp_vectors_with does, the lanes adding their counters into the
    block's bins every flush_quads quads (LANE_FLUSH_QUADS unless a test says fewer), on a grid of
    blocks (a resident grid unless a test says otherwise)."""
    flush_quads = LANE_FLUSH_QUADS if flush_quads is None else flush_quads
    if not 1 <= flush_quads * VECTOR_BYTES <= COUNTER_MAX:
        raise ValueError(f"a lane may count at most {COUNTER_MAX} bytes ({LANE_COUNTER_BITS}-bit counters) between "
                         f"flushes, {VECTOR_BYTES} a quad; flush_quads={flush_quads}")
    x, words, quads = _as_quads(x, head)
    if blocks is None:
        blocks = max(1, min(blocks_for(quads, LANE_THREADS * LANE_QUADS_IN_FLIGHT),
                            sm_count() * lane_blocks_per_sm()))
    args = (x, words, head, flush_quads, out)
    set_max_dynamic_shared_memory(_per_lane_counters, args, LANE_SHARED_BYTES)  # past 48 KiB: opt in
    _zero_bins[1, BINS](out)
    _per_lane_counters[blocks, LANE_THREADS, 0, LANE_SHARED_BYTES](*args)


@op.stage("per_lane_counters", """
    Stage 3's shared atomics are limited by wavefronts, not instructions: lanes of a warp that update
    different counters in one bank are served one after another, and a warp's 32 updates land on
    many counters spread unevenly over the 32 banks. Here every lane owns a private copy of the 256
    counters laid out as a column in its own bank: bin b of lane L is word b * 32 + L of its warp's
    counters. Whatever the bytes, an update's 32 lanes hit 32 different banks, one wavefront, and no
    two lanes ever share a counter, so the hot bin costs no more than any other. The price is memory:
    32 KiB a warp, so an SM holds seven warps (one block, opted in past the 48 KiB default), and
    each thread keeps twelve 16-byte loads in flight while it counts the previous twelve, to have
    bytes on their way from DRAM with that few warps. With that few warps the loop is bound by its
    instructions and their latencies (Nsight Compute: the top stall is waiting on fixed-latency
    results), so a byte is made to cost three: a byte permute (PRMT, byte_of) takes the byte out, one
    multiply-add makes the counter's shared address from it (the lane's first counter's address plus
    128 bytes a bin: shared_offset once, then the address kept as a number), and red.shared.add adds 1
    there (shared_add_at). Indexing the array instead costs four: the compiler merges the byte's mask
    with the index's shift into one instruction, and then needs two more to add the lane and to scale
    by 4 and add the array's base, at every update. At the end each warp adds its 32 copies of each
    bin (lane L reads lane L ^ i's copy at step i: 32 banks again) into the block's bins, one global
    atomic per bin per block as before. Two 16-bit counters to a word (LANE_COUNTER_BITS = 16) would
    halve the memory and double the warps, but cost two more instructions a byte (the increment is 1
    or 1 << 16) and a flush before a counter can pass 65,535: the loop then runs in rounds of 4,095
    quads a lane, the same rounds in every thread, so that a warp always flushes with all its lanes
    whatever the size and the grid; with twelve to fourteen warps an SM they were slower (113 to 120
    us at four instructions a byte): their extra instructions cost more than the warps gained. On the
    H200 at 2^28 skewed bytes: 79.4 us, 3,383 GB/s, 74% of the read ceiling (stage 3: 92.4 us, 63%);
    at four instructions a byte it took 90.2 us.""")
def per_lane_counters(x, out):
    per_lane_counters_with(x, out, _head(x))
