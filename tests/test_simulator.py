"""workbench.simulator: warp intrinsics, launch limits, shared-memory poison and launch recording.

Expected values are written from the PTX definitions (shfl.sync, vote.sync, match.sync) for the
operands numba-cuda passes, i.e. what a GPU computes, not from the simulator itself.
"""

import os

# Before numba is imported. setdefault: if workbench (imported by conftest) already chose a real
# GPU, keep it; these tests are then skipped (sim_only), and the other modules' GPU tests still run.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import signal
import subprocess
import sys

import numba
import numpy as np
import pytest
from numba import cuda, float32, int32

from workbench.simulator import (
    POISON_WORD,
    LaunchLimitError,
    WarpSyncError,
    install,
    record_launches,
)

pytestmark = pytest.mark.sim_only
if numba.config.ENABLE_CUDASIM:
    install()

FULL = 0xFFFFFFFF
LANES = np.arange(32)


@pytest.fixture(autouse=True)
def deadline():
    """Fail a test that takes over 20 s: the errors under test must come instead of a hang."""

    def expire(signum, frame):
        raise TimeoutError("test took over 20 s: a simulated kernel is probably hanging")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------
# Shuffles
# ---------------------------------------------------------------------------------------------


def ptx_source_lanes(mode, b):
    """Source lane of each lane, from PTX shfl.sync with numba's c operand (0 for up, 0x1f else)."""
    bval = b & 31  # PTX reads b[4:0]
    if mode == "idx":
        return np.full(32, bval)
    if mode == "up":
        j = LANES - bval
        return np.where(j >= 0, j, LANES)
    if mode == "down":
        j = LANES + bval
        return np.where(j <= 31, j, LANES)
    return LANES ^ bval


@cuda.jit
def shuffle_all_modes(values, operands, out):
    # out[m, k, lane]: mode m (idx, up, down, xor) with operand operands[k]
    lane = cuda.threadIdx.x
    v = values[lane]
    for k in range(operands.size):
        b = operands[k]
        out[0, k, lane] = cuda.shfl_sync(FULL, v, b)
        out[1, k, lane] = cuda.shfl_up_sync(FULL, v, b)
        out[2, k, lane] = cuda.shfl_down_sync(FULL, v, b)
        out[3, k, lane] = cuda.shfl_xor_sync(FULL, v, b)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_shuffle_modes_follow_ptx(dtype):
    values = (100 + 3 * LANES).astype(dtype)
    operands = np.array([0, 1, 5, 16, 31, 32, 33, 37, -1])
    out = np.zeros((4, operands.size, 32), dtype)
    shuffle_all_modes[1, 32](values, operands, out)
    for m, mode in enumerate(["idx", "up", "down", "xor"]):
        for k, b in enumerate(operands):
            np.testing.assert_array_equal(out[m, k], values[ptx_source_lanes(mode, b)], err_msg=f"{mode} {b}")


def test_shuffle_spot_values():
    values = np.arange(32, dtype=np.int32) * 10
    operands = np.array([1, 37])
    out = np.zeros((4, 2, 32), np.int32)
    shuffle_all_modes[1, 32](values, operands, out)
    assert out[0, 1].tolist() == [50] * 32  # src_lane 37 reads lane 5
    assert out[1, 0, :4].tolist() == [0, 0, 10, 20]  # up 1: lane 0 keeps its own
    assert out[2, 0, 29:].tolist() == [300, 310, 310]  # down 1: lane 31 keeps its own
    assert out[3, 0, :4].tolist() == [10, 0, 30, 20]  # xor 1 swaps pairs
    assert out[2, 1, :3].tolist() == [50, 60, 70]  # down 37 = down 5


seen_types = []


@cuda.jit
def shuffle_record_types(out):
    lane = cuda.threadIdx.x
    for v in (np.float32(lane), np.int32(lane), np.float64(lane), np.int64(lane), float(lane), lane):
        r = cuda.shfl_xor_sync(FULL, v, 1)
        if lane == 0:
            seen_types.append((type(v), type(r)))
    out[lane] = r


def test_shuffle_keeps_the_value_type():
    seen_types.clear()
    shuffle_record_types[1, 32](np.zeros(32, np.int64))
    assert seen_types == [(t, t) for t in (np.float32, np.int32, np.float64, np.int64, float, int)]


