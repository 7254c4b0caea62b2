"""Data races in numba's CUDA simulator, found by watching every memory access of a launch.

The simulator runs the blocks of a launch one after another, so a kernel whose blocks race on
global memory (``out[0] += partial`` from every block, a histogram counted with plain increments,
a scan whose blocks read the previous block's total) always computes the right answer there, and
only goes wrong on a GPU, where blocks run at the same time. Running blocks in another order
would expose some of these bugs some of the time; this module exposes all of them every time: it
records each access to global and shared memory and checks it against the earlier accesses to
the same bytes, with the happens-before rules of the CUDA memory model, simplified:

* two accesses by one thread are ordered (program order);
* threads of one block are ordered by ``cuda.syncthreads()`` (every access before a barrier
  happens before every access after it), and lanes of one warp by the warp intrinsics they meet
  at (``syncwarp``, shuffles, votes: a vector clock per warp);
* blocks are ordered only through atomics: a thread that calls ``cuda.threadfence()`` and then
  an atomic on some address *releases* what it (and its block, up to its last barrier) did
  before the fence; any thread whose atomic on that address comes later *acquires* it. That is
  the "last block" pattern (write the block's partial, fence, take a ticket with
  ``cuda.atomic.add``; the block that draws the last ticket reads every partial) and the
  flag-publishing pattern of a chained scan;
* atomics never race with each other; a plain access after an atomic on the same address is
  ordered if its thread has itself (or through its block's barriers) done an atomic on that
  address since;
* a kernel launch is ordered after the whole previous launch: each launch starts afresh.

Two accesses to the same address race when they come from different threads, at least one is a
non-atomic write (or an atomic against a plain access), and neither is ordered before the other.
A race found is noted and the block runs on to its end; then the launch stops with a
:class:`RaceError` that names the array, the index, the two threads and blocks, what each did and on
which source line, and how to fix it. Which race that is does not depend on how the Python threads
happened to interleave (the first race found would): of the races the block met, the one on the
lowest element, a write against a read before two writes, then by line and thread, the write told
first. Once the launch's threads have made ``RUN_ON_AFTER_RACE`` more accesses between them (a loop
bound read from racing memory), they stop there. Two plain writes of the same value are not
reported (that race is harmless, and common in flag setting).

Cost: every element access of a tracked array goes through a Python proxy, a lock and a few
dictionary operations, 1-3 µs more than numba's own access. Measured on the 2-core development
machine (busy with other jobs, so a guide): checking every stage of softmax and transpose at their
simulator sizes took 36 and 37 s of CPU with race checking, 25 and 24 s without, and 34 and 39 s
in the simulator before this module existed (which started a new Python thread per CUDA thread,
where now threads are reused). Shared memory is tracked per block and forgotten when the block
ends; global memory per launch. ``WORKBENCH_SIM_RACECHECK=0`` switches it all off (see
``workbench.simulator.racecheck``).

The same accesses feed the profiler's counters when they are asked for
(:mod:`workbench.simulator.counters`: ``LaunchRaces.counts``, and each tracked array's ``track_origin``
and ``track_itemsize``).

Limits, deliberately lenient: an atomic read is an acquire even without a fence after it (PTX
wants one, or ``.acquire`` semantics); ``threadfence_block()`` releases nothing (blocks cannot
see what it orders); element accesses are tracked, array slices passed to numpy functions are
not; local arrays are private and never tracked.
"""

from __future__ import annotations

import linecache
import operator
import os
import re
import sys
import threading

import numpy as np

READ = "read"
WRITE = "write"
ATOMIC = "atomic"

# A thread that reads one unchanging address this many times in a row waits for something (a
# flag another block sets). If that block has not run yet, the simulator would wait forever.
SPIN_LIMIT = 20_000
# After a race is noted, the block's threads run on to the end so that every race is seen (see the module
# docstring); past this many more accesses (all threads of the launch together) the block stops, and the
# lowest race seen so far is reported.
RUN_ON_AFTER_RACE = 200_000


