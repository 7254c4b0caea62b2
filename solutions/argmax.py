"""Argmax of a float32 vector: the index of its largest element, the LOWEST such index on a tie.

The interview question: a reduction that carries a payload. Each step compares two (value, index)
candidates and keeps the better one: the larger value, or on equal values the lower index (that is
what numpy.argmax returns, and it makes the answer independent of the order threads finish in).
Forgetting the tie rule is the classic wrong answer: it passes on random data and fails on real
data, which has ties (quantised values, saturated sensors, padding). The inputs here always do.

An argmax reads the vector once (4 bytes per element) and writes one index: bound by memory
bandwidth. The stages differ in how many candidates survive to the final pass.

Constraints: x is float32, 1-D, contiguous, n >= 1, finite (no NaN or inf); out is int32 of shape
(1,) and receives the index. Ties go to the lowest index. x is never written.
"""

import numpy as np
from numba import cuda, float32, int32

from solutions._vector_io import VECTOR_BYTES, aligned16, load4
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array, scratch, sm_count
from workbench.targets import against_peer

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
ELEMENTS_PER_THREAD = 16
VECTORS_PER_STEP = 4  # one_pass: independent 16-byte loads a thread issues per step (64 bytes in flight)
# one_pass: blocks per SM in its resident grid. Its kernel takes 38 registers a thread (workbench ptx), so 6
# blocks of 256 fit an SM, not 8 (a grid of 8 a SM would run in two rounds, the second a third full). 4
# blocks keep 1024 x 64 bytes in flight per SM, over twice what hides DRAM latency at 4.3 TB/s, and leave
# room for a compiler that takes a few registers more (timed on an H200 at 2^28, 2026-11-24: 4, 5 and 6
# within 1% of each other, 3 about 4% slower, 8 about 3% slower).
BLOCKS_PER_SM = 4
NO_INDEX = 2**31 - 1  # the index of "no candidate": loses every tie
NEG_INF = np.float32(-np.inf)  # the value of "no candidate": loses to every finite value


