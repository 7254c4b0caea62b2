"""The notebook builder: one notebook per chapter of the course, built from the registry and the curriculum
so it never drifts from ``solutions/``.

``build_notebook(chapter)`` makes a chapter's notebook (nbformat): what the chapter teaches (its Part,
time, prerequisites, questions), then its primary ladder: the module's story, the bytes and flops models,
how to run, one section per stage (its paragraph, its diff against the previous stage, its source folded,
its check, the figures so far), the whole ladder against the library peer; then its variants side by side
and a short section each (their paragraphs, a check per stage, their figures and table).
``build_all_notebooks()`` adds ``00_start_here`` (the course map), ``90_grade_yourself`` and
``99_compare_all``; ``build_all(out_dir, execute=...)`` writes them (a notebook per chapter of
``workbench/curriculum.py``, named by its declared number) and runs them with nbclient so their outputs
show without running them. The cells call :mod:`workbench.nb`.

``workbench notebooks build [--execute] [--only OP|CHAPTER] [--sim] [--recorded] [--force]``,
``workbench notebooks check`` (which are out of date) and ``workbench notebooks list``. Committed
notebooks are executed on CPU (``WORKBENCH_MODE=sim``) so that their figures are the recorded ones, with
device and date; the tests check that their cells are what this builder makes from ``solutions/`` today
and that their outputs are what a fresh run prints.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import linecache
import os
import sys
import textwrap
import time
from pathlib import Path

from .. import nb as cells_helpers
from .. import curriculum, paths, plots, profiles, registry
from ..curriculum import Chapter
from ..markers import no_exercise_because
from ..ladder import Operator, as_size, size_label

# nbformat validates with jsonschema, which imports rfc3987_syntax when it is installed (jupyter-events
# asks for it) and compiles 39 grammars doing so: 4 s of every process that reads a notebook, for an "iri"
# format the notebook schema never uses. This module runs in the CLI and the tests, never in a learner's
# kernel, so it can tell jsonschema the package is absent (None in sys.modules: an ImportError it expects).
sys.modules.setdefault("rfc3987_syntax", None)

START_HERE = "00_start_here.ipynb"
GRADE_YOURSELF = "90_grade_yourself.ipynb"
COMPARE_ALL = "99_compare_all.ipynb"
KERNEL_NAME = "python3"
EXECUTE_TIMEOUT_S = 1800  # per cell


# -- cells --------------------------------------------------------------------------------------------

def code_cell(src: str):
    import nbformat.v4 as v4

    return v4.new_code_cell(src.strip("\n"))


def markdown_cell(src: str):
    import nbformat.v4 as v4

    return v4.new_markdown_cell(src.strip("\n"))


def cell_sources(nb) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in nb.cells]


def source_hash(nb) -> str:
    return hashlib.sha256(json.dumps(cell_sources(nb)).encode()).hexdigest()[:16]


def finish(cells: list, name: str):
    """A notebook with stable cell ids (so rebuilding changes nothing that did not change)."""
    import nbformat.v4 as v4

    nb = v4.new_notebook()
    for i, cell in enumerate(cells):
        cell["id"] = f"{name[:40]}-{i:02d}"
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["workbench"] = {"generated_by": "workbench notebooks build", "source_hash": source_hash(nb)}
    return nb


# -- the models, quoted from solutions/ -----------------------------------------------------------------

def _lambda_source(fn) -> str | None:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # e.g. a lambda on the line that closes a triple-quoted string
        try:
            first = fn.__code__.co_firstlineno
            return "".join(linecache.getlines(inspect.getsourcefile(fn))[first - 1:first + 4])
        except (OSError, TypeError):
            return None


def model_text(fn) -> str | None:
    """How a model computes, as written in solutions/: a lambda's expression with its trailing comment
    ('4 * size[0] + 4'), or a named function's whole source (several lines). None if unreadable."""
    if getattr(fn, "__name__", "") != "<lambda>":
        try:
            return textwrap.dedent(inspect.getsource(fn)).strip()
        except (OSError, TypeError):
            return None
    src = _lambda_source(fn)
    if src is None:
        return None
    candidates = []
    at = src.find("lambda")
    while at >= 0:
        text = src[at:]
        for end in range(len(text), 0, -1):  # the longest prefix that is one lambda
            try:
                tree = ast.parse(text[:end], mode="eval")
            except SyntaxError:
                continue
            if isinstance(tree.body, ast.Lambda):
                expr = ast.unparse(tree.body.body)
                line_rest = text[end:].split("\n", 1)[0]
                comment = line_rest.split("#", 1)[1].strip() if "#" in line_rest else ""
                consts = compile(text[:end], "<model>", "eval").co_consts
                same = any(getattr(c, "co_code", None) == fn.__code__.co_code and c.co_names == fn.__code__.co_names
                           for c in consts)
                candidates.append((not same, expr + (f"  # {comment}" if comment else "")))
                break
        at = src.find("lambda", at + 6)
    return min(candidates)[1] if candidates else None


def _model_md(label: str, fn) -> str:
    text = model_text(fn)
    if text is None:
        return ""
    if "\n" in text:
        return f"- {label}:\n\n  ```python\n" + textwrap.indent(text, "  ") + "\n  ```"
    return f"- {label}: `{text}`"


