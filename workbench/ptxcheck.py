"""Would a real GPU accept this stage? Compile every kernel of it for sm_90, without a GPU.

The simulator runs plain Python, so it accepts kernels that numba's CUDA compiler rejects (lists,
strings, type errors) and it cannot see float64 creeping into a float32 kernel (a bare ``0.0`` or a
Python float argument is float64). So the CPU suite also compiles each stage for real:

1. in the simulator, run the stage once and record every kernel launch with the numba types of its
   arguments (``workbench.simulator.record_launches``). A stage the simulator cannot run (it links
   CUDA C++, say) is started anyway, once on a ragged size and once on one whose sizes are multiples
   of 16 (where launchers pick their vectorised kernels): the launch is recorded before the kernel
   starts, and the kernel then stops where it calls the code the simulator does not have;
2. in a subprocess with the real numba.cuda (``WORKBENCH_MODE=compile``: no GPU, no driver needed),
   ``numba.cuda.compile_ptx`` each kernel with those types for compute capability 9.0;
3. fail on any compile error, and on any ``.f64`` instruction in a stage that computes in float32;
4. report registers, spills and shared memory per kernel, from the assembler's report (nvJitLink from
   the CUDA wheels, else ``ptxas`` on PATH). A kernel that calls CUDA C++ (``cuda.declare_device(...,
   link=...)``) is measured as it runs: its numba side compiled to LTO-IR, the C++ compiled by NVRTC,
   both linked with link-time optimisation, as numba does at launch. Where NVRTC or nvJitLink is
   missing, the row says so and is ``skipped``, not failed.

Every stage gives at least one row: a stage that fails its check, launches no kernel, or whose
compiler process dies is a failed row that says why, never an empty table.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .device import COMPILE_CC

# The "a" target, as numba-cuda compiles on a Hopper GPU itself (codegen._ensure_cc adds it from cc 9.0 on):
# sm_90a accepts everything sm_90 does, plus the instructions only Hopper has (wgmma, setmaxnreg) that
# hgemm's Hopper stages issue.
CC = (*COMPILE_CC, "a")
ARCH = f"sm_{CC[0]}{CC[1]}{CC[2]}"
_F64 = re.compile(r"\.f64\b")
_EXTERN_CALL = re.compile(r"^\s*\.extern\s+\.func\b", re.M)  # a call into code numba did not compile
PROTOCOL = "PTXCHECK "  # the prefix of the compiler process's answer lines (anything else is noise)

# One vocabulary for every verdict the workbench prints (check's: passed, failed, skipped).
OK, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class KernelReport:
    """One kernel of one stage, compiled for sm_90: ``status`` is passed, failed, or skipped (a part of
    the check that this machine cannot do, ``message`` says which and why)."""

    stage: str
    kernel: str
    signature: str
    status: str = OK
    message: str = ""
    f64_lines: list = field(default_factory=list)
    registers: int | None = None
    spill_bytes: int | None = None
    shared_bytes: int | None = None
    linked: list = field(default_factory=list)  # CUDA C++ files linked into the kernel (gemm_mma.cu)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    @property
    def skipped(self) -> bool:
        return self.status == SKIPPED


class CollectError(RuntimeError):
    """A stage whose kernels could not be collected in the simulator; the message says why."""


# -- 1. collecting the launches, in the simulator ----------------------------------------------------

def _distinct(launches) -> list[tuple[str, str, tuple]]:
    seen, out = set(), []
    for py_func, types in launches:
        key = (py_func.__module__, py_func.__qualname__, types)
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def collect_launches(stage, size=None) -> tuple[list[tuple[str, str, tuple]], list[str]]:
    """Run ``stage`` once in the simulator: ((module, qualname, arg types) per distinct kernel, notes on
    what could not be collected)."""
    if stage.gpu_only:
        return collect_unrunnable(stage)
    from .check import check_stage
    from .simulator import record_launches

    op = stage.op
    size = size or op.sim_sizes[min(2, len(op.sim_sizes) - 1)]
    with record_launches() as launches:
        result = check_stage(stage, size)
    if not result.passed:
        raise CollectError(f"it failed its check in the simulator, so its kernels were not compiled: {result.message}")
    return _distinct(launches), []


def aligned_size(size) -> tuple:
    """``size`` with every number rounded up to a multiple of 16: the shape of a GPU's headline sizes,
    for which launchers choose their vectorised, 16-byte-aligned kernels."""
    return tuple(-(-int(n) // 16) * 16 for n in size)


def collect_unrunnable(stage) -> tuple[list[tuple[str, str, tuple]], list[str]]:
    """The launches of a stage the simulator cannot run (see the module's docstring, step 1). A size at
    which the launcher itself fails before launching anything gets a note: the kernel it would pick
    there is not compiled, and the report says so rather than leaving it out silently."""
    from .check import run_once
    from .ladder import as_size, size_label
    from .simulator import record_launches

    op = stage.op
    ragged = as_size(op.sim_sizes[min(2, len(op.sim_sizes) - 1)])
    found, notes = [], []
    for size in dict.fromkeys([ragged, aligned_size(ragged)]):
        inputs = op.make_inputs(size, np.random.default_rng(0))
        why = ""
        with record_launches() as launches:
            try:
                run_once(stage, inputs, op.make_output(size), launch=stage.launch)
            except Exception as exc:  # expected: the kernel reaches what only a GPU has; the launch is recorded
                why = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        if not launches and why:
            notes.append(f"at size {size_label(size)} the launcher could not run in the simulator ({why}): a kernel "
                         "it would launch only at such sizes is not compiled here")
        found += launches
    if not found:
        raise CollectError("its launcher launched no kernel in the simulator" + (f"; {notes[-1]}" if notes else ""))
    return _distinct(found), notes


# -- 2-4. compiling, in a process with the real numba.cuda ---------------------------------------------

def parse_assembler_log(text: str) -> dict:
    """Registers, spill bytes (stores + loads) and shared bytes from ptxas' ``-v`` report."""
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", text)
    smem = re.search(r"(\d+) bytes smem", text)
    if regs is None:
        return {}
    return {"registers": int(regs.group(1)), "spill_bytes": sum(map(int, spills)),
            "shared_bytes": int(smem.group(1)) if smem else 0}


def _link_log(objects, lto: bool) -> str:
    """Link (assemble) with nvJitLink for sm_90 and return its verbose log."""
    from cuda.core import Linker, LinkerOptions

    linker = Linker(*objects, options=LinkerOptions(arch=ARCH, verbose=True, link_time_optimization=lto or None))
    try:
        linker.link("cubin")
        return linker.get_info_log() or ""
    finally:
        linker.close()


def _system_ptxas_log(ptx: str) -> str:
    """The system ptxas' report, for machines without nvJitLink (it may be older than the NVVM that wrote
    the PTX: then the PTX is retried with the ISA version ptxas names)."""
    if not shutil.which("ptxas"):
        return ""

    def assemble(text: str) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            with open(src, "w") as f:
                f.write(text)
            return subprocess.run(["ptxas", "-v", f"-arch={ARCH}", src, "-o", os.path.join(d, "k.cubin")],
                                  capture_output=True, text=True)

    run = assemble(ptx)
    older = re.search(r"Unsupported \.version [\d.]+; current version is '([\d.]+)'", run.stderr)
    if older:
        run = assemble(re.sub(r"^\.version [\d.]+", f".version {older.group(1)}", ptx, count=1, flags=re.M))
    return run.stderr


def ptx_resources(ptx: str) -> dict:
    """Registers, spills and shared memory of one kernel's PTX, assembled for sm_90."""
    from cuda.core import ObjectCode

    try:
        return parse_assembler_log(_link_log([ObjectCode.from_ptx(ptx.encode(), name="kernel.ptx")], lto=False))
    except Exception as exc:
        if not toolchain_missing(exc):
            raise
        return parse_assembler_log(_system_ptxas_log(ptx))


def toolchain_missing(exc: BaseException) -> bool:
    """Is this 'a compiler library is not installed here' rather than an error in the code?"""
    try:
        from cuda.pathfinder import DynamicLibNotAvailableError, DynamicLibNotFoundError
        missing = (ImportError, DynamicLibNotFoundError, DynamicLibNotAvailableError)
    except ImportError:
        missing = (ImportError,)
    return isinstance(exc, missing)


def as_object_code(code, name: str):
    """What ``numba.cuda.compile_all`` returns (LTO-IR bytes for the kernel; for each linked file, the
    NVRTC output or numba's LinkableCode for ptx/cubin/fatbin/... files) as cuda.core ObjectCode."""
    from cuda.core import ObjectCode

    if isinstance(code, ObjectCode):
        return code
    if isinstance(code, (bytes, bytearray)):
        return ObjectCode.from_ltoir(bytes(code), name=name)
    factory = {"PTXSource": ObjectCode.from_ptx, "Cubin": ObjectCode.from_cubin, "Fatbin": ObjectCode.from_fatbin,
               "Archive": ObjectCode.from_library, "Object": ObjectCode.from_object, "LTOIR": ObjectCode.from_ltoir}
    return factory[type(code).__name__](code.data, name=code.name)


def link_with_cpp(kernel, types, bounds, report: KernelReport) -> None:
    """Compile the kernel and the CUDA C++ it links as numba does at launch (LTO-IR + NVRTC, linked
    with link-time optimisation) and fill in the linked kernel's resources."""
    from numba import cuda

    try:
        codes, _ = cuda.compile_all(kernel.py_func, tuple(types), device=False, abi="numba", cc=CC, output="ltoir",
                                    **({"launch_bounds": bounds} if bounds else {}))
        objects = [as_object_code(c, f"{report.kernel}.ltoir") for c in codes]
        report.linked = [o.name for o in objects[1:]]
        resources = parse_assembler_log(_link_log(objects, lto=True))
    except Exception as exc:
        what = ", ".join(report.linked) or "the CUDA C++ it links"
        if toolchain_missing(exc):
            report.status = SKIPPED
            report.message = (f"the numba side compiles; {what} was not compiled and linked here "
                              f"(NVRTC and nvJitLink, from the CUDA wheels: pip install 'numba-cuda[cu13]'): "
                              f"{type(exc).__name__}: {str(exc).strip()[:300]}")
        else:
            report.status = FAILED
            report.message = (f"{what} does not compile or link for {ARCH}: {type(exc).__name__}: "
                              f"{str(exc).strip(chr(0) + ' ').strip()[:1500]}")
        return
    for k, v in resources.items():
        setattr(report, k, v)
    report.message = f"linked with the CUDA C++ of {', '.join(report.linked)} (NVRTC, LTO), as at launch"


def compile_kernel(stage_key: str, module_name: str, qualname: str, types: tuple, forbid_f64: bool) -> KernelReport:
    """In THIS process (which must run the real numba.cuda): compile one kernel and report."""
    import importlib

    from numba import cuda

    rep = KernelReport(stage_key, f"{module_name}.{qualname}", "(" + ", ".join(map(str, types)) + ")")
    try:
        kernel = importlib.import_module(module_name)
        for part in qualname.split("."):
            kernel = getattr(kernel, part)
        # The kernel's own launch_bounds (a register cap) change what the assembler reports: keep them.
        bounds = getattr(kernel, "targetoptions", {}).get("launch_bounds")
        ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(types), cc=CC, **({"launch_bounds": bounds} if bounds else {}))
    except Exception as exc:  # a typing or lowering error: what the GPU would have said
        rep.status = FAILED
        rep.message = f"does not compile for {ARCH}: {type(exc).__name__}: {str(exc).strip()[:1500]}"
        return rep
    body = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    rep.f64_lines = [ln for ln in body if _F64.search(ln)][:5]
    if _EXTERN_CALL.search(ptx):
        link_with_cpp(kernel, types, bounds, rep)
    else:
        try:
            for k, v in ptx_resources(ptx).items():
                setattr(rep, k, v)
        except Exception as exc:  # the assembler refused the PTX: so would the driver, at load
            rep.status = FAILED
            rep.message = f"the PTX does not assemble for {ARCH}: {type(exc).__name__}: {str(exc).strip()[:1500]}"
    if forbid_f64 and rep.f64_lines:
        rep.status = FAILED
        rep.message = ("float64 instructions in a float32 stage (e.g. `" + rep.f64_lines[0] + "`): a bare float "
                       "literal, a Python float argument or a math function on a float64 value promotes the "
                       "arithmetic; write float32(...) literals and pass float32 values")
    return rep


