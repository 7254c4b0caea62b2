# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/depthwise.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade depthwise3x3            (or depthwise3x3.<stage>; its other operators: depthwise3x3[nhwc])
# The grader checks each stage against the operator in solutions/depthwise.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: e89e05839a7f61861d0d2ab1855b0e7af97d791562d644f062bef217c361b5d3
# --------------------------------------------------------------------------------------------------
"""Depthwise 3x3 convolution of float32 images, NCHW and channels last (NHWC): one filter per channel.

MobileNet's layer: each channel convolved with its own 3x3 filter, zero padding 1, stride 1, so the
output has the input's shape. 18 flops per 8 bytes (each input read about once, each output written
once) is far too little arithmetic to matter, unlike a full convolution's (conv.py): the layer is
memory-bound, "% of peak" is the fraction of the measured copy bandwidth, and the ladders are about
reading each byte once, with many loads in flight, and filling the GPU:

* ``depthwise3x3`` (NCHW): a thread per output issues 9 loads per output; a thread per column strip
  keeps a 3-row window in registers and issues 3 (each of them shared with the neighbouring threads
  through L1); then the whole strip's window is loaded before any of it is used, the index arithmetic is
  taken out of the loop, and a thread takes four neighbouring columns in 16-byte loads and stores.
* ``depthwise3x3[nhwc]``: the same layer with a pixel's channels contiguous (what cuDNN's tensor-core
  kernels and torch's channels_last use), so a warp puts 32 neighbouring channels of one pixel across
  its lanes: the same strips, then four channels a thread in 16-byte loads.
"""

import numpy as np
from numba import cuda, float32, int64, uint32, uint64

from solutions._nchw import BENCH_SIZES, CHECK_SIZES, GROUP, HEADLINE, nchw_bytes, nchw_images
from solutions._vector_io import aligned16, load2, load4, store2, store4
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array
from workbench.targets import against_peer, of_ceiling

THREADS = 256


# == depthwise3x3 ==================================================================================

def _depthwise_inputs(size, rng):
    (x,) = nchw_images(size, rng)
    return x, rng.uniform(-1.0, 1.0, (size[1], 3, 3)).astype(np.float32)


def _depthwise_reference(x, w):
    N, C, H, W = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((N, C, H, W))
    for r in range(3):
        for s in range(3):
            out += w[None, :, r, s, None, None].astype(np.float64) * xp[:, :, r:r + H, s:s + W]
    return out


def _depthwise_adversarial(size, rng):
    x, w = _depthwise_inputs(size, rng)
    # A constant image: inside, each output is its channel's filter sum; along the border only the taps
    # on the image count (clamping or wrapping counts them all). Channels differ, so mixing them shows.
    return [("constant-image", (np.ones_like(x), w))]


def _depthwise_validate(x, w, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("w", w, dtype=np.float32, shape=(x.shape[1], 3, 3))
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape))


def _depthwise_peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, w, out):
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            weight = peers.as_torch(w).view(size[1], 1, 3, 3)
            result = torch.nn.functional.conv2d(peers.as_torch(x), weight, padding=1, groups=size[1])
        finally:
            torch.backends.cudnn.allow_tf32 = saved
        return result

    run.returns_output = True  # the bench copies torch's own result back instead of timing a copy
    return "torch.conv2d (groups=C)", run


def _depthwise_expression(torch, size):
    """The eager peer's call, for torch.compile: Inductor hands a convolution to cuDNN as eager torch
    does (only its max-autotune mode tries Triton templates), so expect the eager figure plus a wrapper."""
    return lambda x, w: torch.nn.functional.conv2d(x, w.view(size[1], 1, 3, 3), padding=1, groups=size[1])


depthwise_op = Operator(
    name="depthwise3x3",
    targets=[against_peer(1.0), of_ceiling(85, "copy_gbps")],
    title="Depthwise 3x3 convolution (one filter per channel, padding 1), NCHW float32",
    reference=_depthwise_reference,
    make_inputs=_depthwise_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: 2 * nchw_bytes(size) + 36 * size[1],
    flops=lambda size: 18 * int(np.prod(size)),
    validate=_depthwise_validate,
    peer=_depthwise_peer,
    torch_expression=_depthwise_expression,
    adversarial_inputs=_depthwise_adversarial,
    size_names=("N", "C", "H", "W"),
    # the third (quick) simulator size takes quad_columns' 16-byte path (W % 4 == 0); the others its fallback
    sim_sizes=[(1, 2, 3, 5), (2, 3, 7, 6), (1, 3, 9, 8), (1, 3, 9, 10)],
    check_sizes=CHECK_SIZES,
    bench_sizes=BENCH_SIZES,
    headline_size=HEADLINE,
    rank=330,
    group=GROUP,
    record_all_sizes=True,
)


