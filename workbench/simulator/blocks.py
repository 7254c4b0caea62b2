"""The block scheduler: syncthreads(), warp rendezvous, deadlock detection, and the reused threads."""

import os
import queue
import sys
import threading
import time

import numba
import numpy as np

from . import races as race_detector
from .core import MAX_THREADS_PER_BLOCK, WARP_SIZE, LaunchLimitError, NeedsGPU, WarpSyncError
from .races import RaceError
from .shared import poison_shared_memory

if numba.config.ENABLE_CUDASIM:
    from numba.cuda.simulator import kernel as _kernel
    from numba.cuda.simulator import kernelapi as _kernelapi


# After a block fails, how long its launch waits for the other threads to notice and stop.
_UNWIND_SECONDS = 1.0


class _Aborted(RuntimeError):
    """Raised in threads woken because their block already failed; never reaches the user."""


_IN_SYNCTHREADS = "syncthreads()"  # a thread's sim_wait while it waits at the barrier


class _Arrival:
    """One lane's call of a warp intrinsic, waiting for the other lanes of its mask."""

    __slots__ = ("thread", "lane", "kind", "mask", "value", "values")

    def __init__(self, thread, lane, kind, mask, value):
        self.thread = thread
        self.lane = lane
        self.kind = kind
        self.mask = mask
        self.value = value
        self.values = None  # {lane: value} of the whole mask, once everyone has arrived


class _Warp:
    def __init__(self, lock, index, lanes):
        self.index = index
        self.first_thread = index * WARP_SIZE
        self.existing = (1 << lanes) - 1  # the last warp of a block may be partial
        # Lanes that have arrived at an intrinsic, by (intrinsic, mask). PTX completes a *.sync
        # instruction when every lane of the mask has executed one "with the same qualifiers and
        # same membermask": that is the key. Disjoint masks (two half-warps) proceed independently.
        self.waiting = {}
        self.at_activemask = []  # arrivals in activemask(), see _Block.activemask
        self.arrived = threading.Condition(lock)


