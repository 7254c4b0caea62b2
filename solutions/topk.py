"""Top-k of each row of a float32 matrix: the k largest values and their column indices, largest first.

The sampling step of a language model: 4096 rows of logits over a vocabulary of 32,000 or 128,256
tokens, k of about 50. A row is far too long for one thread and k is far smaller than the row, so
sorting the whole row does a thousand times more work than the answer needs. The ladder goes from a
full sort to selecting without sorting: a radix select finds the k-th largest by counting (a
histogram of the key bits, a byte at a time), and the last stage reads each row once, keeping only
elements that beat the k-th best seen so far and merging them with a bitonic sort in shared memory.

The order is ``torch.topk``'s: larger first; NaN ranks above every number (+inf included) and all
NaNs tie; -0.0 ranks just below +0.0 (torch's radix select ranks them so too); equal values go to the
lower index first, so the answer never depends on which thread finished first (torch.topk also keeps
the lower indices of a tie at the k-th place; within its answer its sort may order equal values
otherwise, which logits without ties never show). Every stage gets this from one idea: each
element's float bits become an unsigned key whose integer order is that order (flip every bit of a
negative, set the sign bit of a positive, NaN -> 0xFFFFFFFF), and the key with the inverted column
index below it, as a 64-bit integer, is unique in its row: the top k are the k largest of those.

A top-k reads the row once (4 bytes per element) and writes 8 bytes per selected element: bound by
memory bandwidth when the selection costs less than the read, which is what the stages work towards.

A stage is called ``stage(x, k, out)``. ``k`` is a one-element int32 array holding k, as
``torch.topk(x, k)`` takes it (a stage's inputs are all arrays, and the float64 reference sees only
the inputs); it must equal ``out.shape[2]``, which is what the launchers size their work by, so
nothing is read back from the device. ``out`` is one int32 array of shape (2, rows, k): ``out[0]``
holds the selected values' float32 bits (``out[0].view(np.float32)`` are the values; bits, so that
NaN payloads and -0.0 are compared exactly), ``out[1]`` their column indices. Constraints: x is
float32, 2-D (rows, cols), contiguous; 1 <= k <= min(128, cols); x and k are never written.
"""

import numpy as np
from numba import cuda, int32, uint32, uint64

from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, expect_device_array, scratch, sm_count
from workbench.targets import against_peer