def models_md(op: Operator) -> str:
    size = as_size(op.headline_size)
    b, f = int(op.bytes_moved(size)), int(op.flops(size))
    bt, ft = _model_md("bytes moved, at least", op.bytes_moved), _model_md("flops", op.flops)
    lines = ["## What the ladder must do: the models", "",
             "Every stage is judged against the least work any kernel must do: read each input once, write the "
             "output once (the **bytes model**), and do the arithmetic the result needs (the **flops model**). "
             "Rates in the plots divide these by the measured time, so a stage that moves more than the minimum "
             "shows a lower rate, not a higher one.", ""]
    if bt or ft:
        lines += [f"With `size` the problem size (here a tuple of {len(size)}, e.g. `{size_label(size)}` is "
                  f"`{tuple(size)}`):", ""]
    lines += [t for t in (bt, ft) if t]
    intensity = f"{f / b:.3g}" if b else "∞"
    lines += [f"- at the headline size, {plots.size_phrase(op, size)}: **{plots.binary_bytes(b)}** moved and "
              f"**{f:.3g} flop**, an arithmetic intensity of **{intensity} flop/byte**.", ""]
    ridge = ("an H200 moves about 4 TB/s and computes about 50 TFLOP/s in fp32: about 12 flop per byte")
    if op.bound_note:
        lines.append(textwrap.dedent(op.bound_note).strip())
    elif op.bound == "compute":
        _, peak_name = plots.peak_of(op, {})
        of_what = (f"is of the library's ({peak_name.replace(' ', ') ')} rate on the same GPU" if peak_name != "none"
                   else "has no measured peak in this precision yet")
        lines.append(f"That intensity is far above the ridge of the roofline ({ridge}), so this ladder is "
                     f"**compute-bound**: it is measured in GFLOP/s and \"% of peak\" {of_what}.")
    else:
        lines.append(f"That is far below the ridge of the roofline ({ridge}), so this ladder is **memory-bound**: "
                     "the best a stage can do is move the minimum bytes at the measured copy bandwidth, and "
                     "\"% of peak\" is of that bandwidth.")
    if plots.has_stage_bytes(op):
        lines += ["", "Some stages move more than the minimum (their own traffic model), at the headline size:", ""]
        for s in op.stages:
            t = s.traffic(size)
            lines.append(f"- {s.order}. `{s.name}`: {plots.binary_bytes(t)} ({t / b:.2g}x the minimum)")
    return "\n".join(lines)


# A chapter says it in a paragraph; 00_start_here says it whole (HOW_TO_RUN_MD).
HOW_TO_RUN_SHORT_MD = """\
**Running it.** With a CUDA GPU, `check()` runs each stage at the GPU check sizes and the figures are
measured now; without one, kernels run in numba's CUDA simulator (every stage still checked, at small
sizes) and the figures are those **recorded** on a GPU in `results/`, labelled with device and date
([00_start_here](00_start_here.ipynb) says more). The notebook is generated from `solutions/`: edit the
ladder, not it.
"""

HOW_TO_RUN_MD = """\
## How to run the notebooks

The workbench decides when it is imported whether there is a CUDA GPU:

- **GPU** (`workbench.MODE == 'gpu'`): `check()` runs each stage at the GPU check sizes (up to the
  large ones), and `progress()` measures the stages so far *now*, at a few sizes, next to the library
  peer. The plots say "measured now".
- **CPU** (`workbench.MODE == 'sim'`): kernels run in numba's CUDA simulator, one Python thread per CUDA
  thread. Every stage is still checked for correctness, at small sizes; timings would mean nothing, so
  the plots show figures **recorded** on a GPU in `results/`, labelled with the device and date.

`WORKBENCH_MODE=sim` forces the simulator on a GPU machine. The notebooks are generated from
`solutions/` by `workbench notebooks build` (add `--execute` to run them): edit the ladder, not the notebook.
"""


# -- one operator ---------------------------------------------------------------------------------------

def import_cell(ch: Chapter) -> str:
    """The first code cell: the workbench (before numba), the helpers, the chapter's modules and its primary
    operator. ``from solutions import <module>`` finds operators from $WORKBENCH_SOLUTIONS_PATH too."""
    modules = list(dict.fromkeys(registry.short_module_name(op) for op in chapter_operators(ch)))
    where = ", ".join(f"solutions/{m}.py" for m in modules)
    return (f"import workbench                 # chooses GPU or simulator before numba is imported\n"
            f"from workbench import nb\n"
            f"from solutions import {', '.join(modules)}   # the ladders' modules: {where}\n\n"
            f"op = nb.operator({ch.primary!r})   # its Operator: op[\"<stage name>\"] is a stage, callable\n"
            f"nb.about_mode()")


def chapter_operators(ch: Chapter) -> list[Operator]:
    ops = registry.load_operators()
    return [ops[name] for name in ch.operators]


def chapter_md(ch: Chapter) -> str:
    """The notebook's opening: the chapter, its Part, time, prerequisites (links), the questions it
    answers, and its variants."""
    by_number = {c.number: c for c in registry.chapters()}
    part = curriculum.part(ch.part)
    facts = [f"Part {part.number}: {part.title}"]
    if ch.core:
        facts.append("on the core path ★")
    if ch.minutes:
        facts.append(f"about {ch.minutes} minutes")
    if ch.prerequisites:
        facts.append("after " + ", ".join(f"[{n}. {by_number[n].title}]({by_number[n].notebook})"
                                          for n in ch.prerequisites))
    lines = [f"# {ch.number}. {ch.title}", "", " · ".join(facts) + " · [the course map](00_start_here.ipynb)", ""]
    if ch.unfiled:
        lines += [curriculum.unfiled_note(ch)]
    else:
        lines += ["This chapter answers:", ""] + [f"- {q}" for q in ch.teaches]
    for family, elsewhere in registry.family_elsewhere(ch):
        lines += ["", f"The `{family}` family continues in "
                  + ", ".join(f"[{c.number}. {c.title}]({c.notebook})" for c in elsewhere) + "."]
    if len(ch.operators) > 1:
        others = ", ".join(f"`{name}`" for name in ch.operators[1:])
        lines += ["", f"Its ladders vary by {ch.axes}. The `{ch.primary}` ladder is walked stage by stage below; "
                      f"its variants {others} follow, a short section each (their checks, figures and tables)."]
    return "\n".join(lines)


def title_and_story(doc: str) -> tuple[str, str]:
    """A module docstring's first paragraph as one line (its title sentence, which may wrap in the source),
    and the rest as Markdown."""
    first, _, rest = inspect.cleandoc(doc).partition("\n\n")
    return cells_helpers.prose_markdown(" ".join(first.split())), cells_helpers.prose_markdown(rest.strip())


def story_md(op: Operator) -> str:
    """The notebook's opening: the module's docstring (shared, with a pointer, by a module's further
    operators), and the stages in order."""
    module = registry.module_of(op)
    short = registry.short_module_name(op)
    first, rest = title_and_story(module.__doc__ or op.title)
    story = f"**{first}**\n\n{rest}"
    main = registry.operators_by_module()[short][0]
    if main is not op:
        story = (f"This ladder lives in `solutions/{short}.py`, next to the `{main.name}` ladder "
                 f"(notebook `{registry.notebook_name(main)}`), whose story it shares:\n\n> "
                 + story.replace("\n", "\n> "))
    return (f"## {op.title}: the `{op.name}` ladder\n\n{story}\n\n"
            f"The ladder has {len(op.stages)} stages: " + ", ".join(f"{s.order}. `{s.name}`" for s in op.stages)
            + f". Each section below shows what a stage changed from the one before (the diff), its kernels "
            f"(read from `solutions/{short}.py`), checks it against a float64 reference, and plots how far the "
            "ladder has climbed so far.")


