"""Notebooks: one per operator, built from the registry so they never drift from ``solutions/``.

Two halves:

* **helpers the notebooks call** — ``show_source(stage)`` (the stage's kernels and launcher, read from
  ``solutions/``), ``check(stage)`` (a correctness run shown as a table), ``progress(op, upto=...)``
  (the staircase and latency-vs-size so far), ``roofline``, ``bytes_per_stage``, ``ladder_table``,
  ``compare_all``. On a GPU the figures are measured now (a few sizes, the stages so far); without one
  they come from ``results/`` and say where and when they were recorded, or say plainly that there
  are none yet.
* **the builder** — ``build_notebook(op)`` turns an Operator into a notebook (nbformat): the module's
  story, the bytes/flops models, how to run, one section per stage, a closing section with the whole
  ladder against the library peer. ``build_all(out_dir, execute)`` writes ``notebooks/NN_<op>.ipynb``
  in ladder order plus ``00_start_here`` and ``99_compare_all``; ``execute`` runs them with nbclient
  so that their outputs (tables, plots) show without running them.

``workbench notebooks build [--execute] [--only OP] [--sim] [--recorded] [--force]`` is the command;
``workbench notebooks list`` names the files. Committed notebooks are executed on CPU (or with
``--recorded`` on a GPU) so that their figures are the recorded ones, with device and date; the tests
check that their cells are what the builder makes from ``solutions/`` today.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import os
import re
import sys
import textwrap
import time
from pathlib import Path

from .ladder import Operator, Stage, as_size, size_label

# -- knobs ----------------------------------------------------------------------------------------


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


# In the simulator check() runs the SIM_SIZES smallest of the op's sim_sizes (None: all of them).
# The tests set WORKBENCH_NOTEBOOK_SIM_SIZES=2 to keep executing every notebook fast.
SIM_SIZES: int | None = _env_int("WORKBENCH_NOTEBOOK_SIM_SIZES")
# On a GPU, progress() measures the stages so far now, at this many sizes (smallest bench size, a middle
# one, the headline size); LIVE = False (or WORKBENCH_NOTEBOOK_LIVE=0) shows the figures recorded in
# results/ instead.
LIVE = os.environ.get("WORKBENCH_NOTEBOOK_LIVE", "1").strip() != "0"
LIVE_SIZES = 3
FIG_DPI = 80  # figures embedded in the committed notebooks: legible, and small in git

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
START_HERE = "00_start_here.ipynb"
COMPARE_ALL = "99_compare_all.ipynb"
KERNEL_NAME = "python3"
EXECUTE_TIMEOUT_S = 1800  # per cell


# -- small display helpers ----------------------------------------------------------------------

def _display(obj) -> None:
    try:
        from IPython.display import display
    except ImportError:  # plain Python: print what a notebook would show
        print(obj)
        return
    display(obj)


class Table:
    """A small table that renders as HTML in a notebook and as aligned text elsewhere."""

    def __init__(self, headers: list[str], rows: list[list], title: str = "", note: str = ""):
        self.headers, self.rows, self.title, self.note = headers, [[str(c) for c in r] for r in rows], title, note

    def _repr_html_(self) -> str:
        import html

        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows)
        title = f"<p><b>{html.escape(self.title)}</b></p>" if self.title else ""
        note = f"<p><i>{html.escape(self.note)}</i></p>" if self.note else ""
        return f"{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"

    def __repr__(self) -> str:
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h)
                  for i, h in enumerate(self.headers)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        out = ([self.title] if self.title else []) + [line(self.headers), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows] + ([self.note] if self.note else [])
        return "\n".join(out)


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def fmt_count(n: float, unit: str = "flop") -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{int(n)} {unit}"


def pretty_size(size) -> str:
    """(268435456,) -> '268435456 (2^28)'; (4096, 4096) -> '4096x4096'."""
    size = as_size(size)
    label = size_label(size)
    if len(size) == 1 and size[0] >= 1024 and size[0] & (size[0] - 1) == 0:
        label += f" (2^{size[0].bit_length() - 1})"
    return label


# -- the mode and the models ----------------------------------------------------------------------

def about_mode() -> None:
    """Print whether kernels run on a GPU or in the simulator, and what that means for this notebook."""
    import workbench
    from . import device

    print(f"workbench.MODE = {workbench.MODE!r}")
    if device.is_simulator():
        print(device.SIMULATOR_NOTICE.format(reason=device.probe().reason))
        print("Here: check() runs every stage at the simulator sizes; plots show figures recorded on a GPU "
              "in results/ (labelled 'recorded', with device and date).")
    elif device.mode() == "compile":
        print("compile mode (WORKBENCH_MODE=compile): kernels compile to PTX but nothing runs; "
              "plots show figures recorded in results/.")
    else:
        from . import results

        env = results.environment()
        print(f"GPU: {env['device']} (compute capability {env.get('compute_capability')}, "
              f"{env.get('sm_count')} SMs), numba-cuda {env.get('numba_cuda')}")
        print("Here: check() runs every stage at the GPU check sizes; progress() measures the stages so far "
              "now (labelled 'measured now')" if LIVE else "Here: plots show figures recorded in results/.")


def operator(name: str) -> Operator:
    from .ladder import load_operators

    return load_operators()[name]


def _recorded_peaks() -> tuple[dict, str]:
    from . import results

    for data in results.load_all():
        if data.get("peaks", {}).get("copy_gbps"):
            return data["peaks"], data.get("device", "?")
    return {}, ""


def models(op: Operator) -> None:
    """The bytes and flops a kernel must at least move/do at each bench size, and the time floor that
    the measured peak bandwidth (or compute rate) puts under them."""
    peaks, dev = _recorded_peaks()
    compute = op.bound == "compute"
    peak = peaks.get("gemm_fp32_gflops") if compute else peaks.get("copy_gbps")
    headers = ["size", "bytes (minimum)", "flops", "flop / byte"]
    if peak:
        headers.append(f"floor at {peak:.0f} {'GFLOP/s' if compute else 'GB/s'} (µs)")
    rows = []
    for size in [as_size(s) for s in op.bench_sizes]:
        b, f = int(op.bytes_moved(size)), int(op.flops(size))
        row = [size_label(size), fmt_bytes(b), fmt_count(f), f"{f / b:.3g}" if b else "—"]
        if peak:
            row.append(f"{(f if compute else b) / peak / 1e3:.3g}")
        rows.append(row)
    note = (f"The floor is the time the {'measured cuBLAS fp32 rate' if compute else 'measured copy bandwidth'} "
            f"of {dev} allows; no stage can beat it." if peak else
            "No measured peak in results/ yet: run `workbench peaks` on a GPU to see the time floor.")
    _display(Table(headers, rows, f"{op.name}: what every stage must at least do", note))


# -- source ---------------------------------------------------------------------------------------

class Source:
    """Python source that renders syntax-highlighted in a notebook (inline styles: no stylesheet per
    cell, so committed notebooks stay small) and as plain text elsewhere."""

    def __init__(self, code: str, title: str = ""):
        self.code, self.title = code, title

    def _repr_html_(self) -> str:
        import html

        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        body = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))
        return (f"<p><code>{html.escape(self.title)}</code></p>" if self.title else "") + body

    def __repr__(self) -> str:
        return (f"# {self.title}\n" if self.title else "") + self.code


# The stage's paragraph in its decorator, which the notebook shows as text just above the source.
_STAGE_PARAGRAPH = re.compile(r"""(@\w+\.stage\(\s*(["'])[^"']*\2,\s*)(\"\"\"|\'\'\')(.*?)\3""", re.S)


def show_source(stage: Stage, paragraph: bool = False) -> None:
    """The stage's kernels and launcher, read from solutions/ (never pasted), syntax-highlighted. The
    paragraph in the stage's decorator is elided (the notebook prints it above) unless ``paragraph``."""
    module = stage.launch.__module__
    code = stage.source()
    if not paragraph:
        code = _STAGE_PARAGRAPH.sub(lambda m: m.group(1) + '"""(the paragraph above)"""', code, count=1)
    _display(Source(code, f"{module.replace('.', '/')}.py: stage {stage.order}, {stage.name}"))


# -- correctness ----------------------------------------------------------------------------------

def check_sizes(op: Operator) -> list:
    """The sizes check() uses: the simulator sizes (the SIM_SIZES smallest) on CPU, check sizes on a GPU."""
    from . import device

    if not device.is_simulator():
        return [as_size(s) for s in op.check_sizes]
    sizes = sorted((as_size(s) for s in op.sim_sizes), key=lambda s: (math.prod(s), s))
    chosen = sizes[:SIM_SIZES] if SIM_SIZES else sizes
    return [s for s in (as_size(x) for x in op.sim_sizes) if s in chosen]  # in the op's own order


def check(stage: Stage, sizes=None, seed: int = 0) -> None:
    """Run the stage against the float64 reference at each size, show a table; raise if any failed."""
    import numpy as np

    from . import device
    from .check import check_stage

    sizes = [as_size(s) for s in sizes] if sizes else check_sizes(stage.op)
    rng = np.random.default_rng(seed)
    rows, failed = [], []
    for size in sizes:
        t0 = time.perf_counter()
        r = check_stage(stage, size, rng)
        took = time.perf_counter() - t0
        verdict = "skipped" if r.skipped else ("ok" if r.passed else "FAIL")
        rows.append([size_label(size), f"{r.rel_err:.3g}", f"{r.tolerance:.1g}", verdict,
                     f"{took:.2f}", r.message])
        if not r.passed:
            failed.append(r)
    where = "in the simulator" if device.is_simulator() else "on the GPU"
    _display(Table(["size", "rel. error", "tolerance", "result", "seconds", "message"], rows,
                   f"{stage.key} {where}: {len(sizes) - len(failed)} of {len(sizes)} sizes pass",
                   "rel. error = ‖out − ref‖ / ‖ref‖ against a float64 reference on fresh random inputs; "
                   "the output was poisoned with NaN first."))
    if failed:
        raise AssertionError(f"{stage.key}: {len(failed)} check(s) failed: " + "; ".join(r.message for r in failed))


# -- figures: live on a GPU, recorded otherwise -----------------------------------------------------

_LIVE_CACHE: dict = {}  # (op, size) -> {stage name: record, "__peer__": [records]}
_LIVE_ENV: dict = {}


def _live_sizes(op: Operator) -> list[tuple]:
    sizes = [as_size(s) for s in op.bench_sizes]
    picks = [sizes[0], sizes[len(sizes) // 2], as_size(op.headline_size)] if sizes else [as_size(op.headline_size)]
    out: list[tuple] = []
    for s in picks:
        if s not in out:
            out.append(s)
    return sorted(out, key=math.prod)[-LIVE_SIZES:] if len(out) > LIVE_SIZES else out


def _live_peaks(env: dict) -> dict:
    if "peaks" not in _LIVE_ENV:
        from . import results

        path = results.path_for(env["device"])
        stored = results.load(path).get("peaks", {}) if path.exists() else {}
        if not stored.get("copy_gbps"):
            from .peaks import measure_peaks

            print("measuring this GPU's peaks (copy bandwidth, library GEMM) once...")
            stored = measure_peaks()
        _LIVE_ENV["peaks"] = stored
    return _LIVE_ENV["peaks"]


def _live_data(op: Operator, stages: list[Stage]) -> dict:
    """Measure (once per notebook session) the given stages and the peer at a few sizes."""
    import numpy as np

    from . import results
    from .bench import bench_size

    if "env" not in _LIVE_ENV:
        _LIVE_ENV["env"] = results.environment()
    env = _LIVE_ENV["env"]
    peaks = _live_peaks(env)
    rng = np.random.default_rng(0)
    records = []
    for size in _live_sizes(op):
        cache = _LIVE_CACHE.setdefault((op.name, size), {})
        todo = [s for s in stages if s.name not in cache]
        need_peer = "__peer__" not in cache
        if todo or need_peer:
            new, failures = bench_size(op, todo, size, peaks, rng, env, with_peer=need_peer)
            if need_peer:
                cache["__peer__"] = [r for r in new if r.get("kind") == "peer"]
            for r in new:
                if r.get("kind") == "stage":
                    cache[r["stage"]] = r
            for s in todo:  # a stage that failed its check gets no figure (and is not re-timed)
                cache.setdefault(s.name, None)
            for failure in failures:
                print(f"FAIL (not timed) {failure}")
        records += cache["__peer__"] + [cache[s.name] for s in stages if cache.get(s.name) is not None]
    return {"device": env["device"], "peaks": peaks, "records": records}


def _stages_upto(op: Operator, upto: str | None) -> list[Stage]:
    if upto is None:
        return list(op.stages)
    return [s for s in op.stages if s.order <= op[upto].order]


def figures(op: Operator, upto: str | None = None) -> tuple[dict | None, bool, str]:
    """(data, live, note): the records to draw for ``op``'s stages up to ``upto``.

    On a GPU (and LIVE), measured now; otherwise the newest recorded file in results/ for this op,
    cut to the stages so far. ``data`` is None when there is nothing to show; ``note`` says why."""
    from . import device, results

    stages = _stages_upto(op, upto)
    names = {s.name for s in stages}
    if not device.is_simulator() and device.mode() == "gpu" and LIVE:
        return _live_data(op, stages), True, ""
    recorded = results.latest_file_with(op.name)
    if recorded is None:
        where = results.results_dir()
        try:
            where = where.resolve().relative_to(NOTEBOOK_DIR.parent.resolve())
        except ValueError:
            pass
        return None, False, (f"No recorded figures yet for {op.name} in {where}/. On a GPU machine, "
                             f"`workbench run {op.name}` measures the ladder and records it; this cell will then "
                             "draw them (with device and date).")
    recs = [r for r in results.records_for(op.name, recorded)
            if r.get("kind") == "peer" or r.get("stage") in names]
    data = {"device": recorded.get("device", "?"), "peaks": recorded.get("peaks", {}), "records": recs}
    missing = [s.name for s in stages if not any(r.get("stage") == s.name for r in recs)]
    note = ""
    if missing:
        note = (f"No recorded figures on {data['device']} for stage(s) {', '.join(missing)} yet "
                f"(recorded before they existed?): `workbench bench {op.name}` on a GPU adds them.")
    if not any(r.get("kind") == "stage" for r in recs):
        return None, False, note
    return data, False, note


def _metric(op: Operator) -> str:
    return "gflops" if op.bound == "compute" else "gbps"


def _has_stage_bytes(op: Operator) -> bool:
    return any(s.bytes_moved is not None for s in op.stages)


class Picture:
    """A finished figure as a palette PNG (128 colours: plots lose nothing visible, and the committed
    notebooks shrink about 3x). ``figure`` keeps the matplotlib Figure for whoever wants to look closer."""

    def __init__(self, figure):
        import io

        buf = io.BytesIO()
        figure.savefig(buf, format="png", dpi=FIG_DPI, bbox_inches="tight", facecolor="white")
        self.figure, self.png = figure, buf.getvalue()
        try:
            from PIL import Image

            image = Image.open(io.BytesIO(self.png)).convert("RGB")
            image = image.quantize(colors=128, method=Image.Quantize.MEDIANCUT)
            small = io.BytesIO()
            image.save(small, format="PNG", optimize=True)
            if small.tell() < len(self.png):
                self.png = small.getvalue()
        except Exception:  # no Pillow: the full-colour PNG
            pass

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        titles = [ax.get_title().split("\n")[0] for ax in self.figure.axes if ax.get_title()]
        return f"<figure: {'; '.join(titles)}>"


def _show(fig) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    _display(Picture(fig))
    plt.close(fig)


def _subplots(n: int, width: float = 6.2, height: float = 4.2):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(width * n, height), dpi=FIG_DPI, squeeze=False)
    return fig, list(axes[0])


def progress(op: Operator, upto: str | None = None) -> None:
    """Side by side: the staircase so far (GB/s, or GFLOP/s with the roofline for a compute-bound op)
    and latency against size so far; a bytes-per-stage panel where stages move different amounts."""
    from . import plots

    data, live, note = figures(op, upto)
    if note:
        print(note)
    if data is None:
        if _has_stage_bytes(op):  # what needs no measurement: the bytes each stage moves, from its model
            bytes_per_stage(op, upto)
        return
    panels = ["staircase", "latency"]
    if op.bound == "compute":
        panels.append("roofline")
    if _has_stage_bytes(op):
        panels.append("bytes")
    fig, axes = _subplots(len(panels))
    for name, ax in zip(panels, axes):
        if name == "staircase":
            plots.staircase(data, op.name, size=op.headline_size, upto=upto, metric=_metric(op), ax=ax, live=live)
            bars = sorted({(r["order"], r["stage"]) for r in plots.headline(data["records"], op.headline_size)
                           if r.get("kind") == "stage"})
            _recolor(ax, op, [n for _, n in bars])
        elif name == "latency":
            plots.latency(data, op.name, upto=upto, ax=ax, live=live)
            _recolor(ax, op)
        elif name == "roofline":
            plots.roofline(data, op.name, size=op.headline_size, ax=ax, live=live)
            _recolor(ax, op)
        else:
            plot_stage_bytes(data, op.name, size=op.headline_size, ax=ax, live=live, op=op)
    _show(fig)


def stage_colors(op: Operator) -> dict:
    """One colour per stage for the whole notebook, whatever subset of stages a figure shows (the plots
    colour by position among the stages they are given, so 'so far' figures would shift colours)."""
    from . import plots

    return {s.name: plots._color(s.order - 1, len(op.stages)) for s in op.stages}


def _recolor(ax, op: Operator, bar_names: list[str] | None = None) -> None:
    colors = stage_colors(op)
    if bar_names:
        from matplotlib.patches import Rectangle

        bars = [p for p in ax.patches if isinstance(p, Rectangle)]
        for bar, name in zip(bars, bar_names):
            if name in colors:
                bar.set_facecolor(colors[name])
    for artist in list(ax.lines) + list(ax.collections):
        if artist.get_label() in colors:
            artist.set_color(colors[artist.get_label()])
    legend = ax.get_legend()
    if legend is not None:  # its handles were copied when it was made: make it again
        ax.legend(fontsize=legend.get_texts()[0].get_fontsize() if legend.get_texts() else 8, loc=legend._loc,
                  ncol=getattr(legend, "_ncols", 1))


def roofline(op: Operator) -> None:
    """Every stage at the headline size under the memory and compute roofs."""
    from . import plots

    data, live, note = figures(op)
    if note:
        print(note)
    if data is None:
        return
    fig, (ax,) = _subplots(1, width=8, height=4.8)
    plots.roofline(data, op.name, size=op.headline_size, ax=ax, live=live)
    _recolor(ax, op)
    _show(fig)


def plot_stage_bytes(data: dict, op_name: str, *, size=None, upto: str | None = None, ax=None, live: bool = False,
                     source: str | None = None, op: Operator | None = None):
    """Bytes each stage moves (its own traffic model, ``stage_bytes``) against the minimum any kernel
    must move (``bytes``), one bar per stage at one size: what fusing kernels saves."""
    import matplotlib.pyplot as plt

    from . import plots

    recs = plots.headline([r for r in data["records"] if r["op"] == op_name and r.get("kind") == "stage"], size)
    recs = sorted(recs, key=lambda r: r["order"])
    names = [r["stage"] for r in recs]
    if upto is not None and upto in names:
        recs = recs[: names.index(upto) + 1]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4))
    minimum = max((r["bytes"] for r in recs), default=0)
    values = [r.get("stage_bytes", r["bytes"]) for r in recs]
    unit, scale = next(((u, k) for u, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
                        if max(values + [minimum]) >= k), ("B", 1))
    colors = stage_colors(op) if op is not None else {}
    bars = ax.bar([r["stage"] for r in recs], [v / scale for v in values],
                  color=[colors.get(r["stage"], plots._color(i, len(names))) for i, r in enumerate(recs)])
    for bar, v in zip(bars, values):
        ax.annotate(f"{v / minimum:.2g}x" if minimum else "", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    if minimum:
        ax.axhline(minimum / scale, **plots.PEAK_STYLE, label=f"minimum (each input read once, output written once) "
                                                             f"{fmt_bytes(minimum)}")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_ylabel(f"{unit} moved per call")
    ax.set_ylim(0, max([v / scale for v in values] + [minimum / scale]) * 1.25 or 1)
    ax.tick_params(axis="x", rotation=20)
    size_txt = recs[0]["size_label"] if recs else "?"
    prov = source or plots._provenance(data, recs, live)
    ax.set_title(f"{op_name} @ {size_txt}: bytes moved per stage\n{prov}", fontsize=10)
    return ax


def bytes_per_stage(op: Operator, upto: str | None = None) -> None:
    """The bytes-moved-per-stage bars, from the records where there are any, else from the models."""
    data, live, _ = figures(op, upto)
    source = None
    if data is None or not any(r.get("kind") == "stage" and "stage_bytes" in r for r in data["records"]):
        size = as_size(op.headline_size)
        data = {"device": "model", "peaks": {}, "records": [
            {"op": op.name, "stage": s.name, "order": s.order, "kind": "stage", "size": list(size),
             "size_label": size_label(size), "bytes": int(op.bytes_moved(size)), "stage_bytes": s.traffic(size)}
            for s in _stages_upto(op, upto)]}
        source = "from the stages' traffic models (no recorded figures needed)"
    fig, (ax,) = _subplots(1, width=7.5, height=4)
    plot_stage_bytes(data, op.name, size=op.headline_size, upto=upto, ax=ax, live=live, source=source, op=op)
    _show(fig)


def ladder_table(op: Operator) -> None:
    """The ladder at its headline size against the library peer (the README's table)."""
    from IPython.display import Markdown

    from .cli import ladder_table as _table

    data, live, note = figures(op)
    if note:
        print(note)
    if data is None:
        return
    _display(Markdown(("Measured now. " if live else "Recorded. ") + _table(op.name, data)))


# -- across operators -----------------------------------------------------------------------------

def list_ladders() -> None:
    """Every operator, its stages and its notebook."""
    from .ladder import load_operators

    rows = []
    for name, op in load_operators().items():
        rows.append([notebook_name(op), op.title, op.bound, " → ".join(s.name for s in op.stages)])
    _display(Table(["notebook", "operator", "bound by", "stages"], rows, "The ladders"))


def _best(op: Operator, data: dict) -> tuple[dict | None, dict | None]:
    from .plots import headline

    recs = headline([r for r in data["records"] if r["op"] == op.name], op.headline_size)
    stages = [r for r in recs if r.get("kind") == "stage"]
    peers_ = [r for r in recs if r.get("kind") == "peer"]
    best = min(stages, key=lambda r: r["median_us"], default=None)
    return best, (peers_[0] if peers_ else None)


def compare_all() -> None:
    """Each operator's best stage at its headline size against its library peer, from results/."""
    from . import results
    from .ladder import load_operators

    rows, bars = [], []
    for name, op in load_operators().items():
        data = results.latest_file_with(name)
        best, peer = _best(op, data) if data else (None, None)
        if best is not None:
            bars.append((name, best, peer))
        if best is None:
            rows.append([name, op.bound, size_label(as_size(op.headline_size)), "—", "—", "—", "—", "—",
                         "no recorded figures yet"])
            continue
        m = _metric(op)
        unit = "GFLOP/s" if m == "gflops" else "GB/s"
        pct = f"{best['pct_of_peak']:.0f}%" if best.get("pct_of_peak") is not None else "—"
        rows.append([name, op.bound, best["size_label"], best["stage"], f"{best[m]:.0f} {unit}", pct,
                     f"{peer['stage']} {peer[m]:.0f} {unit}" if peer else "—",
                     f"{peer['median_us'] / best['median_us']:.2f}x" if peer else "—",
                     f"{data.get('device', '?')}, {best['date'][:10]}"])
    _display(Table(["operator", "bound", "size", "best stage", "rate", "% of peak", "library peer",
                    "best vs peer (time ratio)", "recorded on"], rows,
                   "Every ladder's best stage against its library peer",
                   "% of peak: of the measured copy bandwidth (memory-bound) or cuBLAS fp32 rate (compute-bound). "
                   "best vs peer > 1 means the stage is faster than the library."))
    if not bars:
        return
    import numpy as np

    fig, (ax,) = _subplots(1, width=max(6.0, 0.9 * len(bars) + 2), height=4.2)
    x = np.arange(len(bars))
    ours = [b.get("pct_of_peak") or 0 for _, b, _ in bars]
    theirs = [(p.get("pct_of_peak") or 0) if p else 0 for _, _, p in bars]
    ax.bar(x - 0.2, ours, 0.4, label="best stage", color="tab:green")
    ax.bar(x + 0.2, theirs, 0.4, label="library peer", color="tab:red", alpha=0.7)
    for xi, v in zip(x, ours):
        ax.annotate(f"{v:.0f}", (xi - 0.2, v), ha="center", va="bottom", fontsize=7)
    ax.axhline(100, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(x, [f"{n}\n{b['stage']}" for n, b, _ in bars], rotation=30, fontsize=8, ha="right")
    ax.set_ylabel("% of measured peak")
    devices = sorted({b["device"] for _, b, _ in bars})
    dates = sorted(b["date"][:10] for _, b, _ in bars)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
    ax.set_title(f"best stage vs library, % of peak at each headline size\n{', '.join(devices)}, recorded {when}",
                 fontsize=10)
    ax.legend(fontsize=8)
    _show(fig)


def roofline_all() -> None:
    """One roofline with every operator's stages (from the recorded file holding the most operators)."""
    from . import results
    from .ladder import load_operators

    names = list(load_operators())
    files = [(sum(1 for n in names if results.records_for(n, d)), d) for d in results.load_all()]
    files = [(k, d) for k, d in files if k]
    if not files:
        print(f"No recorded figures yet (nothing in {results.results_dir()}): run `workbench run OP` on a GPU.")
        return
    _, data = max(files, key=lambda kd: kd[0])
    ops = [n for n in names if results.records_for(n, data)]
    others = [n for n in names if n not in ops]
    if others:
        print(f"not recorded on {data.get('device')}: {', '.join(others)}")
    fig, (ax,) = _subplots(1, width=10, height=6)
    _roofline_of_operators(ax, data, ops)
    _show(fig)


def _roofline_of_operators(ax, data: dict, ops: list[str]) -> None:
    """One colour per operator: its stages as dots that darken up the ladder, its fastest stage ringed
    and named, its library peer a cross; the memory and compute roofs from the recorded peaks."""
    import matplotlib.pyplot as plt

    from . import plots
    from .ladder import load_operators

    registry = load_operators()
    cmap = plt.get_cmap("tab20")
    shown, skipped = [], []
    for i, name in enumerate(ops):
        recs = plots.headline([r for r in data["records"] if r["op"] == name],
                              registry[name].headline_size if name in registry else None)
        if not recs or all(r["flops"] == 0 for r in recs):
            skipped.append(name)  # no arithmetic (a transpose): no point on a log-log roofline
            continue
        color = cmap(i % 20)
        stages = sorted((r for r in recs if r.get("kind") == "stage"), key=lambda r: r["order"])
        for k, r in enumerate(stages):
            ax.scatter(r["flops"] / r["bytes"], r["gflops"], color=color, s=18,
                       alpha=0.35 + 0.65 * (k + 1) / len(stages), zorder=3)
        best = min(stages, key=lambda r: r["median_us"], default=None)
        if best is not None:
            x, y = best["flops"] / best["bytes"], best["gflops"]
            ax.scatter(x, y, s=70, facecolors="none", edgecolors=color, linewidths=1.5, zorder=4,
                       label=f"{name} ({best['stage']})")
            ax.annotate(name, (x, y), fontsize=7, xytext=(5, 3), textcoords="offset points", color=color)
        for r in recs:
            if r.get("kind") == "peer":
                ax.scatter(r["flops"] / r["bytes"], r["gflops"], marker="x", color=color, s=30, zorder=4)
        shown += recs
    xs = [r["flops"] / r["bytes"] for r in shown if r["flops"]] or [1]
    lo, hi = min(xs + [0.05]) / 2, max(xs + [100]) * 4
    peaks = data.get("peaks", {})
    copy = peaks.get("copy_gbps")
    for key, label in (("gemm_fp32_gflops", "fp32 (cuBLAS)"), ("gemm_tf32_gflops", "TF32 (cuBLAS)")):
        top = peaks.get(key)
        if copy and top:
            ax.plot([lo, top / copy, hi], [copy * lo, top, top], color="gray", linewidth=1)
            ax.annotate(f"{label} {top / 1e3:.0f} TFLOP/s", (hi, top), ha="right", va="bottom", fontsize=7)
    if copy:
        ax.annotate(f"memory {copy:.0f} GB/s", (lo, copy * lo), fontsize=7, va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte, from the models)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("every ladder on one roofline (ringed: fastest stage, x: library peer)\n"
                 + plots._provenance(data, shown, False), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if shown:
        ax.legend(fontsize=7, loc="lower right", ncol=2 if len(ops) > 8 else 1)
    if skipped:
        ax.text(0.01, 0.99, "not drawn (no flops): " + ", ".join(skipped), transform=ax.transAxes,
                fontsize=7, va="top")


# == the builder ==================================================================================

def module_of(op: Operator):
    """The solutions module that defines ``op``."""
    for fn in [s.launch for s in op.stages] + [op.reference, op.make_inputs]:
        module = sys.modules.get(getattr(fn, "__module__", ""))
        if module is not None and module.__name__.startswith("solutions"):
            return module
    raise LookupError(f"cannot tell which solutions module defines {op.name}")


def model_text(fn) -> str | None:
    """How a model computes, as written in solutions/: a lambda's expression with its trailing comment
    ('4 * size[0] + 4'), or a named function's whole source (several lines). None if unreadable."""
    is_lambda = getattr(fn, "__name__", "") == "<lambda>"
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except Exception:  # e.g. a lambda on the line that closes a triple-quoted string
        if not is_lambda:
            return None
        try:
            import linecache

            first = fn.__code__.co_firstlineno
            src = "".join(linecache.getlines(inspect.getsourcefile(fn))[first - 1:first + 4])
        except Exception:
            return None
    if not is_lambda:
        return src.strip()
    candidates = []
    at = src.find("lambda")
    while at >= 0:
        text = src[at:]
        for end in range(len(text), 0, -1):  # the longest prefix that is one lambda
            try:
                tree = ast.parse(text[:end], mode="eval")
            except SyntaxError:
                continue
            if isinstance(tree.body, ast.Lambda):
                expr = ast.unparse(tree.body.body)
                line_rest = text[end:].split("\n", 1)[0]
                comment = line_rest.split("#", 1)[1].strip() if "#" in line_rest else ""
                code = compile(text[:end], "<model>", "eval").co_consts
                same = any(getattr(c, "co_code", None) == fn.__code__.co_code and c.co_names == fn.__code__.co_names
                           for c in code)
                candidates.append((not same, expr + (f"  # {comment}" if comment else "")))
                break
        at = src.find("lambda", at + 6)
    return min(candidates)[1] if candidates else None


def _model_md(label: str, fn) -> str:
    text = model_text(fn)
    if text is None:
        return ""
    if "\n" in text:
        return f"- {label}:\n\n  ```python\n" + textwrap.indent(text, "  ") + "\n  ```"
    return f"- {label}: `{text}`"


def _models_md(op: Operator) -> str:
    size = as_size(op.headline_size)
    b, f = int(op.bytes_moved(size)), int(op.flops(size))
    bt, ft = _model_md("bytes moved, at least", op.bytes_moved), _model_md("flops", op.flops)
    lines = ["## What the ladder must do: the models", ""]
    lines.append(
        "Every stage is judged against the least work any kernel must do: read each input once, write the "
        "output once (the **bytes model**), and do the arithmetic the result needs (the **flops model**). "
        "Rates in the plots divide these by the measured time, so a stage that moves more than the minimum "
        "shows a lower rate, not a higher one.")
    lines.append("")
    if bt or ft:
        lines.append(f"With `size` the problem size (here a tuple of {len(size)}, e.g. `{size_label(size)}` is "
                     f"`{tuple(size)}`):")
        lines.append("")
    lines += [t for t in (bt, ft) if t]
    inten = f / b if b else float("inf")
    lines.append(f"- at the headline size {pretty_size(size)}: **{fmt_bytes(b)}** moved and **{fmt_count(f)}**, "
                 f"an arithmetic intensity of **{inten:.3g} flop/byte**.")
    lines.append("")
    if op.bound == "compute":
        lines.append(
            "That intensity is far above the ridge of the roofline (an H200 moves about 4 TB/s and computes about "
            "50 TFLOP/s in fp32: about 12 flop per byte), so this ladder is **compute-bound**: it is measured in "
            "GFLOP/s and \"% of peak\" is of the library's (cuBLAS) fp32 rate on the same GPU.")
    else:
        lines.append(
            "That is far below the ridge of the roofline (an H200 moves about 4 TB/s and computes about 50 TFLOP/s "
            "in fp32: about 12 flop per byte), so this ladder is **memory-bound**: the best a stage can do is move "
            "the minimum bytes at the measured copy bandwidth, and \"% of peak\" is of that bandwidth.")
    odd = [s for s in op.stages if s.bytes_moved is not None]
    if odd:
        lines.append("")
        lines.append("Some stages move more than the minimum (their own traffic model), at the headline size:")
        lines.append("")
        for s in op.stages:
            t = s.traffic(size)
            lines.append(f"- {s.order}. `{s.name}`: {fmt_bytes(t)} ({t / b:.2g}x the minimum)")
    return "\n".join(lines)


HOW_TO_RUN_MD = """\
## How to run this notebook

The workbench decides when it is imported whether there is a CUDA GPU:

- **GPU** (`workbench.MODE == 'gpu'`): `check()` runs each stage at the GPU check sizes (up to the
  large ones), and `progress()` measures the stages so far *now*, at a few sizes, next to the library
  peer. The plots say "measured now".
- **CPU** (`workbench.MODE == 'sim'`): kernels run in numba's CUDA simulator, one Python thread per CUDA
  thread. Every stage is still checked for correctness, at small sizes; timings would mean nothing, so
  the plots show figures **recorded** on a GPU in `results/`, labelled with the device and date.

`WORKBENCH_MODE=sim` forces the simulator on a GPU machine. The notebooks are generated from
`solutions/` by `workbench notebooks build` (add `--execute` to run them): edit the ladder, not the notebook.
"""


def _code(src: str):
    import nbformat.v4 as v4

    return v4.new_code_cell(src.strip("\n"))


def _md(src: str):
    import nbformat.v4 as v4

    return v4.new_markdown_cell(src.strip("\n"))


def _finish(cells: list, name: str):
    """A notebook with stable cell ids (so rebuilding changes nothing that did not change)."""
    import nbformat.v4 as v4

    nb = v4.new_notebook()
    for i, cell in enumerate(cells):
        cell["id"] = f"{name[:40]}-{i:02d}"
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["workbench"] = {"generated_by": "workbench notebooks build", "source_hash": source_hash(nb)}
    return nb


def _import_cell(op: Operator) -> str:
    module = module_of(op)
    short = module.__name__.rsplit(".", 1)[-1]
    get = f"{short}.op" if getattr(module, "op", None) is op else f"nb.operator({op.name!r})"
    return (f"import workbench                 # chooses GPU or simulator before numba is imported\n"
            f"from workbench import notebook as nb\n"
            f"from solutions import {short}   # the ladder: every stage is {short}.<stage name>\n\n"
            f"op = {get}\n"
            f"nb.about_mode()")


def build_notebook(op: Operator):
    """The notebook for one operator: its story, its models, then a section per stage, then the whole ladder."""
    module = module_of(op)
    short = module.__name__.rsplit(".", 1)[-1]
    doc = inspect.cleandoc(module.__doc__ or op.title)
    first, _, rest = doc.partition("\n")
    story = f"**{first.strip()}**\n\n{rest.strip()}"
    main = getattr(module, "op", None)
    if isinstance(main, Operator) and main is not op:  # a further operator of a module (OPERATORS)
        story = (f"This ladder lives in `solutions/{short}.py`, next to the `{main.name}` ladder "
                 f"(notebook `{notebook_name(main)}`), whose story it shares:\n\n> " + story.replace("\n", "\n> "))
    runnable = [s for s in op.stages if not s.gpu_only] or list(op.stages)
    by_hand = (f"{short}.{runnable[0].name}" if getattr(module, runnable[0].name, None) is runnable[0]
               else f"op[{runnable[0].name!r}]") if runnable else "print"
    cells = [
        _md(f"# {op.title}: the `{op.name}` ladder\n\n{story}\n\n"
            f"The ladder has {len(op.stages)} stages: " + ", ".join(f"{s.order}. `{s.name}`" for s in op.stages)
            + f". Each section below shows a stage's kernel (read from `solutions/{short}.py`), checks it "
            "against a float64 reference, and plots how far the ladder has climbed so far."),
        _md(HOW_TO_RUN_MD),
        _code(_import_cell(op)),
        _md(_models_md(op)),
        _code("nb.models(op)  # the same models at every bench size (and the time floor, where a peak is recorded)"),
        _md("### Calling a stage by hand\n\nA stage is a plain function on device arrays. `check()` below does "
            "this for you (fresh random inputs, an output poisoned with NaN, a float64 reference), but "
            "nothing more is hidden:"),
        _code(
            "import numpy as np\n"
            "from numba import cuda\n\n"
            "size = nb.check_sizes(op)[-1]\n"
            "inputs = op.make_inputs(size, np.random.default_rng(0))\n"
            "d_inputs = [cuda.to_device(a) for a in inputs]\n"
            "d_out = cuda.device_array_like(op.make_output(size))\n"
            f"{by_hand}(*d_inputs, d_out)  # the stage checks its arguments, then launches its kernels\n"
            "got, want = d_out.copy_to_host(), op.reference(*inputs)\n"
            "print(f\"size {size}: max |got - want| = {np.abs(got - want).max():.3g} (float64 reference)\")"),
    ]
    for s in op.stages:
        ref = f"op[{s.name!r}]"
        text = f"## {s.order}. `{s.name}`\n\n{s.summary}"
        if s.gpu_only:
            text += f"\n\n> **GPU only**: {s.gpu_only}. In the simulator its check is skipped."
        cells += [
            _md(text),
            _code(f"nb.show_source({ref})"),
            _code(f"nb.check({ref})"),
            _code(f"nb.progress(op, upto={s.name!r})"),
        ]
    metric_words = ("GFLOP/s, under the compute peak" if op.bound == "compute"
                    else "effective GB/s, under the measured copy bandwidth")
    cells += [
        _md("## The whole ladder\n\n"
            f"**Staircase** (left): each stage at the headline size in {metric_words} (dotted line) and the "
            "library peer (dashed red). **Latency against size** (right), log-log: a flat line is launch-bound "
            "(a few µs whatever the size), a slope of one is bandwidth-bound; the dotted line is the time the "
            "minimum bytes take at peak bandwidth, a floor no stage can cross."),
        _code("nb.progress(op)"),
    ]
    if op.bound != "compute" and op.flops(as_size(op.headline_size)) > 0:  # (no roofline point at 0 flops)
        cells += [
            _md("**Roofline**: each stage's arithmetic intensity (flops over minimum bytes) against its rate. "
                "Under the slanted memory roof a kernel can only get faster by moving its bytes faster."),
            _code("nb.roofline(op)"),
        ]
    cells += [
        _md("**Bytes moved per stage** against the minimum: a stage that reads or writes an intermediate "
            "result in global memory pays for it in bytes; fusing kernels removes those round trips."),
        _code("nb.bytes_per_stage(op)"),
        _md("**The ladder against the library** (the README's table): median time, effective rate, % of the "
            "measured peak, and the time ratio to the peer (above 1x: faster than the library)."),
        _code("nb.ladder_table(op)"),
        _md(f"## Your turn\n\n`exercises/{short}.py` is this ladder with the heart of each kernel cut out: "
            "each `TODO(exercise)` block replaces what sits between `# BEGIN SOLUTION` and `# END SOLUTION` in "
            f"`solutions/{short}.py`, with numbered hints (read one at a time). Fill one in, then grade it "
            f"with `workbench grade {op.name}` (or `{op.name}.STAGE`), or in "
            "`notebooks/90_grade_yourself.ipynb`: the same checks the solutions pass, and on a GPU a speed bar."),
    ]
    return _finish(cells, op.name)


def build_start_here(ops: dict):
    example = next(iter(ops.values()), None)
    cells = [
        _md("""\
# numba-cuda-workbench: start here

Learn to write fast GPU kernels with `numba.cuda` by watching them get fast. Each operator (a sum, an
elementwise expression, a transpose, softmax, layernorm, a matrix product...) is a **ladder**: a sequence
of kernels, each a small change from the one before (naive → coalesced → shared-memory tiles → warp-level →
fused), each **correct on any valid input** and each **measured**. The notebooks walk one ladder each:
the kernel, its check, and how far the ladder has climbed so far."""),
        _md(HOW_TO_RUN_MD.replace("this notebook", "the notebooks")),
        _code("import workbench\nfrom workbench import notebook as nb\n\nnb.about_mode()"),
        _md("## The ladders"),
        _code("nb.list_ladders()"),
        _md("""\
## How a ladder works

A ladder lives in one module, `solutions/<op>.py`. It builds an `Operator` (what is computed: a float64
reference, random inputs, the output's shape, and **models** of the least bytes and flops any kernel must
move and do) and registers each stage with `@op.stage("name", "what changed and why it is faster")` on a
launcher that runs module-level `@cuda.jit` kernels on device arrays.

- **Checked**: every stage runs on fresh random inputs (never zeros or `arange`, which hide wrong
  indexing), into an output poisoned with NaN (an element never written shows up), and is compared with a
  float64 reference by relative error ‖out − ref‖ / ‖ref‖; sizes include ones that are not multiples of
  the block or tile. `workbench check OP[.STAGE]`.
- **Measured** (GPU): median of many samples, with the inputs rotated through more memory than the L2
  cache holds, launches back to back so Python is not in the numbers, next to the library peer (torch or
  CuPy) on the same arrays. `workbench bench OP`, recorded in `results/<device>.json`.
- **Compiled for sm_90** in the CPU test suite: `workbench ptx OP` shows registers, spills and shared memory."""),
    ]
    if example is not None and example.stages:
        cells += [
            _md(f"For example, the first stage of the `{example.name}` ladder, read from "
                f"`solutions/{module_of(example).__name__.rsplit('.', 1)[-1]}.py`, and its check:"),
            _code(f"op = nb.operator({example.name!r})\n"
                  "nb.show_source(op.stages[0], paragraph=True)  # with the paragraph in its decorator"),
            _code("nb.check(op.stages[0])"),
        ]
    cells += [
        _md("""\
## How to read the plots

- **Staircase**: one bar per stage at the operator's headline (large) size, in effective GB/s (the
  minimum bytes divided by the time) for memory-bound operators, GFLOP/s for compute-bound ones. The
  dotted line is the peak measured on that GPU (a copy kernel's bandwidth, or cuBLAS's fp32 rate), the
  dashed red line the library peer. Each bar is labelled with its rate and its % of the peak.
- **Latency against size** (log-log): small sizes are launch-bound (a few µs, flat), large sizes
  bandwidth-bound (a slope of one). The dotted line is the minimum bytes at peak bandwidth: a floor.
- **Roofline**: arithmetic intensity (flop per byte, from the models) against GFLOP/s, under the memory
  roof (slanted) and the compute roofs (flat). Memory-bound operators sit far left.
- **Bytes moved per stage**: each stage's own traffic against the minimum: what fusion saves.

Every figure's title names the device and the date of its records: "recorded" (from `results/`) or
"measured now" (on this GPU, this session)."""),
    ]
    if example is not None and example.stages:
        cells += [_code("nb.progress(op)")]
    cells += [
        _md("""\
## Exercises

`exercises/` holds every ladder with the heart of each kernel cut out (`exercises/README.md` lists them).
In `solutions/`, the part a learner writes sits between `# BEGIN SOLUTION` and `# END SOLUTION`, after one
to three `# HINT:` lines (vague, then specific); the exercise keeps the kernel's signature, its
shared-memory declarations and the launcher, and turns the marked region into a `TODO(exercise)` block
with the hints. Fill one in, then grade it: `workbench grade OP` (or `OP.STAGE`), or
`notebooks/90_grade_yourself.ipynb`. The grader judges with the solution's reference, inputs and sizes,
and on a GPU also asks for a share of the solution's speed.

## Commands

`workbench list` (the ladders) · `check OP[.STAGE]` · `bench OP` (GPU) · `run OP` (check, bench, plot) ·
`plot OP` · `table OP` · `ptx OP` · `doctor` · `grade [OP[.STAGE]]` · `exercises build` ·
`notebooks build [--execute]` (these notebooks, from `solutions/`)."""),
    ]
    return _finish(cells, "start-here")


def build_compare_all(ops: dict):
    cells = [
        _md("""\
# Every ladder side by side

Each operator's fastest stage at its headline size against its library peer, with its % of the measured
peak (copy bandwidth for memory-bound operators, cuBLAS fp32 for compute-bound ones), then one roofline with
every stage of every operator. Figures come from `results/` (recorded on a GPU, with device and date)."""),
        _code("import workbench\nfrom workbench import notebook as nb\n\nnb.about_mode()"),
        _code("nb.compare_all()"),
        _md("Memory-bound operators sit left of the ridge, on the slanted roof: their ceiling is bandwidth. "
            "Compute-bound ones (GEMM) sit right, under the flat compute roofs."),
        _code("nb.roofline_all()"),
    ]
    return _finish(cells, "compare-all")


# -- names, hashes, writing, executing -----------------------------------------------------------

def notebook_name(op: Operator, ops: dict | None = None) -> str:
    """NN_<op>.ipynb: NN from solutions.LADDER_ORDER (1-based); operators not listed follow."""
    import solutions

    from .ladder import load_operators

    order = list(getattr(solutions, "LADDER_ORDER", ()))
    if op.name in order:
        return f"{order.index(op.name) + 1:02d}_{op.name}.ipynb"
    extra = [n for n in (ops or load_operators()) if n not in order]
    return f"{len(order) + 1 + extra.index(op.name):02d}_{op.name}.ipynb"


def cell_sources(nb) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in nb.cells]


def source_hash(nb) -> str:
    return hashlib.sha256(json.dumps(cell_sources(nb)).encode()).hexdigest()[:16]


def build_all_notebooks() -> dict:
    """{file name: notebook} for every operator, plus start-here and compare-all."""
    from .ladder import load_operators

    ops = load_operators()
    out = {START_HERE: build_start_here(ops)}
    for op in ops.values():
        out[notebook_name(op, ops)] = build_notebook(op)
    out[COMPARE_ALL] = build_compare_all(ops)
    return out


def kernel_env(extra: dict | None = None) -> dict:
    """The environment for the notebook kernel: this interpreter's bin/ first on PATH (the kernelspec
    says just "python"), so the kernel imports the same workbench as the caller."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # ... and finds workbench and solutions even where the project is not pip-installed (`python3 -m workbench`)
    root = str(NOTEBOOK_DIR.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env.update(extra or {})
    return env


def execute_notebook(nb, cwd: Path, timeout: int = EXECUTE_TIMEOUT_S, env: dict | None = None):
    """Run every cell in a fresh kernel (kernel "python3", this interpreter), outputs written in place."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME, record_timing=False,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(env=kernel_env(env))
    return nb


class HandEdited(RuntimeError):
    """A notebook was edited by hand since it was generated: not overwritten without --force."""


def _hand_edited(path: Path) -> bool:
    import nbformat

    try:
        old = nbformat.read(path, as_version=4)
    except Exception:
        return False
    recorded = old.metadata.get("workbench", {}).get("source_hash")
    return recorded is not None and recorded != source_hash(old)


def build_all(out_dir: Path | str = NOTEBOOK_DIR, execute: bool = False, only: list[str] | None = None,
              force: bool = False, env: dict | None = None, log=print) -> list[Path]:
    """Write notebooks/NN_<op>.ipynb for every operator, 00_start_here and 99_compare_all.

    Without ``execute``, a notebook whose cells are unchanged is left alone (its outputs kept); a changed
    one is written without outputs. With ``execute`` each is run (nbclient) and saved with its outputs.
    A notebook edited by hand since it was generated is not overwritten unless ``force``."""
    import nbformat

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, failed = [], []
    for name, nb in build_all_notebooks().items():
        if only and not any(o == name or o == name.split("_", 1)[-1].removesuffix(".ipynb") for o in only):
            continue
        path = out_dir / name
        if path.exists():
            if not force and _hand_edited(path):
                raise HandEdited(f"{path} was edited by hand since it was generated; move it aside or pass --force")
            if not execute and cell_sources(nbformat.read(path, as_version=4)) == cell_sources(nb):
                log(f"up to date: {path}")
                continue
        if execute:
            from nbclient.exceptions import CellExecutionError

            t0 = time.perf_counter()
            log(f"executing {name} ...")
            try:
                execute_notebook(nb, out_dir, env=env)
            except CellExecutionError as exc:  # written anyway, with the traceback in the failing cell
                first = next((ln for ln in str(exc).splitlines() if "Error" in ln and ":" in ln), str(exc)[:200])
                log(f"  FAILED: {first.strip()}")
                failed.append(name)
            log(f"  ran in {time.perf_counter() - t0:.0f} s")
        nbformat.validate(nb)
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, path)
        log(f"wrote {path}")
        written.append(path)
    if failed:
        raise NotebookFailed(f"a cell failed in {', '.join(failed)} (the traceback is in the notebook)")
    return written


class NotebookFailed(RuntimeError):
    """A notebook's cell raised while executing; the notebook was still written, with the traceback."""


# -- CLI: `workbench notebooks build [--execute]` ----------------------------------------------------

def stale_notebooks(out_dir: Path | str = NOTEBOOK_DIR) -> list[str]:
    """Notebooks that are missing or whose cells differ from what the builder makes now."""
    import nbformat

    stale = []
    for name, nb in build_all_notebooks().items():
        path = Path(out_dir) / name
        if not path.exists() or cell_sources(nbformat.read(path, as_version=4)) != cell_sources(nb):
            stale.append(name)
    return stale


def cmd_notebooks(args) -> int:
    if args.action == "list":
        for name in build_all_notebooks():
            print(name)
        return 0
    if args.action == "check":
        stale = stale_notebooks(args.out)
        for name in stale:
            print(f"out of date: {Path(args.out) / name}")
        if stale:
            only = " ".join(f"--only {n}" for n in stale)
            print(f"rebuild: workbench notebooks build --execute {only}", file=sys.stderr)
        return 1 if stale else 0
    env = {}
    if args.sim:
        env["WORKBENCH_MODE"] = "sim"
    if args.recorded:
        env["WORKBENCH_NOTEBOOK_LIVE"] = "0"
    try:
        build_all(Path(args.out), execute=args.execute, only=args.only, force=args.force, env=env)
    except (HandEdited, NotebookFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # nbclient's CellExecutionError names the failing cell
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def add_cli(sub) -> None:
    s = sub.add_parser("notebooks", help="build (and --execute) the notebooks from solutions/")
    s.add_argument("action", choices=["build", "check", "list"],
                   help="build: write (and with --execute run) them; check: list those out of date; list: names")
    s.add_argument("--execute", action="store_true", help="run them (nbclient) and save their outputs")
    s.add_argument("--only", action="append", help="an operator (e.g. reduction) or a file name; repeatable")
    s.add_argument("--out", default=str(NOTEBOOK_DIR))
    s.add_argument("--force", action="store_true", help="overwrite notebooks edited by hand")
    s.add_argument("--sim", action="store_true", help="execute in the simulator even on a GPU machine")
    s.add_argument("--recorded", action="store_true",
                   help="on a GPU, plot the figures recorded in results/ instead of measuring them now "
                        "(what the committed notebooks should show)")
    s.set_defaults(func=cmd_notebooks)
