"""The three pictures of a ladder, drawn from records (live, or recorded in ``results/``).

* staircase: effective bandwidth (or GFLOP/s) of each stage at the headline size, with the measured
  peak and the library peer as horizontal lines;
* latency against size, log-log, one line per stage: flat where launch-bound, a slope of one where
  bandwidth-bound;
* roofline: each stage's arithmetic intensity against its rate, under the memory and compute roofs.

Every figure is titled with the device and the date of the records it shows.
"""

from __future__ import annotations

from pathlib import Path

import math

import matplotlib.pyplot as plt

from .ladder import as_size

STAGE_COLORS = plt.get_cmap("viridis")
PEER_STYLE = dict(color="tab:red", linestyle="--", linewidth=1.5)
PEAK_STYLE = dict(color="black", linestyle=":", linewidth=1.5)


def _records(data: dict, op: str) -> list[dict]:
    return [r for r in data["records"] if r["op"] == op]


def _provenance(data: dict, recs: list[dict], live: bool) -> str:
    dates = sorted(r["date"][:10] for r in recs) or ["?"]
    when = dates[-1] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
    how = "measured now" if live else "recorded"
    return f"{data.get('device', '?')}, {how} {when}"


def _stage_names(recs: list[dict]) -> list[str]:
    stages = sorted({(r["order"], r["stage"]) for r in recs if r.get("kind") == "stage"})
    return [name for _, name in stages]


def _color(i: int, n: int):
    return STAGE_COLORS(0.1 + 0.8 * i / max(n - 1, 1))


def headline(recs: list[dict], size) -> list[dict]:
    size = list(as_size(size)) if size is not None else None
    if size is None or not any(r["size"] == size for r in recs):
        size = max((r["size"] for r in recs), key=math.prod, default=None)
    return [r for r in recs if r["size"] == size]


