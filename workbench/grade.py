"""The autograder: ``workbench grade [OP[.STAGE]] [--impl exercises|solutions|FILE]``.

A submission (a generated exercise, the answer key, or any file that defines a stage's launcher) is
judged by the operator in ``solutions/``, never by anything the submission defines: its reference,
its input generator, its tolerance and its sizes. For every stage:

* **before running anything**, the source of the launcher and of every kernel and function it reaches
  is searched for the ``TODO(exercise)`` stub line: a stub is "not implemented yet", not a crash;
* **correctness**, case by case: the operator's check (or simulator) sizes plus extra sizes that are
  not multiples of any block, fresh random inputs for each, the output poisoned first, every output
  element compared (``workbench.check``), inputs compared after the call; and, while the call runs,
  the grader watches it: at least one kernel must be launched (numpy on the host is not a kernel),
  no device array may be copied to the host, the answer key's kernels may not be launched, and new
  device buffers (``cuda.device_array``) come filled with garbage, as they can on a GPU;
* **speed** (on a GPU only): the stage must reach ``GRADE_SPEED_BAR`` (default 60%) of the solution
  stage's bandwidth, both timed in the same run with ``workbench.timing.measure``.

Every stage runs in its own subprocess, one case at a time, with a timeout per case: a kernel that
hangs or kills its process fails that case, and grading goes on with the next. Grading never writes
to the submission's files. Failures come with a reason code and advice that names the usual cause
(a missing bounds check, a missing ``cuda.syncthreads()``, ...).

``grade_function("op.stage", launcher)`` grades a function defined in a notebook, in-process, with
the same checks and the same report.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import select
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from . import device as _device

DEFAULT_SPEED_BAR = 0.6
TIMEOUT_SIM_S = 300.0  # per case, in the simulator: generous, it is slow
TIMEOUT_GPU_S = 60.0
STARTUP_TIMEOUT_S = 120.0  # importing numba and the submission
PROTOCOL = "@@workbench-grade@@ "  # prefix of the worker's report lines on stdout

# Advice by reason code: what a learner should look at. Shown after the case's own message.
ADVICE = {
    "not-implemented": "not implemented yet: write the code where the TODO(exercise) line is, then delete that line",
    "missing": "the submission does not define this stage",
    "import-error": "the submission could not be imported: fix the error above (file and line are in the traceback)",
    "answer-key": "the submission runs the answer key's code: write your own kernel",
    "out-of-bounds": ("out-of-bounds access: missing bounds check? The grid is rounded up to whole blocks, so the "
                      "last block has threads with no element: guard every access (if i < x.size:)"),
    "launch-limit": ("the launch was refused: a block may have at most 1024 threads (x*y*z) and 48 KiB of static "
                     "shared memory; launch more blocks instead"),
    "warp-sync": "a warp intrinsic was called by only part of the lanes in its mask (a shuffle inside a branch?)",
    "unwritten": ("some output elements were never written: does every output element get a thread (or a loop "
                  "iteration)? Check the grid size and the loop bounds. (Or the output was accumulated into "
                  "without being zeroed first: it starts as garbage)"),
    "uninitialised": ("the output was accumulated into (atomics, +=) without being set to zero first: device "
                      "memory starts as garbage, zero it in a kernel before accumulating"),
    "nan": ("is there a cuda.syncthreads() between the threads' writes to shared memory and their reads of "
            "each other's data? Is every accumulator and buffer initialised before use (new device memory, like "
            "shared memory, starts as garbage)?"),
    "all-zeros": "the output is all zeros: was the result computed but never stored?",
    "wrong-values": "wrong values: the report shows the first wrong index and the worst elements",
    "input-modified": "the stage wrote to an input: inputs are read-only (use a scratch buffer)",
    "no-kernel-launch": ("no kernel was launched: the stage must compute on the GPU, in a @cuda.jit kernel "
                         "(computing with numpy on the host is not the exercise)"),
    "host-copy": ("the stage copied a device array to the host while running: the computation must stay on the "
                  "GPU (no copy_to_host / numpy in a launcher)"),
    "compile-error": "the kernel does not compile for the GPU (the message names the line and the types)",
    "exception": "the stage raised an exception",
    "timeout": ("did not finish in time: a kernel that never ends? (a loop whose index never advances, a "
                "cuda.syncthreads() that some threads never reach, a block waiting on another block)"),
    "crash": "the grading process died while running this case (a hard crash in the submission?)",
    "too-slow": "correct, but slower than the speed bar: see the stage's lesson for what makes it fast",
}
SHARED_MEMORY_ADVICE = ("this stage's kernels share data through shared memory: does a cuda.syncthreads() separate "
                        "every write to it from other threads' reads (and is it initialised before use)? In the "
                        "simulator, shared memory starts as garbage: NaN for floats, 0x7FFBADAD for ints")


@dataclass
class CaseResult:
    stage: str  # op.stage
    size: list
    passed: bool
    reason: str = ""
    message: str = ""
    advice: str = ""
    rel_err: float | None = None
    tolerance: float | None = None
    first_bad_index: list | None = None
    worst: list = field(default_factory=list)  # [index, got, expected] of the largest errors
    seconds: float = 0.0
    kind: str = "correctness"  # or "speed", or "stage" (one verdict for the whole stage: stub, missing...)
    speed: dict | None = None  # gbps, solution_gbps, ratio, bar (speed cases)

    @property
    def label(self) -> str:
        if self.kind == "speed":
            return "speed @ " + "x".join(map(str, self.size))
        if self.kind == "stage":
            return "stage"
        return "x".join(map(str, self.size))


@dataclass
class StageGrade:
    key: str
    order: int
    status: str  # "pass", "fail", "not-implemented", "skipped"
    cases: list = field(default_factory=list)
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class Report:
    impl: str
    mode: str
    seed: int
    stages: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def graded(self) -> list:
        return [s for s in self.stages if s.status != "skipped"]

    @property
    def score(self) -> tuple[int, int]:
        return sum(s.passed for s in self.graded), len(self.graded)

    @property
    def passed(self) -> bool:
        done, total = self.score
        return total > 0 and done == total

    def as_dict(self) -> dict:
        done, total = self.score
        return {"impl": self.impl, "mode": self.mode, "seed": self.seed, "seconds": round(self.seconds, 2),
                "score": {"passed": done, "total": total}, "passed": self.passed,
                "stages": [{"key": s.key, "order": s.order, "status": s.status, "note": s.note,
                            "cases": [asdict(c) for c in s.cases]} for s in self.stages]}

    def junit(self) -> str:
        cases = [(s, c) for s in self.stages for c in s.cases]
        failures = sum(not c.passed for s, c in cases if s.status != "skipped")
        lines = ['<?xml version="1.0" encoding="utf-8"?>',
                 f'<testsuites name="workbench grade" tests="{len(cases)}" failures="{failures}" '
                 f'time="{self.seconds:.3f}">',
                 f'<testsuite name={quoteattr("grade " + self.impl)} tests="{len(cases)}" failures="{failures}" '
                 f'time="{self.seconds:.3f}">']
        for s, c in cases:
            head = (f'<testcase classname={quoteattr(s.key)} name={quoteattr(c.label)} '
                    f'time="{c.seconds:.3f}"')
            if s.status == "skipped":
                lines.append(f"{head}><skipped message={quoteattr(s.note)}/></testcase>")
            elif c.passed:
                lines.append(f"{head}/>")
            else:
                body = "\n".join(filter(None, [c.message, c.advice, _worst_text(c)]))
                lines.append(f"{head}><failure type={quoteattr(c.reason or 'failed')} "
                             f"message={quoteattr(_one_line(c))}>{escape(body)}</failure></testcase>")
        lines += ["</testsuite>", "</testsuites>"]
        return "\n".join(lines) + "\n"

    def render(self, console=None) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = console or Console()
        table = Table(title=f"grade: {self.impl} ({'simulator' if self.mode == 'sim' else 'GPU'}, seed {self.seed})",
                      title_justify="left")
        for col in ("stage", "case", "result", "detail"):
            table.add_column(col, overflow="fold")
        for s in self.stages:
            if s.status == "skipped":
                table.add_row(s.key, "", "[yellow]skip[/]", escape(s.note))
                continue
            for c in s.cases:
                verdict = "[green]ok[/]" if c.passed else (
                    "[yellow]todo[/]" if c.reason == "not-implemented" else "[red]FAIL[/]")
                detail = _speed_text(c) if c.kind == "speed" else ("" if c.passed else _one_line(c))
                table.add_row(s.key, c.label, verdict, escape(detail))
        console.print(table)
        for s in self.stages:
            bad = [c for c in s.cases if not c.passed and c.reason != "not-implemented"]
            if not bad:
                continue
            c = bad[0]
            console.print(f"[bold]{s.key}[/] failed at {c.label}: {escape(c.message)}")
            if c.advice:
                console.print(f"  [cyan]advice:[/] {escape(c.advice)}")
            worst = _worst_text(c)
            if worst:
                console.print(escape("  " + worst.replace("\n", "\n  ")))
        done, total = self.score
        colour = "green" if self.passed else "red"
        console.print(f"[{colour}]score: {done}/{total} stages passed[/]" + (
            f" ({100 * done / total:.0f}%)" if total else "") + f" in {self.seconds:.0f} s")

    def text(self, width: int = 120) -> str:
        from rich.console import Console

        buf = io.StringIO()
        self.render(Console(file=buf, width=width, color_system=None, force_terminal=False, force_jupyter=False,
                            highlight=False))
        return buf.getvalue()


def _one_line(c: CaseResult) -> str:
    return c.message.splitlines()[0] if c.message else c.reason


def _worst_text(c: CaseResult) -> str:
    if not c.worst:
        return ""
    rows = [f"index {idx}: got {got!r}, expected {want!r}" for idx, got, want in c.worst]
    extra = []
    if c.first_bad_index is not None:
        extra.append(f"first wrong index {c.first_bad_index}")
    if c.rel_err is not None and c.kind == "correctness":
        extra.append(f"relative error {c.rel_err:.3g} (tolerance {c.tolerance:.1g})" if c.tolerance is not None
                     else f"relative error {c.rel_err:.3g}")
    if c.worst:
        try:
            extra.append(f"max abs error {max(abs(float(g) - float(w)) for _, g, w in c.worst):.3g}")
        except (TypeError, ValueError):
            pass
    return "; ".join(extra) + "\nworst elements:\n  " + "\n  ".join(rows)


def _speed_text(c: CaseResult) -> str:
    s = c.speed or {}
    if not s:
        return c.message
    return (f"{s['gbps']:.0f} GB/s vs solution {s['solution_gbps']:.0f} GB/s = {100 * s['ratio']:.0f}% "
            f"(bar {100 * s['bar']:.0f}%)" + ("" if c.passed else f": {c.message}"))


# -- what to grade ---------------------------------------------------------------------------------

def solution_module_name(op) -> str:
    """The solutions module (e.g. 'solutions.scan') that defines an operator."""
    return op.stages[0].launch.__module__ if op.stages else f"solutions.{op.name}"


def _module_file(name: str) -> Path:
    return Path(importlib.import_module(name).__file__)


def is_exercise(stage) -> bool:
    """Does the stage's solution code have a marked region (is it an exercise)?"""
    return any("# BEGIN SOLUTION" in src for _, src, _ in _sources(stage.launch))


