"""What a submission may not do while it is graded, refused where it happens and recorded.

The grading worker installs all of these before it imports the submission; ``grade_function`` (in a
notebook, in-process) uses only the device-array guard, for the length of each call.

* **The answer key** (the ladder modules of ``solutions/``) cannot be imported (an import hook) nor
  read (an audit hook on ``open``), so its source cannot be executed either. Its shared helpers
  (``solutions/_*.py``, no answers in them) and the package itself may be.
* **The repository** is not writable: opening a file in it for writing, removing, renaming or
  creating one is refused.
* **Processes**: code of the submission may not start any (the libraries it calls may), nor signal a
  process outside the worker's own session (the grader, its group).
* **The host** (during a call, outside kernels): device data may not be read on the host (copies,
  indexing, numpy on a device array), and the output may not be written from the host: the stage
  must compute on the GPU, and its output must come from its kernels.

Each refusal raises in the submission's code (``PermissionError``, ``ImportError`` or
:class:`HostAccessRefused`) *and* is recorded, so that a submission that catches the exception still
fails, for the recorded reason. None of this decides a verdict: the grader compares the outputs in
its own process; these only say why a submission that cheats (or strays) is rejected.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import device as _device
from ..paths import REPO_ROOT
from .submission import WORKBENCH_DIR, is_library_file

ANSWER_KEY_PACKAGE = "solutions"


class HostAccessRefused(AttributeError):
    """Device data touched on the host during a graded call. (An AttributeError, so that probes such
    as numpy's ``__array_interface__`` lookup fail the way a real GPU array's would.)"""


@dataclass
class Refusal:
    reason: str  # a code of workbench.grade.reasons: answer-key, wrote-file, process, host-copy, host-write
    what: str  # one line: what was refused


@lru_cache(maxsize=None)
def _stdlib_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths)


def _is_stdlib(filename: str) -> bool:
    return filename.startswith("<frozen") or os.path.realpath(filename).startswith(_stdlib_roots())


# The workbench's machinery that runs a submission's kernels (the simulator's launch and blocks): trusted
# like numba's. Any other workbench code (to_host, fill_from_host, scratch, ...) is a helper: it acts for
# whoever called it, so the guards look through it to its caller and a helper never launders a host copy.
MACHINERY_DIRS = (os.path.join(os.path.realpath(WORKBENCH_DIR), "simulator") + os.sep,)


@lru_cache(maxsize=4096)
def _workbench_helper(filename: str) -> bool:
    real = os.path.realpath(filename)
    return real.startswith(os.path.realpath(WORKBENCH_DIR) + os.sep) and not real.startswith(MACHINERY_DIRS)


def _requester(skip) -> str:
    """The file of the first frame for which ``skip(file)`` is false, looking through this module and the
    workbench's helpers to whoever called them. A stack of nothing but the workbench's own code (the
    worker between calls) is the workbench's request."""
    frame, last = sys._getframe(1), __file__
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename == __file__ or _workbench_helper(filename) or skip(filename)):
            return filename
        last = filename if _workbench_helper(filename) else last
        frame = frame.f_back
    return last


def _submission_asked(skip=_is_stdlib) -> bool:
    """Did the submission's code (not a library's) ask for what is being done?"""
    return not is_library_file(_requester(skip))


def _library_lookup() -> bool:
    """Is ``ctypes.util.find_library`` asking (it runs ``ldconfig -p``, or gcc/ld, to find a shared
    library)? On a GPU, numba and the CUDA bindings find the driver, NVVM and NVRTC that way the first
    time a kernel compiles: a read-only lookup, not the submission starting work of its own."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("_find") and code.co_filename.endswith(os.path.join("ctypes", "util.py")):
            return True
        frame = frame.f_back
    return False


def _path_of(arg) -> str | None:
    if isinstance(arg, int):
        return None  # a file descriptor
    try:
        path = os.fsdecode(os.fspath(arg))
    except TypeError:
        return None
    return os.path.realpath(path)


def _inside(path: str | None, roots) -> bool:
    return path is not None and any(path == r or path.startswith(r + os.sep) for r in roots)


def _shared(path: str) -> bool:
    """The answer key's package file and its shared helpers (``solutions/_ptx.py``): no answers in them."""
    return os.path.basename(path).startswith("_")


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CHANGE_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.symlink", "os.link",
                 "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.move", "os.chflags"}
PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                  "os.exec", "os.startfile", "pty.spawn"}


SIGNAL_EVENTS = {"os.kill", "os.killpg"}


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _own_processes(event: str, target, sig) -> bool:
    """Is a signal ``sig`` to ``target`` (a pid for os.kill, a group for os.killpg; 0, -1 and -group
    as kill(2) reads them) meant for the worker's own session only (itself, what it started), or a
    mere probe (signal 0)? A submission that kills its parent's group would otherwise take the
    grader, and its report, with it."""
    if sig == 0:
        return True
    own_group, own_session = os.getpgid(0), os.getsid(0)
    if event == "os.killpg":
        return target in (0, own_group)
    if target == 0:
        return True  # the caller's own group
    if target == -1:
        return False  # every process it may signal
    if target < 0:
        return -target == own_group
    return target == os.getpid() or _session_of(target) == own_session


