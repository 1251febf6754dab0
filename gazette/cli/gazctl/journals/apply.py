"""``gazctl journals apply``: apply journal specifications (Gazette's ``journals_apply.go``).

Flags, help and output are Gazette's; see ``gazctl journals apply --help``.
"""

from __future__ import annotations

from google.protobuf import text_format

from gazette.cli.gazctl.common import CommandError, Context, apply_failed, read_specs
from gazette.client.errors import (
    ClientError,
)
from gazette.client.journal_client import JournalClient
from gazette.errors import GazetteError
from gazette.protocol import protocol_pb2 as pb


def changes_from_yaml(text: str) -> pb.ApplyRequest:
    """The ApplyRequest of a journal-space YAML document (Gazette's hierarchy)."""
    from gazette.journalspace import apply_request

    return apply_request(text)


def _decode_specs(text: str) -> pb.ApplyRequest:
    try:
        return changes_from_yaml(text)
    except (ValueError, GazetteError) as err:  # SpecSpaceError and YAML errors.
        raise CommandError("failed to decode journal tree", err=str(err)) from None


async def _apply(ctx: Context, client: JournalClient, req: pb.ApplyRequest) -> None:
    try:
        resp = await client.apply(req, ctx.args.max_txn_size)
    except ClientError as err:
        raise apply_failed("journals", err, len(req.changes)) from None
    ctx.log.info("successfully applied", revision=resp.header.etcd.revision)


async def cmd_apply(ctx: Context) -> None:
    text = await read_specs(ctx)
    req = _decode_specs(text)
    if ctx.args.dry_run:
        ctx.stdout.write(text_format.MessageToString(req).encode())
        ctx.stdout.flush()
        return
    async with ctx.client() as client:
        await _apply(ctx, client, req)
