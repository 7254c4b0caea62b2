"""A load4 that records where each call reads, for the tests of the 16-byte stages: every index a multiple
of 4, the vectors covering their array once. It reads as the simulator's load4 does (which, unlike the
GPU's, would read from any index)."""


def record_load4(install, key=lambda array, i: int(i)):
    """Install (``install(load4)``, e.g. a monkeypatch.setattr) a load4 that appends ``key(array, i)`` to
    the list returned, one entry a call."""
    calls = []

    def load4(array, i):
        calls.append(key(array, i))
        return array[i], array[i + 1], array[i + 2], array[i + 3]

    install(load4)
    return calls
