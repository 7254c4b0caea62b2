"""Import workbench first: it decides GPU vs simulator before numba is imported.

On a GPU the suite runs in parallel (``pytest -m gpu -n 12 --dist loadgroup``: compiling kernels and
computing float64 references keep many cores busy) while every measurement of a test marked ``timing`` gets
the GPU to itself: it holds an exclusive lock for its duration, every other GPU test a shared one, so no
kernel of another worker runs while a speed is measured; the timing tests are ordered last (CONTRIBUTING.md)."""

import contextlib
import os
import shutil
import tempfile
import uuid

import pytest

import workbench
from workbench.gpulock import GpuLock  # shared with the grader: one mechanism

STAGES_PER_WORKER = 2  # GPU ladder checks: stages of one operator grouped on one worker (see below)


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config):
    # Under xdist each worker's float64 references (numpy's BLAS, torch on the CPU) would start a thread
    # per core: 12 workers on 16 cores ran 192 spinning threads. A share of the cores each instead; the
    # workers are started after this hook and inherit it. A variable the user set is left alone.
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and not os.environ.get("PYTEST_XDIST_WORKER"):
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for name in BLAS_THREAD_VARIABLES:
            os.environ.setdefault(name, share)
    if workbench.MODE == "sim" and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
        from workbench.simulator import run_on_one_core  # each worker a core: half the suite's time

        run_on_one_core(int(os.environ["PYTEST_XDIST_WORKER"][2:]))
    if workbench.MODE == "gpu" and os.environ.get("PYTEST_XDIST_WORKER"):
        _share_compiled_kernels(_session_stem("kernels"))
    elif workbench.MODE == "gpu" and getattr(config.option, "testrunuid", "set") is None:
        config.option.testrunuid = uuid.uuid4().hex  # xdist's controller: known here, to clean up after


def pytest_unconfigure(config):
    """xdist's controller removes what its workers shared (the kernel cache, the lock files)."""
    run = getattr(config.option, "testrunuid", None)
    if workbench.MODE == "gpu" and run and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_session_stem("kernels", run), ignore_errors=True)
        for suffix in (".turnstile", ".lock"):
            with contextlib.suppress(OSError):
                os.remove(_session_stem("gpu", run) + suffix)


def _session_stem(what: str, run: str | None = None) -> str:
    """A path in the temporary directory that xdist's workers of one test session share (they share
    ``PYTEST_XDIST_TESTRUNUID``), unique to the session."""
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    return os.path.join(tempfile.gettempdir(), f"workbench-gpu-suite-{run}-{what}")


KERNELS = {"loaded": 0, "compiled": 0}  # this worker's kernels read from the shared cache or compiled


def _share_compiled_kernels(directory: str):
    """The GPU suite's workers share compiled kernels through numba's file cache (``cache=True``), in a
    directory of this session only, so nothing outlives the run and no kernel is ever read stale.

    Without it each worker compiled every kernel it ran: a timing test compiled its whole ladder again
    after the ladder checks had compiled each stage on other workers (attention_tc's took 216 s, mostly
    NVVM and ptxas). The timing tests run last (``pytest_collection_modifyitems``), so they find the
    checks' kernels on disk. Kernels numba cannot cache (linked CUDA C++, captured device arrays) are
    compiled as before: a failed save or load is a miss, never an error."""
    from numba.core import sigutils
    from numba.cuda import decorators, dispatcher
    from numba.cuda.core import config

    config.CACHE_DIR = directory

    class SharedCache(dispatcher.CUDACache):
        def load_overload(self, sig, target_context):
            try:
                kernel = super().load_overload(sig, target_context)
            except Exception:  # noqa: BLE001 - an entry that cannot be read is a miss
                kernel = None
            KERNELS["loaded" if kernel is not None else "compiled"] += 1
            return kernel

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except Exception:  # noqa: BLE001 - e.g. "Cannot pickle CUDACodeLibrary with linking files"
                self.disable()

    class CachedDispatcher(dispatcher.CUDADispatcher):
        def __init__(self, py_func, targetoptions, **kwargs):
            super().__init__(py_func, targetoptions, **kwargs)
            if targetoptions.get("device") or targetoptions.get("link"):
                return  # device functions are compiled into their kernels; linked kernels cannot be pickled
            try:
                self._cache = SharedCache(py_func)
            except RuntimeError:  # no source file to key the cache on (code made at run time)
                pass

        def compile(self, sig):
            # Reached at a signature's first launch (later launches find the overload in numba's C
            # dispatcher). Compiling takes seconds of CPU and no GPU: a worker that holds the GPU lock
            # (a check's run, a measurement's warm-up) lets go of it meanwhile, so that the other
            # workers' runs and measurements do not wait for NVVM and ptxas.
            argtypes, _ = sigutils.normalize_signature(sig)
            if self.specialized or self.overloads.get(argtypes) is not None or _LOCK is None:
                return super().compile(sig)
            with _LOCK.set_aside():
                return super().compile(sig)

    decorators.CUDADispatcher = CachedDispatcher


