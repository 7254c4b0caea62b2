"""BatchNorm folded into the convolution before it: the deployment trick, on a ResNet unit.

A trained network's inference pass runs conv -> BatchNorm -> ReLU, and BatchNorm there is a fixed
affine map per output channel k: y = (conv - mean_k) * s_k + beta_k with s_k = gamma_k / sqrt(var_k +
eps). A convolution is linear in its weights, so the map moves into them:

    w'[k] = w[k] * s_k        b'[k] = beta_k - mean_k * s_k        y = conv(x, w') + b'

and the unit becomes one convolution with a bias and a ReLU, which the convolution ladder's fused
epilogue (solutions/conv.py, conv2d[bias_relu].fused_epilogue) applies on the accumulators before
their one store. What the fold removes is two passes over the output (BatchNorm's and ReLU's read and
write); what it changes is rounding: conv(x, w * s) rounds each product of the scaled weights, and
beta - mean * s is computed once in float32, where the unfolded BatchNorm subtracts the mean from
each output first. The check's relative error of each stage shows the difference.

Why conv + BN + ReLU and not conv + BN alone: the conv ladder's public bias epilogue is bias + ReLU
(conv2d[bias_relu]), and conv -> BN -> ReLU is the unit a deployed ResNet is made of. Size
N x C x H x W x K (3x3 filters, stride 1, padding 1). Inputs x (N, C, H, W), w (K, C, 3, 3) and the
BatchNorm's gamma, beta, running_mean, running_var (K,), all float32.

This module imports two ladders (conv's implicit GEMM and fused epilogue, batchnorm's inference kernel), so it has
no exercise: the grader refuses answer-key modules, and a learner's conv would have to come first.
"""

import math

import numpy as np
from numba import cuda, float32

from solutions import batchnorm, conv
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch

THREADS = 256
EPS = batchnorm.EPS  # BatchNorm's eps, float32 1e-5, as the batchnorm ladders use
EPS32 = float(np.finfo(np.float32).eps)


def _inputs(size, rng):
    N, C, H, W, K = size
    x = rng.uniform(-1.0, 1.0, (N, C, H, W)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (K, C, 3, 3)).astype(np.float32)
    # Each output is a sum of 9 C products of uniform(-1, 1) draws: variance C (away from the border).
    # Running statistics like a trained model's: a mean a fraction of that spread, a variance near it.
    spread = math.sqrt(C)
    gamma = rng.uniform(0.5, 1.5, K).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, K).astype(np.float32)
    mean = (rng.uniform(-0.3, 0.3, K) * spread).astype(np.float32)
    var = (rng.uniform(0.5, 2.0, K) * spread * spread).astype(np.float32)
    return x, w, gamma, beta, mean, var


def _reference(x, w, gamma, beta, mean, var):
    N, C, H, W = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((N, w.shape[0], H, W))
    for r in range(3):
        for s in range(3):
            y += np.einsum("kc,nchw->nkhw", w[:, :, r, s].astype(np.float64), xp[:, :, r:r + H, s:s + W])
    k = (slice(None), None, None)
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + float(EPS))
    y = (y - mean[k]) * scale[k] + beta[k]
    return np.where(np.isnan(y), y, np.maximum(y, 0.0))


def tiny_variance_inputs(size, rng):
    """The operator's adversarial set (the quick tier checks it on the last stage only; tests/test_batchnorm.py
    checks both stages on it in the slow tier)."""
    inputs = list(_inputs(size, rng))
    # A channel of tiny variance: its scale is ~100x the others', so w' spans a wider range and the
    # folded bias beta - mean * s is a difference of two large numbers (the fold's rounding, magnified).
    var = inputs[5].copy()
    var[0] = np.float32(1e-4) * var[0]
    inputs[5] = var
    return tuple(inputs)


