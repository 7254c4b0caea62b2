"""AllReduce across the GPUs of this host: every stage of solutions/allreduce.py against NCCL.

    python3 -m workbench.tools.allreduce [--budget SECONDS] [--out DIR]
    python3 -m workbench.tools.allreduce --redraw [DIR]   (the figures again, from DIR's recorded run)

`workbench record` runs it (in a process of its own: NCCL's settings below must be in place before torch
is imported) on a machine with two GPUs or more. It writes ``DIR/gpu_allreduce.json`` and two figures,
``DIR/allreduce_sizes.png`` and ``DIR/allreduce-rmsnorm_shapes.png`` (DIR: ``results/runs``), which the
README's table (``workbench.tables``) and the notebooks read. While it runs, ``DIR/gpu_allreduce.partial.json``
holds what is measured so far; a stage stuck for a minute (a rank waiting for a peer) ends the run there.

Measured as nccl-tests does: a message of B bytes per GPU, time per all-reduce, algbw = B / time,
busbw = 2(N-1)/N * B / time, from 4 KB to 1 GB. Two times per figure:

* ``gpu_us``: GPU time per call, many calls enqueued behind a sleep kernel so that the host's launch
  cost is not in it (the workbench's method, see workbench/timing.py), for the stages and for NCCL.
  A sample in which the sleep ran out before the host had enqueued every call is retaken with a
  longer sleep: it timed the host (the first runs' NCCL figures at 4 KB-1 MB, 13-98 us, mixed both);
* ``wall_us``: wall time per call of a loop of calls then a synchronize, host cost included (what the
  issue's NCCL figures through torch.distributed were: 49.8 us at 1 MB).

NCCL runs through torch.distributed, one process per GPU (started by this script); the stages run in
this process, one rank per GPU, with peer pointers (``allreduce.Group.on_gpus``). Every stage is
checked at every size before it is timed: the inputs are small multiples of 1/16, so every sum is
exact in float32 and a device kernel compares each element with the exact sum (unwritten elements
hold NaN). Also measured: the NVLink ceiling (a copy-engine copy GPU 0 -> GPU 1, alone and both ways at once, and SM
stores into the peer, both ways), the exchange floor (16 bytes each way, one kernel a GPU), and
the fused all-reduce + residual + RMSNorm against NCCL + torch.add + RMSNorm (torch's, and the workbench's).

With one GPU there is nothing to compare with NCCL: the stages run with emulated ranks on it
(correctness and one-device times only). Prints a table and writes DIR/gpu_allreduce.json. Budget: about 3 minutes on two H200s.

Safety: NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, set below before anything else is imported, and inherited by the workers);
nothing here calls cuMulticastCreate.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
FUSED_SHAPES = [(16, 8192), (256, 8192), (4096, 8192)]  # (tokens, hidden): decode, small and large batch
FILL_GRID = (264, 256)  # blocks, threads of the pattern, fill and check kernels
BUDGET_S = 165  # stop starting new measurements after this (--budget sets it)
NCCL_S = 75  # NCCL's workers, every size and the unfused epilogue: about 40 s on two H200s
RUN_FILE = "gpu_allreduce.json"  # under --out: what the README's table and the notebooks read
PARTIAL_FILE = "gpu_allreduce.partial.json"  # what was measured so far, for a run that is cut short
SIZES_PLOT, FUSED_PLOT = "allreduce_sizes.png", "allreduce-rmsnorm_shapes.png"  # beside it, one per notebook
SAMPLES = 5  # timed samples a figure, the median kept: one late sample (a 4 KB call at 9.6 us among 5.1s) does not decide
HANG_S = 60  # no measurement takes this long: a stage still running after it is stuck waiting for a peer
T0 = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - T0


class Watchdog:
    """Ends a run stuck in a kernel (a rank waiting for a peer that never writes: a CUDA kernel cannot be
    interrupted) after writing what was measured so far, so one stuck stage does not lose the others."""

    def __init__(self, out: dict, out_dir: Path):
        import threading

        self.out, self.out_dir = out, out_dir
        self.what, self.deadline = "starting", time.perf_counter() + HANG_S
        threading.Thread(target=self._watch, daemon=True).start()

    def now(self, what: str, allow_s: float = HANG_S) -> None:
        """What the run starts now, and how long it may take."""
        self.what, self.deadline = what, time.perf_counter() + allow_s
        print(f"{elapsed():6.1f} s  {what}", flush=True)

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            if time.perf_counter() > self.deadline:
                self.out["notes"].append(f"stuck: {self.what} had not finished after its allowance; run ended there")
                save_partial(self.out, self.out_dir)
                print(f"STUCK: {self.what}; what was measured is in {self.out_dir / PARTIAL_FILE}", flush=True)
                os._exit(3)


def save_partial(out: dict, out_dir: Path) -> None:
    (out_dir / PARTIAL_FILE).write_text(json.dumps(out, indent=1, default=str))


def calls_for(nbytes: int) -> int:
    """Calls per timed sample: enough to dwarf event overhead, few for big messages."""
    return max(3, min(50, int(64e6 // max(nbytes, 1))))


# ====================================================================================================
# NCCL, one process per GPU (torch.distributed)
# ====================================================================================================

def nccl_worker(rank: int, world: int, port: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from solutions import layernorm

    torch.cuda.set_device(rank)
    cuda.select_device(rank)  # numba's kernels (the RMSNorm) on this process's GPU too, not GPU 0
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=dev)

    def pattern(n, r):
        i = torch.arange(n, dtype=torch.int64, device=dev)
        h = (i * 2654435761 + r * 40503) & 0xFFFFFFFF
        return (((h >> 7) % 257) - 128).to(torch.float32) * 0.0625

    def gpu_time(fn, k):
        """GPU time per call: k calls enqueued behind a sleep, events around them; median of SAMPLES samples.
        A sample whose sleep ran out before the host had enqueued every call (the start event already
        complete) timed the host, not the GPU: it is retaken with a sleep twice as long. Both ranks
        decide together (an all-reduce of the verdict), or they would fall out of step."""
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        fn()
        enqueue_us = (time.perf_counter() - t) / 2 * 1e6
        torch.cuda.synchronize()
        # One sleep for both ranks: a rank whose sleep ends first starts its all-reduce and waits in it
        # for the other, and that wait would be timed (the 2 x H200 run of 2026-11-29 timed NCCL at 4 KB
        # at 46 us that way, where NCCL takes about 10).
        agreed = torch.tensor([k * enqueue_us * 2 + 500], device=dev)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        per_call, sleep_us, retaken = [], float(agreed.item()), 0
        verdict = torch.zeros(1, device=dev)
        while len(per_call) < SAMPLES:
            dist.barrier()
            torch.cuda.synchronize()
            torch.cuda._sleep(int(sleep_us * 2000))  # ~2000 cycles a us
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(k):
                fn()
            verdict.fill_(float(start.query()))
            end.record()
            end.synchronize()
            dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
            if verdict.item() and retaken < 6:
                sleep_us, retaken = sleep_us * 2, retaken + 1
                continue
            per_call.append(start.elapsed_time(end) * 1000 / k)
        retakes[0] += retaken
        return sorted(per_call)[SAMPLES // 2]

    def wall_time(fn, k):
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(k):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / k * 1e6

    retakes = [0]
    results = {"rank": rank, "allreduce": [], "fused": []}
    for nbytes in SIZES:
        n = nbytes // 4
        x = pattern(n, rank)
        want = sum(pattern(n, r) for r in range(world))
        dist.all_reduce(x)
        correct = bool(torch.equal(x, want))
        k = calls_for(nbytes)
        results["allreduce"].append({"bytes": nbytes, "correct": correct,
                                     "gpu_us": gpu_time(lambda: dist.all_reduce(x), k),
                                     "wall_us": wall_time(lambda: dist.all_reduce(x), k)})
    # The unfused transformer epilogue: NCCL all-reduce (in place, as after a row-parallel matmul),
    # torch.add of the residual, then RMSNorm: torch's (torch.nn.functional.rms_norm, what a model calls)
    # and the workbench's fastest for these rows (solutions/layernorm.py, launched by numba).
    for rows, cols in FUSED_SHAPES:
        g = torch.Generator(device=dev).manual_seed(rank)
        partial = torch.randn(rows, cols, device=dev, generator=g) * 1e-3
        residual = torch.randn(rows, cols, device=dev, generator=g.manual_seed(99))
        weight = torch.rand(cols, device=dev, generator=g) + 0.5
        h = torch.empty_like(residual)
        y = torch.empty_like(residual)
        nh, nw, ny = cuda.as_cuda_array(h), cuda.as_cuda_array(weight), cuda.as_cuda_array(y)

        def with_torch_rmsnorm():
            dist.all_reduce(partial)
            torch.add(partial, residual, out=h)
            torch.nn.functional.rms_norm(h, (cols,), weight, eps=1e-5)

        def with_workbench_rmsnorm():
            dist.all_reduce(partial)
            torch.add(partial, residual, out=h)
            layernorm.rmsnorm_lean.launch(nh, nw, ny)

        k = max(3, min(30, int(32e6 // (rows * cols * 4))))
        results["fused"].append({"rows": rows, "cols": cols,
                                 "gpu_us": gpu_time(with_torch_rmsnorm, k), "wall_us": wall_time(with_torch_rmsnorm, k),
                                 "workbench_rmsnorm_gpu_us": gpu_time(with_workbench_rmsnorm, k)})
    results["starved_samples_retaken"] = retakes[0]
    Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def run_nccl(world: int, out_dir: Path, timeout_s: float) -> dict | None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    files = [out_dir / f"nccl_rank{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", "workbench.tools.allreduce", "--nccl-worker", str(r), str(world),
                               str(port), str(files[r])],
                              cwd=str(REPO), env=dict(os.environ)) for r in range(world)]
    deadline = time.perf_counter() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if not all(f.exists() for f in files):
        print(f"NCCL workers did not finish (exit codes {[p.returncode for p in procs]}): no NCCL figures")
        return None
    ranks = [json.loads(f.read_text()) for f in files]
    for f in files:
        f.unlink()
    # The slowest rank's time is the collective's time.
    merged = {"allreduce": [], "fused": [], "starved_samples_retaken": max(r.get("starved_samples_retaken", 0) for r in ranks)}
    for kind in ("allreduce", "fused"):
        for rows in zip(*(r[kind] for r in ranks)):
            rec = dict(rows[0])
            for key in ("gpu_us", "wall_us", "workbench_rmsnorm_gpu_us"):
                if key in rec:
                    rec[key] = max(r[key] for r in rows)
            if "correct" in rec:
                rec["correct"] = all(r["correct"] for r in rows)
            merged[kind].append(rec)
    return merged


# ====================================================================================================
# The stages, one rank per GPU, in this process
# ====================================================================================================

import numpy as np  # noqa: E402

import workbench  # noqa: E402,F401  (decides GPU or simulator before numba is imported)
from numba import cuda, float32, int32, uint64  # noqa: E402

from solutions._ptx import mailbox_clear_f32x4, mailbox_store_f32x4, mailbox_wait_f32x4  # noqa: E402
from workbench.tables import bus_gbps, bytes_label  # noqa: E402


@cuda.jit(device=True, inline=True)
def _value(i, rank):
    """Rank ``rank``'s element i: a multiple of 1/16 in [-8, 8), so any sum over a few ranks is exact."""
    h = (uint64(i) * uint64(2654435761) + uint64(rank) * uint64(40503)) & uint64(0xFFFFFFFF)
    return float32(int32((h >> uint64(7)) % uint64(257)) - int32(128)) * float32(0.0625)


