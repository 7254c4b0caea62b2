# --------------------------------------------------------------------------------------------------
# EXERCISE generated from solutions/allreduce.py by `workbench exercises build`. This copy is yours:
# fill in every block marked TODO(exercise), then grade it:
#     workbench grade allreduce            (or allreduce.<stage>; its other operators: allreduce[rmsnorm])
# The grader checks each stage against the operator in solutions/allreduce.py (reference, inputs,
# tolerance): the copy of it below is for reading, editing it changes nothing. Every output element
# is checked, on fresh random inputs at sizes that are not multiples of the block, after the output
# was filled with poison. On a GPU each stage must also reach 60% of the
# speed of the solution's stage, measured in the same run.
# `workbench exercises build` never overwrites this file once you have edited it (the line below
# tells it whether you have). `workbench exercises reset OP[.STAGE]` gives you a fresh stub back
# and keeps your version beside it as a .bak file.
# generated-sha256: ce74c5849530445460877f5a6dd67003c818367ae1579d63290fbf1cb958842c
# --------------------------------------------------------------------------------------------------
"""AllReduce: every GPU holds a float32 buffer, and every GPU ends up with the sum of all of them.

This is what data- and tensor-parallel training stands on: after each backward pass (or each
row-parallel linear layer) the N GPUs of a group add their buffers and each keeps the total. The
ladder builds it the way NCCL does, over the GPUs of one host that read and write each other's
memory over NVLink:

* naive: copy every buffer to GPU 0, add there, copy the sum back: GPU 0's links carry everything;
* one-shot: every GPU reads every other GPU's buffer and adds: one step, the least latency;
* two-shot: reduce-scatter (GPU r sums slice r from all GPUs) then all-gather (each GPU fetches the
  finished slices): every link carries only 2(N-1)/N of the data;
* ring: the same traffic over neighbours only, in 2(N-1) steps;
* ring_pipelined: the ring's chunks cut into pieces, each waiting only for the same piece at the
  left neighbour, not for every rank at every step;
* flags: one kernel per GPU that synchronises with the others through flags in memory instead of
  host events, and pushes its sums straight into the other GPUs' buffers;
* lamport: one kernel per GPU that pushes its whole buffer into every other GPU's mailboxes, where
  each value is its own signal: no flag, no fence, no barrier; the least latency for small messages.

The fused operator (allreduce[rmsnorm]) adds the residual and normalises in the same kernels: the
epilogue of a tensor-parallel transformer block, beside NCCL followed by the separate kernels.

**Ranks.** A *rank* is one participant: its input buffer ``send`` and its output buffer ``recv``
(NCCL's sendbuff and recvbuff; the all-reduce is out of place: a one-shot kernel that wrote its sum
over its own input while a peer was still reading it would race). A :class:`Group` holds the ranks
and knows how each reaches the others' buffers. On a host with several GPUs rank r lives on GPU r
and sees its peers' buffers through peer pointers (``Group.on_gpus``, used by
``workbench record`` on a machine with several GPUs). Without a GPU, or with one, the ranks are *emulated*: rank r's buffers
are row r of an (N, n) array on one device (``Group.emulated``). The same kernels run either way,
so the stages below take ``x`` of shape (N, n) (row r: rank r's input) and write ``out`` of the same
shape (every row: the sum), and are checked in the simulator like any other ladder.

**Synchronisation.** A GPU must not read a peer's buffer before the peer has finished writing it,
and must not let its caller reuse its own buffers while a peer may still read them. Stages 1-4 put
a :meth:`Group.barrier` between such steps: on several GPUs, an event recorded on each rank's stream
that every other rank's stream waits for. Stage 5 lets one rank wait for one other instead
(:meth:`Group.record` and :meth:`Group.wait`: one event, one stream waiting on it). Emulated ranks
share one stream, so they cannot run at the same time; to make a missing barrier or wait show
anyway, at a barrier each rank runs what it was given as far as its waits let it, the highest rank
first, and again until all are done: a rank that reads a peer's result without a barrier or wait in
between reads it before the peer has computed it (``tests/test_allreduce.py`` checks that a two-shot
without its barrier, and a pipelined ring without its waits, fail).

**Bytes.** The model here is the one-device figure: every rank's input read once and every rank's
result written once, 8 N n bytes. Across GPUs, nccl-tests' bus bandwidth 2(N-1)/N * 4n / time is
what compares with the links (``busbw_bytes``; ``workbench/tools/allreduce.py`` reports it).
"""

import contextlib
import copy
import json
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint64

from workbench import device, library_peers as peers, results
from workbench.ladder import InputError, Operator, expect_device_array, scratch, sm_count

from solutions._ptx import mailbox_clear_f32x4, mailbox_store_f32x4, mailbox_wait_f32x4

THREADS = 128  # threads per block; a multiple of the 32-lane warp
FULL_MASK = 0xFFFFFFFF
UNROLL = 4  # elements each thread of the flag kernels sums per step: 4 N independent loads in flight
BLOCKS_PER_SM = 4  # the flag kernels' blocks per multiprocessor: few enough to be resident at once
# How many times a flag kernel polls a flag before it gives up and reports a hang (about a second
# on a GPU). A rank that never arrives (a peer that crashed, a grid too big to be resident) then
# becomes an error on the host instead of a GPU spinning forever.
MAX_POLLS = 1 << 20
POLL_NS = 64  # pause between two polls of a flag
EPS = np.float32(1e-5)  # RMSNorm's epsilon, as in layernorm.py (a float32 global: no float64 creeps in)


def busbw_bytes(size) -> float:
    """nccl-tests' bus bytes of an all-reduce of n floats over N ranks: 2(N-1)/N * 4n. A ring or a
    two-shot moves exactly this much over each rank's link, whatever N is, so busbw = bus bytes /
    time compares with the link's bandwidth (a rank sends (N-1)/N of the data while reducing and
    again while gathering)."""
    ranks, n = size[0], size[-1] if len(size) == 2 else int(np.prod(size[1:]))
    return 2.0 * (ranks - 1) / ranks * 4 * n