def pytest_addoption(parser):
    parser.addoption(
        "--part", default="all", metavar="K/N",
        help="run part K of N (1 <= K <= N) of the tests marked `exhaustive` (every stage at every simulator size, "
             "every kernel compiled for sm_90), the others deselected; the other tests all run. Default: all. "
             "`.ci/run` picks K from the commit count, so that successive submissions check successive parts.")


def _part(config) -> tuple[int, int] | None:
    """(K, N) from ``--part K/N``, or None for all."""
    value = config.getoption("part")
    if value == "all":
        return None
    try:
        k, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--part wants K/N (two whole numbers, 1 <= K <= N) or all; got {value!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--part wants K/N with 1 <= K <= N; got {value!r}")
    return k, n


def part_of(test_ids, k: int, n: int) -> set:
    """Part K of N of ``test_ids``: every Nth in sorted order, from the Kth. The N parts are disjoint and
    cover them all."""
    return set(sorted(test_ids)[k - 1::n])


def pytest_report_header(config):
    part = _part(config)
    if part is not None:
        return f"exhaustive tests: part {part[0]} of {part[1]} (--part); `--part all` runs every one"


def pytest_collection_modifyitems(config, items):
    # --part K/N: every Nth exhaustive test, counted in a fixed order (by test id, so that the parts of N
    # runs cover them all whatever else is selected), starting at the Kth.
    part = _part(config)
    if part is not None:
        keep = part_of([item.nodeid for item in items if "exhaustive" in item.keywords], *part)
        dropped = [item for item in items if "exhaustive" in item.keywords and item.nodeid not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if not ("exhaustive" in item.keywords and item.nodeid not in keep)]
    # GPU tests need a real device; everything else is written for the simulator (CPU).
    on_gpu = workbench.MODE == "gpu"
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gpu" not in item.keywords and "sim_only" in item.keywords and on_gpu:
            item.add_marker(pytest.mark.skip(reason="simulator-only test"))
        if "timing" in item.keywords and "gpu" not in item.keywords:
            raise pytest.UsageError(f"{item.nodeid}: a `timing` test must also be marked `gpu`")
    # An operator's GPU ladder checks two stages to a worker (with ``--dist loadgroup``): the two share
    # their inputs and float64 references (tests/test_ladders.py::_cases). A whole ladder on one worker
    # shared them once, but made it the suite's critical path: hgemm's six stages (each compiling its
    # linked CUDA C++) took 536 s there, more than the suite's 8 minutes.
    for item in items:
        stage = getattr(item, "callspec", None) and item.callspec.params.get("stage")
        if "gpu" in item.keywords and stage is not None and hasattr(stage, "op"):
            chunk = stage.op.stages.index(stage) // STAGES_PER_WORKER
            item.add_marker(pytest.mark.xdist_group(f"ladder-{stage.op.name}-{chunk}"))
    # Timing tests last: xdist hands tests out in this order, so the correctness tests run in parallel
    # first and the timing tests, each of which must wait for the GPU to be free, queue up at the end
    # instead of draining all workers once each. Except ``timing(whole=True, early=True)``: a test that
    # holds the GPU alone for a minute (the grader's speed bar, its kernels compiled in a subprocess)
    # goes first, while the other workers compile (outside the lock) rather than queue behind it.
    def order(item):
        marker = item.get_closest_marker("timing")
        return 1 if marker is None else (0 if marker.kwargs.get("early") else 2)

    items.sort(key=order)


_LOCK = None


@pytest.fixture(autouse=True)
def _gpu_to_itself_while_timing(request):
    """A GPU test shares the GPU with the other workers' tests; a measurement has it alone.

    A test marked ``timing`` holds no lock while it prepares on the CPU (inputs, float64 references);
    its first call of each stage (``workbench.bench.first_call``) holds the shared lock, as a check's
    run does, and each of its measurements (``workbench.timing.measure``, ``host_call_latency``) takes
    the exclusive lock for its own duration, so the timing tests' preparation runs in parallel and only
    the measuring is serial. ``@pytest.mark.timing(whole=True)``: the whole test holds it (a test that
    times by other means: host enqueue costs, streams, a grader subprocess's speed bar). Any other GPU
    test holds the shared lock and may not measure (``_timing_refused``). Whatever a worker holds, it
    sets aside while numba compiles (``CachedDispatcher.compile``)."""
    global _LOCK
    if workbench.MODE != "gpu" or "gpu" not in request.keywords:
        yield
        return
    _LOCK = _LOCK or GpuLock(_session_stem("gpu"))
    _LOCK.waited = _LOCK.held_alone = 0.0
    _KERNELS_BEFORE.update(KERNELS)
    marker = request.node.get_closest_marker("timing")
    if marker is None and request.node.get_closest_marker("gpu_lock_per_run"):
        with _runs_shared(_LOCK), _timing_refused(request.node.nodeid):
            yield
    elif marker is None:
        with _LOCK.shared(), _timing_refused(request.node.nodeid):
            yield
    elif marker.kwargs.get("whole"):
        with _LOCK.exclusive():
            yield
    else:
        with _measurements_alone(_LOCK):
            yield


_KERNELS_BEFORE = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Where a GPU test's time went, added to its report as the call ends (the suite's log has it:
    scripts/test_durations.py): seconds waiting for the GPU lock, seconds holding it alone, kernels
    read from the workers' shared cache or compiled."""
    yield
    if _LOCK is not None and "gpu" in item.keywords and workbench.MODE == "gpu":
        item.user_properties += [("gpu_wait_s", round(_LOCK.waited, 2)), ("gpu_alone_s", round(_LOCK.held_alone, 2)),
                                 *((f"kernels_{k}", KERNELS[k] - _KERNELS_BEFORE.get(k, 0)) for k in KERNELS)]


