"""conv2d's implicit GEMM main loop, shared by the ladders that run a convolution as one (solutions/conv.py:
conv2d, conv2d[general], the fused epilogues; solutions/conv_transpose.py: parity_gemm's stride-1 classes).

A shared module (solutions/_*.py) rather than an import of conv.py: a ladder module that imports
another gets no exercise (the grader refuses the answer key's modules while grading).

The product is filters (K x CRS, row-major, rows m0.. of the block) times the im2col matrix (CRS x
pixels), whose columns are gathered from the image in the tile loads and never written. Block tile
64 output channels x 128 pixels, 128 threads, each 8 x 8 accumulators (see output_index).
"""

from numba import cuda, float32, int32, uint32, uint64

from workbench import device as _device

ALIGN16 = None if _device.is_simulator() else 16  # the simulator refuses alignment=

BM, BN, BK = 64, 128, 8  # block tile: 64 output channels x 128 output pixels, K-step 8 taps
GEMM_THREADS = 128  # 4 warps as 2 x 2, each a 32 x 64 warp tile; each thread 8 x 8 outputs
SA = BM + 4  # row stride of the transposed filter tile As[j, m] (68 floats)
SB = BN + 4  # row stride of the pixel tile Bs[j, q] (132 floats)
A_FLOATS = 2 * BK * SA  # double-buffered
B_FLOATS = 2 * BK * SB


@cuda.jit(device=True, inline=True)
def _load_filter_tile(w_flat, K, CRS, m0, j0, t, a_next):
    """This thread's 4 floats of the next filter tile: row m0 + t // 2, taps j0 + (t % 2) * 4 + 0..3."""
    m = m0 + t // 2
    j = j0 + (t % 2) * 4
    for i in range(4):
        inside = m < K and j + i < CRS
        a_next[i] = w_flat[uint64(m * CRS + j + i)] if inside else float32(0.0)


@cuda.jit(device=True, inline=True)
def _gather_pixel_tile(x_flat, base, h0, w0, H, W, HW, C, R, S, dilation, tap, b_next):
    """This thread's 8 taps of its output pixel for the next K-step: the im2col column, gathered.
    tap = [c, r, s] of the step's first tap, advanced in place (an odometer: no divisions)."""
    for i in range(BK):
        c = tap[0]
        h = h0 + tap[1] * dilation
        col = w0 + tap[2] * dilation
        inside = c < C and 0 <= h < H and 0 <= col < W and base >= 0
        b_next[i] = x_flat[uint64(base + c * HW + h * W + col)] if inside else float32(0.0)
        tap[2] += 1
        if tap[2] == S:
            tap[2] = 0
            tap[1] += 1
            if tap[1] == R:
                tap[1] = 0
                tap[0] += 1


