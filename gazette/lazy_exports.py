"""Package exports loaded on first use (PEP 562), shared by gazette's package ``__init__``s.

A package lists each exported name's home module; ``lazy_exports`` returns the module-level
``__getattr__`` and ``__dir__`` that import the home on first access and keep the value in
the package's namespace, so the second access is an ordinary global lookup.

Invariants: importing a package imports none of its homes; every name in ``__all__`` that is
not defined eagerly has a home (``tests/unit/test_gazctl_start.py`` checks each is reachable);
an unknown name raises ``AttributeError`` naming the package, as a plain module would. The
package keeps its ``TYPE_CHECKING`` imports: type checkers do not run ``__getattr__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], exported: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``; ``homes`` maps a name to its module, which
    may be relative to the package (``".uuid"``)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        vars(sys.modules[package])[name] = value  # found once
        return value

    def __dir__() -> list[str]:
        return sorted(exported)

    return __getattr__, __dir__