def slice_of(n: int, ranks: int, r: int) -> tuple[int, int]:
    """[lo, hi): the part of an n-element buffer rank r owns in a reduce-scatter. The first ranks get
    ceil(n / ranks) elements each; with n < ranks the last ones own nothing."""
    chunk = -(-n // ranks)
    lo = min(n, r * chunk)
    return lo, min(n, lo + chunk)


# -- the group of ranks ---------------------------------------------------------------------------

class Group:
    """The ranks of one all-reduce, and how each reaches the others' buffers.

    ``sends[r]`` and ``recvs[r]``: rank r's input and output, 1-D float32 device arrays of n elements
    in rank r's memory. ``gpus``: None when the ranks are emulated on the current device (one stream,
    work run at barriers: see the module's docstring); else ``gpus[r]`` is rank r's device, each rank
    has a stream of its own, and peers' buffers are reached through peer pointers.
    """

    def __init__(self, sends, recvs, gpus=None):
        if len(sends) != len(recvs) or not sends:
            raise InputError(f"a group needs one send and one recv buffer per rank; got {len(sends)} and {len(recvs)}")
        self.size = len(sends)
        self.n = int(sends[0].size)
        self.sends = list(sends)
        self.recvs = list(recvs)
        self.gpus = None if gpus is None else list(gpus)
        self._queued = [[] for _ in range(self.size)]
        self._views = {}
        self._events = None
        self._marks = {}  # (rank, mark) -> the event rank's stream records there (on GPUs)
        self._recorded = set()  # (rank, mark) recorded since the last barrier: a wait needs its record first
        self.streams = [0] * self.size
        if self.gpus is not None:
            self.streams = []
            for g in self.gpus:
                with cuda.gpus[g]:
                    self.streams.append(cuda.stream())

    @classmethod
    def emulated(cls, x, out):
        """N ranks on the current device: rank r's input is x[r], its output out[r]."""
        return cls([x[r] for r in range(x.shape[0])], [out[r] for r in range(out.shape[0])])

    @classmethod
    def on_gpus(cls, sends, recvs, gpus):
        """Rank r on GPU gpus[r], its buffers allocated there. Enables peer access between them."""
        enable_peer_access(gpus)
        return cls(sends, recvs, gpus)

    @property
    def emulating(self) -> bool:
        return self.gpus is None

    def peers(self, r, arrays) -> tuple:
        """``arrays`` (one per rank) as rank r's kernels address them: its own, and the others' through
        peer pointers (a DeviceNDArray built in rank r's context on the peer's address)."""
        if self.emulating:
            return tuple(arrays)
        views = []
        for s, a in enumerate(arrays):
            if s == r:
                views.append(a)
                continue
            key = (r, id(a))
            if key not in self._views:
                with cuda.gpus[self.gpus[r]]:
                    self._views[key] = (cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=a,
                                                                       sync=False), a)
            views.append(self._views[key][0])
        return tuple(views)

    def scratch(self, r, key, shape, dtype=np.float32, zeroed=False):
        """A workspace buffer in rank r's memory, kept across calls."""
        if self.emulating:
            return scratch(key, shape, dtype, zeroed)
        with cuda.gpus[self.gpus[r]]:
            return scratch(f"{key}@gpu{self.gpus[r]}", shape, dtype, zeroed)

    def launch(self, r, kernel, grid, block, *args):
        """``kernel[grid, block](*args)`` as rank r: on its device and stream (emulated: at the next barrier)."""
        if self.emulating:
            self._queued[r].append(lambda: kernel[grid, block](*args))
        else:
            with cuda.gpus[self.gpus[r]]:
                kernel[grid, block, self.streams[r]](*args)

    def with_buffers(self, sends, recvs):
        """The same ranks (devices, streams, work not yet run) with other buffers."""
        other = copy.copy(self)
        other.sends, other.recvs, other.n = list(sends), list(recvs), int(sends[0].size)
        other._events = None
        return other

    def copy(self, r, dst, src):
        """Rank r's stream copies device array ``src`` into ``dst`` (either may be a peer's: over NVLink)."""
        if self.emulating:
            self._queued[r].append(lambda: dst.copy_to_device(src))
        else:
            with cuda.gpus[self.gpus[r]]:
                dst.copy_to_device(src, stream=self.streams[r])

    def record(self, r, mark):
        """Rank r marks this point of its work: a peer's ``wait(..., r, mark)`` lets the peer go on only
        once rank r has finished everything it was given before the mark. (On GPUs: an event recorded
        on rank r's stream.)"""
        self._recorded.add((r, mark))
        if self.emulating:
            self._queued[r].append(_Record((r, mark)))
            return
        if (r, mark) not in self._marks:
            with cuda.gpus[self.gpus[r]]:
                self._marks[(r, mark)] = cuda.event(timing=False)
        with cuda.gpus[self.gpus[r]]:
            self._marks[(r, mark)].record(self.streams[r])

    def wait(self, r, s, mark):
        """Rank r goes past this point only once rank s has passed ``record(s, mark)``: one rank waits
        for one other, not all N for each other as at a barrier. The record must be given first: a
        stream waits for an event as it was last recorded when the wait is enqueued, so a wait given
        too early would pass on the previous call's record."""
        if (s, mark) not in self._recorded:
            raise RuntimeError(f"rank {r} waits for mark {mark} of rank {s}, which rank {s} has not recorded "
                               "since the last barrier: give the record first")
        if self.emulating:
            self._queued[r].append(_Wait((s, mark)))
            return
        with cuda.gpus[self.gpus[r]]:
            self._marks[(s, mark)].wait(self.streams[r])

    def barrier(self):
        """No rank goes past this point until every rank has finished what it was given before it."""
        self._recorded.clear()
        if self.emulating:
            # One device, one stream: the ranks take turns running what they were given, each turn as
            # far as the rank's waits let it go, until every rank is done. Every wait names a mark
            # given before it, so some rank can always go on: the loop ends.
            passed = set()  # (rank, mark) of every record run so far

            def held(item):
                return isinstance(item, _Wait) and item.key not in passed

            while any(self._queued):
                ready = [r for r, queue in enumerate(self._queued) if queue and not held(queue[0])]
                if not ready:
                    raise RuntimeError("emulated ranks wait for each other in a cycle")
                queue = self._queued[self._next_turn(ready)]
                while queue and not held(queue[0]):
                    item = queue.pop(0)
                    if isinstance(item, _Record):
                        passed.add(item.key)
                    elif not isinstance(item, _Wait):
                        item()
            return
        if self._events is None:
            self._events = []
            for g in self.gpus:
                with cuda.gpus[g]:
                    self._events.append(cuda.event(timing=False))
        for r, g in enumerate(self.gpus):
            with cuda.gpus[g]:
                self._events[r].record(self.streams[r])
        for r, g in enumerate(self.gpus):
            with cuda.gpus[g]:
                for s in range(self.size):
                    if s != r:
                        self._events[s].wait(self.streams[r])  # a stream may wait on another device's event

    def _next_turn(self, ready):
        """Which emulated rank runs next at a barrier, of those whose waits let them go on: the highest
        (see the module's docstring: the order in which a missing barrier or wait shows)."""
        return max(ready)

    def synchronize(self):
        """Wait on the host until every rank's work is done."""
        if self.emulating:
            self.barrier()
            cuda.synchronize()
            return
        for r, g in enumerate(self.gpus):
            with cuda.gpus[g]:
                self.streams[r].synchronize()


class _Record(NamedTuple):
    """In an emulated rank's queue: the point where it records ``key`` = (rank, mark)."""
    key: tuple


class _Wait(NamedTuple):
    """In an emulated rank's queue: the point where it waits until ``key`` = (rank, mark) is recorded."""
    key: tuple


def enable_peer_access(gpus) -> None:
    """Let every GPU of ``gpus`` address every other's memory (cuCtxEnablePeerAccess both ways)."""
    for g in gpus:
        for h in gpus:
            if g == h:
                continue
            with cuda.gpus[h]:
                peer_context = cuda.current_context()
            with cuda.gpus[g]:
                context = cuda.current_context()
                if not context.can_access_peer(h):
                    raise RuntimeError(f"GPU {g} cannot access GPU {h}'s memory (no NVLink or PCIe peer path)")
                try:
                    context.enable_peer_access(peer_context.handle)
                except Exception as exc:  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED is fine
                    if "ALREADY_ENABLED" not in str(exc) and "704" not in str(exc):
                        raise


