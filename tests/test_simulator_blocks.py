"""workbench.simulator across blocks: races, a device with few SMs, libdevice and jit options, cost.

The simulator runs the blocks of a launch one after another, so races between blocks never show in
its results; these tests check that the race checker reports them (and only them), that a small
simulated SM count exposes launch-geometry bugs, that what numba offers on a GPU (libdevice,
compiler options) works or says clearly that it needs a GPU, and that big launches are refused
before they take hours.
"""

import os

# Before numba is imported (see tests/test_simulator.py).
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import math
import signal
import struct
import subprocess
import sys
import time

import numba
import numpy as np
import pytest
from numba import cuda, float32, int32, int64

from workbench.simulator import (
    DEFAULT_SM_COUNT,
    NeedsGPU,
    RaceError,
    TooManyThreads,
    run_on_one_core,
    estimated_seconds,
    install,
    racecheck,
    racecheck_enabled,
    simulated_sm_count,
    simulated_threads,
    sm_count,
    thread_budget,
)

pytestmark = pytest.mark.sim_only
if numba.config.ENABLE_CUDASIM:
    install()
    from numba.cuda import libdevice

FIX = "use cuda.atomic.add or give each block its own slot"


@pytest.fixture(autouse=True)
def deadline():
    """Fail a test that takes over 30 s: a hang must not pass for slowness."""

    def expire(signum, frame):
        raise TimeoutError("test took over 30 s: a simulated kernel is probably hanging")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def device(values, dtype=np.float32):
    return cuda.to_device(np.asarray(values, dtype=dtype))


# ---------------------------------------------------------------------------------------------
# Races between blocks, in global memory
# ---------------------------------------------------------------------------------------------


