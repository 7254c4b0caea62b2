"""Warp intrinsics (methods of the simulator's fake `cuda` module)."""

import operator
import threading

import numba
import numpy as np

from .blocks import lane_words, lanes_of
from .core import FULL_MASK, WARP_SIZE, WarpSyncError

if numba.config.ENABLE_CUDASIM:
    from numba.cuda.simulator import kernelapi as _kernelapi


def _enter_warp_call(kind, mask):
    """Check a warp intrinsic's mask for the calling thread; return (thread, lane, mask).

    numba truncates the mask to 32 bits, so -1 means all lanes. The caller must be in its own mask
    (PTX: undefined otherwise), and every lane the mask names must exist: in a block whose size is
    not a multiple of 32 the last warp is partial, and the lanes it lacks never arrive.
    """
    thread = threading.current_thread()
    mask = operator.index(mask) & FULL_MASK
    lane = thread.thread_id % WARP_SIZE
    if not mask >> lane & 1:
        raise WarpSyncError(
            f"{kind}: lane {lane} called it with mask {mask:#010x}, which does not include lane {lane}; "
            "every calling lane must be in the mask (on a GPU the result is undefined)"
        )
    block = thread.sim_block
    warp = block.warps[thread.thread_id // WARP_SIZE]
    absent = mask & ~warp.existing
    if absent:
        raise WarpSyncError(
            f"{kind}(mask={mask:#010x}): {lane_words(lanes_of(absent))} of warp {warp.index} do not exist: "
            f"the block has {len(block.threads)} threads, so this warp has only "
            f"{lane_words(lanes_of(warp.existing))}. Name only lanes that exist (cuda.activemask() "
            "lists them), or make the block size a multiple of 32."
        )
    return thread, lane, mask


def _check_word(kind, value):
    """numba's shfl and match intrinsics take int32, int64, float32 or float64 values; nothing else."""
    if type(value) is int:
        ok = -(2**63) <= value < 2**63  # numba types a Python int as int64
    elif type(value) is float:
        ok = True
    else:
        ok = isinstance(value, np.generic) and value.dtype.kind in "if" and value.dtype.itemsize in (4, 8)
    if not ok:
        raise TypeError(
            f"{kind} works on int32, int64, float32 and float64 values, as numba's does; got "
            f"{value!r} of type {type(value).__name__}"
        )


def _like(received, own, kind, lane, source):
    """Give a value that arrived from another lane the type of the caller's own value.

    In compiled code a variable has one type in every lane; in the simulator, lanes that took
    different paths can hold, say, a Python float and a numpy.float32. Same kind: convert. Int and
    float: numba would have made both float, so the code likely relies on an int start value.
    """
    if type(received) is type(own):
        return received
    if isinstance(received, (float, np.floating)) == isinstance(own, (float, np.floating)):
        return type(own)(received)
    raise TypeError(
        f"{kind}: lane {lane} passes a {type(own).__name__} but lane {source} passes a "
        f"{type(received).__name__}. Compiled, the variable would have one float type in every lane: "
        "start it from a float (0.0, not 0)."
    )


def _shuffle(kind, mask, value, b, source_lane):
    _check_word(kind, value)
    thread, lane, mask = _enter_warp_call(kind, mask)
    # PTX uses only b[4:0]: a lane index or offset of 32 means 0, 33 means 1, -1 means 31.
    source = source_lane(lane, operator.index(b) & (WARP_SIZE - 1))
    if not mask >> source & 1:
        raise WarpSyncError(
            f"{kind}: lane {lane} reads lane {source}, which is not in the mask {mask:#010x}; "
            "on a GPU the value it gets is undefined"
        )
    values = thread.sim_block.rendezvous(thread, kind, mask, value)
    return _like(values[source], value, kind, lane, source)


# Source lane j for each mode, from PTX's shfl.sync with the c operand numba passes (0x1f for idx,
# down and bfly: clamp at lane 31; 0 for up: clamp at lane 0). Out of range, a lane reads itself.


def _idx_source(lane, b):
    return b


def _up_source(lane, b):
    return lane - b if lane >= b else lane


def _down_source(lane, b):
    return lane + b if lane + b < WARP_SIZE else lane


def _xor_source(lane, b):
    return lane ^ b


def shfl_sync(self, mask, value, src_lane):
    """Return `value` from lane ``src_lane % 32``.

    numba's API has no width argument: shuffles always span the whole 32-lane warp. `value` is an
    int32, int64, float32 or float64 (Python int and float count as the 64-bit types) and comes
    back with the caller's type. Every lane named in `mask` must call the same intrinsic with the
    same mask; the lane read must be one of them.
    """
    return _shuffle("shfl_sync", mask, value, src_lane, _idx_source)


def shfl_up_sync(self, mask, value, delta):
    """Return `value` from lane ``lane - delta``, or the caller's own if that is below 0.

    Only ``delta % 32`` counts. See shfl_sync for width, types and mask.
    """
    return _shuffle("shfl_up_sync", mask, value, delta, _up_source)


def shfl_down_sync(self, mask, value, delta):
    """Return `value` from lane ``lane + delta``, or the caller's own if that is above 31.

    Only ``delta % 32`` counts. See shfl_sync for width, types and mask.
    """
    return _shuffle("shfl_down_sync", mask, value, delta, _down_source)


def shfl_xor_sync(self, mask, value, lane_mask):
    """Return `value` from lane ``lane ^ (lane_mask % 32)``. See shfl_sync for width, types and mask."""
    return _shuffle("shfl_xor_sync", mask, value, lane_mask, _xor_source)


def _vote(kind, mask, predicate):
    """Rendezvous on a predicate; return (ballot of the mask's lanes, mask)."""
    if not isinstance(predicate, (bool, int, np.integer, np.bool_)):
        raise TypeError(
            f"{kind}: the predicate must be an integer or a boolean, as numba requires; got {predicate!r}"
        )
    thread, _, mask = _enter_warp_call(kind, mask)
    votes = thread.sim_block.rendezvous(thread, kind, mask, bool(predicate))
    return sum(1 << lane for lane, vote in votes.items() if vote), mask


def _int32(bits):
    return np.uint32(bits).view(np.int32)


def ballot_sync(self, mask, predicate):
    """Bit i set if lane i of `mask` has a true predicate.

    numba types the result int32, so with lane 31 set it is negative: a full-warp ballot is -1,
    not 0xFFFFFFFF.
    """
    return _int32(_vote("ballot_sync", mask, predicate)[0])


def any_sync(self, mask, predicate):
    """True if the predicate is true in any lane of `mask`."""
    return _vote("any_sync", mask, predicate)[0] != 0


def all_sync(self, mask, predicate):
    """True if the predicate is true in every lane of `mask`."""
    ballot, mask = _vote("all_sync", mask, predicate)
    return ballot == mask


def eq_sync(self, mask, predicate):
    """True if the predicate has the same truth value in every lane of `mask`."""
    ballot, mask = _vote("eq_sync", mask, predicate)
    return ballot in (0, mask)


def _match(kind, mask, value):
    """Rendezvous on a value's bits (floats compare as bits, as match.sync does).

    Returns ({lane: bits} for the mask, the caller's bits, mask).
    """
    _check_word(kind, value)
    thread, lane, mask = _enter_warp_call(kind, mask)
    patterns = thread.sim_block.rendezvous(thread, kind, mask, np.asarray(value).tobytes())
    return patterns, patterns[lane], mask


def match_any_sync(self, mask, value):
    """The lanes of `mask` whose value has the same bits as the caller's, as an int32 bit mask."""
    patterns, own, _ = _match("match_any_sync", mask, value)
    return _int32(sum(1 << lane for lane, pattern in patterns.items() if pattern == own))


def match_all_sync(self, mask, value):
    """``(mask, True)`` if every lane of `mask` has the same value, else ``(0, False)``; mask as int32."""
    patterns, own, mask = _match("match_all_sync", mask, value)
    if all(pattern == own for pattern in patterns.values()):
        return _int32(mask), True
    return np.int32(0), False


def syncwarp(self, mask=FULL_MASK):
    """Wait until every lane of `mask` has called syncwarp with this mask."""
    thread, _, mask = _enter_warp_call("syncwarp", mask)
    thread.sim_block.rendezvous(thread, "syncwarp", mask, None)


def activemask(self):
    """The lanes of the caller's warp running with it, as a uint32 (approximated: _Block.activemask)."""
    thread = threading.current_thread()
    return np.uint32(thread.sim_block.activemask(thread))


def lanemask_lt(self):
    """The lanes below the caller's, as a uint32: ``(1 << lane) - 1``."""
    return np.uint32((1 << threading.current_thread().thread_id % WARP_SIZE) - 1)


def _bits(value):
    """An integer's bits as numba sees them: two's complement in its type's width (Python int: int64)."""
    width = value.dtype.itemsize * 8 if isinstance(value, np.integer) else 64
    return int(value) & ((1 << width) - 1), width


def popc(self, value):
    """Number of set bits (of a negative int too, e.g. a ballot with lane 31 set)."""
    return _bits(value)[0].bit_count()


def ffs(self, value):
    """1-based position of the lowest set bit; 0 if none."""
    bits = _bits(value)[0]
    return (bits & -bits).bit_length()


def clz(self, value):
    """Number of leading zero bits, in the width of the value's type."""
    bits, width = _bits(value)
    return width - bits.bit_length()


INTRINSICS = (
    shfl_sync,
    shfl_up_sync,
    shfl_down_sync,
    shfl_xor_sync,
    ballot_sync,
    any_sync,
    all_sync,
    eq_sync,
    match_any_sync,
    match_all_sync,
    syncwarp,
    activemask,
    lanemask_lt,
    popc,
    ffs,
    clz,
)


def install():
    for function in INTRINSICS:
        setattr(_kernelapi.FakeCUDAModule, function.__name__, function)
