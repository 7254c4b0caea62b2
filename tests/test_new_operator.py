"""A new operator is one file: written in a folder of its own and named by $WORKBENCH_SOLUTIONS_PATH, it
appears in `workbench list`, `check`, `diff` and `ptx`, in the exercises, in a generated notebook, in the
README's course map (an unfiled chapter, until workbench/curriculum.py lists it) and in the recording
script, with no other file edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TOY = textwrap.dedent('''
    """Twice a float32 vector: the smallest ladder there is, written for a test."""
    import numpy as np
    from numba import cuda

    from workbench.ladder import Operator, blocks_for, expect_device_array

    THREADS = 128


    def _validate(x, out):
        expect_device_array("x", x, dtype=np.float32, ndim=1)
        expect_device_array("out", out, dtype=np.float32, shape=x.shape)


    op = Operator(
        name="toy_twice",
        title="Twice a float32 vector",
        reference=lambda x: 2.0 * x.astype(np.float64),
        make_inputs=lambda size, rng: (rng.uniform(-1, 1, size[0]).astype(np.float32),),
        make_output=lambda size: np.empty(size[0], np.float32),
        bytes_moved=lambda size: 8 * size[0],
        flops=lambda size: size[0],
        validate=_validate,
        check_sizes=[1, 1000],
        sim_sizes=[1, 300],
        bench_sizes=[1000],
        headline_size=(1000,),
        rank=5000,
        group="A throw-away operator",
    )


    @cuda.jit
    def _one_per_thread(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = 2.0 * x[i]


    @op.stage("one_per_thread", """
        One thread per element, a block of 128 threads, as many blocks as it takes: the shape of every
        elementwise kernel, here as the first rung of a ladder written for a test.
    """)
    def one_per_thread(x, out):
        _one_per_thread[blocks_for(x.size, THREADS), THREADS](x, out)


    @cuda.jit
    def _grid_stride(x, out):
        i = cuda.grid(1)
        # HINT: every thread handles elements i, i + the grid's width, ... until the end of x
        # BEGIN SOLUTION
        while i < x.size:
            out[i] = 2.0 * x[i]
            i += cuda.gridsize(1)
        # END SOLUTION


    @op.stage("grid_stride", """
        A fixed grid of 8 blocks that strides over the vector: each thread handles many elements, so the
        grid no longer grows with n and the launch costs the same at every size.
    """)
    def grid_stride(x, out):
        _grid_stride[8, THREADS](x, out)
''')


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("my_ladders")
    (folder / "toy_twice.py").write_text(TOY)
    return folder


def workbench(toy_dir: Path, *args, cwd=ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORKBENCH_SOLUTIONS_PATH=str(toy_dir), WORKBENCH_MODE="sim")
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_listed_checked_and_diffed(toy_dir):
    listed = workbench(toy_dir, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    toy = [op for op in json.loads(listed.stdout) if op["op"] == "toy_twice"]
    assert toy and [s["name"] for s in toy[0]["stages"]] == ["one_per_thread", "grid_stride"]

    checked = workbench(toy_dir, "check", "toy_twice", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {r["status"] for r in json.loads(checked.stdout)} == {"passed"}

    diff = workbench(toy_dir, "diff", "toy_twice.grid_stride", "--plain")
    assert diff.returncode == 0, diff.stderr
    assert "+    while i < x.size:" in diff.stdout and "-    if i < x.size:" in diff.stdout


@pytest.mark.slow  # NVVM and ptxas, as the ladders' own compile test
@pytest.mark.sim_only
def test_compiled_for_sm90(toy_dir):
    run = workbench(toy_dir, "ptx", "toy_twice")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "_grid_stride" in run.stdout and "_one_per_thread" in run.stdout


@pytest.mark.slow  # (7 s)
def test_readme_section_and_recording_plan(toy_dir):
    code = ("from workbench import tables; import sys; "
            "sys.stdout.write(tables.course_map() + tables.docs_pages()['docs/81_toy_twice.md'])")
    env = dict(os.environ, WORKBENCH_SOLUTIONS_PATH=str(toy_dir), WORKBENCH_MODE="sim")
    readme = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert readme.returncode == 0, readme.stderr
    assert "[81 toy_twice](docs/81_toy_twice.md)" in readme.stdout  # unfiled, until curriculum.py lists it
    assert "## `toy_twice`: Twice a float32 vector" in readme.stdout and "workbench/curriculum.py" in readme.stdout
    plan = subprocess.run([sys.executable, "-m", "workbench", "record", "--dry-run"], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert plan.returncode == 0, plan.stderr
    assert any("toy_twice @ " in line and "never recorded" in line for line in plan.stdout.splitlines()), plan.stdout


def test_exercise_and_notebook_generated(toy_dir, tmp_path):
    exercises = tmp_path / "exercises"
    built = workbench(toy_dir, "exercises", "build", "--out", str(exercises))
    assert built.returncode == 0, built.stdout + built.stderr
    stub = (exercises / "toy_twice.py").read_text()
    assert "TODO(exercise)" in stub and "i += cuda.gridsize(1)" not in stub

    notebooks = tmp_path / "notebooks"
    made = workbench(toy_dir, "notebooks", "build", "--only", "toy_twice", "--out", str(notebooks))
    assert made.returncode == 0, made.stdout + made.stderr
    [path] = notebooks.glob("*_toy_twice.ipynb")
    text = path.read_text()
    assert "from solutions import toy_twice" in text and "grid_stride" in text
