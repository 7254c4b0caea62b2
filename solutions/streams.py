"""Streams and asynchronous copies: host data larger than one chunk, copied in, computed on, copied out.

The data starts and ends in host memory (a batch arriving from a loader, results going back to it),
and the kernel, a tanh-GELU, takes far less time than the copies: PCIe moves 50-60 GB/s each way
where HBM moves 4000. The ceiling is the host<->device link, and the ladder is about reaching it:

1. ``pageable``: ordinary numpy arrays. The driver cannot DMA from memory the OS may page out, so
   each copy is staged through a pinned buffer of the driver's, piece by piece, and the copy, the
   kernel and the copy back run one after the other.
2. ``pinned``: the host arrays allocated page-locked (``cuda.pinned_array``): the copy engines read
   and write them directly, at the link's rate. Still one thing at a time.
3. ``overlapped``: the work cut into chunks, each chunk's copy in, kernel and copy out issued on one
   of several streams. The GPU has a copy engine for each direction besides its multiprocessors, so
   chunk i+1 comes in while chunk i is computed and chunk i-1 goes out.

Not an ``Operator``: a stage here takes *host* arrays, and what it teaches is a timeline, while the
harness's operators take device arrays and are timed on the GPU alone. So the module carries its own
runner (:func:`run_stage`: the result checked against a float64 reference, CUDA events around every
copy and kernel), the ceiling (:func:`measure_link`: the same bytes copied both ways at once with
nothing else running) and the Gantt chart (:func:`draw_timelines`). :func:`run_ladder` runs them all (on
a GPU for real times); ``tests/test_tools.py`` checks every stage in the simulator (where the times mean nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from numba import cuda, float32

from workbench.ladder import blocks_for

THREADS = 256
# The overlapped stage's chunks: more hide more of the first copy in and the last copy out, but each costs
# the host ~0.4 ms to issue (three numba calls and their events), and the host is part of the pipeline:
# at 2^26 floats on an H200, 8 chunks reached 93-97% of the both-ways link, 16 chunks 83-91%, 32 chunks 56-58%
# (results/runs/gpu_streams_sweep_2026-11-24.jsonl).
CHUNKS = 8
STREAMS = 2  # streams the chunks take in turn: two already let chunk i+1 come in while chunk i goes out
SQRT_2_OVER_PI = np.float32(math.sqrt(2.0 / math.pi))


# -- the work: a GELU over a vector -------------------------------------------------------------------

@cuda.jit
def _gelu(x, out):
    """out = GELU(x), tanh approximation; a grid-stride loop, so any grid covers any length."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        out[i] = float32(0.5) * v * (float32(1.0) + math.tanh(SQRT_2_OVER_PI * (v + float32(0.044715) * v * v * v)))


