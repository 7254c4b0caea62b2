"""Make numba's CUDA simulator behave more like a GPU.

numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) runs each CUDA thread of a block as a Python thread,
one block after another. That makes kernels easy to debug, but the simulator is forgiving where a
GPU is not, and it lacks parts of numba's CUDA API. ``install()`` patches its classes in memory
(nothing on disk changes) so that:

* the warp intrinsics exist (``cuda.shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``,
  ``shfl_xor_sync``, ``ballot_sync``, ``any_sync``, ``all_sync``, ``eq_sync``, ``match_any_sync``,
  ``match_all_sync``, ``syncwarp``, ``activemask``, ``lanemask_lt``), with the semantics of PTX's
  ``shfl.sync``, ``vote.sync``, ``match.sync`` and ``bar.warp.sync`` as numba-cuda emits them, and
  with misuse that would hang or give undefined results on a GPU stopped by a :class:`WarpSyncError`
  that says what went wrong;
* data races are found (:mod:`workbench.simulator.races`): every access to global and shared
  memory is checked against the earlier ones, and two that conflict (different threads, at least
  one writing, nothing ordering them) stop the launch with a :class:`RaceError` naming the array,
  the index, the two threads and blocks and the source lines. On by default;
  ``WORKBENCH_SIM_RACECHECK=0`` or :func:`racecheck` turns it off;
* the simulated device has :func:`sm_count` multiprocessors (132, like an H100/H200, unless
  ``WORKBENCH_SIM_SM_COUNT`` or :func:`simulated_sm_count` says fewer): with few, a grid sized
  from the SM count is small, so a kernel that forgot its grid-stride loop fails at small sizes;
  ``cuda.get_current_device()`` reports it (``MULTIPROCESSOR_COUNT``) with the other usual limits;
* launches a GPU would refuse raise :class:`LaunchLimitError` (block and grid sizes, 48 KiB of
  shared memory per block), and, inside :func:`thread_budget`, launches too big to simulate in
  reasonable time raise :class:`TooManyThreads` before they start (:func:`simulated_threads`,
  :func:`estimated_seconds`);
* shared memory starts every block full of garbage (NaN for floats, the bytes of 0x7FFBADAD for
  everything else), as it does on a GPU, so reading it before writing it shows up instead of
  quietly reading zeros or the previous block's values;
* ``cuda.popc``, ``cuda.ffs`` and ``cuda.clz`` count bits in the width of their argument's type, as
  numba does (the simulator's versions assume a non-negative 32-bit value, which a ballot with lane
  31 set is not);
* the rest of what numba offers on a GPU works: ``cuda.libdevice`` (and ``numba.cuda.libdevice``)
  functions (:mod:`workbench.simulator.libdevice`), the cache-hint loads and stores
  (``cuda.ldcs``, ``cuda.stcs``, ...), ``cuda.nanosleep``, ``alignment=`` of shared and local
  arrays, and ``cuda.jit`` options that only matter to the compiler (``lineinfo``,
  ``launch_bounds``, ``max_registers``, ``fastmath``, ``cache``, ``forceinline``, ``lto``, ...);
  what the simulator cannot run (code linked with ``link=`` or ``cuda.declare_device``, a grid-wide
  ``this_grid().sync()`` over several blocks, a block waiting for a later one) raises
  :class:`NeedsGPU` with the reason, never a wrong answer;
* a launch made inside ``launches.in_clusters(n)`` runs as thread-block clusters of ``n`` blocks (sm_90's
  cluster launch): the blocks of a cluster run side by side, each with its own shared memory at the same
  alignment, so the cluster instructions of ``solutions/_hopper.py`` (a TMA multicast, an arrival on
  another block's mbarrier, the cluster barrier) reach across them, and a block that fails stops the
  others;
* :func:`record_launches` lists every kernel launch with numba's types for its arguments, so the
  same kernels can be compiled for a real GPU elsewhere.

Warp intrinsics are rendezvous: each lane deposits its operand and sleeps until every lane of the
mask has; then each computes its own result from all the operands. To notice a rendezvous that can
never complete (a lane in the mask took another branch, sits in ``syncthreads()``, or returned), the
block scheduler is replaced too (see :mod:`.blocks`): numba's version polls every thread in a busy
loop and only knows about ``syncthreads()``.

One deliberate difference from PTX: a mask that names a lane which has returned from the kernel is
an error here. PTX just leaves exited lanes out of the wait, but a shuffle that reads one gets an
undefined value and a vote silently ignores it, so such a mask is almost always a bug (typically
an early ``return`` before a full-warp reduction); build masks with ``cuda.activemask()`` or
``cuda.ballot_sync`` instead.

Cost (measured on a 2-core CPU shared with other jobs, so only a guide): a simulated thread costs
0.1-1 ms, from a kernel with a few element accesses to one with hundreds; race checking adds 1-3 µs
per element access (30-50% on the access-heavy ladders: see workbench.simulator.races). Python
threads are reused from block to block and launch to launch, as starting one costs more than most
simulated threads do: and a process kept on one core (:func:`run_on_one_core`, or
``WORKBENCH_SIM_CORE=N`` in its environment) simulates in about half the time, as its threads then
hand over within a core.

The parts, one module each: :mod:`.core` (the warp, a GPU's limits, the errors), :mod:`.switches`
(race checking, the SM count, the thread budget), :mod:`.launches` (a launch's checks, recording, its
blocks), :mod:`.shared` (poisoned shared memory and its limit), :mod:`.blocks` (the block scheduler and
the reused threads), :mod:`.intrinsics` (warp intrinsics), :mod:`.atomics` (fences, atomics, the grid
barrier), :mod:`.device` (the simulated device's attributes), :mod:`.api` (the rest of numba's CUDA
API); :mod:`.races` finds data races and :mod:`.counters` counts what the profiler would.
"""

