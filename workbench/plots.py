"""Every picture of a ladder, drawn from records (measured now, or recorded in ``results/``).

* staircase: each stage's rate at the headline size (effective GB/s, or GFLOP/s for a compute-bound
  operator), with the measured peak and each library peer as horizontal lines (peers each in a colour
  and dash of their own: eager torch and torch.compile are two lines, never one red one);
* latency against size, log-log, one line per stage and per shape family (softmax's rows of 1024
  columns are one line, its rows of 4096 another: same bytes is not same shape);
* roofline: each stage's arithmetic intensity (flops over the bytes its own traffic model moves) against
  its rate, under the memory and compute roofs; drawn only where the stages sit at two intensities or
  more (``roofline_says_something``), a sentence otherwise;
* bytes per stage: what each stage's traffic model says it moves, against the minimum (fusion's gain);
* across operators: each best stage against its library peer, and one roofline of every ladder.

Every figure is titled with the operator, the size in words ("2^28 floats (1 GiB moved)"), and the
device and date of its records. Figures are made to be read at the width JupyterLab and GitHub show
them (about ``PAGE_WIDTH_PX`` = 1000 pixels): at most two panels side by side, no text under 9 points,
legends under the axes (never over the data), and bar labels on an opaque box, so a peak or peer line
passes behind them rather than through them. ``png(fig)`` is how every figure is saved, for the
README's ``results/plots/`` and for the notebooks alike; ``caption(op, kinds)`` says in Markdown what a
figure of those panels shows (left and right only where there are two). ``results/plots/drawn_from.json``
records the hash of the records each committed PNG was drawn from (``committed_plots_out_of_date``).

Drawing functions take an axes first and return it; ``ladder_figure`` and ``save_all`` make whole
figures. Stage colours follow a stage's place in its whole ladder, so a "so far" figure never shifts them.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from . import bench, paths, registry, results
from .ladder import Operator, as_size, size_label

FIG_DPI = 100
PAGE_WIDTH_PX = 1000  # what a notebook or README column shows; figures are made to read at this width
PANEL_IN = (5.0, 4.6)  # one panel (inches) with its legend below it: two side by side fill the page
TITLE_PT, LABEL_PT, SMALL_PT = 10.5, 10, 9  # smallest text: 9 pt at 100 dpi is 12.5 px
TITLE_CHAR_EM = 0.62  # a title character's average width, in ems (titles wrap to their panel)
PNG_PAD_IN = 0.08  # white margin around a saved figure's tight box
LEGEND_COLUMN_PX = 250  # the width a legend column needs: a panel 500 px wide holds two  # a panel title wraps at this many characters

STAGE_COLORS = plt.get_cmap("viridis")
PEER_COLOR = "tab:red"
# Library peers (eager torch, torch.compile, cuBLAS...) each get a colour, a line style and a marker of
# their own: two peers drawn alike would read as one. Viridis (the stages) has no red, orange or pink.
PEER_LOOKS = [("tab:red", "--", "x"), ("tab:orange", "-.", "P"), ("tab:pink", (0, (5, 1, 1, 1, 1, 1)), "*"),
              ("tab:brown", (0, (3, 2)), "X")]
PEAK_STYLE = dict(color="black", linestyle=":", linewidth=1.6)
OTHER_PEAK_STYLE = dict(color="black", linestyle=(0, (1, 4)), linewidth=1.6)  # a stage's own precision's peak
FLOOR_STYLE = dict(color="0.45", linestyle=":", linewidth=2.2)
# Shape families on the latency plot: the first is drawn solid with dots, the next ones differ in both.
FAMILY_STYLES = [("-", "o"), ("--", "s"), ("-.", "^"), ((0, (1, 1)), "D"), ((0, (5, 1, 1, 1, 1, 1)), "v"),
                 ((0, (8, 2)), "P")]  # attention records five shape families
LABEL_BOX = dict(boxstyle="square,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9)
LABEL_ZORDER = 6  # above every line


# -- words --------------------------------------------------------------------------------------

def binary_bytes(n: float) -> str:
    """1073741828 -> '1 GiB'; 201326592 -> '192 MiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def count_words(n: int) -> str:
    """268435456 -> '2^28'; 1000003 -> '1,000,003'."""
    if n >= 1024 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return f"{n:,}"


def size_phrase(op: Operator, size) -> str:
    """A size in words: '2^28 floats (1 GiB moved)', '32768x4096 floats (1 GiB moved)',
    '4096x4096x4096 (MxNxK, 192 MiB moved)'."""
    size = as_size(size)
    moved = binary_bytes(op.bytes_moved(size))
    if len(size) >= 3:
        return f"{size_label(size)} ({op.size_form}, {moved} moved)"
    noun = "floats" if np.dtype(op.dtype) == np.float32 else "elements"
    shape = count_words(size[0]) if len(size) == 1 else size_label(size)
    return f"{shape} {noun} ({moved} moved)"


def provenance(data: dict, recs: list[dict], live: bool) -> str:
    """'NVIDIA H200, recorded 2026-11-22' (or 'measured now'): where and when the records were taken."""
    dates = sorted(r["date"][:10] for r in recs if r.get("date")) or ["?"]
    when = dates[-1] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
    return f"{data.get('device', '?')}, {'measured now' if live else 'recorded'} {when}"


def _title(ax, first: str, second: str = "") -> None:
    """A title of one or two lines (what, then where and when), wrapped to the panel's width."""
    chars = int(ax.figure.bbox.width / (TITLE_PT * FIG_DPI / 72 * TITLE_CHAR_EM))
    lines = textwrap.wrap(first, max(chars, 30)) + ([second] if second else [])
    ax.set_title("\n".join(lines), fontsize=TITLE_PT)


