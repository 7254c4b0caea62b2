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
# generated-sha256: c09e93bd41ecd08d849839e4a63954681d4228a8a707491a1a270e97ead37d17
# --------------------------------------------------------------------------------------------------
"""Histogram of a uint8 vector into 256 int32 bins: out[b] = number of i with x[i] == b.

The interview question: many threads want to increment the same counter at once. Atomic adds make
that correct; the lesson is where the atomics land. Thousands of threads hammering 256 global
counters queue up behind each other (worst when the data is skewed: an image that is mostly
background sends most elements to one bin). Giving every block a private copy of the bins in
shared memory moves the contention to fast on-chip atomics, and each block then adds its 256
counts to the global bins once. Reading 16 bytes a load, with a sub-histogram per warp, then leaves
the shared atomics as the limit: on skewed data the hardware already folds a warp's equal bytes
into one update, so what costs is the number of distinct counters each instruction touches.

A histogram reads each byte once and writes 256 counts: n + 1 KiB of traffic, one increment per
element. Counts are integers: they must be exact (the grader compares with tolerance 0).

Constraints: x is uint8, 1-D, contiguous, n >= 1 (any n up to 2^31 - 1); out is int32 of shape
(256,). The stage overwrites out (it must zero it first); x is never written.
"""

import numpy as np
from numba import cuda, int32, uint32

from solutions._vector_io import VECTOR_BYTES, aligned16, load4
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array, sm_count
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


def per_warp_vectors_with(x, out, head):
    """Zero out, then count x with x[:head] read one byte at a time (tests choose head) and the bytes
    from there on, whole quads of them, seen as uint32 words (a view: no copy)."""
    x = x if hasattr(x, "is_c_contiguous") else cuda.as_cuda_array(x)
    quads = (x.size - head) // VECTOR_BYTES
    words = x[head:head + VECTOR_BYTES * quads].view(np.uint32)
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
