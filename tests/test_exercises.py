"""exercises/ is generated from the ladder modules: in sync, every stub found before running and harmless
when run, the learner's loop green (edit, check, build, reset), a learner's file never lost; and the
interview set's own checks (inputs, bad input).

Operators and exercises are discovered, not listed: ladders that gain markers later are covered too.
"""

import argparse
import ast
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from workbench import paths, registry
from workbench.check import check_stage
from workbench.generate import exercises as ex
from workbench.introspect import functions_of
from workbench.ladder import InputError, Operator, as_size
from workbench.markers import BEGIN, END, HINT, STUB_MARK, stub_lines

ROOT = paths.REPO_ROOT
INTERVIEW = ("scan", "histogram", "argmax", "matvec", "stencil")

SYNTH = '''"""A synthetic ladder module."""
from numba import cuda


@cuda.jit
def _copy(x, out):
    i = cuda.grid(1)
    # HINT: vague
    # HINT: middle
    # HINT: nearly there
    # BEGIN SOLUTION
    if i < x.size:
        out[i] = x[i]
    # END SOLUTION


@cuda.jit
def _double(x, out):
    i = cuda.grid(1)
    # HINT: only one
    # BEGIN SOLUTION
    v = x[i] * 2
    # END SOLUTION
    out[i] = v


def launch(x, out):
    _copy[1, 32](x, out)
'''


# -- the generator ---------------------------------------------------------------------------------

def test_render_replaces_each_region_with_numbered_hints_and_a_stub():
    body = ex.render_body(SYNTH, "synth.py")
    assert "out[i] = x[i]" not in body and "v = x[i] * 2" not in body  # the answers are gone
    assert "BEGIN SOLUTION" not in body and "# HINT:" not in body
    assert "#   hint 1 (nudge): vague" in body
    assert "#   hint 2: middle" in body
    assert "#   hint 3 (nearly the answer): nearly there" in body
    assert "#   hint 1: only one" in body
    # `pass` where nothing after the region needs it; `return` where later code reads a name the
    # region defined (v), so the stub never reaches a NameError.
    assert "    pass  # " + STUB_MARK in body
    assert "    return  # " + STUB_MARK in body
    assert "def launch(x, out):\n    _copy[1, 32](x, out)" in body  # launchers are kept
    ast.parse(body)
    assert len(stub_lines(body)) == 2


def test_header_records_the_hash_of_what_was_generated():
    text = ex.render(SYNTH, "synth")
    assert ex.is_pristine(text)
    assert not ex.is_pristine(text.replace("pass  # TODO", "out[i] = x[i]  # TODO"))
    assert not ex.is_pristine(ex.render_body(SYNTH))  # no header: treated as the learner's


@pytest.mark.parametrize("bad, says", [
    ("def f():\n    # BEGIN SOLUTION\n    x = 1\n", "never closed"),
    ("def f():\n    x = 1\n    # END SOLUTION\n", "without a BEGIN"),
    ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n", "do not nest"),
    ("def f():\n    # HINT: a\n    x = 1\n", "directly followed"),
    ("def f():\n" + "    # HINT: a\n" * 4 + "    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n", "at most 3"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "inside a function"),
    # A `return` stub inside a branch, with a shuffle after it: the lanes that return would leave the
    # others waiting at the shuffle (matvec.vectors once shipped such a stub, and its first run hung).
    ("def f(x, y):\n    acc = 0.0\n    if x.size > 1:\n        # BEGIN SOLUTION\n        a = x[0]\n        # END SOLUTION\n"
     "        acc = a\n    acc += cuda.shfl_down_sync(FULL_MASK, acc, 1)\n    y[0] = acc\n", "shfl_down_sync below waits"),
])
def test_malformed_markers_are_refused_with_file_and_line(bad, says):
    with pytest.raises(ex.MarkerError, match=says) as info:
        ex.find_regions(bad, "bad.py")
    assert "bad.py:" in str(info.value)


@pytest.fixture
def synth(tmp_path):
    """Two synthetic ladder files (and one without markers) and an empty exercises folder."""
    sols, out = tmp_path / "solutions", tmp_path / "exercises"
    sols.mkdir()
    (sols / "synth.py").write_text(SYNTH)
    (sols / "other.py").write_text(SYNTH.replace("vague", "other"))
    (sols / "plain.py").write_text("x = 1\n")  # no markers: no exercise
    return sols, out