def targets(target: str | None, impl: str = "exercises") -> list:
    """Stages to grade: OP.STAGE, every exercise stage of OP, or of every operator with an exercise."""
    from .ladder import load_operators, resolve

    if target:
        op, stages = resolve(target)
        if "." in target:
            return stages
        marked = [s for s in stages if is_exercise(s)]
        return marked or stages
    out = []
    for op in load_operators().values():
        out += [s for s in op.stages if is_exercise(s)]
    if impl not in ("exercises", "solutions") and not _is_dir(impl):
        # A single file: only the operators it defines stages for.
        names = _file_op_names(Path(impl))
        out = [s for s in out if s.op.name in names]
    return out


def _is_dir(impl: str) -> bool:
    return os.path.isdir(impl)


def _file_op_names(path: Path) -> set:
    import re

    text = path.read_text()
    names = set(re.findall(r"""name\s*=\s*["']([A-Za-z0-9_]+)["']""", text))
    names |= set(re.findall(r"""^\s*(?:from\s+solutions\.)([A-Za-z0-9_]+)""", text, re.M))
    names.add(path.stem)
    return names


def grade_sizes(op, mode: str, quick: bool = False) -> list[tuple]:
    """The operator's sizes for this mode plus extra adversarial ones (GRADE_EXTRA_SIZES in the module,
    else each dimension of the middle and the largest size plus one)."""
    from .ladder import as_size

    base = [as_size(s) for s in (op.sim_sizes if mode == "sim" else op.check_sizes)]
    module = importlib.import_module(solution_module_name(op))
    extra_spec = getattr(module, "GRADE_EXTRA_SIZES", None)
    middle = base[len(base) // 2]
    if isinstance(extra_spec, dict) and op.name in extra_spec and isinstance(extra_spec[op.name], dict):
        extra_spec = extra_spec[op.name]
    if isinstance(extra_spec, dict) and extra_spec.get(mode):
        extra = [as_size(s) for s in extra_spec[mode]]
    else:
        largest = max(base, key=lambda s: int(np.prod(s)))
        extra = [tuple(d + 1 for d in middle)] + ([] if quick else [tuple(d + 1 for d in largest)])
    if quick:  # the smallest size, and the middle one made awkward (one more in every dimension)
        chosen = [base[0], extra[0]]
    else:
        chosen = base + extra
    out = []
    for s in chosen:
        if s not in out:
            out.append(s)
    return out


# -- loading a submission --------------------------------------------------------------------------

def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def submission_path(impl: str, op) -> Path | None:
    """The file to load for ``impl`` (None: the solutions module itself)."""
    if impl == "solutions":
        return None
    module = solution_module_name(op).rsplit(".", 1)[-1]
    if impl == "exercises":
        return repo_root() / "exercises" / f"{module}.py"
    path = Path(impl)
    if path.is_dir():
        return path / f"{module}.py"
    return path


def load_file(path: Path):
    """Import a file as a fresh module (never writes next to it: no bytecode cache)."""
    path = Path(path).resolve()
    name = "submission_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:8]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def find_launch(module, op_name: str, stage_name: str) -> tuple[Callable | None, str]:
    """The submission's launcher for a stage, or (None, why not).

    Looked for as a stage of an Operator named op_name in the module, then as a module-level name
    equal to the stage's (a Stage or a plain function). It must be defined in the submission itself.
    """
    from .ladder import Operator, Stage

    found = []
    for value in list(vars(module).values()):
        if isinstance(value, Operator) and value.name == op_name:
            found += [s.launch for s in value.stages if s.name == stage_name]
    attr = getattr(module, stage_name, None)
    if isinstance(attr, Stage):
        found.append(attr.launch)
    elif callable(attr):
        found.append(attr)
    own = [f for f in found if getattr(f, "__module__", None) == module.__name__]
    if own:
        return own[0], ""
    if found:
        return None, (f"`{stage_name}` in the submission is {found[0].__module__}.{found[0].__qualname__}, not "
                      "code of its own: the answer key does not count")
    return None, (f"no stage {op_name}.{stage_name} in {getattr(module, '__file__', module.__name__)}: define "
                  f"`def {stage_name}(*inputs, out)` there, or register it with @op.stage({stage_name!r}, ...)")


def _sources(launch: Callable) -> list[tuple[str, str, int]]:
    """(qualname, source, first line) of the launcher and every kernel and module-level function it
    reaches by name, following plain helper functions too (a recursive launcher, say)."""
    seen: dict = {}

    def visit(func):
        code = getattr(func, "__code__", None)
        if code is None or id(func) in seen:
            return
        seen[id(func)] = func
        names = set(code.co_names)
        stack = list(code.co_consts)
        while stack:
            const = stack.pop()
            if hasattr(const, "co_names"):
                names |= set(const.co_names)
                stack += list(const.co_consts)
        for name in names:
            obj = func.__globals__.get(name)
            if obj is None:
                continue
            py = getattr(obj, "py_func", None)
            if py is not None and getattr(py, "__module__", None) == func.__module__:
                visit(py)
            elif inspect.isfunction(obj) and obj.__module__ == func.__module__:
                visit(obj)

    visit(launch)
    out = []
    for func in seen.values():
        try:
            lines, first = inspect.getsourcelines(func)
        except (OSError, TypeError):
            continue
        out.append((func.__qualname__, "".join(lines), first))
    return out


def display_path(filename: str | None) -> str:
    """A file name as a learner knows it: relative to here, or 'your notebook cell'."""
    if not filename:
        return "?"
    if "ipykernel" in filename or filename.startswith("<"):
        return "your notebook cell"
    path = os.path.abspath(filename)
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def find_stubs(launch: Callable) -> list[str]:
    """'file:line in `func`' for every TODO(exercise) stub line the stage still reaches."""
    from .exercises import stub_lines

    found = []
    filename = inspect.getsourcefile(launch) or "?"
    for qualname, source, first in _sources(launch):
        for line in stub_lines(source):
            found.append(f"{display_path(filename)}, line {first + line - 1}, in `{qualname}`")
    return sorted(set(found))


# -- watching a call -------------------------------------------------------------------------------

class Watch:
    """While active: record kernel launches and device-to-host copies; poison new device buffers."""

    def __init__(self):
        self.launches: list = []  # python functions of the kernels launched
        self.host_copies = 0
        self._undo: list = []

    def __enter__(self):
        from numba import cuda

        from .check import poison_like

        if _device.is_simulator():
            from .simulator import record_launches

            self._recorder = record_launches()
            recorded = self._recorder.__enter__()
            self._recorded = recorded
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as array_class
        else:
            from numba.cuda import dispatcher
            from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase as array_class

            original_call = dispatcher.CUDADispatcher.call
            watch = self

            def call(disp, args, launch_config):
                watch.launches.append(disp.py_func)
                return original_call(disp, args, launch_config)

            self._patch(dispatcher.CUDADispatcher, "call", call)
        original_copy = array_class.copy_to_host
        watch = self

        def copy_to_host(arr, *args, **kwargs):
            watch.host_copies += 1
            return original_copy(arr, *args, **kwargs)

        self._patch(array_class, "copy_to_host", copy_to_host)
        for name in ("device_array", "device_array_like"):
            original = getattr(cuda, name)

            def poisoned(*args, _original=original, **kwargs):
                arr = _original(*args, **kwargs)
                arr.copy_to_device(poison_like(np.empty(arr.shape, arr.dtype)))
                return arr

            self._patch(cuda, name, poisoned)
        return self

    def _patch(self, owner, name, value):
        self._undo.append((owner, name, owner.__dict__.get(name, getattr(owner, name))))
        setattr(owner, name, value)

    def __exit__(self, *exc):
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()
        if _device.is_simulator():
            self.launches += [py for py, _ in self._recorded]
            self._recorder.__exit__(*exc)
        return False


def _answer_key_kernels(launched: list) -> list[str]:
    """Kernels from solutions/ that contain a marked solution region (helpers are fine)."""
    out = []
    for py in launched:
        module = getattr(py, "__module__", "") or ""
        if module.startswith("solutions.") and py.__qualname__ not in out:
            try:
                source = inspect.getsource(py)
            except (OSError, TypeError):
                continue
            if "# BEGIN SOLUTION" in source:
                out.append(f"{module}.{py.__qualname__}")
    return out


def _classify_exception(exc: BaseException, filename: str | None) -> tuple[str, str]:
    name = type(exc).__name__
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if filename and os.path.abspath(f.filename) == os.path.abspath(filename)]
    if mine:
        f = mine[-1]
        where = f" at {display_path(f.filename)}, line {f.lineno} (`{(f.line or '').strip()}`)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, IndexError):
        return "out-of-bounds", f"out-of-bounds access{where}: {text}. Missing bounds check?"
    if name == "LaunchLimitError":
        return "launch-limit", f"launch refused{where}: {text}"
    if name == "WarpSyncError":
        return "warp-sync", f"{name}{where}: {str(exc).strip()}"
    if type(exc).__module__.startswith("numba") and name.endswith("Error") and ".errors" in type(exc).__module__:
        return "compile-error", f"{name}{where}: {str(exc).strip()[:1500]}"
    return "exception", f"{name}{where}: {text}"


