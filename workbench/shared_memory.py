"""Launch settings numba-cuda has no call for: more than 48 KiB of dynamic shared memory.

A block may declare at most 48 KiB of shared memory statically, and by default may be given at most
48 KiB dynamically (the fourth launch parameter, ``kernel[grid, block, stream, nbytes]``). Hopper
allows up to 227 KiB per block, but only to a kernel that has opted in: the driver attribute
``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` must be raised on the compiled function first, or
the launch fails with ``CUDA_ERROR_INVALID_VALUE``. numba-cuda 0.30 exposes only the cache-config
and carveout attributes, so :func:`set_max_dynamic_shared_memory` sets it through the driver
bindings (``cuda.bindings.driver``) on the overload numba compiled for the given argument types.

In numba's simulator there is no driver: the call checks ``nbytes`` against the sm_90 limit (so a
launcher asking for more than a Hopper GPU allows fails on a CPU exactly as it would on the GPU) and
records the opt-in on the kernel object as ``sim_max_dynamic_shared_bytes``, which the workbench's
simulator reads where it enforces the 48 KiB default (``workbench.simulator``'s launch check).
"""

from __future__ import annotations

from . import device as _device

STATIC_LIMIT = 48 * 1024  # bytes of shared memory a block gets without opting in
SM90_OPTIN_LIMIT = 227 * 1024  # bytes per block an sm_90 kernel may opt in to (H100, H200)


class SharedMemoryError(ValueError):
    """A shared-memory request the device cannot grant; the message names the limit."""


def _device_optin_limit() -> int:
    if _device.is_simulator():
        return SM90_OPTIN_LIMIT
    from numba import cuda

    return int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


def _argument_types(kernel, signature_or_args):
    """A signature ("void(float32[:, ::1], ...)" or a tuple of numba types) or the launch's actual
    arguments -> the tuple of numba types numba compiles the kernel for."""
    from numba.cuda import types
    from numba.cuda.core import sigutils

    if isinstance(signature_or_args, str):
        return sigutils.normalize_signature(signature_or_args)[0]
    items = tuple(signature_or_args)
    if items and all(isinstance(t, types.Type) for t in items):
        return items
    return tuple(kernel.typeof_pyval(a) for a in items)


_RAISED: dict = {}  # (id of the compiled overload, nbytes) already set: launchers call this every launch


def _check_errors(err, what):
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err.name}")


def set_max_dynamic_shared_memory(kernel, signature_or_args, nbytes: int) -> None:
    """Let ``kernel``, compiled for ``signature_or_args``, be launched with ``nbytes`` of dynamic shared
    memory (``kernel[grid, block, 0, nbytes](...)``), past the default 48 KiB.

    ``signature_or_args``: a signature string, a tuple of numba types, or the arguments the launch will
    pass (their types are what numba compiles for). Raises :class:`SharedMemoryError` naming the limit
    when the kernel's static shared memory plus ``nbytes`` exceeds what a block may have on this device
    (227 KiB on an H100/H200; the simulator checks against that sm_90 limit and does nothing else).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise SharedMemoryError(f"nbytes must be a non-negative int (bytes of dynamic shared memory), got {nbytes!r}")
    limit = _device_optin_limit()
    if _device.is_simulator():
        if nbytes > limit:
            raise SharedMemoryError(f"{nbytes} bytes of dynamic shared memory is more than the {limit} bytes "
                                    f"(227 KiB) a block may have on sm_90")
        kernel.sim_max_dynamic_shared_bytes = max(nbytes, getattr(kernel, "sim_max_dynamic_shared_bytes", 0))
        return
    overload = kernel.compile(_argument_types(kernel, signature_or_args))
    static = int(overload.shared_mem_per_block)
    if static + nbytes > limit:
        raise SharedMemoryError(f"{nbytes} bytes of dynamic shared memory plus the kernel's {static} static bytes "
                                f"is more than the {limit} bytes a block may have on this device")
    key = (id(overload), nbytes)
    if key in _RAISED:
        return
    from cuda.bindings import driver

    handle = overload.library.get_cufunc().handle
    if isinstance(handle, driver.CUfunction):
        func = handle
    else:  # numba-cuda loads kernels as library kernels: the context's function comes from the CUkernel
        kern = handle if isinstance(handle, driver.CUkernel) else driver.CUkernel(int(handle))
        err, func = driver.cuKernelGetFunction(kern)
        _check_errors(err, "cuKernelGetFunction")
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    (err,) = driver.cuFuncSetAttribute(func, attribute, nbytes)
    _check_errors(err, f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes})")
    _RAISED[key] = True
