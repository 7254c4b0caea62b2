"""Operators and their ladders of stages.

An :class:`Operator` says what is computed and how to judge it: a float64 reference, a generator of
random inputs, the output's shape, and models of the bytes a kernel must move and the flops it must
do. Each :class:`Stage` is one rung of the ladder: a name, a paragraph on what changed from the
previous rung and why, and a launcher that runs the stage's kernel(s) on device arrays.

A ``solutions/<op>.py`` module builds one Operator and decorates its launchers with ``op.stage``.
The decorated name stays callable (``reduction.fused(x, out)``), and checks its arguments first.
Everything else about an operator (where it is listed, how the grader judges it) is a declared field
here, never a module-level name found by ``getattr``: ``workbench.registry`` finds the operators.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import device as _device

Size = tuple  # an operator's problem size, e.g. (n,) or (rows, cols) or (M, N, K)


class InputError(ValueError):
    """Bad input to a stage: the message names what was expected."""


def as_size(size: Any) -> Size:
    if isinstance(size, (int, np.integer)):
        return (int(size),)
    return tuple(int(s) for s in size)


def size_label(size: Size) -> str:
    return "x".join(str(s) for s in size)


@dataclass
class Stage:
    op: "Operator"
    name: str
    order: int
    summary: str
    launch: Callable[..., None]
    bytes_moved: Callable[[Size], int] | None = None  # this stage's own traffic, if not the op's minimum
    flops: Callable[[Size], int] | None = None
    gpu_only: str | None = None  # reason this stage cannot run in the simulator
    tolerance: float | None = None  # overrides the operator's tolerance for this stage
    dtype: Any = None  # the precision the stage computes in; the PTX check forbids f64 when float32
    # For the grader: along each named dimension, the extents at which this stage's blocks, tiles, chunks
    # or unrolled steps end ({"cols": (ILP_SPAN,)}: a row of exactly one unrolled step). It grades sizes
    # landing exactly on each and one short and one past it, where a loop bound off by one shows.
    boundaries: Mapping[str, Sequence[int]] | None = None
    # Arithmetic in a precision numpy has no dtype for ("tf32": tensor cores fed float32 read as TF32):
    # its "% of peak" divides by that precision's library rate, and the tables name it beside the stage.
    precision: str | None = None

    @property
    def key(self) -> str:
        return f"{self.op.name}.{self.name}"

    @property
    def title(self) -> str:
        return f"{self.order}. {self.name}"

    def __call__(self, *args, **kwargs):
        """Run the stage on device arrays after checking them (dtype, shape, contiguity, device)."""
        if self.gpu_only and _device.is_simulator():
            raise RuntimeError(f"{self.key} needs a real GPU: {self.gpu_only}")
        signature = inspect.signature(self.launch)
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"{self.key} takes {self.key.split('.')[1]}{signature}: {exc}") from None
        self.op.validate(*args, **kwargs)
        # A torch or CuPy tensor passes validation, but launchers use numba's array attributes
        # (x.size is a method on a tensor): hand them a numba view of the same memory, no copy.
        args = tuple(as_numba_view(a) for a in args)
        kwargs = {k: as_numba_view(v) for k, v in kwargs.items()}
        return self.launch(*args, **kwargs)

    def traffic(self, size: Size) -> int:
        return int((self.bytes_moved or self.op.bytes_moved)(size))

    def work(self, size: Size) -> int:
        return int((self.flops or self.op.flops)(size))

    def source(self) -> str:
        """The launcher's source and the source of every kernel it names (for notebooks and docs)."""
        from .introspect import stage_source

        return stage_source(self)

    def __repr__(self) -> str:
        return f"<Stage {self.key} #{self.order}>"