def by_hand_cell(op: Operator) -> str:
    runnable = [s for s in op.stages if not s.gpu_only] or list(op.stages)
    return ("import numpy as np\n"
            "from numba import cuda\n\n"
            "size = nb.check_sizes(op)[-1]\n"
            "inputs = op.make_inputs(size, np.random.default_rng(0))\n"
            "d_inputs = [cuda.to_device(a) for a in inputs]\n"
            "d_out = cuda.device_array_like(op.make_output(size))\n"
            f"op[{runnable[0].name!r}](*d_inputs, d_out)  # the stage checks its arguments, then launches its kernels\n"
            "got, want = d_out.copy_to_host(), op.reference(*inputs)\n"
            "print(f\"size {size}: max |got - want| = {np.abs(got - want).max():.3g} (float64 reference)\")")


def stage_cells(op: Operator, counters: bool = False) -> list:
    """A section per stage: its paragraph, the diff from the previous stage, its source (folded), its check,
    its figure; with ``counters`` (the core path's chapters), the profiler's counters counted in the
    simulator: the first stage's table, then for each later one the line that changed and what its counters
    did (its full table folded)."""
    cells = []
    for s in op.stages:
        ref = f"op[{s.name!r}]"
        text = f"## {s.order}. `{s.name}`\n\n{cells_helpers.prose_markdown(s.summary)}"
        if s.gpu_only:
            text += f"\n\n> **GPU only**: {s.gpu_only}. In the simulator its check is skipped."
        cells.append(markdown_cell(text))
        if s.order > 1:
            cells.append(scrolled(code_cell(f"nb.show_diff({ref})  # what changed from stage {s.order - 1}")))
        source = code_cell(f"nb.show_source({ref})")
        cells += [collapsed(source) if s.order > 1 else scrolled(source), code_cell(f"nb.check({ref})")]
        if counters and not s.gpu_only:
            if s.order == 1:
                cells.append(scrolled(code_cell(f"nb.simulated_counters({ref})  # what a profiler would count, "
                                                "counted in the simulator")))
            else:
                cells += [scrolled(code_cell(f"nb.counter_changes({ref})  # the line that changed and what its "
                                             "counters did")),
                          collapsed(code_cell(f"nb.simulated_counters({ref})  # all its counters"))]
        if s is not op.stages[-1]:  # the last stage's figure is the whole ladder's, drawn once below
            cells.append(code_cell(f"nb.progress(op, upto={s.name!r})"))
    return cells


def scrolled(cell):
    """A cell whose output (a diff, a source, a counter table) JupyterLab shows in a box of at most 24 lines
    with its own scroll bar (``scrolled`` metadata; a click on its left edge expands it): a long diff stays
    one screen's part of a chapter, and reads whole where it is."""
    cell.metadata["scrolled"] = True
    return cell


def collapsed(cell):
    """A cell whose output (a full source, a long table) is folded until clicked: the diff above it is the
    lesson. ``collapsed`` for the classic notebook and nbconvert, ``jupyter.outputs_hidden`` for JupyterLab."""
    cell.metadata["collapsed"] = True
    cell.metadata["jupyter"] = {"outputs_hidden": True}
    return cell


def paragraph_key(summary: str) -> str:
    """A stage paragraph as compared for repetition: the same words, however the source indented them."""
    return " ".join(summary.split())


def variant_cells(op: Operator, shown: dict[str, str], introduced: set[str]) -> list:
    """A variant's short section: what it is, its module's story the first time the notebook meets that
    module (what the axis changes: 16-bit storage, another function, ...; folded), its stages' paragraphs
    (one already shown in this notebook is named, not repeated), a check per stage (folded), its figures
    and its table. ``shown`` maps each paragraph shown so far to the stage that showed it, and
    ``introduced`` holds the modules whose story was told; both grow."""
    short = registry.short_module_name(op)
    lines = [f"## Variant `{op.name}`: {op.title}", ""]
    if short not in introduced:
        introduced.add(short)
        first, rest = title_and_story(registry.module_of(op).__doc__ or op.title)
        lines += [f"`solutions/{short}.py`: **{first}**", ""]
        if rest:
            lines += ["<details><summary>What it changes, and why (the module's story)</summary>", "",
                      rest, "", "</details>", ""]
    lines += [f"{len(op.stages)} stages (`workbench diff {op.name}.STAGE` shows each one's change):", ""]
    for s in op.stages:
        said = shown.get(paragraph_key(s.summary))
        lines.append(f"{s.order}. `{s.name}`: "
                     + (f"as `{said}` above." if said else cells_helpers.prose_markdown(s.summary.strip())))
        shown.setdefault(paragraph_key(s.summary), s.key)
        if s.gpu_only:
            lines.append(f"   **GPU only**: {s.gpu_only}.")
    cells = [markdown_cell("\n".join(lines)),
             code_cell(f"op = nb.operator({op.name!r})  # this section's variant")]
    cells += [collapsed(code_cell(f"nb.check(op[{s.name!r}])")) for s in op.stages]  # each verdict in its header
    cells += [code_cell("nb.progress(op)"), collapsed(code_cell("nb.ladder_table(op)"))]
    return cells


