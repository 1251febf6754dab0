"""Process flags in Gazette's style: ``--group.name`` flags that default to their environment
variable (``GROUP_NAME``), and typed reads of them that exit with one line naming a bad flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["Flag", "Flags", "add_flags"]

Flag = tuple[str, str, Any, str]
"""(flag, environment variable, default, help)."""


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    """Adds ``flags``, each defaulting to its environment variable."""
    for flag, env, default, help_ in flags:
        parser.add_argument(flag, dest=flag[2:].replace(".", "_").replace("-", "_"),
                            default=os.environ.get(env, default), help=f"{help_} [${env}] (default {default})")


class Flags:
    """Typed reads of parsed flags; a bad value exits naming the flag."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns

    def get(self, name: str) -> str:
        return str(getattr(self.ns, name.replace(".", "_").replace("-", "_")))

    def integer(self, name: str) -> int:
        try:
            return int(self.get(name))
        except ValueError:
            raise SystemExit(f"gazette: invalid --{name} {self.get(name)!r} (expected an integer)") from None
