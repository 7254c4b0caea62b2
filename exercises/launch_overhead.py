# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/launch_overhead.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade launch_overhead            (or launch_overhead.<stage>)
# The grader checks each stage against the operator in solutions/launch_overhead.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: 86aebdaf723d6f5d47f5d5190e3655d788f6df3df031134f6614ffe877a92920
# --------------------------------------------------------------------------------------------------
"""The cost of calling a kernel from Python, and how to remove it: LayerNorm as three small kernels.

A decoder block at batch 1 is a chain of small kernels (norms, elementwise ops) that each run for a
few microseconds. A numba launch costs about 26 µs of Python on the host (on an H200: finding the
compiled overload for the arguments' types, then flattening every array into the dozen values the
kernel's ABI takes, on every call), so below a few MB of data the GPU waits on Python, not on memory.

The work here is LayerNorm over the rows of a float32 matrix written as eager framework code runs
it: three kernels (row means, row variances, then the normalised output). Every stage computes the
same thing with the same three kernels, except the last; what changes is how they are launched:

1. ``dispatch``: ``kernel[grid, block](args)`` for each kernel, each call.
2. ``configured``: the configured launchers made once per shape. Saves nothing: numba caches them.
3. ``prepared``: the overloads found and the arguments flattened once per set of arguments; a call
   is three ``cuLaunchKernel`` calls (``workbench.prepared.KernelLaunch``).
4. ``graph``: the three launches captured once into a CUDA graph; a call is one ``cuGraphLaunch``.
5. ``fused``: one kernel instead of three (one read of the matrix instead of three), prepared.

What is measured is host time: the harness's ``host_call_us`` (one call and a synchronize) in every
record, and ``workbench.prepared.host_time_per_call`` the time per call of a loop of calls, what a
Python program pays when the kernels are shorter than the launch. GPU time (the staircase) moves only
at the graph (no gaps between the kernels) and at the fusion (a third of the memory traffic).

The prepared and graph stages keep a plan per set of argument objects (``PlanCache``): the first
call with new arrays pays for preparing them, later calls with the same arrays replay. In numba's
simulator there is no driver: those stages launch as ``dispatch`` does, so the simulator checks the
kernels, and the GPU the launch paths.
"""

import math

import numpy as np
from numba import cuda, float32, uint64

from workbench import device, library_peers as peers, prepared
from workbench.ladder import InputError, Operator, blocks_for, expect_device_array, scratch

THREADS = 256  # threads per block; a multiple of the 32-lane warp
WARPS = THREADS // 32  # rows per block in the statistics kernels (a warp per row)
TWO_WARPS = 2 * WARPS  # a shared array's shape must be a constant: a module global, not an expression
FULL_MASK = 0xFFFFFFFF
EPS = np.float32(1e-5)
MAX_GRID_Y = 65535
SHIFT, MEAN, RSTD = 0, 1, 2  # columns of the per-row statistics the three kernels pass along


# -- the operator ----------------------------------------------------------------------------------

def _inputs(size, rng):
    rows, cols = size
    x = (rng.uniform(-2.0, 2.0, (rows, 1)) + rng.uniform(0.5, 2.0, (rows, 1))
         * rng.standard_normal((rows, cols))).astype(np.float32)
    x[::4] += np.float32(1e4)  # a large mean: the kernels shift each row by its first element first
    return x, rng.uniform(0.5, 1.5, cols).astype(np.float32), rng.uniform(-1.0, 1.0, cols).astype(np.float32)


def _adversarial(size, rng):
    """Constant rows (variance 0: the output is exactly the bias) beside rows whose variance is near
    eps (where sqrt(var + eps) and sqrt(var) + eps differ by up to 40%)."""
    rows, cols = size
    x = np.repeat(rng.choice([0.0, -7.0, 1e4], (rows, 1)), cols, axis=1)
    x[1::2] = rng.uniform(-1.0, 1.0, (rows // 2, 1)) + rng.uniform(1e-3, 1e-2) * rng.standard_normal((rows // 2, cols))
    _, weight, bias = _inputs((1, cols), rng)
    return [("constant-and-near-eps-rows", (x.astype(np.float32), weight, bias))]


def _reference(x, weight, bias):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + float(EPS)) * weight.astype(np.float64) + bias.astype(np.float64)


def _validate(x, weight, bias, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    cols = x.shape[1]
    for name, v in (("weight", weight), ("bias", bias)):
        expect_device_array(name, v, dtype=np.float32, ndim=1)
        if v.shape[0] != cols:
            raise InputError(f"{name} must have one entry per column of x ({cols}); got length {v.shape[0]}")
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape))


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None
    F = torch.nn.functional

    def layer_norm(x, w, b, out):
        return F.layer_norm(peers.as_torch(x), (x.shape[1],), peers.as_torch(w), peers.as_torch(b), float(EPS))
    layer_norm.returns_output = True  # torch allocates its result: the bench checks what it returns
    return "torch.nn.functional.layer_norm", layer_norm


