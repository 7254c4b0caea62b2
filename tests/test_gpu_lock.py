"""The GPU suite's lock (tests/conftest.py): a timing test holds it shared while it prepares and trades
that for the exclusive lock while it measures, so that no other worker's GPU work runs beside a
measurement. Checked with a second process probing the lock file, no GPU needed."""
import fcntl
import subprocess
import sys

from tests.conftest import _GpuLock


def _can_share(path: str) -> bool:
    """Could another process take the lock shared now (without waiting)?"""
    probe = ("import fcntl, sys\n"
             f"f = open({path!r}, 'a')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)\nexcept OSError:\n    sys.exit(1)\n")
    return subprocess.run([sys.executable, "-c", probe]).returncode == 0


def test_a_measurement_trades_the_shared_hold_for_the_exclusive_one_and_back():
    lock = _GpuLock()
    path = lock.gpu.name
    with lock.shared():
        assert lock.holding == "shared" and _can_share(path)
        with lock.upgraded():
            assert lock.holding == "exclusive" and not _can_share(path)
            with lock.upgraded():  # measure() inside measure(): re-entrant
                assert lock.holding == "exclusive"
            assert lock.holding == "exclusive"
        assert lock.holding == "shared" and _can_share(path)
    assert lock.holding is None and _can_share(path)
    fcntl.flock(lock.gpu, fcntl.LOCK_UN)