class _Block:
    """The synchronisation state of one simulated thread block.

    Every thread reports here when it waits in syncthreads() or a warp intrinsic, and when it exits.
    One lock guards it all, so "every thread still running is waiting, and no wait can complete"
    is a fact checked at the moment it becomes true, instead of a guess made by polling with
    timeouts. Conditions on that lock let threads sleep: one per warp (completing a warp intrinsic
    wakes only that warp), one for the barrier, one for the thread that launched the block.

    Under the lock:
      live     threads started and not exited;
      blocked  live threads waiting in syncthreads() or a warp intrinsic. Whoever completes a wait
               counts the waiters out at once, before they get to run again, so a thread that
               was just released is never mistaken for a stuck one;
      failure  the (exception, traceback) that ends the block, or None. Once it is set, every wait
               raises _Aborted, and the counts no longer matter.

    A barrier completes as soon as all live threads are in it, a warp intrinsic as soon as its last
    lane arrives, and activemask() as soon as no other lane of its warp is running. So if all live
    threads are blocked, none of them will ever be released: a deadlock, reported as a
    WarpSyncError (one always involves a warp intrinsic).
    """

    def __init__(self, block_dim, block_idx, grid_dim=(1, 1, 1), races=None):
        self.block_idx = block_idx
        self.linear_index = block_idx[0] + grid_dim[0] * (block_idx[1] + grid_dim[1] * block_idx[2])
        self.races = races
        self.shared_shadow = races.new_block_shadow() if races is not None else None
        size = block_dim[0] * block_dim[1] * block_dim[2]
        self.threads = [None] * size  # by linear thread id
        self.lock = threading.Lock()
        self.live = size
        self.blocked = 0
        self.failure = None
        self.barrier = []
        self.barrier_generation = 0
        self.votes = None  # syncthreads_count/and/or
        self.barrier_released = threading.Condition(self.lock)
        self.finished = threading.Condition(self.lock)
        self.warps = [
            _Warp(self.lock, w, min(WARP_SIZE, size - w * WARP_SIZE)) for w in range(-(-size // WARP_SIZE))
        ]
        # A block of a thread-block cluster (run_cluster): its cluster, its rank there, and the address of
        # its own dynamic shared memory, which the cluster's instructions translate addresses between.
        self.cluster = None
        self.cluster_rank = 0
        self.sim_shared = None
        self.sim_shared_base = None

    def add(self, thread):
        thread.sim_block = self
        thread.sim_wait = None  # what the thread waits in: _IN_SYNCTHREADS, an _Arrival, or None
        thread.sim_exited = False
        thread.sim_clock = None
        if self.races is not None:
            thread.sim_clock = race_detector.ThreadClock(
                self.linear_index, self.block_idx, thread.thread_id, tuple(thread.threadIdx)
            )
        self.threads[thread.thread_id] = thread

    def run(self):
        """Start the threads; return when all have exited, or raise the block's failure."""
        self.start()
        with self.lock:
            while self.live and self.failure is None:
                self.finished.wait()
        self.finish()

    def start(self):
        for thread in self.threads:
            thread.start()

    def finish(self):
        """After the threads have exited or the block has failed: raise the race or failure, if any."""
        with self.lock:
            if self.failure is not None:
                # Give the woken threads a moment to stop, so none runs on into the next launch.
                self.finished.wait_for(lambda: self.live == 0, timeout=_UNWIND_SECONDS)
        if self.races is not None:
            self.races.raise_found()  # a race, before what it may have caused (a bad index, a deadlock)
        if self.failure is not None:
            exception, traceback = self.failure
            raise exception.with_traceback(traceback)

    def abort(self, why):
        """Stop the block because another block of its cluster failed."""
        with self.lock:
            self._fail((_Aborted(why), None))

    # All methods below run with the lock held.

    def _warp_of(self, thread):
        return self.warps[thread.thread_id // WARP_SIZE]

    def _block(self, thread, wait):
        thread.sim_wait = wait
        self.blocked += 1
        self._settle_activemask(self._warp_of(thread))

    def _wake(self, thread):
        thread.sim_wait = None
        self.blocked -= 1

    def _sleep(self, condition, done):
        """Sleep on condition until done(); raise _Aborted if the block fails first."""
        while not done():
            if self.failure is not None:
                raise _Aborted("another thread of the block failed")
            condition.wait()

    def _raise_if_failed(self):
        if self.failure is not None:
            raise _Aborted("another thread of the block failed")

    def _fail(self, failure):
        if self.failure is not None:
            return
        self.failure = failure
        for warp in self.warps:
            warp.arrived.notify_all()
        self.barrier_released.notify_all()
        self.finished.notify_all()

    def _release_barrier(self):
        if self.races is not None:
            race_detector.barrier([thread.sim_clock for thread in self.barrier])
            if self.races.counts is not None:
                self.races.counts.barrier(len({thread.thread_id // WARP_SIZE for thread in self.barrier}))
        for thread in self.barrier:
            self._wake(thread)
        self.barrier = []
        self.barrier_generation += 1
        self.barrier_released.notify_all()

    def _settle_activemask(self, warp):
        """Complete the warp's activemask() calls once no other lane of it is running."""
        if not warp.at_activemask:
            return
        calling = sum(1 << arrival.lane for arrival in warp.at_activemask)
        for lane in lanes_of(warp.existing & ~calling):
            thread = self.threads[warp.first_thread + lane]
            if not thread.sim_exited and thread.sim_wait is None:
                return  # still running: it may yet call activemask() too
        for arrival in warp.at_activemask:
            arrival.values = calling
            self._wake(arrival.thread)
        warp.at_activemask = []
        warp.arrived.notify_all()

    def _check_deadlock(self):
        if self.live and self.blocked == self.live:
            self._fail((WarpSyncError(self._describe_deadlock()), None))

    # Entry points, called by the simulated threads.

    def syncthreads(self, thread):
        with self.lock:
            self._raise_if_failed()
            generation = self.barrier_generation
            self.barrier.append(thread)
            self._block(thread, _IN_SYNCTHREADS)
            if len(self.barrier) == self.live:
                self._release_barrier()
            else:
                self._check_deadlock()
            self._sleep(self.barrier_released, lambda: self.barrier_generation != generation)

    def syncthreads_vote(self, thread, value, combine):
        """syncthreads_count/and/or: a barrier at which every thread votes; `combine` counts the votes."""
        if self.votes is None:
            with self.lock:
                if self.votes is None:
                    self.votes = np.zeros(len(self.threads), dtype=np.bool_)
        self.votes[thread.thread_id] = bool(value)
        self.syncthreads(thread)
        result = combine(self.votes)
        self.syncthreads(thread)  # nobody votes again before everyone has counted
        return result

    def rendezvous(self, thread, kind, mask, value):
        """Wait until every lane of mask has called intrinsic `kind` with this mask.

        Returns {lane: value} for the lanes of the mask. Each lane gets its own _Arrival, and the
        last lane to arrive hands all of them the same dict and removes the group: a fast lane
        that goes straight on to its next call starts a new group and overwrites nothing that a
        slower lane still has to read.
        """
        warp = self._warp_of(thread)
        arrival = _Arrival(thread, thread.thread_id % WARP_SIZE, kind, mask, value)
        with self.lock:
            self._raise_if_failed()
            group = warp.waiting.setdefault((kind, mask), [])
            group.append(arrival)
            self._block(thread, arrival)
            if len(group) == mask.bit_count():
                del warp.waiting[(kind, mask)]
                values = {member.lane: member.value for member in group}
                if self.races is not None:
                    race_detector.warp_meeting([member.thread.sim_clock for member in group])
                    if self.races.counts is not None:
                        self.races.counts.intrinsic(kind)
                for member in group:
                    member.values = values
                    self._wake(member.thread)
                warp.arrived.notify_all()
            else:
                self._check_deadlock()
            self._sleep(warp.arrived, lambda: arrival.values is not None)
        return arrival.values

    def activemask(self, thread):
        """The lanes of the thread's warp that call activemask() "together" with it.

        On a GPU, activemask() returns the lanes executing that instruction with the caller. The
        simulator's threads do not run in lockstep (one may finish the kernel before the next
        starts), so "together" is approximated: wait until every other lane of the warp has
        called activemask() too, or waits in syncthreads() or a warp intrinsic, or has exited;
        the answer is the lanes that called. In converged code that is every lane that has not
        exited, as on a GPU; inside a branch it leaves out lanes on the other path once they
        wait or finish. It never deadlocks: it completes whenever a lane of the warp stops
        running, so it is settled in _block() and thread_exited().
        """
        warp = self._warp_of(thread)
        arrival = _Arrival(thread, thread.thread_id % WARP_SIZE, "activemask", None, None)
        with self.lock:
            self._raise_if_failed()
            warp.at_activemask.append(arrival)
            self._block(thread, arrival)
            self._sleep(warp.arrived, lambda: arrival.values is not None)
        return arrival.values

    def thread_exited(self, thread):
        with self.lock:
            thread.sim_exited = True
            self.live -= 1
            self._settle_activemask(self._warp_of(thread))
            if thread.exception is not None:
                self._fail(thread.exception)
            elif self.barrier and len(self.barrier) == self.live:
                self._release_barrier()  # exited threads no longer count at the barrier
            else:
                self._check_deadlock()
            if self.live == 0:
                self.finished.notify_all()

    def _describe_deadlock(self):
        lines = [
            f"deadlock in block {tuple(self.block_idx)}: every thread that has not exited is waiting, "
            "and none of the waits can complete."
        ]
        for warp in self.warps:
            for (kind, mask), group in warp.waiting.items():
                arrived = sum(1 << member.lane for member in group)
                by_place = {}
                for lane in lanes_of(mask & ~arrived):
                    place = self._whereabouts(self.threads[warp.first_thread + lane])
                    by_place.setdefault(place, []).append(lane)
                missing = "; ".join(f"{lane_words(lanes)}: {place}" for place, lanes in by_place.items())
                lines.append(
                    f"  warp {warp.index}: {lane_words(lanes_of(arrived))} wait in {kind}(mask={mask:#010x}) "
                    f"for the rest of the mask, which never arrives ({missing})"
                )
        if self.barrier:
            waiting = _ranges(thread.thread_id for thread in self.barrier)
            lines.append(
                f"  threads {waiting} (linear ids) wait in syncthreads(), which needs every thread "
                "that has not exited"
            )
        lines.append(
            "A warp intrinsic returns only when every lane named in its mask has called the same "
            "intrinsic with the same mask. A lane that took another branch, waits in syncthreads() "
            "or has returned never arrives: on a GPU the kernel hangs or computes garbage. Name only "
            "the lanes that take part (cuda.activemask() and cuda.ballot_sync build such masks)."
        )
        return "\n".join(lines)

    @staticmethod
    def _whereabouts(thread):
        if thread.sim_exited:
            return "exited"
        if thread.sim_wait is _IN_SYNCTHREADS:
            return "in syncthreads()"
        return f"in {thread.sim_wait.kind}(mask={thread.sim_wait.mask:#010x})"


def run_block(workers, fn, grid_dim, block_dim, grid_point, args, debug, races):
    """numba's BlockManager.run, rebuilt on _Block and reused threads: one per CUDA thread of the
    block, then sleep until all are done."""
    poison_shared_memory(_kernel._kernel_context.shared)
    block = _Block(block_dim, grid_point, grid_dim, races)

    def job():
        if debug:
            np.seterr(divide="raise")  # numba's debug=True: division by zero raises
        fn(*args)

    for worker, index in zip(workers, np.ndindex(*block_dim)):
        worker.assign(job, grid_point, index, block_dim)
        block.add(worker)
    block.run()


class Cluster:
    """The blocks of one thread-block cluster, by rank, run side by side (a cluster's blocks are resident
    together on a GPU, and may wait for each other)."""

    def __init__(self, blocks):
        self.blocks = blocks
        for rank, block in enumerate(blocks):
            block.cluster, block.cluster_rank = self, rank


_CLUSTER_POLL_SECONDS = 0.002
# Called when a cluster's blocks are stopped: whoever keeps threads waiting on conditions of its own (the
# mbarriers of solutions/_hopper.py) wakes them there, to find their block failed.
ON_CLUSTER_ABORT = []


def run_cluster(workers, fn, grid_dim, block_dim, grid_points, args, debug, races, dynamic_shared_bytes):
    """run_block for the blocks of one cluster at once, each with its own shared memory (allocated at the
    same alignment, so an offset means the same place in each, as mapa assumes). When one block fails,
    the others are stopped (their threads may be waiting for it) and its failure is raised."""
    threads = len(list(np.ndindex(*block_dim)))

    def job():
        if debug:
            np.seterr(divide="raise")  # numba's debug=True: division by zero raises
        fn(*args)

    blocks = []
    for rank, point in enumerate(grid_points):
        block = _Block(block_dim, point, grid_dim, races)
        block.sim_shared = _kernelapi.FakeCUDAShared(dynamic_shared_bytes)
        block.sim_shared._dynshared = _aligned_bytes(dynamic_shared_bytes)
        block.sim_shared_base = block.sim_shared._dynshared.ctypes.data
        poison_shared_memory(block.sim_shared)
        blocks.append(block)
        for worker, index in zip(workers[rank * threads:(rank + 1) * threads], np.ndindex(*block_dim)):
            worker.assign(job, point, index, block_dim)
            block.add(worker)
    Cluster(blocks)
    for block in blocks:
        block.start()
    while any(block.live for block in blocks) and not any(block.failure is not None for block in blocks):
        time.sleep(_CLUSTER_POLL_SECONDS)
    failed = next((block for block in blocks if block.failure is not None), None)
    if failed is not None:
        for block in blocks:
            if block is not failed:
                block.abort(f"block {tuple(failed.block_idx)} of the cluster failed")
        for wake in ON_CLUSTER_ABORT:
            wake()
        failed.finish()
    for block in blocks:
        block.finish()


_ALIGNMENT = 1024  # a GPU block's shared memory starts on (at least) a 1 KiB boundary


def _aligned_bytes(nbytes):
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.byte)
    skip = -raw.ctypes.data % _ALIGNMENT
    return raw[skip:skip + nbytes]


# Errors whose message is complete as it is: numba's thread runner prefixes every message with
# "tid=[...] ctaid=[...]:", which would only clutter these.
_OWN_ERRORS = (RaceError, NeedsGPU, WarpSyncError, LaunchLimitError, _Aborted)


class _Worker(threading.Thread):
    """A Python thread that runs one CUDA thread of one block after another.

    Starting a Python thread costs more than most simulated CUDA threads do (a few hundred µs), so
    threads are kept between blocks and launches: a launch takes as many idle workers as its
    blocks have threads (see take_workers) and gives them back at the end. ``threading.
    current_thread()`` is the worker, so what the simulator's ``cuda`` module reads from it
    (threadIdx, blockIdx, syncthreads) is set anew for each block by assign().
    """

    def __init__(self):
        super().__init__(daemon=True, name="simulated CUDA thread")
        self.jobs = queue.SimpleQueue()
        self.busy = False  # running a CUDA thread (or stuck in one that never returned)
        self.launched = False
        self.job = None

    def assign(self, job, grid_point, index, block_dim):
        self.job = job
        self.blockIdx = _kernelapi.Dim3(*grid_point)
        self.threadIdx = _kernelapi.Dim3(*index)
        self.thread_id = index[0] + block_dim[0] * (index[1] + block_dim[1] * index[2])
        self.exception = None

    def start(self):
        """Run the assigned CUDA thread (called by _Block.run)."""
        self.busy = True
        if not self.launched:
            self.launched = True
            super().start()
        self.jobs.put(self.job)

    def run(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.run_cuda_thread(job)

    def run_cuda_thread(self, job):
        """Run the kernel as one CUDA thread, record its exception (if any), report the exit."""
        tracking = race_detector.current
        tracking.clock, tracking.block = self.sim_clock, self.sim_block
        races = self.sim_block.races
        counts = races.counts if races is not None else None
        if counts is not None:
            counts.start_thread(self.sim_clock)
        try:
            # A GPU computes inf and NaN without a word; numpy's scalars, which the simulator computes
            # with, would warn once per thread (the adversarial inputs hold NaN and inf on purpose).
            with np.errstate(all="ignore"):
                job()
        except race_detector.SpinWait as error:
            self.exception = (NeedsGPU(str(error)), sys.exc_info()[2])
        except _OWN_ERRORS as error:
            self.exception = (error, sys.exc_info()[2])
        except (SystemExit, KeyboardInterrupt) as error:  # sys.exit() in a kernel: the launch says so
            self.exception = (error, sys.exc_info()[2])
        except Exception as error:
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            message = f"{where}: {error}" if str(error) else where
            try:
                renamed = type(error)(message)  # as numba does, so the message says which thread
            except Exception:
                renamed = error
            self.exception = (renamed, sys.exc_info()[2])
        finally:
            if counts is not None:
                counts.end_thread()  # before the exit is reported: the launch may end with it
            tracking.clock = tracking.block = None
            self.job = None
            self.busy = False
            self.sim_block.thread_exited(self)

    # The kernel-side API numba's BlockThread offers.

    def syncthreads(self):
        self.sim_block.syncthreads(self)

    def syncthreads_count(self, value):
        return int(self.sim_block.syncthreads_vote(self, value, np.count_nonzero))

    def syncthreads_and(self, value):
        return 1 if self.sim_block.syncthreads_vote(self, value, np.all) else 0

    def syncthreads_or(self, value):
        return 1 if self.sim_block.syncthreads_vote(self, value, np.any) else 0

    def __str__(self):
        return f"Thread <<<{self.blockIdx}, {self.threadIdx}>>>"


_idle_workers = []
_workers_lock = threading.Lock()
_MAX_IDLE_WORKERS = MAX_THREADS_PER_BLOCK


def take_workers(count):
    with _workers_lock:
        taken = _idle_workers[len(_idle_workers) - min(count, len(_idle_workers)):]
        del _idle_workers[len(_idle_workers) - len(taken):]
    return taken + [_Worker() for _ in range(count - len(taken))]


def give_back_workers(workers):
    """Keep the workers that finished for later launches; one still running a CUDA thread (its
    block failed and it has not noticed, or it loops forever) is left to itself."""
    with _workers_lock:
        room = _MAX_IDLE_WORKERS - len(_idle_workers)
        _idle_workers.extend([worker for worker in workers if not worker.busy and worker.is_alive()][:room])


def _forget_workers():
    """In a forked child the workers' threads do not exist (fork copies only the forking thread)."""
    global _workers_lock
    _workers_lock = threading.Lock()
    _idle_workers.clear()


os.register_at_fork(after_in_child=_forget_workers)


def lanes_of(bits):
    return [lane for lane in range(WARP_SIZE) if bits >> lane & 1]


def _ranges(numbers):
    """'0-15, 20, 22-23' for 0, 1, ..., 15, 20, 22, 23."""
    parts = []
    for n in sorted(numbers):
        if parts and parts[-1][1] == n - 1:
            parts[-1][1] = n
        else:
            parts.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def lane_words(lanes):
    return f"lane {lanes[0]}" if len(lanes) == 1 else f"lanes {_ranges(lanes)}"
