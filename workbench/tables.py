"""Ladder tables in Markdown, and the README's ladder sections, generated from the registry and
``results/``.

The README's "The ladders" part lies between ``<!-- ladders -->`` and ``<!-- /ladders -->`` and is made
here whole: a heading per ``Operator.group`` (in ``rank`` order), and for each operator its table (between
``<!-- ladder:OP -->`` markers) and its committed plots. A new operator therefore appears in the README
without anyone editing it: `workbench table --update-readme`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import paths, profiles, registry, results
from .bench import peak_key, percent_of_peak
from .ladder import Operator, size_label


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


STREAMS = {"copy_gbps": "copy", "read_gbps": "read-only", "read2_write1_gbps": "two-reads-one-write"}


def peak_caption(op: Operator, peaks: dict) -> str:
    """The table's sentence on what "% of peak" divides by."""
    key = peak_key(op, peaks)
    if key is None or not peaks.get(key):
        return "% of peak is — (no peak of this precision measured yet)"
    if key in STREAMS:
        return f"% of peak is of the measured {STREAMS[key]} bandwidth, {peaks[key]:.0f} GB/s"
    precision = key.split("_")[1]
    return f"% of peak is of the measured cuBLAS {precision} rate, {peaks[key] / 1e3:.1f} TFLOP/s"


def ladder_table(op: Operator, data: dict) -> str:
    """Markdown table of a ladder at its headline size, from one recorded results file."""
    recs = results.headline(results.records_for(op.name, data), op.headline_size)
    stages = sorted((r for r in recs if r.get("kind") == "stage"), key=lambda r: r["order"])
    peers = [r for r in recs if r.get("kind") == "peer"]
    if not stages:
        elsewhere = op.figures_elsewhere() if op.figures_elsewhere else None
        if elsewhere:
            return elsewhere
        return f"_no recorded figures for {op.name} yet: `workbench bench {op.name}` on a GPU records them_\n"
    # "vs peer" compares with the strongest peer recorded at this size (the fastest library call, eager
    # torch or torch.compile); every peer keeps its own row, timed against that strongest one.
    strongest = min(peers, key=lambda r: r["median_us"]) if peers else None
    first = stages[0]
    v = first["versions"]
    torch = f", torch {v['torch']}" if "torch" in v else ""
    lines = [f"{op.title}, {first['size_label']} {first['dtype']} on **{data['device']}**, "
             f"{max(r['date'] for r in stages)[:10]} (numba-cuda {v.get('numba_cuda')}, numba {v.get('numba')}{torch}); "
             f"{peak_caption(op, data.get('peaks') or {})}.", "",
             "| # | stage | median µs | GB/s | GFLOP/s | % of peak | vs " + (strongest["stage"] if strongest else "peer") + " |",
             "|---|---|---:|---:|---:|---:|---:|"]
    peaks_ = data.get("peaks") or {}
    for r in stages:
        peer = strongest or r.get("peer")
        ratio = f"{peer['median_us'] / r['median_us']:.2f}x" if peer else "—"
        pct = percent_of_peak(op, r["gbps"], r["gflops"], peaks_)
        lines.append(f"| {r['order']} | {r['stage']} | {r['median_us']:.1f} | {r['gbps']:.0f} | {r['gflops']:.0f} | "
                     f"{_fmt(pct, '.0f')} | {ratio} |")
    for r in peers:
        pct = percent_of_peak(op, r["gbps"], r["gflops"], peaks_)
        lines.append(f"| — | {r['stage']} (library) | {r['median_us']:.1f} | {r['gbps']:.0f} | {r['gflops']:.0f} | "
                     f"{_fmt(pct, '.0f')} | {strongest['median_us'] / r['median_us']:.2f}x |")
    if not any(r["stage"] == "torch.compile" for r in peers):
        lines += compiled_elsewhere(op, stages[-1])
    return "\n".join(lines) + "\n"


COMPILE_RUN = ("runs", "gpu_compile_peer.json")  # scripts/gpu_compile_peer.py: torch.compile of each expression


def compiled_elsewhere(op: Operator, at: dict) -> list[str]:
    """A note under a table whose run timed no torch.compile: what torch.compile took at the same size in
    the run that timed it alone. It is not a ratio in the table, as ratios come from one run; but a table
    that says "2x torch" where torch.compile is faster than the last stage must say so."""
    path = results.results_dir().joinpath(*COMPILE_RUN)
    if not path.exists():
        return []
    run = json.loads(path.read_text())
    compiled = [r for row in run.get("rows", []) for r in row.get("records", [])
                if r.get("op") == op.name and r.get("stage") == "torch.compile" and r.get("size") == at["size"]]
    if not compiled:
        return []
    c = compiled[0]
    return ["", f"_torch.compile of the same expression was timed in another run "
                f"(`results/{'/'.join(COMPILE_RUN)}`, {c['date'][:10]}, {c.get('device', '?')}): {c['median_us']:.1f} µs "
                f"at {c['size_label']}, against {at['median_us']:.1f} µs for `{at['stage']}` here. It has no ratio "
                "in this table, as a table's ratios come from one run._"]