K_MAX = 128
FULL_MASK = 0xFFFFFFFF
LOW32 = np.uint64(0xFFFFFFFF)
SHIFT32 = np.uint64(32)
NO_KEY = np.uint64(0)  # below every element's key (the smallest, -inf's, is 0x007FFFFF << 32): padding
ONE = np.uint64(1)
NEG_INF_BITS = np.uint32(0xFF800000)  # -inf: the lowest key of a number, what a step past the row's end loads


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def block_size(elements: int, per_thread: int, most: int) -> int:
    """Threads for a block that owns ``elements``: about ``per_thread`` each, a power of two from one
    warp to ``most`` (a short row gets a small block instead of idle threads)."""
    return min(most, max(32, next_pow2(-(-elements // per_thread))))


# -- the order: the same on the host (reference) and on the device --------------------------------

def order_keys(x: np.ndarray) -> np.ndarray:
    """uint32 keys whose integer order is torch.topk's order of the float32 values x."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    keys = np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)
    return np.where(np.isnan(x), np.uint32(0xFFFFFFFF), keys)


def reference_topk(x: np.ndarray, k) -> np.ndarray:
    """(2, rows, k) int64: the top-k values' float32 bits and their indices, in torch.topk's order.
    The same unique uint64 key as the kernels' (order key, inverted index) makes the answer exact;
    a partition then a sort of the k (not a sort of the row) keeps it quick at 4096 x 128,256."""
    k = int(np.asarray(k).ravel()[0])
    x = np.ascontiguousarray(x, np.float32)
    rows, cols = x.shape
    inverted_index = np.uint64(0xFFFFFFFF) - np.arange(cols, dtype=np.uint64)
    out = np.empty((2, rows, k), np.int64)
    for r0 in range(0, rows, 256):  # a block of rows at a time: its temporaries stay in cache
        block = x[r0: r0 + 256]
        keys = order_keys(block).astype(np.uint64) << np.uint64(32)
        keys |= inverted_index
        np.invert(keys, out=keys)  # ascending order of the inverted keys = the answer's order
        part = (np.argpartition(keys, k - 1, axis=1)[:, :k] if k < cols
                else np.broadcast_to(np.arange(cols), block.shape))
        order = np.take_along_axis(part, np.argsort(np.take_along_axis(keys, part, axis=1), axis=1), axis=1)
        out[0, r0: r0 + 256] = np.take_along_axis(block.view(np.int32), order, axis=1)
        out[1, r0: r0 + 256] = order
    return out


def _inputs(size, rng):
    rows, cols, k = size
    # Logits: normal, spread like a model's (a few tokens stand out). Float32 rounding makes a tie
    # among a row's top k + 1 values about once in 500 rows; such rows are drawn again, so that a
    # library whose sort orders equal values otherwise (torch.topk's may) agrees with the reference.
    x = (rng.standard_normal((rows, cols)) * 4.0).astype(np.float32)
    tied = _rows_with_ties_at_the_top(x, k)
    while tied.size:
        x[tied] = (rng.standard_normal((tied.size, cols)) * 4.0).astype(np.float32)
        tied = tied[_rows_with_ties_at_the_top(x[tied], k)]
    return x, k_array(k)


def _rows_with_ties_at_the_top(x, k):
    """The rows of x (no NaN) where two of the k + 1 largest values are equal."""
    top = min(k + 1, x.shape[1])
    largest = np.sort(-np.partition(-x, top - 1, axis=1)[:, :top], axis=1)
    return np.flatnonzero((np.diff(largest, axis=1) == 0).any(axis=1))


def k_array(k: int) -> np.ndarray:
    """k as a stage takes it: a one-element int32 array (every input of a stage is an array)."""
    return np.array([k], np.int32)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    rows, cols, k = size
    # Every row one value (a different one per row): the answer is the first k indices, in order.
    constant = np.repeat(rng.standard_normal((rows, 1)).astype(np.float32), cols, axis=1)
    # Four levels, +0.0 and -0.0 among them: the k-th place falls inside a long tie.
    levels = np.array([1.5, 0.0, -0.0, -2.0], np.float32)
    ties = levels[rng.integers(0, 4, (rows, cols))]
    # NaN (both signs) above +inf above the numbers above -inf; in the first row more NaNs than k.
    special = (rng.standard_normal((rows, cols)) * 4.0).astype(np.float32)
    where = rng.random((rows, cols))
    special[where < 0.1] = np.nan
    special[(where >= 0.1) & (where < 0.15)] = -np.nan
    special[(where >= 0.15) & (where < 0.2)] = np.inf
    special[where >= 0.9] = -np.inf
    special[0, : min(cols, k + 3)] = np.nan
    special[:, -1] = np.nan  # a NaN in the last column: a loop that stops early misses it
    # Ascending rows: every element beats the k-th best seen so far (the worst case of a filter).
    ascending = np.sort(rng.standard_normal((rows, cols)).astype(np.float32), axis=1)
    return [(label, (x, k_array(k))) for label, x in [
        ("constant-rows", constant), ("ties-and-signed-zeros", ties), ("nan-inf", special), ("ascending", ascending)]]


def _validate(x, k, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    expect_device_array("k", k, dtype=np.int32, shape=(1,))
    expect_device_array("out", out, dtype=np.int32, ndim=3)
    rows, cols = x.shape
    if out.shape[:2] != (2, rows):
        raise InputError(f"out must have shape (2, {rows}, k): values' bits and indices; got {tuple(out.shape)}")
    k = out.shape[2]
    if not 1 <= k <= min(K_MAX, cols):
        raise InputError(f"k (out.shape[2]) must be between 1 and min({K_MAX}, cols = {cols}); got {k}")


def explain(inputs, out, ref):
    """The grader's hint for a wrong answer: a tie broken the wrong way, or NaN/-0.0 misplaced."""
    x = inputs[0]
    wrong = np.argwhere(out != ref)
    if not wrong.size:
        return None
    _, row, j = wrong[0]
    want = int(ref[1, row, j])
    got = int(out[1, row, j])
    if not 0 <= got < x.shape[1]:
        return f"row {row}, place {j}: index {got} is not a column of x"
    a, b = x[row, got], x[row, want]
    if np.isnan(b) and not np.isnan(a):
        return f"row {row}, place {j}: x[{row}, {want}] is NaN, which ranks above every number (as in torch.topk)"
    if order_keys(np.array([a]))[0] == order_keys(np.array([b]))[0]:
        return (f"row {row}, place {j}: columns {got} and {want} hold the same value ({b}); equal values go to "
                "the LOWER index first")
    if a == b:
        return f"row {row}, place {j}: +0.0 ranks above -0.0 (compare the keys of the bits, not the floats)"
    return None


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, k, out):
        o = peers.as_torch(out)
        # torch.topk writes int64 indices: into a buffer of its own, then converted into out[1].
        indices = peers.cached("topk.int64_indices", out, lambda _: torch.empty(o.shape[1:], dtype=torch.int64,
                                                                                device=o.device))
        torch.topk(peers.as_torch(x), o.shape[2], dim=1, out=(o[0].view(torch.float32), indices))
        o[1].copy_(indices)
    return "torch.topk", run


op = Operator(
    name="topk",
    targets=[against_peer(1.0), against_peer(1.0, size=(4096, 128_256, 50))],
    pattern="read",  # each row read once, k values and indices written
    title="Top-k of each row of a float32 matrix (values and indices, torch.topk's order)",
    reference=reference_topk,
    make_inputs=_inputs,
    make_output=lambda size: np.empty((2, size[0], size[2]), np.int32),
    bytes_moved=lambda size: 4 * size[0] * size[1] + 8 * size[0] * size[2],
    flops=lambda size: size[0] * size[1],  # one comparison per element: the least any selection does
    validate=_validate,
    tolerance=lambda size, dtype: 0.0,  # bits and indices: exact
    peer=_peer,
    adversarial_inputs=_adversarial,
    explain=explain,
    size_names=("rows", "cols", "k"),
    check_sizes=[(1, 1, 1), (3, 129, 128), (64, 1000, 50), (257, 32000, 50), (128, 128_256, 128), (4096, 32000, 50)],
    # sim_sizes[0] and sim_sizes[2] are the quick tier's (sim_sizes[2] also the PTX check's).
    sim_sizes=[(2, 7, 3), (2, 40, 5), (2, 70, 17), (2, 300, 50), (1, 700, 128)],
    bench_sizes=[(64, 32000, 50), (512, 32000, 50), (4096, 32000, 50), (4096, 128_256, 50)],
    headline_size=(4096, 32000, 50),
    rank=380,
    group="Top-k per row",
    record_all_sizes=True,
    grade_sizes={"sim": [(2, 257, 9), (3, 64, 64)], "gpu": [(100, 32000, 50), (33, 5000, 128)]},
)


# -- the order on the device ----------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _order_key(bits):
    """The uint32 whose integer order is torch.topk's order of the float32 with these bits."""
    if (bits & 0x7FFFFFFF) > 0x7F800000:  # NaN, either sign, any payload: above everything, all equal
        return uint32(0xFFFFFFFF)
    if bits & 0x80000000:  # negative: flip every bit, so that a more negative value gets a smaller key
        return uint32(bits ^ 0xFFFFFFFF)
    return uint32(bits | 0x80000000)  # positive or +0.0: above every negative (and -0.0)


@cuda.jit(device=True, inline=True)
def _row_key(bits, col):
    """An element's order key with its inverted column index below it, as one uint64: unique within a
    row, and larger means earlier in the answer (a larger value, or an equal one at a lower index)."""
    return (uint64(_order_key(bits)) << SHIFT32) | (LOW32 - uint64(col))


@cuda.jit(device=True, inline=True)
def _column_of(key):
    return int32(LOW32 - (key & LOW32))


@cuda.jit(device=True, inline=True)
def _bitonic_sort_descending(keys, n):
    """Sort keys[0:n] (n a power of two) largest first, with every thread of the block; a barrier
    after each of the log2(n) * (log2(n) + 1) / 2 passes."""
    t = cuda.threadIdx.x
    size = 2
    while size <= n:  # merge runs of `size`: the run's first half descending, the next ascending ...
        stride = size // 2
        while stride > 0:
            for p in range(t, n // 2, cuda.blockDim.x):
                lo = 2 * p - (p & (stride - 1))  # p with a 0 bit inserted at stride's place
                hi = lo + stride
                a = keys[lo]
                b = keys[hi]
                if (a < b) == ((lo & size) == 0):  # out of this run's order (descending where lo & size == 0)
                    keys[lo] = b
                    keys[hi] = a
            cuda.syncthreads()
            stride //= 2
        size *= 2


def _views(x, out):
    """The float32 inputs and output values as their bits (uint32), and the output indices."""
    return x.view(np.uint32), out[0].view(np.uint32), out[1]


# -- 1. sort each row -----------------------------------------------------------------------------

@cuda.jit
def _full_sort(x_bits, out_bits, out_cols, keys):
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    rows, cols = x_bits.shape
    n = keys.shape[1]  # a power of two >= cols: bitonic sort's length
    k = out_cols.shape[1]
    for row in range(b, rows, cuda.gridDim.x):  # this block's rows, one after another, in keys[b]
        # HINT: Write each element's _row_key(bits, column) into this block's row of `keys` (NO_KEY past the row's end, which sorts last), then sort it.
        # HINT: _bitonic_sort_descending(keys[b], n) sorts with every thread of the block; a barrier before it (the keys must all be written) and after the copy-out (the next row reuses keys[b]).
        # HINT: The first k keys are the answer: _column_of(key) gives the column; copy x_bits[row, column] and the column to out_bits[row, j] and out_cols[row, j].
        # BEGIN SOLUTION
        for i in range(t, n, cuda.blockDim.x):
            keys[b, i] = _row_key(x_bits[row, i], i) if i < cols else NO_KEY
        cuda.syncthreads()
        _bitonic_sort_descending(keys[b], n)
        for j in range(t, k, cuda.blockDim.x):
            col = _column_of(keys[b, j])
            out_bits[row, j] = x_bits[row, col]
            out_cols[row, j] = col
        cuda.syncthreads()
        # END SOLUTION


@op.stage("full_sort", """
    Sort every row, keep the first k. Each float becomes an unsigned key in torch.topk's order (NaN
    on top, -0.0 below +0.0), with the inverted column index below it so that equal values come out
    lowest index first; a block sorts its row's keys with a bitonic sort in global memory (a network
    of compare-exchanges whose pattern does not depend on the data: 120 passes over 32,768 keys for
    a 32,000-entry row, a barrier after each). Correct and simple, and log^2(n) / 2 times the reads
    of the answer: it sorts 31,950 elements nobody asked for.""")
def full_sort(x, k, out):
    x_bits, out_bits, out_cols = _views(x, out)
    rows, cols = x.shape
    n = next_pow2(cols)
    blocks = min(rows, 2 * sm_count())  # every block keeps a row of keys in flight: 2 per SM is enough
    keys = scratch("topk.full_sort.keys", (blocks, n), np.uint64)
    _full_sort[blocks, block_size(n // 2, 4, 1024)](x_bits, out_bits, out_cols, keys)  # 4 pairs a thread


# -- 2. radix select ------------------------------------------------------------------------------

BINS = 256  # one byte of the key per pass


@cuda.jit(device=True, inline=True)
def _find_digit(hist, need, chosen):
    """Warp 0: the bin that holds the need-th largest key (counting from the top bin down), and how
    many keys lie in the bins above it, into chosen[0] and chosen[1]. Lane l owns 8 bins, from the
    top: a scan over the lanes' totals finds the lane, the lane walks its 8 bins."""
    lane = cuda.threadIdx.x
    top = BINS - 1 - 8 * lane
    mine = 0
    for j in range(8):
        mine += hist[top - j]
    above = mine
    offset = 1
    while offset < 32:  # inclusive scan from lane 0 (the top bins) down
        left = cuda.shfl_up_sync(FULL_MASK, above, offset)
        if lane >= offset:
            above += left
        offset *= 2
    above -= mine  # keys in the bins of the lanes before this one
    if above < need <= above + mine:
        for j in range(8):
            if above + hist[top - j] >= need:
                chosen[0] = top - j
                chosen[1] = above
                break
            above += hist[top - j]


@cuda.jit
def _radix_select(x_bits, out_bits, out_cols):
    hist = cuda.shared.array(BINS, int32)
    chosen = cuda.shared.array(2, int32)  # the k-th key's next byte, and the keys in higher bins
    picked = cuda.shared.array(K_MAX, uint64)
    n_picked = cuda.shared.array(1, int32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    threads = cuda.blockDim.x
    cols = x_bits.shape[1]
    k = out_cols.shape[1]
    # HINT: Find the k-th largest key a byte at a time, from the top: count (shared-memory histogram, atomics) the next byte of every key whose bytes above match the prefix found so far; _find_digit picks the bin where the k-th falls.
    # HINT: Keep prefix and mask (the bytes found) and need (how many of the keys under the prefix still belong to the answer: need -= keys in higher bins). Stop when the chosen bin holds exactly `need` keys: then exactly k keys have (key & mask) >= prefix.
    # HINT: Gather those k keys into `picked` (an atomic counter in n_picked), then write each at its rank (the number of picked keys larger than it): the answer in order, without a sort.
    # BEGIN SOLUTION
    prefix = uint64(0)  # the bytes of the k-th largest key found so far
    mask = uint64(0)  # which bits of it are found
    need = k  # how many keys that match the prefix still belong to the top k
    shift = 64
    done = False
    while not done:
        shift -= 8
        for b in range(t, BINS, threads):
            hist[b] = 0
        cuda.syncthreads()
        for i in range(t, cols, threads):
            key = _row_key(x_bits[row, i], i)
            if key & mask == prefix:
                cuda.atomic.add(hist, int32((key >> uint64(shift)) & uint64(0xFF)), 1)
        cuda.syncthreads()
        if t < 32:
            _find_digit(hist, need, chosen)
        cuda.syncthreads()
        digit = chosen[0]
        need -= chosen[1]
        prefix |= uint64(digit) << uint64(shift)
        mask |= uint64(0xFF) << uint64(shift)
        done = hist[digit] == need  # every key in this bin is in: the prefix separates the top k
        cuda.syncthreads()  # everyone has read hist and chosen before the next pass rewrites them
    if t == 0:
        n_picked[0] = 0
    cuda.syncthreads()
    for i in range(t, cols, threads):
        key = _row_key(x_bits[row, i], i)
        if key & mask >= prefix:
            picked[cuda.atomic.add(n_picked, 0, 1)] = key
    cuda.syncthreads()
    for j in range(t, k, threads):
        key = picked[j]
        rank = 0
        for m in range(k):
            if picked[m] > key:
                rank += 1
        col = _column_of(key)
        out_bits[row, rank] = x_bits[row, col]
        out_cols[row, rank] = col
    # END SOLUTION


@op.stage("radix_select", """
    Select without sorting. A block per row finds the k-th largest key a byte at a time: it counts
    the top byte of every key in a 256-bin shared-memory histogram, walks the bins from the top to
    the one where the k-th key falls, and repeats on the next byte among the keys in that bin only.
    It stops as soon as that bin holds exactly as many keys as the answer still needs (two or three
    passes on logits, since the keys below the top bytes rarely tie); then exactly k keys are at or
    above the prefix found, and one more pass gathers them and writes each at its rank. Ties cost
    nothing extra: the column index is part of the key. A few reads of each row instead of a sort;
    blocks of 1,024 threads keep few rows in flight (one block an SM at 56 registers a thread: 132
    rows, 17 MB), so that the later passes can come from L2.""")
def radix_select(x, k, out):
    x_bits, out_bits, out_cols = _views(x, out)
    rows, cols = x.shape
    _radix_select[rows, block_size(cols, 32, 1024)](x_bits, out_bits, out_cols)


# -- 3. one read: filter against the k-th best so far, merge with a bitonic sort ----------------------

SLOTS = 2048  # shared-memory keys: the best k so far, then the candidates waiting to be merged
ITEMS = 4  # elements each thread loads before it looks at any (loads in flight)
SELECT_THREADS = 128  # measured on an H200 at (4096, 32000, 50): 1257.5 us at 128 threads, 1645.5 at 256


@cuda.jit(device=True, inline=True)
def _merge_candidates(keys, count, k):
    """Sort the best k so far and the waiting candidates together (padded to a power of two); the
    best k are then keys[0:k] again, in order, and no candidate waits."""
    waiting = k + count[0]
    n = 1
    while n < waiting:
        n *= 2
    for i in range(waiting + cuda.threadIdx.x, n, cuda.blockDim.x):
        keys[i] = NO_KEY
    cuda.syncthreads()
    _bitonic_sort_descending(keys, n)
    if cuda.threadIdx.x == 0:
        count[0] = 0
    cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def _first_bar(keys, loaded, cols, k):
    """A bar before the first merge: the k-th largest of the threads' best keys in the first step. The
    k threads whose best reach it hold k elements at or above it, so no element of the answer is
    below it. Without it the whole first step would be candidates (a sort of k + a step's keys); with
    it, about k are. Returned less one: a candidate must be strictly above the bar."""
    t = cuda.threadIdx.x
    threads = cuda.blockDim.x
    best = NO_KEY
    for j in range(ITEMS):
        if j * threads + t < cols:
            best = max(best, _row_key(loaded[j], j * threads + t))
    keys[t] = best
    cuda.syncthreads()
    _bitonic_sort_descending(keys, threads)
    bar = keys[k - 1]
    cuda.syncthreads()  # all have read the bar before the best-k slots are cleared again
    if t < k:
        keys[t] = NO_KEY
    cuda.syncthreads()
    return bar - ONE if bar != NO_KEY else NO_KEY


@cuda.jit
def _bitonic_select(x_bits, out_bits, out_cols, capacity):
    keys = cuda.shared.array(SLOTS, uint64)
    count = cuda.shared.array(1, int32)  # candidates waiting in keys[k:]
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    threads = cuda.blockDim.x
    lane = t % 32
    cols = x_bits.shape[1]
    k = out_cols.shape[1]
    step = threads * ITEMS
    merge_above = capacity - k - step  # more candidates waiting than this, and the next step might not fit
    loaded = cuda.local.array(ITEMS, uint32)
    for i in range(t, k, threads):
        keys[i] = NO_KEY
    if t == 0:
        count[0] = 0
    cuda.syncthreads()
    threshold = NO_KEY  # the k-th best key so far: only a key above it can be in the answer
    for start in range(0, cols, step):
        # HINT: Load this thread's ITEMS elements of the step first (into `loaded`: the loads in flight together), then look at them: a key above `threshold` is a candidate, appended to keys[k + ...]. Once the bar has risen most warps have none: let one cuda.any_sync vote skip the rest.
        # HINT: Append with one atomic per warp, not per element: mask = cuda.ballot_sync(FULL_MASK, is_candidate); one lane adds popc(mask) to count[0]; each candidate's slot is that base + popc(mask & cuda.lanemask_lt()).
        # HINT: After the step (a barrier), if count[0] > merge_above the next step might not fit: _merge_candidates(keys, count, k), and threshold = keys[k - 1] (still NO_KEY while fewer than k were seen). Every thread must take the same decision: read count[0], then a barrier, before any warp appends again.
        # BEGIN SOLUTION
        for j in range(ITEMS):
            i = start + j * threads + t
            loaded[j] = x_bits[row, i] if i < cols else NEG_INF_BITS
        if start == 0 and k <= threads:
            threshold = _first_bar(keys, loaded, cols, k)
        # The cheap test first, on the 32-bit keys: a candidate's key is at least the bar's.
        bar = uint32(threshold >> SHIFT32)
        maybe = False
        for j in range(ITEMS):
            if _order_key(loaded[j]) >= bar:
                maybe = True
        if cuda.any_sync(FULL_MASK, maybe):
            for j in range(ITEMS):
                i = start + j * threads + t
                key = _row_key(loaded[j], i) if i < cols else NO_KEY
                is_candidate = key > threshold
                mask = cuda.ballot_sync(FULL_MASK, is_candidate)
                if mask != 0:
                    base = 0
                    if lane == 0:
                        base = cuda.atomic.add(count, 0, cuda.popc(mask))
                    base = cuda.shfl_sync(FULL_MASK, base, 0)
                    if is_candidate:
                        keys[k + base + cuda.popc(mask & cuda.lanemask_lt())] = key
        cuda.syncthreads()
        waiting = count[0]
        cuda.syncthreads()  # all have read count before a warp that runs ahead appends again: one decision
        if waiting > merge_above:
            _merge_candidates(keys, count, k)
            threshold = keys[k - 1]
        # END SOLUTION
    if count[0] > 0:
        _merge_candidates(keys, count, k)
    for j in range(t, k, threads):
        col = _column_of(keys[j])
        out_bits[row, j] = x_bits[row, col]
        out_cols[row, j] = col


@op.stage("bitonic_select", """
    Read each row once. A block streams its row (each thread loads 4 elements before looking at any) and
    keeps the best k keys so far in shared memory, sorted; an element is a candidate only if it beats
    the k-th of those, and candidates are appended with one atomic per warp (a ballot says who, a
    popcount where). When the candidates might overflow the buffer, a bitonic sort in shared memory
    merges them with the best k, and the k-th becomes the new bar. The first bar comes before any merge:
    the k-th largest of the 128 threads' best keys in the first step (k elements reach it). On a row of
    logits the bar then rises fast: about k ln(n / 512) elements (210 of 32,000) are ever candidates, so
    a row costs one read and a few small sorts. Blocks of 128 threads, not 256: a block's barriers (two
    a step, and every pass of a merge) wait for 4 warps instead of 8, and up to 13 blocks of 16 KiB fit
    an SM instead of 8, so more rows are in flight (on an H200, 24% faster at (4096, 32000, 50), 15% at
    128,256 columns). Against radix_select it wins on long rows only: 1.6x at 128,256 columns, a tie at
    the headline, (4096, 32000, 50). The likely reason: radix_select reads a row three or four times,
    but with its 132 rows in flight (17 MB) the later reads come from the 60 MiB L2 at 32,000 columns,
    not at 128,256 (68 MB); and neither stage is near the memory's speed at the headline (419 GB/s), so
    this one's single read saves little while its barriers (63 steps a row) cost. A warp-level bitonic
    selection for small k would be another design: there each warp keeps its own best k in registers and
    merges candidates with shuffles, with no shared memory and no block barrier, and the warps' lists
    meet once at the row's end. That would remove the barriers, but each warp's bar would rise on a
    quarter of the row (more candidates), and each k up to 128 needs its own layout of keys in lanes
    (two a lane at k = 50, four at 128); the block version serves every k with one shared buffer and one
    bar, which is why it was built. The warp-level variant has not been written or timed.""")
def bitonic_select(x, k, out):
    select_with_slots(x, out, SLOTS)


def select_with_slots(x, out, slots):
    """bitonic_select using only ``slots`` (at most SLOTS) of the shared buffer: tests pass a small
    number, so that rows of a few hundred elements in the simulator merge in mid-row as rows of
    32,000 do on a GPU."""
    x_bits, out_bits, out_cols = _views(x, out)
    rows, cols = x.shape
    threads = block_size(cols, 4 * ITEMS, SELECT_THREADS)
    if not out.shape[2] + threads * ITEMS <= slots <= SLOTS:
        raise InputError(f"slots must hold k plus a step of {threads * ITEMS} candidates, and at most {SLOTS}; got {slots}")
    _bitonic_select[rows, threads](x_bits, out_bits, out_cols, slots)