def build_notebook(ch: Chapter):
    """The notebook of a chapter: what it teaches, then its primary ladder (its story, its models, a section
    per stage, the whole ladder), then its variants side by side and a short section each."""
    family = chapter_operators(ch)
    op = family[0]
    cells = [
        markdown_cell(chapter_md(ch)),
        markdown_cell(story_md(op)),
        markdown_cell(HOW_TO_RUN_SHORT_MD),
        code_cell(import_cell(ch)),
        markdown_cell(models_md(op)),
        collapsed(code_cell("nb.models(op)  # the same models at every bench size (and the time floor, where a peak "
                            "is recorded)")),
        markdown_cell("### Calling a stage by hand\n\nA stage is a plain function on device arrays. `check()` below "
                      "does this for you (fresh random inputs, an output poisoned with NaN, a float64 reference), "
                      "but nothing more is hidden:"),
        code_cell(by_hand_cell(op)),
    ]
    cells += stage_cells(op, counters=ch.core)
    drawn = cells_helpers.whole_ladder_figures(op)  # captions follow the panels each figure will have
    caption = f"\n\n{plots.caption(op, drawn['progress'])}" if drawn["progress"] else ""
    cells += [markdown_cell(f"## The whole ladder{caption}"), code_cell("nb.progress(op)")]
    if drawn["roofline"]:
        cells += [markdown_cell(plots.caption(op, drawn["roofline"])), code_cell("nb.roofline(op)")]
    elif plots.has_roofline(op) and drawn["progress"]:  # says where the stages sit instead
        cells.append(code_cell("nb.roofline(op)"))
    if drawn["bytes"]:
        cells += [markdown_cell(plots.caption(op, drawn["bytes"])), code_cell("nb.bytes_per_stage(op)")]
    if any(o.targets for o in family):
        cells += [markdown_cell("### The targets\n\nWhat this chapter's ladders set out to reach, each judged on the "
                                "records (`workbench targets` prints the same verdicts):"),
                  code_cell("nb.targets(op)")]
    if profiles.recorded(op.name)[1]:
        cells += [
            markdown_cell("## Why each step is faster: the counters\n\nTiming says how fast; Nsight Compute's "
                          "hardware counters say why. Each stage ran once under `ncu` (`workbench profile "
                          f"{op.name}` on a GPU; these were recorded there): DRAM throughput as a share of its peak, "
                          "achieved occupancy, registers and shared memory per thread and block, cache hit rates, "
                          "instructions executed, and the stall reasons that cost the most cycles per instruction. "
                          "Below the table, the three largest steps of the staircase, each with the counters that "
                          "moved most."),
            collapsed(code_cell("nb.counters(op)")),
        ]
    cells += [
        markdown_cell("**The ladder against the library** (its chapter page's table): median time, effective "
                      "rate, % of the measured peak, and the time ratio to the peer (above 1x: faster than the "
                      "library)."),
        collapsed(code_cell("nb.ladder_table(op)")),
    ]
    if len(family) > 1:
        cells += [markdown_cell(f"## The variants side by side\n\nThe chapter's ladders vary by {ch.axes}. Each "
                                "one's fastest stage against its strongest library peer, at its own headline size:"),
                  code_cell(f"nb.variants({ch.number})")]
        shown = {paragraph_key(s.summary): s.key for s in op.stages}
        introduced = {registry.short_module_name(op)}  # the primary's story opened the notebook
        for variant in family[1:]:
            cells += variant_cells(variant, shown, introduced)
    first_of_module = {}  # each module's exercise once, named by its first operator in the chapter
    for o in family:
        first_of_module.setdefault(registry.short_module_name(o), o)
    turns = [your_turn_md(o, short).removeprefix("## Your turn\n\n") for short, o in first_of_module.items()]
    cells.append(markdown_cell("## Your turn\n\n" + "\n\n".join(turns)))
    return finish(cells, ch.stem)


def your_turn_md(op: Operator, short: str) -> str:
    """The closing cell: the exercise made from this ladder, or why there is none yet."""
    why_not = no_exercise_because(registry.source_file(op).read_text())
    if why_not:
        return (f"## Your turn\n\nThis ladder has no exercise yet: `solutions/{short}.py` {why_not}. Read its stages "
                f"here and with `workbench diff {op.name}.STAGE`; the exercises that exist are listed in "
                "`exercises/README.md`.")
    return (f"## Your turn\n\n`exercises/{short}.py` is this ladder with the heart of each kernel cut out: "
            "each `TODO(exercise)` block replaces what sits between `# BEGIN SOLUTION` and "
            f"`# END SOLUTION` in `solutions/{short}.py`, with numbered hints (read one at a time). Fill "
            f"one in, then grade it with `workbench grade {op.name}` (or `{op.name}.STAGE`), or in "
            f"`notebooks/{GRADE_YOURSELF}`: the same checks the solutions pass, and on a GPU a speed bar.")


# -- the notebooks around the ladders -------------------------------------------------------------------

