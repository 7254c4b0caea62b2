"""Is a stage correct? Judged against a float64 reference on fresh random inputs.

Every check: new random inputs (never zeros or arange, which hide wrong indexing); the output
poisoned with NaN first, so an element the kernel never wrote shows up; relative error
‖out − ref‖ / ‖ref‖ against a per-dtype tolerance; any NaN fails; the inputs must come back unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from . import device as _device
from .ladder import Operator, Size, Stage, as_size, size_label


@dataclass
class CheckResult:
    key: str
    size: list
    passed: bool
    rel_err: float
    tolerance: float
    message: str = ""
    skipped: bool = False
    first_bad_index: list | None = None
    worst: list = field(default_factory=list)  # [(index, got, expected)] of the largest errors

    def as_dict(self) -> dict:
        return asdict(self)


def poison_like(template: np.ndarray) -> np.ndarray:
    """NaN for floats, an unlikely bit pattern for ints: what an unwritten element looks like."""
    out = np.empty_like(template)
    if np.issubdtype(out.dtype, np.floating):
        out.fill(np.nan)
    else:
        out.fill(np.iinfo(out.dtype).min + 7 if np.issubdtype(out.dtype, np.signedinteger) else np.iinfo(out.dtype).max - 7)
    return out


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    diff = np.linalg.norm((out.astype(np.float64) - ref).ravel())
    scale = np.linalg.norm(np.asarray(ref, dtype=np.float64).ravel())
    return float(diff / scale) if scale > 0 else float(diff)


def compare(key: str, size: Size, out: np.ndarray, ref: np.ndarray, tolerance: float) -> CheckResult:
    """Judge ``out`` against ``ref``; the message says what went wrong and where first."""
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        return CheckResult(key, list(size), False, float("inf"), tolerance,
                           f"output shape {out.shape} but expected {ref.shape}")
    bad_nan = ~np.isfinite(out) & np.isfinite(ref)
    if bad_nan.any():
        first = np.unravel_index(int(np.flatnonzero(bad_nan)[0]), out.shape)
        n_bad = int(bad_nan.sum())
        return CheckResult(key, list(size), False, float("nan"), tolerance,
                           f"{n_bad} of {out.size} output elements are NaN/inf (first at index {list(map(int, first))}); "
                           "the output was poisoned with NaN: were those elements never written?",
                           first_bad_index=list(map(int, first)))
    err = relative_error(out, ref)
    passed = err <= tolerance
    result = CheckResult(key, list(size), passed, err, tolerance)
    if not passed:
        absdiff = np.abs(out.astype(np.float64) - ref)
        scale = max(float(np.abs(ref).max()), 1e-30)
        wrong = absdiff > tolerance * scale
        flat_wrong = np.flatnonzero(wrong)
        first = np.unravel_index(int(flat_wrong[0] if flat_wrong.size else absdiff.argmax()), out.shape)
        order = np.argsort(absdiff.ravel())[::-1][:5]
        result.first_bad_index = list(map(int, first))
        result.worst = [[list(map(int, np.unravel_index(int(i), out.shape))), float(out.ravel()[i]), float(ref.ravel()[i])]
                        for i in order]
        result.message = (f"relative error {err:.3g} exceeds tolerance {tolerance:.1g}; "
                          f"{int(wrong.sum())} of {out.size} elements off, first at index {result.first_bad_index}")
    return result


def run_once(stage: Stage, inputs: tuple, out_template: np.ndarray, launch: Callable | None = None) -> tuple[np.ndarray, list]:
    """Copy inputs to the device, poison the output, run, copy back. Returns (out, inputs_after)."""
    from numba import cuda

    d_inputs = [cuda.to_device(np.ascontiguousarray(a)) for a in inputs]
    d_out = cuda.to_device(poison_like(out_template))
    (launch or stage)(*d_inputs, d_out)
    cuda.synchronize()
    return d_out.copy_to_host(), [d.copy_to_host() for d in d_inputs]


def check_stage(stage: Stage, size, rng: np.random.Generator | None = None, launch: Callable | None = None) -> CheckResult:
    """Check one stage at one size on fresh random inputs."""
    op: Operator = stage.op
    size = as_size(size)
    if stage.gpu_only and _device.is_simulator():
        return CheckResult(stage.key, list(size), True, 0.0, 0.0, f"skipped: {stage.gpu_only}", skipped=True)
    rng = rng or np.random.default_rng()
    inputs = op.make_inputs(size, rng)
    originals = [np.array(a, copy=True) for a in inputs]
    ref = op.reference(*inputs)
    tol = stage.tolerance if stage.tolerance is not None else op.tolerance_for(size, stage.dtype)
    try:
        out, after = run_once(stage, inputs, op.make_output(size), launch)
    except Exception as exc:  # a crash is a failed check, reported with its cause
        return CheckResult(stage.key, list(size), False, float("inf"), tol, f"{type(exc).__name__}: {exc}")
    result = compare(stage.key, size, out, ref, tol)
    for i, (before, now) in enumerate(zip(originals, after)):
        if not np.array_equal(before, now, equal_nan=True):
            result.passed = False
            result.message = (result.message + "; " if result.message else "") + \
                f"input {i} was modified: a stage must not write to its inputs"
    return result


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
    return results