# -- one case --------------------------------------------------------------------------------------

def _uses_shared_memory(launch: Callable) -> bool:
    return any("cuda.shared.array" in src or "syncthreads" in src for _, src, _ in _sources(launch))


def _explainer(op):
    module = importlib.import_module(solution_module_name(op))
    explain = getattr(module, "explain", None)
    return explain if callable(explain) else None


def run_case(stage, launch: Callable, size, rng: np.random.Generator, *, submission_file: str | None = None,
             answer_key_ok: bool = False) -> CaseResult:
    """Check ``launch`` as ``stage`` (the solution's: its operator judges) at one size."""
    from .check import check_stage
    from .ladder import as_size

    op = stage.op
    size = as_size(size)
    state = {"exc": None, "watch": None}

    def watched(*args):
        op.validate(*args)  # the grader's own inputs: a failure here is the grader's bug
        watch = Watch()
        state["watch"] = watch
        try:
            with watch:
                launch(*args)
                from numba import cuda

                cuda.synchronize()
        except BaseException as exc:
            state["exc"] = exc
            raise

    t0 = time.perf_counter()
    result = check_stage(stage, size, rng, launch=watched, explain=_explainer(op))
    seconds = time.perf_counter() - t0
    case = CaseResult(stage.key, list(size), result.passed, result.reason, result.message,
                      rel_err=_finite(result.rel_err), tolerance=result.tolerance,
                      first_bad_index=result.first_bad_index, worst=result.worst, seconds=seconds)
    watch = state["watch"]
    if state["exc"] is not None:
        case.passed = False
        case.reason, case.message = _classify_exception(state["exc"], submission_file)
        case.rel_err = None
    elif watch is not None:
        key = _answer_key_kernels(watch.launches)
        if not watch.launches:
            case.passed, case.reason = False, "no-kernel-launch"
            case.message = "no kernel was launched during the call" + (
                f" (and the output is wrong too: {result.message})" if result.message else "")
        elif key and not answer_key_ok:
            case.passed, case.reason = False, "answer-key"
            case.message = f"the stage launched the answer key's kernel {', '.join(key)}"
        elif watch.host_copies:
            case.passed, case.reason = False, "host-copy"
            case.message = f"the stage copied device data to the host {watch.host_copies} time(s) during the call"
    if not case.passed and result.skipped:
        case.passed = True
    if not case.passed:
        case.advice = ADVICE.get(case.reason, "")
        if case.reason in ("wrong-values", "unwritten", "all-zeros") and _uses_shared_memory(launch):
            case.advice = (case.advice + ". Also: " if case.advice else "") + SHARED_MEMORY_ADVICE
    return case


