"""torch.compile beside eager torch as a peer (issue 16): the Operator field, the bench's list of peers,
the strongest peer on every stage record, a compile failure as one failure line, and the table's
"vs" column. Runs in the simulator without torch: peers are fakes written here, in numba, and
``workbench.library_peers`` is monkeypatched where torch would be asked for."""

from __future__ import annotations

import json

import numpy as np
import pytest
from numba import cuda

from workbench import bench, library_peers, registry, tables
from workbench.ladder import Operator, as_size, expect_device_array

SIZE = (5,)
ENV = {"device": "simulated", "l2_bytes": 1 << 10}


@cuda.jit
def _double(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]


def _launch_double(x, out):
    _double[1, 32](x, out)


def _operator(**fields) -> Operator:
    op = Operator(
        name="twice", title="2x", reference=lambda x: 2 * x.astype(np.float64),
        make_inputs=lambda size, rng: (rng.standard_normal(size).astype(np.float32),),
        make_output=lambda size: np.empty(size, np.float32), bytes_moved=lambda size: 8 * size[0],
        flops=lambda size: size[0], validate=lambda x, out: expect_device_array("x", x),
        check_sizes=[SIZE], sim_sizes=[SIZE], bench_sizes=[SIZE], headline_size=SIZE, **fields)
    op.stage("double", "the only stage")(_launch_double)
    return op


def _fake_timing(median_us):
    """A measure() that reports a fixed median (the simulator's clock says nothing about speed)."""
    def measure(launch, arg_sets):
        launch(*arg_sets[0])
        return bench.Timing(median_us.get(getattr(launch, "label", "stage"), 10.0), 1.0, 2.0, 1.0, 5, 1, 3.0)
    return measure


def _labelled(label, launch):
    launch.label = label
    return launch


def _eager_peer(size):
    return "eager", _labelled("eager", lambda x, out: _launch_double(x, out))


def test_torch_expression_is_optional_and_given_where_issue_16_asks():
    assert _operator().torch_expression is None
    ops = registry.load_operators()
    asked = {"softmax", "layernorm", "rmsnorm", "layernorm[residual]", "layernorm[bias_relu]", "elementwise",
             "softmax[fp16]", "softmax[bf16]", "layernorm[fp16]", "layernorm[bf16]", "rmsnorm[fp16]", "rmsnorm[bf16]",
             "elementwise[fp16]", "elementwise[bf16]", "depthwise3x3", "pool2d[max]", "batchnorm[infer]", "rope",
             "rope[interleaved]", "attention"}
    assert not [name for name in asked if ops[name].torch_expression is None]


def test_without_torch_there_is_no_compiled_peer():
    """The simulator has no torch: the compiled peer is absent, never a crash or a stub."""
    assert library_peers.torch() is None
    assert library_peers.compiled_peer(registry.operator("softmax"), (4, 100)) is None
    assert bench.peer_launches(_operator(peer=_eager_peer), SIZE, with_compile=True)[0][0] == "eager"


def _bench(monkeypatch, op, median_us, compiled_peer, with_compile=True):
    monkeypatch.setattr(bench, "measure", _fake_timing(median_us))
    monkeypatch.setattr(library_peers, "compiled_peer", compiled_peer)
    return bench.bench_size(op, op.stages, SIZE, {}, np.random.default_rng(0), ENV, with_compile=with_compile)


def _compiled(size_seen):
    def compiled_peer(op, size):
        size_seen.append(as_size(size))
        return library_peers.COMPILED_NAME, _labelled(library_peers.COMPILED_NAME, lambda x, out: _launch_double(x, out))
    return compiled_peer


@pytest.mark.parametrize("eager_us, compiled_us, strongest", [(8.0, 5.0, "torch.compile"), (4.0, 5.0, "eager")])
def test_every_peer_is_recorded_and_stages_compare_with_the_strongest(monkeypatch, eager_us, compiled_us, strongest):
    seen = []
    records, failures = _bench(monkeypatch, _operator(peer=_eager_peer),
                               {"eager": eager_us, "torch.compile": compiled_us, "stage": 10.0}, _compiled(seen))
    assert not failures and seen == [SIZE]
    peer_records = [r for r in records if r["kind"] == "peer"]
    assert [r["stage"] for r in peer_records] == ["eager", "torch.compile"]  # eager first: the tests' targets
    assert all(r["order"] == 0 for r in peer_records)
    (stage,) = [r for r in records if r["kind"] == "stage"]
    assert stage["peer"]["name"] == strongest
    assert stage["peer"]["median_us"] == min(eager_us, compiled_us)


