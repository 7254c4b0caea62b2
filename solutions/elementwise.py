"""y = GELU(x + bias) + residual on a float32 matrix, in six steps from three kernels to one pass at memory speed.

The epilogue of a transformer layer: add a bias to every row, apply the exact (erf) GELU, add the
residual. Per element it reads x and residual and writes y (12 bytes; bias is one row, read once and
then cached) and does a few dozen arithmetic instructions, so a good kernel is bound by memory
bandwidth. The ladder's questions: how many bytes does the chain of operations really move (fusion),
do neighbouring threads touch neighbouring addresses (coalescing), are enough loads in flight to keep
memory busy (instruction-level parallelism), and how many instructions does finding each element
cost (a remainder per element, a sign test per index)? At 2^28 elements the last two matter as much
as the first two: with GELU's erf already costing ~25 instructions per element, index arithmetic is
what keeps a numba kernel from streaming at full bandwidth.
"""

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from workbench.ladder import Operator, blocks_for, expect_device_array, scratch, sm_count, stage_of
from workbench import library_peers as peers
from workbench.targets import of_ceiling

from solutions._half import (
    FLOAT16, FORMATS, ILP, SIXTEEN, SIXTEEN_BIT_STORY, a_matrix, as_float64, bits16, expect_rows, expect_vectors,
    flat_bits16, half_operator, pack, per_format, short_name, torch_peer, words)
# gelu(v) = 0.5 v (1 + erf(v / sqrt 2)) in float32, a device function (math.erf: libdevice's erff); the reference
# is the same chain in float64. Both live in solutions/_references.py, with the row ladders' references.
from solutions._references import gelu, gelu_bias_residual64, gelu_bias_residual_inputs
from solutions._vector_io import aligned16, load4, store4

# The fp16/bf16 variants' part of the lesson, the same for softmax, the norms and GELU, is told once in
# solutions/_half.py.
__doc__ += SIXTEEN_BIT_STORY

THREADS = 256  # threads per block in the 1-D stages; a multiple of the 32-lane warp
BLOCK_2D = (16, 16)  # threads per block in the 2-D stages (x, y)
MAX_GRID_Y = 65535  # the CUDA limit on blocks in a grid's y dimension
ELEMENTS_PER_THREAD = 16  # stage 3 sizes its grid so that each thread handles about this many
LOADS_PER_THREAD = 4  # independent elements each thread keeps in flight per iteration (stage 4; 8 in stage 5)


# -- the operator ----------------------------------------------------------------------------------

def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    rows, cols = size
    sign = np.where(rng.random((rows, cols)) < 0.5, np.float32(-1.0), np.float32(1.0))
    bias = rng.uniform(-1.0, 1.0, cols).astype(np.float32)
    residual = rng.uniform(0.25, 1.25, (rows, cols)).astype(np.float32)
    # GELU's tails, far past the random draws: exactly x + bias on the right, -0 on the left (the
    # output is then the residual). A GELU written with exp(v) (a sigmoid e^v / (1 + e^v)) is
    # inf / inf = NaN there.
    tails = (sign * rng.uniform(10.0, 1e4, (rows, cols))).astype(np.float32)
    # Near float32's largest value: 0.5 * v * (1 + erf(..)) is v, but v * (1 + erf(..)) formed first
    # is 2 v, which overflows to inf.
    huge = (sign * rng.uniform(1e38, 3e38, (rows, cols))).astype(np.float32)
    return [("saturated-tails", (tails, bias, residual)), ("near-float32-max", (huge, bias, residual))]


