"""The allocator against a real etcd: members announce, the leader converges, members leave,
drain on exit, only the leader writes, and it solves in a child process it ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import cast

import aetcd
import pytest

from gazette.allocator import (
    AnnounceConflictError,
    Announcement,
    BatchedTxn,
    Round,
    State,
    TxnFailedError,
    allocate,
    announce,
    converge,
    journal_is_consistent,
    route_of,
    routes_equivalent,
    solve,
)
from gazette.allocator import allocator as allocator_module
from gazette.allocator.keys import items_key, members_key
from gazette.broker.keys import broker_decoder
from gazette.etcd import connect
from gazette.etcd.keyspace import KeySpace
from gazette.etcd.txn import Cmp, Put, commit
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.etcd import EtcdFixture
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.eventually import eventually

pytestmark = pytest.mark.timeout(60)

DEADLINE = 20.0


def broker_spec(zone: str, suffix: str, limit: int, exiting: bool = False) -> bytes:
    spec = pb.BrokerSpec(journal_limit=limit, exiting=exiting)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = f"http://{suffix}.test:8080"
    return spec.SerializeToString()


class Broker:
    """One member: announcement, watched keyspace, allocate loop, and a stand-in for the
    broker's replication, which advertises the route of each local assignment once "synced"."""

    def __init__(self, etcd: EtcdFixture, zone: str, suffix: str, limit: int, **allocate_args: float) -> None:
        self.etcd, self.zone, self.suffix, self.limit = etcd, zone, suffix, limit
        self.allocate_args = allocate_args  # e.g. solve_quiet, solve_max_delay
        self.key = members_key(etcd.prefix, zone, suffix)
        self.rounds: list[Round] = []
        self.client: aetcd.Client | None = None
        self.ks = KeySpace(etcd.prefix, broker_decoder(etcd.prefix))
        self.announcement: Announcement | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.allocate_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.client = await connect(self.etcd.endpoint)
        self.announcement = await announce(
            self.client, self.key, broker_spec(self.zone, self.suffix, self.limit), ttl=5
        )
        await self.ks.load(self.client)
        self.tasks = [
            asyncio.create_task(self.ks.watch(self.client)),
            asyncio.create_task(self.announcement.keep_alive()),
            asyncio.create_task(self._advertise_routes()),
        ]
        self.allocate_task = asyncio.create_task(
            allocate(self.client, self.ks, self.key, journal_is_consistent,
                     on_round=self.rounds.append, **self.allocate_args)  # type: ignore[arg-type]
        )

    async def _advertise_routes(self) -> None:
        assert self.client is not None
        while True:
            signal = self.ks.update_signal()
            state = State.from_keyspace(self.ks, self.key, journal_is_consistent)
            for local in state.local_items:
                route = route_of(local.assignments)
                mine = local.assignment
                if not routes_equivalent(route, cast(pb.Route | None, mine.decoded.value)):
                    await commit(
                        self.client,
                        [Cmp(mine.key, "mod", mine.mod_revision)],
                        [Put(mine.key, route.SerializeToString(), mine.lease)],
                    )
            await signal.wait()

    async def set_exiting(self) -> None:
        assert self.announcement is not None
        await self.announcement.update(broker_spec(self.zone, self.suffix, self.limit, True))

    async def set_limit(self, limit: int) -> None:
        assert self.announcement is not None
        self.limit = limit
        await self.announcement.update(broker_spec(self.zone, self.suffix, limit))

    async def stop(self, revoke: bool = True) -> None:
        for task in [*self.tasks, *([self.allocate_task] if self.allocate_task else [])]:
            task.cancel()
        await asyncio.gather(*self.tasks, *([self.allocate_task] if self.allocate_task else []),
                             return_exceptions=True)
        self.tasks, self.allocate_task = [], None
        if self.client is not None:
            if revoke and self.announcement is not None:
                await self.announcement.revoke()
            await self.client.close()
            self.client = None


@contextlib.asynccontextmanager
async def cluster(etcd: EtcdFixture, members: list[tuple[str, str, int]]) -> AsyncIterator[
    dict[str, Broker]
]:
    brokers: dict[str, Broker] = {}
    try:
        for zone, suffix, limit in members:
            brokers[suffix] = Broker(etcd, zone, suffix, limit)
            await brokers[suffix].start()
        yield brokers
    finally:
        for b in brokers.values():
            await b.stop()


