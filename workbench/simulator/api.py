"""The rest of numba's CUDA API: libdevice, cache hints, nanosleep, jit options, declare_device."""

import time

import numba

from . import libdevice as libdevice_bodies
from .core import NeedsGPU

if numba.config.ENABLE_CUDASIM:
    from numba.cuda.simulator import api as _api
    from numba.cuda.simulator import kernel as _kernel
    from numba.cuda.simulator import kernelapi as _kernelapi

_original_jit = None  # numba's simulator jit, which jit() calls; set by install()


def _load(array, index):
    """A load with a cache hint (cuda.ldca, ldcg, ldcs, ldlu, ldcv): the hint only matters to caches."""
    return array[index]


def _store(array, index, value):
    """A store with a cache hint (cuda.stcg, stcs, stwb, stwt): the hint only matters to caches."""
    array[index] = value


def _nanosleep(self, ns):
    """cuda.nanosleep: let the other simulated threads run (a spin-wait loop needs them to)."""
    time.sleep(0)


_LOADS = ("ldca", "ldcg", "ldcs", "ldlu", "ldcv")
_STORES = ("stcg", "stcs", "stwb", "stwt")

# cuda.jit options that change only how the GPU compiler builds a kernel: accepted and ignored.
COMPILER_ONLY_OPTIONS = frozenset({
    "debug", "opt", "lineinfo", "cache", "launch_bounds", "max_registers", "lto", "fastmath",
    "inline", "forceinline", "shared_memory_carveout", "extensions", "argtypes", "restype",
})


def jit(func_or_sig=None, device=False, link=(), boundscheck=None, **options):
    """numba.cuda.jit for the simulator: numba's, accepting every option a GPU's accepts.

    Options for the GPU compiler (``lineinfo``, ``launch_bounds``, ``max_registers``, ``fastmath``,
    ``cache``, ...) change nothing here. ``link=`` (CUDA C++ or PTX linked in) cannot run in the
    simulator: the kernel or device function raises :class:`NeedsGPU` when called.
    """
    unknown = sorted(set(options) - COMPILER_ONLY_OPTIONS)
    if unknown:
        raise TypeError(f"cuda.jit() got unexpected keyword argument(s) {', '.join(unknown)}; it takes "
                        f"device, link, boundscheck, {', '.join(sorted(COMPILER_ONLY_OPTIONS))}")
    kept = {name: options[name] for name in ("debug", "fastmath", "inline", "opt", "cache") if name in options}
    make = _original_jit(func_or_sig, device=device, boundscheck=boundscheck, **kept)

    def mark(kernel):
        if link:
            files = ", ".join(str(item) for item in (link if isinstance(link, (list, tuple)) else [link]))
            kernel.sim_needs_gpu = (
                f"{kernel.__name__} links code with link= ({files}), which the simulator cannot run"
            )
        return kernel

    if isinstance(make, _kernel.FakeCUDAKernel):
        return mark(make)
    return lambda fn: mark(make(fn))


def declare_device(name, sig, link=None, use_cooperative=False, abi="numba"):
    """cuda.declare_device: a device function written in CUDA C++ or PTX. The simulator cannot run
    it: calling it raises NeedsGPU (numba's simulator returns None, which fails obscurely)."""

    def external(*args):
        raise NeedsGPU(
            f"{name} is declared with cuda.declare_device and comes from CUDA C++ or PTX "
            f"({link or 'linked code'}), which the simulator cannot run"
        )

    external.__name__ = name
    return external


def install():
    global _original_jit
    _original_jit = _api.jit
    module = _kernelapi.FakeCUDAModule
    module.nanosleep = _nanosleep
    module.libdevice = libdevice_bodies.install(unavailable=NeedsGPU)
    for name in _LOADS:
        setattr(module, name, staticmethod(_load))
    for name in _STORES:
        setattr(module, name, staticmethod(_store))
    import numba.cuda
    from numba.cuda import simulator as simulator_package

    for namespace in (numba.cuda, _api, simulator_package):
        namespace.jit = jit
        namespace.declare_device = declare_device
        for name in _LOADS:
            setattr(namespace, name, _load)
        for name in _STORES:
            setattr(namespace, name, _store)
