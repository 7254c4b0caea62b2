"""Run one stage once, for a tool that watches the process (``ncu``, ``compute-sanitizer``).

    python -m workbench.tools.target OP.STAGE [--size S] [--impl FILE] [--seed N] [--warmup] [--profile-range]

The stage runs on the operator's random inputs at the given size (default: its headline size), its
output poisoned first, as ``workbench check`` runs it. ``--warmup`` runs it once before (compilation,
module loading, a prepared stage's plan), ``--profile-range`` brackets the measured call with
``cuProfilerStart``/``cuProfilerStop`` (for ``ncu --profile-from-start off``), and ``--impl FILE`` runs a
learner's launcher for the stage from FILE instead of the answer key's. Prints one line (the stage,
the size, whether the output matched the reference) and exits 0, or 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)

from .. import registry, sizes
from ..check import compare, poison_like, tolerance_of
from ..ladder import Operator, Stage, as_size, size_label, to_device, to_host


def load_launcher(path: str, op_name: str, stage_name: str):
    """The launcher for ``op_name.stage_name`` in a learner's file: a function named like the stage, or a
    stage of an Operator of that name defined there."""
    spec = importlib.util.spec_from_file_location(f"learner_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    for value in vars(module).values():
        if isinstance(value, Operator) and value.name == op_name:
            for s in value.stages:
                if s.name == stage_name:
                    return s.launch
    attr = vars(module).get(stage_name)
    if isinstance(attr, Stage):
        return attr.launch
    if callable(attr):
        return attr
    raise SystemExit(f"error: {path} defines no stage {op_name}.{stage_name} (a function named {stage_name})")


def profiler(start: bool) -> None:
    from cuda.bindings import driver

    (err,) = driver.cuProfilerStart() if start else driver.cuProfilerStop()
    if int(err) != 0:
        raise RuntimeError(f"cuProfiler{'Start' if start else 'Stop'} failed: {err.name}")


def main(argv=None) -> int:
    import numpy as np
    from numba import cuda

    p = argparse.ArgumentParser(prog="python -m workbench.tools.target", description=__doc__.split("\n\n")[0])
    p.add_argument("target")
    p.add_argument("--size")
    p.add_argument("--impl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", action="store_true")
    p.add_argument("--profile-range", action="store_true")
    args = p.parse_args(argv)
    op, stages = registry.resolve(args.target)
    if len(stages) != 1 or "." not in args.target:
        print(f"error: give one stage, OP.STAGE (stages of {op.name}: {', '.join(s.name for s in op.stages)})",
              file=sys.stderr)
        return 2
    stage = stages[0]
    size = sizes.check_size(op, sizes.parse_size(args.size)) if args.size else as_size(op.headline_size)
    launch = load_launcher(args.impl, op.name, stage.name) if args.impl else stage.launch
    rng = np.random.default_rng(args.seed)
    inputs = op.make_inputs(size, rng)
    template = op.make_output(size)
    d_inputs = [to_device(a) for a in inputs]
    d_out = to_device(poison_like(template))
    if args.warmup:
        launch(*d_inputs, d_out)
        cuda.synchronize()
    if args.profile_range:
        profiler(True)
    launch(*d_inputs, d_out)
    cuda.synchronize()
    if args.profile_range:
        profiler(False)
    result = compare(stage.key, size, to_host(d_out), op.reference(*inputs), tolerance_of(stage, size))
    print(f"ran {stage.key} @ {size_label(size)}: {'correct' if result.passed else 'WRONG: ' + result.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
