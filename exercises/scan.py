# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/scan.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade scan            (or scan.<stage>)
# The grader checks each stage against the operator in solutions/scan.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 3cf2830f67356def4f600ea8048f32e15f897546562d29712a8e12024c2e8c65
# --------------------------------------------------------------------------------------------------
"""Inclusive prefix sum (scan) of a float32 vector: y[i] = x[0] + x[1] + ... + x[i].

The interview question: every output depends on every input before it, yet a GPU runs thousands of
blocks that cannot wait for each other. The answer has two levels. Inside a block, threads scan a
tile together (through shared memory, or through each other's registers with warp shuffles). Across
blocks, each tile needs the total of all tiles before it: collect the tile totals, scan them (the
same problem, n / tile times smaller: recurse), and add each tile's offset.

A scan must read x once and write y once: 8 bytes and 1 add per element, so it is bound by memory
bandwidth. The stages differ in how many extra passes over memory they make to stitch the tiles.

Constraints: x is float32, 1-D, contiguous, any length n >= 1 (not a multiple of the tile); y has
x's shape. The sum is inclusive (y[0] = x[0]). x is never written.
"""

import numpy as np
from numba import cuda, float32

from workbench import peers
from workbench.ladder import Operator, blocks_for, expect_device_array, scratch

THREADS = 256  # threads per block; a multiple of the 32-lane warp
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF
ITEMS = 8  # elements each thread scans in registers in the reduce_then_scan stage
TILE = THREADS * ITEMS  # elements per block in the reduce_then_scan stage


def _inputs(size, rng):
    (n,) = size
    # Both signs, mean 0.5: prefix sums wander but grow, so relative error means something.
    return (rng.uniform(-1.0, 2.0, n).astype(np.float32),)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    (n,) = size
    # A large first element: every prefix starts at 2^25, where a float32 total is a multiple of 4.
    # One running total that adds the elements in order drops every later one (each below 2), so
    # y[i] stays 2^25 where it should grow by about i; a scan of short partial sums keeps them.
    x = rng.uniform(0.5, 1.5, n).astype(np.float32)
    x[0] = np.float32(2**25)
    return [("large-first-element", (x,))]


def _validate(x, y):
    expect_device_array("x", x, dtype=np.float32, ndim=1)
    expect_device_array("y", y, dtype=np.float32, shape=tuple(x.shape))


def _tolerance(size, dtype):
    # Each prefix is a float32 sum of up to n terms: rounding error grows like sqrt(n) ulps.
    (n,) = size
    return max(1e-5, 4 * float(np.finfo(np.float32).eps) * np.sqrt(n))


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        return "torch.cumsum", lambda x, y: torch.cumsum(peers.as_torch(x), dim=0, out=peers.as_torch(y))
    cupy = peers.cupy()
    if cupy is not None:
        return "cupy.cumsum", lambda x, y: cupy.cumsum(peers.as_cupy(x), out=peers.as_cupy(y))
    return None


op = Operator(
    name="scan",
    title="Inclusive prefix sum of a float32 vector",
    reference=lambda x: np.cumsum(x.astype(np.float64)),
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size[0], np.float32),
    bytes_moved=lambda size: 8 * size[0],
    flops=lambda size: size[0],
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    adversarial_inputs=_adversarial,
    check_sizes=[1, 31, 257, 2049, 65_537, 1_000_003, 2**24 + 1, 2**28],
    # The PTX check runs sim_sizes[2]: 2049 needs more than one tile, so every kernel is launched.
    sim_sizes=[1, 31, 2049, 257, 1000, 4099],
    bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
    headline_size=(2**28,),
    rank=120,
    group="The interview set: scan, histogram, argmax, matrix-vector, stencil",
    grade_sizes={"sim": [(2050,), (2048,), (513,)], "gpu": [(2048 * 2048 + 1,), (2048 * 256,), (2**17 + 3,)]},
)

# The grader's extra cases (besides the sizes above): a whole number of tiles, and enough tiles for


@cuda.jit
def _add_tile_offsets(y, scanned_totals, tile):
    """y[i] += (sum of all tiles before i's tile): the second pass of scan-then-propagate."""
    i = cuda.grid(1)
    if i < y.size:
        t = i // tile
        if t > 0:
            y[i] += scanned_totals[t - 1]


# -- 1. scan-then-propagate: Hillis-Steele in shared memory ---------------------------------------

@cuda.jit
def _tile_scan_hillis_steele(x, y, totals):
    buf = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    # EXERCISE: write this part of `_tile_scan_hillis_steele`. Read the hints one at a time.
    #   hint 1 (nudge): Load one element per thread into buf (0 past the end), then double the distance each step: every thread adds the value `offset` places to its left.
    #   hint 2: Read buf[t - offset] into a register, syncthreads, then add it: otherwise a neighbour may already have overwritten what you read. syncthreads again before the next step.
    #   hint 3 (nearly the answer): offset = 1; while offset < THREADS: v = buf[t - offset] if t >= offset else 0; syncthreads; buf[t] += v; syncthreads; offset *= 2. Then write y[i] (if i < n) and, from the last thread, totals[blockIdx.x] = buf[THREADS - 1].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _scan_then_propagate(x, y, level=0):
    tiles = blocks_for(x.size, THREADS)
    totals = scratch(f"scan.hillis_steele.totals.{level}", tiles)
    _tile_scan_hillis_steele[tiles, THREADS](x, y, totals)
    if tiles > 1:  # stitch the tiles: scan their totals (recursively), add each tile's offset
        scanned = scratch(f"scan.hillis_steele.scanned.{level}", tiles)
        _scan_then_propagate(totals, scanned, level + 1)
        _add_tile_offsets[tiles, THREADS](y, scanned, THREADS)