def reference(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def gelu_grid(n: int) -> int:
    return min(blocks_for(n, THREADS), 132 * 8)  # a grid-stride loop: a grid that fills the GPU suffices


# -- a timeline: CUDA events around every copy and kernel ----------------------------------------------

@dataclass
class Span:
    lane: str  # the row of the Gantt chart: "default stream", "stream 2", ...
    kind: str  # "copy in", "kernel", "copy out"
    chunk: int
    start: object  # CUDA events, read after the run
    end: object
    start_ms: float = 0.0
    end_ms: float = 0.0


@dataclass
class Timeline:
    origin: object = field(default_factory=lambda: cuda.event())
    spans: list = field(default_factory=list)

    def begin(self, stream=0) -> None:
        self.origin.record(stream)

    def around(self, lane: str, kind: str, chunk: int, stream, work: Callable[[], None]) -> None:
        """Run ``work`` (which enqueues on ``stream``) between two events recorded on that stream."""
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        work()
        end.record(stream)
        self.spans.append(Span(lane, kind, chunk, start, end))

    def read(self) -> list[Span]:
        """After a synchronize: each span's start and end in ms from the origin."""
        for s in self.spans:
            s.start_ms = self.origin.elapsed_time(s.start)
            s.end_ms = self.origin.elapsed_time(s.end)
        return self.spans


@dataclass
class Workspace:
    """Device buffers and streams, made once and reused: allocating them is not what is measured."""
    n: int
    d_x: object = None
    d_out: object = None
    streams: list = field(default_factory=list)

    def __post_init__(self):
        self.d_x = cuda.device_array(self.n, np.float32)
        self.d_out = cuda.device_array(self.n, np.float32)
        self.streams = [cuda.stream() for _ in range(STREAMS)]


# -- the stages ------------------------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    order: int
    summary: str
    run: Callable  # run(x_host, out_host, workspace, timeline)
    pinned: bool  # the host arrays it is given are page-locked


STAGES: list[Stage] = []


def stage(name: str, summary: str, *, pinned: bool):
    def register(run):
        STAGES.append(Stage(name, len(STAGES) + 1, " ".join(summary.split()), run, pinned))
        return run
    return register


def _one_at_a_time(x, out, ws, tl):
    tl.around("default stream", "copy in", 0, 0, lambda: ws.d_x.copy_to_device(x))
    tl.around("default stream", "kernel", 0, 0, lambda: _gelu[gelu_grid(x.size), THREADS](ws.d_x, ws.d_out))
    tl.around("default stream", "copy out", 0, 0, lambda: ws.d_out.copy_to_host(out))


@stage("pageable", """
    Copy in, compute, copy out, on the default stream, from ordinary (pageable) numpy arrays. The
    copy engines can only read page-locked memory, so the driver stages every copy through a pinned
    buffer of its own, chunk by chunk, with a CPU memcpy in the way: well under the link's rate.
    Nothing overlaps: the timeline is three bars end to end.""", pinned=False)
def pageable(x, out, ws, tl):
    _one_at_a_time(x, out, ws, tl)


@stage("pinned", """
    The same three steps from host arrays allocated page-locked (cuda.pinned_array): the copy engines
    read and write them directly, so each copy runs at the link's rate, often twice the pageable
    one. Allocate pinned where the data is produced: pinning an existing array costs a copy of its
    own. Still nothing overlaps: while a copy runs the multiprocessors idle, and the other
    direction's copy engine too.""", pinned=True)
def pinned(x, out, ws, tl):
    _one_at_a_time(x, out, ws, tl)


@stage("overlapped", """
    The vector cut into 8 chunks, each chunk's copy in, kernel and copy out issued on one of two
    streams in turn (asynchronous copies: they need pinned memory). Work on one stream runs in
    order; work on different streams may overlap, and the GPU has a copy engine for each direction
    beside its multiprocessors: chunk i+1 comes in while chunk i is computed and chunk i-1 goes
    out. Only the first chunk's copy in and the last one's copy out are left exposed, so the whole
    takes about as long as moving the bytes both ways at once: the link's ceiling. Why not more,
    smaller chunks: the host issues every copy, at ~0.4 ms a chunk through numba, and once issuing
    takes longer than the copies the engines wait for the host (16 chunks 83-91% of the link, 32
    chunks 56-58%, 8 chunks 93-97%).""", pinned=True)
def overlapped(x, out, ws, tl):
    n = x.size
    chunk = blocks_for(n, CHUNKS)
    for c, lo in enumerate(range(0, n, chunk)):
        hi = min(n, lo + chunk)
        s = ws.streams[c % len(ws.streams)]
        lane = f"stream {c % len(ws.streams) + 1}"
        d_x, d_out = ws.d_x[lo:hi], ws.d_out[lo:hi]
        tl.around(lane, "copy in", c, s, lambda: d_x.copy_to_device(x[lo:hi], stream=s))
        tl.around(lane, "kernel", c, s, lambda: _gelu[gelu_grid(hi - lo), THREADS, s](d_x, d_out))
        tl.around(lane, "copy out", c, s, lambda: d_out.copy_to_host(out[lo:hi], stream=s))


# -- running a stage, and the ceiling --------------------------------------------------------------------

def host_arrays(n: int, pinned: bool, rng: np.random.Generator | None = None):
    """(x, out) on the host: pinned or pageable; x random (never zeros), out poisoned with NaN."""
    rng = rng or np.random.default_rng(0)
    if pinned:
        x, out = cuda.pinned_array(n, np.float32), cuda.pinned_array(n, np.float32)
    else:
        x, out = np.empty(n, np.float32), np.empty(n, np.float32)
    x[:] = rng.uniform(-4.0, 4.0, n).astype(np.float32)
    out[:] = np.nan
    return x, out


@dataclass
class Run:
    stage: str
    n: int
    total_ms: float
    spans: list
    rel_err: float
    passed: bool

    @property
    def gbps(self) -> float:
        """Bytes over the link (in and out) per second."""
        return 2 * 4 * self.n / (self.total_ms * 1e-3) / 1e9

    def as_dict(self) -> dict:
        return {"stage": self.stage, "n": self.n, "total_ms": self.total_ms, "gbps": self.gbps,
                "rel_err": self.rel_err, "passed": self.passed,
                "spans": [{"lane": s.lane, "kind": s.kind, "chunk": s.chunk, "start_ms": s.start_ms,
                           "end_ms": s.end_ms} for s in self.spans]}


def run_stage(st: Stage, x: np.ndarray, out: np.ndarray, ws: Workspace, tolerance: float = 1e-5) -> Run:
    """Run one stage once on host arrays (of the kind it wants), timed by events, and check it."""
    if x.size != ws.n or out.size != ws.n:
        raise ValueError(f"the workspace holds {ws.n} elements; x has {x.size}, out {out.size}")
    out[:] = np.nan
    cuda.synchronize()
    tl = Timeline()
    tl.begin()
    st.run(x, out, ws, tl)
    end = cuda.event()
    end.record()  # the default (legacy) stream waits for every other stream: the end of everything
    end.synchronize()
    cuda.synchronize()
    spans = tl.read()
    total = tl.origin.elapsed_time(end)
    ref = reference(x)
    err = float(np.linalg.norm(out.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))
    passed = bool(np.isfinite(out).all() and err <= tolerance)
    return Run(st.name, int(x.size), float(total), spans, err, passed)


def measure_link(n: int, repeats: int = 5) -> dict:
    """The ceiling: pinned copies of n float32 each way, alone (H2D, D2H) and both at once on two
    streams (what the overlapped stage can at best approach). Median of ``repeats``, in ms and GB/s."""
    x, out = cuda.pinned_array(n, np.float32), cuda.pinned_array(n, np.float32)
    x[:] = 1.0
    d_in, d_out = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    s_in, s_out = cuda.stream(), cuda.stream()

    def timed(work) -> float:
        times = []
        for _ in range(repeats):
            cuda.synchronize()
            start, end = cuda.event(), cuda.event()
            start.record()
            work()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return float(np.median(times))

    h2d = timed(lambda: d_in.copy_to_device(x, stream=s_in))
    d2h = timed(lambda: d_out.copy_to_host(out, stream=s_out))
    both = timed(lambda: (d_in.copy_to_device(x, stream=s_in), d_out.copy_to_host(out, stream=s_out)))
    nbytes = 4 * n
    return {"n": n, "h2d_ms": h2d, "d2h_ms": d2h, "both_ways_ms": both, "h2d_gbps": nbytes / h2d / 1e6,
            "d2h_gbps": nbytes / d2h / 1e6, "both_ways_gbps": 2 * nbytes / both / 1e6}


def run_ladder(n: int, repeats: int = 3, rng: np.random.Generator | None = None) -> dict:
    """Every stage at n elements (the best of ``repeats`` runs, each checked) and the link's ceiling."""
    ws = Workspace(n)
    _gelu[1, THREADS](ws.d_x[:1], ws.d_out[:1])  # compile before anything is timed
    cuda.synchronize()
    runs = []
    for st in STAGES:
        x, out = host_arrays(n, st.pinned, rng)
        tries = [run_stage(st, x, out, ws) for _ in range(repeats)]
        failed = [r for r in tries if not r.passed]
        runs.append(failed[0] if failed else min(tries, key=lambda r: r.total_ms))
    return {"runs": runs, "link": measure_link(n) if n >= 1 << 20 else None}


def percent_of_link(run: Run, link: dict | None) -> float | None:
    """The ceiling's time (both ways at once) as a percentage of the run's."""
    if not link:
        return None
    return 100.0 * link["both_ways_ms"] / run.total_ms


# -- the Gantt chart ----------------------------------------------------------------------------------------

COLOURS = {"copy in": "#4C72B0", "kernel": "#55A868", "copy out": "#C44E52"}


def draw_timelines(runs: list, path, link: dict | None = None) -> None:
    """One Gantt chart per run (a row per stream, a bar per copy or kernel), stacked, on one time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes_of = [sorted({s.lane for s in r.spans}, key=lambda l: (l != "default stream", l)) for r in runs]
    heights = [max(1, len(l)) * 0.45 + 0.9 for l in lanes_of]
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, sum(heights)), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    longest = max(r.total_ms for r in runs)
    for ax, run, lanes in zip(axes[:, 0], runs, lanes_of):
        for s in run.spans:
            y = lanes.index(s.lane)
            ax.barh(y, max(s.end_ms - s.start_ms, longest * 1e-4), left=s.start_ms, height=0.7,
                    color=COLOURS[s.kind], edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.invert_yaxis()
        title = f"{run.stage}: {run.total_ms:.2f} ms, {run.gbps:.1f} GB/s over the link"
        pct = percent_of_link(run, link)
        if pct is not None:
            title += f" ({pct:.0f}% of the measured both-ways copy)"
        ax.set_title(title, loc="left", fontsize=10)
        ax.axvline(run.total_ms, color="grey", lw=0.8, ls=":")
    axes[-1, 0].set_xlabel("ms since the first copy was issued")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="upper right", ncol=3,
               fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