async def put_journal(client: aetcd.Client, root: str, name: str, replication: int) -> None:
    spec = pb.JournalSpec(name=name, replication=replication)
    await client.put(items_key(root, name).encode(), spec.SerializeToString())


async def put_revision(etcd: EtcdFixture, name: str) -> int:
    """Puts journal ``name`` (replication 1); the etcd revision of the put."""
    await put_journal(etcd.client, etcd.prefix, name, 1)
    got = await etcd.client.get(items_key(etcd.prefix, name).encode())
    assert got is not None
    return int(got.mod_revision)


async def keyspace_until(ks: KeySpace, cond: Callable[[State], bool], what: str) -> State:
    """Waits (bounded) until `cond` holds for the keyspace's state."""
    async with asyncio.timeout(DEADLINE):
        while True:
            signal = ks.update_signal()
            state = State.from_keyspace(ks, "", journal_is_consistent)
            if cond(state):
                return state
            try:
                await signal.wait()
            except TimeoutError:
                raise AssertionError(f"timed out waiting until {what}") from None


def converged(want: dict[str, int]) -> Callable[[State], bool]:
    """Every journal has its replicas, all consistent, a primary, and two zones if r >= 2."""

    def check(state: State) -> bool:
        zones = {m.decoded.zone for m in state.members if not m.decoded.exiting}
        for it in state.items:
            asn = state.assignments_of.get(it.decoded.name, [])
            if len(asn) != want[it.decoded.name]:
                return False
            if not asn or not journal_is_consistent(it, asn[0], asn):
                return False
            if sorted(a.decoded.slot for a in asn) != list(range(len(asn))):
                return False
            if len(asn) >= 2 and len(zones) >= 2 and len({a.decoded.zone for a in asn}) < 2:
                return False
        return len(state.items) == len(want)

    return check


@contextlib.asynccontextmanager
async def observer(etcd: EtcdFixture) -> AsyncIterator[KeySpace]:
    ks = KeySpace(etcd.prefix, broker_decoder(etcd.prefix))
    await ks.load(etcd.client)
    task = asyncio.create_task(ks.watch(etcd.client))
    try:
        yield ks
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


JOURNALS = {"j1": 1, "j2": 2, "j3": 3, "j4": 2, "j5": 1}


async def test_converge_leave_and_drain(etcd: EtcdFixture) -> None:
    members = [("z1", "a", 10), ("z1", "b", 10), ("z2", "c", 10)]
    async with observer(etcd) as ks, cluster(etcd, members) as brokers:
        for name, r in JOURNALS.items():
            await put_journal(etcd.client, etcd.prefix, name, r)
        state = await keyspace_until(ks, converged(JOURNALS), "journals are assigned")
        per_member = Counter(a.decoded.suffix for a in state.assignments)
        assert sum(per_member.values()) == 9 and max(per_member.values()) <= 4

        # Only the leader (the first member announced) ran rounds.
        assert brokers["a"].rounds and not brokers["b"].rounds and not brokers["c"].rounds

        # A fourth member joins in z2, and b is set exiting: b drains to zero assignments
        # (three members at full capacity remain for j3) and its allocate loop returns.
        d = Broker(etcd, "z2", "d", 10)
        brokers["d"] = d
        await d.start()
        await brokers["b"].set_exiting()
        assert brokers["b"].allocate_task is not None
        async with asyncio.timeout(DEADLINE):
            await brokers["b"].allocate_task
        state = await keyspace_until(
            ks,
            lambda s: converged(JOURNALS)(s)
            and all(a.decoded.suffix != "b" for a in s.assignments),
            "b is drained",
        )
        assert {a.decoded.suffix for a in state.assignments} == {"a", "c", "d"}
        await brokers["b"].stop()

        # c leaves (its lease is revoked): its journals are reassigned to a and d.
        await brokers["c"].stop()
        want = {**JOURNALS, "j3": 2}  # Two members left: j3 can have only two replicas.
        state = await keyspace_until(
            ks,
            lambda s: converged(want)(s) and all(a.decoded.suffix != "c" for a in s.assignments),
            "c's journals are reassigned",
        )
        assert [m.decoded.suffix for m in state.members] == ["a", "d"]


