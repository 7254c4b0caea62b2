# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/reduction.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade reduction            (or reduction.<stage>)
# The grader checks each stage against the operator in solutions/reduction.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 51538d4635c65133bc0e5f53d41c1bb1666a6c8e5dacdfd72a41e0a79e78c8f5
# --------------------------------------------------------------------------------------------------
"""Sum of a float32 vector, in six steps from one atomic per element to one pass at memory speed.

A sum reads every element once and does one add per element: 4 bytes and 1 flop per element, so it
is bound by memory bandwidth. The ladder's question is what stands between a kernel and that bound:
serialised atomics, too few bytes in flight, and the cost of combining the threads' partial sums.
"""

import numpy as np
from numba import cuda, float32, float64, int32, uint64

from solutions._vector_io import aligned16, load4
from workbench.device import is_simulator
from workbench.ladder import Operator, blocks_for, expect_device_array, scratch, sm_count
from workbench import library_peers as peers
from workbench.targets import against_peer, of_ceiling

THREADS = 256  # threads per block; a multiple of the 32-lane warp
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
ELEMENTS_PER_THREAD = 16  # stages 2-4 size their grid so that each thread sums about this many
LOADS_PER_THREAD = 8  # independent loads each thread keeps in flight in the fused stage
VECTORS_PER_THREAD = 4  # 16-byte vectors each thread loads per step in the vector_loads stage (written out four times)
BLOCKS_PER_SM = 2048 // THREADS  # the blocks a multiprocessor holds at once (at most 32 registers a thread)


