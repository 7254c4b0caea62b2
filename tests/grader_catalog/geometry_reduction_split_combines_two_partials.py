# WRONG (a split schedule that assumes the simulator's two SMs): reduction.coalesced launches one block per
# multiprocessor, each block grid-strides and leaves its partial sum in a scratch slot, and a second
# kernel adds slots 0 and 1 only. Right on a device of 2 SMs (the grader's simulated one, once), wrong
# on any other: the grader also grades a case on a simulated device of 5 SMs.
"""reduction.coalesced: a persistent grid of one block per SM, its partials combined as if there were two."""

from numba import cuda, float32

from workbench.ladder import scratch, sm_count

EXPECT = {"target": "reduction.coalesced", "class": "geometry", "verdict": "reject",
          "reasons": ["wrong-values"], "cpu": True, "quick": True}

THREADS = 128


@cuda.jit
def _partials(x, slots):
    total = cuda.shared.array(1, float32)
    if cuda.threadIdx.x == 0:
        total[0] = float32(0.0)
    cuda.syncthreads()
    acc = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        acc += x[i]
    cuda.atomic.add(total, 0, acc)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        slots[cuda.blockIdx.x] = total[0]


@cuda.jit
def _combine(slots, out):
    out[0] = slots[0] + slots[1]  # BUG: as many slots as SMs, not two


def coalesced(x, out):
    blocks = max(2, sm_count())
    slots = scratch("slots", (blocks,))
    _partials[blocks, THREADS](x, slots)
    _combine[1, 1](slots, out)
