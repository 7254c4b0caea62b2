"""What a notebook's cells call: ``from workbench import nb``.

Each generated notebook (``workbench notebooks build``) is a chapter of the course: it walks one ladder, then
its variants, with these helpers:

* ``about_mode()``: GPU or simulator, and what that means for the cells below;
* ``models(op)``: the bytes and flops every stage must at least move and do, and the time floor;
* ``show_diff(stage)``: what changed from the previous stage (the lesson), then ``show_source(stage)``:
  the stage's kernels and launcher, read from ``solutions/`` (never pasted);
* ``check(stage)``: the stage against the float64 reference at every check size, and on the operator's
  adversarial inputs at one of them, shown as a table that fills in while it runs; a failure raises,
  a stage the simulator cannot run shows as skipped (never as passed);
* ``simulated_counters(stage)``: the profiler's counters counted in the simulator (sectors per request,
  bank conflicts, divergent branches per source line) and one warp's addresses drawn for the worst line;
  ``counter_changes(stage)``: the lines whose counters moved from the previous stage, drawn before and after;
* ``progress(op, upto=...)``: the staircase and latency-against-size figures of the stages so far;
  ``roofline(op)``, ``bytes_per_stage(op)``, ``ladder_table(op)`` for the whole ladder;
* ``variants(chapter)`` (a chapter's variants side by side), ``compare_part(part)``, ``roofline_all()``,
  ``gradeable_stages()`` across operators.

Figures are drawn by :mod:`workbench.plots`. On a GPU they are measured now (a few sizes, the stages so
far, each timed once per session); without one they come from ``results/`` and say where and when they
were recorded, or say plainly that there are none yet.
"""

from __future__ import annotations

import math
import os
import re
import time

import numpy as np

from . import curriculum, device, diff, markers, paths, plots, registry, results, tables
from .check import adversarial_cases, check_stage
from .ladder import Operator, Stage, as_size, size_label

# -- knobs ----------------------------------------------------------------------------------------


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


# In the simulator check() runs the SIM_SIZES smallest of the operator's sim_sizes (None: all of them).
SIM_SIZES: int | None = _env_int("WORKBENCH_NOTEBOOK_SIM_SIZES")
# On a GPU, progress() measures the stages so far now, at LIVE_SIZES sizes (smallest bench size, a middle
# one, the headline size); WORKBENCH_NOTEBOOK_LIVE=0 shows the figures recorded in results/ instead.
LIVE = os.environ.get("WORKBENCH_NOTEBOOK_LIVE", "1").strip() != "0"
LIVE_SIZES = 3


# -- showing things -------------------------------------------------------------------------------

def show(obj) -> None:
    """Display ``obj`` in a notebook (its richest form), or print it elsewhere."""
    try:
        from IPython.display import display
    except ImportError:
        print(obj)
        return
    display(obj)


# Printed text wraps at word boundaries at this many characters: JupyterLab's output area at 1280 px
# shows about 120 monospace characters and, past them, breaks a line wherever it reaches the edge,
# mid-word (its CSS is `word-break: break-all`). 100 also fits GitHub's notebook view and a terminal.
PRINT_COLUMNS = 100


def wrapped(text: str, columns: int = PRINT_COLUMNS) -> str:
    """``text`` with each line longer than ``columns`` wrapped at word boundaries (a word longer than a
    line, a path, stays whole), its continuation indented under a bullet's text."""
    import textwrap

    out = []
    for line in text.splitlines() or [""]:
        bullet = re.match(r"\s*(?:[•\-*]|\d+\.)\s+", line)
        indent = " " * (bullet.end() if bullet else len(line) - len(line.lstrip()))
        out.append(textwrap.fill(line, columns, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False) if len(line) > columns else line)
    return "\n".join(out)


def say(text: str) -> None:
    """Print ``text`` wrapped to PRINT_COLUMNS, so that no output breaks a word at the page's edge."""
    print(wrapped(text), flush=True)


class LiveDisplay:
    """An output that is redrawn in place as work goes on (a notebook's display_id); in a terminal,
    each ``line`` is printed instead, so slow work is never silent."""

    def __init__(self, obj):
        self.obj = obj
        self.handle = None
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is not None:
            self.handle = display(obj, display_id=True)

    def update(self, line: str = "") -> None:
        if self.handle is not None:
            self.handle.update(self.obj)
        elif line:
            say(line)