def _finite(x):
    return None if x is None or not np.isfinite(x) else float(x)


def speed_case(stage, launch: Callable, bar: float, size=None) -> CaseResult:
    """Time the submission and the solution stage on the same inputs, in the same process (GPU only)."""
    from numba import cuda

    from .bench import rotating_arg_sets
    from .check import compare
    from .ladder import as_size
    from .results import environment
    from .timing import measure

    op = stage.op
    module = importlib.import_module(solution_module_name(op))
    size = as_size(size or getattr(module, "GRADE_SPEED_SIZE", None) or op.headline_size)
    rng = np.random.default_rng(12345)
    inputs = op.make_inputs(size, rng)
    template = op.make_output(size)
    arg_sets = rotating_arg_sets(inputs, template, environment().get("l2_bytes"), max_sets=16)
    t0 = time.perf_counter()
    mine = measure(launch, arg_sets)
    ref_out = arg_sets[0][-1].copy_to_host()
    theirs = measure(stage.launch, arg_sets)
    cuda.synchronize()
    moved = op.bytes_moved(size)
    gbps, sol_gbps = moved / mine.median_us / 1e3, moved / theirs.median_us / 1e3
    ratio = theirs.median_us / mine.median_us
    check = compare(stage.key, size, ref_out, op.reference(*inputs),
                    stage.tolerance if stage.tolerance is not None else op.tolerance_for(size, stage.dtype))
    case = CaseResult(stage.key, list(size), ratio >= bar and check.passed, kind="speed",
                      seconds=time.perf_counter() - t0,
                      speed={"gbps": gbps, "solution_gbps": sol_gbps, "ratio": ratio, "bar": bar,
                             "median_us": mine.median_us, "solution_median_us": theirs.median_us})
    if not check.passed:
        case.reason, case.message = check.reason or "wrong-values", f"wrong at the timing size: {check.message}"
    elif ratio < bar:
        case.reason = "too-slow"
        case.message = f"{100 * ratio:.0f}% of the solution's bandwidth, the bar is {100 * bar:.0f}%"
        case.advice = ADVICE["too-slow"]
    return case


