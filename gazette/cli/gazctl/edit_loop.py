"""The ``$EDITOR`` loop shared by ``gazctl journals edit`` and ``gazctl shards edit``.

The listed specs are written to a temporary file under a comment header and the editor runs;
an empty or unchanged file cancels; a file that does not parse re-opens the editor with the
error at the top; otherwise ``apply`` is called once with the edited text.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gazette.cli.gazctl.common import CommandError, Context
from gazette.errors import GazetteError


def _header(noun: str) -> str:
    return (f"# Please edit the {noun} specifications below. Lines beginning with '#' at the top\n"
            "# are ignored, and an empty file aborts the edit. Revisions are checked when applying:\n"
            f"# if a {noun} changed since it was listed, nothing is applied.\n")


def _strip_header(text: str) -> str:
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    return "".join(lines[i:])


def _run_editor(ctx: Context, path: str) -> None:
    editor = ctx.env.get("VISUAL") or ctx.env.get("EDITOR") or "vi"
    result = subprocess.run(["/bin/sh", "-c", f'{editor} "$1"', "editor", path], check=False)
    if result.returncode != 0:
        raise CommandError("editor failed", editor=editor, status=result.returncode)


async def edit_and_apply(ctx: Context, noun: str, original: str, parse: Callable[[str], Any],
                         apply: Callable[[str], Awaitable[None]]) -> None:
    before, message = original, ""
    fd, path = tempfile.mkstemp(prefix=f"gazctl-{noun}s-edit-", suffix=".yaml")
    os.close(fd)
    try:
        while True:
            header = _header(noun) + "".join(f"# {line}\n" for line in message.splitlines())
            await asyncio.to_thread(Path(path).write_text, header + before)
            await asyncio.to_thread(_run_editor, ctx, path)
            edited = _strip_header(await asyncio.to_thread(Path(path).read_text))
            if not edited.strip():
                ctx.log.info("Cancelled; empty file.")
                return
            if edited == before:
                ctx.log.info("Cancelled; no changes to invalid file." if message
                             else "Cancelled; nothing to do.")
                return
            try:
                parse(edited)
            except (ValueError, GazetteError) as err:
                before, message = edited, f"error: {err}"
                continue  # Re-open the editor with the error shown at the top.
            await apply(edited)
            return
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
