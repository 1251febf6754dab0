"""``gazctl shards apply``: apply shard specifications (Gazette's ``shards_apply.go``).

The input is a shard space (``common`` plus ``shards``, the format of ``shards list -o yaml``).
The consumer refuses a shard whose source journal is missing or has no framed content-type,
naming the field, and then applies nothing.
"""

from __future__ import annotations

from google.protobuf import text_format

from gazette.cli.gazctl.common import CommandError, Context, apply_failed, read_specs
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


def _shard_of(req: pc.ApplyRequest, message: str) -> str:
    """The shard a refusal naming ``changes[i]...`` concerns."""
    import re

    m = re.search(r"changes\[(\d+)\]", message)
    if m and int(m.group(1)) < len(req.changes):
        ch = req.changes[int(m.group(1))]
        return ch.upsert.id if ch.HasField("upsert") else ch.delete
    return ""


async def apply_changes(ctx: Context, client: ShardClient, req: pc.ApplyRequest) -> None:
    try:
        resp = await client.apply(req, ctx.args.max_txn_size)
    except ShardStatusError as err:
        if err.status == pc.Status.ETCD_TRANSACTION_FAILED:
            raise CommandError("failed to apply shards: a shard changed since it was listed "
                               "(stale revision); list again and retry", err=str(err)) from None
        raise apply_failed("shards", err, len(req.changes)) from None
    except ClientError as err:
        failed = apply_failed("shards", err, len(req.changes))
        shard = _shard_of(req, str(err))
        if shard:
            failed.fields["shard"] = shard
        raise failed from None
    ctx.log.info("successfully applied", revision=resp.header.etcd.revision)


async def cmd_apply(ctx: Context) -> None:
    text = await read_specs(ctx)
    req = decode_specs(text)
    if ctx.args.dry_run:
        ctx.stdout.write(text_format.MessageToString(req).encode())
        ctx.stdout.flush()
        return
    async with ctx.shard_client() as client:
        await apply_changes(ctx, client, req)