# The simulated thread running on this Python thread: ``current.clock`` (its ThreadClock) and
# ``current.block`` (its block: barrier count, shared-memory Shadow), set by the simulator before
# it runs a CUDA thread with race checking on, and cleared after. A thread-local is the quickest
# way to find them on every access.
class _Current(threading.local):
    clock = None
    block = None


current = _Current()


class RaceError(RuntimeError):
    """Two threads access the same memory, at least one writing, and nothing orders the two.

    ``places`` holds (file, line, source text) of the two accesses, the write first: the error is raised
    when the block ends, so its traceback does not pass through the racing lines."""

    def __init__(self, message, places=()):
        super().__init__(message)
        self.places = list(places)


class SpinWait(RuntimeError):
    """A thread spins on a value that only a block the simulator has not run yet could change.

    workbench.simulator turns it into its NeedsGPU (this module cannot import that one: it is imported by it)."""


# ------------------------------------------------------------------------------------------------
# What a thread knows happened before it (beyond its own block's barriers)
# ------------------------------------------------------------------------------------------------


class Knowledge:
    """Accesses of other threads that a thread knows are ordered before its next one.

    ``blocks`` maps a block (its linear index) to ``(phase, {thread: fences})``: every access that
    block made before its barrier number ``phase``, and each listed thread's accesses made before
    its fence number ``fences``. ``atomics`` maps an address to the position, in that address's
    order of atomic operations, of the latest one known: every atomic on the address up to it.

    Objects shared between threads (after a barrier, in a release) are never changed; a thread
    copies before it adds to one it does not own (see ThreadClock).
    """

    __slots__ = ("blocks", "atomics")

    def __init__(self, blocks=None, atomics=None):
        self.blocks = blocks if blocks is not None else {}
        self.atomics = atomics if atomics is not None else {}

    def copy(self):
        return Knowledge(dict(self.blocks), dict(self.atomics))

    def merged(self, other):
        """A new Knowledge holding both (the later phase and fence count of each block and thread)."""
        result = self.copy()
        blocks = result.blocks
        for block, (phase, fences) in other.blocks.items():
            mine = blocks.get(block)
            if mine is None:
                blocks[block] = (phase, fences)
                continue
            joined = dict(mine[1])
            for thread, count in fences.items():
                if joined.get(thread, 0) < count:
                    joined[thread] = count
            blocks[block] = (max(mine[0], phase), joined)
        atomics = result.atomics
        for address, order in other.atomics.items():
            if atomics.get(address, -1) < order:
                atomics[address] = order
        return result


NOTHING = Knowledge()


def merge_all(knowledges):
    """The union of several Knowledge objects; one of them when they are all the same object."""
    distinct = {id(k): k for k in knowledges if k is not NOTHING}
    if not distinct:
        return NOTHING
    values = list(distinct.values())
    result = values[0]
    for other in values[1:]:
        result = result.merged(other)
    return result


class ThreadClock:
    """One simulated thread's place in the happens-before order, and who it is (for messages)."""

    __slots__ = (
        "block", "block_idx", "tid", "thread_idx", "warp", "lane",
        "wc", "wvec", "fences", "known", "owns_known", "release",
        "spin_address", "spin_value", "spin_count",
    )

    def __init__(self, block, block_idx, tid, thread_idx):
        self.block = block  # linear block index
        self.block_idx = tuple(block_idx)
        self.tid = tid  # linear thread index within the block
        self.thread_idx = tuple(thread_idx)
        self.warp, self.lane = divmod(tid, 32)
        self.wc = 0  # warp intrinsics this lane has completed
        self.wvec = None  # per lane of the warp: intrinsics completed that this lane has met
        self.fences = 0  # cuda.threadfence() calls so far
        self.known = NOTHING
        self.owns_known = False
        self.release = None  # what this thread's next atomic publishes (set by a fence)
        self.spin_address = None
        self.spin_value = None
        self.spin_count = 0

    def acquire(self, view):
        if view is NOTHING or view is self.known:
            return
        if self.known is NOTHING:
            self.known, self.owns_known = view, False
        else:
            self.known, self.owns_known = self.known.merged(view), True

    def note_atomic(self, address, order):
        if not self.owns_known:
            self.known, self.owns_known = self.known.copy(), True
        self.known.atomics[address] = order

    def fence(self, phase):
        """cuda.threadfence(): what came before it is published by this thread's next atomics."""
        self.fences += 1
        own = Knowledge({self.block: (phase, {self.tid: self.fences})})
        self.release = self.known.merged(own) if self.known is not NOTHING else own

    def describe(self):
        return f"thread {self.thread_idx} of block {self.block_idx}"


