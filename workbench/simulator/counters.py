"""What the profiler would count, counted in the simulator: coalescing, bank conflicts, divergence.

The race checker (:mod:`workbench.simulator.races`) already sees every element access a kernel makes
to global and shared memory, with its thread, its address and the bytecode instruction that made it.
Inside :func:`counting`, each launch also keeps those accesses, and each simulated thread traces the
source lines it executes (``sys.settrace``, kernel code only). When the launch ends, the lanes of each
warp are grouped into *warp instructions* as the hardware groups them: lanes run the same instruction
together when they are at the same dynamic instance of it, that is the same bytecode instruction (or
source line) for the same time in their own run (the 3rd iteration of a loop meets the 3rd iteration,
whatever branches came before). Then, per instruction, what the hardware would do with it:

* a global load or store touches the 32-byte *sectors* and 128-byte *lines* its lanes' bytes fall in
  (addresses counted from the start of their array, which a GPU allocates 256-byte aligned); the ideal
  is the fewest sectors that could hold the distinct bytes asked for, ``ceil(bytes / 32)``;
* a shared-memory access is served in *wavefronts*: 32 banks of 4 bytes, bank ``(offset / 4) % 32``;
  lanes reading the same 4-byte word share it (a broadcast), different words in one bank take one
  wavefront each. The rule modelled for wider accesses is the one NVIDIA documents for 8-byte words
  and Nsight Compute shows for 16-byte vectors: the warp is split into phases of 128 bytes (two
  half-warps for 8-byte accesses, four quarter-warps for 16-byte ones), each phase at least one
  wavefront, and conflicts counted within a phase. Conflicts are the wavefronts beyond that ideal;
* element accesses on one line of a function declared a vector access (:func:`vector_access`: the
  simulator's ``load4``, a GPU's ``ld.global.v4``) that together make one 8- or 16-byte access per
  lane, contiguous and aligned, count as that one access (:func:`merge_vector_accesses`). Elsewhere two
  neighbouring elements read on one line stay two requests, as the compiler leaves them when it cannot
  prove their alignment (gemm's ``alpha_beta[0], alpha_beta[1]``: two 4-byte loads on the H200);
* an atomic counts once per warp instruction, with the lanes it updates;
* each executed source line counts its active lanes (threads per warp instruction, Nsight's
  ``smsp__thread_inst_executed_per_inst_executed.ratio``, with lines for SASS instructions), and each
  executed line that holds a conditional jump (``if``, ``while``, a ``for`` loop's test) is a branch:
  uniform when every active lane went on to the same next line;
* barriers (``syncthreads`` completed, per block and per warp) and warp intrinsics (shuffles, votes).

Counting is only ever on inside :func:`counting`; outside it nothing of this runs. It turns race
checking on for its launches (the accesses come from there). Cost, in CPU seconds on the 2-core
development machine (2026-11-29), each stage at its operator's largest simulator size: transpose's
stages +0.2 to +1.1 s over checking, softmax's +0.5 to +1.3 s, GEMM's +0.4 s (naive) to +4.2 s
(vectorized: 215,000 accesses and 2.4 million traced lines). Most of it is ``sys.settrace``: while it
is on, CPython 3.11 runs the thread's code without its specialised instructions; the line tracer is
installed on kernel and device-function frames only (:func:`LaunchRecord.entering_device_function`).
``tests/test_counters.py`` holds transpose's padded stage to under 4 s more than its check.

What it cannot see: caches (a load that hits L1 is still a request of its sectors; Nsight counts those
the same way at the L1 level, but DRAM traffic is smaller), the compiler's own merging of neighbouring
accesses into vector instructions (numba may turn two float32 reads into one 8-byte load), and replays
of atomics to one address. The comparison with recorded Nsight Compute counters
(``tests/test_counters.py``) names these where they make the figures differ.
"""

from __future__ import annotations

import dis
import math
import os
import sys
import sysconfig
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

WARP_SIZE = 32
SECTOR_BYTES = 32
LINE_BYTES = 128
BANKS = 32
BANK_BYTES = 4

GLOBAL = "global"  # an access's space, as races.Shadow names it ("shared" the other)

# Opcodes that make a line a branch: a conditional jump or a loop's test (CPython 3.10-3.13 names).
_BRANCH_OPCODES = {name for name in dis.opname if "JUMP" in name and "IF" in name} | {"FOR_ITER"}

# Code from these places is the simulator, numba, numpy or Python itself, never a kernel: not traced.
_NOT_KERNEL_DIRS = tuple(
    os.path.realpath(d) + os.sep
    for d in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
              os.path.dirname(os.path.dirname(__file__))}
)