def _validate(x, w, gamma, beta, mean, var, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("w", w, dtype=np.float32, ndim=4)
    K, C = w.shape[0], x.shape[1]
    if tuple(w.shape) != (K, C, 3, 3):
        raise InputError(f"w must be K x {C} x 3 x 3 (3x3 filters over the input's C = {C}), got {tuple(w.shape)}")
    for name, a in (("gamma", gamma), ("beta", beta), ("running_mean", mean), ("running_var", var)):
        expect_device_array(name, a, dtype=np.float32, shape=(K,))
    N, _, H, W = x.shape
    expect_device_array("out", out, dtype=np.float32, shape=(N, K, H, W))


def _tolerance(size, dtype):
    # conv's: a 9C-term float32 dot product's rounding grows like sqrt(9C) ulps; BatchNorm scales each
    # output by about 1/spread and the fold rounds the weights once more: twice conv's bound.
    C = size[1]
    return max(2e-5, 8 * EPS32 * math.sqrt(9 * C))


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, w, gamma, beta, mean, var, out):
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            F = torch.nn.functional
            y = F.conv2d(peers.as_torch(x), peers.as_torch(w), padding=1)
            y = F.batch_norm(y, peers.as_torch(mean), peers.as_torch(var), peers.as_torch(gamma),
                             peers.as_torch(beta), training=False, eps=float(EPS))
            return torch.relu(y)
        finally:
            torch.backends.cudnn.allow_tf32 = saved

    run.returns_output = True
    return "torch conv2d + batch_norm + relu (cuDNN fp32)", run


def _expression(torch, size):
    eps = float(EPS)

    def unit(x, w, gamma, beta, mean, var):
        F = torch.nn.functional
        return torch.relu(F.batch_norm(F.conv2d(x, w, padding=1), mean, var, gamma, beta, training=False, eps=eps))

    return unit


def _conv_bytes(size):
    N, C, H, W, K = size
    return 4 * (N * C * H * W + K * C * 9 + N * K * H * W)


op = Operator(
    name="conv2d", variant={"fusion": "bn_folded"},
    title="3x3 convolution -> BatchNorm (inference) -> ReLU, the BatchNorm folded into the weights (NCHW float32)",
    reference=_reference,
    make_inputs=_inputs,
    adversarial_inputs=lambda size, rng: [("tiny-variance", tiny_variance_inputs(size, rng))],
    make_output=lambda size: np.empty((size[0], size[4], size[2], size[3]), np.float32),
    bytes_moved=lambda size: _conv_bytes(size) + 16 * size[4],
    flops=lambda size: 2 * size[0] * size[4] * size[2] * size[3] * size[1] * 9,
    validate=_validate,
    tolerance=_tolerance,
    peer=_peer,
    torch_expression=_expression,
    bound="compute",
    size_names=("N", "C", "H", "W", "K"),
    # One block of the implicit GEMM (K <= 64, N H W <= 128) keeps the simulator quick, as conv's.
    sim_sizes=[(1, 2, 3, 4, 3), (1, 2, 7, 9, 5), (1, 3, 5, 6, 65)],
    check_sizes=[(1, 1, 1, 1, 1), (2, 3, 7, 9, 5), (3, 17, 15, 13, 70), (32, 64, 56, 56, 64)],
    bench_sizes=[(32, 64, 56, 56, 64), (32, 256, 14, 14, 256)],
    headline_size=(32, 64, 56, 56, 64),
    rank=323,
    group="Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
    record_all_sizes=True,
)


# -- 1. the layers one after another -------------------------------------------------------------------

@cuda.jit
def _relu_in_place(y):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        v = y[i]
        if v < float32(0.0):  # NaN stays NaN, as torch.relu
            y[i] = float32(0.0)


@op.stage("conv_then_bn", """
    The graph as trained, one layer at a time: the convolution ladder's implicit GEMM writes the
    convolution, batchnorm[infer]'s vectors stage normalizes it in place (a read and a write of the
    output at 16 bytes a load), and a ReLU kernel reads it a third time and writes it again. The
    convolution is compute-bound; the two passes after it are pure memory traffic, 4 N K H W bytes
    each way per pass.""")
