"""The word-count consumer application: a real-time n-gram model (Gazette's
``examples/word-count``).

Run it with ``gazette consume --app examples.word_count.counter:Counter --wordcount.N 2`` (the
repository root on ``PYTHONPATH``). It serves the ``word_count.NGram`` gRPC service on the
consumer's port:

* ``Publish(text)``: tokenizes the text into n-grams and publishes a delta of 1 per n-gram,
  committed, to the ``word_count.NGramCount`` partitions (by n-gram, modulo), returning once
  every delta is appended.
* ``Query(prefix, shard)``: the counts of the n-grams starting with ``prefix``, from the shard
  the prefix maps to (or the one named): a process that is not that shard's primary proxies
  the request to the one that is, with the resolution's header attached.

Shards (``shard-NNN``, one per partition) sum deltas into ``RocksDBStore`` (key: the
n-gram; value: its count as a varint, as Gazette's), with hot standbys. Per transaction the
touched counts are read once, summed in memory (the shard's state, ``shard.state``: the
framework makes it per shard and drops it with the shard), and written in the store's write
batch with the checkpoint: each delta is counted exactly once.
"""

from __future__ import annotations

import logging
from typing import Any

from examples.word_count import word_count_pb2 as wc
from examples.word_count import word_count_pb2_grpc as wc_grpc
from examples.word_count.messages import DELTA_TYPE, NGramCount, WordCountError, ngrams
from gazette.client import AppendService, list_journals
from gazette.consumer import InitArgs, RocksDBStore, Shard, ShardPublisher, StatefulApplication
from gazette.message import Envelope, Publisher, modulo_mapping
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.recoverylog import Recorder

__all__ = ["Counter", "uvarint", "uvarint_decode"]

log = logging.getLogger("word_count")


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def uvarint_decode(b: bytes) -> int:
    n = shift = 0
    for byte in b:
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return n
        shift += 7
    raise WordCountError(f"truncated varint {b!r}")


Counts = dict[str, int]
"""A shard's state: the counts its current transaction touched (n-gram -> new count)."""


class Counter(wc_grpc.NGramServicer, StatefulApplication[RocksDBStore, NGramCount, Counts]):
    receive_acks = False  # transaction acknowledgements carry no n-gram: not handed over

    def __init__(self) -> None:
        self.n = 2
        self.args: InitArgs | None = None
        self._parts = pb.ListResponse()
        self._mapping = modulo_mapping(lambda m: m.pb.n_gram.encode(), lambda: self._parts)
        self._appends: AppendService | None = None
        self._publisher: Publisher[Any] | None = None

    # --- configuration ---------------------------------------------------------------------

    def add_flags(self, parser: Any) -> None:
        parser.add_argument("--wordcount.N", dest="wordcount_n", type=int, default=2,
                            help="Number of grams per n-gram")

    async def init_application(self, args: InitArgs) -> None:
        self.n = getattr(args.config, "wordcount_n", 2)
        if self.n < 1:
            raise WordCountError(f"--wordcount.N must be at least 1 (got {self.n})")
        self.args = args
        self._parts = await list_journals(args.journal_client, f"app.gazette.dev/message-type={DELTA_TYPE}")
        if not self._parts.journals:
            raise WordCountError(f"no journal is labelled app.gazette.dev/message-type={DELTA_TYPE}")
        # The service lives as long as the process: appends it queues are flushed per Publish.
        self._appends = AppendService(args.journal_client)
        self._publisher = Publisher(self._appends)
        args.add_service(wc.DESCRIPTOR.services_by_name["NGram"], self)

    # --- the application ---------------------------------------------------------------------

    def new_store(self, shard: Shard[Counts], recorder: Recorder | None) -> RocksDBStore:
        return RocksDBStore(recorder)

    def new_shard_state(self, shard: Shard[Counts], store: RocksDBStore) -> Counts:
        return {}

    def new_message(self, spec: pb.JournalSpec) -> type[NGramCount]:
        return NGramCount

    def consume_message(self, shard: Shard[Counts], store: RocksDBStore, env: Envelope[NGramCount],
                        publisher: ShardPublisher) -> None:
        m, counts = env.message, shard.state
        gram = m.pb.n_gram
        prior = counts.get(gram)
        if prior is None:
            raw = store.get(gram.encode())
            prior = uvarint_decode(raw) if raw else 0
        counts[gram] = prior + m.pb.count

    def finalize_txn(self, shard: Shard[Counts], store: RocksDBStore, publisher: ShardPublisher) -> None:
        counts = shard.state
        for gram, count in counts.items():
            store.put(gram.encode(), uvarint(count))
        counts.clear()

    # --- the NGram service ----------------------------------------------------------------------

    async def Publish(self, request: wc.PublishRequest, context: Any) -> wc.PublishResponse:  # noqa: N802
        assert self._publisher is not None and self._appends is not None
        # One framed write per partition; returns once those appends are acknowledged.
        handles = await self._publisher.publish_committed_many(
            self._mapping, [NGramCount(gram, 1) for gram in ngrams(request.text, self.n)])
        for handle in handles.values():
            await handle
        return wc.PublishResponse()

    async def Query(self, request: wc.QueryRequest, context: Any) -> wc.QueryResponse:  # noqa: N802
        assert self.args is not None
        shard = request.shard or self._shard_of(request.prefix)
        header = request.header if request.HasField("header") else None
        res = await self.args.resolver.resolve(shard, may_proxy=header is None, proxy_header=header)
        if res.status != pc.Status.OK:
            raise WordCountError(f"shard {shard}: {pc.Status.Name(res.status)}")  # type: ignore[arg-type]
        if res.shard is None:
            fwd = wc.QueryRequest()
            fwd.CopyFrom(request)
            fwd.shard = shard
            fwd.header.CopyFrom(res.header)
            stub = wc_grpc.NGramStub(self.args.channel(res.endpoint))  # type: ignore[no-untyped-call]
            resp: wc.QueryResponse = await stub.Query(fwd)
            return resp
        out = wc.QueryResponse()
        for key, value in res.store.items(request.prefix.encode()):
            out.grams.add(n_gram=key.decode(), count=uvarint_decode(value))
        return out

    def _shard_of(self, prefix: str) -> str:
        assert self.args is not None
        if not prefix:
            raise WordCountError("a query names a prefix or a shard")
        journal, _ = self._mapping(NGramCount(prefix))
        specs = self.args.resolver.shards_with_source(journal)
        if not specs:
            raise WordCountError(f"no shard reads {journal}")
        return specs[0].id