@dataclass
class Operator:
    """What a ladder computes, and how to judge and measure any stage of it.

    make_inputs(size, rng) -> tuple of host arrays (random, never zeros or arange)
    make_output(size) -> an empty host array of the output's shape and dtype
    reference(*inputs) -> float64 array of the output's shape
    bytes_moved(size) / flops(size) -> the minimum a kernel must move / compute
    validate(*device_arrays) -> raise InputError naming what was expected
    peer(size) -> (library name, callable(*device_inputs, out)) or None where no library is installed
    other_peers(size) -> [(library name, callable(*device_inputs, out)), ...] of the installed ones
    torch_expression(torch, size) -> f(*input_tensors) -> output tensor: the operator as plain torch
        code, for ``torch.compile`` (the bench times it beside ``peer``; see ``library_peers.compiled_peer``)
    """

    # -- what it computes (required: the family's name and title, the reference, inputs, output, models)
    name: str  # the family's name; the operator's own name adds its variant (``softmax[bf16]``)
    title: str
    reference: Callable[..., np.ndarray]
    make_inputs: Callable[[Size, np.random.Generator], tuple]
    make_output: Callable[[Size], np.ndarray]
    bytes_moved: Callable[[Size], int]
    flops: Callable[[Size], int]
    validate: Callable[..., None]
    # -- its sizes
    check_sizes: Sequence[Size]  # on a GPU
    sim_sizes: Sequence[Size]  # in the simulator: small, slow is the simulator
    bench_sizes: Sequence[Size]  # latency against size, small (launch-bound) to large (bandwidth-bound)
    headline_size: Size  # the size of the staircase and the README table

    # -- what it computes, continued: its point on the family's axes, its precision, its accuracy
    # The variant: a value on each of the family's axes (AXES) where it differs from the axis's default,
    # e.g. {"dtype": "bf16"}, {"function": "gelu", "dtype": "fp16"}, {"combine": "max", "axis": "rows"}.
    variant: Mapping[str, str] = field(default_factory=dict)
    dtype: Any = np.float32
    # the dtype the arithmetic runs in, where it differs from dtype (an int8 GEMM between float32 in and
    # out): a compute-bound operator's "% of peak" divides by the library rate of this precision
    compute_dtype: Any = None
    tolerance: Callable[[Size, Any], float] | None = None
    # adversarial_inputs(size, rng) -> [(label, inputs)]: inputs random draws never hit (all-negative,
    # constant rows, huge logits, ties, ...), checked by the grader and the tests beside the random ones
    adversarial_inputs: Callable[[Size, np.random.Generator], list[tuple[str, tuple]]] | None = None
    size_names: Sequence[str] | None = None  # what each number of a size is; None: by their count
    # The simulator size the quick test tier checks every stage at; None: the middle of sim_sizes. Set it
    # where the middle one is costly to simulate (many threads a block, emulated tensor-core instructions);
    # keep it not a multiple of any block or tile, so that every edge path still runs.
    quick_size: Size | None = None

    # -- how it is measured: its peers, its bound, its targets
    peer: Callable[[Size], tuple[str, Callable] | None] | None = None
    # More libraries a user could call instead (cuda.compute's device-wide algorithms): (name, launch)
    # pairs, each timed after ``peer`` and torch.compile; those not installed are simply absent.
    other_peers: Callable[[Size], list[tuple[str, Callable]]] | None = None
    # The torch module is passed in, not imported, because solutions import without torch (a CPU
    # machine has none); the size is passed so that a size field (attention's causal flag) can choose
    # the expression at trace time. The returned function takes the inputs as tensors in make_inputs'
    # order, no numba array and no out: what torch.compile traces.
    torch_expression: Callable[[Any, Size], Callable[..., Any]] | None = None
    bound: str = "memory"  # "memory" or "compute": which measured peak "% of peak" refers to
    # a memory-bound operator's streams (MEMORY_PATTERNS): which measured bandwidth "% of peak" divides by
    pattern: str = "copy"
    # Where the floor is not this GPU's memory or arithmetic (AllReduce: the links between GPUs), what
    # bounds the ladder instead, in a paragraph: the notebook's models section says it in place of the
    # memory- or compute-bound sentence.
    bound_note: str = ""
    # For an operator `workbench bench` cannot measure as it runs (AllReduce needs several GPUs): the file
    # under results/ that its run on several GPUs writes (`workbench record` there), which
    # workbench.tables renders as its README table.
    figures_elsewhere: str | None = None
    record_all_sizes: bool = False  # `workbench record` measures every bench size (else the headline only)
    # What the ladder must reach on a GPU (workbench.targets.Target: "the last stage at least the best peer",
    # "85% of the read ceiling", ...): `workbench targets` judges each against the recorded figures.
    targets: Sequence[Any] = ()

    # -- how it is listed: the README, notebooks and `workbench list` sort by (rank, name); operators that
    # share a `group` share one README heading (a fusion beside the ladder it fuses).
    rank: float = 1000.0
    group: str | None = None  # the README heading; None: the operator's own title

    # -- how the grader judges a learner's stage of this operator
    grade_sizes: Mapping[str, Sequence[Size]] | None = None  # extra sizes by mode ("sim", "gpu"); None: derived
    grade_speed_bar: float = 0.6  # fraction of the solution's bandwidth a stage must reach on a GPU
    grade_speed_size: Size | None = None  # None: the headline size
    # explain(inputs, out, ref) -> a sentence on why out is wrong (a tie broken the wrong way, ...) or None
    explain: Callable[[tuple, np.ndarray, np.ndarray], str | None] | None = None

    # -- set when built: its ladder, its family, the module that defines it (by the registry)
    stages: list[Stage] = field(default_factory=list)
    module: str | None = None
    family: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.family = self.name.partition("[")[0]  # (dataclasses.replace passes the full name back in)
        self.variant = dict(self.variant)
        for axis, value in self.variant.items():
            if axis not in AXES or not value:
                raise ValueError(f"{self.family}: variant {self.variant}; an axis is one of {', '.join(AXES)}, "
                                 f"each given a value")
        self.name = variant_name(self.family, self.variant)
        if self.pattern not in MEMORY_PATTERNS:
            raise ValueError(f"{self.name}: pattern={self.pattern!r}; an operator's memory pattern is one of "
                             f"{', '.join(map(repr, MEMORY_PATTERNS))} (what its bytes model reads and writes)")

    def quick_sim_size(self) -> tuple:
        """The size the quick tier checks each stage at: ``quick_size``, else the middle simulator size."""
        if self.quick_size is not None:
            return as_size(self.quick_size)
        sizes = [as_size(s) for s in self.sim_sizes]
        return sizes[len(sizes) // 2]

    def stage(
        self,
        name: str,
        summary: str,
        *,
        bytes_moved: Callable[[Size], int] | None = None,
        flops: Callable[[Size], int] | None = None,
        gpu_only: str | None = None,
        tolerance: float | None = None,
        dtype: Any = None,
        boundaries: Mapping[str, Sequence[int]] | None = None,
        precision: str | None = None,
    ):
        """Register the decorated launcher as the next stage of this ladder."""
        if any(s.name == name for s in self.stages):
            raise ValueError(f"{self.name} already has a stage named {name!r}")
        for dim, ends in (boundaries or {}).items():
            if dim not in self.dims or not all(isinstance(e, int) and e >= 1 for e in ends):
                raise ValueError(f"{self.name}.{name}: boundaries={{{dim!r}: {ends!r}}}; a boundary is a "
                                 f"dimension of {', '.join(self.dims)} and the whole numbers (at least 1) "
                                 f"where the stage's blocks, tiles or chunks end along it")

        def register(launch: Callable[..., None]) -> Stage:
            st = Stage(
                self, name, len(self.stages) + 1, " ".join(summary.split()), launch,
                bytes_moved, flops, gpu_only, tolerance, dtype or self.dtype,
                {dim: tuple(ends) for dim, ends in boundaries.items()} if boundaries else None,
                precision,
            )
            self.stages.append(st)
            return st

        return register

    def __getitem__(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"{self.name} has no stage {name!r}; stages: {', '.join(s.name for s in self.stages)}")

    @property
    def slug(self) -> str:
        """The name as a file name: 'softmax[bf16]' -> 'softmax-bf16' (plots, figures)."""
        return "-".join([self.family, *self.variant_values])

    @property
    def variant_values(self) -> list[str]:
        """The variant's values in the axes' order, defaults left out: ['gelu', 'fp16']."""
        return [self.variant[axis] for axis in AXES if self.variant.get(axis, AXES[axis]) != AXES[axis]]

    @property
    def dims(self) -> tuple[str, ...]:
        """The names of a size's numbers: ('n',), ('rows', 'cols'), ('M', 'N', 'K'), ..."""
        if self.size_names:
            return tuple(self.size_names)
        return DEFAULT_SIZE_NAMES[len(as_size(self.headline_size))]

    @property
    def size_form(self) -> str:
        """How a size of this operator is written on a command line: N, ROWSxCOLS, MxNxK, ..."""
        return "x".join(d.upper() for d in self.dims)

    def tolerance_for(self, size: Size, dtype: Any) -> float:
        if self.tolerance is not None:
            return float(self.tolerance(size, dtype))
        return DEFAULT_TOLERANCE[np.dtype(dtype).name]


# The axes a family's variants lie on, in the order a name lists them, each with its default: a value
# equal to the default is left out of the name (``softmax`` is softmax[fp32]); "" where every variant
# names its value (an activation's function). Values are distinct across axes, so a name need not say
# which axis a value is on: ``reduction[max,rows]``.
AXES = {
    "function": "",  # an activation's function: relu, gelu, silu, ...
    "combine": "sum",  # a reduction's combine: sum, max, min, mean, sumsq
    "axis": "vector",  # what a reduction reduces: the whole vector, each row, each column
    "window": "kxk",  # a pooling window: K x K, or the whole plane (global)
    "fusion": "none",  # what is fused into the operator: bias_gelu, residual, rope, ...
    "geometry": "3x3",  # a convolution's filter, stride and padding: 3x3 same, or general
    "batch": "single",  # one problem a launch, or a batch of them
    "pairs": "halves",  # which elements RoPE rotates together: the two halves, or interleaved pairs
    "layout": "nchw",  # an image's layout: channels first or channels last (nhwc)
    "mode": "",  # training or inference
    "dtype": "fp32",  # the inputs' and output's format: fp32, fp16, bf16, int8
}


def variant_name(family: str, variant: Mapping[str, str]) -> str:
    """'softmax', {'dtype': 'bf16'} -> 'softmax[bf16]'; defaults are left out ({'dtype': 'fp32'} -> 'softmax')."""
    values = [variant[axis] for axis in AXES if variant.get(axis, AXES[axis]) != AXES[axis]]
    return f"{family}[{','.join(values)}]" if values else family


def stage_of(ops: Sequence[Operator], name: str, summary: str, **options):
    """Register the decorated launcher as stage ``name`` of every operator in ``ops``: the one way a
    launcher serves several variants of a family (an fp16 and a bf16 ladder, ...), picking each
    variant's kernel from its inputs' dtype. ``options`` are :meth:`Operator.stage`'s (``dtype=np.float32``
    for stages that compute in float32 between 16-bit inputs and outputs, ``bytes_moved``, ...).

    The decorated name stays the plain launcher, since it serves every variant: each variant's checked
    stage (its validation first) is ``op[name]``."""
    def register(launch: Callable[..., None]) -> Callable[..., None]:
        for op in ops:
            op.stage(name, summary, **options)(launch)
        return launch

    return register


# How a memory-bound operator's minimum bytes split between reads and writes, each with a ceiling of its
# own that `workbench peaks` measures (workbench.ceilings): reading alone runs faster than copying, and two
# reads per write faster again, since the memory bus turns round between reads and writes less often.
MEMORY_PATTERNS = {
    "read": "read only: the input read once, a tiny output (reductions, argmax, histogram, matvec)",
    "copy": "as many bytes written as read (softmax, layernorm, transpose, scan): the default",
    "read2_write1": "two inputs read per output written (z = x + y, an elementwise op with a residual)",
}

DEFAULT_SIZE_NAMES = {1: ("n",), 2: ("rows", "cols"), 3: ("M", "N", "K"), 4: ("batch", "M", "N", "K")}

# ‖out − ref‖ / ‖ref‖ that a correct kernel stays under, by the precision it computes in.
DEFAULT_TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


# -- helpers that launchers and validators share ------------------------------------------------

def blocks_for(n: int, threads: int) -> int:
    """Blocks needed to give each of n items a thread (at least one block)."""
    return max(1, (n + threads - 1) // threads)


def is_device_array(a) -> bool:
    """A numba device array, or anything exporting __cuda_array_interface__ (torch, CuPy)."""
    if isinstance(a, np.ndarray):
        return False
    if _device.is_simulator():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return isinstance(a, FakeCUDAArray)
    return hasattr(a, "__cuda_array_interface__")


def as_numba_view(a):
    """A numba device array viewing ``a``'s memory when ``a`` is a foreign CUDA tensor; else ``a`` itself."""
    if hasattr(a, "is_c_contiguous") or not hasattr(a, "__cuda_array_interface__"):
        return a  # numba's own arrays, scalars, and the simulator's arrays
    from numba import cuda

    return cuda.as_cuda_array(a)


def expect_device_array(name: str, a, *, dtype=None, ndim: int | None = None, shape=None,
                        contiguous: bool = True, min_size: int = 1) -> None:
    """Raise InputError naming what was expected of argument ``name``."""
    if isinstance(a, np.ndarray):
        raise InputError(
            f"{name} is a host (numpy) array; stages take device arrays: pass cuda.to_device({name}) "
            f"(or a torch/CuPy CUDA tensor)")
    if not is_device_array(a):
        raise InputError(f"{name} must be a CUDA device array, got {type(a).__name__}")
    if not hasattr(a, "is_c_contiguous"):  # a torch/CuPy array: look at it through numba
        from numba import cuda

        a = cuda.as_cuda_array(a)
    if dtype is not None and np.dtype(a.dtype) != np.dtype(dtype):
        raise InputError(f"{name} must have dtype {np.dtype(dtype).name}, got {np.dtype(a.dtype).name}")
    if ndim is not None and a.ndim != ndim:
        raise InputError(f"{name} must be {ndim}-D, got shape {tuple(a.shape)}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise InputError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if contiguous and not a.is_c_contiguous():
        raise InputError(f"{name} must be C-contiguous (row-major, no strides); make a contiguous copy first")
    if a.size < min_size:
        raise InputError(f"{name} is empty: a stage needs at least {min_size} element(s)")


def moved_as_bits(dtype) -> bool:
    """numba-cuda 0.30 copies host arrays through the buffer protocol, which refuses ml_dtypes' bfloat16
    ("cannot include dtype 'E' in a buffer"): such arrays travel as their 16-bit patterns instead."""
    return np.dtype(dtype).name == "bfloat16" and not _device.is_simulator()


def to_device(host: np.ndarray):
    """A device copy of a host array, of any dtype a stage takes (bfloat16 included)."""
    from numba import cuda

    host = np.ascontiguousarray(host)
    if moved_as_bits(host.dtype):
        return cuda.to_device(host.view(np.uint16)).view(host.dtype)
    return cuda.to_device(host)


def to_host(dev) -> np.ndarray:
    """A host copy of a device array (bfloat16 included)."""
    if moved_as_bits(dev.dtype):
        return dev.view(np.uint16).copy_to_host().view(dev.dtype)
    return dev.copy_to_host()


def fill_from_host(dev, host: np.ndarray) -> None:
    """Overwrite device array ``dev`` with ``host`` (same shape and dtype)."""
    if moved_as_bits(dev.dtype):
        dev.view(np.uint16).copy_to_device(np.ascontiguousarray(host).view(np.uint16))
    else:
        dev.copy_to_device(host)


def scratch(key: str, shape, dtype=np.float32, zeroed: bool = False):
    """A device buffer cached by (key, shape, dtype): workspace a launcher reuses across calls
    (allocating inside a timed launcher would time the allocator). ``zeroed`` fills it with zeros
    once, when it is first allocated (for counters a kernel resets itself)."""
    from numba import cuda

    k = (key, tuple(np.atleast_1d(shape)), np.dtype(dtype).str)
    buf = _SCRATCH.get(k)
    if buf is None:
        buf = cuda.to_device(np.zeros(shape, dtype)) if zeroed else cuda.device_array(shape, dtype=dtype)
        _SCRATCH[k] = buf
    return buf


_SCRATCH: dict = {}


def clear_scratch() -> None:
    """Forget every cached workspace buffer (the grader does, so a submission starts from garbage)."""
    _SCRATCH.clear()


def sm_count() -> int:
    """Multiprocessors on this device (132 on an H100/H200). In the simulator, the simulated device's:
    132 too, unless ``WORKBENCH_SIM_SM_COUNT`` or ``workbench.simulator.simulated_sm_count(n)`` says
    fewer (the grader does, so that a grid sized from the SM count stays small)."""
    if _device.is_simulator():
        from .simulator import sm_count as simulated_sm_count

        return simulated_sm_count()
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT
