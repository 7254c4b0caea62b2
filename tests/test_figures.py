"""Every figure reads at the width JupyterLab and GitHub show it (about 1000 px).

Each kind of figure is drawn for every operator from the recorded ``results/nvidia-h200.json`` (five
of them in the quick tier, all with ``-m slow``), the way notebooks and the README draw them (``plots.ladder_figure``, ``plots.png``'s tight box), and measured:
its width in pixels, its smallest text in pixels once shrunk to 1000 px, legends clear of the data,
staircase bar labels never crossed by the peak or peer lines, titles that say the size in words, and
one latency line per shape family.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Annotation, Text  # noqa: E402

from workbench import nb, plots, registry, results  # noqa: E402

RECORDED = Path(__file__).resolve().parent.parent / "results" / "nvidia-h200.json"
DATA = results.load(RECORDED)
OPS = [op for op in registry.load_operators().values() if results.records_for(op.name, DATA)]
PAGE_PX = 1000
MIN_TEXT_PX = 9.0


# -- measuring a drawn figure ---------------------------------------------------------------------

def drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def saved_width_px(fig, renderer) -> float:
    """The width of the PNG that plots.png writes: the tight box plus its padding, at the figure's dpi."""
    box = fig.get_tightbbox(renderer)
    return (box.width + 2 * plots.PNG_PAD_IN) * fig.dpi


def visible_texts(fig) -> list[Text]:
    """Every text a figure holds (tick labels of ticks out of view included: stricter, never looser)."""
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def smallest_text_px(fig, renderer) -> tuple[float, str]:
    scale = min(1.0, PAGE_PX / saved_width_px(fig, renderer))
    sizes = [(t.get_fontsize() * fig.dpi / 72 * scale, t.get_text()) for t in visible_texts(fig)]
    return min(sizes)


def legends(fig) -> list:
    out = list(fig.legends)
    for sub in fig.subfigs:
        out += sub.legends
    out += [ax.get_legend() for ax in fig.get_axes() if ax.get_legend() is not None]
    return out


def data_boxes(ax):
    """Display-space points and boxes of what an axes plots: line vertices, scatter points, bars."""
    points, boxes = [], []
    for line in ax.get_lines():
        xy = line.get_xydata()
        if len(xy):
            points += [tuple(p) for p in line.get_transform().transform(xy)]
    for coll in ax.collections:
        offsets = coll.get_offsets()
        if len(offsets):
            points += [tuple(p) for p in coll.get_offset_transform().transform(offsets)]
    for patch in ax.patches:
        if isinstance(patch, Rectangle):  # as drawn: clipped to the axes (a log axis has no 0 to start from)
            shown = Bbox.intersection(patch.get_window_extent(), ax.bbox)
            if shown is not None:
                boxes.append(shown)
    inside = [p for p in points if ax.bbox.contains(*p)]
    return inside, boxes


def assert_legends_clear_of_data(fig, renderer, what: str) -> None:
    for legend in legends(fig):
        box = legend.get_window_extent(renderer)
        for ax in fig.get_axes():
            points, bars = data_boxes(ax)
            inside = [p for p in points if box.contains(*p)]
            assert not inside, f"{what}: the legend covers {len(inside)} data point(s)"
            assert not any(box.overlaps(b) for b in bars), f"{what}: the legend covers a bar"


def horizontal_lines(ax) -> list[Line2D]:
    return [line for line in ax.get_lines() if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) >= 2]


def assert_bar_labels_not_struck_through(ax, renderer, what: str) -> None:
    for label in [t for t in ax.texts if isinstance(t, Annotation)]:
        box = label.get_window_extent(renderer)
        for line in horizontal_lines(ax):
            y = ax.transData.transform((0, line.get_ydata()[0]))[1]
            if box.y0 < y < box.y1:  # the line runs through the label's height: it must pass behind it
                patch = label.get_bbox_patch()
                assert patch is not None and patch.get_facecolor()[3] > 0.5, \
                    f"{what}: {label.get_text()!r} is struck through by {line.get_label()!r}"
                assert label.get_zorder() > line.get_zorder(), f"{what}: {line.get_label()!r} is drawn over a label"


def check_legible(fig, what: str) -> None:
    renderer = drawn(fig)
    width = saved_width_px(fig, renderer)
    assert 600 <= width <= 1100, f"{what}: {width:.0f} px wide (made for about {PAGE_PX})"
    px, text = smallest_text_px(fig, renderer)
    assert px >= MIN_TEXT_PX, f"{what}: {text!r} is {px:.1f} px tall at {PAGE_PX} px wide"
    assert_legends_clear_of_data(fig, renderer, what)
    for ax in fig.get_axes():
        assert_bar_labels_not_struck_through(ax, renderer, what)


