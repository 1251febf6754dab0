"""The Append RPC: atomic, serialized, replicated appends through a journal's primary.

Each append runs Gazette's append state machine (broker/append_fsm.go):

    RESOLVE → ACQUIRE_PIPELINE → START_PIPELINE → [SEND_SYNC ⇄ RECV_SYNC] → UPDATE_ASSIGNMENTS
      → AWAIT_DESIRED_REPLICAS → VALIDATE_PRECONDITIONS → (UPDATE_SUSPEND) → stream content
      → commit (or roll back) → read acknowledgements, in turn
    (or PROXY to the primary, or a refusal Status)

* RESOLVE reads through any etcd revision the request (or an earlier step) names, and
  resolves the journal; a broker that is not primary proxies (AWAIT_DESIRED_REPLICAS first).
* ACQUIRE_PIPELINE first reads the client's stream ahead (``readahead.ReadAhead``: until its
  commit or ``READ_AHEAD`` bytes, under the min-rate policy), then queues for the replica's
  send side (``send_lock``): a stalled client is aborted before it queues, so it never holds
  healthy appends behind it. START_PIPELINE keeps the
  current pipeline if it serves the resolved route and is unbroken, else retires it and
  builds one over the spool (``spool_lock``) with a Replicate stream to each peer.
* A new pipeline is synchronised: the spool's fragment is proposed to every peer; a peer
  holding a greater offset (or an empty fragment it cannot extend ours from) makes every
  member roll to an empty fragment at the largest offset seen, taking that peer's
  registers; a peer knowing a different route at a later revision sends us back to
  RESOLVE through that revision. Only then is the route advertised as consistent in the
  assignments' values (UPDATE_ASSIGNMENTS), which is what lets the allocator move
  replicas. Before advertising a route of several members, spools closed by the
  synchronisation are persisted, so whichever member becomes primary next finds them.
* VALIDATE_PRECONDITIONS: registers, suspension, the expected offset, and
  INDEX_HAS_GREATER_OFFSET when the stores hold content beyond the synchronised spool
  (an explicit ``offset`` equal to the index's end, as ``gazctl journals reset-head`` sends,
  re-synchronises the pipeline there instead). With a route of one member only, a spool
  that never held content starts after what the stores hold (there is no peer to ask).
* Content chunks are scattered to the peers and the local spool as they arrive; the
  client's empty chunk and end of stream commit with ``spool.next()`` (and the updated
  registers); any other ending rolls the pending content back everywhere.
* The commit or rollback is the append's last send: it then takes the pipeline's read
  barrier, releases the send side (the next append may stream at once), and reads its
  acknowledgements when its turn comes. So a commit costs one round trip and appends are
  pipelined. That last phase runs shielded from the caller's cancellation, so responses
  on the streams are always read by their owner.
* A failed peer fails the append (UNAVAILABLE at the RPC edge): the pipeline is marked
  broken, and the next append (or pulse) tears it down and builds a new one. A commit that
  some replicas applied before the failure stays in their spools and is kept by the next
  synchronisation (Gazette's at-least-once edge); a failure before the commit rolls back
  everywhere. A journal offset is never assigned twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple

from gazette import auth
from gazette.allocator import desired_replication
from gazette.auth import Claims, token_of
from gazette.broker import metrics
from gazette.broker.context import BrokerContext
from gazette.broker.flow import AppendFlowControl, flow_controlled, min_rate_policed
from gazette.broker.pipeline import Pipeline, ReplicationError
from gazette.broker.readahead import ReadAhead
from gazette.broker.replica import Replica, acquire_unless, wait_unless
from gazette.broker.spool import EMPTY_SHA1
from gazette.broker.wire import AppendChunk, ContentChunk, put_varint, validated
from gazette.errors import GazetteError
from gazette.fragment import Fragment, set_sum
from gazette.protocol import labels, validate
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.specs import may_write
from gazette.server.edge import end_rpc

if TYPE_CHECKING:
    from gazette.broker.resolver import Resolution

log = logging.getLogger(__name__)

MAX_SYNC_ROUNDS = 16
"""Synchronisation rounds of one pipeline before giving up (each round rolls forward)."""
DEFAULT_FLUSH_INTERVAL = 24 * 3600
"""Seconds: a journal's index counts as clean once all of it was remote this long."""


class AppendStreamError(GazetteError):
    """The client's request stream broke the Append protocol."""

    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"
    http_status: ClassVar[int] = 400


def maybe_roll(cur: Fragment, first_append: float | None, roll_to: int,
               spec: pb.JournalSpec.Fragment, now: float) -> Fragment:
    """The fragment the next append extends: the current one, or an empty one at its end.

    Rolls when the spool is empty (trivially, to pick up the spec's codec), longer than the
    spec's fragment length, asked to move to ``roll_to``, or begun in an earlier flush interval.
    """
    return _maybe_roll(cur, first_append, roll_to, spec.length, spec.flush_interval.seconds,
                       spec.compression_codec, now)


