"""compute-sanitizer's reports, turned into one teaching line per finding.

``compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck`` prints each error as a block of
lines prefixed with ``=========``: a headline (``Invalid __global__ write of size 4 bytes``, ``Potential
RAW hazard detected at __shared__ 0x8 in block (0,0,0)``, ``Barrier error detected``, ``Uninitialized
__global__ memory read``) and indented details (``at <kernel>+0x70 in file.py:25``, ``by thread
(31,0,0) in block (3,0,0)``, ``Address ... is out of bounds``). :func:`parse` reads both the current
form (``at kernel+0x70 in file:line``) and the older one (``at 0x70 in file:line:kernel``), and
:func:`teach` says what happened in words a learner acts on: the kernel, the source line (and its
text, when the file is at hand), the thread, what it did and the usual cause.

Line numbers need line information in the kernels: the sanitize command runs stages with
``NUMBA_CUDA_DEBUGINFO=1``. Model layer, so that the command (``workbench sanitize``, the tools room)
and the grader can both use it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")

PREFIX = re.compile(r"^=========(?: |$)")
THREAD = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)")
# "at kernel(args)+0x70 in /path/file.py:25" (2023+) or "at 0x70 in /path/file.py:25:kernel(args)" (older);
# without line information: "at kernel+0x70" / "at 0x70 in kernel(args)".
LOCATION = re.compile(r"(?P<file>[^\s:]+\.(?:py|cu|cuh|cpp|c|h)):(?P<line>\d+)")
SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


@dataclass
class Finding:
    tool: str
    what: str  # the headline, e.g. "Invalid __global__ write of size 4 bytes"
    kind: str  # "out-of-bounds", "misaligned", "race", "barrier", "uninitialized", "other"
    kernel: str | None = None
    file: str | None = None
    line: int | None = None
    thread: tuple | None = None
    block: tuple | None = None
    other_thread: tuple | None = None  # racecheck: the thread on the other side of the hazard
    other_line: int | None = None
    access: str | None = None  # racecheck: "RAW", "WAR", "WAW"; memcheck: "read"/"write"
    details: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _kernel_of(text: str) -> str | None:
    """The kernel's short name in a location: 'at cudapy::m::_tree[abi:v1,...](Array<...>)+0x70 in f.py:9',
    'at 0x70 in f.py:9:cudapy::m::_tree[abi:...](...)', 'Write Thread (4,0,0) at _tree+0x2c0 in f.py:9'."""
    m = re.search(r"\bat (.*)", text)
    if not m:
        return None
    where = LOCATION.sub("", m.group(1))  # the file:line, wherever it stands
    where = re.sub(r"^0x[0-9a-fA-F]+\s+in\s+", "", where.strip())  # the older form's leading pc offset
    where = re.sub(r"\+0x[0-9a-fA-F]+.*$", "", where)  # the newer form's offset and what follows
    where = re.sub(r"\s+in\s*$", "", where).strip(" :")
    name = where.split("(")[0].split("[abi")[0].split("<")[0].rsplit("::", 1)[-1].strip()
    return name or None


def _location(text: str) -> tuple[str | None, int | None, str | None]:
    m = LOCATION.search(text)
    return (m.group("file"), int(m.group("line")), _kernel_of(text)) if m else (None, None, _kernel_of(text))


def _classify(tool: str, what: str) -> tuple[str, str | None]:
    w = what.lower()
    if "hazard" in w or "race" in w:
        m = re.search(r"\b(RAW|WAR|WAW)\b", what)
        return "race", m.group(1) if m else None
    if "barrier" in w or "sync" in w:
        return "barrier", None
    if "uninitialized" in w:
        return "uninitialized", "read"
    if "misaligned" in w:
        return "misaligned", "write" if "write" in w else "read"
    if "invalid" in w and ("read" in w or "write" in w or "atomic" in w):
        return "out-of-bounds", "write" if "write" in w else ("atomic" if "atomic" in w else "read")
    return "other", None


def _blocks(output: str) -> list[list[str]]:
    """The sanitizer's lines (prefix removed) grouped by finding: a headline and its indented details."""
    groups: list[list[str]] = []
    for raw in output.splitlines():
        if not PREFIX.match(raw):
            continue
        line = PREFIX.sub("", raw, count=1)
        text = line.strip()
        if not text or text.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "LEAK SUMMARY", "RACECHECK SUMMARY",
                                        "Program hit", "Target application returned")):
            continue
        if line.startswith(" ") and groups:
            groups[-1].append(text)
        elif not line.startswith(" "):
            groups.append([text])
    return groups


