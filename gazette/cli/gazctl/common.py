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

    def client(self) -> JournalClient:
        return JournalClient(self.address, zone=self.zone)

    def shard_client(self) -> ShardClient:
        return ShardClient(self.consumer_address)


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
