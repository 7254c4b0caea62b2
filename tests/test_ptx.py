"""`workbench ptx`: every stage gives a row. A stage that links CUDA C++ (``cuda.declare_device(...,
link=)``) is compiled and linked as at launch and reports its registers, or says why not; a stage with
no compiled kernel is a failed row with its reason, never an empty table; progress comes per stage."""

from __future__ import annotations

import sys
import textwrap

import pytest

from workbench import registry
from workbench.ptxcheck import FAILED, OK, SKIPPED, aligned_size, check_stages, parse_assembler_log, toolchain_missing

SAMPLES = '''
"""Stages for the PTX check's tests: one linking CUDA C++, one launching nothing, one wrong."""
import os

import numpy as np
from numba import cuda

from workbench.ladder import Operator, blocks_for

CU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "twice.cu")
# On a GPU (and in the compiler process) a foreign function; the simulator cannot run it.
_twice = cuda.declare_device("twice", "float32(float32)", link=CU)

op = Operator(
    name="ptx_link_samples", title="stages for the PTX check's tests",
    reference=lambda x: 2.0 * x.astype(np.float64),
    make_inputs=lambda size, rng: (rng.standard_normal(size[0]).astype(np.float32),),
    make_output=lambda size: np.empty(size[0], np.float32),
    bytes_moved=lambda size: 8 * size[0], flops=lambda size: size[0], validate=lambda x, out: None,
    check_sizes=[33], sim_sizes=[1, 33, 70], bench_sizes=[33], headline_size=(33,))


@cuda.jit
def _apply_twice(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = _twice(x[i])


@cuda.jit
def _zero(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 0


@op.stage("linked", "calls a function written in CUDA C++ and linked in", gpu_only="links CUDA C++")
def linked(x, out):
    if x.size % 16 == 0:  # as a launcher asking what only a GPU answers (an address) fails in the simulator
        raise AttributeError("no device address in the simulator")
    _apply_twice[blocks_for(x.size, 32), 32](x, out)


@op.stage("nothing", "launches no kernel at all", gpu_only="a GPU-only stage that forgot its launch")
def nothing(x, out):
    pass


@op.stage("wrong", "writes zeros: fails its check")
def wrong(x, out):
    _zero[blocks_for(x.size, 32), 32](x, out)
'''

TWICE_CU = '''
// numba's ABI for a foreign device function: the result through the first argument, 0 returned.
extern "C" __device__ int twice(float* result, float x)
{
    *result = 2.0f * x;
    return 0;
}
'''


@pytest.fixture
def samples(tmp_path, monkeypatch):
    """The sample module, importable here and (through PYTHONPATH) in the compiler process."""
    (tmp_path / "ptx_link_samples.py").write_text(textwrap.dedent(SAMPLES))
    (tmp_path / "twice.cu").write_text(TWICE_CU)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    import ptx_link_samples

    yield ptx_link_samples.op
    sys.modules.pop("ptx_link_samples", None)


@pytest.mark.sim_only
def test_every_stage_gets_a_row_and_a_linked_kernel_reports_its_registers(samples):
    said = []
    rows = check_stages(samples.stages, progress=said.append)
    by_stage = {}
    for r in rows:
        by_stage.setdefault(r.stage, []).append(r)
    assert list(by_stage) == [s.key for s in samples.stages]  # every stage, in order

    linked, not_collected = by_stage["ptx_link_samples.linked"]
    assert linked.kernel.endswith("_apply_twice")
    # The launcher failed at the aligned size before launching: said, not silently left out.
    assert not_collected.status == SKIPPED and "at size 80" in not_collected.message
    assert "no device address" in not_collected.message
    if linked.status == OK:
        assert linked.registers and linked.registers > 0 and linked.spill_bytes == 0
        assert linked.linked and "linked with the CUDA C++" in linked.message
    else:  # only where the compiler libraries are missing: a row that says so, not a failure
        assert linked.status == SKIPPED and "NVRTC" in linked.message, linked.message

    (nothing,) = by_stage["ptx_link_samples.nothing"]
    assert nothing.status == FAILED and "launched no kernel" in nothing.message
    (wrong,) = by_stage["ptx_link_samples.wrong"]
    assert wrong.status == FAILED and "failed its check in the simulator" in wrong.message

    assert len(said) == len(samples.stages)  # progress: one line per stage, as each finishes
    assert [line.split(":")[0] for line in said] == [s.key for s in samples.stages]


@pytest.mark.sim_only
def test_a_compile_error_in_the_linked_cpp_is_a_failed_row(samples, tmp_path):
    (tmp_path / "twice.cu").write_text(TWICE_CU.replace("return 0;", "return undeclared;"))
    row = check_stages([samples["linked"]])[0]
    assert row.status in (FAILED, SKIPPED), row.message
    if row.status == FAILED:
        assert "does not compile or link for sm_90" in row.message and "undeclared" in row.message


def test_assembler_report_and_missing_toolchain_are_read_right():
    log = ("ptxas info    : Compiling entry function '_Z1k' for 'sm_90'\n"
           "ptxas         .     16 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers, 16896 bytes smem\n")
    assert parse_assembler_log(log) == {"registers": 128, "spill_bytes": 24, "shared_bytes": 16896}
    assert parse_assembler_log("ptxas info    : Used 32 registers, used 1 barriers\n")["shared_bytes"] == 0
    assert parse_assembler_log("") == {}
    assert toolchain_missing(ImportError("no nvrtc")) and not toolchain_missing(RuntimeError("syntax error"))
    assert aligned_size((17, 33, 19)) == (32, 48, 32) and aligned_size((16,)) == (16,)


@pytest.mark.slow
@pytest.mark.sim_only
def test_gemm_stages_that_link_cpp_are_compiled_and_measured():
    """`workbench ptx gemm` once left out the two stages that link gemm_mma.cu, and `ptx gemm.tensor_core`
    printed an empty table."""
    op = registry.operator("gemm")
    linking = [s for s in op.stages if s.name in ("async_copy", "tensor_core")]
    rows = check_stages(linking)
    assert {r.stage for r in rows} == {s.key for s in linking}
    for r in rows:
        assert r.status in (OK, SKIPPED), f"{r.stage} {r.kernel}: {r.message}"
        if r.status == OK:
            assert r.linked and r.registers, r
