"""A test harness for consumer applications (Gazette's ``consumertest``): a real etcd, a real
broker and in-process consumer processes running an ``Application``, with its journal and
shard specs applied and every shard primary and serving before the test body runs.

An app's test is a few lines::

    async def test_counts(gazette_consumer):
        async with gazette_consumer(MyApp(), journals=JOURNALS, shards=SHARDS) as h:
            await h.publish("in/part-000", {"key": "a"}, {"key": "a"})
            await h.read_through()          # every shard processed all that was appended
            assert h.app.counts["a"] == 2

The ``gazette_consumer`` fixture comes with the ``gazette.testing.pytest_plugin`` (registered
as a pytest plugin when gazette is installed); without pytest, use ``ConsumerHarness`` directly.

Invariants: ``__aenter__`` returns only once every shard of ``shards`` is primary with its
store restored; ``read_through`` returns only once a completed transaction of each shard read
through each source journal's write head as of the call (read-your-writes, via ``Stat``);
``__aexit__`` drains the processes and removes the brokers and the etcd prefix.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from gazette.allocator.keys import items_key, members_prefix
from gazette.client import AppendService, JournalClient, append, write_head
from gazette.consumer.client import ShardClient
from gazette.consumer.interfaces import Application
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.consumer.shard import ShardRuntime
from gazette.consumer.shardspace import apply_request as shard_apply_request
from gazette.journalspace import apply_request as journal_apply_request
from gazette.protocol import consumer_pb2 as pc
from gazette.tasks import wait_first
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import start_test_etcd, unique_prefix
from gazette.testing.etcd_process import EtcdProcess

__all__ = ["ConsumerHarness"]


class ConsumerHarness:
    """See the module docstring. ``etcd_url`` reuses a running etcd (else one is started);
    ``processes`` consumer processes share the shards (each takes ``limit`` at most);
    ``app_args`` are parsed with the consumer's flags and the app's own (``add_flags``)."""

    def __init__(self, app: Application[Any, Any, Any], *, journals: str, shards: str, etcd_url: str | None = None,
                 processes: int = 1, root: Path | None = None, limit: int = 64,
                 timeout: float = 60.0, app_args: Sequence[str] = ()) -> None:
        self.app = app
        self.app_args = list(app_args)
        self.journals_yaml, self.shards_yaml = journals, shards
        self.timeout = timeout
        self._etcd_url = etcd_url
        self._etcd: EtcdProcess | None = None
        self._n, self._limit = processes, limit
        self._root_tmp = None if root is not None else tempfile.TemporaryDirectory(prefix="gazette-harness-")
        self.root = root or Path(self._root_tmp.name)  # type: ignore[union-attr]
        self.cluster: Cluster | None = None
        self.processes: list[ConsumerProcess] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.client: JournalClient | None = None
        self._service: AppendService | None = None
        self.shard_ids: list[str] = []
        self.shards: ShardClient | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> ConsumerHarness:
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _start(self) -> None:
        if self._etcd_url is None:
            self._etcd = await asyncio.to_thread(start_test_etcd)
            self._etcd_url = self._etcd.url
        self.cluster = Cluster(self._etcd_url, unique_prefix("/gazette-harness/brokers"), self.root / "cluster")
        await asyncio.to_thread(self.cluster.add_broker, "local")
        self.client = JournalClient(self.cluster.address)
        self._service = AppendService(self.client)
        for doc in self.journals_yaml.split("\n---\n"):  # one or more YAML documents
            if doc.strip():
                await self.client.apply(journal_apply_request(doc))
        prefix = unique_prefix("/gazette-harness/consumers")
        from gazette.consumer.run import consumer_parser

        args = consumer_parser(self.app, "consumer-harness").parse_args(self.app_args)  # the app's flags
        for i in range(self._n):
            proc = ConsumerProcess(ConsumerConfig(
                port=0, suffix=f"harness-{i}", limit=self._limit, broker_address=self.cluster.address,
                etcd_address=self.cluster.etcd_url, etcd_prefix=prefix, etcd_lease=5, args=args), self.app)
            self.processes.append(proc)
            self._tasks.append(asyncio.create_task(proc.run(), name=f"consumer harness-{i}"))
        async with asyncio.timeout(self.timeout):
            for proc in self.processes:
                await _first(proc.ready.wait(), self._tasks)
            # Every process sees every member before shards exist, so the first assignment is
            # already balanced (no shard moves right after the harness reports it serving).
            while any(len(p.keyspace.prefixed(members_prefix(p.keyspace.root))) < self._n
                      for p in self.processes):
                await _first(wait_first(*(p.keyspace.wait_for_update() for p in self.processes)),
                             self._tasks)
        self.shards = ShardClient(self.processes[0].endpoint)
        req = shard_apply_request(self.shards_yaml)
        self.shard_ids = [ch.upsert.id for ch in req.changes if ch.HasField("upsert")]
        if req.changes:
            await self.shards.apply(req)
        await self.wait_serving()

    async def wait_serving(self) -> None:
        """Returns once every shard is primary somewhere with its store restored."""
        async with asyncio.timeout(self.timeout):
            for sid in self.shard_ids:
                while self.runtime(sid) is None:
                    started = [e for p in self.processes if (e := p.shards.get(sid)) is not None
                               and not e[1].done()]
                    if started:  # primary here: wait for its store to restore (or it to end)
                        await _first(wait_first(started[0][0].ready.wait(), started[0][1]), self._tasks)
                    else:  # not assigned yet: wait for the processes to follow the keyspace
                        await _first(wait_first(*(p.wait_reconciled() for p in self.processes)), self._tasks)

    async def aclose(self) -> None:
        for proc in self.processes:
            proc.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shards is not None:
            await self.shards.close()
        if self._service is not None:
            await self._service.close()
        if self.client is not None:
            await self.client.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.close)
        if self._etcd is not None:
            await asyncio.to_thread(self._etcd.close)
        if self._root_tmp is not None:
            self._root_tmp.cleanup()

    # -- helpers -------------------------------------------------------------------------

    def runtime(self, shard_id: str) -> ShardRuntime[Any] | None:
        """The shard's running primary (None while it is not serving)."""
        for proc in self.processes:
            entry = proc.shards.get(shard_id)
            if entry is not None and entry[0].ready.is_set() and not entry[1].done():
                return entry[0]
        return None

    def store(self, shard_id: str) -> Any:
        rt = self.runtime(shard_id)
        return rt.store if rt is not None else None

    async def publish(self, journal: str, *docs: Mapping[str, Any], content_type: str = "application/x-ndjson") -> None:
        """Publishes ``docs`` as committed JSON messages to ``journal`` (appended when it returns)."""
        from gazette.message import JSONMessage, Publisher

        assert self._service is not None
        pub = Publisher(self._service)
        for doc in docs:
            await pub.publish_committed(lambda m: (journal, content_type), JSONMessage(**doc))
        await self._service.flush()

    async def append_lines(self, journal: str, docs: Sequence[Mapping[str, Any]]) -> None:
        """Appends raw JSON lines (no UUIDs: each is delivered as its own committed message)."""
        assert self.client is not None
        await append(self.client, journal, "".join(json.dumps(d) + "\n" for d in docs).encode())

    async def read_through(self, shard_ids: Sequence[str] | None = None) -> None:
        """Returns once each shard completed a transaction reading through its sources'
        current write heads (what was appended before this call has been processed)."""
        assert self.client is not None and self.shards is not None
        for sid in shard_ids or self.shard_ids:
            ks = self.processes[0].keyspace  # the spec, even while the shard moves between processes
            item = ks.search(items_key(ks.root, sid))
            if item is None or not isinstance(item.value, pc.ShardSpec):
                raise LookupError(f"shard {sid!r} does not exist")
            journals = [s.journal for s in item.value.sources]
            heads = {j: await write_head(self.client, j) for j in journals}
            async with asyncio.timeout(self.timeout):
                await self.shards.stat(sid, read_through={j: h for j, h in heads.items() if h})


async def _first(waiter: Any, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Awaits ``waiter``, failing at once if a consumer process task ended meanwhile."""
    fut = asyncio.ensure_future(waiter)
    try:
        await asyncio.wait({fut, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t.done():
                t.result()  # raises the process's error
                raise RuntimeError("a consumer process of the harness stopped")
        await fut
    finally:
        fut.cancel()
