"""``gazctl journals apply``: apply journal specifications (Gazette's ``journals_apply.go``).

Flags, help and output are Gazette's; see ``gazctl journals apply --help``. Changes go in
etcd transactions of at most ``--max-txn-size`` (by default as many as a default etcd admits):
each transaction is atomic, a larger apply is not (``common.apply_in_transactions``).
"""

from __future__ import annotations

from google.protobuf import text_format

from gazette.cli.gazctl.common import (
    ApplyBatchError,
    CommandError,
    Context,
    apply_failed,
    apply_in_transactions,
    read_specs,
)
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
        resp, txns = await apply_in_transactions(req.changes, ctx.args.max_txn_size, client.apply)
    except ApplyBatchError as err:
        if not isinstance(err.cause, ClientError):
            raise err.cause from None
        raise apply_failed("journals", err.cause, len(req.changes), err.applied) from None
    # Gazette's line; the count of transactions only when the apply was split (not atomic).
    split = {"transactions": txns} if txns > 1 else {}
    ctx.log.info("successfully applied", revision=resp.header.etcd.revision, **split)


async def cmd_apply(ctx: Context) -> None:
    text = await read_specs(ctx)
    req = _decode_specs(text)
    if ctx.args.dry_run:
        ctx.stdout.write(text_format.MessageToString(req).encode())
        ctx.stdout.flush()
        return
    async with ctx.client() as client:
        await _apply(ctx, client, req)