# -- every figure of every recorded operator ----------------------------------------------------------

# The quick tier draws two ladders (shape families and per-stage traffic; compute-bound fp16); -m slow
# draws every recorded operator.
QUICK = {"softmax", "gemm[fp16]"}
EVERY_OP = [pytest.param(op, id=op.name, marks=() if op.name in QUICK else (pytest.mark.slow,)) for op in OPS]


@pytest.mark.parametrize("op", EVERY_OP)
def test_every_figure_of_an_operator_is_legible_at_1000px(op):
    """What a notebook shows: staircase and latency side by side, the roofline, the bytes per stage."""
    kinds = plots.figure_kinds(op, DATA)
    progress = [k for k in kinds if k in ("staircase", "latency")]
    figures = {"progress (staircase + latency)": plots.ladder_figure(DATA, op, progress)}
    if "roofline" in kinds:
        figures["roofline"] = plots.ladder_figure(DATA, op, ["roofline"])
    if "bytes" in kinds:
        figures["bytes"] = plots.ladder_figure({}, op, ["bytes"])
    try:
        for what, fig in figures.items():
            check_legible(fig, f"{op.name} {what}")
        titles = [fig.get_axes()[0].get_title() for fig in figures.values()]
        assert not any("@" in t for t in titles), titles
        staircase_title = figures["progress (staircase + latency)"].get_axes()[0].get_title().replace("\n", " ")
        assert plots.size_phrase(op, op.headline_size) in staircase_title
        assert "NVIDIA H200, recorded" in titles[0]
    finally:
        for fig in figures.values():
            plt.close(fig)


@pytest.mark.parametrize("name", ["softmax", pytest.param("gemm", marks=pytest.mark.slow)])
def test_readme_figures_are_legible_at_1000px(name):
    """What README shows: one panel a figure, as save_all draws them."""
    op = registry.operator(name)
    for kind in plots.figure_kinds(op, DATA):
        if kind in plots.SAVED_KINDS:
            fig = plots.ladder_figure(DATA, op, [kind])
            try:
                check_legible(fig, f"{name} {kind} (README)")
            finally:
                plt.close(fig)


@pytest.mark.slow  # every recorded operator on two figures
def test_figures_across_operators_are_legible():
    rows = [(op, *plots.best_stage(op, DATA), DATA["peaks"]) for op in OPS]
    fig, (ax,) = plots.new_figure(1)
    plots.best_against_peer(ax, rows)
    fig2, (ax2,) = plots.new_figure(1, height=6.0)
    plots.roofline_of_operators(ax2, DATA, OPS)
    try:
        check_legible(fig, "best against peer")
        check_legible(fig2, "every ladder on one roofline")
    finally:
        plt.close(fig)
        plt.close(fig2)


def test_three_panels_never_share_one_row():
    with pytest.raises(ValueError, match="one or two panels"):
        plots.new_figure(3)


# -- what the figures say ------------------------------------------------------------------------------

def test_sizes_in_words():
    ops = registry.load_operators()
    assert plots.size_phrase(ops["reduction"], (2**28,)) == "2^28 floats (1 GiB moved)"
    assert plots.size_phrase(ops["softmax"], (32768, 4096)) == "32768x4096 floats (1 GiB moved)"
    assert plots.size_phrase(ops["gemm"], (4096, 4096, 4096)) == "4096x4096x4096 (MxNxK, 256 MiB moved)"
    assert plots.count_words(1_000_003) == "1,000,003"


def test_latency_draws_one_line_per_shape_family():
    """softmax's 32768x4096 and 4096x32768 move the same bytes; no line may join them."""
    op = registry.operator("softmax")
    families = plots.shape_families(op.bench_sizes)
    assert [f[-1] for f in families] == [(32768, 1024), (32768, 4096), (4096, 32768)]
    assert plots.shape_families([(32, 32), (128, 128), (1024, 1024)]) == [[(32, 32), (128, 128), (1024, 1024)]]
    fig, (ax,) = plots.new_figure(1)
    try:
        plots.latency(ax, DATA, op)
        naive = [line for line in ax.get_lines() if line.get_color() is not None
                 and matplotlib.colors.same_color(line.get_color(), plots.stage_color(op, 1))]
        assert len(naive) == len(families)  # one line (or lone point) per family
        recorded = {tuple(r["size"]) for r in results.records_for(op.name, DATA) if r["stage"] == "naive"}
        family_bytes = [sorted(op.bytes_moved(s) for s in fam if s in recorded) for fam in families]
        drawn_bytes = [sorted(line.get_xdata()) for line in naive]
        assert sorted(drawn_bytes) == sorted(family_bytes), "a line joins sizes of different shapes"
        labels = [t.get_text() for t in ax.figure.legends[0].get_texts()]
        assert {"shape ROWSx1024", "shape ROWSx4096", "shape 4096x32768"} <= set(labels)
    finally:
        plt.close(fig)