def test_no_compile_times_the_eager_peer_alone(monkeypatch):
    seen = []
    records, failures = _bench(monkeypatch, _operator(peer=_eager_peer), {"eager": 4.0}, _compiled(seen),
                               with_compile=False)
    assert not failures and seen == []
    assert [r["stage"] for r in records if r["kind"] == "peer"] == ["eager"]


def test_a_compile_failure_is_one_failure_line_and_the_rest_is_measured(monkeypatch):
    def compiled_peer(op, size):
        def launch(x, out):
            raise RuntimeError("backend='inductor' raised:\nCompilationError: at 3:4 ...\nmore lines")
        return library_peers.COMPILED_NAME, launch

    records, failures = _bench(monkeypatch, _operator(peer=_eager_peer), {"eager": 4.0}, compiled_peer)
    assert failures == ["torch.compile @ 5: RuntimeError: backend='inductor' raised:"]
    assert [r["stage"] for r in records] == ["eager", "double"]
    assert records[1]["peer"]["name"] == "eager"


def test_a_wrong_compiled_result_gets_no_figure(monkeypatch):
    def compiled_peer(op, size):
        return library_peers.COMPILED_NAME, _labelled(library_peers.COMPILED_NAME, lambda x, out: None)  # writes nothing

    records, failures = _bench(monkeypatch, _operator(), {}, compiled_peer)
    assert len(failures) == 1 and failures[0].startswith("torch.compile @ 5")
    assert [r["stage"] for r in records] == ["double"] and records[0]["peer"] is None


def test_table_compares_with_the_strongest_peer(monkeypatch):
    records, _ = _bench(monkeypatch, _operator(peer=_eager_peer), {"eager": 8.0, "torch.compile": 5.0, "stage": 10.0},
                        _compiled([]))
    op = _operator()
    for r in records:
        r.update(date="2026-11-23T00:00:00", versions={"numba_cuda": "0.30.4"}, gflops=r.get("gflops", 0))
    text = tables.ladder_table(op, {"device": "GPU", "records": records})
    header = [line for line in text.splitlines() if line.startswith("| # |")][0]
    assert header.endswith("| vs best peer |")  # the strongest, torch.compile: its row reads 1.00x
    rows = {line.split(" | ")[1]: line.rsplit(" | ", 1)[1] for line in text.splitlines() if line.startswith("| ")}
    assert rows["double"] == "0.50x |"
    assert rows["eager (library)"] == "0.62x |" and rows["torch.compile (library)"] == "1.00x |"


def test_a_table_without_torch_compile_names_what_it_took_in_its_own_run(monkeypatch, tmp_path):
    """bias_relu_layernorm's table says 2.44x eager torch; torch.compile, timed in another run, is faster than
    its last stage: the table must say so (as a note, not a ratio: ratios come from one run)."""
    records, _ = _bench(monkeypatch, _operator(peer=_eager_peer), {"eager": 8.0, "stage": 4.0}, _compiled([]),
                        with_compile=False)
    for r in records:
        r.update(date="2026-11-23T00:00:00", versions={"numba_cuda": "0.30.4"}, gflops=r.get("gflops", 0))
    op = _operator()
    compiled = dict(records[0], stage="torch.compile", op=op.name, median_us=3.0, device="GPU")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "gpu_compile_peer.json").write_text(json.dumps({"rows": [{"records": [compiled]}]}))
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    text = tables.ladder_table(op, {"device": "GPU", "records": records})
    note = text.strip().splitlines()[-1]
    assert "torch.compile" in note and "3.0 µs" in note and "4.0 µs for `double`" in note
    other_size = dict(compiled, size=[7])
    (tmp_path / "runs" / "gpu_compile_peer.json").write_text(json.dumps({"rows": [{"records": [other_size]}]}))
    assert "torch.compile" not in tables.ladder_table(op, {"device": "GPU", "records": records})


