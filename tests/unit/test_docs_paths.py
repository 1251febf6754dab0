"""docs/architecture.md cannot drift from the tree: every path it names exists, every package
and module under ``gazette/`` appears in its module index, and its prose carries no line
counts (they go stale with the next commit)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"

# A path-like token: backticked, or a gazette/... word of the map's code block.
_TICKED = re.compile(r"`([^`\s]+)`")
_BARE = re.compile(r"(?<![\w/.])(gazette/[\w/.]*)")
_INDEX_LINE = re.compile(r"^- `(gazette/(?:[\w]+/)*)`: (.*)$")
_LINE_COUNTS = [
    re.compile(r"\b\d[\d,]*\s+lines?\b"),  # "795 lines", "~640 lines"
    re.compile(r"\b\d+-line\b"),  # "a 122-line scenario"
    re.compile(r"\(~?\d{3,}\)"),  # "labels.py (684)"
]


def _text() -> str:
    return DOC.read_text()


def _is_path(token: str) -> bool:
    if any(c in token for c in "{}*<>$") or "://" in token or token.startswith(("/", ".", "-")):
        return False
    if not re.fullmatch(r"[\w./-]+", token) or not token[0].isalpha():
        return False
    return token.endswith(".py") or ("/" in token and (
        token.endswith("/") or re.search(r"\.[a-z]+$", token) is not None))


_TOPS = ("gazette", "tests", "examples", "bench", "scripts", "docs", "fuzz")


def _exists(token: str) -> bool:
    """Relative to the repository root or to ``gazette/``; a bare file name anywhere in the
    project's own directories."""
    path = token.rstrip("/")
    if (ROOT / path).exists() or (ROOT / "gazette" / path).exists():
        return True
    return "/" not in path and any(any((ROOT / top).rglob(path)) for top in _TOPS)


def named_paths(text: str) -> set[str]:
    tokens = {t for t in _TICKED.findall(text)} | set(_BARE.findall(text))
    return {t.rstrip(".,;:)") for t in tokens if _is_path(t.rstrip(".,;:)"))}


def indexed_modules(text: str) -> set[str]:
    """Every ``gazette/.../x.py`` of the module index (``- `gazette/pkg/`: `a.py` `b.py` ``)."""
    out: set[str] = set()
    for line in text.splitlines():
        m = _INDEX_LINE.match(line)
        if m:
            pkg = m.group(1)
            out.add(pkg)
            out.update(pkg + name for name in _TICKED.findall(m.group(2)))
    return out


def tree_modules() -> set[str]:
    """Every package (``gazette/x/``) and module (``gazette/x/y.py``) but ``__init__.py`` and
    the generated ``*_pb2*.py``."""
    out: set[str] = set()
    for path in (ROOT / "gazette").rglob("*.py"):
        rel = path.relative_to(ROOT)
        if "__pycache__" in rel.parts or "_pb2" in path.name:
            continue
        out.add(rel.parent.as_posix() + "/")
        if path.name != "__init__.py":
            out.add(rel.as_posix())
    return out


def test_every_named_path_exists() -> None:
    missing = sorted(t for t in named_paths(_text()) if not _exists(t))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_and_module_is_in_the_index() -> None:
    indexed, tree = indexed_modules(_text()), tree_modules()
    assert not sorted(tree - indexed), f"not in the module index: {sorted(tree - indexed)}"
    assert not sorted(indexed - tree), f"indexed but not in the tree: {sorted(indexed - tree)}"


def test_no_line_counts_in_prose() -> None:
    found = [m.group(0) for rx in _LINE_COUNTS for m in rx.finditer(_text())]
    assert not found, f"line counts go stale: {found}"