def test_stage_colours_follow_the_whole_ladder():
    """A 'so far' figure colours stage 2 as the whole-ladder figure does, and reads as well."""
    op = registry.operator("reduction")
    early = plots.ladder_figure(DATA, op, ["staircase", "latency"], upto=op.stages[1].name)
    whole = plots.ladder_figure(DATA, op, ["staircase"])
    try:
        check_legible(early, "reduction so far")
        bars_early = [p for p in early.get_axes()[0].patches if isinstance(p, Rectangle)]
        bars_whole = [p for p in whole.get_axes()[0].patches if isinstance(p, Rectangle)]
        assert len(bars_early) == 2 and len(bars_whole) == len(op.stages)
        assert bars_early[1].get_facecolor() == bars_whole[1].get_facecolor()
    finally:
        plt.close(early)
        plt.close(whole)


def test_save_all_writes_the_readme_figures(tmp_path):
    op = registry.operator("transpose")  # no flops: no roofline
    written = plots.save_all(DATA, op, tmp_path)
    assert [p.name for p in written] == ["transpose_staircase.png", "transpose_latency.png"]
    from PIL import Image

    for p in written:
        width, _ = Image.open(p).size
        assert width <= 1100 and math.isfinite(width)


def test_a_latency_figure_needs_two_sizes():
    one_size = [op for op in OPS if plots.recorded_sizes(DATA, op) == 1]
    assert one_size and all("latency" not in plots.figure_kinds(op, DATA) for op in one_size)
    assert "latency" in plots.figure_kinds(registry.operator("reduction"), DATA)


def test_every_recorded_operator_has_its_committed_figures():
    """README figures (results/plots/) exist for every operator with records, as save_all draws them,
    and no other figure sits there."""
    committed = Path(__file__).resolve().parent.parent / "results" / "plots"
    expected = {f"{op.slug}_{kind}.png" for op in OPS for kind in plots.figure_kinds(op, DATA) if kind in plots.SAVED_KINDS}
    assert {p.name for p in committed.glob("*.png")} == expected
    for op in OPS:
        for kind in plots.figure_kinds(op, DATA):
            if kind in plots.SAVED_KINDS:
                assert (committed / f"{op.slug}_{kind}.png").exists(), \
                    f"results/plots/{op.slug}_{kind}.png is missing: `workbench plot {op.name} --out results/plots`"


# -- every series told apart, every label readable ------------------------------------------------------

def legend_looks(fig) -> dict[str, tuple]:
    """{legend label: (colour, line style, marker)} of every legend entry in ``fig``."""
    looks = {}
    for legend in legends(fig):
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            if isinstance(handle, Line2D):
                look = (matplotlib.colors.to_hex(handle.get_color()), str(handle.get_linestyle()),
                        str(handle.get_marker()))
            else:  # a scatter's or a bar's handle
                face = handle.get_facecolor()
                face = face[0] if getattr(face, "ndim", 1) == 2 and len(face) else face
                look = (matplotlib.colors.to_hex(face), "", str(getattr(handle, "get_paths", lambda: "")()[:1]))
            looks[text.get_text()] = look
    return looks


SERIES_QUICK = {"softmax", "attention", "reduction"}  # two peers; a stage recorded at some shapes only


@pytest.mark.parametrize("op", [pytest.param(op, id=op.name, marks=() if op.name in SERIES_QUICK else pytest.mark.slow)
                                for op in OPS])
