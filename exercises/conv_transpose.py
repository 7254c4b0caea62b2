# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/conv_transpose.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade conv_transpose2d            (or conv_transpose2d.<stage>)
# The grader checks each stage against the operator in solutions/conv_transpose.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 0f857f5ffded601c2d112a13adfba0443add6a440dac9a4919824c90d505de55
# --------------------------------------------------------------------------------------------------
"""Transposed 2-D convolution (NCHW float32): the upsampling layer of decoders and GANs, and the gradient
of conv2d with respect to its input.

out[n, k, ho, wo] = sum of x[n, c, h, w] * wt[c, k, r, s] over every (c, h, w, r, s) with
                    h * stride - pad + r = ho  and  w * stride - pad + s = wo
as torch.nn.functional.conv_transpose2d computes it (output_padding 0, dilation 1, groups 1). Each input
pixel is spread over an R x S window of the output, windows placed ``stride`` apart, and ``pad`` rows
and columns cropped from each side: Ho = (H - 1) stride - 2 pad + R (and Wo likewise). With stride 2,
a 4x4 filter and padding 1 it doubles the image (28x28 -> 56x56), the DCGAN layer.

Read as the gradient: if y = conv2d(x', wt, stride, pad) then dL/dx' = conv_transpose2d(dL/dy, wt,
stride, pad), with wt's first axis conv2d's output channels; which is why the filter is C x K x R x S,
the input's channels first.

The ladder is the choice between pushing and pulling:

1. ``scatter``: each input pixel pushes its filter-weighted contributions into the outputs its window
   covers, with atomic additions (neighbouring windows overlap when R > stride).
2. ``gather``: each output pulls the inputs that reach it; the stride's holes are skipped by parity,
   so no atomics and no wasted taps.
3. ``shared_tile``: the gather, with a block's input patch and filters staged in shared memory and
   each thread computing 8 output channels from each input value it reads.
4. ``parity_gemm``: the outputs split by parity into stride^2 classes, each an ordinary stride-1
   convolution with a sub-filter, run on conv2d's implicit GEMM main loop (solutions/_implicit_gemm.py).

Inputs: x float32 (N, C, H, W), w float32 (C, K, R, S), geometry int32 [stride, pad] (a device array the
kernels read, as conv2d[general]'s), out float32 (N, K, Ho, Wo), overwritten. Size: N x C x H x W x K x
R x S x STRIDE x PAD.
"""

import math

import numpy as np
from numba import cuda, float32

from workbench import device as _device
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch
from workbench.targets import against_peer

from solutions._implicit_gemm import BM, BN, GEMM_THREADS, gemm_tile_loop, output_index

EPS32 = float(np.finfo(np.float32).eps)
MAX_STRIDE = 4
MAX_TAPS_1D = 5  # filters up to 5x5 (the shared patch and filter tile are sized for it)


def output_hw(H, W, R, S, stride, pad):
    """(Ho, Wo), as torch.nn.functional.conv_transpose2d counts them (output_padding 0)."""
    return (H - 1) * stride - 2 * pad + R, (W - 1) * stride - 2 * pad + S


def _inputs(size, rng):
    N, C, H, W, K, R, S, stride, pad = size
    x = rng.uniform(-1.0, 1.0, (N, C, H, W)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (C, K, R, S)).astype(np.float32)
    return x, w, np.array([stride, pad], np.int32)


def _reference(x, w, geometry):
    """float64: for each filter tap, every input pixel's contribution lands on a strided grid of the
    uncropped output (one tensordot over c per tap); then the padding is cropped."""
    stride, pad = (int(v) for v in geometry)
    N, C, H, W = x.shape
    _, K, R, S = w.shape
    full = np.zeros((N, K, (H - 1) * stride + R, (W - 1) * stride + S))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for r in range(R):
        for s in range(S):
            contribution = np.tensordot(x64, w64[:, :, r, s], axes=(1, 0)).transpose(0, 3, 1, 2)
            full[:, :, r:r + stride * (H - 1) + 1:stride, s:s + stride * (W - 1) + 1:stride] += contribution
    Ho, Wo = output_hw(H, W, R, S, stride, pad)
    return np.ascontiguousarray(full[:, :, pad:pad + Ho, pad:pad + Wo])


