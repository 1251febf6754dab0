"""``gazctl shards list``: list shards (Gazette's ``shards_list.go``).

Flags, help and output are Gazette's; see ``gazctl shards list --help``. ``--lag`` stats each
shard (through any consumer: the request is forwarded to the primary) and reads each source
journal's write head from the brokers; lag is the head minus the shard's read-through offset.
It is a column of the table and, with ``-o json``, each shard's ``"lag"`` object (bytes by
source journal).
"""

from __future__ import annotations

import argparse
import asyncio

from google.protobuf import text_format

from gazette.cli.gazctl.common import CommandError, Context, listing_flags, selector_of
from gazette.cli.gazctl.output import json_line, render_table
from gazette.client import JournalClient, write_head
from gazette.client.errors import ClientError
from gazette.consumer.client import ShardClient, ShardStatusError
from gazette.protocol import consumer_pb2 as pc


def add_list_flags(p: argparse.ArgumentParser) -> None:
    listing_flags(p)
    p.add_argument("--lag", action="store_true",
                   help="Show the amount of unread data for each shard")


async def list_shards(client: ShardClient, selector: str | None) -> pc.ListResponse:
    sel = selector_of(selector)
    try:
        return await client.list(sel)
    except (ClientError, ShardStatusError) as err:
        raise CommandError("failed to list shards", err=str(err), consumer=client.address) from None


def shards_yaml(resp: pc.ListResponse) -> str:
    from gazette.consumer.shardspace import from_list_response, to_yaml

    return to_yaml(from_list_response(resp))


def reduce_status(statuses: list[pc.ReplicaStatus]) -> pc.ReplicaStatus:
    """Gazette's ``ReplicaStatus.Reduce``: the highest code wins; FAILED errors accumulate."""
    out = pc.ReplicaStatus()
    for st in statuses:
        if st.code > out.code:
            out.code = st.code
        if st.code == pc.ReplicaStatus.FAILED:
            out.errors.extend(st.errors)
    return out


async def lag_of(shards: ShardClient, journals: JournalClient, shard_id: str) -> dict[str, int]:
    """Per source journal the shard has read, its write head minus the shard's read-through."""
    try:
        stat = await shards.stat(shard_id)
    except (ClientError, ShardStatusError) as err:
        raise CommandError("failed to stat shard", err=str(err), shard=shard_id) from None
    out = {}
    for journal, offset in sorted(stat.read_through.items()):
        try:
            head = await write_head(journals, journal)
        except ClientError as err:
            raise CommandError("failed to read journal", err=str(err), journal=journal) from None
        out[journal] = head - offset
    return out


async def lags_of(ctx: Context, resp: pc.ListResponse, shards: ShardClient) -> list[dict[str, int]]:
    """``lag_of`` of every listed shard, in order."""
    async with ctx.client() as journals:
        return list(await asyncio.gather(*(lag_of(shards, journals, s.spec.id) for s in resp.shards)))


def status_name(code: int) -> str:
    return pc.ReplicaStatus.Code.Name(code)  # type: ignore[arg-type]


async def _table(ctx: Context, resp: pc.ListResponse, shards: ShardClient) -> str:
    a = ctx.args
    headers = ["ID", "Status"]
    headers += ["RF"] if a.rf else []
    headers += ["Primary"] if a.primary else []
    headers += ["Replicas"] if a.replicas else []
    headers += a.labels
    headers += ["Lag"] if a.lag else []
    lags: list[str] = []
    if a.lag:
        lags = [", ".join(f"{j}:{n}" for j, n in lag.items()) for lag in await lags_of(ctx, resp, shards)]
    rows = []
    for i, sh in enumerate(resp.shards):
        primary, replicas = "<none>", []
        for k, m in enumerate(sh.route.members):
            code = sh.status[k].code if k < len(sh.status) else pc.ReplicaStatus.IDLE
            cell = f"{m.suffix}:{status_name(code)}"
            if k == sh.route.primary:
                primary = cell
            else:
                replicas.append(cell)
        row = [sh.spec.id, status_name(reduce_status(list(sh.status)).code)]
        row += [str(0 if sh.spec.disable else sh.spec.hot_standbys + 1)] if a.rf else []
        row += [primary] if a.primary else []
        row += [",".join(replicas)] if a.replicas else []
        for name in a.labels:
            values = [lb.value for lb in sh.spec.labels.labels if lb.name == name]
            row.append(",".join(values) if values else "<none>")
        row += [lags[i]] if a.lag else []
        rows.append(row)
    return render_table(headers, rows)


async def cmd_list(ctx: Context) -> None:
    async with ctx.shard_client() as shards:
        resp = await list_shards(shards, ctx.args.selector)
        fmt = ctx.args.format
        if fmt == "yaml":
            out = shards_yaml(resp)
        elif fmt == "json":
            from google.protobuf.json_format import MessageToDict

            doc = MessageToDict(resp, preserving_proto_field_name=True,
                                always_print_fields_with_no_presence=True)
            if ctx.args.lag:  # not a ListResponse field: each shard's "lag", by source journal
                for sh, lag in zip(doc.get("shards", []), await lags_of(ctx, resp, shards), strict=True):
                    sh["lag"] = lag
            out = json_line(doc)
        elif fmt == "proto":
            out = text_format.MessageToString(resp)
        else:
            out = await _table(ctx, resp, shards)
    ctx.stdout.write(out.encode())
    ctx.stdout.flush()
