# WRONG (numeric trap, a fencepost): allreduce.two_shot whose reduce-scatter cuts the buffer into slices
# of n // N elements. When n is not a multiple of N the last n % N elements belong to no rank: nobody
# sums them and nobody gathers them, so every rank's output keeps its poison there (and with n < N the
# slices are empty and nothing is written at all). Right whenever N divides n, as at a tidy size tried
# by hand; the grader's sizes (101 over 2 ranks, 100 over 3, 257 over 4) leave a tail.
"""allreduce.two_shot: slices of n // N elements, the tail of the buffer never summed."""

from numba import cuda

EXPECT = {"target": "allreduce.two_shot", "class": "numeric", "verdict": "reject",
          "reasons": ["unwritten"], "cpu": True}

THREADS = 128


@cuda.jit
def _reduce_scatter(sends, recv, lo, hi):
    for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
        acc = sends[0][i]
        for s in range(1, len(sends)):
            acc += sends[s][i]
        recv[i] = acc


@cuda.jit
def _all_gather(recvs, rank, chunk):
    mine = recvs[rank]
    for owner in range(len(recvs)):
        if owner != rank:
            for i in range(owner * chunk + cuda.grid(1), (owner + 1) * chunk, cuda.gridsize(1)):
                mine[i] = recvs[owner][i]


def two_shot(x, out):
    ranks, n = x.shape
    chunk = n // ranks  # BUG: rounds down; the slices must be ceil(n / ranks) long, the last ones cut at n
    sends = tuple(x[r] for r in range(ranks))
    recvs = tuple(out[r] for r in range(ranks))
    blocks = max(1, -(-n // THREADS))
    for r in range(ranks):  # the emulated ranks run one after another: every slice is summed before any gather
        _reduce_scatter[blocks, THREADS](sends, recvs[r], r * chunk, (r + 1) * chunk)
    for r in range(ranks):
        _all_gather[blocks, THREADS](recvs, r, chunk)
