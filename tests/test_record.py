"""`workbench record` and `workbench targets` without a GPU: the plan's order, the budget, saving after every
item, the summary's changes beyond noise, stale ceilings, and each kind of target judged on a small
synthetic results file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench import record, results, targets
from workbench.cli import main
from workbench.ladder import Operator
from workbench.targets import MET, MISSED, NEVER, against_peer, of_ceiling

DEVICE = "NVIDIA Test GPU"
FRESH = "2026-11-28T00:00:00+00:00"
STALE = "2026-11-01T00:00:00+00:00"


def make_op(name="probe", sizes=((8,), (16,), (32,)), headline=(32,), record_all=True, **fields) -> Operator:
    op = Operator(name, "a probe", lambda x: x, None, lambda s: np.empty(s, np.float32),
                  bytes_moved=lambda s: 4 * s[0], flops=lambda s: s[0], validate=lambda *a: None,
                  check_sizes=list(sizes), sim_sizes=list(sizes), bench_sizes=list(sizes), headline_size=headline,
                  record_all_sizes=record_all, peer=lambda size: None, **fields)
    for order, stage in enumerate(("naive", "fast"), 1):
        op.stage(stage, f"the {stage} stage")(lambda x, out: None)
    return op


def rec(op, stage, size, median, date=FRESH, kind="stage", order=None, spread=0.01, gbps=1000.0, gflops=10.0):
    return {"op": op, "stage": stage, "size": list(size), "dtype": "float32", "date": date, "kind": kind,
            "order": order if order is not None else (0 if kind == "peer" else 1 + ("fast" == stage)),
            "median_us": median, "p10_us": median * (1 - spread / 2), "p90_us": median * (1 + spread / 2),
            "samples": 10, "launches_per_sample": 10, "gbps": gbps, "gflops": gflops}


def complete(op_name, size, date, naive=20.0, fast=10.0, peer=12.0):
    return [rec(op_name, "naive", size, naive, date), rec(op_name, "fast", size, fast, date),
            rec(op_name, "torch.probe", size, peer, date, kind="peer")]


def test_the_plan_puts_the_never_recorded_first_then_the_headline_then_the_stalest():
    op = make_op()
    data = {"records": complete("probe", (8,), STALE) + complete("probe", (32,), FRESH)
            + [rec("probe", "naive", (16,), 5.0, FRESH)]}  # 16: "fast" and the peer never recorded
    items = record.plan([op], data)
    assert [i.size for i in items] == [(16,), (32,), (8,)]  # among complete sizes the headline goes first
    assert items[0].missing == ["fast", "a peer"]
    # a peer missing alone (a torch.compile that failed its check) waits its turn by date
    peerless = [r for r in complete("probe", (16,), FRESH) if r["kind"] == "stage"]
    items = record.plan([op], {"records": complete("probe", (8,), STALE) + complete("probe", (32,), STALE) + peerless})
    assert [(i.size, i.missing) for i in items] == [((32,), []), ((8,), []), ((16,), ["a peer"])]
    fresh_headline = make_op(name="probe")
    items = record.plan([fresh_headline], {"records": complete("probe", (8,), STALE) + complete("probe", (16,), FRESH)})
    assert [(i.size, bool(i.missing)) for i in items] == [((32,), True), ((8,), False), ((16,), False)]  # the stalest first


def test_a_never_recorded_size_that_a_target_reads_goes_before_the_other_never_recorded_ones():
    op = make_op(targets=[against_peer(1.0, size=(8,))])  # a target reads 8, never recorded; 32 is the headline
    items = record.plan([op], {"records": []})
    assert [(i.size, i.for_target) for i in items] == [((8,), True), ((32,), False), ((16,), False)]
    # once measured, the target's size waits its turn like any other complete size
    items = record.plan([op], {"records": complete("probe", (8,), STALE)})
    assert [i.size for i in items] == [(32,), (16,), (8,)]


def test_an_items_estimate_is_its_last_run_else_a_model_of_compile_and_timing():
    op = make_op()
    timed = [dict(r, item_seconds=7.5) for r in complete("probe", (8,), STALE)]
    assert record.estimate_seconds(op, timed, with_compile=True) == 7.5
    never = record.estimate_seconds(op, [], with_compile=True)
    assert never == pytest.approx(3 * record.STAGE_SECONDS)  # two stages and the peer, no torch expression


def test_a_size_never_recorded_is_estimated_from_another_size_scaled_by_its_work():
    op = make_op()  # memory-bound: its work is its bytes, 4 per element
    at_8 = [dict(r, item_seconds=60.0) for r in complete("probe", (8,), STALE, naive=1e3, fast=5e2)]
    small = record.estimate_seconds(op, [], with_compile=True, size=(8,), elsewhere=at_8)
    big = record.estimate_seconds(op, [], with_compile=True, size=(32,), elsewhere=at_8)
    # four times the bytes: four times the timing and four times the wall time the other size took
    assert big == pytest.approx(4 * 60.0) and small == pytest.approx(60.0)
    assert big > record.estimate_seconds(op, [], with_compile=True)  # the model alone knew nothing of it
    items = record.plan([op], {"records": at_8})
    assert {i.size: round(i.estimate_s) for i in items}[(32,)] == 240


def test_an_item_that_outlasts_the_budget_is_cut_off_and_what_came_before_is_kept(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    op = make_op(record_all=False, headline=(8,), sizes=((8,),))
    results.save_records(DEVICE, [dict(r, item_seconds=0.1) for r in complete("probe", (8,), STALE)])

    def too_slow(item):  # its estimate (0.1 s, its last run) was wrong
        time.sleep(5)
        return complete("probe", item.size, FRESH), []

    began = time.monotonic()
    summary = record.record([op], 0.5, DEVICE, too_slow, say=lambda line: None)
    assert time.monotonic() - began < 2, "the run went on past its budget"
    assert summary.measured == [] and "cut off when the budget ran out" in summary.skipped[0]
    assert {r["date"] for r in results.load(results.path_for(DEVICE))["records"]} == {STALE}  # nothing lost


def test_record_saves_after_every_item_skips_what_does_not_fit_and_summarises(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    op = make_op()
    old = complete("probe", (8,), STALE, fast=10.0) + complete("probe", (32,), STALE, fast=10.0)
    results.save_records(DEVICE, old)
    now = [0.0]
    saved_before = []

    def measure(item):  # each item takes 10 s of the fake clock
        now[0] += 10
        saved_before.append(len(results.load(results.path_for(DEVICE))["records"]))
        fast = {(8,): 5.0, (16,): 10.0, (32,): 10.05}[item.size]  # 8: 2x faster; 32: within noise
        return complete("probe", item.size, "2026-11-29T00:00:00+00:00", fast=fast), []

    lines = []
    # estimates: 12 s for the first item (three callables at STAGE_SECONDS), 1.5 s for the next sizes of the
    # same operator (compiled by then): 25 s fits all three (at 20 s, 5 s are left)
    summary = record.record([op], budget_s=25, device=DEVICE, measure_item=measure, say=lines.append,
                            clock=lambda: now[0])
    # 16 (never recorded) first, then the stale headline 32, then 8: each saved before the next starts
    assert saved_before == [6, 9, 9]
    assert summary.measured == ["probe @ 16", "probe @ 32", "probe @ 8"]
    assert [(c[0], c[1]) for c in summary.changes] == [("probe @ 8", "fast")]
    assert summary.changes[0][4] == pytest.approx(1.0)
    assert any("faster than the last record" in line for line in summary.lines())
    saved = results.load(results.path_for(DEVICE))["records"]
    assert all(r["item_seconds"] == 10 for r in saved if r["date"].startswith("2026-11-29"))
    # a budget that fits nothing: every item skipped with its estimate, the never-recorded one listed
    summary = record.record([make_op(sizes=((8,), (64,)), headline=(64,))], budget_s=1, device=DEVICE,
                            measure_item=measure, say=lines.append, clock=lambda: now[0])
    assert summary.measured == [] and summary.unrecorded == ["probe @ 64"]
    assert all("s left" in s for s in summary.skipped)


def test_a_change_counts_only_beyond_both_records_spread_and_the_noise_floor():
    old = rec("probe", "fast", (8,), 100.0, spread=0.02)
    assert record.change(old, rec("probe", "fast", (8,), 98.0, spread=0.02)) is None  # 2%: noise
    assert record.change(old, rec("probe", "fast", (8,), 90.0, spread=0.02)) == pytest.approx(100 / 90 - 1)
    assert record.change(old, rec("probe", "fast", (8,), 90.0, spread=0.3)) is None  # inside the new spread
    assert record.change(old, rec("probe", "fast", (8,), 120.0)) == pytest.approx(100 / 120 - 1)


def test_ceilings_are_stale_when_missing_incomplete_other_versions_or_old():
    env = {"numba_cuda": "0.30.4", "torch": "2.11"}
    full = {k: 1.0 for k in record.PEAKS_KEYS} | {"date": results.now(), "environment": dict(env)}
    assert record.peaks_stale(full, env) is None
    assert "no ceilings" in record.peaks_stale(None, env)
    assert "read_gbps never measured" in record.peaks_stale({**full, "read_gbps": None}, env)
    assert "torch 2.11 -> 2.12" in record.peaks_stale(full, {**env, "torch": "2.12"})
    assert "older than" in record.peaks_stale({**full, "date": "2026-01-01T00:00:00+00:00"}, env)


PEAKS = {"read_gbps": 4000.0, "copy_gbps": 3800.0, "gemm_fp32_gflops": 50000.0}


def judged(op, data):
    return [targets.judge(op, t, data) for t in op.targets]


def test_targets_are_judged_met_missed_or_never_measured_on_the_records():
    op = make_op(targets=[against_peer(1.0), against_peer(1.5, "eager"), of_ceiling(20, "read_gbps"),
                          of_ceiling(20, "copy_gbps", stage="best"), against_peer(0.9, size=(8,)),
                          against_peer(1.0, "cuSPARSE*")])
    data = {"peaks": PEAKS, "records": [
        rec("probe", "naive", (32,), 20.0, gbps=1500.0), rec("probe", "fast", (32,), 10.0, gbps=1000.0),
        rec("probe", "torch.probe", (32,), 12.0, kind="peer"),
        rec("probe", "torch.compile", (32,), 9.0, kind="peer")]}
    v = judged(op, data)
    assert [x.status for x in v] == [MISSED, MISSED, MET, MET, NEVER, NEVER]
    assert v[0].peer == "torch.compile" and v[0].value == pytest.approx(0.9) and v[0].date == FRESH
    assert v[1].peer == "torch.probe" and v[1].value == pytest.approx(1.2)  # eager: torch.compile left out
    assert v[2].peer == "read_gbps" and v[2].value == pytest.approx(100 * 1000 / 4000)
    assert v[3].stage == "fast" and v[3].value == pytest.approx(100 * 1000 / 3800)  # best: the fastest stage
    assert "no record of the last stage at 8" in v[4].why
    assert "no record of cuSPARSE*" in v[5].why
    # no ceiling recorded: never measured, naming the key
    assert "no read_gbps ceiling" in targets.judge(op, op.targets[2], {"records": data["records"]}).why
    assert targets.judge(op, op.targets[0], None).status == NEVER


def test_a_ceiling_must_be_a_recorded_key():
    with pytest.raises(ValueError, match="read_gbps"):
        of_ceiling(50, "read")


def test_targets_command_prints_every_declared_target_as_json(capsys):
    assert main(["targets", "reduction[sum]", "--json"]) == 0  # one variant (the family's default)
    found = json.loads(capsys.readouterr().out)
    assert [v["target"] for v in found] == ["last stage >= 1.00x the best peer at 268435456",
                                            "last stage >= 90% of the copy ceiling at 268435456"]
    assert all(v["status"] in (MET, MISSED, NEVER) for v in found)
    assert main(["targets", "reduction", "--json"]) == 0  # the family: every variant's targets
    family = json.loads(capsys.readouterr().out)
    assert {v["op"] for v in family} > {"reduction", "reduction[cols]"} and found == family[:2]


def test_every_operator_one_gpu_runs_declares_its_targets_in_the_registry():
    from workbench import registry

    declared = {op.name for op in registry.load_operators().values() if op.targets}
    assert {"reduction", "gemm[fp16]", "gemm[bf16]", "decode_attention", "histogram", "gemm", "spmv", "conv2d",
            "layernorm", "rmsnorm", "batchnorm[train]", "reduction[cols]", "transpose"} <= declared


def test_record_refuses_a_bad_budget_and_an_unknown_family_and_plans_without_a_gpu(capsys):
    assert main(["record", "--budget", "0"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["record", "nosuchop"]) == 2
    assert main(["record", "reduction", "--dry-run"]) == 0
    assert "reduction @ 268435456" in capsys.readouterr().out
    assert main(["record", "reduction"]) == 2  # the simulator: no timings


def test_a_stage_target_compares_two_stages_of_the_ladder_at_one_size():
    from workbench.targets import against_stage

    op = make_op(targets=[against_stage(1.5, "naive"), against_stage(3.0, "naive"), against_stage(1.0, "nope")])
    data = {"records": [rec("probe", "naive", (32,), 20.0), rec("probe", "fast", (32,), 10.0)]}
    v = judged(op, data)
    assert [x.status for x in v] == [MET, MISSED, NEVER]
    assert v[0].value == pytest.approx(2.0) and v[0].peer == "naive" and v[0].unit == "x"
    assert "no record of stage nope" in v[2].why


def test_every_recorded_stage_has_its_place_in_the_ladder_today(tmp_path):
    """A stage inserted into a ladder (gemm's warp_tiles before the tensor-core stages) moves the stages
    after it; the records measured before must move too, or tables, plots and the "last stage" targets
    read the old places. registry.renumber_recorded_stages puts them right."""
    from workbench import paths, registry

    committed = paths.REPO_ROOT / "results"
    files = sorted(committed.glob("*.json")) + sorted((committed / "profiles").glob("*.json"))
    for path in files:
        wrong = registry.stages_out_of_place(json.loads(path.read_text()).get("records", []))
        assert not wrong, (f"{path.name}: {len(wrong)} stage records out of place, e.g. {wrong[0]['op']}."
                           f"{wrong[0]['stage']} at {wrong[0]['order']}: run registry.renumber_recorded_stages")
    gemm = registry.operator("gemm")
    moved = tmp_path / "r.json"
    moved.write_text(json.dumps({"records": [
        {"op": "gemm", "stage": "tensor_core", "kind": "stage", "order": 1},
        {"op": "gemm", "stage": "torch.addmm", "kind": "peer", "order": 0},
        {"op": "gemm", "stage": "a_stage_since_removed", "kind": "stage", "order": 4},
        {"op": "gemm", "stage": "split_k", "order": 2}]}))  # a profile record: no kind
    assert registry.renumber_recorded_stages([moved]) == 2
    orders = [r["order"] for r in json.loads(moved.read_text())["records"]]
    assert orders == [gemm["tensor_core"].order, 0, 4, gemm["split_k"].order]
