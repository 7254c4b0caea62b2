"""Scan ladder: the single-pass decoupled_lookback stage's protocol in the simulator (the look-back over
windows of 32 predecessors, waiting on a tile not yet published, the ticket counter and the descriptors
reset from call to call, a plain store or load in place of the atomics caught as a race). `-m gpu`: the
issue's target at 2^28 (>= 85% of copy bandwidth, and no slower than torch.cumsum), and views off a
16-byte boundary."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda, float32, int64, uint64

from solutions import scan
from workbench.ladder import clear_scratch

op = scan.op
STAGE = op["decoupled_lookback"]


def packed(status, value):
    """A descriptor as the kernel publishes it: the value's float32 bits high, the status low."""
    return (int(np.float32(value).view(np.uint32)) << 32) | status


def unpacked(word):
    word = int(word)
    return word & 0xFFFFFFFF, np.uint32(word >> 32).view(np.float32)


def inclusive_scan(x):
    return np.cumsum(x.astype(np.float64))


# -- in the simulator -------------------------------------------------------------------------------

@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of one warp (VECTORS x 128 elements), so that many tiles cost few simulated threads. The simulator
    runs a kernel as Python, which reads these module constants at each launch."""
    monkeypatch.setattr(scan, "ONE_PASS_THREADS", 32)
    monkeypatch.setattr(scan, "ONE_PASS_WARPS", 1)
    monkeypatch.setattr(scan, "ROW", 4 * 32)
    monkeypatch.setattr(scan, "ONE_PASS_TILE", scan.VECTORS * 4 * 32)
    clear_scratch()  # descriptors left by other tile sizes are fine, but start each test from nothing
    yield scan.ONE_PASS_TILE
    clear_scratch()


@cuda.jit
def look_back_once(state, descriptors, tile, aggregate, out):
    """One warp runs the stage's look-back for `tile` against descriptors the test wrote."""
    lane = cuda.threadIdx.x
    exclusive = scan._look_back(state, descriptors, tile, aggregate, lane)
    out[lane] = exclusive


def run_look_back(words, tile, aggregate):
    """(exclusive prefix each lane returned, the descriptors afterwards) for `tile`, given the
    descriptors of tiles 0 .. len(words) - 1 (state[0] stands for the ticket counter)."""
    state = cuda.to_device(np.array([0] + words + [0] * (tile + 1 - len(words)), np.uint64))
    out = cuda.device_array(32, np.float32)
    look_back_once[1, 32](state, int64(1), int64(tile), float32(aggregate), out)
    return out.copy_to_host(), [unpacked(w) for w in state.copy_to_host()[1:]]


@pytest.mark.sim_only
def test_look_back_adds_aggregates_back_to_the_nearest_prefix_across_windows():
    # Tile 70 sees only AGGREGATEs in its first two windows (tiles 38-69, 6-37) and meets tile 5's PREFIX
    # in the third; tile 2's PREFIX (further back) and tiles before 0 must not count.
    words = [packed(scan.AGGREGATE, 1000.0)] * 70
    words[2] = packed(scan.PREFIX, 5000.0)
    words[5] = packed(scan.PREFIX, 100.0)
    for t in range(6, 70):
        words[t] = packed(scan.AGGREGATE, float(t))
    exclusive, after = run_look_back(words, 70, 7.0)
    expected = 100.0 + sum(range(6, 70))
    assert (exclusive == expected).all(), exclusive  # every lane of the warp holds it
    assert after[70] == (scan.PREFIX, expected + 7.0)
    assert after[:70] == [unpacked(w) for w in words]  # the predecessors are only read


@pytest.mark.sim_only
def test_look_back_stops_at_the_nearest_prefix_inside_a_window():
    words = [packed(scan.PREFIX, 1.0)] * 40
    words[30] = packed(scan.PREFIX, 1000.0)
    for t in range(31, 40):
        words[t] = packed(scan.AGGREGATE, float(t))
    exclusive, after = run_look_back(words, 40, 2.0)
    assert exclusive[0] == 1000.0 + sum(range(31, 40))
    assert after[40] == (scan.PREFIX, exclusive[0] + 2.0)
    exclusive, after = run_look_back([], 0, 3.5)  # the first tile: nothing before it
    assert exclusive[0] == 0.0 and after[0] == (scan.PREFIX, 3.5)


@pytest.mark.sim_only
def test_look_back_waits_for_a_predecessor_that_has_published_nothing():
    """A tile still EMPTY has been drawn by a running block that has not scanned it yet: the look-back
    must read it again until it publishes, never take it as 0. The simulator runs one block at a time, so
    nothing ever publishes here, and it reports the wait as needing a GPU (rather than hanging)."""
    from workbench.simulator import NeedsGPU

    words = [packed(scan.PREFIX, 1.0), packed(scan.EMPTY, 0.0), packed(scan.AGGREGATE, 2.0)]
    with pytest.raises(NeedsGPU, match=r"read state\[2\] .* times in a row without it changing"):
        run_look_back(words, 3, 1.0)


def scan_on_device(x):
    y = cuda.device_array(x.size, np.float32)
    STAGE(cuda.to_device(x), y)
    return y.copy_to_host()