def build_start_here(ops: dict):
    example = next(iter(ops.values()), None)
    cells = [
        markdown_cell("""\
# numba-cuda-workbench: start here

Learn to write fast GPU kernels with `numba.cuda` by watching them get fast. Each operator (a sum, an
elementwise expression, a transpose, softmax, layernorm, a matrix product...) is a **ladder**: a sequence
of kernels, each a small change from the one before (naive → coalesced → shared-memory tiles → warp-level →
fused), each **correct on any valid input** and each **measured**. The ladders make a course of chapters,
a notebook each: what each stage changed, the kernel, its check, and how far the ladder has climbed so far.
Follow the core path (★) first, or start from any chapter whose prerequisites you know."""),
        markdown_cell(course_map_md()),
        markdown_cell(HOW_TO_RUN_MD),
        code_cell("import workbench\nfrom workbench import nb\n\nnb.about_mode()"),
        markdown_cell("""\
## How a ladder works

A ladder lives in one module, `solutions/<op>.py`. It builds an `Operator` (what is computed: a float64
reference, random inputs, the output's shape, and **models** of the least bytes and flops any kernel must
move and do) and registers each stage with `@op.stage("name", "what changed and why it is faster")` on a
launcher that runs module-level `@cuda.jit` kernels on device arrays.

- **Checked**: every stage runs on fresh random inputs (never zeros or `arange`, which hide wrong
  indexing) and on the operator's adversarial inputs, into an output poisoned with NaN (an element never
  written shows up), and is compared with a float64 reference by relative error ‖out − ref‖ / ‖ref‖;
  sizes include ones that are not multiples of the block or tile. `workbench check OP[.STAGE]`.
- **Measured** (GPU): median of many samples, with the inputs rotated through more memory than the L2
  cache holds, launches back to back so Python is not in the numbers, next to the library peer (torch or
  CuPy) on the same arrays. `workbench bench OP`, recorded in `results/<device>.json`.
- **Compiled for sm_90** in the CPU test suite: `workbench ptx OP` shows registers, spills and shared memory.
- **The diff is the lesson**: `workbench diff OP.STAGE` (and every notebook section) shows what a stage
  changed from the one before."""),
    ]
    if example is not None and example.stages:
        cells += [
            markdown_cell(f"For example, the first stage of the `{example.name}` ladder, read from "
                          f"`solutions/{registry.short_module_name(example)}.py`, and its check:"),
            code_cell(f"op = nb.operator({example.name!r})\n"
                      "nb.show_source(op.stages[0], paragraph=True)  # with the paragraph in its decorator"),
            code_cell("nb.check(op.stages[0])"),
        ]
    cells.append(markdown_cell("""\
## How to read the plots

- **Staircase**: one bar per stage at the operator's headline (large) size, in effective GB/s (the
  minimum bytes divided by the time) for memory-bound operators, GFLOP/s for compute-bound ones. The
  dotted line is the peak measured on that GPU (a copy kernel's bandwidth, or cuBLAS's fp32 rate), each
  library peer a line of its own colour and dash (eager torch red, torch.compile orange). Each bar is labelled with its rate and its % of the peak.
- **Latency against size** (log-log): small sizes are launch-bound (a few µs, flat), large sizes
  bandwidth-bound (a slope of one). Sizes of different shapes (rows of 1024 or of 4096 columns) get
  their own line style. The dotted grey line is the least time the roofline allows: a floor.
- **Roofline**: arithmetic intensity (flop per byte, from each stage's traffic model) against GFLOP/s,
  under the memory roof (slanted) and the compute roofs (flat). Memory-bound operators sit far left.
  Drawn where a ladder's stages sit at two intensities or more; where they all sit at one, a sentence
  says where, and the staircase shows how far each stage is from the roof.
- **Bytes moved per stage**: each stage's own traffic against the minimum: what fusion saves.

Every figure's title names the size in words, and the device and the date of its records: "recorded"
(from `results/`) or "measured now" (on this GPU, this session)."""))
    if example is not None and example.stages:
        cells.append(code_cell("nb.progress(op)"))
    cells.append(markdown_cell(f"""\
## Exercises

`exercises/` holds every ladder with the heart of each kernel cut out (`exercises/README.md` lists them).
In `solutions/`, the part a learner writes sits between `# BEGIN SOLUTION` and `# END SOLUTION`, after one
to three `# HINT:` lines (vague, then specific); the exercise keeps the kernel's signature, its
shared-memory declarations and the launcher, and turns the marked region into a `TODO(exercise)` block
with the hints. Fill one in, then grade it: `workbench grade OP` (or `OP.STAGE`), or
`notebooks/{GRADE_YOURSELF}`. The grader judges with the solution's reference, inputs and sizes,
and on a GPU also asks for a share of the solution's speed.

## Commands

`workbench list` (the ladders) · `check OP[.STAGE]` · `diff OP.STAGE` · `bench OP` (GPU) ·
`run OP` (check, bench, plot) · `plot OP` · `table OP` · `ptx OP` · `doctor` · `grade [OP[.STAGE]]` ·
`exercises build` · `notebooks build [--execute]` (these notebooks, from `solutions/`)."""))
    return finish(cells, "start-here")


def course_map_md() -> str:
    """The course map: a table per Part, each chapter linking its notebook, with its time, prerequisites
    and the first question it answers; then the core path in order."""
    chapters = registry.chapters()
    by_number = {ch.number: ch for ch in chapters}

    def link(ch: Chapter) -> str:
        return f"[{ch.number}. {ch.title}]({ch.notebook})"

    lines = ["## The course map", "",
             "Each chapter is a notebook: one ladder walked stage by stage, then its variants (other dtypes, "
             "functions, axes, fusions), a short section each. ★ marks the core path; \"after\" names the "
             "chapters it builds on.", ""]
    for part in curriculum.PARTS:
        mine = [ch for ch in chapters if ch.part == part.number]
        if not mine:
            continue
        lines += [f"### Part {part.number}: {part.title}", "", part.about, ""]
        for ch in mine:
            facts = [f"{ch.minutes} min" if ch.minutes else "", "after " + ", ".join(
                f"[{n}]({by_number[n].notebook})" for n in ch.prerequisites) if ch.prerequisites else ""]
            lines.append(f"- {link(ch)}{' ★' if ch.core else ''} · " + " · ".join(f for f in facts if f)
                         + f"  \n  {ch.teaches[0]}")
        lines.append("")
    core = [ch for ch in chapters if ch.core]
    hours = sum(ch.minutes for ch in core) / 60
    lines += [f"**The core path** ({len(core)} chapters, about {hours:.0f} hours): "
              + " → ".join(f"[{ch.number} {ch.slug}]({ch.notebook})" for ch in core) + "."]
    return "\n".join(lines)


def build_compare_all(ops: dict):
    parts = sorted({ch.part for ch in registry.chapters()})
    cells = [
        markdown_cell("""\
# Every ladder side by side

Each operator's fastest stage at its headline size against its strongest library peer, with its % of the
measured peak (the bandwidth of its memory pattern for memory-bound operators, the library's GEMM rate in
its precision for compute-bound ones), a Part at a time in the course's order: a table, then the same as
bars, each named. Then one roofline with every stage of every operator. Figures come from `results/`
(recorded on a GPU, with device and date)."""),
        code_cell("import workbench\nfrom workbench import nb\n\nnb.about_mode()"),
    ]
    for number in parts:
        part = curriculum.part(number)
        cells += [markdown_cell(f"## Part {number}: {part.title}\n\n{part.about}"),
                  code_cell(f"nb.compare_part({number})")]
    cells += [
        markdown_cell("## Every stage on one roofline\n\nMemory-bound operators sit left of the ridge, on the "
                      "slanted roof: their ceiling is bandwidth. Compute-bound ones (GEMM) sit right, under the "
                      "flat compute roofs."),
        code_cell("nb.roofline_all()"),
    ]
    return finish(cells, "compare-all")


