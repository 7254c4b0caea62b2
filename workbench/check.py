"""Is a stage correct? Judged against a float64 reference on fresh random inputs.

Every check: new random inputs (never zeros or arange, which hide wrong indexing); the output
poisoned with NaN first, so an element the kernel never wrote shows up; relative error
‖out − ref‖ / ‖ref‖ against a per-dtype tolerance; any NaN fails; the inputs must come back unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from . import device as _device
from .ladder import Operator, Size, Stage, as_size, size_label, to_device, to_host


PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class CheckResult:
    """One stage at one size: ``status`` is passed, failed or skipped (a stage the simulator cannot run
    was never judged: it neither passed nor failed, and says why in ``message``)."""

    key: str
    size: list
    status: str
    rel_err: float | None
    tolerance: float | None
    message: str = ""
    inputs: str = "random"  # which inputs: "random", or the label of an adversarial set ("all-negative", ...)
    first_bad_index: list | None = None
    worst: list = field(default_factory=list)  # [(index, got, expected)] of the largest errors
    # What went wrong, as a short code the grader keys its advice on: "shape", "unwritten" (poison
    # left in the output), "uninitialised" (integer output = poison + answer), "nan" (a NaN/inf the
    # kernel computed), "all-zeros", "wrong-values", "input-modified", "exception"; "" when passed.
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    @property
    def skipped(self) -> bool:
        return self.status == SKIPPED

    def fail(self, reason: str, message: str) -> None:
        self.status = FAILED
        self.reason = self.reason or reason
        self.message = (self.message + "; " if self.message else "") + message

    def as_dict(self) -> dict:
        return asdict(self)


# The NaN an output is poisoned with: a quiet NaN with a payload of its own, so that an element
# still holding it was never written, while any other NaN was computed by the kernel.
_POISON_BITS = {np.dtype(np.float32): (np.uint32, 0x7FC0DEAD), np.dtype(np.float64): (np.uint64, 0x7FF800000000DEAD)}
# The 16-bit formats: fp16 (exponent 0x7C00, quiet bit 0x0200) and bf16 from ml_dtypes (exponent 0x7F80,
# quiet bit 0x0040), each with a payload that a conversion of a computed NaN does not produce.
_POISON_BITS[np.dtype(np.float16)] = (np.uint16, 0x7EAD)
try:
    import ml_dtypes

    _POISON_BITS[np.dtype(ml_dtypes.bfloat16)] = (np.uint16, 0x7FED)
except ImportError:  # pragma: no cover - bf16 arrays need ml_dtypes anyway
    pass


def poison_value(dtype) -> np.ndarray:
    """The value poison_like fills an array of ``dtype`` with, as a 0-d array."""
    dtype = np.dtype(dtype)
    if dtype in _POISON_BITS:
        bits_type, bits = _POISON_BITS[dtype]
        return np.array(bits, dtype=bits_type).view(dtype)
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        return np.array(np.nan, dtype=dtype)  # complex: NaN + 0j (a workspace of FFT coefficients)
    info = np.iinfo(dtype)
    return np.array(info.min + 7 if np.issubdtype(dtype, np.signedinteger) else info.max - 7, dtype=dtype)


def poison_like(template: np.ndarray) -> np.ndarray:
    """NaN for floats, an unlikely bit pattern for ints: what an unwritten element looks like."""
    out = np.empty_like(template)
    out.fill(poison_value(out.dtype))
    return out


def is_poison(a: np.ndarray) -> np.ndarray:
    """Elementwise: does ``a`` still hold poison_like's value (bit for bit, for floats)?"""
    a = np.asarray(a)
    p = poison_value(a.dtype)
    if a.dtype in _POISON_BITS:
        bits_type = _POISON_BITS[a.dtype][0]
        return a.view(bits_type) == p.view(bits_type)
    if np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating):
        return np.isnan(a)
    return a == p


def relative_error(out: np.ndarray, ref: np.ndarray, floor: float = 0.0) -> float:
    """||out - ref|| / ||ref||, with ||ref|| taken as at least ``floor`` (compare passes the output
    format's underflow scale)."""
    diff = np.linalg.norm((out.astype(np.float64) - ref).ravel())
    scale = max(float(np.linalg.norm(np.asarray(ref, dtype=np.float64).ravel())), floor)
    return float(diff / scale) if scale > 0 else float(diff)


