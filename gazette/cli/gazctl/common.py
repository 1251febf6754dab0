"""What every gazctl command shares: the ``Context`` it runs in, ``CommandError`` (a message
the user can act upon, printed as one line), label-selector parsing and listing.

Invariants: selectors use Gazette's grammar (``gazette.protocol.labels``); a failure the user
can act upon is a ``CommandError`` carrying log fields, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

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

C = TypeVar("C")
R = TypeVar("R")


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


# etcd refuses a transaction with more than --max-txn-ops (128 by default) comparisons or
# more than that many operations. A journal or shard change is one put or delete and at most
# one comparison (its expected revision), and an Apply adds none of its own: so 128 changes
# fit one transaction of a default etcd.
ETCD_DEFAULT_MAX_TXN_OPS = 128
DEFAULT_MAX_TXN_SIZE = ETCD_DEFAULT_MAX_TXN_OPS

# What --max-txn-size means, for the help of both applies.
APPLY_TRANSACTIONS_HELP = f"""\
Changes are applied in etcd transactions of at most --max-txn-size changes ({DEFAULT_MAX_TXN_SIZE}
by default, what a default etcd admits per transaction). Each transaction is atomic, but an
apply of more changes than that is not: its transactions are applied in order and the first
that fails stops the apply, leaving those before it applied (the error says how many
changes were). --max-txn-size 0 applies everything in one atomic transaction, which etcd
refuses beyond its --max-txn-ops (128 by default).
"""


def apply_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``journals apply`` and ``shards apply`` (Gazette's ApplyConfig)."""
    p.add_argument("--specs", default="-", help="Input specifications path to apply. "
                   "Use '-' for stdin")
    p.add_argument("--dry-run", action="store_true", help="Perform a dry-run of the apply")
    p.add_argument("--max-txn-size", type=int, default=DEFAULT_MAX_TXN_SIZE,
                   help="maximum number of specs to be processed within an apply "
                        f"transaction (default {DEFAULT_MAX_TXN_SIZE}, within etcd's default "
                        "limit of operations per transaction). Each transaction is atomic; "
                        "an apply of more specs is not (earlier transactions stay applied if "
                        "a later one fails). If 0, all changes are issued in a single "
                        "transaction")


# etcd's refusal of a transaction with more than its --max-txn-ops (default 128) operations.
ETCD_TXN_TOO_LARGE = "too many operations in txn request"


def apply_failed(what: str, err: Exception, count: int, applied: int = 0) -> CommandError:
    """The error of a failed ``journals apply`` or ``shards apply`` of ``count`` changes, of
    which the first ``applied`` were applied by earlier transactions (they stay applied); when
    etcd refused the transaction as too large, it says to split it with ``--max-txn-size``."""
    fields: dict[str, Any] = {"err": str(err)}
    if applied:
        fields["applied"] = (f"{applied} of {count} changes were applied by earlier "
                             "transactions and stay applied")
    if ETCD_TXN_TOO_LARGE in str(err):
        fields["hint"] = (f"{count} changes exceed etcd's limit of operations per transaction "
                          "(--max-txn-ops, 128 by default); apply them in several transactions "
                          f"with --max-txn-size (the default, {DEFAULT_MAX_TXN_SIZE}, fits a "
                          "default etcd; use a smaller one for an etcd with a lower limit)")
    return CommandError(f"failed to apply {what}", **fields)


class ApplyBatchError(GazetteError):
    """A batch of an apply failed; ``applied`` changes before it were applied."""

    def __init__(self, cause: Exception, applied: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.applied = applied


async def apply_in_transactions(changes: Sequence[C], max_txn_size: int,
                                send: Callable[[Sequence[C]], Awaitable[R]]) -> tuple[R, int]:
    """Sends ``changes`` in order, in transactions of at most ``max_txn_size`` (all in one
    when it is <= 0, one empty one when there are none); returns the last response and the
    number of transactions. The first failure raises ``ApplyBatchError`` with the count of
    changes applied before it (they stay applied: the apply is atomic per transaction only)."""
    size = max_txn_size if max_txn_size > 0 else max(len(changes), 1)
    resp: R | None = None
    txns = 0
    for start in range(0, max(len(changes), 1), size):
        try:
            resp = await send(changes[start:start + size])
        except Exception as err:
            raise ApplyBatchError(err, start) from err
        txns += 1
    assert resp is not None  # at least one transaction is sent
    return resp, txns


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