def _maybe_roll(cur: Fragment, first_append: float | None, roll_to: int, max_length: int,
                interval: int, codec: int, now: float) -> Fragment:
    length = cur.content_length
    flush = length == 0 or length > max_length or (roll_to != 0 and roll_to != cur.begin)
    if interval > 0 and first_append is not None and int(first_append) // interval != int(now) // interval:
        flush = True
    if not flush:
        return cur
    end = cur.end
    if roll_to != 0:
        assert end <= roll_to, "invalid roll_to offset"
        end = roll_to
    return Fragment(cur.journal, end, end, codec=codec)  # type: ignore[arg-type]  # a codec's value


class AppendPlan:
    """What an append reads of its journal's spec, read from the protobuf once per resolution
    (each read of a protobuf field builds or looks up a wrapper object; these are plain
    attributes). Never changes: a new spec is a new keyspace revision, a new resolution."""

    def __init__(self, spec: pb.JournalSpec) -> None:
        frag = spec.fragment
        self.writable = may_write(spec)
        self.desired_replication = desired_replication(spec)
        self.has_stores = len(frag.stores) > 0
        self.fragment_length = int(frag.length)
        self.flush_interval = int(frag.flush_interval.seconds)  # 0: none
        self.codec = int(frag.compression_codec)
        self.suspend_level = int(spec.suspend.level)
        self.suspend_offset = int(spec.suspend.offset)
        self.max_append_rate = int(spec.max_append_rate)
        self._header_field = b""  # the resolution's header as a response's field 2, once needed

    def header_field(self, header: pb.Header) -> bytes:
        """:func:`header_field` of the resolution's ``header``, serialized at its first use."""
        if not self._header_field:
            self._header_field = header_field(header)
        return self._header_field


def append_plan(res: Resolution) -> AppendPlan:
    """The plan of ``res`` (whose spec is known), made at its first append."""
    plan = res.append_plan
    if isinstance(plan, AppendPlan):
        return plan
    assert res.spec is not None
    made = AppendPlan(res.spec)
    res.append_plan = made
    return made


def registers_match(selector: pb.LabelSelector, registers: pb.LabelSet) -> bool:
    """Whether ``registers`` match ``selector``; remembered per pair of encodings, since a
    fenced writer checks the same selector against the same registers on every append."""
    key = (selector.SerializeToString(), registers.SerializeToString())
    hit = _REGISTER_MATCHES.get(key)
    if hit is None:
        hit = labels.LabelSelector.from_proto(selector).matches(labels.LabelSet.from_proto(registers))
        if len(_REGISTER_MATCHES) >= 4096:
            _REGISTER_MATCHES.clear()
        _REGISTER_MATCHES[key] = hit
    return hit


_REGISTER_MATCHES: dict[tuple[bytes, bytes], bool] = {}


def _response(status: int, header: pb.Header) -> pb.AppendResponse:
    return pb.AppendResponse(status=status, header=header)  # type: ignore[arg-type]  # copies header


def _int64(n: int) -> int:
    """An int64 field's varint value: a negative one as its two's complement (ten bytes)."""
    return n if n >= 0 else n + (1 << 64)


def _len_field(tag: int, body: bytes) -> bytes:
    out = bytearray((tag,))
    put_varint(out, len(body))
    out += body
    return bytes(out)


def header_field(header: pb.Header) -> bytes:
    """``AppendResponse.header`` (field 2) as it is serialized, for :func:`encode_committed`."""
    return _len_field(0x12, header.SerializeToString())


def encode_committed(header: bytes, journal: str, begin: int, end: int, digest: bytes, codec: int,
                     registers: bytes, chunks: int) -> bytes:
    """The serialized ``AppendResponse`` of a committed append (status OK), byte for byte what
    protobuf serializes of the message ``AppendFSM.stream`` would otherwise build: ``header``
    is :func:`header_field`'s, ``registers`` a serialized ``LabelSet`` (always present, as
    the message sets it), ``digest`` the content's 20-byte SHA-1. The one response of every
    append, built without a message, a copy of the header, or a serialization: the commit's
    fragment into one buffer, then the response into another."""
    frag = bytearray()
    name = journal.encode()
    if name:
        frag.append(0x0A)
        put_varint(frag, len(name))
        frag += name
    if begin:
        frag.append(0x10)
        put_varint(frag, _int64(begin))
    if end:
        frag.append(0x18)
        put_varint(frag, _int64(end))
    # SHA1Sum: fixed64, fixed64, fixed32 of the digest read big-endian, each written
    # little-endian on the wire (so byte-reversed); zero parts are omitted, as proto3 does.
    # Its length (at most 23) is one varint byte.
    a, b, c = digest[7::-1], digest[15:7:-1], digest[19:15:-1]
    sum_len = (9 if a != _ZERO8 else 0) + (9 if b != _ZERO8 else 0) + (5 if c != _ZERO4 else 0)
    frag.append(0x22)
    frag.append(sum_len)
    if a != _ZERO8:
        frag.append(0x09)
        frag += a
    if b != _ZERO8:
        frag.append(0x11)
        frag += b
    if c != _ZERO4:
        frag.append(0x1D)
        frag += c
    if codec:
        frag.append(0x28)
        put_varint(frag, codec)
    out = bytearray(header)
    out.append(0x1A)
    put_varint(out, len(frag))
    out += frag
    out.append(0x22)
    put_varint(out, len(registers))
    out += registers
    if chunks:
        out.append(0x28)
        put_varint(out, chunks)
    return bytes(out)


