# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/batchnorm.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade batchnorm[train]            (or batchnorm[train].<stage>; its other operators: batchnorm[infer])
# The grader checks each stage against the operator in solutions/batchnorm.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 30b208791f9648f78c309bf0ffb0f6c1c7fe5b4513488ee663eb0bf9f4ce6948
# --------------------------------------------------------------------------------------------------
"""BatchNorm of NCHW float32 images: the training forward pass (statistics of the batch) and inference.

Both read their input once and write their output once for a few flops per element: memory-bound, so
"% of peak" is the fraction of the measured copy bandwidth, and the ladders are about reading each byte
once, with many loads in flight, and filling the GPU:

* ``batchnorm[train]``: per channel, the mean and (biased) variance over N*H*W elements, then
  out = (x - mean) / sqrt(var + 1e-5) * gamma + beta. The statistics are a reduction across the whole
  batch: too few channels (64) to give each one block, so the ladder splits each channel over many
  blocks and combines their partial sums.
* ``batchnorm[infer]``: the inference form, with the running statistics a trained model stores: an
  elementwise layer once each channel's divisor is folded into one scale. The same fold, applied to the
  weights of the convolution before it, removes the layer from a deployed network altogether
  (conv_bn.py).
"""

import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64
from numba.cuda import libdevice

from solutions._nchw import BENCH_SIZES, CHECK_SIZES, GROUP, HEADLINE, SIM_SIZES, nchw_bytes
from solutions._vector_io import aligned16, load4, load4_hinted, store4, store4_hinted
from workbench import library_peers as peers
from workbench.ladder import Operator, blocks_for, expect_device_array, scratch, sm_count
from workbench.targets import against_peer, of_ceiling

THREADS = 256
WARPS = THREADS // 32  # a shared array's shape must be a module constant, not an expression
FULL_MASK = 0xFFFFFFFF
EPS = np.float32(1e-5)  # a float32 global: numba types it float32
TORCH_EPS = float(EPS)  # eps for torch expressions: torch.compile traces float() of a numpy scalar as data-dependent and fails


# == batchnorm[train] ==============================================================================

def _bn_inputs(size, rng):
    N, C, H, W = size
    mean = rng.uniform(-3.0, 3.0, (1, C, 1, 1))
    std = rng.uniform(0.5, 2.0, (1, C, 1, 1))
    x = (mean + std * rng.standard_normal((N, C, H, W))).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    beta = rng.uniform(-1.0, 1.0, C).astype(np.float32)
    return x, gamma, beta


def _bn_reference(x, gamma, beta):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return (x64 - mean) / np.sqrt(var + float(EPS)) * gamma[None, :, None, None] + beta[None, :, None, None]


def _bn_adversarial(size, rng):
    x, gamma, beta = _bn_inputs(size, rng)
    # Channel 0 has mean 1e4 and std 1: sum(x^2)/n - mean^2 cancels catastrophically in float32 (the
    # kernels sum deviations from a sample of the channel instead). The last channel is constant:
    # variance 0, and the output must be exactly beta there.
    x[:, 0] = (1e4 + rng.standard_normal(x[:, 0].shape)).astype(np.float32)
    x[:, -1] = np.float32(0.75)
    return [("offset-and-constant-channels", (x, gamma, beta))]


def _bn_validate(x, gamma, beta, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    C = x.shape[1]
    expect_device_array("gamma", gamma, dtype=np.float32, shape=(C,))
    expect_device_array("beta", beta, dtype=np.float32, shape=(C,))
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape))


def _bn_peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, gamma, beta, out):
        return torch.nn.functional.batch_norm(peers.as_torch(x), None, None, peers.as_torch(gamma),
                                              peers.as_torch(beta), training=True, eps=float(EPS))

    run.returns_output = True
    return "torch.batch_norm(training=True)", run


def _bn_expression(torch, size):
    return lambda x, gamma, beta: torch.nn.functional.batch_norm(x, None, None, gamma, beta, training=True,
                                                                 eps=TORCH_EPS)


bn_op = Operator(
    name="batchnorm", variant={"mode": "train"},
    targets=[against_peer(1.5, "torch.batch_norm*", stage="vector_passes"), against_peer(1.0),
             of_ceiling(85, "copy_gbps", stage="vector_passes")],
    title="BatchNorm, training forward: per-channel batch statistics, then normalize (NCHW float32)",
    reference=_bn_reference,
    make_inputs=_bn_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    # The minimum: the statistics need every element before the first output can be written, so x is
    # read twice (unless it fits on chip) and the output written once.
    bytes_moved=lambda size: 3 * nchw_bytes(size) + 8 * size[1],
    flops=lambda size: 5 * int(np.prod(size)),
    validate=_bn_validate,
    peer=_bn_peer,
    torch_expression=_bn_expression,
    adversarial_inputs=_bn_adversarial,
    size_names=("N", "C", "H", "W"),
    sim_sizes=[(1, 2, 3, 5), (2, 3, 9, 10), (3, 2, 7, 6)],
    check_sizes=CHECK_SIZES,
    bench_sizes=BENCH_SIZES,
    headline_size=HEADLINE,
    rank=332,
    group=GROUP,
    record_all_sizes=True,
)