class Guard:
    """The record of refusals, and the switches that say what is refused right now."""

    def __init__(self, answer_key_dirs=(), repo_root=REPO_ROOT):
        self.refusals: list[Refusal] = []
        self.answer_key_dirs = tuple(os.path.realpath(d) for d in answer_key_dirs)
        self.repo_root = (os.path.realpath(repo_root),)
        self.output = None  # the device output array while a call runs (None between calls)

    def refuse(self, reason: str, what: str) -> None:
        self.refusals.append(Refusal(reason, what))

    def take(self) -> list[Refusal]:
        """The refusals recorded since the last take."""
        taken, self.refusals = self.refusals, []
        return taken

    # -- the worker's guards, for the life of the process ---------------------------------------------

    def install(self) -> None:
        """Refuse the answer key's imports, and (by an audit hook, which cannot be removed) reads of its
        files, writes into the repository, and processes started by the submission."""
        if self.answer_key_dirs:
            sys.meta_path.insert(0, _AnswerKeyBlocker(self))
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple) -> None:
        if event == "open":
            self._check_open(*args[:3])
        elif event in CHANGE_EVENTS:
            for path in map(_path_of, args[:2]):
                if _inside(path, self.repo_root):
                    self.refuse("wrote-file", f"{event} {path}")
                    raise PermissionError(f"{event}({path!r}): the repository is read-only while grading")
        elif event in SIGNAL_EVENTS and not _own_processes(event, *args[:2]):
            self.refuse("signal", f"{event}{tuple(args[:2])}")
            raise PermissionError(f"{event}{tuple(args[:2])}: a stage may not signal processes that are not its own")
        elif event in PROCESS_EVENTS and _submission_asked() and not _library_lookup():
            what = " ".join(map(str, args[1])) if event == "subprocess.Popen" and args[1:2] else event
            self.refuse("process", f"{event}: {what}"[:200])
            raise PermissionError(f"{event}: a stage may not start processes while it is graded")

    def _check_open(self, file, mode=None, flags=0) -> None:
        path = _path_of(file)
        if path is None:
            return
        if _inside(path, self.answer_key_dirs) and path.endswith(".py") and not _shared(path):
            self.refuse("answer-key", f"open {path}")
            raise PermissionError(f"{path}: the answer key is not readable while grading")
        writing = any(c in (mode or "") for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
        if writing and _inside(path, self.repo_root):
            self.refuse("wrote-file", f"open {path} for writing")
            raise PermissionError(f"{path}: the repository is read-only while grading")

    # -- the device-array guard, for the length of one call -------------------------------------------

    @contextmanager
    def call(self, output):
        """While the ``with`` block runs: device data may be read only by kernels and libraries, and
        ``output`` written only by kernels."""
        self.output = output
        # numba's driver copies take the simulator's arrays too: guarded in both modes
        patches = (_simulator_patches(self) if _device.is_simulator() else []) + _gpu_patches(self)
        undo = []
        try:
            for owner, name, value in patches:
                undo.append((owner, name, owner.__dict__.get(name, _MISSING)))
                setattr(owner, name, value)
            yield self
        finally:
            for owner, name, value in reversed(undo):
                if value is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)
            self.output = None

    def host_read(self, what: str) -> None:
        self.refuse("host-copy", what)
        raise HostAccessRefused(f"{what}: device data cannot be read on the host while the stage runs "
                                "(compute on the GPU, in a kernel)")

    def host_write(self, what: str) -> None:
        self.refuse("host-write", what)
        raise HostAccessRefused(f"{what}: the output must be written by a kernel, not from the host")


_MISSING = object()


class _AnswerKeyBlocker(importlib.abc.MetaPathFinder):
    def __init__(self, guard: Guard):
        self.guard = guard

    def find_spec(self, fullname, path=None, target=None):
        package, _, module = fullname.partition(".")
        if fullname == ANSWER_KEY_PACKAGE:
            # The worker's path leaves the repository out, so the package itself may not be found, and
            # `from solutions.x import ...` would end as a plain ModuleNotFoundError before reaching the
            # refusal below. Find the package where the answer key lives: its shared `_` helpers stay
            # importable, its ladders are refused by name.
            parents = [os.path.dirname(d) for d in self.guard.answer_key_dirs]
            return importlib.machinery.PathFinder.find_spec(fullname, parents)
        if package == ANSWER_KEY_PACKAGE and module and not module.startswith("_"):
            self.guard.refuse("answer-key", f"import {fullname}")
            raise ImportError(f"`import {fullname}`: the answer key ({ANSWER_KEY_PACKAGE}/) cannot be imported "
                              "while grading: write your own code", name=fullname)
        return None


