"""``python -m workbench.grade.worker FD``: the grading worker, the only process a submission's code
runs in (the child side; ``supervisor`` is the parent's).

It never sees the reference, the seed or a verdict. It imports the submission behind the guards
(``guards``), then answers the grader's requests on the channel (file descriptor FD, a socket the
grader made, moved out of the way of the submission's code): *prepare* a stage (find its launcher,
describe the code it reaches), *call* it on inputs the grader sends and send back what it wrote,
*time* it (on a GPU). The submission's prints go to this process's stdout and stderr, which the
grader keeps apart from the channel and shows as the submission's output.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import threading
import traceback

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)

from .. import device as _device
from ..ladder import clear_scratch
from .channel import Channel
from .guards import Guard
from .submission import describe_launcher, find_launch, load_file
from .watch import (classify, fresh_outputs, import_error_text, refusal_facts, run_watched, simulated_device,
                    take_primitives, tampered, threads_left, timing_arg_sets)


def _private_channel(fd: int) -> Channel:
    """The channel on a descriptor of its own, not inherited by any process the code might start."""
    high = random.randrange(300, 900)
    os.dup2(fd, high, inheritable=False)
    os.close(fd)
    return Channel(socket.socket(fileno=high))


def _load_gpu_libraries() -> None:
    """On a GPU, compile and run one tiny kernel before the guards go up: finding and loading the
    driver, NVVM and libdevice then happens as the workbench's own work, not during the submission's
    import or its first call."""
    if workbench.MODE != "gpu":
        return
    import numpy as np
    from numba import cuda

    @cuda.jit
    def touch(a):
        a[0] = 1.0

    buffer = cuda.device_array(1, np.float32)
    touch[1, 1](buffer)
    cuda.synchronize()


def answer_key_importable(answer_key_dirs) -> None:
    """Grading the answer key itself (no guard): its modules import their package's helpers
    (``from solutions._templates import instantiate``), and the worker's path leaves the repository out.
    Where the repository is pip-installed the package is found anyway; in a clone that is not (the GPU
    machine runs one from PYTHONPATH), it was not: "No module named 'solutions'". So the folder that
    holds the package goes on the path, for the answer key only."""
    for package_dir in answer_key_dirs:
        parent = os.path.dirname(os.path.realpath(package_dir))
        if parent not in sys.path:
            sys.path.append(parent)


class Worker:
    def __init__(self, job: dict, channel: Channel):
        self.job = job
        self.channel = channel
        self.guard = Guard(job.get("answer_key_dirs", ()) if job.get("guard_answer_key") else ())
        self.module = None
        self.launches: dict = {}
        self.timing = None  # (stage, draws, device argument sets, threads before) made ready to time

    def serve(self) -> int:
        if self.job.get("core") is not None and _device.is_simulator():
            from ..simulator import run_on_one_core

            run_on_one_core(self.job["core"])  # before any simulated thread starts: they inherit it
        _load_gpu_libraries()
        self.primitives = take_primitives()  # before the submission can replace any of them
        self.guard.install()
        if not self.job.get("guard_answer_key"):
            answer_key_importable(self.job.get("answer_key_dirs", ()))
        with simulated_device(self.job.get("sm_count")):
            return self._serve()

    def _serve(self) -> int:
        self.channel.send(self.load())
        while True:
            header, arrays = self.channel.receive()
            kind = header.get("type")
            if kind == "bye":
                return 0
            try:
                reply, out = {"prepare": self.prepare, "call": self.call, "ready-to-time": self.ready_to_time,
                              "time": self.time, "after-timing": self.after_timing}[kind](header, arrays)
            except Exception as exc:  # the grader's own code failed: say where, never blame the submission
                tail = traceback.format_exception(type(exc), exc, exc.__traceback__)[-2:]
                reply, out = {"type": "internal-error", "message": "".join(tail).strip()}, []
            self.channel.send(reply, out)

    def load(self) -> dict:
        """Import the submission; the reply says why not if it could not be."""
        path = self.job["submission"]
        try:
            self.module = load_file(path)
        except BaseException as exc:  # a syntax error, an import error, exit(): the learner's file, reported
            if isinstance(exc, KeyboardInterrupt):
                raise
            refusals = self.guard.take()
            facts = classify(exc, path)
            if refusals:
                facts = {"reason": refusals[0].reason, "message": f"importing it was refused: {facts['message']}"}
            elif facts["reason"] not in ("needs-gpu", "exited"):
                facts = {"reason": "import-error", "message": import_error_text(exc, path)}
            return {"type": "loaded", "ok": False, **facts, "refusals": refusal_facts(refusals)}
        return {"type": "loaded", "ok": True,
                "refusals": refusal_facts(self.guard.take() + tampered(self.primitives))}

    def prepare(self, header: dict, arrays) -> tuple[dict, list]:
        launch, why = find_launch(self.module, header["op"], header["stage"])
        clear_scratch()  # a stage starts from fresh (garbage-filled) workspace buffers
        if launch is None:
            return {"type": "prepared", "ok": False, "message": why}, []
        self.launches[header["stage"]] = launch
        return {"type": "prepared", "ok": True, "functions": describe_launcher(launch)}, []

    def call(self, header: dict, arrays: list) -> tuple[dict, list]:
        launch = self.launches[header["stage"]]
        with simulated_device(header.get("sm_count")):  # (None: the job's, set for the whole worker)
            outcome = run_watched(launch, tuple(arrays[:-1]), arrays[-1], self.guard, self.job["submission"],
                                  self.job.get("max_threads"), on_compiling=self.compiling)
        reply = {"type": "called", "id": header["id"], "error": outcome.error, "launches": outcome.launches,
                 "refusals": refusal_facts(outcome.refusals), "seconds": outcome.seconds}
        return reply, ([outcome.out, *outcome.inputs_after] if outcome.error is None else [])

    def compiling(self, seconds: float | None) -> None:
        """Tell the supervisor, while the call goes on, that a launch starts compiling (None) or has compiled
        (the seconds it took): compiling is not the kernel running, and does not count towards its limit."""
        self.channel.send({"type": "compiling"} if seconds is None else {"type": "compiled", "seconds": seconds})

    def ready_to_time(self, header: dict, arrays: list) -> tuple[dict, list]:
        """Before timing (GPU only), while other jobs may run kernels: device copies of ``header["draws"]``
        different draws of the inputs (``watch.timing_arg_sets``) and one call (it compiles), so that the
        grader's exclusive hold of the GPU (``time``) covers the timing only, not the copies and compiles."""
        from ..bench import first_call
        from ..results import environment

        launch = self.launches[header["stage"]]
        count = int(header["draws"])
        per_draw = (len(arrays) - 1) // count
        draws = [tuple(arrays[k * per_draw:(k + 1) * per_draw]) for k in range(count)]
        self.timing = None
        threads_before = set(threading.enumerate())
        try:
            arg_sets = timing_arg_sets(draws, arrays[-1], environment().get("l2_bytes"))
            first_call(launch, arg_sets[0])
        except Exception as exc:  # the learner's launcher raised
            return {"type": "ready", "error": classify(exc, self.job["submission"])}, []
        self.timing = (header["stage"], draws, arg_sets, threads_before)
        return {"type": "ready"}, []

    def time(self, header: dict, arrays: list) -> tuple[dict, list]:
        """Time the launcher on the argument sets ``ready_to_time`` made (the grader holds the GPU alone)."""
        from ..timing import measure

        stage, _, arg_sets, _ = self._made_ready(header["stage"])
        try:
            timing = measure(self.launches[stage], arg_sets)
        except Exception as exc:  # the learner's launcher raised while being timed
            self.timing = None
            return {"type": "timed", "error": classify(exc, self.job["submission"])}, []
        if not header.get("keep", True):  # no calls after timing will be asked for: free the device copies now
            self.timing = None
        return {"type": "timed", "median_us": timing.median_us}, []

    def after_timing(self, header: dict, arrays: list) -> tuple[dict, list]:
        """Call the launcher once more on new inputs in the buffers it was timed on and send those outputs
        back (``watch.fresh_outputs``): the grader judges them. And what it was refused meanwhile."""
        stage, draws, arg_sets, threads_before = self._made_ready(header["stage"])
        self.timing = None
        try:
            outputs = fresh_outputs(self.launches[stage], arg_sets, draws)
        except Exception as exc:
            return {"type": "checked", "error": classify(exc, self.job["submission"])}, []
        refused = tampered(self.primitives) + threads_left(threads_before)
        if refused:  # a clock, an event or the timer replaced, work left to a thread: its time is its own story
            return {"type": "checked", "error": {"reason": refused[0].reason, "message": refused[0].what}}, []
        return {"type": "checked"}, outputs

    def _made_ready(self, stage: str) -> tuple:
        if self.timing is None or self.timing[0] != stage:
            raise RuntimeError(f"{stage} was not made ready to time")
        return self.timing


def _die_with_the_grader() -> None:
    """Linux: be killed when the grader's process ends, even if it is killed itself (a kernel that
    hangs must not outlive it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _die_with_the_grader()
    channel = _private_channel(int(argv[0]))
    sys.argv = sys.argv[:1]  # nothing about the channel left where the submission could read it
    job, _ = channel.receive()
    code = Worker(job, channel).serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not the submission's atexit handlers


if __name__ == "__main__":
    main()