def metric_of(op: Operator) -> str:
    """The record field a ladder is judged by: 'gflops' (compute-bound) or 'gbps' (memory-bound)."""
    return "gflops" if op.bound == "compute" else "gbps"


def unit_of(op: Operator) -> str:
    return "GFLOP/s" if op.bound == "compute" else "GB/s (effective)"


# -- peaks --------------------------------------------------------------------------------------

PEAK_NAMES = {"copy_gbps": "copy", "read_gbps": "read-only stream", "read2_write1_gbps": "2-read-1-write stream",
              "gemm_fp32_gflops": "cuBLAS fp32", "gemm_tf32_gflops": "cuBLAS TF32", "gemm_fp16_gflops": "cuBLAS fp16"}


def peak_of(op: Operator, peaks: dict) -> tuple[float | None, str]:
    """(the measured peak this operator's "% of peak" divides by, its name), as the tables have it: the
    bandwidth of its memory pattern's stream (the copy bandwidth where that stream was not measured), or
    the library GEMM rate in the operator's precision (None where none was measured)."""
    key = bench.peak_key(op, peaks)
    return (peaks.get(key) if key else None), PEAK_NAMES.get(key, key or "none")


def memory_ceiling(op: Operator, peaks: dict) -> tuple[float | None, str]:
    """(the bandwidth this operator's bytes stream at best, its name): its own pattern's measured stream
    for a memory-bound operator, the copy bandwidth for a compute-bound one (its roofline's slanted roof)."""
    key = bench.peak_key(op, peaks) if op.bound == "memory" else "copy_gbps"
    return peaks.get(key), PEAK_NAMES[key]


def percent(op: Operator, rec: dict, peaks: dict) -> float | None:
    """A record's % of the peak, against the peaks of the file it is drawn from (as the README's table)."""
    return bench.percent_of_peak(op, rec["gbps"], rec["gflops"], peaks, rec.get("stage"))


# -- records --------------------------------------------------------------------------------------

def stage_color(op: Operator, order: int):
    """The colour of stage ``order`` (1-based) of ``op``, whatever subset of stages a figure shows."""
    n = max(len(op.stages), order, 1)
    return STAGE_COLORS(0.1 + 0.8 * (order - 1) / max(n - 1, 1))


def _stage_records(recs: list[dict], upto: str | None, op: Operator) -> list[dict]:
    """The stage records of ``recs`` up to stage ``upto`` (by its order in ``op``), in ladder order."""
    last = op[upto].order if upto is not None else math.inf
    return sorted((r for r in recs if r.get("kind") == "stage" and r["order"] <= last), key=lambda r: r["order"])


def _peers(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r.get("kind") == "peer"]


def peer_look(data: dict, op: Operator, name: str) -> tuple:
    """(colour, line style, marker) of ``op``'s peer ``name``: by its place among the peers recorded in
    ``data`` at any size (eager ones first, torch.compile after them), so that every panel draws one peer
    alike and two peers apart."""
    recorded = {r["stage"] for r in _peers(results.records_for(op.name, data))}
    names = sorted(recorded, key=lambda name: ("compile" in name, name))
    return PEER_LOOKS[names.index(name) % len(PEER_LOOKS)]