@pytest.mark.sim_only
def test_many_tiles_and_repeated_calls_reset_the_counter_and_descriptors(small_tiles):
    """Calls of several sizes in a row (up to 41 tiles, more than one look-back window), each twice:
    each one right, the ticket counter rolled over to the next call by the block that drew the last
    ticket, this call's descriptors all PREFIX (the running sums of the tiles), the next call's half
    cleared to EMPTY. (Blocks run in order here, so each look-back ends at its neighbour's PREFIX; the
    tests above give it windows of AGGREGATEs.)"""
    tile = small_tiles
    rng = np.random.default_rng(3)
    calls = {}
    for n in [40 * tile + 5, 3 * tile, 40 * tile + 5, 1, tile + 1, 3 * tile]:
        x = rng.uniform(-1.0, 2.0, n).astype(np.float32)
        y = scan_on_device(x)
        ref = inclusive_scan(x)
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() + 1e-6, n
        tiles = -(-n // tile)
        calls[tiles] = calls.get(tiles, 0) + 1
        state = scan._one_pass_state(tiles).copy_to_host()
        assert int(state[0]) == calls[tiles] << 32, (n, hex(int(state[0])))  # no ticket drawn yet
        used = (calls[tiles] - 1) % 2
        half = [unpacked(w) for w in state[1 + used * tiles: 1 + (used + 1) * tiles]]
        sums = inclusive_scan(np.pad(x, (0, tiles * tile - n)).reshape(tiles, tile).sum(axis=1))
        assert [s for s, _ in half] == [scan.PREFIX] * tiles
        assert np.allclose([v for _, v in half], sums, rtol=1e-5, atol=1e-5)
        assert not state[1 + (1 - used) * tiles: 1 + (2 - used) * tiles].any()


@pytest.mark.sim_only
def test_real_tiles_with_a_tail_and_the_element_by_element_path():
    n = 2 * scan.ONE_PASS_TILE + 7
    x = np.random.default_rng(5).uniform(-1.0, 2.0, n).astype(np.float32)
    ref = inclusive_scan(x)
    assert np.abs(scan_on_device(x) - ref).max() < 1e-3
    y = cuda.device_array(n, np.float32)
    scan._single_pass(cuda.to_device(x), y, False)  # what a view off a 16-byte boundary takes
    assert np.abs(y.copy_to_host() - ref).max() < 1e-3


@cuda.jit(device=True)
def publish_with_a_plain_store(state, index, status, value):
    state[index] = (uint64(np.float32(value).view(np.uint32)) << uint64(32)) | uint64(status)


@cuda.jit(device=True)
def read_with_a_plain_load(state, index):
    word = state[index]
    return int(word) & 0xFFFFFFFF, np.uint32(int(word) >> 32).view(np.float32)


@pytest.mark.sim_only
@pytest.mark.parametrize("name, broken", [("_publish", publish_with_a_plain_store),
                                          ("_read", read_with_a_plain_load)])
def test_a_descriptor_written_or_read_without_an_atomic_is_a_race(small_tiles, monkeypatch, name, broken):
    """The look-back's one rule: a descriptor crosses between blocks through atomics only. A plain store
    (or load) in place of one leaves the two blocks unordered, which a GPU may show as a torn or stale
    word; the simulator's race checker reports it at once."""
    from workbench.simulator import RaceError

    x = np.ones(3 * small_tiles, np.float32)
    assert np.array_equal(scan_on_device(x), np.arange(1, x.size + 1))  # the stage as written: no race
    clear_scratch()
    monkeypatch.setattr(scan, name, broken)
    with pytest.raises(RaceError, match=r"state\[\d+\]"):
        scan_on_device(x)


# -- on a GPU ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_views_off_a_16_byte_boundary_and_calls_in_a_row_on_the_gpu():
    rng = np.random.default_rng(7)
    for n in [1, scan.ONE_PASS_TILE - 1, scan.ONE_PASS_TILE + 1, 300 * scan.ONE_PASS_TILE + 3]:
        x = rng.uniform(-1.0, 2.0, n + 1).astype(np.float32)
        ref = inclusive_scan(x[1:])
        d_x = cuda.to_device(x)
        d_y = cuda.device_array(n + 1, np.float32)
        aligned_x, aligned_y = cuda.to_device(x[1:]), cuda.device_array(n, np.float32)
        for _ in range(3):  # each call resets the descriptors for the next: alternate the two kinds
            STAGE(d_x[1:], d_y[1:])  # 4 bytes past an aligned start: element by element
            STAGE(aligned_x, aligned_y)  # 16-byte vectors
            for y in (d_y.copy_to_host()[1:], aligned_y.copy_to_host()):
                err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
                assert err <= op.tolerance_for((n,), np.float32), (n, err)


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_at_85_percent_of_copy_and_at_least_torch_cumsum():
    """At 2^28 floats, in one run: decoupled_lookback reaches >= 85% of the copy bandwidth measured now
    (4 bytes read and 4 written an element) and is no slower than torch.cumsum."""
    from tests.headline import headline

    peaks, stages, peer = headline(op)
    best = stages[-1]
    assert best["stage"] == "decoupled_lookback", best["stage"]
    assert best["gbps"] >= 0.85 * peaks["copy_gbps"], (best["gbps"], peaks["copy_gbps"])
    assert peer is not None, "torch is needed for the comparison"
    assert best["median_us"] <= peer["median_us"], (best["median_us"], peer["stage"], peer["median_us"])
