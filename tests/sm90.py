"""Compiling a ladder's kernels for sm_90 from a test, as the GPU would, on a machine without one.

numba's CUDA simulator, which the tests run in, cannot compile, so each compile runs in a fresh
process with the real numba.cuda (WORKBENCH_MODE=compile): kernels that link CUDA C++ (the
tensor-core ones) are linked as at launch (NVRTC + LTO), which is what takes the minutes."""
import os
import subprocess
import sys


def attention_signature(element: str) -> str:
    """The argument types of an attention kernel (q, k, v, out of ``element``, the scale, the causal
    flag), as the source line the child process evaluates."""
    return (f"(types.Array(types.{element}, 4, 'C'),) * 4 + (types.float32, types.Array(types.int32, 1, 'C'))")


def compile_for_sm90(module: str, names: list[str], signature: str, timeout: int = 1500) -> tuple[list, str]:
    """Compile the kernels ``names`` of ``module`` (found by name, as `workbench ptx` does) with the
    argument types ``signature`` (source, see attention_signature). Returns one (name, status,
    spill bytes, registers) per kernel compiled, and the child's output, for assertion messages."""
    code = (
        "from numba.cuda import types\n"
        "from workbench.ptxcheck import compile_kernel\n"
        f"sig = {signature}\n"
        f"for name in {list(names)!r}:\n"
        f"    r = compile_kernel('x', {module!r}, name, sig, True)\n"
        "    print('compiled', name, r.status, r.spill_bytes, r.registers, r.message[:300])\n"
    )
    env = {**os.environ, "WORKBENCH_MODE": "compile", "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    reports = [tuple(line.split()[1:5]) for line in done.stdout.splitlines() if line.startswith("compiled ")]
    return reports, done.stdout + done.stderr