def barrier(clocks):
    """cuda.syncthreads() completed for these threads: each now knows what any of them knew."""
    merged = merge_all(clock.known for clock in clocks)
    for clock in clocks:
        clock.known, clock.owns_known = merged, False


def warp_meeting(clocks):
    """A warp intrinsic completed for these lanes: a vector-clock join, and shared knowledge."""
    vectors = [clock.wvec for clock in clocks if clock.wvec is not None]
    if not vectors:
        merged = [0] * 32
    elif len(vectors) == 1:
        merged = list(vectors[0])
    else:
        merged = list(map(max, *vectors))
    for clock in clocks:
        if merged[clock.lane] < clock.wc + 1:
            merged[clock.lane] = clock.wc + 1
    for clock in clocks:
        clock.wc += 1
        clock.wvec = merged  # shared, never changed in place
    barrier(clocks)


# ------------------------------------------------------------------------------------------------
# Accesses and the shadow memory that remembers them
# ------------------------------------------------------------------------------------------------


# An access is a tuple (it is made for every element read or written, so it is kept cheap):
CLOCK, PHASE, WC, FENCES, KIND, ORDER, CODE, OFFSET, ARRAY, INDEX, VALUE = range(11)
# the thread's ThreadClock, its block's barrier count, its warp count and fence count then; READ,
# WRITE or ATOMIC; the position among the address's atomics (atomics only, else -1); the code
# object of the kernel or device function and the bytecode offset in it (frame.f_lasti: the line
# number, frame.f_lineno, costs a search of the line table on every access, so the line is looked
# up only for a message); the tracked array it went through (for its name) and the index as the
# kernel wrote it; the value written (plain writes only).


def ordered(earlier, clock, phase, address):
    """Does access `earlier` happen before the next access of the thread with `clock`, at `phase`?"""
    owner = earlier[CLOCK]
    if owner is clock:
        return True
    if owner.block == clock.block:
        if earlier[PHASE] < phase:
            return True
        if owner.warp == clock.warp and clock.wvec is not None and clock.wvec[owner.lane] > earlier[WC]:
            return True
    known = clock.known
    if known is NOTHING:
        return False
    view = known.blocks.get(owner.block)
    if view is not None and (earlier[PHASE] < view[0] or earlier[FENCES] < view[1].get(owner.tid, 0)):
        return True
    return earlier[KIND] is ATOMIC and known.atomics.get(address, -1) >= earlier[ORDER]


_STRIPES = 64  # accesses to one address take one of this many locks, chosen by the address


