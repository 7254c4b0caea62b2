# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/pooling.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade pool2d[max]            (or pool2d[max].<stage>; its other operators: pool2d[mean], pool2d[mean,global])
# The grader checks each stage against the operator in solutions/pooling.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 22730a2165dde75986be342d97c7c52fa3478f787256ca9efd316baba8511b72
# --------------------------------------------------------------------------------------------------
"""Pooling of NCHW float32 images: 2x2 max-pooling with its argmax indices, K x K average pooling, and the
global average of each plane.

* ``pool2d[max]``: the max of each 2x2 window (stride 2) and, for the backward pass, which of the 4 it
  was. The output holds both: ``out[0]`` the values, ``out[1]`` the flat index h * W + w of the max in
  its input plane (as torch's ``return_indices`` gives), stored as float32, exact below 2^24; the check's
  tolerance is 0, so a single wrong index fails. Ties go to the first element in row-major order, and a
  NaN wins (the last NaN of the window), as in torch.
* ``pool2d[mean]``: the mean of each K x K window, stride 2, zero padding (K - 1) // 2 (K = 2: no padding, the
  2x2 downsampling of a U-Net; K = 3: padding 1, ResNet-D's shortcut pooling). Size N x C x H x W x K.
  torch's default ``count_include_pad=True``: the divisor is always K * K, the padded zeros counted,
  so a corner window of a 3x3 pool averages its 4 pixels over 9. Output Ho = (H + 2 pad - K) // 2 + 1.
* ``pool2d[mean,global]``: N x C x H x W -> N x C, the mean of each plane (the layer before a classifier).
  A reduction per plane: 3136 floats at 56x56, 49 at 7x7, so the question is how many threads a plane
  gets and how many loads each keeps in flight.

None of them does enough arithmetic per byte to matter: each reads its input once and writes less, so
the ladders are about reading each byte once, with many loads in flight (several windows a thread,
then 16-byte loads), and filling the GPU. "% of peak" divides by the copy ceiling for the window pools
(a 2x2 max-pool writes half of what it reads, values and indices; a 2x2 average pool a quarter:
bytes_moved counts both) and by the read-only ceiling for the global pool.
"""

import numpy as np
from numba import cuda, float32, uint32, uint64

from solutions._nchw import BENCH_SIZES, CHECK_SIZES, GROUP, HEADLINE, nchw_bytes, nchw_images
from solutions._vector_io import aligned16, load4, store2
from workbench import library_peers as peers
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array
from workbench.targets import against_peer, of_ceiling

THREADS = 256
FULL_MASK = 0xFFFFFFFF


# == pool2d[max] ====================================================================================

def _maxpool_reference(x):
    N, C, H, W = x.shape
    Ho, Wo = H // 2, W // 2
    win = x[:, :, :2 * Ho, :2 * Wo].reshape(N, C, Ho, 2, Wo, 2).transpose(0, 1, 2, 4, 3, 5).reshape(N, C, Ho, Wo, 4)
    nan = np.isnan(win)
    # torch's rule: scan the window in row-major order, take an element if it is greater or NaN.
    which = np.where(nan.any(-1), 3 - np.argmax(nan[..., ::-1], -1), np.argmax(np.where(nan, -np.inf, win), -1))
    values = np.take_along_axis(win, which[..., None], -1)[..., 0]
    rows = 2 * np.arange(Ho)[:, None] + which // 2
    cols = 2 * np.arange(Wo)[None, :] + which % 2
    return np.stack([values.astype(np.float64), (rows * W + cols).astype(np.float64)])


def _maxpool_adversarial(size, rng):
    (x,) = nchw_images(size, rng)
    # Every value negative: a max started from 0 (or an index from a zeroed slot) shows.
    negative = -np.abs(x) - np.float32(1.0)
    # Small integers: most windows hold ties, which must go to the first element in row-major order.
    ties = rng.integers(-1, 2, x.shape).astype(np.float32)
    return [("all-negative", (negative,)), ("ties", (ties,))]