@cuda.jit
def shuffle_a(value, out):
    out[cuda.threadIdx.x] = cuda.shfl_sync(FULL, value, 0)


@pytest.mark.parametrize("value", [np.float16(1), np.uint32(1), True, 1 + 2j])
def test_shuffle_rejects_types_numba_rejects(value):
    with pytest.raises(TypeError, match="int32, int64, float32 and float64"):
        shuffle_a[1, 32](value, np.zeros(32))


@cuda.jit
def butterfly_sum(values, out):
    i = cuda.threadIdx.x
    v = values[i]
    offset = 16
    while offset > 0:
        v += cuda.shfl_xor_sync(FULL, v, offset)
        offset //= 2
    out[i] = v


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_butterfly_reduction_gives_every_lane_the_exact_sum(dtype):
    values = np.arange(32, dtype=dtype)
    out = np.zeros(32, dtype)
    butterfly_sum[1, 32](values, out)
    assert (out == 496).all()


def test_butterfly_per_warp_in_a_96_thread_block():
    values = np.arange(96, dtype=np.int64)
    out = np.zeros(96, np.int64)
    butterfly_sum[1, 96](values, out)
    expected = np.repeat([values[w * 32 : w * 32 + 32].sum() for w in range(3)], 32)
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def broadcast_linear_id(out):
    tid = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
    out[cuda.threadIdx.y, cuda.threadIdx.x] = cuda.shfl_sync(FULL, tid, 0)


def test_warps_of_a_2d_block_are_runs_of_linear_ids():
    out = np.zeros((4, 16), np.int64)
    broadcast_linear_id[1, (16, 4)](out)
    # (16, 4): rows y=0,1 (linear ids 0-31) are warp 0, rows y=2,3 are warp 1
    np.testing.assert_array_equal(out, [[0] * 16, [0] * 16, [32] * 16, [32] * 16])


@cuda.jit
def low_half_shuffles(out):
    lane = cuda.threadIdx.x
    out[0, lane] = -1
    out[1, lane] = -1
    if lane < 16:
        out[0, lane] = cuda.shfl_up_sync(0x0000FFFF, lane * 2, 1)
        out[1, lane] = cuda.shfl_xor_sync(0x0000FFFF, lane * 2, 8)


def test_partial_mask_with_only_its_lanes_calling():
    out = np.zeros((2, 32), np.int64)
    low_half_shuffles[1, 32](out)
    assert out[0].tolist() == [0] + [2 * (lane - 1) for lane in range(1, 16)] + [-1] * 16
    assert out[1].tolist() == [2 * (lane ^ 8) for lane in range(16)] + [-1] * 16


@cuda.jit
def two_halves_at_once(out):
    lane = cuda.threadIdx.x
    if lane < 16:
        out[lane] = cuda.shfl_sync(0x0000FFFF, lane, 15 - lane)
    else:
        out[lane] = cuda.shfl_sync(0xFFFF0000, lane, 47 - lane)


def test_disjoint_masks_proceed_independently():
    out = np.zeros(32, np.int64)
    two_halves_at_once[1, 32](out)
    np.testing.assert_array_equal(out, list(range(15, -1, -1)) + list(range(31, 15, -1)))


@cuda.jit
def rotate_many_times(values, rounds, out):
    lane = cuda.threadIdx.x
    v = values[lane]
    for r in range(rounds):
        for _ in range(lane % 3):  # lanes reach each shuffle at different times
            pass
        v = cuda.shfl_sync(FULL, v + lane, (lane + 1) % 32)
    out[lane] = v


def test_repeated_shuffles_reuse_the_rendezvous():
    values = np.arange(32, dtype=np.int64)
    out = np.zeros(32, np.int64)
    rotate_many_times[1, 32](values, 50, out)
    expected = values.copy()
    for _ in range(50):
        expected = np.roll(expected + LANES, -1)
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def warp_sum(x, out):
    i = cuda.grid(1)
    v = float32(0)
    for k in range(i, x.size, cuda.gridsize(1)):
        v += x[k]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL, v, offset)
        offset //= 2
    if cuda.laneid == 0:
        cuda.atomic.add(out, 0, v)