# ------------------------------------------------------------------------------------------------
# Recording: what each simulated thread did, kept per thread and merged when it exits
# ------------------------------------------------------------------------------------------------


class _ThreadRecord(threading.local):
    """The simulated thread running on this Python thread, while a counted launch runs it."""

    launch = None  # the LaunchRecord
    clock = None  # its race-checker ThreadClock: block, warp, lane
    accesses = None  # [(space, kind, code, lasti, occurrence, origin, offset, itemsize)]
    instruction_counts = None  # (code, lasti) -> times this thread executed that access so far
    line_counts = None  # code -> {line: times this thread executed it}
    branches = None  # [(code, line, occurrence, next line or -1 for a return)]


current = _ThreadRecord()


class LaunchRecord:
    """Everything one counted launch did, merged from its threads as each one exits."""

    def __init__(self, kernel, grid_dim, block_dim):
        self.kernel = kernel
        self.grid_dim, self.block_dim = tuple(grid_dim), tuple(block_dim)
        self.lock = threading.Lock()
        self.accesses = {}  # (block, warp) -> [(lane, access), ...]
        self.lines = {}  # (block, warp, code, line) -> [times each lane executed it]
        self.branches = {}  # (block, warp, code, line, occurrence) -> {next line: lanes that went there}
        self.barriers = 0  # syncthreads() completed, per block
        self.barrier_warps = 0  # ... times the warps that took part
        self.intrinsics = {}  # kind -> warp-level calls completed
        self._traced = {}  # code -> its branch lines, or None where the code is not a kernel's

    # -- called by the simulator ----------------------------------------------------------------------

    def start_thread(self, clock):
        current.launch, current.clock = self, clock
        current.accesses, current.branches = [], []
        current.instruction_counts, current.line_counts = {}, {}
        sys.settrace(self._find_kernel_frame)

    def entering_device_function(self):
        """Called by the simulator as a device function is called: trace its lines too."""
        sys.settrace(self._find_kernel_frame)

    def end_thread(self):
        sys.settrace(None)
        clock = current.clock
        key = (clock.block, clock.warp)
        lane = clock.lane
        with self.lock:
            self.accesses.setdefault(key, []).extend((lane, access) for access in current.accesses)
            for code, counts in current.line_counts.items():
                for line, count in counts.items():
                    self.lines.setdefault((clock.block, clock.warp, code, line), []).append(count)
            for code, line, occurrence, following in current.branches:
                targets = self.branches.setdefault((clock.block, clock.warp, code, line, occurrence), {})
                targets[following] = targets.get(following, 0) + 1
        current.launch = current.clock = current.accesses = current.branches = None
        current.instruction_counts = current.line_counts = None

    def barrier(self, warps):
        self.barriers += 1
        self.barrier_warps += warps

    def intrinsic(self, kind):
        self.intrinsics[kind] = self.intrinsics.get(kind, 0) + 1

    # -- called on every access of a tracked array (from races.Shadow) --------------------------------

    def access(self, space, kind, array, address, frame):
        counts = current.instruction_counts
        if counts is None:
            return  # not one of this launch's simulated threads
        while self._branch_lines(frame.f_code) is None and frame.f_back is not None:
            frame = frame.f_back  # an access the simulator made for the kernel (cuda.ldcs): the kernel's line
        instruction = (frame.f_code, frame.f_lasti)
        occurrence = counts.get(instruction, 0)
        counts[instruction] = occurrence + 1
        origin = array.track_origin
        current.accesses.append((space, kind, instruction[0], instruction[1], occurrence, origin, address - origin,
                                 array.track_itemsize))

    # -- line tracing -----------------------------------------------------------------------------

    def _branch_lines(self, code):
        if code in self._traced:
            return self._traced[code]
        lines = None
        path = os.path.realpath(code.co_filename)
        if not code.co_filename.startswith("<") and not path.startswith(_NOT_KERNEL_DIRS):
            lines = frozenset(i.positions.lineno for i in dis.get_instructions(code)
                              if i.opname in _BRANCH_OPCODES and i.positions and i.positions.lineno)
        self._traced[code] = lines
        return lines

    def _find_kernel_frame(self, frame, event, arg):
        """The trace function while a kernel or device function is about to start: its frame gets a line
        tracer; then calls are ignored again (cheaply), as most calls a kernel makes are the simulator's."""
        branch_lines = self._branch_lines(frame.f_code)
        if branch_lines is None:
            return None  # the simulator on its way to the kernel: keep looking
        sys.settrace(_IGNORE_CALLS)
        return self._line_tracer(frame.f_code, branch_lines)

    @staticmethod
    def _line_tracer(code, branch_lines):
        counts = current.line_counts.setdefault(code, {})  # line -> times this thread ran it
        branches = current.branches
        last_branch, last_occurrence = 0, 0  # this frame's last line, if it was a branch (0: it was not)

        def trace_line(frame, event, arg):
            nonlocal last_branch, last_occurrence
            if event == "line":
                line = frame.f_lineno
                occurrence = counts.get(line, 0)
                counts[line] = occurrence + 1
                if last_branch:
                    branches.append((code, last_branch, last_occurrence, line))
                if line in branch_lines:
                    last_branch, last_occurrence = line, occurrence
                else:
                    last_branch = 0
            elif event == "return" and last_branch:
                branches.append((code, last_branch, last_occurrence, -1))
                last_branch = 0
            return trace_line

        return trace_line


