"""The terminal consoles every command prints through: rich's, with operators' names kept as they are.

A variant's name has brackets (``softmax[bf16]``, ``reduction[max,rows]``), which rich's markup would
read as a style tag and drop. Markup tags the workbench writes (``[yellow]``, ``[/]``) never follow a
letter or digit directly, and a variant's brackets always do: so a ``[`` right after a name's last
character is escaped before rich parses the text, in printed strings and in table cells alike.
"""

from __future__ import annotations

import re

from rich.console import Console

_VARIANT_BRACKET = re.compile(r"(?<=[A-Za-z0-9_])\[(?=[a-z0-9_,]+\])")


class NameSafeConsole(Console):
    def render_str(self, text: str, *, markup: bool | None = None, **kwargs):
        if self._markup if markup is None else markup:  # (text printed with markup=False is left as it is)
            text = _VARIANT_BRACKET.sub(r"\\[", text)
        return super().render_str(text, markup=markup, **kwargs)


def console(**kwargs) -> Console:
    """A rich Console (same arguments) that prints ``softmax[bf16]`` as written."""
    return NameSafeConsole(**kwargs)