def _taps_1d(n, taps, stride, pad):
    """How many (input, tap) pairs of one axis land inside the cropped output."""
    out = (n - 1) * stride - 2 * pad + taps
    return sum(1 for i in range(n) for t in range(taps) if 0 <= i * stride - pad + t < out)


def _flops(size):
    N, C, H, W, K, R, S, stride, pad = size
    return 2 * N * C * K * _taps_1d(H, R, stride, pad) * _taps_1d(W, S, stride, pad)


def _bytes(size):
    N, C, H, W, K, R, S, stride, pad = size
    Ho, Wo = output_hw(H, W, R, S, stride, pad)
    return 4 * (N * C * H * W + C * K * R * S + N * K * Ho * Wo)


def _tolerance(size, dtype):
    # Each output sums about C R S / stride^2 products of zero-mean terms: rounding grows like its sqrt.
    N, C, H, W, K, R, S, stride, pad = size
    return max(1e-5, 4 * EPS32 * math.sqrt(C * R * S))


def _adversarial(size, rng):
    """One bright pixel in the top-left corner of every channel, and a NaN in the bottom-right one of
    channel 0, on a zero image: the top-left outputs are the filter itself (a flipped or shifted filter,
    or taps of the wrong parity show), the bottom-right ones NaN, which must propagate."""
    x, w, geometry = _inputs(size, rng)
    x = np.zeros_like(x)
    x[:, :, 0, 0] = 1.0
    x[:, 0, -1, -1] = np.nan
    return [("corner-impulse-and-nan", (x, w, geometry))]


