"""Which modules the compiled build compiles, and which build is running.

``setup.py`` reads :data:`COMPILED_MODULES` (as text) and compiles them with mypyc when a wheel
is built; :func:`build_line` is what ``gazette --version`` prints about it; ``mypyc_attr`` is
mypyc's class decorator, usable by the compiled modules without depending on mypy.

Invariants:

* A module is on the list only if compiling it was measured to pay (docs/architecture.md,
  "The compiled build", has the figures) and its tests pass against the compiled module.
* :func:`compiled_modules` reports what actually loaded: a listed module imported from its
  ``.py`` (a silent fallback) is not counted, and tests/unit/test_compiled_build.py fails on
  it in a compiled install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:  # mypy_extensions is mypy's, not a dependency of gazette

    def mypyc_attr(*attrs: object, **kwattrs: object) -> Callable[[type], type]:
        """mypyc's class options, for the compiled modules (``allow_interpreted_subclasses``):
        mypyc reads the decorator where it compiles and never calls it; interpreted, a no-op.
        Imported from here, not defined in a compiled module: there mypyc compiles the
        ``else`` of ``if TYPE_CHECKING`` as unreachable (it raises)."""
        return lambda cls: cls

COMPILED_MODULES: tuple[str, ...] = (
    "gazette.message.uuid",
    "gazette.message.sequencer",
    "gazette.allocator._flow",
    "gazette.allocator.solver",
    "gazette.rpc.frames",
    "gazette.rpc.hpack_decoder",
    "gazette.rpc.connection",
    "gazette.rpc.server",
    "gazette.fragment.fragment",
    "gazette.broker.index",
    "gazette.broker.metrics",
    "gazette.broker.readahead",
    "gazette.broker.wire",
    "gazette.protocol.validate",
    "gazette.tasks",
    "gazette.fifo_lock",
    "gazette.broker.append",
    "gazette.broker.group_commit",
    "gazette.broker.pipeline",
    "gazette.broker.spool",
    "gazette.broker.replicate",
    "gazette.rpc.channel",
    "gazette.client.append_service",
    "gazette.message.framing",
    "gazette.message.iterators",
    "gazette.message.publisher",
    "gazette.consumer.transaction",
    "gazette.recoverylog.recorder",
    "gazette.recoverylog.capture",
    "gazette.recoverylog.player",
)


def is_compiled(module: str) -> bool:
    """Whether importing ``module`` loads a C extension (mypyc's) rather than its ``.py``.

    Found without importing it (``--version`` stays quick): an extension beside a ``.py`` is
    what the import system picks."""
    spec = importlib.util.find_spec(module)
    origin = (spec.origin if spec is not None else None) or ""
    return not origin.endswith((".py", ".pyc"))


def compiled_modules() -> list[str]:
    """The listed modules that are extension modules in this installation."""
    return [m for m in COMPILED_MODULES if is_compiled(m)]


def build_line() -> str:
    """``compiled (mypyc): N modules`` or ``interpreted``: which build of gazette runs."""
    compiled = compiled_modules()
    if not compiled:
        return "interpreted"
    return f"compiled (mypyc): {len(compiled)} modules"
