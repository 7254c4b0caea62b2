"""How long a chapter is to read: the screens its notebook fills at 1280 x 1000, as JupyterLab shows it.

A chapter should fit a sitting: the core path's notebooks at most ``SCREENS_PER_SITTING`` screens. The page is
laid out by a headless Chromium (Debian's ``chromium``): the notebook is exported to HTML with nbconvert's lab
template, and what JupyterLab folds is folded first: an output with ``jupyter.outputs_hidden`` is a thin bar, a
source with ``jupyter.source_hidden`` is gone, and an output with ``scrolled`` is a box of at most 24 lines
(JupyterLab's ``max-height: 24em``) with its own scroll bar. The page's height over 1000 pixels is the
number of screens.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

WIDTH, SCREEN = 1280, 1000  # the window a learner reads in, in pixels
SCROLLED_MAX_PX = 24 * 14  # JupyterLab's scrolled output box: 24em at the output's 14 px
FOLDED_BAR_PX = 20  # what a folded output (outputs_hidden) still takes: JupyterLab's collapser bar
SCREENS_PER_SITTING = 25  # a core chapter's notebook at most this long


class NoBrowser(RuntimeError):
    """No Chromium to lay the pages out."""


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    raise NoBrowser("measuring screens needs a headless Chromium (`apt install chromium`); none found on PATH")


def laid_out_html(path: Path) -> str:
    """The notebook as JupyterLab shows it, as one HTML page whose title becomes each cell's height once
    the browser has laid it out (a script at the end measures them)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(path), as_version=4)
    scrolled, folded = [], []
    for i, cell in enumerate(nb.cells):
        shown = cell.get("metadata", {}).get("jupyter", {})
        if shown.get("outputs_hidden") and cell.get("outputs"):
            cell.outputs = []
            folded.append(i)
        if shown.get("source_hidden"):
            cell.source = ""
        if cell.get("metadata", {}).get("scrolled") is True:
            scrolled.append(i)
    html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    script = f"""<script>window.addEventListener('load', () => {{
  const cells = [...document.querySelectorAll('.jp-Cell')];
  for (const i of {json.dumps(scrolled)}) {{
    const out = cells[i] && cells[i].querySelector('.jp-Cell-outputWrapper');
    if (out) {{ out.style.maxHeight = '{SCROLLED_MAX_PX}px'; out.style.overflow = 'hidden'; }}
  }}
  for (const i of {json.dumps(folded)}) {{ if (cells[i]) cells[i].style.paddingBottom = '{FOLDED_BAR_PX}px'; }}
  document.title = 'CELLS' + JSON.stringify(cells.map(c => c.offsetHeight));
}});</script></body>"""
    return html.replace("</body>", script)


def cell_heights(path: Path) -> list[int]:
    """Each cell's height in pixels at WIDTH, laid out by Chromium."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(laid_out_html(Path(path)))
        dom = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},{SCREEN}",
                              "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=300).stdout
    found = re.search(r"<title>CELLS(\[.*?\])</title>", dom)
    if found is None:
        raise RuntimeError(f"Chromium laid out no page for {path}")
    return json.loads(found.group(1))


def screens(path: Path) -> float:
    """The screens of SCREEN pixels the notebook fills."""
    return sum(cell_heights(path)) / SCREEN


def screenshots(path: Path, out_dir: Path, which: list[int] | None = None) -> list[Path]:
    """The notebook's screens as a learner scrolls through them, 1280 x 1000 PNGs ``<stem>-NN.png`` in
    ``out_dir`` (``which``: those screens only, counted from 1), laid out and folded as ``screens`` measures."""
    import math

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = math.ceil(sum(cell_heights(path)) / SCREEN)
    html = laid_out_html(path)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in which or range(1, total + 1):
            if not 1 <= k <= total:
                continue
            page = Path(tmp) / f"screen{k}.html"
            # Once the folding script has run (the load handler before this one), lift the page by k - 1
            # screens: a headless screenshot is of the window's top, whatever the scroll position.
            lift = (f"<script>window.addEventListener('load', () => {{ document.body.style.position = 'relative';"
                    f" document.body.style.top = '-{(k - 1) * SCREEN}px'; }});</script></body>")
            page.write_text(html.replace("</body>", lift))
            shot = out_dir / f"{path.stem}-{k:02d}.png"
            subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--window-size={WIDTH},{SCREEN}", "--virtual-time-budget=10000",
                            f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=300)
            if shot.exists():
                written.append(shot)
    return written
