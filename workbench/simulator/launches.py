"""Launches: the limits a GPU checks, recording, the thread budget, and the run of every block."""

import threading
from contextlib import contextmanager

import numba
import numpy as np

from . import counters as counting
from . import races as race_detector
from . import shared
from .blocks import give_back_workers, run_block, run_cluster, take_workers
from .core import MAX_BLOCK_DIM, MAX_GRID_DIM, MAX_THREADS_PER_BLOCK, LaunchLimitError, NeedsGPU
from .switches import charge_budgets, racecheck_enabled, simulated_threads

if numba.config.ENABLE_CUDASIM:
    from numba.cuda.errors import normalize_kernel_dimensions
    from numba.cuda.simulator import kernel as _kernel
    from numba.cuda.simulator import kernelapi as _kernelapi
    from numba.cuda.simulator.args import ArgHint, InOut
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray

    _TrackedGlobalArray = race_detector.make_global_array_class(FakeWithinKernelCUDAArray)

_original_kernel_call = None  # numba's FakeCUDAKernel.__call__, which kernel_call() calls; set by install()


_recordings = []  # the lists of the active record_launches() blocks

_cluster = threading.local()  # .blocks: the cluster size of the launches made in in_clusters(), in this thread
MAX_CLUSTER_BLOCKS = 8  # the portable cluster size (16 needs a non-portable opt-in)


@contextmanager
def in_clusters(blocks):
    """Run the kernel launches made inside the ``with`` block as thread-block clusters of ``blocks``
    consecutive blocks along x (sm_90's cluster launch attribute): the blocks of each cluster run side by
    side, each with its own shared memory, and the cluster instructions of solutions/_hopper.py
    (cluster_ctarank, cluster_sync, mbarrier_arrive_cluster, tma_load_2d_multicast) reach across them."""
    blocks = int(blocks)
    if not 1 <= blocks <= MAX_CLUSTER_BLOCKS:
        raise LaunchLimitError(f"a cluster of {blocks} blocks: a portable cluster has 1 to {MAX_CLUSTER_BLOCKS}")
    outer = getattr(_cluster, "blocks", 1)
    _cluster.blocks = blocks
    try:
        yield
    finally:
        _cluster.blocks = outer


class _SharedOfEachBlock:
    """``cuda.shared`` for a launch in clusters: the blocks of a cluster run at the same time, so each one
    reads its own shared memory (its _Block's), not the launch's one buffer that blocks run one after
    another reuse."""

    def __init__(self, launch_shared):
        self._launch_shared = launch_shared

    def __getattr__(self, name):
        block = getattr(threading.current_thread(), "sim_block", None)
        own = getattr(block, "sim_shared", None)
        return getattr(own if own is not None else self._launch_shared, name)


@contextmanager
def record_launches():
    """Record the kernel launches made inside the ``with`` block.

    Yields a list that each launch appends ``(py_function, argument_types)`` to, where
    ``argument_types`` is a tuple of numba types, as the GPU dispatcher would infer them: arrays by
    dtype, dimensions and layout (a device array or ``cuda.In(...)`` wrapper types like the NumPy
    array inside it), a Python int as int64, a float as float64. That is enough to compile the same
    kernel, e.g. with ``cuda.compile_ptx(py_function, argument_types)``. Device-function calls are
    not launches and are not recorded.
    """
    launches = []
    _recordings.append(launches)
    try:
        yield launches
    finally:
        _recordings[:] = [active for active in _recordings if active is not launches]


def _numba_type(arg):
    while isinstance(arg, ArgHint):
        arg = arg.value
    if isinstance(arg, FakeCUDAArray):
        arg = arg._ary
    if isinstance(arg, np.ndarray) and arg.dtype.name == "bfloat16":
        # numba's own typeof knows no bfloat16; numba-cuda's (the one a GPU launch uses) maps
        # ml_dtypes' bfloat16 to its __nv_bfloat16
        from numba.cuda.typing.typeof import typeof as cuda_typeof

        return cuda_typeof(arg)
    return numba.typeof(arg)


def kernel_call(self, *args):
    """FakeCUDAKernel.__call__: numba's launch, with the checks a GPU makes, recording, the thread
    budget, and race checking (which needs the array arguments wrapped, so numba's version is
    rebuilt here rather than called)."""
    needs_gpu = getattr(self, "sim_needs_gpu", None)  # set by jit() for code linked with link=
    if needs_gpu:
        raise NeedsGPU(needs_gpu)
    if self._device or (_kernel._kernel_context is not None and _in_simulated_cuda_thread()):
        if counting.current.launch is not None:  # counted: its lines are traced too
            counting.current.launch.entering_device_function()
        return _original_kernel_call(self, *args)  # a device function: a call, not a launch
    with _ONE_LAUNCH_AT_A_TIME:
        _launch(self, args)


# A launch swaps process-wide state (numba's kernel context, the kernel module's `cuda`) and takes
# workers from one pool: launches from several host threads run one after another, as a GPU's default
# stream runs them. Without this, a launch from a second thread ran inside the first one's kernel
# context as if it were a device function, or shared its workers, and a block waited at a barrier for
# threads that never came.
_ONE_LAUNCH_AT_A_TIME = threading.RLock()


