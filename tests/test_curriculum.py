"""The course's shape: the declared curriculum (workbench/curriculum.py), the README course map and the chapter
pages under docs/ that `workbench table --update-readme` writes, and `workbench list [OP|CHAPTER]`."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from workbench import curriculum, registry, tables
from workbench.cli import main
from workbench.curriculum import CHAPTERS, Chapter, CurriculumError

REPO = Path(__file__).resolve().parent.parent
OPS = registry.load_operators()


# -- the declaration ---------------------------------------------------------------------------------

def test_every_operator_is_in_exactly_one_declared_chapter():
    filed = [name for ch in CHAPTERS for name in ch.operators]
    assert len(filed) == len(set(filed)), "an operator is listed in two chapters"
    assert set(filed) == set(OPS), (f"in no chapter: {sorted(set(OPS) - set(filed))}; "
                                    f"declared but no such operator: {sorted(set(filed) - set(OPS))}")
    assert not any(ch.unfiled for ch in registry.chapters())


def test_chapters_are_few_with_a_core_path_of_about_a_dozen():
    chapters = registry.chapters()
    assert len(chapters) <= 50
    core = [ch for ch in chapters if ch.core]
    assert 10 <= len(core) <= 14, [ch.stem for ch in core]
    numbers = {ch.number for ch in chapters}
    for ch in core:  # a learner on the core path meets nothing it has not been taught
        assert {p for p in ch.prerequisites if p in numbers} <= {c.number for c in core}, ch.stem
    for ch in chapters:
        assert len(ch.teaches) == 3 and all(q.strip().endswith("?") for q in ch.teaches), ch.stem
        assert ch.minutes > 0 and ch.title and ch.part == ch.number // 10


def test_notebook_numbers_never_collide_with_the_course_notebooks():
    from workbench.generate import notebooks as builder

    special = {int(name[:2]) for name in (builder.START_HERE, builder.GRADE_YOURSELF, builder.COMPARE_ALL)}
    numbers = [ch.number for ch in registry.chapters()]
    assert len(numbers) == len(set(numbers)) and not special & set(numbers)
    assert special.isdisjoint(range(curriculum.UNFILED_FIRST, curriculum.UNFILED_LAST + 1))


def test_appending_a_family_renumbers_nothing():
    before = {name: registry.notebook_name(op) for name, op in OPS.items()}
    appended = CHAPTERS + (Chapter(19, "newcomer", "A new family", ("newcomer",), ("a?", "b?", "c?"), minutes=5,
                                   prerequisites=(11,)),)
    chapters = curriculum.chapters_for([*OPS, "newcomer"], appended)
    after = {name: ch.notebook for ch in chapters for name in ch.operators}
    assert after.pop("newcomer") == "19_newcomer.ipynb"
    assert after == before


def test_an_operator_in_no_chapter_gets_an_unfiled_chapter_that_says_where_to_file_it():
    chapters = curriculum.chapters_for(["reduction", "mine", "yours"], CHAPTERS)
    unfiled = [ch for ch in chapters if ch.unfiled]
    assert [(ch.number, ch.notebook) for ch in unfiled] == [(81, "81_mine.ipynb"), (82, "82_yours.ipynb")]
    assert curriculum.CURRICULUM_FILE in curriculum.unfiled_note(unfiled[0])
    assert [ch.stem for ch in chapters if not ch.unfiled] == ["11_reduction"]  # chapters with none are left out
    with pytest.raises(CurriculumError, match="add them to workbench/curriculum.py"):
        curriculum.chapters_for([f"op{i}" for i in range(10)], CHAPTERS)


@pytest.mark.parametrize("broken, says", [
    (lambda chs: chs + (replace(chs[0], slug="again"),), "used twice"),
    (lambda chs: chs + (replace(chs[0], number=19, slug="again"),), "already in chapter 11"),
    (lambda chs: chs + (replace(chs[0], number=20, slug="x", operators=("x",)),), "p\\*10\\+k"),
    (lambda chs: chs + (replace(chs[0], number=19, slug="x", operators=("x",), prerequisites=(99,)),),
     "prerequisite 99"),
    (lambda chs: chs + (replace(chs[0], number=19, slug="x", operators=("x",), teaches=("one?",)),),
     "three questions"),
])
def test_a_contradictory_curriculum_is_refused_naming_the_chapter(broken, says):
    with pytest.raises(CurriculumError, match=says):
        curriculum.validate(broken(CHAPTERS))


# -- the README and docs/ ---------------------------------------------------------------------------

LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")


def _local_links(path: Path) -> list[str]:
    return [target for _, target in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", target)]


def _rendered_table_widths(text: str) -> list[tuple[int, str]]:
    """The width of each Markdown table row as read: links by their text, code marks dropped."""
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            shown = LINK.sub(r"\1", line).replace("`", "")
            out.append((len(shown), line))
    return out


def test_readme_is_a_front_door_of_at_most_300_lines():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "<!-- course -->" in text and "docs/21_softmax.md" in text


PAGES = ["README.md", *sorted(ch.page for ch in registry.chapters())]


@pytest.mark.parametrize("page", PAGES)
def test_every_link_is_valid(page):
    path = REPO / page
    assert path.exists(), f"{page} is missing: run `workbench table --update-readme`"
    broken = [t for t in _local_links(path) if not (path.parent / t.split("#")[0]).exists()]
    fix = ("`workbench notebooks build --execute --sim` makes the notebooks" if all(".ipynb" in t for t in broken)
           else "`workbench table --update-readme` writes the pages")
    assert not broken, f"{page} links to files that do not exist ({fix}): {broken}"


TOO_WIDE: dict[str, str] = {}  # page -> why its table cannot fit yet (a strict xfail until it does)


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.xfail(reason=TOO_WIDE[p], strict=True))
                                  if p in TOO_WIDE else p for p in PAGES])
def test_every_table_fits_100_columns(page):
    wide = [line for width, line in _rendered_table_widths((REPO / page).read_text()) if width > 100]
    assert not wide, f"{page}: table rows wider than 100 columns: {wide[:3]}"


def test_readme_links_every_chapter_page_and_notebook():
    text = (REPO / "README.md").read_text()
    for ch in registry.chapters():
        assert f"({ch.page})" in text and f"(notebooks/{ch.notebook})" in text, ch.stem


def test_committed_readme_and_docs_are_what_the_registry_and_results_generate():
    readme = (REPO / "README.md").read_text()
    fix = "run `workbench table --update-readme`"
    assert tables.render_readme(readme) == readme, fix
    for page, text in tables.docs_pages().items():
        assert (REPO / page).read_text() == text, f"{page}: {fix}"
    made = {Path(p).name for p in tables.docs_pages()}
    assert {p.name for p in (REPO / "docs").glob("[0-9][0-9]_*.md")} == made


def test_update_readme_writes_the_map_and_the_pages_and_removes_old_pages(tmp_path, monkeypatch):
    few = [registry.chapter(n) for n in ("11", "13", "21")]  # softmax and its prerequisites: enough, and quick
    monkeypatch.setattr(registry, "chapters", lambda: few)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- course -->\nSTALE MAP\n<!-- /course -->\nrest\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "09_gone.md").write_text("a chapter that no longer exists")
    assert tables.update_readme(readme) == "updated"
    text = readme.read_text()
    assert "STALE MAP" not in text and text.endswith("rest\n") and "[21 softmax](docs/21_softmax.md) ★" in text
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["11_reduction.md", "13_elementwise.md",
                                                                          "21_softmax.md"]
    assert tables.update_readme(readme) == "unchanged"
    assert tables.update_readme(tmp_path / "docs" / "21_softmax.md") == "no-markers"


def test_a_chapter_page_shows_every_variant_table_beside_the_others():
    page = tables.chapter_page(registry.chapter("21"))
    for name in ("softmax", "softmax[fp16]", "softmax[bf16]"):
        assert f"## `{name}`:" in page and f"| `{name}` |" in page
    last = registry.operator("softmax[fp16]").stages[-1].name  # the row names the ladder's last stage, its ratio
    assert re.search(rf"\| `softmax\[fp16\]` \| `{last}` \| \d+\.\d\dx \S", page) or "no recorded" in page
    assert "[11 reduction](11_reduction.md)" in page and "(../notebooks/21_softmax.ipynb)" in page


def test_a_family_that_spans_chapters_names_the_others_in_each_page_and_notebook():
    from workbench.generate import notebooks as generate
    spans = {ch.number: [(family, [c.number for c in others]) for family, others in registry.family_elsewhere(ch)]
             for ch in registry.chapters()}
    assert spans[33] == [("gemm", [31, 35])] and spans[21] == []
    page = tables.chapter_page(registry.chapter("33"))
    assert "The `gemm` family continues in [31 gemm](31_gemm.md), [35 int8_gemm](35_int8_gemm.md)." in page
    opening = generate.chapter_md(registry.chapter("31"))
    assert "The `gemm` family continues in [33. Half-precision GEMM on tensor cores](33_hgemm.ipynb)" in opening
    assert "continues in" not in tables.chapter_page(registry.chapter("21"))


# -- workbench list ---------------------------------------------------------------------------------

def test_list_shows_the_chapters_and_filters_by_operator_or_chapter(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "21 ★" in text and "softmax[fp16]" in text and "rows_in_flight" not in text  # chapters, not stages
    assert main(["list", "21", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [op["op"] for op in listed] == ["softmax", "softmax[fp16]", "softmax[bf16]"]
    assert {op["chapter"] for op in listed} == {"21_softmax"}
    assert main(["list", "softmax[fp16]", "--json"]) == 0
    assert [op["op"] for op in json.loads(capsys.readouterr().out)] == ["softmax[fp16]"]
    assert main(["list", "layernorm"]) == 0  # a family's name wins over a chapter's: all its variants
    out = capsys.readouterr().out
    assert "layernorm[bias_relu]" in out and "layernorm[fp16]" in out and "rmsnorm" not in out
    assert main(["list", "layernorm[fp16]", "--json"]) == 0
    assert [op["op"] for op in json.loads(capsys.readouterr().out)] == ["layernorm[fp16]"]
    assert main(["list", "no_such_thing"]) == 2
    err = capsys.readouterr().err
    assert "no operator or chapter 'no_such_thing'" in err and "21_softmax" in err and "Traceback" not in err


def test_a_stage_in_tf32_is_measured_against_tf32s_peak_and_named_so():
    """gemm's tensor-core stages read float32 as TF32: against the float32 library rate they showed 214% of
    peak on the course map. Their % divides by cuBLAS's TF32 rate, and the tables say TF32 beside the stage."""
    from workbench import bench

    gemm = OPS["gemm"]
    peaks = {"gemm_fp32_gflops": 50_000.0, "gemm_tf32_gflops": 350_000.0}
    assert bench.peak_key(gemm, peaks, "split_k") == "gemm_tf32_gflops"
    assert bench.peak_key(gemm, peaks, "async_copy") == "gemm_fp32_gflops"
    assert bench.percent_of_peak(gemm, 0, 105_000.0, peaks, "split_k") == pytest.approx(30)
    assert tables.stage_words(gemm, "split_k") == "split_k (TF32)" and tables.stage_words(gemm, "naive") == "naive"
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| [31 gemm]"))
    assert "(TF32)" in row and int(re.search(r"\| (\d+)% \|", row).group(1)) <= 100, row  # split_k: 31%