# -- the simulator: FakeCUDAArray wraps a host numpy array ---------------------------------------------

# Attributes of a device array that carry no data (a GPU array has these too).
METADATA = {"dtype", "size", "ndim", "strides", "itemsize", "nbytes", "flags", "shape", "stream",
            "__cuda_array_interface__", "__cuda_ndarray__", "_numba_type_", "alloc_size"}
ARITHMETIC = ("__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__neg__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__iter__", "__contains__")


def _simulator_patches(guard: Guard) -> list:
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as Array

    def trusted() -> bool:  # inside a kernel, or numba's (or the workbench's) own code
        return sim_kernel._kernel_context is not None or is_library_file(_requester(lambda f: False))

    def is_output(arr) -> bool:
        out = guard.output
        return out is not None and np.shares_memory(arr.__dict__["_ary"], out.__dict__["_ary"])

    original = {name: Array.__dict__[name] for name in ("copy_to_host", "copy_to_device", "__getitem__",
                                                         "__setitem__", "__getattr__")}

    def copy_to_host(self, *args, **kwargs):
        if not trusted():
            guard.host_read("copy_to_host()")
        return original["copy_to_host"](self, *args, **kwargs)

    def copy_to_device(self, ary, *args, **kwargs):
        if is_output(self) and not trusted():
            guard.host_write("copy_to_device() into the output")
        return original["copy_to_device"](self, ary, *args, **kwargs)

    def getitem(self, index):
        value = original["__getitem__"](self, index)
        if not isinstance(value, Array) and not trusted():
            guard.host_read(f"reading element {index!r} of a device array on the host")
        return value

    def setitem(self, index, value):
        if is_output(self) and np.ndim(value) > 0 and not trusted():
            guard.host_write("assigning host data to the output")
        return original["__setitem__"](self, index, value)

    def getattr_(self, name):  # reached for what FakeCUDAArray delegates to its numpy array
        if name not in METADATA and not trusted():
            guard.host_read(f"`.{name}` of a device array on the host (numpy on device data)")
        return original["__getattr__"](self, name)

    def refuse_arithmetic(name):
        def arithmetic(self, *args):
            if not trusted():
                guard.host_read(f"`{name}` on a device array (host arithmetic; a GPU array has none)")
            return getattr(self.__dict__["_ary"], name)(*args)
        return arithmetic

    def data(self):  # `._ary`: the numpy array inside
        if not trusted():
            guard.host_read("`._ary` of a device array")
        return self.__dict__["_ary"]

    def set_data(self, value):
        self.__dict__["_ary"] = value

    def describe(self):  # as a GPU array prints: no data
        return f"<device array {self.dtype} {tuple(self.shape)}>"

    patches = [(Array, "copy_to_host", copy_to_host), (Array, "copy_to_device", copy_to_device),
               (Array, "__getitem__", getitem), (Array, "__setitem__", setitem), (Array, "__getattr__", getattr_),
               (Array, "_ary", property(data, set_data)), (Array, "__repr__", describe), (Array, "__str__", describe)]
    patches += [(Array, name, refuse_arithmetic(name)) for name in ARITHMETIC if name in Array.__dict__]
    return patches


# -- numba's device-to-host and host-to-device copies (a GPU's, and the simulator's through them) -------------------------------------------

def _gpu_patches(guard: Guard) -> list:
    from numba.cuda.cudadrv import driver

    cudadrv_dir = os.path.dirname(driver.__file__)

    def asked_by_submission() -> bool:  # not by numba's launch machinery, say
        return not is_library_file(_requester(lambda f: f.startswith(cudadrv_dir)))

    original_d2h, original_h2d = driver.device_to_host, driver.host_to_device
    original_pointer = getattr(driver, "device_pointer", None)  # the simulator's driver has none

    def device_to_host(dst, src, size, stream=0):
        if asked_by_submission():
            guard.host_read("a copy of device data to the host")
        return original_d2h(dst, src, size, stream)

    def host_to_device(dst, src, size, stream=0):
        out = guard.output
        if out is not None and asked_by_submission() and _same_memory(dst, out, original_pointer):
            guard.host_write("a copy of host data into the output")
        return original_h2d(dst, src, size, stream)

    return [(driver, "device_to_host", device_to_host), (driver, "host_to_device", host_to_device)]


def _same_memory(dst, out, device_pointer) -> bool:
    """Does a copy into ``dst`` land in the output ``out`` (a GPU's pointers, or the simulator's arrays)?"""
    if device_pointer is None:
        mine, theirs = getattr(dst, "__dict__", {}).get("_ary"), out.__dict__.get("_ary")
        return isinstance(mine, np.ndarray) and isinstance(theirs, np.ndarray) and np.shares_memory(mine, theirs)
    start = device_pointer(out)
    return start <= device_pointer(dst) < start + out.alloc_size
