"""Hardware counters per stage: Nsight Compute's numbers, recorded like the timings, and read back.

A timing says *that* stage 3 is faster than stage 2; counters say *why*: more of DRAM's peak used,
more warps resident, fewer instructions, a stall reason gone. ``workbench profile OP`` (the tools
room) runs ``ncu --clock-control none --csv --page raw --print-units base`` with :data:`METRICS` on
one call of each stage and records one record per kernel in ``results/profiles/<device>.json``; this
module holds what both the command and the presentation need: the metric set, the parser of ncu's
CSV, the file, per-stage totals, and :func:`explain_steps`, sentences on the largest steps of a
staircase backed by the counters (what a notebook section shows beside the diff).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import results

SCHEMA = 1

# key -> (ncu metric, what it is). Names as Nsight Compute 2023-2025 spells them (`ncu --query-metrics`).
METRICS = {
    "duration_ns": ("gpu__time_duration.sum", "kernel time (ns)"),
    "dram_pct_of_peak": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput, % of peak"),
    "dram_read_bytes": ("dram__bytes_read.sum", "bytes read from DRAM"),
    "dram_write_bytes": ("dram__bytes_write.sum", "bytes written to DRAM"),
    "sm_pct_of_peak": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput, % of peak"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy, %"),
    "registers": ("launch__registers_per_thread", "registers per thread"),
    "shared_static_bytes": ("launch__shared_mem_per_block_static", "static shared memory per block (B)"),
    "shared_dynamic_bytes": ("launch__shared_mem_per_block_dynamic", "dynamic shared memory per block (B)"),
    "l1_hit_pct": ("l1tex__t_sector_hit_rate.pct", "L1 hit rate, %"),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct", "L2 hit rate, %"),
    "instructions": ("smsp__inst_executed.sum", "warp instructions executed"),
    "grid_size": ("launch__grid_size", "blocks"),
    "block_size": ("launch__block_size", "threads per block"),
    # Which unit is the bottleneck of a compute-bound kernel (attention, GEMM): each pipe's busy share.
    "issue_active_pct": ("sm__inst_issued.avg.pct_of_peak_sustained_active", "instruction issue, % of peak"),
    "wgmma_pipe_pct": ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                       "tensor pipe busy with wgmma (Hopper), %"),
    "mma_pipe_pct": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                     "tensor pipe busy with mma.sync, %"),
    "fma_pipe_pct": ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "FMA pipe busy, %"),
    "xu_pipe_pct": ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
                    "special-function pipe (exp2, rcp), % of peak"),
}

# What `workbench profile --counters` adds: the memory-access and divergence counters the simulator counts
# too (workbench.simulator.counters, `workbench counters`), so that the two can be held to each other.
COUNTER_METRICS = {
    "global_load_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "global load requests (warp instr.)"),
    "global_load_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "32-byte sectors of global loads"),
    "global_store_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "global store requests"),
    "global_store_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "32-byte sectors of global stores"),
    "global_atomic_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum", "global atomics with a result"),
    "global_reduction_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_red.sum", "global atomics without one"),
    "shared_load_requests": ("smsp__inst_executed_op_shared_ld.sum", "shared-memory load instructions"),
    "shared_store_requests": ("smsp__inst_executed_op_shared_st.sum", "shared-memory store instructions"),
    "shared_load_wavefronts": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "wavefronts of shared loads"),
    "shared_store_wavefronts": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "wavefronts of shared stores"),
    "shared_load_bank_conflicts": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                                   "bank conflicts of shared loads"),
    "shared_store_bank_conflicts": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                                    "bank conflicts of shared stores"),
    "branch_uniform_pct": ("smsp__sass_average_branch_targets_threads_uniform.pct",
                           "branches all active lanes took alike, %"),
    "threads_per_instruction": ("smsp__thread_inst_executed_per_inst_executed.ratio",
                                "active lanes per warp instruction"),
    "barriers": ("smsp__inst_executed_op_barrier.sum", "barrier instructions executed (per warp)"),
}

# Why warps were not issuing: cycles stalled per issued instruction, by reason (WarpStateStats).
STALL_REASONS = {
    "long_scoreboard": "waiting on global/local memory (a load not yet back)",
    "short_scoreboard": "waiting on shared memory or a special-function result",
    "barrier": "waiting at cuda.syncthreads() for the rest of the block",
    "membar": "waiting on a memory fence",
    "mio_throttle": "the shared-memory/special-instruction queue full",
    "lg_throttle": "the global-memory instruction queue full (too many small loads)",
    "math_pipe_throttle": "a math pipe busy",
    "wait": "a fixed-latency dependency",
    "not_selected": "ready but another warp was issued (plenty of work)",
    "no_instruction": "instruction cache miss or waiting after a branch",
    "branch_resolving": "waiting for a branch target",
    "dispatch_stall": "dispatch stall",
    "drain": "draining memory stores at exit",
    "sleeping": "asleep (nanosleep)",
    "tex_throttle": "the texture/L1 queue full",
    "imc_miss": "an immediate-constant cache miss",
}
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def metric_names(with_stalls: bool = True, counters: bool = False) -> list[str]:
    names = [m for m, _ in METRICS.values()]
    if counters:
        names += [m for m, _ in COUNTER_METRICS.values()]
    if with_stalls:
        names += [STALL_METRIC.format(r) for r in STALL_REASONS]
    return names


# -- ncu's CSV ---------------------------------------------------------------------------------------

def _number(text: str):
    text = (text or "").strip().strip('"')
    if text in ("", "n/a", "N/A"):
        return None
    for candidate in (text, text.replace(",", "")):
        try:
            value = float(candidate)
            return int(value) if value.is_integer() and "." not in candidate else value
        except ValueError:
            continue
    return text


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels from ``ncu --csv --page raw`` output: [{"kernel": name, "id": n, "metrics": {key: value},
    "stalls": {reason: cycles per issue}}], in launch order. Lines that are not CSV (ncu's ``==PROF==``
    messages, the program's own output) are skipped; the row of units after the header too."""
    lines = [l for l in text.splitlines() if l.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col:
        raise ValueError("not ncu --page raw CSV: no 'Kernel Name' column")
    by_metric = {m: k for k, (m, _) in (METRICS | COUNTER_METRICS).items()}
    stall_of = {STALL_METRIC.format(r): r for r in STALL_REASONS}
    kernels = []
    for row in rows[1:]:
        if len(row) != len(header) or not row[col["Kernel Name"]] or row[col.get("ID", 0)] in ("", "ID"):
            continue  # the units row has an empty kernel name
        entry = {"kernel": short_kernel_name(row[col["Kernel Name"]]), "id": _number(row[col["ID"]]) if "ID" in col
                 else len(kernels), "metrics": {}, "stalls": {}}
        for name, i in col.items():
            if name in by_metric:
                entry["metrics"][by_metric[name]] = _number(row[i])
            elif name in stall_of:
                value = _number(row[i])
                if isinstance(value, (int, float)):
                    entry["stalls"][stall_of[name]] = float(value)
        kernels.append(entry)
    return kernels


def short_kernel_name(name: str) -> str:
    """'cudapy::solutions::softmax::_ilp[abi:v1,cw51...](Array<float, 2, C, mutable, aligned>, ...)' -> '_ilp'."""
    name = name.split("(")[0].split("[abi")[0].split("<")[0]
    return name.rsplit("::", 1)[-1].strip() or name


# -- the recorded file ----------------------------------------------------------------------------------

def profiles_dir() -> Path:
    return results.results_dir() / "profiles"


def counters_dir() -> Path:
    """Where `workbench profile --counters` records: at the simulator's small sizes, apart from the
    profiles at benchmark sizes that tables, notebooks and :func:`recorded` show."""
    return profiles_dir() / "counters"


def path_for(device_name: str, counters: bool = False) -> Path:
    return (counters_dir() if counters else profiles_dir()) / f"{results.slug(device_name)}.json"


def load(path: Path) -> dict:
    import json

    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: profile schema {data.get('schema')!r}, this workbench reads {SCHEMA}")
    results.renamed_records(data.get("records", []))
    return data


def save(device_name: str, records: list[dict], counters: bool = False) -> Path:
    """Add (or replace, by op, stage and size) kernel records in this device's profile file (with
    ``counters``, its file of `workbench profile --counters` records)."""
    path = path_for(device_name, counters)
    data = load(path) if path.exists() else {"schema": SCHEMA, "device": device_name, "records": []}
    replaced = {(r["op"], r["stage"], tuple(r["size"])) for r in records}
    data["records"] = [r for r in data["records"] if (r["op"], r["stage"], tuple(r["size"])) not in replaced] + records
    results.write_atomic(path, data)
    return path


def recorded(op_name: str) -> tuple[str | None, list[dict]]:
    """(device, records) of the newest profile file that has ``op_name``; (None, []) if none."""
    best, best_date = (None, []), ""
    for path in sorted(profiles_dir().glob("*.json")) if profiles_dir().exists() else []:
        try:
            data = load(path)
        except (ValueError, OSError):
            continue
        recs = [r for r in data["records"] if r["op"] == op_name]
        if recs and max(r.get("date", "") for r in recs) >= best_date:
            best, best_date = (data["device"], recs), max(r.get("date", "") for r in recs)
    return best


# -- per stage ---------------------------------------------------------------------------------------------

def stage_totals(records: list[dict]) -> list[dict]:
    """One row per (stage, size), in stage order: the kernels' times and bytes summed, the rates and
    occupancy weighted by kernel time, registers and shared memory of the longest kernel, and the
    time-weighted stall reasons."""
    groups: dict = {}
    for r in records:  # the stages in order, then the library peers (`workbench profile --peers`)
        is_peer = r.get("kind") == "peer"
        groups.setdefault((is_peer, r["order"], r["stage"], tuple(r["size"])), []).append(r)
    rows = []
    for (is_peer, order, stage, size), recs in sorted(groups.items()):
        times = [float(r["metrics"].get("duration_ns") or 0) for r in recs]
        total = sum(times) or 1.0

        def weighted(key):
            vals = [(r["metrics"].get(key), t) for r, t in zip(recs, times)]
            vals = [(v, t) for v, t in vals if isinstance(v, (int, float))]
            return sum(v * t for v, t in vals) / sum(t for _, t in vals) if vals and sum(t for _, t in vals) else None

        def summed(key):
            vals = [r["metrics"].get(key) for r in recs]
            return sum(v for v in vals if isinstance(v, (int, float))) if any(isinstance(v, (int, float)) for v in vals) else None

        longest = recs[max(range(len(recs)), key=lambda i: times[i])]
        stalls: dict = {}
        for r, t in zip(recs, times):
            for reason, v in (r.get("stalls") or {}).items():
                stalls[reason] = stalls.get(reason, 0.0) + v * t / total
        rows.append({
            "stage": stage, "order": order, "peer": is_peer, "size": list(size), "kernels": len(recs),
            "duration_ns": sum(times),
            "dram_pct_of_peak": weighted("dram_pct_of_peak"), "sm_pct_of_peak": weighted("sm_pct_of_peak"),
            "occupancy_pct": weighted("occupancy_pct"), "l1_hit_pct": weighted("l1_hit_pct"),
            "l2_hit_pct": weighted("l2_hit_pct"), "dram_bytes": (summed("dram_read_bytes") or 0) + (summed("dram_write_bytes") or 0),
            "instructions": summed("instructions"), "registers": longest["metrics"].get("registers"),
            "shared_bytes": (longest["metrics"].get("shared_static_bytes") or 0) + (longest["metrics"].get("shared_dynamic_bytes") or 0),
            "top_stalls": sorted(stalls.items(), key=lambda kv: -kv[1])[:3],
        })
    return rows


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def row_label(row: dict) -> str:
    """'8. by_shape' for a stage, 'torch.compile (library)' for a peer, as the ladder tables name them."""
    return f"{row['stage']} (library)" if row.get("peer") else f"{row['order']}. {row['stage']}"


def explain_step(before: dict, after: dict) -> str:
    """One sentence: how much faster ``after`` is than ``before``, and the counters that moved most."""
    speedup = _ratio(before["duration_ns"], after["duration_ns"])
    head = (f"{row_label(after)} is {speedup:.2f}x {'faster' if speedup >= 1 else 'slower'} than "
            f"{row_label(before)}" if speedup else row_label(after))
    reasons = []
    for key, label, fmt in (("dram_pct_of_peak", "DRAM throughput", "{:.0f}% of peak"),
                            ("occupancy_pct", "achieved occupancy", "{:.0f}%"),
                            ("l1_hit_pct", "L1 hit rate", "{:.0f}%"), ("l2_hit_pct", "L2 hit rate", "{:.0f}%")):
        a, b = before.get(key), after.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(b - a) >= 10:
            reasons.append((abs(b - a) / 100, f"{label} {fmt.format(a)} -> {fmt.format(b)}"))
    for key, label in (("instructions", "instructions"), ("dram_bytes", "DRAM bytes"), ("kernels", "kernels")):
        r = _ratio(before.get(key), after.get(key))
        if r and (r >= 1.25 or r <= 0.8):
            reasons.append((abs(math.log(r)), f"{r:.1f}x fewer {label}" if r > 1 else f"{1 / r:.1f}x more {label}"))
    if before.get("registers") != after.get("registers") and after.get("registers"):
        reasons.append((0.05, f"registers per thread {before.get('registers')} -> {after.get('registers')}"))
    top_a = before["top_stalls"][0] if before.get("top_stalls") else None
    top_b = after["top_stalls"][0] if after.get("top_stalls") else None
    if top_a and top_b and top_a[0] != top_b[0]:
        reasons.append((0.5, f"the top stall changed from {top_a[0].replace('_', ' ')} "
                             f"({STALL_REASONS.get(top_a[0], '')}) to {top_b[0].replace('_', ' ')}"))
    elif top_a and top_b and _ratio(top_a[1], top_b[1]) and _ratio(top_a[1], top_b[1]) >= 1.5:
        reasons.append((math.log(top_a[1] / top_b[1]), f"{top_a[0].replace('_', ' ')} stalls "
                                                        f"{top_a[1]:.1f} -> {top_b[1]:.1f} cycles per instruction"))
    reasons.sort(key=lambda kv: -kv[0])
    return head + (": " + "; ".join(text for _, text in reasons[:3]) if reasons else ": no counter moved much") + "."


def explain_steps(records: list[dict], size=None, largest: int = 3) -> list[str]:
    """Sentences on the ``largest`` steps of the staircase (by time ratio between consecutive stages)
    at ``size`` (default: the largest size profiled), in stage order."""
    rows = _at_size([r for r in stage_totals(records) if not r["peer"]], size)
    steps = [(abs(math.log(_ratio(a["duration_ns"], b["duration_ns"]) or 1.0)), i)
             for i, (a, b) in enumerate(zip(rows, rows[1:]))]
    chosen = sorted(i for _, i in sorted(steps, reverse=True)[:largest])
    return [explain_step(rows[i], rows[i + 1]) for i in chosen]


def _at_size(rows: list[dict], size=None) -> list[dict]:
    """The rows at ``size``, or (None) at the largest size among them."""
    if size is None and rows:
        size = max((r["size"] for r in rows), key=math.prod)
    return [r for r in rows if size is not None and r["size"] == list(size)]


def explain_against_peers(records: list[dict], size=None) -> list[str]:
    """A sentence per library peer profiled (`workbench profile --peers`): the fastest stage profiled at
    the same size against it, with the counters that differ most; what says why a ladder ends behind or
    ahead of the library. Empty where no peer was profiled."""
    rows = _at_size(stage_totals(records), size)
    stages = [r for r in rows if not r["peer"]]
    if not stages:
        return []
    best = min(stages, key=lambda r: r["duration_ns"] or math.inf)
    return [explain_step(peer, best) for peer in rows if peer["peer"]]


# -- the same counters, counted in the simulator --------------------------------------------------------------

@dataclass
class SimulatedCounters:
    """What the simulator counted for one stage at one size (``workbench counters``): one
    :class:`workbench.simulator.counters.LaunchCounters` per kernel, and whether the output was right."""

    stage: Any
    size: tuple
    status: str  # the check's: passed, failed or skipped
    message: str
    kernels: list
    bytes_model: int  # the stage's bytes model (Stage.traffic), what it must move at least

    def total(self, space, kind):
        from .simulator.counters import LineCounters

        result = LineCounters("", 0, space, kind)
        for kernel in self.kernels:
            result.add(kernel.total(space, kind))
        return result

    @property
    def unique_global_bytes(self):
        return sum(k.unique_global_bytes for k in self.kernels)


def counter_size(op) -> tuple:
    """The size counters are counted (and recorded on a GPU, to compare) at by default: the operator's
    largest simulator size, where warps are full and every edge path runs."""
    from .ladder import as_size

    return max((as_size(s) for s in op.sim_sizes), key=math.prod)


def simulated(stage, size, seed: int = 0) -> SimulatedCounters:
    """Run ``stage`` once at ``size`` in the simulator, checked as ``workbench check`` does, counting
    what its kernels do (see workbench.simulator.counters). Needs the simulator."""
    import numpy as np

    from .check import check_stage
    from .ladder import as_size
    from .simulator import counters

    size = as_size(size)
    with counters.counting() as launches:
        result = check_stage(stage, size, np.random.default_rng(seed))
    return SimulatedCounters(stage, size, result.status, result.message or "", counters.merge_by_kernel(launches),
                             stage.traffic(size))


def source_text(file: str, line: int) -> str:
    import linecache

    return linecache.getline(file, line).strip()


def counter_rows(kernel) -> list[dict]:
    """One kernel's lines, the worst first: memory accesses by the transactions they waste, then branches
    by how often they split the warp. Each row: line, source text, what (e.g. "global load"), warp
    instructions, per request (sectors or wavefronts), ideal per request, efficiency %, wasted, and one warp
    instruction's accesses as [lane, offset in the array, bytes] (for a diagram)."""
    rows = []
    for row in kernel.memory.values():
        per_request = row.sectors_per_request if row.space == "global" else row.wavefronts_per_request
        ideal = (row.ideal_sectors if row.space == "global" else row.ideal_wavefronts) / (row.requests or 1)
        rows.append({"line": row.line, "source": source_text(row.file, row.line), "what": f"{row.space} {row.kind}",
                     "requests": row.requests, "unit": "sectors" if row.space == "global" else "wavefronts",
                     "per_request": per_request, "ideal_per_request": ideal, "efficiency_pct": 100 * row.efficiency,
                     "wasted": row.excess, "lanes_per_request": row.lanes / (row.requests or 1),
                     "example": [list(access) for access in row.example]})
    for branch in kernel.branches.values():
        rows.append({"line": branch.line, "source": source_text(branch.file, branch.line), "what": "branch",
                     "requests": branch.executed, "unit": "divergent",
                     "per_request": branch.divergent / branch.executed,
                     "ideal_per_request": 0.0, "efficiency_pct": 100 * (1 - branch.divergent / branch.executed),
                     "wasted": branch.divergent, "lanes_per_request": None, "example": []})
    # ties broken by everything a row shows, so that the order never depends on which simulated thread
    # recorded its access first
    rows.sort(key=lambda r: (-r["wasted"], r["what"] == "branch", r["line"], r["what"], r["source"]))
    return rows


def kernel_summary(kernel) -> dict:
    """A kernel's totals, named after the Nsight Compute metrics they stand for."""
    out = {"kernel": kernel.kernel, "launches": kernel.launches}
    for space, kind in (("global", "load"), ("global", "store"), ("global", "atomic"), ("shared", "load"),
                        ("shared", "store"), ("shared", "atomic")):
        total = kernel.total(space, kind)
        if not total.requests:
            continue
        key = f"{space}_{kind}"
        out[f"{key}_requests"] = total.requests
        if space == "global":
            out[f"{key}_sectors"] = total.sectors
            out[f"{key}_sectors_per_request"] = total.sectors_per_request
            out[f"{key}_efficiency_pct"] = 100 * total.efficiency
        else:
            out[f"{key}_wavefronts"] = total.wavefronts
            out[f"{key}_bank_conflicts"] = total.conflicts
    out["threads_per_instruction"] = kernel.threads_per_instruction
    out["branch_uniform_pct"] = kernel.uniform_branch_pct
    out["barriers"] = kernel.barriers
    out["barrier_warps"] = kernel.barrier_warps
    out["warp_intrinsics"] = sum(kernel.intrinsics.values())
    out["l1_global_bytes"] = kernel.l1_global_bytes
    out["unique_global_bytes"] = kernel.unique_global_bytes
    return out


def simulated_as_dict(counted: SimulatedCounters) -> dict:
    """What ``workbench counters --json`` prints for one stage."""
    return {"stage": counted.stage.key, "size": list(counted.size), "check": counted.status,
            "bytes_model": counted.bytes_model, "unique_global_bytes": counted.unique_global_bytes,
            "kernels": [dict(kernel_summary(k), lines=counter_rows(k)) for k in counted.kernels]}


@dataclass
class CounterChange:
    """One access line of a stage against the same line (same source text, space and kind) one stage before."""

    source: str
    what: str
    unit: str
    before: dict | None  # the line's row in the earlier stage (counter_rows); None: the line is new
    after: dict | None  # ... in the later one; None: the line is gone
    edited: bool  # the line itself was edited (else only something around it changed)

    def sentence(self) -> str:
        if self.before is None:
            return f"new: `{self.source}` ({self.what}), {self.after['per_request']:.1f} {self.unit} per request"
        if self.after is None:
            return f"gone: `{self.source}` ({self.what}), was {self.before['per_request']:.1f} {self.unit} per request"
        return (f"`{self.source}` ({self.what}): {self.before['per_request']:.1f} -> "
                f"{self.after['per_request']:.1f} {self.unit} per request")


def counter_changes(before: dict, after: dict, threshold: float = 0.1) -> list[CounterChange]:
    """The access lines whose counters moved between two stages (documents of :func:`simulated_as_dict`),
    the largest move first. Lines are matched by their source text, space and kind; a line moved when its
    sectors (or wavefronts) per request changed by more than ``threshold`` of the larger, or is new or gone.
    A line that reads the same but counts differently (the padded tile's column read) is the lesson as
    much as an edited one; ``edited`` says which it is."""
    from .diff import stage_diff
    from .registry import resolve

    def by_text(document):
        merged = {}
        for kernel in document["kernels"]:
            for row in kernel["lines"]:
                if row["what"] == "branch":
                    continue
                key = (row["source"], row["what"])
                if key in merged:  # the same line in two kernels: requests-weighted
                    mine = dict(merged[key])
                    requests = mine["requests"] + row["requests"]
                    mine["per_request"] = (mine["per_request"] * mine["requests"]
                                           + row["per_request"] * row["requests"]) / requests
                    mine["requests"] = requests
                    row = mine
                merged[key] = row
        return merged

    (_, [stage_before]), (_, [stage_after]) = resolve(before["stage"]), resolve(after["stage"])
    edited = {line[1:].strip() for line in stage_diff(stage_after, stage_before).lines if line[:1] in "+-"}
    old, new = by_text(before), by_text(after)
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a and b and abs(a["per_request"] - b["per_request"]) <= threshold * max(a["per_request"], b["per_request"]):
            continue
        changes.append(CounterChange(key[0], key[1], (a or b)["unit"], a, b, key[0] in edited))
    changes.sort(key=lambda c: -abs((c.after or {}).get("per_request", 0) - (c.before or {}).get("per_request", 0)))
    return changes


# -- the simulator held to the hardware -------------------------------------------------------------------------

# (what is compared, the simulator's figure, the recorded figure): per request, so that a compiler that merges
# or splits accesses (numba's vector loads, a load it keeps in a register) changes the request counts, which
# the comparison shows beside, but not the figure compared.
def _per(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


COMPARED = {
    "global load sectors/request": (
        lambda c: c.total("global", "load").sectors_per_request if c.total("global", "load").requests else None,
        lambda m: _per(m.get("global_load_sectors"), m.get("global_load_requests"))),
    "global store sectors/request": (
        lambda c: c.total("global", "store").sectors_per_request if c.total("global", "store").requests else None,
        lambda m: _per(m.get("global_store_sectors"), m.get("global_store_requests"))),
    "shared load bank conflicts/request": (
        lambda c: _per(c.total("shared", "load").conflicts, c.total("shared", "load").requests),
        lambda m: _per(m.get("shared_load_bank_conflicts"), m.get("shared_load_requests"))),
    "shared store bank conflicts/request": (
        lambda c: _per(c.total("shared", "store").conflicts, c.total("shared", "store").requests),
        lambda m: _per(m.get("shared_store_bank_conflicts"), m.get("shared_store_requests"))),
}
AGREE_WITHIN = 0.10  # of the larger figure
AGREE_NEAR_ZERO = 0.05  # per request: 0.02 against 0 conflicts is agreement, not a 100% difference


def recorded_counters() -> dict:
    """{(op, stage, size): metrics summed over the stage's kernels} of what `workbench profile --counters`
    recorded (counters_dir()), with the device's name under "device"."""
    found = {}
    for path in sorted(counters_dir().glob("*.json")) if counters_dir().exists() else []:
        try:
            data = load(path)
        except (ValueError, OSError):
            continue
        for r in data["records"]:
            if not any(key in r["metrics"] for key in COUNTER_METRICS):
                continue
            summed = found.setdefault((r["op"], r["stage"], tuple(r["size"])), {"device": data["device"]})
            for key, value in r["metrics"].items():
                if key in COUNTER_METRICS and isinstance(value, (int, float)):
                    summed[key] = summed.get(key, 0) + value
    return found


def compare_counters(counted: SimulatedCounters, recorded: dict) -> list[dict]:
    """The simulator's figures against the recorded ones for one stage: a row per COMPARED figure that both
    have, with ``agree`` (within AGREE_WITHIN of the larger, or AGREE_NEAR_ZERO per request)."""
    rows = []
    for name, (simulated_figure, recorded_figure) in COMPARED.items():
        mine, theirs = simulated_figure(counted), recorded_figure(recorded)
        if mine is None or theirs is None:
            continue  # an access the stage does not make, or a metric this ncu did not record
        agree = abs(mine - theirs) <= max(AGREE_WITHIN * max(abs(mine), abs(theirs)), AGREE_NEAR_ZERO)
        rows.append({"stage": counted.stage.key, "size": list(counted.size), "figure": name, "simulator": mine,
                     "recorded": theirs, "agree": agree})
    return rows