_ZERO8 = bytes(8)
_ZERO4 = bytes(4)


# Enum values read on every append: a nested protobuf enum is a metaclass attribute lookup
# each time it is named, a module constant is not.
_SUSPEND_RESUME: Final[int] = pb.AppendRequest.SUSPEND_RESUME
_SUSPEND_NO_RESUME: Final[int] = pb.AppendRequest.SUSPEND_NO_RESUME
_SUSPEND_IF_FLUSHED: Final[int] = pb.AppendRequest.SUSPEND_IF_FLUSHED
_SUSPEND_NOW: Final[int] = pb.AppendRequest.SUSPEND_NOW
_SUSPEND_KEEP: Final[int] = pb.AppendRequest.SUSPEND_KEEP
_LEVEL_NONE: Final[int] = pb.JournalSpec.Suspend.NONE
_LEVEL_PARTIAL: Final[int] = pb.JournalSpec.Suspend.PARTIAL
_LEVEL_FULL: Final[int] = pb.JournalSpec.Suspend.FULL

# States.
RESOLVE = "resolve"
ACQUIRE_PIPELINE = "acquire pipeline"
START_PIPELINE = "start pipeline"
SEND_SYNC = "send pipeline sync"
RECV_SYNC = "recv pipeline sync"
UPDATE_ASSIGNMENTS = "update assignments"
AWAIT_DESIRED_REPLICAS = "await desired replicas"
VALIDATE_PRECONDITIONS = "validate preconditions"
UPDATE_SUSPEND = "update suspend"
STREAM_CONTENT = "stream content"
ERROR = "error"
PROXY = "proxy"


class _Acks(NamedTuple):
    """What an append needs to read its acknowledgements (see ``AppendFSM._send_final``)."""

    pln: Pipeline
    replica: Replica
    wait_for: asyncio.Future[None]  # the previous append has read its acknowledgements
    close_after: asyncio.Future[None]  # set once ours are read: the next append's turn
    sent: bool  # our commit (or rollback) was proposed to the peers
    send_err: ReplicationError | None  # a peer's send failed by then


