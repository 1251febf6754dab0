"""``gazctl journals edit``: edit journal specifications (Gazette's ``journals_edit.go``).

Flags, help and output are Gazette's; see ``gazctl journals edit --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

from gazette.cli.gazctl.common import CommandError, Context, list_selected, selector_only
from gazette.cli.gazctl.journals.apply import changes_from_yaml
from gazette.cli.gazctl.journals.list import journals_yaml
from gazette.client.errors import (
    ApplyError,
    ClientError,
)
from gazette.errors import GazetteError
from gazette.protocol import protocol_pb2 as pb

_EDIT_HEADER = """\
# Please edit the journal specifications below. Lines beginning with '#' at the top
# are ignored, and an empty file aborts the edit. Revisions are checked when applying:
# if a journal changed since it was listed, nothing is applied.
"""


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


async def cmd_edit(ctx: Context) -> None:
    async with ctx.client() as client:
        resp = await list_selected(client, ctx.args.selector)
        if not resp.journals:
            raise CommandError("no journals match selector", selector=ctx.args.selector)
        original = journals_yaml(resp)
        before, message = original, ""
        fd, path = tempfile.mkstemp(prefix="gazctl-journals-edit-", suffix=".yaml")
        os.close(fd)
        try:
            while True:
                header = _EDIT_HEADER + "".join(f"# {line}\n" for line in message.splitlines())
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
                    req = changes_from_yaml(edited)
                except (ValueError, GazetteError) as err:
                    before, message = edited, f"error: {err}"
                    continue  # Re-open the editor with the error shown at the top.
                try:
                    resp_apply = await client.apply(req, ctx.args.max_txn_size)
                except ApplyError as err:
                    if err.status == pb.ETCD_TRANSACTION_FAILED:
                        raise CommandError(
                            "failed to apply journals: a journal changed since it was listed "
                            "(stale revision); re-run edit to start from the current specs",
                            err=str(err)) from None
                    raise CommandError("failed to apply journals", err=str(err)) from None
                except ClientError as err:
                    raise CommandError("failed to apply journals", err=str(err)) from None
                ctx.log.info("successfully applied", revision=resp_apply.header.etcd.revision)
                return
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)


def edit_flags(p: argparse.ArgumentParser) -> None:
    selector_only(p)
    p.add_argument("--max-txn-size", type=int, default=0,
                   help="maximum number of specs to be processed within an apply transaction")
