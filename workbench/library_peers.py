"""The library a user would otherwise call (torch, else CuPy), on the workbench's own device arrays.

Arrays are shared zero-copy through ``__cuda_array_interface__``, so a peer reads the very buffers the
stages read. Views are cached per buffer so that timing a peer does not time the wrapping.

Two kinds of peer: the operator's own ``peer`` (eager torch, else CuPy: what a user calls today), and
``compiled_peer``, the operator's ``torch_expression`` under ``torch.compile`` (what a user gets by
letting Inductor fuse that same expression into generated Triton kernels).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from functools import lru_cache
from typing import Callable

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


# -- torch.compile of an operator's torch expression --------------------------------------------------

COMPILED_NAME = "torch.compile"  # the stage name of the compiled peer's records

_COMPILED: dict = {}


def compiled(key: tuple, make_expression: Callable[[], Callable]):
    """``torch.compile(make_expression(), dynamic=False, fullgraph=True)``, made once per ``key``
    ((operator, size)). Nothing compiles here: the first call traces and compiles (the bench's check
    call does, before any timing). ``dynamic=False`` specialises the kernels on this size's shapes, as a
    fixed-shape model is compiled; ``fullgraph=True`` turns a graph break into an error, so a figure
    named torch.compile is never half eager. One expression is kept at a time, and Dynamo's caches are
    reset before the next: every size of the same expression is a recompilation of one function, and
    past Dynamo's recompile limit (8) it would quietly run eager torch under this name."""
    if key not in _COMPILED:
        torch_ = torch()
        _COMPILED.clear()
        torch_.compiler.reset()
        _COMPILED[key] = torch_.compile(make_expression(), dynamic=False, fullgraph=True)
    return _COMPILED[key]


@contextmanager
def without_tf32(torch_):
    """cuDNN's TF32 off for the call (torch's default lets a float32 convolution use it; cuBLAS's is off
    by default): the bench checks a float32 peer to float32's tolerance, as the eager depthwise peer does."""
    saved = torch_.backends.cudnn.allow_tf32
    torch_.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch_.backends.cudnn.allow_tf32 = saved


def compiled_peer(op, size) -> tuple[str, Callable] | None:
    """("torch.compile", launch) for an operator that gives a ``torch_expression``, or None (no
    expression, or no torch on a GPU). ``launch(*device_inputs, out)`` views the inputs as tensors
    (cached, as every peer's) and returns what the compiled expression returns: the bench checks and
    times that (``returns_output``), so the timed work is the expression's kernels alone, reading the
    inputs and writing a result torch allocates from its caching allocator, never a copy into ``out``.
    An eager peer with ``out=`` writes the same bytes into ``out``; one that copies its result into
    ``out`` (pool2d[max]'s indices) does more work than the compiled expression, which returns the
    output's layout whole."""
    torch_ = torch()
    if torch_ is None or op.torch_expression is None:
        return None
    size = tuple(size)
    fn = compiled((op.name, size), lambda: op.torch_expression(torch_, size))

    def launch(*arrays):
        with without_tf32(torch_):
            return fn(*(as_torch(a) for a in arrays[:-1]))  # the last array is out

    launch.returns_output = True
    return COMPILED_NAME, launch


# -- cuda.compute (cuda-cccl): CUB's device-wide algorithms from Python ----------------------------------

def cuda_compute():
    """cuda.compute if installed with its compiled bindings (none on a machine without a driver), else None."""
    module = library("cuda.compute")
    return module if module is not None and getattr(module, "_BINDINGS_AVAILABLE", False) else None


def _cub_call(make, call_args: Callable):
    """A launch(*device_inputs, out) running a cuda.compute algorithm object: ``make(first_call_arrays)``
    builds it (CUB's kernels compiled for this GPU, once), its scratch memory is sized and allocated at the
    first call, and every call passes ``call_args(arrays)`` (d_in, d_out, num_items, ...). As a CUB user
    does: build once, keep the scratch, launch."""
    from numba import cuda

    built = {}

    def launch(*arrays):
        if not built:
            built["algorithm"] = algorithm = make(arrays)
            need = algorithm(temp_storage=None, **call_args(arrays))
            built["scratch"] = cuda.device_array(max(int(need), 1), "uint8")
        built["algorithm"](temp_storage=built["scratch"], **call_args(arrays))

    return launch


def cub_sum_peer(size) -> tuple[str, Callable] | None:
    """("cuda.compute.reduce_into", launch(x, out)): CUB's device reduction (sum, float32) into out[0]."""
    cc = cuda_compute()
    if cc is None:
        return None
    import numpy as np

    zero = np.zeros(1, np.float32)
    args = lambda arrays: dict(d_in=arrays[0], d_out=arrays[1], num_items=arrays[0].size, op=cc.OpKind.PLUS,
                               h_init=zero)
    make = lambda arrays: cc.make_reduce_into(d_in=arrays[0], d_out=arrays[1], op=cc.OpKind.PLUS, h_init=zero)
    return "cuda.compute.reduce_into", _cub_call(make, args)


def cub_inclusive_sum_peer(size) -> tuple[str, Callable] | None:
    """("cuda.compute.inclusive_scan", launch(x, y)): CUB's device scan (inclusive sum, float32)."""
    cc = cuda_compute()
    if cc is None:
        return None
    args = lambda arrays: dict(d_in=arrays[0], d_out=arrays[1], num_items=arrays[0].size, op=cc.OpKind.PLUS,
                               init_value=None)
    make = lambda arrays: cc.make_inclusive_scan(d_in=arrays[0], d_out=arrays[1], op=cc.OpKind.PLUS)
    return "cuda.compute.inclusive_scan", _cub_call(make, args)


def versions() -> dict:
    out = {}
    for name in ("torch", "cupy"):
        module = library(name)
        if module is not None:
            out[name] = module.__version__
    try:
        from importlib.metadata import version

        if cuda_compute() is not None:
            out["cuda_cccl"] = version("cuda-cccl")
    except Exception:  # not installed as a distribution: no version to report
        pass
    return out