def _inputs(size, rng):
    (n,) = size
    # Mean 0.5, both signs: a sum far from zero, so relative error means something.
    return (rng.uniform(-1.0, 2.0, n).astype(np.float32),)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    (n,) = size
    # A large first element. Past 2^25 a float32 total is a multiple of 4, so one running total that
    # adds the elements in order drops every later one (each below 2): off by about n. Sums of short
    # partial sums keep them (off by a few units in 2^25, far inside the tolerance).
    x = rng.uniform(0.5, 1.5, n).astype(np.float32)
    x[0] = np.float32(2**25)
    return [("large-first-element", (x,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=1)
    expect_device_array("out", out, dtype=np.float32, shape=(1,))


def _tolerance(size, dtype):
    # A float32 sum's rounding error grows like sqrt(n) ulps for an unbiased order of additions.
    (n,) = size
    return max(1e-5, 4 * float(np.finfo(np.float32).eps) * np.sqrt(n))


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        return "torch.sum", lambda x, out: torch.sum(peers.as_torch(x), dim=0, out=peers.as_torch(out)[0])
    cupy = peers.cupy()
    if cupy is not None:
        return "cupy.sum", lambda x, out: cupy.sum(peers.as_cupy(x), out=peers.as_cupy(out)[0])
    return None


op = Operator(
    name="reduction",
    targets=[against_peer(1.0), of_ceiling(90, "copy_gbps")],
    title="Sum of a float32 vector",
    reference=lambda x: np.array([x.astype(np.float64).sum()]),
    make_inputs=_inputs,
    make_output=lambda size: np.empty(1, np.float32),
    bytes_moved=lambda size: 4 * size[0] + 4,
    pattern="read",  # every input byte read once, one number written: the read-only ceiling
    flops=lambda size: size[0],
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    other_peers=lambda size: [peers.cub_sum_peer(size)],  # CUB's algorithm, through cuda.compute where installed
    torch_expression=lambda torch, size: lambda x: torch.sum(x, dim=0, keepdim=True),  # for torch.compile
    adversarial_inputs=_adversarial,
    check_sizes=[1, 31, 33, 1000, 1_000_003, 2**24 + 1, 2**28],
    sim_sizes=[1, 31, 33, 1000, 1021, 4099],
    bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
    headline_size=(2**28,),
    rank=10,
    group="Reduction: sum of a float32 vector",
    record_all_sizes=True,
)


@cuda.jit
def _zero(out):
    out[0] = float32(0.0)


# -- 1. naive ----------------------------------------------------------------------------------

@cuda.jit
def _atomic_per_element(x, total):
    i = cuda.grid(1)
    # EXERCISE: write this part of `_atomic_per_element`. Read the hints one at a time.
    #   hint 1 (nudge): One thread per element: each adds its element to the single running total.
    #   hint 2: Thousands of threads update total[0] at once: a plain += loses updates; cuda.atomic.add(array, index, value) does not. Threads past the end of x must do nothing.
    #   hint 3 (nearly the answer): if i < x.size: cuda.atomic.add(total, 0, float64(x[i]))
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _start_total(total):
    total[0] = float64(0.0)


@cuda.jit
def _store_total(total, out):
    out[0] = float32(total[0])


@op.stage("naive", """
    One thread per element, and each thread adds its element straight into a single running total
    with an atomic add. Every one of the n atomics targets the same address, so the memory system
    serialises them: the kernel runs at the rate of atomics to one address, nowhere near the rate
    memory delivers data. The total is float64, because one float32 counter is also wrong: past
    2^24 its spacing exceeds the addends, which then round away (75% error at 2^28 elements).""",
    dtype=np.float64, boundaries={"n": (THREADS,)})
def naive(x, out):
    total = scratch("reduction.naive.total", 1, np.float64)
    _start_total[1, 1](total)
    _atomic_per_element[blocks_for(x.size, THREADS), THREADS](x, total)
    _store_total[1, 1](total, out)


# -- 2. coalesced grid-stride partials ----------------------------------------------------------

@cuda.jit
def _grid_stride_partials(x, out):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    # EXERCISE: write this part of `_grid_stride_partials`. Read the hints one at a time.
    #   hint 1 (nudge): Sum many elements privately in a register first, then do ONE atomic add per thread.
    #   hint 2: Walk x with a grid-stride loop (start at cuda.grid(1), step cuda.gridsize(1)) so that neighbouring threads read neighbouring elements. Start the partial sum from float32(0.0).
    #   hint 3 (nearly the answer): partial = float32(0.0); for i in range(start, x.size, stride): partial += x[i]; then cuda.atomic.add(out, 0, partial)
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _grid(n, elements_per_thread):
    """Enough blocks for each thread to sum about ``elements_per_thread`` elements."""
    return blocks_for(n, THREADS * elements_per_thread)


@op.stage("coalesced", """
    Each thread first sums many elements privately in a register, walking the vector with a stride of
    the whole grid: at every step the 32 threads of a warp read 32 neighbouring floats, one 128-byte
    transaction (coalesced). Only then does it add its partial sum atomically. The atomics drop from n
    to one per thread (n / 16 here) and the time drops with them: atomics on one address are still
    the bottleneck. Partials of 16 elements are also big enough not to round away in a float32
    total, so the float64 counter can go.""",
    boundaries={"n": (THREADS * ELEMENTS_PER_THREAD,)})
def coalesced(x, out):
    _zero[1, 1](out)
    _grid_stride_partials[_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)


# -- 3. shared-memory tree -----------------------------------------------------------------------

@cuda.jit
def _shared_tree(x, out):
    partials = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    # EXERCISE: write this part of `_shared_tree`. Read the hints one at a time.
    #   hint 1 (nudge): Store each thread's partial in shared memory, then halve the number of active threads at each step: thread t adds partials[t + half] into partials[t].
    #   hint 2: Every step needs a cuda.syncthreads() (outside the if: every thread must reach it), so no thread reads a value before it is written. Thread 0 ends with the block's sum.
    #   hint 3 (nearly the answer): partials[t] = partial; syncthreads; half = THREADS // 2; while half > 0: if t < half: partials[t] += partials[t + half]; syncthreads; half //= 2. Then thread 0: cuda.atomic.add(out, 0, partials[0]).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("shared_tree", """
    The threads of a block combine their partial sums in shared memory before touching global memory:
    a tree that halves the active threads at each step (sequential addressing, so active threads stay
    contiguous and shared-memory banks conflict-free), eight steps for 256 threads. One atomic per
    block instead of one per thread: 256 times fewer atomics on the one hot address.""",
    boundaries={"n": (THREADS * ELEMENTS_PER_THREAD,)})
def shared_tree(x, out):
    _zero[1, 1](out)
    _shared_tree[_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)


# -- 4. warp shuffle ---------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    """Butterfly sum over the 32 lanes of a warp: registers only, no shared memory, no barrier."""
    # EXERCISE: write this part of `_warp_sum`. Read the hints one at a time.
    #   hint 1 (nudge): Each step, every lane adds the value of the lane `offset` places above it; halve offset each step, starting at 16.
    #   hint 2: cuda.shfl_down_sync(FULL_MASK, value, offset) returns `value` from lane (lane + offset); five steps (16, 8, 4, 2, 1) leave the warp's sum in lane 0.
    #   hint 3 (nearly the answer): offset = 16; while offset > 0: value += cuda.shfl_down_sync(FULL_MASK, value, offset); offset //= 2
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    return value


@cuda.jit(device=True, inline=True)
def _block_sum(value):
    """Sum over the block: each warp reduces in registers, warp 0 reduces the per-warp sums.
    The result is valid in thread 0."""
    warp_sums = cuda.shared.array(WARPS, float32)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    value = _warp_sum(value)
    if lane == 0:
        warp_sums[warp] = value
    cuda.syncthreads()
    if warp == 0:
        value = warp_sums[lane] if lane < WARPS else float32(0.0)
        value = _warp_sum(value)
    return value


@cuda.jit
def _warp_shuffle(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    total = _block_sum(partial)
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(out, 0, total)


@op.stage("warp_shuffle", """
    Within a warp, threads can read each other's registers directly with shfl_down_sync: five shuffle
    steps sum 32 values with no shared memory and no barrier. Each warp reduces its partials this way,
    writes one value to shared memory, and the first warp reduces those: one barrier per block instead
    of nine, and shared-memory traffic cut from hundreds of accesses to eight.""",
    boundaries={"n": (THREADS * ELEMENTS_PER_THREAD,)})
def warp_shuffle(x, out):
    _zero[1, 1](out)
    _warp_shuffle[_grid(x.size, ELEMENTS_PER_THREAD), THREADS](x, out)


# -- 5. fused: independent loads, one launch ---------------------------------------------------

@cuda.jit(device=True, inline=True)
def _last_block_adds_up(total, block_sums, blocks_done, out):
    """Each block stores its sum (``total``, valid in thread 0); the last block to finish adds them up
    into out[0]. So no separate launch is needed to zero the output first, and the result is the same
    on every run (a fixed order of additions)."""
    is_last = cuda.shared.array(1, int32)
    if cuda.threadIdx.x == 0:
        block_sums[cuda.blockIdx.x] = total
        cuda.threadfence()  # this block's sum is visible to all before it is counted as done
        is_last[0] = cuda.atomic.add(blocks_done, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if is_last[0]:
        partial = float32(0.0)
        for b in range(cuda.threadIdx.x, cuda.gridDim.x, THREADS):
            partial += block_sums[b]
        total = _block_sum(partial)
        if cuda.threadIdx.x == 0:
            out[0] = total
            blocks_done[0] = 0  # ready for the next call


@cuda.jit
def _fused(x, block_sums, blocks_done, out):
    n = x.size
    stride = cuda.gridsize(1)
    # Eight loads that depend neither on each other nor on the adds, per iteration: each thread keeps
    # eight requests in flight, which is what it takes to cover memory latency at full bandwidth.
    a0 = float32(0.0)
    a1 = float32(0.0)
    a2 = float32(0.0)
    a3 = float32(0.0)
    i = cuda.grid(1)
    # EXERCISE: write this part of `_fused`. Read the hints one at a time.
    #   hint 1 (nudge): Each iteration issues eight loads that do not depend on each other (i, i + stride, ..., i + 7*stride), two into each of the four accumulators, then advances by 8 * stride.
    #   hint 2: Run the unrolled loop while all eight indices are in range (i + 7 * stride < n), then finish the remaining elements one stride at a time.
    #   hint 3 (nearly the answer): while i + 7*stride < n: a0 += x[i] + x[i + 4*stride]; a1 += x[i + stride] + x[i + 5*stride]; ... ; i += 8*stride. Then: while i < n: a0 += x[i]; i += stride
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    _last_block_adds_up(_block_sum((a0 + a1) + (a2 + a3)), block_sums, blocks_done, out)


def _resident_grid(n, elements_per_thread=LOADS_PER_THREAD):
    """A grid that fills the GPU once (all the blocks a multiprocessor can hold), never more than it
    takes to give each thread ``elements_per_thread`` elements."""
    return min(_grid(n, elements_per_thread), sm_count() * BLOCKS_PER_SM)


@op.stage("fused", """
    One pass, one launch, at memory speed. The grid is sized to the machine (as many blocks as can be
    resident at once) instead of to the data, and each thread issues eight independent loads per
    iteration, so the memory system always has enough requests in flight.
    Blocks reduce with warp shuffles and store one sum each; the last block to finish (found with an
    atomic ticket counter) adds those up. No atomics on the output, so no extra launch to zero it,
    and the same answer on every run.""",
    boundaries={"n": (THREADS * LOADS_PER_THREAD,)})
def fused(x, out):
    blocks = _resident_grid(x.size)
    block_sums = scratch("reduction.fused.block_sums", blocks)
    blocks_done = scratch("reduction.fused.blocks_done", 1, np.int32, zeroed=True)  # reset by the last block
    _fused[blocks, THREADS](x, block_sums, blocks_done, out)


# -- 6. vector_loads: 16-byte loads --------------------------------------------------------------

# The grid counts on BLOCKS_PER_SM blocks resident per multiprocessor; launch_bounds (the real compiler's
# option, not the simulator's) holds the kernel to the registers that allows.
VECTOR_JIT = {} if is_simulator() else {"launch_bounds": (THREADS, BLOCKS_PER_SM)}


@cuda.jit(**VECTOR_JIT)
def _vector_loads(x, block_sums, blocks_done, out):
    n = uint64(x.size)
    four = uint64(4)
    vectors = n // four  # whole 16-byte vectors; the last n % 4 elements are the tail
    stride = uint64(cuda.gridsize(1))  # in vectors
    first = uint64(cuda.grid(1))
    partial = float32(0.0)
    # EXERCISE: write this part of `_vector_loads`. Read the hints one at a time.
    #   hint 1 (nudge): x[4 * w : 4 * w + 4] is vector w. Each step reads four vectors a grid stride apart (w, w + stride, w + 2 * stride, w + 3 * stride) with load4(x, 4 * w), all four before any is added: 64 bytes in flight per thread.
    #   hint 2: Add each vector's four elements in pairs, then the four vectors' sums, and only then into the thread's partial sum (never one running total over many elements). Then the last vectors one at a time, and the tail: thread t takes element 4 * vectors + t if it exists.
    #   hint 3 (nearly the answer): while w + 3*stride < vectors: p0, p1, p2, p3 = load4(x, four * w); q0, ... = load4(x, four * (w + stride)); ...; pq = ((p0 + p1) + (p2 + p3)) + ((q0 + q1) + (q2 + q3)); rs = the same for r and s; partial += pq + rs; w += four * stride. Then: while w < vectors: one load4; w += stride. Then: e = four * vectors + first; if e < n: partial += x[e]
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    _last_block_adds_up(_block_sum(partial), block_sums, blocks_done, out)


@op.stage("vector_loads", """
    The fused stage, with 16 bytes per load instruction instead of 4. numba will not merge four
    neighbouring x[i] into one vector load by itself: it cannot prove that x[i] sits on a 16-byte
    boundary, and a misaligned vector load is an error on a GPU. load4 says it for the compiler and
    becomes one ld.global.v4.f32. Each thread issues four such loads a step, all before it adds any:
    64 bytes in flight per thread instead of 32, so the 2048 threads of a multiprocessor keep twice the
    bytes requested at any moment (what covers memory latency at full bandwidth), from a quarter of the
    load instructions and address computations. The four vectors are summed in pairs, and only their
    sum of 16 elements meets the thread's running total. Then the last vectors one at a time, and the
    n % 4 elements past the last whole vector, one per thread. A vector that does not start on a
    16-byte boundary (a view starting mid-buffer) takes the fused kernel. On an H200 at 2^28
    elements: 240.5 us, 4,464 GB/s, 97% of the read ceiling, against fused's 247.9 in the same
    process (1.03x). Against the libraries in one run: 235.8 us (4,554 GB/s), torch.sum 245.3, CUB's
    reduce_into (cuda.compute) 237.7, torch.compile's Triton kernels 234.5 (0.99x). Under Nsight
    Compute the gap closes: this kernel takes 236.4 us, torch.compile's two kernels 233.9 + 2.3 (a
    split reduction, then a kernel that sums the partials) = 236.3, so both read at the rate the
    machine gives a sum; the 1.3 us the event timing shows is inside its run-to-run spread.""",
    boundaries={"n": (THREADS * 4 * VECTORS_PER_THREAD,)})
def vector_loads(x, out):
    if not aligned16(x):  # 16-byte loads would fault on a vector that starts mid-buffer
        fused.launch(x, out)  # the fused stage's launcher (fused itself is the registered stage)
        return
    blocks = _resident_grid(x.size, 4 * VECTORS_PER_THREAD)
    block_sums = scratch("reduction.vector_loads.block_sums", blocks)
    blocks_done = scratch("reduction.vector_loads.blocks_done", 1, np.int32, zeroed=True)  # reset by the last block
    _vector_loads[blocks, THREADS](x, block_sums, blocks_done, out)