def test_warp_reduction_of_1000_float32():
    x = np.random.default_rng(0).uniform(-1, 2, 1000).astype(np.float32)
    out = np.zeros(1, np.float32)
    warp_sum[2, 64](x, out)
    reference = x.astype(np.float64).sum()
    assert abs(out[0] - reference) <= 1e-5 * abs(reference)


# ---------------------------------------------------------------------------------------------
# Votes, match, masks
# ---------------------------------------------------------------------------------------------


@cuda.jit
def votes(predicates, mask, out):
    lane = cuda.threadIdx.x
    if mask >> lane & 1:
        p = predicates[lane]
        out[0, lane] = cuda.ballot_sync(mask, p)
        out[1, lane] = cuda.any_sync(mask, p)
        out[2, lane] = cuda.all_sync(mask, p)
        out[3, lane] = cuda.eq_sync(mask, p)


@pytest.mark.parametrize(
    "name, predicates, mask, ballot, any_, all_, eq",
    [
        ("all true", np.ones(32), FULL, -1, 1, 1, 1),  # numba's ballot is int32: 0xffffffff is -1
        ("all false", np.zeros(32), FULL, 0, 0, 0, 1),
        ("even lanes", LANES % 2 == 0, FULL, 0x55555555, 1, 0, 0),
        ("lane 7 only", LANES == 7, FULL, 0x80, 1, 0, 0),
        ("low byte, true from 4", LANES >= 4, 0xFF, 0xF0, 1, 0, 0),
        ("low byte, all true", LANES < 8, 0xFF, 0xFF, 1, 1, 1),
        ("lane 31 and others", LANES > 29, FULL, -(2**31) + 2**30, 1, 0, 0),
    ],
)
def test_votes(name, predicates, mask, ballot, any_, all_, eq):
    out = np.full((4, 32), 99, np.int64)
    votes[1, 32](predicates.astype(np.int32), mask, out)
    lanes = [lane for lane in range(32) if mask >> lane & 1]
    for row, expected in enumerate([ballot, any_, all_, eq]):
        assert out[row, lanes].tolist() == [expected] * len(lanes), (name, row)


ballots = []


@cuda.jit
def ballot_bit_counts(out):
    lane = cuda.threadIdx.x
    b = cuda.ballot_sync(FULL, lane >= 28)
    if lane == 0:
        ballots.append(b)
    out[0] = cuda.popc(b)
    out[1] = cuda.ffs(b)
    out[2] = cuda.clz(b)
    out[3] = cuda.popc(cuda.ballot_sync(FULL, True))


def test_ballot_is_int32_and_bit_intrinsics_count_its_bits():
    ballots.clear()
    out = np.zeros(4, np.int64)
    ballot_bit_counts[1, 32](out)
    assert type(ballots[0]) is np.int32 and ballots[0] == np.uint32(0xF0000000).view(np.int32)
    assert out.tolist() == [4, 29, 0, 32]


@cuda.jit
def matches(values, out):
    lane = cuda.threadIdx.x
    out[0, lane] = cuda.match_any_sync(FULL, values[lane])
    mask, same = cuda.match_all_sync(FULL, values[lane])
    out[1, lane] = mask
    out[2, lane] = same


def test_match_any_and_all():
    values = (LANES % 3).astype(np.float32)
    out = np.zeros((3, 32), np.int64)
    matches[1, 32](values, out)
    # numba types match_any_sync's result int32: lane 31's bit makes it negative
    groups = [sum(1 << lane for lane in range(32) if lane % 3 == r) for r in range(3)]
    groups = [np.uint32(bits).view(np.int32) for bits in groups]
    assert out[0].tolist() == [groups[lane % 3] for lane in range(32)]
    assert out[1].tolist() == [0] * 32 and out[2].tolist() == [0] * 32
    matches[1, 32](np.full(32, 2.5, np.float32), out)
    assert out[0].tolist() == [-1] * 32 and out[1].tolist() == [-1] * 32 and out[2].tolist() == [1] * 32


@cuda.jit
def masks(out):
    lane = cuda.threadIdx.x
    tid = lane + cuda.blockDim.x * cuda.threadIdx.y
    out[tid, 0] = cuda.activemask()
    out[tid, 1] = cuda.lanemask_lt()