def test_every_series_is_in_the_legend_and_drawn_apart(op):
    """Two library peers are not two identical red dashed lines, and no recorded stage is missing from
    the latency legend (a stage recorded at only some shapes, softmax's by_shape, once was)."""
    for kind in [k for k in plots.figure_kinds(op, DATA) if k in ("staircase", "latency", "roofline")]:
        fig = plots.ladder_figure(DATA, op, [kind])
        try:
            looks = legend_looks(fig)
            assert len(set(looks.values())) == len(looks), f"{op.name} {kind}: two series drawn alike: {looks}"
            recs = results.headline(results.records_for(op.name, DATA), op.headline_size)
            peers = {r["stage"] for r in recs if r["kind"] == "peer"}
            if kind == "latency":
                stages = {r["stage"] for r in results.records_for(op.name, DATA) if r["kind"] == "stage"}
                missing = stages - set(looks)
                assert not missing, f"{op.name} latency: no legend entry for {sorted(missing)}"
                assert {f"{p} (library)" for p in peers} <= set(looks)
            if kind == "roofline":
                stages = {r["stage"] for r in recs if r["kind"] == "stage"}
                assert stages <= set(looks), f"{op.name} roofline: no legend entry for {sorted(stages - set(looks))}"
        finally:
            plt.close(fig)


def annotation_boxes(fig, renderer) -> list:
    return [(t.get_text(), t.get_window_extent(renderer)) for ax in fig.get_axes() for t in ax.texts
            if isinstance(t, Annotation)]


BARS_QUICK = {"gemm", "attention", "softmax"}  # the most stages: bars narrower than their labels


@pytest.mark.parametrize("op", [pytest.param(op, id=op.name, marks=() if op.name in BARS_QUICK else pytest.mark.slow)
                                for op in OPS])
def test_bar_labels_never_overlap(op):
    """Each bar's label stands clear of its neighbours', in the notebook's two-panel figure and alone."""
    figures = [plots.ladder_figure(DATA, op, ["staircase", "latency"]), plots.ladder_figure(DATA, op, ["staircase"])]
    if plots.has_stage_bytes(op):
        figures.append(plots.ladder_figure({}, op, ["bytes"]))
    try:
        for fig in figures:
            boxes = annotation_boxes(fig, drawn(fig))
            for i, (text, box) in enumerate(boxes):
                for other, other_box in boxes[i + 1:]:
                    assert not box.overlaps(other_box), f"{op.name}: the labels {text!r} and {other!r} overlap"
    finally:
        for fig in figures:
            plt.close(fig)


def test_a_roofline_is_drawn_only_where_stages_sit_at_two_intensities():
    """gemm's stages all do the same flops on the same minimum bytes: one column under the roof, which
    says nothing the staircase does not, so it gets a sentence; attention's stages move bytes of their
    own (traffic models) and spread along the intensity axis."""
    gemm, attention = registry.operator("gemm"), registry.operator("attention")
    assert "roofline" not in plots.figure_kinds(gemm, DATA)
    assert "512 flop/byte" in plots.one_intensity_note(gemm, DATA)
    assert "roofline" in plots.figure_kinds(attention, DATA)
    fig = plots.ladder_figure(DATA, attention, ["roofline"])
    try:
        xs = {round(float(x), 6) for coll in fig.get_axes()[0].collections for x, _ in coll.get_offsets()}
        assert len(xs) > 1
    finally:
        plt.close(fig)


def test_captions_name_sides_only_under_two_panels():
    op = registry.operator("softmax")
    two, one = plots.caption(op, ["staircase", "latency"]), plots.caption(op, ["staircase"])
    assert "**Staircase** (left)" in two and "**Latency against size** (right)" in two
    assert "(left)" not in one and "(right)" not in one and "**Staircase**" in one


# -- the notebooks, as committed -----------------------------------------------------------------------
# Read as JSON (no kernel): what a reader sees. WORKBENCH_LINT_NOTEBOOKS=DIR reads another folder (one
# built with `workbench notebooks build --execute --sim --only OP --out DIR`).

LINTED = Path(os.environ.get("WORKBENCH_LINT_NOTEBOOKS") or Path(__file__).resolve().parent.parent / "notebooks")
NOTEBOOKS = sorted(LINTED.glob("*.ipynb"))
FIGURE_NAMES = ("**Staircase**", "**Latency against size**", "**Roofline**", "**Bytes moved per stage**")


