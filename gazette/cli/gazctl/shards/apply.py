"""``gazctl shards apply``: apply shard specifications (Gazette's ``shards_apply.go``).

The input is a shard space (``common`` plus ``shards``, the format of ``shards list -o yaml``).
The consumer refuses a shard whose source journal is missing or has no framed content-type,
naming the field, and then applies nothing of that transaction. Changes go in etcd
transactions of at most ``--max-txn-size`` (``common.apply_in_transactions``): each is atomic,
a larger apply is not; the error of a failed one says how many changes earlier ones applied.
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
from gazette.client.errors import ClientError
from gazette.consumer.client import ShardClient, ShardStatusError
from gazette.errors import GazetteError
from gazette.protocol import consumer_pb2 as pc


def changes_from_yaml(text: str) -> pc.ApplyRequest:
    """The ApplyRequest of a shard-space YAML document."""
    from gazette.consumer.shardspace import apply_request

    return apply_request(text)


def decode_specs(text: str) -> pc.ApplyRequest:
    try:
        return changes_from_yaml(text)
    except (ValueError, GazetteError) as err:
        raise CommandError("failed to decode shard space", err=str(err)) from None


def _shard_of(req: pc.ApplyRequest, message: str, offset: int = 0) -> str:
    """The shard a refusal naming ``changes[i]...`` of a transaction starting at change
    ``offset`` of ``req`` concerns."""
    import re

    m = re.search(r"changes\[(\d+)\]", message)
    if m and offset + int(m.group(1)) < len(req.changes):
        ch = req.changes[offset + int(m.group(1))]
        return ch.upsert.id if ch.HasField("upsert") else ch.delete
    return ""


async def apply_changes(ctx: Context, client: ShardClient, req: pc.ApplyRequest) -> None:
    try:
        resp, txns = await apply_in_transactions(req.changes, ctx.args.max_txn_size, client.apply)
    except ApplyBatchError as batch:
        err, applied = batch.cause, batch.applied
        if isinstance(err, ShardStatusError):
            if err.status == pc.Status.ETCD_TRANSACTION_FAILED:
                failed = CommandError("failed to apply shards: a shard changed since it was listed "
                                      "(stale revision); list again and retry", err=str(err))
                if applied:
                    failed.fields["applied"] = (f"{applied} of {len(req.changes)} changes were "
                                                "applied by earlier transactions and stay applied")
                raise failed from None
            raise apply_failed("shards", err, len(req.changes), applied) from None
        if isinstance(err, ClientError):
            failed = apply_failed("shards", err, len(req.changes), applied)
            # A refusal names changes[i] of its own transaction.
            shard = _shard_of(req, str(err), offset=applied)
            if shard:
                failed.fields["shard"] = shard
            raise failed from None
        raise err from None
    # Gazette's line; the count of transactions only when the apply was split (not atomic).
    split = {"transactions": txns} if txns > 1 else {}
    ctx.log.info("successfully applied", revision=resp.header.etcd.revision, **split)


async def cmd_apply(ctx: Context) -> None:
    text = await read_specs(ctx)
    req = decode_specs(text)
    if ctx.args.dry_run:
        ctx.stdout.write(text_format.MessageToString(req).encode())
        ctx.stdout.flush()
        return
    async with ctx.shard_client() as client:
        await apply_changes(ctx, client, req)