# -- 1. a thread per output -------------------------------------------------------------------------

@cuda.jit
def _depthwise_naive(x, w, out):
    i = cuda.grid(1)
    N, C, H, W = x.shape
    if i < x.size:
        col = i % W
        row = i // W % H
        c = i // (W * H) % C
        n = i // (W * H * C)
        # EXERCISE: write this part of `_depthwise_naive`. Read the hints one at a time.
        #   hint 1: nine taps w[c, r, s] * x[n, c, row + r - 1, col + s - 1]; taps outside the plane are zero.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_op.stage("naive", """
    One thread per output reads its 9 taps and its channel's 9 weights straight from global memory,
    with a bounds test per row and per tap. Neighbouring threads take neighbouring columns, so every
    load is coalesced and L1 serves most of the 9-fold reuse, but that is 18 load instructions, four
    index divisions and signed (wrap-checked) indexing per 8 bytes of useful traffic.""")
def depthwise_naive(x, w, out):
    _depthwise_naive[blocks_for(x.size, THREADS), THREADS](x, w, out)


# -- 2. column strips: a 3-row window in registers -------------------------------------------------------

STRIP = 8  # output rows per thread


@cuda.jit(device=True, inline=True)
def _row_of_three(x, base, h, col, H, W, v):
    """v = x[plane, h, col - 1 .. col + 1], zeros outside the plane (unsigned addresses: no wrap code)."""
    inside = 0 <= h < H
    v[0] = x[uint64(base + h * W + col - 1)] if inside and col > 0 else float32(0.0)
    v[1] = x[uint64(base + h * W + col)] if inside else float32(0.0)
    v[2] = x[uint64(base + h * W + col + 1)] if inside and col + 1 < W else float32(0.0)


@cuda.jit
def _depthwise_strips(x, w, out, N, C, H, W):
    # x, out: flat views. Thread i: column col of strip `strip` of plane (n, c); neighbouring threads
    # take neighbouring columns, whatever the plane's width (no idle lanes on 14-wide planes).
    i = cuda.grid(1)
    strips = (H + STRIP - 1) // STRIP
    if i < N * C * strips * W:
        col = i % W
        strip = i // W % strips
        plane = i // (W * strips)
        c = plane % C
        base = plane * H * W
        row0 = strip * STRIP
        taps = cuda.local.array(9, float32)
        above = cuda.local.array(3, float32)
        middle = cuda.local.array(3, float32)
        below = cuda.local.array(3, float32)
        for k in range(9):
            taps[k] = w[uint64(c * 9 + k)]
        # EXERCISE: write this part of `_depthwise_strips`. Read the hints one at a time.
        #   hint 1 (nudge): load input rows row0 - 1 and row0 into `above` and `middle` (_row_of_three), then for each of the STRIP output rows load only the row below.
        #   hint 2 (nearly the answer): the output is sum over s of taps[s] above[s] + taps[3 + s] middle[s] + taps[6 + s] below[s]; then slide the window: above <- middle <- below.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_op.stage("strips", """
    Each thread computes a strip of 8 outputs down one column, keeping the 3 input rows its window
    covers in registers: each step down loads one new row of 3 values (the neighbouring threads load
    the same ones, so L1 turns them into one coalesced line), so loads per output drop from 9 to 3 and
    the weights are loaded once per 8 outputs instead of per output. The index arithmetic is done
    once per strip and addresses are unsigned (no wrap-around code), and the flat thread numbering
    keeps all 32 lanes busy on 14-pixel-wide planes, where a 2-D block would idle half of them.""")
def depthwise_strips(x, w, out):
    N, C, H, W = x.shape
    n = N * C * blocks_for(H, STRIP) * W
    _depthwise_strips[blocks_for(n, THREADS), THREADS](x.reshape(x.size), w.reshape(w.size),
                                                        out.reshape(out.size), N, C, H, W)


# -- 3. the whole strip's window in flight ------------------------------------------------------------------

WINDOW_ROWS = STRIP + 2  # the input rows a strip of STRIP outputs reads (a module constant: a local array's shape)

@cuda.jit
def _depthwise_window_in_flight(x, w, out, N, C, H, W):
    # As _depthwise_strips, but the STRIP + 2 input rows the strip needs are all loaded before the first
    # output is computed: in strips, each step's 3 loads waited behind the previous step's store.
    i = cuda.grid(1)
    strips = (H + STRIP - 1) // STRIP
    if i < N * C * strips * W:
        col = i % W
        strip = i // W % strips
        plane = i // (W * strips)
        c = plane % C
        base = plane * H * W
        row0 = strip * STRIP
        taps = cuda.local.array(9, float32)
        window = cuda.local.array((WINDOW_ROWS, 3), float32)
        row = cuda.local.array(3, float32)
        for k in range(9):
            taps[k] = w[uint64(c * 9 + k)]
        # EXERCISE: write this part of `_depthwise_window_in_flight`. Read the hints one at a time.
        #   hint 1 (nudge): first load every input row row0 - 1 .. row0 + STRIP into window (_row_of_three into a row, then copy); no store in between, so all 3 (STRIP + 2) loads are in flight together.
        #   hint 2 (nearly the answer): then each output row r sums taps against window rows r, r + 1, r + 2 and stores if row0 + r < H.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_op.stage("window_in_flight", """
    strips measured 113 us on an H200 at 128x64x56x56 (1830 GB/s, 43% of copy): each step down the
    strip loads one row and stores one output, and the next row's loads cannot move above that
    store (out might alias x), so a thread has 3 loads in flight at a time. Here a thread loads all
    30 values its strip needs (10 rows of 3) before computing any output, then computes and stores
    the 8 outputs from registers: ten times the loads in flight per thread, the same instructions.""")
def depthwise_window_in_flight(x, w, out):
    N, C, H, W = x.shape
    n = N * C * blocks_for(H, STRIP) * W
    _depthwise_window_in_flight[blocks_for(n, THREADS), THREADS](x.reshape(x.size), w.reshape(w.size),
                                                                  out.reshape(out.size), N, C, H, W)



# -- 4. addresses stepped, not recomputed ------------------------------------------------------------------------

STEPPED_THREADS = 256  # a block of stepped_addresses


@cuda.jit
def _depthwise_stepped_addresses(x, w, out, N, C, H, W):
    # As _depthwise_window_in_flight, with the index arithmetic done once a thread: the thread number split
    # in 32-bit arithmetic, one uint64 address stepped by W a row, the column's two edge tests made once.
    i = cuda.grid(1)
    strips = uint32((H + STRIP - 1) // STRIP)
    if i < N * C * strips * W:
        t = uint32(i)
        col = t % uint32(W)
        t //= uint32(W)
        row0 = t % strips * uint32(STRIP)
        plane = t // strips
        c = plane % uint32(C)
        zero = float32(0.0)
        has_left = col > uint32(0)
        has_right = col + uint32(1) < uint32(W)
        taps = cuda.local.array(9, float32)
        window = cuda.local.array((WINDOW_ROWS, 3), float32)
        # EXERCISE: write this part of `_depthwise_stepped_addresses`. Read the hints one at a time.
        #   hint 1 (nudge): at = the flat index of x[plane, row0 - 1, col] (uint64; it wraps for row0 = 0, a row never loaded); for each of the WINDOW_ROWS rows test once whether it is on the image, load at - 1, at, at + 1 (the outer two only if has_left / has_right), then at += W.
        #   hint 2 (nearly the answer): then the 9 weights, and each output row a chain of 9 multiply-adds (acc = taps[0] * window[r, 0]; acc += ...), stored if row0 + r < H.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_op.stage("stepped_addresses", """
    The same loads and arithmetic as window_in_flight, with the index arithmetic taken out of the
    loop. Its sass is about 900 instructions for 8 outputs (a few of them the divisions' slow paths),
    most of them integer: each of its 30 loads recomputed base + h W + col - 1 in 64-bit multiplies
    and tested the row and the column again, and splitting the thread number took four 64-bit
    divisions. At a copy's speed an H200 multiprocessor has about 64 instruction slots per output, so
    that kernel was bound by issuing instructions, not by memory. Here the thread number is split in
    32-bit arithmetic, one address is stepped by W from row to row, the column's two edge tests are
    made once and the row's once a row, and each output is a chain of 9 multiply-adds: about 460
    instructions of sass for the same 8 outputs. On an H200 at 128x64x56x56: 64.6 us, 3,183 GB/s, 75%
    of the copy ceiling, where window_in_flight took 153.8 in one process (2.38x); torch.compile's
    kernel took 169.6 and cuDNN's 241.7 in the same run.""")
def depthwise_stepped_addresses(x, w, out):
    N, C, H, W = x.shape
    n = N * C * blocks_for(H, STRIP) * W
    _depthwise_stepped_addresses[blocks_for(n, STEPPED_THREADS), STEPPED_THREADS](
        x.reshape(x.size), w.reshape(w.size), out.reshape(out.size), N, C, H, W)


# -- 5. four columns a thread: 16-byte loads and stores ---------------------------------------------------------

QUAD_STRIP = 4  # output rows per thread: the window is (QUAD_STRIP + 2) x 6 registers (at 8 the compiler
#                no longer unrolls the output loop, and the window goes to local memory)
QUAD_WINDOW_ROWS = QUAD_STRIP + 2
QUAD_THREADS = 256  # a block of quad_columns


@cuda.jit(device=True, inline=True)
def _quad_output(taps, window, r, j):
    """Output column col + j of the strip's row r: a chain of 9 multiply-adds, one FFMA a tap."""
    acc = taps[0] * window[r, j]
    for k in range(1, 9):
        acc += taps[k] * window[r + k // 3, j + k % 3]
    return acc


@cuda.jit
def _depthwise_quad_columns(x, w, out, N, C, H, W):
    # As _depthwise_stepped_addresses, with thread i owning four neighbouring output columns col .. col + 3
    # (W a multiple of 4, so every row starts on a 16-byte boundary): a window row is one 16-byte load of
    # the four columns plus the column on each side, two 4-byte loads that hit L1 (the neighbouring lanes'
    # 16-byte loads fetched those lines).
    i = cuda.grid(1)
    quads = uint32(W // 4)
    strips = uint32((H + QUAD_STRIP - 1) // QUAD_STRIP)
    if i < N * C * strips * quads:
        t = uint32(i)
        col = t % quads * uint32(4)
        t //= quads
        row0 = t % strips * uint32(QUAD_STRIP)
        plane = t // strips
        c = plane % uint32(C)
        zero = float32(0.0)
        has_left = col > uint32(0)
        has_right = col + uint32(4) < uint32(W)
        taps = cuda.local.array(9, float32)
        window = cuda.local.array((QUAD_WINDOW_ROWS, 6), float32)  # window[r, s]: image column col + s - 1
        # EXERCISE: write this part of `_depthwise_quad_columns`. Read the hints one at a time.
        #   hint 1 (nudge): at = the flat index of x[plane, row0 - 1, col] (it wraps for row0 = 0, a row never loaded); for each window row on the image: window[r, 1:5] is load4(x, at), window[r, 0] is x[at - 1] if has_left, window[r, 5] is x[at + 4] if has_right (zeros otherwise, and for rows off the image); then at += W.
        #   hint 2 (nearly the answer): output column col + j of row r is the 9 taps against window[r + k // 3, j + k % 3]; the four of a row go out as one store4 at x's flat index of (plane, row0 + r, col), if row0 + r < H.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_op.stage("quad_columns", """
    stepped_addresses issues three 4-byte loads for each input row of each output: 30 load
    instructions for a strip of 8 outputs, two of every three of them L1 hits on words a neighbouring
    lane also loads. Here a thread owns four neighbouring columns of its strip: a window row is one
    16-byte load of those four columns plus one 4-byte load on each side, 3 instructions for 4
    columns instead of 12, and each output row leaves as one 16-byte store. The multiply-adds stay
    9 an output; the loads, stores and address steps around them shrink about fourfold. The strip
    is 4 rows (its window, 6 x 6 values, stays in 62 registers). Nsight Compute on an H200 at
    128x64x56x56: 22 M warp instructions where stepped_addresses issued 45 M, issue slots 45% busy
    instead of 73%, DRAM at 76% of its peak instead of 63%. Timed: 53.8 us, 3,823 GB/s, 89% of the
    copy ceiling; stepped_addresses took 64.6 in the same run (1.20x), torch.compile's kernels 171.3
    and cuDNN's 241.6. It needs W a multiple of 4 (each image row then starts on a 16-byte
    boundary) and 16-byte aligned arrays; otherwise the launcher runs stepped_addresses' kernel.""")
def depthwise_quad_columns(x, w, out):
    N, C, H, W = x.shape
    flat_x, flat_w, flat_out = x.reshape(x.size), w.reshape(w.size), out.reshape(out.size)
    if W % 4 != 0 or not aligned16(flat_x, flat_out):
        n = N * C * blocks_for(H, STRIP) * W
        _depthwise_stepped_addresses[blocks_for(n, STEPPED_THREADS), STEPPED_THREADS](flat_x, flat_w, flat_out,
                                                                                        N, C, H, W)
        return
    n = N * C * blocks_for(H, QUAD_STRIP) * (W // 4)
    _depthwise_quad_columns[blocks_for(n, QUAD_THREADS), QUAD_THREADS](flat_x, flat_w, flat_out, N, C, H, W)


# == depthwise3x3[nhwc]: the same layer, channels last =====================================================

# In NCHW a plane is contiguous and a warp reads 32 neighbouring pixels of one channel; in NHWC
# (channels last: x[n, h, w, c], what cuDNN's tensor-core kernels and torch's channels_last use) a
# pixel's C channels are contiguous, and a warp reads 32 neighbouring channels of one pixel. A depthwise
# filter never mixes channels, so the channel is the natural thing to put across a warp: every lane
# does the same arithmetic on its own channel, coalesced, with no border divergence inside a warp (all
# its lanes sit at the same pixel). The filter stays (C, 3, 3), torch's depthwise weight whatever the
# activations' layout: each thread loads its channel's 9 weights once, so their layout hardly matters.

def _nhwc_inputs(size, rng):
    N, H, W, C = size
    x = rng.uniform(-2.0, 2.0, (N, H, W, C)).astype(np.float32)
    return x, rng.uniform(-1.0, 1.0, (C, 3, 3)).astype(np.float32)


def _nhwc_reference(x, w):
    nchw = _depthwise_reference(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), w)
    return nchw.transpose(0, 2, 3, 1)


def _nhwc_adversarial(size, rng):
    x, w = _nhwc_inputs(size, rng)
    # A constant image: borders count only the taps on the image; channels differ, so mixing them shows.
    return [("constant-image", (np.ones_like(x), w))]


def _nhwc_validate(x, w, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("w", w, dtype=np.float32, shape=(x.shape[3], 3, 3))
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape))


def _nhwc_peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    C = size[3]

    def run(x, w, out):
        # x is N x H x W x C in memory: as an N x C x H x W tensor it has channels_last strides, and
        # cuDNN picks its channels-last kernel; the result comes back channels-last, i.e. NHWC.
        x_cl = peers.as_torch(x).permute(0, 3, 1, 2)
        weight = peers.as_torch(w).view(C, 1, 3, 3)
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            y = torch.nn.functional.conv2d(x_cl, weight, padding=1, groups=C)
        finally:
            torch.backends.cudnn.allow_tf32 = saved
        return y.permute(0, 2, 3, 1)

    run.returns_output = True
    return "torch.conv2d (groups=C, channels_last)", run


def _nhwc_expression(torch, size):
    C = size[3]
    return lambda x, w: torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.view(C, 1, 3, 3),
                                                   padding=1, groups=C).permute(0, 2, 3, 1)


depthwise_nhwc_op = Operator(
    name="depthwise3x3", variant={"layout": "nhwc"},
    targets=[against_peer(1.0), of_ceiling(85, "copy_gbps")],
    title="Depthwise 3x3 convolution (padding 1), NHWC (channels last) float32",
    reference=_nhwc_reference,
    make_inputs=_nhwc_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: 2 * nchw_bytes(size) + 36 * size[3],
    flops=lambda size: 18 * int(np.prod(size)),
    validate=_nhwc_validate,
    peer=_nhwc_peer,
    torch_expression=_nhwc_expression,
    adversarial_inputs=_nhwc_adversarial,
    size_names=("N", "H", "W", "C"),
    sim_sizes=[(1, 3, 5, 2), (1, 5, 7, 3), (1, 9, 10, 4), (2, 7, 6, 36)],  # the middle (quick) takes the 16-byte path; C = 3 its fallback
    check_sizes=[(1, 1, 2, 1), (2, 17, 19, 3), (4, 28, 28, 64), (32, 56, 56, 64)],
    bench_sizes=[(32, 56, 56, 64), (32, 14, 14, 256), (128, 56, 56, 64)],
    headline_size=(128, 56, 56, 64),
    rank=330.5,
    group=GROUP,
    record_all_sizes=True,
)


# -- 1. a thread per output, the channel across the warp ------------------------------------------------

@cuda.jit
def _depthwise_nhwc_naive(x, w, out):
    i = cuda.grid(1)
    N, H, W, C = x.shape
    if i < x.size:
        c = i % C
        col = i // C % W
        row = i // (C * W) % H
        n = i // (C * W * H)
        # EXERCISE: write this part of `_depthwise_nhwc_naive`. Read the hints one at a time.
        #   hint 1: the same nine taps as NCHW's naive stage, indexed x[n, h, w, c]; taps off the image are zero.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_nhwc_op.stage("naive", """
    depthwise3x3's naive kernel with the index order reversed: the channel varies fastest, so a
    warp's 32 lanes take 32 channels of one pixel, and each of its nine tap loads is 128 contiguous
    bytes (one coalesced line when C >= 32); the weights are L1 hits. The lanes of a
    warp share their pixel, so the border tests never split a warp (in NCHW a warp spans a row's
    edge). Still 18 loads, four divisions and signed indexing per output.""")
def depthwise_nhwc_naive(x, w, out):
    _depthwise_nhwc_naive[blocks_for(x.size, THREADS), THREADS](x, w, out)


# -- 2. column strips, the channel across the warp ------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _nhwc_row_of_three(x, image, h, col, c, H, W, C, v):
    """v = x[image, h, col - 1 .. col + 1, c], zeros off the image (unsigned addresses)."""
    inside = 0 <= h < H
    pixel = (image * H + h) * W + col
    v[0] = x[uint64((pixel - 1) * C + c)] if inside and col > 0 else float32(0.0)
    v[1] = x[uint64(pixel * C + c)] if inside else float32(0.0)
    v[2] = x[uint64((pixel + 1) * C + c)] if inside and col + 1 < W else float32(0.0)


@cuda.jit
def _depthwise_nhwc_strips(x, w, out, N, H, W, C):
    # x, out: flat views. Thread i: channel c of column col of strip `strip` of image n; neighbouring
    # threads take neighbouring channels.
    i = cuda.grid(1)
    strips = (H + STRIP - 1) // STRIP
    if i < N * strips * W * C:
        c = i % C
        col = i // C % W
        strip = i // (C * W) % strips
        n = i // (C * W * strips)
        row0 = strip * STRIP
        taps = cuda.local.array(9, float32)
        above = cuda.local.array(3, float32)
        middle = cuda.local.array(3, float32)
        below = cuda.local.array(3, float32)
        for k in range(9):
            taps[k] = w[uint64(c * 9 + k)]
        # EXERCISE: write this part of `_depthwise_nhwc_strips`. Read the hints one at a time.
        #   hint 1: as depthwise3x3.strips: rows row0 - 1 and row0 into `above` and `middle` (_nhwc_row_of_three), then per output row load the row below, compute, slide.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_nhwc_op.stage("strips", """
    depthwise3x3's strips in channels-last order: each thread computes 8 outputs down one column of
    one channel, a 3-row window in registers, so loads per output drop from 9 to 3 (the horizontal
    neighbours' loads are other warps' lines, served by L1) and the 9 weights are loaded once per
    strip. The difference from NCHW is only the index order: a warp's loads are 32 channels of one
    pixel, 128 contiguous bytes, whatever the width of the image (NCHW's 14-wide planes needed the
    flat numbering to keep lanes busy; here C does that once C >= 32).""")
def depthwise_nhwc_strips(x, w, out):
    N, H, W, C = x.shape
    n = N * blocks_for(H, STRIP) * W * C
    _depthwise_nhwc_strips[blocks_for(n, THREADS), THREADS](x.reshape(x.size), w.reshape(w.size),
                                                            out.reshape(out.size), N, H, W, C)


# -- 3. four channels a thread, 16-byte loads -------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _nhwc_row_of_three4(x, image, h, col, c4, H, W, C, v):
    """v[s, j] = x[image, h, col + s - 1, c4 + j] for j < 4, zeros off the image: three 16-byte loads."""
    zero = float32(0.0)
    pixel = (image * H + h) * W + col
    for s in range(3):
        if 0 <= h < H and 0 <= col + s - 1 < W:
            a, b, c, d = load4(x, uint64((pixel + s - 1) * C + c4))
        else:
            a, b, c, d = zero, zero, zero, zero
        v[s, 0] = a
        v[s, 1] = b
        v[s, 2] = c
        v[s, 3] = d


@cuda.jit
def _depthwise_nhwc_vector4(x, w, out, N, H, W, C):
    # As _depthwise_nhwc_strips, with thread i owning channels c4 .. c4 + 3 (C is a multiple of 4).
    i = cuda.grid(1)
    quads = C // 4
    strips = (H + STRIP - 1) // STRIP
    if i < N * strips * W * quads:
        c4 = i % quads * 4
        col = i // quads % W
        strip = i // (quads * W) % strips
        n = i // (quads * W * strips)
        row0 = strip * STRIP
        taps = cuda.local.array((9, 4), float32)
        above = cuda.local.array((3, 4), float32)
        middle = cuda.local.array((3, 4), float32)
        below = cuda.local.array((3, 4), float32)
        for k in range(9):
            for j in range(4):
                taps[k, j] = w[uint64((c4 + j) * 9 + k)]
        # EXERCISE: write this part of `_depthwise_nhwc_vector4`. Read the hints one at a time.
        #   hint 1: the strips kernel four channels wide: each row of three is three load4 (_nhwc_row_of_three4), each output four sums, one store4.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_nhwc_op.stage("vector4", """
    What channels-last makes possible: a thread takes four neighbouring channels, so each tap of its
    window is one 16-byte load (load4) instead of four 4-byte ones, and each output row one 16-byte
    store: a quarter of the load and store instructions, a warp's access 512 contiguous bytes. In
    NCHW four neighbouring floats are four columns whose windows overlap, so a row of them also needs
    the column on each side, and its rows start 16-byte aligned only when W is a multiple of 4
    (depthwise3x3's quad_columns). Here it needs C a multiple of 4 and 16-byte aligned arrays;
    otherwise the launcher runs the strips kernel.""")
def depthwise_nhwc_vector4(x, w, out):
    N, H, W, C = x.shape
    flat_x, flat_w, flat_out = x.reshape(x.size), w.reshape(w.size), out.reshape(out.size)
    if C % 4 != 0 or not aligned16(flat_x, flat_out):
        n = N * blocks_for(H, STRIP) * W * C
        _depthwise_nhwc_strips[blocks_for(n, THREADS), THREADS](flat_x, flat_w, flat_out, N, H, W, C)
        return
    n = N * blocks_for(H, STRIP) * W * (C // 4)
    _depthwise_nhwc_vector4[blocks_for(n, THREADS), THREADS](flat_x, flat_w, flat_out, N, H, W, C)


# -- 4. the whole strip's window in flight, four channels a thread ---------------------------------------------

NHWC_STRIP = 4  # output rows per thread: its window is (NHWC_STRIP + 2) rows x 3 pixels x 4 channels of registers
NHWC_WINDOW_ROWS = NHWC_STRIP + 2
NHWC_THREADS = 128  # a block; with ~120 registers a thread, 128-thread blocks leave fewer registers idle than 256


@cuda.jit
def _depthwise_nhwc_window_in_flight(x, w, out, N, H, W, C):
    # As _depthwise_nhwc_vector4, but the NHWC_STRIP + 2 input rows the strip needs are all loaded before
    # the first output is computed, and the index arithmetic is done once: 32-bit for the thread's
    # coordinates, then one uint64 address stepped by a row (W * C) or a pixel (C).
    i = cuda.grid(1)
    quads = uint32(C // 4)
    strips = uint32((H + NHWC_STRIP - 1) // NHWC_STRIP)
    if i < N * strips * W * quads:
        t = uint32(i)
        c4 = t % quads * uint32(4)
        t //= quads
        col = t % uint32(W)
        t //= uint32(W)
        row0 = t % strips * uint32(NHWC_STRIP)
        n = t // strips
        zero = float32(0.0)
        has_left = col > uint32(0)
        has_right = col + uint32(1) < uint32(W)
        row_step = uint64(W) * uint64(C)
        taps = cuda.local.array(36, float32)
        window = cuda.local.array((NHWC_WINDOW_ROWS, 3, 4), float32)
        # EXERCISE: write this part of `_depthwise_nhwc_window_in_flight`. Read the hints one at a time.
        #   hint 1 (nudge): first every input row row0 - 1 .. row0 + NHWC_STRIP into window[r, s, 0:4] (pixel col + s - 1, channels c4 .. c4 + 3: one load4 each, zeros off the image): no store in between, so all 3 (NHWC_STRIP + 2) loads are in flight together.
        #   hint 2 (nearly the answer): then the weights (channel c4 + j's 9 taps are w[(c4 + j) * 9 .. + 8]: 36 floats from w[9 c4], nine load4), and each output row r: four chains of 9 multiply-adds against window rows r, r + 1, r + 2, one store4 if row0 + r < H.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_nhwc_op.stage("window_in_flight", """
    depthwise3x3's window_in_flight step, taken four channels at a time. In vector4 each step down
    the strip loads one row (three 16-byte loads) and stores one output, and the next row's loads
    cannot move above that store (out might alias x): three loads in flight a thread, two of them
    L1 hits on lines the horizontal neighbours fetched, so only about 16 bytes a thread of DRAM
    traffic waiting at any time. Here a thread loads the whole window its strip needs, 6 rows of 3
    pixels x 4 channels (18 loads), before it computes any output: six times the DRAM bytes in
    flight a thread. The strip is 4 rows, not 8 (the window is registers: 72 of them, plus 36 for
    the weights), so the two halo rows are re-read once per 4 outputs, from L2 (the strip above
    was read by a neighbouring block moments before). And the instructions are trimmed as in
    depthwise3x3's stepped_addresses: the thread number is split in 32-bit arithmetic, one address
    is stepped by a row instead of recomputed per load, each output is a chain of 9 multiply-adds,
    and the 36 weights of the thread's four channels, contiguous in w, are nine 16-byte loads (these
    took the kernel's sass from about 890 instructions for its 16 outputs to 600). On an H200 at
    128x56x56x64: 66.0 us, 73% of the copy ceiling, where vector4 took 116.7 in one process (1.77x);
    torch's channels-last depthwise convolution took 69.3 and torch.compile's 69.8 in the same run
    (1.05x).""")
def depthwise_nhwc_window_in_flight(x, w, out):
    N, H, W, C = x.shape
    flat_x, flat_w, flat_out = x.reshape(x.size), w.reshape(w.size), out.reshape(out.size)
    if C % 4 != 0 or not aligned16(flat_x, flat_w, flat_out):  # the weights are read in 16-byte loads too
        n = N * blocks_for(H, STRIP) * W * C
        _depthwise_nhwc_strips[blocks_for(n, THREADS), THREADS](flat_x, flat_w, flat_out, N, H, W, C)
        return
    n = N * blocks_for(H, NHWC_STRIP) * W * (C // 4)
    _depthwise_nhwc_window_in_flight[blocks_for(n, NHWC_THREADS), NHWC_THREADS](flat_x, flat_w, flat_out,
                                                                                N, H, W, C)



# -- 5. two channels of three pixels a thread: one window for three outputs ------------------------------------

PAIR_STRIP = 4  # output rows per thread
PAIR_PIXELS = 3  # neighbouring output pixels per thread: the window is (PAIR_STRIP + 2) x (PAIR_PIXELS + 2) x 2 registers
PAIR_WINDOW_ROWS = PAIR_STRIP + 2
PAIR_WINDOW_COLS = PAIR_PIXELS + 2
PAIR_THREADS = 128  # a block


@cuda.jit
def _depthwise_nhwc_channel_pairs(x, w, out, N, H, W, C):
    # As _depthwise_nhwc_window_in_flight, with thread i owning channels c2, c2 + 1 (C even) of PAIR_PIXELS
    # neighbouring output pixels: 8-byte loads and stores, 18 weights, and one window the pixels share.
    i = cuda.grid(1)
    pairs = uint32(C // 2)
    groups = uint32((W + PAIR_PIXELS - 1) // PAIR_PIXELS)
    strips = uint32((H + PAIR_STRIP - 1) // PAIR_STRIP)
    if i < N * strips * groups * pairs:
        t = uint32(i)
        c2 = t % pairs * uint32(2)
        t //= pairs
        col0 = t % groups * uint32(PAIR_PIXELS)
        t //= groups
        row0 = t % strips * uint32(PAIR_STRIP)
        n = t // strips
        zero = float32(0.0)
        row_step = uint64(W) * uint64(C)
        taps = cuda.local.array(18, float32)
        window = cuda.local.array((PAIR_WINDOW_ROWS, PAIR_WINDOW_COLS, 2), float32)
        # EXERCISE: write this part of `_depthwise_nhwc_channel_pairs`. Read the hints one at a time.
        #   hint 1 (nudge): window_in_flight's kernel with two channels instead of four and PAIR_PIXELS pixels: window[r, s] is pixel col0 + s - 1 of image row row0 + r - 1, one load2 (zeros off the image).
        #   hint 2 (nearly the answer): the 18 weights of channels c2, c2 + 1 start at w[9 c2] (even, so 8-byte aligned): nine load2; each output is a chain of 9 multiply-adds, each output pixel's pair one store2.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@depthwise_nhwc_op.stage("channel_pairs", """
    window_in_flight loads each input pixel three times, once for each output pixel whose window
    covers it (the second and third are L1 hits, but each is still a 16-byte load through L1), and
    holds 108 values a thread, a 72-value window and the 36 weights of four channels: 128 registers.
    A wider window shares its loads: here a thread takes two channels of three neighbouring output
    pixels, and its window of 6 rows x 5 pixels serves all three, so each input is loaded 5/3 times
    instead of 3, in 8-byte loads (a 16-byte window that wide would not fit in registers; this one,
    60 values and 18 weights, takes 100). On an H200 at 128x56x56x64: 60.8 us, 3,383 GB/s, 79% of
    the copy ceiling (a sweep of the pixels a thread: 3 pixels 61.5, 2 pixels 63.9, 1 pixel 67.2;
    window_in_flight took 66.6 beside the 2-pixel kernel). Strips of 6 rows were slower (77.5 us at
    1 pixel, 121 at 2; at 3 the compiler stops unrolling and the window goes to local memory: 197),
    and capping the 2-pixel kernel's registers at 80 or 64 to run more warps gained nothing (64.3,
    94.9). It needs C even and aligned arrays; otherwise the launcher runs the strips kernel.""")
def depthwise_nhwc_channel_pairs(x, w, out):
    N, H, W, C = x.shape
    flat_x, flat_w, flat_out = x.reshape(x.size), w.reshape(w.size), out.reshape(out.size)
    if C % 2 != 0 or not aligned16(flat_x, flat_w, flat_out):
        n = N * blocks_for(H, STRIP) * W * C
        _depthwise_nhwc_strips[blocks_for(n, THREADS), THREADS](flat_x, flat_w, flat_out, N, H, W, C)
        return
    n = N * blocks_for(H, PAIR_STRIP) * blocks_for(W, PAIR_PIXELS) * (C // 2)
    _depthwise_nhwc_channel_pairs[blocks_for(n, PAIR_THREADS), PAIR_THREADS](flat_x, flat_w, flat_out, N, H, W, C)


OPERATORS = [depthwise_op, depthwise_nhwc_op]