_COMPILED: dict[tuple, KernelReport] = {}  # (module, qualname, types, forbid_f64) -> its report, this process


def compile_all(items: list[tuple[str, str, str, tuple, bool]]) -> list[KernelReport]:
    """In THIS process: compile each (stage, module, qualname, types, forbid_f64) and report. A kernel that
    an earlier stage launched with the same argument types (a ladder's shared helper kernels) is compiled
    once: the later stage gets a copy of its report."""
    reports = []
    for stage_key, *kernel in items:
        key = tuple(kernel)
        if key not in _COMPILED:
            _COMPILED[key] = compile_kernel(stage_key, *kernel)
        reports.append(dataclasses.replace(_COMPILED[key], stage=stage_key))
    return reports


class CompileProcess:
    """The subprocess that compiles: one line of work in, one line of reports out, per stage. Stages are
    sent as soon as their kernels are collected, so it compiles one while the next runs in the simulator."""

    def __init__(self):
        from .paths import REPO_ROOT

        path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=path)
        self.log = tempfile.TemporaryFile(mode="w+")  # its stderr: kept for the message if it dies
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench.ptxcheck"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def send(self, items) -> None:
        self.proc.stdin.write(base64.b64encode(pickle.dumps(items)).decode() + "\n")
        self.proc.stdin.flush()

    def receive(self) -> list[KernelReport]:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                return pickle.loads(base64.b64decode(line[len(PROTOCOL):].strip()))
        self.proc.wait()
        self.log.seek(0)
        raise RuntimeError(f"the compiler process ended (exit {self.proc.returncode}): {self.log.read()[-1500:]}")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def failed_row(stage, why: str) -> KernelReport:
    return KernelReport(stage.key, "-", "", FAILED, why)


