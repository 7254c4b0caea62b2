"""2-D convolution of a batch of float32 images (NCHW), from a thread per output to Winograd.

out[n, k, ho, wo] = sum over c, r, s of w[k, c, r, s] * x[n, c, ho*stride - pad + r*dilation,
                                                           wo*stride - pad + s*dilation]
(a cross-correlation, as every deep-learning library computes it), pixels outside the image zero.

A convolution layer is a matrix product in disguise: with the reduction index j = (c, r, s) and the
output column q = (n, ho, wo), out[k, q] = sum_j W[k, j] X[j, q], where W is the filter bank seen as
a K x CRS matrix (w's own memory, as is) and X[j, q] is the input pixel tap j of output q reads. That
"im2col" matrix holds each input pixel R*S times, which is why there are four algorithms:

* direct: loop over the taps (stages 1-2); simple, no extra memory, slow for a dense layer. Libraries
  keep it where there is no matrix product worth forming: depthwise and grouped convolutions with a
  few channels per group (``solutions/depthwise.py``), and layers whose C*R*S or K is
  smaller than a GEMM tile.
* explicit im2col + GEMM (stage 3): write X to memory, then call the best GEMM. Caffe's algorithm;
  costs R*S times the input in memory traffic. cuDNN's IMPLICIT_PRECOMP_GEMM is its descendant.
* implicit GEMM (stage 4): the GEMM's tile loader gathers X's elements straight from the image,
  never writing X. What cuDNN and CUTLASS pick for most layers, and always for 1x1 filters. Stage 6
  (async_gather) walks its reduction taps outermost so that every tile is copied by cp.async.
* Winograd F(2x2, 3x3) (stage 5): transforms 4x4 input tiles so that each 2x2 block of outputs costs
  16 multiplies instead of 36 (2.25x fewer); as accurate as the GEMM forms on ordinary data, not
  where an output is small beside its tile's inputs (stage 5 says when). Libraries pick it for 3x3,
  stride-1 layers with many channels.
* FFT (``solutions/conv_fft.py``, operator ``conv2d_fft``): a pointwise product in frequency space;
  wins only for large filters and few channels.

The transposed convolution (conv2d's input gradient) is ``solutions/conv_transpose.py``.

Four operators share these kernels:

``conv2d``: 3x3 filters, stride 1, padding 1 (the layer ResNet and VGG are made of), size
N x C x H x W x K. Winograd F(2x2, 3x3) (stage 5) is written for that geometry only; async_gather
(stage 6, taps outermost) is compiled for it (its loop takes the geometry; conv2d passes constants).

``conv2d[general]``: any filter R x S, stride, padding and dilation, given as a third input
``geometry`` (an int32 device array [stride, pad, dilation]; the kernels read it from device memory,
so launchers never copy anything to the host), size N x C x H x W x K x R x S x STRIDE x PAD x DIL.
Its ladder is conv2d's without Winograd, async_gather last.
Output size Ho = (H + 2 pad - dilation (R - 1) - 1) // stride + 1 (and Wo likewise).

``conv2d[bias_relu]`` and ``conv2d[bias_add_relu]``: conv2d's layer with the epilogue a network puts after
it, relu(conv(x, w) + bias[k]) and relu(conv(x, w) + bias[k] + residual) (a ResNet block's tail);
inputs x, w, bias float32 (K,) (and residual, shaped as out). Stages: ``unfused`` (the implicit GEMM,
then an epilogue kernel), ``fused_epilogue`` (the epilogue on the accumulators, one store) and
``async_epilogue`` (the same epilogue on async_gather's main loop).

Inputs: x float32 (N, C, H, W), w float32 (K, C, R, S), both C-contiguous; out float32 (N, K, Ho, Wo)
is overwritten; x and w are never written.
"""

import math

import numpy as np
from numba import cuda, float32, uint32, uint64

from workbench import device as _device
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch
from workbench.targets import against_peer, against_stage

from solutions import gemm as gemm_ladder
from solutions._implicit_gemm import (ALIGN16, BM, BN, GEMM_THREADS, SA, SB, eight_taps, gemm_tile_loop,
                                      output_index)
from solutions._ptx import (cp_async_chunk4_s32, cp_async_chunk16_s32, cp_async_commit, cp_async_wait_pending,
                            shared_address32)

EPS32 = float(np.finfo(np.float32).eps)


def _gpu_options(**options):
    """Compile options only the real GPU compiler takes (the simulator's cuda.jit takes none)."""
    return {} if _device.is_simulator() else options




# -- shapes, inputs, the reference ----------------------------------------------------------------

