# CORRECT (unusual): scan.hillis_steele done the work-efficient way (Blelloch): each block scans a tile of
# 512 elements (two per thread) with an up-sweep and a down-sweep in shared memory, which gives the
# exclusive scan; adding the element itself makes it inclusive. Tile totals are scanned the same way,
# recursively, and added to each tile.
"""scan.hillis_steele: Blelloch's up-sweep / down-sweep per tile."""

from numba import cuda, float32

from workbench.ladder import blocks_for, scratch

EXPECT = {"target": "scan.hillis_steele", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 256
TILE = 2 * THREADS


@cuda.jit
def _tile_scan(x, y, totals):
    buf = cuda.shared.array(TILE, float32)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * TILE
    for k in range(2):
        i = base + k * THREADS + t
        buf[k * THREADS + t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()
    offset = 1
    d = TILE // 2
    while d > 0:  # up-sweep: partial sums in place
        if t < d:
            a = offset * (2 * t + 1) - 1
            b = offset * (2 * t + 2) - 1
            buf[b] += buf[a]
        offset *= 2
        d //= 2
        cuda.syncthreads()
    if t == 0:
        totals[cuda.blockIdx.x] = buf[TILE - 1]
        buf[TILE - 1] = float32(0.0)
    cuda.syncthreads()
    d = 1
    while d < TILE:  # down-sweep: exclusive prefixes
        offset //= 2
        if t < d:
            a = offset * (2 * t + 1) - 1
            b = offset * (2 * t + 2) - 1
            left = buf[a]
            buf[a] = buf[b]
            buf[b] += left
        d *= 2
        cuda.syncthreads()
    for k in range(2):
        i = base + k * THREADS + t
        if i < x.size:
            y[i] = buf[k * THREADS + t] + x[i]


@cuda.jit
def _add_offsets(y, scanned):
    i = cuda.grid(1)
    if i < y.size:
        tile = i // TILE
        if tile > 0:
            y[i] += scanned[tile - 1]


def _scan(x, y, level=0):
    tiles = blocks_for(x.size, TILE)
    totals = scratch(f"catalog.blelloch.totals.{level}", tiles)
    _tile_scan[tiles, THREADS](x, y, totals)
    if tiles > 1:
        scanned = scratch(f"catalog.blelloch.scanned.{level}", tiles)
        _scan(totals, scanned, level + 1)
        _add_offsets[blocks_for(y.size, THREADS), THREADS](y, scanned)


def hillis_steele(x, y):
    _scan(x, y)
