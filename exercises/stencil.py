# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/stencil.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade stencil            (or stencil.<stage>)
# The grader checks each stage against the operator in solutions/stencil.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: e27d97f7354d0555bbda471dbdbdfc7ad38cda0fd5559d3059eb3d039be91eae
# --------------------------------------------------------------------------------------------------
"""5x5 convolution of a float32 image, zero outside the image: out[r, c] = sum w[i, j] * img[r+i-2, c+j-2].

The interview question: every output reads 25 inputs, and each input is read by 25 outputs. A
naive kernel asks global memory (or, at best, the caches) 25 times for every pixel. A block that
first copies its tile of the image into shared memory, together with the 2-pixel border (the halo)
its outputs also need, reads each pixel from global memory about once and serves the 25 reads from
on-chip memory. The details are the interview: which threads load the halo, what goes in it at the
image's edge (zeros), and the barrier between loading and computing. The follow-up question is
whether the tile is needed at all: with a 5x5 window a thread can keep the reuse in its own
registers, walking down a strip of outputs (stage 3, whose paragraph says when shared memory pays).

Minimum traffic: read the image once, write the output once (8 bytes per pixel), plus the weights;
50 flops per pixel (25 multiply-adds).

Constraints: img is float32, 2-D, C-contiguous, any shape (rows, cols) >= (1, 1); w is float32 of
shape (5, 5) (not symmetric: w[i, j] weights row offset i - 2 and column offset j - 2); out has
img's shape and is overwritten. Pixels outside the image count as zero. img and w are never written.
"""

import numpy as np
from numba import cuda, float32, int64, uint64

from solutions._vector_io import flat_view, load_chunk, rows_fit_vectors, store_chunk
from workbench import device as _device
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array, sm_count
from workbench.targets import of_ceiling

RADIUS = 2
DIAMETER = 2 * RADIUS + 1
TILE = 16  # a block computes a TILE x TILE patch of the output
HALO_TILE = TILE + 2 * RADIUS  # the patch of the input it needs


def _inputs(size, rng):
    rows, cols = size
    img = rng.uniform(-1.0, 2.0, (rows, cols)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (DIAMETER, DIAMETER)).astype(np.float32)
    return img, w


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    rows, cols = size
    w = rng.uniform(-1.0, 1.0, (DIAMETER, DIAMETER)).astype(np.float32)
    # A constant image: inside, every output is the sum of the 25 weights; near the border only the
    # weights that land on the image count. Clamping to the edge or wrapping around counts them all.
    ones = np.ones((rows, cols), np.float32)
    # One bright pixel in the corner, zeros elsewhere: the output around (0, 0) is w read backwards
    # (out[r, c] = w[2 - r, 2 - c]), so a flipped or transposed w, or a shifted halo, shows.
    corner = np.zeros((rows, cols), np.float32)
    corner[0, 0] = 1.0
    return [("constant-image", (ones, w)), ("corner-impulse", (corner, w))]


def _reference(img, w):
    rows, cols = img.shape
    padded = np.pad(img.astype(np.float64), RADIUS)
    out = np.zeros((rows, cols))
    for i in range(DIAMETER):
        for j in range(DIAMETER):
            out += float(w[i, j]) * padded[i:i + rows, j:j + cols]
    return out


def _validate(img, w, out):
    expect_device_array("img", img, dtype=np.float32, ndim=2)
    expect_device_array("w", w, dtype=np.float32, shape=(DIAMETER, DIAMETER))
    expect_device_array("out", out, dtype=np.float32, shape=tuple(img.shape))


def explain(inputs, out, ref):
    """The grader's hint for wrong values: transposed weights, or rows and columns swapped?"""
    img, w = inputs

    def close(candidate):
        scale = max(1.0, float(np.abs(candidate).max()))
        return candidate.shape == out.shape and np.allclose(out, candidate, rtol=1e-4, atol=1e-4 * scale)

    if close(_reference(img, np.ascontiguousarray(w.T))):
        return "the output is the convolution with w transposed: use w[row offset, column offset] (w[i, j] with i for rows)"
    if img.shape[0] == img.shape[1] and close(_reference(np.ascontiguousarray(img.T), w).T):
        return "rows and columns are swapped somewhere: cuda.grid(2) returns (x, y) = (column, row)"
    return None


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    functional = torch.nn.functional
    # cuDNN convolutions default to TF32 on Ampere and later (3e-4 relative error here): compare
    # float32 with float32.
    torch.backends.cudnn.allow_tf32 = False

    def run(img, w, out):
        image = peers.as_torch(img)[None, None]
        # conv2d is a cross-correlation, which is what this stencil computes.
        result = functional.conv2d(image, peers.as_torch(w)[None, None], padding=RADIUS)
        peers.as_torch(out).copy_(result[0, 0])

    return "torch.conv2d", run