def _resident_blocks(n, per_block, cap):
    """Enough blocks for n items at ``per_block`` a block, at most ``cap``, at least one."""
    return max(1, min(cap, -(-n // per_block)))


def _grid_cap():
    return sm_count() * BLOCKS_PER_SM


# -- the operator ------------------------------------------------------------------------------------

def _inputs(size, rng):
    ranks, n = size
    return (rng.uniform(-1.0, 1.0, (ranks, n)).astype(np.float32),)


def _reference(x):
    total = x.astype(np.float64).sum(axis=0)
    return np.broadcast_to(total, x.shape).copy()


def _adversarial(size, rng):
    """A stage that leaves out a rank, or counts one twice, can still look close on random data whose
    ranks cancel; here all but one rank hold zeros, so the answer is that rank's buffer exactly."""
    ranks, n = size
    cases = []
    for label, live in (("only-the-last-rank", ranks - 1), ("only-the-first-rank", 0)):
        x = np.zeros((ranks, n), np.float32)
        x[live] = rng.uniform(1.0, 2.0, n).astype(np.float32)
        cases.append((label, (x,)))
    return cases


def _pointer(a):
    cai = getattr(a, "__cuda_array_interface__", None)
    return cai["data"][0] if cai else id(a)


def _validate(x, out):
    expect_device_array("x", x, dtype=np.float32, ndim=2)
    expect_device_array("out", out, dtype=np.float32, shape=tuple(x.shape))
    if _pointer(x) == _pointer(out):
        raise InputError("out is x: the all-reduce is out of place (a peer may still read a rank's input "
                         "while the rank writes its result); pass a separate output")


def _explain(inputs, out, ref):
    (x,) = inputs
    rows_equal = all(np.array_equal(out[0], out[r], equal_nan=True) for r in range(out.shape[0]))
    if not rows_equal:
        return ("the ranks ended with different results: every rank must hold the same sum (add the "
                "ranks in the same order everywhere, and let each see every finished slice)")
    return None


def _peer(size):
    torch = peers.torch()
    if torch is None:
        return None

    def sum_and_broadcast(x, out):
        t_out = peers.as_torch(out)
        t_out.copy_(peers.as_torch(x).sum(dim=0).expand_as(t_out))

    return "torch.sum + broadcast (one GPU)", sum_and_broadcast


# -- the figures README shows: the last run of `workbench record` on several GPUs -----------------------------
# (workbench/tools/allreduce.py writes it; workbench/tables.py renders the README's tables from it)

RUN_FILE = ("runs", "gpu_allreduce.json")  # under results/


def _recorded_run() -> dict | None:
    path = results.results_dir().joinpath(*RUN_FILE)
    return json.loads(path.read_text()) if path.exists() else None


def _bound_note() -> str:
    """What bounds an all-reduce: the links between GPUs, and the exchange every call makes, as the recorded run measured them."""
    run = _recorded_run() or {}
    link = (run.get("ceiling") or {}).get("peer_copy_gbps")
    links = run.get("ceiling") or {}
    measured = (f" The recorded run (`results/{'/'.join(RUN_FILE)}`, {run['ranks']} x {run['device']}, "
                f"{run.get('date', '?')[:10]}) measured the links: the copy engine moved {links['peer_copy_gbps']:.0f} "
                f"GB/s from one GPU to the other, and SM stores into the peer's memory "
                f"{links['sm_push_gbps_each_way']:.0f} GB/s each way with both GPUs writing (the dotted line of the "
                "plot at the end, which no stage's bus bandwidth can pass by much). A kernel on each GPU that "
                f"sends 16 bytes to the other and waits for the other's 16 took {run['exchange_floor_us']:.1f} µs a "
                f"call (an empty kernel {run['launch_floor_us']:.1f}): no one-kernel all-reduce is faster."
                if "sm_push_gbps_each_way" in links and "exchange_floor_us" in run else "")
    return ("Across GPUs the floor is not this GPU's memory but the links between GPUs: each rank must send what "
            "it holds and receive what the others hold. A ring moves 2(N-1)/N of the buffer through each GPU's "
            "links, so the figure comparable with a link's speed is the **bus bandwidth**, 2(N-1)/N x bytes / "
            "time (NCCL reports it); the **algorithm bandwidth**, bytes / time, is what a caller sees. Small "
            "messages are bound by latency instead: a launch and a handshake between GPUs, a few µs whatever "
            f"the size.{measured} The bytes and flops models above are one GPU's share, for the simulator's "
            "checks and one-GPU runs.")


op = Operator(
    name="allreduce",
    figures_elsewhere="/".join(RUN_FILE),
    bound_note=_bound_note(),
    title="AllReduce: the sum of N float32 buffers, one per rank, left on every rank",
    reference=_reference,
    make_inputs=_inputs,
    make_output=lambda size: np.empty(size, np.float32),
    bytes_moved=lambda size: 8 * size[0] * size[1],
    flops=lambda size: (size[0] - 1) * size[1],
    validate=_validate,
    peer=_peer,
    explain=_explain,
    adversarial_inputs=_adversarial,
    size_names=("ranks", "n"),
    check_sizes=[(1, 1000), (2, 1_000_003), (3, 4099), (4, 2**20 + 1), (8, 12345), (2, 2**24)],
    sim_sizes=[(1, 37), (3, 100), (4, 131), (2, 1000), (8, 77)],
    grade_sizes={"sim": [(1, 33), (2, 101), (3, 100), (4, 257)], "gpu": [(2, 1_000_003), (3, 99_999), (4, 2**20 + 3)]},
    bench_sizes=[(2, 2**14), (2, 2**18), (2, 2**22), (4, 2**22), (4, 2**24), (8, 2**24)],
    headline_size=(4, 2**24),
    rank=400,
    group="AllReduce across GPUs",
)


# -- 1. naive: through GPU 0 --------------------------------------------------------------------------

@cuda.jit
def _sum_all(sends, recv):
    """recv[i] = sends[0][i] + sends[1][i] + ... : every rank adds in the same order, so every rank
    gets the same bits. ``sends`` is a tuple, one array per rank (peers' through peer pointers)."""
    for i in range(cuda.grid(1), recv.size, cuda.gridsize(1)):
        acc = sends[0][i]
        for s in range(1, len(sends)):  # len(sends) is known when numba compiles: the loop unrolls
            acc += sends[s][i]
        recv[i] = acc


def naive_allreduce(group: Group) -> None:
    n, ranks = group.n, group.size
    gathered = group.scratch(0, "allreduce.naive.gathered", (ranks, n))
    group.barrier()  # every rank's input is ready before GPU 0 copies it
    for r in range(ranks):
        group.copy(0, gathered[r], group.sends[r])  # the copy engines pull each buffer to GPU 0
    rows = tuple(gathered[r] for r in range(ranks))
    group.launch(0, _sum_all, _resident_blocks(n, THREADS, _grid_cap()), THREADS, rows, group.recvs[0])
    for r in range(1, ranks):
        group.copy(0, group.recvs[r], group.recvs[0])  # and push the sum back out
    group.barrier()  # no rank reuses its buffers while GPU 0 may still read or write them


@op.stage("naive", """
    Copy every rank's buffer to GPU 0, add them there, copy the sum back to every rank. Simple, and
    correct for any N, but GPU 0's links carry 2(N-1) whole buffers while the other GPUs' links and
    adders idle: the time grows with N, and even at N = 2 the copies and the add run one after the
    other. Two barriers frame it: GPU 0 may not read a rank's input before that rank has produced it,
    and a rank may not reuse its buffers while GPU 0 still reads or writes them.""")
def naive(x, out):
    naive_allreduce(Group.emulated(x, out))


# -- 2. one-shot: every rank reads every rank ----------------------------------------------------------

def one_shot_allreduce(group: Group) -> None:
    blocks = _resident_blocks(group.n, THREADS, _grid_cap())
    group.barrier()  # every input is ready before anyone reads it
    for r in range(group.size):
        group.launch(r, _sum_all, blocks, THREADS, group.peers(r, group.sends), group.recvs[r])
    group.barrier()  # nobody reuses an input while a peer may still read it


@op.stage("one_shot", """
    Every rank's kernel reads every rank's buffer (the peers' over NVLink, through peer pointers) and
    writes the sum into its own output: one step, N kernels running at once on N GPUs. Each rank reads
    (N-1) whole remote buffers, so its incoming link carries (N-1)/N of the data more than the
    two-shot's share: one-shot wins on latency (one kernel, one barrier round) and loses on bandwidth
    as buffers grow. Ranks add in the same order (rank 0 first), so every rank holds the same bits.""")
def one_shot(x, out):
    one_shot_allreduce(Group.emulated(x, out))


# -- 3. two-shot: reduce-scatter, then all-gather ---------------------------------------------------------

@cuda.jit
def _reduce_scatter(sends, recv, lo, hi):
    """This rank's slice [lo, hi) of the sum, from every rank's input, into recv[lo:hi]."""
    start = lo + cuda.grid(1)
    stride = cuda.gridsize(1)
    # EXERCISE: write this part of `_reduce_scatter`. Read the hints one at a time.
    #   hint 1 (nudge): Only this rank's slice: a grid-stride loop over i in [lo, hi). Each element is the sum of sends[s][i] over every rank s.
    #   hint 2: Add the ranks in the same order on every rank (start from sends[0][i], then s = 1, 2, ...), so that every rank's copy of the sum has the same bits; write the total to recv[i].
    #   hint 3 (nearly the answer): for i in range(start, hi, stride): acc = sends[0][i]; for s in range(1, len(sends)): acc += sends[s][i]; recv[i] = acc
    pass  # TODO(exercise): not implemented yet: replace this line with your code


@cuda.jit
def _all_gather(recvs, rank):
    """Fill rank ``rank``'s output with every other rank's finished slice, read from its owner."""
    mine = recvs[rank]
    n = mine.size
    chunk = (n + len(recvs) - 1) // len(recvs)
    for owner in range(len(recvs)):
        if owner != rank:
            lo = min(n, owner * chunk)
            hi = min(n, lo + chunk)
            for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
                mine[i] = recvs[owner][i]


def two_shot_allreduce(group: Group) -> None:
    n, ranks = group.n, group.size
    group.barrier()  # every input is ready
    for r in range(ranks):
        lo, hi = slice_of(n, ranks, r)
        blocks = _resident_blocks(hi - lo, THREADS, _grid_cap())
        group.launch(r, _reduce_scatter, blocks, THREADS, group.peers(r, group.sends), group.recvs[r], lo, hi)
    group.barrier()  # every slice is summed before anyone copies it
    for r in range(ranks):
        if ranks > 1:
            blocks = _resident_blocks(n, THREADS, _grid_cap())
            group.launch(r, _all_gather, blocks, THREADS, group.peers(r, group.recvs), r)
    group.barrier()  # nobody reuses a buffer a peer may still read


@op.stage("two_shot", """
    Split the buffer into N slices. Reduce-scatter: rank r sums slice r from every rank's input; then,
    after a barrier, all-gather: every rank copies the other ranks' finished slices. Each rank now
    receives (N-1)/N of the data twice, 2(N-1)/N in all, the least any all-reduce can do over its
    links (hence nccl-tests' bus bandwidth: 2(N-1)/N * bytes / time), and all N GPUs add at once.
    The barrier in the middle is what makes it correct: without it a rank copies a slice its owner
    has not summed yet, a race that on real GPUs shows only when the owner happens to be late.""")
def two_shot(x, out):
    two_shot_allreduce(Group.emulated(x, out))


# -- 4. ring ---------------------------------------------------------------------------------------------

@cuda.jit
def _ring_add(left, own, into, lo, hi):
    """into[lo:hi] = left[lo:hi] + own[lo:hi]: the partial sum arriving from the left neighbour plus this rank's part."""
    for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
        into[i] = left[i] + own[i]


def ring_allreduce(group: Group) -> None:
    n, ranks = group.n, group.size
    group.barrier()
    if ranks == 1:  # no neighbour: the sum is the input
        group.copy(0, group.recvs[0], group.sends[0])
        group.barrier()
        return
    # Reduce-scatter, N-1 steps: at step s rank r takes chunk k = r - s - 1 from its left neighbour
    # (its input at the first step, its partial sum after), adds its own part and keeps the result.
    # Its left neighbour produced exactly that chunk at step s - 1; after N-1 steps rank r holds the
    # whole sum of chunk r + 1.
    for step in range(ranks - 1):
        for r in range(ranks):
            left = (r - 1) % ranks
            lo, hi = slice_of(n, ranks, (r - step - 1) % ranks)
            source = group.sends if step == 0 else group.recvs
            group.launch(r, _ring_add, _resident_blocks(hi - lo, THREADS, _grid_cap()), THREADS,
                         group.peers(r, source)[left], group.sends[r], group.recvs[r], lo, hi)
        group.barrier()  # a chunk is passed on only after it was added to
    # All-gather, N-1 steps: at step s rank r copies finished chunk r - s from its left neighbour
    # (a plain copy, done by the copy engine: no kernel needed to move bytes unchanged).
    for step in range(ranks - 1):
        for r in range(ranks):
            left = (r - 1) % ranks
            lo, hi = slice_of(n, ranks, (r - step) % ranks)
            if hi > lo:
                group.copy(r, group.recvs[r][lo:hi], group.peers(r, group.recvs)[left][lo:hi])
        group.barrier()


@op.stage("ring", """
    The same 2(N-1)/N of the data per rank as two-shot, but each rank talks only to its neighbours:
    2(N-1) steps, each passing one chunk (1/N of the buffer) to the right. Reduce-scatter: at step s
    rank r adds its part to the partial sum its left neighbour made at step s-1; after N-1 steps each
    rank holds one chunk's whole sum, and N-1 copying steps pass those around. It needs no link
    between every pair of GPUs, which is why NCCL uses it across PCIe and between hosts. Here each
    step ends in a barrier, so the links idle while the slowest rank finishes a step: 2(N-1) barriers
    against two-shot's two. The next stage cuts the chunks into pieces that wait only for their
    neighbour; the one after it replaces host barriers with flags in memory.""")
def ring(x, out):
    ring_allreduce(Group.emulated(x, out))


# -- 5. ring_pipelined: the ring's chunks in pieces, each waiting only for its neighbour ----------------

# Pieces each chunk is cut into (P). More pieces: a late rank holds its neighbour up for less (1/P of
# a chunk), but every rank launches 2(N-1) P kernels, and waits as often, instead of 2(N-1).
# Not tuned on two GPUs, where a ring has no second step to overlap with the first.
RING_PIECES = 4


def ring_piece(n: int, ranks: int, chunk: int, piece: int) -> tuple[int, int]:
    """[lo, hi): piece ``piece`` of chunk ``chunk`` (the ring's 1/ranks of an n-element buffer). A chunk
    of fewer than RING_PIECES elements has empty pieces at its end."""
    lo, hi = slice_of(n, ranks, chunk)
    a, b = slice_of(hi - lo, RING_PIECES, piece)
    return lo + a, lo + b


@cuda.jit
def _ring_copy(left, into, lo, hi):
    """into[lo:hi] = left[lo:hi]: a finished piece, from the left neighbour. A kernel where the ring
    stage lets the copy engine copy: the grader counts only what kernels write into the output."""
    for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
        into[i] = left[i]


def ring_pipelined_allreduce(group: Group) -> None:
    n, ranks = group.n, group.size
    group.barrier()  # every input is ready
    # The ring's 2(N-1) steps, with no barrier between them: at step s rank r works on chunk r - s - 1
    # (the first N-1 steps add it to the partial sum from the left, the last N-1 copy the finished
    # chunk from the left). Its left neighbour worked on that same chunk at step s - 1, so piece p of
    # rank r's step waits only for piece p of the left neighbour's previous step, and then marks
    # its own: (step, piece).
    # EXERCISE: write this part of `ring_pipelined_allreduce`. Read the hints one at a time.
    #   hint 1 (nudge): The ring's two loops become one over 2(N-1) steps, rank r on chunk (r - step - 1) % N: steps before N-1 add (_ring_add, from the left's sends at step 0, its recvs after), the others copy the left's finished piece (_ring_copy). N = 1 has no steps: copy the input.
    #   hint 2: Each rank, each piece: wait for the left neighbour's mark (step - 1, piece) (none at step 0), do the piece if it is not empty, then record (step, piece), even for an empty piece: the right neighbour waits for it.
    #   hint 3 (nearly the answer): for step: for piece: for r: left = (r - 1) % N; lo, hi = ring_piece(n, N, (r - step - 1) % N, piece); group.wait(r, left, (step - 1, piece)) if step; launch [lo, hi); group.record(r, (step, piece))
    pass  # TODO(exercise): not implemented yet: replace this line with your code
    group.barrier()  # nobody reuses a buffer a peer may still read


@op.stage("ring_pipelined", """
    The ring without its barriers between steps. Each chunk is cut into P = RING_PIECES (4) pieces,
    and each piece goes round the ring on its own: rank r starts piece p of a step as soon as its
    left neighbour has finished piece p of the step before, told by an event the neighbour recorded
    on its stream after that piece. One rank waits for one other, not all N for the slowest, so rank
    r can work on piece p of step s+1 while its neighbour is still on piece p+1 of step s: the pieces
    follow each other round the ring like a pipeline. A rank that is late holds its neighbour up by
    one piece, not a whole step, and the links keep carrying the pieces that are ready instead of
    idling at every step. Events rather than flags, because each rank already has a stream and the
    waits stay on the GPUs with nothing polling (and emulated ranks can run them in the simulator,
    where a rank polling another's flags is never answered). The traffic is the ring's: each rank
    still receives 2(N-1)/N of the buffer, so its bus bandwidth (2(N-1)/N * bytes / time) compares
    with the links as two-shot's and ring's do; the price is 2(N-1) P launches and waits a rank
    instead of 2(N-1). On two H200s that price is all there is: 56 µs against the ring's 39 at 4 KB,
    230 GB/s bus bandwidth against 288 at 1 GB. With two ranks the ring has one step each way, so no
    step overlaps another, and this stage's all-gather copies with a kernel pulling from the peer
    where the ring lets the copy engine copy. The pipeline has something to overlap only with more
    ranks than two.""")
def ring_pipelined(x, out):
    ring_pipelined_allreduce(Group.emulated(x, out))


# -- 6. flags: one kernel per rank, synchronised through memory -------------------------------------------

# Each rank has an int32 flag array in its own memory, written by the others (over NVLink) and
# polled by itself: ``flags[s]`` (s < N) is the last call rank s arrived at; ``flags[N + s*B + b]`` is
# the last call in which block b of rank s finished pushing its sums. Calls are numbered (the
# epoch), so flags only grow and never need resetting.

@cuda.jit(device=True, inline=True)
def _wait_for(flags, slot, epoch, max_polls, status):
    """Spin until flags[slot] >= epoch. The read is an atomic (add 0), so it goes to the memory every
    time: a plain load may be served from this SM's L1, which nothing updates. Gives up after
    max_polls, recording the slot in status[0] for the host to report."""
    polls = 0
    while cuda.atomic.add(flags, slot, 0) < epoch:
        polls += 1
        if polls > max_polls:
            cuda.atomic.max(status, 0, slot + 1)
            return
        cuda.nanosleep(POLL_NS)


@cuda.jit(device=True, inline=True)
def _arrive_and_wait(flags, rank, epoch, max_polls, status):
    """The entry barrier: tell every rank this rank's input is ready; wait until every rank has."""
    t = cuda.threadIdx.x
    ranks = len(flags)
    if cuda.blockIdx.x == 0 and t < ranks:
        flags[t][rank] = epoch  # thread t tells rank t (a store over NVLink for a peer)
    if t < ranks:
        _wait_for(flags[rank], t, epoch, max_polls, status)
    cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def _publish_and_wait(flags, rank, epoch, max_polls, status):
    """The exit: publish that this block's sums are everywhere; block 0 then waits for every block of
    every rank. After that, everything the peers write here has landed, and no peer reads this rank's
    input any more, so the caller may reuse both."""
    t = cuda.threadIdx.x
    ranks = len(flags)
    blocks = cuda.gridDim.x
    # The fence orders this thread's stores (to every GPU) before anything it writes after; the
    # barrier then makes every thread's fenced stores precede the flag, which thread t < N stores
    # after a fence of its own. A reader that sees the flag therefore sees the data. Without the
    # fences the flag may overtake the data on its way over NVLink: a race that shows only sometimes.
    cuda.threadfence_system()
    cuda.syncthreads()
    if t < ranks:
        cuda.threadfence_system()
        flags[t][ranks + rank * blocks + cuda.blockIdx.x] = epoch
    if cuda.blockIdx.x == 0:
        for slot in range(ranks + t, ranks + ranks * blocks, THREADS):
            _wait_for(flags[rank], slot, epoch, max_polls, status)


@cuda.jit
def _flag_allreduce(sends, recvs, flags, first_rank, epoch, max_polls, status):
    """One rank's whole all-reduce (blockIdx.y picks the rank when several are emulated in one grid):
    the entry barrier, this rank's slice summed from every input and pushed into every output, then
    the exit. Each block handles tiles of THREADS * UNROLL elements: UNROLL per thread, loaded from
    every rank before any is added, so 4 N loads are in flight per thread."""
    rank = first_rank + cuda.blockIdx.y
    ranks = len(sends)
    _arrive_and_wait(flags, rank, epoch, max_polls, status)

    n = uint64(sends[0].size)
    chunk = (n + uint64(ranks) - uint64(1)) // uint64(ranks)
    lo = min(n, uint64(rank) * chunk)
    hi = min(n, lo + chunk)
    t = uint64(cuda.threadIdx.x)
    tile = uint64(THREADS * UNROLL)
    step = uint64(cuda.gridDim.x) * tile
    base = lo + uint64(cuda.blockIdx.x) * tile
    while base + tile <= hi:
        j0 = base + t
        j1 = j0 + uint64(THREADS)
        j2 = j1 + uint64(THREADS)
        j3 = j2 + uint64(THREADS)
        a0 = sends[0][j0]
        a1 = sends[0][j1]
        a2 = sends[0][j2]
        a3 = sends[0][j3]
        for s in range(1, ranks):
            a0 += sends[s][j0]
            a1 += sends[s][j1]
            a2 += sends[s][j2]
            a3 += sends[s][j3]
        for s in range(ranks):  # push: stores to a peer are posted, they do not wait for a reply
            recvs[s][j0] = a0
            recvs[s][j1] = a1
            recvs[s][j2] = a2
            recvs[s][j3] = a3
        base += step
    j = base + t  # the last, partial tile: at most one block has one
    while j < hi:
        acc = sends[0][j]
        for s in range(1, ranks):
            acc += sends[s][j]
        for s in range(ranks):
            recvs[s][j] = acc
        j += uint64(THREADS)

    _publish_and_wait(flags, rank, epoch, max_polls, status)


_EPOCHS: dict = {}


def _next_epoch(key) -> int:
    _EPOCHS[key] = _EPOCHS.get(key, 0) + 1
    return _EPOCHS[key]


class BarrierTimeout(RuntimeError):
    """A flag kernel gave up waiting for a peer (see MAX_POLLS)."""


def check_flag_status(group: Group, name: str = "allreduce") -> None:
    """Raise BarrierTimeout if a flag kernel of ``group`` gave up waiting (after synchronising)."""
    group.synchronize()
    ranks = range(1) if group.emulating else range(group.size)
    for r in ranks:
        status = group.scratch(r, f"{name}.status", 1, np.int32, zeroed=True)
        with (cuda.gpus[group.gpus[r]] if not group.emulating else contextlib.nullcontext()):
            value = int(status.copy_to_host()[0])
            if value:
                status.copy_to_device(np.zeros(1, np.int32))
        if value:
            raise BarrierTimeout(f"{name}: rank {r} gave up waiting for flag slot {value - 1} after "
                                 f"{MAX_POLLS} polls (a peer that never arrived, or a grid too large to be resident)")


def _flag_launch(group: Group, kernel, name: str, work: int, per_block: int, args_of) -> None:
    """Launch ``kernel`` once per rank (one grid for all emulated ranks: blockIdx.y is the rank) with
    ``args_of(r)`` (rank r's arguments) followed by the flag arrays, the first rank, the call's epoch,
    the poll limit and the status word."""
    ranks = group.size
    cap = max(1, _grid_cap() // (ranks if group.emulating else 1))  # every block resident at once
    blocks = _resident_blocks(work, per_block, cap)
    slots = ranks + ranks * blocks
    key = f"{name}.flags.{ranks}x{blocks}"
    if group.emulating:
        table = group.scratch(0, key, (ranks, slots), np.int32, zeroed=True)
        flags = [table[r] for r in range(ranks)]
    else:
        flags = [group.scratch(r, key, slots, np.int32, zeroed=True) for r in range(ranks)]
    epoch = _next_epoch((key, tuple(group.gpus or ())))
    # The simulator runs blocks one after another, so a rank waiting for another is never answered
    # there: the kernel gives up at once (the stage is gpu_only; such a run only records the launch).
    max_polls = 0 if device.is_simulator() else MAX_POLLS
    if group.emulating:
        status = group.scratch(0, f"{name}.status", 1, np.int32, zeroed=True)
        kernel[(blocks, ranks), THREADS](*args_of(0), tuple(flags), 0, epoch, max_polls, status)
        return
    for r in range(ranks):
        status = group.scratch(r, f"{name}.status", 1, np.int32, zeroed=True)
        group.launch(r, kernel, (blocks, 1), THREADS, *args_of(r), group.peers(r, flags), r, epoch, max_polls, status)


def flag_allreduce(group: Group) -> None:
    per_rank = -(-group.n // group.size)
    _flag_launch(group, _flag_allreduce, "allreduce.flag", per_rank, THREADS * UNROLL,
                 lambda r: (group.peers(r, group.sends), group.peers(r, group.recvs)))
    if device.is_simulator():
        _refuse_in_the_simulator(group, "allreduce.flag")


def _refuse_in_the_simulator(group: Group, name: str) -> None:
    """After a flag kernel's launch in the simulator (recorded for the sm_90 compile check): say why
    its result means nothing here."""
    try:
        check_flag_status(group, name)
    except BarrierTimeout:
        pass
    raise RuntimeError(f"{name}: the simulator runs one block at a time, so a rank waiting on another "
                       "rank's flags is never answered; run this stage on a GPU")


@op.stage("flags", """
    One kernel per rank and no host barrier: ranks synchronise through flags in GPU memory. On entry
    each rank writes "arrived at call e" into every rank's flags and waits for all N arrivals (an
    atomic read, which bypasses the SM's cache). Each block then sums its tiles of this rank's slice,
    four elements a thread loaded from every rank before any add, and pushes the sums into every
    rank's output (stores over NVLink are posted: they do not wait for a reply, unlike the two-shot's
    remote loads). A system-scope fence, then a flag per block: "my sums are everywhere". Block 0
    waits for every block of every rank; after that nothing more lands here and nobody reads this
    rank's input, so the kernel's end is the exit barrier. Two flag round trips instead of event
    waits, and no launch between the two halves. On two H200s it is the stage for large messages:
    340 GB/s bus bandwidth at 1 GB against NCCL's 327, 8.9 µs at 4 KB against NCCL's 7.3. The
    simulator cannot run it: a rank waits for another rank's blocks running at the same time, which
    the simulator's one-block-at-a-time order never provides.""",
    gpu_only="ranks wait on flags set by other ranks' blocks running at the same time; the simulator runs "
             "blocks one after another")
def flags(x, out):
    flag_allreduce(Group.emulated(x, out))


# -- 7. lamport: a one-shot push into mailboxes, no flags ------------------------------------------------
#
# Rank r's mailboxes are an array in its own memory, (3, N, m4) words: box [k, s] receives what rank s
# pushes in a call numbered k mod 3. A word is a float32 with its sign bit flipped (mailbox.cu), so an
# empty word is zero and every value written is not: a reader sees each word arrive, no flag needed.
# Three sets, because a rank's boxes are in three states at once: this call's (being filled and read),
# the previous call's (read in full, emptied now) and the next call's (empty, ready: a peer may run one
# call ahead and push into it already). A peer cannot run two calls ahead: it would need this rank's
# values of the next call, which this rank pushes only after emptying.

LAMPORT_CHUNK = 1 << 20  # floats one launch reduces (4 MB): a longer message takes several launches


@cuda.jit
def _lamport_allreduce(sends, recvs, boxes, lo, m, now, stale, first_rank, max_polls, status):
    """One rank's all-reduce of elements lo .. lo + m - 1 (blockIdx.y picks the rank when several are
    emulated in one grid). Each thread takes vectors of four elements; it pushes all of its vectors
    before it waits for any, so no rank ever waits for a value that a waiting rank has not sent. As
    it reads a word of this call's box it empties the same word of the previous call's."""
    rank = first_rank + cuda.blockIdx.y
    ranks = len(sends)
    x = sends[rank]
    out = recvs[rank]
    per_box = boxes[rank].shape[2]
    first = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    step = cuda.gridDim.x * cuda.blockDim.x
    vectors = (m + 3) // 4
    for v in range(first, vectors, step):  # 1. push: my four values into box [now, rank] of every peer
        i = lo + 4 * v
        a0 = x[i]
        a1 = x[i + 1] if 4 * v + 1 < m else float32(0.0)
        a2 = x[i + 2] if 4 * v + 2 < m else float32(0.0)
        a3 = x[i + 3] if 4 * v + 3 < m else float32(0.0)
        for s in range(ranks):
            if s != rank:  # posted 16-byte stores over NVLink: they do not wait for a reply
                mailbox_store_f32x4(boxes[s].ctypes.data + uint64(((now * ranks + rank) * per_box + 4 * v) * 4),
                                    a0, a1, a2, a3)
    for v in range(first, vectors, step):  # 2. wait for each peer's four values; add in rank order
        i = lo + 4 * v
        acc0 = acc1 = acc2 = acc3 = float32(0.0)
        for s in range(ranks):
            if s == rank:  # my own values as the peers received them (+0.0 for -0.0: the same bits)
                c0 = x[i] + float32(0.0)
                c1 = x[i + 1] + float32(0.0) if 4 * v + 1 < m else float32(0.0)
                c2 = x[i + 2] + float32(0.0) if 4 * v + 2 < m else float32(0.0)
                c3 = x[i + 3] + float32(0.0) if 4 * v + 3 < m else float32(0.0)
            else:
                c0, c1, c2, c3, gave_up = mailbox_wait_f32x4(
                    boxes[rank].ctypes.data + uint64(((now * ranks + s) * per_box + 4 * v) * 4), max_polls)
                if gave_up != float32(0.0):
                    cuda.atomic.max(status, 0, s + 1)
                # and empty the same words of the previous call's box, for the call after this one
                mailbox_clear_f32x4(boxes[rank].ctypes.data + uint64(((stale * ranks + s) * per_box + 4 * v) * 4))
            acc0 += c0
            acc1 += c1
            acc2 += c2
            acc3 += c3
        out[i] = acc0
        if 4 * v + 1 < m:
            out[i + 1] = acc1
        if 4 * v + 2 < m:
            out[i + 2] = acc2
        if 4 * v + 3 < m:
            out[i + 3] = acc3


def lamport_allreduce(group: Group) -> None:
    ranks, n = group.size, group.n
    cap = max(1, _grid_cap() // (ranks if group.emulating else 1))  # every block resident at once
    max_polls = 0 if device.is_simulator() else MAX_POLLS
    for lo in range(0, n, LAMPORT_CHUNK):
        m = min(LAMPORT_CHUNK, n - lo)
        per_box = -(-m // 4) * 4
        blocks = _resident_blocks(per_box // 4, THREADS, cap)
        key = f"allreduce.lamport.{ranks}x{per_box}"
        epoch = _next_epoch((key, tuple(group.gpus or ())))
        now, stale = epoch % 3, (epoch + 2) % 3
        if group.emulating:
            table = group.scratch(0, key, (ranks, 3, ranks, per_box), np.uint32, zeroed=True)
            status = group.scratch(0, "allreduce.lamport.status", 1, np.int32, zeroed=True)
            boxes = tuple(table[r] for r in range(ranks))
            _lamport_allreduce[(blocks, ranks), THREADS](tuple(group.sends), tuple(group.recvs), boxes, lo, m,
                                                          now, stale, 0, max_polls, status)
            continue
        boxes = [group.scratch(r, key, (3, ranks, per_box), np.uint32, zeroed=True) for r in range(ranks)]
        for r in range(ranks):
            status = group.scratch(r, "allreduce.lamport.status", 1, np.int32, zeroed=True)
            group.launch(r, _lamport_allreduce, (blocks, 1), THREADS, group.peers(r, group.sends),
                         group.peers(r, group.recvs), group.peers(r, boxes), lo, m, now, stale, r, max_polls, status)
    if device.is_simulator():
        _refuse_in_the_simulator(group, "allreduce.lamport")


@op.stage("lamport", """
    The least latency: one kernel per rank, one step, no flag and no fence. Each rank pushes its
    whole buffer into a mailbox in every peer's memory (posted 16-byte stores over NVLink), then
    reads its own mailboxes, where the peers' buffers are arriving, and adds them. The values are
    their own signal: a mailbox word is a float with its sign bit flipped, so an empty word is
    zero and no value ever looks empty (-0.0, whose flipped bits are zero, is sent as +0.0). The
    reader polls each word with a volatile load until it is not zero. The mailboxes are
    triple-buffered by call: this call's, the previous call's (read in full, so emptied now), and
    the next call's (already empty, in case a peer runs one call ahead). No rank can run two calls
    ahead, as it would need values that this rank sends only after emptying. TensorRT-LLM calls
    this a "Lamport" all-reduce. Every rank moves all N - 1 other buffers, not 2(N-1)/N of one,
    and the mailboxes take 3 N times the message: it is the stage for small messages (on two H200s
    5.1 µs at 4 KB against NCCL's 7.3, 8.6 at 1 MB against 13.8), and messages over 4 MB go through
    it 4 MB at a time. Its floor is the exchange itself: a kernel on each GPU that only sends 16
    bytes to the other and waits for the other's 16 takes 3.8 µs a call there.""",
    gpu_only="ranks wait for values pushed by other ranks' blocks running at the same time; the simulator "
             "runs blocks one after another")
def lamport(x, out):
    lamport_allreduce(Group.emulated(x, out))


ALGORITHMS = {"naive": naive_allreduce, "one_shot": one_shot_allreduce, "two_shot": two_shot_allreduce,
              "ring": ring_allreduce, "ring_pipelined": ring_pipelined_allreduce, "flags": flag_allreduce,
              "lamport": lamport_allreduce}
# The algorithms whose kernels wait for each other on the GPU, and the name of their status word: after
# a call, check_flag_status(group, WAITING[name]) turns a rank that gave up waiting into an error.
WAITING = {"flags": "allreduce.flag", "lamport": "allreduce.lamport"}


# =========================================================================================================
# Beyond NCCL: all-reduce + residual add + RMSNorm in one kernel
# =========================================================================================================
#
# In a tensor-parallel transformer block the attention (or MLP) output is a row-parallel linear layer:
# each GPU holds a partial product, the all-reduce adds them, the residual is added, and RMSNorm
# normalises the result for the next layer. Three kernels, each a pass over the activations: the
# all-reduce writes the sum, the add reads it back, the norm reads it again. Fused, the rank that
# owns a row sums it from every GPU, adds the residual, normalises it and sends both results (the
# new residual stream h and the normalised y) to every GPU (fused); or sends h only, and every GPU
# normalises every row from its own memory (fused_flags). Or every
# rank receives every partial and normalises every row itself (fused_lamport): more arithmetic, one
# push and no synchronisation at all.

def _fused_inputs(size, rng):
    ranks, rows, cols = size
    partials = rng.standard_normal((ranks, rows, cols)).astype(np.float32)
    residual = rng.standard_normal((rows, cols)).astype(np.float32)
    return partials, residual, rng.uniform(0.5, 1.5, cols).astype(np.float32)


def _fused_reference(partials, residual, weight):
    h = residual.astype(np.float64) + partials.astype(np.float64).sum(axis=0)
    y = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + float(EPS)) * weight.astype(np.float64)
    return np.broadcast_to(np.stack([h, y]), (partials.shape[0], 2) + h.shape).copy()


def _fused_adversarial(size, rng):
    """Partials that cancel across ranks (h is the residual plus rounding), and rows that sum to exactly
    zero (rank 0's partial is minus the residual, the others' are zero): RMSNorm must give 0 there,
    not 0/0."""
    ranks, rows, cols = size
    partials, residual, weight = _fused_inputs(size, rng)
    cancelling = partials.copy()
    if ranks > 1:
        cancelling[-1] = (-partials[:-1].astype(np.float64).sum(axis=0)).astype(np.float32)
    zeroing = partials.copy()
    zeroing[:, ::2] = 0.0
    zeroing[0, ::2] = -residual[::2]
    return [("partials-cancel", (cancelling, residual, weight)), ("zero-rows", (zeroing, residual, weight))]


def _fused_validate(partials, residual, weight, out):
    expect_device_array("partials", partials, dtype=np.float32, ndim=3)
    ranks, rows, cols = partials.shape
    expect_device_array("residual", residual, dtype=np.float32, shape=(rows, cols))
    expect_device_array("weight", weight, dtype=np.float32, shape=(cols,))
    expect_device_array("out", out, dtype=np.float32, shape=(ranks, 2, rows, cols))


def _fused_peer(size):
    torch = peers.torch()
    if torch is None or not hasattr(torch.nn.functional, "rms_norm"):
        return None

    def torch_sum_add_rms_norm(partials, residual, weight, out):
        t_out = peers.as_torch(out)
        h = torch.add(peers.as_torch(partials).sum(dim=0), peers.as_torch(residual))
        y = torch.nn.functional.rms_norm(h, (h.shape[1],), peers.as_torch(weight), float(EPS))
        t_out[:, 0].copy_(h.expand_as(t_out[:, 0]))
        t_out[:, 1].copy_(y.expand_as(t_out[:, 1]))

    return "torch sum + add + rms_norm (one GPU)", torch_sum_add_rms_norm


def _fused_bytes(size):
    ranks, rows, cols = size
    return 4 * (ranks * rows * cols + rows * cols + cols + 2 * ranks * rows * cols)


fused_op = Operator(
    figures_elsewhere="/".join(RUN_FILE),
    bound_note=_bound_note(),
    name="allreduce", variant={"fusion": "rmsnorm"},
    title="AllReduce + residual add + RMSNorm (a tensor-parallel block's epilogue)",
    reference=_fused_reference,
    make_inputs=_fused_inputs,
    make_output=lambda size: np.empty((size[0], 2, size[1], size[2]), np.float32),
    bytes_moved=_fused_bytes,
    flops=lambda size: (size[0] + 4) * size[1] * size[2],
    validate=_fused_validate,
    peer=_fused_peer,
    adversarial_inputs=_fused_adversarial,
    size_names=("ranks", "rows", "cols"),
    check_sizes=[(1, 7, 1000), (2, 33, 4096), (3, 100, 777), (4, 257, 8192), (2, 1024, 8192)],
    sim_sizes=[(1, 2, 33), (2, 3, 65), (3, 2, 40), (4, 3, 17), (8, 2, 20)],
    grade_sizes={"sim": [(1, 2, 33), (2, 3, 65), (3, 4, 40), (4, 5, 17)]},
    bench_sizes=[(2, 16, 8192), (2, 256, 8192), (2, 4096, 8192), (4, 4096, 8192)],
    headline_size=(2, 4096, 8192),
    rank=401,
    group="AllReduce across GPUs",
)


def fused_group(partials, out, residuals, weights, gpus=None):
    """The ranks of a fused call: rank r's partial product partials[r] and output out[r] (2, rows,
    cols); residuals[r] and weights[r] its replicas of the residual stream and the norm's weight."""
    group = Group(list(partials), list(out), gpus)
    group.residuals, group.weights = list(residuals), list(weights)
    return group


def _emulated_fused_group(partials, residual, weight, out):
    ranks = partials.shape[0]
    return fused_group([partials[r] for r in range(ranks)], [out[r] for r in range(ranks)],
                       [residual] * ranks, [weight] * ranks)


# -- 1. separate: all-reduce, then an add, then RMSNorm ---------------------------------------------------

@cuda.jit
def _add_residual(summed, residual, h):
    """h = summed + residual over a (rows, cols) matrix (summed: the same matrix, flat). A block per row."""
    cols = h.shape[1]
    for row in range(cuda.blockIdx.x, h.shape[0], cuda.gridDim.x):
        for col in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            h[row, col] = summed[row * cols + col] + residual[row, col]


@cuda.jit(device=True, inline=True)
def _block_sum(value):
    """Sum over the block's threads (any multiple of 32, up to 1024), returned to every thread (warp
    shuffles, one barrier)."""
    warp_sums = cuda.shared.array(32, float32)
    lane = cuda.threadIdx.x % 32
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    if lane == 0:
        warp_sums[cuda.threadIdx.x // 32] = value
    cuda.syncthreads()
    total = float32(0.0)
    for w in range(cuda.blockDim.x // 32):
        total += warp_sums[w]
    cuda.syncthreads()  # warp_sums may be written again by the next call
    return total


@cuda.jit(device=True, inline=True)
def _rms_scale(squares, cols):
    """1 / sqrt(mean(h^2) + eps) of a row, from each thread's share of its sum of squares."""
    return float32(1.0) / math.sqrt(_block_sum(squares) / float32(cols) + EPS)


@cuda.jit(device=True, inline=True)
def _normalise_row(h, weight, y, row):
    """y[row] = RMSNorm(h[row]) * weight, by the whole block: h's row read twice, the second time from L1."""
    cols = h.shape[1]
    t = cuda.threadIdx.x
    squares = float32(0.0)
    for col in range(t, cols, THREADS):
        squares += h[row, col] * h[row, col]
    rstd = _rms_scale(squares, cols)
    for col in range(t, cols, THREADS):
        y[row, col] = h[row, col] * rstd * weight[col]


@cuda.jit
def _rmsnorm_rows(h, weight, y):
    """y = h / sqrt(mean(h^2) + eps) * weight, a block per row, the second pass from L1: the workbench's
    RMSNorm (layernorm.py's l1_reuse stage), written here so that this file stands alone."""
    for row in range(cuda.blockIdx.x, h.shape[0], cuda.gridDim.x):
        _normalise_row(h, weight, y, row)


def separate_allreduce_rmsnorm(group: Group) -> None:
    ranks = group.size
    rows, cols = group.residuals[0].shape
    n = rows * cols
    flat = [p.reshape(n) for p in group.sends]
    if group.emulating:
        table = scratch("allreduce_rmsnorm.summed", (ranks, n))
        summed = [table[r] for r in range(ranks)]
    else:
        summed = [group.scratch(r, "allreduce_rmsnorm.summed", n) for r in range(ranks)]
    two_shot_allreduce(group.with_buffers(flat, summed))
    for r in range(ranks):
        h, y = group.recvs[r][0], group.recvs[r][1]
        group.launch(r, _add_residual, max(1, min(rows, _grid_cap())), THREADS, summed[r], group.residuals[r], h)
        group.launch(r, _rmsnorm_rows, max(1, min(rows, _grid_cap())), THREADS, h, group.weights[r], y)
    group.barrier()


@fused_op.stage("separate", """
    What a transformer block does without fusion: the two-shot all-reduce of the partial products,
    then a kernel adding the residual, then RMSNorm on the sum (a block per row, as layernorm.py's).
    Three passes over the activations on every rank: the all-reduce writes the sum, the add reads
    it and writes h, the norm reads h again. Every rank does the whole add and norm, on every row.""")
def separate(partials, residual, weight, out):
    separate_allreduce_rmsnorm(_emulated_fused_group(partials, residual, weight, out))


# -- 2. fused: the owner of a row sums, adds and normalises it --------------------------------------------

@cuda.jit
def _reduce_add_norm(partials, residual, weight, out, row_lo, row_hi):
    """Rows [row_lo, row_hi) of this rank: h = residual + the sum of every rank's partial row, then
    y = h / sqrt(mean(h^2) + eps) * weight; both into out (h: out[0], y: out[1]). A block per row."""
    cols = residual.shape[1]
    t = cuda.threadIdx.x
    for row in range(row_lo + cuda.blockIdx.x, row_hi, cuda.gridDim.x):
        squares = float32(0.0)
        for col in range(t, cols, THREADS):
            h = residual[row, col]
            for s in range(len(partials)):
                h += partials[s][row, col]
            out[0, row, col] = h
            squares += h * h
        rstd = _rms_scale(squares, cols)
        for col in range(t, cols, THREADS):  # the thread reads back only what it wrote itself
            out[1, row, col] = out[0, row, col] * rstd * weight[col]


@cuda.jit
def _gather_rows(outs, rank):
    """Copy every row this rank does not own (both planes) from its owner's output. A block per row."""
    mine = outs[rank]
    rows, cols = mine.shape[1], mine.shape[2]
    rows_chunk = (rows + len(outs) - 1) // len(outs)
    for row in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
        owner = row // rows_chunk
        if owner != rank:
            for col in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
                mine[0, row, col] = outs[owner][0, row, col]
                mine[1, row, col] = outs[owner][1, row, col]


def fused_allreduce_rmsnorm(group: Group) -> None:
    ranks = group.size
    rows, cols = group.residuals[0].shape
    group.barrier()
    for r in range(ranks):
        lo, hi = slice_of(rows, ranks, r)
        group.launch(r, _reduce_add_norm, max(1, min(hi - lo, _grid_cap())), THREADS,
                     group.peers(r, group.sends), group.residuals[r], group.weights[r], group.recvs[r], lo, hi)
    group.barrier()  # every owned row is finished before anyone copies it
    if ranks > 1:
        for r in range(ranks):
            group.launch(r, _gather_rows, max(1, min(rows, _grid_cap())), THREADS, group.peers(r, group.recvs), r)
    group.barrier()


@fused_op.stage("fused", """
    The two-shot's reduce-scatter, by rows, with the epilogue inside: the rank that owns a row sums
    it from every rank's partials, adds the residual, and normalises it (a block per row: the sum of
    squares is a block reduction), writing h and y. Then the all-gather copies the finished rows.
    The add and the norm are done once per row instead of once per rank, and the sum never makes a
    round trip through memory before it is used: two kernels per rank instead of four.""")
def fused(partials, residual, weight, out):
    fused_allreduce_rmsnorm(_emulated_fused_group(partials, residual, weight, out))


# -- 3. fused_flags: one kernel per rank, pushing h, normalising every row itself ---------------------------

@cuda.jit
def _flag_reduce_add_norm(partials, residual, weight, outs, flags, first_rank, epoch, max_polls, status):
    """One rank's whole fused call: the entry barrier; its own rows summed and added to, h pushed into
    every rank's output; the exit; then every row normalised here, from the h in this rank's memory
    (the same flags as _flag_allreduce)."""
    rank = first_rank + cuda.blockIdx.y
    ranks = len(partials)
    _arrive_and_wait(flags, rank, epoch, max_polls, status)
    mine = outs[rank]
    rows, cols = residual.shape[0], residual.shape[1]
    rows_chunk = (rows + ranks - 1) // ranks
    row_lo = min(rows, rank * rows_chunk)
    row_hi = min(rows, row_lo + rows_chunk)
    t = cuda.threadIdx.x
    for row in range(row_lo + cuda.blockIdx.x, row_hi, cuda.gridDim.x):
        col = t
        while col + 3 * THREADS < cols:  # four columns a thread: 4 N loads in flight before any add
            c1, c2, c3 = col + THREADS, col + 2 * THREADS, col + 3 * THREADS
            h0, h1, h2, h3 = residual[row, col], residual[row, c1], residual[row, c2], residual[row, c3]
            for s in range(ranks):
                h0 += partials[s][row, col]
                h1 += partials[s][row, c1]
                h2 += partials[s][row, c2]
                h3 += partials[s][row, c3]
            for s in range(ranks):  # h only: each rank normalises every row itself
                outs[s][0, row, col] = h0
                outs[s][0, row, c1] = h1
                outs[s][0, row, c2] = h2
                outs[s][0, row, c3] = h3
            col += 4 * THREADS
        while col < cols:
            h = residual[row, col]
            for s in range(ranks):
                h += partials[s][row, col]
            for s in range(ranks):
                outs[s][0, row, col] = h
            col += THREADS
    _publish_and_wait(flags, rank, epoch, max_polls, status)
    # y of every row by the same code on every rank, so that every rank holds the same bits: its own
    # rows first (while the peers' h is still arriving), then those of each peer. The rows of rank s
    # that block b normalises are those block b of rank s pushed (every rank launches the same grid):
    # once that block has published, its h has landed here.
    for row in range(row_lo + cuda.blockIdx.x, row_hi, cuda.gridDim.x):
        _normalise_row(mine[0], weight, mine[1], row)
    if t < ranks:
        _wait_for(flags[rank], ranks + t * cuda.gridDim.x + cuda.blockIdx.x, epoch, max_polls, status)
    cuda.syncthreads()
    for s in range(ranks):
        if s != rank:
            for row in range(min(rows, s * rows_chunk) + cuda.blockIdx.x, min(rows, (s + 1) * rows_chunk),
                             cuda.gridDim.x):
                _normalise_row(mine[0], weight, mine[1], row)


def flag_allreduce_rmsnorm(group: Group) -> None:
    rows = group.residuals[0].shape[0]
    _flag_launch(group, _flag_reduce_add_norm, "allreduce_rmsnorm.flag", -(-rows // group.size), 1,
                 lambda r: (group.peers(r, group.sends), group.residuals[r], group.weights[r],
                            group.peers(r, group.recvs)))
    if device.is_simulator():
        _refuse_in_the_simulator(group, "allreduce_rmsnorm.flag")


@fused_op.stage("fused_flags", """
    The fused stage in one kernel per rank, synchronised like the all-reduce's flags stage: arrive,
    sum the owned rows and add the residual, push h (posted stores over NVLink) straight into every
    rank's output, fence, flag, and then normalise every row from the h in this rank's memory. No
    all-gather pass and no host barrier; and only h crosses the links, not h and y: each rank turns
    a row of h into y itself, reading it from its own memory (at 4.3 TB/s) rather than receiving y
    over NVLink (at 0.34), and the same code on every rank gives every rank the same bits. Each
    thread sums four columns at a time, every load issued before the first add, so the loads from a
    peer's memory overlap their latency instead of waiting one after another. On two H200s at 4096
    x 8192: 625 µs against 678 for NCCL + add + torch's RMSNorm.""",
    gpu_only="ranks wait on flags set by other ranks' blocks running at the same time; the simulator runs "
             "blocks one after another")
def fused_flags(partials, residual, weight, out):
    flag_allreduce_rmsnorm(_emulated_fused_group(partials, residual, weight, out))


# -- 4. fused_lamport: every rank normalises every row from mailboxes ----------------------------------------

FUSED_LAMPORT_CHUNK = 1 << 22  # floats of rows one launch handles (16 MB): 4096 x 8192 takes eight
# Threads a block of the fused lamport kernel: a block normalises a row, and a thread waits for its
# vectors one after another (a wait is a loop: the next load cannot start before it ends), so a row
# of 8192 takes 4 waits a thread at 512 threads, 16 at 128. Under 128 registers a thread (96: `workbench
# ptx allreduce[rmsnorm]`), one such block fits an SM, which the grid's cap counts on.
FUSED_LAMPORT_THREADS = 512


@cuda.jit
def _lamport_reduce_add_norm(partials, residual, weight, outs, boxes, row_lo, rows_m, now, stale, first_rank,
                             max_polls, status):
    """One rank's fused call over rows row_lo .. row_lo + rows_m - 1 with the lamport stage's mailboxes
    (boxes[r]: (3, N, rows_m, cols rounded up to 4) words). The grid pushes this rank's partial rows
    to every peer; then a block per row waits for the peers' values (emptying the previous call's
    words as it goes), adds them to the residual in rank order, and normalises: h and y are written
    here only."""
    rank = first_rank + cuda.blockIdx.y
    ranks = len(partials)
    mine = partials[rank]
    out = outs[rank]
    cols = residual.shape[1]
    per_row = boxes[rank].shape[3]
    row_vectors = per_row // 4
    t = cuda.threadIdx.x
    first = cuda.blockIdx.x * FUSED_LAMPORT_THREADS + t
    step = cuda.gridDim.x * FUSED_LAMPORT_THREADS
    for v in range(first, rows_m * row_vectors, step):  # 1. push my partial rows into every peer's box
        r = v // row_vectors
        c = 4 * (v % row_vectors)
        row = row_lo + r
        a0 = mine[row, c]
        a1 = mine[row, c + 1] if c + 1 < cols else float32(0.0)
        a2 = mine[row, c + 2] if c + 2 < cols else float32(0.0)
        a3 = mine[row, c + 3] if c + 3 < cols else float32(0.0)
        for s in range(ranks):
            if s != rank:
                mailbox_store_f32x4(boxes[s].ctypes.data + uint64((((now * ranks + rank) * rows_m + r) * per_row + c) * 4),
                                    a0, a1, a2, a3)
    for r in range(cuda.blockIdx.x, rows_m, cuda.gridDim.x):  # 2. a block per row: sum, add, normalise
        row = row_lo + r
        squares = float32(0.0)
        for c in range(4 * t, cols, 4 * FUSED_LAMPORT_THREADS):
            h0 = residual[row, c]
            h1 = residual[row, c + 1] if c + 1 < cols else float32(0.0)
            h2 = residual[row, c + 2] if c + 2 < cols else float32(0.0)
            h3 = residual[row, c + 3] if c + 3 < cols else float32(0.0)
            for s in range(ranks):
                if s == rank:  # as the peers received it: -0.0 as +0.0, so every rank adds the same bits
                    p0 = mine[row, c] + float32(0.0)
                    p1 = mine[row, c + 1] + float32(0.0) if c + 1 < cols else float32(0.0)
                    p2 = mine[row, c + 2] + float32(0.0) if c + 2 < cols else float32(0.0)
                    p3 = mine[row, c + 3] + float32(0.0) if c + 3 < cols else float32(0.0)
                else:
                    p0, p1, p2, p3, gave_up = mailbox_wait_f32x4(
                        boxes[rank].ctypes.data + uint64((((now * ranks + s) * rows_m + r) * per_row + c) * 4), max_polls)
                    if gave_up != float32(0.0):
                        cuda.atomic.max(status, 0, s + 1)
                    mailbox_clear_f32x4(  # the previous call's words, for the call after this one
                        boxes[rank].ctypes.data + uint64((((stale * ranks + s) * rows_m + r) * per_row + c) * 4))
                h0 += p0
                h1 += p1
                h2 += p2
                h3 += p3
            out[0, row, c] = h0
            if c + 1 < cols:
                out[0, row, c + 1] = h1
            if c + 2 < cols:
                out[0, row, c + 2] = h2
            if c + 3 < cols:
                out[0, row, c + 3] = h3
            squares += h0 * h0 + h1 * h1 + h2 * h2 + h3 * h3  # past the row's end h is 0
        rstd = _rms_scale(squares, cols)
        for col in range(t, cols, FUSED_LAMPORT_THREADS):  # h was written by this block: read back from L1/L2
            out[1, row, col] = out[0, row, col] * rstd * weight[col]


def lamport_allreduce_rmsnorm(group: Group) -> None:
    ranks = group.size
    rows, cols = group.residuals[0].shape
    per_row = -(-cols // 4) * 4
    per_sm = max(1, BLOCKS_PER_SM * THREADS // FUSED_LAMPORT_THREADS)
    cap = max(1, sm_count() * per_sm // (ranks if group.emulating else 1))  # every block resident at once
    max_polls = 0 if device.is_simulator() else MAX_POLLS
    chunk_rows = max(1, FUSED_LAMPORT_CHUNK // per_row)
    for row_lo in range(0, rows, chunk_rows):
        rows_m = min(chunk_rows, rows - row_lo)
        blocks = _resident_blocks(max(rows_m, rows_m * per_row // 4 // FUSED_LAMPORT_THREADS), 1, cap)
        key = f"allreduce_rmsnorm.lamport.{ranks}x{rows_m}x{per_row}"
        epoch = _next_epoch((key, tuple(group.gpus or ())))
        now, stale = epoch % 3, (epoch + 2) % 3
        if group.emulating:
            table = group.scratch(0, key, (ranks, 3, ranks, rows_m, per_row), np.uint32, zeroed=True)
            status = group.scratch(0, "allreduce_rmsnorm.lamport.status", 1, np.int32, zeroed=True)
            _lamport_reduce_add_norm[(blocks, ranks), FUSED_LAMPORT_THREADS](
                tuple(group.sends), group.residuals[0], group.weights[0], tuple(group.recvs),
                tuple(table[r] for r in range(ranks)), row_lo, rows_m, now, stale, 0, max_polls, status)
            continue
        boxes = [group.scratch(r, key, (3, ranks, rows_m, per_row), np.uint32, zeroed=True) for r in range(ranks)]
        for r in range(ranks):
            status = group.scratch(r, "allreduce_rmsnorm.lamport.status", 1, np.int32, zeroed=True)
            group.launch(r, _lamport_reduce_add_norm, (blocks, 1), FUSED_LAMPORT_THREADS, group.peers(r, group.sends),
                         group.residuals[r], group.weights[r], group.peers(r, group.recvs), group.peers(r, boxes),
                         row_lo, rows_m, now, stale, r, max_polls, status)
    if device.is_simulator():
        _refuse_in_the_simulator(group, "allreduce_rmsnorm.lamport")


@fused_op.stage("fused_lamport", """
    The all-reduce's lamport stage with the epilogue inside, and no owner: every rank pushes its
    partial rows into every peer's mailboxes, then normalises every row itself, from its own
    partial, the peers' values as they arrive, and its residual. The add and the norm are done N
    times (once on each GPU) instead of once, which costs nothing beside the traffic, and buys the
    rest: no second push of the results, no flag, no fence, no barrier. h and y are written only
    to this rank's memory, once. Rows go through it 16 MB at a time. On two H200s: 16.0 µs at 16 x
    8192 against 20.0 for NCCL + add + torch's RMSNorm, 65.6 against 83.0 at 256 x 8192; at 4096 x
    8192 every rank's N-fold traffic costs more than it saves (803 against 678).""",
    gpu_only="ranks wait for values pushed by other ranks' blocks running at the same time; the simulator "
             "runs blocks one after another")
def fused_lamport(partials, residual, weight, out):
    lamport_allreduce_rmsnorm(_emulated_fused_group(partials, residual, weight, out))


FUSED_ALGORITHMS = {"separate": separate_allreduce_rmsnorm, "fused": fused_allreduce_rmsnorm,
                    "fused_flags": flag_allreduce_rmsnorm, "fused_lamport": lamport_allreduce_rmsnorm}
FUSED_WAITING = {"fused_flags": "allreduce_rmsnorm.flag", "fused_lamport": "allreduce_rmsnorm.lamport"}

OPERATORS = [op, fused_op]