def test_activemask_and_lanemask_lt_in_a_40_thread_block():
    out = np.zeros((40, 2), np.int64)
    masks[1, 40](out)
    assert (out[:32, 0] == FULL).all()
    assert (out[32:, 0] == 0xFF).all()  # warp 1 has lanes 0-7 only
    assert out[:, 1].tolist() == [(1 << (t % 32)) - 1 for t in range(40)]


@cuda.jit
def activemask_after_return_and_in_a_branch(out):
    lane = cuda.threadIdx.x
    if lane < 16:
        out[0, lane] = cuda.activemask()  # lanes 16-31 are on the other path
    cuda.syncthreads()
    if lane >= 20:
        return
    m = cuda.activemask()
    out[1, lane] = m
    out[2, lane] = cuda.popc(cuda.ballot_sync(m, True))


def test_activemask_leaves_out_returned_lanes_and_the_other_branch():
    out = np.full((3, 32), -1, np.int64)
    activemask_after_return_and_in_a_branch[1, 32](out)
    assert out[0].tolist() == [0xFFFF] * 16 + [-1] * 16
    assert out[1].tolist() == [0xFFFFF] * 20 + [-1] * 12
    assert out[2].tolist() == [20] * 20 + [-1] * 12


@cuda.jit
def syncwarp_exchange(out):
    lane = cuda.threadIdx.x
    buffer = cuda.shared.array(32, int32)
    for r in range(4):
        buffer[lane] = lane * 10 + r
        cuda.syncwarp()
        out[r, lane] = buffer[(lane + 1) % 32]
        cuda.syncwarp(FULL)


def test_syncwarp_orders_shared_memory_within_a_warp():
    out = np.zeros((4, 32), np.int64)
    syncwarp_exchange[1, 32](out)
    for r in range(4):
        assert out[r].tolist() == [((lane + 1) % 32) * 10 + r for lane in range(32)]


@cuda.jit
def block_sum(x, out):
    tid = cuda.threadIdx.x
    partial = cuda.shared.array(64, float32)
    partial[tid] = x[tid]
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()
        stride //= 2
    out[1] = cuda.syncthreads_count(x[tid] > 10)
    if tid == 0:
        out[0] = partial[0]


def test_syncthreads_still_works():
    out = np.zeros(2, np.float32)
    block_sum[1, 64](np.arange(64, dtype=np.float32), out)
    assert out.tolist() == [2016, 53]


# ---------------------------------------------------------------------------------------------
# Misuse: errors, never hangs
# ---------------------------------------------------------------------------------------------


@cuda.jit
def read_outside_mask(out):
    lane = cuda.threadIdx.x
    if lane < 16:
        out[lane] = cuda.shfl_sync(0x0000FFFF, lane, 20)


def test_reading_a_lane_outside_the_mask_is_an_error():
    with pytest.raises(WarpSyncError, match=r"reads lane 20, which is not in the mask 0x0000ffff"):
        read_outside_mask[1, 32](np.zeros(32))


@cuda.jit
def caller_outside_mask(out):
    out[cuda.threadIdx.x] = cuda.ballot_sync(0x1, True)


def test_calling_lane_must_be_in_its_mask():
    with pytest.raises(WarpSyncError, match=r"lane \d+ called it with mask 0x00000001"):
        caller_outside_mask[1, 32](np.zeros(32))


def test_mask_naming_lanes_a_partial_warp_lacks_is_an_error():
    with pytest.raises(WarpSyncError, match=r"lanes 16-31 of warp 1 do not exist: the block has 48 threads"):
        butterfly_sum[1, 48](np.zeros(48), np.zeros(48))


@cuda.jit
def half_in_syncthreads(out):
    lane = cuda.threadIdx.x
    if lane < 16:
        cuda.syncthreads()
    else:
        out[lane] = cuda.shfl_down_sync(FULL, lane, 1)


def test_divergence_between_syncthreads_and_a_shuffle_is_an_error():
    with pytest.raises(WarpSyncError) as error:
        half_in_syncthreads[1, 32](np.zeros(32))
    message = str(error.value)
    assert "lanes 16-31 wait in shfl_down_sync(mask=0xffffffff)" in message
    assert "lanes 0-15: in syncthreads()" in message


