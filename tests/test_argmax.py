"""Argmax ladder: what its last stage (one_pass) adds. Ties across its 16-byte vectors, across the loads of
one step, across threads and across blocks go to the lowest index; a view's unaligned head is read first;
the ticket resets between calls; the loads are 16 bytes wide. `-m gpu`: the issue's target against
torch.argmax at 2^28 floats."""

import numpy as np
import pytest

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from numba import cuda

from solutions import argmax
from tests.load4_calls import record_load4

op = argmax.op
STRIDE = argmax.THREADS  # one block: the grid stride in vectors
# One block of 256 threads: a step covers 4 * 256 vectors (elements 0 .. 4095), the remainder loop the
# next 300 vectors (threads 0 .. 299), and 3 elements are left for the tail.
N = 4 * (argmax.VECTORS_PER_STEP * STRIDE + 300) + 3


def run(x, blocks=1, head=0):
    out = cuda.to_device(np.full(1, -1, np.int32))
    argmax.one_pass_with(cuda.to_device(x), out, blocks, head)
    return int(out.copy_to_host()[0])


def with_ties(n, positions, rng, top=np.float32(7.0)):
    x = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    x[list(positions)] = top
    return x


@pytest.mark.parametrize("positions", [
    (1, 2),  # inside one float4
    (3, 4),  # the last element of thread 0's first vector, the first of thread 1's
    (3, 4 * STRIDE),  # thread 0: its first load of a step and its second
    (4 * STRIDE + 3, 8 * STRIDE),  # thread 0: second and third load of the step
    (8 * STRIDE + 3, 12 * STRIDE),  # thread 0: third and fourth
    (4 * STRIDE + 2, 12 * STRIDE + 1),  # thread 0: second and fourth
    (21, 4 * (4 * STRIDE + 5)),  # thread 5: the unrolled step, then the remainder loop
    (0, N - 3),  # thread 0: its first element and its tail element
    (4 * STRIDE - 1, 4 * STRIDE),  # thread 255's first vector, thread 0's second: two warps
    (N - 3, N - 2),  # the tail only, two threads
], ids=lambda p: f"{p[0]}-{p[1]}")
def test_ties_go_to_the_lowest_index(positions):
    x = with_ties(N, positions, np.random.default_rng(1))
    assert run(x) == min(positions) == np.argmax(x)


def test_ties_across_blocks_go_to_the_lowest_index():
    """Three blocks: block 2's first vectors hold a lower index than block 0's second load. The block
    winners arrive in block order, not index order, so the last block must compare (value, index) pairs."""
    blocks = 3
    stride = blocks * argmax.THREADS
    in_block_2 = 4 * (2 * argmax.THREADS + 10) + 1  # thread 522's first vector
    in_block_0 = 4 * (stride + 10) + 1  # thread 10's second load
    in_block_1 = 4 * (3 * stride + argmax.THREADS + 7)  # thread 263's fourth load
    x = with_ties(4 * 4 * stride + 5, (in_block_0, in_block_1, in_block_2), np.random.default_rng(2))
    assert run(x, blocks) == in_block_2 == np.argmax(x)
    x[in_block_2] = np.float32(-1.0)  # now blocks 0 and 1 tie: block 0's index is lower
    assert run(x, blocks) == in_block_0 == np.argmax(x)


@pytest.fixture
def vector_loads(monkeypatch):
    """The index of every load4 the kernel makes, through the simulator's load4 (which, unlike the GPU's,
    would read from any index)."""
    return record_load4(lambda load4: monkeypatch.setattr(argmax, "load4", load4))


@pytest.mark.parametrize("head", [0, 1, 2, 3])
def test_vector_loads_start_on_16_byte_boundaries(vector_loads, head):
    """x[head] is the first element on a 16-byte boundary: every load4 reads from one, and together they
    cover x[head:] but its last (n - head) % 4 elements, each element once."""
    n = 4 * (argmax.VECTORS_PER_STEP * STRIDE + 37) + 3  # one step, the remainder loop and a tail
    x = with_ties(n, (n - 1,), np.random.default_rng(head))
    assert run(x, head=head) == n - 1
    assert all((i - head) % 4 == 0 for i in vector_loads)
    assert sorted(vector_loads) == list(range(head, head + 4 * ((n - head) // 4), 4))


@pytest.mark.parametrize("head", [1, 2, 3])
def test_an_unaligned_head_is_read_first(head):
    """A view that starts mid-buffer: x[:head] read singly (the simulator's arrays are always aligned, so
    the head is chosen here), the rest as vectors from x[head]."""
    rng = np.random.default_rng(head)
    n = 4 * STRIDE + 4 * 5 + 2 + head
    x = with_ties(n, (head - 1, head), rng)  # the last of the head and the first of the vectors
    assert run(x, head=head) == head - 1
    x = with_ties(n, (head, n - 1), rng)  # the first vector and the tail
    assert run(x, head=head) == head
    x = with_ties(n, (n - 1,), rng)
    assert run(x, head=head) == n - 1
    assert run(with_ties(head, (head - 1,), rng), head=head) == head - 1  # a vector all head


def test_ticket_resets_between_calls():
    rng = np.random.default_rng(3)
    for blocks, position in [(2, 900), (3, 5000), (1, 7), (2, 4000)]:
        x = with_ties(6000, (position,), rng)
        assert run(x, blocks) == position
        assert argmax.scratch("argmax.one_pass.blocks_done", 1, np.int32, zeroed=True).copy_to_host()[0] == 0


@pytest.mark.slow
def test_one_pass_reads_16_bytes_per_load():
    """On sm_90 the kernel's loads of x are ld.global.v4.f32: four a step and one in the remainder loop."""
    import subprocess
    import sys

    code = """
import workbench
from numba import cuda
from numba.cuda import types
from solutions import argmax
f32, i32 = types.Array(types.float32, 1, "C"), types.Array(types.int32, 1, "C")
ptx, _ = cuda.compile_ptx(argmax._one_pass.py_func, (f32, types.int64, f32, i32, i32, i32), cc=(9, 0))
print(ptx)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "WORKBENCH_MODE": "compile"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("ld.global.v4.f32") >= argmax.VECTORS_PER_STEP + 1, done.stdout[-3000:]


# -- on a GPU -----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.timing
def test_headline_at_least_torch_argmax():
    """At 2^28 floats (the issue's target, on an H200): the last stage at least as fast as torch.argmax,
    measured in the same run."""
    from tests.headline import headline

    _, stages, peer = headline(op)
    assert peer is not None, "torch (or CuPy) is needed for the comparison"
    last = stages[-1]
    assert last["median_us"] <= peer["median_us"], (last["stage"], last["median_us"], peer["stage"], peer["median_us"])