@cuda.jit
def flush_with_plus_equals(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    partials = cuda.shared.array(32, float32)
    partials[cuda.threadIdx.x] = partial
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        block_sum = float32(0.0)
        for t in range(cuda.blockDim.x):
            block_sum += partials[t]
        out[0] += block_sum  # every block's thread 0: a lost update waiting to happen


@cuda.jit
def flush_with_atomic_add(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    cuda.atomic.add(out, 0, partial)


def test_flush_of_block_partials_with_plus_equals_is_a_race():
    x, out = device(np.ones(256)), device([0.0])
    with pytest.raises(RaceError) as caught:
        flush_with_plus_equals[4, 32](x, out)
    message = str(caught.value)
    assert "data race in kernel flush_with_plus_equals" in message
    assert "out[0] (global memory)" in message
    assert "blocks (0, 0, 0) and (1, 0, 0)" in message
    assert "wrote it (the value 64.0)" in message and "read it" in message
    assert "test_simulator_blocks.py" in message and "`out[0] += block_sum" in message
    assert "read-modify-write" in message and FIX in message
    out = device([0.0])
    flush_with_atomic_add[4, 32](x, out)  # the fix: no race
    assert out.copy_to_host()[0] == 256


@cuda.jit
def histogram_plain_global(x, bins):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        bins[x[i]] += 1


@cuda.jit
def histogram_atomic_global(x, bins):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        cuda.atomic.add(bins, x[i], 1)


def test_histogram_with_plain_increments_in_global_memory_is_a_race():
    x = device(np.arange(128) % 4, np.int32)
    bins = device(np.zeros(4), np.int32)
    with pytest.raises(RaceError) as caught:
        histogram_plain_global[2, 32](x, bins)
    message = str(caught.value)
    assert "bins[" in message and "global memory" in message and "read-modify-write" in message
    bins = device(np.zeros(4), np.int32)
    histogram_atomic_global[2, 32](x, bins)
    assert list(bins.copy_to_host()) == [32, 32, 32, 32]


@cuda.jit
def block_sums_to_slots(x, partials):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    cuda.atomic.add(partials, cuda.blockIdx.x, partial)


@cuda.jit
def combine_slots(partials, out):
    if cuda.grid(1) == 0:
        total = float32(0.0)
        for b in range(partials.size):
            total += partials[b]
        out[0] = total


@cuda.jit
def scale_ranges(x, y, overlap):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        y[i // overlap] = 2 * x[i]  # overlap 1: disjoint; 2: two threads share each output


def test_slots_per_block_then_a_second_kernel_and_disjoint_ranges_are_no_race():
    x = device(np.arange(300))
    partials, out = device(np.zeros(3)), device([0.0])
    block_sums_to_slots[3, 32](x, partials)
    combine_slots[1, 32](partials, out)
    assert out.copy_to_host()[0] == sum(range(300))
    y = cuda.device_array(300, np.float32)
    scale_ranges[3, 32](x, y, 1)
    assert np.array_equal(y.copy_to_host(), 2 * np.arange(300))
    with pytest.raises(RaceError, match="The two writes land in either order"):
        scale_ranges[3, 32](x, y, 2)


# A one-pass scan: each block scans its tile, then adds the running total of the blocks before it.

@cuda.jit(device=True)
def tile_scan(x, y, totals):
    """Serial scan of this block's 32-element tile by thread 0; returns the tile's total."""
    start = cuda.blockIdx.x * 32
    running = float32(0.0)
    for i in range(start, min(start + 32, x.size)):
        running += x[i]
        y[i] = running
    return running


@cuda.jit
def scan_reads_previous_total_unsynchronised(x, y, totals):
    if cuda.threadIdx.x == 0:
        total = tile_scan(x, y, totals)
        b = cuda.blockIdx.x
        before = totals[b - 1] if b > 0 else float32(0.0)  # nothing says block b - 1 is done
        totals[b] = before + total
        for i in range(b * 32, min(b * 32 + 32, x.size)):
            y[i] += before


@cuda.jit
def scan_chained_with_fence_and_flag(x, y, totals, ready):
    if cuda.threadIdx.x == 0:
        total = tile_scan(x, y, totals)
        b = cuda.blockIdx.x
        before = float32(0.0)
        if b > 0:
            while cuda.atomic.add(ready, b - 1, 0) == 0:  # an atomic read: wait for the flag
                pass
            before = totals[b - 1]
        totals[b] = before + total
        cuda.threadfence()  # the total is visible to every block before the flag says so
        cuda.atomic.exch(ready, b, 1)
        for i in range(b * 32, min(b * 32 + 32, x.size)):
            y[i] += before


@cuda.jit
def scan_chained_flag_without_fence(x, y, totals, ready):
    if cuda.threadIdx.x == 0:
        total = tile_scan(x, y, totals)
        b = cuda.blockIdx.x
        before = float32(0.0)
        if b > 0:
            while cuda.atomic.add(ready, b - 1, 0) == 0:
                pass
            before = totals[b - 1]
        totals[b] = before + total
        cuda.atomic.exch(ready, b, 1)
        for i in range(b * 32, min(b * 32 + 32, x.size)):
            y[i] += before


def scan_arrays(n=100):
    x = device(np.arange(n) % 7)
    tiles = -(-n // 32)
    return x, cuda.device_array(n, np.float32), device(np.zeros(tiles)), device(np.zeros(tiles), np.int32)


def test_scan_reading_the_previous_blocks_total_without_synchronisation_is_a_race():
    x, y, totals, _ = scan_arrays()
    with pytest.raises(RaceError) as caught:
        scan_reads_previous_total_unsynchronised[4, 32](x, y, totals)
    message = str(caught.value)
    assert "totals[0]" in message and "blocks (0, 0, 0) and (1, 0, 0)" in message
    assert "wrote it" in message and "read it" in message
    assert "before = totals[b - 1]" in message
    assert "cuda.threadfence()" in message and FIX in message


def test_chained_scan_needs_a_fence_before_its_atomic_flag():
    x, y, totals, ready = scan_arrays()
    scan_chained_with_fence_and_flag[4, 32](x, y, totals, ready)
    assert np.array_equal(y.copy_to_host(), np.cumsum(np.arange(100) % 7))
    x, y, totals, ready = scan_arrays()
    with pytest.raises(RaceError, match=r"totals\[0\]"):
        scan_chained_flag_without_fence[4, 32](x, y, totals, ready)


@cuda.jit
def last_block_sums_the_partials(x, partials, done, out, fence):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    if cuda.threadIdx.x < 16:
        cuda.atomic.add(partials, cuda.blockIdx.x, partial)
    else:
        cuda.atomic.add(partials, cuda.gridDim.x + cuda.blockIdx.x, partial)
    is_last = cuda.shared.array(1, int32)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        if fence:
            cuda.threadfence()
        is_last[0] = cuda.atomic.add(done, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if is_last[0] and cuda.threadIdx.x == 0:
        total = float32(0.0)
        for b in range(partials.size):
            total += partials[b]
        out[0] = total
        done[0] = 0  # reset for the next launch: ordered after every block's atomic


def test_last_block_ticket_pattern_needs_its_threadfence():
    x, done, out = device(np.ones(500)), device([0], np.int32), device([0.0])
    partials = device(np.zeros(8))
    last_block_sums_the_partials[4, 32](x, partials, done, out, 1)
    assert out.copy_to_host()[0] == 500 and done.copy_to_host()[0] == 0
    partials = device(np.zeros(8))
    with pytest.raises(RaceError, match=r"partials\[0\].*\n.*updated it atomically.*\n.*read it"):
        last_block_sums_the_partials[4, 32](x, partials, done, out, 0)


# ---------------------------------------------------------------------------------------------
# Races between threads of a block, in shared memory
# ---------------------------------------------------------------------------------------------


@cuda.jit
def histogram_shared(x, bins, plain):
    local = cuda.shared.array(4, int32)
    t = cuda.threadIdx.x
    if t < 4:
        local[t] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        if plain:
            local[x[i]] += 1
        else:
            cuda.atomic.add(local, x[i], 1)
    cuda.syncthreads()
    if t < 4:
        cuda.atomic.add(bins, t, local[t])


def test_histogram_with_plain_increments_in_shared_memory_is_a_race():
    x = device(np.arange(64) % 4, np.int32)
    bins = device(np.zeros(4), np.int32)
    with pytest.raises(RaceError) as caught:
        histogram_shared[1, 64](x, bins, 1)
    message = str(caught.value)
    assert "local[" in message and "(shared memory)" in message and "of block (0, 0, 0)" in message
    assert "cuda.atomic.add" in message and "cuda.syncthreads()" in message
    bins = device(np.zeros(4), np.int32)
    histogram_shared[2, 64](x, bins, 0)
    assert list(bins.copy_to_host()) == [16, 16, 16, 16]


@cuda.jit
def neighbour_through_shared(x, y, barrier):
    buf = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    buf[t] = x[t]
    if barrier:
        cuda.syncthreads()
    y[t] = buf[(t + 33) % 64]  # another warp's element


@cuda.jit
def neighbour_within_a_warp(x, y, sync):
    buf = cuda.shared.array(32, float32)
    lane = cuda.threadIdx.x
    buf[lane] = x[lane]
    if sync:
        cuda.syncwarp()
    y[lane] = buf[(lane + 1) % 32]


def test_missing_syncthreads_between_shared_write_and_read_is_a_race():
    x, y = device(np.arange(64)), cuda.device_array(64, np.float32)
    with pytest.raises(RaceError, match=r"buf\[\d+\] \(shared memory\)"):
        neighbour_through_shared[1, 64](x, y, 0)
    neighbour_through_shared[1, 64](x, y, 1)
    assert np.array_equal(y.copy_to_host(), (np.arange(64) + 33) % 64)


def test_the_race_reported_does_not_depend_on_how_threads_interleave():
    """Which pair of threads meets first differs from run to run; the report names the same race every
    time: the lowest element, the write told first, its line where the grader points."""
    x, y = device(np.arange(64)), cuda.device_array(64, np.float32)
    errors = []
    for _ in range(6):
        with pytest.raises(RaceError) as caught:
            neighbour_through_shared[1, 64](x, y, 0)
        errors.append(caught.value)
    assert len({str(e) for e in errors}) == 1, {str(e) for e in errors}
    message = str(errors[0])
    assert "buf[0] (shared memory)" in message and "threads (0, 0, 0) and (31, 0, 0)" in message
    assert message.index("wrote it") < message.index("read it")
    assert [text for _, _, text in errors[0].places] == ["buf[t] = x[t]", "y[t] = buf[(t + 33) % 64]  # another warp's element"]


def test_syncwarp_orders_the_lanes_of_a_warp():
    x, y = device(np.arange(32)), cuda.device_array(32, np.float32)
    with pytest.raises(RaceError, match="syncwarp"):
        neighbour_within_a_warp[1, 32](x, y, 0)
    neighbour_within_a_warp[1, 32](x, y, 1)
    assert np.array_equal(y.copy_to_host(), (np.arange(32) + 1) % 32)


def test_racecheck_switches_off(monkeypatch):
    x, out = device(np.ones(256)), device([0.0])
    with racecheck(False):
        flush_with_plus_equals[4, 32](x, out)
    assert out.copy_to_host()[0] == 256  # blocks one after another: the race does not show
    monkeypatch.setenv("WORKBENCH_SIM_RACECHECK", "0")
    assert not racecheck_enabled()
    flush_with_plus_equals[4, 32](x, out)
    with racecheck(True), pytest.raises(RaceError):
        flush_with_plus_equals[4, 32](x, out)
    monkeypatch.setenv("WORKBENCH_SIM_RACECHECK", "1")
    assert racecheck_enabled()


# ---------------------------------------------------------------------------------------------
# The solutions' own kernels are not flagged (with 2 SMs, as the grader runs them)
# ---------------------------------------------------------------------------------------------

# One size per operator with several blocks in every launch, small enough to be quick.
SOLUTION_SIZES = {"reduction": (4099,), "histogram": (4099,), "argmax": (1021,), "scan": (600,)}


@pytest.mark.parametrize("name", sorted(SOLUTION_SIZES))
def test_solution_stages_are_race_free_and_right_on_two_sms(name):
    from workbench.check import check_stage
    from workbench.registry import operator

    op = operator(name)
    with simulated_sm_count(2), racecheck(True):
        with pytest.raises(RaceError):  # the checker is on...
            flush_with_plus_equals[2, 32](device(np.ones(64)), device([0.0]))
        for stage in op.stages:  # ...and finds nothing wrong in the solutions
            if stage.gpu_only:
                continue
            result = check_stage(stage, SOLUTION_SIZES[name], np.random.default_rng(11))
            assert result.passed, f"{stage.key}: {result.message}"


# ---------------------------------------------------------------------------------------------
# A device with few SMs
# ---------------------------------------------------------------------------------------------


@cuda.jit
def double_without_grid_stride(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 2 * x[i]


def double_on_a_resident_grid(x, y):
    """A launcher that sizes its grid from the SM count (8 blocks of 256 per SM), as a persistent
    kernel would, but forgot the grid-stride loop its kernel then needs."""
    from workbench.ladder import blocks_for
    from workbench.ladder import sm_count as ladder_sm_count

    blocks = min(blocks_for(x.size, 256), ladder_sm_count() * 8)
    double_without_grid_stride[blocks, 256](x, y)


def test_sm_count_of_the_simulated_device(monkeypatch):
    from workbench.ladder import sm_count as ladder_sm_count

    assert sm_count() == ladder_sm_count() == cuda.get_current_device().MULTIPROCESSOR_COUNT == DEFAULT_SM_COUNT
    with simulated_sm_count(2):
        assert sm_count() == ladder_sm_count() == cuda.get_current_device().MULTIPROCESSOR_COUNT == 2
    assert cuda.get_current_device().MAX_THREADS_PER_BLOCK == 1024
    with pytest.raises(ValueError), simulated_sm_count(0):
        pass
    monkeypatch.setenv("WORKBENCH_SIM_SM_COUNT", "4")
    assert ladder_sm_count() == 4
    with simulated_sm_count(1):
        assert ladder_sm_count() == 1
    monkeypatch.setenv("WORKBENCH_SIM_SM_COUNT", "four")
    with pytest.raises(ValueError, match="WORKBENCH_SIM_SM_COUNT must be a whole number"):
        ladder_sm_count()


def test_two_sms_expose_a_missing_grid_stride_loop_at_a_few_thousand_elements():
    n = 4100  # > 2 SMs x 8 blocks x 256 threads = 4096
    x = device(np.arange(n))
    with racecheck(False):  # only the geometry matters here: keep it quick
        y = device(np.zeros(n))
        double_on_a_resident_grid(x, y)  # 132 SMs: one thread per element, right
        assert np.array_equal(y.copy_to_host(), 2 * np.arange(n))
        y = device(np.zeros(n))
        with simulated_sm_count(2):
            double_on_a_resident_grid(x, y)
    assert np.array_equal(y.copy_to_host()[:4096], 2 * np.arange(4096))
    assert not y.copy_to_host()[4096:].any()  # never written: the bug shows


# ---------------------------------------------------------------------------------------------
# libdevice, and what numba offers on a GPU
# ---------------------------------------------------------------------------------------------


@cuda.jit
def argmax_packed(x, best):
    """Argmax with one 64-bit atomic max: the float's bits made order-preserving, high; the
    complemented index, low (so the lowest index wins ties)."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        bits = cuda.libdevice.float_as_int(x[i])
        key = bits if bits >= 0 else bits ^ 0x7FFFFFFF
        cuda.atomic.max(best, 0, (int64(key) << 32) | (0xFFFFFFFF - i))


def test_packed_atomic_argmax_with_libdevice_float_as_int():
    values = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    values[[10, 700]] = values.max() + 1
    best = device([np.iinfo(np.int64).min], np.int64)
    argmax_packed[4, 64](device(values), best)
    assert 0xFFFFFFFF - (int(best.copy_to_host()[0]) & 0xFFFFFFFF) == 10


def f32(value):
    return struct.unpack("<i", struct.pack("<f", value))[0]


def test_libdevice_bit_casts_integer_intrinsics_and_tuples():
    assert libdevice.float_as_int(1.0) == 0x3F800000 and libdevice.float_as_int(-2.0) == f32(-2.0)
    assert libdevice.int_as_float(0x3F800000) == 1.0 and isinstance(libdevice.int_as_float(0), np.float32)
    assert libdevice.double_as_longlong(1.0) == 0x3FF0000000000000
    assert libdevice.longlong_as_double(0x4000000000000000) == 2.0
    assert libdevice.hiloint2double(libdevice.double2hiint(3.5), libdevice.double2loint(3.5)) == 3.5
    assert libdevice.mulhi(-(2**31), 2**30) == -(2**29) and libdevice.umulhi(-1, -1) == -2  # 0xFFFFFFFE
    assert libdevice.byte_perm(0x33221100, 0x77665544, 0x1054) == 0x11005544
    assert libdevice.brev(1) == -(2**31) and libdevice.clz(1) == 31 and libdevice.popcll(-1) == 64
    assert libdevice.ffs(0) == 0 and libdevice.ffs(8) == 4 and libdevice.sad(3, 10, 1) == 8
    assert libdevice.float2half_rn(1.0) == 0x3C00 and libdevice.half2float(0x3C00) == 1.0
    assert libdevice.float2int_rn(2.5) == 2 and libdevice.float2int_rn(3.5) == 4  # ties to even
    assert libdevice.float2int_rd(-0.5) == -1 and libdevice.float2int_ru(0.1) == 1
    assert libdevice.double2int_rz(1e20) == 2**31 - 1 and libdevice.double2int_rn(math.nan) == 0  # saturate
    assert libdevice.float2uint_rn(3e9) == np.int32(np.uint32(3000000000).view(np.int32))
    assert libdevice.sincosf(0.5) == (np.float32(math.sin(0.5)), np.float32(math.cos(0.5)))
    mantissa, exponent = libdevice.frexp(12.0)
    assert (mantissa, exponent) == (0.75, 4) and isinstance(exponent, np.int32)
    assert libdevice.modf(2.25) == (0.25, 2.0) and libdevice.remquo(7.0, 2.0) == (-1.0, 4)
    assert libdevice.round(2.5) == 3.0 and libdevice.rint(2.5) == 2.0 and libdevice.round(-0.5) == -1.0
    assert libdevice.saturatef(1.5) == 1.0 and libdevice.saturatef(math.nan) == 0.0
    assert libdevice.ilogb(0.0) == -(2**31) and libdevice.logb(8.0) == 3.0
    assert libdevice.isnanf(math.nan) == 1 and libdevice.signbitd(-0.0) == 1 and libdevice.isinfd(1.0) == 0


def test_libdevice_rounding_modes_are_exact():
    rng = np.random.default_rng(5)
    pairs = rng.standard_normal((300, 2)).astype(np.float32) * np.float32(1e3)
    for a, b in pairs:
        exact = float(a) + float(b)  # exact: two float32s fit in a float64 sum here
        down, up, near, zero = (libdevice.fadd_rd(a, b), libdevice.fadd_ru(a, b), libdevice.fadd_rn(a, b),
                                libdevice.fadd_rz(a, b))
        assert down <= exact <= up and near == np.float32(a) + np.float32(b)
        assert up == down or np.nextafter(down, np.float32(np.inf)) == up
        assert abs(zero) <= abs(exact) and zero in (down, up)
        assert libdevice.fmul_rn(a, b) == a * b and libdevice.fdiv_rn(a, b) == a / b
        assert libdevice.ddiv_rn(float(a), float(b)) == float(a) / float(b)
        assert libdevice.fsqrt_rn(abs(a)) == np.sqrt(abs(a)) and libdevice.dsqrt_rn(abs(float(a))) == math.sqrt(abs(a))
        assert libdevice.fsqrt_rd(abs(a)) <= math.sqrt(abs(a)) <= libdevice.fsqrt_ru(abs(a))
    assert libdevice.fadd_rd(1.0, -1.0) == 0.0 and math.copysign(1, libdevice.fadd_rd(1.0, -1.0)) == -1
    a = np.float32(1 + 2**-12)  # a * a = 1 + 2^-11 + 2^-24: rounded to float32, the 2^-24 is lost
    assert libdevice.fmaf_rn(a, a, -1.0) == np.float32(2**-11 + 2**-24) != a * a - np.float32(1)
    assert libdevice.double2float_rz(1e300) == np.finfo(np.float32).max and libdevice.double2float_rn(1e300) == np.inf
    assert libdevice.int2float_rz(2**24 + 1) == 2**24 and libdevice.int2float_ru(2**24 + 1) == 2**24 + 2
    assert libdevice.fmul_rn(1e-30, 1e-30) == 0.0 and libdevice.fmul_ru(1e-30, 1e-30) == np.float32(2**-149)


def test_libdevice_special_functions():
    for x in (-0.9, -0.3, 0.0, 0.2, 0.5, 0.99, 0.999999):
        assert abs(math.erf(libdevice.erfinv(x)) - x) < 1e-15
    for y in (1e-300, 1e-20, 0.01, 0.5, 1.0, 1.7):
        assert math.isclose(math.erfc(libdevice.erfcinv(y)), y, rel_tol=1e-12)
    for p in (1e-10, 0.025, 0.5, 0.9):
        assert math.isclose(libdevice.normcdf(libdevice.normcdfinv(p)), p, rel_tol=1e-12)
    for x in (-3.0, 0.5, 20.0, 26.0):  # 26: past the switch to the asymptotic series, still computable
        assert math.isclose(libdevice.erfcx(x), math.exp(x * x) * math.erfc(x), rel_tol=1e-12)
    assert math.isclose(libdevice.j0(1.0), 0.7651976865579666, rel_tol=1e-14)
    assert math.isclose(libdevice.j1(1.0), 0.4400505857449335, rel_tol=1e-14)
    assert math.isclose(libdevice.y0(1.0), 0.08825696421567696, rel_tol=1e-12)
    assert math.isclose(libdevice.y1(1.0), -0.7812128213002887, rel_tol=1e-12)
    for n, x in ((0, 0.5), (2, 3.0), (3, 12.0), (5, 40.0)):  # the Wronskian ties J and Y together
        wronskian = libdevice.jn(n + 1, x) * libdevice.yn(n, x) - libdevice.jn(n, x) * libdevice.yn(n + 1, x)
        assert math.isclose(wronskian, 2 / (math.pi * x), rel_tol=1e-10)
    assert libdevice.tgamma(5.0) == 24.0 and libdevice.lgamma(0.0) == math.inf


def test_every_libdevice_function_numba_declares_runs():
    from numba.cuda.libdevicefuncs import functions

    from workbench.simulator.libdevice import IMPLEMENTATIONS

    names = [name[len("__nv_"):] for name in functions]
    assert not [name for name in names if name not in IMPLEMENTATIONS]
    for name, (_, arguments) in functions.items():
        args = [3 if "int" in str(a.ty) else 0.75 for a in arguments if not a.is_ptr]
        getattr(libdevice, name[len("__nv_"):])(*args)  # no exception, whatever the result


@cuda.jit(lineinfo=True, launch_bounds=(64, 2), max_registers=64, fastmath=True, cache=True, opt=True,
          lto=False, debug=False)
def with_compiler_options(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = scaled(x[i]) + cuda.ldcs(x, i)
        cuda.stcs(y, i, y[i] + libdevice.fast_expf(0.0))
        cuda.nanosleep(10)


@cuda.jit(device=True, inline="always", forceinline=True)
def scaled(v):
    return 2 * v


@cuda.jit
def aligned_arrays(x, y):
    tile = cuda.shared.array(32, float32, alignment=16)
    regs = cuda.local.array(4, float32, alignment=16)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    regs[0] = tile[t]
    y[t] = regs[0]


def test_jit_accepts_every_compiler_option_and_the_gpu_only_api():
    x, y = device(np.arange(64)), cuda.device_array(64, np.float32)
    with_compiler_options[1, 64](x, y)
    assert np.array_equal(y.copy_to_host(), 3 * np.arange(64) + 1)
    aligned_arrays[1, 32](x, y)
    assert np.array_equal(y.copy_to_host()[:32], np.arange(32))
    with pytest.raises(TypeError, match="lineinfoo"):
        cuda.jit(lineinfoo=True)(lambda x: None)
    with pytest.raises(ValueError, match="power of 2"):
        cuda.jit(lambda y: cuda.shared.array(4, float32, alignment=3))[1, 1](y)


@cuda.jit(link=["mma_helpers.cu"])
def linked_kernel(x):
    x[0] = 1


external = cuda.declare_device("cp_async16", "int32(uint64, uint64, int32)", link="mma_helpers.cu")


@cuda.jit
def calls_external(x):
    x[0] = external(0, 0, 16)


@cuda.jit
def grid_barrier(x):
    g = cuda.cg.this_grid()
    x[cuda.grid(1)] = 1
    g.sync()


@cuda.jit
def waits_for_a_later_block(flags):
    b = cuda.blockIdx.x
    if cuda.threadIdx.x == 0:
        if b + 1 < cuda.gridDim.x:
            while cuda.atomic.add(flags, b + 1, 0) == 0:  # block b + 1 has not run yet: forever
                pass
        cuda.atomic.exch(flags, b, 1)


def test_what_the_simulator_cannot_run_needs_a_gpu():
    x = device([0.0])
    with pytest.raises(NeedsGPU, match=r"links code with link= \(mma_helpers.cu\)"):
        linked_kernel[1, 1](x)
    with pytest.raises(NeedsGPU, match="cp_async16 is declared with cuda.declare_device"):
        calls_external[1, 1](device([0], np.int32))
    with pytest.raises(NeedsGPU, match="this_grid"):
        grid_barrier[2, 32](device(np.zeros(64)))
    grid_barrier[1, 32](device(np.zeros(32)))  # one block: a block barrier, fine
    with pytest.raises(NeedsGPU, match=r"flags\[1\].*waits for another block"):
        waits_for_a_later_block[2, 32](device([0, 0], np.int32))
    assert issubclass(NeedsGPU, RuntimeError) and not issubclass(NeedsGPU, RaceError)


# ---------------------------------------------------------------------------------------------
# What a launch costs: persistent grids, the thread estimate and budget
# ---------------------------------------------------------------------------------------------


@cuda.jit
def persistent_sum(x, out):
    partial = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    cuda.atomic.add(out, 0, partial)


def persistent_launch(x, out):
    """32 blocks per SM, as a persistent kernel sizes its grid."""
    persistent_sum[sm_count() * 32, 128](x, out)


def test_estimate_of_a_launch():
    assert simulated_threads(4, 256) == 1024 and simulated_threads((4, 2), (16, 16, 1)) == 2048
    assert estimated_seconds(simulated_threads(132 * 32, 256)) > 300  # the 300 s time-out
    assert estimated_seconds(simulated_threads(2 * 32, 128)) < 30


def test_a_persistent_grid_is_refused_at_132_sms_and_runs_in_seconds_at_2():
    x = device(np.ones(10_000))
    out = device([0.0])
    with thread_budget(100_000) as budget, pytest.raises(TooManyThreads) as caught:
        persistent_launch(x, out)
    message = str(caught.value)
    assert "4,224 blocks of 128 threads = 540,672 threads" in message
    assert "Grade it on a GPU, or use a smaller grid" in message and budget.used == 0
    assert isinstance(caught.value, NeedsGPU)
    start = time.perf_counter()
    with simulated_sm_count(2), thread_budget(100_000) as budget:
        persistent_launch(x, out)
    seconds = time.perf_counter() - start
    assert out.copy_to_host()[0] == 10_000 and budget.used == 8192
    print(f"persistent grid, 2 SMs x 32 blocks x 128 threads: {seconds:.1f} s")


# ---------------------------------------------------------------------------------------------
# The threads that run simulated CUDA threads are reused: failures and forks must not break that
# ---------------------------------------------------------------------------------------------


@cuda.jit
def exits_in_one_thread(x):
    if cuda.threadIdx.x == 3:
        sys.exit(3)
    x[cuda.threadIdx.x] = 1


def test_sys_exit_in_a_kernel_reaches_the_launch_and_the_next_launch_runs():
    with pytest.raises(SystemExit):
        exits_in_one_thread[1, 32](device(np.zeros(32)))
    x, y = device(np.arange(64)), cuda.device_array(64, np.float32)
    scale_ranges[2, 32](x, y, 1)
    assert np.array_equal(y.copy_to_host(), 2 * np.arange(64))


def _passes_in_a_forked_child(check) -> bool:
    """Run ``check()`` in a forked child (what it changes stays there); True if it returned True."""
    pid = os.fork()
    if pid == 0:
        status = 2
        try:
            status = 0 if check() else 1
        finally:
            os._exit(status)
    try:
        _, status = os.waitpid(pid, 0)
        pid = None
        return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_forked_child_runs_kernels():
    x, y = device(np.arange(64)), cuda.device_array(64, np.float32)
    scale_ranges[2, 32](x, y, 1)  # the parent now keeps idle threads, which a child does not have

    def runs():
        scale_ranges[2, 32](x, y, 1)
        return np.array_equal(y.copy_to_host(), 2 * np.arange(64))

    assert _passes_in_a_forked_child(runs)


@cuda.jit
def records_its_cores(out):
    i = cuda.grid(1)
    cores = os.sched_getaffinity(0)  # (Python in the simulator: the simulated thread's own cores)
    out[i] = min(cores) if len(cores) == 1 else -1


def test_a_process_kept_on_one_core_runs_every_simulated_thread_there():
    """Simulated threads hand over to one another on every barrier and shuffle: within one core that is
    about half the cost. Threads started after run_on_one_core inherit its core (checked in a forked
    child, whose cores the test's process does not share)."""

    def kept_there():
        os.sched_setaffinity(0, range(os.cpu_count()))  # (a test worker may have been kept to one)
        allowed = sorted(os.sched_getaffinity(0))
        core = run_on_one_core(len(allowed) + 1)  # modulo the cores allowed
        out = cuda.device_array(96, np.int64)
        records_its_cores[3, 32](out)
        expected = allowed[(len(allowed) + 1) % len(allowed)]
        return core == expected and set(out.copy_to_host()) == {expected}

    assert _passes_in_a_forked_child(kept_there)


def test_the_environment_can_keep_a_simulating_process_on_one_core():
    """WORKBENCH_SIM_CORE=N (a notebook's kernel gets 0): the process is kept on the N-th of its cores
    from import on; a value that is not an index is one line, not a failure."""
    code = ("import os, workbench, numba; assert numba.config.ENABLE_CUDASIM; "
            "print(sorted(os.sched_getaffinity(0)))")
    env = dict(os.environ, WORKBENCH_MODE="sim")
    allowed = sorted(os.sched_getaffinity(0))
    for setting, expected in (("1", [allowed[1 % len(allowed)]]), ("one", allowed)):
        done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                              env=dict(env, WORKBENCH_SIM_CORE=setting), timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(expected)
        if setting == "one":
            assert "WORKBENCH_SIM_CORE='one' ignored: the index of a core" in done.stderr