class Shadow:
    """The accesses to one memory space: a launch's global memory, or one block's shared memory.

    For each address it remembers the last plain write, the latest read of each thread that read
    it since (one access, or a {clock: access} dict once a second thread reads), and the latest
    atomic of each thread. Reads are not forgotten at a write (FastTrack would): a reader may be
    adding its read while another thread writes, and keeping them costs little, as there is at
    most one per thread. Most addresses are read by one thread, so no dict is made for them.
    """

    def __init__(self, space, races):
        self.space = space  # "global" or "shared"
        self.races = races
        self.writes = {}  # address -> access
        self.reads = {}  # address -> access, or {clock: access}
        self.atomics = {}  # address -> {clock: access}
        self.atomic_counts = {}  # address -> number of atomics so far
        self.sync = {}  # address -> Knowledge released through atomics on it
        self.locks = [threading.Lock() for _ in range(_STRIPES)]

    def read(self, address, array, index, value, frame):
        clock = current.clock
        if clock is None:
            return  # read outside a simulated thread (after its launch): not ours to judge
        if self.races.found is not None:
            self.races.run_on()
        if self.races.counts is not None:
            self.races.counts.access(self.space, "load", array, address, frame)
        phase = current.block.barrier_generation
        access = (clock, phase, clock.wc, clock.fences, READ, -1, frame.f_code, frame.f_lasti, array, index, None)
        reads = self.reads
        with self.locks[(address >> 2) % _STRIPES]:
            earlier = reads.get(address)
            if earlier is None or type(earlier) is tuple and earlier[CLOCK] is clock:
                reads[address] = access
            elif type(earlier) is dict:
                earlier[clock] = access
            else:
                reads[address] = {earlier[CLOCK]: earlier, clock: access}
            write = self.writes.get(address)
            atomics = self.atomics.get(address)
        if write is not None and write[CLOCK] is not clock and not ordered(write, clock, phase, address):
            self.races.report(self, write, access)
        if atomics:
            self.check(tuple(atomics.values()), clock, phase, address, access)
        if clock.spin_address == address and clock.spin_value == value:
            clock.spin_count += 1
            if clock.spin_count >= SPIN_LIMIT:
                raise SpinWait(self.races.describe_spin(self, clock, access))
        else:
            clock.spin_address, clock.spin_value, clock.spin_count = address, value, 0

    def write(self, address, array, index, value, frame):
        clock = current.clock
        if clock is None:
            return
        if self.races.found is not None:
            self.races.run_on()
        if self.races.counts is not None:
            self.races.counts.access(self.space, "store", array, address, frame)
        phase = current.block.barrier_generation
        access = (clock, phase, clock.wc, clock.fences, WRITE, -1, frame.f_code, frame.f_lasti, array, index, value)
        clock.spin_address = None
        with self.locks[(address >> 2) % _STRIPES]:
            earlier = self.writes.get(address)
            self.writes[address] = access
            reads = self.reads.get(address)
            reads = () if reads is None else tuple(reads.values()) if type(reads) is dict else (reads,)
            atomics = self.atomics.get(address)
            atomics = tuple(atomics.values()) if atomics else ()
        if (earlier is not None and earlier[CLOCK] is not clock and not ordered(earlier, clock, phase, address)
                and not same_value(earlier[VALUE], value, array._ary.dtype)):
            self.races.report(self, earlier, access)
        self.check(reads, clock, phase, address, access)
        self.check(atomics, clock, phase, address, access)

    def atomic(self, address, array, index, frame, operation):
        """Check an atomic against the plain accesses before it, run it, and synchronise."""
        clock = current.clock
        if clock is None:
            return operation()
        if self.races.counts is not None:
            self.races.counts.access(self.space, "atomic", array, address, frame)
        phase = current.block.barrier_generation
        with self.locks[(address >> 2) % _STRIPES]:
            order = self.atomic_counts.get(address, 0)
            self.atomic_counts[address] = order + 1
            access = (clock, phase, clock.wc, clock.fences, ATOMIC, order, frame.f_code, frame.f_lasti, array,
                      index, None)
            self.atomics.setdefault(address, {})[clock] = access
            write = self.writes.get(address)
            if write is not None and write[CLOCK] is not clock and not ordered(write, clock, phase, address):
                self.races.report(self, write, access)
            reads = self.reads.get(address)
            if reads is not None:
                self.check(tuple(reads.values()) if type(reads) is dict else (reads,), clock, phase, address, access)
            result = operation()
            released = self.sync.get(address, NOTHING)
            clock.acquire(released)
            if clock.release is not None:
                self.sync[address] = released.merged(clock.release) if released is not NOTHING else clock.release
            clock.note_atomic(address, order)
        if clock.spin_address == address and same_value(clock.spin_value, result):
            clock.spin_count += 1
            if clock.spin_count >= SPIN_LIMIT:
                raise SpinWait(self.races.describe_spin(self, clock, access))
        else:
            clock.spin_address, clock.spin_value, clock.spin_count = address, result, 0
        return result

    def check(self, earlier_accesses, clock, phase, address, access):
        for earlier in earlier_accesses:
            if earlier[CLOCK] is not clock and not ordered(earlier, clock, phase, address):
                self.races.report(self, earlier, access)