# The trace function between kernel frames: called as getattr(frame, "call", None) on every call the
# thread makes, it answers None (no frame has that attribute) without running any Python, so the
# simulator's own calls do not get a line tracer and cost little. (sys.settrace has no cheaper filter
# before Python 3.12's sys.monitoring.)
_IGNORE_CALLS = getattr


_sessions = []  # the active counting() blocks, innermost last


@contextmanager
def counting():
    """Count what every kernel launched inside the ``with`` block does; yields the list of
    :class:`LaunchCounters`, one per launch, filled in as each launch ends."""
    launches = []
    _sessions.append(launches)
    try:
        yield launches
    finally:
        _sessions.remove(launches)


def new_launch(kernel, grid_dim, block_dim):
    """A LaunchRecord for a launch starting now, or None when nobody is counting."""
    return LaunchRecord(kernel, grid_dim, block_dim) if _sessions else None


def finish_launch(record):
    """Summarise a finished launch for every counting() block around it."""
    summary = summarise(record)
    for launches in _sessions:
        launches.append(summary)


# ------------------------------------------------------------------------------------------------
# Counting: the hardware's rules applied to each warp instruction
# ------------------------------------------------------------------------------------------------


def sectors_and_lines(offsets_and_sizes):
    """(sectors, 128-byte lines, ideal sectors) that one warp's global access touches."""
    sectors, lines, distinct = set(), set(), set()
    for offset, size in offsets_and_sizes:
        distinct.add((offset, size))
        for byte in (offset, offset + size - 1):
            sectors.add(byte // SECTOR_BYTES)
            lines.add(byte // LINE_BYTES)
    useful = sum(size for _, size in distinct)
    return len(sectors), len(lines), math.ceil(useful / SECTOR_BYTES)


def wavefronts(lanes_offsets_sizes):
    """(wavefronts, ideal wavefronts) of one warp's shared-memory access.

    The lanes are split into phases of 128 bytes (one phase for accesses of 4 bytes or fewer, half-warps
    for 8-byte ones, quarter-warps for 16-byte ones); in each phase, the busiest bank's count of distinct
    4-byte words is that phase's wavefronts (lanes on the same word share it)."""
    phases = {}
    for lane, offset, size in lanes_offsets_sizes:
        lanes_per_phase = WARP_SIZE // max(1, size // BANK_BYTES)
        words = phases.setdefault(lane // lanes_per_phase, {})
        for word in range(offset // BANK_BYTES, (offset + size - 1) // BANK_BYTES + 1):
            words.setdefault(word % BANKS, set()).add(word)
    total = sum(max(len(w) for w in banks.values()) for banks in phases.values())
    return total, len(phases)


@dataclass
class LineCounters:
    """One source line's accesses of one kind (a global load, a shared store, ...) in one kernel."""

    file: str
    line: int
    space: str  # "global" or "shared"
    kind: str  # "load", "store" or "atomic"
    requests: int = 0  # warp instructions
    lanes: int = 0  # thread accesses
    bytes: int = 0
    sectors: int = 0  # global: 32-byte sectors touched
    lines: int = 0  # global: 128-byte lines touched
    ideal_sectors: int = 0
    wavefronts: int = 0  # shared: wavefronts needed
    ideal_wavefronts: int = 0
    # one warp instruction of the line, [(lane, offset in its array, bytes)]: the first with the most lanes
    example: list = field(default_factory=list, repr=False)

    @property
    def sectors_per_request(self):
        return self.sectors / self.requests if self.requests else 0.0

    @property
    def wavefronts_per_request(self):
        return self.wavefronts / self.requests if self.requests else 0.0

    @property
    def conflicts(self):
        """Shared memory: wavefronts beyond the ideal (Nsight's l1tex__data_bank_conflicts_...)."""
        return self.wavefronts - self.ideal_wavefronts

    @property
    def excess(self):
        """Transactions this line wastes: sectors beyond the ideal, or conflicting wavefronts."""
        return self.sectors - self.ideal_sectors if self.space == GLOBAL else self.conflicts

    @property
    def efficiency(self):
        """Of what the line moves, the share it asked for (1.0: nothing wasted)."""
        if self.space == GLOBAL:
            return self.ideal_sectors / self.sectors if self.sectors else 1.0
        return self.ideal_wavefronts / self.wavefronts if self.wavefronts else 1.0

    def add(self, other):
        for name in ("requests", "lanes", "bytes", "sectors", "lines", "ideal_sectors", "wavefronts",
                     "ideal_wavefronts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if _better_example(other.example, self.example):
            self.example = other.example


@dataclass
class BranchCounters:
    """One source line that branches, in one kernel: how often a warp ran it, and how often it split."""

    file: str
    line: int
    executed: int = 0  # warp instructions
    divergent: int = 0  # ... after which the warp's lanes went to different lines

    def add(self, other):
        self.executed += other.executed
        self.divergent += other.divergent


@dataclass
class LaunchCounters:
    """The counters of one kernel (one launch, or several launches of it added together)."""

    kernel: str
    launches: int = 1
    memory: dict = field(default_factory=dict)  # (file, line, space, kind) -> LineCounters
    branches: dict = field(default_factory=dict)  # (file, line) -> BranchCounters
    lane_lines: dict = field(default_factory=dict)  # (file, line) -> [warp instructions, active lanes]
    barriers: int = 0
    barrier_warps: int = 0
    intrinsics: dict = field(default_factory=dict)
    unique_global_bytes: int = 0  # distinct global bytes touched: what DRAM must move at least

    def add(self, other):
        self.launches += other.launches
        for key, row in other.memory.items():
            self.memory.setdefault(key, LineCounters(*key)).add(row)
        for key, row in other.branches.items():
            self.branches.setdefault(key, BranchCounters(*key)).add(row)
        for key, (instructions, lanes) in other.lane_lines.items():
            mine = self.lane_lines.setdefault(key, [0, 0])
            mine[0] += instructions
            mine[1] += lanes
        self.barriers += other.barriers
        self.barrier_warps += other.barrier_warps
        for kind, n in other.intrinsics.items():
            self.intrinsics[kind] = self.intrinsics.get(kind, 0) + n
        self.unique_global_bytes += other.unique_global_bytes

    def total(self, space, kind):
        """The LineCounters of every line of one space and kind added together."""
        result = LineCounters("", 0, space, kind)
        for row in self.memory.values():
            if row.space == space and row.kind == kind:
                result.add(row)
        return result

    @property
    def threads_per_instruction(self):
        """Active lanes per executed warp instruction (32: no divergence, no partial warps)."""
        instructions = sum(i for i, _ in self.lane_lines.values())
        return sum(l for _, l in self.lane_lines.values()) / instructions if instructions else 0.0

    @property
    def uniform_branch_pct(self):
        executed = sum(b.executed for b in self.branches.values())
        return 100.0 * (1 - sum(b.divergent for b in self.branches.values()) / executed) if executed else 100.0

    @property
    def l1_global_bytes(self):
        """Bytes of the sectors global loads, stores and atomics touch (each request's sectors in full)."""
        return SECTOR_BYTES * sum(r.sectors for r in self.memory.values() if r.space == GLOBAL)


def summarise(record: LaunchRecord) -> LaunchCounters:
    """Group a finished launch's accesses and lines into warp instructions and count them."""
    result = LaunchCounters(record.kernel.__name__, barriers=record.barriers, barrier_warps=record.barrier_warps,
                            intrinsics=dict(record.intrinsics))
    touched = set()
    for _, lanes_accesses in sorted(record.accesses.items(), key=lambda item: item[0]):  # block 0's warp 0 first
        instructions = {}
        for lane, (space, kind, code, lasti, occurrence, origin, offset, size) in lanes_accesses:
            instructions.setdefault((space, kind, code, lasti, occurrence, origin), []).append((lane, offset, size))
            if space == GLOBAL:
                touched.add((origin + offset, size))
        for (space, kind, code, lasti, _, _), accesses in merge_vector_accesses(instructions).items():
            key = (code.co_filename, _line_of(code, lasti), space, kind)
            row = result.memory.get(key)
            if row is None:
                row = result.memory[key] = LineCounters(*key)
            row.requests += 1
            row.lanes += len(accesses)
            if _better_example(sorted(accesses), row.example):
                row.example = sorted(accesses)
            row.bytes += sum(size for _, _, size in accesses)
            if space == GLOBAL:
                sectors, lines, ideal = sectors_and_lines((offset, size) for _, offset, size in accesses)
                row.sectors += sectors
                row.lines += lines
                row.ideal_sectors += ideal
            else:
                waves, ideal = wavefronts(accesses)
                row.wavefronts += waves
                row.ideal_wavefronts += ideal
    result.unique_global_bytes = sum(size for _, size in touched)
    for (_, _, code, line), counts in record.lines.items():
        # Instance k of the line ran on the lanes that ran it more than k times.
        mine = result.lane_lines.setdefault((code.co_filename, line), [0, 0])
        mine[0] += max(counts)
        mine[1] += sum(counts)
    for (_, _, code, line, _), targets in record.branches.items():
        row = result.branches.setdefault((code.co_filename, line), BranchCounters(code.co_filename, line))
        row.executed += 1
        row.divergent += len(targets) > 1
    return result


VECTOR_ACCESS_CODE: set = set()  # code objects of the functions whose element accesses are one vector access


def vector_access(function):
    """Declare a simulator stand-in for a vector load or store (``load4``: four element reads on one line,
    one ``ld.global.v4`` on a GPU): its accesses are counted as the one vector access the GPU makes."""
    VECTOR_ACCESS_CODE.add(getattr(function, "py_func", function).__code__)
    return function


def _better_example(candidate: list, current: list) -> bool:
    """Whether ``candidate`` (a warp instruction's sorted accesses) should be a line's example warp instead
    of ``current``: more lanes first, then the lowest addresses, so that the warp drawn is the same in every
    run whatever order the simulated threads happened to record their accesses in."""
    return (-len(candidate), candidate) < (-len(current), current)


def merge_vector_accesses(instructions):
    """Element accesses that together are one 8- or 16-byte vector access, merged into it.

    The simulator emulates a 16-byte load (``load4`` of solutions/_vector_io.py, ``ld.global.v4`` on a
    GPU) as four element reads (and ``store4`` as four writes); counted apart, they would look like four
    strided requests (and, in shared memory, four conflicting ones). The accesses one call of a
    :func:`vector_access` function makes to one array are one vector access when every lane's bytes are
    contiguous, 8 or 16 in all, and aligned to that size, as the hardware's vector instructions require. ``instructions`` maps (space, kind, code,
    bytecode offset, occurrence, array) to [(lane, offset, bytes)]; the result has the same form."""
    by_line = {}
    for key in instructions:
        space, kind, code, lasti, occurrence, origin = key
        if code not in VECTOR_ACCESS_CODE:  # scalar code: each element access is its own instruction
            by_line[key] = [key]
            continue
        by_line.setdefault((space, kind, code, occurrence, origin), []).append(key)  # one call, any line
    merged = {}
    for keys in by_line.values():
        vector = _as_vector([instructions[key] for key in keys]) if len(keys) > 1 else None
        if vector is None:
            merged.update((key, instructions[key]) for key in keys)
        else:
            merged[min(keys, key=lambda key: key[3])] = vector
    return merged


def _as_vector(element_accesses):
    """[(lane, offset, bytes)] of one vector access per lane, or None where these are not one."""
    per_lane = {}
    for accesses in element_accesses:
        for lane, offset, size in accesses:
            per_lane.setdefault(lane, []).append((offset, size))
    vector = []
    for lane, parts in per_lane.items():
        parts.sort()
        total = sum(size for _, size in parts)
        start = parts[0][0]
        contiguous = all(a + n == b for (a, n), (b, _) in zip(parts, parts[1:]))
        if len(parts) != len(element_accesses) or total not in (8, 16) or start % total or not contiguous:
            return None
        vector.append((lane, start, total))
    return vector


def _line_of(code, lasti, _cache={}):
    key = (code, lasti)
    line = _cache.get(key)
    if line is None:
        line = code.co_firstlineno
        for start, end, number in code.co_lines():
            if start <= lasti < end and number is not None:
                line = number
                break
        _cache[key] = line
    return line


def merge_by_kernel(launches):
    """One LaunchCounters per kernel name, launches of the same kernel added together, in first-launch order."""
    merged = {}
    for launch in launches:
        if launch.kernel in merged:
            merged[launch.kernel].add(launch)
        else:
            merged[launch.kernel] = LaunchCounters(launch.kernel, launches=0)
            merged[launch.kernel].add(launch)
    return list(merged.values())