@cuda.jit
def fill_pattern(a, rank):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = _value(i, rank)


@cuda.jit
def fill(a, v):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = v


@cuda.jit
def count_wrong(a, ranks, wrong):
    """Elements of a that differ from the exact sum over ranks (NaN: never written)."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        want = float32(0.0)
        for r in range(ranks):
            want += _value(i, r)
        if not (a[i] == want):
            cuda.atomic.add(wrong, 0, 1)


@cuda.jit
def push(src, peer_dst):
    """peer_dst[:] = src: stores over NVLink into a peer's memory, as the stages send their bytes."""
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        peer_dst[i] = src[i]


@cuda.jit
def exchange(peer_boxes, own_boxes, now, stale, max_polls):
    """The least any one-kernel all-reduce does, by one thread: push a 16-byte word into the peer's
    mailbox (this call's), wait for the peer's word to land in ours, empty last call's. Timed back to
    back, as the stages are: the floor under the lamport stage's latency on these links."""
    if cuda.threadIdx.x == 0:
        mailbox_store_f32x4(peer_boxes.ctypes.data + uint64(now * 16), float32(1.0), float32(1.0), float32(1.0),
                            float32(1.0))
        mailbox_wait_f32x4(own_boxes.ctypes.data + uint64(now * 16), max_polls)
        mailbox_clear_f32x4(own_boxes.ctypes.data + uint64(stale * 16))