class Table:
    """A small table that renders as HTML in a notebook and as aligned text elsewhere."""

    def __init__(self, headers: list[str], rows: list[list], title: str = "", note: str = ""):
        self.headers, self.title, self.note = headers, title, note
        self.rows = [[str(c) for c in r] for r in rows]

    def _repr_html_(self) -> str:
        import html

        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows)
        note = f"<p><i>{html.escape(self.note)}</i></p>" if self.note else ""
        return f"{first_line(self.title)}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"

    def __repr__(self) -> str:
        widths = [max([len(h)] + [len(r[i]) for r in self.rows]) for i, h in enumerate(self.headers)]

        def line(cells):
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

        out = ([self.title] if self.title else []) + [line(self.headers), line(["-" * w for w in widths])]
        return "\n".join(out + [line(r) for r in self.rows] + ([self.note] if self.note else []))


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
        return first_line(self.title) + body

    def __repr__(self) -> str:
        return (f"# {self.title}\n" if self.title else "") + self.code


class Diff:
    """A stage's change against the previous stage: HTML with added and removed lines marked, and the
    unified diff as plain text (what GitHub and a terminal show)."""

    def __init__(self, stage_diff: diff.StageDiff):
        self.diff = stage_diff

    def _repr_html_(self) -> str:
        return diff.as_html(self.diff)

    def __repr__(self) -> str:
        return diff.as_text(self.diff)


def first_line(title: str) -> str:
    """An output's title as the first line of its HTML, in plain text: a folded output in JupyterLab shows its
    first line as a preview, which would otherwise read ``<p><b>...``."""
    import html

    return f"{html.escape(title)}\n" if title else ""


class Picture:
    """A finished figure as the PNG ``plots.png`` makes (what README's figures are, too); ``figure``
    keeps the matplotlib Figure for whoever wants to look closer."""

    def __init__(self, figure):
        self.figure, self.png = figure, plots.png(figure)

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        titles = [ax.get_title().split("\n")[0] for ax in self.figure.get_axes() if ax.get_title()]
        return f"<figure: {'; '.join(titles)}>"


class RecordedPicture:
    """A PNG a measuring script drew and left in results/ (for an operator `workbench bench` cannot time)."""

    def __init__(self, path):
        self.path = path

    def _repr_png_(self) -> bytes:
        return self.path.read_bytes()

    def __repr__(self) -> str:
        return f"<figure: {self.path.relative_to(results.results_dir().parent).as_posix()}>"


def show_figure(fig) -> None:
    import matplotlib.pyplot as plt

    show(Picture(fig))
    plt.close(fig)


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