def output_hw(H, W, R, S, stride, pad, dilation):
    """(Ho, Wo): how many filter positions fit, as torch.nn.functional.conv2d counts them."""
    return ((H + 2 * pad - dilation * (R - 1) - 1) // stride + 1,
            (W + 2 * pad - dilation * (S - 1) - 1) // stride + 1)


def _geometry_of(size):
    """(N, C, H, W, K, R, S, stride, pad, dilation) of either operator's size."""
    if len(size) == 5:
        return (*size, 3, 3, 1, 1, 1)
    return tuple(size)


def _images(size, rng):
    N, C, H, W, K, R, S, *_ = _geometry_of(size)
    x = rng.uniform(-1.0, 1.0, (N, C, H, W)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (K, C, R, S)).astype(np.float32)
    return x, w


def _conv64(x, w, stride, pad, dilation):
    """The float64 reference: one tensordot (a BLAS product over c) per filter tap."""
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    Ho, Wo = output_hw(H, W, R, S, stride, pad, dilation)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w64 = w.astype(np.float64)
    out = np.zeros((K, N, Ho, Wo))
    for r in range(R):
        for s in range(S):
            h0, w0 = r * dilation, s * dilation
            taps = xp[:, :, h0:h0 + stride * (Ho - 1) + 1:stride, w0:w0 + stride * (Wo - 1) + 1:stride]
            out += np.tensordot(w64[:, :, r, s], taps, axes=(1, 1))
    return np.ascontiguousarray(out.transpose(1, 0, 2, 3))


def _tolerance(size, dtype):
    # Each output is a C*R*S-term float32 dot product of zero-mean terms: its rounding error grows
    # like sqrt(CRS) ulps whatever the order of the additions (as in the GEMM ladder).
    _, C, _, _, _, R, S, *_ = _geometry_of(size)
    return max(1e-5, 4 * EPS32 * math.sqrt(C * R * S))


def _flops(size):
    N, C, H, W, K, R, S, stride, pad, dilation = _geometry_of(size)
    Ho, Wo = output_hw(H, W, R, S, stride, pad, dilation)
    return 2 * N * K * Ho * Wo * C * R * S


def _bytes(size):
    N, C, H, W, K, R, S, stride, pad, dilation = _geometry_of(size)
    Ho, Wo = output_hw(H, W, R, S, stride, pad, dilation)
    return 4 * (N * C * H * W + K * C * R * S + N * K * Ho * Wo)


def _border_inputs(size, rng):
    """Inputs random draws never produce, checked beside the random ones."""
    x, w = _images(size, rng)
    # A constant image: away from the border every output is the sum of its filter; at the border
    # only the taps that land on the image count. Clamping to the edge or wrapping around shows.
    ones = np.ones_like(x)
    # One bright pixel in the top-left corner of each image: the outputs around it are the filter
    # read backwards, so a flipped filter, swapped rows and columns or a shifted window shows.
    corner = np.zeros_like(x)
    corner[:, :, 0, 0] = 1.0
    return [("constant-image", (ones, w)), ("corner-impulse", (corner, w))]


def _explain(inputs, out, ref):
    x, w = inputs[:2]
    if w.shape[2] == w.shape[3]:
        flipped = np.ascontiguousarray(w[:, :, ::-1, ::-1])
        if out.shape == ref.shape and np.allclose(out, _explain_ref(inputs, flipped), rtol=1e-4, atol=1e-4):
            return "the output is the convolution with the filter flipped: use w[k, c, r, s] with r = 0 at the top"
    return None


def _explain_ref(inputs, w):
    if len(inputs) == 3:
        stride, pad, dilation = (int(v) for v in inputs[2])
        return _conv64(inputs[0], w, stride, pad, dilation)
    return _conv64(inputs[0], w, 1, 1, 1)


def _peer_for(stride, pad, dilation):
    torch = peers.torch()
    if torch is None:
        return None
    conv2d = torch.nn.functional.conv2d

    def run(x, w, *rest):
        out = rest[-1]
        # cuDNN uses TF32 for float32 convolutions by default on Ampere and later (~5e-4 error): compare
        # float32 with float32. Put back as found, so other peers in the process are not affected.
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            result = conv2d(peers.as_torch(x), peers.as_torch(w), stride=stride, padding=pad, dilation=dilation)
        finally:
            torch.backends.cudnn.allow_tf32 = saved
        peers.as_torch(out).copy_(result)

    return run


# -- the operators ----------------------------------------------------------------------------------

def _validate_images(x, w):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("w", w, dtype=np.float32, ndim=4)
    if w.shape[1] != x.shape[1]:
        raise InputError(f"w must be K x C x R x S with C = {x.shape[1]} (x's channels), got {tuple(w.shape)}")


def _validate(x, w, out):
    _validate_images(x, w)
    if tuple(w.shape[2:]) != (3, 3):
        raise InputError(f"conv2d takes 3x3 filters (stride 1, padding 1), got {w.shape[2]}x{w.shape[3]}; "
                         "conv2d[general] takes any filter, stride, padding and dilation")
    N, _, H, W = x.shape
    expect_device_array("out", out, dtype=np.float32, shape=(N, w.shape[0], H, W))


def _peer(size):
    run = _peer_for(1, 1, 1)
    return None if run is None else ("torch.conv2d (cuDNN fp32)", run)


op = Operator(
    name="conv2d",
    targets=[against_peer(1.0)],
    title="3x3 convolution of a batch of float32 images (NCHW, stride 1, padding 1)",
    reference=lambda x, w: _conv64(x, w, 1, 1, 1),
    make_inputs=_images,
    make_output=lambda size: np.empty((size[0], size[4], size[2], size[3]), np.float32),
    bytes_moved=_bytes,
    flops=_flops,
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    bound="compute",
    size_names=("N", "C", "H", "W", "K"),
    adversarial_inputs=_border_inputs,
    explain=_explain,
    check_sizes=[(1, 1, 1, 1, 1), (2, 3, 7, 9, 5), (3, 17, 15, 13, 33), (4, 64, 28, 28, 70),
                 (8, 128, 14, 14, 128)],
    # The quick tier checks the first and the third; the slow tier adds K past the 64-channel tile and
    # more pixels than the 128-pixel tile.
    sim_sizes=[(1, 2, 3, 4, 3), (1, 4, 5, 6, 65), (1, 3, 7, 9, 5), (2, 3, 9, 8, 6)],
    bench_sizes=[(32, 64, 56, 56, 64), (32, 256, 14, 14, 256), (32, 128, 28, 28, 128)],
    headline_size=(32, 64, 56, 56, 64),
    rank=320,
    group="Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
    record_all_sizes=True,
    grade_sizes={"sim": [(1, 2, 5, 6, 3), (2, 3, 4, 9, 2)], "gpu": [(2, 19, 17, 15, 70), (1, 64, 56, 56, 64)]},
)


def _general_validate(x, w, geometry, out):
    _validate_images(x, w)
    expect_device_array("geometry", geometry, dtype=np.int32, shape=(3,))
    # The one host read of the checked call (the benchmark calls the launcher, which reads nothing):
    # without the numbers, a wrong output shape could not be named.
    host = geometry if hasattr(geometry, "copy_to_host") else cuda.as_cuda_array(geometry)  # torch, CuPy
    stride, pad, dilation = (int(v) for v in host.copy_to_host())
    if stride < 1 or dilation < 1 or pad < 0:
        raise InputError(f"geometry must be [stride >= 1, pad >= 0, dilation >= 1], got {[stride, pad, dilation]}")
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    if stride > MAX_STRIDE or max(R - 1, S - 1) * dilation > MAX_REACH:
        raise InputError(f"conv2d[general] supports stride <= {MAX_STRIDE} and a dilated filter reach "
                         f"dilation*(R-1) <= {MAX_REACH} (7x7, or 3x3 at dilation 3); got stride {stride}, "
                         f"{R}x{S} at dilation {dilation}")
    Ho, Wo = output_hw(H, W, R, S, stride, pad, dilation)
    if Ho < 1 or Wo < 1:
        raise InputError(f"a {R}x{S} filter at dilation {dilation} does not fit a {H}x{W} image padded by {pad}")
    expect_device_array("out", out, dtype=np.float32, shape=(N, K, Ho, Wo))


def _general_inputs(size, rng):
    x, w = _images(size, rng)
    return x, w, np.array(size[7:10], np.int32)


def _general_adversarial(size, rng):
    # The constant image only (the simulator is slow): it is the one that tests every border, which
    # stride, padding and dilation move.
    geometry = np.array(size[7:10], np.int32)
    return [(label, (x, w, geometry)) for label, (x, w) in _border_inputs(size, rng)[:1]]


def _general_output(size):
    N, C, H, W, K, R, S, stride, pad, dilation = size
    return np.empty((N, K, *output_hw(H, W, R, S, stride, pad, dilation)), np.float32)


def _general_peer(size):
    run = _peer_for(*size[7:10])
    return None if run is None else ("torch.conv2d (cuDNN fp32)", run)


MAX_STRIDE = 2  # the shared-tile stage's input patch is sized for these (see PATCH_ROWS)
MAX_REACH = 6

general_op = Operator(
    name="conv2d", variant={"geometry": "general"},
    title="Convolution with any filter size, stride, padding and dilation (NCHW float32)",
    reference=lambda x, w, geometry: _conv64(x, w, *(int(v) for v in geometry)),
    make_inputs=_general_inputs,
    make_output=_general_output,
    bytes_moved=_bytes,
    flops=_flops,
    validate=_general_validate,
    tolerance=_tolerance,
    peer=_general_peer,
    bound="compute",
    size_names=("N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dil"),
    adversarial_inputs=_general_adversarial,
    explain=_explain,
    # Quick tier (the middle size, also what `workbench ptx` compiles at): a 1x1 with C = 17, past
    # async_gather's K_STEP so that it runs its own kernel (a whole K-step and one of a channel); the slow
    # tier adds a 3x3 at stride 2 and dilation 2, a 7x7 at stride 2 and an unpadded 3x3 with K past the
    # 64-channel tile and more pixels than the 128-pixel tile.
    sim_sizes=[(1, 3, 7, 9, 4, 3, 3, 2, 2, 2), (1, 2, 9, 11, 3, 7, 7, 2, 3, 1),
               (1, 17, 6, 7, 6, 1, 1, 1, 0, 1), (2, 3, 10, 13, 65, 3, 3, 1, 0, 1)],
    check_sizes=[(1, 1, 1, 1, 1, 1, 1, 1, 0, 1), (2, 3, 17, 19, 5, 7, 7, 2, 3, 1), (3, 17, 15, 13, 33, 3, 3, 2, 1, 1),
                 (2, 19, 21, 23, 70, 3, 3, 1, 2, 2), (4, 64, 28, 28, 70, 1, 1, 1, 0, 1),
                 (8, 3, 224, 224, 64, 7, 7, 2, 3, 1)],
    bench_sizes=[(32, 128, 28, 28, 128, 1, 1, 1, 0, 1), (32, 3, 224, 224, 64, 7, 7, 2, 3, 1),
                 (32, 64, 56, 56, 128, 3, 3, 2, 1, 1)],
    headline_size=(32, 128, 28, 28, 128, 1, 1, 1, 0, 1),
    rank=321,
    group="Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
    record_all_sizes=True,
)

_CONSTANTS: dict = {}


def _constant(key, values, dtype):
    """A small device array holding ``values``, copied once per process (a launcher that copied it on
    every call would time the copy)."""
    if key not in _CONSTANTS:
        _CONSTANTS[key] = cuda.to_device(np.array(values, dtype))
    return _CONSTANTS[key]


def _same3x3():
    return _constant("geometry 3x3", [1, 1, 1], np.int32)


def _flat(a):
    """A 1-D view of a contiguous device array (no copy)."""
    return a.reshape(a.size)


# -- 1. direct: a thread per output ---------------------------------------------------------------

THREADS = 256


@cuda.jit
def _direct(x, w, geometry, out):
    i = cuda.grid(1)
    N, K, Ho, Wo = out.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R, S = w.shape[2], w.shape[3]
    if i < out.size:
        # Neighbouring threads take neighbouring wo: their loads of x and their stores are coalesced,
        # and they read the same filter element (a broadcast).
        wo = i % Wo
        ho = i // Wo % Ho
        k = i // (Wo * Ho) % K
        n = i // (Wo * Ho * K)
        stride = geometry[0]
        pad = geometry[1]
        dilation = geometry[2]
        # HINT: the top-left input pixel of this output's window is (ho * stride - pad, wo * stride - pad); tap (r, s) is dilation * (r, s) further on.
        # HINT: acc = sum over c, r, s of w[k, c, r, s] * x[n, c, h, col], skipping taps outside the image (they are zero).
        # BEGIN SOLUTION
        h0 = ho * stride - pad
        w0 = wo * stride - pad
        acc = float32(0.0)
        for c in range(C):
            for r in range(R):
                h = h0 + r * dilation
                if 0 <= h < H:
                    for s in range(S):
                        col = w0 + s * dilation
                        if 0 <= col < W:
                            acc += w[k, c, r, s] * x[n, c, h, col]
        out[n, k, ho, wo] = acc
        # END SOLUTION


def _launch_direct(x, w, geometry, out):
    _direct[blocks_for(out.size, THREADS), THREADS](x, w, geometry, out)


DIRECT_SUMMARY = """
    One thread per output computes its C*R*S-term dot product straight from global memory, skipping
    the taps that fall outside the image. A warp's 32 threads take 32 neighbouring output pixels of one
    channel, so its loads of x are coalesced and its filter loads are one broadcast; the caches catch
    some of the reuse (each input pixel is read by K*R*S outputs), but every tap is a load instruction
    and a bounds test for one multiply-add. No library runs this form for a dense layer; a loop over
    the taps is what a library keeps for a depthwise convolution, where each output channel reads one
    input channel and there is no matrix product to form."""


@op.stage("direct", DIRECT_SUMMARY)
def direct(x, w, out):
    _launch_direct(x, w, _same3x3(), out)


@general_op.stage("direct", DIRECT_SUMMARY)
def general_direct(x, w, geometry, out):
    _launch_direct(x, w, geometry, out)


# -- 2. direct, with the input patch and the filters in shared memory ---------------------------------

TH, TW = 8, 32  # a block computes an 8 x 32 patch of outputs ...
KT = 8  # ... for 8 output channels: each thread 8 outputs, one pixel in 8 channels
PATCH_ROWS = (TH - 1) * MAX_STRIDE + MAX_REACH + 1  # the input rows such a patch can need: 21
PATCH_COLS = (TW - 1) * MAX_STRIDE + MAX_REACH + 1  # and columns: 69
MAX_TAPS = (MAX_REACH + 1) * (MAX_REACH + 1)  # 7x7


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
    dilation = geometry[2]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    t = ty * TW + tx
    k_groups = (K + KT - 1) // KT
    n = cuda.blockIdx.z // k_groups
    k0 = cuda.blockIdx.z % k_groups * KT
    ho = cuda.blockIdx.y * TH + ty
    wo = cuda.blockIdx.x * TW + tx
    h_first = cuda.blockIdx.y * TH * stride - pad  # image row of patch[0, :]
    w_first = cuda.blockIdx.x * TW * stride - pad
    rows = (TH - 1) * stride + (R - 1) * dilation + 1  # the part of the patch this geometry needs
    cols = (TW - 1) * stride + (S - 1) * dilation + 1
    for kk in range(KT):
        acc[kk] = float32(0.0)
    # HINT: per input channel c: the block copies the input rows x cols this patch of outputs reads (zeros outside the image) and the KT filters' R x S taps for c into shared memory; then a barrier.
    # HINT: each thread then reads its tap (ty * stride + r * dilation, tx * stride + s * dilation) of the patch ONCE and uses it for all KT output channels; a second barrier before the next channel overwrites the patch.
    # BEGIN SOLUTION
    for c in range(C):
        for e in range(t, rows * cols, TH * TW):
            pr = e // cols
            pc = e % cols
            h = h_first + pr
            col = w_first + pc
            patch[pr, pc] = x[n, c, h, col] if 0 <= h < H and 0 <= col < W else float32(0.0)
        for e in range(t, KT * R * S, TH * TW):
            kk = e // (R * S)
            tap = e % (R * S)
            filters[kk, tap] = w[k0 + kk, c, tap // S, tap % S] if k0 + kk < K else float32(0.0)
        cuda.syncthreads()  # the patch and the filters are complete before anyone reads them
        for r in range(R):
            for s in range(S):
                v = patch[ty * stride + r * dilation, tx * stride + s * dilation]
                for kk in range(KT):  # one shared read of x feeds KT multiply-adds
                    acc[kk] += filters[kk, r * S + s] * v
        cuda.syncthreads()  # everyone is done with this channel before the next one overwrites it
    # END SOLUTION
    if ho < Ho and wo < Wo:
        for kk in range(KT):
            if k0 + kk < K:
                out[n, k0 + kk, ho, wo] = acc[kk]


def _launch_shared_tile(x, w, geometry, out):
    N, K, Ho, Wo = out.shape
    grid = (blocks_for(Wo, TW), blocks_for(Ho, TH), N * blocks_for(K, KT))
    _shared_tile[grid, (TW, TH)](x, w, geometry, out)


SHARED_SUMMARY = """
    A block takes an 8x32 patch of output pixels in 8 output channels. For each input channel it first
    copies the input patch those outputs read (with its halo, zeros beyond the border) and the 8 filters'
    taps into shared memory, then each thread reads each of its taps once from shared memory and uses it
    for all 8 channels. Global loads per multiply-add drop from about 1 to about 1/50, and the bounds
    tests leave the inner loop. The cost: two barriers per input channel, and the shared patch is sized
    for the largest geometry the operator takes (stride 2, a 7x7 reach), so strided layers pay 2-way
    bank conflicts. A library picks a tiled direct kernel like this for grouped convolutions with a few
    channels per group, and for layers with so few channels (C or K well below a GEMM tile's 64)
    that a GEMM's tile would be mostly padding; a dense layer like this one goes to the GEMM forms."""


@op.stage("shared_tile", SHARED_SUMMARY)
def shared_tile(x, w, out):
    _launch_shared_tile(x, w, _same3x3(), out)


@general_op.stage("shared_tile", SHARED_SUMMARY)
def general_shared_tile(x, w, geometry, out):
    _launch_shared_tile(x, w, geometry, out)


# -- 3. explicit im2col, then the GEMM ladder's GEMM ----------------------------------------------------

@cuda.jit
def _im2col(x, geometry, R, S, columns):
    # columns[n, j, p]: the input pixel tap j = (c, r, s) of output pixel p of image n reads (0 outside).
    i = cuda.grid(1)
    N, CRS, P = columns.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    if i < columns.size:
        # HINT: split i into (n, j, p) with p fastest (coalesced writes), j into (c, r, s) and p into (ho, wo).
        # HINT: the pixel is x[n, c, ho * stride - pad + r * dilation, wo * stride - pad + s * dilation], or 0 outside the image.
        # BEGIN SOLUTION
        p = i % P
        j = i // P % CRS
        n = i // (P * CRS)
        Wo = (W + 2 * geometry[1] - geometry[2] * (S - 1) - 1) // geometry[0] + 1
        ho = p // Wo
        wo = p % Wo
        c = j // (R * S)
        r = j // S % R
        s = j % S
        h = ho * geometry[0] - geometry[1] + r * geometry[2]
        col = wo * geometry[0] - geometry[1] + s * geometry[2]
        columns[n, j, p] = x[n, c, h, col] if 0 <= h < H and 0 <= col < W else float32(0.0)
        # END SOLUTION


def _gemm_stage():
    """The GEMM ladder's fastest float32 CUDA-core stage, async_copy (cp.async, linked CUDA C++), on a
    GPU. The simulator can link no CUDA C++ and runs each thread as a Python thread: there the GEMM
    ladder's shared_tiles stage stands in (one output a thread, 64 times less Python per thread). The
    GEMM kernels are checked by the GEMM ladder's own tests; what this stage adds is im2col."""
    return gemm_ladder.shared_tiles if _device.is_simulator() else gemm_ladder.async_copy


def im2col_bytes(size) -> int:
    """The im2col buffer's size: every input pixel R*S times (for the whole batch)."""
    N, C, H, W, K, R, S, stride, pad, dilation = _geometry_of(size)
    Ho, Wo = output_hw(H, W, R, S, stride, pad, dilation)
    return 4 * N * C * R * S * Ho * Wo


def _im2col_traffic(size):
    # The buffer is written once and read by the GEMM at least once: 2 x its size on top of the minimum.
    return _bytes(size) + 2 * im2col_bytes(size)


def _launch_im2col_gemm(x, w, geometry, out):
    N, K, Ho, Wo = out.shape
    C, R, S = w.shape[1], w.shape[2], w.shape[3]
    P = Ho * Wo
    columns = scratch("conv.im2col", (N, C * R * S, P), np.float32)
    _im2col[blocks_for(columns.size, THREADS), THREADS](x, geometry, R, S, columns)
    filters = w.reshape(K, C * R * S)  # the filter bank is already the GEMM's A matrix, as is
    one_zero = _constant("alpha=1, beta=0", [1.0, 0.0], np.float32)  # beta = 0: C is not read
    gemm = _gemm_stage().launch
    for n in range(N):  # one product per image: out[n] (K x P) = filters (K x CRS) @ columns[n] (CRS x P)
        image_out = out[n].reshape(K, P)
        gemm(filters, columns[n], image_out, one_zero, image_out)


IM2COL_SUMMARY = """
    Lower the convolution to the GEMM ladder's fastest float32 CUDA-core GEMM. A first kernel writes the
    im2col matrix, for each image the C*R*S x Ho*Wo matrix of the pixels each output reads, and then one
    GEMM per image multiplies the filter bank (K x C*R*S, w's memory as it is) by it (in the simulator a
    simpler stage of the GEMM ladder stands in). On the H200 it lost even to shared_tile: 5776 µs at the
    N32 C64 56x56 layer (1.28 TFLOP/s, against 2638 µs), 9.3-9.9 ms at all three layers in a second run,
    and 5.6-6.4 ms for conv2d[general]'s 1x1 layer, which has a ninth of the work and a buffer 18 times
    smaller. A time that does not follow the work is not the GPU's (not profiled, but the records
    agree): the launcher loops over the 32 images in Python, slicing views of the buffer and the output
    and launching a GEMM for each, and gemm[batched]'s loop stage, the same pattern, measured 200-280 µs
    an iteration on that machine: 32 iterations are 6-9 ms, during which the GPU mostly waits. The GPU's
    own share would be poor too: one image's product (64 x 3136 outputs at the headline layer) is 25 of
    the GEMM's 128 x 128 block tiles for 132 SMs, each with half its rows past K = 64, a tenth of the
    machine at most. The buffer, R*S times the input (231 MB for that layer, written once and read back:
    about 0.1 ms at the copy rate), is not what sank it here. The fix is one launch for the whole batch,
    the image in the grid's third dimension (gemm[batched]'s one_launch); it is not made yet, since it
    could not be timed. Caffe did exactly this; it is still what a library falls back on for odd
    geometries, where its workspace is allowed."""


@op.stage("im2col_gemm", IM2COL_SUMMARY, bytes_moved=_im2col_traffic)
def im2col_gemm(x, w, out):
    _launch_im2col_gemm(x, w, _same3x3(), out)


@general_op.stage("im2col_gemm", IM2COL_SUMMARY, bytes_moved=_im2col_traffic)
def general_im2col_gemm(x, w, geometry, out):
    _launch_im2col_gemm(x, w, geometry, out)


# -- 4. implicit GEMM: gather while loading the GEMM's tiles, register-tiled -------------------------------

@cuda.jit(device=True, inline=True)
def _implicit_gemm_block(x_flat, w_flat, geometry, N, C, H, W, K, R, S, Ho, Wo, acc):
    """acc (8 x 8, registers) = this thread's share of the block's 64 x 128 tile of the product
    filters (K x CRS) @ im2col (CRS x N*Ho*Wo), the im2col matrix never written."""
    stride = geometry[0]
    pad = geometry[1]
    dilation = geometry[2]
    # The output pixel whose im2col column this thread gathers, fixed for the whole loop: its image's
    # base address and its window's top-left corner are computed once.
    q = cuda.blockIdx.x * BN + cuda.threadIdx.x
    P = Ho * Wo
    n = q // P
    p = q % P
    h0 = p // Wo * stride - pad
    w0 = p % Wo * stride - pad
    base = n * C * H * W if q < N * P else -1  # -1: a column past the last pixel gathers zeros
    for m in range(8):
        for qq in range(8):
            acc[m, qq] = float32(0.0)
    gemm_tile_loop(x_flat, w_flat, K, C, H, W, R, S, dilation, cuda.blockIdx.y * BM, base, h0, w0, acc)


# At 128 registers (4 blocks per SM) the 64 accumulators, 12 staging registers and the gather's state
# spill 180 bytes a thread; at <= 168 three blocks (12 warps) share an SM without spilling.
@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, 3)))
def _implicit_gemm(x_flat, w_flat, geometry, N, C, H, W, K, R, S, Ho, Wo, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _implicit_gemm_block(x_flat, w_flat, geometry, N, C, H, W, K, R, S, Ho, Wo, acc)
    _store_outputs(acc, N, K, Ho * Wo, out_flat)


@cuda.jit(device=True, inline=True)
def _store_outputs(acc, N, K, P, out_flat):
    """The block tile's store: acc[m, qq] is output channel k, pixel q of the GEMM (see output_index),
    out[n, k, p] for q = n P + p; rows past K and columns past N P are not stored."""
    t = cuda.threadIdx.x
    for qq in range(8):
        _, col = output_index(t, 0, qq)
        q = cuda.blockIdx.x * BN + col
        if q < N * P:
            n = q // P
            p = q % P
            for m in range(8):
                row, _ = output_index(t, m, qq)
                k = cuda.blockIdx.y * BM + row
                if k < K:
                    out_flat[(n * K + k) * P + p] = acc[m, qq]


def _launch_implicit_gemm(x, w, geometry, out):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    grid = (blocks_for(N * Ho * Wo, BN), blocks_for(K, BM))
    _implicit_gemm[grid, GEMM_THREADS](_flat(x), _flat(w), geometry, N, C, H, W, K, R, S, Ho, Wo, _flat(out))


IMPLICIT_SUMMARY = """
    The same product without the buffer: the GEMM's tile loader computes, for each element of the
    pixel tile, which input pixel it is and reads it straight from the image (zero past the border).
    The main loop is the GEMM ladder's stage 6: 8x8 outputs per thread from 16-byte shared loads, the
    K-step's taps written out, the next step's loads in flight in registers while this one computes
    (double buffering), one barrier a step. The block tile is 64 channels x 128 pixels, since layers
    have 64-512 output channels. The gather's index arithmetic is kept off the critical path: a thread
    gathers one pixel's column at every step, so its image base and window corner are computed once,
    and the tap (c, r, s) advances like an odometer instead of by divisions. The loads still go
    through registers: the GEMM ladder's cp.async (its stage 7) copies 16-byte chunks, and the gather
    cannot: a 3x3 window starts at wo - 1, so four neighbouring pixels of a tap are rarely 16-byte
    aligned, and at a border or a row's end not all inside the image. Stage 6 (async_gather) copies
    single floats instead, after reordering the reduction so that each one is a plain copy or a zero."""


@op.stage("implicit_gemm", IMPLICIT_SUMMARY)
def implicit_gemm(x, w, out):
    _launch_implicit_gemm(x, w, _same3x3(), out)


@general_op.stage("implicit_gemm", IMPLICIT_SUMMARY)
def general_implicit_gemm(x, w, geometry, out):
    _launch_implicit_gemm(x, w, geometry, out)


# -- 5. Winograd F(2x2, 3x3): 16 multiplies for 4 outputs instead of 36 ------------------------------------
#
# For a 2x2 block of outputs and the 4x4 input tile d it reads, with one 3x3 filter g:
#   Y = A^T [ (G g G^T) * (B^T d B) ] A        (* elementwise, 16 products)
# B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
# G   = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
# A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
# Summed over input channels, the 16 elementwise products become 16 independent GEMMs:
#   M[e] (K x T) = U[e] (K x C) @ V[e] (C x T), e = each of the 16 positions of the 4x4 tile,
# with U = the transformed filters, V = the transformed input tiles, T = N * ceil(H/2) * ceil(W/2).


@cuda.jit
def _winograd_filters(w, U):
    # U[e, k, c] = (G g G^T)[e // 4, e % 4] for g = w[k, c]: one thread per (k, c), done once per call
    # (a network would transform its filters once, ahead of time).
    i = cuda.grid(1)
    K, C = w.shape[0], w.shape[1]
    if i < K * C:
        k = i // C
        c = i % C
        Gg = cuda.local.array((4, 3), float32)
        half = float32(0.5)
        for col in range(3):  # G g: combine the filter's rows
            g0 = w[k, c, 0, col]
            g1 = w[k, c, 1, col]
            g2 = w[k, c, 2, col]
            Gg[0, col] = g0
            Gg[1, col] = half * (g0 + g1 + g2)
            Gg[2, col] = half * (g0 - g1 + g2)
            Gg[3, col] = g2
        for row in range(4):  # (G g) G^T: combine its columns
            g0 = Gg[row, 0]
            g1 = Gg[row, 1]
            g2 = Gg[row, 2]
            U[row * 4 + 0, k, c] = g0
            U[row * 4 + 1, k, c] = half * (g0 + g1 + g2)
            U[row * 4 + 2, k, c] = half * (g0 - g1 + g2)
            U[row * 4 + 3, k, c] = g2


@cuda.jit
def _winograd_inputs(x, V):
    # V[e, c, t] = (B^T d B)[e // 4, e % 4] for the 4x4 input tile d of output tile t in channel c.
    i = cuda.grid(1)
    N, C, H, W = x.shape
    T = V.shape[2]
    tiles_w = (W + 1) // 2
    tiles_h = (H + 1) // 2
    if i < C * T:
        t = i % T  # neighbouring threads: neighbouring tiles of one channel (coalesced stores of V)
        c = i // T
        tw = t % tiles_w
        th = t // tiles_w % tiles_h
        n = t // (tiles_w * tiles_h)
        d = cuda.local.array((4, 4), float32)
        # HINT: the tile is x[n, c, 2 th - 1 + a, 2 tw - 1 + b] for a, b in 0..3 (padding 1: zero outside the image).
        # HINT: B^T d combines rows: (d0 - d2, d1 + d2, d2 - d1, d1 - d3); then (B^T d) B combines the columns the same way.
        # BEGIN SOLUTION
        for a in range(4):
            h = 2 * th - 1 + a
            for b in range(4):
                col = 2 * tw - 1 + b
                d[a, b] = x[n, c, h, col] if 0 <= h < H and 0 <= col < W else float32(0.0)
        for b in range(4):  # B^T d
            d0 = d[0, b]
            d1 = d[1, b]
            d2 = d[2, b]
            d3 = d[3, b]
            d[0, b] = d0 - d2
            d[1, b] = d1 + d2
            d[2, b] = d2 - d1
            d[3, b] = d1 - d3
        for a in range(4):  # (B^T d) B
            d0 = d[a, 0]
            d1 = d[a, 1]
            d2 = d[a, 2]
            d3 = d[a, 3]
            V[a * 4 + 0, c, t] = d0 - d2
            V[a * 4 + 1, c, t] = d1 + d2
            V[a * 4 + 2, c, t] = d2 - d1
            V[a * 4 + 3, c, t] = d1 - d3
        # END SOLUTION


@cuda.jit
def _winograd_outputs(M, out):
    # out's 2x2 block of tile t in channel k = A^T m A, m[e] = M[e, k, t].
    i = cuda.grid(1)
    N, K, Ho, Wo = out.shape
    T = M.shape[2]
    tiles_w = (Wo + 1) // 2
    tiles_h = (Ho + 1) // 2
    if i < K * T:
        t = i % T
        k = i // T
        tw = t % tiles_w
        th = t // tiles_w % tiles_h
        n = t // (tiles_w * tiles_h)
        m = cuda.local.array((2, 4), float32)
        # HINT: A^T m combines rows: (m0 + m1 + m2, m1 - m2 - m3); then the same on the columns gives the 2x2 outputs.
        # BEGIN SOLUTION
        for b in range(4):  # A^T m
            m0 = M[0 * 4 + b, k, t]
            m1 = M[1 * 4 + b, k, t]
            m2 = M[2 * 4 + b, k, t]
            m3 = M[3 * 4 + b, k, t]
            m[0, b] = m0 + m1 + m2
            m[1, b] = m1 - m2 - m3
        for a in range(2):  # (A^T m) A, and the store: the last row or column of a tile may lie outside
            ho = 2 * th + a
            if ho < Ho:
                out[n, k, ho, 2 * tw] = m[a, 0] + m[a, 1] + m[a, 2]
                if 2 * tw + 1 < Wo:
                    out[n, k, ho, 2 * tw + 1] = m[a, 1] - m[a, 2] - m[a, 3]
        # END SOLUTION


@cuda.jit
def _products_in_the_simulator(U, V, M):
    # M[e] = U[e] @ V[e], one output a thread. Only the simulator runs it: it runs each thread as a
    # Python thread, and the GEMM ladder's batched kernel (what the GPU runs) costs 256 of them a block
    # with 64 outputs each, whatever the size. That kernel is checked by the GEMM ladder's own tests.
    i = cuda.grid(1)
    batch, K, T = M.shape
    if i < M.size:
        t = i % T
        k = i // T % K
        e = i // (T * K)
        acc = float32(0.0)
        for c in range(U.shape[2]):
            acc += U[e, k, c] * V[e, c, t]
        M[e, k, t] = acc


def winograd_tiles(N, H, W):
    return N * ((H + 1) // 2) * ((W + 1) // 2)


def _winograd_traffic(size):
    # V and M are written and read once each: 16 floats per tile per channel, 4x the input and output.
    N, C, H, W, K = size
    T = winograd_tiles(N, H, W)
    return _bytes(size) + 4 * 2 * 16 * T * (C + K)


def _winograd_flops(size):
    # What the stage does: 16 products per 2x2 block, instead of 36 (the transforms are not counted).
    N, C, H, W, K = size
    return 2 * 16 * winograd_tiles(N, H, W) * C * K


@op.stage("winograd", """
    Winograd's minimal filtering, F(2x2, 3x3): a 2x2 block of outputs reads a 4x4 input tile d, and Y =
    A^T [(G g G^T) * (B^T d B)] A computes it with 16 multiplies instead of 36 (the transforms are
    additions and halvings). Summed over input channels, the 16 elementwise products are 16 independent
    GEMMs, U[e] (K x C) times V[e] (C x tiles). Three small kernels transform the filters, the input
    tiles (overlapping: 4x the input) and the 16 product matrices back; the GEMMs run on the GEMM
    ladder's batched kernel in one launch. 2.25x fewer multiply-adds, paid for in memory traffic: V and
    M are 4x the input and the output. On the H200 that trade did not pay at the headline layer (361.4
    µs against implicit_gemm's 360.1; 393 against 396 in a second run), likely because with K = 64
    output channels half of each 128 x 128 block tile of the batched GEMM is padding (it computes twice
    the products it keeps), on top of V and M's 411 MB. With 128 and 256 channels the tiles are full and
    it won: 193 against 532 µs at N32 C256 14x14, 202 against 389 at N32 C128 28x28. Accuracy: the same
    run measured a smaller error than the implicit GEMM's at all three layers (2.6e-7 against 4.3e-7,
    5.0e-7 against 8.3e-7, 3.6e-7 against 6.0e-7), likely because each of its GEMMs sums C terms where
    the implicit GEMM sums 9C. The transforms lose accuracy where an output is small beside the values
    its tile combines: a bright pixel under a zero filter tap drops out of the exact sum, but the
    rounded intermediates (halved sums of taps, times the pixel) are as large as the pixel, so that
    output carries the pixel's rounding (tests/test_conv.py: pixels at 1e4, an error of 1e-3 on those
    outputs where direct has 5e-8, while the whole output's error stays inside the check). Larger tiles
    such as F(4x4, 3x3), whose transforms hold 1/24 and 8, lose more on any data (about 7x F(2x2)'s
    error on uniform data, in that file's float32 emulation). Only for 3x3 filters at stride 1, which is
    why it is in conv2d and absent from conv2d[general]. cuDNN's WINOGRAD_NONFUSED is this
    algorithm; libraries pick it for 3x3 stride-1 layers with many channels, where the GEMMs dominate
    the transforms.""",
    bytes_moved=_winograd_traffic, flops=_winograd_flops)
def winograd(x, w, out):
    N, C, H, W = x.shape
    K = w.shape[0]
    T = winograd_tiles(N, H, W)
    U = scratch("conv.winograd.U", (16, K, C), np.float32)
    V = scratch("conv.winograd.V", (16, C, T), np.float32)
    M = scratch("conv.winograd.M", (16, K, T), np.float32)
    _winograd_filters[blocks_for(K * C, THREADS), THREADS](w, U)
    _winograd_inputs[blocks_for(C * T, THREADS), THREADS](x, V)
    if _device.is_simulator():
        _products_in_the_simulator[blocks_for(M.size, THREADS), THREADS](U, V, M)
    else:
        gemm_ladder.one_launch.launch(U, V, M)  # the GEMM ladder's batched GEMM: 16 products, one launch
    _winograd_outputs[blocks_for(K * T, THREADS), THREADS](M, out)


# -- 6. async_gather: taps outermost, every tile copied by cp.async through a multi-stage pipeline ---------
#
# Stage 4 walks the reduction in w's own order, j = (c, r, s): each of a thread's 8 gathered elements
# per K-step is a different tap, so each needs its own odometer step, its own 4 bounds tests and its
# own load and shared store, all in registers. Walked as (r, s, c) instead, a K-step is K_STEP input
# channels of ONE tap: the thread's pixel, shifted by (r - 1, s - 1), is inside the image or not for the
# whole step, and its K_STEP elements lie a channel (H W floats) apart. The filters are reordered once
# to match, wt[r S + s, c, k] (output channel fastest, zero-padded to whole tiles), so a K-step's filter
# tile is K_STEP rows of 64 neighbouring floats: 16-byte copies, no tests, no transposition on the way.

K_STEP = 16  # input channels per K-step (8 or 16): taps of one (r, s); C is padded up to a multiple
PIPELINE_STAGES = 3  # K-steps in flight: copies for step kt + PIPELINE_STAGES - 1 start before step kt's FMAs
BLOCKS_PER_SM = 3  # launch bound: registers are capped so that this many 128-thread blocks share an SM
STEP_A = K_STEP * SA  # floats of one stage's filter tile As[j, m] (m: 64 output channels + 4 padding)
STEP_B = K_STEP * SB  # floats of one stage's pixel tile Bs[j, q] (q: 128 pixels + 4 padding)
PIPELINE_A = PIPELINE_STAGES * STEP_A  # every stage's tiles, in shared memory: 3 x 16 x 200 floats = 38.4 KB,
PIPELINE_B = PIPELINE_STAGES * STEP_B  # under the 48 KB a static shared array may take
FILTER_CHUNKS = K_STEP * BM // 4 // GEMM_THREADS  # 16-byte filter copies per thread per K-step
if K_STEP % 8 or PIPELINE_STAGES < 2 or 4 * (PIPELINE_A + PIPELINE_B) > 48 * 1024:
    raise ValueError(f"async_gather needs K_STEP a multiple of 8 (its taps are computed 8 at a time), "
                     f"PIPELINE_STAGES >= 2 and their tiles within a static shared array's 48 KB; got K_STEP = "
                     f"{K_STEP}, PIPELINE_STAGES = {PIPELINE_STAGES}: {4 * (PIPELINE_A + PIPELINE_B)} bytes")


@cuda.jit
def _taps_outermost_filters(w, wt):
    # wt[r S + s, c, k] = w[k, c, r, s]; zero past C and K, so the main loop's filter copies need no tests.
    i = cuda.grid(1)
    taps, Cp, Kp = wt.shape
    K, C, R, S = w.shape
    if i < wt.size:
        k = i % Kp  # neighbouring threads: neighbouring output channels (coalesced stores)
        c = i // Kp % Cp
        rs = i // (Kp * Cp)
        wt[rs, c, k] = w[k, c, rs // S, rs % S] if k < K and c < C else float32(0.0)


@cuda.jit(device=True, inline=True)
def _copy_step_async(x_ptr, wt_ptr, a_dst, b_dst, C, H, W, Cp, Kp, m0, base, h0, w0, r, s, c0, S, dilation):
    """Start the copies of K-step (r, s, c0..c0 + K_STEP - 1) into one pipeline stage and return without
    waiting (an R x S filter: tap (r, s) reads the pixel dilation (r, s) past the window's corner).
    a_dst, b_dst: the stage's tiles as shared-window addresses (shared_address32), already offset by
    this thread's place in them."""
    t = cuda.threadIdx.x
    for i in range(FILTER_CHUNKS):  # filters: 4 neighbouring output channels of one input channel
        e = t + i * GEMM_THREADS
        j = e // (BM // 4)
        m = e % (BM // 4) * 4
        src = wt_ptr + uint64((((r * S + s) * Cp + c0 + j) * Kp + m0 + m) * 4)
        cp_async_chunk16_s32(a_dst + uint64((j * SA + m) * 4), src, 16)
    # HINT: this thread's pixel, shifted by the tap, is (h0 + r dilation, w0 + s dilation): one test for the whole step (base < 0: no pixel).
    # HINT: element j is channel c0 + j of that pixel, H W floats after element j - 1; copy 0 bytes (a zero) where it is outside the image or past C.
    # BEGIN SOLUTION
    h = h0 + r * dilation
    col = w0 + s * dilation
    pixel_inside = base >= 0 and 0 <= h < H and 0 <= col < W
    # Outside, every element is a zero copied from x's first float: no address past the image is formed.
    pixel_bytes = 4 if pixel_inside else 0
    channel_bytes = uint64(H * W * 4) if pixel_inside else uint64(0)
    src = x_ptr + uint64((base + c0 * H * W + h * W + col) * 4) if pixel_inside else x_ptr
    if c0 + K_STEP <= C:  # every step but a last partial one per tap; the same for the whole block
        for j in range(K_STEP):
            cp_async_chunk4_s32(b_dst + uint64(j * SB * 4), src, pixel_bytes)
            src += channel_bytes
    else:  # channels past C: zeros
        for j in range(K_STEP):
            inside = c0 + j < C
            cp_async_chunk4_s32(b_dst + uint64(j * SB * 4), src if inside else x_ptr, pixel_bytes if inside else 0)
            src += channel_bytes
    # END SOLUTION


@cuda.jit(device=True, inline=True)
def _next_step(r, s, c0, C, S):
    """The K-step after (r, s, c0): an odometer, channel block fastest, then s, then r (no divisions)."""
    c0 += K_STEP
    if c0 >= C:
        c0 = 0
        s += 1
        if s == S:
            s = 0
            r += 1
    return r, s, c0


@cuda.jit(device=True, inline=True)
def _async_gather_block(x_flat, wt_flat, N, C, H, W, Cp, Kp, R, S, stride, pad, dilation, Ho, Wo, acc):
    """acc (8 x 8, registers) = this thread's share of the block's 64 x 128 tile of the product
    wt (taps x Cp x Kp, see _taps_outermost_filters) times the im2col matrix, the reduction walked
    (r, s, c); stage 4's _implicit_gemm_block with every tile copied by cp.async. Every kernel that
    ends in another store (the fused epilogues) runs this same loop; conv2d's pass the geometry as
    constants (3, 3, 1, 1, 1, H, W), which the compiler folds in, conv2d[general]'s read it."""
    As = cuda.shared.array(PIPELINE_A, float32, alignment=ALIGN16)
    Bs = cuda.shared.array(PIPELINE_B, float32, alignment=ALIGN16)
    a = cuda.local.array(8, float32)
    b = cuda.local.array(8, float32)
    t = cuda.threadIdx.x
    P = Ho * Wo
    q = cuda.blockIdx.x * BN + t  # the output pixel whose column this thread copies, as in stage 4
    n = q // P
    p = q % P
    h0 = p // Wo * stride - pad  # the window's top-left input pixel
    w0 = p % Wo * stride - pad
    base = n * C * H * W if q < N * P else -1
    m0 = cuda.blockIdx.y * BM
    x_ptr = x_flat.ctypes.data
    wt_ptr = wt_flat.ctypes.data
    # The tiles as shared-window addresses (32-bit sums after inlining); this thread's pixel column of
    # Bs added once (its filter chunks' places are computed in _copy_step_async), each stage's per step.
    a_base = uint64(shared_address32(As.ctypes.data))
    b_base = uint64(shared_address32(Bs.ctypes.data)) + uint64(t * 4)
    for m in range(8):
        for qq in range(8):
            acc[m, qq] = float32(0.0)
    ut = uint32(t)
    lane = ut % uint32(32)
    r0 = (ut // uint32(64)) * uint32(32) + (lane // uint32(8)) * uint32(4)  # as gemm_tile_loop
    c0l = ((ut // uint32(32)) % uint32(2)) * uint32(64) + (lane % uint32(8)) * uint32(4)
    steps = R * S * (Cp // K_STEP)
    # The next step to copy: tap (r, s), channels c0..c0 + K_STEP - 1.
    r = 0
    s = 0
    c0 = 0
    for i in range(PIPELINE_STAGES - 1):  # fill the pipeline: one commit group per step, empty or not
        if i < steps:
            _copy_step_async(x_ptr, wt_ptr, a_base + uint64(i * STEP_A * 4), b_base + uint64(i * STEP_B * 4),
                             C, H, W, Cp, Kp, m0, base, h0, w0, r, s, c0, S, dilation)
            r, s, c0 = _next_step(r, s, c0, C, S)
        cp_async_commit()
    read = 0  # the stage step kt computes from
    write = PIPELINE_STAGES - 1  # the stage step kt + PIPELINE_STAGES - 1 is copied into
    for kt in range(steps):
        cp_async_wait_pending(PIPELINE_STAGES - 2)  # step kt has landed (this thread's copies) ...
        cuda.syncthreads()  # ... everyone's; and everyone is done computing step kt - 1 (stage `write`)
        if kt + PIPELINE_STAGES - 1 < steps:
            _copy_step_async(x_ptr, wt_ptr, a_base + uint64(write * STEP_A * 4), b_base + uint64(write * STEP_B * 4),
                             C, H, W, Cp, Kp, m0, base, h0, w0, r, s, c0, S, dilation)
            r, s, c0 = _next_step(r, s, c0, C, S)
        cp_async_commit()
        ia = uint32(read * STEP_A) + r0
        ib = uint32(read * STEP_B) + c0l
        for g in range(K_STEP // 8):
            eight_taps(As, Bs, ia + uint32(g * 8 * SA), ib + uint32(g * 8 * SB), a, b, acc)
        read = read + 1 if read + 1 < PIPELINE_STAGES else 0
        write = write + 1 if write + 1 < PIPELINE_STAGES else 0
    cp_async_wait_pending(0)  # nothing is left in flight (the last groups are empty)


@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, BLOCKS_PER_SM)))
def _async_gather(x_flat, wt_flat, N, C, H, W, K, Cp, Kp, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _async_gather_block(x_flat, wt_flat, N, C, H, W, Cp, Kp, 3, 3, 1, 1, 1, H, W, acc)
    _store_outputs(acc, N, K, H * W, out_flat)


def _padded_filters(w):
    """w reordered taps outermost (see _taps_outermost_filters), C padded to K_STEP, K to the 64-row tile."""
    K, C, R, S = w.shape
    wt = scratch("conv.async_gather.filters", (R * S, blocks_for(C, K_STEP) * K_STEP, blocks_for(K, BM) * BM),
                 np.float32)
    _taps_outermost_filters[blocks_for(wt.size, THREADS), THREADS](w, wt)
    return wt


@op.stage("async_gather", """
    Stage 4's implicit GEMM again, with the reduction walked taps outermost, (r, s, c) instead of w's
    (c, r, s), so that every tile can travel by cp.async. A K-step is now K_STEP input channels of one
    filter tap: the thread's pixel, shifted by the tap, is inside the image or outside for the whole
    step (one test, where stage 4 made four per element and stepped an odometer per element), and its
    elements lie a channel apart, one address addition each. With no per-element decision left but
    "copy or zero", each element is a 4-byte cp.async whose ignore-source flag writes the zero: the
    load, the register that staged it and the shared store become one instruction (three with the
    address, in the compiled loop), and the registers stage 4 spent on staging buy a deeper pipeline
    (PIPELINE_STAGES K-steps in flight, as in the GEMM ladder's stage 9) and a longer K-step (16
    channels: half the barriers). The filters are reordered once per call, by a small kernel, into
    wt[tap, c, k] with the output channel fastest and zeros past C and K, so a K-step's filter tile is
    whole 16-byte chunks, copied with no tests and no transposition (a network would store its filters
    this way once, as it would Winograd's). The arithmetic is stage 4's: 8 x 8 outputs a thread from
    16-byte shared loads, 64 channels x 128 pixels a block. cuDNN's fastest float32 kernel for this
    layer is the same algorithm with another tile: an implicit GEMM of 128 pixels x 32 channels a
    block, a K-step of 8, three stages of asynchronous copies. On an H200 at 32x64x56x56x64 the
    compiled loop is 77% FFMA where stage 4's was 47%: 208.5 us, 35.5 TFLOP/s, against cuDNN's 268.0
    (27.6 TFLOP/s) in the same run, 1.28x; stage 4 took 333.4 in one process with this stage's 197.4.""")
def async_gather(x, w, out):
    N, C, H, W = x.shape
    K = w.shape[0]
    wt = _padded_filters(w)
    grid = (blocks_for(N * H * W, BN), wt.shape[2] // BM)
    _async_gather[grid, GEMM_THREADS](_flat(x), _flat(wt), N, C, H, W, K, wt.shape[1], wt.shape[2], _flat(out))


# -- conv2d[general] 5. async_gather: the same loop, any filter, stride, padding and dilation ---------------

# A K-step is K_STEP channels of one tap: with fewer input channels (an RGB first layer, C = 3) most of
# each step would be zeros, 16 / 3 times the multiply-adds, where stage 4 packs (c, r, s) densely.
GATHER_MIN_CHANNELS = K_STEP  # layers with fewer input channels take stage 4's kernel (0: never)

@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, BLOCKS_PER_SM)))
def _async_gather_general(x_flat, wt_flat, geometry, N, C, H, W, K, R, S, Ho, Wo, Cp, Kp, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _async_gather_block(x_flat, wt_flat, N, C, H, W, Cp, Kp, R, S, geometry[0], geometry[1], geometry[2],
                        Ho, Wo, acc)
    _store_outputs(acc, N, K, Ho * Wo, out_flat)


@general_op.stage("async_gather", """
    Stage 4's implicit GEMM on conv2d's async_gather main loop (that ladder's stage 6): the same device
    function, given the filter size, stride, padding and dilation where conv2d passes 3, 3, 1, 1, 1.
    The reduction is walked taps outermost: a K-step is K_STEP input channels of one tap (r, s), which
    puts the thread's pixel at (ho stride - pad + r dilation, wo stride - pad + s dilation), inside the
    image or outside for the whole step, so each element is a 4-byte cp.async or its zero; the
    filters, reordered once per call into wt[r S + s, c, k], are 16-byte copies with no tests; and
    PIPELINE_STAGES K-steps are in flight. R S taps make R S ceil(C / K_STEP) K-steps. A 1x1 filter is
    one tap, a plain GEMM over the channels with every pixel inside, where stage 4 still paid an
    odometer step and four bounds tests per element and staged each through a register. The geometry
    comes from the device array, so the compiler cannot fold it in as it does conv2d's constants: a few
    more registers and index instructions, the same tiles, pipeline and 8 x 8 FMA loop. A layer with
    fewer than K_STEP input channels (an RGB image's first layer) keeps stage 4's kernel: a K-step of
    one tap's 3 channels would be mostly zeros, where stage 4 packs all of (c, r, s) into its steps.
    On an H200 at the 1x1 layer (32x128x28x28, 128 channels out): 46.1 us against cuDNN's 49.0 in the
    same run (1.06x), where stage 4 was 0.85x.""")
def general_async_gather(x, w, geometry, out):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    if C < GATHER_MIN_CHANNELS:
        _launch_implicit_gemm(x, w, geometry, out)
        return
    wt = _padded_filters(w)
    grid = (blocks_for(N * Ho * Wo, BN), wt.shape[2] // BM)
    _async_gather_general[grid, GEMM_THREADS](_flat(x), _flat(wt), geometry, N, C, H, W, K, R, S, Ho, Wo,
                                              wt.shape[1], wt.shape[2], _flat(out))


# == conv2d[bias_relu] and conv2d[bias_add_relu]: the epilogue, fused ====================================
#
# A ResNet layer is rarely a bare convolution: BatchNorm folded into the filters leaves a per-channel
# bias, then ReLU, and at the end of a residual block the block's input is added before the ReLU:
#   out = relu(conv(x, w) + bias[k])                  conv2d[bias_relu]
#   out = relu(conv(x, w) + bias[k] + residual)       conv2d[bias_add_relu]
# (3x3, stride 1, padding 1 as conv2d). The epilogue is a few additions per output; what it costs
# when run as its own kernel is one more read and write of the whole output.

def _epilogue_inputs(size, rng, with_residual):
    x, w = _images(size, rng)
    N, C, H, W, K = size
    # Each output is a sum of 9 C products of uniform(-1, 1) draws (spread sqrt(C)): a bias and a
    # residual of the same spread put about half of the outputs on each side of ReLU's bend.
    spread = np.float32(math.sqrt(C))
    bias = rng.uniform(-1.0, 1.0, K).astype(np.float32) * spread
    if not with_residual:
        return x, w, bias
    return x, w, bias, rng.uniform(-1.0, 1.0, (N, K, H, W)).astype(np.float32) * spread


def _epilogue_reference(x, w, bias, residual=None):
    pre = _conv64(x, w, 1, 1, 1) + bias.astype(np.float64)[None, :, None, None]
    if residual is not None:
        pre += residual
    return np.maximum(pre, 0.0)  # propagates NaN, as torch.relu does


def _epilogue_adversarial(size, rng, with_residual):
    inputs = list(_epilogue_inputs(size, rng, with_residual))
    x, bias = inputs[0], inputs[2]
    # One NaN pixel: every output whose window holds it is NaN, and must stay NaN through the ReLU
    # (max(v, 0) written as fmaxf returns 0 for NaN: torch.relu keeps it). And a bias far past the
    # products, alternately +-1e4 by channel: the negative channels are all zeros, the positive ones
    # all pass, so a bias indexed by pixel instead of channel, or a ReLU before the bias, shows.
    x = x.copy()
    x[0, 0, x.shape[2] // 2, x.shape[3] // 2] = np.nan
    bias = np.where(np.arange(bias.size) % 2 == 0, 1e4, -1e4).astype(np.float32)
    inputs[0], inputs[2] = x, bias
    return [("nan-pixel-huge-bias", tuple(inputs))]


def _epilogue_validate(x, w, bias, *rest):
    *residual, out = rest
    _validate(x, w, out)
    expect_device_array("bias", bias, dtype=np.float32, shape=(w.shape[0],))
    if residual:
        expect_device_array("residual", residual[0], dtype=np.float32, shape=tuple(out.shape))


def _epilogue_peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    conv2d = torch.nn.functional.conv2d

    def run(x, w, bias, *rest):
        *residual, out = rest
        with peers.without_tf32(torch):
            y = conv2d(peers.as_torch(x), peers.as_torch(w), peers.as_torch(bias), padding=1)
        if residual:
            y.add_(peers.as_torch(residual[0]))
        # The ReLU writes straight into out (clamp_min keeps NaN, as relu does): no extra copy.
        torch.clamp_min(y, 0.0, out=peers.as_torch(out))

    return "torch conv2d(bias)+relu (cuDNN fp32)", run


def _epilogue_expression(with_residual):
    def expression(torch, size):
        conv2d = torch.nn.functional.conv2d
        if with_residual:
            return lambda x, w, bias, residual: torch.relu(conv2d(x, w, bias, padding=1) + residual)
        return lambda x, w, bias: torch.relu(conv2d(x, w, bias, padding=1))
    return expression


def _epilogue_bytes(with_residual):
    # The minimum: x, w, bias (and the residual) read once, out written once.
    def moved(size):
        N, C, H, W, K = size
        return _bytes(size) + 4 * K + (4 * N * K * H * W if with_residual else 0)
    return moved


def _unfused_bytes(with_residual):
    # The separate epilogue kernel reads the convolution's output back and writes it again.
    def moved(size):
        N, C, H, W, K = size
        return _epilogue_bytes(with_residual)(size) + 2 * 4 * N * K * H * W
    return moved


_EPILOGUE_FIELDS = dict(
    make_output=lambda size: np.empty((size[0], size[4], size[2], size[3]), np.float32),
    flops=_flops,
    validate=_epilogue_validate,
    tolerance=_tolerance,
    peer=_epilogue_peer,
    bound="compute",
    size_names=("N", "C", "H", "W", "K"),
    check_sizes=[(1, 1, 1, 1, 1), (2, 3, 7, 9, 5), (3, 17, 15, 13, 70), (32, 64, 56, 56, 64)],
    # Quick tier (the middle size): one block of the implicit GEMM (K <= 64, N H W <= 128), 7x9 and K = 5
    # multiples of no tile, 9 taps = a full K-step and a partial one: the epilogue is what is new here,
    # the main loop is conv2d's (checked there at C = 3). The slow tier adds K past the 64-channel tile.
    sim_sizes=[(1, 2, 3, 4, 3), (1, 1, 7, 9, 5), (1, 3, 5, 6, 65)],
    bench_sizes=[(32, 64, 56, 56, 64), (32, 256, 14, 14, 256)],
    headline_size=(32, 64, 56, 56, 64),
    group="Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
    record_all_sizes=True,
)

bias_relu_op = Operator(
    name="conv2d", variant={"fusion": "bias_relu"},
    targets=[against_stage(1.0, "unfused", stage="fused_epilogue")],
    title="3x3 convolution + bias + ReLU, the epilogue fused (NCHW float32)",
    reference=_epilogue_reference,
    make_inputs=lambda size, rng: _epilogue_inputs(size, rng, False),
    bytes_moved=_epilogue_bytes(False),
    torch_expression=_epilogue_expression(False),
    adversarial_inputs=lambda size, rng: _epilogue_adversarial(size, rng, False),
    rank=322,
    **_EPILOGUE_FIELDS,
)

bias_add_relu_op = Operator(
    name="conv2d", variant={"fusion": "bias_add_relu"},
    title="3x3 convolution + bias + residual + ReLU (a ResNet block's tail), fused (NCHW float32)",
    reference=_epilogue_reference,
    make_inputs=lambda size, rng: _epilogue_inputs(size, rng, True),
    bytes_moved=_epilogue_bytes(True),
    torch_expression=_epilogue_expression(True),
    adversarial_inputs=lambda size, rng: _epilogue_adversarial(size, rng, True),
    rank=323,
    **_EPILOGUE_FIELDS,
)


@cuda.jit(device=True, inline=True)
def _bias_residual_relu(v, bias_k, residual_flat, i, add_residual):
    """The epilogue of output i (channel k): the one piece of code both stages apply, in different places."""
    v += bias_k
    if add_residual:
        v += residual_flat[i]
    # Not max(v, 0): that compiles to fmaxf, which returns 0 for a NaN; torch.relu keeps the NaN.
    return float32(0.0) if v < float32(0.0) else v


# -- 1. unfused: the implicit GEMM stores, a second kernel reads the output back ----------------------

@cuda.jit
def _bias_relu_in_place(out_flat, bias, residual_flat, add_residual, K, P):
    i = cuda.grid(1)
    if i < out_flat.size:
        # HINT: out[n, k, p] is flat index i = (n K + k) P + p: its channel is k = i // P % K.
        # BEGIN SOLUTION
        out_flat[i] = _bias_residual_relu(out_flat[i], bias[i // P % K], residual_flat, i, add_residual)
        # END SOLUTION


def _unfused(x, w, bias, residual, add_residual, out):
    N, K, Ho, Wo = out.shape
    _launch_implicit_gemm(x, w, _same3x3(), out)
    _bias_relu_in_place[blocks_for(out.size, THREADS), THREADS](_flat(out), bias, _flat(residual),
                                                                  add_residual, K, Ho * Wo)


UNFUSED_SUMMARY = """
    What two library calls give you: conv2d's implicit GEMM (stage 4: as fast as Winograd at the
    headline layer on the H200, 360 against 361 µs) writes the whole output, then a second
    kernel reads it back, adds the channel's bias (and the residual), applies ReLU and writes it again.
    The arithmetic is nothing; the cost is the output's round trip through memory, 8 bytes per output
    (25.7 MB each way at N32 K64 56x56), and a second launch."""


@bias_relu_op.stage("unfused", UNFUSED_SUMMARY, bytes_moved=_unfused_bytes(False))
def unfused(x, w, bias, out):
    _unfused(x, w, bias, out, False, out)  # no residual: out stands in for it, never read


@bias_add_relu_op.stage("unfused", UNFUSED_SUMMARY, bytes_moved=_unfused_bytes(True))
def add_unfused(x, w, bias, residual, out):
    _unfused(x, w, bias, residual, True, out)


# -- 2. fused_epilogue: bias, residual and ReLU on the accumulators, one store ------------------------

@cuda.jit(device=True, inline=True)
def _epilogue_store(acc, N, K, Ho, Wo, bias, residual_flat, out_flat, add_residual, bias_once):
    """The implicit GEMM's store of acc, with the epilogue applied to each register value on its way
    out. add_residual and bias_once are constants at each call (below): the compiler drops the branch
    not taken. bias_once: a thread's 64 accumulators lie in 8 rows (output channels), so it reads their
    8 biases once, before the store loop, rather than at each of its 64 stores."""
    t = cuda.threadIdx.x
    P = Ho * Wo
    k0 = cuda.blockIdx.y * BM
    bias_m = cuda.local.array(8, float32)
    if bias_once:
        for m in range(8):
            row, _ = output_index(t, m, 0)
            bias_m[m] = bias[k0 + row] if k0 + row < K else float32(0.0)
    for qq in range(8):
        _, col = output_index(t, 0, qq)
        q = cuda.blockIdx.x * BN + col
        if q < N * P:
            n = q // P
            p = q % P
            for m in range(8):
                row, _ = output_index(t, m, qq)
                k = k0 + row
                if k < K:
                    i = (n * K + k) * P + p
                    # HINT: the implicit GEMM's store, with the epilogue applied to the register value on its way out.
                    # BEGIN SOLUTION
                    bias_k = bias_m[m] if bias_once else bias[k]
                    out_flat[i] = _bias_residual_relu(acc[m, qq], bias_k, residual_flat, i, add_residual)
                    # END SOLUTION


# Four kernels, one body: with and without the residual, the bias read once (the stages) or at every
# store (the first version, kept for the GPU script to time beside it: ``epilogue_variant``).
@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, 3)))
def _conv_bias_relu(x_flat, w_flat, geometry, N, C, H, W, K, bias, residual_flat, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _implicit_gemm_block(x_flat, w_flat, geometry, N, C, H, W, K, 3, 3, H, W, acc)
    _epilogue_store(acc, N, K, H, W, bias, residual_flat, out_flat, False, True)


@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, 3)))
def _conv_bias_add_relu(x_flat, w_flat, geometry, N, C, H, W, K, bias, residual_flat, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _implicit_gemm_block(x_flat, w_flat, geometry, N, C, H, W, K, 3, 3, H, W, acc)
    _epilogue_store(acc, N, K, H, W, bias, residual_flat, out_flat, True, True)


@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, 3)))
def _conv_bias_relu_per_store(x_flat, w_flat, geometry, N, C, H, W, K, bias, residual_flat, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _implicit_gemm_block(x_flat, w_flat, geometry, N, C, H, W, K, 3, 3, H, W, acc)
    _epilogue_store(acc, N, K, H, W, bias, residual_flat, out_flat, False, False)


@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, 3)))
def _conv_bias_add_relu_per_store(x_flat, w_flat, geometry, N, C, H, W, K, bias, residual_flat, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _implicit_gemm_block(x_flat, w_flat, geometry, N, C, H, W, K, 3, 3, H, W, acc)
    _epilogue_store(acc, N, K, H, W, bias, residual_flat, out_flat, True, False)


_EPILOGUE_KERNELS = {(False, True): _conv_bias_relu, (True, True): _conv_bias_add_relu,
                     (False, False): _conv_bias_relu_per_store, (True, False): _conv_bias_add_relu_per_store}


def _fused(x, w, bias, residual, add_residual, out, bias_once=True):
    N, C, H, W = x.shape
    K = w.shape[0]
    grid = (blocks_for(N * H * W, BN), blocks_for(K, BM))
    kernel = _EPILOGUE_KERNELS[(add_residual, bias_once)]
    kernel[grid, GEMM_THREADS](_flat(x), _flat(w), _same3x3(), N, C, H, W, K, bias, _flat(residual), _flat(out))


def epilogue_variant(bias_once, add_residual):
    """A launcher of the fused kernel with the bias read once per thread or at every store (the GPU
    script times both: which one the stage uses is a measurement, not a guess). Arguments as the
    stages': (x, w, bias, out) or (x, w, bias, residual, out)."""
    def launch(x, w, bias, *rest):
        residual = rest[0] if add_residual else rest[-1]
        _fused(x, w, bias, residual, add_residual, rest[-1], bias_once)
    return launch


FUSED_SUMMARY = """
    The implicit GEMM's main loop unchanged (the same device function), with the bias, the residual and
    ReLU applied to each accumulator while it is still in a register, just before its one store. A
    thread's 64 accumulators lie in 8 output channels: it reads their 8 biases once, before the store
    loop, and whether a residual is added is compiled in (a kernel each), so the store loop is the
    implicit GEMM's plus one add, one compare (and one residual load at the store's own index). The
    separate kernel and its read and write of the output are gone; the residual is read where the output
    is written. This is a library's "epilogue fusion" (cuDNN's ConvBiasActivation with its z input,
    CUTLASS's epilogue functors, what torch.compile asks of a convolution template). Why the implicit
    GEMM and not Winograd: they are as fast at this layer, but the implicit GEMM's accumulators are the
    outputs themselves, while Winograd's are transformed tiles that become outputs only in its last
    kernel (the epilogue would go there, still a separate pass over M). On an H200, with the bias alone
    the fusion won at the headline layer (about 3%) but lost at N32 C256 14x14, for a reason not yet
    found. With the residual it never won: the fused residual epilogue cost as much over the bare
    convolution as the whole separate pass. The likely reason is in the compiled store loop: each
    output's residual load, its additions, ReLU and store in turn, 64 memory latencies one after
    another per thread (stage 3 says why the compiler keeps that order, and loads the residual first).
    Not registers: ptxas gives the fused kernel 159 and no spills, the implicit GEMM 161."""


@bias_relu_op.stage("fused_epilogue", FUSED_SUMMARY)
def fused_epilogue(x, w, bias, out):
    _fused(x, w, bias, out, False, out)


@bias_add_relu_op.stage("fused_epilogue", FUSED_SUMMARY)
def add_fused_epilogue(x, w, bias, residual, out):
    _fused(x, w, bias, residual, True, out)


# -- 3. async_epilogue: the same epilogue on async_gather's main loop, the residual loaded before any store ----
#
# Stage 2's store loop makes a chain of its residual loads: numba cannot tell the compiler that out and
# the residual never overlap, so no residual load may move above the store before it. In its SASS each
# of a thread's 64 outputs is LDG, FADD, FADD, FSETP, FSEL, STG in turn: 64 memory latencies one after
# another, where the bare convolution's 64 stores wait for nothing. Here the residual goes into the
# accumulators first, before any store, in batches of RESIDUAL_COLUMNS x 8 loads issued back to back
# (16 LDG then 16 FADD in the SASS at 2: four latencies a thread). All 64 at once would need 64 more
# registers than the 168 that three blocks an SM allow (ptxas spills 1220 bytes at 8 columns, 96 at 4).

RESIDUAL_FIRST = True  # False: stage 2's store loop, the residual read at each store (for a sweep)
RESIDUAL_COLUMNS = 2  # accumulator columns whose 8 residuals each are loaded together: 2, 4 or 8
if RESIDUAL_COLUMNS not in (2, 4, 8):
    raise ValueError(f"RESIDUAL_COLUMNS must be 2, 4 or 8 (of a thread's 8 accumulator columns), "
                     f"got {RESIDUAL_COLUMNS}")


@cuda.jit(device=True, inline=True)
def _residual_columns(acc, first, N, K, P, residual_flat):
    """acc[m, qq] += the residual at its output's index (see _store_outputs), for the accumulator
    columns qq = first .. first + RESIDUAL_COLUMNS - 1, every load before any use. No load sits behind
    a branch: an output past the tile's edge loads residual_flat[0] (always there) into an accumulator
    that is never stored, so the compiler can issue them back to back, each into its own register."""
    t = cuda.threadIdx.x
    held = cuda.local.array((8, RESIDUAL_COLUMNS), float32)
    for j in range(RESIDUAL_COLUMNS):
        _, col = output_index(t, 0, first + j)
        q = cuda.blockIdx.x * BN + col
        n = q // P
        p = q % P
        for m in range(8):
            row, _ = output_index(t, m, first + j)
            k = cuda.blockIdx.y * BM + row
            held[m, j] = residual_flat[(n * K + k) * P + p if q < N * P and k < K else 0]
    for j in range(RESIDUAL_COLUMNS):
        for m in range(8):
            acc[m, first + j] += held[m, j]


@cuda.jit(device=True, inline=True)
def _residual_into_accumulators(acc, N, K, P, residual_flat):
    """The residual into all 64 accumulators, RESIDUAL_COLUMNS columns (8 loads each) in flight at a
    time. Written out, not a loop over the batches: numba cannot ask for an unrolled loop, and a loop
    the compiler keeps indexes acc at run time, which puts it in local memory."""
    _residual_columns(acc, 0, N, K, P, residual_flat)
    if RESIDUAL_COLUMNS < 8:
        _residual_columns(acc, RESIDUAL_COLUMNS, N, K, P, residual_flat)
    if RESIDUAL_COLUMNS < 4:
        _residual_columns(acc, 2 * RESIDUAL_COLUMNS, N, K, P, residual_flat)
        _residual_columns(acc, 3 * RESIDUAL_COLUMNS, N, K, P, residual_flat)


@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, BLOCKS_PER_SM)))
def _async_bias_relu(x_flat, wt_flat, N, C, H, W, K, Cp, Kp, bias, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _async_gather_block(x_flat, wt_flat, N, C, H, W, Cp, Kp, 3, 3, 1, 1, 1, H, W, acc)
    _epilogue_store(acc, N, K, H, W, bias, out_flat, out_flat, False, True)  # out: the residual, never read


@cuda.jit(**_gpu_options(launch_bounds=(GEMM_THREADS, BLOCKS_PER_SM)))
def _async_bias_add_relu(x_flat, wt_flat, N, C, H, W, K, Cp, Kp, bias, residual_flat, out_flat):
    acc = cuda.local.array((8, 8), float32)
    _async_gather_block(x_flat, wt_flat, N, C, H, W, Cp, Kp, 3, 3, 1, 1, 1, H, W, acc)
    if RESIDUAL_FIRST:
        # The residual joins the sum before the bias (stage 2 adds the bias first): a different rounding
        # of the same three terms, inside the check's tolerance.
        _residual_into_accumulators(acc, N, K, H * W, residual_flat)
        _epilogue_store(acc, N, K, H, W, bias, residual_flat, out_flat, False, True)
    else:
        _epilogue_store(acc, N, K, H, W, bias, residual_flat, out_flat, True, True)


def async_fused(x, w, bias, residual, out):
    """relu(conv(x, w) + bias[k] (+ residual)) on async_gather's main loop; residual None: no residual.
    Public: conv2d[bn_folded] runs its folded filters and bias through it."""
    N, C, H, W = x.shape
    K = w.shape[0]
    wt = _padded_filters(w)
    grid = (blocks_for(N * H * W, BN), wt.shape[2] // BM)
    args = (_flat(x), _flat(wt), N, C, H, W, K, wt.shape[1], wt.shape[2], bias)
    if residual is None:
        _async_bias_relu[grid, GEMM_THREADS](*args, _flat(out))
    else:
        _async_bias_add_relu[grid, GEMM_THREADS](*args, _flat(residual), _flat(out))


ASYNC_EPILOGUE_SUMMARY = """
    Stage 2's epilogue on conv2d's fastest main loop: the kernel is conv2d's async_gather (stage 6 of
    that ladder: the reduction walked taps outermost, every tile copied by cp.async through a
    PIPELINE_STAGES-deep pipeline, the filters reordered once per call into wt[tap, c, k]) with its
    store replaced by stage 2's: one device function for the main loop, one for the epilogue. The gain
    is the main loop's: a K-step of the compiled loop is about 77% FFMA where the implicit GEMM's was
    47%. One change to the epilogue itself, for the residual. Stage 2 read each residual value at its
    store, and since numba cannot promise the compiler that out and the residual never overlap, no load
    may move above the store before it: a thread's 64 outputs were each load, add, ReLU, store in turn,
    64 memory latencies in a row, the likely reason that fusion never beat the separate pass. Here the
    residual is added to the accumulators before the first store, its loads issued 16 at a time
    (RESIDUAL_COLUMNS), each into its own register: four latencies a thread instead of 64. Not all 64 at
    once: beside the accumulators they need more registers than three blocks an SM leave a thread, and
    ptxas spills (from 32 at once). An output past the tile's edge loads the residual's first float
    into an accumulator that is never stored, so no load waits on a branch. On an H200 at
    32x64x56x56x64: with the bias alone 198.5 us against torch's cuDNN convolution (bias) and ReLU,
    286.1 in the same run (1.44x); with the residual 212.0 against 302.8 (1.43x; torch.compile 354.9)."""


@bias_relu_op.stage("async_epilogue", ASYNC_EPILOGUE_SUMMARY)
def async_epilogue(x, w, bias, out):
    async_fused(x, w, bias, None, out)


@bias_add_relu_op.stage("async_epilogue", ASYNC_EPILOGUE_SUMMARY)
def add_async_epilogue(x, w, bias, residual, out):
    async_fused(x, w, bias, residual, out)


OPERATORS = [op, general_op, bias_relu_op, bias_add_relu_op]
