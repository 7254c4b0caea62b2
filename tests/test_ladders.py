"""Every stage of every operator in the registry: correct, compiled for sm_90, and (on a GPU) correct at
the operator's check sizes. A new ``solutions/<op>.py`` is tested here without a line of its own;
``tests/test_<op>.py`` keeps only what is specific to an operator.

Tiers: the quick tier (the default) checks each stage once, with random inputs at the operator's quick size
(``Operator.quick_sim_size``: by convention not a multiple of any block or tile, so every edge path runs),
and the last stage, the one a user calls, with the operator's adversarial inputs too; ``-m slow`` checks
every stage at every simulator size with the adversarial inputs (what the quick tier leaves out) and
compiles every kernel for sm_90 (``workbench ptx``): both marked ``exhaustive``, which ``--part K/N`` runs a
part at a time (``.ci/run`` runs a third).
``-m gpu`` checks every check size on a GPU, and the headline size of the operators that the timing
tests time there without checking again (tests/headline.py TIMED_AT_HEADLINE), except that a first ("naive") stage skips the largest check size, where it takes
seconds a call and teaches nothing new. Every stage of an operator is checked on the same inputs, and
their float64 reference is computed once per worker (``_cases``); ``pytest -m gpu -n 12 --dist
loadgroup`` keeps two stages of an operator on one worker (tests/conftest.py groups them), so that it is
once per two stages.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.headline import TIMED_AT_HEADLINE
from workbench.check import adversarial_cases, check_stage, gpu_check_sizes
from workbench.ladder import as_size, size_label
from workbench.ptxcheck import check_stages
from workbench.registry import load_operators

OPS = load_operators()
SPILL_BUDGET = 128  # bytes of spill traffic a kernel may have
# Stages whose spill is part of their lesson, each with the bound it must stay under: hgemm's stage 2
# builds its mma fragments element by element (24 shared loads per 16 mma, their addresses live in
# registers); at 255 registers ptxas 13 spills 184 bytes, and stage 3 (ldmatrix) is what removes it.
SPILL_EXPECTED = {"gemm[fp16].mma": 256, "gemm[bf16].mma": 256}
STAGES = [s for op in OPS.values() for s in op.stages]


def _failures(results) -> list[str]:
    return [f"{r.key} @ {size_label(tuple(r.size))} ({r.inputs}): {r.message}" for r in results if r.failed]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.key)
def test_stage_correct_in_the_simulator(stage):
    rng = np.random.default_rng(1)
    size = stage.op.quick_sim_size()
    results = [check_stage(stage, size, rng)]
    if stage is stage.op.stages[-1]:
        results += [check_stage(stage, size, inputs=inputs, label=label)
                    for label, inputs in adversarial_cases(stage.op, size, rng)]
    assert not _failures(results), "\n".join(_failures(results))
    if stage.gpu_only:
        assert all(r.skipped and stage.gpu_only in r.message for r in results)


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.key)
def test_stage_correct_at_every_simulator_size(stage):
    rng = np.random.default_rng(2)
    results = []
    for size in stage.op.sim_sizes:
        results.append(check_stage(stage, size, rng))
        results += [check_stage(stage, size, inputs=inputs, label=label)
                    for label, inputs in adversarial_cases(stage.op, size, rng)]
    assert not _failures(results), "\n".join(_failures(results))


@pytest.mark.slow  # NVVM and ptxas on every kernel of every ladder: minutes on two cores
@pytest.mark.exhaustive
@pytest.mark.sim_only
@pytest.mark.parametrize("op", list(OPS.values()), ids=lambda op: op.name)
def test_every_kernel_compiles_for_sm90_with_little_spill(op):
    reports = check_stages(op.stages)
    compiled = {r.stage for r in reports}
    missing = [s.key for s in op.stages if s.key not in compiled]
    assert not missing, f"stages with no compiled kernel: {missing}"
    bad = [f"{r.stage} {r.kernel}: {r.message}" for r in reports if r.failed]
    assert not bad, "\n".join(bad)
    # gemm's register-tiled kernels cap registers with launch_bounds at the price of a few spilled bytes;
    # more than that is a regression.
    spills = [f"{r.stage} {r.kernel}: {r.spill_bytes} B" for r in reports
              if (r.spill_bytes or 0) > SPILL_EXPECTED.get(r.stage, SPILL_BUDGET)]
    assert not spills, f"register spills over {SPILL_BUDGET} bytes (or a stage's bound in SPILL_EXPECTED): {spills}"


def test_every_operator_is_complete():
    """What a ladder needs to be listed, checked, measured, graded and shown."""
    problems = []
    for op in OPS.values():
        if not op.stages:
            problems.append(f"{op.name}: no stages")
        if len(op.sim_sizes) < 2:
            problems.append(f"{op.name}: give at least two simulator sizes (one not a multiple of any block)")
        if as_size(op.headline_size) not in [as_size(s) for s in op.bench_sizes]:
            problems.append(f"{op.name}: the headline size {op.headline_size} is not among its bench sizes")
        for s in op.stages:
            if len(s.summary.split()) < 12:
                problems.append(f"{s.key}: its paragraph should say what changed and why ({s.summary!r})")
        declared = [*op.sim_sizes, *op.check_sizes, *op.bench_sizes, op.headline_size, op.quick_sim_size()]
        dims = {len(as_size(s)) for s in declared}
        if dims != {len(op.dims)}:
            problems.append(f"{op.name}: sizes of different lengths {sorted(dims)} for the form {op.size_form}")
    assert not problems, "\n".join(problems)


def gpu_sizes(stage) -> list[tuple]:
    sizes = gpu_check_sizes(stage)
    headline = as_size(stage.op.headline_size)
    if stage.op.name in TIMED_AT_HEADLINE and headline not in sizes:
        sizes.append(headline)
    return sizes


_CASES: dict = {}  # (operator, size, adversarial?) -> [(label, inputs, reference)]: one operator's at a time


def _cases(op, size: tuple, adversarial: bool) -> list[tuple[str, tuple, np.ndarray]]:
    """The inputs every stage of ``op`` is checked on at ``size``, with their reference, computed once:
    the inputs are drawn from a seed made of the size, so any stage, on any worker, gets the same."""
    if any(key[0] != op.name for key in _CASES):
        _CASES.clear()  # keep one operator's cases in memory (at 2^28 floats they are gigabytes)
    key = (op.name, size, adversarial)
    if key not in _CASES:
        rng = np.random.default_rng([3, *size])
        cases = [("random", op.make_inputs(size, rng))]
        if adversarial:
            cases = adversarial_cases(op, size, rng)
        _CASES[key] = [(label, inputs, op.reference(*inputs)) for label, inputs in cases]
    return _CASES[key]


@pytest.mark.gpu
@pytest.mark.gpu_lock_per_run  # its CPU work (references, comparisons) runs while others measure
@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.key)
def test_stage_correct_on_the_gpu(stage):
    sizes = gpu_sizes(stage)
    mid = as_size(stage.op.check_sizes[len(stage.op.check_sizes) // 2])
    cases = [(size, case) for size in sizes for case in _cases(stage.op, size, adversarial=False)]
    cases += [(mid, case) for case in _cases(stage.op, mid, adversarial=True)]
    results = [check_stage(stage, size, inputs=inputs, label=label, reference=ref)
               for size, (label, inputs, ref) in cases]
    assert not _failures(results), "\n".join(_failures(results))
    assert not any(r.skipped for r in results)
