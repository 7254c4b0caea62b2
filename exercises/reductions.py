# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/reductions.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade reduction[max]            (or reduction[max].<stage>; its other operators: reduction[min], reduction[mean], reduction[sumsq], reduction[rows], reduction[cols], reduction[max,rows], reduction[max,cols], reduction[min,rows], reduction[min,cols], reduction[mean,rows], reduction[mean,cols])
# The grader checks each stage against the operator in solutions/reductions.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 8ce93763e1057c23fa6f3b3cd69adcbfdab743faf93d2105396132e3f401817f
# --------------------------------------------------------------------------------------------------
"""Reductions beyond the sum: max, min, mean and sum of squares of a vector, and a matrix summed over
its rows and over its columns.

**The combining operation as a parameter.** The `reduction` ladder summed; a reduction is any
associative operation folded over the data, and three things change with it (the kernels below are
written once and instantiated per operation, see ``solutions/_templates.py``):

* the *identity*, what a thread with nothing to read starts from: 0 for a sum, -inf for a maximum,
  +inf for a minimum (0 would make the maximum of an all-negative vector 0);
* *NaN*: torch's ``max``/``amax``/``min`` return NaN when any element is NaN. ``a if a > b else b`` does
  not: every comparison with NaN is false, so a NaN is dropped whenever it is the first argument, and
  the answer depends on the order of the tree. ``maximum`` below tests ``a != a`` (true only for NaN)
  so that NaN wins from either side. A sum propagates NaN by itself (NaN + x, inf + -inf);
* the *finish*: a mean is a sum divided by n once at the end, never per element.

Two stages, the second the first made fast: ``two_pass`` (each block folds its grid-stride share and
warp shuffles combine it; a second one-block launch folds the per-block results: no atomics, because
numba's float atomics do not promise torch's NaN propagation (``cuda.atomic.nanmax`` drops NaN by
design) and a fixed order of combination gives the same answer on every run), then ``one_pass`` (16-byte loads, four vectors a
step in flight per thread, and the last block to finish folds the per-block results: one launch).

**The layout lesson.** A matrix summed over its rows (``x.sum(dim=1)``: each output reads a contiguous
row) and over its columns (``x.sum(dim=0)``: each output reads one float from every row, a row apart).
The obvious kernel for each is a thread per output, and they fail for opposite reasons: a thread per
row reads with neighbouring threads a row apart (each warp load touches 32 rows: uncoalesced); a
thread per column reads coalesced (neighbouring threads, neighbouring columns) but a 16384-column
matrix gives only 16384 threads, an eighth of what an H200 holds, each with one load in flight. The
fixes: a warp per row (coalesced, a shuffle tree per row), and for columns, blocks of 32 columns x 8
row lanes that each sum a band of rows, combine their 8 partial sums through shared memory and leave
one partial per column per band; a small second kernel adds the bands. Then the column kernel gets the
vector ladder's two last steps: 16-byte loads (a thread owns four neighbouring columns) and the last
block to finish folding the bands, in the same launch.
"""

import numpy as np
from numba import cuda, float32, int32, uint64

from solutions._templates import instantiate
from solutions._vector_io import aligned16, flat_view, load4
from workbench import library_peers as peers
from workbench.device import is_simulator
from workbench.ladder import Operator, blocks_for, expect_device_array, scratch, sm_count
from workbench.targets import against_peer

THREADS = 256  # threads per block, a multiple of the 32-lane warp
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
RESIDENT_BLOCKS_PER_SM = 2048 // THREADS  # all the threads a Hopper multiprocessor holds
ELEMENTS_PER_THREAD = 16  # a grid is never larger than it takes to give each thread this many
NEG_INF = float32(-np.inf)
POS_INF = float32(np.inf)
ZERO = float32(0.0)
COLUMN_STRIP = 32  # columns per block in the column kernels: one warp's worth, one 128-byte line per row
ROW_LANES = THREADS // COLUMN_STRIP  # 8 rows read at once by a block of the banded column kernel
MIN_BAND_ROWS = 64  # a band gives each thread at least 8 rows: fewer, and the second kernel would dominate
# column_vectors: a thread owns 4 neighbouring columns, read with one 16-byte load per row
COLUMN_QUADS = 32  # threads across a column_vectors block, 4 columns each: a warp reads 512 contiguous bytes of a row
VECTOR_ROW_LANES = 8  # threads down a column_vectors block: rows it reads at once
ROWS_IN_FLIGHT = 4  # rows each thread loads (16 bytes each) before it folds any of them
VECTOR_THREADS = COLUMN_QUADS * VECTOR_ROW_LANES
STRIP_COLS = 4 * COLUMN_QUADS  # columns per column_vectors block
VECTOR_BLOCKS_PER_SM = 4  # blocks per multiprocessor the band split aims for (one wave): half the threads an SM
# holds, with four 16-byte loads in flight each, already covers memory latency; taller bands leave fewer partials to fold


# -- the combining operations (device functions) ----------------------------------------------------------

@cuda.jit(device=True, inline=True)
def add(a, b):
    return a + b