import os
import sys

import numba

from . import api, atomics, device, intrinsics, launches, shared
from .core import (
    CORE_ENV,
    DEFAULT_SM_COUNT,
    FULL_MASK,
    POISON_WORD,
    SECONDS_PER_THREAD,
    WARP_SIZE,
    LaunchLimitError,
    NeedsGPU,
    TooManyThreads,
    WarpSyncError,
)
from .launches import record_launches
from .races import RaceError
from .switches import (
    estimated_seconds,
    racecheck,
    racecheck_enabled,
    run_on_one_core,
    simulated_sm_count,
    simulated_threads,
    sm_count,
    thread_budget,
)

__all__ = [
    "FULL_MASK", "POISON_WORD", "WARP_SIZE", "DEFAULT_SM_COUNT", "SECONDS_PER_THREAD",
    "LaunchLimitError", "NeedsGPU", "RaceError", "TooManyThreads", "WarpSyncError",
    "install", "record_launches", "racecheck", "racecheck_enabled", "run_on_one_core", "sm_count", "simulated_sm_count",
    "simulated_threads", "estimated_seconds", "thread_budget",
]

_installed = False


def install():
    """Patch numba's CUDA simulator as the module docstring describes. Safe to call twice.

    The simulator must be on (``NUMBA_ENABLE_CUDASIM=1`` before numba is first imported): on a GPU
    there is nothing to patch, and the patched classes do not exist.
    """
    global _installed
    if not numba.config.ENABLE_CUDASIM:
        raise RuntimeError(
            "workbench.simulator.install() patches numba's CUDA simulator, which is off: set "
            "NUMBA_ENABLE_CUDASIM=1 in the environment before numba is first imported."
        )
    if _installed:
        return
    for part in (launches, shared, intrinsics, atomics, device, api):
        part.install()
    _installed = True
    core = os.environ.get(CORE_ENV, "").strip()
    if core.isdigit():
        run_on_one_core(int(core))
    elif core:
        print(f"workbench: {CORE_ENV}={core!r} ignored: the index of a core (0, 1, ...) was expected",
              file=sys.stderr)
