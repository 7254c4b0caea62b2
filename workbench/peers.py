"""The library a user would otherwise call (torch, else CuPy), on the workbench's own device arrays.

Arrays are shared zero-copy through ``__cuda_array_interface__``, so a peer reads the very buffers the
stages read. Views are cached per buffer so that timing a peer does not time the wrapping.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from . import device as _device


@lru_cache(maxsize=None)
def library(name: str):
    """The imported module if installed and usable on this GPU, else None (never in the simulator)."""
    if _device.is_simulator():
        return None
    try:
        module = importlib.import_module(name)
    except Exception:
        return None
    if name == "torch" and not module.cuda.is_available():
        return None
    return module


def torch():
    return library("torch")


def cupy():
    return library("cupy")


_VIEWS: dict = {}


def _key(a) -> tuple:
    cai = a.__cuda_array_interface__
    return (cai["data"][0], tuple(cai["shape"]), cai["typestr"], cai.get("strides"))


def cached(kind: str, a, make):
    """``make(a)`` computed once per device buffer ``a`` (by address, shape, dtype and strides) and kind,
    and kept until ``clear_views()``: a timed peer call never pays for a view or a host read twice."""
    k = (kind,) + _key(a)
    if k not in _VIEWS:
        _VIEWS[k] = make(a)
    return _VIEWS[k]


def clear_views() -> None:
    """Drop every cached view (they keep their buffers alive): the bench does after each size."""
    _VIEWS.clear()


def as_torch(a):
    """A torch tensor viewing device array ``a`` (no copy). A bfloat16 array (ml_dtypes) exports its
    elements as 2 raw bytes (typestr '<V2'), which torch cannot read: it is viewed as int16 and the
    tensor reinterpreted as torch.bfloat16."""
    def make(a):
        if a.__cuda_array_interface__["typestr"].endswith("V2") and getattr(a, "dtype", None) is not None \
                and a.dtype.name == "bfloat16":
            return torch().as_tensor(a.view("int16"), device="cuda").view(torch().bfloat16)
        return torch().as_tensor(a, device="cuda")
    return cached("torch", a, make)


def to_host(a):
    """A device array or a torch/CuPy tensor copied to a NumPy array. torch exports no
    __cuda_array_interface__ for bfloat16, so such a tensor comes back through its int16 bits, as an
    ml_dtypes.bfloat16 array (what a peer that returns its bf16 result hands the bench)."""
    from numba import cuda

    if getattr(a, "dtype", None) is not None and str(a.dtype) == "torch.bfloat16":
        import ml_dtypes

        return cuda.as_cuda_array(a.view(torch().int16)).copy_to_host().view(ml_dtypes.bfloat16)
    return (a if hasattr(a, "copy_to_host") else cuda.as_cuda_array(a)).copy_to_host()


def as_cupy(a):
    return cached("cupy", a, lambda a: cupy().asarray(a))


def versions() -> dict:
    out = {}
    for name in ("torch", "cupy"):
        module = library(name)
        if module is not None:
            out[name] = module.__version__
    return out