# -- the worker: one stage, many cases, in a subprocess ---------------------------------------------

def worker_main(stream_in=None, stream_out=None) -> int:
    """Entry point of ``python -m workbench.grade_worker``: a JSON job on stdin, report lines on stdout."""
    job = json.loads((stream_in or sys.stdin).read())
    out = stream_out or sys.stdout

    def emit(event: dict) -> None:
        out.write(PROTOCOL + json.dumps(event) + "\n")
        out.flush()

    run_job(job, emit)
    return 0


def prepare(stage, impl: str) -> tuple[Callable | None, CaseResult | None, str | None]:
    """(launch, a stage-level verdict instead of running, the submission's file)."""
    path = submission_path(impl, stage.op)
    if path is None:
        return stage.launch, None, inspect.getsourcefile(stage.launch)
    if not path.exists():
        return None, CaseResult(stage.key, [], False, "missing", f"{path} does not exist"
                                + (": run `workbench exercises build`" if impl == "exercises" else ""),
                                advice=ADVICE["missing"], kind="stage"), str(path)
    try:
        module = load_file(path)
    except BaseException as exc:  # a syntax error, an import error: the learner's file, reported
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:]).strip()
        return None, CaseResult(stage.key, [], False, "import-error", f"importing {path} failed:\n{tb}",
                                advice=ADVICE["import-error"], kind="stage"), str(path)
    launch, why = find_launch(module, stage.op.name, stage.name)
    if launch is None:
        reason = "answer-key" if "answer key" in why else "missing"
        if impl == "exercises" and reason == "missing":
            why += (" (the exercise predates this stage of the solution: `workbench exercises build` adds it, "
                    "with --backup if you have edited the file)")
        return None, CaseResult(stage.key, [], False, reason, why, advice=ADVICE[reason], kind="stage"), str(path)
    stubs = find_stubs(launch)
    if stubs:
        return None, CaseResult(stage.key, [], False, "not-implemented",
                                "not implemented yet: " + "; ".join(stubs) + " still has the TODO(exercise) stub line",
                                advice=ADVICE["not-implemented"], kind="stage"), str(path)
    return launch, None, str(path)


