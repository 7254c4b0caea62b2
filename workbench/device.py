"""Is there a GPU? Decide before numba is imported.

numba reads ``NUMBA_ENABLE_CUDASIM`` once, when it is first imported, so the choice between the real
GPU and numba's CUDA simulator has to be made before anything imports numba. Importing
``numba.cuda`` to ask would be too late, so we ask the CUDA driver directly through ctypes:
``cuInit`` + ``cuDeviceGetCount``. No driver library, or a driver with no device, means simulator.

``WORKBENCH_MODE`` overrides the probe: ``gpu`` (fail loudly if there is none), ``sim`` (force the
simulator, e.g. to test CPU mode on a GPU machine), ``compile`` (real numba.cuda without a GPU:
only ``compile_ptx`` works; used by the PTX checks).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass

MODES = ("gpu", "sim", "compile")


@dataclass(frozen=True)
class Probe:
    gpus: int
    driver_version: str | None  # e.g. "13.0", from cuDriverGetVersion
    reason: str  # why there is or is no GPU, in words


def probe_driver() -> Probe:
    """Count CUDA devices through the driver API, without importing numba."""
    names = ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda") or ""]
    if sys.platform == "win32":
        names = ["nvcuda.dll"]
    lib = None
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return Probe(0, None, "no CUDA driver library (libcuda) on this machine")
    version = ctypes.c_int(0)
    driver = None
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
        driver = f"{version.value // 1000}.{(version.value % 1000) // 10}"
    status = lib.cuInit(0)
    if status != 0:
        return Probe(0, driver, f"the CUDA driver is present but cuInit failed (CUresult {status})")
    count = ctypes.c_int(0)
    status = lib.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return Probe(0, driver, f"cuDeviceGetCount failed (CUresult {status})")
    if count.value == 0:
        return Probe(0, driver, "the CUDA driver sees no device")
    return Probe(count.value, driver, f"{count.value} CUDA device(s) found by the driver")


_PROBE: Probe | None = None
_MODE: str | None = None


def probe() -> Probe:
    global _PROBE
    if _PROBE is None:
        _PROBE = probe_driver()
    return _PROBE


def choose_mode() -> str:
    """Pick gpu / sim / compile once per process and configure numba's environment for it."""
    global _MODE
    if _MODE is not None:
        return _MODE
    wanted = os.environ.get("WORKBENCH_MODE", "").strip().lower()
    if wanted and wanted not in MODES:
        raise ValueError(f"WORKBENCH_MODE must be one of {', '.join(MODES)}; got {wanted!r}")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and not wanted:
        wanted = "sim"  # the user asked numba for the simulator directly
    if not wanted:
        wanted = "gpu" if probe().gpus > 0 else "sim"
    if wanted == "gpu" and probe().gpus == 0:
        raise RuntimeError(f"WORKBENCH_MODE=gpu but {probe().reason}.")
    if "numba" in sys.modules:
        import numba

        already_sim = bool(numba.config.ENABLE_CUDASIM)
        if already_sim != (wanted == "sim"):
            raise RuntimeError(
                "numba was imported before workbench chose between GPU and simulator "
                f"(numba's simulator is {'on' if already_sim else 'off'}, workbench wants {wanted!r}). "
                "Import workbench before numba, or set NUMBA_ENABLE_CUDASIM yourself."
            )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if wanted == "sim" else "0"
    # Small grids are deliberate here (a one-thread kernel that zeroes an accumulator): no nagging.
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    _MODE = wanted
    return _MODE


def mode() -> str:
    return choose_mode()


COMPILE_CC = (9, 0)  # what compile mode compiles for: the H100/H200 the recorded figures come from


def install_compile_target() -> None:
    """In compile mode, compile device functions for ``COMPILE_CC``.

    ``compile_ptx(kernel, types, cc=...)`` needs no GPU, but numba-cuda 0.30 compiles each device function
    the kernel calls (``@cuda.jit(device=True, forceinline=True)``: one LLVM function, inlined by NVVM)
    for "the current device", which a machine without a GPU does not have. The kernel's own ``cc``
    is the only architecture compile mode ever asks for, so the device functions get it too."""
    from types import SimpleNamespace

    import numba.cuda.dispatcher as dispatcher

    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=COMPILE_CC)


def is_simulator() -> bool:
    return choose_mode() == "sim"


SIMULATOR_NOTICE = (
    "No CUDA GPU here ({reason}): kernels run in numba's CUDA simulator. "
    "Correctness only, at small sizes; timings are not meaningful; plots show figures recorded on a GPU."
)

_NOTICE_SHOWN = False


def announce(stream=None) -> None:
    """Say once per process, plainly, that we are in simulator mode."""
    global _NOTICE_SHOWN
    if _NOTICE_SHOWN or not is_simulator():
        return
    _NOTICE_SHOWN = True
    print(SIMULATOR_NOTICE.format(reason=probe().reason), file=stream or sys.stderr)