async def test_a_leader_waiting_for_its_solve_runs_no_rounds_until_it_is_due(etcd: EtcdFixture) -> None:
    """While a burst of item changes waits for its debounced solve, and the leader's last round
    wrote nothing, it runs no rounds (each linear in all the items) per revision; a member
    change ends the rest at once, and the items are then solved and assigned."""
    async with observer(etcd) as ks:
        leader = Broker(etcd, "z1", "a", 100, solve_quiet=30.0, solve_max_delay=30.0)
        try:
            await put_journal(etcd.client, etcd.prefix, "j0", 1)
            await leader.start()  # its first round solves at once
            await keyspace_until(ks, converged({"j0": 1}), "j0 is assigned")
            # j1 comes within `quiet` of that solve: it waits, and the round it causes
            # converges towards the previous solution, writing nothing.
            rev = await put_revision(etcd, "j1")
            # Rounds are recorded by the allocate task, not signalled by the keyspace: polled.
            await eventually(lambda: any(r.revision >= rev and r.idle for r in leader.rounds),
                             "an idle round at j1's revision", DEADLINE)
            rested = len(leader.rounds)
            # More items, each a revision of its own, paced past the round catch-up
            # (ROUND_QUIET) so that a leader without rest would round on each.
            for i in range(2, 8):
                await asyncio.sleep(0.1)  # pacing the workload, not waiting on a condition
                last = await put_revision(etcd, f"j{i}")
            await leader.set_limit(101)  # a member change: a solve is due at once
            want = {f"j{i}": 1 for i in range(8)}
            await keyspace_until(ks, converged(want), "the burst is solved and assigned")
            during = [r for r in leader.rounds[rested:] if r.revision <= last]
            assert during == [], f"rounds while resting: {during}"
        finally:
            await leader.stop()


async def test_leader_failover(etcd: EtcdFixture) -> None:
    members = [("z1", "a", 10), ("z2", "b", 10), ("z2", "c", 10)]
    async with observer(etcd) as ks, cluster(etcd, members) as brokers:
        for name, r in JOURNALS.items():
            await put_journal(etcd.client, etcd.prefix, name, r)
        await keyspace_until(ks, converged(JOURNALS), "journals are assigned")
        assert not brokers["b"].rounds and not brokers["c"].rounds

        # The leader goes away; b (next oldest) takes over and repairs a's replicas.
        await brokers["a"].stop()
        await put_journal(etcd.client, etcd.prefix, "j6", 2)
        want = {**JOURNALS, "j6": 2, "j3": 2}  # Two members left: j3 can have only two.
        state = await keyspace_until(ks, converged(want), "b repairs the allocation")
        assert brokers["b"].rounds and not brokers["c"].rounds
        assert {a.decoded.suffix for a in state.assignments} == {"b", "c"}


async def test_announce_conflict(etcd: EtcdFixture) -> None:
    key = members_key(etcd.prefix, "z1", "a")
    first = await announce(etcd.client, key, broker_spec("z1", "a", 1), ttl=5)
    try:
        with pytest.raises(AnnounceConflictError, match="already held"):
            await announce(etcd.client, key, broker_spec("z1", "a", 1), ttl=5)
        await first.update(broker_spec("z1", "a", 0, exiting=True))
        got = await etcd.client.get(key.encode())
        assert pb.BrokerSpec.FromString(got.value).exiting
        assert got.lease == first.lease_id  # The update kept the lease.
    finally:
        await first.revoke()
    assert await etcd.client.get(key.encode()) is None


async def test_announce_waits_longer_than_its_own_ttl(etcd: EtcdFixture) -> None:
    # A restarted process finds its old key held until the old lease lapses (here: 4 s, twice
    # the waiter's 2 s TTL); the waiter's own lease must still be alive when it takes the key.
    key = members_key(etcd.prefix, "z1", "b")
    old = await etcd.client.lease(4)
    await etcd.client.put(key.encode(), broker_spec("z1", "b", 1), lease=old)
    ann = await announce(etcd.client, key, broker_spec("z1", "b", 1), ttl=2, conflict_timeout=30,
                         retry_interval=0.5)
    try:
        reply = await etcd.client.refresh_lease(ann.lease_id)
        assert reply is not None and reply.TTL > 0
        got = await etcd.client.get(key.encode())
        assert got is not None and got.lease == ann.lease_id
    finally:
        await ann.revoke()