def source_path(op: Operator) -> str:
    """The ladder's file as a reader finds it: 'solutions/softmax.py' (absolute if outside the checkout)."""
    path = registry.source_file(op).resolve()
    try:
        return path.relative_to(paths.REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return str(path)


# -- the mode and the models ----------------------------------------------------------------------

def operator(name: str) -> Operator:
    return registry.operator(name)


def about_mode() -> None:
    """Print whether kernels run on a GPU or in the simulator, and what that means for this notebook."""
    import workbench

    say(f"workbench.MODE = {workbench.MODE!r}")
    if device.is_simulator():
        say(device.SIMULATOR_NOTICE.format(reason=device.probe().reason))
        say("Here: check() runs every stage at the simulator sizes; plots show figures recorded on a GPU "
            "in results/ (labelled 'recorded', with device and date).")
    elif device.mode() == "compile":
        say("compile mode (WORKBENCH_MODE=compile): kernels compile to PTX but nothing runs; "
            "plots show figures recorded in results/.")
    else:
        env = results.environment()
        say(f"GPU: {env['device']} (compute capability {env.get('compute_capability')}, "
            f"{env.get('sm_count')} SMs), numba-cuda {env.get('numba_cuda')}")
        say("Here: check() runs every stage at the GPU check sizes; progress() measures the stages so far "
            "now (labelled 'measured now')" if LIVE else "Here: plots show figures recorded in results/.")


def _recorded_peaks() -> tuple[dict, str]:
    for data in results.load_all():
        if (data.get("peaks") or {}).get("copy_gbps"):
            return data["peaks"], data.get("device", "?")
    return {}, ""


def models(op: Operator) -> None:
    """The bytes and flops a kernel must at least move/do at each bench size, and the time floor that
    the measured peak bandwidth (or compute rate) puts under them."""
    peaks, dev = _recorded_peaks()
    compute = op.bound == "compute"
    peak, peak_name = plots.peak_of(op, peaks)
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
    note = (f"The floor is the time the measured {peak_name} {'rate' if compute else 'bandwidth'} "
            f"of {dev} allows; no stage can beat it." if peak else
            f"No measured {peak_name if compute else 'copy'} peak in results/ yet: `workbench peaks` on a GPU "
            "measures the peaks the time floor needs.")
    show(Table(headers, rows, f"{op.name}: what every stage must at least do", note))


# -- source and diff ------------------------------------------------------------------------------

def show_source(stage: Stage, paragraph: bool = False) -> None:
    """The stage's kernels and launcher, read from solutions/ (never pasted), syntax-highlighted. The
    paragraph in the stage's decorator is elided (the notebook prints it above) unless ``paragraph``."""
    code = stage.source() if paragraph else diff.elide_paragraph(stage.source())
    show(Source(code, f"{source_path(stage.op)}: stage {stage.order}, {stage.name}"))


def show_diff(stage: Stage, against: Stage | None = None) -> None:
    """What changed in the kernels and launcher from the previous stage (or ``against``)."""
    show(Diff(diff.stage_diff(stage, against)))


# -- correctness ----------------------------------------------------------------------------------

def check_sizes(op: Operator) -> list:
    """The sizes check() uses: the simulator sizes (the SIM_SIZES smallest) on CPU, check sizes on a GPU."""
    if not device.is_simulator():
        return [as_size(s) for s in op.check_sizes]
    sizes = [as_size(s) for s in op.sim_sizes]
    chosen = sorted(sizes, key=lambda s: (math.prod(s), s))[:SIM_SIZES] if SIM_SIZES else sizes
    return [s for s in sizes if s in chosen]  # in the operator's own order


class CheckReport(Table):
    """The rows of a stage's check as they come in, and a headline that counts passed, failed and
    skipped cases apart (a skipped case was never judged: it is not a pass)."""

    HEADERS = ["size", "inputs", "rel. error", "tolerance", "result", "time", "note"]

    def __init__(self, stage: Stage, total: int):
        self.stage, self.total, self.results, self.running = stage, total, [], ""
        self.where = "in the simulator" if device.is_simulator() else "on the GPU"
        super().__init__(self.HEADERS, [], "", "rel. error = ‖out − ref‖ / ‖ref‖ against a float64 reference; "
                         "the output was poisoned with NaN first. Adversarial inputs are the operator's own "
                         "hard cases (ties, all-negative, huge values, ...), here at one size; "
                         "`workbench check` runs them at every size.")
        self.title = self.headline()

    def add(self, result, seconds: float) -> str:
        self.results.append(result)
        verdict = {"passed": "passed", "failed": "FAILED", "skipped": "skipped"}[result.status]
        row = [size_label(result.size), result.inputs,
               "—" if result.rel_err is None else f"{result.rel_err:.3g}",
               "—" if result.tolerance is None else f"{result.tolerance:.1g}",
               verdict, "—" if result.skipped else f"{seconds:.2f} s", result.message]
        self.rows.append(row)
        self.title = self.headline()
        return "  ".join(row[:6])

    def skip_reason(self) -> str:
        if self.stage.gpu_only:
            return f"needs a GPU ({self.stage.gpu_only})"
        return next((r.message for r in self.results if r.skipped), "")

    def headline(self) -> str:
        passed = sum(r.passed for r in self.results)
        failed = sum(r.failed for r in self.results)
        skipped = sum(r.skipped for r in self.results)
        judged = passed + failed
        text = f"{self.stage.key} {self.where}: "
        text += f"{passed} of {judged} cases pass" if judged else "no case run"
        if skipped:
            text += f"; {skipped} skipped: {self.skip_reason()}"
        if self.running:
            text += f" (running {self.running}, {len(self.results) + 1} of about {self.total})"
        return text

    @property
    def failures(self) -> list:
        return [r for r in self.results if r.failed]

    def failure_summary(self) -> str:
        """Each distinct failure once, with the cases it happened in: 'msg (at 1x1x1, 5x7x3)'."""
        where: dict[str, list[str]] = {}
        for r in self.failures:
            case = size_label(r.size) + ("" if r.inputs == "random" else f" {r.inputs}")
            where.setdefault(r.message, []).append(case)
        return "; ".join(f"{message} (at {', '.join(cases)})" for message, cases in where.items())


def adversarial_size(sizes: list) -> tuple | None:
    """The one size at which check() also runs the operator's adversarial inputs: the middle of the
    sizes by element count (their hard cases are about values, not sizes; ``workbench check`` and the
    grader run them at every size)."""
    ordered = sorted(sizes, key=lambda s: (math.prod(s), s))
    return ordered[len(ordered) // 2] if ordered else None


def check(stage: Stage, sizes=None, seed: int = 0) -> None:
    """Run the stage against the float64 reference at each size on random inputs, and at one size on the
    operator's adversarial inputs; the table fills in while it runs. Raises if any case failed."""
    sizes = [as_size(s) for s in sizes] if sizes else check_sizes(stage.op)
    rng = np.random.default_rng(seed)
    skip_all = bool(stage.gpu_only) and device.is_simulator()
    hard_cases_at = None if skip_all else adversarial_size(sizes)
    report = CheckReport(stage, len(sizes))
    live = LiveDisplay(report)
    for size in sizes:
        cases = [("random", None)]
        while cases:
            label, inputs = cases.pop(0)
            report.running = f"{size_label(size)}, {label} inputs"
            live.update()
            started = time.perf_counter()
            result = check_stage(stage, size, rng, inputs=inputs, label=label)
            line = report.add(result, time.perf_counter() - started)
            report.running = ""
            live.update(line)
            if label == "random" and size == hard_cases_at:  # drawn after the random case, as `check` does
                extra = adversarial_cases(stage.op, size, rng)
                cases += extra
                report.total += len(extra)
    report.title = report.headline()
    live.update()
    if live.handle is None:
        say(report.title)
    if report.failures:
        raise AssertionError(f"{stage.key}: {len(report.failures)} case(s) failed: " + report.failure_summary())


# -- figures: live on a GPU, recorded otherwise -----------------------------------------------------

_LIVE_CACHE: dict = {}  # (op, size) -> {stage name: record or None, "__peer__": [records]}
_LIVE_ENV: dict = {}


def live_sizes(op: Operator) -> list[tuple]:
    """The sizes progress() measures on a GPU: the smallest bench size, a middle one, the headline size."""
    sizes = [as_size(s) for s in op.bench_sizes]
    picks = [sizes[0], sizes[len(sizes) // 2], as_size(op.headline_size)] if sizes else [as_size(op.headline_size)]
    out: list[tuple] = []
    for s in picks:
        if s not in out:
            out.append(s)
    return sorted(out, key=math.prod)[-LIVE_SIZES:]


def _live_peaks(env: dict) -> dict:
    if "peaks" not in _LIVE_ENV:
        stored = results.stored_peaks(env["device"])
        if stored is None:
            from .ceilings import measure_peaks

            say("measuring this GPU's peaks (copy bandwidth, library GEMM) once...")
            stored = measure_peaks()
        _LIVE_ENV["peaks"] = stored
    return _LIVE_ENV["peaks"]


def _live_data(op: Operator, stages: list[Stage]) -> dict:
    """Measure (once per notebook session) the given stages and the peer at a few sizes."""
    from .bench import bench_size

    if "env" not in _LIVE_ENV:
        _LIVE_ENV["env"] = results.environment()
    env = _LIVE_ENV["env"]
    peaks = _live_peaks(env)
    rng = np.random.default_rng(0)
    records = []
    for size in live_sizes(op):
        cache = _LIVE_CACHE.setdefault((op.name, size), {})
        todo = [s for s in stages if s.name not in cache]
        need_peer = "__peer__" not in cache
        if todo or need_peer:
            started = time.perf_counter()
            new, failures = bench_size(op, todo, size, peaks, rng, env, with_peer=need_peer)
            say(f"measured {', '.join(s.name for s in todo) or 'the peer'} at {size_label(size)} "
                f"in {time.perf_counter() - started:.1f} s")
            if need_peer:
                cache["__peer__"] = [r for r in new if r.get("kind") == "peer"]
            for r in new:
                if r.get("kind") == "stage":
                    cache[r["stage"]] = r
            for s in todo:  # a stage that failed its check gets no figure (and is not re-timed)
                cache.setdefault(s.name, None)
            for failure in failures:
                say(f"FAIL (not timed) {failure}")
        records += cache["__peer__"] + [cache[s.name] for s in stages if cache.get(s.name) is not None]
    return {"device": env["device"], "peaks": peaks, "records": records}


def stages_upto(op: Operator, upto: str | None) -> list[Stage]:
    if upto is None:
        return list(op.stages)
    return [s for s in op.stages if s.order <= op[upto].order]


def figures(op: Operator, upto: str | None = None, measure: bool = True) -> tuple[dict | None, bool, str]:
    """(data, live, note): the records to draw for ``op``'s stages up to ``upto``.

    On a GPU (and LIVE, and ``measure``), measured now; otherwise the newest recorded file in results/
    for this op, cut to the stages so far. ``data`` is None when there is nothing to show; ``note`` says why."""
    stages = stages_upto(op, upto)
    names = {s.name for s in stages}
    if measure and not device.is_simulator() and device.mode() == "gpu" and LIVE:
        return _live_data(op, stages), True, ""
    recorded = results.latest_file_with(op.name)
    if recorded is None and _elsewhere(op):
        line = tables.elsewhere_stage_line(op, upto) if upto else None
        if upto not in (None, op.stages[0].name):  # the why is said once, at the first stage
            return None, False, line or ""
        return None, False, (f"{op.name} runs on several GPUs at once, which `workbench bench` (one GPU) cannot "
                             "time: `workbench record` on a machine with two GPUs or more measures it, and that "
                             "run's figures and tables close this notebook." + (f" {line}" if line else ""))
    if recorded is None:
        where = results.results_dir()
        try:
            where = where.resolve().relative_to(paths.REPO_ROOT.resolve())
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


def _elsewhere(op: Operator) -> str | None:
    """The markdown of figures a script recorded for ``op`` (AllReduce's, across GPUs), or None."""
    return tables.figures_elsewhere(op)


def _elsewhere_pictures(op: Operator) -> list:
    """The plots that script drew beside its run: results/runs/<op>_*.png."""
    return sorted((results.results_dir() / "runs").glob(f"{op.slug}_*.png"))


def progress(op: Operator, upto: str | None = None) -> None:
    """The staircase so far and latency against size so far, side by side (the staircase alone where
    only one size was measured)."""
    data, live, note = figures(op, upto)
    if note:
        say(note)
    if data is None:
        if _elsewhere(op):
            for path in _elsewhere_pictures(op) if upto is None else ():  # once, the whole ladder
                show(RecordedPicture(path))
        elif upto is not None and plots.has_stage_bytes(op):  # what needs no measurement: the bytes each
            bytes_per_stage(op, upto)  # stage so far moves, from its model (the whole ladder's has a cell of its own)
        return
    if upto is not None and not any(r.get("kind") == "stage" and r["stage"] == upto for r in data["records"]):
        return  # this stage has no figures: drawn again, the ladder so far would repeat the figure above
    show_figure(plots.ladder_figure(data, op, progress_kinds(op, data), upto=upto, live=live))


def progress_kinds(op: Operator, data: dict) -> list[str]:
    """The panels progress() draws from ``data``: the staircase, and latency where two sizes were measured."""
    return [k for k in plots.figure_kinds(op, data) if k in ("staircase", "latency")]


def roofline(op: Operator) -> None:
    """Every stage at the headline size under the memory and compute roofs, where the stages sit at two
    or more intensities; otherwise the sentence that says where they all sit."""
    if not plots.has_roofline(op):
        say(f"{op.name} does no arithmetic (0 flops): it has no point on a roofline.")
        return
    data, live, note = figures(op)
    if note:
        say(note)
    if data is None:
        return
    if plots.roofline_says_something(op, data):
        show_figure(plots.ladder_figure(data, op, ["roofline"], live=live))
    else:
        say(plots.one_intensity_note(op, data))


def whole_ladder_figures(op: Operator) -> dict[str, list[str]]:
    """What the whole-ladder cells draw from the records in results/ (never measured: the notebook
    builder asks, to caption each figure by the panels it will have): {"progress": its panels,
    "roofline": ["roofline"] or [], "bytes": ["bytes"] or []}. No records: no progress or roofline figure."""
    data, _, _ = figures(op, measure=False)
    drawn = plots.figure_kinds(op, data) if data is not None else []
    progress = progress_kinds(op, data) if data is not None else []
    bytes_figure = ["bytes"] if plots.has_stage_bytes(op) else []
    return {"progress": progress, "roofline": [k for k in drawn if k == "roofline"], "bytes": bytes_figure}


# -- prose from solutions/ as Markdown --------------------------------------------------------------

SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const|ref|term):`~?([^`]+)`")
CODE_SPAN = re.compile(r"(```.*?```|``[^\n]*?``|`[^`\n]*`)", re.S)
# An asterisk between two operands ("2*M*N*K", "ho*stride", "(a+b)*c") is multiplication, which Markdown
# would read as the edge of italics; one with a space on a side ("*now*", "a * b") is left as it is.
TIMES_ASTERISK = re.compile(r"(?<=[\w)\]])\*(?=[\w(\[])")


def prose_markdown(text: str) -> str:
    """A paragraph or docstring from solutions/ as Markdown that shows what it says: Sphinx roles
    (``:func:`name```) become code, and a multiplication's asterisk outside code is escaped, so that
    "2*M*N*K flops" is not set in italics (emphasis, "*now*", stays emphasis)."""
    parts = CODE_SPAN.split(SPHINX_ROLE.sub(lambda m: f"`{m.group(1)}`", text))
    for i in range(0, len(parts), 2):  # the even parts are outside code
        parts[i] = TIMES_ASTERISK.sub(r"\\*", parts[i])
    return "".join(parts)


def bytes_per_stage(op: Operator, upto: str | None = None) -> None:
    """The bytes each stage moves (its traffic model) against the minimum, from the models alone."""
    show_figure(plots.ladder_figure({}, op, ["bytes"], upto=upto))


def ladder_table(op: Operator) -> None:
    """The ladder at its headline size against the library peer (the README's table)."""
    from IPython.display import Markdown

    data, live, note = figures(op)
    if data is None and _elsewhere(op):
        show(Markdown("Recorded. " + _elsewhere(op)))
        return
    if note:
        say(note)
    if data is None:
        return
    show(Markdown(("Measured now. " if live else "Recorded. ") + tables.ladder_table(op, data)))


def targets(op: Operator) -> None:
    """The chapter's declared targets (workbench.targets) and what the records say of each: met, missed or
    never measured; the same verdicts as the README's course map and `workbench targets`."""
    from IPython.display import Markdown

    names = registry.chapter_of(op).operators
    table = tables.targets_table(names)
    if not table:
        say(f"No target is declared for {', '.join(names)}.")
        return
    show(Markdown("Recorded. " + table))


def counters(op: Operator) -> None:
    """The Nsight Compute counters recorded for every stage (`workbench profile OP` on a GPU writes them to
    results/profiles/), and what changed at the largest steps of the staircase."""
    from . import profiles

    device_name, records = profiles.recorded(op.name)
    if not records:
        say(f"No counters recorded for {op.name}: `workbench profile {op.name}` on a GPU with Nsight Compute "
            "records them.")
        return
    dates = sorted({r["date"][:10] for r in records})
    show(Table(list(tables.PROFILE_COLUMNS), tables.profile_rows(records), tables.profile_title(device_name, records),
               f"Recorded on a GPU ({device_name}, {', '.join(dates)}), not measured now."))
    for sentence in profiles.explain_steps(records) + profiles.explain_against_peers(records):
        say(f"• {sentence}")


_counted_documents: dict = {}  # (stage key, size) -> what simulated_counters counted, for counter_changes


def _counted(stage: Stage, size=None) -> dict:
    """The stage's counters (profiles.simulated_as_dict) at ``size`` (default: its largest simulator size), counted
    in the simulator: here, or on a GPU machine in a child process in simulator mode. Counted once per session."""
    import json
    import subprocess
    import sys

    from . import profiles

    size = as_size(size) if size is not None else profiles.counter_size(stage.op)
    key = (stage.key, size)
    if key not in _counted_documents:
        if device.is_simulator():
            document = profiles.simulated_as_dict(profiles.simulated(stage, size))
        else:
            run = subprocess.run([sys.executable, "-m", "workbench", "counters", stage.key, "--size", size_label(size),
                                  "--json"], capture_output=True, text=True, env=dict(os.environ, WORKBENCH_MODE="sim"))
            documents = json.loads(run.stdout) if run.stdout.strip().startswith("[") else []
            document = documents[0] if documents else {"stage": stage.key, "size": list(size), "kernels": [],
                                                       "check": run.stderr.strip()[-300:] or "not counted"}
        _counted_documents[key] = document
    return _counted_documents[key]


def _warp_diagram(ax, row: dict, label: str) -> None:
    """One warp instruction of an access line: which lane touches which 32-byte sector (global memory,
    counted from the warp's first) or which of the 32 banks (shared memory)."""
    from .simulator import counters

    example = row["example"]
    lanes = [lane for lane, _, _ in example]
    if row["what"].startswith("global"):
        sectors = [offset // counters.SECTOR_BYTES for _, offset, _ in example]
        y = [s - min(sectors) for s in sectors]
        touched, _, ideal = counters.sectors_and_lines((offset, size) for _, offset, size in example)
        ax.set_ylabel("32-byte sector (from the warp's first)")
        summary = f"{touched} sectors (ideal {ideal})"
    else:
        y = [(offset // counters.BANK_BYTES) % counters.BANKS for _, offset, _ in example]
        waves, ideal = counters.wavefronts(example)
        ax.set_ylabel("shared-memory bank")
        ax.set_ylim(-1, counters.BANKS)
        summary = f"{waves} wavefront{'s' if waves > 1 else ''} (ideal {ideal})"
    ax.scatter(lanes, y, s=18, c=y, cmap="viridis")
    ax.set_xlabel("lane of the warp")
    ax.set_xlim(-1, counters.WARP_SIZE)
    ax.set_title(f"{label}\n{row['line']}: {row['source'][:48]}\n{row['what']}: {len(example)} lanes, {summary}",
                 fontsize=8)


def simulated_counters(stage: Stage, size=None) -> None:
    """The profiler's counters for one stage, counted in the simulator (``workbench counters``): a table
    per kernel of its lines, the worst first (sectors per request of each global access, wavefronts per
    request of each shared one, how often each branch split a warp), and a diagram of one warp's
    addresses for the line that wastes the most."""
    document = _counted(stage, size)
    if not document["kernels"]:
        say(f"{stage.key}: not counted ({document.get('check')}).")
        return
    worst = None
    for kernel in document["kernels"]:
        rows = [[f"{r['line']}: {r['source'][:50]}", r["what"], f"{r['requests']:,}",
                 f"{r['per_request']:.2f} {r['unit']}", f"{r['ideal_per_request']:.2f}", f"{r['efficiency_pct']:.0f}%"]
                for r in kernel["lines"][:12]]
        note = (f"{kernel['threads_per_instruction']:.1f} of 32 lanes active per line executed, "
                f"{kernel['branch_uniform_pct']:.0f}% of branches uniform, {kernel['barriers']} block barriers, "
                f"{kernel['warp_intrinsics']} warp intrinsics.")
        show(Table(["line", "access", "warp instructions", "per request", "ideal", "efficiency"], rows,
                   f"{kernel['kernel']} at {size_label(tuple(document['size']))}, counted in the simulator", note))
        for row in kernel["lines"]:
            if row["example"] and (worst is None or row["wasted"] > worst["wasted"]):
                worst = row
    say(f"Global bytes touched: {fmt_bytes(document['unique_global_bytes'])}; the bytes model: "
          f"{fmt_bytes(document['bytes_model'])}.")
    if worst is not None and worst["wasted"] > 0:
        fig, (ax,) = plots.new_figure(1)
        _warp_diagram(ax, worst, f"{stage.key}: one warp of its most wasteful access")
        show_figure(fig)
    elif worst is not None:  # a diagram of an access that wastes nothing would be called wasteful
        say("Every access at its ideal: no sector or wavefront wasted, so no warp is drawn.")


def counter_changes(stage: Stage, size=None) -> None:
    """The line that changed from the previous stage and what its counters did: each access line whose
    sectors or wavefronts per request moved, and one warp's addresses before and after for the largest move."""
    from . import profiles

    before_stage = diff.previous_stage(stage)
    if before_stage is None:
        say(f"{stage.key} is the first stage: nothing to compare its counters with.")
        return
    before, after = _counted(before_stage, size), _counted(stage, size)
    changes = profiles.counter_changes(before, after)
    if not changes:
        say(f"No access line of {stage.key} counts differently from {before_stage.key}.")
        return
    for change in changes:
        same = "" if change.edited else " (the line reads the same: what around it changed)"
        say(f"• {change.sentence()}{same}")
    top = changes[0]
    pairs = [(row, label) for row, label in ((top.before, before_stage.key), (top.after, stage.key))
             if row and row["example"]]
    if pairs:
        fig, axes = plots.new_figure(len(pairs))
        for ax, (row, label) in zip(axes, pairs):
            _warp_diagram(ax, row, label)
        show_figure(fig)


# -- across operators -----------------------------------------------------------------------------

def roofline_all() -> None:
    """One roofline with every operator's stages (from the recorded file holding the most operators)."""
    ops = list(registry.load_operators().values())
    files = [(sum(1 for op in ops if results.records_for(op.name, d)), d) for d in results.load_all()]
    files = [(k, d) for k, d in files if k]
    if not files:
        say(f"No recorded figures yet (nothing in {results.results_dir()}): run `workbench run OP` on a GPU.")
        return
    _, data = max(files, key=lambda kd: kd[0])
    recorded = [op for op in ops if results.records_for(op.name, data)]
    others = [op.name for op in ops if op not in recorded]
    if others:
        say(f"not recorded on {data.get('device')}: {', '.join(others)}")
    fig, (ax,) = plots.new_figure(1, height=6.0)
    plots.roofline_of_operators(ax, data, recorded)
    show_figure(fig)


def gradeable_stages() -> None:
    """Every stage a learner can grade (``grade_function("op.stage", launcher)``), with the launcher's
    arguments and whether its exercise in exercises/ has code to write."""
    import inspect

    rows = []
    for op in registry.load_operators().values():
        exercise = f"exercises/{registry.short_module_name(op)}.py"
        for stage in op.stages:
            todo = markers.has_markers(stage.source())
            rows.append([stage.key, f"{stage.name}{inspect.signature(stage.launch)}",
                         exercise if todo else "(given whole)", "on a GPU only" if stage.gpu_only else "anywhere"])
    show(Table(["target", "launcher to write", "exercise", "runs"], rows, "Stages you can grade",
               "Write a launcher with these arguments (device arrays, the output last) and the kernels it "
               "launches; grade_function(target, launcher) judges it like the solution."))


# -- the course ------------------------------------------------------------------------------------

def variants(chapter: int) -> None:
    """A chapter's variants side by side: each one's best stage against its strongest peer (recorded)."""
    from IPython.display import Markdown

    names = registry.chapter(str(chapter)).operators
    show(Markdown(tables.variants_table(names) + "\nWhich variants each stage serves:\n\n"
                  + tables.stages_served_table(names)))


def compare_part(number: int) -> None:
    """One Part's operators, chapter by chapter: a table of each one's best stage against its strongest
    peer, and the same as bars of % of peak, each bar named (from results/)."""
    from IPython.display import Markdown

    part = curriculum.part(number)
    names = [name for ch in registry.chapters() if ch.part == number for name in ch.operators]
    show(Markdown(tables.variants_table(names)))
    ops = registry.load_operators()
    rows = []
    for name in names:
        data = results.latest_file_with(name)
        best, peer = plots.best_stage(ops[name], data) if data else (None, None)
        if best is not None:
            rows.append((ops[name], best, peer, data.get("peaks") or {}))
    if rows:
        show_figure(plots.part_figure(rows, f"Part {part.number}, {part.title}: best stage against the library"))
    else:
        print(f"Part {part.number}: nothing recorded yet (`workbench bench OP` on a GPU records it).")
