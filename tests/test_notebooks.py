"""The notebooks: built from the registry, valid, executable on CPU (simulator), and committed up to date.

Execution runs each notebook in a fresh ipykernel (the venv's interpreter) with ``WORKBENCH_MODE=sim``
and the two smallest simulator sizes, against a results directory of synthetic GPU records so the
plotting path runs too (and once against an empty one: the "no recorded figures yet" path).
"""

import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from workbench import notebook
from workbench.ladder import as_size, load_operators, size_label

OPS = load_operators()
REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "notebooks"
NB_ENV = {"WORKBENCH_MODE": "sim", "WORKBENCH_NOTEBOOK_SIM_SIZES": "2"}
CELL_TIMEOUT_S = 150


# -- synthetic GPU records: every stage and a peer at every bench size ----------------------------------

PEAKS = {"copy_gbps": 4046.0, "gemm_fp32_gflops": 50900.0, "gemm_tf32_gflops": 350000.0,
         "date": "2026-01-01T00:00:00+00:00"}


def fake_records(op):
    """Plausible records (a ladder that climbs towards the peak) in the schema bench.py writes."""
    records = []
    n = len(op.stages)
    sizes = [as_size(s) for s in op.bench_sizes]
    if as_size(op.headline_size) not in sizes:
        sizes.append(as_size(op.headline_size))
    for size in sizes:
        b, f = int(op.bytes_moved(size)), int(op.flops(size))
        peer_us = None
        for order, name, frac, kind, traffic in (
                [(0, "library.peer", 0.9, "peer", b)]
                + [(s.order, s.name, 0.05 + 0.85 * s.order / n, "stage", s.traffic(size)) for s in op.stages]):
            if op.bound == "compute":
                us = 3.0 + f / (frac * PEAKS["gemm_fp32_gflops"]) / 1e3
            else:
                us = 3.0 + traffic / (frac * PEAKS["copy_gbps"]) / 1e3
            gbps, gflops = b / us / 1e3, f / us / 1e3
            pct = 100 * (gflops / PEAKS["gemm_fp32_gflops"] if op.bound == "compute" else gbps / PEAKS["copy_gbps"])
            rec = {"device": "Test GPU", "versions": {"numba_cuda": "0.30.4", "numba": "0.61", "torch": "2.9"},
                   "date": "2026-01-01T00:00:00+00:00", "op": op.name, "size": list(size),
                   "size_label": size_label(size), "dtype": "float32", "median_us": us, "p10_us": us * 0.98,
                   "p90_us": us * 1.02, "min_us": us * 0.97, "samples": 25, "launches_per_sample": 10,
                   "host_call_us": us + 20, "bytes": b, "stage_bytes": traffic, "flops": f, "gbps": gbps,
                   "stage_gbps": traffic / us / 1e3, "gflops": gflops, "pct_of_peak": pct,
                   "peak_kind": "gemm_fp32_gflops" if op.bound == "compute" else "copy_gbps",
                   "stage": name, "order": order, "kind": kind, "rel_err": 1e-7}
            if kind == "peer":
                peer_us = us
            else:
                rec["summary"] = ""
                rec["peer"] = {"name": "library.peer", "median_us": peer_us, "gbps": b / peer_us / 1e3,
                               "gflops": f / peer_us / 1e3, "host_call_us": peer_us + 20}
            records.append(rec)
    return records


@pytest.fixture(scope="module")
def fake_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    data = {"schema": 1, "device": "Test GPU", "peaks": PEAKS,
            "records": [r for op in OPS.values() for r in fake_records(op)]}
    (d / "test-gpu.json").write_text(json.dumps(data))
    return d


def _outputs(nb):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            yield cell, out


def _text(nb) -> str:
    parts = []
    for _, out in _outputs(nb):
        parts.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _execute(nb, tmp_path, results_dir):
    start = time.perf_counter()
    notebook.execute_notebook(nb, tmp_path, timeout=CELL_TIMEOUT_S,
                              env={**NB_ENV, "WORKBENCH_RESULTS": str(results_dir)})
    errors = [f"{''.join(c.source)[:80]!r}: {o.get('ename')}: {o.get('evalue')}"
              for c, o in _outputs(nb) if o.output_type == "error"]
    assert not errors, "\n".join(errors)
    return time.perf_counter() - start


# -- building ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(OPS))
def test_built_notebook_is_valid_and_walks_every_stage(name):
    op = OPS[name]
    nb = notebook.build_notebook(op)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    assert len({c.id for c in nb.cells}) == len(nb.cells)
    assert nb.cells[0].source.startswith(f"# {op.title}")
    for stage in op.stages:
        ref = f"op[{stage.name!r}]"
        for call in (f"nb.show_source({ref})", f"nb.check({ref})", f"nb.progress(op, upto={stage.name!r})"):
            assert call in sources, f"{name}: no cell {call}"
        assert any(s.startswith(f"## {stage.order}. `{stage.name}`") and stage.summary in s for s in sources)
    for call in ("nb.progress(op)", "nb.bytes_per_stage(op)", "nb.ladder_table(op)", "nb.about_mode()"):
        assert any(call in s for s in sources), call
    assert any("workbench.MODE" in s for s in sources)