def test_build_never_overwrites_a_learners_edits(synth):
    sols, out = synth
    sources = lambda: ex.sources_from_files(sols.glob("*.py"))  # noqa: E731  (re-read: the files change)
    assert [(r.path.name, r.action) for r in ex.build(out, sources=sources())] == [
        ("other.py", "created"), ("synth.py", "created")]
    assert not (out / "plain.py").exists()
    assert {r.action for r in ex.build(out, sources=sources())} == {"unchanged"}

    mine = (out / "synth.py").read_text().replace(f"pass  # {STUB_MARK}", "if i < x.size: out[i] = x[i]  #")
    (out / "synth.py").write_text(mine)
    # Solution unchanged: the edited file is kept as it is.
    (kept,) = ex.build(out, only=["synth"], sources=sources())
    assert kept.action == "kept" and "has not changed" in kept.detail
    assert (out / "synth.py").read_text() == mine
    # Solution changed: still kept (it is the learner's), the detail says how to get the new one.
    (sols / "synth.py").write_text(SYNTH.replace("# HINT: vague", "# HINT: vaguer"))
    (kept,) = ex.build(out, only=["synth"], sources=sources())
    assert kept.action == "kept" and "--backup" in kept.detail
    assert (out / "synth.py").read_text() == mine
    # --backup: the learner's file is copied to a timestamped .bak first, then the new exercise is written.
    (result,) = ex.build(out, only=["synth"], sources=sources(), backup=True)
    assert result.action == "backed-up"
    (backup,) = out.glob("synth.py.*.bak")
    assert backup.read_text() == mine and str(backup) in result.detail
    assert "hint 1 (nudge): vaguer" in (out / "synth.py").read_text()
    assert ex.is_pristine((out / "synth.py").read_text())
    # An unedited exercise follows its solution.
    (sols / "synth.py").write_text(SYNTH.replace("# HINT: middle", "# HINT: middle, reworded"))
    assert ex.build(out, only=["synth"], sources=sources())[0].action == "updated"


def test_check_tells_a_stale_generated_file_from_a_learners_edit(synth):
    sols, out = synth
    ex.build(out, sources=ex.sources_from_files(sols.glob("*.py")))
    states = lambda: {s.path.name: s for s in ex.check(out, sources=ex.sources_from_files(sols.glob("*.py")))}  # noqa: E731
    assert {name: s.state for name, s in states().items()} == {
        "synth.py": ex.UP_TO_DATE, "other.py": ex.UP_TO_DATE, "README.md": ex.UP_TO_DATE}

    (sols / "other.py").write_text(SYNTH.replace("vague", "changed"))  # a generated file goes stale
    mine = (out / "synth.py").read_text() + "\n# my notes\n"  # and the learner edits the other
    (out / "synth.py").write_text(mine)
    now = states()
    assert now["other.py"].state == ex.STALE and now["other.py"].problem
    assert now["synth.py"].state == ex.EDITED and not now["synth.py"].problem
    assert not now["synth.py"].solution_changed

    (sols / "synth.py").write_text(SYNTH.replace("only one", "only one, reworded"))
    now = states()
    assert now["synth.py"].state == ex.EDITED and now["synth.py"].solution_changed and not now["synth.py"].problem
    (out / "README.md").unlink()
    assert states()["README.md"].state == ex.MISSING
    assert (out / "synth.py").read_text() == mine  # checking never writes


def test_an_exercise_whose_module_is_gone_is_kept_while_it_holds_the_learners_work(synth):
    """A ladder module split or dissolved (half_norms.py into softmax/layernorm/elementwise): its old exercise
    is removed by build only if the learner never edited it; an edited one is kept, and check and build say
    where its stages went."""
    sols, out = synth
    sources = lambda: ex.sources_from_files(sols.glob("*.py"))  # noqa: E731
    ex.build(out, sources=sources())
    mine = (out / "other.py").read_text() + "\n# my kernel\n"
    (out / "other.py").write_text(mine)
    (out / "half_norms.py").write_text((out / "synth.py").read_text())  # generated, never edited
    (sols / "other.py").unlink()  # the module other.py is gone
    states = {s.path.name: s for s in ex.check(out, sources=sources())}
    assert states["other.py"].state == ex.ORPHANED and states["other.py"].edited and not states["other.py"].problem
    assert states["half_norms.py"].state == ex.ORPHANED and states["half_norms.py"].problem
    assert "exercises/softmax.py" in ex.orphan_note(states["half_norms.py"])
    results = {r.path.name: r for r in ex.build(out, sources=sources())}
    assert results["other.py"].action == "kept" and "your edits" in results["other.py"].detail
    assert (out / "other.py").read_text() == mine
    assert results["half_norms.py"].action == "removed" and not (out / "half_norms.py").exists()
    assert (out / "synth.py").exists()


