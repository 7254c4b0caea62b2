# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/matvec.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade matvec            (or matvec.<stage>)
# The grader checks each stage against the operator in solutions/matvec.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: a519a8a4a18e5dd1a68adaef36b4680b7274fd0f7c2559c290d1de5f0e8b27b1
# --------------------------------------------------------------------------------------------------
"""Matrix-vector product y = A x, A float32 of shape (rows, cols), row-major.

The interview question: the obvious mapping, one thread per row, is wrong for a GPU. A warp's 32
threads then read 32 different rows at the same column: addresses a whole row apart, 32 memory
transactions for 32 useful floats. Give each row a whole warp instead: the lanes read 32
neighbouring floats of the row (one transaction), each sums a strided slice, and five shuffles add
the 32 partial sums. Same arithmetic, a different map from threads to data.

A matrix-vector product reads A once (4 bytes per element, and two flops: a multiply and an add)
plus x and y: about 2 flops per 4 bytes, far below any GPU's flop-to-byte ratio. It is bound by
memory bandwidth, and a good kernel streams A at close to copy speed.

Constraints: A is float32, 2-D, C-contiguous, any shape (rows, cols) >= (1, 1); x is float32 of
length cols; y is float32 of length rows and is overwritten. A and x are never written.
"""

import numpy as np
from numba import cuda, float32, int64

from solutions._vector_io import VECTOR_BYTES, aligned16, flat_view, load4
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array
from workbench.targets import against_peer

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
VECTORS_PER_LANE = 4  # vectors: 16-byte loads of A a lane issues per step, all independent (2 KB a warp)
MIN_LANES = 4  # vectors: the fewest lanes a row gets (a row's head and tail, up to 3 columns each, take one a lane)


def _inputs(size, rng):
    rows, cols = size
    a = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)
    x = rng.uniform(-0.5, 1.5, cols).astype(np.float32)
    return a, x


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    rows, cols = size
    a, _ = _inputs(size, rng)
    # x picks the last column alone: y must be exactly that column of A (a column loop that stops
    # one early gives zeros).
    last_column = np.zeros(cols, np.float32)
    last_column[-1] = 1.0
    # Every product negative (A < 0 < x): an accumulator started from a value other than 0, or a
    # max with 0 left in, shows.
    negative = -np.abs(a)
    positive_x = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    return [("last-column-only", (a, last_column)), ("all-negative-products", (negative, positive_x))]


def _validate(a, x, y):
    expect_device_array("a", a, dtype=np.float32, ndim=2)
    rows, cols = a.shape
    expect_device_array("x", x, dtype=np.float32, shape=(cols,))
    expect_device_array("y", y, dtype=np.float32, shape=(rows,))


def _tolerance(size, dtype):
    # Each output is a float32 dot product of length cols.
    return max(1e-5, 4 * float(np.finfo(np.float32).eps) * np.sqrt(size[1]))


def explain(inputs, out, ref):
    """The grader's hint for wrong values: was the matrix read transposed?"""
    a, x = inputs
    rows, cols = a.shape
    if rows == cols and rows > 1:
        at_x = a.T.astype(np.float64) @ x.astype(np.float64)
        if np.allclose(out, at_x, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(at_x).max()))):
            return "the output equals A^T x: the matrix index is transposed (a[col, row] instead of a[row, col])"
    return None


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        return "torch.mv", lambda a, x, y: torch.mv(peers.as_torch(a), peers.as_torch(x), out=peers.as_torch(y))
    cupy = peers.cupy()
    if cupy is not None:
        return "cupy.matmul", lambda a, x, y: cupy.matmul(peers.as_cupy(a), peers.as_cupy(x), out=peers.as_cupy(y))
    return None


op = Operator(
    name="matvec",
    targets=[against_peer(0.95)],
    title="Matrix-vector product y = A x (float32)",
    reference=lambda a, x: a.astype(np.float64) @ x.astype(np.float64),
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size[0], np.float32),
    bytes_moved=lambda size: 4 * (size[0] * size[1] + size[0] + size[1]),
    pattern="read",  # the matrix read once; x and y are tiny beside it: the read-only ceiling
    flops=lambda size: 2 * size[0] * size[1],
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    torch_expression=lambda torch, size: lambda a, x: torch.mv(a, x),  # for torch.compile
    adversarial_inputs=_adversarial,
    check_sizes=[(1, 1), (1000, 1000), (4097, 1023), (31, 100_003), (100_003, 31), (16384, 16384)],
    sim_sizes=[(1, 1), (33, 31), (31, 70), (67, 129), (5, 300)],
    bench_sizes=[(256, 256), (1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (16384, 16384)],
    headline_size=(16384, 16384),
    rank=150,
    group="The interview set: scan, histogram, argmax, matrix-vector, stencil",
    grade_sizes={"sim": [(33, 65), (1, 300), (40, 1)], "gpu": [(1, 1_000_003), (1_000_003, 1), (8191, 8193)]},
    explain=explain,
)


