"""Import cycles among gazette's modules, and imports of another package's private names.

Reads every module under ``gazette/`` (generated ``*_pb2*`` excepted) and builds its import
graph from *every* import statement: top-level, function-local and ``TYPE_CHECKING``-only
(import-linter's layer contracts work on packages; this works on modules). Prints each strongly
connected component of more than one module, and each ``from gazette.x import _name`` (a module
reaching into another module's private names); exits 1 if there is any.

Run: ``python scripts/import_cycles.py`` (``scripts/test.sh`` does).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "gazette"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py") if "_pb2" not in p.name}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[str] = []
    for mod, path in modules.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in modules else base)
                    if a.name.startswith("_") and not a.name.startswith("__") and base.startswith("gazette"):
                        private.append(f"{mod} imports {base}.{a.name}")
            for t in targets:
                # The module named, not its parent packages: Python runs a package's __init__
                # before its modules, which is ordering, not a dependency of the design.
                if t in modules and t != mod:
                    edges[mod].add(t)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    edges, private = graph()
    found = cycles(edges)
    for comp in found:
        print("import cycle:", " <-> ".join(comp))
    for line in private:
        print("private import:", line)
    if not found and not private:
        print(f"no import cycles among {len(edges)} modules; no private names imported across modules")
    return 1 if found or private else 0


if __name__ == "__main__":
    sys.exit(main())
