# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/histogram.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade histogram            (or histogram.<stage>)
# The grader checks each stage against the operator in solutions/histogram.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: ba6608ad9f700513e2ff8de44b26f35ccb7c1f449c239593cacc9eb6fe840d1b
# --------------------------------------------------------------------------------------------------
"""Histogram of a uint8 vector into 256 int32 bins: out[b] = number of i with x[i] == b.

The interview question: many threads want to increment the same counter at once. Atomic adds make
that correct; the lesson is where the atomics land. Thousands of threads hammering 256 global
counters queue up behind each other (worst when the data is skewed: an image that is mostly
background sends most elements to one bin). Giving every block a private copy of the bins in
shared memory moves the contention to fast on-chip atomics, and each block then adds its 256
counts to the global bins once.

A histogram reads each byte once and writes 256 counts: n + 1 KiB of traffic, one increment per
element. Counts are integers: they must be exact (the grader compares with tolerance 0).

Constraints: x is uint8, 1-D, contiguous, n >= 1 (any n up to 2^31 - 1); out is int32 of shape
(256,). The stage overwrites out (it must zero it first); x is never written.
"""

import numpy as np
from numba import cuda, int32

from workbench import peers
from workbench.ladder import Operator, blocks_for, expect_device_array, sm_count

BINS = 256
THREADS = 256
ELEMENTS_PER_THREAD = 16  # the grid is sized so that each thread counts about this many elements


def _inputs(size, rng):
    (n,) = size
    # Skewed like real data: half the elements fall in one hot bin (contention), the rest are
    # uniform over all 256 values (so bins 0 and 255 are exercised too).
    x = rng.integers(0, BINS, n, dtype=np.uint8)
    hot = rng.random(n) < 0.5
    x[hot] = rng.integers(0, BINS)
    return (x,)


def _adversarial(size, rng):
    """Inputs random draws never produce, checked beside the random ones (``workbench check``, the grader)."""
    (n,) = size
    # Only the two edge values, 0 and 255: a table of 255 bins, or a loop over bins that stops one
    # early (zeroing, flushing), gets bin 255 wrong.
    edges = rng.choice(np.array([0, BINS - 1], np.uint8), n)
    # Every element in one bin: every increment of the launch contends for the same counter.
    one_bin = np.full(n, rng.integers(0, BINS), np.uint8)
    return [("edge-bins", (edges,)), ("all-one-bin", (one_bin,))]


def _validate(x, out):
    expect_device_array("x", x, dtype=np.uint8, ndim=1)
    expect_device_array("out", out, dtype=np.int32, shape=(BINS,))


def _peer(size):
    torch = peers.torch()
    if torch is not None:
        def run(x, out):
            peers.as_torch(out).copy_(torch.bincount(peers.as_torch(x), minlength=BINS))
        return "torch.bincount", run
    cupy = peers.cupy()
    if cupy is not None:
        def run_cupy(x, out):
            peers.as_cupy(out)[...] = cupy.bincount(peers.as_cupy(x), minlength=BINS)
        return "cupy.bincount", run_cupy
    return None


op = Operator(
    name="histogram",
    title="256-bin histogram of a uint8 vector",
    reference=lambda x: np.bincount(x, minlength=BINS).astype(np.int64),
    make_inputs=_inputs,
    make_output=lambda size: np.empty(BINS, np.int32),
    bytes_moved=lambda size: size[0] + 4 * BINS,
    pattern="read",  # every input byte read once, a few bins written: the read-only ceiling
    flops=lambda size: size[0],
    validate=_validate,
    tolerance=lambda size, dtype: 0.0,  # counts are exact
    peer=_peer,
    adversarial_inputs=_adversarial,
    dtype=np.int32,
    check_sizes=[1, 31, 1000, 1_000_003, 2**24 + 1, 2**28],
    sim_sizes=[1, 31, 33, 1000, 4099],
    bench_sizes=[2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28],
    headline_size=(2**28,),
    rank=130,
    group="The interview set: scan, histogram, argmax, matrix-vector, stencil",
    grade_sizes={"sim": [(1025,), (8195,)], "gpu": [(2**20 + 3,), (255,), (132 * 8 * 4096 + 1,)]},
)


@cuda.jit
def _zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def _grid(n):
    """Blocks for about ELEMENTS_PER_THREAD elements per thread, never more than fill the GPU."""
    return min(blocks_for(n, THREADS * ELEMENTS_PER_THREAD), sm_count() * (2048 // THREADS))


# -- 1. global atomics ---------------------------------------------------------------------------

@cuda.jit
def _global_atomics(x, out):
    # EXERCISE: write this part of `_global_atomics`. Read the hints one at a time.
    #   hint 1 (nudge): Walk the input with a grid-stride loop; each element adds 1 to the bin its value names.
    #   hint 2: Many threads hit the same bin at once: a plain out[b] += 1 loses updates. cuda.atomic.add(array, index, value) does not.
    #   hint 3 (nearly the answer): for i in range(cuda.grid(1), x.size, cuda.gridsize(1)): cuda.atomic.add(out, x[i], int32(1))
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("global_atomics", """
    Zero the 256 bins, then every thread walks the input with a grid-stride loop (coalesced reads)
    and adds 1 to its element's bin with an atomic add in global memory. Correct for any data, but
    every increment is a round trip to the L2 cache, and increments to the same bin are serialised
    there: with half the data in one hot bin, the whole GPU waits on one address.""")
def global_atomics(x, out):
    _zero_bins[1, BINS](out)
    _global_atomics[_grid(x.size), THREADS](x, out)


# -- 2. shared-memory privatisation --------------------------------------------------------------

@cuda.jit
def _shared_privatized(x, out):
    bins = cuda.shared.array(BINS, int32)  # this block's private histogram (starts as garbage)
    t = cuda.threadIdx.x
    # EXERCISE: write this part of `_shared_privatized`. Read the hints one at a time.
    #   hint 1 (nudge): Three phases, separated by barriers: zero the block's shared bins, count into them, add them to the global bins.
    #   hint 2: Shared memory starts as garbage: zero bins[t] first, and cuda.syncthreads() before any thread counts (and again before the flush, so every count is in).
    #   hint 3 (nearly the answer): bins[t] = 0 (THREADS == BINS); syncthreads; grid-stride: cuda.atomic.add(bins, x[i], int32(1)); syncthreads; if bins[t] != 0: cuda.atomic.add(out, t, bins[t]).
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@op.stage("shared_privatized", """
    Each block counts into its own 256 bins in shared memory (zeroed first: shared memory starts as
    garbage), then adds its non-zero counts to the global bins: one global atomic per bin per block
    instead of one per element. Shared-memory atomics are resolved on the multiprocessor, many
    times faster than a trip to L2, and the hot bin is now contended only within a block, never
    across the whole GPU.""")
def shared_privatized(x, out):
    _zero_bins[1, BINS](out)
    _shared_privatized[_grid(x.size), THREADS](x, out)