@cuda.jit(device=True, inline=True)
def maximum(a, b):
    # a > b is false whenever either is NaN: testing a != a (true only for NaN) makes NaN win from either side
    return a if (a > b or a != a) else b


@cuda.jit(device=True, inline=True)
def minimum(a, b):
    return a if (a < b or a != a) else b


@cuda.jit(device=True, inline=True)
def itself(v):
    return v


@cuda.jit(device=True, inline=True)
def square(v):
    return v * v


@cuda.jit(device=True, inline=True)
def total(acc, n):
    return acc


@cuda.jit(device=True, inline=True)
def divide_by_n(acc, n):
    return acc / float32(n)


# -- templates: `combine`, `transform`, `finish` and IDENTITY are bound per operation ---------------------

def _warp_fold(value):
    """Fold the 32 lanes of a warp with `combine`: five shuffle steps, the result in lane 0."""
    offset = 16
    while offset > 0:
        value = combine(value, cuda.shfl_down_sync(FULL_MASK, value, offset))  # noqa: F821
        offset //= 2
    return value


def _block_fold(value):
    """Fold a whole block: each warp in registers, then warp 0 folds the warps' results (in thread 0)."""
    warp_results = cuda.shared.array(WARPS, float32)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    value = _warp_fold(value)  # noqa: F821 - the instantiation of _warp_fold for this operation
    if lane == 0:
        warp_results[warp] = value
    cuda.syncthreads()
    if warp == 0:
        value = warp_results[lane] if lane < WARPS else IDENTITY  # noqa: F821
        value = _warp_fold(value)  # noqa: F821
    return value


# -- 1. two_pass ------------------------------------------------------------------------------------------

def _block_partials(x, partials):
    # EXERCISE: write this part of `_block_partials`. Read the hints one at a time.
    #   hint 1 (nudge): Start from the operation's IDENTITY (what folds into anything without changing it), not from 0.
    #   hint 2 (nearly the answer): Fold transform(x[i]) over a grid-stride loop with combine, then fold the block with _block_fold; thread 0 stores the block's result in partials[cuda.blockIdx.x].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _fold_partials(partials, n, out):
    acc = IDENTITY  # noqa: F821
    for b in range(cuda.threadIdx.x, partials.size, THREADS):
        acc = combine(acc, partials[b])  # noqa: F821
    acc = _block_fold(acc)  # noqa: F821
    if cuda.threadIdx.x == 0:
        out[0] = finish(acc, n)  # noqa: F821


def _resident_grid(n):
    """A grid that fills the GPU once, never more blocks than it takes to give each thread 16 elements."""
    return min(blocks_for(n, THREADS * ELEMENTS_PER_THREAD), sm_count() * RESIDENT_BLOCKS_PER_SM)


def two_pass(x, out):
    blocks = _resident_grid(x.size)
    partials = scratch(f"reductions.{NAME}.partials", blocks)  # noqa: F821
    _block_partials[blocks, THREADS](x, partials)  # noqa: F821
    _fold_partials[1, THREADS](partials, x.size, out)  # noqa: F821


# -- 2. one_pass ------------------------------------------------------------------------------------------

