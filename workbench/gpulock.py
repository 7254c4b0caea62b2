"""One GPU, several processes and threads using it: kernels run side by side, a measurement runs alone.

A pair of lock files (``flock``) holds it together across processes: the GPU test suite's workers
(tests/conftest.py) and the grader's parallel jobs (``workbench grade --jobs N``, or several ``grade``
processes at once) take a *shared* lock to run kernels and an *exclusive* one to time them, so no kernel
of another process or thread runs while a speed is measured. A turnstile gives a waiting timer priority:
while it waits, no new shared holder gets in, so the running ones drain and it gets in.

flock belongs to an open file, not to a process, so each thread opens the files for itself: two threads
of one process exclude each other as two processes do. Within a thread the locks nest: a shared hold
inside this thread's own hold is that hold (re-entrant); an exclusive hold inside its own shared hold
would wait for itself, and is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time

LOCK_VARIABLE = "WORKBENCH_GPU_LOCK"  # the lock files' path stem, where processes must agree on another one


class GpuLock:
    """The shared/exclusive lock of one GPU, named by a path stem (``STEM.turnstile``, ``STEM.lock``)."""

    def __init__(self, stem: str):
        self.stem = stem
        self._local = threading.local()

    def _mine(self):
        """This thread's files and hold (opened on first use)."""
        mine = self._local
        if not hasattr(mine, "gpu"):
            mine.turnstile, mine.gpu = open(self.stem + ".turnstile", "a"), open(self.stem + ".lock", "a")
            mine.depth = 0  # nested exclusive holds (measure() calls host_call_latency())
            mine.holding = None  # "shared", "exclusive" or None
            mine.since = 0.0
            mine.waited = mine.held_alone = 0.0  # seconds: the test suite reports them per test
        return mine

    # What this thread waited for the lock and held it alone, in seconds (the suite resets them per test).
    waited = property(lambda self: self._mine().waited, lambda self, v: setattr(self._mine(), "waited", v))
    held_alone = property(lambda self: self._mine().held_alone, lambda self, v: setattr(self._mine(), "held_alone", v))

    @property
    def holding(self) -> str | None:
        return self._mine().holding

    def _take(self, kind: str):
        mine = self._mine()
        asked = time.perf_counter()
        if kind == "shared":
            fcntl.flock(mine.turnstile, fcntl.LOCK_SH)
            fcntl.flock(mine.gpu, fcntl.LOCK_SH)
            fcntl.flock(mine.turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(mine.turnstile, fcntl.LOCK_EX)
            fcntl.flock(mine.gpu, fcntl.LOCK_EX)
        mine.holding, mine.since = kind, time.perf_counter()
        mine.waited += mine.since - asked

    def _drop(self):
        mine = self._mine()
        fcntl.flock(mine.gpu, fcntl.LOCK_UN)
        if mine.holding == "exclusive":
            fcntl.flock(mine.turnstile, fcntl.LOCK_UN)
            mine.held_alone += time.perf_counter() - mine.since
        mine.holding = None

    @contextlib.contextmanager
    def shared(self):
        """Run kernels beside other shared holders, never while another process or thread measures."""
        if self._mine().holding is not None:  # inside this thread's own hold (a run inside a measurement)
            yield
            return
        self._take("shared")
        try:
            yield
        finally:
            self._drop()

    @contextlib.contextmanager
    def exclusive(self):
        """The GPU alone: every other holder's kernels have finished, and no new one starts until this ends."""
        mine = self._mine()
        if mine.depth == 0:
            if mine.holding is not None:
                raise RuntimeError("a measurement inside a run that holds the GPU shared would deadlock")
            self._take("exclusive")
        mine.depth += 1
        try:
            yield
        finally:
            mine.depth -= 1
            if mine.depth == 0:
                self._drop()

    @contextlib.contextmanager
    def set_aside(self):
        """Let go of whatever this thread holds for the duration (a compile: CPU work), then take the same again."""
        kind = self._mine().holding
        if kind is None:
            yield
            return
        self._drop()
        try:
            yield
        finally:
            self._take(kind)


def default_stem() -> str:
    """The lock of the GPUs this thread uses: ``$WORKBENCH_GPU_LOCK`` if set, else one per user and per
    ``CUDA_VISIBLE_DEVICES`` in the temporary directory, so that every ``grade`` on this machine that uses
    the same GPUs takes the same lock (processes pinned to different GPUs do not wait for each other). A
    thread pinned to one GPU (``pinned``) takes that GPU's."""
    devices = pinned_gpu() or os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    if os.environ.get(LOCK_VARIABLE):
        return os.environ[LOCK_VARIABLE] + (f"-{devices}" if pinned_gpu() else "")
    devices = devices.replace(",", "-") or "none"
    return os.path.join(tempfile.gettempdir(), f"workbench-gpu-{os.getuid()}-{devices}")


_PINNED = threading.local()


@contextlib.contextmanager
def pinned(gpu: str | None):
    """For the duration, this thread's lock (``gpu_lock``) is that of one GPU, named as
    ``CUDA_VISIBLE_DEVICES`` names it (the grader's jobs spread over several GPUs: each job's thread takes
    its own GPU's lock, its workers see that GPU alone). None: no change."""
    before = pinned_gpu()
    _PINNED.gpu = gpu if gpu is not None else before
    try:
        yield
    finally:
        _PINNED.gpu = before


def pinned_gpu() -> str | None:
    return getattr(_PINNED, "gpu", None)


_DEFAULT: dict[str, GpuLock] = {}
_DEFAULT_GUARD = threading.Lock()


def gpu_lock() -> GpuLock:
    """This thread's lock for the GPU it uses (one object per stem; each thread holds it by its own files)."""
    stem = default_stem()
    with _DEFAULT_GUARD:
        if stem not in _DEFAULT:
            _DEFAULT[stem] = GpuLock(stem)
        return _DEFAULT[stem]