@cuda.jit(device=True, inline=True)
def _store_tiles(As, Bs, buf, t, a_next, b_next):
    """Registers to shared memory: the filter tile transposed (As[j, m]), so that a thread's 4 rows at
    one j are 4 neighbouring floats; the pixel tile as Bs[j, q], this thread's column q = t."""
    for i in range(4):
        As[uint32((buf * BK + (t % 2) * 4 + i) * SA + t // 2)] = a_next[i]
    for i in range(BK):
        Bs[uint32((buf * BK + i) * SB + t)] = b_next[i]


@cuda.jit(device=True, inline=True)
def _outer_product(As, Bs, ia, ib, a, b, acc):
    """One tap: 4 + 4 floats of the filter tile's column and of the pixel tile's row (16-byte shared
    loads: unsigned indices, multiples of 4), then 64 multiply-adds."""
    for i in range(4):
        a[i] = As[ia + uint32(i)]
        a[4 + i] = As[ia + uint32(16 + i)]
        b[i] = Bs[ib + uint32(i)]
        b[4 + i] = Bs[ib + uint32(32 + i)]
    for m in range(8):
        for q in range(8):
            acc[m, q] += a[m] * b[q]


@cuda.jit(device=True, inline=True)
def eight_taps(As, Bs, ia, ib, a, b, acc):
    """The K-step's 8 taps written out (numba has no #pragma unroll; see the GEMM ladder's stage 6)."""
    _outer_product(As, Bs, ia, ib, a, b, acc)
    _outer_product(As, Bs, ia + uint32(1 * SA), ib + uint32(1 * SB), a, b, acc)
    _outer_product(As, Bs, ia + uint32(2 * SA), ib + uint32(2 * SB), a, b, acc)
    _outer_product(As, Bs, ia + uint32(3 * SA), ib + uint32(3 * SB), a, b, acc)
    _outer_product(As, Bs, ia + uint32(4 * SA), ib + uint32(4 * SB), a, b, acc)
    _outer_product(As, Bs, ia + uint32(5 * SA), ib + uint32(5 * SB), a, b, acc)
    _outer_product(As, Bs, ia + uint32(6 * SA), ib + uint32(6 * SB), a, b, acc)
    _outer_product(As, Bs, ia + uint32(7 * SA), ib + uint32(7 * SB), a, b, acc)


@cuda.jit(device=True, inline=True)
def gemm_tile_loop(x_flat, w_flat, K, C, H, W, R, S, dilation, m0, base, h0, w0, acc):
    """acc (8 x 8, registers) += this thread's share of the block's 64 x 128 tile of the product
    filters (K x CRS, rows m0.. of w_flat) @ im2col (CRS x pixels), the im2col matrix never written.
    The thread gathers the column of one output pixel: its image starts at x_flat[base] (-1: a column
    past the last pixel, zeros), its R x S window's top-left input pixel is (h0, w0). Public: the
    transposed convolution's parity_gemm runs its stride-1 sub-convolutions on this same loop."""
    As = cuda.shared.array(A_FLOATS, float32, alignment=ALIGN16)
    Bs = cuda.shared.array(B_FLOATS, float32, alignment=ALIGN16)
    a = cuda.local.array(8, float32)
    b = cuda.local.array(8, float32)
    a_next = cuda.local.array(4, float32)
    b_next = cuda.local.array(BK, float32)
    tap = cuda.local.array(3, int32)
    t = cuda.threadIdx.x
    CRS = C * R * S
    HW = H * W
    tap[0] = 0
    tap[1] = 0
    tap[2] = 0
    # Thread origin in the block tile: warp (t // 64, t // 32 % 2) owns 32 x 64 outputs at
    # (32 (t // 64), 64 (t // 32 % 2)); lane l its 4x4 pieces at ((l // 8) 4, (l % 8) 4) and 16 rows /
    # 32 columns further on. Unsigned: the shared indices built on them need no wrap-around code.
    ut = uint32(t)
    lane = ut % uint32(32)
    r0 = (ut // uint32(64)) * uint32(32) + (lane // uint32(8)) * uint32(4)
    c0 = ((ut // uint32(32)) % uint32(2)) * uint32(64) + (lane % uint32(8)) * uint32(4)
    # the GEMM ladder's double-buffered loop: load step 0 (filter tile and gathered pixel tile) into registers, store to buffer 0, sync.
    # per K-step: gather the NEXT step into registers first, compute 8 taps on the current buffer (eight_taps at ia = buf * BK * SA + r0, ib = buf * BK * SB + c0), then store the next step into the other buffer and sync.
    _load_filter_tile(w_flat, K, CRS, m0, 0, t, a_next)
    _gather_pixel_tile(x_flat, base, h0, w0, H, W, HW, C, R, S, dilation, tap, b_next)
    _store_tiles(As, Bs, 0, t, a_next, b_next)
    cuda.syncthreads()
    buf = 0
    for j0 in range(0, CRS, BK):
        more = j0 + BK < CRS
        if more:  # the next step's global loads are in flight while this step computes
            _load_filter_tile(w_flat, K, CRS, m0, j0 + BK, t, a_next)
            _gather_pixel_tile(x_flat, base, h0, w0, H, W, HW, C, R, S, dilation, tap, b_next)
        ubuf = uint32(buf)
        eight_taps(As, Bs, ubuf * uint32(BK * SA) + r0, ubuf * uint32(BK * SB) + c0, a, b, acc)
        if more:
            _store_tiles(As, Bs, 1 - buf, t, a_next, b_next)  # last read before the previous barrier
            cuda.syncthreads()
            buf = 1 - buf


@cuda.jit(device=True, inline=True)
def output_index(t, m, qq):
    """Block-tile (row, column) of accumulator acc[m, qq] (see gemm_tile_loop), as signed ints."""
    lane = t % 32
    row = t // 64 * 32 + lane // 8 * 4 + m // 4 * 16 + m % 4
    col = t // 32 % 2 * 64 + lane % 8 * 4 + qq // 4 * 32 + qq % 4
    return row, col