def test_building_one_exercise_touches_only_it_and_the_index_lists_all(synth):
    sols, out = synth
    sources = ex.sources_from_files(sols.glob("*.py"))
    ex.build(out, sources=sources)
    (out / "other.py").write_text("stale, say")  # (not pristine: `build synth` must leave it alone)
    (result,) = ex.build(out, only=["synth"], sources=sources)
    assert result.path.name == "synth.py"
    assert (out / "other.py").read_text() == "stale, say"
    index = (out / "README.md").read_text()
    assert "[synth.py](synth.py)" in index and "[other.py](other.py)" in index
    with pytest.raises(registry.UnknownTarget, match="no exercise named 'nope'; exercises: other, synth"):
        ex.build(out, only=["nope"], sources=sources)


# -- the learner's loop, end to end, on the real ladders ---------------------------------------------------

def function_text(source: str, name: str) -> list[str]:
    """The lines of module-level function ``name`` in ``source``, decorators included."""
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return source.splitlines()[first - 1:node.end_lineno]


def fill_in(exercise: str, solution: str, names) -> str:
    """The exercise with the named functions written as the solution has them (without the markers):
    a learner's answer."""
    for name in names:
        old = "\n".join(function_text(exercise, name))
        answer = [ln for ln in function_text(solution, name) if not (HINT.match(ln) or BEGIN.match(ln) or END.match(ln))]
        exercise = exercise.replace(old, "\n".join(answer))
    return exercise


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"exercise_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_exercises_cli(*argv) -> int:
    parser = argparse.ArgumentParser(prog="workbench")
    ex.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["exercises", *map(str, argv)])
    return args.func(args)


def test_the_learners_loop_stays_green_and_never_loses_a_file(tmp_path, capsys):
    out = tmp_path / "exercises"
    ex.build(out)
    op = registry.operator("reduction")
    solution = registry.source_file(op).read_text()
    marked = [s for s in op.stages if ex.marked_functions(s, solution)]
    first, second = marked[0], marked[-1]
    names = ex.marked_functions(first, solution)
    path = out / "reduction.py"

    # The learner fills in the first stage (with the solution's code) and leaves a note elsewhere.
    mine = fill_in(path.read_text(), solution, names) + "\n# my notes on the last stage\n"
    path.write_text(mine)
    learner = load_module(path)
    size = op.sim_sizes[2]
    assert check_stage(first, size, np.random.default_rng(0), launch=learner.op[first.name].launch).passed

    # check: green, and says the file is the learner's.
    assert run_exercises_cli("check", "--out", out) == 0
    said = capsys.readouterr().out
    assert "edited" in said and "reduction.py" in said
    assert not [s for s in ex.check(out) if s.problem]
    # build (all, or just this one): kept, byte for byte.
    assert {r.action for r in ex.build(out) if r.path == path} == {"kept"}
    assert run_exercises_cli("build", "reduction", "--out", out) == 0
    assert "kept" in capsys.readouterr().out
    assert path.read_text() == mine

    # reset one stage: a fresh stub for it, the rest of the learner's work kept, their version beside it.
    assert run_exercises_cli("reset", f"reduction.{first.name}", "--out", out) == 0
    said = capsys.readouterr().out.strip()
    (backup,) = out.glob("reduction.py.*.bak")
    assert backup.read_text() == mine
    assert said.startswith(f"reset {path}") and str(backup) in said and len(said.splitlines()) == 1
    now = path.read_text()
    assert "# my notes on the last stage" in now
    for name in names:
        assert "\n".join(function_text(now, name)) in ex.build(tmp_path / "fresh", only=["reduction"])[0].path.read_text()
    assert run_exercises_cli("check", "--out", out) == 0

    # reset the whole operator: the file is generated again; the learner's latest version kept too.
    assert run_exercises_cli("reset", "reduction", "--out", out) == 0
    assert ex.is_pristine(path.read_text()) and "# my notes" not in path.read_text()
    backups = sorted(out.glob("reduction.py.*.bak"))
    assert len(backups) == 2 and {b.read_text() for b in backups} == {mine, now}
    assert run_exercises_cli("reset", f"reduction.{second.name}", "--out", out) == 0  # nothing to reset now
    assert "already a fresh stub" in capsys.readouterr().out
    assert len(list(out.glob("reduction.py.*.bak"))) == 2

    # build OP rewrites nothing else, and the index still lists every exercise.
    (out / "README.md").write_text("one row\n")
    assert run_exercises_cli("build", "reduction", "--out", out) == 0
    index = (out / "README.md").read_text()
    assert all(f"[{m}.py]({m}.py)" in index for m in ex.exercise_sources())