# -- 1. one thread per row ------------------------------------------------------------------------

@cuda.jit
def _thread_per_row(a, x, y):
    row = cuda.grid(1)
    # EXERCISE: write this part of `_thread_per_row`. Read the hints one at a time.
    #   hint 1 (nudge): One thread owns one row: it walks the row's columns and accumulates a dot product in a register.
    #   hint 2: There are more threads than rows (the grid is rounded up to whole blocks): guard with row < a.shape[0]. Start the sum from float32(0.0), not 0.0, to stay in float32.
    #   hint 3 (nearly the answer): if row < a.shape[0]: acc = float32(0.0); for col in range(a.shape[1]): acc += a[row, col] * x[col]; y[row] = acc
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("thread_per_row", """
    One thread per row, summing its row in a register. The arithmetic is right and each element of A
    is read once, but a warp's 32 threads read 32 rows at the same column: addresses cols * 4 bytes
    apart, so every load instruction needs 32 separate memory transactions, each delivering one
    useful float of the 32 it fetches (the rest waits in cache, if it survives).""")
def thread_per_row(a, x, y):
    _thread_per_row[blocks_for(a.shape[0], THREADS), THREADS](a, x, y)


# -- 2. one warp per row --------------------------------------------------------------------------

@cuda.jit
def _warp_per_row(a, x, y):
    lane = cuda.threadIdx.x % 32
    row = cuda.grid(1) // 32  # warp w of the grid owns row w
    # EXERCISE: write this part of `_warp_per_row`. Read the hints one at a time.
    #   hint 1 (nudge): A whole warp owns one row: lane k sums columns k, k + 32, k + 64, ... so that at each step the 32 lanes read 32 neighbouring floats (one transaction).
    #   hint 2: Then add the 32 partial sums with cuda.shfl_down_sync(FULL_MASK, acc, offset) for offset = 16, 8, 4, 2, 1; lane 0 holds the total. Keep the row check outside the shuffles' branch: all 32 lanes must reach each shuffle.
    #   hint 3 (nearly the answer): if row < a.shape[0]: acc = float32(0.0); for col in range(lane, a.shape[1], 32): acc += a[row, col] * x[col]; offset = 16; while offset > 0: acc += shfl_down_sync(FULL_MASK, acc, offset); offset //= 2; if lane == 0: y[row] = acc
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("warp_per_row", """
    One warp per row. Lane k sums columns k, k + 32, k + 64, ...: at every step the warp reads 32
    neighbouring floats of its row, one 128-byte transaction fully used (coalesced). The 32 partial
    sums are then added with five shfl_down_sync steps, register to register, and lane 0 writes the
    result. Same flops, same bytes, 32 times fewer memory transactions: the kernel now streams A
    at close to copy bandwidth (for rows of at least a few hundred columns).""")
def warp_per_row(a, x, y):
    _warp_per_row[blocks_for(a.shape[0] * 32, THREADS), THREADS](a, x, y)


# -- 3. 16-byte loads, four in flight per lane -----------------------------------------------------

ZERO = float32(0.0)


@cuda.jit(device=True, inline=True)
def _a4(flat, i, inside):
    """flat[i .. i + 3] in one 16-byte load (i on a 16-byte boundary), or zeros past the row's vectors."""
    if inside:
        return load4(flat, i)
    return ZERO, ZERO, ZERO, ZERO


@cuda.jit(device=True, inline=True)
def _x4(x, col, x_vector, inside):
    """x[col .. col + 3]: one 16-byte load where x[col] sits on a 16-byte boundary, else four loads (or
    zeros past the row's vectors). x is small and read by every row: these come from the L1/L2 caches,
    not from DRAM."""
    if not inside:
        return ZERO, ZERO, ZERO, ZERO
    if x_vector:
        return load4(x, col)
    return x[col], x[col + 1], x[col + 2], x[col + 3]


@cuda.jit(device=True, inline=True)
def _dot4(acc, a0, a1, a2, a3, x0, x1, x2, x3):
    return acc + a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3