def underflow_scale(dtype, n: int) -> float:
    """The norm below which ``n`` values of a float format lose relative precision: its smallest normal
    number times sqrt(n). A float16 GELU(-6) is -5.9e-9, under float16's smallest subnormal, so the right
    answer is 0, off by 100% of the exact value: against this scale, by 1e-4. For float32 and wider (and
    bfloat16, with float32's exponents) the scale is around 1e-38 and changes nothing."""
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating) and dtype not in _POISON_BITS:
        return 0.0
    try:
        tiny = float(np.finfo(dtype).tiny)
    except (TypeError, ValueError):  # ml_dtypes' bfloat16
        import ml_dtypes

        tiny = float(ml_dtypes.finfo(dtype).tiny)
    return tiny * math.sqrt(max(n, 1))


def _same_bits(before: np.ndarray, now: np.ndarray) -> bool:
    """Is ``now`` bit for bit ``before``? A stage that writes to its input changes bits; comparing bits (a
    memcmp) instead of values (NaN-aware, and emulated element by element for float16) keeps this check
    from costing more than the run it judges: 14 s against 0.4 s for a decode-attention KV cache."""
    before, now = np.ascontiguousarray(before), np.ascontiguousarray(now)
    if before.shape != now.shape or before.dtype != now.dtype:
        return False
    return np.array_equal(before.reshape(-1).view(np.uint8), now.reshape(-1).view(np.uint8))


def _index(flat: int, shape) -> list:
    return list(map(int, np.unravel_index(int(flat), shape)))


def _compare_exact(key: str, size: Size, out: np.ndarray, ref: np.ndarray) -> CheckResult:
    """Integer outputs (counts, indices): every element must match exactly."""
    ref = np.asarray(ref)
    if np.issubdtype(ref.dtype, np.floating):
        ref = np.rint(ref)
    want = ref.astype(np.int64)
    got = out.astype(np.int64)
    err = relative_error(got, want.astype(np.float64))
    wrong = got != want
    if not wrong.any():
        return CheckResult(key, list(size), PASSED, err, 0.0)
    flat = np.flatnonzero(wrong)
    result = CheckResult(key, list(size), FAILED, err, 0.0, first_bad_index=_index(flat[0], out.shape))
    order = flat[np.argsort(np.abs(got - want).ravel()[flat], kind="stable")[::-1][:5]]
    result.worst = [[_index(i, out.shape), int(got.ravel()[i]), int(want.ravel()[i])] for i in order]
    unwritten = is_poison(out) & wrong
    poison = int(poison_value(out.dtype))
    if np.array_equal(got - poison, want) and want.any():
        result.reason = "uninitialised"
        result.message = (f"every element is off by exactly {poison}, the garbage the output held before the call: "
                          "it was accumulated into without being zeroed first")
    elif unwritten.any():
        result.reason = "unwritten"
        result.message = (f"{int(unwritten.sum())} of {out.size} output elements still hold the poison value "
                          f"{int(poison_value(out.dtype))} the output was filled with (first at index "
                          f"{_index(np.flatnonzero(unwritten)[0], out.shape)}): were they never written?")
    elif not got.any() and want.any():
        result.reason = "all-zeros"
        result.message = "the output is all zeros: did the kernel compute and write anything?"
    else:
        result.reason = "wrong-values"
        result.message = (f"{int(wrong.sum())} of {out.size} elements differ (integer outputs must match exactly); "
                          f"first at index {result.first_bad_index}: got {int(got.ravel()[flat[0]])}, "
                          f"expected {int(want.ravel()[flat[0]])}")
    return result