def _one_pass(x, partials, blocks_done, out):
    n = uint64(x.size)
    four = uint64(4)
    vectors = n // four  # whole 16-byte vectors; the last n % 4 elements are the tail
    stride = uint64(cuda.gridsize(1))
    s2 = stride + stride
    s3 = s2 + stride
    s4 = s2 + s2
    first = uint64(cuda.grid(1))
    a0 = IDENTITY  # noqa: F821 - four independent accumulators: four dependency chains
    a1 = IDENTITY  # noqa: F821
    a2 = IDENTITY  # noqa: F821
    a3 = IDENTITY  # noqa: F821
    # EXERCISE: write this part of `_one_pass`. Read the hints one at a time.
    #   hint 1 (nudge): Each step reads four vectors a grid stride apart (w, w + stride, w + s2, w + s3) with load4, all four before any is used: 64 bytes in flight per thread. Each vector folds into its own accumulator.
    #   hint 2 (nearly the answer): Then the last vectors one at a time (fewer than four strides are left), and the tail: thread t takes element four * vectors + t if it exists.
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    result = _block_fold(combine(combine(a0, a1), combine(a2, a3)))  # noqa: F821

    # The last block to finish folds the per-block results: one launch, the same order on every run.
    is_last = cuda.shared.array(1, int32)
    if cuda.threadIdx.x == 0:
        partials[cuda.blockIdx.x] = result
        cuda.threadfence()  # this block's result is visible to all before it is counted as done
        is_last[0] = cuda.atomic.add(blocks_done, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if is_last[0]:
        acc = IDENTITY  # noqa: F821
        for b in range(cuda.threadIdx.x, cuda.gridDim.x, THREADS):
            acc = combine(acc, partials[b])  # noqa: F821
        acc = _block_fold(acc)  # noqa: F821
        if cuda.threadIdx.x == 0:
            out[0] = finish(acc, n)  # noqa: F821
            blocks_done[0] = 0  # ready for the next call


def one_pass(x, out):
    if not aligned16(x):  # a view starting mid-buffer: 16-byte loads would fault there
        two_pass(x, out)  # noqa: F821 - this operation's two_pass launcher
        return
    blocks = _resident_grid(x.size)
    partials = scratch(f"reductions.{NAME}.partials", blocks)  # noqa: F821
    blocks_done = scratch(f"reductions.{NAME}.blocks_done", 1, np.int32, zeroed=True)  # noqa: F821
    _one_pass[blocks, THREADS](x, partials, blocks_done, out)  # noqa: F821


TWO_PASS = """
    Each thread folds its grid-stride share of the vector into a register that starts at the
    operation's identity ({identity}), the block folds its threads' results with warp shuffles, and
    one value per block goes to a small buffer; a second launch of one block folds those and
    {finish}. The combining operation is a parameter of the kernel's code ({combine}); no atomics,
    so the order of combination is fixed and NaN {nan}."""

ONE_PASS = """
    The sum ladder's last stage, vector_loads, with the combining operation as a parameter: each thread
    reads four 16-byte vectors a step (load4), all four issued before any is used, 64 bytes in flight per
    thread, each folded into its own accumulator (four independent dependency chains), and the last
    block to finish (an atomic ticket) folds the per-block results, so there is no second launch and the
    answer is the same on every run. (Two vectors a step, 32 bytes, measured 0.97-0.98x
    torch.amax/amin/mean at 2^28 on an H200.) A vector that does not start on a 16-byte boundary falls
    back to the two-pass kernels. The grid counts on 8 blocks resident per multiprocessor, 32 registers
    a thread; the sixteen loaded values would take 33, so the kernel is compiled with
    launch_bounds=(256, 8), which holds the compiler to 32 (no spill: workbench ptx)."""


# -- the vector operators ------------------------------------------------------------------------------

def _vector_inputs(size, rng):
    (n,) = size
    # Mean 0.5, both signs: a maximum, a minimum and a sum that are not all near zero.
    return (rng.uniform(-1.0, 2.0, n).astype(np.float32),)


def _vector_adversarial(kind):
    def make(size, rng):
        (n,) = size
        nan = rng.uniform(-1.0, 2.0, n).astype(np.float32)
        nan[n // 2] = np.nan  # one NaN, mid-vector: whatever the tree, it must come out
        cases = [("one-nan", (nan,))]
        if kind in ("max", "min"):
            # all negative (an identity of 0 would win a maximum) with +-inf at the ends (an identity
            # of +-FLT_MAX would lose to them)
            neg = -rng.uniform(1.0, 2.0, n).astype(np.float32)
            neg[0], neg[-1] = (-np.inf, np.inf) if kind == "min" else (np.inf, -np.inf)
            if n == 1:
                neg[0] = -1.5
            cases.append(("all-negative-and-infinities", (neg,)))
        return cases
    return make


def _vector_validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=1)
    expect_device_array("out", out, dtype=np.float32, shape=(1,))


def _sum_tolerance(size, dtype):
    # A float32 sum's rounding error grows like sqrt(n) ulps for a tree of partial sums (as `reduction`).
    n = int(np.prod(size))
    return max(1e-5, 4 * float(np.finfo(np.float32).eps) * np.sqrt(n))


def _exact(size, dtype):
    return 0.0  # a maximum or minimum of float32 values is one of them: no rounding at all


def _torch_vector_peer(name, call):
    def peer(size):
        torch = peers.torch()
        if torch is None:
            return None
        return name, lambda x, out: call(torch, peers.as_torch(x), peers.as_torch(out)[0])
    return peer


class VectorReduction:
    """One row of the table the vector operators are made from."""

    def __init__(self, kind, title, combine, transform, finish, identity, reference, peer, tolerance, words):
        self.kind, self.title, self.combine, self.transform, self.finish = kind, title, combine, transform, finish
        self.identity, self.reference, self.peer, self.tolerance, self.words = identity, reference, peer, tolerance, words


# The same reductions as plain torch code, for torch.compile (one number, shaped as the output)
VECTOR_EXPRESSIONS = {
    "max": lambda torch, x: torch.amax(x, dim=0, keepdim=True),
    "min": lambda torch, x: torch.amin(x, dim=0, keepdim=True),
    "mean": lambda torch, x: torch.mean(x, dim=0, keepdim=True),
    "sumsq": lambda torch, x: torch.sum(x * x, dim=0, keepdim=True),
}


def _ref(fn):
    return lambda x: np.array([fn(x.astype(np.float64))])


VECTOR_REDUCTIONS = [
    VectorReduction("max", "Maximum of a float32 vector", maximum, itself, total, NEG_INF, _ref(np.max),
                    _torch_vector_peer("torch.amax", lambda t, x, o: t.amax(x, dim=0, out=o)), _exact,
                    dict(identity="-inf", finish="thread 0 stores the result", combine="maximum",
                         nan="in any block wins: maximum(a, b) tests a != a")),
    VectorReduction("min", "Minimum of a float32 vector", minimum, itself, total, POS_INF, _ref(np.min),
                    _torch_vector_peer("torch.amin", lambda t, x, o: t.amin(x, dim=0, out=o)), _exact,
                    dict(identity="+inf", finish="thread 0 stores the result", combine="minimum",
                         nan="in any block wins: minimum(a, b) tests a != a")),
    VectorReduction("mean", "Mean of a float32 vector", add, itself, divide_by_n, ZERO, _ref(np.mean),
                    _torch_vector_peer("torch.mean", lambda t, x, o: t.mean(x, dim=0, out=o)), _sum_tolerance,
                    dict(identity="0", finish="divides the sum by n, once", combine="add",
                         nan="propagates through the adds")),
    VectorReduction("sumsq", "Sum of squares of a float32 vector", add, square, total, ZERO,
                    _ref(lambda v: np.sum(v * v)),
                    _torch_vector_peer("torch.dot(x, x)", lambda t, x, o: t.dot(x, x, out=o)), _sum_tolerance,
                    dict(identity="0", finish="thread 0 stores the result", combine="add, after squaring "
                         "each element (transform)", nan="propagates through the adds")),
]

FOLD_TEMPLATES = [_warp_fold, _block_fold]  # device functions, instantiated before the kernels
# one_pass's grid assumes RESIDENT_BLOCKS_PER_SM blocks resident per multiprocessor: 32 registers a thread at
# most. Its 16 loaded values leave the compiler at 33 unbounded, which would leave a second, partial wave of
# blocks; launch_bounds (the real compiler's option, not the simulator's) holds it to the promise.
ONE_PASS_JIT = {} if is_simulator() else {"launch_bounds": (THREADS, RESIDENT_BLOCKS_PER_SM)}
VECTOR_KERNELS = [(_block_partials, {}), (_fold_partials, {}), (_one_pass, ONE_PASS_JIT)]


def _make_vector_operator(r: VectorReduction, rank: float) -> Operator:
    op = Operator(
        name="reduction", variant={"combine": r.kind},
        targets=[against_peer(1.0, "eager")],
        pattern="read",  # the vector read once, one number written
        title=r.title,
        reference=r.reference,
        make_inputs=_vector_inputs,
        make_output=lambda size: np.empty(1, np.float32),
        bytes_moved=lambda size: 4 * size[0] + 4,
        flops=lambda size: size[0] * (2 if r.transform is square else 1),
        validate=_vector_validate,
        tolerance=r.tolerance,
        peer=r.peer,
        torch_expression=lambda torch, size, expression=VECTOR_EXPRESSIONS[r.kind]: lambda x: expression(torch, x),
        adversarial_inputs=_vector_adversarial(r.kind),
        check_sizes=[1, 31, 33, 1000, 1_000_003],  # the GPU suite is shared: 2^28 is the script's
        # quick: 1 and 1029 (one block; one_pass's one-vector loop and a tail of 1: its four-vector loop
        # needs more than 3 x 256 vectors, tests/test_reductions.py runs it at 4095); the slow tier adds
        # 8191 (two blocks: the four-vector loop, a tail of 3 and the last block's fold)
        sim_sizes=[1, 1029, 8191],
        bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
        headline_size=(2**28,),
        rank=rank,
        group="Reductions beyond the sum: max, min, mean, sum of squares; rows and columns",
    )
    namespace = dict(globals(), combine=r.combine, transform=r.transform, finish=r.finish, IDENTITY=r.identity,
                     NAME=op.name)
    for template in FOLD_TEMPLATES:
        namespace[template.__name__] = instantiate(template, namespace, f"{template.__name__}_{r.kind}",
                                                   jit={"device": True, "inline": True})
    for template, jit in VECTOR_KERNELS:
        namespace[template.__name__] = instantiate(template, namespace, f"{template.__name__}_{r.kind}", jit=jit)
    namespace["two_pass"] = instantiate(two_pass, namespace, f"two_pass_{r.kind}")  # one_pass falls back to it
    op.stage("two_pass", TWO_PASS.format(**r.words))(namespace["two_pass"])
    op.stage("one_pass", ONE_PASS)(instantiate(one_pass, namespace, f"one_pass_{r.kind}"))
    return op


# -- the matrix operators: the sum over rows (dim=1) and over columns (dim=0) -------------------------------

# -- rows 1. thread_per_row

def _thread_per_row(x, out):
    r = cuda.grid(1)
    # EXERCISE: write this part of `_thread_per_row`. Read the hints one at a time.
    #   hint 1: Thread r adds up row r, one column after another.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def thread_per_row(x, out):
    _thread_per_row[blocks_for(x.shape[0], THREADS), THREADS](x, out)  # noqa: F821


# -- rows 2. warp_per_row

def _warp_per_row(x, out):
    rows = uint64(x.shape[0])
    cols = uint64(x.shape[1])
    row = uint64(cuda.grid(1)) // uint64(32)
    lane = uint64(cuda.threadIdx.x % 32)
    w32 = uint64(32)
    if row >= rows:  # a whole warp leaves together: the shuffles below see all 32 lanes or none
        return
    a0 = IDENTITY  # noqa: F821
    a1 = IDENTITY  # noqa: F821
    # EXERCISE: write this part of `_warp_per_row`. Read the hints one at a time.
    #   hint 1 (nudge): The 32 lanes of a warp read 32 neighbouring columns of the warp's row (one 128-byte line), then the next 32: lane, lane + 32, lane + 64, ...
    #   hint 2 (nearly the answer): Keep four loads in flight (c, c + 32, c + 64, c + 96), then fold the warp's lanes with _warp_fold; lane 0 writes out[row].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def warp_per_row(x, out):
    _warp_per_row[blocks_for(x.shape[0], WARPS), THREADS](x, out)  # noqa: F821


# -- columns 1. thread_per_column

def _thread_per_column(x, out):
    c = cuda.grid(1)
    # EXERCISE: write this part of `_thread_per_column`. Read the hints one at a time.
    #   hint 1: Thread c adds up column c, one row after another: neighbouring threads read neighbouring floats of each row.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def thread_per_column(x, out):
    _thread_per_column[blocks_for(x.shape[1], THREADS), THREADS](x, out)  # noqa: F821


# -- columns 2. row_bands

def _column_bands(x, band_rows, partials):
    """Block (strip, band): 32 columns x the band's rows; thread (tx, ty) sums rows ty, ty + 8, ... of
    the band in column tx; the 8 row lanes combine through shared memory; one partial per column."""
    rows = uint64(x.shape[0])
    cols = uint64(x.shape[1])
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = uint64(cuda.blockIdx.x * COLUMN_STRIP + tx)
    band = cuda.blockIdx.y
    start = uint64(band) * uint64(band_rows)
    end = min(start + uint64(band_rows), rows)
    lanes = uint64(ROW_LANES)
    tile = cuda.shared.array((ROW_LANES, COLUMN_STRIP), float32)
    a0 = IDENTITY  # noqa: F821
    a1 = IDENTITY  # noqa: F821
    # EXERCISE: write this part of `_column_bands`. Read the hints one at a time.
    #   hint 1 (nudge): Each warp (fixed ty) reads 32 neighbouring columns of one row at a time: coalesced. Thread (tx, ty) walks rows start + ty, start + ty + 8, ... below end, four rows in flight (r, r + 8, r + 16, r + 24).
    #   hint 2 (nearly the answer): Then tile[ty, tx] = the thread's result; after cuda.syncthreads() the threads of row lane 0 fold their column's 8 values and write partials[band, col].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _fold_bands(partials, rows, out):
    c = cuda.grid(1)
    if c < out.size:
        acc = IDENTITY  # noqa: F821
        for band in range(partials.shape[0]):
            acc = combine(acc, partials[band, c])  # noqa: F821
        out[c] = finish(acc, rows)  # noqa: F821


def band_split(rows, strips, blocks_per_sm=RESIDENT_BLOCKS_PER_SM):
    """Rows per band: enough bands that strips x bands blocks fill the GPU (blocks_per_sm on each
    multiprocessor), each band at least MIN_BAND_ROWS rows."""
    wanted = max(1, (sm_count() * blocks_per_sm) // strips)
    band_rows = max(MIN_BAND_ROWS, -(-rows // wanted))
    return band_rows, -(-rows // band_rows)


def row_bands(x, out):
    rows, cols = x.shape
    strips = blocks_for(cols, COLUMN_STRIP)
    band_rows, bands = band_split(rows, strips)
    partials = scratch(f"reductions.{NAME}.bands", (bands, cols))  # noqa: F821
    _column_bands[(strips, bands), (COLUMN_STRIP, ROW_LANES)](x, band_rows, partials)  # noqa: F821
    _fold_bands[blocks_for(cols, THREADS), THREADS](partials, rows, out)  # noqa: F821


# -- columns 3. column_vectors

def _column_vectors(flat, rows, cols, band_rows, partials, bands_done, out):
    """Block (strip, band): STRIP_COLS columns x the band's rows of the matrix ``flat`` (row-major, cols a
    multiple of 4); thread (tx, ty) owns columns 4 tx .. 4 tx + 3 of the strip and reads rows ty,
    ty + VECTOR_ROW_LANES, ... of the band, one 16-byte load a row. The row lanes combine through shared
    memory, one partial per column per band; the last band of a strip to finish folds the strip's."""
    rows = uint64(rows)
    cols = uint64(cols)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    t = ty * COLUMN_QUADS + tx
    strip = uint64(cuda.blockIdx.x)
    first_col = strip * uint64(STRIP_COLS)
    col = first_col + uint64(4 * tx)  # the first of this thread's four columns
    band = uint64(cuda.blockIdx.y)
    start = band * uint64(band_rows)
    end = min(start + uint64(band_rows), rows)
    lanes = uint64(VECTOR_ROW_LANES)
    a0 = IDENTITY  # noqa: F821 - one accumulator per column
    a1 = IDENTITY  # noqa: F821
    a2 = IDENTITY  # noqa: F821
    a3 = IDENTITY  # noqa: F821
    # EXERCISE: write this part of `_column_vectors`. Read the hints one at a time.
    #   hint 1 (nudge): Row r of the thread's four columns is the vector at flat[r * cols + col] (col a multiple of 4: load4 may read it). Each step loads ROWS_IN_FLIGHT rows of the band (r, r + lanes, r + 2 * lanes, ...) and folds each column's value into that column's accumulator.
    #   hint 2: A loop over range(ROWS_IN_FLIGHT) with a constant trip count is unrolled by the compiler: the loads do not depend on each other or on the folds, so all of them are issued first. Then the band's last rows one at a time (r < end).
    #   hint 3 (nearly the answer): if col < cols: r = start + ty; while r + (ROWS_IN_FLIGHT - 1) * lanes < end: for k in range(ROWS_IN_FLIGHT): v0, v1, v2, v3 = load4(flat, (r + k * lanes) * cols + col); a0 = combine(a0, v0); ...; then r += ROWS_IN_FLIGHT * lanes. Then: while r < end: the same for one row; r += lanes
    return  # TODO(exercise): not implemented yet: replace this line with your code
    tile = cuda.shared.array((VECTOR_ROW_LANES, STRIP_COLS), float32)
    tile[ty, 4 * tx] = a0
    tile[ty, 4 * tx + 1] = a1
    tile[ty, 4 * tx + 2] = a2
    tile[ty, 4 * tx + 3] = a3
    cuda.syncthreads()
    # partials[strip] holds the strip's bands, so that no 128-byte line holds two strips' partials: a
    # strip's last block reads lines no other block has read (and cached) before they were written
    for c in range(t, STRIP_COLS, VECTOR_THREADS):
        acc = tile[0, c]
        for k in range(1, VECTOR_ROW_LANES):
            acc = combine(acc, tile[k, c])  # noqa: F821
        partials[strip, band, uint64(c)] = acc

    # The last band of the strip to finish (a ticket counter per strip) folds the strip's bands: one
    # launch, and the same order of combination on every run.
    is_last = cuda.shared.array(1, int32)
    cuda.syncthreads()  # every partial of the block is written before thread 0 publishes them
    if t == 0:
        cuda.threadfence()  # the block's partials are visible to all before it is counted as done
        is_last[0] = cuda.atomic.add(bands_done, strip, 1) == cuda.gridDim.y - 1
    cuda.syncthreads()
    if is_last[0]:
        c = uint64(t)
        while c < uint64(STRIP_COLS) and first_col + c < cols:
            acc = IDENTITY  # noqa: F821
            for b in range(uint64(cuda.gridDim.y)):
                acc = combine(acc, partials[strip, b, c])  # noqa: F821
            out[first_col + c] = finish(acc, rows)  # noqa: F821
            c += uint64(VECTOR_THREADS)
        if t == 0:
            bands_done[strip] = 0  # ready for the next call


def column_vectors(x, out):
    rows, cols = x.shape
    if cols % 4 != 0 or not aligned16(x):  # rows that do not start on 16-byte boundaries
        row_bands(x, out)  # noqa: F821 - this operation's row_bands launcher
        return
    strips = blocks_for(cols, STRIP_COLS)
    band_rows, bands = band_split(rows, strips, VECTOR_BLOCKS_PER_SM)
    partials = scratch(f"reductions.{NAME}.strip_bands", (strips, bands, STRIP_COLS))  # noqa: F821
    bands_done = scratch(f"reductions.{NAME}.bands_done", strips, np.int32, zeroed=True)  # noqa: F821
    _column_vectors[(strips, bands), (COLUMN_QUADS, VECTOR_ROW_LANES)](  # noqa: F821
        flat_view(x), rows, cols, band_rows, partials, bands_done, out)


THREAD_PER_ROW = """
    One thread per row, each adding its row from left to right: the obvious kernel, and the wrong
    layout for it. At every step the 32 threads of a warp read 32 floats a whole row apart, so one
    load instruction touches 32 different 128-byte lines and uses 4 bytes of each; the rest of each
    line must survive in L1 until the thread comes back for it, and with thousands of rows in
    flight most of it does not."""

WARP_PER_ROW = """
    A warp per row: its 32 lanes read 32 neighbouring floats of the row (one 128-byte line per load
    instruction, every byte used), four lines in flight per lane, two accumulators; a shuffle tree
    folds the 32 lanes' sums and lane 0 writes the row's. At 16384 rows that is 16384 warps, eight
    per block: plenty to fill the GPU. Indices are unsigned (no negative-index test per load)."""

THREAD_PER_COLUMN = """
    One thread per column, each adding its column from top to bottom. This layout is coalesced for
    free: at every step the 32 threads of a warp read 32 neighbouring floats of the same row. What it
    lacks is parallelism: a 16384-column matrix gives 16384 threads (64 blocks, half the
    multiprocessors of an H200 idle, the other half an eighth full), each with one load in flight,
    walking 16384 rows one after another."""

ROW_BANDS = """
    The rows are cut into bands, so that (32-column strips) x (bands) blocks fill the GPU. A block is
    32 x 8 threads: each warp reads 32 neighbouring columns of one row (coalesced, as before), the
    8 warps take every 8th row of the band, four rows in flight each; the 8 partial sums of a column
    meet in a shared-memory tile and one value per column per band goes to a small buffer, which a
    second kernel (a thread per column) adds up. The strided reduction now reads memory as fast as
    the contiguous one: the layout decides the kernel, not the speed."""

COLUMN_VECTORS = """
    The row bands, with the vector ladder's last two steps. A thread owns four neighbouring columns
    and reads them with one load4 per row: a warp reads 512 contiguous bytes of a row per load
    instruction instead of 128, and each thread loads four rows before it folds any of them, 64 bytes
    in flight instead of 16, from a quarter of the load instructions. A block covers 128 columns x 8
    row lanes; the lanes' partials meet in a shared-memory tile, and one value per column per band
    goes to a buffer laid out strip by strip. The second launch is gone, and with it the gap between
    two kernels: the last block of each strip of columns to finish (a ticket counter per strip) folds
    that strip's bands and writes its outputs, in a fixed order. A width that is not a multiple of 4,
    or a matrix that does not start on a 16-byte boundary, takes the row_bands kernels. Four blocks of
    256 threads an SM are enough here: with 64 bytes in flight a thread they cover the memory latency, and
    the taller bands leave fewer partials to fold. On an H200 at 16384 x 16384 the column sums took
    241.5 us (4,447 GB/s, 97% of the read ceiling), and so did the maxima, minima and means (241.5-241.7):
    level with torch.compile's kernel (240.3-241.5 in the same runs) and 1.03x torch's sum(dim=0)
    (248.4), where row_bands was 3-4% behind in one process."""


def _matrix_inputs(size, rng):
    rows, cols = size
    return (rng.uniform(-1.0, 2.0, (rows, cols)).astype(np.float32),)


def _matrix_adversarial(kind):
    def make(size, rng):
        rows, cols = size
        (x,) = _matrix_inputs(size, rng)
        if kind in ("max", "min"):
            # all of one sign, away from 0 (an identity of 0 would win every row or column without a special)
            x = (-1.0 if kind == "max" else 1.0) * rng.uniform(1.0, 2.0, (rows, cols)).astype(np.float32)
        # A NaN in one row and column, +inf in another, +inf and -inf meeting in a third (NaN for a sum).
        x[rows // 2, cols // 2] = np.nan
        x[0, 0] = np.inf
        x[-1, -1] = np.inf
        x[-1, 0] = -np.inf
        return [("nan-and-infinities", (x,))]
    return make


def _matrix_validate(dim):
    def validate(x, out):
        expect_device_array("x", x, dtype=np.float32, ndim=2)
        expect_device_array("out", out, dtype=np.float32, shape=(x.shape[1 - dim],))
    return validate


class MatrixReduction:
    """One row of the table the matrix operators are made from: an operation (as the vector table's) and
    an orientation (dim=1: over each row, contiguous; dim=0: over each column, strided)."""

    def __init__(self, kind, dim, combine, finish, identity, torch_name, note):
        self.kind, self.dim, self.combine, self.finish, self.identity = kind, dim, combine, finish, identity
        self.torch_name, self.note = torch_name, note
        self.name = f"{kind}_{'rows' if dim == 1 else 'cols'}"


def _torch_matrix_peer(torch_name, dim):
    def peer(size):
        torch = peers.torch()
        if torch is None:
            return None
        call = getattr(torch, torch_name)
        return (f"torch.{torch_name}(dim={dim})",
                lambda x, out: call(peers.as_torch(x), dim=dim, out=peers.as_torch(out)))
    return peer


def _torch_matrix_expression(torch_name, dim):
    return lambda torch, size: lambda x: getattr(torch, torch_name)(x, dim=dim)


MATRIX_REFERENCES = {"sum": np.sum, "amax": np.max, "amin": np.min, "mean": np.mean}  # NaN propagates in each
ROW_STAGES = [(thread_per_row, "thread_per_row", THREAD_PER_ROW), (warp_per_row, "warp_per_row", WARP_PER_ROW)]
COLUMN_STAGES = [(thread_per_column, "thread_per_column", THREAD_PER_COLUMN), (row_bands, "row_bands", ROW_BANDS),
                 (column_vectors, "column_vectors", COLUMN_VECTORS)]
# column_vectors' grid counts on VECTOR_BLOCKS_PER_SM blocks resident per multiprocessor; launch_bounds (the
# real compiler's option, not the simulator's) holds the kernel to the registers that allows (64 a thread at
# 4 blocks of 256; unbounded, the compiler could take more, and a grid of one wave would run in two)
COLUMN_VECTORS_JIT = {} if is_simulator() else {"launch_bounds": (VECTOR_THREADS, VECTOR_BLOCKS_PER_SM)}
# where a stage's strips of columns and unrolled steps of rows end (the grader checks sizes on either side)
BOUNDARIES = {"column_vectors": {"cols": (STRIP_COLS,), "rows": (ROWS_IN_FLIGHT * VECTOR_ROW_LANES,)}}
ROW_KERNELS = [(_thread_per_row, {}), (_warp_per_row, {})]
COLUMN_KERNELS = [(_thread_per_column, {}), (_column_bands, {}), (_fold_bands, {}),
                  (_column_vectors, COLUMN_VECTORS_JIT)]
MAX_NOTE = """ The combining operation is the vector ladder's maximum (identity -inf; a NaN wins from
    either side, as in torch.amax); the kernels are the sum's, instantiated with it."""
MIN_NOTE = """ The combining operation is the vector ladder's minimum (identity +inf; a NaN wins from
    either side, as in torch.amin); the kernels are the sum's, instantiated with it."""
MEAN_NOTE = """ The kernels are the sum's; the one thread that writes an output divides the sum by the
    number of elements it covers, once (finish), as torch.mean does."""

COMBINE_OF = {"sum": "sum", "amax": "max", "amin": "min", "mean": "mean"}  # torch's name -> the combine axis's
MATRIX_REDUCTIONS = [
    MatrixReduction(kind, dim, combine, finish, identity, kind, note)
    for kind, combine, finish, identity, note in [("sum", add, total, ZERO, ""),
                                                  ("amax", maximum, total, NEG_INF, MAX_NOTE),
                                                  ("amin", minimum, total, POS_INF, MIN_NOTE),
                                                  ("mean", add, divide_by_n, ZERO, MEAN_NOTE)]
    for dim in (1, 0)
]
MATRIX_TITLES = {"sum": "Sum", "amax": "Maximum", "amin": "Minimum", "mean": "Mean"}


def _make_matrix_operator(m: MatrixReduction, rank: float) -> Operator:
    dim = m.dim
    reduce64 = MATRIX_REFERENCES[m.kind]
    where = "row of a float32 matrix (dim=1, contiguous)" if dim == 1 else "column of a float32 matrix (dim=0, strided)"
    # quick: the middle size: one block, not a multiple of a warp or of the 8 row lanes, big enough for every
    # unrolled loop (warp_per_row's four lines need cols > 127, the band kernel's four rows rows > 24);
    # slow: one element, and several blocks (two bands of rows for the column kernels, two strips of 32 for
    # row_bands). Widths a multiple of 4, where column_vectors takes its 16-byte kernel: the third size is
    # the one `workbench ptx` runs a stage at to find its kernels (a width of 1 takes the fallback)
    sim_sizes = [(1, 1), (7, 130), (70, 20)] if dim == 1 else [(1, 1), (33, 20), (70, 44)]
    op = Operator(
        name="reduction", variant={"combine": COMBINE_OF[m.kind], "axis": "rows" if m.dim == 1 else "cols"},
        targets=[against_peer(1.0, "eager")],
        pattern="read",  # the matrix read once, one row or column of results written
        title=f"{MATRIX_TITLES[m.kind]} over each {where}",
        reference=lambda x: reduce64(x.astype(np.float64), axis=dim),
        make_inputs=_matrix_inputs,
        make_output=lambda size: np.empty(size[1 - dim], np.float32),
        bytes_moved=lambda size: 4 * size[0] * size[1] + 4 * size[1 - dim],
        flops=lambda size: size[0] * size[1],
        validate=_matrix_validate(dim),
        tolerance=_exact if m.kind in ("amax", "amin") else _sum_tolerance,
        peer=_torch_matrix_peer(m.torch_name, dim),
        torch_expression=_torch_matrix_expression(m.torch_name, dim),
        adversarial_inputs=_matrix_adversarial(m.kind),
        check_sizes=[(1, 1), (3, 5), (37, 1000), (1000, 37), (4097, 4099), (20000, 64)],
        sim_sizes=sim_sizes,
        bench_sizes=[(1024, 1024), (4096, 4096), (8192, 8192), (16384, 16384)],
        headline_size=(16384, 16384),
        rank=rank,
        group="Reductions beyond the sum: max, min, mean, sum of squares; rows and columns",
    )
    namespace = dict(globals(), combine=m.combine, transform=itself, finish=m.finish, IDENTITY=m.identity,
                     NAME=op.name)
    namespace["_warp_fold"] = instantiate(_warp_fold, namespace, f"_warp_fold_{m.name}",
                                          jit={"device": True, "inline": True})
    for template, jit in ROW_KERNELS if dim == 1 else COLUMN_KERNELS:
        namespace[template.__name__] = instantiate(template, namespace, f"{template.__name__}_{m.name}", jit=jit)
    for k, (launcher, name, summary) in enumerate(ROW_STAGES if dim == 1 else COLUMN_STAGES):
        namespace[name] = instantiate(launcher, namespace, f"{name}_{m.name}")  # a later stage may fall back to it
        op.stage(name, summary + (m.note if k == 0 else ""), boundaries=BOUNDARIES.get(name))(namespace[name])
    return op


OPERATORS = ([_make_vector_operator(r, 360 + k) for k, r in enumerate(VECTOR_REDUCTIONS)]
             + [_make_matrix_operator(m, 366 + 0.1 * k) for k, m in enumerate(MATRIX_REDUCTIONS)])
op = OPERATORS[0]
BY_NAME = {o.name: o for o in OPERATORS}
