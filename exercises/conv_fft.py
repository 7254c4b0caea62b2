# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/conv_fft.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade conv2d_fft            (or conv2d_fft.<stage>)
# The grader checks each stage against the operator in solutions/conv_fft.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 50c72b2417a7b85db7317e0c136dac61345057a23a94f6fd9d722731a6d6b44e
# --------------------------------------------------------------------------------------------------
"""2-D convolution with a large filter through the FFT: few channels in, one out (NCHW float32).

out[n, h, w] = sum over c, r, s of wt[c, r, s] * x[n, c, h - pad + r, w - pad + s],  pad = R // 2
(a cross-correlation, as conv2d; R x R odd filters, stride 1, "same" output size, zeros outside).

Direct convolution costs 2 C R^2 flops per output: 1922 per input channel at 31x31. The convolution
theorem turns it into a pointwise product: pad image and (flipped) filter to P x P, P a power of two
>= max(H, W) + R - 1 so that the circular convolution the FFT computes equals the linear one, transform
both, multiply, transform back. Per output that is O(log P) flops whatever R is (about 5 log2(P^2) per
transform per output position, for the image, the filter and the inverse), so there is a filter size
past which it wins: the GPU script sweeps R and prints it. Libraries pick FFT for large filters and
few channels (cuDNN's FFT and FFT_TILING algorithms); for 3x3 layers with many channels the GEMM or
Winograd algorithms win, the FFT's padding and transforms costing more than they save.

Size: N x C x H x W x R. Inputs: x float32 (N, C, H, W), w float32 (C, R, R); out float32 (N, H, W).
"""

import math

import numpy as np
from numba import complex64, cuda, float32

from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch

EPS32 = float(np.finfo(np.float32).eps)
MAX_P = 1024  # the longest line one block transforms in shared memory (8 KiB of complex64)
THREADS = 256


def fft_length(H, W, R):
    """P: the power of two the image and filter are padded to (no wrap-around of the linear convolution)."""
    return 1 << (max(H, W) + R - 2).bit_length()


def _inputs(size, rng):
    N, C, H, W, R = size
    return (rng.uniform(-1.0, 1.0, (N, C, H, W)).astype(np.float32),
            rng.uniform(-1.0, 1.0, (C, R, R)).astype(np.float32))


def _reference(x, w):
    """float64: one shifted, weighted copy of the padded image per filter tap."""
    N, C, H, W = x.shape
    R = w.shape[1]
    pad = R // 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((N, H, W))
    for r in range(R):
        for s in range(R):
            out += np.einsum("nchw,c->nhw", xp[:, :, r:r + H, s:s + W], w[:, r, s].astype(np.float64))
    return out


def _tolerance(size, dtype):
    # Direct: sqrt(C R^2) roundings of a dot product. FFT: each transform rounds about log2(P^2) times
    # per value, relative to the signal's norm.
    N, C, H, W, R = size
    P = fft_length(H, W, R)
    return max(1e-5, 4 * EPS32 * math.sqrt(C * R * R), 8 * EPS32 * math.log2(P * P))


def _adversarial(size, rng):
    """A zero image with one bright pixel in each corner: the outputs there are the filter, read forwards
    or backwards, cut at the border: a filter not flipped for the FFT, an off-by-one crop, or a circular
    wrap-around (P too small) shows. (No NaN case: an FFT spreads one NaN over the whole image, as cuDNN's
    FFT algorithms do; the direct stage keeps it local.)"""
    x, w = _inputs(size, rng)
    x = np.zeros_like(x)
    x[:, :, 0, 0] = 1.0
    x[:, :, -1, -1] = -2.0
    return [("corner-impulses", (x, w))]


