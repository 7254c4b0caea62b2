"""The simulated device: its multiprocessor count and the usual limits."""

import numba

from .core import (
    MAX_BLOCK_DIM,
    MAX_GRID_DIM,
    MAX_THREADS_PER_BLOCK,
    SHARED_MEMORY_PER_BLOCK,
    WARP_SIZE,
)
from .switches import sm_count

if numba.config.ENABLE_CUDASIM:
    from numba.cuda.simulator.cudadrv import devices as _devices


# What cuda.get_current_device().<NAME> reports here: an H100/H200's values, except the SM count.
DEVICE_ATTRIBUTES = {
    "WARP_SIZE": WARP_SIZE,
    "MAX_THREADS_PER_BLOCK": MAX_THREADS_PER_BLOCK,
    "MAX_BLOCK_DIM_X": MAX_BLOCK_DIM[0],
    "MAX_BLOCK_DIM_Y": MAX_BLOCK_DIM[1],
    "MAX_BLOCK_DIM_Z": MAX_BLOCK_DIM[2],
    "MAX_GRID_DIM_X": MAX_GRID_DIM[0],
    "MAX_GRID_DIM_Y": MAX_GRID_DIM[1],
    "MAX_GRID_DIM_Z": MAX_GRID_DIM[2],
    "MAX_SHARED_MEMORY_PER_BLOCK": SHARED_MEMORY_PER_BLOCK,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": SHARED_MEMORY_PER_BLOCK,  # numba cannot opt in
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 228 * 1024,
    "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "MAX_REGISTERS_PER_BLOCK": 65536,
    "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
    "L2_CACHE_SIZE": 50 * 1024 * 1024,
    "TOTAL_CONSTANT_MEMORY": 64 * 1024,
}


def _device_attribute(self, name):
    """FakeCUDADevice.__getattr__: the simulated device's attributes (numba reads a real one's from
    the driver by the same names)."""
    if name == "MULTIPROCESSOR_COUNT":
        return sm_count()
    if name in DEVICE_ATTRIBUTES:
        return DEVICE_ATTRIBUTES[name]
    raise AttributeError(
        f"the simulated device has no attribute {name!r}; it has MULTIPROCESSOR_COUNT, "
        + ", ".join(DEVICE_ATTRIBUTES)
    )


def install():
    device = _devices.FakeCUDADevice
    device.__getattr__ = _device_attribute
    device.name = b"numba CUDA simulator (workbench)"