def _validate(x, w, geometry, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("w", w, dtype=np.float32, ndim=4)
    if w.shape[0] != x.shape[1]:
        raise InputError(f"w must be C x K x R x S with C = {x.shape[1]} (x's channels first, as torch's "
                         f"conv_transpose2d weight), got {tuple(w.shape)}")
    expect_device_array("geometry", geometry, dtype=np.int32, shape=(2,))
    # The one host read of the checked call (the benchmark calls the launcher, which reads nothing).
    host = geometry if hasattr(geometry, "copy_to_host") else cuda.as_cuda_array(geometry)
    stride, pad = (int(v) for v in host.copy_to_host())
    N, C, H, W = x.shape
    _, K, R, S = w.shape
    if not 1 <= stride <= MAX_STRIDE or max(R, S) > MAX_TAPS_1D:
        raise InputError(f"conv_transpose2d takes stride 1..{MAX_STRIDE} and filters up to "
                         f"{MAX_TAPS_1D}x{MAX_TAPS_1D}; got stride {stride}, {R}x{S}")
    if not 0 <= pad < min(R, S):
        raise InputError(f"padding must be 0..{min(R, S) - 1} for a {R}x{S} filter, got {pad}")
    Ho, Wo = output_hw(H, W, R, S, stride, pad)
    if Ho < 1 or Wo < 1:
        raise InputError(f"padding {pad} crops the whole {Ho + 2 * pad}x{Wo + 2 * pad} output")
    expect_device_array("out", out, dtype=np.float32, shape=(N, K, Ho, Wo))


def _output(size):
    N, C, H, W, K, R, S, stride, pad = size
    return np.empty((N, K, *output_hw(H, W, R, S, stride, pad)), np.float32)


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    stride, pad = size[7], size[8]
    conv_transpose2d = torch.nn.functional.conv_transpose2d

    def run(x, w, geometry, out):
        with peers.without_tf32(torch):
            result = conv_transpose2d(peers.as_torch(x), peers.as_torch(w), stride=stride, padding=pad)
        peers.as_torch(out).copy_(result)

    return "torch.conv_transpose2d (cuDNN fp32)", run


def _expression(torch, size):
    stride, pad = size[7], size[8]
    return lambda x, w, geometry: torch.nn.functional.conv_transpose2d(x, w, stride=stride, padding=pad)


op = Operator(
    name="conv_transpose2d",
    targets=[against_peer(1.0)],
    title="Transposed convolution (NCHW float32, any stride and padding; conv2d's input gradient)",
    reference=_reference,
    make_inputs=_inputs,
    make_output=_output,
    bytes_moved=_bytes,
    flops=_flops,
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    torch_expression=_expression,
    bound="compute",
    size_names=("N", "C", "H", "W", "K", "R", "S", "stride", "pad"),
    adversarial_inputs=_adversarial,
    # Quick tier (the middle size): a 4x4 filter at stride 2, 8x10 outputs, K and the output width
    # multiples of no tile; two input channels, so each parity class of parity_gemm is one K-step of its
    # GEMM (the simulator runs its 4 blocks of 128 threads as Python threads). The slow tier adds a 3x3
    # at stride 2 (parity classes of 2 and 1 taps, partial K-steps) and a stride-1 5x5 past the
    # 8-channel tile; tests/test_conv.py a class spread over several blocks.
    sim_sizes=[(1, 2, 3, 4, 3, 3, 3, 2, 1), (1, 2, 4, 5, 5, 4, 4, 2, 1), (2, 3, 5, 4, 9, 5, 5, 1, 2)],
    check_sizes=[(1, 1, 1, 1, 1, 1, 1, 1, 0), (2, 3, 7, 9, 5, 3, 3, 2, 1), (3, 17, 13, 11, 33, 4, 4, 2, 1),
                 (2, 9, 10, 12, 10, 5, 5, 3, 2), (32, 64, 28, 28, 64, 4, 4, 2, 1)],
    bench_sizes=[(32, 64, 28, 28, 64, 4, 4, 2, 1), (32, 128, 14, 14, 64, 3, 3, 2, 1)],
    headline_size=(32, 64, 28, 28, 64, 4, 4, 2, 1),
    rank=324,
    group="Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
    record_all_sizes=True,
)

THREADS = 256


@cuda.jit
def _zero(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = float32(0.0)


# -- 1. scatter: each input pixel pushes into the outputs it reaches, with atomics ---------------------------

@cuda.jit
def _scatter(x, w, geometry, out):
    i = cuda.grid(1)
    N, C, H, W = x.shape
    K, R, S = w.shape[1], w.shape[2], w.shape[3]
    Ho, Wo = out.shape[2], out.shape[3]
    if i < N * K * H * W:
        # A thread per input pixel (h, w) and output channel k; neighbouring threads take neighbouring w.
        w_in = i % W
        h = i // W % H
        k = i // (W * H) % K
        n = i // (W * H * K)
        stride = geometry[0]
        pad = geometry[1]
        # EXERCISE: write this part of `_scatter`. Read the hints one at a time.
        #   hint 1 (nudge): input pixel (h, w_in) lands on out[.., h * stride - pad + r, w_in * stride - pad + s] for each tap (r, s) inside the output.
        #   hint 2 (nearly the answer): sum its contribution over c in a register, then cuda.atomic.add it there: the windows of neighbouring pixels overlap.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


def _scatter_traffic(size):
    # On top of the minimum: the output zeroed first, and each contribution an atomic read-modify-write
    # (8 bytes, served by L2 at best), R S per input pixel and output channel.
    N, C, H, W, K, R, S, stride, pad = size
    Ho, Wo = output_hw(H, W, R, S, stride, pad)
    return _bytes(size) + 4 * N * K * Ho * Wo + 8 * N * K * _taps_1d(H, R, stride, pad) * _taps_1d(W, S, stride, pad)


@op.stage("scatter", """
    The definition read forwards: each input pixel, for each output channel, adds its R x S
    weighted contributions into the output (the sum over input channels kept in a register, so one
    atomic per tap, not C). Windows placed stride apart overlap when R > stride, so two threads may
    add to the same output at once: the additions must be atomic, and the output must be zeroed first
    (a second kernel). Every output takes (R / stride)^2 atomic read-modify-writes, done in L2, and
    the zeroing pass writes the output twice. Yet on the H200 this was not the slow stage: 3781 µs at
    the headline against the gather's 3933, 1098 against 1784 at the 3x3 layer: each atomic carries C
    multiply-adds summed in a register, and the atomics of a warp land on distinct addresses. What it
    costs for sure is determinism: the order of the float additions depends on which thread gets
    there first, so the last bits change from run to run (the GPU script shows it; a library that
    promises determinism never scatters). Its merit: the loop over inputs has no holes, which is why
    frameworks wrote the input gradient this way first.""",
    bytes_moved=_scatter_traffic)
def scatter(x, w, geometry, out):
    N, K, Ho, Wo = out.shape
    _, C, H, W = x.shape
    flat = out.reshape(out.size)
    _zero[blocks_for(out.size, THREADS), THREADS](flat)
    _scatter[blocks_for(N * K * H * W, THREADS), THREADS](x, w, geometry, out)


# -- 2. gather: each output pulls the inputs that reach it ------------------------------------------------

@cuda.jit
def _gather(x, w, geometry, out):
    i = cuda.grid(1)
    N, K, Ho, Wo = out.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R, S = w.shape[2], w.shape[3]
    if i < out.size:
        wo = i % Wo
        ho = i // Wo % Ho
        k = i // (Wo * Ho) % K
        n = i // (Wo * Ho * K)
        stride = geometry[0]
        pad = geometry[1]
        # EXERCISE: write this part of `_gather`. Read the hints one at a time.
        #   hint 1 (nudge): input row h reaches output row ho through tap r = ho + pad - h * stride: only taps r with r = (ho + pad) mod stride do, and then h = (ho + pad - r) / stride exactly.
        #   hint 2 (nearly the answer): loop r from (ho + pad) % stride up to R in steps of stride (s likewise), skip h or w outside the input, sum over c.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("gather", """
    The definition read backwards: a thread per output sums the inputs that reach it. Output row ho
    is reached from input row h through tap r = ho + pad - h stride, so only the taps with r = (ho +
    pad) mod stride contribute, each from exactly one row: the loops start at that parity and step by
    the stride, and never visit the holes (a 4x4 filter at stride 2: 4 taps of 16 per output). One
    thread owns each output: no atomics, no zeroing pass, one store, and the same sum in the same order
    every run (deterministic). This is conv2d's direct stage with the roles of the axes swapped, and
    what cuDNN's and torch's backward-data kernels compute, as a GEMM, in the stage after next. It buys
    determinism, not speed: on the H200 it was no faster than the scatter (above), each multiply-add
    still two loads, and with a 3x3 filter at stride 2 the threads of a warp walk 4, 2 or 1 taps by
    the parity of their output.""")
def gather(x, w, geometry, out):
    _gather[blocks_for(out.size, THREADS), THREADS](x, w, geometry, out)


# -- 3. shared_tile: the gather with the input patch and the filters in shared memory ----------------------

TH, TW = 8, 32  # a block computes an 8 x 32 patch of outputs ...
KT = 8  # ... for 8 output channels: each thread one pixel in 8 channels
# The input rows such a patch reads: from (ho0 + pad - R + 1) / stride to (ho0 + TH - 1 + pad) / stride,
# at most (TH + R - 2) / stride + 1 <= TH + R - 1 of them (stride 1).
PATCH_ROWS = TH + MAX_TAPS_1D - 1
PATCH_COLS = TW + MAX_TAPS_1D - 1
MAX_TAPS = MAX_TAPS_1D * MAX_TAPS_1D


@cuda.jit
def _shared_tile(x, w, geometry, out):
    patch = cuda.shared.array((PATCH_ROWS, PATCH_COLS), float32)
    filters = cuda.shared.array((KT, MAX_TAPS), float32)
    acc = cuda.local.array(KT, float32)
    N, K, Ho, Wo = out.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R, S = w.shape[2], w.shape[3]
    stride = geometry[0]
    pad = geometry[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    t = ty * TW + tx
    k_groups = (K + KT - 1) // KT
    n = cuda.blockIdx.z // k_groups
    k0 = cuda.blockIdx.z % k_groups * KT
    ho0 = cuda.blockIdx.y * TH
    wo0 = cuda.blockIdx.x * TW
    ho = ho0 + ty
    wo = wo0 + tx
    # The input patch this block's outputs read (floor divisions: the first row may be negative).
    h_first = (ho0 + pad - R + 1) // stride
    w_first = (wo0 + pad - S + 1) // stride
    rows = (ho0 + TH - 1 + pad) // stride - h_first + 1
    cols = (wo0 + TW - 1 + pad) // stride - w_first + 1
    # This thread's first tap in each axis (its parity) and the patch row and column it reads there.
    r_first = (ho + pad) % stride
    s_first = (wo + pad) % stride
    pr_first = (ho + pad - r_first) // stride - h_first
    pc_first = (wo + pad - s_first) // stride - w_first
    for kk in range(KT):
        acc[kk] = float32(0.0)
    # EXERCISE: write this part of `_shared_tile`. Read the hints one at a time.
    #   hint 1 (nudge): per input channel c: copy the rows x cols input patch (zeros outside the image) and the KT filters' R x S taps for c into shared memory; a barrier.
    #   hint 2 (nearly the answer): then each thread walks its parity's taps, r = r_first, r_first + stride, ... (the patch row moves up one per step: pr_first - (r - r_first) / stride), reads each patch value once and uses it for all KT channels; a second barrier.
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    if ho < Ho and wo < Wo:
        for kk in range(KT):
            if k0 + kk < K:
                out[n, k0 + kk, ho, wo] = acc[kk]


@op.stage("shared_tile", """
    conv2d's shared-tile stage applied to the gather. A block takes an 8 x 32 patch of outputs in 8
    output channels; for each input channel it first copies the input patch those outputs read (about
    (8 + R) / stride x (32 + S) / stride pixels, zeros past the border) and the 8 filters' taps into
    shared memory, then each thread walks its parity's taps, reading each input value once from shared
    memory for 8 multiply-adds. Global loads per multiply-add drop about 8-fold and the bounds tests
    leave the inner loop (the patch holds the zeros). What it does not fix: neighbouring threads have
    different parities, so with a 3x3 filter at stride 2 half of a warp walks 2 taps per axis and the
    other half 1 (a 4x4 filter divides evenly: 2 and 2); and the 8 channels per thread are far fewer
    than an implicit GEMM's register tile. On the H200: 3684 µs at the headline (the best of the
    first three, 10x behind cuDNN's 354), 2369 at the 3x3 layer (the worst, the imbalance above).
    The next stage removes the parity from the inner loop altogether.""")
def shared_tile(x, w, geometry, out):
    N, K, Ho, Wo = out.shape
    grid = (blocks_for(Wo, TW), blocks_for(Ho, TH), N * blocks_for(K, KT))
    _shared_tile[grid, (TW, TH)](x, w, geometry, out)



# -- 4. parity_gemm: stride^2 stride-1 convolutions, each an implicit GEMM ----------------------------------
#
# Output row ho is reached only through the taps r = ph, ph + stride, ... with ph = (ho + pad) mod stride,
# from input row h = u - j for tap r = ph + j stride, where u = (ho + pad - ph) / stride. So the output
# rows of one parity ph, indexed by u, are an ordinary stride-1 correlation of x with the sub-filter of
# taps ph, ph + stride, ... read backwards (r' = Rj - 1 - j, Rj of them): h = u - (Rj - 1) + r'. The same
# holds for the columns; the (ph, pw) pairs are the stride^2 parity classes.

@cuda.jit(device=True, inline=True)
def _class_axis(ph, n_out, taps, stride, pad):
    """One axis of parity class ph: (its taps Rj, first output index, how many outputs, their first u)."""
    taps_j = (taps - ph + stride - 1) // stride  # r = ph, ph + stride, ... < taps (0 when ph >= taps)
    first = (ph + stride * MAX_TAPS_1D - pad) % stride  # the first output with (o + pad) mod stride = ph
    count = (n_out - first + stride - 1) // stride if first < n_out else 0
    return taps_j, first, count, (first + pad - ph) // stride


@cuda.jit
def _class_filters(w, geometry, packed):
    """packed = each class's sub-filter bank as conv2d's A matrix (K x C x Rj x Sj, taps reversed), the
    classes one after another (together exactly the R S taps of w). One thread per element of w."""
    i = cuda.grid(1)
    C, K, R, S = w.shape
    if i < w.size:
        s = i % S
        r = i // S % R
        k = i // (S * R) % K
        c = i // (S * R * K)
        stride = geometry[0]
        ph = r % stride
        pw = s % stride
        offset = 0  # the taps of the classes before (ph, pw)
        for a in range(ph * stride + pw):
            offset += ((R - a // stride + stride - 1) // stride) * ((S - a % stride + stride - 1) // stride)
        taps_r = (R - ph + stride - 1) // stride
        taps_s = (S - pw + stride - 1) // stride
        packed[K * C * offset + ((k * C + c) * taps_r + taps_r - 1 - r // stride) * taps_s
               + taps_s - 1 - s // stride] = w[c, k, r, s]


# conv2d's register cap (3 blocks an SM, no spills); the simulator's cuda.jit takes no launch_bounds.
@cuda.jit(**({} if _device.is_simulator() else {"launch_bounds": (GEMM_THREADS, 3)}))
def _parity_gemm(x_flat, packed, geometry, N, C, H, W, K, R, S, Ho, Wo, out_flat):
    stride = geometry[0]
    pad = geometry[1]
    # The blocks of class 0 come first, then those of class 1, ...: find this block's class.
    b = cuda.blockIdx.x
    first_block = 0
    offset = 0
    found = False
    taps_r, row0, rows, u0 = 0, 0, 0, 0
    taps_s, col0, cols, v0 = 0, 0, 0, 0
    for ph in range(stride):
        tr, r0, nr, u = _class_axis(ph, Ho, R, stride, pad)
        for pw in range(stride):
            ts, c0, nc, v = _class_axis(pw, Wo, S, stride, pad)
            blocks = (N * nr * nc + BN - 1) // BN
            if not found:
                if b < first_block + blocks:
                    found = True
                    taps_r, row0, rows, u0 = tr, r0, nr, u
                    taps_s, col0, cols, v0 = ts, c0, nc, v
                else:
                    first_block += blocks
                    offset += K * C * tr * ts
    if not found:
        return  # a block past the last class (the grid is sized for the most classes: see parity_gemm)
    # EXERCISE: write this part of `_parity_gemm`. Read the hints one at a time.
    #   hint 1 (nudge): this thread gathers the im2col column of class pixel q = (b - first_block) * BN + t: (n, i, j) with j fastest; its window's top-left input pixel is (u0 + i - (taps_r - 1), v0 + j - (taps_s - 1)).
    #   hint 2 (nearly the answer): run conv2d's gemm_tile_loop on the class's sub-filters (packed from offset on, taps_r x taps_s, dilation 1); store acc[m, qq] to output (row0 + stride i, col0 + stride j) of channel k.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def largest_stride(H, W, Ho, Wo, R, S):
    """The largest stride these shapes allow (the launcher reads no geometry from the device): the one
    that, with some padding 0 <= pad < min(R, S), gives Ho = (H - 1) stride - 2 pad + R and Wo likewise.
    Almost always the shapes allow just one; the grid is sized for this one's stride^2 classes."""
    possible = [stride for stride in range(1, MAX_STRIDE + 1) for pad in range(min(R, S))
                if output_hw(H, W, R, S, stride, pad) == (Ho, Wo)]
    return max(possible, default=MAX_STRIDE)


@op.stage("parity_gemm", """
    What cuDNN's and CUTLASS's strided backward-data kernels do. The outputs of one parity class,
    (ho + pad, wo + pad) mod stride = (ph, pw), are reached only by the taps of that parity, each from
    one input pixel that moves one row per output row of the class: the class is an ordinary stride-1
    convolution of x with a sub-filter (taps ph, ph + stride, ... read backwards; a 4x4 filter at stride
    2 gives four 2x2 sub-filters). So the transposed convolution is stride^2 small convolutions, and
    each runs on conv2d's implicit GEMM main loop as it is (gemm_tile_loop: 64 channels x 128 pixels a
    block, 8 x 8 accumulators a thread, the gather in the tile loads, double-buffered): no holes, no
    parity test per tap, no atomics, and the register tile's reuse that stage 3's 8 channels a thread
    lacked. A first small kernel packs each class's sub-filters as the GEMM's A matrix (a network would
    do it once); one launch runs every class, each block finding its class from its index. The cost:
    a class's outputs are stride apart in memory, so at stride 2 its stores write every other float
    of the sectors they touch (the other classes' blocks write the rest).""")
def parity_gemm(x, w, geometry, out):
    N, K, Ho, Wo = out.shape
    _, C, H, W = x.shape
    R, S = w.shape[2], w.shape[3]
    packed = scratch("conv_transpose.parity_gemm.filters", (w.size,), np.float32)
    _class_filters[blocks_for(w.size, THREADS), THREADS](w, geometry, packed)
    # A class's blocks cover its pixels; the classes together hold N Ho Wo of them, so the blocks number
    # at most blocks_for(N Ho Wo) + classes - 1. The stride stays on the device: the grid is sized for
    # the most classes the shapes allow, and the blocks past the last class leave at once.
    classes = largest_stride(H, W, Ho, Wo, R, S) ** 2
    grid = (blocks_for(N * Ho * Wo, BN) + classes - 1, blocks_for(K, BM))
    _parity_gemm[grid, GEMM_THREADS](x.reshape(x.size), packed, geometry, N, C, H, W, K, R, S, Ho, Wo,
                                                 out.reshape(out.size))


OPERATORS = [op]