def parse(output: str, tool: str) -> list[Finding]:
    """Findings in a compute-sanitizer run's output, in the order printed, duplicates (the same kind
    at the same lines) folded into the first."""
    findings, seen = [], set()
    for block in _blocks(output):
        head = re.sub(r"^Error:\s*", "", block[0])
        if head.startswith(("Saved host backtrace", "Host Frame", "Device Frame")):
            continue
        kind, access = _classify(tool, head)
        f = Finding(tool, head, kind, access=access)
        m = re.search(r"in block " + THREAD.pattern, head)
        if m:
            f.block = tuple(int(v) for v in m.groups())
        if head.startswith("Race reported between"):  # racecheck's analysis form: two locations in two lines
            f.file, f.line, f.kernel = _location(head)
            f.access = head.split("Race reported between ")[1].split(" access")[0]
            if len(block) > 1:
                _, f.other_line, _ = _location(block[1])
        for d in block[1:]:
            if d.startswith(("Saved host backtrace", "Host Frame", "Device Frame")):
                continue
            f.details.append(d)
            threads = THREAD.findall(d)
            if d.startswith("at ") and f.line is None:
                f.file, f.line, f.kernel = _location(d)
            elif d.startswith("by thread") and threads:
                f.thread = tuple(map(int, threads[0]))
                if len(threads) > 1:
                    f.block = tuple(map(int, threads[1]))
            elif re.match(r"(Write|Read|Atomic)\s+Thread", d) and threads:  # racecheck's hazard form
                file, line, kernel = _location(d)
                if f.thread is None:
                    f.thread, f.file, f.line, f.kernel = tuple(map(int, threads[0])), file, line, kernel
                else:
                    f.other_thread, f.other_line = tuple(map(int, threads[0])), line
        key = (f.kind, f.access, f.kernel, f.line, f.other_line)
        if key in seen:
            continue
        seen.add(key)
        findings.append(f)
    return findings


def is_sanitizer_log(output: str) -> bool:
    """Did compute-sanitizer write this? Every line it prints starts with its "=========" prefix."""
    return any(PREFIX.match(line) for line in output.splitlines())


def error_count(output: str) -> int | None:
    m = SUMMARY.search(output)
    return int(m.group(1)) if m else None


def _source_line(file: str | None, line: int | None) -> str | None:
    if not file or not line:
        return None
    try:
        lines = Path(file).read_text().splitlines()
    except OSError:
        return None
    return lines[line - 1].strip() if 0 < line <= len(lines) else None


def _where(f: Finding) -> str:
    place = f"line {f.line} of {Path(f.file).name}" if f.line else "a line the report does not name (no line info)"
    code = _source_line(f.file, f.line)
    return place + (f" (`{code}`)" if code else "")


def _thread(t, b=None) -> str:
    if t is None:
        return "a thread"
    text = f"thread ({t[0]},{t[1]},{t[2]})"
    return text + (f" of block ({b[0]},{b[1]},{b[2]})" if b else "")


def teach(f: Finding) -> str:
    """One line a learner can act on."""
    kernel = f"kernel {f.kernel}" if f.kernel else "a kernel"
    if f.kind == "out-of-bounds":
        return (f"{f.tool}: {kernel}, {_where(f)}: {_thread(f.thread, f.block)} made a {f.access} outside every "
                f"allocation ({f.what}). An index past the end of the array: a thread beyond the data (missing "
                "`if i < n:` bounds check) or an index computed wrong.")
    if f.kind == "misaligned":
        return (f"{f.tool}: {kernel}, {_where(f)}: {_thread(f.thread, f.block)} made a misaligned {f.access} "
                f"({f.what}): a vector access at an address that is not a multiple of its size.")
    if f.kind == "race":
        other = (f" against line {f.other_line}" + (f" (`{_source_line(f.file, f.other_line)}`)"
                                                   if _source_line(f.file, f.other_line) else "")) if f.other_line else ""
        who = (f"{_thread(f.thread)} and {_thread(f.other_thread)}" if f.other_thread else "two threads")
        block = f" in block ({f.block[0]},{f.block[1]},{f.block[2]})" if f.block else ""
        hazard = {"RAW": "one reads shared memory another writes", "WAR": "one writes shared memory another "
                  "still reads", "WAW": "both write the same shared memory"}.get(f.access or "", "they touch the "
                                                                                   "same shared memory")
        return (f"{f.tool}: {kernel}, {_where(f)}{other}: {who}{block} race, {hazard} ({f.access or 'hazard'}), "
                "with no cuda.syncthreads() between the write and the read.")
    if f.kind == "barrier":
        return (f"{f.tool}: {kernel}, {_where(f)}: {_thread(f.thread, f.block)} reached a cuda.syncthreads() that "
                f"not every thread of its block reaches ({f.what}): a barrier inside an `if` that divides the block.")
    if f.kind == "uninitialized":
        return (f"{f.tool}: {kernel}, {_where(f)}: {_thread(f.thread, f.block)} read device memory nothing had "
                f"written ({f.what}): a buffer used before it was filled (zero it, or write before reading).")
    return f"{f.tool}: {kernel}, {_where(f)}: {f.what}."