@cuda.jit
def early_return(x, out):
    i = cuda.threadIdx.x
    if i >= 20:
        return
    out[i] = cuda.shfl_down_sync(FULL, x[i], 1)


def test_lanes_that_returned_are_reported():
    with pytest.raises(WarpSyncError, match=r"lanes 20-31: exited"):
        early_return[1, 32](np.zeros(32), np.zeros(32))


@cuda.jit
def different_votes(out):
    lane = cuda.threadIdx.x
    if lane % 2:
        out[lane] = cuda.any_sync(FULL, True)
    else:
        out[lane] = cuda.all_sync(FULL, True)


def test_lanes_in_different_intrinsics_are_reported():
    with pytest.raises(WarpSyncError, match=r"in any_sync\(mask=0xffffffff\)"):
        different_votes[1, 32](np.zeros(32))


@cuda.jit
def one_lane_raises(out):
    lane = cuda.threadIdx.x
    if lane == 3:
        out[lane] = 1 // (lane - 3)
    out[lane] = cuda.shfl_sync(FULL, lane, 0)


def test_an_exception_in_one_lane_stops_the_lanes_waiting_for_it():
    with pytest.raises(ZeroDivisionError, match=r"tid=\[3, 0, 0\]"):
        one_lane_raises[1, 32](np.zeros(32))


@cuda.jit
def mixed_int_and_float(x, out):
    lane = cuda.threadIdx.x
    v = x[lane] if lane < 8 else 0
    out[lane] = cuda.shfl_sync(FULL, v, 0)


def test_int_and_float_in_different_lanes_is_an_error():
    with pytest.raises(TypeError, match=r"start it from a float"):
        mixed_int_and_float[1, 32](np.ones(32, np.float32), np.zeros(32))


# ---------------------------------------------------------------------------------------------
# Launch limits
# ---------------------------------------------------------------------------------------------


@cuda.jit
def nothing(out):
    pass


@pytest.mark.parametrize(
    "grid, block, message",
    [
        (1, (1025, 1, 1), "1025 threads exceeds the limit of 1024 threads per block"),
        (1, (32, 33, 1), "32 x 33 x 1 = 1056 threads exceeds"),
        (1, (1, 1, 65), r"blockDim.z = 65 exceeds its limit of 64"),
        ((1, 65536), 1, r"gridDim.y = 65536 exceeds its limit of 65535"),
        (2**31, 1, r"gridDim.x = 2147483648 exceeds its limit of 2147483647"),
        (0, 32, r"gridDim.x = 0: every grid and block dimension must be at least 1"),
    ],
)
def test_launch_configuration_limits(grid, block, message):
    with pytest.raises(LaunchLimitError, match=message):
        nothing[grid, block](np.zeros(1))


@cuda.jit
def static_shared(out):
    s = cuda.shared.array(12544, float32)  # 49 KiB
    s[0] = 1
    out[0] = s[0]


@cuda.jit
def static_and_dynamic_shared(out):
    s = cuda.shared.array(10240, float32)  # 40 KiB
    d = cuda.shared.array(0, float32)
    s[0] = 1
    d[0] = 1
    out[0] = s[0] + d[0]


def test_shared_memory_limits():
    with pytest.raises(LaunchLimitError, match=r"static shared memory .* of 50176 bytes per block exceeds"):
        static_shared[1, 1](np.zeros(1))
    with pytest.raises(LaunchLimitError, match=r"static \(40960 bytes\) \+ dynamic \(16384 bytes\)"):
        static_and_dynamic_shared[1, 1, 0, 16384](np.zeros(1))
    with pytest.raises(LaunchLimitError, match=r"dynamic shared memory of 50000 bytes"):
        nothing[1, 1, 0, 50000](np.zeros(1))
    out = np.zeros(1)
    static_and_dynamic_shared[1, 1, 0, 8192](out)  # exactly 48 KiB is allowed
    assert out[0] == 2


# ---------------------------------------------------------------------------------------------
# Shared memory starts as garbage
# ---------------------------------------------------------------------------------------------


