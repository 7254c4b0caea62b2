"""BatchNorm (solutions/batchnorm.py) and its fold into the convolution before it (solutions/conv_bn.py):
what is specific to them. Every stage's correctness at the simulator sizes and its sm_90 compile are
tests/test_ladders.py's; here the paths those tiny sizes do not take, and on a GPU the ladders' targets."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from workbench.check import check_stage

from solutions import batchnorm


# -- the vector stages: the paths the simulator sizes do not take ------------------------------------------

def test_bn_normalize_kernel_takes_its_four_vectors_in_flight_path():
    """The simulator sizes are under one block's 4096 elements, so every thread there takes the
    one-vector-at-a-time branch. 1x2x41x43 (3526 elements, planes of 1763: vectors straddle planes)
    sends threads 0-112 down the four-loads-then-four-stores branch, the rest down the other."""
    rng = np.random.default_rng(3)
    result = check_stage(batchnorm.bn_infer_op["vectors"], (1, 2, 41, 43), rng)
    assert result.passed, result.message


def test_bn_train_vector_passes_keeps_a_channel_at_1e4_exact():
    """The adversarial input (a channel of mean 1e4 and std 1, and a constant channel) at a size whose
    planes start off 16-byte boundaries (H*W = 15): the head and tail of each plane take single loads."""
    size = (3, 2, 3, 5)
    (label, inputs), = batchnorm.bn_op.adversarial_inputs(size, np.random.default_rng(5))
    result = check_stage(batchnorm.bn_op["vector_passes"], size, np.random.default_rng(5), inputs=inputs, label=label)
    assert result.passed, result.message


@pytest.mark.slow  # the simulator sizes give each channel one statistics block; this one gives it two
def test_bn_train_vector_passes_combines_the_partials_of_several_blocks():
    size = (2, 2, 33, 33)  # 2178 elements a channel: two blocks, each a plane of 1089 (unaligned starts)
    result = check_stage(batchnorm.bn_op["vector_passes"], size, np.random.default_rng(4))
    assert result.passed, result.message



# -- the chunk kernels: batchnorm[infer].one_launch and batchnorm[train].reverse_chunks -----------------------

CHUNK_STAGES = [batchnorm.bn_infer_op["one_launch"], batchnorm.bn_op["reverse_chunks"]]


def _key(stage):
    return stage.key


def _check_with_adversaries(stage, size, seed):
    rng = np.random.default_rng(seed)
    result = check_stage(stage, size, rng)
    assert result.passed, (size, result.message)
    for label, inputs in stage.op.adversarial_inputs(size, np.random.default_rng(seed)):
        result = check_stage(stage, size, np.random.default_rng(seed), inputs=inputs, label=label)
        assert result.passed, (size, label, result.message)


@pytest.mark.parametrize("stage", CHUNK_STAGES, ids=_key)
@pytest.mark.parametrize("size", [(1, 3, 5, 7), (2, 5, 3, 3), (3, 7, 2, 2), (2, 3, 1, 3), (1, 1, 1, 1)])
def test_chunk_stages_at_awkward_sizes(stage, size):
    """H*W = 35 and 9 (planes start off 16-byte boundaries: head and tail elements), 4 (whole vectors
    only), 3 and 1 (no whole vector: the edges alone); C = 3, 5, 7, 1; N = 1 to 3."""
    _check_with_adversaries(stage, size, seed=sum(size))


@pytest.mark.slow  # thousands of elements a plane
@pytest.mark.parametrize("stage", CHUNK_STAGES, ids=_key)
@pytest.mark.parametrize("size", [(1, 3, 37, 113), (2, 3, 21, 37)])
def test_chunk_stages_at_larger_planes(stage, size):
    """H*W = 4181 is 1045 whole vectors a plane: two chunks of 256 lanes x 4 vectors, the second mostly
    idle; H*W = 777 (194 vectors) gives a chunk 64 lanes, four planes a block. Both start planes off
    16-byte boundaries."""
    _check_with_adversaries(stage, size, seed=sum(size))


def test_chunk_geometry_at_the_bench_sizes():
    """(lane_bits, chunks a plane, items, blocks): a 56x56 plane (784 vectors) is one chunk of 256 lanes;
    a 28x28 plane (196) one of 64 lanes, four a block; a 14x14 plane (49) one of 32 lanes, eight a block."""
    assert batchnorm._chunk_grid(128, 64, 56 * 56) == (8, 1, 8192, 8192)
    assert batchnorm._chunk_grid(32, 128, 28 * 28) == (6, 1, 4096, 1024)
    assert batchnorm._chunk_grid(32, 256, 14 * 14) == (5, 1, 8192, 1024)
    assert batchnorm._chunk_grid(1, 3, 4181) == (8, 2, 6, 6)


@pytest.mark.parametrize("stage", CHUNK_STAGES, ids=_key)
def test_chunk_stages_stride_over_the_chunks_with_a_machine_sized_grid(stage, monkeypatch):
    """CHUNK_BLOCKS_PER_SM = 1 on a simulated GPU of one multiprocessor: one block, its 8 groups of 32
    lanes taking the 15 planes in turn."""
    from workbench.simulator import simulated_sm_count

    monkeypatch.setattr(batchnorm, "CHUNK_BLOCKS_PER_SM", 1)
    with simulated_sm_count(1):
        _check_with_adversaries(stage, (3, 5, 3, 5), seed=2)


def test_reverse_chunks_in_either_order(monkeypatch):
    monkeypatch.setattr(batchnorm, "NORMALIZE_IN_REVERSE", False)
    _check_with_adversaries(batchnorm.bn_op["reverse_chunks"], (2, 3, 3, 5), seed=6)


@pytest.mark.parametrize("stage", CHUNK_STAGES, ids=_key)
def test_chunk_kernels_read_each_whole_vector_of_a_plane_once(stage, monkeypatch):
    """Planes of 35 elements start off 16-byte boundaries: the 16-byte loads start on multiples of 4,
    cover each plane's whole vectors once, and no vector crosses into the next plane."""
    from tests.load4_calls import record_load4

    calls = record_load4(lambda load4: monkeypatch.setattr(batchnorm, "chunk_load4", load4))
    size = (2, 3, 5, 7)
    result = check_stage(stage, size, np.random.default_rng(1))
    assert result.passed, result.message
    HW = 35
    expected = [i for p in range(2 * 3) for i in range(-(-p * HW // 4) * 4, (p * HW + HW) // 4 * 4, 4)]
    assert sorted(calls) == expected


@pytest.mark.parametrize("stage", CHUNK_STAGES, ids=_key)
def test_a_view_that_starts_mid_buffer_takes_the_previous_stage(stage, monkeypatch):
    """The simulator counts every array as aligned: aligned16 is told to say no, and the chunk kernels to
    fail if they are launched."""
    class Refused:
        def __getitem__(self, config):
            raise AssertionError("a chunk kernel was launched on a misaligned view")

    monkeypatch.setattr(batchnorm, "aligned16", lambda *arrays: False)
    monkeypatch.setattr(batchnorm, "_bn_infer_chunks", Refused())
    monkeypatch.setattr(batchnorm, "_bn_apply_chunks", Refused())
    result = check_stage(stage, (2, 3, 2, 3), np.random.default_rng(8))
    assert result.passed, result.message


# -- conv2d[bn_folded]: the fold's rounding -----------------------------------------------------------------------

@pytest.mark.slow  # two simulated implicit GEMM blocks per stage: seconds each
def test_folded_weights_stays_within_tolerance_on_a_tiny_variance_channel():
    """A channel with a variance 1e4 times smaller than the others has a scale 100 times larger: its
    folded weights span a wider range and its bias beta - mean * s is a difference of large numbers.
    Both stages must stay within the operator's tolerance there."""
    from solutions import conv_bn

    size = (1, 2, 7, 9, 5)
    inputs = conv_bn.tiny_variance_inputs(size, np.random.default_rng(9))
    for stage in conv_bn.op.stages:
        result = check_stage(stage, size, np.random.default_rng(9), inputs=inputs, label="tiny-variance")
        assert result.passed, (stage.key, result.message)


# -- on a GPU: the targets at 128x64x56x56 ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("op", batchnorm.OPERATORS, ids=lambda o: o.name)
def test_batchnorm_final_stages_correct_at_the_headline(op):
    result = check_stage(op.stages[-1], op.headline_size, np.random.default_rng(0))
    assert result.passed, result.message


@pytest.mark.gpu
@pytest.mark.timing
def test_batchnorm_train_vector_passes_beats_torch_by_half():
    """BatchNorm training at least 1.5x torch at N128 C64 56x56."""
    from tests.headline import headline

    _, stages, peer = headline(batchnorm.bn_op)
    times = {r["stage"]: r["median_us"] for r in stages}
    assert peer is not None
    assert peer["median_us"] / times["vector_passes"] >= 1.5, (times, peer["median_us"])


@pytest.mark.gpu
@pytest.mark.timing
def test_batchnorm_infer_vectors_at_least_torch():
    from tests.headline import headline

    _, stages, peer = headline(batchnorm.bn_infer_op)
    times = {r["stage"]: r["median_us"] for r in stages}
    assert peer is not None
    assert peer["median_us"] / times["vectors"] >= 1.0, (times, peer["median_us"])