def test_backup_works_in_any_position(tmp_path, capsys):
    out = tmp_path / "exercises"
    ex.build(out, only=["scan"])
    path = out / "scan.py"
    for argv in (["build", "--backup", "scan"], ["build", "scan", "--backup"]):
        path.write_text(path.read_text() + "\n# mine\n")
        assert run_exercises_cli(*argv, "--out", out) == 0, argv
        assert "backed-up" in capsys.readouterr().out
        assert ex.is_pristine(path.read_text())
    assert len(list(out.glob("scan.py.*.bak"))) == 2


def test_reset_refuses_what_it_cannot_do_safely_and_leaves_the_file(tmp_path, capsys):
    out = tmp_path / "exercises"
    ex.build(out, only=["scan"])
    path = out / "scan.py"
    broken = path.read_text() + "\ndef oops(:\n"
    path.write_text(broken)
    stage = registry.operator("scan").stages[0]
    assert run_exercises_cli("reset", stage.key, "--out", out) == 2
    said = capsys.readouterr().err
    assert "does not parse" in said and "reset the whole operator" in said and "Traceback" not in said
    assert path.read_text() == broken and not list(out.glob("*.bak"))
    assert run_exercises_cli("reset", "scan.nosuchstage", "--out", out) == 2
    assert "no stage 'nosuchstage'" in capsys.readouterr().err
    assert run_exercises_cli("build", "nosuchop", "--out", out) == 2
    assert "no exercise named 'nosuchop'" in capsys.readouterr().err
    assert path.read_text() == broken


