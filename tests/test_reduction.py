"""The reduction ladder on a GPU: the issue's targets (correctness and sm_90 compilation of every stage
are tests/test_ladders.py's)."""

import numpy as np
import pytest

from solutions import reduction
from tests.load4_calls import record_load4
from workbench.check import adversarial_cases, check_stage
from workbench.ladder import scratch, to_device

VECTOR_LOADS = reduction.op["vector_loads"]


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_must_show():
    """At 2^28 floats: the last stage reaches >= 90% of measured copy bandwidth, and each stage is faster
    than the one before (measured in one run)."""
    from tests.headline import headline

    peaks, stages, _ = headline(reduction.op)
    times = [r["median_us"] for r in stages]
    assert all(a > b for a, b in zip(times, times[1:])), times
    assert stages[-1]["gbps"] >= 0.9 * peaks["copy_gbps"]


@pytest.mark.gpu
@pytest.mark.timing
def test_headline_at_least_torch_sum():
    from tests.headline import headline

    _, stages, peer = headline(reduction.op)
    if peer is None:
        pytest.skip("no library peer installed")
    assert stages[-1]["gbps"] >= peer["gbps"]


# -- vector_loads: 16-byte loads --------------------------------------------------------------------

def _checked(stage, n, seed):
    rng = np.random.default_rng(seed)
    results = [check_stage(stage, (n,), rng)]
    results += [check_stage(stage, (n,), inputs=inputs, label=label)
                for label, inputs in adversarial_cases(stage.op, (n,), rng)]
    return [f"{r.key} @ {n} ({r.inputs}): {r.message}" for r in results if r.failed]


@pytest.mark.parametrize("n", [1, 3, 5, 1029, 4095])
def test_vector_loads_at_awkward_sizes(n):
    """One block: no whole vector (1, 3), one vector and a tail of one (5), the one-vector loop and a tail
    of one (1029), and at 4095 threads 0-254 take the four-vector loop once, thread 255 the one-vector
    loop three times, threads 0-2 the tail of three."""
    assert not _checked(VECTOR_LOADS, n, n)


@pytest.mark.slow
@pytest.mark.parametrize("n", [4096, 8191, 3 * 4096 + 4 * 256 * 3 + 6])
def test_vector_loads_over_several_blocks(n):
    """Every thread's four-vector loop exactly once (4096); two and four blocks, whose sums the last block
    to finish adds up, with leftover vectors and a tail."""
    assert not _checked(VECTOR_LOADS, n, n)


@pytest.fixture
def vector_loads(monkeypatch):
    """The index of every load4 the kernel makes, through the simulator's load4 (which, unlike the GPU's,
    would read from any index)."""
    return record_load4(lambda load4: monkeypatch.setattr(reduction, "load4", load4))


@pytest.mark.parametrize("n", [4095, 4098])
def test_vector_loads_read_each_whole_vector_once_from_a_16_byte_boundary(vector_loads, n):
    """Every load4 starts on a multiple of 4 elements, and together they cover x but its last n % 4
    elements, each element once (the tail is read one element at a time)."""
    x = np.random.default_rng(n).uniform(-1.0, 2.0, n).astype(np.float32)
    out = to_device(np.zeros(1, np.float32))
    VECTOR_LOADS(to_device(x), out)
    assert sorted(vector_loads) == list(range(0, 4 * (n // 4), 4))
    np.testing.assert_allclose(out.copy_to_host(), reduction.op.reference(x), rtol=1e-5)


def test_a_view_that_starts_mid_buffer_takes_the_fused_kernel(monkeypatch):
    """On a GPU a view 4 bytes past a 16-byte boundary would fault in a 16-byte load: the launcher asks
    aligned16 and takes the fused stage's kernel. (The simulator counts every array as aligned: here
    aligned16 is told to say no, and the vector kernel to fail if it is launched.)"""
    launched = []

    class Refused:
        def __getitem__(self, config):
            launched.append(config)
            raise AssertionError("the 16-byte kernel was launched on a misaligned view")

    monkeypatch.setattr(reduction, "aligned16", lambda *arrays: False)
    monkeypatch.setattr(reduction, "_vector_loads", Refused())
    x = np.random.default_rng(7).uniform(-1.0, 2.0, 1030).astype(np.float32)
    out = to_device(np.zeros(1, np.float32))
    VECTOR_LOADS(to_device(x)[1:], out)
    assert not launched
    np.testing.assert_allclose(out.copy_to_host(), reduction.op.reference(x[1:]), rtol=1e-5)


def test_vector_loads_ticket_resets_between_calls():
    """The last block resets the counter of finished blocks, so a second call (another size, another
    grid) again finds its last block."""
    rng = np.random.default_rng(3)
    for n in (4099, 1, 4099, 33):
        x = rng.uniform(-1.0, 2.0, n).astype(np.float32)
        out = to_device(np.zeros(1, np.float32))
        VECTOR_LOADS(to_device(x), out)
        np.testing.assert_allclose(out.copy_to_host(), reduction.op.reference(x), rtol=1e-5)
        assert scratch("reduction.vector_loads.blocks_done", 1, np.int32, zeroed=True).copy_to_host()[0] == 0


@pytest.mark.gpu
def test_a_misaligned_view_takes_the_fused_kernel_on_the_gpu():
    x = np.random.default_rng(2).uniform(-1.0, 2.0, 1_000_003).astype(np.float32)
    d_x = to_device(x)
    out = to_device(np.zeros(1, np.float32))
    VECTOR_LOADS(d_x[1:], out)  # 4 bytes past a 16-byte boundary
    np.testing.assert_allclose(out.copy_to_host(), reduction.op.reference(x[1:]), rtol=1e-5)