def _validate(x, w, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("w", w, dtype=np.float32, ndim=3)
    N, C, H, W = x.shape
    if w.shape[0] != C or w.shape[1] != w.shape[2] or w.shape[1] % 2 == 0:
        raise InputError(f"w must be C x R x R with C = {C} and R odd, got {tuple(w.shape)}")
    if fft_length(H, W, w.shape[1]) > MAX_P:
        raise InputError(f"max(H, W) + R - 1 must be at most {MAX_P} (one block transforms a line), got "
                         f"{max(H, W) + w.shape[1] - 1}")
    expect_device_array("out", out, dtype=np.float32, shape=(N, H, W))


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    pad = size[4] // 2

    def run(x, w, out):
        with peers.without_tf32(torch):
            y = torch.nn.functional.conv2d(peers.as_torch(x), peers.as_torch(w).unsqueeze(0), padding=pad)
        peers.as_torch(out).copy_(y[:, 0])

    return "torch.conv2d (cuDNN fp32)", run


def _flops(size):
    N, C, H, W, R = size
    return 2 * N * C * H * W * R * R  # the direct count: what the FFT stage avoids doing


def _bytes(size):
    N, C, H, W, R = size
    return 4 * (N * C * H * W + C * R * R + N * H * W)


op = Operator(
    name="conv2d_fft",
    title="Large-filter convolution, direct against FFT (few channels in, one out; NCHW float32)",
    reference=_reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty((size[0], size[2], size[3]), np.float32),
    bytes_moved=_bytes,
    flops=_flops,
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    bound="compute",
    size_names=("N", "C", "H", "W", "R"),
    adversarial_inputs=_adversarial,
    sim_sizes=[(1, 1, 3, 4, 3), (1, 2, 5, 6, 3), (2, 3, 9, 7, 7)],
    check_sizes=[(1, 1, 1, 1, 1), (2, 3, 17, 13, 7), (1, 2, 100, 37, 31), (8, 3, 256, 256, 15)],
    bench_sizes=[(8, 3, 256, 256, 7), (8, 3, 256, 256, 15), (8, 3, 256, 256, 31)],
    headline_size=(8, 3, 256, 256, 31),
    rank=325,
    group="Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
    record_all_sizes=True,
)


# -- 1. direct: a thread per output --------------------------------------------------------------------

@cuda.jit
def _direct(x, w, out):
    i = cuda.grid(1)
    N, H, W = out.shape
    C, R = w.shape[0], w.shape[1]
    if i < out.size:
        col = i % W
        h = i // W % H
        n = i // (W * H)
        pad = R // 2
        # EXERCISE: write this part of `_direct`. Read the hints one at a time.
        #   hint 1: acc = sum over c, r, s of w[c, r, s] * x[n, c, h - pad + r, col - pad + s], skipping taps outside the image.
        return  # TODO(exercise): not implemented yet: replace this line with your code
        out[n, h, col] = acc


@op.stage("direct", """
    The baseline: a thread per output sums its C R^2 taps straight from global memory (the caches
    catch the reuse), skipping the taps outside the image. Its cost grows with the filter's area:
    2 C R^2 flops per output, 49 taps per channel at 7x7 and 961 at 31x31.""")
def direct(x, w, out):
    _direct[blocks_for(out.size, THREADS), THREADS](x, w, out)


# -- 2. fft: pad, transform, multiply-accumulate over channels, transform back ----------------------------

@cuda.jit(device=True, inline=True)
def _bit_reversed(i, bits):
    j = 0
    for _ in range(bits):
        j = (j << 1) | (i & 1)
        i >>= 1
    return j


_TWIDDLES: dict = {}


def _twiddles(P):
    """exp(-2 pi i j / P) for j < P / 2, computed in float64 on the host once per P and kept on the
    device (as cuFFT keeps its tables): no sine or cosine in the kernels, and each factor correctly
    rounded to float32."""
    if P not in _TWIDDLES:
        _TWIDDLES[P] = cuda.to_device(np.exp(-2j * np.pi * np.arange(max(1, P // 2)) / P).astype(np.complex64))
    return _TWIDDLES[P]


@cuda.jit(device=True, inline=True)
def _fft_in_shared(line, twiddles, P, bits, sign):
    """In-place radix-2 FFT of line[0:P] (shared, loaded in bit-reversed order) by P / 2 threads:
    log2 P rounds of butterflies, one butterfly a thread a round, a barrier between rounds.
    sign -1: forward transform; +1: inverse (unscaled)."""
    t = cuda.threadIdx.x
    half = 1
    for _ in range(bits):
        # EXERCISE: write this part of `_fft_in_shared`. Read the hints one at a time.
        #   hint 1 (nudge): in the round whose butterflies span `half`, thread t joins i0 = (t // half) 2 half + t % half and i0 + half.
        #   hint 2 (nearly the answer): with twiddle = exp(-pi i j / half) (conjugated for the inverse), u = line[i0], v = line[i0 + half] * twiddle: line[i0] = u + v, line[i0 + half] = u - v; then a barrier.
        pass  # TODO(exercise): not implemented yet: replace this line with your code
        half *= 2


@cuda.jit
def _rows_forward(src, flip, spec, twiddles, bits):
    """spec[plane, row, :] = FFT of row `row` of plane `plane` of src zero-padded to P x P; with flip,
    the plane is read rotated by 180 degrees (the filter: cross-correlation is convolution with it)."""
    line = cuda.shared.array(MAX_P, complex64)
    plane, row = cuda.blockIdx.y, cuda.blockIdx.x
    Hs, Ws = src.shape[1], src.shape[2]
    P = 1 << bits
    t = cuda.threadIdx.x
    for i in range(t, P, cuda.blockDim.x):
        col = _bit_reversed(i, bits)
        h = Hs - 1 - row if flip else row
        c = Ws - 1 - col if flip else col
        inside = row < Hs and col < Ws
        line[i] = complex64(src[plane, h, c]) if inside else complex64(0)
    cuda.syncthreads()
    if row < Hs:  # a row of padding transforms to zeros: skip the butterflies
        _fft_in_shared(line, twiddles, P, bits, -1)
    for i in range(t, P, cuda.blockDim.x):
        spec[plane, row, i] = line[i]


@cuda.jit
def _columns(spec, twiddles, bits, sign):
    """Transform every column of every plane of spec in place."""
    line = cuda.shared.array(MAX_P, complex64)
    plane, col = cuda.blockIdx.y, cuda.blockIdx.x
    P = 1 << bits
    t = cuda.threadIdx.x
    for i in range(t, P, cuda.blockDim.x):
        line[i] = spec[plane, _bit_reversed(i, bits), col]
    cuda.syncthreads()
    _fft_in_shared(line, twiddles, P, bits, sign)
    for i in range(t, P, cuda.blockDim.x):
        spec[plane, i, col] = line[i]


@cuda.jit
def _multiply_accumulate(X, Wf, Y):
    """Y[n] = sum over c of X[n, c] * Wf[c], pointwise: the whole convolution, in frequency space."""
    i = cuda.grid(1)
    N, P = Y.shape[0], Y.shape[1]
    C = Wf.shape[0]
    if i < N * P * P:
        e = i % (P * P)
        n = i // (P * P)
        # EXERCISE: write this part of `_multiply_accumulate`. Read the hints one at a time.
        #   hint 1: one complex multiply-add per input channel: the spectra of image n's channel c (plane n C + c of X) times the filter's.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _rows_inverse_crop(Y, out, twiddles, bits, pad):
    """out[n, h, :] = the real part of the inverse FFT of row h + pad of Y[n], columns pad..pad+W-1,
    scaled by 1 / P^2 (the two unscaled inverse transforms)."""
    line = cuda.shared.array(MAX_P, complex64)
    n, h = cuda.blockIdx.y, cuda.blockIdx.x
    W = out.shape[2]
    P = 1 << bits
    t = cuda.threadIdx.x
    for i in range(t, P, cuda.blockDim.x):
        line[i] = Y[n, h + pad, _bit_reversed(i, bits)]
    cuda.syncthreads()
    _fft_in_shared(line, twiddles, P, bits, 1)
    scale = float32(1.0) / float32(P * P)
    for col in range(t, W, cuda.blockDim.x):
        out[n, h, col] = line[col + pad].real * scale


def _fft_traffic(size):
    # Complex64 spectra (8 bytes a point, P^2 points a plane): the image planes and filter planes are
    # written by the row pass, read and written by the column pass, read by the product; the product is
    # written, read and written by the inverse column pass, read by the inverse row pass.
    N, C, H, W, R = size
    P = fft_length(H, W, R)
    planes = N * C + C
    return _bytes(size) + 8 * P * P * (3 * planes + N * C + C + 4 * N)


@op.stage("fft", """
    The convolution theorem: the image planes and the filter (rotated 180 degrees: a cross-correlation
    is a convolution with the flipped filter) are zero-padded to P x P, P a power of two at least
    max(H, W) + R - 1 so that nothing wraps around, and transformed by rows then by columns. Each line
    is one block's work in shared memory: loaded in bit-reversed order, then log2 P rounds of radix-2
    butterflies, one butterfly a thread, a barrier between rounds, the twiddle factors read from a
    table computed once per P. Then one pointwise complex
    multiply-accumulate over the input channels (the whole convolution), the inverse transform by
    columns, and by rows keeping only the H x W window the 'same' output needs. Its cost depends on P,
    not on R: at 256x256 images P is 512 for every filter from 7x7 to 31x31 (P = 1024 would start at
    max(H, W) + R - 1 > 512). The price: 7 launches, complex spectra 2-4x the image (P^2 complex per
    plane), column passes whose loads are strided (a library transposes, or transforms several columns
    per block), and an error of a few float32 ulps times log2 P^2 relative to the image's norm, spread
    over all outputs (a NaN anywhere poisons the whole image: the direct stage keeps it local).""",
    bytes_moved=_fft_traffic)
def fft(x, w, out):
    N, C, H, W = x.shape
    R = w.shape[1]
    P = fft_length(H, W, R)
    bits = P.bit_length() - 1
    threads = max(1, P // 2)
    X = scratch("conv_fft.X", (N * C, P, P), np.complex64)
    Wf = scratch("conv_fft.W", (C, P, P), np.complex64)
    Y = scratch("conv_fft.Y", (N, P, P), np.complex64)
    tw = _twiddles(P)
    _rows_forward[(P, C), threads](w, True, Wf, tw, bits)
    _columns[(P, C), threads](Wf, tw, bits, -1)
    _rows_forward[(P, N * C), threads](x.reshape(N * C, H, W), False, X, tw, bits)
    _columns[(P, N * C), threads](X, tw, bits, -1)
    _multiply_accumulate[blocks_for(N * P * P, THREADS), THREADS](X, Wf, Y)
    _columns[(P, N), threads](Y, tw, bits, 1)
    _rows_inverse_crop[(H, N), threads](Y, out, tw, bits, R // 2)


OPERATORS = [op]