def run_job(job: dict, emit: Callable[[dict], None]) -> None:
    """Grade the job's items ([stage key, case index or "speed"]) in order, reporting each."""
    from .ladder import _SCRATCH

    prepared: dict = {}
    passed: dict = {}
    for key, case in job["items"]:
        if key not in prepared:
            stage = _stage_from(job["module"], key)
            launch, verdict, filename = prepare(stage, job["impl"])
            prepared[key] = (stage, launch, filename)
            passed[key] = verdict is None
            if verdict is not None:
                emit({"event": "stage", "stage": key, "result": asdict(verdict)})
            _SCRATCH.clear()
        stage, launch, filename = prepared[key]
        if launch is None:
            continue
        if case == "speed":
            if not (passed[key] and not _device.is_simulator()):
                emit({"event": "skip", "stage": key, "case": case})
                continue
            emit({"event": "start", "stage": key, "case": case})
            try:
                result = speed_case(stage, launch, job["speed_bar"][key])
            except Exception as exc:
                result = CaseResult(key, [], False, "exception", f"timing failed: {type(exc).__name__}: {exc}",
                                    kind="speed")
        else:
            emit({"event": "start", "stage": key, "case": case})
            rng = np.random.default_rng([job["seed"], case])
            result = run_case(stage, launch, job["sizes"][key][case], rng, submission_file=filename,
                              answer_key_ok=job["impl"] == "solutions")
            passed[key] &= result.passed
        emit({"event": "result", "stage": key, "case": case, "result": asdict(result)})


def _stage_from(module_name: str, key: str):
    """The solution stage ``op.stage`` from its module, without importing every other ladder."""
    from .ladder import Operator

    module = importlib.import_module(module_name)
    op_name, _, stage_name = key.partition(".")
    for value in vars(module).values():
        if isinstance(value, Operator) and value.name == op_name:
            return value[stage_name]
    raise KeyError(f"{module_name} defines no operator {op_name!r}")