def same_value(a, b, dtype=None):
    """Same bits, as `dtype` if given (so NaN equals NaN, and 0.0 differs from -0.0)."""
    try:
        return np.asarray(a, dtype).tobytes() == np.asarray(b, dtype).tobytes()
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------------
# Tracked arrays: global-memory arguments of a launch, and shared arrays
# ------------------------------------------------------------------------------------------------


class TrackedMemory:
    """Element accesses of one numpy array, reported to a Shadow: the launch's global memory, or
    (``shadow`` None) the shared memory of the block running."""

    def init_tracking(self, ary, races, name, shadow):
        self.__dict__.update(
            _ary=ary,
            _races=races,
            _name=name,
            _shadow=shadow,
            _base=ary.__array_interface__["data"][0],
            _strides=ary.strides,
            _shape=ary.shape,
            # for the counters (workbench.simulator.counters): where the array's allocation starts, which a
            # GPU aligns to 256 bytes, and the bytes of one element
            track_origin=allocation_start(ary),
            track_itemsize=ary.dtype.itemsize,
        )

    def address(self, index):
        """The byte address of element `index` (numba's negative indices count from the end)."""
        if type(index) is tuple:
            offset = self._base
            for axis, i in enumerate(index):
                i = operator.index(i)
                if i < 0:
                    i += self._shape[axis]
                offset += i * self._strides[axis]
            return offset
        i = operator.index(index)
        if i < 0:
            i += self._shape[0]
        return self._base + i * self._strides[0]

    def get(self, index):
        value = self._ary[index]
        kind = type(value)
        if kind is np.ndarray:  # a row or a slice: a view, tracked as well
            return self.view(value)
        if kind is not np.void:  # (a record is left to numba's wrapper)
            if type(index) is int and index >= 0:  # the common case, without a call
                address = self._base + index * self._strides[0]
            else:
                address = self.address(index)
            (self._shadow or current.block.shared_shadow).read(address, self, index, value, sys._getframe(2))
        return value

    def set(self, index, value):
        ary = self._ary
        ary[index] = value
        if type(index) is tuple and len(index) != ary.ndim or type(index) is not tuple and ary.ndim != 1:
            return  # a row or a slice, not an element
        if type(index) is slice or type(index) is tuple and any(type(i) is slice for i in index):
            return
        if type(index) is int and index >= 0:
            address = self._base + index * self._strides[0]
        else:
            address = self.address(index)
        (self._shadow or current.block.shared_shadow).write(address, self, index, value, sys._getframe(2))

    def tracked_atomic(self, index, operation, frame):
        shadow = self._shadow or current.block.shared_shadow
        return shadow.atomic(self.address(index), self, index, frame, operation)


def allocation_start(ary):
    """The address of the first byte of the allocation a view of it starts in (its root array)."""
    while isinstance(ary.base, np.ndarray):
        ary = ary.base
    return ary.__array_interface__["data"][0]


def make_global_array_class(base):
    """A subclass of numba's in-kernel array wrapper whose element accesses are tracked."""

    class TrackedGlobalArray(base, TrackedMemory):
        def __init__(self, fake_array, races, name):
            base.__init__(self, fake_array)
            self.init_tracking(fake_array._ary, races, name, races.global_memory)

        def view(self, ary):
            return TrackedGlobalArray(type(self._item)(ary), self._races, self._name)

        def __getitem__(self, index):
            value = self.get(index)
            return base(type(self._item)(value)) if type(value) is np.void else value

        def __setitem__(self, index, value):
            self.set(index, value)

    return TrackedGlobalArray