async def test_deposed_leader_cannot_write(etcd: EtcdFixture) -> None:
    # Two allocators race: a's view is stale (its member key has since gone, so b leads).
    # Every one of a's transactions re-checks a's member key, so nothing of a's applies.
    a = await announce(etcd.client, members_key(etcd.prefix, "z1", "a"),
                       broker_spec("z1", "a", 10), ttl=5)
    b = await announce(etcd.client, members_key(etcd.prefix, "z2", "b"),
                       broker_spec("z2", "b", 10), ttl=5)
    try:
        await put_journal(etcd.client, etcd.prefix, "j1", 2)
        stale = KeySpace(etcd.prefix, broker_decoder(etcd.prefix))
        await stale.load(etcd.client)
        state = State.from_keyspace(stale, a.key, journal_is_consistent)
        assert state.is_leader
        await a.revoke()
        member = state.local_member
        assert member is not None
        txn = BatchedTxn(etcd.client, [Cmp(member.key, "mod", member.mod_revision)])
        with pytest.raises(TxnFailedError):
            await converge(txn, state, solve(state))
            await txn.flush()
        assert txn.revision == 0
        got = await etcd.client.get_prefix(f"{etcd.prefix}/assign/".encode())
        assert list(got) == []
    finally:
        await b.revoke()


async def test_keep_alive_survives_an_etcd_restart(etcd_fresh: EtcdProcess) -> None:
    # A restarted etcd restores its leases: a member must ride out the outage, not exit.
    client = await connect(etcd_fresh.endpoint)
    try:
        key = members_key("/keep-alive", "z1", "c")
        async with await announce(client, key, broker_spec("z1", "c", 1), ttl=3) as ann:
            await etcd_fresh.astop()
            await asyncio.sleep(1.5)  # an outage of half the TTL: the fault itself
            await etcd_fresh.astart()
            for _ in range(100):  # the keep-alive is still running once etcd answers again
                with contextlib.suppress(aetcd.exceptions.ConnectionFailedError,
                                         aetcd.exceptions.ConnectionTimeoutError):
                    reply = await client.refresh_lease(ann.lease_id)
                    if reply is not None and reply.TTL > 0:
                        break
                await asyncio.sleep(0.1)  # polling the restarted server
            assert ann._keep_alive is not None and not ann._keep_alive.done()  # noqa: SLF001
            got = await client.get(key.encode())
            assert got is not None and got.lease == ann.lease_id
    finally:
        await client.close()


def solver_children() -> set[int]:
    """Our child processes running the allocator's solver (see `solve_process`)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # exited meanwhile
        if ppid == os.getpid() and b"gazette.allocator.solve_process" in cmdline:
            out.add(int(entry))
    return out


async def test_leader_solves_in_a_child_process_it_ends(
    etcd: EtcdFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allocator_module, "SOLVE_IN_PROCESS_ITEMS", 1)  # every solve in the child
    assert not solver_children()
    members = [("z1", "a", 10), ("z2", "b", 10), ("z2", "c", 10)]
    async with observer(etcd) as ks, cluster(etcd, members) as brokers:
        for name, r in JOURNALS.items():
            await put_journal(etcd.client, etcd.prefix, name, r)
        await keyspace_until(ks, converged(JOURNALS), "journals are assigned")
        first = solver_children()
        assert len(first) == 1  # the leader's, and only the leader's

        await brokers["a"].stop()  # its allocate is cancelled: its child is killed and reaped
        assert not solver_children() & first
        await put_journal(etcd.client, etcd.prefix, "j6", 2)
        want = {**JOURNALS, "j6": 2, "j3": 2}
        await keyspace_until(ks, converged(want), "b takes over, solving in its own child")
        assert len(solver_children() - first) == 1
    assert not solver_children()
