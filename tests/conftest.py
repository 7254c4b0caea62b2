"""Import workbench first: it decides GPU vs simulator before numba is imported.

On a GPU the suite runs in parallel (``pytest -m gpu -n 8``: compiling kernels and computing float64
references keep many cores busy) while every test that *times* something (marked ``timing``) gets the GPU to
itself: a timing test holds an exclusive lock for its duration, every other GPU test a shared one, so no
kernel of another worker runs while a speed is measured; the timing tests are ordered last."""

import fcntl
import os
import tempfile

import pytest

import workbench


def pytest_collection_modifyitems(config, items):
    # GPU tests need a real device; everything else is written for the simulator (CPU).
    on_gpu = workbench.MODE == "gpu"
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gpu" not in item.keywords and "sim_only" in item.keywords and on_gpu:
            item.add_marker(pytest.mark.skip(reason="simulator-only test"))
        if "timing" in item.keywords and "gpu" not in item.keywords:
            raise pytest.UsageError(f"{item.nodeid}: a `timing` test must also be marked `gpu`")
    # Timing tests last: xdist hands tests out in this order, so the correctness tests run in parallel
    # first and the timing tests, each of which must wait for the GPU to be free, queue up at the end
    # instead of draining all workers once each.
    items.sort(key=lambda item: "timing" in item.keywords)


@pytest.fixture(autouse=True)
def _gpu_to_itself_while_timing(request):
    """A shared lock for a GPU test, an exclusive one for a timing test, one pair of lock files per test
    session (xdist's workers share ``PYTEST_XDIST_TESTRUNUID``). The turnstile gives a waiting timing test
    priority: while it waits, no new test takes a shared lock, so the running ones drain and it gets in."""
    if workbench.MODE != "gpu" or "gpu" not in request.keywords:
        yield
        return
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    stem = os.path.join(tempfile.gettempdir(), f"workbench-gpu-suite-{run}")
    exclusive = "timing" in request.keywords
    with open(stem + ".turnstile", "a") as turnstile, open(stem + ".lock", "a") as gpu:
        fcntl.flock(turnstile, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gpu, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(gpu, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