def compare(key: str, size: Size, out: np.ndarray, ref: np.ndarray, tolerance: float) -> CheckResult:
    """Judge ``out`` against ``ref``; the message says what went wrong and where first.

    Integer outputs must match exactly (the tolerance is ignored). For floats, elements that still
    hold the output's poison are reported as never written, other NaN/inf as computed.
    """
    if out.shape != np.shape(ref):
        return CheckResult(key, list(size), FAILED, float("inf"), tolerance,
                           f"output shape {out.shape} but expected {np.shape(ref)}", reason="shape")
    if np.issubdtype(out.dtype, np.integer) or np.issubdtype(out.dtype, np.bool_):
        return _compare_exact(key, size, out, ref)
    ref = np.asarray(ref, dtype=np.float64)
    bad_nan = ~np.isfinite(out) & np.isfinite(ref)
    if bad_nan.any():
        first = _index(np.flatnonzero(bad_nan)[0], out.shape)
        n_bad = int(bad_nan.sum())
        unwritten = bad_nan & is_poison(out)
        n_unwritten = int(unwritten.sum())
        if n_unwritten:
            where = _index(np.flatnonzero(unwritten)[0], out.shape)
            message = (f"{n_unwritten} of {out.size} output elements still hold the NaN the output was poisoned "
                       f"with (first at index {where}): were they never written?")
            if n_unwritten < n_bad:
                message += f" {n_bad - n_unwritten} more are NaN/inf computed by the kernel."
            reason = "unwritten"
        else:
            message = (f"{n_bad} of {out.size} output elements are NaN/inf computed by the kernel (first at index "
                       f"{first}): a read of memory nobody wrote? Shared memory and new buffers start as garbage "
                       "(NaN here): a missing cuda.syncthreads() between writing and reading shared memory, or "
                       "a buffer or accumulator never initialised")
            reason = "nan"
        return CheckResult(key, list(size), FAILED, float("nan"), tolerance, message, first_bad_index=first,
                           worst=[[first, float(out[tuple(first)]), float(ref[tuple(first)])]], reason=reason)
    special = ~np.isfinite(ref)
    if special.any():
        # The reference itself is NaN or +-inf there (a NaN input that must propagate, max of a row
        # holding inf): the output must hold the same value, a NaN the kernel computed (not the poison)
        # or the same infinity. The relative error is then taken over the finite elements only.
        same = (np.isnan(ref) & np.isnan(out) & ~is_poison(out)) | (ref == out)
        mismatch = special & ~same
        if mismatch.any():
            flat = np.flatnonzero(mismatch)
            first = _index(flat[0], out.shape)
            unwritten = bool(is_poison(out).ravel()[flat[0]])
            message = (f"{flat.size} of {out.size} elements whose expected value is NaN or inf differ (first at "
                       f"index {first}: got {out.ravel()[flat[0]]}, expected {ref.ravel()[flat[0]]})"
                       + (": never written (it still holds the poison)" if unwritten else ""))
            return CheckResult(key, list(size), FAILED, float("nan"), tolerance, message, first_bad_index=first,
                               worst=[[first, float(out.ravel()[flat[0]]), float(ref.ravel()[flat[0]])]],
                               reason="unwritten" if unwritten else "wrong-values")
    finite = ~special
    floor = underflow_scale(out.dtype, int(finite.sum()))
    err = relative_error(out[finite], ref[finite], floor) if special.any() else relative_error(out, ref, floor)
    passed = err <= tolerance
    result = CheckResult(key, list(size), PASSED if passed else FAILED, err, tolerance)
    if not passed:
        absdiff = np.where(finite, np.abs(out.astype(np.float64) - np.where(finite, ref, 0.0)), 0.0)
        scale = max(float(np.abs(ref[finite]).max()), 1e-30)
        wrong = absdiff > tolerance * scale
        flat_wrong = np.flatnonzero(wrong)
        first = np.unravel_index(int(flat_wrong[0] if flat_wrong.size else absdiff.argmax()), out.shape)
        order = np.argsort(absdiff.ravel())[::-1][:5]
        result.first_bad_index = list(map(int, first))
        result.worst = [[list(map(int, np.unravel_index(int(i), out.shape))), float(out.ravel()[i]), float(ref.ravel()[i])]
                        for i in order]
        result.message = (f"relative error {err:.3g} exceeds tolerance {tolerance:.1g}; "
                          f"{int(wrong.sum())} of {out.size} elements off, first at index {result.first_bad_index}")
        result.reason = "wrong-values"
        if not out.any() and ref.any():
            result.reason = "all-zeros"
            result.message = "the output is all zeros: did the kernel compute and write anything? " + result.message
    return result


def run_once(stage: Stage, inputs: tuple, out_template: np.ndarray, launch: Callable | None = None) -> tuple[np.ndarray, list]:
    """Copy inputs to the device, poison the output, run, copy back. Returns (out, inputs_after)."""
    from numba import cuda

    d_inputs = [to_device(a) for a in inputs]
    d_out = to_device(poison_like(out_template))
    (launch or stage)(*d_inputs, d_out)
    cuda.synchronize()
    return to_host(d_out), [to_host(d) for d in d_inputs]


def tolerance_of(stage: Stage, size: Size) -> float:
    """The relative error a correct run of ``stage`` at ``size`` stays under."""
    return stage.tolerance if stage.tolerance is not None else stage.op.tolerance_for(size, stage.dtype)