def staircase(data: dict, op: str, *, size=None, upto: str | None = None, metric: str = "gbps", ax=None, live=False):
    """Bars per stage at one size; stages after ``upto`` are left out (notebooks reveal them one by one)."""
    recs = headline(_records(data, op), size)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4))
    names = _stage_names(recs)
    if upto is not None and upto in names:
        names = names[: names.index(upto) + 1]
    by_stage = {r["stage"]: r for r in recs if r.get("kind") == "stage"}
    values = [by_stage[n][metric] for n in names]
    bars = ax.bar(names, values, color=[_color(i, len(_stage_names(recs))) for i in range(len(names))])
    for bar, name in zip(bars, names):
        r = by_stage[name]
        label = f"{r[metric]:.0f}" + (f"\n{r['pct_of_peak']:.0f}%" if r.get("pct_of_peak") is not None else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    peaks = data.get("peaks", {})
    peak = peaks.get("copy_gbps") if metric == "gbps" else peaks.get("gemm_fp32_gflops")
    if peak:
        ax.axhline(peak, **PEAK_STYLE, label=f"measured peak ({'copy' if metric == 'gbps' else 'cuBLAS fp32'}) {peak:.0f}")
    for r in recs:
        if r.get("kind") == "peer":
            ax.axhline(r[metric], **PEER_STYLE, label=f"{r['stage']} {r[metric]:.0f}")
    unit = "GB/s (effective)" if metric == "gbps" else "GFLOP/s"
    size_txt = recs[0]["size_label"] if recs else "?"
    ax.set_ylabel(unit)
    ax.set_title(f"{op} @ {size_txt}: {unit}\n{_provenance(data, recs, live)}", fontsize=10)
    ax.tick_params(axis="x", rotation=20)
    top = max(values + [peak or 0] + [r[metric] for r in recs if r.get("kind") == "peer"], default=1) or 1
    positive = [v for v in values if v > 0]
    if positive and top / min(positive) > 100:  # early stages would be invisible on a linear axis
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 3, top * 40)  # headroom for the labels and the legend
    else:
        ax.set_ylim(0, top * 1.2)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def latency(data: dict, op: str, *, upto: str | None = None, ax=None, live=False):
    """Median latency against bytes moved, log-log, one line per stage, the peer dashed."""
    recs = _records(data, op)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4))
    names = _stage_names(recs)
    if upto is not None and upto in names:
        names = names[: names.index(upto) + 1]
    all_names = _stage_names(recs)
    for name in names:
        pts = sorted((r["bytes"], r["median_us"]) for r in recs if r["stage"] == name)
        ax.plot(*zip(*pts), marker="o", markersize=3, color=_color(all_names.index(name), len(all_names)), label=name)
    for peer in sorted({r["stage"] for r in recs if r.get("kind") == "peer"}):
        pts = sorted((r["bytes"], r["median_us"]) for r in recs if r["stage"] == peer)
        ax.plot(*zip(*pts), **PEER_STYLE, label=peer)
    copy = data.get("peaks", {}).get("copy_gbps")
    if copy and recs:
        # The bandwidth floor, drawn only where it is within sight of the measurements.
        floor_us = min(r["median_us"] for r in recs) / 3
        lo = max(min(r["bytes"] for r in recs), floor_us * copy * 1e3)
        hi = max(r["bytes"] for r in recs)
        if hi > lo:
            ax.plot([lo, hi], [lo / copy / 1e3, hi / copy / 1e3], **PEAK_STYLE, label="bytes / peak bandwidth")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes moved (model)")
    ax.set_ylabel("median latency (µs)")
    ax.set_title(f"{op}: latency against size\n{_provenance(data, recs, live)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def roofline(data: dict, op: str | list[str], *, size=None, ax=None, live=False):
    """Stages as points under the roofs min(bandwidth x intensity, compute peak)."""
    ops = [op] if isinstance(op, str) else op
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.5))
    peaks = data.get("peaks", {})
    all_recs = []
    for name in ops:
        recs = headline(_records(data, name), size if len(ops) == 1 else None)
        all_recs += recs
        stages = _stage_names(recs)
        # Stages of one operator share an intensity (same bytes and flops models): a legend, not labels.
        for r in sorted(recs, key=lambda r: r.get("order", 0)):
            intensity = r["flops"] / r["bytes"]
            label = f"{name}.{r['stage']}" if len(ops) > 1 else r["stage"]
            if r.get("kind") == "peer":
                ax.scatter(intensity, r["gflops"], marker="x", color="tab:red", zorder=3, label=label)
            else:
                ax.scatter(intensity, r["gflops"], color=_color(stages.index(r["stage"]), len(stages)), zorder=3,
                           label=label)
    xs = [r["flops"] / r["bytes"] for r in all_recs] or [1]
    lo, hi = min(xs + [0.05]) / 2, max(xs + [100]) * 4
    copy = peaks.get("copy_gbps")
    for key, label in (("gemm_fp32_gflops", "fp32 (cuBLAS)"), ("gemm_tf32_gflops", "TF32 (cuBLAS)")):
        top = peaks.get(key)
        if copy and top:
            ridge = top / copy
            ax.plot([lo, ridge, hi], [copy * lo, top, top], color="gray", linewidth=1)
            ax.annotate(f"{label} {top / 1e3:.0f} TFLOP/s", (hi, top), ha="right", va="bottom", fontsize=7)
    if copy:
        ax.annotate(f"memory {copy:.0f} GB/s", (lo, copy * lo), fontsize=7, rotation=0, va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte, from the models)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"roofline: {', '.join(ops)}\n{_provenance(data, all_recs, live)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best", ncol=2 if len(all_recs) > 8 else 1)
    return ax


def save_all(data: dict, op: str, out_dir: Path, *, metric: str = "gbps", live: bool = False) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (("staircase", lambda ax: staircase(data, op, metric=metric, ax=ax, live=live)),
                       ("latency", lambda ax: latency(data, op, ax=ax, live=live)),
                       ("roofline", lambda ax: roofline(data, op, ax=ax, live=live))):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        draw(ax)
        fig.tight_layout()
        path = out_dir / f"{op}_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