def test_other_peers_are_timed_after_torch_compile_and_the_strongest_wins(monkeypatch):
    other = lambda size: [("cub", _labelled("cub", lambda x, out: _launch_double(x, out))), None]  # None: not installed
    records, failures = _bench(monkeypatch, _operator(peer=_eager_peer, other_peers=other),
                               {"eager": 8.0, "torch.compile": 6.0, "cub": 5.0, "stage": 10.0}, _compiled([]))
    assert not failures
    assert [r["stage"] for r in records if r["kind"] == "peer"] == ["eager", "torch.compile", "cub"]
    assert [r for r in records if r["kind"] == "stage"][0]["peer"]["name"] == "cub"


class _FakeCudaCompute:
    """cuda.compute's calling convention, in numba: make_* builds an algorithm object; calling it with
    temp_storage=None returns the scratch bytes it needs, with scratch it runs."""
    _BINDINGS_AVAILABLE = True

    class OpKind:
        PLUS = "plus"

    def __init__(self):
        self.built, self.sized, self.ran = 0, 0, []

    def make_inclusive_scan(self, d_in, d_out, op):
        self.built += 1

        def algorithm(temp_storage, d_in, d_out, num_items, op, init_value):
            if temp_storage is None:
                self.sized += 1
                return 96
            assert temp_storage.nbytes == 96 and op == "plus" and init_value is None
            self.ran.append(num_items)
            d_out.copy_to_device(np.cumsum(d_in.copy_to_host(), dtype=np.float32))
        return algorithm


def test_a_cuda_compute_peer_builds_once_sizes_its_scratch_once_and_runs_each_call(monkeypatch):
    assert library_peers.cuda_compute() is None  # the simulator: no cuda.compute peer, never a stub
    assert library_peers.cub_inclusive_sum_peer((5,)) is None
    fake = _FakeCudaCompute()
    monkeypatch.setattr(library_peers, "cuda_compute", lambda: fake)
    name, launch = library_peers.cub_inclusive_sum_peer((5,))
    x = np.arange(1, 6, dtype=np.float32)
    d_x, d_y = cuda.to_device(x), cuda.device_array(5, np.float32)
    launch(d_x, d_y)
    launch(d_x, d_y)
    assert name == "cuda.compute.inclusive_scan" and (fake.built, fake.sized, fake.ran) == (1, 1, [5, 5])
    np.testing.assert_array_equal(d_y.copy_to_host(), np.cumsum(x))


class _EventsTheGpuPassedAtOnce:
    """CUDA events of a GPU that had finished its sleep before Python queued the sample: each start has
    already been passed when it is queried (what a call that waits for the GPU, or a stalled host, looks like)."""

    def record(self):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def test_samples_the_gpu_waited_for_python_in_are_counted(monkeypatch):
    """measure() retakes a starved sample behind longer sleeps; one starved at every take is counted, so that a
    time of the host is never reported as a kernel's."""
    import time

    from numba import cuda as numba_cuda

    from workbench import timing

    monkeypatch.setattr(numba_cuda, "event", lambda: _EventsTheGpuPassedAtOnce())
    monkeypatch.setattr(numba_cuda, "event_elapsed_time", lambda a, b: 0.001, raising=False)  # 1 us: quicker than Python
    monkeypatch.setattr(numba_cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "keep_gpu_busy", lambda us: None)

    def slow_python_call():
        until = time.perf_counter() + 20e-6
        while time.perf_counter() < until:
            pass

    measured = timing.measure(slow_python_call, [()], samples=5, budget_s=0.5)
    assert measured.starved_samples == measured.samples == 5


def test_a_host_bound_timing_is_a_failure_not_a_record(monkeypatch):
    def measure(launch, arg_sets):
        launch(*arg_sets[0])
        return bench.Timing(90.0, 60.0, 100.0, 50.0, 7, 1, 850.0, starved_samples=5)

    monkeypatch.setattr(bench, "measure", measure)
    op = _operator(peer=_eager_peer)
    records, failures = bench.bench_size(op, op.stages, SIZE, {}, np.random.default_rng(0), ENV)
    assert records == []
    assert failures[0] == ("eager @ 5: the GPU waited for Python in 5 of 7 samples (each call 850 us on the host): "
                           "a time of the host, not of the kernels; not recorded")