def _legend_below(ax, most_columns: int = 3):
    """A legend under the panel (under its tick labels and x label), so that it never covers the data.

    It belongs to the panel's (sub)figure, placed "outside lower center": constrained layout makes room
    for it, however tall the rotated tick labels are (``new_figure`` gives each panel a subfigure)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    fits = int(ax.figure.bbox.width // LEGEND_COLUMN_PX)  # columns that fit under the panel
    ncols = max(1, min(most_columns, fits, len(handles)))
    renderer = ax.get_figure(root=True).canvas.get_renderer()
    while True:
        legend = ax.figure.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=SMALL_PT,
                                  frameon=False)
        # Long labels ("torch.max_pool2d(return_indices) (library)") make a column wider than the estimate: a
        # legend wider than its panel would spill under the next panel's bars. One column fewer until it fits.
        if ncols == 1 or legend.get_window_extent(renderer).width <= ax.figure.bbox.width:
            return legend
        legend.remove()
        ncols -= 1


def _grow_for_legend(ax, legend) -> None:
    """Make the figure taller by the legend's height: with one entry per operator (seventy and more) the
    legend under the panel is taller than the panel, and constrained layout, keeping the figure's size,
    would squeeze the axes to nothing and lay the legend over the data."""
    if legend is None:
        return
    root = ax.get_figure(root=True)
    needed_in = legend.get_window_extent(root.canvas.get_renderer()).height / root.dpi
    width_in, height_in = root.get_size_inches()
    root.set_size_inches(width_in, height_in + needed_in)


def _ticks(ax) -> None:
    ax.tick_params(labelsize=SMALL_PT)


def _powers_of_ten_only(ax) -> None:
    """On a log axis spanning a decade or two, matplotlib also labels minor ticks (2, 3, 4 x 10^7), and
    their labels run into each other: there, besides the powers of ten, only 2 and 5 times them."""
    from matplotlib.ticker import FuncFormatter

    def two_and_five(value, _position):
        exponent = math.floor(math.log10(value) + 1e-9)
        mantissa = round(value / 10 ** exponent)
        return rf"${mantissa}\times10^{{{exponent}}}$" if mantissa in (2, 5) else ""

    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if lo > 0 and math.log10(hi / lo) <= 2:
            axis.set_minor_formatter(FuncFormatter(two_and_five))


# -- one operator ---------------------------------------------------------------------------------

AXES_SHARE = 0.8  # of its (sub)figure's width, what a panel's axes keep beside its tick labels
LABEL_CHAR_EM = 0.6  # a label digit's width in ems (DejaVu Sans digits are 0.64; "%" is wider, spaces narrower)


def _bar_labels(ax, bars, labels: list[str]) -> bool:
    """Label each bar over its top, on an opaque box. Upright where every label fits the width of its
    bar's slot; otherwise all of them on one line each, turned on end, so that neighbours never overlap
    (twelve stages in a 500-pixel panel leave 35 pixels a bar: "31964" alone needs 40). Returns whether
    they stand upright (a turned label is taller: the caller leaves more room above the bars)."""
    slot_px = AXES_SHARE * ax.figure.bbox.width / max(len(bars), 1)
    widest = max((len(line) for label in labels for line in label.split("\n")), default=0)
    upright = widest * SMALL_PT * ax.figure.dpi / 72 * LABEL_CHAR_EM <= slot_px * 0.9
    for bar, label in zip(bars, labels):
        ax.annotate(label if upright else label.replace("\n", " "),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", rotation=0 if upright else 90,
                    fontsize=SMALL_PT, bbox=LABEL_BOX, zorder=LABEL_ZORDER)
    return upright


def staircase(ax, data: dict, op: Operator, *, upto: str | None = None, live: bool = False):
    """One bar per stage at the headline size, up to stage ``upto``; the measured peak (dotted) and each
    library peer (``peer_look``) as lines. Each bar is labelled with its rate and its % of the peak."""
    metric = metric_of(op)
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    stages = _stage_records(recs, upto, op)
    peers = _peers(recs)
    values = [r[metric] for r in stages]
    bars = ax.bar([r["stage"] for r in stages], values, color=[stage_color(op, r["order"]) for r in stages],
                  zorder=2)
    peaks = data.get("peaks") or {}
    peak, peak_name = peak_of(op, peaks)
    peak_lines = []
    if peak:
        ax.axhline(peak, **PEAK_STYLE, zorder=3, label=f"measured peak ({peak_name}) {peak:.0f}")
    for key in dict.fromkeys(bench.peak_key(op, peaks, r["stage"]) for r in stages):  # a TF32 stage's own peak
        if key and peaks.get(key) and peaks[key] != peak:
            ax.axhline(peaks[key], **OTHER_PEAK_STYLE, zorder=3,
                       label=f"measured peak ({PEAK_NAMES.get(key, key)}) {peaks[key]:.0f}")
            peak_lines.append(peaks[key])
    for r in peers:
        color, style, _ = peer_look(data, op, r["stage"])
        ax.axhline(r[metric], color=color, linestyle=style, linewidth=1.6, zorder=3,
                   label=f"{r['stage']} {r[metric]:.0f}")
    labels = []
    for r in stages:
        pct = percent(op, r, peaks)
        labels.append(f"{r[metric]:.0f}" + (f"\n{pct:.0f}%" if pct is not None else ""))
    upright = _bar_labels(ax, bars, labels)
    top = max(values + [peak or 0] + peak_lines + [r[metric] for r in peers], default=1) or 1
    positive = [v for v in values if v > 0]
    if positive and top / min(positive) > 100:  # early stages would be invisible on a linear axis
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 3, top * (6 if upright else 40))  # room for the labels over the tallest bar
    else:
        ax.set_ylim(0, top * (1.3 if upright else 1.6))
    ax.set_ylabel(unit_of(op), fontsize=LABEL_PT)
    ax.tick_params(axis="x", rotation=25)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    _ticks(ax)
    size = as_size(recs[0]["size"]) if recs else as_size(op.headline_size)
    _title(ax, f"{op.name} at {size_phrase(op, size)}", provenance(data, stages + peers, live))
    _legend_below(ax)
    return ax


def shape_families(sizes: list[tuple]) -> list[list[tuple]]:
    """Sizes that grow together, each family in increasing order. All of one shape (a vector, squares,
    cubes: each a multiple of the first) is one family; otherwise sizes are grouped by every dimension
    but the first (softmax: rows of 1024 columns, rows of 4096, ...), so that two sizes moving the same
    bytes in different shapes (32768x4096 and 4096x32768) are never joined by one line."""
    sizes = sorted({as_size(s) for s in sizes}, key=lambda s: (math.prod(s), s))
    if not sizes:
        return []
    first = np.array(sizes[0], dtype=float)
    # s is a multiple of first when s * first[0] == first * s[0] (multiplied out: a size may hold a 0,
    # attention's causal flag, and dividing by it warned in the notebooks)
    if len(first) == 1 or all(np.allclose(np.array(s) * first[0], first * s[0]) for s in sizes):
        return [sizes]
    groups: dict[tuple, list[tuple]] = {}
    for s in sizes:
        groups.setdefault(s[1:], []).append(s)
    return sorted(groups.values(), key=lambda g: (-len(g), math.prod(g[0])))


def family_label(op: Operator, family: list[tuple]) -> str:
    """'ROWSx1024' for rows of 1024 columns; a family of one size is that size."""
    if len(family) == 1:
        return size_label(family[0])
    return "x".join([op.dims[0].upper()] + [str(d) for d in family[0][1:]])


def time_floor(op: Operator, peaks: dict, recs: list[dict]) -> list[tuple[float, float]]:
    """(bytes, µs) at each recorded size: the least time the roofline allows, the larger of the minimum
    bytes at the operator's memory ceiling (``memory_ceiling``) and (compute-bound) the flops at the
    library's rate in the operator's precision. Sizes that move the same bytes (attention causal or not)
    share a point: the least of their times, so that no measurement can sit below the line. Empty without
    a measured memory ceiling."""
    memory = memory_ceiling(op, peaks)[0]
    compute = peak_of(op, peaks)[0] if op.bound == "compute" else None
    if not memory:
        return []
    floor = {}
    for r in recs:
        us = max(r["bytes"] / memory, r["flops"] / compute if compute else 0.0) / 1e3
        floor[r["bytes"]] = min(floor.get(r["bytes"], us), us)
    return sorted(floor.items())


def latency(ax, data: dict, op: Operator, *, upto: str | None = None, live: bool = False):
    """Median latency against bytes moved, log-log: one line per stage (its colour) and shape family
    (its line style and marker); the library peer in red; the roofline's least time as a floor."""
    recs = results.records_for(op.name, data)
    stages = _stage_records(recs, upto, op)
    peers = _peers(recs)
    families = shape_families([r["size"] for r in stages + peers])
    family_of = {s: i for i, fam in enumerate(families) for s in fam}

    def draw(rows: list[dict], color, label: str, look: tuple | None = None) -> None:
        """One line per shape family; the first line drawn carries the legend entry (a stage recorded
        only at some shapes still gets one)."""
        for i, fam in enumerate(families):
            pts = sorted((r["bytes"], r["median_us"]) for r in rows if family_of[as_size(r["size"])] == i)
            if not pts:
                continue
            style, marker = FAMILY_STYLES[i % len(FAMILY_STYLES)]
            if look and len(families) == 1:  # one family: the peer's own style tells it from the others
                style, marker = look[1], look[2]
            ax.plot(*zip(*pts), color=color, linestyle=style, marker=marker, markersize=5 if look else 4,
                    linewidth=1.8 if look else 1.4, label=label, zorder=3)
            label = None

    for order in sorted({r["order"] for r in stages}):
        rows = [r for r in stages if r["order"] == order]
        draw(rows, stage_color(op, order), rows[0]["stage"])
    for name in sorted({r["stage"] for r in peers}):
        look = peer_look(data, op, name)
        draw([r for r in peers if r["stage"] == name], look[0], f"{name} (library)", look)
    shown = stages + peers
    floor = time_floor(op, data.get("peaks") or {}, shown)
    if shown:  # drawn only where it is within sight of the measurements
        floor = [(b, us) for b, us in floor if us >= min(r["median_us"] for r in shown) / 3]
    if len(floor) > 1:
        compute_peak, name = peak_of(op, data.get("peaks") or {})
        by_flops = op.bound == "compute" and compute_peak
        memory_name = memory_ceiling(op, data.get("peaks") or {})[1]
        ax.plot(*zip(*floor), **FLOOR_STYLE, zorder=2,
                label=f"floor: flops at the {name} peak" if by_flops else f"floor: bytes at the {memory_name} peak")
    if len(families) > 1:
        for i, fam in enumerate(families):
            style, marker = FAMILY_STYLES[i % len(FAMILY_STYLES)]
            ax.plot([], [], color="black", linestyle=style, marker=marker, markersize=4,
                    label=f"shape {family_label(op, fam)}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _powers_of_ten_only(ax)
    ax.set_xlabel("bytes moved (model)", fontsize=LABEL_PT)
    ax.set_ylabel("median latency (µs)", fontsize=LABEL_PT)
    ax.grid(True, which="both", alpha=0.3)
    _ticks(ax)
    _title(ax, f"{op.name}: latency against size", provenance(data, shown, live))
    _legend_below(ax)
    return ax


COMPUTE_ROOFS = (("gemm_fp32_gflops", "fp32 (cuBLAS)"), ("gemm_tf32_gflops", "TF32 (cuBLAS)"),
                 ("gemm_fp16_gflops", "fp16 (cuBLAS)"))


def _roofs(ax, peaks: dict, lo: float, hi: float, keys: tuple[str, ...], memory_key: str = "copy_gbps") -> None:
    """The memory roof (slanted: the stream ``memory_key`` names) and the compute roofs named by ``keys``
    (flat) between intensities lo and hi."""
    copy = peaks.get(memory_key)
    if not copy:
        return
    for key, label in [(k, name) for k, name in COMPUTE_ROOFS if k in keys]:
        top = peaks.get(key)
        if top:
            ax.plot([lo, top / copy, hi], [copy * lo, top, top], color="gray", linewidth=1, zorder=1)
            ax.annotate(f"{label} {top / 1e3:.0f} TFLOP/s", (hi, top), xytext=(-2, 2), textcoords="offset points",
                        ha="right", va="bottom", fontsize=SMALL_PT, color="0.3")
    stream = "" if memory_key == "copy_gbps" else f" ({PEAK_NAMES[memory_key]})"
    ax.annotate(f"memory{stream} {copy:.0f} GB/s", (lo, copy * lo), xytext=(2, 4), textcoords="offset points",
                rotation=0, va="bottom", fontsize=SMALL_PT, color="0.3")


def _roofline_axes(ax, points: list[tuple[float, float]], peaks: dict, keys: tuple[str, ...],
                   memory_key: str = "copy_gbps") -> None:
    """Log-log axes around the (intensity, GFLOP/s) ``points``, with the roofs and room for their labels."""
    xs = [x for x, _ in points]
    lo, hi = min(xs + [0.05]) / 2, max(xs + [100]) * 4
    _roofs(ax, peaks, lo, hi, keys, memory_key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ys = [y for _, y in points if y > 0]
    copy = peaks.get(memory_key)
    bottom = min(ys + ([copy * lo] if copy else []), default=1.0) / 3
    top = max(ys + [peaks[k] for k in keys if peaks.get(k)], default=10.0) * 3  # room for the roofs' labels
    ax.set_ylim(bottom, top)
    ax.set_xlabel("arithmetic intensity (flop / byte, from the models)", fontsize=LABEL_PT)
    ax.set_ylabel("GFLOP/s", fontsize=LABEL_PT)
    ax.grid(True, which="both", alpha=0.3)
    _ticks(ax)


def has_roofline(op: Operator) -> bool:
    """A roofline needs arithmetic: an operator with no flops (a transpose) has no point on it."""
    return op.flops(as_size(op.headline_size)) > 0


def intensity(rec: dict) -> float:
    """A record's arithmetic intensity: its flops over the bytes its own stage moves (its traffic
    model; the operator's minimum where the stage has none, and for a library peer)."""
    return rec["flops"] / (rec.get("stage_bytes") or rec["bytes"])


def intensities(op: Operator, data: dict) -> list[float]:
    """The distinct arithmetic intensities of ``op``'s records at its headline size, rounded to 0.1%."""
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    return sorted({float(f"{intensity(r):.3g}") for r in recs if r["flops"]})


def roofline_says_something(op: Operator, data: dict) -> bool:
    """A roofline of one ladder places its stages by intensity; where every stage and peer sits at the
    same one (no stage has a traffic model of its own: gemm), it would stack them in one column under
    the roof, which the staircase's "% of peak" already says. It is drawn where there are two or more."""
    return has_roofline(op) and len(intensities(op, data)) > 1


def one_intensity_note(op: Operator, data: dict) -> str:
    """What a one-column roofline would have said, in a sentence: the intensity, which side of the
    ridge, and that the staircase shows the distance to the roof."""
    peaks = data.get("peaks") or {}
    memory, _ = memory_ceiling(op, peaks)
    compute = peaks.get(bench.peak_key(op, peaks) if op.bound == "compute" else "gemm_fp32_gflops")
    size = as_size(op.headline_size)
    x = (intensities(op, data) or [op.flops(size) / op.bytes_moved(size)])[0]
    text = (f"Every stage of {op.name} does the same flops on the same bytes (no stage moves more than the "
            f"minimum in its model): one arithmetic intensity, {x:.3g} flop/byte")
    if memory and compute:
        ridge = compute / memory
        side = "right of the ridge: compute-bound" if x > ridge else "left of the ridge: memory-bound"
        text += f", {side} (the ridge is at {ridge:.3g} flop/byte on {data.get('device', '?')})"
    return (text + ". A roofline would stack every stage in one column under the same roof; the staircase's "
            "% of peak is each stage's distance to it, so no roofline is drawn.")


def roofline(ax, data: dict, op: Operator, *, upto: str | None = None, live: bool = False):
    """Each stage at the headline size as a point (intensity from its own traffic model, rate
    measured) under the memory and compute roofs; each library peer a cross of its own."""
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    stages = _stage_records(recs, upto, op)
    peers = _peers(recs)
    for r in stages:
        ax.scatter(intensity(r), r["gflops"], color=stage_color(op, r["order"]), s=36, zorder=3,
                   label=r["stage"])
    for r in peers:
        color, _, marker = peer_look(data, op, r["stage"])
        ax.scatter(intensity(r), r["gflops"], marker=marker, color=color, s=50, zorder=4,
                   label=f"{r['stage']} (library)")
    peaks = data.get("peaks") or {}
    keys = ("gemm_fp32_gflops", "gemm_tf32_gflops") + ((bench.peak_key(op),) if op.bound == "compute" else ())
    memory_key = bench.peak_key(op, peaks) if op.bound == "memory" else "copy_gbps"  # its own stream's roof
    _roofline_axes(ax, [(intensity(r), r["gflops"]) for r in stages + peers if r["flops"]],
                   peaks, keys, memory_key)
    size = as_size(recs[0]["size"]) if recs else as_size(op.headline_size)
    _title(ax, f"{op.name}: roofline at {size_phrase(op, size)}", provenance(data, stages + peers, live))
    _legend_below(ax)
    return ax


def has_stage_bytes(op: Operator) -> bool:
    """Do some stages move more than the minimum (a traffic model of their own)?"""
    return any(s.bytes_moved is not None for s in op.stages)


def stage_bytes(ax, op: Operator, *, upto: str | None = None, size=None):
    """Bytes each stage moves (its own traffic model) against the minimum any kernel must move, one bar
    per stage at the headline size: what fusing kernels saves. Drawn from the models: no records needed."""
    size = as_size(size or op.headline_size)
    stages = [s for s in op.stages if upto is None or s.order <= op[upto].order]
    minimum = int(op.bytes_moved(size))
    values = [s.traffic(size) for s in stages]
    unit, scale = next(((u, k) for u, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
                        if max(values + [minimum]) >= k), ("B", 1))
    bars = ax.bar([s.name for s in stages], [v / scale for v in values],
                  color=[stage_color(op, s.order) for s in stages], zorder=2)
    for bar, v in zip(bars, values):
        ax.annotate(f"{v / minimum:.2g}x" if minimum else "", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=SMALL_PT,
                    bbox=LABEL_BOX, zorder=LABEL_ZORDER)
    if minimum:
        ax.axhline(minimum / scale, **PEAK_STYLE, zorder=3,
                   label=f"minimum: each input read once, the output written once ({binary_bytes(minimum)})")
    ax.set_ylabel(f"{unit} moved per call", fontsize=LABEL_PT)
    ax.set_ylim(0, max([v / scale for v in values] + [minimum / scale]) * 1.25 or 1)
    ax.tick_params(axis="x", rotation=25)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    _ticks(ax)
    _title(ax, f"{op.name}: bytes moved per stage at {size_phrase(op, size)}", "from the stages' traffic models")
    _legend_below(ax)
    return ax


# -- across operators -----------------------------------------------------------------------------

def best_stage(op: Operator, data: dict) -> tuple[dict | None, dict | None]:
    """(the fastest stage's record, the strongest library peer's record: eager torch or torch.compile,
    whichever was faster) at the operator's headline size, as the tables compare them."""
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    stages = [r for r in recs if r.get("kind") == "stage"]
    peers = _peers(recs)
    return (min(stages, key=lambda r: r["median_us"], default=None),
            min(peers, key=lambda r: r["median_us"], default=None))


def best_against_peer(ax, rows: list[tuple[Operator, dict, dict | None, dict]]):
    """Each operator's best stage and its library peer, in % of the measured peak, side by side; a row
    is (operator, best stage's record, peer's record or None, the peaks of the file they come from)."""
    x = np.arange(len(rows))
    ours = [percent(op, best, peaks) or 0 for op, best, _, peaks in rows]
    theirs = [(percent(op, peer, peaks) or 0) if peer else 0 for op, _, peer, peaks in rows]
    bars = ax.bar(x - 0.2, ours, 0.4, label="best stage", color="tab:green", zorder=2)
    ax.bar(x + 0.2, theirs, 0.4, label="library peer", color=PEER_COLOR, alpha=0.7, zorder=2)
    upright = _bar_labels(ax, bars, [f"{v:.0f}" for v in ours])
    ax.axhline(100, **PEAK_STYLE, zorder=3, label="100% of the measured peak")
    ax.set_xticks(x, [f"{op.name}\n{best['stage']}" for op, best, _, _ in rows])
    ax.tick_params(axis="x", rotation=35)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    ax.set_ylim(0, max(ours + theirs + [100]) * (1.15 if upright else 1.3))
    ax.set_ylabel("% of measured peak", fontsize=LABEL_PT)
    _ticks(ax)
    devices = sorted({best["device"] for _, best, _, _ in rows})
    dates = sorted(best["date"][:10] for _, best, _, _ in rows)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
    _title(ax, "best stage against the library, % of peak at each headline size",
           f"{', '.join(devices)}, recorded {when}")
    _legend_below(ax)
    return ax


def roofline_of_operators(ax, data: dict, ops: list[Operator]):
    """One colour per operator: its stages as dots that darken up the ladder, its fastest stage ringed,
    its library peer a cross; the memory and compute roofs from the recorded peaks. Operators without
    flops (a transpose) have no point on a log-log roofline and are named in a note."""
    cmap = plt.get_cmap("tab20")
    shown, skipped = [], []
    for i, op in enumerate(ops):
        recs = results.headline(results.records_for(op.name, data), op.headline_size)
        if not recs or all(r["flops"] == 0 for r in recs):
            skipped.append(op.name)
            continue
        color = cmap(i % 20)
        stages = sorted((r for r in recs if r.get("kind") == "stage"), key=lambda r: r["order"])
        for k, r in enumerate(stages):
            ax.scatter(intensity(r), r["gflops"], color=color, s=18,
                       alpha=0.35 + 0.65 * (k + 1) / len(stages), zorder=3)
        best, _ = best_stage(op, data)
        if best is not None:
            ax.scatter(intensity(best), best["gflops"], s=70, facecolors="none", edgecolors=color,
                       linewidths=1.5, zorder=4, label=f"{op.name} ({best['stage']})")
        for r in _peers(recs):
            ax.scatter(intensity(r), r["gflops"], marker="x", color=color, s=30, zorder=4)
        shown += recs
    _roofline_axes(ax, [(intensity(r), r["gflops"]) for r in shown if r["flops"]],
                   data.get("peaks") or {}, tuple(key for key, _ in COMPUTE_ROOFS))
    _title(ax, "every ladder on one roofline (ringed: fastest stage, x: library peer)",
           provenance(data, shown, False))
    _grow_for_legend(ax, _legend_below(ax, most_columns=2))  # labels of 30 characters: three columns clip
    if skipped:
        ax.text(0.01, 0.99, "not drawn (no flops): " + ", ".join(skipped), transform=ax.transAxes,
                fontsize=SMALL_PT, va="top", bbox=LABEL_BOX)
    return ax


# -- figures --------------------------------------------------------------------------------------

def new_figure(panels: int = 1, height: float = PANEL_IN[1]):
    """A figure of ``panels`` panels side by side (at most two: wider would shrink below legible), each
    in a subfigure of its own so that its legend sits under it."""
    if not 1 <= panels <= 2:
        raise ValueError(f"a figure holds one or two panels side by side, not {panels}")
    width = PANEL_IN[0] * 2 if panels == 2 else PANEL_IN[0] * 1.6
    fig = plt.figure(figsize=(width, height), dpi=FIG_DPI, layout="constrained")
    subfigures = fig.subfigures(1, panels, squeeze=False)[0]
    return fig, [sub.subplots() for sub in subfigures]


# What each kind of panel draws, given (ax, data, op, upto, live).
PANELS = {
    "staircase": lambda ax, data, op, upto, live: staircase(ax, data, op, upto=upto, live=live),
    "latency": lambda ax, data, op, upto, live: latency(ax, data, op, upto=upto, live=live),
    "roofline": lambda ax, data, op, upto, live: roofline(ax, data, op, upto=upto, live=live),
    "bytes": lambda ax, data, op, upto, live: stage_bytes(ax, op, upto=upto),
}


SAVED_KINDS = ("staircase", "latency", "roofline")  # what save_all writes (bytes per stage: notebooks only)


def recorded_sizes(data: dict, op: Operator) -> int:
    """How many sizes the records hold for ``op`` (a latency line needs two)."""
    return len({tuple(r["size"]) for r in results.records_for(op.name, data)})


def figure_kinds(op: Operator, data: dict | None = None) -> list[str]:
    """The figures an operator has: the staircase always; latency against size where the records hold
    two sizes or more (given no ``data``: always); a roofline where it does arithmetic at two or more
    intensities (``roofline_says_something``; given no ``data``: wherever it does arithmetic); bytes per
    stage where some stage moves more than the minimum."""
    latency_too = data is None or recorded_sizes(data, op) > 1
    roofline_too = has_roofline(op) if data is None else roofline_says_something(op, data)
    return (["staircase"] + (["latency"] if latency_too else []) + (["roofline"] if roofline_too else [])
            + (["bytes"] if has_stage_bytes(op) else []))


def caption(op: Operator, kinds: list[str]) -> str:
    """Markdown that says what a figure of these panels (``kinds``, left to right) shows, naming a
    panel's side only where there are two: the caption follows the figure actually drawn."""
    metric_words = ("GFLOP/s, under the compute peak" if op.bound == "compute"
                    else "effective GB/s, under the measured bandwidth of its memory pattern")
    what = {
        "staircase": ("**Staircase**", f"each stage at the headline size in {metric_words} (dotted line), and "
                      "each library peer as a line of its own colour and dash"),
        "latency": ("**Latency against size**", "on log-log axes a flat line is launch-bound (a few µs whatever "
                    "the size), a slope of one is bandwidth-bound; each shape family has its own line style; the "
                    "dotted grey line is the least time the roofline allows, a floor no stage can cross"),
        "roofline": ("**Roofline**", "each stage's arithmetic intensity (flops over the bytes its own traffic "
                     "model moves) against its rate. Under the slanted memory roof a kernel can only get faster "
                     "by moving its bytes faster; under a flat compute roof, by doing its arithmetic faster"),
        "bytes": ("**Bytes moved per stage**", "what each stage moves against the minimum: a stage that reads "
                  "or writes an intermediate result in global memory pays for it in bytes; fusing kernels removes those "
                  "round trips"),
    }
    other = sorted({s.precision.upper() for s in op.stages if s.precision})
    if other:  # gemm's TF32 stages: their bars' % is of that precision's peak, drawn as a sparser dotted line
        what["staircase"] = (what["staircase"][0], what["staircase"][1].replace(
            "(dotted line)", f"(dotted line; a stage computing in {', '.join(other)}: its % is of that "
                             "precision's peak, the sparser dotted line)"))
    sides = ["(left)", "(right)"] if len(kinds) == 2 else [""]
    return " ".join(f"{what[k][0]}{' ' + side if side else ''}: {what[k][1]}." for k, side in zip(kinds, sides))


def ladder_figure(data: dict, op: Operator, kinds: list[str], *, upto: str | None = None, live: bool = False):
    """One figure of one or two panels (``kinds`` from PANELS) for ``op``'s stages up to ``upto``."""
    fig, axes = new_figure(len(kinds))
    for kind, ax in zip(kinds, axes):
        PANELS[kind](ax, data, op, upto, live)
        ax.set_gid(kind)  # what the panel is, for whoever reads the figure back (nb.Picture, the tests)
    return fig


def png(fig, dpi: int = FIG_DPI) -> bytes:
    """The figure as a PNG with a 128-colour palette (plots lose nothing visible; files shrink ~3x)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", pad_inches=PNG_PAD_IN, facecolor="white",
                metadata={"Software": None})
    data = buf.getvalue()
    try:
        from PIL import Image
    except ImportError:  # no Pillow: the full-colour PNG
        return data
    image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    small = io.BytesIO()
    image.save(small, format="PNG", optimize=True)
    return small.getvalue() if small.tell() < len(data) else data


def save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(fig))
    plt.close(fig)
    return path


# Beside the PNGs save_all writes: for each, a hash of the records it was drawn from and of the PNG itself,
# so that a test can tell a committed figure drawn from other records (older peaks, a stage re-recorded)
# from one drawn from today's.
MANIFEST = "drawn_from.json"


def data_hash(data: dict, op: Operator) -> str:
    """A hash of what ``op``'s saved figures are drawn from: its records in ``data`` (every size) and the
    file's device and measured peaks. Any change there changes the figures, and this hash."""
    drawn = {"device": data.get("device"), "peaks": data.get("peaks") or {},
             "records": sorted(results.records_for(op.name, data), key=lambda r: json.dumps(r, sort_keys=True))}
    return hashlib.sha256(json.dumps(drawn, sort_keys=True, default=str).encode()).hexdigest()[:16]


def png_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def read_manifest(out_dir: Path) -> dict:
    path = Path(out_dir) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    path = Path(out_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


def save_all(data: dict, op: Operator | str, out_dir: Path, *, live: bool = False, metric: str | None = None) -> list[Path]:
    """Write ``<slug>_staircase.png`` (``softmax-bf16_staircase.png``), ``_latency.png`` (where two sizes or more were recorded) and
    ``_roofline.png`` (where its stages sit at two intensities or more) into ``out_dir``: the figures
    README shows, each entered in the folder's manifest (``drawn_from.json``) with the hash of the records
    it was drawn from. The metric follows the operator (``metric`` is accepted for older callers and must agree)."""
    op = registry.operator(op) if isinstance(op, str) else op
    if metric is not None and metric != metric_of(op):
        raise ValueError(f"{op.name} is {op.bound}-bound: its plots are in {metric_of(op)}, not {metric}")
    paths_written = []
    manifest = read_manifest(out_dir)
    drawn_from = data_hash(data, op)
    for kind in SAVED_KINDS:  # a kind no longer drawn (a roofline of one column) leaves no stale PNG behind
        (Path(out_dir) / f"{op.slug}_{kind}.png").unlink(missing_ok=True)
        manifest.pop(f"{op.slug}_{kind}.png", None)
    for kind in [k for k in figure_kinds(op, data) if k in SAVED_KINDS]:
        path = save(ladder_figure(data, op, [kind], live=live), Path(out_dir) / f"{op.slug}_{kind}.png")
        manifest[path.name] = {"data": drawn_from, "png": png_hash(path)}
        paths_written.append(path)
    _write_manifest(out_dir, manifest)
    return paths_written


def committed_plots_out_of_date(out_dir: Path = paths.COMMITTED_PLOTS_DIR) -> dict[str, str]:
    """{figure or operator: why} for every committed figure not drawn from today's records in results/
    (each operator's newest recorded file, as the tables read them): missing, drawn from other records,
    changed since it was drawn, or no longer drawn at all."""
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    stale: dict[str, str] = {}
    expected = set()
    files = results.load_all()
    for op in registry.load_operators().values():
        data = results.latest_file_with(op.name, files)
        if data is None:
            continue
        drawn_from = data_hash(data, op)
        for kind in [k for k in figure_kinds(op, data) if k in SAVED_KINDS]:
            name = f"{op.slug}_{kind}.png"
            expected.add(name)
            entry = manifest.get(name)
            if not (out_dir / name).exists() or entry is None:
                stale[name] = "missing"
            elif entry["data"] != drawn_from:
                stale[name] = "drawn from other records than today's"
            elif entry["png"] != png_hash(out_dir / name):
                stale[name] = "changed since it was drawn"
    for path in out_dir.glob("*.png"):
        if path.name not in expected:
            stale[path.name] = "no longer drawn (no records, or a kind this operator no longer has)"
    return stale


def update_committed_plots(out_dir: Path = paths.COMMITTED_PLOTS_DIR, log=print) -> list[Path]:
    """Redraw the committed figures that are out of date (``committed_plots_out_of_date``) and remove
    those no longer drawn; the figures of unchanged records are left as they are (drawing all takes minutes)."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir = Path(out_dir)
    stale = committed_plots_out_of_date(out_dir)
    ops = {op.slug: op for op in registry.load_operators().values()}  # figures are named by slug
    redrawn = []
    for name in sorted({n.rsplit("_", 1)[0] for n in stale}):
        data = results.latest_file_with(ops[name].name) if name in ops else None
        if data is None:  # an operator without records (or gone): its figures go
            for kind in SAVED_KINDS:
                (out_dir / f"{name}_{kind}.png").unlink(missing_ok=True)
            manifest = read_manifest(out_dir)
            _write_manifest(out_dir, {k: v for k, v in manifest.items() if not k.startswith(f"{name}_")})
            log(f"removed the figures of {name}: no records")
            continue
        written = save_all(data, ops[name], out_dir)
        log(f"drew {', '.join(p.name for p in written)}")
        redrawn += written
    return redrawn


# -- the course, by Part (99_compare_all) ------------------------------------------------------------

BAR_ROW_IN = 0.24  # height of one operator's row in a by-Part figure: its name on the axis stays legible


def part_figure(rows: list[tuple[Operator, dict, dict | None, dict]], title: str):
    """One Part's operators as horizontal bars, each named on its axis: the best stage's % of the measured
    peak, the strongest library peer's as a red tick on the same row, the value written past the bar's end
    and the tick.
    A row is (operator, best stage's record, peer's record or None, the peaks of their file). The figure
    grows with its rows and its two-entry legend sits under it, never taller than the plot."""
    fig, (ax,) = new_figure(1, height=1.6 + BAR_ROW_IN * len(rows))
    y = np.arange(len(rows))[::-1]  # the first row on top
    measured = [percent(op, best, peaks) for op, best, _, peaks in rows]  # None: no peak in its precision
    ours = [v or 0 for v in measured]
    theirs = [(percent(op, peer, peaks) if peer else None) for op, _, peer, peaks in rows]
    ax.barh(y, ours, 0.7, color="tab:green", label="best stage", zorder=2)
    peer_y = [yi for yi, t in zip(y, theirs) if t is not None]
    ax.scatter([t for t in theirs if t is not None], peer_y, marker="|", s=160, linewidths=2.5,
               color=PEER_COLOR, label="strongest library peer", zorder=LABEL_ZORDER + 1)  # over the labels
    for yi, v, t, (op, best, _, _) in zip(y, measured, theirs, rows):
        precision = bench.stage_precision(op, best["stage"])  # a TF32 stage: % of TF32's peak, not the peer's
        words = (f"{v:.0f}% {best['stage']}" + (f" (of the {precision.upper()} peak)" if precision else "")
                 if v is not None else f"{best['stage']} (no peak of its precision measured)")
        # the label starts past the bar's end and past the peer's tick, so that the tick never covers it
        ax.annotate(words, (max(v or 0, t or 0), yi), xytext=(5, 0), textcoords="offset points",
                    va="center", fontsize=SMALL_PT, bbox=LABEL_BOX, zorder=LABEL_ZORDER)
    ax.set_yticks(y, [op.name for op, _, _, _ in rows], fontsize=SMALL_PT)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.axvline(100, **PEAK_STYLE, zorder=3, label="100% of the measured peak")
    ax.set_xlim(0, max(ours + [t for t in theirs if t is not None] + [100]) * 1.45)  # room for the labels
    ax.set_xlabel("% of measured peak at the headline size", fontsize=LABEL_PT)
    _ticks(ax)
    devices = sorted({best["device"] for _, best, _, _ in rows})
    dates = sorted(best["date"][:10] for _, best, _, _ in rows)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
    _title(ax, title, f"{', '.join(devices)}, recorded {when}")
    _legend_below(ax)
    return fig