def notebook_cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def text_of(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def figures_of(cell: dict) -> list[tuple[bytes, int]]:
    """(PNG, panels) of each image a code cell shows; a panel per title in its text/plain, which
    ``nb.Picture`` writes as '<figure: title; title>'."""
    out = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "image/png" in data:
            plain = "".join(data.get("text/plain", ""))
            panels = plain.count(";") + 1 if plain.startswith("<figure:") and " results/" not in plain else 1
            out.append((base64.b64decode("".join(data["image/png"])), panels))
    return out


def next_code_cell(cells: list[dict], i: int) -> dict:
    return next((c for c in cells[i + 1:] if c["cell_type"] == "code"), {})


def lint_id(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint_id)
def test_a_caption_names_the_panels_its_figure_has(path):
    """"(left)/(right)" only over a figure of two panels."""
    cells = notebook_cells(path)
    for i, cell in enumerate(cells):
        text = text_of(cell)
        if cell["cell_type"] == "markdown" and ("(left)" in text or "(right)" in text):
            shown = figures_of(next_code_cell(cells, i))
            assert shown and shown[0][1] == 2, \
                f"{path.name} cell {i} speaks of left and right over {shown[0][1] if shown else 'no'} figure panel(s)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint_id)
def test_no_figure_is_described_that_is_not_drawn(path):
    """A caption that names a figure is followed by that figure, not by 'no recorded figures yet'."""
    cells = notebook_cells(path)
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and any(name in text_of(cell) for name in FIGURE_NAMES):
            if "How to read the plots" in text_of(cell):  # the legend of every plot, in start-here
                continue
            assert figures_of(next_code_cell(cells, i)), f"{path.name} cell {i} describes a figure that is not drawn"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint_id)
def test_no_two_consecutive_figures_are_the_same(path):
    pictures = [png for cell in notebook_cells(path) if cell["cell_type"] == "code" for png, _ in figures_of(cell)]
    for a, b in zip(pictures, pictures[1:]):
        assert a != b, f"{path.name}: the same figure twice in a row"