def _maxpool_validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    N, C, H, W = x.shape
    if H < 2 or W < 2:
        raise InputError(f"a 2x2 max-pool needs planes of at least 2x2, got {H}x{W}")
    expect_device_array("out", out, dtype=np.float32, shape=(2, N, C, H // 2, W // 2))


def _maxpool_peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, out):
        o = peers.as_torch(out)
        values, indices = torch.nn.functional.max_pool2d(peers.as_torch(x), 2, return_indices=True)
        o[0].copy_(values)
        o[1].copy_(indices)  # int64 -> float32: a small extra kernel torch's own layout does not need

    return "torch.max_pool2d(return_indices)", run


def _maxpool_expression(torch, size):
    """The operator's output whole (values, then the indices as float32), for torch.compile: where the
    eager peer copies values and indices into out, Inductor can write both from its pooling kernel."""
    def pool(x):
        values, indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
        return torch.stack((values, indices.to(torch.float32)))
    return pool


maxpool_op = Operator(
    name="pool2d", variant={"combine": "max"},
    targets=[against_peer(1.0), of_ceiling(85, "copy_gbps")],
    title="2x2 max-pooling (stride 2) with the argmax indices training needs, NCHW float32",
    reference=_maxpool_reference,
    make_inputs=nchw_images,
    make_output=lambda size: np.empty((2, size[0], size[1], size[2] // 2, size[3] // 2), np.float32),
    # Read the input once, write the values and the indices.
    bytes_moved=lambda size: nchw_bytes(size) + 2 * 4 * size[0] * size[1] * (size[2] // 2) * (size[3] // 2),
    flops=lambda size: 0,
    validate=_maxpool_validate,
    tolerance=lambda size, dtype: 0.0,  # a max is exact, and so must every index be
    peer=_maxpool_peer,
    torch_expression=_maxpool_expression,
    adversarial_inputs=_maxpool_adversarial,
    size_names=("N", "C", "H", "W"),
    sim_sizes=[(1, 1, 2, 2), (2, 3, 6, 5), (1, 2, 7, 8), (1, 2, 7, 9)],  # the middle (quick) one: W % 4 == 0, the vectors path
    check_sizes=[(1, 1, 2, 3)] + CHECK_SIZES[1:],  # a 2x2 pool needs a 2x2 plane: the smallest, with an odd column
    bench_sizes=BENCH_SIZES,
    headline_size=HEADLINE,
    rank=331,
    group=GROUP,
    record_all_sizes=True,
)


# -- 1. a thread per output ------------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _take(v, h, w, W, best, best_at):
    """torch's rule: a later element wins if it is greater, or NaN."""
    if v > best or v != v:
        return v, h * W + w
    return best, best_at


@cuda.jit
def _maxpool_naive(x, out):
    i = cuda.grid(1)
    N, C, H, W = x.shape
    Ho = out.shape[3]
    Wo = out.shape[4]
    if i < N * C * Ho * Wo:
        wo = i % Wo
        ho = i // Wo % Ho
        c = i // (Wo * Ho) % C
        n = i // (Wo * Ho * C)
        # EXERCISE: write this part of `_maxpool_naive`. Read the hints one at a time.
        #   hint 1 (nudge): start from the window's first element (2 ho, 2 wo) and its index; visit the other three in row-major order with _take.
        #   hint 2 (nearly the answer): out[0, n, c, ho, wo] = the max, out[1, n, c, ho, wo] = its flat index h * W + w, as a float32.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@maxpool_op.stage("naive", """
    One thread per output window: four loads (two neighbouring pairs in two rows), three comparisons
    with torch's rule (greater, or NaN), and two stores, the max and its index. The loads are
    coalesced (a warp reads two 256-byte row segments) but each thread has only four in flight, and
    every index goes through four divisions and numba's signed, wrap-checked indexing.""")
def maxpool_naive(x, out):
    N, C, H, W = x.shape
    _maxpool_naive[blocks_for(N * C * (H // 2) * (W // 2), THREADS), THREADS](x, out)


# -- 2. more windows in flight per thread -------------------------------------------------------------------

WINDOWS = 4  # windows per thread, one grid-width apart, all loaded before any is compared


@cuda.jit(device=True, inline=True)
def _take_at(v, at, best, best_at):
    """_take with the element's offset in its plane already known."""
    if v > best or v != v:
        return v, at
    return best, best_at


@cuda.jit
def _maxpool_in_flight(x, out, N, C, H, W):
    # x, out: flat views. Window i is (plane, ho, wo); its values go to out[i], its index to out[total + i].
    Ho = H // 2
    Wo = W // 2
    total = N * C * Ho * Wo
    step = cuda.gridsize(1)
    first = cuda.grid(1)
    v = cuda.local.array((WINDOWS, 4), float32)
    within = cuda.local.array(WINDOWS, uint32)  # each window's first element within its plane: h * W + w
    # EXERCISE: write this part of `_maxpool_in_flight`. Read the hints one at a time.
    #   hint 1 (nudge): two loops over the WINDOWS windows i = first + k * step: the first divides i once, keeps the window's offset within its plane and issues all 4 * WINDOWS loads (unsigned addresses); the second compares and stores.
    #   hint 2 (nearly the answer): window i: plane = i // (Ho Wo), ho, wo from the rest; its first element is at plane * H * W + 2 ho * W + 2 wo.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@maxpool_op.stage("in_flight", """
    Each thread takes 4 windows one grid-width apart and issues all 16 of their loads before the first
    comparison, so 16 loads per thread are in flight instead of 4 (what kept the memory-bound ladders
    of softmax and LayerNorm from the copy rate, NOTES.md); neighbouring threads still read
    neighbouring windows, so every load stays coalesced. A window's position is divided out once (the
    naive kernel's four divisions per window are what its threads spend most instructions on) and kept
    as its offset in the plane, which is also the index to store; addresses are unsigned, which drops
    numba's negative-index checks.""")
def maxpool_in_flight(x, out):
    N, C, H, W = x.shape
    total = N * C * (H // 2) * (W // 2)
    threads = blocks_for(total, WINDOWS)
    _maxpool_in_flight[blocks_for(threads, THREADS), THREADS](x.reshape(x.size), out.reshape(out.size),
                                                                N, C, H, W)


# -- 3. two windows per 16-byte load ---------------------------------------------------------------------------

GROUPS = 4  # groups of two windows per thread, THREADS apart, all loaded before any is compared


@cuda.jit
def _maxpool_vectors(x, out, N, C, H, W):
    # x, out: flat views; W is a multiple of 4, so every row starts on a 16-byte boundary. Group g is
    # windows 2g and 2g + 1 (two neighbours in one output row): input columns 4wq .. 4wq + 3 of rows
    # 2ho and 2ho + 1, one load4 each.
    Ho = uint32(H // 2)
    Wq = uint32(W // 4)  # groups per output row
    groups = uint32(N * C) * Ho * Wq
    total = uint64(2) * uint64(groups)  # windows: where the indices start in out
    first = uint32(cuda.blockIdx.x) * uint32(GROUPS * THREADS) + uint32(cuda.threadIdx.x)
    top = cuda.local.array((GROUPS, 4), float32)
    bottom = cuda.local.array((GROUPS, 4), float32)
    within = cuda.local.array(GROUPS, uint32)  # the group's first element within its plane: 2 ho W + 4 wq
    # EXERCISE: write this part of `_maxpool_vectors`. Read the hints one at a time.
    #   hint 1 (nudge): first loop: for each of the GROUPS groups g = first + k THREADS, divide g into (plane, ho, wq) once, keep within = 2 ho W + 4 wq, and load4 the two rows (all 2 GROUPS loads before any comparison).
    #   hint 2 (nearly the answer): second loop: window 2g is top[0], top[1], bottom[0], bottom[1] in torch's order (_take_at), window 2g + 1 the other two columns; values to out[2g], out[2g + 1], indices to out[total + 2g], ...
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@maxpool_op.stage("vectors", """
    in_flight measured 62 us on an H200 at 128x64x56x56 (2490 GB/s, 59% of copy): each window still
    costs four 4-byte loads and three index divisions. When W is a multiple of 4 every input row
    starts on a 16-byte boundary, so two neighbouring windows are two 16-byte loads (four columns of
    two rows): a quarter of the load instructions, and the position (plane, row, column group) is
    divided out once per two windows, in 32-bit arithmetic. A thread takes 4 such groups, THREADS
    apart (a warp's loads are 512 contiguous bytes), all 8 loads issued before the first comparison.
    Other widths, and a view off a 16-byte boundary, run the in_flight kernel.""")
def maxpool_vectors(x, out):
    N, C, H, W = x.shape
    flat_x = x.reshape(x.size)
    flat_out = out.reshape(out.size)
    if W % 4 != 0 or x.size >= 2 ** 32 or not aligned16(flat_x):
        total = N * C * (H // 2) * (W // 2)
        _maxpool_in_flight[blocks_for(blocks_for(total, WINDOWS), THREADS), THREADS](flat_x, flat_out, N, C, H, W)
        return
    groups = N * C * (H // 2) * (W // 4)
    _maxpool_vectors[blocks_for(groups, GROUPS * THREADS), THREADS](flat_x, flat_out, N, C, H, W)


# == pool2d[mean] =====================================================================================

def pooled_hw(H, W, K):
    pad = (K - 1) // 2
    return (H + 2 * pad - K) // 2 + 1, (W + 2 * pad - K) // 2 + 1


def _avg_reference(x, window):
    K = int(window[0])
    N, C, H, W = x.shape
    pad = (K - 1) // 2
    Ho, Wo = pooled_hw(H, W, K)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    total = np.zeros((N, C, Ho, Wo))
    for r in range(K):
        for s in range(K):
            total += xp[:, :, r:r + 2 * Ho - 1:2, s:s + 2 * Wo - 1:2]
    return total / (K * K)  # count_include_pad: the padded zeros count


def _avg_inputs(size, rng):
    # K travels as a one-element int32 array the kernels read (as conv2d[general]'s geometry): the
    # reference sees only the inputs, and a launcher never copies anything to the host.
    return nchw_images(size, rng) + (np.array([size[4]], np.int32),)


def _avg_output(size):
    N, C, H, W, K = size
    return np.empty((N, C) + pooled_hw(H, W, K), np.float32)


def _avg_adversarial(size, rng):
    x, window = _avg_inputs(size, rng)
    # A constant image: inside, every output is the constant; along a padded border of the 3x3 pool it
    # is less (the zeros count), which a divisor of "pixels on the image" gets wrong. Large values on
    # top of it: a sum of 9 values near 1e4 keeps 3 fewer bits than the values, still far within
    # float32's 24.
    return [("constant-image", (np.ones_like(x), window)),
            ("offset-1e4", ((x + np.float32(1e4)).astype(np.float32), window))]


def _avg_validate(x, window, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("window", window, dtype=np.int32, shape=(1,))
    N, C, H, W = x.shape
    if H < 2 or W < 2:
        raise InputError(f"a 2x2 or 3x3 pool (stride 2) needs planes of at least 2x2, got {H}x{W}")
    expect_device_array("out", out, dtype=np.float32, ndim=4)
    if tuple(out.shape[:2]) != (N, C):
        raise InputError(f"out must be {N} x {C} x Ho x Wo, got {tuple(out.shape)}")
    Ho, Wo = out.shape[2], out.shape[3]
    if (Ho, Wo) not in (pooled_hw(H, W, 2), pooled_hw(H, W, 3)):
        raise InputError(f"out's planes are {Ho}x{Wo}: not what a 2x2 or 3x3 pool (stride 2) of {H}x{W} gives")


def _avg_peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    K = size[4]

    def run(x, window, out):
        return torch.nn.functional.avg_pool2d(peers.as_torch(x), K, stride=2, padding=(K - 1) // 2)

    run.returns_output = True
    return "torch.avg_pool2d", run


def _avg_expression(torch, size):
    K = size[4]
    return lambda x, window: torch.nn.functional.avg_pool2d(x, K, stride=2, padding=(K - 1) // 2)


def _avg_bytes(size):
    N, C, H, W, K = size
    if K not in (2, 3):  # the window reaches the kernels as a device value: the size is where K is refused
        raise InputError(f"pool2d[mean]'s window K is 2 or 3 (a 2x2 or 3x3 pool); got K={K}")
    Ho, Wo = pooled_hw(H, W, K)
    return 4 * N * C * (H * W + Ho * Wo)


# The middle (quick) simulator size takes the vectors path with K = 3 and an odd H; the last with K = 2.
AVG_SIM = [(1, 2, 4, 5, 2), (1, 3, 7, 9, 3), (1, 2, 9, 8, 3), (2, 2, 7, 12, 2)]
AVG_CHECK = [(1, 1, 2, 3, 2), (1, 1, 2, 2, 3), (2, 3, 17, 19, 3), (2, 3, 17, 19, 2), (3, 5, 17, 20, 2),
             (3, 5, 17, 20, 3), (4, 64, 28, 28, 3), (32, 64, 56, 56, 2)]
AVG_BENCH = [(32, 64, 56, 56, 2), (32, 64, 56, 56, 3), (128, 64, 56, 56, 3), (128, 64, 56, 56, 2)]

avg_op = Operator(
    name="pool2d", variant={"combine": "mean"},
    targets=[against_peer(1.0), of_ceiling(85, "copy_gbps")],
    title="Average pooling, K x K window (K = 2 or 3), stride 2, padding (K - 1) // 2, count_include_pad (NCHW float32)",
    reference=_avg_reference,
    make_inputs=_avg_inputs,
    make_output=_avg_output,
    bytes_moved=_avg_bytes,
    flops=lambda size: size[4] * size[4] * size[0] * size[1] * pooled_hw(size[2], size[3], size[4])[0]
    * pooled_hw(size[2], size[3], size[4])[1],
    validate=_avg_validate,
    peer=_avg_peer,
    torch_expression=_avg_expression,
    adversarial_inputs=_avg_adversarial,
    size_names=("N", "C", "H", "W", "K"),
    sim_sizes=AVG_SIM,
    check_sizes=AVG_CHECK,
    bench_sizes=AVG_BENCH,
    headline_size=(128, 64, 56, 56, 2),
    rank=331.2,
    group=GROUP,
    record_all_sizes=True,
)


# -- 1. a thread per output ---------------------------------------------------------------------------

@cuda.jit
def _avg_naive(x, window, out):
    i = cuda.grid(1)
    N, C, H, W = x.shape
    Ho = out.shape[2]
    Wo = out.shape[3]
    if i < out.size:
        K = window[0]
        pad = (K - 1) // 2
        wo = i % Wo
        ho = i // Wo % Ho
        c = i // (Wo * Ho) % C
        n = i // (Wo * Ho * C)
        # EXERCISE: write this part of `_avg_naive`. Read the hints one at a time.
        #   hint 1 (nudge): the window's rows are 2 ho - pad .. 2 ho - pad + K - 1 (columns likewise); add the taps that lie on the image.
        #   hint 2 (nearly the answer): count_include_pad: divide by K * K however many taps were on the image.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@avg_op.stage("naive", """
    One thread per output: it reads K, divides its index into (n, c, ho, wo), and adds the K x K taps
    that lie on the image, each behind a bounds test, then divides by K * K (torch's default
    count_include_pad: the padding counts as zeros). Coalesced (neighbouring threads read
    neighbouring pairs of columns) but each thread keeps one load in flight at a time, behind four
    64-bit index divisions and numba's signed, wrap-checked indexing.""")
def avgpool_naive(x, window, out):
    _avg_naive[blocks_for(out.size, THREADS), THREADS](x, window, out)


# -- 2. every tap of several windows in flight ---------------------------------------------------------------

# WINDOWS windows per thread, one grid-width apart, as in pool2d[max]'s in_flight stage

@cuda.jit
def _avg_in_flight(x, window, out, N, C, H, W, Ho, Wo):
    # x, out: flat views. Window i is (plane, ho, wo) = out[i]. Every tap of a 3x3 window (those off
    # the image, or beyond K, read as zero) is loaded before any is added.
    K = uint32(window[0])
    pad = (K - uint32(1)) // uint32(2)
    total = uint32(N * C * Ho * Wo)
    step = uint32(cuda.gridsize(1))
    first = uint32(cuda.grid(1))
    taps = cuda.local.array((WINDOWS, 9), float32)
    # EXERCISE: write this part of `_avg_in_flight`. Read the hints one at a time.
    #   hint 1 (nudge): for each of the WINDOWS windows i = first + k * step: divide i once into (plane, ho, wo), then load its 9 taps (r, s < 3) into taps[k], a zero where r >= K, s >= K or the tap is off the image.
    #   hint 2 (nearly the answer): unsigned arithmetic: h = 2 ho + r - pad is "off the image" when it wrapped below zero, which is h >= H for a uint32. Then sum each window's taps and store total / (K K).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@avg_op.stage("in_flight", """
    Each thread takes 4 windows one grid-width apart and issues all their taps' loads (up to 36) before
    the first addition, so a thread keeps many requests in flight instead of one (the lesson of
    pool2d[max]'s in_flight). A window's position is divided out once, in 32-bit unsigned arithmetic
    (the launcher keeps the output under 2^32 windows), and a tap's row and column are counted in the
    padded image, so they never go negative: unsigned throughout, no signed tests. The tap
    loops run over a 3x3 window whatever K (a 2x2 pool reads its missing taps as zeros without a
    load), so they unroll and the taps stay in registers.""")
def avgpool_in_flight(x, window, out):
    N, C, H, W = x.shape
    if out.size >= 2 ** 32:
        raise InputError(f"pool2d[mean].in_flight counts windows in 32 bits: {out.size} outputs is too many")
    Ho, Wo = out.shape[2], out.shape[3]
    threads = blocks_for(out.size, WINDOWS)
    _avg_in_flight[blocks_for(threads, THREADS), THREADS](x.reshape(x.size), window, out.reshape(out.size),
                                                          N, C, H, W, Ho, Wo)


# -- 3. two windows per 16-byte load, divisions by a multiply --------------------------------------------------

AVG_GROUPS = 2  # groups of two windows per thread, THREADS apart, all loaded before any is added


def fast_divisor(d: int) -> tuple[int, int]:
    """(m, p) with n // d == (n * m) >> p for every 0 <= n < 2^31: p = 31 + ceil(log2 d), m = ceil(2^p / d),
    which fits in 32 bits. The error of m / 2^p against 1 / d is below 1 / 2^31, too small to carry any
    n < 2^31 across a multiple of d (the trick compilers use for a constant divisor; CUTLASS's FastDivmod
    for one known only when the kernel is launched)."""
    p = 31 + (d - 1).bit_length()
    return -(-(1 << p) // d), p


@cuda.jit(device=True, inline=True)
def _divide(n, m, p):
    """n // d for the divisor d of fast_divisor(d) == (m, p): one 32 x 32 -> 64-bit multiply and a shift."""
    return uint32((uint64(n) * uint64(m)) >> uint64(p))


@cuda.jit
def _avg_vectors(x, window, out, H, W, Ho, groups, by_Wq, by_Ho):
    # x, out: flat views; W is a multiple of 4, so every input row starts on a 16-byte boundary and
    # Wo = W / 2. Group g is windows 2q and 2q + 1 of one output row (g = row * W / 4 + q, so its outputs
    # are out[2g] and out[2g + 1]): input columns 4q .. 4q + 3 of each of the window's rows, one load4 a
    # row, and for K = 3 also column 4q - 1, the previous group's last (one 4-byte load, an L1 hit).
    # by_Wq, by_Ho: fast_divisor(W / 4), fast_divisor(Ho), as (m, p) pairs.
    K = uint32(window[0])
    pad = (K - uint32(1)) // uint32(2)
    first = uint32(cuda.blockIdx.x) * uint32(AVG_GROUPS * THREADS) + uint32(cuda.threadIdx.x)
    quad = cuda.local.array((AVG_GROUPS, 3, 4), float32)  # columns 4q .. 4q + 3 of the window's rows
    left = cuda.local.array((AVG_GROUPS, 3), float32)  # column 4q - 1 (K = 3)
    # EXERCISE: write this part of `_avg_vectors`. Read the hints one at a time.
    #   hint 1 (nudge): first loop: for each of the AVG_GROUPS groups g = first + k THREADS, split g into (plane, ho, q) with _divide (row = g // (W / 4), plane = row // Ho) instead of //; for each of 3 padded rows h = 2 ho + r, load4 columns 4q .. 4q + 3 of image row h - pad where the row is in the window (r < K) and on the image (pad <= h < H + pad), zeros elsewhere; with K = 3 and q > 0 also column 4q - 1 into left.
    #   hint 2 (nearly the answer): second loop: window 2q adds columns 4q, 4q + 1 (and, K = 3, 4q - 1) of each row, window 2q + 1 columns 4q + 2, 4q + 3 (and, K = 3, 4q + 1); store the two sums times 1 / (K K) at out[2g], out[2g + 1] with one store2.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@avg_op.stage("vectors", """
    in_flight reaches 44% of copy at 128x64x56x56x2: per window it issues up to nine 4-byte loads and
    splits its index with 32-bit divisions (a GPU has no divide instruction: each is a ~20-instruction
    sequence), so instructions, not DRAM, are the limit. When W is a multiple of 4, every input row
    starts on a 16-byte boundary and two neighbouring windows are one load4 a window row (columns 4q ..
    4q + 3; a 3x3 window also needs column 4q - 1, the previous group's last, a 4-byte load that hits
    L1). A group's position is split by multiplying with a reciprocal computed on the host
    (fast_divisor: n // d == (n m) >> p, exact for every n below 2^31) and the sum is multiplied by
    1 / (K K), not divided. Registers decide the rest: four groups a thread with divisions held 86
    registers (a third of the SM's threads resident) and ran at 0.85x torch.compile; two groups with
    multiplies hold 50, and a group's two outputs leave in one 8-byte store (store2). On an H200 at
    128x64x56x56: 32.2 us, 93% of copy, level with torch.compile's Triton kernel at 2x2 (32.2 us:
    scalar loads, two outputs a thread, most of them L1 hits) and 1.37x faster than it at 3x3. Other
    widths fall back to the in_flight kernel.""")
def avgpool_vectors(x, window, out):
    N, C, H, W = x.shape
    if out.size >= 2 ** 32:
        raise InputError(f"pool2d[mean].vectors counts windows in 32 bits: {out.size} outputs is too many")
    Ho, Wo = out.shape[2], out.shape[3]
    flat_x = x.reshape(x.size)
    flat_out = out.reshape(out.size)
    if W % 4 != 0 or x.size >= 2 ** 32 or not aligned16(flat_x, flat_out):
        _avg_in_flight[blocks_for(blocks_for(out.size, WINDOWS), THREADS), THREADS](flat_x, window, flat_out,
                                                                                    N, C, H, W, Ho, Wo)
        return
    groups = N * C * Ho * (W // 4)  # below 2^31: out.size = 2 groups is below 2^32
    _avg_vectors[blocks_for(groups, AVG_GROUPS * THREADS), THREADS](
        flat_x, window, flat_out, H, W, Ho, groups, fast_divisor(W // 4), fast_divisor(Ho))


# == pool2d[mean,global] ================================================================================

def _gap_reference(x):
    return x.astype(np.float64).mean(axis=(2, 3))


def _gap_adversarial(size, rng):
    (x,) = nchw_images(size, rng)
    # Planes around 1e4 with a spread of 1: a float32 running sum of a whole plane loses the spread's
    # low bits (at 3136 elements the total is 3e7, where a float32 step is 2); partial sums per lane do
    # not. A NaN in one plane must make that plane's mean NaN and leave the others alone.
    offset = (x + np.float32(1e4)).astype(np.float32)
    nan = x.copy()
    nan[0, 0, -1, -1] = np.nan
    return [("offset-1e4", (offset,)), ("one-nan", (nan,))]


def _gap_validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=4)
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape[:2]))


def _gap_peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def run(x, out):
        return torch.mean(peers.as_torch(x), dim=(2, 3))

    run.returns_output = True
    return "torch.mean(dim=(2, 3))", run


GAP_CHECK = [(1, 1, 1, 1), (2, 3, 17, 19), (32, 512, 7, 7), (32, 64, 56, 56)]
GAP_BENCH = [(32, 2048, 7, 7), (32, 64, 56, 56), (128, 512, 7, 7), (128, 64, 56, 56)]

gap_op = Operator(
    name="pool2d", variant={"combine": "mean", "window": "global"},
    targets=[against_peer(1.0), of_ceiling(85, "copy_gbps")],
    title="Global average pooling: the mean of each plane, N x C x H x W -> N x C (NCHW float32)",
    reference=_gap_reference,
    make_inputs=nchw_images,
    make_output=lambda size: np.empty(size[:2], np.float32),
    bytes_moved=lambda size: 4 * int(np.prod(size)) + 4 * size[0] * size[1],
    flops=lambda size: int(np.prod(size)),
    validate=_gap_validate,
    pattern="read",
    peer=_gap_peer,
    torch_expression=lambda torch, size: lambda x: torch.mean(x, dim=(2, 3)),
    adversarial_inputs=_gap_adversarial,
    size_names=("N", "C", "H", "W"),
    sim_sizes=[(1, 2, 3, 5), (2, 3, 9, 11), (1, 3, 33, 35)],
    check_sizes=GAP_CHECK,
    bench_sizes=GAP_BENCH,
    headline_size=(128, 64, 56, 56),
    rank=331.3,
    group=GROUP,
    record_all_sizes=True,
)


# -- 1. a thread per plane -----------------------------------------------------------------------------

@cuda.jit
def _gap_thread_per_plane(x, out, HW):
    p = cuda.grid(1)
    if p < out.size:
        # EXERCISE: write this part of `_gap_thread_per_plane`. Read the hints one at a time.
        #   hint 1: plane p is x[p * HW .. (p + 1) * HW - 1] of the flat view: sum it, divide by HW.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@gap_op.stage("thread_per_plane", """
    The obvious parallelisation: a thread per (image, channel) plane sums it in a loop. At
    128x64x56x56 that is 8192 threads, a sixteenth of what the GPU holds, and neighbouring threads
    read addresses a plane (12.5 KB) apart, so every warp-wide load touches 32 different lines and
    uses 4 bytes of each 32-byte sector. One float32 running sum over 3136 values also rounds more
    than partial sums do.""")
def gap_thread_per_plane(x, out):
    N, C, H, W = x.shape
    _gap_thread_per_plane[blocks_for(N * C, THREADS), THREADS](x.reshape(x.size), out.reshape(out.size), H * W)


# -- 2. a warp per plane --------------------------------------------------------------------------------

WARPS_PER_BLOCK = THREADS // 32


@cuda.jit(device=True, inline=True)
def _warp_sum(v):
    for offset in (16, 8, 4, 2, 1):
        v += cuda.shfl_down_sync(FULL_MASK, v, offset)
    return v


@cuda.jit
def _gap_warp_per_plane(x, out, HW):
    p = cuda.grid(1) // 32
    lane = cuda.threadIdx.x % 32
    if p < out.size:  # the same for the whole warp: every lane takes part in the shuffles
        # EXERCISE: write this part of `_gap_warp_per_plane`. Read the hints one at a time.
        #   hint 1 (nudge): lane l sums elements l, l + 32, ... of plane p (neighbouring lanes, neighbouring floats: one coalesced line per load).
        #   hint 2 (nearly the answer): then add the 32 lanes' sums with shfl_down_sync (16, 8, 4, 2, 1); lane 0 stores the mean.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@gap_op.stage("warp_per_plane", """
    A warp per plane: lane l adds elements l, l + 32, ..., so each warp-wide load is 128 contiguous
    bytes, and the 32 lanes' partial sums meet in five shuffles. 32 times the threads of the thread
    per plane stage, every sector fully used, and each lane's sum holds a 32nd of the plane (less
    rounding). Still one 4-byte load in flight per lane at a time: the loop carries its sum.""")
def gap_warp_per_plane(x, out):
    N, C, H, W = x.shape
    _gap_warp_per_plane[blocks_for(N * C, WARPS_PER_BLOCK), THREADS](x.reshape(x.size), out.reshape(out.size),
                                                                    H * W)


# -- 3. 16-byte loads, four in flight ---------------------------------------------------------------------

@cuda.jit
def _gap_vectors(x, out, HW):
    p = cuda.grid(1) // 32
    lane = uint64(cuda.threadIdx.x % 32)
    if p < out.size:
        four = uint64(4)
        zero = float32(0.0)
        start = uint64(p) * uint64(HW)
        end = start + uint64(HW)
        body = min(start + (four - start % four) % four, end)  # the plane's first 16-byte boundary
        last = max(end - end % four, body)  # the end of its whole vectors
        step1 = uint64(4 * 32)  # one warp-wide load4 covers 128 floats
        step2 = step1 + step1
        step3 = step2 + step1
        step4 = step3 + step1
        # EXERCISE: write this part of `_gap_vectors`. Read the hints one at a time.
        #   hint 1 (nudge): up to 3 head elements (before the first multiple of 4) and 3 tail ones go to single loads by lanes 0-2; the rest is whole vectors.
        #   hint 2 (nearly the answer): lane l's vectors start at body + 4 l, 128 floats apart: load four (those past `last` as zeros) before adding any, then step by 4 * 128.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@gap_op.stage("vectors", """
    The same warp per plane with 16-byte loads (load4): a plane's floats from its first 16-byte
    boundary are read as vectors, four per lane issued before the first addition (64 bytes in
    flight per lane instead of 4), and the up to three unaligned floats at each end of the plane by
    single loads. Vectors past the plane's end read as zeros without a load, so a 7x7 plane (49
    floats: 12 vectors) takes one step. A view not on a 16-byte boundary falls back to the warp per
    plane kernel.""")
def gap_vectors(x, out):
    N, C, H, W = x.shape
    flat = x.reshape(x.size)
    blocks = blocks_for(N * C, WARPS_PER_BLOCK)
    if not aligned16(flat):
        _gap_warp_per_plane[blocks, THREADS](flat, out.reshape(out.size), H * W)
        return
    _gap_vectors[blocks, THREADS](flat, out.reshape(out.size), H * W)


OPERATORS = [maxpool_op, avg_op, gap_op]