def conv_then_bn(x, w, gamma, beta, mean, var, out):
    conv.implicit_gemm(x, w, out)
    batchnorm.batchnorm_infer_vectors(out, gamma, beta, mean, var, out)
    N, K, H, W = out.shape
    flat = out.reshape(out.size)
    _relu_in_place[min(blocks_for(out.size, 4 * THREADS), 4096), THREADS](flat)


# -- 2. BatchNorm folded into the weights and a bias ---------------------------------------------------------

@cuda.jit
def _fold_into_weights(w, gamma, beta, mean, var, w_folded, bias):
    # Thread j of the K x (C 9) weights: w'[k, j] = w[k, j] * s_k; thread (k, 0) also writes b'[k].
    j = cuda.grid(1)
    K = bias.size
    taps = w.size // K
    if j < w.size:
        k = j // taps
        # HINT: s_k = gamma[k] / sqrt(var[k] + EPS) scales every weight of filter k.
        # HINT: the bias takes the rest of the map: beta[k] - mean[k] * s_k, written once per filter.
        # BEGIN SOLUTION
        s = gamma[k] / math.sqrt(var[k] + EPS)
        w_folded[j] = w[j] * s
        if j % taps == 0:
            bias[k] = beta[k] - mean[k] * s
        # END SOLUTION


def _folded(w, gamma, beta, mean, var):
    """(w', b'): the filters scaled and the bias, in scratch buffers (one launch)."""
    K = w.shape[0]
    w_folded = scratch("conv_bn_folded.w", tuple(w.shape), np.float32)
    bias = scratch("conv_bn_folded.bias", (K,), np.float32)
    _fold_into_weights[blocks_for(w.size, THREADS), THREADS](w.reshape(w.size), gamma, beta, mean, var,
                                                             w_folded.reshape(w.size), bias)
    return w_folded, bias


@op.stage("folded_weights", """
    The BatchNorm leaves the graph: a tiny kernel scales each filter by its channel's gamma /
    sqrt(var + eps) and turns the rest of the affine map into a bias, beta - mean * scale (a deployed
    model does this once, offline; here it runs each call and costs a launch over K C 9 floats). Then
    one convolution with a bias and ReLU: the conv ladder's fused epilogue, the same implicit GEMM
    main loop as stage 1, with the bias and ReLU applied to the accumulators before their store. The
    two passes over the output are gone. The rounding differs: the scaled weights are rounded once
    more, and the bias is a difference computed once in float32, which a channel of tiny variance
    magnifies (tests/test_batchnorm.py checks one).""")
def folded_weights(x, w, gamma, beta, mean, var, out):
    w_folded, bias = _folded(w, gamma, beta, mean, var)
    conv.fused_epilogue(x, w_folded, bias, out)


@op.stage("async_epilogue", """
    Stage 2 with conv2d[bias_relu]'s async_epilogue in place of its fused_epilogue: the same fold into
    scratch filters and a bias, then conv2d's fastest main loop (async_gather: the reduction walked taps
    outermost, every tile copied by cp.async through a multi-stage pipeline) with the bias and ReLU
    applied to the accumulators on their way out. That loop wants its filters reordered, wt[tap, c, k],
    so the folded filters go through async_gather's reorder kernel: two small launches before the
    convolution (fold, reorder) where stage 2 had one; a deployed model would store its filters folded
    and reordered once. The change is the main loop alone: the epilogue is stage 2's, and the
    fold's rounding is unchanged (the same folded floats, summed in another order). On an H200 at
    32x64x56x56x64: 203.2 us, against 287.8 for torch's cuDNN convolution, batch_norm and relu in the
    same run (1.42x; torch.compile 351.3).""")
def async_epilogue(x, w, gamma, beta, mean, var, out):
    w_folded, bias = _folded(w, gamma, beta, mean, var)
    conv.async_fused(x, w_folded, bias, None, out)


OPERATORS = [op]