def test_an_operator_from_workbench_solutions_path_gets_an_exercise(tmp_path):
    """Discovery is the registry's: a ladder module in a folder of one's own is exercised too, into the
    one exercises folder the grader reads (here --out)."""
    folder, out = tmp_path / "mine", tmp_path / "exercises"
    folder.mkdir()
    (folder / "toy_copy.py").write_text(textwrap.dedent('''
        import numpy as np
        from numba import cuda
        from workbench.ladder import Operator, blocks_for

        op = Operator(
            name="toy_copy", title="a copy", reference=lambda x: x.astype(np.float64),
            make_inputs=lambda size, rng: (rng.standard_normal(size[0]).astype(np.float32),),
            make_output=lambda size: np.empty(size[0], np.float32),
            bytes_moved=lambda size: 8 * size[0], flops=lambda size: 0, validate=lambda x, out: None,
            check_sizes=[33], sim_sizes=[1, 33], bench_sizes=[33], headline_size=(33,), grade_speed_bar=0.5)


        @cuda.jit
        def _copy(x, out):
            i = cuda.grid(1)
            # HINT: guard the tail
            # BEGIN SOLUTION
            if i < x.size:
                out[i] = x[i]
            # END SOLUTION


        @op.stage("copy", "one thread per element, the simplest kernel there is, as a start for the ladder")
        def copy(x, out):
            _copy[blocks_for(x.size, 32), 32](x, out)
        '''))
    env = dict(os.environ, WORKBENCH_SOLUTIONS_PATH=str(folder))
    run = subprocess.run([sys.executable, "-m", "workbench.generate.exercises", "build", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    stub = (out / "toy_copy.py").read_text()
    assert STUB_MARK in stub and "out[i] = x[i]" not in stub and "reach 50% of the" in stub
    assert str(folder / "toy_copy.py") in stub  # it names where it came from
    assert "[toy_copy.py](toy_copy.py) | toy_copy |" in (out / "README.md").read_text()
    assert (out / "reduction.py").exists()  # beside the built-in ones


# -- the committed exercises -------------------------------------------------------------------------

def test_committed_exercises_are_up_to_date():
    """Missing or stale generated files fail; a learner's edited exercise is theirs and passes."""
    problems = [f"{s.path.name} is {s.state}" for s in ex.check(paths.EXERCISES_DIR) if s.problem]
    assert not problems, "; ".join(problems) + ": run `workbench exercises build`"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """exercises/ as `build` writes it now: the tests below check the generator, not whether the
    committed copy is stale (that is the test above)."""
    out = tmp_path_factory.mktemp("exercises")
    ex.build(out)
    return out


def exercise_operators(fresh):
    """(solution operator, the exercise module's operator of the same name) for every exercised operator."""
    pairs = []
    for module, source in ex.exercise_sources().items():
        loaded = load_module(fresh / f"{module}.py")
        # The registry's rule: a module's operators are `op` and those in `OPERATORS`.
        found = [getattr(loaded, "op", None), *getattr(loaded, "OPERATORS", ())]
        mine = {v.name: v for v in found if isinstance(v, Operator)}
        assert set(mine) == {op.name for op in source.operators}, module
        pairs += [(op, mine[op.name]) for op in source.operators]
    return pairs


def test_every_marked_solution_has_an_exercise_and_the_interview_set_is_there(fresh):
    sources = ex.exercise_sources()
    for name in INTERVIEW:
        assert name in sources
    for module in sources:
        assert (fresh / f"{module}.py").exists()


def test_each_exercise_registers_its_own_operator_with_the_solutions_stages(fresh):
    for op, mine in exercise_operators(fresh):
        assert mine is not op
        assert [s.name for s in mine.stages] == [s.name for s in op.stages]
        for stage in mine.stages:
            assert stage.launch.__module__ != op.module  # the exercise's own launchers


def stub_sources(stage) -> list[str]:
    """The names of the kernels a stage of an exercise reaches that still hold a TODO(exercise) stub."""
    import inspect

    return [name for name, f in functions_of(stage).items() if stub_lines(inspect.getsource(getattr(f, "py_func", f)))] + (
        [stage.launch.__name__] if stub_lines(inspect.getsource(stage.launch)) else [])


@pytest.mark.slow  # (13 s; the quick tier's test_grade.py grades the generated stubs as not implemented)
def test_every_exercise_stage_is_found_not_implemented_before_running(fresh):
    stubbed = 0
    for op, mine in exercise_operators(fresh):
        solution = registry.source_file(op).read_text()
        for stage, theirs in zip(mine.stages, op.stages):
            if ex.marked_functions(theirs, solution):
                assert stub_sources(stage), stage.key
                stubbed += 1
            else:
                assert not stub_sources(stage), stage.key  # nothing cut out: nothing to find
    assert stubbed >= 2 * len(INTERVIEW)


@pytest.mark.slow
@pytest.mark.sim_only
def test_stub_kernels_run_without_crashing_and_leave_the_output_wrong(fresh):
    """The second line of defence: run anyway (as a learner might, by hand), a stub neither crashes
    nor produces a right answer."""
    for op, mine in exercise_operators(fresh):
        solution = registry.source_file(op).read_text()
        for stage, theirs in zip(mine.stages, op.stages):
            if theirs.gpu_only or not ex.marked_functions(theirs, solution):
                continue
            case = check_stage(theirs, op.sim_sizes[1], np.random.default_rng(0), launch=stage.launch)
            # Never a crash. (Not always a wrong answer: a stubbed warp max in a softmax changes only the
            # shift, to which softmax is blind. The static check above is what reports every stub.)
            assert case.passed or case.reason in ("unwritten", "all-zeros", "wrong-values", "nan"), (stage.key, case.message)
            if op.name in INTERVIEW + ("reduction",) and as_size(op.sim_sizes[1]) != (1,):
                assert not case.passed, stage.key


def test_solution_markers_are_found_per_stage():
    for name in INTERVIEW:
        op = registry.operator(name)
        solution = registry.source_file(op).read_text()
        for stage in op.stages:
            assert ex.marked_functions(stage, solution), stage.key


# -- the interview set ------------------------------------------------------------------------------

def test_argmax_inputs_always_tie_at_the_maximum():
    op = registry.operator("argmax")
    rng = np.random.default_rng(1)
    for n in (2, 31, 1000):
        (x,) = op.make_inputs((n,), rng)
        assert (x == x.max()).sum() >= 2
        assert op.reference(x)[0] == np.flatnonzero(x == x.max())[0]


def test_histogram_inputs_are_skewed_and_counts_are_exact():
    from workbench.check import compare

    op = registry.operator("histogram")
    (x,) = op.make_inputs((4000,), np.random.default_rng(2))
    ref = op.reference(x)
    assert ref.max() > 1500 and ref.sum() == 4000  # a hot bin
    out = ref.astype(np.int32)
    assert compare("h", (4000,), out, ref, 0.0).passed
    out[7] += 1
    result = compare("h", (4000,), out, ref, 1.0)  # the tolerance is ignored for integer outputs
    assert not result.passed and result.reason == "wrong-values" and result.first_bad_index == [7]


@pytest.mark.parametrize("name, make_bad, says", [
    ("scan", lambda x, y: (x, cuda.to_device(np.zeros(3, np.float32))), "shape"),
    ("scan", lambda x, y: (x.copy_to_host(), y), "host"),
    ("histogram", lambda x, out: (cuda.to_device(x.copy_to_host().astype(np.int32)), out), "uint8"),
    ("histogram", lambda x, out: (x, cuda.to_device(np.zeros(255, np.int32))), r"\(256,\)"),
    ("argmax", lambda x, out: (x, cuda.to_device(np.zeros(1, np.int64))), "int32"),
    ("matvec", lambda a, x, y: (a, cuda.to_device(np.zeros(a.shape[0], np.float32)), y), "shape"),
    ("stencil", lambda img, w, out: (img, cuda.to_device(np.zeros((3, 3), np.float32)), out), r"\(5, 5\)"),
])
def test_bad_input_names_what_was_expected(name, make_bad, says):
    op = registry.operator(name)
    size = as_size(op.sim_sizes[2])
    inputs = [cuda.to_device(a) for a in op.make_inputs(size, np.random.default_rng(0))]
    out = cuda.to_device(op.make_output(size))
    bad = make_bad(*inputs, out)
    with pytest.raises(InputError, match=says):
        op.stages[0](*bad)


# -- the Hopper exercises (hgemm's wgmma descriptor, TMA barrier protocol, producer/consumer loop) ----------

HOPPER_EXERCISES = {  # stage -> the marked functions the grader must find on its path
    "wgmma": {"matrix_descriptor"},
    "tma": {"matrix_descriptor", "_tma_k_step", "_wait_for_tiles"},
    "warp_specialized": {"matrix_descriptor", "_tma_k_step", "_wait_for_tiles", "_warp_specialized_kernel_source"},
    "persistent": {"matrix_descriptor", "_tma_k_step", "_wait_for_tiles", "_persistent_kernel_source"},
    "clusters": {"matrix_descriptor", "_multicast_k_step", "_wait_for_tiles", "_cluster_kernel_source"},
}


@pytest.mark.sim_only
@pytest.mark.parametrize("stage_name", sorted(HOPPER_EXERCISES))
def test_hopper_stubs_are_on_their_stages_path_and_fail_without_crashing(fresh, stage_name):
    """Each Hopper exercise region is on the path the grader walks from its stage's launcher (and the
    wgmma stage's path holds no region of the later stages), and the generated stub, run, gives a wrong
    answer, not a crash: a zero descriptor, a barrier never armed and never waited on, an empty loop."""
    from workbench.grade.submission import describe_launcher

    op = registry.operator("gemm[fp16]")
    solution_stage = op[stage_name]
    marked = {f["qualname"].split(".")[0] for f in describe_launcher(solution_stage.launch) if f["marked"]}
    assert marked == HOPPER_EXERCISES[stage_name], marked
    mine = load_module(fresh / "hgemm.py").op[stage_name]
    assert stub_sources(mine), stage_name
    case = check_stage(solution_stage, (17, 24, 40), np.random.default_rng(1), launch=mine.launch)
    assert not case.passed, stage_name
    assert case.reason in ("unwritten", "all-zeros", "wrong-values", "nan"), (stage_name, case.message)