def _case_from(d: dict) -> CaseResult:
    return CaseResult(**d)


def _run_job(job: dict, timeout: float) -> dict:
    """Run a job's items in worker subprocesses: {stage key: [CaseResult]}. An item that hangs or
    kills its process fails, and a fresh process goes on with the items after it."""
    import tempfile

    pending = [tuple(item) for item in job["items"]]
    results: dict = {}  # (key, case) -> CaseResult
    verdicts: dict = {}  # key -> CaseResult for the whole stage
    skipped: set = set()
    env = dict(os.environ, WORKBENCH_MODE=_device.mode(), PYTHONDONTWRITEBYTECODE="1")
    while pending:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, "-m", "workbench.grade_worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=env, cwd=str(repo_root()))
            proc.stdin.write(json.dumps(dict(job, items=[list(i) for i in pending])).encode())
            proc.stdin.close()
            current, buf = None, b""
            deadline = time.monotonic() + STARTUP_TIMEOUT_S + timeout
            failure = None
            fd = proc.stdout.fileno()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    proc.kill()
                    proc.wait()
                    failure = ("timeout", f"no result after {timeout:.0f} s: stopped")
                    break
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    proc.wait()
                    err.seek(0)
                    tail = err.read().decode(errors="replace").strip().splitlines()[-12:]
                    failure = ("crash", f"the grading process exited with code {proc.returncode}"
                               + (" while running this case" if current is not None else "")
                               + (":\n" + "\n".join(tail) if tail else ""))
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    if not text.startswith(PROTOCOL):
                        continue  # the submission's own prints
                    event = json.loads(text[len(PROTOCOL):])
                    item = (event["stage"], event.get("case"))
                    if event["event"] == "start":
                        current = item
                        deadline = time.monotonic() + timeout
                    elif event["event"] == "result":
                        results[item] = _case_from(event["result"])
                        current = None
                        deadline = time.monotonic() + timeout
                    elif event["event"] == "skip":
                        skipped.add(item)
                    elif event["event"] == "stage":
                        verdicts[event["stage"]] = _case_from(event["result"])
        left_over = [i for i in pending if i not in results and i not in skipped and i[0] not in verdicts]
        if not left_over:
            break
        reason, message = failure or ("crash", "the grading process stopped early")
        failed = current if current is not None else left_over[0]
        key, case = failed
        results[failed] = CaseResult(key, list(job["sizes"][key][case]) if case != "speed" else [], False, reason,
                                     message, advice=ADVICE[reason], seconds=timeout if reason == "timeout" else 0.0,
                                     kind="speed" if case == "speed" else "correctness")
        if current is None:  # it died before starting an item: the next process would too
            for item in left_over:
                if item not in results:
                    results[item] = CaseResult(item[0], [], False, reason, message, advice=ADVICE[reason])
        pending = [i for i in left_over if i not in results]
    out: dict = {}
    for key, case in job["items"]:
        if key in verdicts:
            out[key] = [verdicts[key]]
        elif (key, case) in results:
            out.setdefault(key, []).append(results[(key, case)])
    return out


def _stage_grade(stage, cases: list[CaseResult]) -> StageGrade:
    if any(c.reason == "not-implemented" for c in cases):
        status = "not-implemented"
    else:
        status = "pass" if cases and all(c.passed for c in cases) else "fail"
    return StageGrade(stage.key, stage.order, status, cases)


def grade(target: str | None = None, impl: str = "exercises", *, sizes=None, quick: bool = False,
          seed: int | None = None, timeout: float | None = None, jobs: int | None = None, speed: bool = True,
          progress: Callable[[str], None] | None = None) -> Report:
    """Grade the stages of ``target`` (default: every exercise) in ``impl``.

    One worker subprocess per solutions module (its stages in order), ``jobs`` of them at a time.
    """
    mode = _device.mode()
    seed = int(seed if seed is not None else np.random.SeedSequence().entropy % (2**31))
    timeout = timeout or (TIMEOUT_SIM_S if mode == "sim" else TIMEOUT_GPU_S)
    jobs = jobs or (max(1, os.cpu_count() or 1) if mode == "sim" else 1)  # one GPU: never time in parallel
    t0 = time.perf_counter()
    report = Report(impl, mode, seed)
    if impl not in ("exercises", "solutions"):
        impl = os.path.abspath(impl)  # the workers run from the repository root
    by_module: dict = {}
    stages = {}
    for stage in targets(target, impl):
        if stage.gpu_only and mode == "sim":
            report.stages.append(StageGrade(stage.key, stage.order, "skipped", note=f"needs a GPU: {stage.gpu_only}"))
            continue
        module = solution_module_name(stage.op)
        job = by_module.setdefault(module, {"impl": impl, "module": module, "seed": seed, "items": [],
                                            "sizes": {}, "speed_bar": {}})
        stage_sizes = [tuple(s) for s in sizes] if sizes else grade_sizes(stage.op, mode, quick)
        job["sizes"][stage.key] = [list(s) for s in stage_sizes]
        job["speed_bar"][stage.key] = _speed_bar(stage.op)
        job["items"] += [[stage.key, i] for i in range(len(stage_sizes))]
        if speed and mode != "sim":
            job["items"].append([stage.key, "speed"])
        stages[stage.key] = stage

    def run(job):
        if progress:
            progress(f"grading {job['module']}")
        return _run_job(job, timeout)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for cases_by_stage in pool.map(run, list(by_module.values())):
            for key, cases in cases_by_stage.items():
                report.stages.append(_stage_grade(stages[key], cases))
    report.stages.sort(key=lambda s: (s.key.split(".")[0], s.order))
    report.seconds = time.perf_counter() - t0
    return report