class AppendFSM:
    """One append's walk through the state machine (see the module docstring)."""

    def __init__(self, broker: BrokerContext, req: pb.AppendRequest, claims: Claims | None = None,
                 ahead: ReadAhead[AppendChunk] | None = None) -> None:
        self.broker = broker
        self.ahead = ahead  # the client's stream, read ahead once before queueing
        self.req = req
        self.claims = claims
        self.state = RESOLVE
        self.res: Resolution | None = None
        self.replica: Replica | None = None  # whose send side we own, if any
        self.pln: Pipeline | None = None
        self.pln_header = False
        self.read_through = req.min_etcd_revision
        self.roll_to = 0
        self.registers = pb.LabelSet()
        self.next_suspend: pb.JournalSpec.Suspend | None = None
        self.resumed = False  # this append resumed a fully suspended journal
        self.status: int = pb.OK
        self.err: BaseException | None = None
        self.sync_rounds = 0
        self.store_health_error = ""
        self.registers_wire = b""  # the registers the local spool committed with us, serialized

    # -- ownership ------------------------------------------------------------------------

    def release(self) -> None:
        """Returns the send side, if owned."""
        replica, self.replica = self.replica, None
        if replica is not None:
            replica.send_lock.release()

    def _retire(self, expect_err: bool) -> None:
        """Detaches and tears down our pipeline (we own the send side)."""
        pln, self.pln = self.pln, None
        if pln is None:
            return
        assert self.replica is not None
        if self.replica.pln is pln:
            self.replica.pln = None
        self.replica.retire_pipeline(pln, expect_err)
        if expect_err:
            self.replica.request_pulse()

    # -- driver ---------------------------------------------------------------------------

    async def run_to_stream(self) -> None:
        """Runs until STREAM_CONTENT or a terminal state (ERROR, PROXY)."""
        steps = _STEPS
        try:
            while self.state not in _STOPS:
                await steps[self.state](self)
        except BaseException:
            # Interrupted mid-step (cancelled, etcd failed, ...): a pipeline in the middle of
            # its synchronisation is in an unknown state.
            if self.state in (SEND_SYNC, RECV_SYNC) and self.pln is not None:
                self._retire(expect_err=True)
            raise

    async def _on_resolve(self) -> None:
        req = self.req
        resolver = self.broker.resolver
        proxy_header = req.header if req.HasField("header") else None
        # The steady state (a resolution of this revision cached) makes no coroutine.
        res = resolver.cached(req.journal, may_proxy=not req.do_not_proxy, require_primary=True,
                              min_etcd_revision=self.read_through, proxy_header=proxy_header,
                              claims=self.claims)
        if res is None:
            res = await resolver.resolve(
                req.journal,
                may_proxy=not req.do_not_proxy,
                require_primary=True,
                min_etcd_revision=self.read_through,
                proxy_header=proxy_header,
                claims=self.claims,
            )
        self.res = res
        if res.status == pb.SUSPENDED and req.suspend == _SUSPEND_RESUME:
            assert res.spec is not None
            self.next_suspend = pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.NONE, offset=res.spec.suspend.offset)
            self.state = UPDATE_SUSPEND
        elif res.status == pb.NO_JOURNAL_PRIMARY_BROKER and self.resumed:
            # This append resumed a journal that had no replicas: wait for the allocator to
            # assign them (a later revision), rather than fail the append that asked for it
            # (Gazette answers NO_JOURNAL_PRIMARY_BROKER here and leaves it to the client's
            # retry; an HTTP client has none). The client's deadline bounds the wait.
            self.read_through = res.header.etcd.revision + 1
            self.state = RESOLVE
        elif res.status != pb.OK:
            self.status = res.status
            self.state = ERROR
        elif not res.is_local:
            self.release()  # no longer primary: give back a pipeline held from before
            self.state = AWAIT_DESIRED_REPLICAS
        elif self.replica is not None and self.replica is res.replica:
            self.state = START_PIPELINE
        else:
            self.release()
            self.state = ACQUIRE_PIPELINE

    async def _on_acquire_pipeline(self) -> None:
        res = self.res
        assert res is not None
        replica = res.replica
        if replica is None or replica.cancelled:
            # Assigned at this revision, but the replica is not serving yet (or any more).
            self.read_through = res.header.etcd.revision + 1
            self.state = RESOLVE
            return
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            # Only a client that committed, or is visibly sending, queues (flow.py): a stalled
            # one is aborted here (RESOURCE_EXHAUSTED) without ever delaying the queue.
            await ahead.fill(_content_length, self.broker.config.min_append_rate)
            if res.signal is not None and res.signal.is_set():
                self.state = RESOLVE  # the route changed while we read: resolve afresh
                return
        # Appends queue here in their (FIFO) order; a holder always finishes, so waiting
        # needs no watch on the resolution: it is checked again once we own the pipeline.
        lock = replica.send_lock
        if not lock.try_acquire():  # free, the steady state: no coroutine
            await lock.acquire()
        self.replica = replica
        self.pln = replica.pln
        # As in Gazette, confirm the resolution still holds now that we own the pipeline.
        self.state = RESOLVE if (res.signal is not None and res.signal.is_set()) else START_PIPELINE

    async def _on_start_pipeline(self) -> None:
        res, replica = self.res, self.replica
        assert res is not None and replica is not None
        self.pln = replica.pln
        pln = self.pln
        if pln is not None and not pln.broken and pln.route_key == res.route_key:
            self.registers = pln.spool.registers
            self.state = UPDATE_ASSIGNMENTS
            return
        if pln is not None:
            self._retire(expect_err=pln.broken)

        if not await acquire_unless(replica.spool_lock, res.signal):
            self.state = RESOLVE
            return
        if replica.cancelled:
            replica.spool_lock.release()
            self.state = RESOLVE
            return
        self.registers = replica.spool.registers
        route = res.route
        streams = [None if i == route.primary else self.broker.dial_replicate(route, i)
                   for i in range(len(route.members))]
        self.pln = replica.pln = Pipeline(res.header, replica.spool, replica.spool_lock.release, streams)
        self.pln_header = True
        self.sync_rounds = 0
        self.state = SEND_SYNC

    async def _on_send_sync(self) -> None:
        res, pln = self.res, self.pln
        assert res is not None and res.spec is not None and pln is not None
        spool = pln.spool
        proposal = maybe_roll(spool.fragment, spool.first_append_time, self.roll_to, res.spec.fragment, time.time())
        req = pb.ReplicateRequest(proposal=proposal.to_proto(), registers=self.registers, acknowledge=True)
        if self.pln_header:
            req.header.CopyFrom(pln.header)
            req.deprecated_journal = spool.journal
            self.pln_header = False
        await pln.scatter(req)
        self.state = RECV_SYNC

    async def _on_recv_sync(self) -> None:
        pln = self.pln
        assert pln is not None
        # Earlier appends may still await acknowledgements on this pipeline: read in turn.
        wait_for, close_after = pln.barrier()
        try:
            await wait_for
            roll_to, roll_regs, read_through = await pln.gather_sync()
        finally:
            close_after.set_result(None)
        err = pln.recv_err() or pln.send_err()
        self.sync_rounds += 1
        if err is None and roll_to and self.sync_rounds >= MAX_SYNC_ROUNDS:
            err = ReplicationError(f"pipeline did not synchronise in {MAX_SYNC_ROUNDS} rounds")
        if err is not None:
            self._retire(expect_err=True)
            self.err = err
            self.state = ERROR
        elif roll_to:
            # A peer holds a larger offset, or cannot extend our fragment: propose that
            # everyone roll forward to roll_to. This time all peers should agree.
            self.roll_to = roll_to
            if roll_regs is not None:
                self.registers = roll_regs
            self.state = SEND_SYNC
        elif read_through:
            # A peer knows a different route at a later revision: catch up, then rebuild.
            self._retire(expect_err=False)
            self.read_through = read_through
            self.state = RESOLVE
        else:
            self.state = UPDATE_ASSIGNMENTS

    async def _on_update_assignments(self) -> None:
        res, replica = self.res, self.replica
        assert res is not None and replica is not None
        if res.advertised:
            self.state = AWAIT_DESIRED_REPLICAS
            return
        rev = await self.broker.update_assignments(replica, res)
        self.read_through = rev
        self.state = RESOLVE

    async def _on_await_desired_replicas(self) -> None:
        res = self.res
        assert res is not None and res.spec is not None
        n, desired = len(res.route.members), append_plan(res).desired_replication
        if n > desired:
            # The allocator over-subscribed the journal and is about to remove members
            # (maybe the primary): wait for that rather than append to n > desired.
            self.read_through = res.header.etcd.revision + 1
            self.state = RESOLVE
        elif n < desired:
            self.status = pb.INSUFFICIENT_JOURNAL_BROKERS
            self.state = ERROR
        elif not res.is_local:
            self.state = PROXY
        else:
            self.state = VALIDATE_PRECONDITIONS

    async def _on_validate_preconditions(self) -> None:
        res, replica, pln = self.res, self.replica, self.pln
        assert res is not None and res.spec is not None and replica is not None and pln is not None
        # Before the first-refresh wait: a store that cannot be listed never completes one.
        # (Each wait is skipped, not awaited, when already satisfied: the steady state.)
        plan = append_plan(res)
        health = self.broker.store_health
        if plan.has_stores and not health.healthy_for_append(res.spec):
            status, self.store_health_error = await health.await_append_status(res.spec)
            if status != pb.OK:
                self.status = status
                self.state = ERROR
                return
        if not replica.index.first_refresh.is_set() and not await wait_unless(replica.index.first_refresh, res.signal):
            self.state = RESOLVE
            return
        if not replica.primary_refreshed.is_set() and not await wait_unless(replica.primary_refreshed, res.signal):
            self.state = RESOLVE
            return
        req, spool = self.req, pln.spool
        # (A spool that was ever written starts nowhere else: fresh_roll_offset is then 0.)
        if (len(res.route.members) == 1 and spool.first_append_time is None
                and (fresh := replica.fresh_roll_offset()) > spool.fragment.end):
            self.roll_to = fresh
            self.state = SEND_SYNC
            return

        index_min, index_max, index_mod = replica.index.summary()
        interval = plan.flush_interval or DEFAULT_FLUSH_INTERVAL
        index_dirty = index_mod == 0 or index_mod > time.time() - interval
        end = spool.fragment.end
        max_offset = max(end, index_max)

        if req.HasField("check_registers") and len(self.registers.labels) != 0:
            if not registers_match(req.check_registers, self.registers):
                self.status = pb.REGISTER_MISMATCH
                self.state = ERROR
                return
        if end < plan.suspend_offset:  # roll forward to the journal's resumption offset
            self.roll_to = plan.suspend_offset
            self.state = SEND_SYNC
            return
        if end != max_offset and req.offset == 0 and plan.writable:
            self.status = pb.INDEX_HAS_GREATER_OFFSET
            self.state = ERROR
            return
        if req.offset != 0 and req.offset != max_offset:
            self.status = pb.WRONG_APPEND_OFFSET
            self.state = ERROR
            return
        if req.offset != 0 and end != max_offset:
            # The explicit offset confirms the index's end: re-synchronise there.
            self.roll_to = max_offset
            self.state = SEND_SYNC
            return

        level = plan.suspend_level
        mode = req.suspend
        if mode == _SUSPEND_RESUME:
            if level != _LEVEL_NONE:
                self.next_suspend = pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.NONE, offset=end)
                self.state = UPDATE_SUSPEND
                return
        elif mode == _SUSPEND_NO_RESUME:
            if level != _LEVEL_NONE:
                self.status = pb.SUSPENDED
                self.state = ERROR
                return
        elif mode == _SUSPEND_IF_FLUSHED or mode == _SUSPEND_NOW:
            if level != _LEVEL_FULL and index_min == index_max:
                self.next_suspend = pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.FULL, offset=end)
                self.state = UPDATE_SUSPEND
                return
            if level == _LEVEL_NONE and (not index_dirty or mode == _SUSPEND_NOW):
                self.next_suspend = pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.PARTIAL, offset=end)
                self.state = UPDATE_SUSPEND
                # The replication factor drops, but we likely stay primary: roll the spool
                # so its content is persisted.
                self.roll_to = end
                return
            if level == _LEVEL_PARTIAL:
                self.status = pb.SUSPENDED
        self.state = STREAM_CONTENT

    async def _on_update_suspend(self) -> None:
        res = self.res
        assert res is not None and self.next_suspend is not None
        self.read_through = await self.broker.update_suspend(res, self.next_suspend.level, self.next_suspend.offset)
        if self.next_suspend.level == _LEVEL_NONE and res.spec is not None \
                and res.spec.suspend.level == _LEVEL_FULL:
            self.resumed = True
        log.info("updated journal suspension", extra={
            "journal": self.req.journal, "revision": self.read_through,
            "suspend": pb.JournalSpec.Suspend.Level.Name(self.next_suspend.level)})
        self.state = RESOLVE

    # -- streaming ------------------------------------------------------------------------

    async def stream(self, rest: AsyncIterator[AppendChunk], wire: bool = False) -> pb.AppendResponse | bytes:
        """STREAM_CONTENT through the acknowledgements; returns the response (or raises): with
        ``wire``, a committed append's as its serialized bytes (:func:`encode_committed`)."""
        res, pln = self.res, self.pln
        assert res is not None and res.spec is not None and pln is not None
        spool = pln.spool
        plan = append_plan(res)
        frag = spool.fragment
        proposal = _maybe_roll(frag, spool.first_append_time, self.roll_to, plan.fragment_length,
                               plan.flush_interval, plan.codec, time.time())
        if proposal is not frag and proposal != frag:
            # The pipeline is synchronised: every peer takes this roll, unacknowledged.
            await pln.scatter(pb.ReplicateRequest(proposal=proposal.to_proto(), registers=self.registers))
            frag = proposal

        begin = frag.end
        started = time.monotonic()
        summer = EMPTY_SHA1.copy()
        delta = 0
        chunks = 0
        committed = False
        status = self.status
        writable = plan.writable
        mode = self.req.suspend
        content_allowed = mode != _SUSPEND_IF_FLUSHED and mode != _SUSPEND_NOW and mode != _SUSPEND_KEEP
        err: BaseException | None = None
        local_only = not pln.peers
        cfg = self.broker.config
        max_rate = plan.max_append_rate
        if cfg.max_append_rate and (max_rate == 0 or cfg.max_append_rate < max_rate):
            max_rate = cfg.max_append_rate
        policed: AsyncGenerator[AppendChunk, None] | None = None
        # Without a max rate, the chunks read ahead are taken as they are (nothing to police:
        # they are here), and the stream is read, policed, only past them (unless it ended).
        buffered: list[AppendChunk] = []
        ended = False
        if max_rate:
            fc = self.replica.flow if self.replica is not None else AppendFlowControl()
            rest = policed = flow_controlled(rest, fc, _content_length, max_rate=max_rate,
                                             min_rate=cfg.min_append_rate)
        else:
            if isinstance(rest, ReadAhead):
                buffered = rest.take()
                ended = rest.ended
            if cfg.min_append_rate and not ended:  # the min rate alone: a fraction of the cost
                rest = min_rate_policed(rest, _content_length, cfg.min_append_rate)
        taken = 0
        try:
            while True:
                if taken < len(buffered):
                    req = buffered[taken]
                    taken += 1
                elif ended:
                    break
                else:
                    try:
                        req = await rest.__anext__()
                    except StopAsyncIteration:
                        break
                if req.journal:
                    raise AppendStreamError("expected Content chunk")
                if committed:
                    raise AppendStreamError("expected EOF after empty Content chunk")
                content = req.content  # each access of a bytes field copies it: read it once
                if not content:
                    committed = True
                    continue
                if not writable or not content_allowed:
                    status = pb.NOT_ALLOWED
                    break
                # Our commit's SHA1 is computed while a worker writes and hashes the spool's.
                await pln.scatter_content(content, delta, partial(summer.update, content))
                if pln.broken:
                    break
                delta += len(content)
                chunks += 1
            if status == pb.OK and not committed and not pln.broken:
                raise AppendStreamError("unexpected EOF before the commit chunk")
            if (status == pb.OK and delta == 0
                    and (self.req.HasField("union_registers") or self.req.HasField("subtract_registers"))):
                raise AppendStreamError("register modification requires non-empty Append")
        except BaseException as e:  # noqa: BLE001 - including cancellation: roll back, then re-raise
            err = e
        if policed is not None:
            await policed.aclose()  # stops its stall timer now, not when it is collected

        regs = self.registers
        if err is None and status == pb.OK and not pln.broken:
            final = spool.next_fragment()
            if self.req.HasField("subtract_registers") or self.req.HasField("union_registers"):
                ls = labels.LabelSet.from_proto(regs)
                if self.req.HasField("subtract_registers"):
                    ls = ls.subtract(labels.LabelSet.from_proto(self.req.subtract_registers))
                if self.req.HasField("union_registers"):
                    ls = labels.LabelSet.from_proto(self.req.union_registers).union(ls)
                regs = ls.to_proto()
            commit = True
        else:
            final = spool.fragment  # roll back the pending content
            commit = False

        # Sent from this task, with no await since the last content chunk: when the whole
        # append arrived at once, its content and commit leave for each peer in one write.
        await self.conclude(final, regs, local_only)
        if err is not None:
            raise err
        if self.err is not None:
            raise self.err
        if status != pb.OK:
            return _response(status, res.header)
        assert commit
        metrics.APPENDS_TALLY.committed(delta, time.monotonic() - started)
        if wire:
            return encode_committed(plan.header_field(res.header), spool.journal, begin, begin + delta,
                                    summer.digest(), final.codec, self.registers_wire, chunks)
        resp = _response(pb.OK, res.header)
        c = resp.commit
        c.journal = spool.journal
        c.begin = begin
        c.end = begin + delta
        set_sum(c.sum, summer.digest())
        c.compression_codec = final.codec
        resp.registers.CopyFrom(regs)
        resp.total_chunks = chunks
        return resp

    async def conclude(self, final: Fragment, registers: pb.LabelSet, local_only: bool) -> None:
        """Proposes ``final`` (the commit, or the rollback of what is pending) with
        ``registers``, hands the send side on, and reads this append's acknowledgements in
        turn: shielded from cancellation unless the route is ours alone (``local_only``), since
        the responses on the peers' streams must be read by us, whatever happens to the client's
        RPC meanwhile. A failure is left in ``err``."""
        acks = self._send_final(final, registers)
        if local_only:
            await self._finish(acks)
            return
        finishing = asyncio.ensure_future(self._finish(acks))
        try:
            await asyncio.shield(finishing)
        except asyncio.CancelledError:
            if not finishing.done():
                finishing.add_done_callback(_consume)
            raise

    def _send_final(self, final: Fragment, registers: pb.LabelSet) -> _Acks:
        """Scatters the commit (or rollback), takes the read barrier and hands the send side
        on; returns what :meth:`_finish` needs. Never awaits: it cannot be interrupted
        between the send and the hand-off."""
        pln, replica = self.pln, self.replica
        assert pln is not None and replica is not None
        # A pipeline that broke meanwhile (a peer failed, maybe under an earlier append) is
        # not sent our proposal: no healthy peer would answer a proposal half the route lacks.
        # A peer over MAX_QUEUED is not waited for here: the next scatter of content waits.
        sent = not pln.broken
        if sent:
            pln.propose_nowait(final, registers)
            # As the local spool took them with the commit (a later commit may change them
            # before the response is made): every committed response's registers.
            self.registers_wire = pln.spool.registers_wire()
        send_err = pln.send_err()
        wait_for, close_after = pln.barrier()
        if send_err is not None or not sent:
            self._retire(expect_err=True)  # peers roll back; its shutdown reads after our turn
        self.release()
        return _Acks(pln, replica, wait_for, close_after, sent, send_err)

    async def _finish(self, acks: _Acks) -> None:
        """Reads our acknowledgements in turn, then lets the next append read its own."""
        pln, replica, wait_for, close_after, sent, send_err = acks
        try:
            await wait_for
            if sent:
                await pln.gather_ok()
        finally:
            close_after.set_result(None)
        recv_err = pln.recv_err()
        # A peer whose write failed after our send (its sender runs later) fails its read
        # too: the write's error is the one that explains it.
        self.err = send_err or (recv_err and (pln.send_err() or recv_err))
        if self.err is None and not sent:
            self.err = ReplicationError("the replication pipeline broke during the append")
        if self.err is not None:
            replica.request_pulse()  # the pipeline is broken: rebuild it without waiting


