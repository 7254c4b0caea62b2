"""Variants are axes of one family: one name for a variant everywhere (``softmax[bf16].rows_in_flight``), parsed
and put in canonical order by the registry, records made under the old names read under the new ones, and the
terminal printing the brackets as written."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from workbench import registry, results, tables
from workbench.cli import main
from workbench.console import console
from workbench.ladder import AXES, Operator, variant_name


def test_a_variant_is_named_by_its_values_in_the_axes_order_defaults_left_out():
    assert variant_name("softmax", {}) == "softmax"
    assert variant_name("softmax", {"dtype": "fp32"}) == "softmax"
    assert variant_name("activation", {"dtype": "fp16", "function": "gelu"}) == "activation[gelu,fp16]"
    assert variant_name("reduction", {"axis": "rows", "combine": "max"}) == "reduction[max,rows]"
    op = Operator("probe", "a probe", None, None, None, bytes_moved=len, flops=len, validate=None, check_sizes=[],
                  sim_sizes=[], bench_sizes=[], headline_size=(1,), variant={"dtype": "bf16", "fusion": "rope"})
    assert (op.family, op.name, op.slug, op.variant_values) == ("probe", "probe[rope,bf16]", "probe-rope-bf16",
                                                                 ["rope", "bf16"])
    with pytest.raises(ValueError, match="an axis is one of"):
        Operator("probe", "a probe", None, None, None, bytes_moved=len, flops=len, validate=None, check_sizes=[],
                 sim_sizes=[], bench_sizes=[], headline_size=(1,), variant={"colour": "red"})


def test_every_value_names_one_axis_so_a_name_need_not_say_which():
    seen: dict[str, str] = {}
    for op in registry.load_operators().values():
        for axis, value in op.variant.items():
            assert seen.setdefault(value, axis) == axis, f"{value!r} is on two axes: {seen[value]} and {axis}"
    assert not set(seen) & {d for d in AXES.values() if d} - {v for a, v in AXES.items() if seen.get(v) == a}


def test_the_registry_reads_a_name_in_any_order_with_or_without_defaults():
    assert registry.canonical_name("reduction[rows,max]") == "reduction[max,rows]"
    assert registry.canonical_name("softmax[fp32]") == "softmax"
    assert registry.operator("reduction[sum,rows]").name == "reduction[rows]"
    op, (stage,) = registry.resolve("softmax[bf16].rows_in_flight")
    assert (op.name, stage.key) == ("softmax[bf16]", "softmax[bf16].rows_in_flight")
    assert registry.split_target("reduction[max,rows].warp_per_row") == ("reduction[max,rows]", "warp_per_row")


def test_a_wrong_name_gets_one_line_naming_what_exists():
    with pytest.raises(registry.UnknownTarget, match=re.escape("softmax's variants: softmax, softmax[fp16]")):
        registry.operator("softmax[int8]")
    with pytest.raises(registry.UnknownTarget, match=re.escape("it is now called 'activation[gelu,fp16]'")):
        registry.resolve("act_gelu_fp16.in_flight")
    with pytest.raises(registry.UnknownTarget, match="activation's variants: activation\\[relu\\]"):
        registry.operator("activation")  # a family whose every variant names its function has no default
    with pytest.raises(registry.UnknownTarget, match="FAMILY or FAMILY\\[VALUE"):
        registry.operator("softmax[bf16")


def test_a_familys_name_stands_for_all_its_variants_where_a_command_takes_families():
    assert [op.name for op in registry.operators_named("softmax")] == ["softmax", "softmax[fp16]", "softmax[bf16]"]
    assert [op.name for op in registry.operators_named("softmax[bf16]")] == ["softmax[bf16]"]
    assert len(registry.operators_named("activation")) == 21
    assert len(registry.families()) <= 50


def test_no_operator_name_encodes_a_dtype_or_a_function_of_another():
    for name in registry.load_operators():
        family = name.partition("[")[0]
        assert not re.search(r"(^|_)(fp16|bf16|fp32|int8|f16|bf)(_|$)", family), name
        assert not family.startswith(("act_", "reduce_", "sum_", "amax_", "amin_", "mean_")), name
        assert family not in ("hgemm", "maxpool2d", "avgpool2d") and "_nhwc" not in family, name


def test_records_under_an_old_name_are_read_under_the_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    old = {"schema": results.SCHEMA, "device": "Test GPU", "peaks": {},
           "records": [{"op": "act_gelu_fp16", "stage": "in_flight", "size": [8]},
                       {"op": "amax_rows", "stage": "warp_per_row", "size": [2, 3]},
                       {"op": "softmax", "stage": "naive", "size": [2, 3]}]}
    (tmp_path / "test-gpu.json").write_text(json.dumps(old))
    loaded = results.load(tmp_path / "test-gpu.json")
    assert [r["op"] for r in loaded["records"]] == ["activation[gelu,fp16]", "reduction[max,rows]", "softmax"]
    assert set(results.RENAMED.values()) <= set(registry.load_operators())  # every old name lands on an operator


def test_the_committed_records_use_todays_names():
    on_disk = json.loads((results.results_dir() / "nvidia-h200.json").read_text())
    assert not {r["op"] for r in on_disk["records"]} & set(results.RENAMED)


def test_the_terminal_prints_a_variants_brackets_and_keeps_its_own_markup():
    buf = io.StringIO()
    out = console(file=buf, width=100, color_system=None)
    out.print("[yellow]checking[/] softmax[bf16].packed and reduction[max,rows]")
    assert buf.getvalue().strip() == "checking softmax[bf16].packed and reduction[max,rows]"
    out.print("1. gemm[int8] @ 1024x1024x1024", markup=False)  # (record --dry-run printed gemm\\[int8])
    assert buf.getvalue().splitlines()[-1] == "1. gemm[int8] @ 1024x1024x1024"


def test_which_variants_each_stage_serves_is_said_by_the_axes():
    table = tables.stages_served_table(registry.chapter("14").operators)
    assert "| `thread_per_element` | dtype fp32 |" in table
    assert "| `short_erfc` | function gelu |" in table  # every dtype of GELU
    assert "except `activation[tanh,fp16]`" in table  # fast_math: every transcendental one but fp16 tanh
    softmax = tables.stages_served_table(registry.chapter("21").operators)
    assert "| `naive` | `softmax` |" in softmax and "| `packed` | dtype fp16, bf16 |" in softmax


def test_list_shows_the_families_and_a_familys_stages_by_variant(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\d+ families, \d+ variants", out) and "reduction[max,rows]" in out
    assert main(["list", "activation"]) == 0
    out = capsys.readouterr().out
    assert "which variants each stage serves" in out and "activation[gelu,bf16]" in out
    assert main(["list", "act_relu"]) == 2
    assert "it is now called 'activation[relu]'" in capsys.readouterr().err
    assert main(["list", "softmax[int8]"]) == 2  # a variant that does not exist: the family's variants named
    assert "softmax's variants: softmax, softmax[fp16]" in " ".join(capsys.readouterr().err.split())


def test_a_variant_checks_in_the_simulator_by_its_name(capsys):
    assert main(["check", "reduction[rows,max].warp_per_row", "--size", "3x37"]) == 0
    assert "2 passed, 0 failed" in capsys.readouterr().out


def test_plots_are_named_by_slug():
    op = registry.operator("activation[gelu,fp16]")
    assert op.slug == "activation-gelu-fp16"
    assert np.all([p.name.startswith(op.slug + "_") for p in tables.committed_plots(op)])


def test_the_graders_report_names_a_variants_stage_as_written():
    from workbench.grade.report import CaseResult, Report, StageGrade

    ok = CaseResult("softmax[fp16].widened", [3, 38], "passed", "", "")
    report = Report("solutions", "sim", 1, stages=[StageGrade("softmax[fp16].widened", 1, "passed", [ok])])
    assert "softmax[fp16].widened" in report.text()
