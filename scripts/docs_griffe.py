"""A griffe extension for the docs site (mkdocs.yml loads it), reading the docstrings as Sphinx
would: each cross-reference role (``:class:`Application```, which Markdown would show verbatim)
becomes a code span of its target (``~a.b.C`` shows ``C``), and a module attribute or type
alias documented by ``#:`` comments above it gets them as its docstring. Nothing is imported:
griffe reads the source."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|exc|mod|data|obj|const|type):`([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


def unroled(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by a code span."""
    return _ROLE.sub(_code, text)


def comment_doc(lines: list[str], lineno: int) -> str | None:
    """The ``#:`` comment lines directly above line ``lineno`` (1-based), joined."""
    found: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        found.append(lines[i].lstrip()[2:].strip())
        i -= 1
    return "\n".join(reversed(found)) or None


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and obj.is_attribute and obj.lineno is not None:
            try:
                lines = obj.lines_collection[obj.filepath]  # type: ignore[index]
            except (KeyError, TypeError):
                lines = []
            text = comment_doc(lines, obj.lineno)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = unroled(obj.docstring.value)
