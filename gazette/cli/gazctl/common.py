"""What every gazctl command shares: the ``Context`` it runs in, ``CommandError`` (a message
the user can act upon, printed as one line), label-selector parsing and listing.

Invariants: selectors use Gazette's grammar (``gazette.protocol.labels``); a failure the user
can act upon is a ``CommandError`` carrying log fields, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import IO, Any

from gazette.auth import Authorizer
from gazette.cli.gazctl.output import (
    Log,
)
from gazette.client.errors import (
    ClientError,
)
from gazette.client.journal_client import JournalClient
from gazette.client.listing import parse_selector
from gazette.consumer.client import ShardClient
from gazette.errors import GazetteError
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.tls import ClientTLS


class CommandError(GazetteError):
    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields


@dataclass
class Context:
    args: argparse.Namespace
    log: Log
    address: str
    stdin: IO[bytes]
    stdout: IO[bytes]
    cache_size: int = 0
    zone: str = ""
    env: Any = field(default_factory=dict)
    consumer_address: str = "http://localhost:8080"
    broker_tls: ClientTLS | None = None
    broker_auth: Authorizer | None = None
    consumer_tls: ClientTLS | None = None
    consumer_auth: Authorizer | None = None

    def client(self) -> JournalClient:
        return JournalClient(self.address, zone=self.zone, tls=self.broker_tls, auth=self.broker_auth)

    def shard_client(self) -> ShardClient:
        return ShardClient(self.consumer_address, tls=self.consumer_tls, auth=self.consumer_auth)


def selector_of(text: str | None) -> pb.LabelSelector:
    try:
        return parse_selector(text or "")
    except GazetteError as err:
        raise CommandError("failed to parse label selector", err=str(err),
                           selector=text or "") from None


async def list_selected(client: JournalClient, selector: str | None,
                what: str = "failed to list journals") -> pb.ListResponse:
    sel = selector_of(selector)
    try:
        return await client.list(sel)
    except ClientError as err:
        raise CommandError(what, err=str(err), broker=client.address) from None


def suspended_fully(j: pb.ListResponse.Journal) -> bool:
    return j.spec.suspend.level == pb.JournalSpec.Suspend.FULL


def selector_only(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")


Command = tuple[str, str, Callable[[argparse.ArgumentParser], None],
                Callable[[Context], Coroutine[Any, Any, None]]]


def apply_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``journals apply`` and ``shards apply`` (Gazette's ApplyConfig)."""
    p.add_argument("--specs", default="-", help="Input specifications path to apply. "
                   "Use '-' for stdin")
    p.add_argument("--dry-run", action="store_true", help="Perform a dry-run of the apply")
    p.add_argument("--max-txn-size", type=int, default=0,
                   help="maximum number of specs to be processed within an apply "
                        "transaction. If 0, the default, all changes are issued in a single "
                        "transaction")


# etcd's refusal of a transaction with more than its --max-txn-ops (default 128) operations.
ETCD_TXN_TOO_LARGE = "too many operations in txn request"


def apply_failed(what: str, err: Exception, count: int) -> CommandError:
    """The error of a failed ``journals apply`` or ``shards apply`` of ``count`` changes; when
    etcd refused the transaction as too large, it says to split it with ``--max-txn-size``."""
    fields: dict[str, Any] = {"err": str(err)}
    if ETCD_TXN_TOO_LARGE in str(err):
        fields["hint"] = (f"{count} changes exceed etcd's limit of operations per transaction "
                          "(--max-txn-ops, 128 by default); apply them in several transactions "
                          "with --max-txn-size (e.g. --max-txn-size 50)")
    return CommandError(f"failed to apply {what}", **fields)


async def read_specs(ctx: Context) -> str:
    """The text of ``--specs`` (a path, or ``-`` for stdin)."""
    import asyncio
    from pathlib import Path

    path = ctx.args.specs
    try:
        data = ctx.stdin.read() if path == "-" else await asyncio.to_thread(Path(path).read_bytes)
    except OSError as err:
        raise CommandError("failed to read YAML input", err=str(err)) from None
    return data.decode()


def listing_flags(p: argparse.ArgumentParser) -> None:
    """The flags ``journals list`` and ``shards list`` share (Gazette's ListConfig)."""
    p.add_argument("-l", "--selector", default="", help="Label Selector query to filter on")
    p.add_argument("-o", "--format", default="table", choices=["table", "yaml", "json", "proto"],
                   help="Output format")
    p.add_argument("-L", "--label-columns", dest="labels", action="append", default=[],
                   help="Labels to present as columns, eg -L label-one -L label-two")
    p.add_argument("-p", "--primary", action="store_true", help="Show primary column")
    p.add_argument("-r", "--replicas", action="store_true", help="Show replicas column")
    p.add_argument("--rf", action="store_true", help="Show replication factor column")