_STEPS = {
    RESOLVE: AppendFSM._on_resolve,
    ACQUIRE_PIPELINE: AppendFSM._on_acquire_pipeline,
    START_PIPELINE: AppendFSM._on_start_pipeline,
    SEND_SYNC: AppendFSM._on_send_sync,
    RECV_SYNC: AppendFSM._on_recv_sync,
    UPDATE_ASSIGNMENTS: AppendFSM._on_update_assignments,
    AWAIT_DESIRED_REPLICAS: AppendFSM._on_await_desired_replicas,
    VALIDATE_PRECONDITIONS: AppendFSM._on_validate_preconditions,
    UPDATE_SUSPEND: AppendFSM._on_update_suspend,
}
_STOPS = frozenset((STREAM_CONTENT, ERROR, PROXY))


def _content_length(req: AppendChunk) -> int:
    if type(req) is ContentChunk:
        return len(req.content)
    return req.ByteSize()  # type: ignore[union-attr]  # the chunk's size on the wire


def _consume(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


async def serve_append(broker: BrokerContext, requests: AsyncIterator[AppendChunk | pb.AppendRequest],
                       context: Any) -> pb.AppendResponse | bytes:
    """The Append RPC's servicer (``service.py``'s ``Append`` awaits it): verifies the token,
    reads and validates the first request, and serves the append, a committed one's response
    serialized (:func:`encode_committed`: the RPC's serializer passes bytes through).

    Errors end the RPC as ``grpc_edge`` would end them (``edge.end_rpc``): a broken stream
    INVALID_ARGUMENT, a failed peer or a stopping resolver UNAVAILABLE (the client retries), a
    stalled client RESOURCE_EXHAUSTED (it gives the pipeline back), a failed proxy with its
    own status. Here rather than behind the edge's wrapper: every resumption of an append
    (its turn at the pipeline, its acknowledgements) passes through each coroutine above it,
    and this one is compiled."""
    failed: Exception
    try:
        claims = broker.verifier.verify(token_of(context.invocation_metadata()), auth.APPEND)
        it = requests.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            raise AppendStreamError("expected an initial AppendRequest") from None
        if isinstance(first, ContentChunk):
            raise AppendStreamError(
                "expected an initial AppendRequest naming a journal, not a content chunk")
        if not validated(first):  # a shared first request was validated when first decoded
            validate.validate_append_request(first)
        # Serialized when committed: the response serializer (server/grpc.py) passes bytes on.
        return await run_append(broker, first, it, claims, True)
    except Exception as err:  # noqa: BLE001 - the edge maps it (a cancellation passes)
        failed = err
    # Outside the handler: compiled, a coroutine must not suspend in one.
    await end_rpc("Append", context, failed)
    raise failed  # not reached: end_rpc raises


async def append(broker: BrokerContext, first: pb.AppendRequest, rest: AsyncIterator[AppendChunk],
                 claims: Claims | None = None) -> pb.AppendResponse:
    """Serves one Append; ``rest`` yields the content chunks after ``first``; a journal
    ``claims`` do not reach is not found."""
    resp = await run_append(broker, first, rest, claims, False)
    assert not isinstance(resp, bytes)
    return resp


async def run_append(broker: BrokerContext, first: pb.AppendRequest, rest: AsyncIterator[AppendChunk],
                     claims: Claims | None, wire: bool) -> pb.AppendResponse | bytes:
    """Serves one Append whose first request is read and checked (``serve_append``, and each
    call of a group that is served alone); with ``wire``, a committed one's response is
    returned serialized."""
    rest = ahead = ReadAhead(rest)
    fsm = AppendFSM(broker, first, claims, ahead)
    try:
        await fsm.run_to_stream()
        res = fsm.res
        assert res is not None
        if fsm.state == PROXY:
            return await _proxy(broker, first, rest, res.header)
        if fsm.state == ERROR:
            if fsm.err is not None:
                raise fsm.err
            resp = _response(fsm.status, res.header)
            if fsm.status == pb.FRAGMENT_STORE_UNHEALTHY:
                resp.store_health_error = fsm.store_health_error
            return resp
        out = await fsm.stream(rest, wire)
    finally:
        fsm.release()
    metrics.APPENDS_TALLY.answered(pb.OK if isinstance(out, bytes) else out.status)
    return out


async def pulse(broker: BrokerContext, replica: Replica, suspend_if_flushed: bool = False) -> None:
    """A zero-byte append as primary: builds and synchronises the pipeline, advertises the
    route, and rolls the spool if its flush interval passed (Gazette's pulse daemon). With
    ``suspend_if_flushed`` (auto-suspension of a stable journal) it suspends the journal where
    its content is persisted: fully if it has no fragments, else partially once its index has
    been clean for the flush interval (see ``_on_validate_preconditions``)."""
    mode = pb.AppendRequest.SUSPEND_IF_FLUSHED if suspend_if_flushed else pb.AppendRequest.SUSPEND_NO_RESUME
    req = pb.AppendRequest(journal=replica.journal, do_not_proxy=True, suspend=mode)

    resp = await append(broker, req, _Requests(pb.AppendRequest(), _NO_CHUNKS))
    if resp.status not in (pb.OK, pb.NOT_JOURNAL_PRIMARY_BROKER, pb.NO_JOURNAL_PRIMARY_BROKER,
                           pb.JOURNAL_NOT_FOUND, pb.SUSPENDED):
        raise ReplicationError(f"pulse of {replica.journal} ended {pb.Status.Name(resp.status)}")


async def _proxy(broker: BrokerContext, first: pb.AppendRequest, rest: AsyncIterator[AppendChunk], header: pb.Header) -> pb.AppendResponse:
    stub = broker.peer_stub(header.route.endpoints[header.route.primary] if header.route.endpoints else "")
    fwd = pb.AppendRequest()
    fwd.CopyFrom(first)
    fwd.header.CopyFrom(header)

    resp: pb.AppendResponse = await stub.Append(_Requests(fwd, rest))
    return resp


class _NoChunks:
    """An empty stream of append chunks."""

    def __aiter__(self) -> _NoChunks:
        return self

    async def __anext__(self) -> AppendChunk:
        raise StopAsyncIteration


_NO_CHUNKS = _NoChunks()


class _Requests:
    """``first``, then ``rest`` as AppendRequests: what a pulse (a lone commit) and a proxied
    append send. A class, not an async generator: the compiled build's mypyc
    does not compile async generators."""

    def __init__(self, first: pb.AppendRequest, rest: AsyncIterator[AppendChunk]) -> None:
        self._first: pb.AppendRequest | None = first
        self._rest: AsyncIterator[AppendChunk] | None = rest

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> pb.AppendRequest:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._rest is not None:
            try:
                req = await self._rest.__anext__()
            except StopAsyncIteration:
                self._rest = None
            else:
                return req.to_proto() if isinstance(req, ContentChunk) else req
        raise StopAsyncIteration
