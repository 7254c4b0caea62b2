"""`workbench sweep OP.STAGE NAME=v1,v2 ...`: a stage's module-level constants tried on a GPU without editing
the file.

numba reads a module's constants when it compiles a kernel, so each setting runs in a fresh process (``python
-m workbench.sweep``): the ladder's source is executed with ``NAME = ...`` replaced (an assignment at the
start of a line, which must exist exactly once), so constants derived from it follow. The stage is then
checked against the float64 reference and timed at the size beside the operator's eager peer
(``bench.bench_size``), nothing saved to results/. The module as committed is timed first, as the baseline.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import types

from .ladder import Stage

ROW = "SWEEP-ROW "  # the child's one line of JSON, among whatever else it prints
TIMEOUT_S = 300  # one setting: compile, check and time a stage


class SweepError(ValueError):
    """A setting that cannot be applied; the message is one line for the user."""


def parse_settings(texts: list[str]) -> list[dict[str, str]]:
    """``["A=1,2", "B=x"]`` -> ``[{"A": "1", "B": "x"}, {"A": "2", "B": "x"}]``: every combination."""
    axes = []
    for text in texts:
        name, sep, values = text.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not values.strip():
            raise SweepError(f"a setting is NAME=VALUE[,VALUE...] with NAME a module constant, e.g. THREADS=128,256; "
                             f"got {text!r}")
        axes.append([(name, v.strip()) for v in values.split(",") if v.strip()])
    return [dict(combo) for combo in itertools.product(*axes)]


def _assignment(name: str) -> re.Pattern:
    return re.compile(r"^" + re.escape(name) + r" = [^#\n]*", re.M)


def patched_source(source: str, path: str, setting: dict[str, str]) -> str:
    """``source`` with each ``NAME = ...`` at the start of a line replaced by ``NAME = VALUE``."""
    for name, value in setting.items():
        source, count = _assignment(name).subn(f"{name} = {value} ", source)
        if count != 1:
            raise SweepError(f"{name} is assigned {count} times at the start of a line in {path}; "
                             "a sweep replaces a module constant assigned exactly once")
    return source


def stage_with(target: str, setting: dict[str, str]) -> Stage:
    """OP.STAGE from its module executed afresh with ``setting`` applied (a fresh module object, put in
    ``sys.modules`` in the old one's place: numba resolves the kernels' globals through it)."""
    from . import registry

    op, stages = registry.resolve(target)
    if "." not in target:
        raise SweepError(f"sweep takes OP.STAGE, e.g. {op.name}.{op.stages[-1].name}")
    module = sys.modules[stages[0].launch.__module__]
    path = module.__file__
    with open(path) as f:
        source = patched_source(f.read(), path, setting)
    fresh = types.ModuleType(module.__name__)
    fresh.__file__ = path
    sys.modules[module.__name__] = fresh
    exec(compile(source, path, "exec"), fresh.__dict__)
    found = [o for o in vars(fresh).values() if getattr(o, "name", None) == op.name and hasattr(o, "stages")]
    found += [o for o in vars(fresh).get("OPERATORS", []) if o.name == op.name]
    if not found:
        raise SweepError(f"{path} defines no operator named {op.name} at module level")
    return next(s for s in found[0].stages if s.name == stages[0].name)


def check_setting(target: str, setting: dict[str, str]) -> None:
    """Refuse a setting before any process starts: every name assigned exactly once in the stage's module."""
    from . import registry

    _, stages = registry.resolve(target)
    path = sys.modules[stages[0].launch.__module__].__file__
    with open(path) as f:
        patched_source(f.read(), path, setting)


def measure_setting(target: str, size: tuple, setting: dict[str, str]) -> dict:
    """In this process: apply the setting, check and time the stage with its eager peer. One row."""
    import numpy as np

    from .bench import bench_size
    from .results import environment, stored_peaks

    stage = stage_with(target, setting)
    env = environment()
    records, failures = bench_size(stage.op, [stage], size, stored_peaks(env["device"]) or {},
                                   np.random.default_rng(0), env)
    keep = ("stage", "kind", "median_us", "p10_us", "p90_us", "gbps", "gflops", "rel_err")
    return {"target": target, "setting": setting, "size": list(size), "failures": failures,
            "records": [{k: r.get(k) for k in keep} for r in records]}


def run_setting(target: str, size: tuple, setting: dict[str, str], timeout_s: float = TIMEOUT_S) -> dict:
    """One setting in a fresh process; its row, or a row with ``error`` (the child's last output)."""
    command = [sys.executable, "-m", "workbench.sweep", target, "x".join(map(str, size)), json.dumps(setting)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"target": target, "setting": setting, "size": list(size), "error": f"no result within {timeout_s:.0f} s"}
    rows = [line[len(ROW):] for line in done.stdout.splitlines() if line.startswith(ROW)]
    if rows:
        return json.loads(rows[0])
    return {"target": target, "setting": setting, "size": list(size), "error": (done.stdout + done.stderr)[-1500:]}


if __name__ == "__main__":  # the child: python -m workbench.sweep OP.STAGE SIZE '{"NAME": "VALUE"}'
    import workbench  # noqa: F401  (GPU or simulator, before numba)
    from workbench.sizes import parse_size

    print(ROW + json.dumps(measure_setting(sys.argv[1], parse_size(sys.argv[2]), json.loads(sys.argv[3]))), flush=True)
