"""``gazctl journals list``: list journals (Gazette's ``journals_list.go``).

Flags, help and output are Gazette's; see ``gazctl journals list --help``.
"""

from __future__ import annotations

import argparse

from google.protobuf import text_format

from gazette.cli.gazctl.common import (
    CommandError,
    Context,
    list_selected,
    listing_flags,
    selector_of,
)
from gazette.cli.gazctl.output import (
    json_line,
    render_table,
)
from gazette.client.errors import (
    ClientError,
)
from gazette.client.listing import PolledList
from gazette.protocol import protocol_pb2 as pb


def add_list_flags(p: argparse.ArgumentParser) -> None:
    listing_flags(p)
    p.add_argument("--stores", action="store_true", help="Show fragment store column")
    p.add_argument("--watch", action="store_true",
                   help="Keep listing as the journals change (polls every --interval)")
    p.add_argument("--interval", type=float, default=10.0, help=argparse.SUPPRESS)


def journals_yaml(resp: pb.ListResponse) -> str:
    from gazette.journalspace import from_list_response, to_yaml

    return to_yaml(from_list_response(resp))


def _list_output(ctx: Context, resp: pb.ListResponse) -> None:
    a = ctx.args
    out: str
    if a.format == "yaml":
        out = journals_yaml(resp)
    elif a.format == "json":
        from google.protobuf.json_format import MessageToDict

        out = json_line(MessageToDict(resp, preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True))
    elif a.format == "proto":
        out = text_format.MessageToString(resp)
    else:
        headers = ["Name"]
        headers += ["RF"] if a.rf else []
        headers += ["Primary"] if a.primary else []
        headers += ["Replicas"] if a.replicas else []
        headers += ["Stores"] if a.stores else []
        headers += a.labels
        rows = []
        for j in resp.journals:
            primary, replicas = "<none>", []
            for i, m in enumerate(j.route.members):
                if i == j.route.primary:
                    primary = m.suffix
                else:
                    replicas.append(m.suffix)
            if j.spec.suspend.level != pb.JournalSpec.Suspend.NONE:
                primary += " <S>"
            row = [j.spec.name]
            row += [str(j.spec.replication)] if a.rf else []
            row += [primary] if a.primary else []
            row += [",".join(replicas)] if a.replicas else []
            if a.stores:
                row.append(j.spec.fragment.stores[0] if j.spec.fragment.stores else "<none>")
            for name in a.labels:
                values = [lb.value for lb in j.spec.labels.labels if lb.name == name]
                row.append(",".join(values) if values else "<none>")
            rows.append(row)
        out = render_table(headers, rows)
    ctx.stdout.write(out.encode())
    ctx.stdout.flush()


async def cmd_list(ctx: Context) -> None:
    async with ctx.client() as client:
        if not ctx.args.watch:
            _list_output(ctx, await list_selected(client, ctx.args.selector))
            return
        polled = PolledList(client, selector_of(ctx.args.selector), interval=ctx.args.interval,
                            on_change=lambda resp: _list_output(ctx, resp),
                            on_error=lambda err: ctx.log.warn("listing failed (will retry)",
                                                              err=str(err)))
        try:
            await polled.start()
        except ClientError as err:
            raise CommandError("failed to list journals", err=str(err)) from None
        try:
            await polled.run()
        finally:
            await polled.stop()