CODE = re.compile(r"(```.*?```|``[^\n]*?``|`[^`\n]*`)", re.S)
SPHINX = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const|ref|term):`")
TIMES = re.compile(r"(?<=[\w)\]])(?<!\\)\*(?=[\w(\[])")  # "2*M*N*K": Markdown reads italics


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint_id)
def test_markdown_shows_its_math_and_its_code_names(path):
    for i, cell in enumerate(notebook_cells(path)):
        if cell["cell_type"] != "markdown":
            continue
        prose = CODE.sub("", text_of(cell))
        assert not SPHINX.search(prose), f"{path.name} cell {i}: a Sphinx role shown literally"
        hit = TIMES.search(prose)
        assert not hit, f"{path.name} cell {i}: {prose[max(0, hit.start() - 20):hit.end() + 20]!r} sets italics"


BOLD_LINE = re.compile(r"(?:^|: )\*\*([^*\n]+)\*\*$", re.M)  # a line that is, or ends in, a bold title


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint_id)
def test_a_bold_title_is_a_whole_sentence(path):
    """A module's title sentence may wrap in its docstring: the notebook shows all of it in bold, not its
    first source line ("... and the**" over the rest of the sentence)."""
    for i, cell in enumerate(notebook_cells(path)):
        if cell["cell_type"] == "markdown":
            for title in BOLD_LINE.findall(text_of(cell)):
                assert title.rstrip().endswith((".", ":", "?", "!", ")")), f"{path.name} cell {i}: **{title}**"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint_id)
def test_printed_text_wraps_at_words_within_the_page(path):
    """JupyterLab breaks a printed line at its edge mid-word: lines are wrapped at words before that."""
    for i, cell in enumerate(notebook_cells(path)):
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream":
                continue
            for line in "".join(output["text"]).splitlines():
                if " " in line.strip():  # a single long word (a path) cannot wrap
                    assert len(line) <= nb.PRINT_COLUMNS, f"{path.name} cell {i}: {len(line)} characters: {line[:60]}"


def test_every_stage_shows_the_kernels_it_launches():
    """A dispatcher (softmax's by_shape, conv's fused_epilogue) shows the kernels its table chooses from,
    not only its three lines; every stage's source holds a kernel."""
    for op in registry.load_operators().values():
        for stage in op.stages:
            assert "cuda.jit" in stage.source(), f"{stage.key} shows no kernel"
    source = registry.operator("softmax")["by_shape"].source()
    assert all(f"def {name}(" in source for name in ("warp_rows", "block_rows", "online_rows", "_softmax_online"))
    rms = registry.operator("rmsnorm")["by_shape"].source()
    assert "_layernorm_warp_rows" not in rms, "rmsnorm's by_shape names its own table, not layernorm's"


# -- the committed figures are drawn from the records ----------------------------------------------------

def test_committed_plots_are_drawn_from_todays_records():
    """Each PNG in results/plots/ is entered in its manifest with the hash of the records it was drawn
    from, and that is the hash of today's records (the reduction's staircase once said 104% of a peak
    re-measured since: its table said 97%)."""
    stale = plots.committed_plots_out_of_date()
    assert not stale, (f"{len(stale)} committed figure(s) out of date, e.g. "
                       + "; ".join(f"{k}: {v}" for k, v in sorted(stale.items())[:5])
                       + ": `workbench table --update-readme` redraws them")


def test_the_manifest_tells_a_figure_drawn_from_other_records(tmp_path):
    op = registry.operator("transpose")
    written = plots.save_all(DATA, op, tmp_path)
    manifest = plots.read_manifest(tmp_path)
    assert set(manifest) == {p.name for p in written}
    assert all(manifest[p.name] == {"data": plots.data_hash(DATA, op), "png": plots.png_hash(p)} for p in written)
    remeasured = {**DATA, "peaks": {**DATA["peaks"], "copy_gbps": DATA["peaks"]["copy_gbps"] * 1.07}}
    assert plots.data_hash(remeasured, op) != plots.data_hash(DATA, op)  # a new peak: other figures
    other_op = {**DATA, "records": [r for r in DATA["records"] if r["op"] != "reduction"]}
    assert plots.data_hash(other_op, op) == plots.data_hash(DATA, op)  # another operator's records: the same


def test_a_stage_without_records_does_not_draw_the_figure_above_again(tmp_path, monkeypatch):
    """progress(op, upto=STAGE) for a stage not recorded yet would draw the stages before it: the
    figure of the section above, a second time. It says so instead."""
    import matplotlib

    matplotlib.use("Agg")
    op = registry.operator("reduction")
    unrecorded = {**DATA, "records": [r for r in DATA["records"]
                                      if not (r["op"] == op.name and r["stage"] == "warp_shuffle")]}
    (tmp_path / RECORDED.name).write_text(json.dumps(unrecorded))
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    shown, printed = [], []
    monkeypatch.setattr(nb, "show", shown.append)
    monkeypatch.setattr(nb, "say", printed.append)
    nb.progress(op, upto="shared_tree")
    nb.progress(op, upto="warp_shuffle")
    assert len(shown) == 1 and any("warp_shuffle" in line for line in printed)
    for picture in shown:
        plt.close(picture.figure)


def test_prose_from_solutions_reads_as_it_was_written_in_markdown():
    text = "2*M*N*K flops on (M*K + K*N) floats; **bold**, *emphasis*, `a*b` and ``x*y`` stay; :func:`quantize`"
    assert nb.prose_markdown(text) == (r"2\*M\*N\*K flops on (M\*K + K\*N) floats; **bold**, *emphasis*, "
                                       "`a*b` and ``x*y`` stay; `quantize`")
    assert not TIMES.search(CODE.sub("", nb.prose_markdown(text)))


def test_printed_text_is_wrapped_at_words():
    line = "• 2. coalesced is 3.46x faster than 1. naive: " + "achieved occupancy 12% -> 98%; " * 5
    out = nb.wrapped(line).splitlines()
    assert len(out) > 1 and all(len(x) <= nb.PRINT_COLUMNS for x in out)
    assert " ".join(x.strip() for x in out) == line.strip()  # no word broken, none lost
    assert all(x.startswith("  ") for x in out[1:])  # continued under the bullet's text
    path = "/a/" + "very_long_directory_name/" * 6
    assert nb.wrapped(path) == path  # one word: left whole


def test_update_redraws_only_what_changed_and_removes_what_is_no_longer_drawn(tmp_path):
    """What `workbench table --update-readme` runs after the tables: a figure whose records changed is
    redrawn, one no operator draws any more goes, the others are left as they are."""
    import shutil

    committed = Path(__file__).resolve().parent.parent / "results" / "plots"
    shutil.copytree(committed, tmp_path, dirs_exist_ok=True)
    manifest = plots.read_manifest(tmp_path)
    manifest["transpose_staircase.png"]["data"] = "drawn-from-old"  # as if transpose were re-recorded
    (tmp_path / plots.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "gone_staircase.png").write_bytes(b"\x89PNG")  # an operator since removed
    assert set(plots.committed_plots_out_of_date(tmp_path)) == {"transpose_staircase.png", "gone_staircase.png"}
    redrawn = plots.update_committed_plots(tmp_path, log=lambda line: None)
    assert {p.name for p in redrawn} == {"transpose_staircase.png", "transpose_latency.png"}
    assert not (tmp_path / "gone_staircase.png").exists()
    assert plots.committed_plots_out_of_date(tmp_path) == {}