def test_numbering_follows_ladder_order():
    import solutions

    names = list(notebook.build_all_notebooks())
    assert names[0] == notebook.START_HERE and names[-1] == notebook.COMPARE_ALL
    ordered = [n for n in solutions.LADDER_ORDER if n in OPS]
    extra = sorted(n for n in OPS if n not in ordered)  # modules not in LADDER_ORDER follow, never 90 or 99
    for i, op_name in enumerate(ordered + extra):
        assert f"{i + 1:02d}_{op_name}.ipynb" in names
    assert "01_reduction.ipynb" in names and "09_gemm.ipynb" in names
    assert not any(n.startswith("90_") for n in names)


def test_model_text_reads_the_models():
    assert notebook.model_text(OPS["reduction"].bytes_moved) == "4 * size[0] + 4"
    assert notebook.model_text(OPS["reduction"].flops) == "size[0]"
    for op in OPS.values():  # every operator's models can be quoted in its notebook
        assert notebook.model_text(op.bytes_moved), f"{op.name}: bytes model unreadable"
        assert notebook.model_text(op.flops), f"{op.name}: flops model unreadable"


def test_build_all_keeps_outputs_and_refuses_to_overwrite_hand_edits(tmp_path):
    logs = []
    written = notebook.build_all(tmp_path, execute=False, only=["reduction"], log=logs.append)
    assert [p.name for p in written] == ["01_reduction.ipynb"]
    stale = notebook.stale_notebooks(tmp_path)
    assert "01_reduction.ipynb" not in stale and notebook.START_HERE in stale
    from workbench.cli import main

    assert main(["notebooks", "check", "--out", str(tmp_path)]) == 1
    path = written[0]
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="kept\n")]
    nbformat.write(nb, path)
    assert notebook.build_all(tmp_path, only=["reduction"], log=logs.append) == []  # unchanged: left alone
    assert nbformat.read(path, as_version=4).cells[2].outputs[0]["text"] == "kept\n"
    nb.cells[2].source += "\nprint('mine')"
    nbformat.write(nb, path)
    with pytest.raises(notebook.HandEdited):
        notebook.build_all(tmp_path, only=["reduction"], log=logs.append)
    assert notebook.build_all(tmp_path, only=["reduction"], force=True, log=logs.append) == [path]


# -- the committed notebooks match the builder ----------------------------------------------------------

@pytest.mark.parametrize("name", list(notebook.build_all_notebooks()))
def test_committed_notebook_is_up_to_date(name):
    path = COMMITTED / name
    fix = "regenerate with `workbench notebooks build --execute` (on CPU it runs them in the simulator)"
    assert path.exists(), f"{path} is missing: {fix}"
    committed = nbformat.read(path, as_version=4)
    assert notebook.cell_sources(committed) == notebook.cell_sources(notebook.build_all_notebooks()[name]), \
        f"{path} differs from what solutions/ generates: {fix}"
    assert notebook.source_hash(committed) == committed.metadata["workbench"]["source_hash"]


