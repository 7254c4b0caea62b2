# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/transpose.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade transpose            (or transpose.<stage>)
# The grader checks each stage against the operator in solutions/transpose.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 3d7f98abb3289c3c8383f936f46a2a70bdb590ce06865fe7b45e167702265b6b
# --------------------------------------------------------------------------------------------------
"""Transpose of a float32 matrix, in six steps from strided writes to one pass near memory speed.

out[j, i] = x[i, j]: no arithmetic at all, each element read once and written once (8 bytes per
element), so the only questions are how the memory is touched and how many instructions it takes to
touch it. Reading x row by row is coalesced; then the writes walk down a column of out, one element
per row. The ladder stages the data through a shared-memory tile so both sides are coalesced, removes
the bank conflicts that tile causes, gives each thread several elements, strips numba's
negative-index checks from the index arithmetic, and finally moves a bigger tile per block with its
loads issued back to back.
"""
import numpy as np
from numba import cuda, float32, uint64

from workbench.ladder import Operator, expect_device_array
from workbench import library_peers as peers
from workbench.targets import against_peer, of_ceiling

TILE = 32  # a tile is TILE x TILE elements: one warp-wide row of 32 floats (128 bytes) per row
NAIVE_ROWS = 8  # rows per block in the naive stage: a 32 x 8 block of threads, one element each
ROWS_PER_PASS = 8  # stage 4: a 32 x 8 block of threads covers a 32 x 32 tile in four passes
PADDED = TILE + 1  # words per row of the padded tile (a constant: shared arrays need literal shapes)


# -- the operator ----------------------------------------------------------------------------------