def check_stages(stages, progress: Callable[[str], None] | None = None) -> list[KernelReport]:
    """Compile every kernel of ``stages`` for sm_90; at least one row per stage, in stage order.

    ``progress(text)`` is called once per stage as it finishes (a line such as 'gemm.naive: 1 ok'), so
    a caller can advance a bar of ``len(stages)`` steps. The simulator runs one stage while the compiler
    process compiles the one before it."""
    stages = list(stages)
    done: dict[str, list[KernelReport]] = {}
    extra: dict[str, list[KernelReport]] = {}  # skipped rows: what the simulator could not collect
    pending: deque = deque()  # (stage, rows already known or None: sent to the compiler)
    worker: CompileProcess | None = None
    dead = ""

    def finish(stage, rows) -> None:
        nonlocal dead
        if rows is None:
            try:
                rows = worker.receive() if not dead else None
            except RuntimeError as exc:
                dead = str(exc)
            rows = rows or [failed_row(stage, dead)]
        done[stage.key] = rows + extra[stage.key]
        if progress is not None:
            progress(f"{stage.key}: {summary(done[stage.key])}")

    try:
        for stage in stages:
            forbid = np.dtype(stage.dtype) == np.float32
            notes: list[str] = []
            try:
                launches, notes = collect_launches(stage)
                items = [(stage.key, m, q, t, forbid) for m, q, t in launches]
                rows = None
            except CollectError as exc:
                rows = [failed_row(stage, str(exc))]
            extra[stage.key] = [KernelReport(stage.key, "-", "", SKIPPED, note) for note in notes]
            if rows is None and dead:
                rows = [failed_row(stage, dead)]
            if rows is None:
                worker = worker or CompileProcess()
                try:
                    worker.send(items)
                except OSError:  # it has died: receiving says why
                    pass
            pending.append((stage, rows))
            while len(pending) > 1:  # the compiler works on one stage while the simulator runs the next
                finish(*pending.popleft())
        while pending:
            finish(*pending.popleft())
    finally:
        if worker is not None:
            worker.close()
    return [row for stage in stages for row in done[stage.key]]


def summary(rows: list[KernelReport]) -> str:
    """'2 passed', '1 passed, 1 skipped', '1 failed': one stage's outcome in a few words."""
    counts = {s: sum(r.status == s for r in rows) for s in (OK, FAILED, SKIPPED)}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n)


def _main() -> None:
    # Run as __main__, but pickle KernelReport under its importable name. Library chatter on stdout
    # (NVVM prints to it) goes to stderr: stdout carries only the answers.
    from workbench.ptxcheck import compile_all as importable_compile_all

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        if line.strip():
            reports = importable_compile_all(pickle.loads(base64.b64decode(line)))
            answers.write(PROTOCOL + base64.b64encode(pickle.dumps(reports)).decode() + "\n")
            answers.flush()


if __name__ == "__main__":
    _main()
