"""Would a real GPU accept this stage? Compile every kernel of it to PTX for sm_90, without a GPU.

The simulator runs plain Python, so it accepts kernels that numba's CUDA compiler rejects (lists,
strings, type errors) and it cannot see float64 creeping into a float32 kernel (a bare ``0.0`` or a
Python float argument is float64). So the CPU suite also compiles each stage for real:

1. in the simulator, run the stage once and record every kernel launch with the numba types of its
   arguments (``workbench.simulator.record_launches``);
2. in a subprocess with the real numba.cuda (``WORKBENCH_MODE=compile``: no GPU, no driver needed),
   ``numba.cuda.compile_ptx`` each kernel with those types for compute capability 9.0;
3. fail on any compile error, and on any ``.f64`` instruction in a stage that computes in float32;
   where ``ptxas`` is on PATH, report registers, spills and shared memory per kernel.
"""

from __future__ import annotations

import base64
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

CC = (9, 0)
_F64 = re.compile(r"\.f64\b")


@dataclass
class KernelReport:
    stage: str
    kernel: str
    signature: str
    ok: bool
    message: str = ""
    f64_lines: list = field(default_factory=list)
    registers: int | None = None
    spill_bytes: int | None = None
    shared_bytes: int | None = None


def collect_launches(stage, size=None) -> list[tuple[str, str, tuple]]:
    """Run ``stage`` once in the simulator; return (module, qualname, arg types) per distinct kernel."""
    from .check import check_stage
    from .simulator import record_launches

    op = stage.op
    size = size or op.sim_sizes[min(2, len(op.sim_sizes) - 1)]
    with record_launches() as launches:
        result = check_stage(stage, size)
    if not result.passed:
        raise AssertionError(f"{stage.key} failed its check while collecting kernels: {result.message}")
    seen, out = set(), []
    for py_func, types in launches:
        key = (py_func.__module__, py_func.__qualname__, types)
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def _ptxas_resources(ptx: str) -> dict:
    if not shutil.which("ptxas"):
        return {}

    def assemble(text: str) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            with open(src, "w") as f:
                f.write(text)
            return subprocess.run(["ptxas", "-v", f"-arch=sm_{CC[0]}{CC[1]}", src, "-o", os.path.join(d, "k.cubin")],
                                  capture_output=True, text=True)

    run = assemble(ptx)
    older = re.search(r"Unsupported \.version [\d.]+; current version is '([\d.]+)'", run.stderr)
    if older:  # NVVM from the pip wheels may be newer than the system ptxas: try its PTX ISA version
        run = assemble(re.sub(r"^\.version [\d.]+", f".version {older.group(1)}", ptx, count=1, flags=re.M))
    text = run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", text)
    smem = re.search(r"(\d+) bytes smem", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": sum(map(int, spills)) if spills else 0,
            "shared_bytes": int(smem.group(1)) if smem else 0}


def compile_all(items: list[tuple[str, str, str, tuple, bool]]) -> list[KernelReport]:
    """In THIS process (which must run the real numba.cuda): compile each (stage, module, qualname,
    types, forbid_f64) and report."""
    import importlib

    from numba import cuda

    reports = []
    for stage_key, module_name, qualname, types, forbid_f64 in items:
        sig = "(" + ", ".join(map(str, types)) + ")"
        rep = KernelReport(stage_key, f"{module_name}.{qualname}", sig, True)
        try:
            obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            # The kernel's own launch_bounds (a register cap) change what ptxas reports: keep them.
            bounds = getattr(obj, "targetoptions", {}).get("launch_bounds")
            ptx, _ = cuda.compile_ptx(obj.py_func, tuple(types), cc=CC,
                                      **({"launch_bounds": bounds} if bounds else {}))
        except Exception as exc:  # a typing or lowering error: what the GPU would have said
            rep.ok = False
            rep.message = f"does not compile for sm_{CC[0]}{CC[1]}: {type(exc).__name__}: {str(exc).strip()[:1500]}"
            reports.append(rep)
            continue
        body = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")]
        rep.f64_lines = [ln for ln in body if _F64.search(ln)][:5]
        if forbid_f64 and rep.f64_lines:
            rep.ok = False
            rep.message = ("float64 instructions in a float32 stage (e.g. `" + rep.f64_lines[0] + "`): a bare float "
                           "literal, a Python float argument or a math function on a float64 value promotes the "
                           "arithmetic; write float32(...) literals and pass float32 values")
        for k, v in _ptxas_resources(ptx).items():
            setattr(rep, k, v)
        reports.append(rep)
    return reports


def check_stages(stages) -> list[KernelReport]:
    """Collect kernels in the simulator (this process), compile them in a subprocess."""
    items = []
    for stage in stages:
        if stage.gpu_only:
            continue
        forbid = np.dtype(stage.dtype) == np.float32
        for module_name, qualname, types in collect_launches(stage):
            items.append((stage.key, module_name, qualname, types, forbid))
    payload = base64.b64encode(pickle.dumps(items)).decode()
    from .results import REPO_ROOT

    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, WORKBENCH_MODE="compile", NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=path)
    run = subprocess.run([sys.executable, "-m", "workbench.ptxcheck"], input=payload, capture_output=True,
                         text=True, env=env, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"PTX compile subprocess failed:\n{run.stderr[-4000:]}")
    return pickle.loads(base64.b64decode(run.stdout.strip().splitlines()[-1]))


def _main() -> None:
    # Run as __main__, but pickle KernelReport under its importable name.
    from workbench.ptxcheck import compile_all as importable_compile_all

    items = pickle.loads(base64.b64decode(sys.stdin.read()))
    reports = importable_compile_all(items)
    sys.stdout.write("\n" + base64.b64encode(pickle.dumps(reports)).decode() + "\n")


if __name__ == "__main__":
    _main()
