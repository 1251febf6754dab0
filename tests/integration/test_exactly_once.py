"""Exactly-once, end to end: publishers -> AppendService -> a real broker -> read-committed readers.

Four ``application/x-ndjson`` journals, replicated on two brokers (the client routes appends to
each journal's primary, learnt from response headers). Concurrent producers publish through one
AppendService whose Append RPC loses requests and responses at random (a lost response has
committed: its retry writes the same bytes again, so journals hold duplicates):

* transactional producers: ``publish_uncommitted`` then the ACK intents, transaction after
  transaction (as a consumer does, the intents are "checkpointed" before being appended);
* crashing producers: some transactions are published and never acknowledged; the producer
  "restarts": it re-appends its last checkpointed intents (rolling back what it published
  since, in the journals those intents cover), and carries on as a new producer (a new
  ProducerID, so its pending messages in other journals stay uncommitted forever);
* an abandoning producer, which publishes uncommitted messages and never acknowledges them;
* a plain producer of ``publish_committed`` messages.

Four blocking read-committed readers (``ReadCommittedIter`` over ``RetryReader``, with small
sequencer rings so commits also replay ranges from the broker) run meanwhile, until each reads a
final committed sentinel. Each committed message must be read exactly once, and no message of
an abandoned or rolled-back transaction at all. The raw journals are checked to really hold
duplicates and the uncommitted messages, so the test cannot pass vacuously.

The soak variant runs four times as many transactions on three brokers and SIGKILLs the
primary of a journal meanwhile.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import pytest

from gazette.client import AppendService, JournalClient, TransportError
from gazette.client.append_service import send_append
from gazette.client.appender import Content
from gazette.message import (
    ACK_TXN,
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    Clock,
    JSONFraming,
    JSONMessage,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    get_flags,
    modulo_mapping,
)
from gazette.message.mapping import MappingFunc
from gazette.message.source import JournalSource
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.cluster import Cluster
from gazette.testing.eventually import eventually

JOURNALS = [f"exactly-once/part-{i:03d}" for i in range(4)]
TXNS = 8
TXN_SIZE = 30
DEADLINE = 60.0
PATIENCE = 30.0


class LossyAppends:
    """The real Append RPC, losing some requests (nothing commits) and some responses (it
    committed, but the service cannot know and retries)."""

    def __init__(self, client: JournalClient, seed: int) -> None:
        self.client = client
        self.rng = random.Random(seed)
        self.lost_requests = 0
        self.lost_responses = 0

    async def rpc(self, request: pb.AppendRequest, chunks: Iterable[Content]) -> pb.AppendResponse:
        roll = self.rng.random()
        if roll < 0.1:
            self.lost_requests += 1
            raise TransportError(grpc.StatusCode.UNAVAILABLE, "injected: request lost")
        resp = await send_append(self.client, request, chunks)
        if roll < 0.3:
            self.lost_responses += 1
            raise TransportError(grpc.StatusCode.UNAVAILABLE, "injected: response lost")
        return resp


async def create_journals(client: JournalClient) -> pb.ListResponse:
    changes = []
    for name in JOURNALS:
        spec = pb.JournalSpec(name=name, replication=2)
        spec.labels.labels.add(name=CONTENT_TYPE, value=CONTENT_TYPE_JSON_LINES)
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.SNAPPY
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 60
        changes.append(pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0))
    await client.apply(changes)
    selector = pb.LabelSelector()
    selector.include.labels.add(name="prefix", value="exactly-once/")
    listing = pb.ListResponse()

    async def assigned() -> bool:
        nonlocal listing
        listing = await client.list(selector)
        return len(listing.journals) == len(JOURNALS) and all(
            len(j.route.members) == 2 and j.route.primary >= 0 for j in listing.journals)

    await eventually(assigned, "every journal has a primary and a replica")
    return listing


def doc_key(msg: JSONMessage) -> bytes:
    key: str = msg.doc["key"]
    return key.encode()


class Scenario:
    """The producers, and which message ids must (and must not) be read committed."""

    def __init__(self, svc: AppendService, mapping: MappingFunc, seed: int,
                 txns: int = TXNS) -> None:
        self.svc = svc
        self.txns = txns
        self.committed_at_fault = -1  # len(committed) when a fault was injected
        self.mapping = mapping
        self.rng = random.Random(seed)
        self.committed: set[str] = set()
        self.uncommitted: set[str] = set()

    def message(self, ident: str) -> JSONMessage:
        return JSONMessage({"id": ident, "key": f"k{self.rng.randrange(1000)}"})

    async def write_intents(self, intents: Iterable[Any]) -> None:
        handles = [self.svc.append_nowait(i.journal, i.intent) for i in intents]
        for h in handles:
            await h  # Commit before the next transaction: producers interleave naturally.

    async def transactional(self, name: str) -> None:
        pub = Publisher(self.svc)
        for t in range(self.txns):
            ids = [f"{name}/{t}/{i}" for i in range(TXN_SIZE)]
            for ident in ids:
                await pub.publish_uncommitted(self.mapping, self.message(ident))
            intents = pub.build_ack_intents()
            self.committed.update(ids)
            await self.write_intents(intents)

    async def crashing(self, name: str) -> None:
        pub = Publisher(self.svc, clock=Clock.now())
        checkpoint: list[Any] = []
        for t in range(self.txns):
            ids = [f"{name}/{t}/{i}" for i in range(TXN_SIZE)]
            for ident in ids:
                await pub.publish_uncommitted(self.mapping, self.message(ident))
            if t % 3 == 1:
                # Crash before the checkpoint commits: these messages are abandoned. On
                # restart the last checkpoint's intents are written again (rolling back the
                # journals they cover), and a new producer carries on.
                self.uncommitted.update(ids)
                await self.write_intents(checkpoint)
                pub = Publisher(self.svc, clock=Clock.now())
                checkpoint = []
                continue
            checkpoint = pub.build_ack_intents()
            self.committed.update(ids)
            await self.write_intents(checkpoint)

    async def abandoning(self, name: str) -> None:
        pub = Publisher(self.svc)
        handle = None
        for i in range(2 * TXN_SIZE):
            ident = f"{name}/0/{i}"
            self.uncommitted.add(ident)
            handle = await pub.publish_uncommitted(self.mapping, self.message(ident))
        assert handle is not None
        await handle  # Written, and never acknowledged.

    async def outside(self, name: str) -> None:
        pub = Publisher(self.svc)
        for t in range(self.txns):
            handle = None
            for i in range(TXN_SIZE):
                ident = f"{name}/{t}/{i}"
                self.committed.add(ident)
                handle = await pub.publish_committed(self.mapping, self.message(ident))
            assert handle is not None
            await handle


async def read_committed(client: JournalClient, journal: str, ring_size: int) -> list[str]:
    """Ids of the committed messages of ``journal``, in order, up to the sentinel."""
    def replay(j: str, begin: int, end: int) -> JournalSource:
        return JournalSource(client, j, begin, end)

    source = JournalSource(client, journal, block=True)
    it = ReadCommittedIter(source, JSONFraming(), JSONMessage.from_json_many,
                           Sequencer(ring_size=ring_size), replay)
    ids: list[str] = []
    try:
        while True:
            for env in await it.next_batch():
                msg: JSONMessage = env.message
                if get_flags(msg.get_uuid()) == ACK_TXN:
                    continue
                if msg.get("sentinel"):
                    return ids
                ids.append(msg["id"])
    finally:
        await source.aclose()


async def read_raw(client: JournalClient, journal: str) -> list[str]:
    """Ids of every message of ``journal`` as written (read-uncommitted, to the head)."""
    it = ReadUncommittedIter(JournalSource(client, journal), JSONFraming(),
                             JSONMessage.from_json_many)
    return [env.message["id"] async for env in it if env.message.get("id")]


async def run_scenario(client: JournalClient, listing: pb.ListResponse, *, txns: int = TXNS,
                       fault: Callable[[Scenario], Awaitable[None]] | None = None) -> Scenario:
    """Runs the producers (and ``fault`` beside them) and the readers; checks exactly-once."""
    mapping = modulo_mapping(doc_key, lambda: listing)
    lossy = LossyAppends(client, seed=7)
    readers = [asyncio.create_task(read_committed(client, j, ring_size=8 + 24 * i))
               for i, j in enumerate(JOURNALS)]
    async with AppendService(client, rpc=lossy.rpc, backoff=lambda attempt: 0.01) as svc:
        s = Scenario(svc, mapping, seed=11, txns=txns)
        await asyncio.gather(
            s.transactional("txn-a"), s.transactional("txn-b"), s.crashing("crash"),
            s.abandoning("abandon"), s.outside("outside"), *([fault(s)] if fault else []))
        sentinel = Publisher(svc)
        for journal in JOURNALS:
            await sentinel.publish_committed(lambda msg, j=journal: (  # type: ignore[misc]
                j, CONTENT_TYPE_JSON_LINES), JSONMessage(sentinel=True))
    read = await asyncio.gather(*readers)

    # Each committed message read once, in exactly one journal; nothing uncommitted.
    counts = Counter(ident for ids in read for ident in ids)
    assert {i for i, n in counts.items() if n > 1} == set()
    assert set(counts) & s.uncommitted == set()
    assert set(counts) == s.committed
    # Per producer, messages were read in publish order within each journal.
    for ids in read:
        for producer in {i.split("/")[0] for i in ids}:
            seq = [tuple(int(x) for x in i.split("/")[1:]) for i in ids
                   if i.startswith(producer + "/")]
            assert seq == sorted(seq)

    # The journals do hold duplicates and the uncommitted messages: readers filtered them.
    raw = Counter([ident for j in JOURNALS for ident in await read_raw(client, j)])
    assert lossy.lost_responses > 0 and lossy.lost_requests > 0
    assert svc.retries >= lossy.lost_requests + lossy.lost_responses
    assert any(raw[i] > 1 for i in s.committed)
    assert s.uncommitted <= set(raw)
    return s


async def test_read_committed_sees_each_committed_message_exactly_once(cluster: Cluster) -> None:
    cluster.add_broker()
    cluster.add_broker()
    async with asyncio.timeout(DEADLINE), JournalClient(cluster.address) as client:
        await run_scenario(client, await create_journals(client))
    for b in cluster.brokers:
        assert "Traceback" not in b.log_text(), b.log_text()[-4000:]


@pytest.mark.soak
async def test_exactly_once_through_a_primary_killed_mid_run(cluster: Cluster) -> None:
    """As above, with three brokers (short leases) and the primary of a journal SIGKILLed
    while producers and readers run: appends in flight when it dies are retried elsewhere
    once the journal is reassigned, and readers resume through other brokers."""
    brokers = [cluster.add_broker(extra_args=("--etcd.lease", "2s")) for _ in range(3)]
    async with asyncio.timeout(4 * DEADLINE), JournalClient(brokers[0].address) as client:
        listing = await create_journals(client)
        primaries = {j.route.endpoints[j.route.primary] for j in listing.journals}
        # Not the client's default address: requests without a route fall back to it.
        victim = next((b for b in brokers[1:] if b.address in primaries), brokers[1])

        async def kill_mid_run(s: Scenario) -> None:
            async def far_enough() -> bool:
                return len(s.committed) >= 6 * TXN_SIZE

            await eventually(far_enough, "a few transactions committed")
            await asyncio.to_thread(victim.kill)
            s.committed_at_fault = len(s.committed)

        s = await run_scenario(client, listing, txns=4 * TXNS, fault=kill_mid_run)
        assert 0 <= s.committed_at_fault < len(s.committed)  # Killed mid-run, indeed.