op = Operator(
    name="stencil",
    targets=[of_ceiling(80, "copy_gbps")],
    title="5x5 convolution of a float32 image (zero padding)",
    reference=_reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: 4 * (2 * size[0] * size[1] + DIAMETER * DIAMETER),
    flops=lambda size: 2 * DIAMETER * DIAMETER * size[0] * size[1],
    validate=_validate,
    peer=_peer,
    torch_expression=lambda torch, size: lambda img, w: torch.nn.functional.conv2d(  # for torch.compile
        img[None, None], w[None, None], padding=RADIUS)[0, 0],
    adversarial_inputs=_adversarial,
    check_sizes=[(1, 1), (3, 1000), (1000, 1000), (4099, 8191), (8192, 8192)],
    sim_sizes=[(1, 1), (2, 7), (17, 33), (40, 23), (33, 50)],
    bench_sizes=[(256, 256), (1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (16384, 16384)],
    headline_size=(8192, 8192),
    rank=160,
    group="The interview set: scan, histogram, argmax, matrix-vector, stencil",
    grade_sizes={"sim": [(18, 35), (1, 40), (19, 1)], "gpu": [(1, 100_003), (100_003, 1), (17, 4097)]},
    explain=explain,
)


def _grid(img):
    rows, cols = img.shape
    return (blocks_for(cols, TILE), blocks_for(rows, TILE)), (TILE, TILE)


# -- 1. naive: every tap from global memory --------------------------------------------------------

@cuda.jit
def _naive(img, w, out):
    col, row = cuda.grid(2)  # x is the fast axis: neighbouring threads take neighbouring columns
    rows, cols = img.shape
    # EXERCISE: write this part of `_naive`. Read the hints one at a time.
    #   hint 1 (nudge): One thread per output pixel: sum the 25 products w[i, j] * img[row + i - RADIUS, col + j - RADIUS].
    #   hint 2: Taps outside the image count as zero: skip them (0 <= r < rows and 0 <= c < cols). Threads past the edge of the image (the grid is rounded up to whole tiles) must not write.
    #   hint 3 (nearly the answer): if row < rows and col < cols: acc = float32(0.0); for i in range(DIAMETER): r = row + i - RADIUS; if 0 <= r < rows: for j in range(DIAMETER): c = col + j - RADIUS; if 0 <= c < cols: acc += w[i, j] * img[r, c]. Then out[row, col] = acc.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("naive", """
    One thread per output pixel reads its 25 taps straight from global memory, skipping taps outside
    the image. Neighbouring threads read neighbouring pixels (coalesced), and the caches catch much
    of the 25-fold reuse, but every tap is still a load instruction through L1, with a bounds test
    in front of it.""")
def naive(img, w, out):
    blocks, threads = _grid(img)
    _naive[blocks, threads](img, w, out)


# -- 2. shared-memory tile with a halo -------------------------------------------------------------

@cuda.jit
def _shared_tile(img, w, out):
    tile = cuda.shared.array((HALO_TILE, HALO_TILE), float32)
    weights = cuda.shared.array((DIAMETER, DIAMETER), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    rows, cols = img.shape
    row0 = cuda.blockIdx.y * TILE - RADIUS  # the image coordinates of tile[0, 0]
    col0 = cuda.blockIdx.x * TILE - RADIUS
    # EXERCISE: write this part of `_shared_tile`. Read the hints one at a time.
    #   hint 1 (nudge): First the whole block copies its (TILE + 4) x (TILE + 4) input patch into `tile` (zeros outside the image) and the weights into `weights`; then each thread computes its pixel from shared memory only.
    #   hint 2: There are more halo cells (20 x 20 = 400) than threads (256): loop over k = ty * TILE + tx, k + 256, ... and map k to (k // HALO_TILE, k % HALO_TILE). cuda.syncthreads() between loading and computing.
    #   hint 3 (nearly the answer): for k in range(ty*TILE + tx, HALO_TILE*HALO_TILE, TILE*TILE): hr, hc = divmod(k, HALO_TILE); r, c = row0 + hr, col0 + hc; tile[hr, hc] = img[r, c] if in the image else 0. Weights: threads with k < 25. syncthreads. acc += weights[i, j] * tile[ty + i, tx + j]; write out[row0 + 2 + ty, col0 + 2 + tx] if inside.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("shared_tile", """
    Each 16x16 block first copies the 20x20 patch of the image its outputs need (its tile plus a 2-pixel
    halo, zeros beyond the image's edge) into shared memory, 400 loads shared by 256 threads, and the 25
    weights beside it. After one barrier every tap is a shared-memory read: no bounds tests in the inner
    loop, and each pixel comes from global memory 1.6 times (400 / 256) instead of 25. Measure before
    you believe it: on an H200 this stage ran slower than the naive one (1068 against 885 µs at
    8192x8192), because Hopper's L1 cache already serves the naive kernel's reuse, while the tile pays a
    barrier and signed index arithmetic on every shared-memory read.""",
    boundaries={"rows": (TILE,), "cols": (TILE,)})
def shared_tile(img, w, out):
    blocks, threads = _grid(img)
    _shared_tile[blocks, threads](img, w, out)


# -- 3. register tile: a strip of outputs per thread, its inputs kept in registers -----------------

# Tunables (the lead times them on the H200; change them here).
COLS = 8  # output columns a thread computes side by side: COLS // 4 16-byte loads a row (a multiple of 4)
STRIP_THREADS = 128  # threads a block, side by side along a row
BLOCKS_PER_SM = 6  # launch_bounds: registers capped so that 6 blocks (24 warps) fit an SM: 80 a thread, no spills.
# Swept at 8192x8192 on an H200 (`workbench sweep stencil.STAGE BLOCKS_PER_SM=5,6,7` tries it again):
# 6 blocks 148.5 us, 7 150.9, 5 158.9; COLS = 4 183.6 (6 blocks) and 386.1 (8); 64-thread blocks x 10 175.2.
MIN_STRIP = 8  # the shortest strip (small images: more, shorter strips keep more threads busy)
SPAN = COLS + 2 * RADIUS  # the input columns a thread's outputs read: c - 2 .. c + COLS + 1
PARTIAL = (DIAMETER - 1, COLS)  # a local array's shape must be a constant, not an expression


@cuda.jit(device=True, inline=True)
def _own_columns(own, img, r, end, c, cols, vector):
    """own[:] = columns c .. c + COLS - 1 of image row r, in COLS // 4 16-byte loads; zeros for a row
    outside 0 .. end - 1 (above or below the image, or below what this strip reads). r is the same
    across the block: the test does not diverge."""
    zero = float32(0.0)
    if r < 0 or r >= end:
        for k in range(COLS):
            own[k] = zero
        return
    for v in range(COLS // 4):
        own[4 * v], own[4 * v + 1], own[4 * v + 2], own[4 * v + 3] = load_chunk(
            img, uint64(r) * cols, c + uint64(4 * v), cols, vector, zero)


@cuda.jit(device=True, inline=True)
def _span(x, own, img, r, end, c, cols, vector):
    """x[:] = columns c - 2 .. c + COLS + 1 of row r: the thread's own columns, and two on each side
    from the 16-byte chunks its neighbours asked for a row earlier (L1 hits by now); zeros past the edges."""
    zero = float32(0.0)
    for k in range(COLS):
        x[RADIUS + k] = own[k]
    if r < 0 or r >= end:  # own holds zeros too
        x[0] = x[1] = x[SPAN - 2] = x[SPAN - 1] = zero
        return
    base = uint64(r) * cols
    four = uint64(4)
    left = load_chunk(img, base, c - four, cols, vector, zero) if c >= four else (zero, zero, zero, zero)
    right = load_chunk(img, base, c + uint64(COLS), cols, vector, zero)
    x[0], x[1] = left[2], left[3]
    x[SPAN - 2], x[SPAN - 1] = right[0], right[1]


@cuda.jit(device=True, inline=True)
def _taps(acc, wts, i, x, q):
    """acc plus weight row i applied to the five inputs of output column c + q: x[q .. q + 4]."""
    for j in range(DIAMETER):
        acc += wts[i, j] * x[q + j]
    return acc


def _gpu_options(**options):
    """Compile options only the real GPU compiler takes (numba's simulator cuda.jit accepts no launch_bounds)."""
    return {} if _device.is_simulator() else options


@cuda.jit(**_gpu_options(launch_bounds=(STRIP_THREADS, BLOCKS_PER_SM)))
def _register_tile(img, w, out, rows, cols, vector, strip):
    # img and out are flat (load4 takes 1-D arrays); rows stays signed: the halo starts at row -2.
    # The local arrays are indexed only by loops of constant length, which unroll: they are registers.
    cols = uint64(cols)
    c = uint64(COLS) * uint64(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    if c >= cols:
        return
    wts = cuda.local.array((DIAMETER, DIAMETER), float32)
    part = cuda.local.array(PARTIAL, float32)  # partial sums of output rows r - 2 .. r + 1
    done = cuda.local.array(COLS, float32)  # output row r - 2, complete
    x = cuda.local.array(SPAN, float32)  # input row r, columns c - 2 .. c + COLS + 1
    near = cuda.local.array(SPAN, float32)  # input row r + 1
    far = cuda.local.array(COLS, float32)  # input row r + 2, the thread's own columns
    top = int64(cuda.blockIdx.y) * strip
    bottom = min(top + strip, rows)  # this thread's outputs: rows top .. bottom - 1, columns c .. c + COLS - 1
    end = min(bottom + RADIUS, rows)  # the input rows the strip reads end here
    # EXERCISE: write this part of `_register_tile`. Read the hints one at a time.
    #   hint 1 (nudge): Copy w into registers once. Then slide down the strip one input row at a time: input row r feeds output rows r - 2 .. r + 2 (weight rows 4 .. 0), so keep those rows' partial sums in registers; after row r, output row r - 2 is complete and can be stored.
    #   hint 2: for q in range(COLS): done[q] = _taps(part[0, q], wts, 4, x, q); part[0, q] = _taps(part[1, q], wts, 3, x, q); ...; part[3, q] = _taps(0, wts, 0, x, q). Store done once r - 2 >= top (the first rows only fill the partial sums).
    #   hint 3 (nearly the answer): Ask for rows early: before row r's multiply-adds, _span(near, far, ..., r + 1, ...) (far holds row r + 1's own columns) then _own_columns(far, ..., r + 2, ...); after them x[:] = near[:]. Prime x and far before the loop over r in range(top - 2, bottom + 2).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def strip_rows(rows, across):
    """Rows a strip: as tall as lets the whole grid (``across`` blocks a strip) run as one wave of
    sm_count() * BLOCKS_PER_SM resident blocks. Every block then starts at once and ends at about the
    same time: a grid of several such waves would end with a part-filled one, and a strip runs long
    enough for that tail to cost. At least MIN_STRIP rows, so that the halo (the 2 * RADIUS extra
    input rows a strip reads) adds at most half again."""
    strips = max(1, sm_count() * BLOCKS_PER_SM // across)
    return max(MIN_STRIP, blocks_for(rows, strips))


@op.stage("register_tile", """
    Each thread now computes an 8-wide strip of outputs, tens of rows tall, and walks down it one
    input row at a time. It reads columns c - 2 .. c + 9 of a row once (two 16-byte loads of its own
    eight pixels, and two pixels on each side from its neighbours' chunks, which their threads asked
    for a row earlier, so they come from L1) and uses them for all five output rows that input row
    touches, keeping those rows' partial sums in registers; the 25 weights are registers too, read
    once per thread. The naive and tiled kernels make 50 loads per output (25 pixels, 25 weights);
    this one makes 4 per input row for 8 outputs, and asks for each row a row of multiply-adds
    before it needs it, so the memory latency hides behind arithmetic. The strips are as tall as
    lets the whole grid be resident at once (launch_bounds keeps 6 blocks an SM), so no half-empty
    last wave of long-running blocks trails behind; the halo costs 4 extra input rows a strip. The
    50 loads are also why the shared tile lost to the naive kernel: they are still there, from
    shared memory now (a warp's two rows of 16 threads, 20 floats apart, collide in 4 banks), each
    read behind 64-bit signed index arithmetic (numba's wraparound for negative indices: its PTX
    holds about 370 integer instructions for one output's 25 multiply-adds), and each thread
    computes a single output after its 1.6 halo loads and a barrier; meanwhile Hopper's L1 (up to
    256 KB an SM) already held the naive kernel's 20x20 window, so the tile saved no memory traffic.
    Its 2.7 KB of shared memory did not limit occupancy. Shared memory pays when the reuse is spread
    across the block and does not fit in one thread's registers: a large radius (a 31x31 window),
    3-D stencils that reuse whole planes, tiles every thread reads many times (GEMM), or a GPU whose
    L1 does not cache global loads. Images whose width is not a multiple of 4 (or that start off a
    16-byte boundary) take the same path with one bounds-checked load and store per pixel.""")
def register_tile(img, w, out, strip=None):
    rows, cols = img.shape
    strands = blocks_for(cols, COLS)  # threads along a row
    threads = min(STRIP_THREADS, 32 * blocks_for(strands, 32))  # a narrow image needs a warp, not four
    across = blocks_for(strands, threads)
    strip = strip or strip_rows(rows, across)
    _register_tile[(across, blocks_for(rows, strip)), threads](
        flat_view(img), w, flat_view(out), rows, cols, rows_fit_vectors(img, out), strip)