GRADE_INTRO = """\
# Grade yourself

Write a kernel in a cell, grade it in the same cell. `grade_function("op.stage", launcher)` runs the same
checks as `workbench grade` on the command line:

* your stage is judged by the operator in `solutions/`: its float64 reference, its random inputs (fresh each
  time, never zeros or `arange`) and its adversarial ones, its tolerance (integers: exact);
* sizes that are not multiples of any block, the output filled with poison first, every element checked,
  the inputs checked afterwards;
* while your launcher runs, the grader watches it: a kernel must be launched (numpy on the host is not a
  kernel), nothing copied back to the host, new device buffers come full of garbage (as on a GPU);
* on a GPU, a speed bar: a share of the solution stage's bandwidth, timed in the same run.

Without a GPU the kernels run in numba's CUDA simulator, which is slow but strict: out-of-range indices
raise, blocks over 1024 threads are refused, and shared memory starts as garbage, so a missing
`cuda.syncthreads()` shows. The outputs below come from such a CPU run.

(In a notebook the grader runs in-process, so a kernel that never ends hangs the cell: interrupt it. The
command line runs each submission in a subprocess with a timeout.)"""

GRADE_IMPORTS = """\
import workbench  # first: chooses GPU or simulator before numba is imported
import numpy as np
from numba import cuda, float32, int32

from workbench import nb
from workbench.grade import grade_function
from workbench.ladder import blocks_for

print("mode:", workbench.MODE)"""

HISTOGRAM_V1 = """\
@cuda.jit
def count_v1(x, out):
    i = cuda.grid(1)
    cuda.atomic.add(out, x[i], int32(1))   # no bounds check, and out is never zeroed


def histogram_v1(x, out):
    count_v1[blocks_for(x.size, 128), 128](x, out)


report = grade_function("histogram.global_atomics", histogram_v1, quick=True, seed=1)"""

HISTOGRAM_V2 = """\
@cuda.jit
def count_v2(x, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, x[i], int32(1))


def histogram_v2(x, out):
    count_v2[blocks_for(x.size, 128), 128](x, out)   # out still holds whatever was there


report = grade_function("histogram.global_atomics", histogram_v2, quick=True, seed=1)"""

HISTOGRAM_V3 = """\
@cuda.jit
def zero_bins(out):
    b = cuda.grid(1)
    if b < out.size:
        out[b] = 0


def histogram_v3(x, out):
    zero_bins[1, 256](out)
    count_v2[blocks_for(x.size, 128), 128](x, out)


report = grade_function("histogram.global_atomics", histogram_v3, seed=1)"""

STENCIL_NO_BARRIER = """\
from solutions.stencil import DIAMETER, HALO_TILE, RADIUS, TILE


@cuda.jit
def tiled_no_barrier(img, w, out):
    tile = cuda.shared.array((HALO_TILE, HALO_TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    rows, cols = img.shape
    row0 = cuda.blockIdx.y * TILE - RADIUS
    col0 = cuda.blockIdx.x * TILE - RADIUS
    for k in range(ty * TILE + tx, HALO_TILE * HALO_TILE, TILE * TILE):
        r, c = row0 + k // HALO_TILE, col0 + k % HALO_TILE
        tile[k // HALO_TILE, k % HALO_TILE] = img[r, c] if (0 <= r < rows and 0 <= c < cols) else float32(0.0)
    # (missing: cuda.syncthreads())
    row, col = row0 + RADIUS + ty, col0 + RADIUS + tx
    if row < rows and col < cols:
        acc = float32(0.0)
        for i in range(DIAMETER):
            for j in range(DIAMETER):
                acc += w[i, j] * tile[ty + i, tx + j]
        out[row, col] = acc


def shared_tile(img, w, out):
    grid = (blocks_for(img.shape[1], TILE), blocks_for(img.shape[0], TILE))
    tiled_no_barrier[grid, (TILE, TILE)](img, w, out)


report = grade_function("stencil.shared_tile", shared_tile, quick=True, seed=2)"""

MATVEC_STUB = """\
@cuda.jit
def warp_per_row(a, x, y):
    lane = cuda.threadIdx.x % 32
    row = cuda.grid(1) // 32
    pass  # TODO(exercise): not implemented yet: replace this line with your code


def launch_warp_per_row(a, x, y):
    warp_per_row[blocks_for(a.shape[0] * 32, 256), 256](a, x, y)


report = grade_function("matvec.warp_per_row", launch_warp_per_row, seed=3)"""


def your_turn_cell(ops: dict) -> str:
    """A cell to fill in: the first stage of the first ladder as a stub with its launcher's arguments,
    graded as it stands (the grader says 'not implemented yet' until the stub line is replaced)."""
    op = next(iter(ops.values()))
    stage = op.stages[0]
    params = list(inspect.signature(stage.launch).parameters)
    args = ", ".join(params)
    return (f'TARGET = "{stage.key}"   # any stage from the list above: keep its launcher\'s arguments\n\n\n'
            "@cuda.jit\n"
            f"def my_kernel({args}):\n"
            "    i = cuda.grid(1)\n"
            "    pass  # TODO(exercise): not implemented yet: replace this line with your code\n\n\n"
            f"def my_launcher({args}):\n"
            f"    my_kernel[blocks_for({params[0]}.size, 256), 256]({args})\n\n\n"
            "report = grade_function(TARGET, my_launcher, quick=True, seed=0)")