class TrackedSharedArray(TrackedMemory):
    """A shared array as kernels see it, with element accesses reported to the block's Shadow."""

    def __init__(self, ary, races, name):
        self.init_tracking(ary, races, name, None)

    def view(self, ary):
        return TrackedSharedArray(ary, self._races, self._name)

    def __getitem__(self, index):
        return self.get(index)

    def __setitem__(self, index, value):
        self.set(index, value)

    def __getattr__(self, name):
        return getattr(self.__dict__["_ary"], name)

    def __len__(self):
        return len(self._ary)

    def __array__(self, dtype=None, copy=None):
        return self._ary if dtype is None else self._ary.astype(dtype)


def untracked(array):
    """The numpy array behind a tracked array (what atomics operate on), or the array itself."""
    if isinstance(array, TrackedMemory):
        return array.__dict__["_ary"]
    return array


# ------------------------------------------------------------------------------------------------
# One launch's detector, and its messages
# ------------------------------------------------------------------------------------------------

_SHARED_NAME = re.compile(r"(\w+)\s*=\s*cuda\.shared\.array\s*\(")


class LaunchRaces:
    """The race detector of one kernel launch."""

    def __init__(self, kernel, global_array_class):
        self.kernel = kernel  # the Python function launched
        self.global_array_class = global_array_class
        self.global_memory = Shadow("global", self)
        self.found = None  # (order key, shadow, first access, second access): the race to report
        self.accesses_since = 0  # accesses made since the first race was noted
        self.found_lock = threading.Lock()
        self.counts = None  # a counters.LaunchRecord, when the launch's counters are wanted too

    def track_argument(self, fake_array, name):
        return self.global_array_class(fake_array, self, name)

    def track_shared(self, ary, frame):
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        found = _SHARED_NAME.search(text)
        name = found.group(1) if found else f"the shared array of line {frame.f_lineno}"
        return TrackedSharedArray(ary, self, name)

    def new_block_shadow(self):
        return Shadow("shared", self)

    # -- messages ---------------------------------------------------------------------------------

    def report(self, shadow, earlier, later):
        """Note a race; raise_found() reports it when the block ends, unless a lower one turns up."""
        (rank1, first), (rank2, second) = sorted(((_rank(a), a) for a in (earlier, later)), key=lambda r: r[0])
        kinds = {first[KIND], second[KIND]}
        pair = 0 if kinds == {WRITE, READ} else 1 if kinds == {WRITE} else 2  # a read that may miss a write first
        key = (shadow.space != "shared", first[ARRAY]._name, _index_key(first[INDEX]), pair, rank1, rank2)
        with self.found_lock:
            if self.found is None or key < self.found[0]:
                self.found = (key, shadow, first, second)

    def run_on(self):
        self.accesses_since += 1  # unlocked: a count that is roughly right is enough
        if self.accesses_since > RUN_ON_AFTER_RACE:
            raise RaceError("stopped after a data race")  # raise_found() says which one

    def raise_found(self):
        """At the end of a block: raise the race noted during it (or in an earlier block), if any."""
        if self.found is not None:
            _, shadow, first, second = self.found
            raise RaceError(self.describe(shadow, first, second), places=[_place(first), _place(second)])

    def describe(self, shadow, earlier, later):
        what = f"{later[ARRAY]._name}{_subscript(later[INDEX])}"
        space = "shared memory" if shadow.space == "shared" else "global memory"
        first, second = earlier[CLOCK], later[CLOCK]
        same_block = first.block == second.block
        if same_block:
            who = (f"threads {first.thread_idx} and {second.thread_idx} of block {first.block_idx} "
                   f"both access {what} ({space})")
        else:
            who = (f"blocks {first.block_idx} and {second.block_idx} both access {what} ({space}), "
                   "and nothing orders the two accesses")
        lines = [
            f"data race in kernel {self.kernel.__name__} ({_where(self.kernel.__code__)}): {who}.",
            f"  {first.describe()} {_verb(earlier)} at {_line(earlier)}",
            f"  {second.describe()} {_verb(later)} at {_line(later)}",
            _why(earlier, later, same_block, shadow.space),
        ]
        return "\n".join(lines)

    def describe_spin(self, shadow, clock, access):
        what = f"{access[ARRAY]._name}{_subscript(access[INDEX])}"
        return (
            f"{clock.describe()} in kernel {self.kernel.__name__} has read {what} ({_line(access)}) "
            f"{SPIN_LIMIT} times in a row without it changing: it waits for another block to change it. "
            "The simulator runs the blocks of a launch one after another, so a block that waits for a "
            "block which has not started yet waits forever (on a GPU, the blocks that fit on the device "
            "run together, in no guaranteed order). This kernel needs a GPU to run; to make it correct "
            "everywhere, wait only for blocks that drew an earlier ticket from an atomic counter."
        )