def _inside(hold, fn):
    """``fn``, each call of it run inside the context ``hold()`` (a lock)."""
    def held(*args, **kwargs):
        with hold():
            return fn(*args, **kwargs)
    return held


@contextlib.contextmanager
def _measurements_alone(lock: GpuLock):
    from workbench import bench, timing

    # A timing test's first call of each stage (bench.first_call) runs kernels as a check does: under the
    # shared lock, never while another worker measures. Unlocked, a naive reduction's 0.5 s first call at
    # the headline size ran beside other workers' measurements and halved them (gemm's tensor_core_deep
    # at 52 TFLOP/s against 103; suite logs of 2026-11-23 and -24).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing, "measure", _inside(lock.exclusive, timing.measure))
        patch.setattr(timing, "host_call_latency", _inside(lock.exclusive, timing.host_call_latency))
        patch.setattr(bench, "first_call", _inside(lock.shared, bench.first_call))
        yield


@contextlib.contextmanager
def _runs_shared(lock: GpuLock):
    """``@pytest.mark.gpu_lock_per_run``: the shared lock only around each ``workbench.check.run_once``
    (inputs to the device, the kernels, results back). A ladder check at a headline size spends most of
    its time on the CPU (float64 references, comparisons); holding the lock through that made every
    measurement queued behind it wait, and the workers waiting with it."""
    from workbench import check

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check, "run_once", _inside(lock.shared, check.run_once))
        yield


@contextlib.contextmanager
def _timing_refused(test: str):
    """A GPU test not marked ``timing`` shares the GPU with others: a speed measured there would be
    measured against them. Every timing path (``workbench.timing``: CUDA-event samples, host call
    latency) refuses to run in one, so a speed test left unmarked fails with the fix, not with a
    number that depends on what else ran."""
    from workbench import timing

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{test} measures a speed: mark it @pytest.mark.timing (so that it gets the GPU to itself)")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing, "_elapsed_us", refuse)
        patch.setattr(timing, "host_call_latency", refuse)
        yield


def pytest_runtest_logreport(report):
    """With ``WORKBENCH_TEST_LOG=FILE`` set, one JSON line per test phase is appended to FILE as it ends:
    a run cut off by a time limit (a device call) still leaves what ran, how long each test took and
    which failed (``scripts/test_durations.py`` summarises it)."""
    path = os.environ.get("WORKBENCH_TEST_LOG")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under xdist the controller writes, once, as each worker's report reaches it
    if not path or (report.when != "call" and report.passed):
        return
    import json

    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
            "seconds": round(report.duration, 2), "start": round(getattr(report, "start", 0.0), 2),
            "worker": getattr(report, "worker_id", None), **dict(report.user_properties)}
    if report.failed:
        line["error"] = str(report.longrepr)[-1500:]
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")