def _matrix_passes(reads, writes):
    return lambda size: 4 * size[0] * size[1] * (reads + writes) + 2 * 4 * size[1]


op = Operator(
    name="launch_overhead",
    title="Launch overhead: LayerNorm as three small kernels, launched four ways, then fused",
    reference=_reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=_matrix_passes(1, 1),
    flops=lambda size: 7 * size[0] * size[1],
    validate=_validate,
    tolerance=lambda size, dtype: 1e-3,  # float32 LayerNorm, as layernorm.py (rows of mean 1e4)
    peer=_peer,
    adversarial_inputs=_adversarial,
    check_sizes=[(1, 1024), (300, 33), (4096, 1024)],
    sim_sizes=[(1, 1), (3, 100), (2, 33)],
    bench_sizes=[(1, 1024), (16, 1024), (256, 1024), (4096, 1024), (32768, 1024)],
    headline_size=(4096, 1024),
    rank=390,
    group="Tools of the trade: launch overhead, CUDA graphs, streams",
    record_all_sizes=True,
)


# -- the three kernels every stage but the last launches -----------------------------------------------

@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    """Butterfly sum over the 32 lanes of a warp; every lane ends with the total."""
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit
def _row_means(x, stats):
    """A warp per row: the row's first element (the shift) and the mean of the shifted row."""
    row = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row < x.shape[0]:
        x0 = x[row, 0]
        # EXERCISE: write this part of `_row_means`. Read the hints one at a time.
        #   hint 1 (nudge): each lane sums x[row, j] - x0 over columns lane, lane + 32, ...; then _warp_sum.
        #   hint 2 (nearly the answer): lane 0 stores stats[row, SHIFT] = x0 and stats[row, MEAN] = total / cols.
        pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _row_rstds(x, stats):
    """A warp per row: 1 / sqrt(mean squared deviation + eps), from the first kernel's mean."""
    row = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row < x.shape[0]:
        shift = stats[row, SHIFT]
        mean = stats[row, MEAN]
        squares = float32(0.0)
        for j in range(lane, x.shape[1], 32):
            d = x[row, j] - shift - mean
            squares += d * d
        squares = _warp_sum(squares)
        if lane == 0:
            stats[row, RSTD] = float32(1.0) / math.sqrt(squares / float32(x.shape[1]) + EPS)


@cuda.jit
def _normalize(x, stats, weight, bias, out):
    """Elementwise: threads cover the columns, the grid's y dimension walks the rows."""
    j = cuda.grid(1)
    if j < x.shape[1]:
        for row in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
            out[row, j] = (x[row, j] - stats[row, SHIFT] - stats[row, MEAN]) * stats[row, RSTD] * weight[j] + bias[j]


def _stats(rows):
    """Per-row shift, mean and rstd: workspace the three kernels hand to each other."""
    return scratch("launch_overhead.stats", (rows, 3))


def _geometry(x):
    """(grid, block) of the three kernels for a matrix of x's shape."""
    rows, cols = x.shape
    per_row = (blocks_for(rows, WARPS), THREADS)
    elementwise = ((blocks_for(cols, THREADS), min(rows, MAX_GRID_Y)), THREADS)
    return per_row, per_row, elementwise


# -- 1. dispatch -----------------------------------------------------------------------------------------

@op.stage("dispatch", """
    Three kernels launched as numba code usually launches them, kernel[grid, block](args). Each call,
    numba types every argument to find the compiled overload, then flattens each array into the values
    the kernel takes (a data pointer, the shape, the strides, ...) and calls the driver: about 26 µs of
    Python per launch on an H200, so 80 µs for the three. Below a few MB of data the kernels finish
    sooner than Python can launch the next one: the GPU idles.""",
    bytes_moved=_matrix_passes(3, 1))
def dispatch(x, weight, bias, out):
    stats = _stats(x.shape[0])
    (g1, b1), (g2, b2), (g3, b3) = _geometry(x)
    _row_means[g1, b1](x, stats)
    _row_rstds[g2, b2](x, stats)
    _normalize[g3, b3](x, stats, weight, bias, out)


# -- 2. configured once -------------------------------------------------------------------------------------

_CONFIGURED: dict = {}  # shape -> the three configured launchers


def _configured(x):
    launchers = _CONFIGURED.get(x.shape)
    if launchers is None:
        (g1, b1), (g2, b2), (g3, b3) = _geometry(x)
        launchers = _CONFIGURED[x.shape] = (_row_means[g1, b1], _row_rstds[g2, b2], _normalize[g3, b3])
    return launchers


@op.stage("configured", """
    The configured launchers (kernel[grid, block]) made once per shape and kept, the first thing one
    tries. It saves nothing (25.8 against 25.9 µs a launch): numba already caches configurations, and
    what costs is the per-argument work every call still does, typing each array and flattening it. The
    lesson is where the time is not.""",
    bytes_moved=_matrix_passes(3, 1))