def build_grade_yourself(ops: dict):
    first = next(iter(ops.values()), None)
    cells = [
        markdown_cell(GRADE_INTRO),
        code_cell(GRADE_IMPORTS),
        markdown_cell("## What you can grade\n\nEvery stage of every ladder: write a launcher with the arguments "
                      "shown (device arrays, the output last) and the kernels it launches. The exercise column says "
                      "where the same stage waits for you as a file, with hints."),
        code_cell("nb.gradeable_stages()"),
    ]
    if first is not None and first.stages:
        cells += [
            markdown_cell(f"## Your turn\n\nPick a stage, replace the stub line (and the launch, if your kernel "
                          f"needs another grid), run the cell. As it stands it is the first stage of the "
                          f"`{first.name}` ladder with nothing written yet, and the grader says so. Read the stage's "
                          f"paragraph with `nb.show_source(nb.operator({first.name!r}).stages[0], paragraph=True)`, "
                          "and its solution only when you have tried."),
            code_cell(your_turn_cell(ops)),
        ]
    if {"histogram", "stencil", "matvec"} <= set(ops):
        cells += [
            markdown_cell("## Exercise 1: a histogram with global atomics\n\nThe statement is the module docstring "
                          "of `solutions/histogram.py` and the stage's paragraph:"),
            code_cell('import solutions.histogram as histogram\n\nstage = nb.operator("histogram")["global_atomics"]\n'
                      'nb.say(histogram.__doc__)\nnb.say(f"{stage.title} - {stage.summary}")'),
            markdown_cell("A first attempt: one thread per element, an atomic add per element. It forgets two things; "
                          "the grader names each."),
            code_cell(HISTOGRAM_V1),
            markdown_cell("Out of bounds: the grid is rounded up to whole blocks of 128, so the last block has threads "
                          "with no element. Add the check, and look again:"),
            code_cell(HISTOGRAM_V2),
            markdown_cell("Every bin is off by the same garbage value: the counts went on top of what the buffer "
                          "held. Zero it first (in a kernel: a launcher must not compute on the host):"),
            code_cell(HISTOGRAM_V3),
            markdown_cell("## Exercise 2: the shared-memory tile of a 5x5 stencil\n\nThe tiled stage copies a 20x20 "
                          "patch (16x16 outputs plus a 2-pixel halo) into shared memory, then computes from it. Here "
                          "is a version that forgets the barrier between loading the patch and reading it. On a GPU "
                          "it would often pass a quick test; in the simulator, shared memory starts as NaN:"),
            code_cell(STENCIL_NO_BARRIER),
            markdown_cell("## Exercise 3: a stub\n\nAn untouched exercise from `exercises/` still has its "
                          "`TODO(exercise)` line; the grader says so without running it (on a real GPU a kernel "
                          "cannot report an error without debug=True, so this is found by reading the source "
                          "first):"),
            code_cell(MATVEC_STUB),
        ]
    cells.append(markdown_cell("""\
## From the command line

The same grader, on the generated exercises (`exercises/`, yours to edit), on the answer key, or on any
file that defines the stage's launcher:

```
workbench grade                      # every exercise
workbench grade scan.reduce_then_scan
workbench grade --impl solutions     # the answer key: passes everything
workbench grade histogram --impl my_histogram.py --json --junit grade.xml
```

`tests/planted/` holds a catalog of classic wrong answers, each rejected for its reason."""))
    return finish(cells, "grade-yourself")


# -- the set ------------------------------------------------------------------------------------------

def notebook_recipes() -> dict:
    """{file name: a function that builds that notebook}, in order: start-here, every chapter (by its
    declared number), grade-yourself, compare-all. Building one does not build the others."""
    ops = registry.load_operators()
    recipes = {START_HERE: functools.partial(build_start_here, ops)}
    for ch in registry.chapters():
        recipes[ch.notebook] = functools.partial(build_notebook, ch)
    recipes[GRADE_YOURSELF] = functools.partial(build_grade_yourself, ops)
    recipes[COMPARE_ALL] = functools.partial(build_compare_all, ops)
    return recipes


def build_all_notebooks() -> dict:
    """{file name: notebook} for every operator, plus start-here, grade-yourself and compare-all."""
    return {name: make() for name, make in notebook_recipes().items()}


class UnknownNotebook(LookupError):
    """--only named neither an operator, a chapter nor a notebook file."""


def select(notebooks: dict, only: list[str] | None) -> dict:
    """The entries of ``notebooks`` (by file name) that ``only`` names (an operator: its chapter's notebook;
    a chapter's number or name; a file name, or a file name's stem); all without it."""
    if not only:
        return notebooks
    picked = {}
    for want in only:
        try:  # a family or a variant: its chapter's notebook
            want = registry.notebook_name(registry.operators_named(want)[0])
        except registry.UnknownTarget:
            pass
        hits = [name for name in notebooks
                if want in (name, name.removesuffix(".ipynb"), *name.removesuffix(".ipynb").split("_", 1))]
        if not hits:
            extra = ", ".join(name.removesuffix(".ipynb") for name in (START_HERE, GRADE_YOURSELF, COMPARE_ALL))
            raise UnknownNotebook(f"no notebook for {want!r}: --only takes an operator (`workbench list`), a "
                                  f"chapter's number or name ({', '.join(ch.stem for ch in registry.chapters())}), "
                                  f"{extra}, or a file name")
        picked.update((name, notebooks[name]) for name in hits)
    return {name: nb for name, nb in notebooks.items() if name in picked}


# -- writing and executing ----------------------------------------------------------------------------

def kernel_env(extra: dict | None = None) -> dict:
    """The environment for the notebook kernel: this interpreter's bin/ first on PATH (the kernelspec
    says just "python"), so the kernel imports the same workbench as the caller, and the checkout on
    PYTHONPATH, so it finds workbench and solutions even where the project is not pip-installed."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    root = str(paths.REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env.setdefault("WORKBENCH_SIM_CORE", "0")  # in the simulator, one core: half the time (simulator.run_on_one_core)
    env.update(extra or {})
    return env


def execute_notebook(nb, cwd: Path, timeout: int = EXECUTE_TIMEOUT_S, env: dict | None = None):
    """Run every cell in a fresh kernel (kernel "python3", this interpreter), outputs written in place."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME, record_timing=False,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(env=kernel_env(env))
    return nb


class HandEdited(RuntimeError):
    """A notebook was edited by hand since it was generated: not overwritten without --force."""


class NotebookFailed(RuntimeError):
    """A notebook's cell raised while executing; the notebook was still written, with the traceback."""


def hand_edited(path: Path) -> bool:
    import nbformat

    try:
        old = nbformat.read(path, as_version=4)
    except (OSError, ValueError, nbformat.ValidationError):
        return False
    recorded = old.metadata.get("workbench", {}).get("source_hash")
    return recorded is not None and recorded != source_hash(old)


