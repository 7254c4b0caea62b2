"""Where things are: the repository, what is committed there, and where generated files go.

One rule each, used by every command:

* ``REPO_ROOT``: the checkout this package runs from (``solutions/``, ``exercises/``, ``notebooks/``,
  ``results/`` and ``README.md`` live there).
* ``results_dir()``: recorded measurements, committed (``$WORKBENCH_RESULTS`` overrides it).
* ``output_dir()``: files a command makes for you to look at (plots of a ``run``, grading logs):
  never committed. ``$WORKBENCH_OUT`` if set, else ``out/`` in the checkout (git-ignored), else, when
  the package is installed without a checkout, ``~/.cache/numba-cuda-workbench``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
SOLUTIONS_DIR = REPO_ROOT / "solutions"
EXERCISES_DIR = REPO_ROOT / "exercises"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
COMMITTED_PLOTS_DIR = REPO_ROOT / "results" / "plots"  # the figures README shows


def is_checkout() -> bool:
    return (REPO_ROOT / "pyproject.toml").exists() and SOLUTIONS_DIR.is_dir()


def results_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_RESULTS") or REPO_ROOT / "results")


def output_dir(*parts: str) -> Path:
    """A folder for generated files that are not committed (created on first use)."""
    base = os.environ.get("WORKBENCH_OUT")
    if base:
        root = Path(base)
    elif is_checkout() and os.access(REPO_ROOT, os.W_OK):
        root = REPO_ROOT / "out"
    else:
        root = Path.home() / ".cache" / "numba-cuda-workbench"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