def configured(x, weight, bias, out):
    stats = _stats(x.shape[0])
    means, rstds, normalize = _configured(x)
    means(x, stats)
    rstds(x, stats)
    normalize(x, stats, weight, bias, out)


# -- 3. prepared: arguments flattened once ---------------------------------------------------------------

_PREPARED = prepared.PlanCache()  # a plan per set of argument objects


def _three_launches(x, weight, bias, out):
    stats = _stats(x.shape[0])
    (g1, b1), (g2, b2), (g3, b3) = _geometry(x)
    # Not an exercise: in the simulator this stage launches as the dispatch stage does, so a grader
    # there could not tell a missing plan from a right one.
    return (prepared.KernelLaunch.of(_row_means, g1, b1, (x, stats)),
            prepared.KernelLaunch.of(_row_rstds, g2, b2, (x, stats)),
            prepared.KernelLaunch.of(_normalize, g3, b3, (x, stats, weight, bias, out)))


@op.stage("prepared", """
    Everything but the driver call done once per set of arguments: the overload found, each array
    flattened into the values the kernel's ABI takes, the values packed into the pointer array
    cuLaunchKernel reads. A call then looks its plan up by the arguments' identity and makes three
    cuLaunchKernel calls, a microsecond or two each. The first call with new arrays pays for the
    plan, as a torch CUDA graph pays for its capture; later calls with the same buffers (a model's
    weights and activations) launch at driver speed.""",
    bytes_moved=_matrix_passes(3, 1))
def prepared_launches(x, weight, bias, out):
    if device.is_simulator():  # no driver to prepare against: launch as the dispatch stage does
        return dispatch.launch(x, weight, bias, out)
    for launch in _PREPARED.get((x, weight, bias, out), lambda: _three_launches(x, weight, bias, out)):
        launch()


# -- 4. graph: one launch for the three --------------------------------------------------------------------

_GRAPHS = prepared.PlanCache()


@op.stage("graph", """
    The three prepared launches captured once into a CUDA graph (stream capture), replayed with one
    cuGraphLaunch: one driver call however many kernels the graph holds, and on the GPU the kernels
    follow each other without a launch gap. At batch 1 a whole decoder block of norms and
    elementwise ops costs what one launch did. The graph is tied to its buffers, as the prepared
    launches are: new arrays, a new capture.""",
    bytes_moved=_matrix_passes(3, 1))
def graph(x, weight, bias, out):
    if device.is_simulator():
        return dispatch.launch(x, weight, bias, out)
    _GRAPHS.get((x, weight, bias, out), lambda: prepared.Graph(_three_launches(x, weight, bias, out)))()


# -- 5. fused: one kernel, prepared --------------------------------------------------------------------------

@cuda.jit
def _layernorm_rows(x, weight, bias, out):
    """A block per row: mean, variance and output in three passes over the row, the second and third
    from the L1 cache (a 1024-column row is 4 KB)."""
    reduced = cuda.shared.array(TWO_WARPS, float32)
    row = uint64(cuda.blockIdx.x)
    t = uint64(cuda.threadIdx.x)
    cols = uint64(x.shape[1])
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    x0 = x[row, 0]
    # EXERCISE: write this part of `_layernorm_rows`. Read the hints one at a time.
    #   hint 1 (nudge): pass 1 sums x - x0 (warp sums into reduced[warp], syncthreads, every lane adds the WARPS
    #   hint 2 (nearly the answer): sums); pass 2 the squared deviations into reduced[WARPS + warp]; pass 3 writes the output.
    pass  # TODO(exercise): not implemented yet: replace this line with your code


_FUSED = prepared.PlanCache()


@op.stage("fused", """
    One kernel instead of three: a block per row computes the mean, the variance and the output,
    re-reading its row from the L1 cache, so the matrix is read from memory once instead of three
    times, and there is one launch to pay for instead of three. Launched prepared. Fusion is the
    cure when the kernels are yours to merge; a graph is the cure when they are not (library calls,
    a framework's ops). What this chapter measures is the host's share: at 4096x1024 one call and its
    synchronize took 31 us here against F.layer_norm's 36 on an H200. On the GPU this kernel, the
    plainest fusion (256 threads a row, three passes over the row through L1, no vector loads), takes
    19.8 us against F.layer_norm's 16.8: the fast LayerNorm is chapter 22's by_shape (one read into
    registers, 16-byte loads), at 12.1 us there against F.layer_norm's 19.6 in its run.""")
def fused(x, weight, bias, out):
    if device.is_simulator():
        return _layernorm_rows[x.shape[0], THREADS](x, weight, bias, out)
    _FUSED.get((x, weight, bias, out),
               lambda: prepared.KernelLaunch.of(_layernorm_rows, x.shape[0], THREADS, (x, weight, bias, out)))()


def clear_plans() -> None:
    """Forget every prepared launch and graph (they keep their buffers alive)."""
    for cache in (_PREPARED, _GRAPHS, _FUSED):
        cache.clear()
