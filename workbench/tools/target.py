"""Run one stage once, for a tool that watches the process (``ncu``, ``compute-sanitizer``).

    python -m workbench.tools.target OP.STAGE [--size S] [--impl FILE] [--seed N] [--warmup] [--profile-range]
    python -m workbench.tools.target OP --peer NAME [--size S] [--seed N] [--warmup] [--profile-range]

The stage runs on the operator's random inputs at the given size (default: its headline size), its
output poisoned first, as ``workbench check`` runs it. ``--warmup`` runs it once before (compilation,
module loading, a prepared stage's plan), ``--profile-range`` brackets the measured call with
``cuProfilerStart``/``cuProfilerStop`` (for ``ncu --profile-from-start off``), and ``--impl FILE`` runs a
learner's launcher for the stage from FILE instead of the answer key's. ``--peer NAME`` runs one of the
operator's library peers instead, as ``workbench bench`` times it (eager torch, cuBLAS, ``torch.compile``,
...), so that ``ncu`` can watch what the ladder is measured against. Prints one line (what ran, the size,
whether the output matched the reference) and exits 0, or 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)

from .. import bench, library_peers, registry, sizes
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


def peer_launcher(op: Operator, size, name: str):
    """The launch of ``op``'s library peer called ``name`` at ``size`` (as the tables name it: the whole name,
    or a part of it that names one peer, case ignored), torch.compile's included."""
    launches = bench.peer_launches(op, size, with_compile=True)
    matches = [(n, launch) for n, launch in launches if n.lower() == name.lower()] or \
              [(n, launch) for n, launch in launches if name.lower() in n.lower()]
    if len(matches) != 1:
        names = ", ".join(repr(n) for n, _ in launches) or "none here (is torch installed?)"
        raise SystemExit(f"error: {op.name} has {'no' if not matches else 'more than one'} peer named {name!r} "
                         f"(its peers at {size_label(size)}: {names})")
    return matches[0]


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
    p.add_argument("--peer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", action="store_true")
    p.add_argument("--profile-range", action="store_true")
    args = p.parse_args(argv)
    op, stages = registry.resolve(args.target)
    size = sizes.check_size(op, sizes.parse_size(args.size)) if args.size else as_size(op.headline_size)
    if args.peer:
        if "." in args.target or args.impl:
            print("error: --peer runs a library peer of an operator: give OP, not OP.STAGE, and no --impl",
                  file=sys.stderr)
            return 2
        name, launch = peer_launcher(op, size, args.peer)
        tolerance = op.tolerance_for(size, op.dtype)
    elif len(stages) != 1 or "." not in args.target:
        print(f"error: give one stage, OP.STAGE (stages of {op.name}: {', '.join(s.name for s in op.stages)})",
              file=sys.stderr)
        return 2
    else:
        stage = stages[0]
        name, tolerance = stage.key, tolerance_of(stage, size)
        launch = load_launcher(args.impl, op.name, stage.name) if args.impl else stage.launch
    rng = np.random.default_rng(args.seed)
    inputs = op.make_inputs(size, rng)
    template = op.make_output(size)
    d_inputs = [to_device(a) for a in inputs]
    d_out = to_device(poison_like(template))
    if args.warmup:  # compiles (torch.compile's too), loads modules, builds a prepared stage's plan
        launch(*d_inputs, d_out)
        cuda.synchronize()
    if args.profile_range:
        profiler(True)
    returned = launch(*d_inputs, d_out)
    cuda.synchronize()
    if args.profile_range:
        profiler(False)
    # A peer with no out= (F.layer_norm, ...) returns its result instead, as bench.py reads it.
    got = library_peers.to_host(returned) if getattr(launch, "returns_output", False) else to_host(d_out)
    result = compare(name, size, got, op.reference(*inputs), tolerance)
    print(f"ran {name} @ {size_label(size)}: {'correct' if result.passed else 'WRONG: ' + result.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