def test_committed_reduction_notebook_is_executed():
    nb = nbformat.read(COMMITTED / "01_reduction.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("outputs") for c in code), "every code cell of the committed notebook shows its output"
    assert not any(o.output_type == "error" for _, o in _outputs(nb))


# -- executing (CPU, simulator) -------------------------------------------------------------------------

# Executing a notebook costs a kernel start plus every check and figure (5-15 s on 2 cores): the full run
# covers one ladder of each kind (memory-bound, with per-stage traffic, compute-bound); the others are
# built and validated above, and their figures drawn in-process below. WORKBENCH_NOTEBOOK_TEST_ALL=1
# executes every one.
EXECUTED = [n for n in OPS if os.environ.get("WORKBENCH_NOTEBOOK_TEST_ALL")] or \
    [n for n in ("reduction", "elementwise", "gemm") if n in OPS]


@pytest.mark.parametrize("name", EXECUTED)
def test_notebook_executes_on_cpu_with_recorded_figures(name, tmp_path, fake_results):
    op = OPS[name]
    nb = notebook.build_notebook(op)
    took = _execute(nb, tmp_path, fake_results)
    text = _text(nb)
    assert "workbench.MODE = 'sim'" in text
    # every stage's check ran (or was skipped for a GPU-only stage) and every progress cell drew a figure
    for stage in op.stages:
        assert f"{stage.key} in the simulator" in text
    images = [c for c, o in _outputs(nb) if "image/png" in o.get("data", {})]
    assert len(images) >= len(op.stages) + 2, f"only {len(images)} figures"
    assert "No recorded figures" not in text  # the records were found
    print(f"{name}: executed in {took:.1f} s")


@pytest.mark.parametrize("name", list(OPS))
def test_figures_draw_for_every_stage(name, fake_results, monkeypatch):
    """What the progress/roofline/bytes/table cells show, drawn in this process from synthetic records."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("WORKBENCH_RESULTS", str(fake_results))
    monkeypatch.setattr(notebook, "LIVE", False)
    shown = []
    monkeypatch.setattr(notebook, "_display", shown.append)
    op = OPS[name]
    notebook.progress(op, upto=op.stages[0].name)  # the first section's figure: one stage so far
    notebook.progress(op)
    notebook.roofline(op)
    notebook.bytes_per_stage(op)
    notebook.ladder_table(op)
    notebook.models(op)
    figures = [x.figure for x in shown if isinstance(x, notebook.Picture)]
    assert all(x.png.startswith(b"\x89PNG") for x in shown if isinstance(x, notebook.Picture))
    assert len(figures) == 4
    first, last = figures[0], figures[1]
    assert len(first.axes[0].patches) == 1  # the staircase so far
    assert len(last.axes[0].patches) == len(op.stages)  # the whole ladder
    assert "Test GPU, recorded 2026-01-01" in last.axes[0].get_title()
    assert any(type(x).__name__ == "Markdown" and "library.peer" in x.data for x in shown)


def test_reduction_notebook_says_when_there_are_no_recorded_figures(tmp_path):
    nb = notebook.build_notebook(OPS["reduction"])
    _execute(nb, tmp_path, tmp_path / "empty-results")
    text = _text(nb)
    assert "No recorded figures yet for reduction" in text
    # the bytes-per-stage bars need no recording: they come from the models
    assert any("image/png" in o.get("data", {}) for _, o in _outputs(nb))


@pytest.mark.parametrize("which", ["start", "compare"])
def test_start_here_and_compare_all_execute(which, tmp_path, fake_results):
    ops = load_operators()
    nb = notebook.build_start_here(ops) if which == "start" else notebook.build_compare_all(ops)
    nbformat.validate(nb)
    _execute(nb, tmp_path, fake_results)
    text = _text(nb)
    if which == "compare":
        for name in OPS:  # (a module added since this test started may be listed without records)
            assert name in text
        assert any("image/png" in o.get("data", {}) for _, o in _outputs(nb))
        assert text.count("no recorded figures yet") <= len(load_operators()) - len(OPS)


def test_live_figures_measure_each_stage_once(monkeypatch):
    """On a GPU, progress() times the stages so far now: each stage (and the peer) once per size,
    then reuses the figures; a stage that fails its check is reported, not timed again."""
    import matplotlib

    matplotlib.use("Agg")
    from workbench import bench, device, results

    op = OPS["reduction"]
    calls = []

    def fake_bench_size(op_, stages, size, peaks, rng, env, progress=None, with_peer=True):
        calls.append(([s.name for s in stages], tuple(size), with_peer))
        recs = [dict(r, date="2026-01-02T00:00:00+00:00") for r in fake_records(op_) if r["size"] == list(size)
                and (r["stage"] in [s.name for s in stages if s.name != "coalesced"]
                     or (with_peer and r["kind"] == "peer"))]
        fails = [f"{op_.name}.coalesced @ {size}: wrong"] if any(s.name == "coalesced" for s in stages) else []
        return recs, fails

    monkeypatch.setattr(device, "is_simulator", lambda: False)
    monkeypatch.setattr(device, "mode", lambda: "gpu")
    monkeypatch.setattr(bench, "bench_size", fake_bench_size)
    monkeypatch.setattr(results, "environment", lambda: {"device": "Test GPU"})
    monkeypatch.setattr(notebook, "LIVE", True)
    monkeypatch.setattr(notebook, "_LIVE_CACHE", {})
    monkeypatch.setattr(notebook, "_LIVE_ENV", {"peaks": PEAKS})
    shown = []
    monkeypatch.setattr(notebook, "_display", shown.append)

    sizes = notebook._live_sizes(op)
    assert len(sizes) == notebook.LIVE_SIZES and as_size(op.headline_size) in sizes
    notebook.progress(op, upto="naive")
    assert calls == [(["naive"], s, True) for s in sizes]
    notebook.progress(op, upto="coalesced")
    notebook.progress(op, upto="shared_tree")
    assert [c[0] for c in calls[len(sizes):]] == [["coalesced"]] * len(sizes) + [["shared_tree"]] * len(sizes)
    assert not any(c[2] for c in calls[len(sizes):])  # the peer is timed once per size
    data, live, _ = notebook.figures(op, upto="shared_tree")
    assert live and {r["stage"] for r in data["records"]} == {"naive", "shared_tree", "library.peer"}
    fig = [x.figure for x in shown if isinstance(x, notebook.Picture)][-1]
    assert "measured now 2026-01-02" in fig.axes[0].get_title()