def _inputs(size, rng):
    rows, cols = size
    return (rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32),)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    rows, cols = size
    # float32's edges, scattered among ordinary values: the largest finite magnitudes, the smallest
    # normal and subnormal ones, signed zeros. A transpose only moves bits, so each must arrive as it
    # left: a tile staged in a narrower type (float16 overflows past 65504) or arithmetic on the way loses them.
    info = np.finfo(np.float32)
    edges = np.array([info.max, -info.max, info.tiny, -info.tiny, info.smallest_subnormal,
                      -info.smallest_subnormal, 0.0, -0.0, 65520.0, -65520.0], np.float32)
    x = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)
    at_edge = rng.random((rows, cols)) < 0.5
    x[at_edge] = rng.choice(edges, int(at_edge.sum()))
    return [("float32-extremes", (x,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    rows, cols = x.shape
    expect_device_array("out", out, dtype=np.float32, shape=(cols, rows))


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        return "torch (out.copy_(x.t()))", lambda x, out: peers.as_torch(out).copy_(peers.as_torch(x).t())
    cupy = peers.cupy()
    if cupy is not None:
        return "cupy (out[...] = x.T)", lambda x, out: cupy.copyto(peers.as_cupy(out), peers.as_cupy(x).T)
    return None


op = Operator(
    name="transpose",
    targets=[of_ceiling(85, "copy_gbps"), against_peer(1.0)],
    title="Transpose of a float32 matrix",
    reference=lambda x: x.T.astype(np.float64),
    make_inputs=_inputs,
    make_output=lambda size: np.empty((size[1], size[0]), np.float32),
    bytes_moved=lambda size: 8 * size[0] * size[1],  # read every element once, write it once
    flops=lambda size: 0,
    validate=_validate,
    peer=_peer,
    torch_expression=lambda torch, size: lambda x: x.t().contiguous(),  # for torch.compile
    adversarial_inputs=_adversarial,
    check_sizes=[(1, 1), (1, 1_000_003), (1_000_003, 1), (33, 65), (65, 33), (1000, 4097), (4097, 1000),
                 (3_000_001, 3), (16384, 16384)],
    sim_sizes=[(1, 1), (1, 37), (37, 1), (33, 65), (70, 45)],
    bench_sizes=[(32, 32), (128, 128), (512, 512), (1024, 1024), (2048, 2048), (4096, 4096),
                 (8192, 8192), (16384, 16384)],
    headline_size=(16384, 16384),
    rank=30,
    group="Transpose",
    record_all_sizes=True,
)


@cuda.jit(device=True, inline=True)
def _tile_corner(cols, tile_rows):
    """Row and column of the top-left element of this block's tile. The grid is 1-D (its y dimension
    is capped at 65535 blocks, too few for a tall matrix): block b takes tile b in row-major order."""
    tiles_across = (cols + TILE - 1) // TILE
    return (cuda.blockIdx.x // tiles_across) * tile_rows, (cuda.blockIdx.x % tiles_across) * TILE


def _tiles(rows, cols, tile_rows):
    return max(1, ((rows + tile_rows - 1) // tile_rows) * ((cols + TILE - 1) // TILE))


# -- 1. naive ----------------------------------------------------------------------------------------

@cuda.jit
def _naive(x, out):
    row0, col0 = _tile_corner(x.shape[1], NAIVE_ROWS)
    # EXERCISE: write this part of `_naive`. Read the hints one at a time.
    #   hint 1 (nudge): one thread per element: row from threadIdx.y, column from threadIdx.x (x moves fastest).
    #   hint 2 (nearly the answer): guard both indices, then out[col, row] = x[row, col].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("naive", """
    One thread per element, neighbouring threads on neighbouring columns: a warp reads 32 consecutive
    floats of a row of x, one 128-byte transaction. Its writes go to one column of out, 32 elements a
    whole row of out apart: 32 separate transactions, each carrying 4 useful bytes of a 32-byte
    sector. The write side sets the pace.""",
    boundaries={"rows": (NAIVE_ROWS,), "cols": (TILE,)})
def naive(x, out):
    rows, cols = x.shape
    _naive[_tiles(rows, cols, NAIVE_ROWS), (TILE, NAIVE_ROWS)](x, out)


# -- 2. shared-memory tile -----------------------------------------------------------------------------

@cuda.jit
def _tiled(x, out):
    tile = cuda.shared.array((TILE, TILE), float32)
    row0, col0 = _tile_corner(x.shape[1], TILE)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    # EXERCISE: write this part of `_tiled`. Read the hints one at a time.
    #   hint 1 (nudge): read a 32 x 32 block of x row by row into tile[ty, tx]; wait for the whole block.
    #   hint 2 (nearly the answer): then write it out row by row too: out row col0 + ty, column row0 + tx takes tile[tx, ty].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("tiled", """
    A block of 32 x 32 threads copies a 32 x 32 tile of x into shared memory, reading rows of x
    (coalesced), waits at a barrier, and writes the tile's columns as rows of out (coalesced too):
    the transposition happens in shared memory, which has no transactions to waste. Every global
    access is now a full 128-byte line. The price moved into shared memory: a warp reading a column
    of the tile hits one bank 32 times over, and those 32 reads are served one after another.""",
    boundaries={"rows": (TILE,), "cols": (TILE,)})
def tiled(x, out):
    rows, cols = x.shape
    _tiled[_tiles(rows, cols, TILE), (TILE, TILE)](x, out)


# -- 3. padded tile: no bank conflicts ---------------------------------------------------------------

@cuda.jit
def _padded(x, out):
    tile = cuda.shared.array((TILE, PADDED), float32)  # one spare column shifts each row by a bank
    row0, col0 = _tile_corner(x.shape[1], TILE)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    # EXERCISE: write this part of `_padded`. Read the hints one at a time.
    #   hint 1: exactly the tiled kernel: only the tile's shape changed.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("padded", """
    Shared memory is 32 banks of 4 bytes; word k lives in bank k % 32. In a 32 x 32 tile, column c
    of every row is word 32 r + c: the same bank for all 32 rows, so reading a column is a 32-way
    conflict. One padding column (33 words per row) puts element (r, c) in bank (r + c) % 32: a
    column now spans all 32 banks and a warp reads it in one go. One extra word per row, no other
    change.""",
    boundaries={"rows": (TILE,), "cols": (TILE,)})
def padded(x, out):
    rows, cols = x.shape
    _padded[_tiles(rows, cols, TILE), (TILE, TILE)](x, out)


# -- 4. several elements per thread --------------------------------------------------------------

@cuda.jit
def _rows_per_thread(x, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    row0, col0 = _tile_corner(x.shape[1], TILE)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    # EXERCISE: write this part of `_rows_per_thread`. Read the hints one at a time.
    #   hint 1 (nudge): a 32 x 8 block: thread (tx, ty) handles rows ty, ty + 8, ty + 16, ty + 24 of the tile.
    #   hint 2 (nearly the answer): the same two phases as before, each a loop over k in range(0, TILE, ROWS_PER_PASS).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("rows_per_thread", """
    The same padded 32 x 32 tile, moved by 32 x 8 threads that each copy four rows of it. Each thread
    issues four independent loads before the barrier, so as many bytes are in flight with a quarter
    of the threads; finding the tile and the barrier are paid once per four elements, and a
    256-thread block lets eight blocks share a multiprocessor where 1024-thread blocks allowed two,
    so one block waiting at its barrier no longer idles half the machine.""",
    boundaries={"rows": (TILE,), "cols": (TILE,)})
def rows_per_thread(x, out):
    rows, cols = x.shape
    _rows_per_thread[_tiles(rows, cols, TILE), (TILE, ROWS_PER_PASS)](x, out)


# -- 5. unsigned indices ---------------------------------------------------------------------------

@cuda.jit
def _unsigned(x, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    # Every index a uint64, and only uint64 with uint64: numba types uint64 + int64 as int64 (signed).
    rows = uint64(x.shape[0])
    cols = uint64(x.shape[1])
    tiles_across = (cols + uint64(TILE - 1)) // uint64(TILE)
    b = uint64(cuda.blockIdx.x)
    row0 = (b // tiles_across) * uint64(TILE)
    col0 = (b % tiles_across) * uint64(TILE)
    tx = uint64(cuda.threadIdx.x)
    ty = uint64(cuda.threadIdx.y)
    # EXERCISE: write this part of `_unsigned`. Read the hints one at a time.
    #   hint 1 (nudge): the rows_per_thread kernel, with every index built from the uint64 values above.
    #   hint 2 (nearly the answer): the pass offset too: for k in range(TILE // ROWS_PER_PASS), kk = uint64(k * ROWS_PER_PASS).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("unsigned", """
    A transpose does no arithmetic on its data, so the arithmetic on its indices is the whole
    instruction count, and numba adds to it: a signed index may be negative, and numba honours
    Python's a[-1], so each index of each access is first tested for sign and wrapped by the
    dimension's length: two tests on every global load and store and on every shared-memory access.
    The same kernel with every index a uint64 skips them all (and its block-to-tile division is an
    unsigned one, without Python's floor-division fix-ups). Same memory traffic, fewer instructions,
    and a third less time (measured on an H200).""",
    boundaries={"rows": (TILE,), "cols": (TILE,)})
def unsigned(x, out):
    rows, cols = x.shape
    _unsigned[_tiles(rows, cols, TILE), (TILE, ROWS_PER_PASS)](x, out)


# -- 6. a bigger tile, its loads staged in registers ---------------------------------------------

BIG = 64  # the 64 x 64 tile of the last stage
BIG_PADDED = BIG + 1
BIG_ROWS_PER_PASS = 16  # moved by 32 x 16 threads: eight elements each per phase
BIG_PASSES = BIG // BIG_ROWS_PER_PASS


@cuda.jit
def _big_tile(x, out):
    tile = cuda.shared.array((BIG, BIG_PADDED), float32)
    staged = cuda.local.array(BIG_PASSES, float32)  # a column half's loads, before any shared store
    rows = uint64(x.shape[0])
    cols = uint64(x.shape[1])
    tiles_across = (cols + uint64(BIG - 1)) // uint64(BIG)
    b = uint64(cuda.blockIdx.x)
    row0 = (b // tiles_across) * uint64(BIG)
    col0 = (b % tiles_across) * uint64(BIG)
    tx = uint64(cuda.threadIdx.x)
    ty = uint64(cuda.threadIdx.y)
    # EXERCISE: write this part of `_big_tile`. Read the hints one at a time.
    #   hint 1 (nudge): a 64 x 64 tile is two 32-column halves, each BIG_PASSES passes of 16 rows, in both phases.
    #   hint 2: in the load phase, first load a half's BIG_PASSES values into staged[] (0 outside x), then
    #   hint 3 (nearly the answer): store them to the tile: no load waits behind a shared-memory store or a bounds branch.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("big_tile", """
    Each block moves a 64 x 64 tile (padded to 65 columns) with 32 x 16 threads: eight elements per
    thread and phase instead of four, so the per-block costs (finding the tile, one division; the
    barrier; starting and retiring the block) are shared by four times as many elements. And the
    loads are staged: each thread first loads its four values of a column half into registers
    (zero outside x), then stores them to the tile. Written as load-check-store per element, as in
    stage 5, each load in the PTX follows the previous element's bounds branch and shared store;
    staged, the four loads go out back to back. Measured on an H200 at 16384 x 16384, in a tuning
    run: 626 us for the 64 x 64 tile moved by 32 x 8 threads without staging, 554 us like this.""",
    boundaries={"rows": (BIG,), "cols": (BIG,)})
def big_tile(x, out):
    rows, cols = x.shape
    blocks = max(1, ((rows + BIG - 1) // BIG) * ((cols + BIG - 1) // BIG))
    _big_tile[blocks, (TILE, BIG_ROWS_PER_PASS)](x, out)