@cuda.jit
def read_before_write(f, i, d32, d64):
    b = cuda.blockIdx.x
    fs = cuda.shared.array(4, float32)
    is_ = cuda.shared.array(4, int32)
    dyn = cuda.shared.array(0, float32)
    f[b] = fs[0]
    i[b] = is_[1]
    d32[b] = dyn[0]
    d64[b] = cuda.shared.array(0, numba.float64)[0]
    fs[0] = b + 1  # what the next block would see if shared memory carried over
    is_[1] = b + 1
    dyn[0] = b + 1


def test_shared_memory_is_garbage_in_every_block():
    f, d32, d64 = np.zeros(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float64)
    i = np.zeros(2, np.int64)
    read_before_write[2, 1, 0, 16](f, i, d32, d64)
    assert np.isnan(f).all() and np.isnan(d32).all() and np.isnan(d64).all()
    assert POISON_WORD == 0x7FFBADAD and i.tolist() == [POISON_WORD] * 2


# ---------------------------------------------------------------------------------------------
# Recording launches, install
# ---------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def twice(v):
    return 2 * v


@cuda.jit
def scale(x, n, a, b, y):
    i = cuda.grid(1)
    if i < n:
        y[i] = twice(x[i]) * a + b


def test_record_launches_captures_numba_types():
    x = np.ones(8, np.float32)
    y = cuda.to_device(np.zeros(8, np.int32))
    scale[1, 8](x, 8, 1.5, np.float32(2), y)  # outside: not recorded
    with record_launches() as launches:
        scale[1, 8](x, 8, 1.5, np.float32(2), y)
        scale[1, 8](cuda.In(x), 3, 0.5, np.float32(1), y)
    assert len(launches) == 2 and all(fn is scale.py_func for fn, _ in launches)
    t = numba.types
    assert launches[0][1] == (t.float32[::1], t.int64, t.float64, t.float32, t.int32[::1])
    assert launches[1][1][0] == t.float32[::1]  # cuda.In(x) types as x


def test_install_is_idempotent():
    shfl = cuda.simulator.kernelapi.FakeCUDAModule.shfl_sync
    install()
    assert cuda.simulator.kernelapi.FakeCUDAModule.shfl_sync is shfl
    out = np.zeros(32, np.int32)
    butterfly_sum[1, 32](np.ones(32, np.int32), out)
    assert (out == 32).all()


def test_install_refuses_without_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", WORKBENCH_MODE="compile")
    code = "from workbench.simulator import install\ntry: install()\nexcept RuntimeError as e: print(e)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "NUMBA_ENABLE_CUDASIM=1" in result.stdout, result.stderr


def test_launches_from_several_host_threads_run_one_after_another():
    """A host program may launch from several threads (a GPU runs them on its streams). The simulator's
    kernel context and its pool of CUDA threads are process-wide: a launch from a second thread while a
    kernel ran was taken for a device function's call (AttributeError: no blockIdx), or shared the
    first one's workers, and a block of the first waited at its barrier for ever (seen in the test
    suite: a stray launch from a test's thread into the next test's transpose). Launches now take
    turns; each still computes its own result."""
    import threading

    @cuda.jit  # (cuda from the module's globals: the simulator swaps a kernel's global `cuda`, not a closure's)
    def block_sums(x, out):
        shared = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        shared[t] = x[cuda.blockIdx.x * 64 + t]
        cuda.syncthreads()
        if t == 0:
            total = float32(0.0)
            for k in range(64):
                total += shared[k]
            out[cuda.blockIdx.x] = total

    def launch_many(seed, wrong):
        rng = np.random.default_rng(seed)
        for _ in range(5):
            x = rng.integers(0, 8, 4 * 64).astype(np.float32)
            out = np.zeros(4, np.float32)
            block_sums[4, 64](x, out)
            if not np.array_equal(out, x.reshape(4, 64).sum(axis=1)):
                wrong.append(seed)

    wrong, errors = [], []

    def guarded(seed):
        try:
            launch_many(seed, wrong)
        except Exception as exc:  # (an exception in a thread would not fail the test by itself)
            errors.append(repr(exc))

    threads = [threading.Thread(target=guarded, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a launch never finished"
    assert not errors and not wrong, (errors, wrong)