@op.stage("hillis_steele", """
    Each block scans a tile of 256 elements in shared memory with Hillis-Steele: in step k every
    thread adds the value 2^k places to its left, so after 8 steps each holds its prefix. The last
    thread also writes the tile's total. The tile totals are scanned the same way (recursively, a
    256th the size), and a second kernel adds each tile's offset to its elements. Correct, but
    y is written, read and written again (16 bytes per element, twice the minimum), and each step
    costs two barriers.""",
    bytes_moved=lambda size: 16 * size[0])
def hillis_steele(x, y):
    _scan_then_propagate(x, y)


# -- 2. reduce-then-scan: registers and warp shuffles ---------------------------------------------

@cuda.jit(device=True, inline=True)
def _warp_inclusive_scan(value, lane):
    """Inclusive scan over the 32 lanes of a warp, in registers: five shuffles, no barrier."""
    offset = 1
    while offset < 32:
        left = cuda.shfl_up_sync(FULL_MASK, value, offset)
        if lane >= offset:
            value += left
        offset *= 2
    return value


@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    offset = 16
    while offset > 0:
        value += cuda.shfl_down_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit
def _tile_totals(x, totals):
    """Pass 1: the sum of each TILE-element tile (coalesced loads, shuffle reduction)."""
    warp_sums = cuda.shared.array(WARPS, float32)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * TILE
    partial = float32(0.0)
    for k in range(ITEMS):
        i = base + k * THREADS + t
        if i < x.size:
            partial += x[i]
    partial = _warp_sum(partial)
    if t % 32 == 0:
        warp_sums[t // 32] = partial
    cuda.syncthreads()
    if t == 0:
        total = float32(0.0)
        for w in range(WARPS):
            total += warp_sums[w]
        totals[cuda.blockIdx.x] = total


@cuda.jit
def _tile_scan_with_offset(x, y, scanned_totals):
    """Pass 2: scan each tile again, starting from the sum of every tile before it."""
    tile = cuda.shared.array(TILE, float32)
    warp_totals = cuda.shared.array(WARPS, float32)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    base = cuda.blockIdx.x * TILE
    for k in range(ITEMS):  # coalesced load of the tile: neighbouring threads, neighbouring floats
        i = base + k * THREADS + t
        tile[k * THREADS + t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()
    # EXERCISE: write this part of `_tile_scan_with_offset`. Read the hints one at a time.
    #   hint 1 (nudge): Three levels: each thread scans its own ITEMS consecutive elements of the tile in registers; the warp scans the thread totals with shuffles; the block combines the warp totals.
    #   hint 2: A thread's exclusive prefix = (scanned_totals[blockIdx.x - 1] for blocks after the first) + (totals of the warps before it) + (its warp's inclusive scan minus its own total). Use _warp_inclusive_scan(value, lane), and warp_totals in shared memory with a syncthreads.
    #   hint 3 (nearly the answer): total = sum of tile[t*ITEMS : t*ITEMS+ITEMS]; inclusive = _warp_inclusive_scan(total, lane); lane 31 writes warp_totals[warp]; syncthreads; prefix = offset + sum(warp_totals[:warp]) + inclusive - total; rewrite tile[t*ITEMS + j] as running prefix; syncthreads; store tile to y coalesced (if i < n).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def _reduce_then_scan(x, y, level=0):
    tiles = blocks_for(x.size, TILE)
    if tiles == 1:
        _tile_scan_with_offset[1, THREADS](x, y, x)  # no tile before the first: the offset is unused
        return
    totals = scratch(f"scan.reduce_then_scan.totals.{level}", tiles)
    scanned = scratch(f"scan.reduce_then_scan.scanned.{level}", tiles)
    _tile_totals[tiles, THREADS](x, totals)
    _reduce_then_scan(totals, scanned, level + 1)
    _tile_scan_with_offset[tiles, THREADS](x, y, scanned)


@op.stage("reduce_then_scan", """
    Two changes. First, the tile offsets are found before scanning instead of patched in after: pass
    1 only sums each tile (reading x), the tile sums are scanned (recursively), and pass 2 scans
    each tile starting from its offset and writes y once: 12 bytes per element instead of 16, and y
    is never read back. Second, each thread scans 8 elements in registers, a warp scans its 32
    thread totals with five shuffles (no shared memory, no barrier), and the block combines its 8
    warp totals: two barriers per tile of 2048 elements instead of sixteen per 256.""",
    bytes_moved=lambda size: 12 * size[0])
def reduce_then_scan(x, y):
    _reduce_then_scan(x, y)
