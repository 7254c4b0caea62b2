"""The exercise markers in a ladder module, shared by the exercise generator and the grader.

A solutions module marks what a learner should write::

    # HINT: a nudge                       (1 to 3 hint lines, vague -> specific, directly before BEGIN)
    # BEGIN SOLUTION
    ...the code...
    # END SOLUTION

The generated exercise replaces each region by its hints and one stub line carrying ``STUB_MARK``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re

HINT = re.compile(r"^(?P<indent>[ \t]*)# HINT:\s?(?P<text>.*?)\s*$")
BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\s*$")
END = re.compile(r"^(?P<indent>[ \t]*)# END SOLUTION\s*$")
STUB_MARK = "TODO(exercise): not implemented yet"  # on the stub line only; the grader looks for it
MAX_HINTS = 3
# A generated exercise's header records the hash of the body below it: an exercise is pristine (nobody
# has edited it) while the two agree. The generator writes it; the grader reads it.
HASH_LINE = re.compile(r"^# generated-sha256: (?P<hash>[0-9a-f]{64})\s*$", re.M)
HEADER_END = "# " + "-" * 98


def has_markers(text: str) -> bool:
    """Does this source have at least one BEGIN SOLUTION region (is it, or part of it, an exercise)?"""
    return any(BEGIN.match(line) for line in text.splitlines())


def stub_lines(source: str) -> list[int]:
    """1-based lines of ``source`` that are still TODO(exercise) stubs (not comments mentioning one)."""
    return [i for i, line in enumerate(source.splitlines(), 1) if STUB_MARK in line and not line.lstrip().startswith("#")]


def no_exercise_because(source: str) -> str | None:
    """Why a ladder module's source gets no exercise (a phrase that follows its file name), or None."""
    if not has_markers(source):
        return "has no regions marked for a learner to write yet"
    imported = ladder_imports(source)
    if imported:
        return (f"imports the ladder module(s) {', '.join(imported)}, which the grader refuses while grading; "
                "shared code belongs in solutions/_*.py")
    return None


def ladder_imports(source: str) -> list[str]:
    """The other ladder modules a solutions module imports (``from solutions import softmax``, ``from
    solutions.layernorm import ...``); shared helpers (``solutions._ptx``) are not ladders. An exercise
    made from such a module could not be graded: the grader refuses the answer key's modules."""
    return list(_ladder_imports(source))


@functools.lru_cache(maxsize=256)  # by the text: building the exercises asks twice per module, each build
def _ladder_imports(source: str) -> tuple[str, ...]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "solutions":
            if node.module == "solutions":
                found += [a.name for a in node.names if not a.name.startswith("_")]
            elif not node.module.split(".")[1].startswith("_"):
                found.append(node.module.split(".")[1])
    return tuple(sorted(set(found)))


def digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def split_header(text: str) -> tuple[str | None, str]:
    """(the hash recorded in the header, the body after it); (None, text) if there is no header."""
    match = HASH_LINE.search(text)
    if match is None:
        return None, text
    end = text.find(HEADER_END + "\n", match.end())
    if end < 0:
        return None, text
    return match["hash"], text[end + len(HEADER_END) + 1:]


def is_pristine(text: str) -> bool:
    """Is this exactly what the exercise generator wrote once (no learner edits below the header)?"""
    recorded, body = split_header(text)
    return recorded is not None and digest(body) == recorded