@cuda.jit(device=True, inline=True)
def _block_sum2(a, b, shared):
    """(sum of a, sum of b) over the block (THREADS threads), for every thread: warp shuffles, then the
    warps' partials through shared memory (2 x 8 floats)."""
    for offset in (16, 8, 4, 2, 1):
        a += cuda.shfl_down_sync(FULL_MASK, a, offset)
        b += cuda.shfl_down_sync(FULL_MASK, b, offset)
    t = cuda.threadIdx.x
    if t % 32 == 0:
        shared[0, t // 32] = a
        shared[1, t // 32] = b
    cuda.syncthreads()
    a = float32(0.0)
    b = float32(0.0)
    for k in range(WARPS):
        a += shared[0, k]
        b += shared[1, k]
    cuda.syncthreads()  # the caller may reuse `shared`
    return a, b


# -- 1. one block per channel ------------------------------------------------------------------------------

@cuda.jit
def _bn_block_per_channel(x, gamma, beta, out):
    shared = cuda.shared.array((2, WARPS), float32)
    N, C, H, W = x.shape
    c = cuda.blockIdx.x
    t = cuda.threadIdx.x
    HW = H * W
    count = N * HW
    shift = x[0, c, 0, 0]  # a sample of the channel: deviations from it are small, their squares exact enough
    # EXERCISE: write this part of `_bn_block_per_channel`. Read the hints one at a time.
    #   hint 1 (nudge): pass 1: each thread sums d = x - shift and d * d over its share of the channel (images n, pixels t, t + THREADS, ...); _block_sum2 totals them.
    #   hint 2 (nearly the answer): mean_d = S1 / count (the mean's offset from shift); var = S2 / count - mean_d^2 (never below 0); pass 2: out = (x - shift - mean_d) * (gamma[c] / sqrt(var + EPS)) + beta[c].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@bn_op.stage("block_per_channel", """
    One block per channel does it all: it sums the channel's N*H*W deviations from a sample of the
    channel (x[0, c, 0, 0]) and their squares, totals them across the block (warp shuffles, then the
    8 warps' partials in shared memory), and then normalizes the channel, reading it a second time.
    Summing deviations instead of the values keeps E[d^2] - E[d]^2 from cancelling when the mean is
    large. Simple, and slow: 64 channels make 64 blocks, half of the 132 SMs idle and the others
    with one block each, far too few loads in flight for the bandwidth.""")
def batchnorm_block_per_channel(x, gamma, beta, out):
    _bn_block_per_channel[x.shape[1], THREADS](x, gamma, beta, out)


# -- 2. each channel split over many blocks: partial sums, then normalize ------------------------------------

SPLIT = 64  # at most this many blocks per channel for the statistics: C * 64 fill the GPU from C = 16 on


@cuda.jit
def _bn_partials(x, partials, N, C, HW):
    # Block (s, c) sums the deviations of elements e = s * THREADS + t, + split * THREADS, ... of
    # channel c (e runs over the N * HW elements: image e // HW, pixel e % HW).
    shared = cuda.shared.array((2, WARPS), float32)
    s = cuda.blockIdx.x
    split = cuda.gridDim.x
    c = cuda.blockIdx.y
    shift = x[uint64(c * HW)]
    count = N * HW
    s1 = float32(0.0)
    s2 = float32(0.0)
    # EXERCISE: write this part of `_bn_partials`. Read the hints one at a time.
    #   hint 1 (nudge): walk e from s * THREADS + t in steps of split * THREADS; element e is x[n, c, p] with n = e // HW, p = e - n * HW; sum d = x - shift and d * d.
    #   hint 2 (nearly the answer): total the block's sums with _block_sum2 and let thread 0 write them to partials[c, s, 0] and partials[c, s, 1].
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _bn_normalize(x, gamma, beta, partials, out, N, C, HW):
    # Block (b, c): first the channel's statistics from its partials (every block recomputes them: at
    # most 128 floats, cheaper than a third launch), then its slice of the channel's elements.
    stats = cuda.shared.array(3, float32)
    t = cuda.threadIdx.x
    c = cuda.blockIdx.y
    if t < 32:  # one warp combines the partials
        s1 = float32(0.0)
        s2 = float32(0.0)
        for k in range(t, partials.shape[1], 32):
            s1 += partials[c, k, 0]
            s2 += partials[c, k, 1]
        for offset in (16, 8, 4, 2, 1):
            s1 += cuda.shfl_down_sync(FULL_MASK, s1, offset)
            s2 += cuda.shfl_down_sync(FULL_MASK, s2, offset)
        if t == 0:
            count = float32(N * HW)
            mean_d = s1 / count
            var = max(s2 / count - mean_d * mean_d, float32(0.0))
            stats[0] = gamma[c] / math.sqrt(var + EPS)
            stats[1] = mean_d
            stats[2] = beta[c]
    cuda.syncthreads()
    scale = stats[0]
    mean_d = stats[1]
    bias = stats[2]
    shift = x[uint64(c * HW)]  # the sample the partial sums are deviations from
    # Block b takes elements e = b * THREADS + t, + grid step, of the channel's N * HW.
    step = cuda.gridDim.x * THREADS
    count = N * HW
    for e in range(cuda.blockIdx.x * THREADS + t, count, step):
        n = e // HW
        at = uint64((n * C + c) * HW + e - n * HW)
        # Not x * scale + (beta - mean * scale): with a mean of 1e4 that rounds at 1e4 * scale.
        out[at] = (x[at] - shift - mean_d) * scale + bias


@bn_op.stage("split_channels", """
    The statistics are now a reduction across blocks: 64 blocks per channel each sum a strided share of
    the channel's elements (deviations from a sample, as before) and write two partial sums; a second
    launch gives each channel a grid row of blocks that first combine the 64 partials with one warp
    (every block redoes it: 128 floats, cheaper than a third launch) into the channel's scale and mean,
    then normalize their slice: (x - sample - mean offset) * scale + beta, which stays exact for a
    channel whose mean is 1e4 (x * scale + shift would round at 1e4 * scale). C x 64 blocks fill all
    SMs, and addresses are unsigned. Two reads of x and one write, the minimum for a batch that does not
    fit on chip. On an H200 it was 5.8x faster than block_per_channel at 32x64x56x56 and 2.6x at
    32x128x28x28, but slower at 32x256x14x14: 42.2 against 33.5 µs. There 256 channels already gave
    block_per_channel 256 blocks, about two an SM, and a channel holds only 6272 elements: split over 25
    blocks, a thread sums at most one, so the statistics are 6400 block-wide reductions of a 6.4 MB
    tensor, and the second launch and its recombining of the partials buy nothing. Splitting pays when
    the channels alone cannot fill the GPU.""")
def batchnorm_split_channels(x, gamma, beta, out):
    N, C, H, W = x.shape
    HW = H * W
    split = min(SPLIT, blocks_for(N * HW, THREADS))  # no block without an element to sum
    partials = scratch("batchnorm_train.partials", (C, split, 2), np.float32)
    flat_x = x.reshape(x.size)
    _bn_partials[(split, C), THREADS](flat_x, partials, N, C, HW)
    blocks_per_channel = min(blocks_for(N * HW, THREADS), 64)
    _bn_normalize[(blocks_per_channel, C), THREADS](flat_x, gamma, beta, partials, out.reshape(out.size), N, C, HW)


# -- 3. 16-byte loads, the statistics finished by the last block, one normalize kernel for both BatchNorms ------

# The normalize pass of both BatchNorms is the same per-channel affine map once the statistics are known:
# out = ((x - center) - offset) * scale + bias, with params[c] = (scale, center, offset, bias). Training
# finds them (center: the channel's sample, offset: the mean's deviation from it); inference folds them
# from the running statistics (center: the running mean, offset: 0). A channel's four floats are one
# 16-byte row, read with one load4.
PLANE_STEP = uint64(4 * THREADS)  # elements between one thread's vectors: a warp's load4 is one 512-byte run
APPLY_BLOCK = 4 * 4 * THREADS  # elements one block of the normalize kernel covers: 4 vectors a thread
STATS_SPLIT = 32  # at most this many blocks per channel for the statistics, each summing whole planes
UINT32_LIMIT = 2 ** 32  # the normalize kernel finds a vector's plane with a 32-bit division


@cuda.jit(device=True, inline=True)
def _affine(v, p):
    return ((v - p[1]) - p[2]) * p[0] + p[3]


@cuda.jit(device=True, inline=True)
def _normalize4(params, e, C, HW, v0, v1, v2, v3):
    """The normalized x[e], ..., x[e + 3] (values v0..v3). HW >= 4, so a vector lies in at most two
    planes (when HW is not a multiple of 4): the first `inside` elements in plane e // HW, the rest in
    the next. One 32-bit division finds the plane (the launcher keeps x.size below 2^32)."""
    hw = uint32(HW)
    plane = uint32(e) // hw
    inside = (plane + uint32(1)) * hw - uint32(e)
    p = load4(params, uint64(4) * uint64(plane % uint32(C)))
    q = p
    if inside < uint32(4):
        q = load4(params, uint64(4) * uint64((plane + uint32(1)) % uint32(C)))
    return (_affine(v0, p), _affine(v1, p if inside > uint32(1) else q),
            _affine(v2, p if inside > uint32(2) else q), _affine(v3, q))


@cuda.jit
def _bn_apply_vectors(x, params, out, C, HW):
    # x, out: flat views, 16-byte aligned. Block b covers APPLY_BLOCK elements; thread t's four vectors
    # start at b * APPLY_BLOCK + 4t and PLANE_STEP apart, so each warp-wide load4 is one coalesced run.
    n = uint64(x.size)
    four = uint64(4)
    body = n - n % four
    s1 = PLANE_STEP
    s2 = s1 + s1
    s3 = s2 + s1
    i = uint64(cuda.blockIdx.x) * uint64(APPLY_BLOCK) + four * uint64(cuda.threadIdx.x)
    # EXERCISE: write this part of `_bn_apply_vectors`. Read the hints one at a time.
    #   hint 1 (nudge): as activations' in_flight: if all four vectors i, i + s1, i + s2, i + s3 lie inside body, issue the four load4 before any store4; else take them one at a time.
    #   hint 2 (nearly the answer): _normalize4(params, i, C, HW, a, b, c, d) gives the four outputs of the vector at i, whatever channel(s) it lies in.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _bn_apply_scalar(x, params, out, C, HW):
    """The fallback for what the vector kernel cannot take: planes under 4 elements, a view not on a
    16-byte boundary, 2^32 elements or more."""
    for e in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = uint64(e) // uint64(HW) % uint64(C)
        out[e] = _affine(x[e], load4(params, uint64(4) * c))


def _bn_apply(x, params, out, C, HW):
    flat_x = x.reshape(x.size)
    flat_out = out.reshape(out.size)
    if HW >= 4 and x.size < UINT32_LIMIT and aligned16(flat_x, flat_out):
        _bn_apply_vectors[blocks_for(x.size, APPLY_BLOCK), THREADS](flat_x, params, flat_out, C, HW)
    else:
        _bn_apply_scalar[blocks_for(x.size, 4 * THREADS), THREADS](flat_x, params, flat_out, C, HW)


@cuda.jit(device=True, inline=True)
def _deviations4(s1, s2, shift, a, b, c, d):
    a -= shift
    b -= shift
    c -= shift
    d -= shift
    return s1 + ((a + b) + (c + d)), s2 + ((a * a + b * b) + (c * c + d * d))


@cuda.jit
def _bn_stats_vectors(x, gamma, beta, partials, done, params, N, C, HW):
    # Block (s, c) sums the deviations of channel c's planes n = s, s + split, ... (plane n starts at
    # (n C + c) HW); the last of the channel's blocks to finish turns the partials into params[c].
    shared = cuda.shared.array((2, WARPS), float32)
    is_last = cuda.shared.array(1, int32)
    t = uint64(cuda.threadIdx.x)
    c = cuda.blockIdx.y
    split = cuda.gridDim.x
    four = uint64(4)
    zero = float32(0.0)
    hw = uint64(HW)
    step1 = PLANE_STEP  # unsigned throughout: numba types uint64 + int64 as float64
    step2 = step1 + step1
    step3 = step2 + step1
    step4 = step3 + step1
    shift = x[uint64(c) * hw]
    s1 = float32(0.0)
    s2 = float32(0.0)
    # EXERCISE: write this part of `_bn_stats_vectors`. Read the hints one at a time.
    #   hint 1 (nudge): a plane [start, end) need not start on a 16-byte boundary: up to 3 head elements (to the next multiple of 4), whole vectors, up to 3 tail elements; threads t < 3 take the head and tail.
    #   hint 2 (nearly the answer): the vectors: thread t's are body + 4t, then PLANE_STEP apart; load four (those past the plane's last vector as zeros, and not counted) before adding any, then step by 4 * PLANE_STEP.
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    s1, s2 = _block_sum2(s1, s2, shared)
    if t == 0:
        partials[c, cuda.blockIdx.x, 0] = s1
        partials[c, cuda.blockIdx.x, 1] = s2
        cuda.threadfence()  # this block's partials are visible to all before it is counted as done
        is_last[0] = cuda.atomic.add(done, c, 1) == split - 1
    cuda.syncthreads()
    if is_last[0] and t < 32:  # the channel's last block: one warp combines the partials
        s1 = float32(0.0)
        s2 = float32(0.0)
        for k in range(t, split, 32):
            s1 += partials[c, k, 0]
            s2 += partials[c, k, 1]
        for offset in (16, 8, 4, 2, 1):
            s1 += cuda.shfl_down_sync(FULL_MASK, s1, offset)
            s2 += cuda.shfl_down_sync(FULL_MASK, s2, offset)
        if t == 0:
            count = float32(N * HW)
            mean_d = s1 / count
            var = max(s2 / count - mean_d * mean_d, float32(0.0))
            params[c, 0] = gamma[c] / math.sqrt(var + EPS)
            params[c, 1] = shift
            params[c, 2] = mean_d
            params[c, 3] = beta[c]
            done[c] = 0  # ready for the next call


@bn_op.stage("vector_passes", """
    split_channels measured 204 us on an H200 at 128x64x56x56: 308 MB in three streams is 1.5 TB/s, a
    third of the copy rate, because each thread loaded one float at a time with an index division
    per element. Both passes now move 16-byte vectors (load4/store4) with several in flight per
    thread. The statistics: block (s, c) sums whole planes of channel c (a plane is contiguous; its
    up to 3 unaligned elements at each end go to single loads; at most 32 blocks a channel, none with
    less than a vector a thread), four vectors issued before any is added; the last of a channel's blocks to finish (an atomic ticket, as the reduction's fused
    stage) combines the partials into the channel's (scale, sample, mean offset, beta), so no launch
    is spent on it. The normalize pass is one kernel shared with batchnorm[infer]'s vectors stage: the
    tensor as one flat stream of vectors, as activations' in_flight, each vector's channel found with
    one 32-bit division (a vector may straddle two planes when H*W is not a multiple of 4), the
    channel's four floats one 16-byte load from L1. Still (x - sample - mean offset) * scale + beta,
    exact for a channel at 1e4. An x not on a 16-byte boundary runs split_channels. On the H200 it
    took 86.9 µs at 128x64x56x56 (83% of the copy rate, 2.85x torch's eager 247.8, torch.compile
    84.3) and tied torch.compile at 32x64x56x56 (28.0 both), but lost to eager torch at the small
    layers: 22.4 against 8.8 µs at 32x256x14x14 (0.39x), 23.0 against 15.9 at 32x128x28x28 (0.69x).
    Its time hardly moves between those two (6.4 and 12.8 MB: 4.5 and 9 µs at the copy rate), so it
    is a fixed cost: two launches, the statistics' chain (sums, block reduction, atomic ticket, the
    last block's combine) before the normalize pass can start, and whole planes a block: a 14x14
    plane is 49 vectors for 256 threads, so four threads in five idle through the statistics (a 28x28
    plane, 196 vectors: one in four). Small layers want several planes a block, or one kernel.""")
def batchnorm_vector_passes(x, gamma, beta, out):
    N, C, H, W = x.shape
    HW = H * W
    if not aligned16(x.reshape(x.size)):  # a view starting mid-buffer: a 16-byte load there would fault
        batchnorm_split_channels.launch(x, gamma, beta, out)
        return
    # Whole planes per block, at most STATS_SPLIT blocks a channel, and none with less than a vector a thread.
    split = max(1, min(STATS_SPLIT, N, N * HW // (4 * THREADS)))
    partials = scratch("batchnorm_train.vector_partials", (C, split, 2), np.float32)
    done = scratch("batchnorm_train.done", (C,), np.int32, zeroed=True)  # reset by each channel's last block
    params = scratch("batchnorm_train.params", (C, 4), np.float32)
    _bn_stats_vectors[(split, C), THREADS](x.reshape(x.size), gamma, beta, partials, done, params, N, C, HW)
    _bn_apply(x, params.reshape(4 * C), out, C, HW)


# == batchnorm[infer] ==============================================================================

def _bn_infer_inputs(size, rng):
    x, gamma, beta = _bn_inputs(size, rng)
    C = size[1]
    # running statistics near (not at) the batch's: a trained model's estimates
    running_mean = (x.mean(axis=(0, 2, 3)) + rng.uniform(-0.1, 0.1, C)).astype(np.float32)
    running_var = (x.var(axis=(0, 2, 3)) * rng.uniform(0.9, 1.1, C)).astype(np.float32)
    return x, gamma, beta, running_mean, running_var


def _bn_infer_reference(x, gamma, beta, running_mean, running_var):
    per_channel = (slice(None), None, None)
    scale = gamma.astype(np.float64) / np.sqrt(running_var.astype(np.float64) + float(EPS))
    return (x.astype(np.float64) - running_mean[per_channel]) * scale[per_channel] + beta[per_channel]


def _bn_infer_adversarial(size, rng):
    # Every channel at 1e4 with a spread of 1: folding the mean into a shift, x * scale + (beta -
    # mean * scale), rounds at 1e4 * scale and loses the spread (a relative error near 1e-4).
    x, gamma, beta, running_mean, running_var = _bn_infer_inputs(size, rng)
    offset = ((x - x.mean(axis=(0, 2, 3), keepdims=True)) + np.float32(1e4)).astype(np.float32)
    offset_mean = np.full_like(running_mean, 1e4)
    # A channel of variance 0: the divisor is sqrt(eps), and the output is large but exact.
    constant = x.copy()
    constant[:, -1] = np.float32(0.75)
    constant_mean, constant_var = running_mean.copy(), running_var.copy()
    constant_mean[-1], constant_var[-1] = np.float32(0.5), np.float32(0.0)
    return [("channels-at-1e4", (offset, gamma, beta, offset_mean, running_var)),
            ("zero-variance-channel", (constant, gamma, beta, constant_mean, constant_var))]


def _bn_infer_validate(x, gamma, beta, running_mean, running_var, out):
    _bn_validate(x, gamma, beta, out)
    C = x.shape[1]
    expect_device_array("running_mean", running_mean, dtype=np.float32, shape=(C,))
    expect_device_array("running_var", running_var, dtype=np.float32, shape=(C,))


def _bn_infer_peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, gamma, beta, running_mean, running_var, out):
        return torch.nn.functional.batch_norm(peers.as_torch(x), peers.as_torch(running_mean),
                                              peers.as_torch(running_var), peers.as_torch(gamma),
                                              peers.as_torch(beta), training=False, eps=float(EPS))

    run.returns_output = True
    return "torch.batch_norm(training=False)", run


def _bn_infer_expression(torch, size):
    """Inductor decomposes batch_norm into one elementwise kernel, as stage 2 (folded) is one."""
    return lambda x, gamma, beta, mean, var: torch.nn.functional.batch_norm(x, mean, var, gamma, beta,
                                                                            training=False, eps=TORCH_EPS)


bn_infer_op = Operator(
    name="batchnorm", variant={"mode": "infer"},
    targets=[against_peer(1.0, "torch.batch_norm*", stage="vectors"), of_ceiling(85, "copy_gbps", stage="vectors")],
    title="BatchNorm, inference: the running statistics folded into a scale per channel (NCHW float32)",
    reference=_bn_infer_reference,
    make_inputs=_bn_infer_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: 2 * nchw_bytes(size) + 16 * size[1],  # x in, out out, four floats a channel
    flops=lambda size: 3 * int(np.prod(size)),
    validate=_bn_infer_validate,
    peer=_bn_infer_peer,
    torch_expression=_bn_infer_expression,
    adversarial_inputs=_bn_infer_adversarial,
    size_names=("N", "C", "H", "W"),
    sim_sizes=SIM_SIZES,
    check_sizes=CHECK_SIZES,
    bench_sizes=BENCH_SIZES,
    headline_size=HEADLINE,
    rank=333,
    group=GROUP,
    record_all_sizes=True,
)


# -- 1. a thread per element, the formula as written ---------------------------------------------------------

@cuda.jit
def _bn_infer_per_element(x, gamma, beta, running_mean, running_var, out):
    e = cuda.grid(1)
    N, C, H, W = x.shape
    if e < x.size:
        w = e % W
        h = (e // W) % H
        c = (e // (W * H)) % C
        n = e // (W * H * C)
        divisor = math.sqrt(running_var[c] + EPS)
        out[n, c, h, w] = (x[n, c, h, w] - running_mean[c]) / divisor * gamma[c] + beta[c]


@bn_infer_op.stage("per_element", """
    The formula as a framework writes it: one thread per element finds its channel by dividing its
    index, reads the channel's four statistics, and computes (x - mean) / sqrt(var + eps) * gamma +
    beta: a square root and a division for every element, and four divisions and remainders to
    unflatten the index. The statistics are the same for the H*W elements of a plane, so most of
    that work is repeated; the reads of x and out are coalesced, and the four small arrays stay in
    L1, so the index arithmetic and the division are what it pays for.""")
def batchnorm_infer_per_element(x, gamma, beta, running_mean, running_var, out):
    _bn_infer_per_element[blocks_for(x.size, THREADS), THREADS](x, gamma, beta, running_mean, running_var, out)


# -- 2. the divisor folded into one scale a channel, a block row per plane -------------------------------------

MAX_GRID_ROWS = 65535  # gridDim.y's limit


@cuda.jit
def _bn_fold(gamma, running_var, scale):
    c = cuda.grid(1)
    if c < scale.size:
        scale[c] = gamma[c] / math.sqrt(running_var[c] + EPS)


@cuda.jit
def _bn_infer_planes(x, beta, running_mean, scale, out, C, HW):
    # Block row p takes planes p, p + gridDim.y, ... (plane = n * C + c; a grid has at most 65535
    # rows): the channel is known before the inner loop, so the statistics are three loads per plane,
    # and each element costs a subtraction and a multiply-add.
    for plane in range(cuda.blockIdx.y, x.size // HW, cuda.gridDim.y):
        c = plane % C
        # EXERCISE: write this part of `_bn_infer_planes`. Read the hints one at a time.
        #   hint 1 (nudge): read the plane's scale, mean and beta once, before the loop over the plane's elements.
        #   hint 2 (nearly the answer): keep (x - mean) * scale + beta: x * scale + (beta - mean * scale) rounds at mean * scale.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@bn_infer_op.stage("folded", """
    What a deployed model does: a first tiny launch folds each channel's divisor into one scale, gamma /
    sqrt(var + eps), and the main kernel gives each (image, channel) plane a row of blocks, so a thread
    knows its channel without dividing its index and reads the three constants once. Each element then
    costs a subtraction and a multiply-add. The mean is not folded into a shift: x * scale + (beta -
    mean * scale) would round at mean * scale, and a channel at 1e4 (the adversarial input) loses its
    spread. The same fold into the preceding convolution's weights and bias removes the layer from an
    inference graph entirely. On an H200 it beat per_element only on the larger tensors (239.8 against
    323.1 µs at 128x64x56x56, 59.2 against 85.4 at 32x64x56x56) and lost on the small ones: 29.3 against
    22.8 at 32x256x14x14, 52.1 against 42.2 at 32x128x28x28. The fold is a second launch, and a row of
    256-thread blocks per plane leaves threads idle where a plane is not a multiple of 256 (196 elements
    fill 77% of one block, 784 77% of four), while per_element's flat grid uses every thread: on a
    tensor this small, the divisions saved are worth less than the launch and the idle threads.""")
def batchnorm_infer_folded(x, gamma, beta, running_mean, running_var, out):
    N, C, H, W = x.shape
    HW = H * W
    scale = scratch("batchnorm_infer.scale", (C,), np.float32)
    _bn_fold[blocks_for(C, THREADS), THREADS](gamma, running_var, scale)
    blocks_per_plane = min(blocks_for(HW, THREADS), 8)
    plane_rows = min(N * C, MAX_GRID_ROWS)
    _bn_infer_planes[(blocks_per_plane, plane_rows), THREADS](x.reshape(x.size), beta, running_mean, scale,
                                                             out.reshape(out.size), C, HW)



# -- 3. several loads in flight per thread -------------------------------------------------------------------

ITEMS = 4  # elements a thread loads before it stores any: its loads are in flight together


@cuda.jit
def _bn_infer_in_flight(x, beta, running_mean, scale, out, C, HW):
    for plane in range(cuda.blockIdx.y, x.size // HW, cuda.gridDim.y):
        c = plane % C
        base = uint64(plane) * uint64(HW)
        first = cuda.blockIdx.x * THREADS * ITEMS + cuda.threadIdx.x
        values = cuda.local.array(ITEMS, float32)
        # Every load before the first store: a store to out might alias the next load of x, so in the
        # folded kernel each load waited for the previous element's store; here ITEMS are in flight.
        for k in range(ITEMS):
            i = first + k * THREADS
            if i < HW:
                values[k] = x[base + uint64(i)]
        s = scale[c]
        mean = running_mean[c]
        b = beta[c]
        for k in range(ITEMS):
            i = first + k * THREADS
            if i < HW:
                out[base + uint64(i)] = (values[k] - mean) * s + b


@bn_infer_op.stage("in_flight", """
    The folded kernel measured 857 GB/s on an H200 at 128x64x56x56, a third of torch, though each
    element costs two arithmetic instructions: it waits. A thread there handled one or two elements,
    loading, computing and storing each in turn, and the compiler may not move the next load above the
    store (out could alias x), so a thread had one 4-byte load in flight, and each block, short-lived,
    also waited on its plane's statistics. Here a thread loads ITEMS = 4 elements (THREADS apart, so a
    warp's loads stay coalesced) into registers before it stores any, and a plane needs a quarter of
    the blocks: four times the bytes in flight per thread, the statistics' latency paid once per
    1024 elements instead of 256. Where planes are small it is no better: at 32x256x14x14 it took 23.4
    µs against per_element's 22.8: a 196-element plane is one block in which 196 threads load one
    element each, so nothing more is in flight than in folded.""")
def batchnorm_infer_in_flight(x, gamma, beta, running_mean, running_var, out):
    N, C, H, W = x.shape
    HW = H * W
    scale = scratch("batchnorm_infer.scale", (C,), np.float32)
    _bn_fold[blocks_for(C, THREADS), THREADS](gamma, running_var, scale)
    blocks_per_plane = blocks_for(HW, THREADS * ITEMS)
    plane_rows = min(N * C, MAX_GRID_ROWS)
    _bn_infer_in_flight[(blocks_per_plane, plane_rows), THREADS](x.reshape(x.size), beta, running_mean, scale,
                                                                out.reshape(out.size), C, HW)


# -- 4. 16-byte vectors, the normalize kernel batchnorm[train]'s vector_passes uses ------------------------------

@cuda.jit
def _bn_fold_params(gamma, beta, running_mean, running_var, params):
    c = cuda.grid(1)
    if c < gamma.size:
        params[c, 0] = gamma[c] / math.sqrt(running_var[c] + EPS)
        params[c, 1] = running_mean[c]
        params[c, 2] = float32(0.0)
        params[c, 3] = beta[c]


@bn_infer_op.stage("vectors", """
    in_flight measured 78.9 us (2606 GB/s) against torch's 74.1 on an H200: four 4-byte loads a thread,
    and a block row per plane whose 3136 elements leave the last of its 256-thread rows three-quarters
    idle. Here the tensor is one flat stream of 16-byte vectors (load4/store4), each thread issuing
    four (64 bytes) before its first store, blocks covering 16 KB each whatever the plane size. A
    vector finds its channel with one 32-bit division and reads the channel's (scale, mean, 0, beta)
    as one 16-byte row from L1; a vector that straddles two planes (H*W not a multiple of 4) takes
    the next channel's row for its last elements. It is the normalize kernel of batchnorm[train]'s
    vector_passes: only how the four floats a channel are found differs. On the H200: 56.0 µs at
    128x64x56x56 (86% of the copy rate; torch 74.1, torch.compile 51.7), but behind torch at the
    small layers, 9.3 against 8.7 µs at 32x256x14x14 and 12.7 against 11.1 at 32x128x28x28
    (torch.compile 5.6 and 8.3): 6.4 MB is 3 µs at the copy rate, and the fold's own launch before
    the normalize kernel is likely much of the difference.""")
def batchnorm_infer_vectors(x, gamma, beta, running_mean, running_var, out):
    N, C, H, W = x.shape
    params = scratch("batchnorm_infer.params", (C, 4), np.float32)
    _bn_fold_params[blocks_for(C, THREADS), THREADS](gamma, beta, running_mean, running_var, params)
    _bn_apply(x, params.reshape(4 * C), out, C, H * W)



# -- 5. one launch, each plane chunk a group of lanes ----------------------------------------------------------

CHUNK_THREADS = 256  # a block of the chunk kernels
CHUNK_VECTORS = 4  # 16-byte vectors a thread loads before its first store: 256 x 4 cover a 56x56 plane's 784
CHUNK_BLOCKS_PER_SM = 0  # 0: the grid covers the tensor once; k: k blocks per SM striding over the chunks
HELD = 4 * CHUNK_VECTORS  # floats a thread holds (a local array's shape must be a module constant)
CHUNK_LOAD_HINT = ""  # a cache qualifier on the chunk kernels' 16-byte loads ("": none; ".cs", ".lu": evict first)
CHUNK_STORE_HINT = ""  # and on their stores (".cs": streaming, the L2 evicts the output first)
INDEX32_LIMIT = 2 ** 31  # 32-bit element indices, with room for a chunk's stride past the end
ONE = uint32(1)
THREE = uint32(3)
FOUR = uint32(4)
chunk_load4 = load4_hinted(CHUNK_LOAD_HINT)  # load4 itself unless a hint is asked for
chunk_store4 = store4_hinted(CHUNK_STORE_HINT)


@cuda.jit(device=True, inline=True)
def _vector_span(start, end, k, lane, lanes):
    """Chunk k of the plane x[start:end] (uint32 element indices), taken by `lanes` threads: the plane's
    whole 16-byte vectors run from body (start rounded up to a multiple of 4) to last; chunk k holds
    vectors k * lanes * CHUNK_VECTORS on, and lane l those l, l + lanes, ...: (body, last, this lane's first)."""
    body = min(uint32((start + THREE) // FOUR * FOUR), end)
    last = max(uint32(end // FOUR * FOUR), body)
    return body, last, uint32(body + FOUR * uint32(uint32(k * lanes) * uint32(CHUNK_VECTORS) + lane))


@cuda.jit(device=True, inline=True)
def _load_chunk(x, held, first, last, stride):
    # EXERCISE: write this part of `_load_chunk`. Read the hints one at a time.
    #   hint 1: held[4j .. 4j + 3] = chunk_load4 (load4, or load4 with a cache hint) of the vector at first + j * stride, for each j < CHUNK_VECTORS whose vector lies below last.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit(device=True, inline=True)
def _affine1(v, scale, center, offset, bias):
    return ((v - center) - offset) * scale + bias


@cuda.jit(device=True, inline=True)
def _store_chunk(out, held, first, last, stride, scale, center, offset, bias):
    for j in range(CHUNK_VECTORS):
        i = uint32(first + uint32(j) * stride)
        if i < last:
            chunk_store4(out, uint64(i), _affine1(held[4 * j], scale, center, offset, bias),
                         _affine1(held[4 * j + 1], scale, center, offset, bias),
                         _affine1(held[4 * j + 2], scale, center, offset, bias),
                         _affine1(held[4 * j + 3], scale, center, offset, bias))


@cuda.jit(device=True, inline=True)
def _plane_edges(x, out, start, body, last, end, k, lane, scale, center, offset, bias):
    """The up to 3 elements before body and after last (H*W not a multiple of 4), one each to chunk 0's
    first lanes: a test the whole warp passes alike, never passed when every plane starts on a 16-byte boundary."""
    if k == uint32(0) and lane < THREE:
        if start + lane < body:
            e = uint64(start + lane)
            out[e] = _affine1(x[e], scale, center, offset, bias)
        if last + lane < end:
            e = uint64(last + lane)
            out[e] = _affine1(x[e], scale, center, offset, bias)


@cuda.jit
def _bn_infer_chunks(x, gamma, beta, running_mean, running_var, out, C, HW, lane_bits, chunks, items):
    # A block is CHUNK_THREADS >> lane_bits groups of 2^lane_bits lanes (whole warps), a group a work
    # item at a time: item w is chunk w % chunks of plane w // chunks. Group g of block b takes items
    # b * groups + g, then a grid's worth further on (once, when the grid covers the tensor).
    held = cuda.local.array(HELD, float32)  # registers: every index is known once the loops unroll
    t = uint32(cuda.threadIdx.x)
    lanes = uint32(ONE << uint32(lane_bits))
    lane = uint32(t & (lanes - ONE))
    groups = uint32(uint32(CHUNK_THREADS) >> uint32(lane_bits))
    stride = uint32(FOUR * lanes)  # elements between a lane's vectors: a warp's load4 is one 512-byte run
    hw = uint32(HW)
    w = uint32(uint32(cuda.blockIdx.x) * groups + (t >> uint32(lane_bits)))
    while w < uint32(items):
        plane = uint32(w // uint32(chunks))
        k = uint32(w - plane * uint32(chunks))
        c = plane % uint32(C)
        start = uint32(plane * hw)
        end = uint32(start + hw)
        body, last, first = _vector_span(start, end, k, lane, lanes)
        # EXERCISE: write this part of `_bn_infer_chunks`. Read the hints one at a time.
        #   hint 1 (nudge): in this order: the loads (_load_chunk), the fold of channel c (gamma * rsqrt(var + EPS): libdevice.rsqrtf, every lane alike), _plane_edges, _store_chunk (offset 0).
        #   hint 2 (nearly the answer): a store may alias x, so any store (even an edge element's) placed before the loads would hold them back; the fold's loads from L1 overlap theirs.
        pass  # TODO(exercise): not implemented yet: replace this line with your code
        w = uint32(w + uint32(cuda.gridDim.x) * groups)


def _chunk_grid(N, C, HW):
    """(lane_bits, chunks a plane, work items, blocks). A plane's chunk gets the fewest lanes, a power
    of two from 32 (a warp) to CHUNK_THREADS, whose CHUNK_VECTORS vectors each cover the plane; a plane
    larger than CHUNK_THREADS * CHUNK_VECTORS vectors is several chunks of CHUNK_THREADS lanes."""
    vectors = HW // 4
    lanes = CHUNK_THREADS
    while lanes > 32 and (lanes // 2) * CHUNK_VECTORS >= vectors:
        lanes //= 2
    chunks = max(1, blocks_for(vectors, lanes * CHUNK_VECTORS))  # at least one: H*W < 4 is edges only
    items = N * C * chunks
    blocks = blocks_for(items, CHUNK_THREADS // lanes)
    if CHUNK_BLOCKS_PER_SM:
        blocks = min(blocks, sm_count() * CHUNK_BLOCKS_PER_SM)
    return lanes.bit_length() - 1, chunks, items, blocks


@bn_infer_op.stage("one_launch", """
    vectors still launched twice: a kernel of C threads folded the statistics into (scale, mean, 0,
    beta) rows, and the normalize kernel waited for it to finish before its first load. The fold is a
    few instructions, but a dependent launch costs its start, its chain of loads and its drain on the
    GPU's timeline at every call. Here the fold moves into the normalize kernel, which now needs the
    channel once per chunk of a plane rather than once per vector: a chunk is a group of lanes (whole
    warps) with 4 vectors each, the fewest lanes from 32 to 256 that cover the plane (a 56x56 plane's
    784 vectors: one chunk of 256; 14x14: 32 lanes, eight planes a block), so small planes no longer
    leave most of a block idle. A group finds its plane and channel with one division and each lane
    folds gamma * rsqrt(var + eps) itself, from L1, after issuing its 16-byte loads: no store comes
    before them, not even a plane's edge elements. The square root is the hardware's approximation
    (rsqrt.approx, a few ulps, far inside the tolerance): an IEEE sqrt and division each bring a
    slow-path call, around which the kernel held 54 registers instead of 40, 4 blocks a multiprocessor
    instead of 6. Indices are 32-bit. A plane that does not start on a 16-byte boundary (H*W not a
    multiple of 4) gives its up to three head and tail elements to single loads; a view off a 16-byte
    boundary, or 2^31 elements or more, runs vectors. CHUNK_THREADS, CHUNK_VECTORS, CHUNK_BLOCKS_PER_SM
    (0: the grid covers the tensor once; k: k blocks per multiprocessor striding over the chunks) and
    the cache hints CHUNK_LOAD_HINT / CHUNK_STORE_HINT are the sweep's. On an H200 at 128x64x56x56:
    52.2 us, 92% of the copy ceiling, where vectors took 56.0; torch.compile's pointwise kernel took
    51.4 in the same run (0.98x). Nsight Compute, which runs each kernel alone from a cold cache,
    orders them the other way (48.2 us at 78% of DRAM's peak against torch.compile's 55.2 at 70%):
    what separates them is how they run back to back, not what one launch does.""")
def batchnorm_infer_one_launch(x, gamma, beta, running_mean, running_var, out):
    N, C, H, W = x.shape
    flat_x, flat_out = x.reshape(x.size), out.reshape(out.size)
    if x.size >= INDEX32_LIMIT or not aligned16(flat_x, flat_out):
        batchnorm_infer_vectors.launch(x, gamma, beta, running_mean, running_var, out)
        return
    lane_bits, chunks, items, blocks = _chunk_grid(N, C, H * W)
    _bn_infer_chunks[blocks, CHUNK_THREADS](flat_x, gamma, beta, running_mean, running_var, flat_out, C, H * W,
                                            lane_bits, chunks, items)



# == batchnorm[train], 4. the statistics, then the chunk kernel in reverse ========================================

NORMALIZE_IN_REVERSE = True  # the normalize pass takes the channels the statistics read last first


@cuda.jit
def _bn_apply_chunks(x, params, out, N, C, HW, lane_bits, chunks, items):
    # As _bn_infer_chunks, with the channel's (scale, sample, mean offset, beta) one 16-byte row of
    # params, and the work items in channel order: item w is chunk w % chunks of image (w // chunks) % N
    # of channel w // (N * chunks), counted from the last item when NORMALIZE_IN_REVERSE.
    held = cuda.local.array(HELD, float32)
    t = uint32(cuda.threadIdx.x)
    lanes = uint32(ONE << uint32(lane_bits))
    lane = uint32(t & (lanes - ONE))
    groups = uint32(uint32(CHUNK_THREADS) >> uint32(lane_bits))
    stride = uint32(FOUR * lanes)
    hw = uint32(HW)
    per_channel = uint32(uint32(N) * uint32(chunks))
    w = uint32(uint32(cuda.blockIdx.x) * groups + (t >> uint32(lane_bits)))
    while w < uint32(items):
        # EXERCISE: write this part of `_bn_apply_chunks`. Read the hints one at a time.
        #   hint 1: r = w counted from the last item when NORMALIZE_IN_REVERSE (else w); then c = r // (N * chunks), and the rest of r gives the image n and the chunk k.
        return  # TODO(exercise): not implemented yet: replace this line with your code
        start = uint32((n * uint32(C) + c) * hw)
        end = uint32(start + hw)
        body, last, first = _vector_span(start, end, k, lane, lanes)
        _load_chunk(x, held, first, last, stride)
        p = load4(params, uint64(FOUR * c))
        _plane_edges(x, out, start, body, last, end, k, lane, p[0], p[1], p[2], p[3])
        _store_chunk(out, held, first, last, stride, p[0], p[1], p[2], p[3])
        w = uint32(w + uint32(cuda.gridDim.x) * groups)


@bn_op.stage("reverse_chunks", """
    vector_passes's two passes each read all of x. 103 MB does not fit in the L2, but the last tens
    of MB the statistics read are still there when they end, and the statistics kernel's blocks start
    in channel order, so those are the planes of the last channels. The normalize pass here starts on
    them (channels last to first), so its first reads can hit the L2 instead of memory. It is
    batchnorm[infer]'s one_launch kernel with the channel's four floats from the statistics (one
    16-byte load per chunk, not one per vector, and no index division per vector): groups of lanes
    a chunk of a plane each, their 16-byte loads issued before any store, 32-bit indices. The
    statistics kernel is vector_passes's (STATS_SPLIT blocks per channel, the last to finish folding
    the channel). NORMALIZE_IN_REVERSE = False takes the channels in order, for the comparison;
    CHUNK_STORE_HINT = ".cs" marks the output streaming, so that the L2 evicts it before x. On an
    H200 at 128x64x56x56: 85.9 us against torch.compile's 84.2 in the same run (0.98x). Nsight Compute
    puts the gap in the normalize pass: the statistics with their fused finalize take 30.6 us against
    torch.compile's reduction and finalize, 32.5; but this pass takes 52.4 us at 72% of DRAM's peak
    where torch.compile's pointwise kernel takes 47.4 at 79%, with 8 elements a thread in blocks of 128
    at 32 registers filling 85% of the warp slots, against 60% at this kernel's 40 registers.""")
def batchnorm_reverse_chunks(x, gamma, beta, out):
    N, C, H, W = x.shape
    HW = H * W
    flat_x, flat_out = x.reshape(x.size), out.reshape(out.size)
    if x.size >= INDEX32_LIMIT or not aligned16(flat_x, flat_out):
        batchnorm_vector_passes.launch(x, gamma, beta, out)
        return
    split = max(1, min(STATS_SPLIT, N, N * HW // (4 * THREADS)))  # as vector_passes
    partials = scratch("batchnorm_train.vector_partials", (C, split, 2), np.float32)
    done = scratch("batchnorm_train.done", (C,), np.int32, zeroed=True)
    params = scratch("batchnorm_train.params", (C, 4), np.float32)
    _bn_stats_vectors[(split, C), THREADS](flat_x, gamma, beta, partials, done, params, N, C, HW)
    lane_bits, chunks, items, blocks = _chunk_grid(N, C, HW)
    _bn_apply_chunks[blocks, CHUNK_THREADS](flat_x, params.reshape(4 * C), flat_out, N, C, HW, lane_bits, chunks,
                                            items)


OPERATORS = [bn_op, bn_infer_op]