def _speed_bar(op) -> float:
    module = importlib.import_module(solution_module_name(op))
    return float(getattr(module, "GRADE_SPEED_BAR", DEFAULT_SPEED_BAR))


def grade_function(op_stage: str, launcher: Callable, *, sizes=None, quick: bool = False, seed: int | None = None,
                   speed: bool = True, show: bool = True) -> Report:
    """Grade a launcher defined here (a notebook cell) as stage ``op.stage``, in this process.

    The same checks and report as ``workbench grade``, without the subprocess: a kernel that hangs
    hangs the notebook (interrupt the kernel). Prints the report unless show=False; returns it.
    """
    from .ladder import resolve

    mode = _device.mode()
    seed = int(seed if seed is not None else np.random.SeedSequence().entropy % (2**31))
    _, (stage,) = resolve(op_stage)
    t0 = time.perf_counter()
    report = Report(f"{getattr(launcher, '__qualname__', 'function')} as {stage.key}", mode, seed)
    stubs = find_stubs(launcher)
    if stubs:
        cases = [CaseResult(stage.key, [], False, "not-implemented",
                            "not implemented yet: " + "; ".join(stubs) + " still has the TODO(exercise) stub line",
                            advice=ADVICE["not-implemented"], kind="stage")]
    else:
        try:
            filename = inspect.getsourcefile(launcher)
        except TypeError:
            filename = None
        cases = []
        for i, size in enumerate(sizes or grade_sizes(stage.op, mode, quick)):
            cases.append(run_case(stage, launcher, size, np.random.default_rng([seed, i]), submission_file=filename))
        if speed and mode != "sim" and all(c.passed for c in cases):
            cases.append(speed_case(stage, launcher, _speed_bar(stage.op)))
    report.stages.append(_stage_grade(stage, cases))
    report.seconds = time.perf_counter() - t0
    if show:
        print(report.text(), end="")
    return report


# -- CLI ------------------------------------------------------------------------------------------

def cmd_grade(args) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    if not args.json:
        _device.announce()
    impl = args.impl
    if impl not in ("exercises", "solutions") and not os.path.exists(impl):
        console.print(f"[red]error:[/] --impl {impl}: no such file or directory (use exercises, solutions or a path)")
        return 2
    report = grade(args.target, impl, sizes=args.size, quick=args.quick, seed=args.seed, timeout=args.timeout,
                   jobs=args.jobs, speed=not args.no_speed,
                   progress=None if args.json else (lambda text: console.print(f"[dim]{text}[/]")))
    if args.junit:
        Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
        Path(args.junit).write_text(report.junit())
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        report.render()
    if not report.stages:
        console.print("[yellow]nothing to grade[/] (no exercise stages matched)")
        return 1
    return 0 if report.passed else 1


def add_cli(sub) -> None:
    """Add `workbench grade` and `workbench exercises` to the CLI's subparsers."""
    from .cli import _parse_size
    from .exercises import add_cli as add_exercises_cli

    s = sub.add_parser("grade", help="grade exercises (or solutions, or a file): correctness, then speed on a GPU")
    s.add_argument("target", nargs="?", help="OP or OP.STAGE (default: every exercise)")
    s.add_argument("--impl", default="exercises",
                   help="exercises (default), solutions (the answer key), or a path to a file or directory")
    s.add_argument("--size", type=_parse_size, action="append", help="grade at these sizes only (repeatable)")
    s.add_argument("--quick", action="store_true", help="two sizes per stage (the smallest and an awkward one) instead of all")
    s.add_argument("--seed", type=int, help="reproduce a run (the report prints its seed)")
    s.add_argument("--timeout", type=float,
                   help=f"seconds per case (default {TIMEOUT_SIM_S:.0f} in the simulator, {TIMEOUT_GPU_S:.0f} on a GPU)")
    s.add_argument("--jobs", type=int, help="stages graded in parallel (default: CPU count in the simulator, 1 on a GPU)")
    s.add_argument("--no-speed", action="store_true", help="skip the speed bar on a GPU")
    s.add_argument("--json", action="store_true")
    s.add_argument("--junit", metavar="PATH", help="also write a JUnit XML report")
    s.set_defaults(func=cmd_grade)
    add_exercises_cli(sub)