def _validate(x, bias, residual, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    rows, cols = x.shape
    expect_device_array("bias", bias, dtype=np.float32, shape=(cols,))
    expect_device_array("residual", residual, dtype=np.float32, shape=(rows, cols))
    expect_device_array("out", out, dtype=np.float32, shape=(rows, cols))


def _bytes_moved(size):
    rows, cols = size
    return 4 * (3 * rows * cols + cols)  # x, residual read once, y written once; bias read once


def _unfused_bytes(size):
    rows, cols = size
    n = rows * cols
    # bias add: read x, write t; GELU: read t, write g; residual add: read g and residual, write y.
    return 4 * (2 * n + cols) + 4 * (2 * n) + 4 * (3 * n)


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        gelu = torch.nn.functional.gelu  # approximate="none": the erf GELU

        def run(x, bias, residual, out):
            torch.add(gelu(peers.as_torch(x) + peers.as_torch(bias)), peers.as_torch(residual),
                      out=peers.as_torch(out))

        return "torch (gelu(x + bias) + residual)", run
    cupy = peers.cupy()
    if cupy is not None:
        import cupyx.scipy.special as special

        def run(x, bias, residual, out):
            v = peers.as_cupy(x) + peers.as_cupy(bias)
            cupy.add(v * (0.5 * (1.0 + special.erf(v * np.float32(np.sqrt(0.5))))), peers.as_cupy(residual),
                     out=peers.as_cupy(out))

        return "cupy (erf GELU, unfused)", run
    return None


def _torch_expression(torch, size):
    """The eager peer's expression on tensors, for torch.compile: Inductor fuses the three operations
    into one kernel, as stage 2 does by hand."""
    return lambda x, bias, residual: torch.nn.functional.gelu(x + bias) + residual


op = Operator(
    name="elementwise",
    targets=[of_ceiling(85, "copy_gbps")],
    title="GELU(x + bias) + residual, float32",
    reference=gelu_bias_residual64,  # GELU(x + bias) + residual in float64, with its own erf (numpy has none)
    make_inputs=gelu_bias_residual_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=_bytes_moved,
    pattern="read2_write1",  # x and residual read, y written: the two-reads-one-write ceiling
    flops=lambda size: 8 * size[0] * size[1],  # bias add, GELU (about six flops besides erf), residual add
    validate=_validate,
    peer=_peer,
    torch_expression=_torch_expression,
    adversarial_inputs=_adversarial,
    check_sizes=[(1, 1), (1, 37), (37, 1), (1, 2**21 + 3), (1_000_003, 1), (33, 65), (1000, 4097),
                 (4097, 1000), (16384, 16384)],
    sim_sizes=[(1, 1), (1, 37), (37, 1), (33, 65), (70, 45), (9, 36)],  # (9, 36): rows of whole 16-byte vectors
    bench_sizes=[(32, 32), (128, 128), (512, 512), (1024, 1024), (2048, 2048), (4096, 4096),
                 (8192, 8192), (16384, 16384)],
    headline_size=(16384, 16384),
    rank=20,
    group="Elementwise + fusion: GELU(x + bias) + residual",
    record_all_sizes=True,
)


def _launch_2d(kernel, rows, cols, *args):
    """Launch ``kernel`` over a (rows, cols) grid of threads, x along rows and y along columns.
    The y dimension holds at most 65535 blocks, so very wide matrices take several launches, each
    told the first column it covers."""
    columns_per_launch = MAX_GRID_Y * BLOCK_2D[1]
    for col0 in range(0, cols, columns_per_launch):
        width = min(columns_per_launch, cols - col0)
        grid = (blocks_for(rows, BLOCK_2D[0]), blocks_for(width, BLOCK_2D[1]))
        kernel[grid, BLOCK_2D](*args, col0)


def _flat(a):
    """The same buffer seen as a 1-D array (a view, no copy): one index walks the whole matrix."""
    if not hasattr(a, "is_c_contiguous"):  # a torch / CuPy tensor: look at it through numba
        a = cuda.as_cuda_array(a)
    return a.reshape(a.size)


# -- 1. unfused: three kernels ---------------------------------------------------------------------

@cuda.jit
def _add_bias(x, bias, t, col0):
    # HINT: one thread per element: cuda.grid(2) gives this thread's two indices.
    # HINT: t[row, col] = x[row, col] + bias[col], guarded against threads beyond the matrix.
    # BEGIN SOLUTION
    row, col = cuda.grid(2)
    col += col0
    if row < x.shape[0] and col < x.shape[1]:
        t[row, col] = x[row, col] + bias[col]
    # END SOLUTION


@cuda.jit
def _gelu(t, g, col0):
    # HINT: the same mapping as the bias kernel; apply the gelu device function.
    # BEGIN SOLUTION
    row, col = cuda.grid(2)
    col += col0
    if row < t.shape[0] and col < t.shape[1]:
        g[row, col] = gelu(t[row, col])
    # END SOLUTION


@cuda.jit
def _add_residual(g, residual, out, col0):
    # HINT: the same mapping again: out = g + residual.
    # BEGIN SOLUTION
    row, col = cuda.grid(2)
    col += col0
    if row < g.shape[0] and col < g.shape[1]:
        out[row, col] = g[row, col] + residual[row, col]
    # END SOLUTION


@op.stage("unfused", """
    Three kernels, one per operation, as a chain of library calls would run them: add the bias,
    apply GELU, add the residual, each one thread per element with row, col = cuda.grid(2), the way
    NumPy indexes a matrix. The intermediates go through global memory: the first kernel writes
    x + bias, the second reads it back and writes GELU of it, the third reads that back. 28 bytes
    move per element where 12 would do, and each of the three launches waits for the one before.""",
    bytes_moved=_unfused_bytes)
def unfused(x, bias, residual, out):
    rows, cols = x.shape
    t = scratch("elementwise.unfused.biased", (rows, cols))
    g = scratch("elementwise.unfused.activated", (rows, cols))
    _launch_2d(_add_bias, rows, cols, x, bias, t)
    _launch_2d(_gelu, rows, cols, t, g)
    _launch_2d(_add_residual, rows, cols, g, residual, out)


# -- 2. fused, same mapping ------------------------------------------------------------------------

@cuda.jit
def _fused_2d(x, bias, residual, out, col0):
    # HINT: do all three operations for your element in one thread: no intermediate leaves registers.
    # HINT: out[row, col] = gelu(x[row, col] + bias[col]) + residual[row, col]
    # BEGIN SOLUTION
    row, col = cuda.grid(2)
    col += col0
    if row < x.shape[0] and col < x.shape[1]:
        out[row, col] = gelu(x[row, col] + bias[col]) + residual[row, col]
    # END SOLUTION


@op.stage("fused", """
    The three kernels become one: each thread reads its x and residual, adds, applies GELU and adds in
    registers, and writes y once. Traffic drops from 28 to the minimum 12 bytes per element and two
    launches disappear. The thread mapping is unchanged, and it is the next problem: cuda.grid(2)
    returns (x, y) and x is the index that moves fastest across a warp, so the 32 threads of a warp
    hold 16 different rows: each load instruction touches 16 rows, a whole row (64 KiB at 16384
    columns) apart, where one 128-byte line would do.""")
def fused(x, bias, residual, out):
    rows, cols = x.shape
    _launch_2d(_fused_2d, rows, cols, x, bias, residual, out)


# -- 3. coalesced: a flat grid-stride loop ---------------------------------------------------------

@cuda.jit
def _coalesced(x, bias, residual, out):
    # HINT: x, residual and out are 1-D views here: walk them with a grid-stride loop.
    # HINT: neighbouring threads take neighbouring elements; element i lies in column i % cols.
    # BEGIN SOLUTION
    cols = bias.size
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = gelu(x[i] + bias[i % cols]) + residual[i]
    # END SOLUTION


def _grid(n, elements_per_thread):
    """Enough blocks of THREADS for each thread to handle about ``elements_per_thread`` elements."""
    return blocks_for(n, THREADS * elements_per_thread)


@op.stage("coalesced", """
    The matrix is contiguous, so it can be walked as one flat vector: thread i takes element i, then
    i + gridsize, and so on. At every step the 32 threads of a warp read 32 neighbouring floats, one
    128-byte line of x and one of residual, and write one line of y: each memory transaction carries
    only bytes that are used. The bias column is i % cols, one integer remainder per element.""")
def coalesced(x, bias, residual, out):
    n = x.shape[0] * x.shape[1]
    _coalesced[_grid(n, ELEMENTS_PER_THREAD), THREADS](_flat(x), bias, _flat(residual), _flat(out))


# -- 4. four elements in flight, no division ---------------------------------------------------------

@cuda.jit(device=True, inline=True)
def _wrap(col, cols):
    """col + step for a step < cols lands below 2 cols: one compare brings it back into range."""
    return col - cols if col >= cols else col


@cuda.jit
def _ilp(x, bias, residual, out):
    n = x.size
    cols = bias.size
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    # HINT: four elements a stride apart per iteration, and no remainder inside the loop.
    # HINT: col = i % cols and step = stride % cols once; next column = _wrap(col + step, cols).
    # HINT: a load cannot move above an earlier store (out might alias x): issue all twelve loads first.
    # BEGIN SOLUTION
    col = i % cols
    step = stride % cols
    while i + 3 * stride < n:
        c1 = _wrap(col + step, cols)
        c2 = _wrap(c1 + step, cols)
        c3 = _wrap(c2 + step, cols)
        x0 = x[i]
        x1 = x[i + stride]
        x2 = x[i + 2 * stride]
        x3 = x[i + 3 * stride]
        r0 = residual[i]
        r1 = residual[i + stride]
        r2 = residual[i + 2 * stride]
        r3 = residual[i + 3 * stride]
        b0 = bias[col]
        b1 = bias[c1]
        b2 = bias[c2]
        b3 = bias[c3]
        out[i] = gelu(x0 + b0) + r0
        out[i + stride] = gelu(x1 + b1) + r1
        out[i + 2 * stride] = gelu(x2 + b2) + r2
        out[i + 3 * stride] = gelu(x3 + b3) + r3
        col = _wrap(c3 + step, cols)
        i += 4 * stride
    while i < n:  # the tail: fewer than four strides left
        out[i] = gelu(x[i] + bias[col]) + residual[i]
        col = _wrap(col + step, cols)
        i += stride
    # END SOLUTION


def _machine_grid(n, elements_per_thread, blocks_per_sm):
    """A grid sized to the machine: ``blocks_per_sm`` blocks per multiprocessor, never more than it
    takes to give each thread ``elements_per_thread`` elements."""
    return min(_grid(n, elements_per_thread), sm_count() * blocks_per_sm)


@op.stage("ilp", """
    Each thread now loads four elements of x, residual and bias, a grid stride apart, before it computes
    any of them, so each thread has eight streaming loads in flight instead of two. On its own that
    bought nothing (measured on an H200: within 1% of the coalesced stage), because the kernel was busy
    with arithmetic: every element paid a 64-bit integer remainder, i % cols, dozens of instructions. So the remainder goes too:
    each thread computes its first column and the column step (stride % cols) once, and every later
    column is the previous one plus the step, wrapped back by one compare. The grid is sized to the
    machine, 32 blocks per multiprocessor (the fastest of those tried for this kernel on an H200).""")
def ilp(x, bias, residual, out):
    n = x.shape[0] * x.shape[1]
    _ilp[_machine_grid(n, LOADS_PER_THREAD, 32), THREADS](_flat(x), bias, _flat(residual), _flat(out))


# -- 5. eight in flight, unsigned indices ---------------------------------------------------------

@cuda.jit
def _ilp8_unsigned(x, bias, residual, out):
    # Unsigned from the start, and only unsigned with unsigned: numba types uint64 combined with an int64
    # (a bare literal such as 2 included) as int64, and the sign test would be back.
    n = uint64(x.size)
    cols = uint64(bias.size)
    stride = uint64(cuda.gridsize(1))
    i = uint64(cuda.grid(1))
    # HINT: the ilp kernel, eight elements per iteration, with every index a uint64.
    # HINT: build the offsets by adding strides (s2 = stride + stride, ...): 2 * stride is a signed int64.
    # BEGIN SOLUTION
    col = i % cols
    step = stride % cols
    s2 = stride + stride
    s3 = s2 + stride
    s4 = s2 + s2
    s5 = s4 + stride
    s6 = s4 + s2
    s7 = s4 + s3
    s8 = s4 + s4
    while i + s7 < n:
        c1 = _wrap(col + step, cols)
        c2 = _wrap(c1 + step, cols)
        c3 = _wrap(c2 + step, cols)
        c4 = _wrap(c3 + step, cols)
        c5 = _wrap(c4 + step, cols)
        c6 = _wrap(c5 + step, cols)
        c7 = _wrap(c6 + step, cols)
        x0 = x[i]
        x1 = x[i + stride]
        x2 = x[i + s2]
        x3 = x[i + s3]
        x4 = x[i + s4]
        x5 = x[i + s5]
        x6 = x[i + s6]
        x7 = x[i + s7]
        r0 = residual[i]
        r1 = residual[i + stride]
        r2 = residual[i + s2]
        r3 = residual[i + s3]
        r4 = residual[i + s4]
        r5 = residual[i + s5]
        r6 = residual[i + s6]
        r7 = residual[i + s7]
        b0 = bias[col]
        b1 = bias[c1]
        b2 = bias[c2]
        b3 = bias[c3]
        b4 = bias[c4]
        b5 = bias[c5]
        b6 = bias[c6]
        b7 = bias[c7]
        out[i] = gelu(x0 + b0) + r0
        out[i + stride] = gelu(x1 + b1) + r1
        out[i + s2] = gelu(x2 + b2) + r2
        out[i + s3] = gelu(x3 + b3) + r3
        out[i + s4] = gelu(x4 + b4) + r4
        out[i + s5] = gelu(x5 + b5) + r5
        out[i + s6] = gelu(x6 + b6) + r6
        out[i + s7] = gelu(x7 + b7) + r7
        col = _wrap(c7 + step, cols)
        i += s8
    while i < n:
        out[i] = gelu(x[i] + bias[col]) + residual[i]
        col = _wrap(col + step, cols)
        i += stride
    # END SOLUTION


@op.stage("ilp8_unsigned", """
    Two costs that hide in numba's index arithmetic. A signed index may be negative, and numba honours
    Python's a[-1], so every access with an int64 index first tests the sign and adds the length:
    three extra instructions per load and store, on four accesses per element. Made uint64 (and kept
    away from int64: uint64 + int64, even 2 * stride, is an int64 again), the indices skip it. The freed
    issue slots go to eight elements in flight per thread instead of four: sixteen streaming loads
    outstanding per thread. That takes about 55 registers (ptxas -v), so four blocks fit on a
    multiprocessor where six did at 40: fewer threads, each with twice the loads in flight, and
    memory busier than before (latency hidden by parallelism within a thread rather than by more
    threads). The grid is 8 blocks per multiprocessor (the fastest of those tried on an H200), and
    the kernel moves its 12 bytes per element at over 90% of copy bandwidth.""")
def ilp8_unsigned(x, bias, residual, out):
    n = x.shape[0] * x.shape[1]
    _ilp8_unsigned[_machine_grid(n, 2 * LOADS_PER_THREAD, 8), THREADS](
        _flat(x), bias, _flat(residual), _flat(out))


# -- 6. vector_tiles: a thread per 16-byte vector ---------------------------------------------------------

VECTOR_TILE_THREADS = 128  # a block: 128 vectors of x and residual, 2 KB of each


@cuda.jit
def _vector_tiles(x, bias, residual, out):
    n = uint64(x.size)
    cols = uint64(bias.size)
    i = uint64(4) * uint64(cuda.grid(1))  # this thread's vector: elements i .. i + 3
    # HINT: The launcher guarantees that a row's length is a multiple of 4 and that the arrays start on 16-byte boundaries, so every vector is whole and lies within one row.
    # HINT: if i < n: two load4 (x and residual at i), the bias of columns c .. c + 3 with c = i % cols, one store4 of gelu(x + bias) + residual.
    # BEGIN SOLUTION
    if i < n:
        c = i % cols
        x0, x1, x2, x3 = load4(x, i)
        r0, r1, r2, r3 = load4(residual, i)
        store4(out, i, gelu(x0 + bias[c]) + r0, gelu(x1 + bias[c + uint64(1)]) + r1,
               gelu(x2 + bias[c + uint64(2)]) + r2, gelu(x3 + bias[c + uint64(3)]) + r3)
    # END SOLUTION


@op.stage("vector_tiles", """
    The activations ladder's finding, applied to the chain: a thread per 16-byte vector (one load4 of x,
    one of the residual, one store4), 128-thread blocks, the grid covering the matrix once, and the bias
    read by element (four neighbouring columns, from L1). Fewer loads in flight a thread than
    ilp8_unsigned's sixteen, and faster. On an H200 this kernel ran at torch.compile's fused Triton
    kernel's speed, about 10% ahead of ilp8_unsigned; two or four vectors a thread were slower. A matrix
    whose rows are not a multiple of 4 floats, or a view that does not start on a 16-byte boundary,
    takes the ilp8_unsigned kernel.""")
def vector_tiles(x, bias, residual, out):
    n = x.shape[0] * x.shape[1]
    xf, rf, of = _flat(x), _flat(residual), _flat(out)
    if bias.size % 4 or not aligned16(xf, rf, of):
        _ilp8_unsigned[_machine_grid(n, 2 * LOADS_PER_THREAD, 8), THREADS](xf, bias, rf, of)
        return
    _vector_tiles[blocks_for(-(-n // 4), VECTOR_TILE_THREADS), VECTOR_TILE_THREADS](xf, bias, rf, of)


# ======================================================================================================
# elementwise[fp16] and elementwise[bf16]: GELU(x + bias) + residual on 16-bit matrices, float32 inside
# ======================================================================================================
# Each launcher serves both formats (stage_of); each kernel is written once, a template compiled per format
# by solutions/_half.py's per_format, and the launcher picks template.kernels[x.dtype].

def _gelu_inputs(dtype):
    def make(size, rng):
        return tuple(a.astype(dtype) for a in gelu_bias_residual_inputs(size, rng))
    return make


def _gelu_adversarial(dtype):
    big = 3.0e4 if dtype == FLOAT16 else 1.0e30  # x + bias + residual stays inside the format
    # Subnormal x (below 6.1e-5 in fp16, 1.2e-38 in bf16) on a small normal bias: x moves x + bias by
    # several roundings of the output, so a kernel that flushes subnormals to zero is caught, while the
    # output itself stays normal (a subnormal output would carry fewer bits than the tolerance assumes).
    small, bias = (3.0e-6, 1.0e-3) if dtype == FLOAT16 else (1.1e-38, 2.0e-37)

    def cases(size, rng):
        rows, cols = size
        large = (rng.uniform(-big, big, size), rng.uniform(-big / 30, big / 30, cols), rng.uniform(0, big / 30, size))
        subnormal = (rng.uniform(-small, small, size), np.full(cols, bias), np.zeros(size))
        return [(label, tuple(a.astype(np.float32).astype(dtype) for a in arrays)) for label, arrays in
                [("large values", large), ("subnormal x, small bias", subnormal)]]
    return cases


def _gelu_peer(torch, x, bias, residual, out):
    gelu = torch.nn.functional.gelu  # approximate="none": the erf GELU
    torch.add(gelu(peers.as_torch(x) + peers.as_torch(bias)), peers.as_torch(residual), out=peers.as_torch(out))


def _gelu_op(dtype, rank):
    def validate(x, bias, residual, out):
        expect_rows(dtype, ("x", x), ("residual", residual), ("out", out))
        expect_vectors(dtype, x, ("bias", bias))

    return half_operator(
        dtype,
        name="elementwise", variant={"dtype": short_name(dtype)},
        title=f"GELU(x + bias) + residual on {a_matrix(dtype)}, float32 inside",
        reference=lambda x, bias, residual: gelu_bias_residual64(*as_float64(x, bias, residual)),
        make_inputs=_gelu_inputs(dtype),
        bytes_moved=lambda size: dtype.itemsize * (3 * size[0] * size[1] + size[1]),
        pattern="read2_write1",  # x and residual read, out written: the two-reads-one-write ceiling
        flops=lambda size: 8 * size[0] * size[1],
        validate=validate,
        peer=torch_peer(f"torch (gelu(x + bias) + residual, {short_name(dtype)})", _gelu_peer),
        # Eager torch rounds x + bias and the GELU to the half format between its three kernels;
        # Inductor fuses them and, by default, keeps the intermediates in float32, as the stages do.
        torch_expression=lambda torch, size: lambda x, bias, residual: (
            torch.nn.functional.gelu(x + bias) + residual),
        rank=rank,
        adversarial_inputs=_gelu_adversarial(dtype),
        check_sizes=[(1, 1), (1, 37), (37, 1), (1, 2**21 + 3), (33, 65), (1001, 4097), (16384, 16384)],
        sim_sizes=[(1, 1), (2, 5), (3, 37), (9, 65), (65, 67)],  # the last: full unrolled steps
        bench_sizes=[(1024, 1024), (4096, 4096), (8192, 8192), (16384, 16384)],
        headline_size=(16384, 16384),
    )


HALF_OPERATORS = [_gelu_op(dtype, 230 + i) for i, dtype in enumerate(FORMATS)]
GELU_BLOCKS_PER_SM = 8  # the float32 ladder's best grid for its eight-in-flight kernel


def gelu_grid(items):
    """Blocks for a grid-stride loop over ``items``: enough for ILP items a thread, at most 8 blocks per
    multiprocessor (the float32 ladder's best for eight loads in flight)."""
    return max(1, min(-(-items // (THREADS * ILP)), sm_count() * GELU_BLOCKS_PER_SM))


# -- 1. widened: the float32 kernel on halves -------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def gelu_widened_flat(x, bias, residual, out, widen, narrow):
    xs = cuda.local.array(ILP, float32)
    rs = cuda.local.array(ILP, float32)
    bs = cuda.local.array(ILP, float32)
    n = uint64(x.size)
    cols = uint64(bias.size)
    stride = uint64(cuda.gridsize(1))
    i = uint64(cuda.grid(1))
    # HINT: elementwise's ilp8_unsigned loop over the flat arrays: eight elements a stride apart, their
    # HINT: column walked with _wrap(col + step, cols); every 16-bit load widened, the result narrowed.
    # BEGIN SOLUTION
    col = i % cols
    step = stride % cols
    span = stride * uint64(ILP)
    while i + span - stride < n:
        c = col
        for u in range(ILP):
            k = i + uint64(u) * stride
            xs[u] = widen(uint32(x[k]))
            rs[u] = widen(uint32(residual[k]))
            bs[u] = widen(uint32(bias[c]))
            c = _wrap(c + step, cols)
        for u in range(ILP):
            out[i + uint64(u) * stride] = uint16(narrow(gelu(xs[u] + bs[u]) + rs[u]))
        col = c
        i += span
    while i < n:
        out[i] = uint16(narrow(gelu(widen(uint32(x[i])) + widen(uint32(bias[col]))) + widen(uint32(residual[i]))))
        col = _wrap(col + step, cols)
        i += stride
    # END SOLUTION


@per_format
def _gelu_widened(x, bias, residual, out):
    gelu_widened_flat(x, bias, residual, out, widen, narrow)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "widened", """
    elementwise's last float32 kernel with 16-bit loads and stores: the matrix walked flat, eight
    elements a grid stride apart per thread, unsigned indices, each column one compare from the
    last. x, bias and residual are widened as they are loaded, x + bias, the erf GELU and the
    residual add are float32, and the sum is rounded to 16 bits once: 6 bytes an element instead of
    12. torch computes the same chain as three kernels, each rounding its result to 16 bits.""", dtype=np.float32)
def gelu_widened(x, bias, residual, out):
    kernel = _gelu_widened.kernels[x.dtype]
    kernel[gelu_grid(x.shape[0] * x.shape[1]), THREADS](flat_bits16(x), bits16(bias), flat_bits16(residual),
                                                         flat_bits16(out))


# -- 2. packed: words of two halves -------------------------------------------------------------------------

@cuda.jit(device=True, inline=True)
def gelu_packed_flat(x16, x32, bias, r16, r32, out16, out32, widen, narrow):
    xs = cuda.local.array(ILP, uint32)
    rs = cuda.local.array(ILP, uint32)
    cs = cuda.local.array(ILP, uint64)
    n = uint64(x16.size)
    words_n = uint64(x32.size)
    cols = uint64(bias.size)
    stride = uint64(cuda.gridsize(1))
    w = uint64(cuda.grid(1))
    # HINT: a grid-stride loop over words, eight a step: word w holds elements 2w and 2w + 1, in columns
    # HINT: col = 2w % cols and _wrap(col + 1, cols); the next word's column is _wrap(col + 2 stride % cols).
    # HINT: when n is odd its last element belongs to no word: thread 0 does it through the 16-bit arrays.
    # BEGIN SOLUTION
    col = (w * uint64(2)) % cols
    step = (stride * uint64(2)) % cols
    one = uint64(1) % cols  # the next column: 1, or 0 when there is only one column
    span = stride * uint64(ILP)
    while w + span - stride < words_n:
        c = col
        for u in range(ILP):
            k = w + uint64(u) * stride
            xs[u] = x32[k]
            rs[u] = r32[k]
            cs[u] = c
            c = _wrap(c + step, cols)
        for u in range(ILP):
            c_high = _wrap(cs[u] + one, cols)
            low = gelu(widen(xs[u]) + widen(uint32(bias[cs[u]]))) + widen(rs[u])
            high = gelu(widen(xs[u] >> SIXTEEN) + widen(uint32(bias[c_high]))) + widen(rs[u] >> SIXTEEN)
            out32[w + uint64(u) * stride] = pack(narrow(low), narrow(high))
        col = c
        w += span
    while w < words_n:
        word, r = x32[w], r32[w]
        low = gelu(widen(word) + widen(uint32(bias[col]))) + widen(r)
        high = gelu(widen(word >> SIXTEEN) + widen(uint32(bias[_wrap(col + one, cols)]))) + widen(r >> SIXTEEN)
        out32[w] = pack(narrow(low), narrow(high))
        col = _wrap(col + step, cols)
        w += stride
    if cuda.grid(1) == 0 and n & uint64(1):
        last = n - uint64(1)
        value = gelu(widen(uint32(x16[last])) + widen(uint32(bias[last % cols]))) + widen(uint32(r16[last]))
        out16[last] = uint16(narrow(value))
    # END SOLUTION


@per_format
def _gelu_packed(x16, x32, bias, r16, r32, out16, out32):
    gelu_packed_flat(x16, x32, bias, r16, r32, out16, out32, widen, narrow)  # noqa: F821 - bound per format


@stage_of(HALF_OPERATORS, "packed", """
    The same loop over 32-bit words: one load brings two elements of x, one two of the residual, one
    store writes two results, and eight words in flight per thread are the float32 kernel's bytes in
    flight again. Seen flat, a word may hold the last column of one row and the first of the next, so
    each half finds its own bias column (col, then col + 1 wrapped); the bias, one row shared by all, is
    read a half at a time from L1. An odd last element, in no word, is thread 0's. On an H200 at 16384 x
    16384 it was slower than widened: within the noise for fp16, 9% slower for bf16. The likely reason,
    not yet checked with a profile: at about half the bandwidth (47-54%) this kernel is bound by
    instructions more than by bytes (the erf alone is about 25 an element, bf16's rounding six more),
    and packing saves only load and store instructions while adding a second bias column (a wrap), the
    shifts and the pack to every word, and a column index per word held in flight.""", dtype=np.float32)
def gelu_packed(x, bias, residual, out):
    kernel = _gelu_packed.kernels[x.dtype]
    kernel[gelu_grid(x.shape[0] * x.shape[1] // 2), THREADS](
        flat_bits16(x), words(x), bits16(bias), flat_bits16(residual), words(residual), flat_bits16(out), words(out))


OPERATORS = [op, *HALF_OPERATORS]