@cuda.jit
def _rows_by_vectors(flat, x, y, cols, lanes, phase, x_vector):
    """``lanes`` (a power of two, 4 to 32) neighbouring lanes own a row: a warp per row for long rows,
    up to 8 rows a warp for short ones. ``flat`` is A as one vector, and flat[0] lies ``phase``
    elements past a 16-byte boundary. A row is read in three parts: a head of 0 to 3 columns up to its
    first 16-byte boundary, whole 16-byte vectors, and a tail of 0 to 3 columns. With cols % 4 == 0 on
    an aligned A (the usual case) every row is vectors only."""
    row = cuda.grid(1) // lanes
    lane = cuda.grid(1) % lanes  # the lane's place in its row's group
    acc = ZERO
    if row < y.size:  # not the same for every row of a warp: no shuffle inside
        base = int64(row) * cols  # the row's first element in flat
        head = min((4 - (phase + base) % 4) % 4, cols)
        end = head + (cols - head) // 4 * 4  # the whole vectors end here; the tail follows
        chunk = 4 * lanes  # columns the row's lanes cover with one 16-byte load each
        acc0 = ZERO
        acc1 = ZERO
        acc2 = ZERO
        acc3 = ZERO
        col = head + 4 * lane
        # EXERCISE: write this part of `_rows_by_vectors`. Read the hints one at a time.
        #   hint 1 (nudge): Each lane reads its row 16 bytes at a time with load4 (through _a4), at columns col = head + 4 * lane, col + chunk, col + 2 * chunk, col + 3 * chunk (the row's lanes read neighbouring bytes), all four loads issued before any multiply; x's four columns for each come from _x4. Each of the four vectors feeds its own accumulator (_dot4).
        #   hint 2: Step col by VECTORS_PER_LANE * chunk while col + 3 * chunk < end. Then at most three vectors are left to a lane: load them in one last step, each only where it lies inside (col + k * chunk < end; _a4 and _x4 give zeros elsewhere), so that they too are in flight together, and add them into acc0, acc1, acc2.
        #   hint 3 (nearly the answer): a0..a3 = _a4(flat, base + col, True); ...; xa0..xa3 = _x4(x, col, x_vector, True); ...; acc0 = _dot4(acc0, a0, a1, a2, a3, xa0, xa1, xa2, xa3); ...; col += VECTORS_PER_LANE * chunk. Last step: the same with inside = col + k * chunk < end for k = 0, 1, 2.
        pass  # TODO(exercise): not implemented yet: replace this line with your code
        # The row's head and tail, a column a lane (none when cols % 4 == 0 on an aligned A)
        head_a = flat[base + lane] if lane < head else ZERO
        head_x = x[lane] if lane < head else ZERO
        tail_a = flat[base + end + lane] if lane < cols - end else ZERO
        tail_x = x[end + lane] if lane < cols - end else ZERO
        acc3 += head_a * head_x + tail_a * tail_x
        acc = (acc0 + acc1) + (acc2 + acc3)
    # Every lane of the warp takes part in the shuffles (a lane past the last row with a 0): lane 0 of
    # each group ends with its row's sum, as offsets below ``lanes`` stay inside the group for lane 0.
    offset = lanes // 2
    while offset > 0:
        acc += cuda.shfl_down_sync(FULL_MASK, acc, offset)
        offset //= 2
    if row < y.size and lane == 0:
        y[row] = acc


def lanes_per_row(cols):
    """The fewest lanes, a power of two from MIN_LANES to 32, that read a row in one step (each lane
    VECTORS_PER_LANE 16-byte loads): 32 from 257 columns on, a warp per row. (Fewer rows a warp, one
    16-byte load a lane, took twice as long at 100003 x 64 and 100003 x 128 on an H200, 2026-11-24.)"""
    lanes = MIN_LANES
    while lanes < 32 and 4 * VECTORS_PER_LANE * lanes < cols:
        lanes *= 2
    return lanes


def _phase(a):
    """How many elements past a 16-byte boundary a's first element lies: 0 for a fresh allocation."""
    if aligned16(a):
        return 0
    return a.__cuda_array_interface__["data"][0] % VECTOR_BYTES // 4


def vectors_with(a, x, y, lanes, phase, x_vector):
    """The vectors kernel with a given group size, phase and x path (tests choose them: the simulator's
    arrays are always aligned)."""
    rows, cols = a.shape
    _rows_by_vectors[blocks_for(rows * lanes, THREADS), THREADS](flat_view(a), x, y, cols, lanes, phase, x_vector)


@op.stage("vectors", """
    Still a warp per row (for rows longer than 256 columns), now reading A 16 bytes at a time: each
    lane loads four floats with one instruction (load4), and issues four such loads, 128 columns
    apart, before it multiplies anything. A warp then has 2 KB of its row in flight instead of 128
    bytes, and the SM's warps together enough to cover DRAM latency, so A streams at full bandwidth;
    each of the four vectors feeds its own accumulator. The last step of a row loads what is left
    (up to three vectors a lane) the same way, all at once. Shorter rows get fewer lanes (down to 4),
    so that a warp reads up to 8 rows at once instead of idling most of its lanes. x, read by every
    row, stays in the L1 and L2 caches and is read with load4 too (shared memory would need a tile
    loop and a barrier for rows longer than 12K floats, for no fewer DRAM bytes). A row starts on a
    16-byte boundary only when cols is a multiple of 4: otherwise each row reads its first and last
    0 to 3 columns singly, the rest as vectors, and x with four plain loads. A matrix of a few long
    rows still has only a few warps at work (one a row): that would take splitting rows between
    warps.""")
def vectors(a, x, y):
    cols = a.shape[1]
    phase = _phase(a)
    vectors_with(a, x, y, lanes_per_row(cols), phase, phase == 0 and cols % 4 == 0 and aligned16(x))
