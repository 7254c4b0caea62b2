"""The grader's side of a grading worker: start it, talk to it, time it out, and leave nothing behind.

A worker runs in a session of its own (so its process group is its own), from an empty temporary
directory, with a ``sys.path`` that has the workbench but neither the repository nor ``solutions/``;
its stdout and stderr go to a file the grader reads as the submission's output; the channel is a
socket pair. After every call, any other process of the worker's session (or carrying its token in
its environment) is a process the submission left behind: it is killed, and the case fails. When
the worker is done, times out or dies, its whole process group is killed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import device as _device
from ..paths import REPO_ROOT
from .channel import SLOW_HOST_BYTES_PER_S, Channel, ChannelClosed, ChannelGarbage, ChannelTimeout
from .report import OUTPUT_SHOWN

STARTUP_TIMEOUT_S = 120.0  # importing numba and the submission
MIN_STARTUP_TIMEOUT_S = 30.0
COMPILE_TIMEOUT_S = 600.0  # a call's compiles, the case's timeout aside: a compile that never ends is stopped
# A call still running after this long is compared with the solution's own time at that size (measured
# then, not before: most calls end sooner and cost nothing); never stopped sooner than this either (a
# first call includes compiling the kernel).
RUNAWAY_FLOOR_S = 10.0  # a short --timeout shortens the wait for an import that hangs, to this at least
TOKEN_VARIABLE = "WORKBENCH_GRADE_TOKEN"


class CaseAborted(Exception):
    """The call did not come back: timed out, the worker died, or the channel got garbage. The
    worker is gone; the next request starts a fresh one."""

    def __init__(self, reason: str, message: str, printed: str = ""):
        super().__init__(message)
        self.reason, self.message, self.printed = reason, message, printed


class GraderError(Exception):
    """The grader's own failure (never the submission's)."""


@dataclass
class CallReply:
    error: dict | None  # {"reason", "message"} when the launcher raised
    launches: list  # submission.describe() of each kernel launched
    refusals: list  # {"reason", "what"} for what the guards refused
    seconds: float
    out: np.ndarray | None = None
    inputs_after: list = field(default_factory=list)
    printed: str = ""  # what the submission printed during the call
    strays: list = field(default_factory=list)  # processes it left running (killed since)


class _LimitInBackground:
    """``limit()`` called in a daemon thread: (allowed seconds, why) in ``result`` once ``done`` is set; a
    limit that fails (the solution cannot run at this size) allows the whole ``timeout``."""

    def __init__(self, limit: Callable[[], tuple[float, str]], timeout: float):
        self.result = (timeout, "")
        self.done = threading.Event()

        def work():
            try:
                self.result = limit()
            except Exception:
                pass
            finally:
                self.done.set()

        threading.Thread(target=work, daemon=True, name="the solution's time").start()


class WorkerProcess:
    """One worker process, from start to stop."""

    def __init__(self, job: dict):
        self.job = job
        self.token = secrets.token_hex(8)
        self.stopped = False
        self.tmp = Path(tempfile.mkdtemp(prefix="workbench-grade-"))
        self.output_file = open(self.tmp / "output.txt", "wb")
        self.read_offset = 0
        parent_end, child_end = socket.socketpair()
        try:
            self.proc = self._start(child_end)
        except BaseException:
            parent_end.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            child_end.close()
        self.channel = Channel(parent_end)

    def _start(self, child_end: socket.socket) -> subprocess.Popen:
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "workbench.grade.worker", str(child_end.fileno())],
                pass_fds=[child_end.fileno()], stdin=subprocess.DEVNULL, stdout=self.output_file,
                stderr=subprocess.STDOUT, cwd=self._workdir(), env=self._environment(), start_new_session=True)
        except BaseException:
            self.output_file.close()
            raise

    def _workdir(self) -> str:
        work = self.tmp / "cwd"
        work.mkdir()
        return str(work)

    def _environment(self) -> dict:
        """The grader's environment, but the worker finds the workbench through a folder that holds
        only a link to it (not the repository, where solutions/ is), and writes no caches."""
        import workbench

        path_dir = self.tmp / "path"
        path_dir.mkdir()
        package = Path(workbench.__file__).resolve().parent
        try:
            (path_dir / "workbench").symlink_to(package, target_is_directory=True)
            python_path = [str(path_dir)]
        except OSError:  # no symlinks here: the folder above the package (the import hook still refuses solutions)
            python_path = [str(package.parent)]
        repo = os.path.realpath(REPO_ROOT)
        kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if p and os.path.realpath(p) != repo]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(python_path + kept), PYTHONSAFEPATH="1",
                   PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", WORKBENCH_MODE=_device.mode(),
                   NUMBA_CACHE_DIR=str(self.tmp / "numba-cache"), **{TOKEN_VARIABLE: self.token})
        env.pop("WORKBENCH_SOLUTIONS_PATH", None)
        if self.job.get("gpu") is not None:  # one of the grader's GPUs, the job's
            env["CUDA_VISIBLE_DEVICES"] = self.job["gpu"]
        return env

    # -- talking -------------------------------------------------------------------------------------

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> dict:
        """Send the job; the reply says whether the submission imported."""
        self.channel.send(self.job)
        header, _ = self._receive(time.monotonic() + timeout, "importing the submission", f"{timeout:.0f} s")
        return header

    def request(self, header: dict, arrays, timeout: float, doing: str,
                limit: Callable[[], tuple[float, str]] | None = None) -> tuple[dict, list]:
        """Send a request and wait for its reply, ``timeout`` seconds at most. With ``limit``: once the
        reply is RUNAWAY_FLOOR_S late, ``limit()`` says how long this call may take in all and why (a
        multiple of the solution's own time), so a loop that never ends is stopped in seconds."""
        try:
            self.channel.send(header, arrays)
        except OSError:
            pass  # it died: receive says how
        # The worker copies what it was sent to the GPU and back before it can answer: on a busy host that
        # takes time of its own, never a kernel's (the reply's arrays get theirs in Channel.receive).
        moving = sum(np.asarray(a).nbytes for a in arrays) / SLOW_HOST_BYTES_PER_S
        start = time.monotonic() + moving
        compiling = 0.0  # seconds the worker said its launches spent compiling: not the kernel's time
        allowed = because = None
        asked = None  # the limit, worked out in a thread of its own once the reply is late
        in_compiler = None  # when the worker said "compiling", until it says "compiled"
        while True:
            # The timeout is for running the call: compiling is not counted (a busy host took over a minute
            # to compile one attention kernel on the H200), and has a limit of its own.
            deadline, why = start + compiling + timeout, f"{timeout:.0f} s"
            if compiling >= 1:
                why += f", besides {compiling:.0f} s compiling"
            if in_compiler is not None:
                deadline = in_compiler + COMPILE_TIMEOUT_S - compiling  # (all of a call's compiles together)
                why = f"{COMPILE_TIMEOUT_S:.0f} s compiling"
            elif limit is not None and timeout > RUNAWAY_FLOOR_S:
                if asked is None and not self.channel.ready(start + compiling + RUNAWAY_FLOOR_S):
                    asked = _LimitInBackground(limit, timeout)
                if allowed is None and asked is not None:
                    # The solution is timed while the call goes on, and the case's timeout still holds
                    # meanwhile: an answer key that takes minutes at some size (coo_to_csr's one-thread
                    # sort did) must not hold the case, and every job waiting for the GPU, beyond it.
                    while not asked.done.is_set() and not self.channel.ready(min(deadline, time.monotonic() + 0.5)):
                        if time.monotonic() >= deadline:
                            break
                    if asked.done.is_set():
                        allowed, because = asked.result
                if allowed is not None and allowed < timeout:
                    deadline = start + compiling + allowed
                    why = f"{allowed:.0f} s ({because})"
                    if compiling >= 1:
                        why += f", besides {compiling:.0f} s compiling"
            if moving >= 1:
                why += f", and {moving:.0f} s to move its inputs"
            header, arrays = self._receive(deadline, doing, why)
            if header.get("type") == "compiling":
                in_compiler = time.monotonic()
            elif header.get("type") == "compiled":
                in_compiler = None
                compiling += max(0.0, float(header.get("seconds", 0.0)))
            else:
                return header, arrays

    def _receive(self, deadline: float, doing: str, waited: str) -> tuple[dict, list]:
        try:
            header, arrays = self.channel.receive(deadline)
        except ChannelTimeout:
            printed = self.printed()
            self.stop()
            raise CaseAborted("timeout", f"no result after {waited} {doing}: stopped", printed)
        except ChannelClosed:
            code = self._exit_code()
            printed = self.printed()
            self.stop()
            how = f"exited (code {code})" if code == 0 else f"exited with code {code}"
            raise CaseAborted("exited" if code == 0 else "crash",
                              f"the process running your code {how} while {doing}", printed)
        except ChannelGarbage as exc:
            printed = self.printed()
            self.stop()
            raise CaseAborted("channel", f"the grader's channel got {exc} while {doing}", printed)
        if header.get("type") == "internal-error":
            raise GraderError(str(header.get("message", "")))
        return header, arrays

    def _exit_code(self):
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "(still running: stopped)"

    def printed(self) -> str:
        """What the worker printed since the last time this was asked (the submission's output)."""
        try:
            with open(self.tmp / "output.txt", "rb") as f:
                f.seek(self.read_offset)
                data = f.read()
        except OSError:
            return ""
        self.read_offset += len(data)
        text = data.decode(errors="replace")
        if len(text) > OUTPUT_SHOWN:
            text = text[:OUTPUT_SHOWN] + f"\n... ({len(text) - OUTPUT_SHOWN} more characters)"
        return text

    # -- what it leaves behind -----------------------------------------------------------------------

    def strays(self) -> list[str]:
        """Other live processes of the worker's session or carrying its token: killed, and listed."""
        found = []
        for pid, description in _processes_of(self.proc.pid, self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            found.append(description)
        return found

    def kill(self) -> None:
        """End the worker and everything it started now: no goodbye, no waiting for it to go (a worker
        inside a long kernel answers neither, and a GPU process takes seconds to tear down). For an
        interrupted run, which ends at once after this."""
        self.stopped = True
        self._kill_group()
        self.strays()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _kill_group(self) -> None:
        """SIGKILL to the worker's process group, and to the worker itself."""
        for kill in (lambda: os.killpg(self.proc.pid, signal.SIGKILL), self.proc.kill):
            try:
                kill()
            except OSError:
                pass

    def stop(self) -> None:
        """End the worker and everything it started; remove its folder. (Safe to call again, and from
        another thread.)"""
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            try:
                self.channel.send({"type": "bye"})
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill_group()
        self.proc.wait()
        self.strays()
        self.channel.close()
        self.output_file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _processes_of(session: int, token: str) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes in ``session`` (as a session or process group), or
    whose environment holds the token, other than the session leader itself. Linux only (/proc)."""
    found = []
    marker = f"{TOKEN_VARIABLE}={token}".encode()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == session:
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rfind(")") + 2:].split()
            state, pgrp, sid = fields[0], int(fields[2]), int(fields[3])
            if state in "ZX":
                continue  # already dead, waiting to be reaped
            ours = session in (pgrp, sid) or marker in Path(f"/proc/{pid}/environ").read_bytes()
            if ours:
                name = stat[stat.find("(") + 1:stat.rfind(")")]
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((pid, f"pid {pid} ({name}): {cmd.strip()[:120]}"))
        except (OSError, ValueError, IndexError):
            continue
    return found


class WorkerSession:
    """The grader's view of one submission file: a worker, started when first needed and again after
    a case it did not come back from (its stage prepared again)."""

    def __init__(self, job: dict, timeout: float):
        self.job = job
        self.timeout = timeout
        self.worker: WorkerProcess | None = None
        self.load_reply: dict | None = None
        self.prepared: dict = {}  # stage name -> op name, for preparing again in a fresh worker
        self.timing_draws = 0  # draws the worker was made ready to time on
        self.closed = False

    def loaded(self) -> dict:
        """{"ok": True} or why the submission could not be imported (asked once: a file that does not
        import is not started again)."""
        if self.load_reply is None:
            self._ensure()
        return self.load_reply

    def _ensure(self) -> WorkerProcess:
        if self.closed:
            raise GraderError("grading was stopped")
        if self.worker is None or self.worker.proc.poll() is not None:
            if self.worker is not None:
                self.worker.stop()  # it died between requests: its folder and strays go too
            self.worker = WorkerProcess(self.job)
            try:
                reply = self.worker.start(min(STARTUP_TIMEOUT_S, max(MIN_STARTUP_TIMEOUT_S, self.timeout)))
            except CaseAborted as exc:
                reply = {"type": "loaded", "ok": False, "reason": exc.reason, "message": exc.message,
                         "refusals": [], "printed": exc.printed}
            reply.setdefault("printed", self.worker.printed())
            if self.load_reply is None:
                self.load_reply = reply
            elif not reply.get("ok"):
                raise GraderError(f"the submission imported once but not when its worker was started again: "
                                  f"{reply.get('message')}")
            for stage, op in self.prepared.items():
                self.worker.request({"type": "prepare", "op": op, "stage": stage}, [], self.timeout,
                                    "preparing the stage")
        return self.worker

    def prepare(self, op: str, stage: str) -> dict:
        worker = self._ensure()
        reply, _ = worker.request({"type": "prepare", "op": op, "stage": stage}, [], self.timeout,
                                  "looking for the stage")
        if reply.get("ok"):
            self.prepared[stage] = op
        reply["printed"] = worker.printed()
        return reply

    def call(self, stage: str, case_id: int, inputs: tuple, out: np.ndarray,
             limit: Callable[[], tuple[float, str]] | None = None, sm_count: int | None = None) -> CallReply:
        """One call of the stage; ``limit`` as in WorkerProcess.request (a runaway kernel's stop);
        ``sm_count``: the simulated device's multiprocessors for this call (None: the job's)."""
        worker = self._ensure()
        header, arrays = worker.request({"type": "call", "stage": stage, "id": case_id, "sm_count": sm_count},
                                        [*inputs, out],
                                        self.timeout, "running this case", limit)
        if header.get("type") != "called" or header.get("id") != case_id:
            worker.stop()
            raise CaseAborted("channel", "the grader's channel got a reply to a call it did not make")
        reply = CallReply(header.get("error"), list(header.get("launches", [])), list(header.get("refusals", [])),
                          float(header.get("seconds", 0.0)))
        if reply.error is not None and reply.error.get("reason") == "gpu-fault":
            worker.stop()  # its CUDA context is lost: the next request starts a fresh worker
        if reply.error is None:
            if len(arrays) != len(inputs) + 1:
                worker.stop()
                raise CaseAborted("channel", "the grader's channel got a reply without the outputs")
            reply.out, reply.inputs_after = arrays[0], arrays[1:]
        reply.printed = worker.printed()
        reply.strays = worker.strays()
        return reply

    def ready_to_time(self, stage: str, draws: list[tuple], out: np.ndarray) -> dict | None:
        """Have the worker copy ``draws`` to the device and call the stage once (it compiles), ready for
        ``time``; None, or the error the call raised."""
        worker = self._ensure()
        arrays = [a for draw in draws for a in draw] + [out]
        header, _ = worker.request({"type": "ready-to-time", "stage": stage, "draws": len(draws)}, arrays,
                                   self.timeout, "preparing to time the stage")
        if header.get("type") != "ready":
            raise CaseAborted("channel", "the grader's channel got a reply to a request it did not make")
        self.timing_draws = len(draws)
        return header.get("error")

    def time(self, stage: str, keep: bool = True) -> tuple[float | None, dict | None]:
        """(median µs, None), or (None, the error it raised), timed on what ``ready_to_time`` made (kept
        for ``after_timing``, or let go at once if not ``keep``)."""
        header, _ = self._ready_worker().request({"type": "time", "stage": stage, "keep": keep}, [], self.timeout,
                                                 "timing the stage")
        if header.get("type") != "timed":
            raise CaseAborted("channel", "the grader's channel got a reply to a request it did not make")
        if header.get("error"):
            return None, header["error"]
        return float(header["median_us"]), None

    def after_timing(self, stage: str) -> tuple[list | None, dict | None]:
        """(the outputs of the calls on fresh inputs after timing, None), or (None, why not): see
        ``watch.fresh_outputs`` for which draw each output is of."""
        header, arrays = self._ready_worker().request({"type": "after-timing", "stage": stage}, [], self.timeout,
                                                      "calling the stage after timing it")
        if header.get("type") != "checked":
            raise CaseAborted("channel", "the grader's channel got a reply to a request it did not make")
        if header.get("error"):
            return None, header["error"]
        if len(arrays) != self.timing_draws:
            raise CaseAborted("channel", "the grader's channel got a timing without its outputs")
        return arrays, None

    def _ready_worker(self) -> WorkerProcess:
        worker = self.worker
        if worker is None or worker.proc.poll() is not None:  # (a fresh worker would have nothing to time)
            raise CaseAborted("crash", "the process running your code died before it was timed")
        return worker

    def close(self) -> None:
        self.closed = True
        worker = self.worker
        if worker is not None:
            worker.stop()

    def kill(self) -> None:
        """As close, for an interrupted run: the worker killed, not waited for."""
        self.closed = True
        worker = self.worker
        if worker is not None:
            worker.kill()
