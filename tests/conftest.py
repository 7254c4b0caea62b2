"""Import workbench first: it decides GPU vs simulator before numba is imported."""

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