def recorded_table(op: Operator) -> str:
    """The table from the newest recorded file that has this operator (a note if none has)."""
    data = results.latest_file_with(op.name)
    return ladder_table(op, data) if data is not None else ladder_table(op, {"records": []})


# -- the README --------------------------------------------------------------------------------------

def between(text: str, name: str) -> tuple[str, str, str] | None:
    """Split ``text`` at ``<!-- name -->`` ... ``<!-- /name -->``: (head, body, tail), or None."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    if start not in text or end not in text.split(start, 1)[1]:
        return None
    head, rest = text.split(start, 1)
    body, tail = rest.split(end, 1)
    return head + start, body, end + tail


def replace_between(text: str, name: str, body: str) -> str | None:
    parts = between(text, name)
    return None if parts is None else f"{parts[0]}\n{body}{parts[2]}"


def committed_plots(op: Operator) -> list[Path]:
    """The committed figures of an operator that README shows, in a fixed order."""
    return [p for kind in ("staircase", "latency", "roofline")
            if (p := paths.COMMITTED_PLOTS_DIR / f"{op.name}_{kind}.png").exists()]


def notebook_label(ops: list[Operator]) -> str:
    names = [registry.notebook_name(op) for op in ops]
    if len(names) == 1:
        return f"`notebooks/{names[0]}`"
    numbers = [n.split("_", 1)[0] for n in names]
    return f"notebooks {numbers[0]}-{numbers[-1]}"


def readme_ladders() -> str:
    """The whole generated "ladders" block: a heading per group, a table and plots per operator."""
    groups: dict[str, list[Operator]] = {}
    for op in registry.load_operators().values():
        groups.setdefault(op.group or op.title, []).append(op)
    out = []
    for heading, ops in groups.items():
        files = sorted({f"solutions/{registry.short_module_name(op)}.py" for op in ops})
        where = f"`{files[0]}`" if len(files) == 1 else "`solutions/`"
        out += [f"### {heading} ({where}, {notebook_label(ops)})", ""]
        for op in ops:
            out += [f"<!-- ladder:{op.name} -->", recorded_table(op).rstrip("\n"), f"<!-- /ladder:{op.name} -->", ""]
            plots = committed_plots(op)
            if plots:
                out += [f"![{op.name} {p.stem.rsplit('_', 1)[1]}]({p.relative_to(paths.REPO_ROOT).as_posix()})"
                        for p in plots] + [""]
    return "\n".join(out)


def render_readme(text: str) -> str:
    """README text with its generated ladders block made anew (unchanged text if it has no markers)."""
    new = replace_between(text, "ladders", readme_ladders())
    return text if new is None else new


def update_readme(readme: Path | None = None) -> str:
    """Rewrite the README's generated block; returns "updated", "unchanged" or "no-markers"."""
    readme = Path(readme or paths.README)
    text = readme.read_text()
    if between(text, "ladders") is None:
        return "no-markers"
    new = render_readme(text)
    if new == text:
        return "unchanged"
    tmp = readme.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, readme)
    return "updated"


# -- recorded Nsight Compute counters (`workbench profile`, the notebooks) ------------------------------------

PROFILE_COLUMNS = ("stage", "size", "kernels", "µs", "DRAM % peak", "occupancy %", "regs", "smem B", "L1 hit %",
                   "L2 hit %", "instructions", "top stalls (cycles/instr)")


def _counter(v, spec):
    return "—" if not isinstance(v, (int, float)) else format(v, spec)


def profile_rows(records: list[dict]) -> list[list[str]]:
    """A row per stage of an operator's recorded counters (its kernels summed), in PROFILE_COLUMNS order."""
    rows = []
    for r in profiles.stage_totals(records):
        stalls = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in r["top_stalls"])
        rows.append([f"{r['order']}. {r['stage']}", size_label(r["size"]), str(r["kernels"]),
                     _counter(r["duration_ns"] / 1e3, ".1f"), _counter(r["dram_pct_of_peak"], ".0f"),
                     _counter(r["occupancy_pct"], ".0f"), _counter(r["registers"], "d"),
                     _counter(r["shared_bytes"], "d"), _counter(r["l1_hit_pct"], ".0f"),
                     _counter(r["l2_hit_pct"], ".0f"), _counter(r["instructions"], ".3g"), stalls or "—"])
    return rows


def profile_title(device: str, records: list[dict]) -> str:
    return f"{records[0]['op']} on {device} (Nsight Compute, --clock-control none)"


def profile_table(device: str, records: list[dict]):
    """The same rows as a rich Table, for the terminal."""
    from rich.table import Table

    table = Table(title=profile_title(device, records), title_justify="left")
    for col in PROFILE_COLUMNS:
        table.add_column(col, justify="left" if col in ("stage", "top stalls (cycles/instr)") else "right")
    for row in profile_rows(records):
        table.add_row(*row)
    return table