def check_stage(stage: Stage, size, rng: np.random.Generator | None = None, launch: Callable | None = None,
                explain: Callable | None = None, inputs: tuple | None = None, label: str = "random",
                reference: np.ndarray | None = None) -> CheckResult:
    """Check one stage at one size, on fresh random inputs or on the ``inputs`` given.

    ``launch`` replaces the stage's own launcher (the grader runs a learner's this way, judged by the
    stage's operator); ``explain(inputs, out, ref)`` may add a hint to a failed comparison (default:
    the operator's own ``explain``); ``label`` names the inputs in the result ("all-negative", ...);
    ``reference``, with ``inputs``, is the operator's reference of those inputs, computed once for every
    stage checked on them (the GPU tests do: a float64 GEMM at 4096^3 is seconds of CPU)."""
    op: Operator = stage.op
    size = as_size(size)
    if stage.gpu_only and _device.is_simulator():
        return CheckResult(stage.key, list(size), SKIPPED, None, None,
                           f"not run: the simulator cannot run it ({stage.gpu_only})", inputs=label)
    if inputs is None:
        inputs = op.make_inputs(size, rng or np.random.default_rng())
    originals = [np.array(a, copy=True) for a in inputs]
    try:
        out, after = run_once(stage, inputs, op.make_output(size), launch)
    except Exception as exc:  # a crash is a failed check, reported with its cause
        return CheckResult(stage.key, list(size), FAILED, float("inf"), tolerance_of(stage, size),
                           f"{type(exc).__name__}: {exc}", reason="exception", inputs=label)
    return judge(stage, size, originals, out, after, explain=explain, label=label, reference=reference)


def judge(stage: Stage, size, inputs: tuple, out: np.ndarray, inputs_after, *, explain: Callable | None = None,
          label: str = "random", reference: np.ndarray | None = None) -> CheckResult:
    """Judge a finished run of ``stage``: ``out`` against the reference of ``inputs`` (as they were
    before the run), and ``inputs_after`` against ``inputs`` (a stage must not write to its inputs).
    ``check_stage`` runs and judges; the grader runs a learner's launcher elsewhere and judges here."""
    op: Operator = stage.op
    size = as_size(size)
    explain = explain or op.explain
    ref = reference
    if ref is None:
        with np.errstate(all="ignore"):  # the adversarial inputs hold NaN and inf on purpose: no warnings
            ref = op.reference(*inputs)
    result = compare(stage.key, size, out, ref, tolerance_of(stage, size))
    result.inputs = label
    if result.failed and explain is not None and result.reason != "shape":
        try:
            hint = explain(inputs, out, ref)
        except Exception:  # a hint must never turn a verdict into a crash
            hint = None
        if hint:
            result.message += f"; {hint}"
    for i, (before, now) in enumerate(zip(inputs, inputs_after)):
        if not _same_bits(before, now):
            changed = np.flatnonzero(~((before == now) | (np.isnan(before) & np.isnan(now)))
                                     if np.issubdtype(before.dtype, np.floating) else before != now)
            where = f" (first at index {_index(changed[0], before.shape)})" if changed.size else ""
            result.fail("input-modified", f"input {i} was modified{where}: a stage must not write to its inputs")
    return result


def adversarial_cases(op: Operator, size, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    """The operator's adversarial input sets at ``size`` (all-negative, constant rows, ...), or []."""
    if op.adversarial_inputs is None:
        return []
    return list(op.adversarial_inputs(as_size(size), rng))


def gpu_check_sizes(stage: Stage) -> list[Size]:
    """The sizes ``stage`` is checked (and graded) at on a GPU: its operator's check sizes, but a first stage
    skips the largest, where it takes seconds a call and teaches nothing new, or far longer: coo_to_csr's
    first stage sorts a row of 10^5 entries with one thread at its largest size, for many minutes."""
    sizes = [as_size(s) for s in stage.op.check_sizes]
    if stage.order == 1 and len(sizes) > 2:
        sizes.remove(max(sizes, key=lambda s: int(np.prod(s))))
    return sizes


def default_sizes(op: Operator) -> list[Size]:
    return [as_size(s) for s in (op.sim_sizes if _device.is_simulator() else op.check_sizes)]


def check_ladder(op: Operator, stages: list[Stage] | None = None, sizes=None, seed: int | None = None,
                 progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    rng = np.random.default_rng(seed)
    results = []
    for stage in stages or op.stages:
        for size in (sizes or default_sizes(op)):
            if progress:
                progress(f"{stage.key} @ {size_label(as_size(size))}")
            results.append(check_stage(stage, size, rng))
            for label, inputs in adversarial_cases(op, size, rng):
                results.append(check_stage(stage, size, inputs=inputs, label=label))
    return results
