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

    def seconds(self, name: str) -> float:
        """A Go-style duration flag (``20s``, ``30ms``), in seconds."""
        from gazette.durations import parse_duration

        try:
            return parse_duration(self.get(name)).total_seconds()
        except ValueError as err:
            raise SystemExit(f"gazette: invalid --{name}: {err}") from None

    def process_id(self, role: str, default_suffix: str) -> tuple[str, str]:
        """(zone, suffix) of ``--{role}.zone`` and ``--{role}.id`` (``default_suffix`` when the
        id is empty), validated as a ProcessSpec.ID."""
        from gazette.protocol import protocol_pb2 as pb
        from gazette.protocol.errors import ValidationError
        from gazette.protocol.validate import validate_process_id

        zone, suffix = self.get(f"{role}.zone"), self.get(f"{role}.id") or default_suffix
        try:
            validate_process_id(pb.ProcessSpec.ID(zone=zone, suffix=suffix))
        except ValidationError as err:
            raise SystemExit(f"gazette: invalid --{role}.zone/--{role}.id: {err}") from None
        return zone, suffix