def _inputs(size, rng):
    (n,) = size
    # Quantised values (multiples of 1/8 in [-64, 64)): ties everywhere, and the maximum always
    # appears at least twice, at random places.
    x = (rng.integers(-512, 512, n) / 8).astype(np.float32)
    if n > 1:
        x[rng.choice(n, size=2, replace=False)] = x.max()
    return (x,)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    (n,) = size
    # All negative: a running best that starts at 0 (or at index 0 with the value 0) never moves.
    negative = (-rng.uniform(1.0, 100.0, n)).astype(np.float32)
    # One value everywhere, and it is float32's most negative: the answer is index 0, the lowest of
    # a tie that spans the vector; a best started at that value with a strict > never moves.
    lowest = np.full(n, np.finfo(np.float32).min, np.float32)
    # The maximum once, at the very end: a loop that stops one element early misses it.
    last = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    last[-1] = np.float32(2.0)
    return [("all-negative", (negative,)), ("all-equal-lowest", (lowest,)), ("max-at-end", (last,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=1)
    expect_device_array("out", out, dtype=np.int32, shape=(1,))


def explain(inputs, out, ref):
    """The grader's hint for a wrong index: was it a tie broken the wrong way?"""
    (x,) = inputs
    got, want = int(out[0]), int(ref[0])
    if 0 <= got < x.size and x[got] == x[want] and got != want:
        return (f"index {got} holds the maximum too ({x[want]}), but so does index {want}: ties must go to "
                "the LOWEST index (compare (value, index) pairs: larger value, or equal value and lower index)")
    if 0 <= got < x.size:
        return f"x[{got}] = {x[got]} but the maximum is x[{want}] = {x[want]}"
    return None


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        return "torch.argmax", lambda x, out: peers.as_torch(out).copy_(torch.argmax(peers.as_torch(x)).view(1))
    cupy = peers.cupy()
    if cupy is not None:
        def run(x, out):
            peers.as_cupy(out)[0] = cupy.argmax(peers.as_cupy(x))
        return "cupy.argmax", run
    return None


op = Operator(
    name="argmax",
    targets=[against_peer(1.0)],
    title="Index of the maximum of a float32 vector (lowest index on ties)",
    reference=lambda x: np.array([np.argmax(x)], dtype=np.int64),
    make_inputs=_inputs,
    make_output=lambda size: np.empty(1, np.int32),
    bytes_moved=lambda size: 4 * size[0] + 4,
    pattern="read",  # every input byte read once, one index written: the read-only ceiling
    flops=lambda size: size[0],
    validate=_validate,
    tolerance=lambda size, dtype: 0.0,  # an index is right or wrong
    peer=_peer,
    torch_expression=lambda torch, size: lambda x: torch.argmax(x).view(1),  # for torch.compile
    adversarial_inputs=_adversarial,
    check_sizes=[1, 31, 1000, 1_000_003, 2**24 + 1, 2**28],
    sim_sizes=[1, 31, 33, 1000, 1021, 4099],
    bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
    headline_size=(2**28,),
    rank=140,
    group="The interview set: scan, histogram, argmax, matrix-vector, stencil",
    grade_sizes={"sim": [(1030,), (257,), (4100,)], "gpu": [(2**20 + 1,), (257,), (256 * 256 + 1,)]},
    explain=explain,
)


@cuda.jit(device=True, inline=True)
def _beats(value, index, best_value, best_index):
    """(value, index) is the better candidate: larger, or as large and earlier."""
    return value > best_value or (value == best_value and index < best_index)


# -- 1. shared-memory tree, one element per thread -------------------------------------------------

@cuda.jit
def _block_argmax_tree(values, indices, has_indices, out_values, out_indices):
    """Each block reduces THREADS candidates (values[i], and indices[i] if has_indices else i) to one."""
    best_values = cuda.shared.array(THREADS, float32)
    best_indices = cuda.shared.array(THREADS, int32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    # HINT: Load one (value, index) candidate per thread into shared memory (past the end: NEG_INF, NO_INDEX), then halve the active threads each step like a sum tree.
    # HINT: Combine with _beats(value, index, best_value, best_index): equal values keep the LOWER index. In the first pass (has_indices == 0) the index of values[i] is i.
    # HINT: half = THREADS // 2; while half > 0: if t < half and _beats(best_values[t + half], best_indices[t + half], best_values[t], best_indices[t]): copy both; syncthreads; half //= 2. Thread 0 writes out_values/out_indices[blockIdx.x].
    # BEGIN SOLUTION
    if i < values.size:
        best_values[t] = values[i]
        best_indices[t] = indices[i] if has_indices else i
    else:
        best_values[t] = NEG_INF
        best_indices[t] = NO_INDEX
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half and _beats(best_values[t + half], best_indices[t + half], best_values[t], best_indices[t]):
            best_values[t] = best_values[t + half]
            best_indices[t] = best_indices[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        out_values[cuda.blockIdx.x] = best_values[0]
        out_indices[cuda.blockIdx.x] = best_indices[0]
    # END SOLUTION


@cuda.jit
def _store_index(indices, out):
    out[0] = indices[0]


def _tree_argmax(values, indices, has_indices, out, level=0):
    blocks = blocks_for(values.size, THREADS)
    cand_values = scratch(f"argmax.tree.values.{level}", blocks, np.float32)
    cand_indices = scratch(f"argmax.tree.indices.{level}", blocks, np.int32)
    _block_argmax_tree[blocks, THREADS](values, indices, has_indices, cand_values, cand_indices)
    if blocks == 1:
        _store_index[1, 1](cand_indices, out)
    else:  # one candidate per block: reduce the candidates the same way
        _tree_argmax(cand_values, cand_indices, 1, out, level + 1)


def _no_indices():
    """A placeholder for the indices argument of the first pass, where an index is a position."""
    return scratch("argmax.no_indices", 1, np.int32)


@op.stage("shared_tree", """
    One element per thread. Each block loads 256 (value, index) candidates into shared memory and
    halves them eight times, keeping at each step the larger value or, on a tie, the lower index.
    Thread 0 writes the block's winner; the winners (n / 256 of them) are reduced the same way,
    recursively, until one is left. Correct, but a launch per level, a barrier per step, and
    threads that each do one load and then mostly wait.""",
    bytes_moved=lambda size: 4 * size[0] + 8 * blocks_for(size[0], THREADS) + 4)
def shared_tree(x, out):
    _tree_argmax(x, _no_indices(), 0, out)


# -- 2. registers, warp shuffles, a resident grid ---------------------------------------------------

@cuda.jit(device=True, inline=True)
def _warp_argmax(value, index):
    """Butterfly over the warp's 32 candidates; every lane ends with the winner."""
    offset = 16
    while offset > 0:
        other_value = cuda.shfl_xor_sync(FULL_MASK, value, offset)
        other_index = cuda.shfl_xor_sync(FULL_MASK, index, offset)
        if _beats(other_value, other_index, value, index):
            value = other_value
            index = other_index
        offset //= 2
    return value, index


@cuda.jit
def _block_argmax_shuffle(values, indices, has_indices, out_values, out_indices):
    """Grid-stride over all candidates in registers, then warp shuffles: one winner per block."""
    warp_values = cuda.shared.array(WARPS, float32)
    warp_indices = cuda.shared.array(WARPS, int32)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    # HINT: Each thread first keeps its own best candidate in registers over a grid-stride loop (its indices only grow, so a strict > keeps the earliest), then the warp combines its 32 candidates.
    # HINT: _warp_argmax(value, index) does the shuffles; lane 0 of each warp writes to warp_values/warp_indices, syncthreads, and warp 0 combines those WARPS candidates the same way.
    # HINT: best = (NEG_INF, NO_INDEX); for i in grid-stride: if values[i] > best: take (values[i], indices[i] if has_indices else i). Then _warp_argmax; lane 0 -> shared; syncthreads; warp 0: (warp_values[lane], warp_indices[lane]) if lane < WARPS else the empty candidate; _warp_argmax; thread 0 writes out_values/out_indices[blockIdx.x].
    # BEGIN SOLUTION
    best_value = NEG_INF
    best_index = int32(NO_INDEX)
    for i in range(cuda.grid(1), values.size, cuda.gridsize(1)):
        v = values[i]
        if v > best_value:  # later i in this thread: only a strictly larger value wins
            best_value = v
            best_index = indices[i] if has_indices else int32(i)
    best_value, best_index = _warp_argmax(best_value, best_index)
    if lane == 0:
        warp_values[warp] = best_value
        warp_indices[warp] = best_index
    cuda.syncthreads()
    if warp == 0:
        best_value = warp_values[lane] if lane < WARPS else NEG_INF
        best_index = warp_indices[lane] if lane < WARPS else int32(NO_INDEX)
        best_value, best_index = _warp_argmax(best_value, best_index)
        if lane == 0:
            out_values[cuda.blockIdx.x] = best_value
            out_indices[cuda.blockIdx.x] = best_index
    # END SOLUTION


def _resident_grid(n):
    return min(blocks_for(n, THREADS * ELEMENTS_PER_THREAD), sm_count() * (2048 // THREADS))


@op.stage("warp_shuffle", """
    The grid is sized to fill the GPU once, and each thread first walks the vector with a
    grid-stride loop keeping its best candidate in registers: coalesced loads, no shared memory,
    and (because a thread's indices only grow) a strict > keeps the earliest index for free. A warp
    then combines its 32 candidates with five butterfly shuffles of the (value, index) pair, warp 0
    combines the block's 8, and one small second launch reduces the ~1000 block winners. Two
    launches instead of four, at any n.""")
def warp_shuffle(x, out):
    blocks = _resident_grid(x.size)
    cand_values = scratch("argmax.shuffle.values", blocks, np.float32)
    cand_indices = scratch("argmax.shuffle.indices", blocks, np.int32)
    _block_argmax_shuffle[blocks, THREADS](x, _no_indices(), 0, cand_values, cand_indices)
    final_values = scratch("argmax.shuffle.final_values", 1, np.float32)
    final_indices = scratch("argmax.shuffle.final_indices", 1, np.int32)
    _block_argmax_shuffle[1, THREADS](cand_values, cand_indices, 1, final_values, final_indices)
    _store_index[1, 1](final_indices, out)


# -- 3. one pass: 16-byte loads, four in flight, a last-block ticket -------------------------------

@cuda.jit(device=True, inline=True)
def _fold4(best_value, best_index, v0, v1, v2, v3, first):
    """Fold elements first .. first + 3 into a running best that holds only lower indices: a strict >
    keeps the earliest of equal values."""
    if v0 > best_value:
        best_value = v0
        best_index = int32(first)
    if v1 > best_value:
        best_value = v1
        best_index = int32(first + 1)
    if v2 > best_value:
        best_value = v2
        best_index = int32(first + 2)
    if v3 > best_value:
        best_value = v3
        best_index = int32(first + 3)
    return best_value, best_index


@cuda.jit(device=True, inline=True)
def _block_argmax(value, index):
    """The block's best (value, index) pair, valid in thread 0: warp shuffles, then warp 0 over the warps."""
    warp_values = cuda.shared.array(WARPS, float32)
    warp_indices = cuda.shared.array(WARPS, int32)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    value, index = _warp_argmax(value, index)
    if lane == 0:
        warp_values[warp] = value
        warp_indices[warp] = index
    cuda.syncthreads()
    if warp == 0:
        value = warp_values[lane] if lane < WARPS else NEG_INF
        index = warp_indices[lane] if lane < WARPS else int32(NO_INDEX)
        value, index = _warp_argmax(value, index)
    return value, index


@cuda.jit
def _one_pass(x, head, block_values, block_indices, blocks_done, out):
    """x[:head] (fewer than 4 elements) lies before the first 16-byte boundary; from there on whole
    vectors of 4, then fewer than 4 left over at the end."""
    n = x.size
    vectors = (n - head) // 4
    tail = head + 4 * vectors  # the first element after the last whole vector
    g = cuda.grid(1)
    stride = cuda.gridsize(1)
    best_value = NEG_INF
    best_index = int32(NO_INDEX)
    if g < head:  # the head's indices are the lowest of all: this thread sees them first
        best_value = x[g]
        best_index = int32(g)
    # HINT: Walk the vectors (4 floats, 16 bytes each) grid-stride, VECTORS_PER_STEP of them per step: v, v + stride, v + 2*stride, v + 3*stride, loaded with load4 before any comparison, so that four 16-byte requests are in flight at once.
    # HINT: Fold them into the running best in index order (the first vector's 4 elements, then the second's, ...): a thread's indices then only grow, so a strict > still keeps the earliest. Finish the last vectors one stride at a time, then the < 4 elements from `tail` on.
    # HINT: v = g; while v + 3*stride < vectors: i = head + 4*v; a0..a3 = load4(x, i); b0..b3 = load4(x, i + 4*stride); ...; fold a with first index i, then b with i + 4*stride, ...; v += 4*stride. Then while v < vectors: one vector; v += stride. Then if g < n - tail: x[tail + g].
    # BEGIN SOLUTION
    v = g
    while v + 3 * stride < vectors:
        i = head + 4 * v  # vector v starts at element i; the next of this thread 4 * stride later
        a0, a1, a2, a3 = load4(x, i)
        b0, b1, b2, b3 = load4(x, i + 4 * stride)
        c0, c1, c2, c3 = load4(x, i + 8 * stride)
        d0, d1, d2, d3 = load4(x, i + 12 * stride)
        best_value, best_index = _fold4(best_value, best_index, a0, a1, a2, a3, i)
        best_value, best_index = _fold4(best_value, best_index, b0, b1, b2, b3, i + 4 * stride)
        best_value, best_index = _fold4(best_value, best_index, c0, c1, c2, c3, i + 8 * stride)
        best_value, best_index = _fold4(best_value, best_index, d0, d1, d2, d3, i + 12 * stride)
        v += 4 * stride
    while v < vectors:  # fewer than four strides of vectors left
        i = head + 4 * v
        a0, a1, a2, a3 = load4(x, i)
        best_value, best_index = _fold4(best_value, best_index, a0, a1, a2, a3, i)
        v += stride
    if g < n - tail:  # the last few elements, past every vector: the highest indices, seen last
        value = x[tail + g]
        if value > best_value:
            best_value = value
            best_index = int32(tail + g)
    # END SOLUTION
    best_value, best_index = _block_argmax(best_value, best_index)

    # The last block to finish picks the winner among the block winners: no second launch. The block
    # winners' indices are in no particular order (each block's come from all over x), so this pass
    # compares (value, index) pairs with _beats.
    is_last = cuda.shared.array(1, int32)
    if cuda.threadIdx.x == 0:
        block_values[cuda.blockIdx.x] = best_value
        block_indices[cuda.blockIdx.x] = best_index
        cuda.threadfence()  # this block's winner is visible to all before it is counted as done
        is_last[0] = cuda.atomic.add(blocks_done, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if is_last[0]:
        best_value = NEG_INF
        best_index = int32(NO_INDEX)
        for b in range(cuda.threadIdx.x, cuda.gridDim.x, THREADS):
            if _beats(block_values[b], block_indices[b], best_value, best_index):
                best_value = block_values[b]
                best_index = block_indices[b]
        best_value, best_index = _block_argmax(best_value, best_index)
        if cuda.threadIdx.x == 0:
            out[0] = best_index
            blocks_done[0] = 0  # ready for the next call


def _head(x):
    """Elements before x's first 16-byte boundary (0 for a fresh allocation; 1 to 3 for a view that
    starts mid-buffer), at most x.size."""
    if aligned16(x):
        return 0
    address = x.__cuda_array_interface__["data"][0]
    return min((VECTOR_BYTES - address % VECTOR_BYTES) // 4, x.size)


def one_pass_with(x, out, blocks, head):
    """The one_pass kernel on ``blocks`` blocks, x[:head] read one element at a time (tests choose both)."""
    block_values = scratch("argmax.one_pass.values", blocks, np.float32)
    block_indices = scratch("argmax.one_pass.indices", blocks, np.int32)
    blocks_done = scratch("argmax.one_pass.blocks_done", 1, np.int32, zeroed=True)  # reset by the last block
    _one_pass[blocks, THREADS](x, head, block_values, block_indices, blocks_done, out)


@op.stage("one_pass", """
    One launch, and four 16-byte loads in flight per thread. Each thread reads x a float4 at a time
    (load4: one instruction for four elements) and issues four of them, a grid stride apart, before
    comparing any, so the memory system always has enough requests to stream at full bandwidth; the
    thread folds them in index order, so a strict > still keeps the earliest of equal values. The
    grid is resident (every block runs at once) and, as in the reduction's fused stage, the last
    block to finish (an atomic ticket) picks the winner among the block winners, comparing
    (value, index) pairs because those come in no order, and resets the ticket for the next call.
    A view that starts between 16-byte boundaries reads its first one to three elements singly.""")
def one_pass(x, out):
    head = _head(x)
    vectors = (x.size - head) // 4
    blocks = max(1, min(blocks_for(vectors, THREADS * VECTORS_PER_STEP), sm_count() * BLOCKS_PER_SM))
    one_pass_with(x, out, blocks, head)