_KIND_ORDER = {WRITE: 0, ATOMIC: 1, READ: 2}


def _rank(access):
    """The order in which the two accesses of a race are told: the write first, then by line, block, thread."""
    clock = access[CLOCK]
    return _KIND_ORDER[access[KIND]], line_of(access), clock.block, clock.tid


def _index_key(index):
    return tuple(int(i) for i in index) if type(index) is tuple else (int(index),)


def _place(access):
    code = access[CODE]
    line = line_of(access)
    return code.co_filename, line, linecache.getline(code.co_filename, line).strip()


def _subscript(index):
    if type(index) is tuple:
        return "[" + ", ".join(str(int(i)) for i in index) + "]"
    return f"[{int(index)}]"


def _where(code):
    return f"{_short_path(code.co_filename)}:{code.co_firstlineno}"


def _short_path(filename):
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def line_of(access):
    """The source line of an access, from its code object and bytecode offset."""
    code, offset = access[CODE], access[OFFSET]
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


def _line(access):
    code = access[CODE]
    line = line_of(access)
    text = linecache.getline(code.co_filename, line).strip()
    place = f"{_short_path(code.co_filename)}:{line} in {code.co_name}"
    return f"{place}: `{text}`" if text else place


def _verb(access):
    if access[KIND] is WRITE:
        return f"wrote it ({_value(access[VALUE])})"
    return {READ: "read it", ATOMIC: "updated it atomically"}[access[KIND]]


def _value(value):
    try:
        return f"the value {value.item() if hasattr(value, 'item') else value!r}"
    except (TypeError, ValueError):
        return "a value"


def _same_line(a, b):
    return a[CODE] is b[CODE] and line_of(a) == line_of(b)


def _why(earlier, later, same_block, space):
    kinds = {earlier[KIND], later[KIND]}
    if kinds == {READ, WRITE} and _same_line(earlier, later):
        effect = ("That line is a read-modify-write (like `+=`), which is not atomic: both can read the same "
                  "old value, and one of the two updates is lost.")
    elif kinds == {WRITE}:
        effect = "The two writes land in either order, so the value left behind depends on timing."
    elif ATOMIC in kinds:
        effect = ("An atomic protects only against other atomics: a plain access to the same element "
                  "can come before or after it.")
    else:
        effect = "The read may see the value from before or after the write, depending on timing."
    if same_block:
        fix = ("Fix: use cuda.atomic.add (or another cuda.atomic operation) for updates that threads share, "
               "or put a cuda.syncthreads() between one thread's write and the other's access"
               + (" (cuda.syncwarp() if both are lanes of one warp)." if space == "shared" else "."))
        return f"Nothing orders these threads between the two accesses. {effect}\n{fix}"
    fix = ("Fix: use cuda.atomic.add or give each block its own slot (for example "
           "partials[cuda.blockIdx.x]) and combine the slots in a second kernel launch, which starts only "
           "after every block of this one has finished. If one block must read what another wrote in the "
           "same launch, the writer calls cuda.threadfence() after writing and then signals with an "
           "atomic (a ticket counter or a flag) that the reader checks with an atomic before reading.")
    return (f"On a GPU the blocks of a launch run at the same time and in no fixed order (the simulator runs "
            f"them one after another, which hides the bug). {effect}\n{fix}")