@cuda.jit
def nothing(a):
    """The floor under every stage: one launch a rank, no work."""
    pass


@cuda.jit
def sleep(iterations):
    """Keeps a GPU busy (about 1 us an iteration: nanosleep may wake early, which the Timer notices)
    while the host enqueues a timed sample."""
    for _ in range(iterations):
        cuda.nanosleep(1000)


class Timer:
    """GPU time per call of a multi-GPU operation, and wall time, as in the NCCL worker."""

    def __init__(self, group, sleep_kernel):
        self.group, self.sleep = group, sleep_kernel
        self.starts, self.ends, self.retaken = [], [], 0
        for g in group.gpus:
            with cuda.gpus[g]:
                self.starts.append(cuda.event(timing=True))
                self.ends.append(cuda.event(timing=True))

    def gpu_us(self, call, k: int) -> float:
        """As the NCCL worker's gpu_time: median of SAMPLES samples, a sample retaken with a longer sleep when
        the host was still enqueueing after every GPU's sleep had run out."""
        group = self.group
        call()
        group.synchronize()
        t = time.perf_counter()
        call()
        call()
        enqueue_us = (time.perf_counter() - t) / 2 * 1e6
        group.synchronize()
        per_call, sleep_us, retaken = [], k * enqueue_us * 2 + 500, 0
        while len(per_call) < SAMPLES:
            for r, g in enumerate(group.gpus):
                with cuda.gpus[g]:
                    self.sleep[1, 1, group.streams[r]](int(sleep_us))
                    self.starts[r].record(group.streams[r])
            for _ in range(k):
                call()
            starved = any(e.query() for e in self.starts)
            for r, g in enumerate(group.gpus):
                with cuda.gpus[g]:
                    self.ends[r].record(group.streams[r])
            group.synchronize()
            if starved and retaken < 6:
                sleep_us, retaken = sleep_us * 2, retaken + 1
                continue
            per_call.append(max(cuda.event_elapsed_time(self.starts[r], self.ends[r]) for r in range(group.size)) * 1000 / k)
        self.retaken += retaken
        return sorted(per_call)[SAMPLES // 2]

    def wall_us(self, call, k: int) -> float:
        self.group.synchronize()
        t = time.perf_counter()
        for _ in range(k):
            call()
        self.group.synchronize()
        return (time.perf_counter() - t) / k * 1e6


def exchange_floor(group, timer) -> float:
    """GPU time per call of ``exchange`` on two GPUs: one launch a GPU and one 16-byte word each way."""
    from solutions import allreduce as ar

    boxes = [group.scratch(r, "tool.exchange", 3 * 4, np.uint32, zeroed=True) for r in range(2)]
    calls = [0]

    def call():
        now, stale = calls[0] % 3, (calls[0] + 2) % 3
        calls[0] += 1
        for r in range(2):
            group.launch(r, exchange, 1, 32, group.peers(r, boxes)[1 - r], boxes[r], now, stale, ar.MAX_POLLS)

    return timer.gpu_us(call, calls_for(4096))


def measure_stages(gpus, out: dict, watch: Watchdog) -> None:
    from solutions import allreduce as ar

    ranks = len(gpus)
    broken = set()
    for nbytes in SIZES:
        if elapsed() > BUDGET_S - 45:
            out["notes"].append(f"stages: stopped before {nbytes} bytes (time budget)")
            break
        n = nbytes // 4
        sends, recvs, wrong = [], [], []
        for r, g in enumerate(gpus):
            with cuda.gpus[g]:
                sends.append(cuda.device_array(n, np.float32))
                recvs.append(cuda.device_array(n, np.float32))
                wrong.append(cuda.device_array(1, np.int64))
                fill_pattern[FILL_GRID[0], FILL_GRID[1]](sends[r], r)
        group = ar.Group.on_gpus(sends, recvs, gpus)
        timer = Timer(group, sleep)
        if "launch_floor_us" not in out:
            out["launch_floor_us"] = timer.gpu_us(
                lambda: [group.launch(r, nothing, 1, 32, sends[r]) for r in range(ranks)], calls_for(4096))
            if ranks == 2:
                out["exchange_floor_us"] = exchange_floor(group, timer)
        for name, algorithm in ar.ALGORITHMS.items():
            if name in broken:
                continue
            rec = {"stage": name, "bytes": nbytes, "ranks": ranks}
            watch.now(f"{name} at {bytes_label(nbytes)}")
            try:
                for r, g in enumerate(gpus):
                    with cuda.gpus[g]:
                        fill[FILL_GRID[0], FILL_GRID[1]](recvs[r], np.float32(np.nan))
                        wrong[r].copy_to_device(np.zeros(1, np.int64))
                group.synchronize()
                algorithm(group)
                if name in ar.WAITING:
                    ar.check_flag_status(group, ar.WAITING[name])
                group.synchronize()
                bad = 0
                for r, g in enumerate(gpus):
                    with cuda.gpus[g]:
                        count_wrong[FILL_GRID[0], FILL_GRID[1]](recvs[r], ranks, wrong[r])
                        bad += int(wrong[r].copy_to_host()[0])
                rec["wrong_elements"] = bad
                rec["correct"] = bad == 0
                if bad == 0:
                    k = calls_for(nbytes)
                    rec["gpu_us"] = timer.gpu_us(lambda: algorithm(group), k)
                    rec["wall_us"] = timer.wall_us(lambda: algorithm(group), k)
                    if name in ar.WAITING:
                        ar.check_flag_status(group, ar.WAITING[name])
            except Exception as exc:  # report, and do not try this stage again
                rec["correct"] = False
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                broken.add(name)
            out["stages"].append(rec)
        out["starved_samples_retaken"] = out.get("starved_samples_retaken", 0) + timer.retaken
        save_partial(out, watch.out_dir)


def measure_fused(gpus, out: dict, watch: Watchdog) -> None:
    from solutions import allreduce as ar

    ranks = len(gpus)
    rng = np.random.default_rng(0)
    for rows, cols in FUSED_SHAPES:
        if elapsed() > BUDGET_S - 10:
            out["notes"].append(f"fused: stopped before {rows}x{cols} (time budget)")
            break
        partials = (rng.standard_normal((ranks, rows, cols)) * 1e-3).astype(np.float32)
        residual = rng.standard_normal((rows, cols)).astype(np.float32)
        weight = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        want = ar.fused_op.reference(partials, residual, weight)[0]
        d_partials, d_res, d_w, d_out = [], [], [], []
        for r, g in enumerate(gpus):
            with cuda.gpus[g]:
                d_partials.append(cuda.to_device(partials[r]))
                d_res.append(cuda.to_device(residual))
                d_w.append(cuda.to_device(weight))
                d_out.append(cuda.device_array((2, rows, cols), np.float32))
        group = ar.fused_group(d_partials, d_out, d_res, d_w, gpus)
        timer = Timer(group, sleep)
        for name, algorithm in ar.FUSED_ALGORITHMS.items():
            rec = {"stage": name, "rows": rows, "cols": cols, "ranks": ranks}
            watch.now(f"{name} at {rows}x{cols}")
            try:
                algorithm(group)
                if name in ar.FUSED_WAITING:
                    ar.check_flag_status(group, ar.FUSED_WAITING[name])
                group.synchronize()
                got = []
                for r, g in enumerate(gpus):
                    with cuda.gpus[g]:
                        got.append(d_out[r].copy_to_host())
                err = float(np.linalg.norm(got[0] - want) / np.linalg.norm(want))
                rec["rel_err"] = err
                rec["same_on_every_rank"] = all(np.array_equal(got[0], o) for o in got)
                rec["correct"] = err < 1e-5 and rec["same_on_every_rank"]
                if rec["correct"]:
                    k = max(3, min(30, int(32e6 // (rows * cols * 4))))
                    rec["gpu_us"] = timer.gpu_us(lambda: algorithm(group), k)
                    rec["wall_us"] = timer.wall_us(lambda: algorithm(group), k)
            except Exception as exc:
                rec["correct"] = False
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            out["fused"].append(rec)
        out["starved_samples_retaken"] = out.get("starved_samples_retaken", 0) + timer.retaken
        save_partial(out, watch.out_dir)


def measure_ceiling(gpus, out: dict) -> None:
    """The NVLink figure: a 256 MB copy from GPU 0 to GPU 1 (copy engine), alone and both ways at once."""
    # Without peer access the driver stages a device-to-device copy between GPUs through host memory:
    # the first run on two H200s (2026-11-23) measured 37 GB/s here while the stages moved 340 GB/s.
    from solutions import allreduce as ar

    ar.enable_peer_access(gpus)
    n = (256 << 20) // 4
    a, b, streams, ev = [], [], [], []
    for g in gpus[:2]:
        with cuda.gpus[g]:
            a.append(cuda.device_array(n, np.float32))
            b.append(cuda.device_array(n, np.float32))
            streams.append(cuda.stream())
            ev.append((cuda.event(), cuda.event()))

    def copy(directions):
        for rep in range(4):  # the first is a warm-up
            for d in directions:  # d: source GPU index; its stream copies its a into the other's b
                with cuda.gpus[gpus[d]]:
                    if rep == 3:
                        ev[d][0].record(streams[d])
                    b[1 - d].copy_to_device(a[d], stream=streams[d])
                    if rep == 3:
                        ev[d][1].record(streams[d])
            for d in directions:
                with cuda.gpus[gpus[d]]:
                    streams[d].synchronize()
        return [n * 4 / (cuda.event_elapsed_time(*ev[d]) * 1e-3) / 1e9 for d in directions]

    try:
        out["ceiling"] = {"peer_copy_gbps": copy([0])[0], "both_ways_gbps_each": copy([0, 1])}
    except Exception as exc:
        out["ceiling"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return
    # The stages move their bytes with SM stores into a peer's memory, not the copy engine: the same
    # push, every GPU writing into the next one's buffer at once, at a few grid sizes; the fastest is
    # the links' ceiling for them (the first runs' flags stage beat the copy engine's figure).
    group = ar.Group.on_gpus(a, b, gpus[:2])
    timer = Timer(group, sleep)
    best = 0.0
    for blocks in (264, 528, 1056):
        def push_both_ways():
            for r in range(2):
                group.launch(r, push, blocks, 512, a[r], group.peers(r, b)[1 - r])
        best = max(best, n * 4 / (timer.gpu_us(push_both_ways, 5) * 1e-6) / 1e9)
    out["ceiling"]["sm_push_gbps_each_way"] = best


def emulated_on_one_gpu(out: dict) -> None:
    """One GPU: every stage with emulated ranks (checked by the workbench, timed on the one device)."""
    from workbench.check import check_stage
    from workbench.ladder import to_device
    from workbench.timing import measure
    from solutions import allreduce as ar

    rng = np.random.default_rng(0)
    for op in (ar.op, ar.fused_op):
        for size in ([(2, 2**20 + 3), (4, 2**22)] if op is ar.op else [(2, 256, 8192)]):
            inputs = op.make_inputs(size, rng)
            for stage in op.stages:
                result = check_stage(stage, size, inputs=inputs)
                rec = {"stage": stage.key, "size": list(size), "correct": result.passed, "message": result.message}
                if result.passed:
                    args = tuple(to_device(a) for a in inputs) + (to_device(op.make_output(size)),)
                    rec["gpu_us"] = measure(stage.launch, [args], samples=5, budget_s=1.0).median_us
                out["emulated"].append(rec)


# ====================================================================================================
# Report
# ====================================================================================================

def unfused(base: dict) -> dict:
    """The unfused epilogue's GPU times from the NCCL workers' record: label -> us."""
    times = {"NCCL + add + torch RMSNorm": base["gpu_us"]}
    if "workbench_rmsnorm_gpu_us" in base:
        times["NCCL + add + workbench RMSNorm"] = base["workbench_rmsnorm_gpu_us"]
    return times


def report(out: dict, out_dir: Path) -> None:
    ranks = out["ranks"]
    nccl = {r["bytes"]: r for r in (out.get("nccl") or {}).get("allreduce", [])}
    names = list(dict.fromkeys(r["stage"] for r in out["stages"]))
    by = {(r["stage"], r["bytes"]): r for r in out["stages"]}
    print(f"\nAllReduce, float32, {ranks} GPUs ({out['device']}): GPU time per call in us (busbw GB/s); "
          "x = wrong or failed")
    print(f"{'size':>7} " + " ".join(f"{n:>16}" for n in names + ["NCCL"]) + f" {'NCCL wall':>10}")
    for nbytes in SIZES:
        cells = []
        for name in names + ["NCCL"]:
            r = nccl.get(nbytes) if name == "NCCL" else by.get((name, nbytes))
            if r is None:
                cells.append(f"{'-':>16}")
            elif not r.get("correct") or "gpu_us" not in r:
                cells.append(f"{'x':>16}")
            else:
                cells.append(f"{r['gpu_us']:9.1f} ({bus_gbps(nbytes, ranks, r['gpu_us']):4.0f})")
        wall = nccl.get(nbytes, {}).get("wall_us")
        print(f"{bytes_label(nbytes):>7} " + " ".join(cells) + (f" {wall:10.1f}" if wall else ""))
    for r in out["stages"]:
        if "error" in r or not r.get("correct", True):
            print(f"  {r['stage']} @ {bytes_label(r['bytes'])}: {r.get('error') or str(r.get('wrong_elements')) + ' wrong elements'}")
    if out.get("ceiling"):
        print(f"NVLink ceiling (peer copy): {out['ceiling']}")
    if "launch_floor_us" in out:
        print(f"Launch floor (an empty kernel on each GPU a call): {out['launch_floor_us']:.2f} us")
    if "exchange_floor_us" in out:
        print(f"Exchange floor (a kernel on each GPU a call pushing 16 bytes to the other and waiting for its 16): "
              f"{out['exchange_floor_us']:.2f} us")
    print(f"Samples retaken because the host had not finished enqueueing: stages {out.get('starved_samples_retaken', 0)}, "
          f"NCCL {(out.get('nccl') or {}).get('starved_samples_retaken', 0)}")

    fused_nccl = {(r["rows"], r["cols"]): r for r in (out.get("nccl") or {}).get("fused", [])}
    if out["fused"]:
        print("\nAll-reduce + residual + RMSNorm, GPU time per call in us (wall us)")
        for r in out["fused"]:
            base = fused_nccl.get((r["rows"], r["cols"]))
            cell = f"{r['gpu_us']:8.1f} ({r['wall_us']:8.1f})" if "gpu_us" in r else f"x {r.get('error', '')}{r.get('rel_err', '')}"
            line = f"  {r['rows']}x{r['cols']} {r['stage']:>12}: {cell}"
            if base:
                line += "   " + ", ".join(f"{name} {us:8.1f}" for name, us in unfused(base).items())
            print(line)

    # The targets, judged on GPU time (both sides measured the same way in this run).
    must = {}
    if nccl and ranks >= 2:
        def best(nbytes):
            times = [by[(n, nbytes)]["gpu_us"] for n in names if "gpu_us" in by.get((n, nbytes), {})]
            return min(times) if times else None
        for nbytes in (256 << 20, 1 << 30):
            b, c = best(nbytes), nccl.get(nbytes, {}).get("gpu_us")
            if b and c:
                must[f"busbw_at_{bytes_label(nbytes)}"] = {"best": bus_gbps(nbytes, ranks, b), "nccl": bus_gbps(nbytes, ranks, c),
                                                     "met": b <= c}
        for nbytes in [s for s in SIZES if s <= 1 << 20]:
            b, c = best(nbytes), nccl.get(nbytes, {}).get("gpu_us")
            if b and c:
                must[f"latency_at_{bytes_label(nbytes)}"] = {"best_us": b, "nccl_us": c, "nccl_wall_us": nccl[nbytes]["wall_us"],
                                                       "met": b <= c / 2}
        for rows, cols in FUSED_SHAPES:  # the best one-kernel stage (not "separate", the unfused one)
            base = fused_nccl.get((rows, cols))
            fused = [r for r in out["fused"] if (r["rows"], r["cols"]) == (rows, cols) and "gpu_us" in r
                     and r.get("correct") and r["stage"] != "separate"]
            if base and fused:
                top = min(fused, key=lambda r: r["gpu_us"])
                fastest = min(unfused(base).values())  # against the faster RMSNorm: torch's or the workbench's
                must[f"fused_{rows}x{cols}"] = {"stage": top["stage"], "fused_us": top["gpu_us"],
                                                "nccl_add_torch_rmsnorm_us": base["gpu_us"],
                                                "nccl_add_workbench_rmsnorm_us": base.get("workbench_rmsnorm_gpu_us"),
                                                "met": top["gpu_us"] < fastest}
        must["correct_everywhere"] = {"met": all(r.get("correct") for r in out["stages"]) and
                                      len(out["stages"]) == len(SIZES) * len(names)}
    out["must_show"] = must
    if must:
        print("\nMust show (GPU time, this run):")
        for k, v in must.items():
            print(f"  {'MET ' if v.get('met') else 'NOT '} {k}: {v}")
    for r in out.get("emulated", []):
        print(f"  emulated {r['stage']} @ {r['size']}: {'ok' if r['correct'] else 'WRONG ' + r['message']}"
              + (f" {r['gpu_us']:.1f} us" if 'gpu_us' in r else ""))
    for note in out["notes"]:
        print("note:", note)
    (out_dir / RUN_FILE).write_text(json.dumps(out, indent=1, default=str))
    (out_dir / PARTIAL_FILE).unlink(missing_ok=True)
    draw(out, out_dir)
    print(f"\nwrote {out_dir / RUN_FILE} in {elapsed():.0f} s")


def draw(run: dict, out_dir: Path) -> list[Path]:
    """The run's two figures beside its JSON (``--redraw`` makes them again from the JSON alone): against
    message size, each stage's and NCCL's time, algorithm bandwidth and bus bandwidth; and the fused
    all-reduce + RMSNorm against NCCL + add + RMSNorm (torch's, and the workbench's) at each shape."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    ranks = run["ranks"]
    if ranks < 2:
        return []
    names = list(dict.fromkeys(r["stage"] for r in run["stages"]))
    by = {(r["stage"], r["bytes"]): r["gpu_us"] for r in run["stages"] if r.get("correct") and "gpu_us" in r}
    nccl = {r["bytes"]: r["gpu_us"] for r in (run.get("nccl") or {}).get("allreduce", []) if "gpu_us" in r}
    sizes = run["sizes"]
    when = f"{ranks} x {run['device']}, {run.get('date', '')[:10]}"
    series = [(name, {s: by[(name, s)] for s in sizes if (name, s) in by}, {"marker": "o"}) for name in names]
    series.append(("NCCL (torch.distributed)", nccl, {"marker": "s", "color": "black", "linewidth": 2.5}))
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    panels = [("time per call, µs (GPU time; lower is better)", lambda s, us: us),
              ("algorithm bandwidth, GB/s (bytes per GPU / time)", lambda s, us: s / (us * 1e-6) / 1e9),
              ("bus bandwidth, GB/s (2(N-1)/N x bytes / time)", lambda s, us: bus_gbps(s, ranks, us))]
    for ax, (ylabel, value) in zip(axes, panels):
        for name, times, style in series:
            if times:
                ax.plot(list(times), [value(s, us) for s, us in times.items()], label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [bytes_label(s) for s in sizes], rotation=45)
        ax.set_xlabel("message, bytes per GPU")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    links = run.get("ceiling", {})
    for key, what, style in (("peer_copy_gbps", "copy engine", "--"), ("sm_push_gbps_each_way", "SM stores, both ways", ":")):
        if links.get(key):
            axes[2].axhline(links[key], color="grey", linestyle=style, label=f"NVLink, {what}: {links[key]:.0f} GB/s")
    for key, what, style in (("exchange_floor_us", "exchange floor: 16 B each way", ":"),
                             ("launch_floor_us", "launch floor: an empty kernel", "--")):
        if run.get(key):
            axes[0].axhline(run[key], color="tab:olive", linestyle=style, label=f"{what}, {run[key]:.1f} µs")
    axes[0].set_title("latency")
    axes[1].set_title("algorithm bandwidth")
    axes[2].set_title("bus bandwidth")
    handles, labels = axes[2].get_legend_handles_labels()
    floors = axes[0].get_legend_handles_labels()
    handles, labels = handles + floors[0][len(series):], labels + floors[1][len(series):]
    fig.legend(handles, labels, loc="lower center", ncol=(len(labels) + 1) // 2, fontsize=9, frameon=False)
    fig.suptitle(f"AllReduce of float32 buffers, every stage against NCCL ({when})")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    written = [out_dir / SIZES_PLOT]
    fig.savefig(written[0], dpi=100)
    plt.close(fig)

    fused = [r for r in run.get("fused", []) if r.get("correct") and "gpu_us" in r]
    base = {(r["rows"], r["cols"]): r for r in (run.get("nccl") or {}).get("fused", []) if "gpu_us" in r}
    shapes = sorted({(r["rows"], r["cols"]) for r in fused})
    if shapes:
        stages = list(dict.fromkeys(r["stage"] for r in fused))
        fig, axes = plt.subplots(1, len(shapes), figsize=(5.4 * len(shapes), 4.8), squeeze=False)
        for ax, (rows, cols) in zip(axes[0], shapes):
            bars = [(s, r["gpu_us"]) for s in stages for r in fused if (r["stage"], r["rows"], r["cols"]) == (s, rows, cols)]
            peers = [(name.replace(" + ", "\n+ ").replace(" RMSNorm", "\nRMSNorm"), us)
                     for name, us in unfused(base[(rows, cols)]).items()] if (rows, cols) in base else []
            colours = ["tab:blue"] * len(bars) + ["black", "dimgrey"][:len(peers)]
            bars += peers
            ax.bar(range(len(bars)), [us for _, us in bars], color=colours)
            ax.set_xticks(range(len(bars)), [n.replace("fused_", "fused_\n") for n, _ in bars], fontsize=8)
            for i, (_, us) in enumerate(bars):
                ax.annotate(f"{us:.0f}" if us >= 100 else f"{us:.1f}", (i, us), ha="center", va="bottom", fontsize=8)
            ax.set_title(f"{rows} tokens x {cols} hidden")
            ax.set_ylabel("GPU time per call, µs (lower is better)")
        fig.suptitle(f"All-reduce + residual + RMSNorm: the stages (blue) against NCCL + torch.add + RMSNorm ({when})")
        fig.tight_layout()
        written.append(out_dir / FUSED_PLOT)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def refuse(why: str) -> None:
    """One line on stderr, exit status 2 (bad input, as the workbench's commands)."""
    print(f"error: {why}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    global BUDGET_S
    if len(sys.argv) > 1 and sys.argv[1] == "--nccl-worker":  # (this script starting its own NCCL ranks)
        rank, world, port, path = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        nccl_worker(rank, world, port, path)
        return
    import argparse

    from workbench import device
    from workbench.results import environment, now, results_dir

    parser = argparse.ArgumentParser(prog="python3 -m workbench.tools.allreduce", description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which no new measurement starts")
    parser.add_argument("--out", type=Path, default=results_dir() / "runs", help="folder of the run's JSON and plot")
    parser.add_argument("--redraw", nargs="?", type=Path, const=results_dir() / "runs", metavar="DIR",
                        help="draw the figures again from DIR's recorded run (default: results/runs), measure nothing")
    args = parser.parse_args()
    if args.redraw is not None:
        recorded = args.redraw / RUN_FILE
        if not recorded.is_file():
            refuse(f"no recorded run at {recorded}: `workbench record allreduce` on a machine with two GPUs or "
                   "more writes it")
        for path in draw(json.loads(recorded.read_text()), args.redraw):
            print(f"drew {path}")
        return
    if device.is_simulator():
        refuse("the all-reduce is measured on GPUs, and this machine has none (numba's simulator is on): "
               "`workbench record allreduce` on a machine with two GPUs or more runs it")
    BUDGET_S = args.budget
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)

    gpus = list(range(len(cuda.gpus)))
    out = {"device": cuda.gpus[0].name.decode() if isinstance(cuda.gpus[0].name, bytes) else str(cuda.gpus[0].name),
           "date": now(), "mode": workbench.MODE, "ranks": len(gpus), "sizes": SIZES, "stages": [], "fused": [], "emulated": [], "notes": [],
           "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}}
    try:
        out["versions"] = environment()
    except Exception as exc:
        out["versions"] = {"error": str(exc)}
    if len(gpus) < 2:
        out["notes"].append("one GPU: no NCCL comparison; stages run with emulated ranks")
        emulated_on_one_gpu(out)
    else:
        watch = Watchdog(out, out_dir)
        watch.now(f"NCCL on {len(gpus)} GPUs (torch.distributed, a process a GPU)", allow_s=NCCL_S + 15)
        out["nccl"] = run_nccl(len(gpus), out_dir, timeout_s=NCCL_S)
        watch.now("NVLink ceiling (peer copy)")
        measure_ceiling(gpus, out)
        measure_stages(gpus, out, watch)
        measure_fused(gpus, out, watch)
        watch.now("report", allow_s=120)
    report(out, out_dir)
    # Everything is written. On two H200s (2026-11-23) the interpreter's teardown, run after this point with
    # peer mappings still open in both contexts, ended in a segmentation fault: leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