def build_all(out_dir: Path | str = paths.NOTEBOOKS_DIR, execute: bool = False, only: list[str] | None = None,
              force: bool = False, env: dict | None = None, log=print) -> list[Path]:
    """Write the notebooks (all, or those ``only`` names) into ``out_dir``.

    Without ``execute``, a notebook whose cells are unchanged is left alone (its outputs kept); a changed
    one is written without outputs. With ``execute`` each is run (nbclient) and saved with its outputs,
    one line per notebook with its time. A notebook edited by hand since it was generated is not
    overwritten unless ``force``."""
    import nbformat

    out_dir = Path(out_dir)
    chosen = {name: make() for name, make in select(notebook_recipes(), only).items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    written, failed = [], []
    for i, (name, nb) in enumerate(chosen.items(), 1):
        path = out_dir / name
        if path.exists():
            if not force and hand_edited(path):
                raise HandEdited(f"{path} was edited by hand since it was generated; move it aside or pass --force")
            if not execute and cell_sources(nbformat.read(path, as_version=4)) == cell_sources(nb):
                log(f"up to date: {path}")
                continue
        if execute:
            from nbclient.exceptions import CellExecutionError

            started = time.perf_counter()
            log(f"[{i}/{len(chosen)}] executing {name} ...")
            try:
                execute_notebook(nb, out_dir, env=env)
            except CellExecutionError as exc:  # written anyway, with the traceback in the failing cell
                first = next((ln for ln in str(exc).splitlines() if "Error" in ln and ":" in ln), str(exc)[:200])
                log(f"  FAILED: {first.strip()}")
                failed.append(name)
            log(f"  ran in {time.perf_counter() - started:.0f} s")
        nbformat.validate(nb)
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, path)
        log(f"wrote {path}")
        written.append(path)
    if only is None:
        for path in no_longer_built(out_dir):  # an operator added before them renumbered them
            if hand_edited(path):
                log(f"kept {path}: no longer built (renumbered or removed), but edited by hand")
            else:
                path.unlink()
                log(f"removed {path}: no longer built (renumbered or removed)")
    if failed:
        raise NotebookFailed(f"a cell failed in {', '.join(failed)} (the traceback is in the notebook)")
    return written


def no_longer_built(out_dir: Path | str = paths.NOTEBOOKS_DIR) -> list[Path]:
    """Notebooks this builder wrote into ``out_dir`` under a name it no longer makes: a new operator
    shifts the numbers of those after it. Only generated ones (a learner's own notebook has no
    ``workbench`` metadata)."""
    import nbformat

    made = set(notebook_recipes())
    out = []
    for path in sorted(Path(out_dir).glob("*.ipynb")):
        if path.name in made:
            continue
        try:
            generated = "workbench" in nbformat.read(path, as_version=4).metadata
        except (OSError, ValueError, nbformat.ValidationError):
            generated = False
        if generated:
            out.append(path)
    return out


def stale_notebooks(out_dir: Path | str = paths.NOTEBOOKS_DIR) -> list[str]:
    """Notebooks that are missing or whose cells differ from what the builder makes now."""
    import nbformat

    stale = []
    for name, nb in build_all_notebooks().items():
        path = Path(out_dir) / name
        if not path.exists() or cell_sources(nbformat.read(path, as_version=4)) != cell_sources(nb):
            stale.append(name)
    return stale


# -- `workbench notebooks build|check|list` -------------------------------------------------------------

def cmd_notebooks(args) -> int:
    out = Path(args.out)
    if args.action == "list":
        for name in notebook_recipes():
            print(name)
        return 0
    if args.action == "screens":
        return screens_report(out, args.only, args.shots)
    if args.action == "check":
        stale = stale_notebooks(out)
        for name in stale:
            print(f"out of date: {out / name}")
        orphans = no_longer_built(out)
        for path in orphans:
            print(f"no longer built (renumbered or removed; `workbench notebooks build` removes it): {path}")
        if orphans and not stale:
            return 1
        if stale:
            only = " ".join(f"--only {n}" for n in stale)
            print(f"rebuild: workbench notebooks build --execute {only}", file=sys.stderr)
            return 1
        print(f"notebooks up to date: all {len(build_all_notebooks())} in {out} match solutions/")
        return 0
    env = {}
    if args.sim:
        env["WORKBENCH_MODE"] = "sim"
    if args.recorded:
        env["WORKBENCH_NOTEBOOK_LIVE"] = "0"
    try:
        build_all(out, execute=args.execute, only=args.only, force=args.force, env=env)
    except UnknownNotebook as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    except (HandEdited, NotebookFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def screens_report(out: Path, only=None, shots: str | None = None) -> int:
    """Print the screens each chapter's notebook fills; 1 if a core chapter's exceeds a sitting. With
    ``shots``, also write every screen as a 1280 x 1000 PNG in that folder (``screens.screenshots``)."""
    from .. import screens

    chapters = {ch.notebook: ch for ch in registry.chapters()}
    try:
        names = list(select(notebook_recipes(), only))  # the chapters and the course's own notebooks
    except UnknownNotebook as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if shots:
        try:
            Path(shots).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"error: --shots {shots}: cannot make that folder ({exc.strerror})", file=sys.stderr)
            return 2
    too_long = []
    try:
        for name in names:  # (a notebook not built yet is an error: build it first)
            n = screens.screens(out / name)
            core = name in chapters and chapters[name].core
            over = core and n > screens.SCREENS_PER_SITTING
            too_long += [name] if over else []
            print(f"{name:32s} {n:5.1f} screens" + (" (core path)" if core else "") + ("  too long" if over else ""))
            if shots:
                written = screens.screenshots(out / name, Path(shots))
                print(f"  {len(written)} screenshots in {shots}/{Path(name).stem}-NN.png")
    except screens.NoBrowser as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if too_long:
        print(f"{len(too_long)} core chapter(s) over {screens.SCREENS_PER_SITTING} screens: {', '.join(too_long)}",
              file=sys.stderr)
        return 1
    return 0


def add_cli(sub) -> None:
    s = sub.add_parser("notebooks", help="build (and --execute) the notebooks from solutions/; check them")
    s.add_argument("action", choices=["build", "check", "list", "screens"],
                   help="build: write (and with --execute run) them; check: list those out of date; list: names; "
                        "screens: how many 1280x1000 screens each fills in JupyterLab (needs Chromium)")
    s.add_argument("--execute", action="store_true", help="run them (nbclient) and save their outputs")
    s.add_argument("--only", action="append", metavar="OP",
                   help="an operator (its chapter's notebook), a chapter (21, softmax or 21_softmax) or a notebook file "
                        "name; repeatable")
    s.add_argument("--out", default=str(paths.NOTEBOOKS_DIR), help="the folder to write (default: notebooks/)")
    s.add_argument("--force", action="store_true", help="overwrite notebooks edited by hand")
    s.add_argument("--shots", metavar="DIR", help="with screens: also save each screen as a 1280x1000 PNG in DIR")
    s.add_argument("--sim", action="store_true", help="execute in the simulator even on a GPU machine")
    s.add_argument("--recorded", action="store_true",
                   help="on a GPU, plot the figures recorded in results/ instead of measuring them now "
                        "(what the committed notebooks should show)")
    s.set_defaults(func=cmd_notebooks)