def _in_simulated_cuda_thread() -> bool:
    return getattr(threading.current_thread(), "blockIdx", None) is not None


def _launch(self, args):
    grid_dim, block_dim = normalize_kernel_dimensions(self.grid_dim, self.block_dim)
    _check_launch(grid_dim, block_dim, self.dynshared_size, getattr(self, "sim_max_dynamic_shared_bytes", 0))
    charge_budgets(self.fn, grid_dim, block_dim)
    if _recordings:
        launch = (self.fn, tuple(_numba_type(arg) for arg in args))
        for launches in _recordings:
            launches.append(launch)
    counts = counting.new_launch(self.fn, grid_dim, block_dim)  # None unless inside counters.counting()
    # The counters see the accesses through the race checker's tracked arrays, so counting turns it on.
    races = None
    if racecheck_enabled() or counts is not None:
        races = race_detector.LaunchRaces(self.fn, _TrackedGlobalArray)
        races.counts = counts
    shared.opted_in_bytes = getattr(self, "sim_max_dynamic_shared_bytes", 0)
    try:
        _run_kernel(self, grid_dim, block_dim, args, races)
    finally:
        shared.opted_in_bytes = 0
    if counts is not None:
        counting.finish_launch(counts)


def _run_kernel(kernel, grid_dim, block_dim, args, races):
    """numba's FakeCUDAKernel.__call__ for a launch: arguments to fake device arrays, one block
    after another, copies back to host arrays at the end."""
    fake_cuda_module = _kernelapi.FakeCUDAModule(grid_dim, block_dim, kernel.dynshared_size)
    names = kernel.fn.__code__.co_varnames[: kernel.fn.__code__.co_argcount]
    with _kernel._push_kernel_context(fake_cuda_module):
        retr = []  # copies back to host arrays passed directly, after the launch
        fake_args = [
            _fake_argument(kernel, arg, retr, races, names[i] if i < len(names) else f"argument {i}")
            for i, arg in enumerate(args)
        ]
        cluster = getattr(_cluster, "blocks", 1)
        if grid_dim[0] % cluster:
            raise LaunchLimitError(f"gridDim.x = {grid_dim[0]} is not a multiple of the cluster's {cluster} blocks")
        workers = take_workers(simulated_threads(cluster, block_dim))
        shared.running_races = races
        try:
            with _kernelapi.swapped_cuda_module(kernel.fn, fake_cuda_module):
                if cluster == 1:
                    for grid_point in np.ndindex(*grid_dim):
                        run_block(workers, kernel.fn, grid_dim, block_dim, grid_point, fake_args, kernel._debug, races)
                else:
                    fake_cuda_module._shared = _SharedOfEachBlock(fake_cuda_module._shared)
                    for z, y, x in np.ndindex(*reversed(grid_dim)):
                        if x % cluster == 0:
                            points = [(x + r, y, z) for r in range(cluster)]
                            run_cluster(workers, kernel.fn, grid_dim, block_dim, points, fake_args, kernel._debug,
                                        races, kernel.dynshared_size)
        finally:
            shared.running_races = None
            give_back_workers(workers)
        for write_back in retr:
            write_back()


def _fake_argument(kernel, arg, retr, races, name):
    """What the kernel gets for one argument (numba's fake_arg), tracked if race checking is on."""
    numba_type = None
    for extension in kernel.extensions:
        numba_type, arg = extension.prepare_args(numba_type, arg, stream=0, retr=retr)
    if isinstance(arg, np.ndarray) and arg.ndim > 0:
        arg = InOut(arg).to_device(retr)
    elif isinstance(arg, ArgHint):
        arg = arg.to_device(retr)
    elif isinstance(arg, np.void):
        arg = FakeCUDAArray(arg)
    if not isinstance(arg, FakeCUDAArray):
        return arg
    if races is not None and isinstance(arg._ary, np.ndarray):
        return races.track_argument(arg, name)
    return FakeWithinKernelCUDAArray(arg)


def _check_launch(grid_dim, block_dim, dynamic_shared_bytes, opted_in_bytes=0):
    """Raise LaunchLimitError for a configuration a GPU would refuse to launch."""
    for name, dims in (("gridDim", grid_dim), ("blockDim", block_dim)):
        for axis, n in zip("xyz", dims):
            if n < 1:
                raise LaunchLimitError(
                    f"{name}.{axis} = {n}: every grid and block dimension must be at least 1"
                )
    threads = block_dim[0] * block_dim[1] * block_dim[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise LaunchLimitError(
            f"a block of {' x '.join(map(str, block_dim))} = {threads} threads exceeds the limit of "
            f"{MAX_THREADS_PER_BLOCK} threads per block"
        )
    for name, dims, limits in (("blockDim", block_dim, MAX_BLOCK_DIM), ("gridDim", grid_dim, MAX_GRID_DIM)):
        for axis, n, limit in zip("xyz", dims, limits):
            if n > limit:
                raise LaunchLimitError(f"{name}.{axis} = {n} exceeds its limit of {limit}")
    shared.check_shared_memory(0, dynamic_shared_bytes, opted_in_bytes)


def install():
    global _original_kernel_call
    _original_kernel_call = _kernel.FakeCUDAKernel.__call__
    _kernel.FakeCUDAKernel.__call__ = kernel_call
