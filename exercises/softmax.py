# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/softmax.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade softmax            (or softmax.<stage>; its other operators: softmax[fp16], softmax[bf16])
# The grader checks each stage against the operator in solutions/softmax.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 61a42493e15018bcfe2b8e7133db35bf1758effd99feacd4cb7bb16d523da232
# --------------------------------------------------------------------------------------------------
"""Softmax over the rows of a float32 matrix, in seven steps from a thread per row to 92% of copy bandwidth.

softmax(x)[r, j] = exp(x[r, j] - m_r) / sum_k exp(x[r, k] - m_r), with m_r the row's maximum. Subtracting
the maximum changes nothing mathematically and everything numerically: exp(89) is already inf in
float32, and a row holding 1e4 would come out inf/inf = NaN without it.

Each element is read once and written once (8 bytes) for a handful of flops, so softmax is bound by
memory bandwidth, like a copy. What the ladder removes, step by step: uncoalesced loads, a thread that
combines the others' results alone, barriers, a read of the row (the "online" softmax finds the
maximum and the sum of exponentials in one pass), then every read but one (the row kept in
registers). Step six is the surprise: on this hardware, with numba, a simple kernel that reads the
row three times but needs half the registers beats the register-resident one, because its second
and third reads come from the L1 cache and twice as many threads fit on the GPU. Step seven gives
that kernel what it lacked, loads in flight: eight per thread instead of one. Fusing is a means,
not the goal: count what the kernel really costs (registers, instructions, bytes from DRAM, and
how many of those bytes are on their way at once).
"""

import math

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from solutions._half import (
    CHUNKS, FLOAT16, FORMATS, GROUP_SLOTS, HELD, LAST, ROW_SIZES, ROW_THREADS, SIXTEEN, SIXTEEN_BIT_STORY, VECTOR,
    a_matrix, as_float64, bits16, block_max, block_max_over, block_sum, block_sum_over, column, edge_element, element,
    expect_rows, fills_launch, fits_vector_rows, flat_bits16, float_format, group_max, group_row, group_sum,
    half_operator, libdevice, load_held, load_vector, pack, per_format, reciprocal, reciprocal_ftz, registers_grid,
    registers_threads, row_max, row_sum, row_words, short_name, store_vector, torch_peer, vector_row,
    vector_rows_shape, whole_row, words)
from solutions._references import softmax64
from solutions._templates import instantiate
from solutions._vector_io import (
    SHARED_ALIGN16, SHARED_ROW_FITS, aligned16, capped, copy_row_to_shared, expect_row_width, flat_view,
    launch_shared_row, load4, load_chunk, rows_fit_vectors, shared_row_threads, store4, store8, store_chunk)
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, stage_of
from workbench.targets import against_peer, of_ceiling

# The fp16/bf16 variants' part of the lesson, the same for softmax, the norms and GELU, is told once in
# solutions/_half.py; what softmax adds to it follows.
__doc__ += SIXTEEN_BIT_STORY + """\
3. ``fast_exp``: at 2 bytes an element each element gets half the instructions it had in
   float32, and libdevice's exact expf was most of them; the hardware's approximate exp2 is accurate
   to a thousandth of a half's rounding.
4. ``rows_in_flight``: blocks of 128 threads a row instead of 256, twice the rows in flight per
   multiprocessor: a block's time on a row is mostly fixed latency, and a 16-bit row is half the bytes.
5. ``vector_rows``: the row read once, 16 bytes a load, held in registers as float32, and every
   instruction that is not softmax's own taken out: at the copy ceiling there are few to spend.
"""

THREADS = 256  # threads per block in the block-per-row stages; a multiple of the 32-lane warp
WARPS = THREADS // 32
TWO_WARPS = 2 * WARPS  # a shared array's shape must be a constant: a module global, not an expression
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
# The most negative float32: the fused stage's "no element seen yet" maximum. Unlike -inf, it keeps
# exp(m_old - m_new) finite (exp(0) = 1, not exp(-inf + inf) = NaN) when nothing has been seen.
LOWEST = np.float32(np.finfo(np.float32).min)

VALUES_PER_THREAD = 16  # fused stage: row elements each thread keeps in registers
MAX_ROW_THREADS = 1024  # the most threads a block may have
REGISTER_COLS = 8192  # fused stage: rows up to this width stay in registers; wider ones stream
STREAM_THREADS = 1024  # fused stage, wide rows: threads per row


# -- the operator ------------------------------------------------------------------------------

def _inputs(size, rng):
    rows, cols = size
    x = rng.normal(0.0, 2.0, (rows, cols)).astype(np.float32)
    # Rows a careless kernel gets wrong, mixed in with the random ones:
    for r in range(0, rows, 5):  # +-1e4: exp overflows unless the row maximum is subtracted first
        x[r] = rng.uniform(-1e4, 1e4, cols).astype(np.float32)
    for r in range(1, rows, 5):  # -inf but for one entry: the answer is one-hot, and -inf - -inf is NaN
        x[r] = -np.inf
        x[r, rng.integers(cols)] = rng.normal(0.0, 2.0)
    return (x,)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    rows, cols = size
    # Every logit far below 0 (a third of the rows constant: the output is exactly 1 / cols). A
    # running maximum started at 0 instead of -inf (or the row's first element) makes every exp
    # underflow to 0, and 0 / 0 is NaN.
    negative = rng.uniform(-1e4, -1e3, (rows, cols)).astype(np.float32)
    negative[::3] = np.float32(rng.uniform(-1e4, -1e3))
    # Masked rows (-inf) whose surviving logits are all far below 0, the first one masked: a
    # maximum started at 0 sees only underflow, and an online softmax that merges a running maximum
    # of -inf with a -inf element computes exp(-inf - -inf) = NaN.
    masked = np.full((rows, cols), NEG_INF, np.float32)
    for r in range(rows):
        keep = rng.random(cols) < 0.3
        keep[0] = cols == 1
        keep[rng.integers(1, cols) if cols > 1 else 0] = True
        masked[r, keep] = rng.uniform(-1e4, -9e3, int(keep.sum()))
    return [("all-negative", (negative,)), ("masked-negative", (masked,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    expect_device_array("out", out, dtype=np.float32, ndim=2)
    if tuple(out.shape) != tuple(x.shape):
        raise InputError(f"out must have the shape of x, {tuple(x.shape)}; got {tuple(out.shape)}")


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        return "torch.softmax", lambda x, out: torch.softmax(peers.as_torch(x), 1, out=peers.as_torch(out))
    cupy = peers.cupy()
    if cupy is not None:
        try:
            from cupyx.scipy.special import softmax as cupy_softmax
        except ImportError:
            return None

        def run(x, out):
            peers.as_cupy(out)[...] = cupy_softmax(peers.as_cupy(x), axis=1)  # allocates, then copies
        return "cupyx.scipy.special.softmax", run
    return None


op = Operator(
    name="softmax",
    targets=[of_ceiling(85, "copy_gbps"), against_peer(1.5, "torch.softmax"), against_peer(1.0)],
    title="Softmax over the rows of a float32 matrix",
    reference=softmax64,  # exp(x - row max) / its row sum, in float64 (solutions/_references.py, shared with fp16/bf16)
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: 2 * 4 * size[0] * size[1],  # read x once, write out once
    flops=lambda size: 4 * size[0] * size[1],  # subtract, exp, add, multiply per element
    validate=_validate,
    peer=_peer,
    torch_expression=lambda torch, size: lambda x: torch.softmax(x, dim=-1),  # for torch.compile
    adversarial_inputs=_adversarial,
    check_sizes=[(300, 1), (300, 33), (300, 1000), (300, 4097), (200, 32768), (32768, 4096)],
    sim_sizes=[(3, 1), (5, 33), (4, 100), (2, 1000), (3, 4097)],
    bench_sizes=[(256, 1024), (4096, 1024), (4096, 4096), (32768, 1024), (32768, 4096), (4096, 32768)],
    headline_size=(32768, 4096),
    rank=40,
    group="Softmax over rows",
    record_all_sizes=True,
)


# -- 1. naive: one thread per row ---------------------------------------------------------------

@cuda.jit
def _row_per_thread(x, out):
    row = cuda.grid(1)
    if row < x.shape[0]:
        cols = x.shape[1]
        # EXERCISE: write this part of `_row_per_thread`. Read the hints one at a time.
        #   hint 1 (nudge): three loops over the row: its maximum m, the sum s of exp(x - m), then out = exp(x - m) / s.
        #   hint 2 (nearly the answer): start m at x[row, 0]; math.exp of a float32 value stays float32.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("naive", """
    One thread per row, three loops over its row: the maximum, the sum of exponentials, then the
    output. Correct, and slow twice over: at each step the 32 threads of a warp read 32 different
    rows, 32 separate memory transactions for 128 useful bytes, and a 32768-row matrix gives only
    32768 threads, too few to keep the GPU's memory system busy.""")
def naive(x, out):
    _row_per_thread[blocks_for(x.shape[0], THREADS), THREADS](x, out)


# -- 2. coalesced: one block per row -----------------------------------------------------------

@cuda.jit
def _block_per_row(x, out):
    partials = cuda.shared.array(THREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    cols = x.shape[1]
    # EXERCISE: write this part of `_block_per_row`. Read the hints one at a time.
    #   hint 1 (nudge): thread t visits columns t, t + THREADS, ...: neighbouring threads read neighbouring floats.
    #   hint 2: each thread stores its partial max in partials[t]; after a barrier thread 0 combines them
    #   hint 3 (nearly the answer): and puts the row max in partials[0]; the same again for the sum. Mind the barriers between.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("coalesced", """
    One block of 256 threads per row. The threads stride across the row together, so each warp's
    load is one 128-byte transaction, and there are as many threads as the GPU can hold. The price is
    combining 256 partial results: each thread leaves its partial max (then sum) in shared memory and
    thread 0 loops over all of them while the other 255 wait at the barrier.""",
    boundaries={"cols": (THREADS,)})
def coalesced(x, out):
    _block_per_row[x.shape[0], THREADS](x, out)


# -- 3. shared-memory tree ---------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _tree_max(partials, t):
    """Halve the active threads each step; the block's maximum ends in partials[0]."""
    half = THREADS // 2
    while half > 0:
        cuda.syncthreads()
        if t < half:
            partials[t] = max(partials[t], partials[t + half])
        half //= 2
    cuda.syncthreads()
    return partials[0]


@cuda.jit(device=True, inline=True)
def _tree_sum(partials, t):
    half = THREADS // 2
    while half > 0:
        cuda.syncthreads()
        if t < half:
            partials[t] += partials[t + half]
        half //= 2
    cuda.syncthreads()
    return partials[0]


@cuda.jit
def _block_per_row_tree(x, out):
    partials = cuda.shared.array(THREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    cols = x.shape[1]
    # EXERCISE: write this part of `_block_per_row_tree`. Read the hints one at a time.
    #   hint 1 (nudge): as before, but combine the partials with _tree_max / _tree_sum (log2(256) = 8 steps).
    #   hint 2 (nearly the answer): a barrier after reading partials[0], before the next tree overwrites it.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("shared_tree", """
    The 256 partials are combined by a tree in shared memory: at each step the lower half of the
    active threads adds (or maxes) in the upper half's value, 8 steps instead of 255 serial ones by a
    single thread. Sequential addressing keeps the active threads contiguous, so whole warps drop
    out together and neighbouring threads hit neighbouring banks.""",
    boundaries={"cols": (THREADS,)})
def shared_tree(x, out):
    _block_per_row_tree[x.shape[0], THREADS](x, out)


# -- 4. a warp per row: shuffles, and max and sum in one pass ----------------------------------

@cuda.jit(device=True, inline=True)
def _warp_max(value):
    """Butterfly (xor) reduction: after 5 steps every lane holds the maximum of all 32."""
    offset = 16
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _merge(m_a, s_a, m_b, s_b):
    """Combine two (maximum m, sum s of exp(x - m)) summaries of parts of a row into one: rescale the
    sum with the smaller maximum by exp(smaller - larger). One exp, no branch."""
    a_larger = m_a >= m_b
    m = m_a if a_larger else m_b
    smaller = m_b if a_larger else m_a
    s_big = s_a if a_larger else s_b
    s_small = s_b if a_larger else s_a
    return m, s_big + s_small * math.exp(smaller - m)


@cuda.jit(device=True, inline=True)
def _warp_merge(m, s):
    offset = 16
    while offset > 0:
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
        s_other = cuda.shfl_xor_sync(FULL_MASK, s, offset)
        m, s = _merge(m, s, m_other, s_other)
        offset //= 2
    return m, s


@cuda.jit
def _warp_per_row_online(x, out):
    row = uint64(cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32)
    lane = uint64(cuda.threadIdx.x % 32)
    if row < uint64(x.shape[0]):
        cols = uint64(x.shape[1])
        # EXERCISE: write this part of `_warp_per_row_online`. Read the hints one at a time.
        #   hint 1 (nudge): one pass: each lane keeps a running (max, sum of exp(x - max)); element v merges in as _merge(m, s, v, 1).
        #   hint 2 (nearly the answer): _warp_merge combines the 32 lanes' summaries; a second pass writes exp(x - m) / s.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("warp_shuffle", """
    One warp per row, eight rows per block: a warp's 32 lanes combine their partial results by reading
    each other's registers (shfl_xor_sync, 5 steps, the result in every lane), with no shared memory
    and no barrier. Each lane also finds its maximum and sum of exponentials in one pass, the "online"
    softmax: a running (max m, sum s) absorbs an element v as m' = max(m, v), s' = s * exp(m - m') +
    exp(v - m'), and two summaries merge the same way. Two reads of the row instead of three. Indices
    are unsigned (uint64): numba then skips the negative-index wraparound it emits for every signed
    index, and these kernels are limited by instructions as much as by memory.""")
def warp_shuffle(x, out):
    _warp_per_row_online[blocks_for(x.shape[0], WARPS), THREADS](x, out)


# -- 5. fused: the row in registers, one read ---------------------------------------------------

@cuda.jit(device=True, inline=True)
def _block_merge(m, s):
    """(max, sum) of the whole block, in every thread: each warp merges in registers, then every warp
    merges the warps' results from shared memory. One barrier. blockDim.x must be a multiple of 32."""
    warp_m = cuda.shared.array(32, float32)
    warp_s = cuda.shared.array(32, float32)
    lane = cuda.threadIdx.x % 32
    m, s = _warp_merge(m, s)
    if lane == 0:
        warp_m[cuda.threadIdx.x // 32] = m
        warp_s[cuda.threadIdx.x // 32] = s
    cuda.syncthreads()
    if lane < cuda.blockDim.x // 32:
        m = warp_m[lane]
        s = warp_s[lane]
    else:
        m = LOWEST
        s = float32(0.0)
    return _warp_merge(m, s)


@cuda.jit
def _softmax_in_registers(x, out):
    values = cuda.local.array(VALUES_PER_THREAD, float32)  # fully unrolled loops keep it in registers
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    step = uint64(cuda.blockDim.x)
    cols = uint64(x.shape[1])
    # EXERCISE: write this part of `_softmax_in_registers`. Read the hints one at a time.
    #   hint 1 (nudge): load this thread's elements (columns t + k * step) into values[] once, noting their maximum.
    #   hint 2: replace each by exp(value - local max) and sum them: this thread's (max, sum) summary.
    #   hint 3 (nearly the answer): _block_merge gives the row's (m, s); each output is values[k] * exp(local max - m) / s.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _softmax_streaming(x, out):
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    cols = x.shape[1]
    # EXERCISE: write this part of `_softmax_streaming`. Read the hints one at a time.
    #   hint 1 (nudge): one pass keeps a running (max, sum): merging in element v is _merge(m, s, v, 1).
    #   hint 2 (nearly the answer): _block_merge, then a second pass writes exp(x - m) / s.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def row_threads(cols, values_per_thread=VALUES_PER_THREAD):
    """Threads for a block that holds a row of ``cols`` in registers: a whole number of warps."""
    warps = blocks_for(blocks_for(cols, values_per_thread), 32)
    return min(MAX_ROW_THREADS, 32 * warps)


def fused_registers(x, out):
    """The fused stage's kernel for rows up to REGISTER_COLS wide."""
    _softmax_in_registers[x.shape[0], row_threads(x.shape[1])](x, out)


def fused_streaming(x, out, threads=None):
    """The fused stage's kernel for rows of any width (two reads of the row)."""
    _softmax_streaming[x.shape[0], threads or STREAM_THREADS](x, out)


@op.stage("fused", """
    A block per row again, and the row read from memory once: each thread loads its 16 elements into
    registers, computes their (max, sum) summary there, and the block merges the summaries with
    shuffles and one barrier; the output is written from the registers. Each element is loaded once,
    exponentiated once and stored once, and 16 independent loads per thread keep memory busy. Rows
    wider than 8192 (16 values x 512 threads) stream instead: one read for (max, sum), one to write.""")
def fused(x, out):
    if x.shape[1] <= REGISTER_COLS:
        fused_registers(x, out)
    else:
        fused_streaming(x, out)


# -- 6. l1_reuse: fewer registers, more threads, the re-reads from L1 ----------------------------

@cuda.jit
def _block_per_row_shuffles(x, out):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    cols = uint64(x.shape[1])
    # EXERCISE: write this part of `_block_per_row_shuffles`. Read the hints one at a time.
    #   hint 1 (nudge): three passes as in shared_tree, striding by THREADS with unsigned indices (while loops, uint64).
    #   hint 2: each reduction: _warp_max / _warp_sum in registers, lane 0 of each warp writes reduced[warp],
    #   hint 3 (nearly the answer): one barrier, then every warp reduces the WARPS values again with shuffles.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("l1_reuse", """
    Faster than keeping the row in registers: a block per row with plain loops needs 31 registers a
    thread (ptxas -v) against 61 for the unrolled register-resident kernel, so twice as many threads
    fit on each multiprocessor, and its short loops issue fewer instructions per element. It reads
    the row three times, but a block's row is only 16 KB, so while the block works on it the second
    and third reads are served by the L1 cache rather than memory. The reductions are warp shuffles
    with one shared-memory exchange each (two barriers per row, against about twenty for the trees
    of stage 3), and the indices are unsigned.""")
def l1_reuse(x, out):
    _block_per_row_shuffles[x.shape[0], THREADS](x, out)


# -- 7. ilp: eight loads in flight per thread ----------------------------------------------------

ILP = 8  # stage 7: elements each thread loads before it uses any of them
ILP_SPAN = ILP * THREADS  # columns a block covers per unrolled step


@cuda.jit
def _block_per_row_ilp(x, out):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(ILP, float32)  # the write pass's loads, held until all have been issued
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    cols = uint64(x.shape[1])
    # EXERCISE: write this part of `_block_per_row_ilp`. Read the hints one at a time.
    #   hint 1 (nudge): stage 6's three passes, each now in two loops: an unrolled one, eight columns a step, then stage 6's loop for the rest.
    #   hint 2: the unrolled loop runs while j + (ILP - 1) * THREADS < cols, does `for u in range(ILP)` over columns j + u * THREADS, and steps j by ILP_SPAN.
    #   hint 3 (nearly the answer): in the write pass, load the ILP values of x into xs before the first store.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("ilp", """
    Stage 6 with its loops unrolled by hand, eight columns a step: each thread issues eight loads
    before it needs the first, where stage 6's loop waited for each load in turn (the compiler does
    not unroll a loop whose trip count it cannot see). Memory is only kept busy by bytes in flight,
    so this is what moves a memory-bound kernel toward the copy rate. In the write pass the eight
    values are loaded into a local array (registers, after unrolling) before the first store,
    because the compiler may not move a load above a store to out that could overlap it. Columns
    past the last full step of eight take stage 6's loop.""",
    boundaries={"cols": (ILP_SPAN,)})
def ilp(x, out):
    _block_per_row_ilp[x.shape[0], THREADS](x, out)


# -- 8. by_shape: the kernel that wins at each row length ----------------------------------------

# Which kernel takes a row, by its width (the first row of the table whose limit covers it):
WARP_ROW_COLS = 1024  # up to here: a warp per row, the row in registers (WARP_CHUNKS x 4 = 32 a lane)
BLOCK_ROW_COLS = 16384  # up to here: a block per row, the row in registers (ROW_CHUNKS x 4 = 16 a thread)
# wider: the online softmax, a block of ONLINE_THREADS per row, two reads (see _softmax_online)
WARP_CHUNKS = 8  # 16-byte pieces of the row each lane holds in the warp-per-row kernel
ROW_CHUNKS = 4  # 16-byte pieces each thread holds in the block-per-row kernels (one online step)
WARP_VALUES = 4 * WARP_CHUNKS
ROW_VALUES = 4 * ROW_CHUNKS
ROWS_PER_BLOCK = 4  # warp-per-row kernel: rows (warps) in a block
FEW_ROWS = 4096  # ... but fewer rows than this get one warp a block, to spread them over every SM
ONLINE_THREADS = 1024  # 1024 beat 512 on the H200: 595 vs 727 us at 8192 x 32000, 1525 vs 1556 at 4096 x 128256


@cuda.jit
def _softmax_warp_rows(x, out, rows, cols, vector):
    values = cuda.local.array(WARP_VALUES, float32)  # unrolled loops with constant indices: registers
    row = uint64(cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32)
    lane = uint64(cuda.threadIdx.x % 32)
    rows = uint64(rows)
    cols = uint64(cols)
    if row < rows:  # the whole warp leaves together, so its shuffles below see all 32 lanes
        base = row * cols
        # EXERCISE: write this part of `_softmax_warp_rows`. Read the hints one at a time.
        #   hint 1 (nudge): lane l holds chunks c = 4 * (l + 32 * k), k < WARP_CHUNKS: load_chunk them all into values[] (fill -inf) before using any.
        #   hint 2: _warp_max, then values[i] = exp(values[i] - m) and their sum; _warp_sum.
        #   hint 3 (nearly the answer): store_chunk each chunk times 1 / sum.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit(device=True, inline=True)
def _block_max_into(value, buffer):
    """Maximum over the block, in every thread, through ``buffer`` (32 floats of shared memory)."""
    lane = cuda.threadIdx.x % 32
    value = _warp_max(value)
    if lane == 0:
        buffer[cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    return _warp_max(buffer[lane] if lane < cuda.blockDim.x // 32 else NEG_INF)


@cuda.jit(device=True, inline=True)
def _block_sum_into(value, buffer):
    lane = cuda.threadIdx.x % 32
    value = _warp_sum(value)
    if lane == 0:
        buffer[cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    return _warp_sum(buffer[lane] if lane < cuda.blockDim.x // 32 else float32(0.0))


@cuda.jit
def _softmax_block_row(x, out, cols, vector):
    values = cuda.local.array(ROW_VALUES, float32)
    maxima = cuda.shared.array(32, float32)
    sums = cuda.shared.array(32, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    threads = uint64(cuda.blockDim.x)
    cols = uint64(cols)
    base = row * cols
    # EXERCISE: write this part of `_softmax_block_row`. Read the hints one at a time.
    #   hint 1 (nudge): the warp kernel with a block: chunks c = 4 * (t + threads * k), k < ROW_CHUNKS, and
    #   hint 2 (nearly the answer): _block_max_into / _block_sum_into (a barrier each) instead of the warp reductions.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _softmax_online(x, out, cols, vector):
    values = cuda.local.array(ROW_VALUES, float32)  # one step's loads, all issued before any is used
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    threads = uint64(cuda.blockDim.x)
    cols = uint64(cols)
    base = row * cols
    span = uint64(4 * ROW_CHUNKS) * threads  # columns the block covers in one step
    # EXERCISE: write this part of `_softmax_online`. Read the hints one at a time.
    #   hint 1 (nudge): pass 1, a step at a time: load ROW_CHUNKS chunks (fill -inf), then m_new = the maximum of m
    #   hint 2: and the step's values; s = s * exp(m - m_new) + sum of exp(v - m_new). Start m at LOWEST.
    #   hint 3 (nearly the answer): _block_merge the threads' (m, s); pass 2 reads the row again and writes exp(v - m) / s.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def warp_rows(x, out, warps=None, registers=None):
    """by_shape's kernel for rows up to WARP_ROW_COLS wide: a warp per row, ``warps`` rows a block
    (default: ROWS_PER_BLOCK, or 1 when rows are fewer than FEW_ROWS); ``registers``: see capped."""
    rows, cols = x.shape
    expect_row_width(cols, WARP_ROW_COLS, "warp_rows")
    if warps is None:
        warps = ROWS_PER_BLOCK if rows >= FEW_ROWS else 1
    capped(_softmax_warp_rows, registers)[blocks_for(rows, warps), 32 * warps](flat_view(x), flat_view(out), rows, cols, rows_fit_vectors(x, out))


def block_row_threads(cols):
    """Threads for a block that holds a row in registers, ROW_VALUES a thread: a whole number of warps."""
    return min(MAX_ROW_THREADS, 32 * blocks_for(blocks_for(cols, ROW_VALUES), 32))


def block_rows(x, out, registers=None):
    """by_shape's kernel for rows up to BLOCK_ROW_COLS wide: a block per row (``registers``: see capped)."""
    rows, cols = x.shape
    expect_row_width(cols, BLOCK_ROW_COLS, "block_rows")
    capped(_softmax_block_row, registers)[rows, block_row_threads(cols)](flat_view(x), flat_view(out), cols, rows_fit_vectors(x, out))


def online_rows(x, out, threads=ONLINE_THREADS):
    """by_shape's kernel for rows of any width: the online softmax, two reads of the row."""
    rows, cols = x.shape
    _softmax_online[rows, threads](flat_view(x), flat_view(out), cols, rows_fit_vectors(x, out))


# Rows too wide for registers: a block per row holds the row in shared memory, read from memory once
# (solutions/_vector_io.py: copy_row_to_shared, launch_shared_row).
SHARED_ROW_MAX_COLS = SHARED_ROW_FITS  # the widest row a block's shared memory holds (57344); wider: online_rows
SHARED_ROW_THREADS = 1024  # threads a row at most ...
SHARED_ROW_CHUNKS = 1  # ... and fewer where a row has fewer than this many chunks of 4 columns a thread


@cuda.jit
def _softmax_shared_row(x, out, cols, vector):
    row = cuda.shared.array(0, float32, alignment=SHARED_ALIGN16)  # dynamic: the row, whole chunks of 4
    maxima = cuda.shared.array(32, float32)
    sums = cuda.shared.array(32, float32)
    first = uint32(4) * uint32(cuda.threadIdx.x)  # this thread's chunks: first + k * step
    step = uint32(4) * uint32(cuda.blockDim.x)
    base = uint64(cuda.blockIdx.x) * uint64(cols)
    cols = uint32(cols)
    # EXERCISE: write this part of `_softmax_shared_row`. Read the hints one at a time.
    #   hint 1 (nudge): copy_row_to_shared (padding -inf); this thread's chunks of the copy (load4): their maximum, _block_max_into;
    #   hint 2 (nearly the answer): then exp(v - m) written back over them (store4) and summed, _block_sum_into; then each times 1 / sum, stored.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def shared_rows(x, out, threads=SHARED_ROW_THREADS):
    """by_shape's kernel for rows wider than BLOCK_ROW_COLS, up to SHARED_ROW_MAX_COLS: a block per row, the
    row in shared memory; ``threads``: the most a row gets."""
    rows, cols = x.shape
    expect_row_width(cols, SHARED_ROW_MAX_COLS, "shared_rows", "shared memory")
    threads = shared_row_threads(cols, threads, SHARED_ROW_CHUNKS)
    launch_shared_row(_softmax_shared_row, rows, threads, cols, flat_view(x), flat_view(out), cols, rows_fit_vectors(x, out))


# Rows from WARP_ROW_COLS + 1 up to VECTOR_ROWS_COLS wide (0: no rows) take the fp16/bf16 ladders' vector_rows kernel
# made float32: its template instantiated with a vector of four floats (softmax_float_row, at the end of the module).
VECTOR_ROWS_COLS = 8192
FLOAT_VECTORS = 4  # 16-byte vectors of four floats each thread holds: a 4096-column row is 256 threads (8: 128)
FLOAT_BLOCK_ROWS_THREADS = 256  # narrower rows share a block of up to this many threads (2-D: threads a row x rows)
FLOAT_REGISTER_CAP = None  # registers a thread (None: as ptxas chooses), as REGISTER_CAP for the 16-bit kernel
# Rows up to NARROW_ROW_COLS wide (0: none) take the same kernel with one vector a thread, before the warp kernel:
# a 1024-column row is then 256 threads, each with one 16-byte load in flight, where a warp holds it 32 values a lane.
NARROW_ROW_COLS = 0  # off: slower than the warp kernel on an H200 at 4096 and 32768 rows of 1024 (see by_shape)
NARROW_FLOAT_VECTORS = 1


def float_vector_rows(x, out):
    """by_shape's kernel for rows up to VECTOR_ROWS_COLS wide: the row held as 16-byte vectors, FLOAT_VECTORS a
    thread. Rows it cannot hold as whole vectors (a width not a multiple of 4, arrays off 16 bytes, wider than
    1024 threads of FLOAT_VECTORS vectors hold) take the block-per-row kernel, as they would without it."""
    rows, cols = x.shape
    if rows * cols == 0 or not fits_vector_rows(cols, FLOAT_VECTORS, x, out, vector=4):
        return (block_rows if cols <= BLOCK_ROW_COLS else shared_rows)(x, out)
    launch_float_rows(_softmax_float_vectors, FLOAT_VECTORS, x, out)


def narrow_vector_rows(x, out):
    """by_shape's kernel for rows up to NARROW_ROW_COLS wide: float_vector_rows' kernel with NARROW_FLOAT_VECTORS
    vectors a thread. Rows it cannot hold take the kernel the table gives them without it."""
    rows, cols = x.shape
    if rows * cols == 0 or not fits_vector_rows(cols, NARROW_FLOAT_VECTORS, x, out, vector=4):
        return (warp_rows if cols <= WARP_ROW_COLS else float_vector_rows)(x, out)
    launch_float_rows(_softmax_narrow_vectors, NARROW_FLOAT_VECTORS, x, out)


def launch_float_rows(kernel, vectors, x, out):
    rows, cols = x.shape
    blocks, block = vector_rows_shape(rows, cols, vectors, FLOAT_BLOCK_ROWS_THREADS, vector=4)
    capped(kernel, FLOAT_REGISTER_CAP)[blocks, block](flat_view(x), flat_view(out), rows, cols)


# Few rows up to SMALL_ROW_COLS wide: the time is a row's latency, not memory, so a row gets a block of threads with
# one 16-byte vector each (256 threads at 1024 columns) and ONE reduction, of (max, sum of exp) pairs.
SMALL_ROW_COLS = 1024  # rows up to this wide, a multiple of 4 floats, on 16 bytes ...
SMALL_MAX_ROWS = 256  # ... when they are at most this many (0: never); more rows take warp_rows (4096 x 1024 and more)
SMALL_VECTORS = 1  # 16-byte vectors each thread holds: a 1024-column row is 256 threads (2: 128)
SMALL_VALUES = 4 * SMALL_VECTORS
SMALL_BLOCK_THREADS = 256  # rows narrower than 128 columns (32 threads) share a block of up to this many threads
# Rows that fill the launch exactly (cols = 4 x SMALL_VECTORS x the threads a row, rows a multiple of the rows a block:
# 256 x 1024) take the kernel compiled with whole_row, which has no bounds checks. False: every launch has them.
SMALL_WHOLE_ROWS = True
# The most warps a row has (its threads at SMALL_ROW_COLS columns): _merge_warps' loops' bound.
SMALL_ROW_WARPS = vector_rows_shape(1, SMALL_ROW_COLS, SMALL_VECTORS, 1024, vector=4)[1][0] // 32


@cuda.jit(device=True, inline=True)
def _share_warp_pairs(m, s, maxima, sums):
    """Lane 0 of each warp writes the warp's pair to shared memory, one barrier; returns (warps a row, where this
    row's pairs start). maxima, sums: a float a warp of the block."""
    warps = uint32(cuda.blockDim.x) >> uint32(5)
    t = uint32(cuda.threadIdx.x)
    first = uint32(cuda.threadIdx.y) * warps
    if t & uint32(31) == uint32(0):
        maxima[first + (t >> uint32(5))] = m
        sums[first + (t >> uint32(5))] = s
    cuda.syncthreads()
    return warps, first


@cuda.jit(device=True, inline=True)
def _merge_warps(m, s, maxima, sums):
    """The row's (max, sum) pair from its warps' pairs, in each thread, with no exp between two shuffles: each
    warp's pair through shared memory, one barrier; each thread reads every maximum of its row's warps
    (broadcast reads, at most SMALL_ROW_WARPS: the loop unrolls) and takes the largest, M; then lane k of each
    group of SMALL_ROW_WARPS lanes rescales warp k's sum to it, s e^(m - M) (one exp a lane), and
    log2(SMALL_ROW_WARPS) shuffles add the group's."""
    if uint32(cuda.blockDim.x) == uint32(32):
        return m, s
    warps, first = _share_warp_pairs(m, s, maxima, sums)
    last = warps - uint32(1)  # warps is a power of two: j & last is j for j < warps, an earlier warp past them
    row_m = maxima[first]
    for j in range(1, SMALL_ROW_WARPS):
        row_m = max(row_m, maxima[first + (uint32(j) & last)])
    k = uint32(cuda.threadIdx.x) & uint32(SMALL_ROW_WARPS - 1)
    i = first + (k & last)
    term = sums[i] * FLOAT_EXP(maxima[i] - row_m)  # +inf or NaN in a maximum: inf - inf, a NaN sum
    row_s = term if k <= last else float32(0.0)  # each warp's term once in each group of SMALL_ROW_WARPS lanes
    offset = SMALL_ROW_WARPS // 2
    while offset > 0:
        row_s += cuda.shfl_xor_sync(FULL_MASK, row_s, offset)
        offset //= 2
    return row_m, row_s


@cuda.jit
def _softmax_small_rows(x, out, rows, cols):
    maxima = cuda.shared.array(32, float32)
    sums = cuda.shared.array(32, float32)
    e = cuda.local.array(SMALL_VALUES, float32)  # x, then exp(x - m) in place: registers once the loops unroll
    base, width = vector_row(rows, cols)  # blockDim.x threads a row, blockDim.y rows a block
    first = uint32(cuda.threadIdx.x * 4)  # vector k of this thread: columns first + k * step ...
    step = uint32(cuda.blockDim.x * 4)
    # EXERCISE: write this part of `_softmax_small_rows`. Read the hints one at a time.
    #   hint 1 (nudge): load4 each vector k (its columns from column(first, step, k), if below width; else -inf) into e, all first.
    #   hint 2: m = the maximum of LOWEST and e, then of the warp (_warp_max); e = FLOAT_EXP(e - m) in place, s their sum.
    #   hint 3 (nearly the answer): the warp's pair (m, _warp_sum(s)); _merge_warps gives the row's (M, S); out = e * (e^(m - M) / S).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def small_rows(x, out):
    """by_shape's kernel for at most SMALL_MAX_ROWS rows up to SMALL_ROW_COLS wide: a block of threads a row,
    SMALL_VECTORS 16-byte vectors a thread, one reduction of (max, sum) pairs. More rows, wider ones (its merge
    reads at most SMALL_ROW_WARPS warps' pairs) and rows it cannot hold as whole vectors (a width not a multiple
    of 4, arrays off 16 bytes) take the kernel the table gives them without it."""
    rows, cols = x.shape
    fits = 0 < cols <= SMALL_ROW_COLS and fits_vector_rows(cols, SMALL_VECTORS, x, out, vector=4)
    if not 0 < rows <= SMALL_MAX_ROWS or not fits:
        return (warp_rows if cols <= WARP_ROW_COLS else float_vector_rows)(x, out)
    blocks, block = vector_rows_shape(rows, cols, SMALL_VECTORS, SMALL_BLOCK_THREADS, vector=4)
    kernel = _softmax_small_whole_rows if SMALL_WHOLE_ROWS and fills_launch(rows, cols, block, 4 * SMALL_VECTORS) \
        else _softmax_small_rows
    kernel[blocks, block](flat_view(x), flat_view(out), rows, cols)


# The dispatch table: (widest row, kernel), first match wins. The kernel for any wider row last.
BY_SHAPE = [(NARROW_ROW_COLS, narrow_vector_rows), (SMALL_ROW_COLS, small_rows), (WARP_ROW_COLS, warp_rows),
            (VECTOR_ROWS_COLS, float_vector_rows), (BLOCK_ROW_COLS, block_rows), (SHARED_ROW_MAX_COLS, shared_rows), (None, online_rows)]


def kernel_for(cols, table=BY_SHAPE):
    return next(launch for limit, launch in table if limit is None or cols <= limit)


@op.stage("by_shape", """
    No one kernel wins at every shape, so the last stage chooses by row width, and up to 1024 columns by the
    number of rows. Few rows (up to 256 of up to 1024 columns) leave the GPU little work to overlap, and a
    row's latency, not memory bandwidth, is much of the time: each row gets a block of threads holding one
    16-byte vector each (256 threads at 1024 columns), and one trip through shared memory. In each warp the
    maximum m comes first, five shuffles; each thread takes exp(x - m) of its four values in place, and five
    shuffles more add their sums: the warp's pair (m, s). Lane 0 of each warp writes it to shared memory;
    after the one barrier each thread reads every warp's maximum and takes the largest, M, and lane k
    rescales warp k's sum by e^(m - M), one exp, for three shuffles to add. The row's maximum and then its
    sum through shared memory would be two barriers, the second waiting on the first; merging (max, sum)
    pairs lane by lane, M = max(m, m'), S = s e^(m - M) + s' e^(m' - M), needs one barrier but puts an exp
    after each shuffle, eight in a row at 256 threads, each waiting on the last. Each thread keeps its
    exp(x - m) in registers, scales them by e^(m - M) / S (one exp more) and stores them with one 16-byte
    store. What is left is the bookkeeping torch.compile's kernel, compiled for one shape, does not have:
    rows that fill their launch exactly (1024 wide) take the kernel compiled without bounds checks, its
    load waiting on nothing but the row's address: 3.4 us at 256 rows against 3.6 with the checks
    (torch.compile 3.1 in the same run). It compiles to about 185 instructions a thread, where the pairs
    merged lane by lane took about 300, yet the two merges ran level (3.4 us both): the time is the
    row's memory round trips, not its instructions. So were x and out passed as one 8-byte address each
    instead of numba's seven values an array (3.6 us both), though Nsight Compute had counted twice
    torch.compile's constant-cache misses. More rows up to 1024 wide get a warp each (four to a block; one,
    when rows are fewer than 4096, to spread them over every SM): the row sits in registers, 32 values a
    lane, read once with 16-byte loads (load4) and written once with 16-byte stores, and the reductions are
    shuffles alone, no barrier. Rows up to 8192 wide take the fp16/bf16
    ladders' last kernel (vector_rows) with a vector of four floats: each thread issues its 4 16-byte loads
    of the row before it uses any (a 4096-column row is a block of 256 threads), takes their maximum, then
    exp(x - max) once, in place, and their sum from those registers, and stores them scaled by one
    approximate reciprocal of the sum. Everything that is not softmax's own arithmetic is gone: a
    two-dimensional block (narrower rows share one, and no thread divides to find its row), unsigned 32-bit
    indices, and each reduction is shuffles, one barrier and log2(warps) shuffles over the warps' results.
    It compiles to about 400 instructions a thread for its 16 values (libdevice's expf, 2 ulp, is 8 an
    element of them) and 40 registers; the block-per-row kernel, the same loads with 64-bit indices,
    load_chunk's bounds checks and its column-at-a-time path, to about 750 and 52 registers. That kernel
    takes rows up to 16384 wide, 16 values a thread (768 threads at 12288), one read, two barriers. Wider
    rows do not fit in registers, but up to 57344 columns (224 KB) they fit in shared memory, which a block
    may have up to 227 KB of once the kernel opts in (set_max_dynamic_shared_memory; 48 KB without). A block
    of 1024 threads copies its row in with cp.async, 16 bytes a copy, which the memory system writes to
    shared memory itself, so no register holds the data and every copy a thread issues is in flight at once;
    each thread copies the chunks it will read back, so no barrier is needed before it does. The maximum is
    a pass over shared memory; the exponentials are written back over the row as they are summed, and the
    last pass scales them and writes them out with 16-byte stores: one read and one write of memory, where
    the online softmax below reads twice and stage 7 three times (at 32768 columns the re-reads miss the
    caches: a row is 128 KB). Wider rows take the online softmax, a block of 1024 threads a row, which reads
    each step of 16 values a thread, folds its maximum and sum of exponentials into a running pair (one exp
    per element, one per step to rescale), merges the threads' pairs, and reads the row once more to write
    it. 1024 threads beat 512 on the H200 (601 vs 724 us at 8192 x 32000, 1526 vs 1555 at 4096 x 128256); at
    56 registers an SM holds one block of 1024 or two of 512, the same threads, and the larger block goes
    through a row in half as many steps. A row whose width is not a multiple of 4 (its rows do not start on
    16-byte boundaries) is read a column at a time, by the kernels the table has without the vector ones. On
    an H200, against torch.compile in the same run: at 32768 x 4096 the vector kernel takes 262.7 us, 96% of
    the copy ceiling, against 316.6 (1.21x; the block-per-row kernel took 267.4 in one process with it); at
    4096 x 4096, 35.3 against 44.1 (1.25x); at 4096 x 32768 the shared row takes 276.5 against 369.0
    (1.33x), where stage 7 took 533. At 1024 columns the warp kernel lost to torch.compile at few rows
    (11.4 against 9.5 us at 4096 rows, 4.0 against 3.3 at 256) and wins at 32768 rows (67.2 against torch's
    80.7); the vector kernel with one vector a thread (256 threads a row, but two reductions) was slower
    still (12.9 and 90.1 us), so the table leaves it out (NARROW_ROW_COLS). The pairs merged lane by lane took
    3.6 us at 256 rows where the warp kernel took 4.0 in the same sweep (torch.compile, whose Triton kernel is the same
    design, 3.1), but 15.0 at 4096 rows against the warp kernel's 11.2: with four waves of rows, memory is
    the time again, and a warp a row keeps more of it in flight than 256 threads waiting on one barrier. So
    the pair reduction takes at most 256 rows (SMALL_MAX_ROWS).""",
    boundaries={"cols": tuple(sorted({SMALL_ROW_COLS, WARP_ROW_COLS} - {0})), "rows": tuple({SMALL_MAX_ROWS} - {0})})
def by_shape(x, out):
    kernel_for(x.shape[1])(x, out)


# ======================================================================================================
# softmax[fp16] and softmax[bf16]: 16-bit rows, float32 inside
# ======================================================================================================
# Their kernels start from stage 7's (ilp): its THREADS, ILP, ILP_SPAN and TWO_WARPS, which are also what
# solutions/_half.py's block_max and block_sum assume.
# Each launcher serves both formats (stage_of); each kernel is written once, a template compiled per format
# by solutions/_half.py's per_format, and the launcher picks template.kernels[x.dtype].

def _softmax_inputs(dtype):
    def make(size, rng):
        # softmax's own inputs (normal(0, 2), rows of +-1e4, rows of -inf but one), with the trap rows
        # moved off the first two: a two-row check then still sees ordinary rows.
        rows, cols = size
        x = rng.normal(0.0, 2.0, size).astype(np.float32)
        for r in range(3, rows, 5):
            x[r] = rng.uniform(-1e4, 1e4, cols)
        for r in range(4, rows, 5):
            x[r] = -np.inf
            x[r, rng.integers(cols)] = rng.normal(0.0, 2.0)
        return (x.astype(dtype),)
    return make


def _softmax_adversarial(dtype):
    big = 6.0e4 if dtype == FLOAT16 else 1.0e30

    def cases(size, rng):
        rows, cols = size
        constant = np.full(size, rng.uniform(-3, 3), np.float32)  # sum of exps = cols: an fp16 sum stalls at 2048
        huge = rng.uniform(-big, big, size).astype(np.float32)  # exp overflows unless the max is subtracted
        tiny = np.full(size, -14.0, np.float32)  # e^-14 against a 0 in each row: fp16 subnormal outputs
        tiny[np.arange(rows), rng.integers(cols, size=rows)] = 0.0
        subnormal = rng.uniform(-3e-6, 3e-6, size).astype(np.float32)  # fp16 subnormal inputs
        one_hot = np.full(size, -np.inf, np.float32)  # -inf - -inf is NaN: the maximum must be finite
        one_hot[np.arange(rows), rng.integers(cols, size=rows)] = rng.normal(0.0, 2.0, rows)
        return [(label, (a.astype(dtype),)) for label, a in
                [("constant rows", constant), ("huge logits", huge), ("tiny probabilities", tiny),
                 ("subnormal inputs", subnormal), ("-inf but one", one_hot)]]
    return cases


def _softmax_op(dtype, rank):
    return half_operator(
        dtype,
        name="softmax", variant={"dtype": short_name(dtype)},
        targets=[of_ceiling(85, "copy_gbps"), against_peer(1.2, "eager")],
        title=f"Softmax over the rows of {a_matrix(dtype)}, float32 inside",
        reference=lambda x: softmax64(*as_float64(x)),
        make_inputs=_softmax_inputs(dtype),
        bytes_moved=lambda size: 2 * dtype.itemsize * size[0] * size[1],  # read x once, write out once
        flops=lambda size: 4 * size[0] * size[1],
        validate=lambda x, out: expect_rows(dtype, ("x", x), ("out", out)),
        peer=torch_peer(f"torch.softmax ({short_name(dtype)})",
                        lambda torch, x, out: torch.softmax(peers.as_torch(x), 1, out=peers.as_torch(out))),
        torch_expression=lambda torch, size: lambda x: torch.softmax(x, dim=-1),  # for torch.compile
        rank=rank,
        adversarial_inputs=_softmax_adversarial(dtype),
        record_all_sizes=True,
        **ROW_SIZES,
    )


HALF_OPERATORS = [_softmax_op(dtype, 200 + i) for i, dtype in enumerate(FORMATS)]


@cuda.jit(device=True, inline=True)
def exact_exp(v):
    """libdevice's expf: accurate to 2 ulp of float32, about a dozen instructions."""
    return math.exp(v)


@cuda.jit(device=True, inline=True)
def fast_exp(v):
    """e^v as 2^(v log2 e) with the hardware's approximate exp2: ``mul.f32`` and ``ex2.approx.f32``,
    relative error about 2^-22, a thousandth of an fp16's rounding."""
    return libdevice.fast_expf(v)


# -- 1. widened: the float32 kernel, reading and writing halves ----------------------------------------

@cuda.jit(device=True, inline=True)
def softmax_widened_row(x, out, widen, narrow):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    xs = cuda.local.array(ILP, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    # EXERCISE: write this part of `softmax_widened_row`. Read the hints one at a time.
    #   hint 1 (nudge): softmax's ilp kernel (three passes, eight columns a step, then the rest one by one), with
    #   hint 2: each load x[row, j] (16 bits) widened to float32 first: widen(x[row, j]).
    #   hint 3 (nearly the answer): the write pass stores narrow(value), the 16 bits of the rounded result.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@per_format
def _softmax_widened(x, out):
    softmax_widened_row(x, out, widen, narrow)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "widened", """
    The float32 ladder's last kernel with 16-bit loads and stores: a block of 256 threads per row,
    three passes (maximum, sum of exponentials, output), eight loads in flight per thread. Each
    element is widened to float32 as it is loaded and rounded to 16 bits once, as it is stored, so
    the maximum and the sum are float32. The bytes halve, but not the instructions: each element
    still takes a load per pass, one conversion each way (fp16: cvt.f32.f16 and cvt.rn.f16.f32; bf16:
    a shift in, five integer instructions and a NaN select out), and eight 2-byte loads a thread
    keep half as many bytes in flight as the float32 kernel's eight 4-byte ones.""", dtype=np.float32)
def softmax_widened(x, out):
    kernel = _softmax_widened.kernels[x.dtype]
    kernel[x.shape[0], THREADS](bits16(x), bits16(out))


# -- 2. packed: two halves per load and store -----------------------------------------------------------

@cuda.jit(device=True, inline=True)
def softmax_packed_row(x16, x32, out16, out32, cols, widen, narrow, exp, threads):
    reduced = cuda.shared.array(TWO_WARPS, float32)
    ws = cuda.local.array(ILP, uint32)
    t = uint64(cuda.threadIdx.x)
    last = uint64((ILP - 1) * threads)  # offset of a step's last word from its first
    span = uint64(ILP * threads)  # words a block covers per unrolled step
    warps = threads // 32
    start, end, first, stop = row_words(uint64(cuda.blockIdx.x), uint64(cols))
    edge = edge_element(t, start, end)
    # EXERCISE: write this part of `softmax_packed_row`. Read the hints one at a time.
    #   hint 1 (nudge): the widened kernel over the row's words: word w holds two halves, widen(w) and widen(w >> 16).
    #   hint 2: words first + t, first + t + threads, ... up to stop, eight a step (last, span); the odd edge element (if
    #   hint 3 (nearly the answer): edge < end) through the 16-bit arrays. exp is passed in; store a word as pack(narrow(a), narrow(b)).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@per_format
def _softmax_packed(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, widen, narrow, exact_exp, THREADS)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "packed", """
    The same three passes over 32-bit words, two halves each: one load instruction brings two
    elements (ld.global.u32, then a free split of the register and a conversion per half), one
    store writes two (the two rounded halves packed with mov.b32 {lo, hi}), and eight words in
    flight per thread are the float32 kernel's 32 bytes again. The matrix is seen flat: when the
    number of columns is odd, every other row starts in the middle of a word, so each row has at most
    one 16-bit element at each end, loaded and stored on its own: a 32-bit store there would also
    write the neighbouring row's half, which another block is writing at the same time.""", dtype=np.float32)
def softmax_packed(x, out):
    kernel = _softmax_packed.kernels[x.dtype]
    kernel[x.shape[0], THREADS](flat_bits16(x), words(x), flat_bits16(out), words(out), x.shape[1])




# -- 3. fast_exp: an exponential as accurate as a half needs ---------------------------------------------

@per_format
def _softmax_fast(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols, widen, narrow, fast_exp, THREADS)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "fast_exp", """
    The packed kernel with a cheaper exponential. At 2 bytes an element, memory delivers twice as
    many elements per second as in float32, so each element gets half the instructions it had, and
    the exponential was most of them: libdevice's expf (about a dozen instructions, two per
    element) is accurate to float32's last bits, which rounding the result to 16 bits then throws
    away. The hardware's approximate exp2 (ex2.approx, via libdevice.fast_expf: a multiply by log2 e
    and one instruction) is off by about 2^-22, a thousandth of an fp16 rounding step, so the output
    is the same to within one rounding; only the kernel's instruction count changes.""", dtype=np.float32)
def softmax_fast_exp(x, out):
    kernel = _softmax_fast.kernels[x.dtype]
    kernel[x.shape[0], THREADS](flat_bits16(x), words(x), flat_bits16(out), words(out), x.shape[1])


# -- 4. rows_in_flight: four warps per row ----------------------------------------------------------------

@per_format
def _softmax_rows(x16, x32, out16, out32, cols):
    softmax_packed_row(x16, x32, out16, out32, cols,
                       widen, narrow, fast_exp, ROW_THREADS)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "rows_in_flight", """
    The fast_exp kernel in blocks of 128 threads per row instead of 256. A block's time on a row is mostly
    fixed latency (the first pass's loads, two barriers, the reductions), whatever the row's bytes;
    at 2 bytes an element a 4096-column row is 8 KB where the float32 kernel's was 16 KB, so 256-
    thread blocks (eight per multiprocessor at 32 registers) keep 64 KB of rows moving per
    multiprocessor where the float32 ilp kernel kept 96 KB (six blocks of 16 KB): about half its
    bandwidth, which is what the packed stage measured. Blocks of 128 threads fit sixteen to a
    multiprocessor: 128 KB of rows in flight, each thread two unrolled steps of eight words a pass
    (the float32 kernel's shape again), and the reductions cross four warps instead of eight.""", dtype=np.float32)
def softmax_rows_in_flight(x, out):
    kernel = _softmax_rows.kernels[x.dtype]
    kernel[x.shape[0], ROW_THREADS](flat_bits16(x), words(x), flat_bits16(out), words(out), x.shape[1])


# -- in_registers (not a stage): the row read once, 16 bytes a load, two results rounded by one instruction --

@cuda.jit(device=True, inline=True)
def softmax_registers_row(x16, x32, out16, out32, rows, cols, threads, widen, narrow, narrow2):
    reduced = cuda.shared.array(GROUP_SLOTS, float32)
    held = cuda.local.array(HELD, uint32)
    results = cuda.local.array(4, uint32)
    t, start, end, head_end, first, stop, tail = group_row(uint64(rows), uint64(cols), uint64(threads))
    head, tail = start + t, tail + t  # this thread's head and tail element, if they are in the row
    warps = threads // 32
    # EXERCISE: write this part of `softmax_registers_row`. Read the hints one at a time.
    #   hint 1 (nudge): load_held brings the thread's CHUNKS vectors at once; word i of held is in the row when its
    #   hint 2: vector first + t + (i // 4) * threads is before stop. Head and tail elements come 16 bits at a time.
    #   hint 3 (nearly the answer): maximum and sum from the registers (group_max, group_sum), then one store4 per vector: narrow2 packs a word.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@per_format
def _softmax_registers(x16, x32, out16, out32, rows, cols, threads):
    softmax_registers_row(x16, x32, out16, out32, rows, cols, threads,
                          widen, narrow, narrow2)  # noqa: F821 - bound per format


def softmax_registers_launch(kernels, x, out):
    """Launch x's format's row-in-registers kernel from ``kernels`` ({dtype: kernel}); a row wider than 1024
    threads hold, or an array that starts off a 16-byte boundary (a view mid-buffer), takes the
    rows_in_flight kernel instead."""
    rows, cols = x.shape
    threads = registers_threads(cols)
    if threads is None or not aligned16(x, out):
        return softmax_rows_in_flight(x, out)
    blocks, block = registers_grid(rows, threads)
    kernel = kernels[x.dtype]
    kernel[blocks, block](flat_bits16(x), words(x), flat_bits16(out), words(out), rows, cols, threads)


def softmax_in_registers(x, out):
    """Not a stage: RMSNorm's in_registers idea applied to softmax, measured slower than rows_in_flight on an
    H200 at 32768 x 4096 (fp16 266.7 us against 165.3, bf16 206.8 against 189.0; see RMSNORM_ONLY).
    Kept so that the occupancy explanation can be tested: timed with its registers capped, it should catch up."""
    softmax_registers_launch(_softmax_registers.kernels, x, out)


# -- 5. vector_rows: the row held as 16-byte vectors, widened once, a lean kernel ------------------------------
# The 16-bit norms' last stage (solutions/layernorm.py, VECTOR_ROWS) with softmax's two reductions; the shape,
# the fit test and the row reductions are solutions/_half.py's. These constants are this ladder's (sweepable).

VECTORS = 4  # 16-byte vectors of x each thread holds (8 halves each): a 4096-column row is 128 threads
BLOCK_ROWS_THREADS = 128  # narrow rows share a block of up to this many threads (one row a warp, no barrier)
REGISTER_CAP = None  # registers a thread (None: as ptxas chooses); a cap buys rows resident with spills
HELD_WORDS = 4 * VECTORS  # a local array's shape must be a constant: a module global
HELD_VALUES = VECTOR * VECTORS
WORD = uint32  # what a held vector is four of: 32-bit words, two halves each (by_shape's float32 rows: floats)
# What the template asks of a format (load_vector, element, store_vector) is solutions/_half.py's, as for the norms'
# vector_rows: these names are the 16-bit formats'; by_shape's float32 kernel binds float_format's instead.


@cuda.jit(device=True, inline=True)
def softmax_vector_row(x, out, rows, cols, widen, narrow2, exp):
    partials = cuda.shared.array(GROUP_SLOTS, float32)
    held = cuda.local.array(HELD_WORDS, WORD)  # x as loaded: VECTORS vectors of four words (two halves, or a float)
    e = cuda.local.array(HELD_VALUES, float32)  # x widened once, then exp(x - max) in place, then scaled
    base, width = vector_row(rows, cols)
    first = uint32(cuda.threadIdx.x * VECTOR)  # vector k of this thread: columns first + k * step ...
    step = uint32(cuda.blockDim.x * VECTOR)
    # EXERCISE: write this part of `softmax_vector_row`. Read the hints one at a time.
    #   hint 1 (nudge): load_vector each vector k whose column c = column(first, step, k) is below width, all before any is used.
    #   hint 2: widen each element once (element) into e; row_max of the in-row ones; e = exp(e - max) in place, row_sum.
    #   hint 3 (nearly the answer): per vector in the row: e * reciprocal(sum) in place, then one store_vector at base + c.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@per_format
def _softmax_vectors(x, out, rows, cols):
    softmax_vector_row(x, out, rows, cols, widen, narrow2, fast_exp)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "vector_rows", """
    The 16-bit norms' last stage (layernorm.py's vector_rows) with softmax's two reductions. What
    changed from rows_in_flight: that kernel read the row a 32-bit word at a time three times (the
    maximum, the sum of exponentials, the output; the second and third from L1), widened each half
    three times and took its exponential twice, in 64-bit index arithmetic with a 16-bit head and tail
    path for odd widths. Here each thread loads VECTORS = 4 vectors of its row, 16 bytes (eight halves)
    a load, all issued before any is used (a 4096-column row is a block of 128 threads); each half is
    widened to float32 once, its maximum taken, then exp2((x - max) log2 e) (mul and ex2.approx, as
    fast_exp) computed once, in place, summed, and scaled by one approximate reciprocal of the sum; the
    results are stored 16 bytes at a time, each pair rounded by one instruction. Why that is faster:
    at the copy ceiling a multiprocessor must move about four elements a cycle (4258 GB/s, 4 bytes an
    element read and written, 132 multiprocessors near 2 GHz) and it issues at most 128 thread-
    instructions a cycle, so a 16-bit row operator has about 30 instructions an element at perfect
    issue and half that in practice; three passes of word loads, conversions and index arithmetic
    spent them. The rest is the norms' lean frame: a two-dimensional block (threads a row by rows a
    block, so no thread divides to find its row), unsigned 32-bit indices, and each reduction (the
    maximum, then the sum) as shuffles, one barrier and log2(warps) shuffles over the warps' results.
    Widths not a multiple of 8 halves, arrays that do not start on 16 bytes and rows wider than 32768
    take rows_in_flight, so the kernel has no head or tail path. On an H200 at 32768x4096: 130.4 us in
    bf16 and 130.5 in fp16, 97% of the copy ceiling, against torch.compile's 309.7 and 302.2 in the same
    run (2.38x and 2.32x).""", dtype=np.float32)
def softmax_vector_rows(x, out):
    rows, cols = x.shape
    if rows * cols == 0 or not fits_vector_rows(cols, VECTORS, x, out):
        return softmax_rows_in_flight(x, out)
    blocks, block = vector_rows_shape(rows, cols, VECTORS, BLOCK_ROWS_THREADS)
    kernel = capped(_softmax_vectors.kernels[x.dtype], REGISTER_CAP)
    kernel[blocks, block](flat_bits16(x), flat_bits16(out), rows, cols)


# -- by_shape's float32 vector_rows kernels (VECTOR_ROWS_COLS, NARROW_ROW_COLS): the template above, four floats ---
# a vector (solutions/_half.py: float_format), FLOAT_VECTORS or NARROW_FLOAT_VECTORS of them a thread. The exp is
# libdevice's expf, as in the float32 ladder's other kernels (exact_exp: 2 ulp, 8 instructions an element on sm_90);
# the 16-bit kernel's fast_exp (4) rounds (x - max) log2 e to float32 before its ex2.approx, an error that grows
# with |x - max| (about 3e-6 relative near -87, where exp underflows), inside float32's 1e-5: FLOAT_EXP = fast_exp
# compiles to 340 instructions a thread and 32 registers where exact_exp takes 396 and 40 (FLOAT_VECTORS = 4).
FLOAT_EXP = exact_exp
softmax_float_row = instantiate(softmax_vector_row.py_func, dict(globals(), **float_format(FLOAT_VECTORS)),
                                "softmax_float_row", jit=dict(device=True, inline=True))
softmax_narrow_row = instantiate(softmax_vector_row.py_func, dict(globals(), **float_format(NARROW_FLOAT_VECTORS)),
                                 "softmax_narrow_row", jit=dict(device=True, inline=True))


@cuda.jit
def _softmax_float_vectors(x, out, rows, cols):
    softmax_float_row(x, out, rows, cols, None, None, FLOAT_EXP)


@cuda.jit
def _softmax_narrow_vectors(x, out, rows, cols):
    softmax_narrow_row(x, out, rows, cols, None, None, FLOAT_EXP)


# small_rows' kernel for rows that fill the launch (SMALL_WHOLE_ROWS): whole_row's constant width drops the checks.
# Made here, where the names it uses (FLOAT_EXP) are all defined.
_softmax_small_whole_rows = instantiate(_softmax_small_rows.py_func, dict(globals(), vector_row=whole_row),
                                        "_softmax_small_whole_rows", jit={})

OPERATORS = [op, *HALF_OPERATORS]
