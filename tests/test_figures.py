"""Every figure reads at the width JupyterLab and GitHub show it (about 1000 px).

Each kind of figure is drawn for every operator from the recorded ``results/nvidia-h200.json`` (five
of them in the quick tier, all with ``-m slow``), the way notebooks and the README draw them (``plots.ladder_figure``, ``plots.png``'s tight box), and measured:
its width in pixels, its smallest text in pixels once shrunk to 1000 px, legends clear of the data,
staircase bar labels never crossed by the peak or peer lines, titles that say the size in words, and
one latency line per shape family.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Annotation, Text  # noqa: E402

from workbench import plots, registry, results  # noqa: E402

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
QUICK = {"softmax", "hgemm"}
EVERY_OP = [pytest.param(op, id=op.name, marks=() if op.name in QUICK else pytest.mark.slow) for op in OPS]


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
    expected = {f"{op.name}_{kind}.png" for op in OPS for kind in plots.figure_kinds(op, DATA) if kind in plots.SAVED_KINDS}
    assert {p.name for p in committed.glob("*.png")} == expected
    for op in OPS:
        for kind in plots.figure_kinds(op, DATA):
            if kind in plots.SAVED_KINDS:
                assert (committed / f"{op.name}_{kind}.png").exists(), \
                    f"results/plots/{op.name}_{kind}.png is missing: `workbench plot {op.name} --out results/plots`"
