"""The primary's replication pipeline of a journal: Replicate streams to every peer of a route.

A pipeline is built by the primary when it must append under a route it has not yet
synchronised. It owns the replica's spool (the replica's ``spool_lock`` is held from
construction until :meth:`Pipeline.close_send`) and one long-lived Replicate stream per peer
of the route. It is Gazette's ``pipeline`` (broker/pipeline.go), carried over to asyncio:

* **scatter**: every ReplicateRequest (content chunk or proposal) is queued to each peer
  whose stream has not failed, then applied to the local spool. Each peer has a sender task
  writing its queue in order, so a scatter does not wait for writes (unless a peer falls
  ``MAX_QUEUED`` bytes behind). A long content chunk is written and hashed into the local
  spool by a worker thread (``Spool.write_content``) while the peers' writes are in flight
  and the append hashes it for its own commit. Content is encoded once; every peer is sent
  the same bytes.
* **full duplex**: the *send side* is owned by one append at a time (the replica's
  ``send_lock``); the *receive side* is handed from append to append in send order by the
  read barrier: :meth:`barrier` returns the future to wait for and the one to resolve after
  reading, so the next append may stream content while earlier commits await their
  acknowledgements, and each reads exactly its own responses, in order.
* **errors**: the first error of each peer, on send and on receive, is kept (a broken peer
  is not written to or read from again). A pipeline with any error is ``broken``: the next
  append tears it down and builds a new one (a pipeline is never repaired in place).
* **teardown**: :meth:`close_send` rolls the local spool back to its last commit, releases
  the spool and half-closes every stream after its queued requests (a failed stream is
  aborted, so its peer lets go of its spool); :meth:`shutdown` then waits for its turn on the
  receive side and reads each peer's end of stream. Peers roll their own spools back when
  their stream ends, so nothing uncommitted survives a teardown anywhere.

The local spool is applied with ``primary=True``: spools it completes are persisted at once.
A local apply never answers anything but OK, since every proposal is derived from the local
spool; anything else is a bug and raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

import grpc

from gazette.allocator import routes_equivalent
from gazette.broker.spool import Spool
from gazette.broker.wire import encode_varint
from gazette.errors import GazetteError
from gazette.fragment import Fragment
from gazette.protocol import protocol_pb2 as pb

log = logging.getLogger(__name__)

OVERLAP_MIN = 64 * 1024
"""Content chunks at least this long are handed to the peers' transports before the local
write and hash begin, so peers receive them while the primary writes."""
MAX_QUEUED = 8 << 20
"""Bytes queued to one peer beyond which a scatter waits for its writes (back-pressure)."""


class PeerStream(Protocol):
    """One Replicate stream to a peer (a gRPC stream-stream call, or a fake in tests)."""

    async def write(self, data: bytes) -> None:
        """Send one serialized ReplicateRequest."""

    async def read(self) -> pb.ReplicateResponse | None:
        """The next response; None at the end of the stream."""

    async def done_writing(self) -> None:
        """Half-close: no more requests."""

    def ended(self) -> bool:
        """Whether the stream is over (the peer, its connection or we ended it), without
        reading it: a pipeline sitting idle learns so without an append."""

    def cancel(self) -> None:
        """Abort the stream."""


class ReplicationError(GazetteError):
    """A peer of the pipeline failed (send or receive), or answered unexpectedly: transient,
    the client retries."""

    grpc_code: ClassVar[str] = "UNAVAILABLE"




def encode_content(content: bytes | memoryview, delta: int) -> bytes:
    """A content ReplicateRequest in wire form, built with a single copy of ``content``.

    Fields in number order, as protobuf encoders write them: ``content`` (4), then
    ``content_delta`` (5) when non-zero.
    """
    tail = b"\x28" + encode_varint(delta) if delta else b""
    return b"".join((b"\x22", encode_varint(len(content)), content, tail))


def _boxed(req: pb.ReplicateRequest, member: pb.ProcessSpec.ID) -> bytes:
    """``req`` serialized with its header's process ID set to the addressed peer."""
    out = pb.ReplicateRequest()
    out.CopyFrom(req)
    out.header.process_id.CopyFrom(member)
    return out.SerializeToString()


def _member(m: pb.ProcessSpec.ID) -> str:
    return f"{m.zone}/{m.suffix}"


class Pipeline:
    """See the module docstring. Built with the replica's spool already owned."""

    def __init__(
        self,
        header: pb.Header,
        spool: Spool,
        release_spool: Callable[[], None],
        streams: Sequence[PeerStream | None],
    ) -> None:
        route = header.route
        if route.primary == -1:
            raise ValueError("a pipeline requires a route with a primary")
        if len(streams) != len(route.members):
            raise ValueError("a pipeline needs one stream slot per route member")
        self.header = header
        self.primary = int(route.primary)  # read on every append: not through the header's message
        self.route_key = (self.primary, tuple((m.zone, m.suffix) for m in route.members))
        self.spool = spool
        self._release_spool: Callable[[], None] | None = release_spool
        self.streams = list(streams)
        self.peers = [i for i, s in enumerate(self.streams) if s is not None]
        n = len(self.streams)
        self.send_errs: list[BaseException | None] = [None] * n
        self.recv_errs: list[BaseException | None] = [None] * n
        self.recv_resp: list[pb.ReplicateResponse | None] = [None] * n
        self._loop = asyncio.get_running_loop()
        self._barrier: asyncio.Future[None] = self._loop.create_future()
        self._barrier.set_result(None)
        self._closed = False
        self._cancelled: set[int] = set()  # peers whose stream we aborted: nothing to read
        self.broken = False  # set on any error: the next append rebuilds the pipeline
        self._senders: list[_Sender | None] = [
            None if s is None else _Sender(self, i, s) for i, s in enumerate(self.streams)]

    @property
    def route(self) -> pb.Route:
        return self.header.route

    def idle_healthy(self) -> bool:
        """Whether an idle pipeline is still whole: no error seen and every peer's stream still
        open. (A peer's connection is watched by keepalive pings, which end its streams when
        the peer stops answering.)"""
        return not self.broken and not self._closed and not any(
            s is not None and s.ended() for s in self.streams)

    def __repr__(self) -> str:
        members = ",".join(_member(m) for m in self.route.members)
        return f"Pipeline(rev={self.header.etcd.revision}, route=[{members}], spool={self.spool!r})"

    # -- send side ------------------------------------------------------------------------

    def _fail_send(self, i: int, err: BaseException) -> None:
        if self.send_errs[i] is None:
            self.send_errs[i] = err
        self.broken = True

    def _local(self, fn: Callable[[], None]) -> None:
        i = self.primary
        if self.send_errs[i] is not None:
            return
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - e.g. a full disk: the append fails
            self._fail_send(i, err)

    def _queue(self, data: bytes | list[bytes]) -> bool:
        """Queues ``data`` (per route member when a list) to every live peer; returns whether
        a peer's queue is now over ``MAX_QUEUED``."""
        full = False
        for i in self.peers:
            sender = self._senders[i]
            if self.send_errs[i] is None and sender is not None:
                sender.put(data[i] if isinstance(data, list) else data)
                full = full or sender.full()
        return full

    async def _wait_space(self) -> None:
        for i in self.peers:
            sender = self._senders[i]
            if sender is not None and self.send_errs[i] is None:
                await sender.wait_space()

    async def scatter_content(self, content: bytes | memoryview, delta: int,
                              alongside: Callable[[], None] | None = None) -> None:
        """Sends a content chunk at ``delta`` to every peer and applies it locally, running
        ``alongside`` (on this thread) while a worker thread writes a long chunk to the spool.
        ``alongside`` runs exactly once, whatever fails."""
        i = self.primary
        full = False
        if self.peers:
            full = self._queue(encode_content(content, delta))
            if len(content) >= OVERLAP_MIN:
                await asyncio.sleep(0)  # each sender hands its write to the transport first
        write = None
        if self.send_errs[i] is None:
            try:
                write = self.spool.write_content(content, delta)
            except Exception as err:  # noqa: BLE001 - e.g. a full disk: the append fails
                self._fail_send(i, err)
        if write is not None:
            failed: BaseException | None = None
            try:
                if alongside is not None:
                    alongside()
            except BaseException as raised:  # noqa: BLE001 - raised once the write settled
                failed = raised
            # Settled outside the handler: compiled, a coroutine must not suspend in one.
            try:
                await write.settle()
            except asyncio.CancelledError:
                raise
            except Exception as bad:  # noqa: BLE001 - the write failed: the append fails
                self._fail_send(i, bad)
            if failed is not None:
                raise failed
        elif alongside is not None:
            alongside()
        if full:
            await self._wait_space()

    async def scatter(self, req: pb.ReplicateRequest) -> None:
        """Sends a proposal to every peer (a header is re-addressed to each) and applies it
        locally, waiting while a peer is ``MAX_QUEUED`` bytes behind; a local refusal is a bug
        and raises AssertionError."""
        if self.scatter_nowait(req):
            await self._wait_space()

    def scatter_nowait(self, req: pb.ReplicateRequest) -> bool:
        """:meth:`scatter` without the wait: queues and applies at once (no await, so frames
        queued in this turn of the loop, such as the content just before a commit, leave
        together); returns whether a peer is now over ``MAX_QUEUED``."""
        spool = self.spool
        refused: list[pb.ReplicateResponse] = []

        def local() -> None:
            resp = spool.apply(req, primary=True)
            if resp.status != pb.OK:
                refused.append(resp)

        full = False
        if self.peers:
            data: bytes | list[bytes]
            if req.HasField("header"):
                data = [b"" if s is None else _boxed(req, self.route.members[i]) for i, s in enumerate(self.streams)]
            else:
                data = req.SerializeToString()
            full = self._queue(data)
        self._local(local)
        if refused:
            raise AssertionError(f"local spool refused its own proposal {req.proposal}: {refused[0]}")
        return full

    def propose_nowait(self, proposal: Fragment, registers: pb.LabelSet) -> bool:
        """:meth:`scatter_nowait` of an acknowledged proposal the primary made of its own spool
        (a commit, :meth:`Spool.next_fragment`, or a rollback to :attr:`Spool.fragment`): the
        local spool takes the fragment itself, and only peers get the wire form."""
        full = False
        if self.peers:
            req = pb.ReplicateRequest(proposal=proposal.to_proto(), registers=registers, acknowledge=True)
            full = self._queue(req.SerializeToString())
        i = self.primary
        if self.send_errs[i] is None:
            try:
                refused = self.spool.apply_proposal(proposal, registers, primary=True)
            except Exception as err:  # noqa: BLE001 - e.g. a full disk: the append fails
                self._fail_send(i, err)
            else:
                if refused is not None:
                    raise AssertionError(f"local spool refused its own proposal {proposal}: {refused}")
        return full

    def send_err(self) -> ReplicationError | None:
        """The first send-side error (the local spool counts as a member), if any."""
        for i, err in enumerate(self.send_errs):
            if err is not None:
                return _wrap("send to", self.route.members[i], err)
        return None

    def close_send(self) -> None:
        """Rolls back uncommitted local content, releases the spool and half-closes every
        stream (after its queued requests; a failed stream is cancelled). Idempotent. Must
        be called by the send-side owner."""
        if self._closed:
            return
        self._closed = True
        spool = self.spool
        spool.must_apply(pb.ReplicateRequest(proposal=spool.fragment.to_proto(), registers=spool.registers), True)
        release, self._release_spool = self._release_spool, None
        if release is not None:
            release()
        for i in self.peers:
            sender = self._senders[i]
            assert sender is not None
            if self.send_errs[i] is None:
                sender.close()
            else:
                self._cancelled.add(i)
                sender.cancel()

    # -- receive side ---------------------------------------------------------------------

    def barrier(self) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
        """Installs a new read barrier: returns (wait_for, close_after). The caller, after
        its sends and before releasing the send side, takes the barrier; then waits for
        ``wait_for``, reads its responses, and resolves ``close_after``."""
        wait_for = self._barrier
        self._barrier = close_after = self._loop.create_future()
        return wait_for, close_after

    async def _read(self, i: int) -> pb.ReplicateResponse | None:
        stream = self.streams[i]
        assert stream is not None
        if i in self._cancelled:
            self.recv_errs[i] = ReplicationError("stream was aborted")
            return None
        try:
            return await stream.read()
        except asyncio.CancelledError:
            self.recv_errs[i] = ReplicationError("receive was cancelled")
            self.broken = True
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return None  # the gRPC call itself was cancelled (see `cancel`)
        except Exception as err:  # noqa: BLE001 - kept as the peer's receive error
            self.recv_errs[i] = err
            self.broken = True
            return None

    async def gather(self) -> None:
        """Receives one response from every peer (an end of stream is an error here)."""
        for i in self.peers:
            if self.recv_errs[i] is not None:
                continue
            resp = await self._read(i)
            if resp is None:
                if self.recv_errs[i] is None:
                    self.recv_errs[i] = ReplicationError("unexpected end of stream")
                    self.broken = True
                continue
            self.recv_resp[i] = resp

    async def gather_ok(self) -> None:
        """``gather``, treating any status but OK as the peer's error."""
        await self.gather()
        for i in self.peers:
            resp = self.recv_resp[i]
            if self.recv_errs[i] is None and resp is not None and resp.status != pb.OK:
                self.recv_errs[i] = ReplicationError(f"unexpected !OK response: {_short(resp)}")
                self.broken = True

    async def gather_sync(self) -> tuple[int, pb.LabelSet | None, int]:
        """Gathers the answers to a synchronising proposal: ``(roll_to, registers, read_through)``.

        All zero when every peer agreed. Else the largest end offset beyond the local spool's
        that a peer holds (with that peer's registers), or the local end when a peer holds
        an empty fragment there (it cannot extend ours), or the etcd revision through which
        a peer knows a different route. Any other answer is the peer's error.
        """
        await self.gather()
        roll_to, roll_regs, read_through = 0, None, 0
        end = self.spool.fragment.end
        for i in self.peers:
            resp = self.recv_resp[i]
            if self.recv_errs[i] is not None or resp is None:
                continue
            if resp.status == pb.OK:
                continue
            if resp.status == pb.WRONG_ROUTE:
                if (not routes_equivalent(resp.header.route, self.route)
                        and resp.header.etcd.revision > self.header.etcd.revision):
                    read_through = max(read_through, resp.header.etcd.revision)
                    continue
                err = f"unexpected WRONG_ROUTE: {_short(resp)}"
            elif resp.status == pb.PROPOSAL_MISMATCH:
                f = resp.fragment
                if f.end > end:
                    if f.end > roll_to:
                        roll_to = f.end
                        roll_regs = pb.LabelSet()
                        roll_regs.CopyFrom(resp.registers)
                    continue
                if f.end == end and f.end == f.begin:
                    roll_to = max(roll_to, f.end)
                    continue
                err = f"unexpected PROPOSAL_MISMATCH: {_short(resp)}"
            else:
                err = f"unexpected status: {_short(resp)}"
            self.recv_errs[i] = ReplicationError(err)
            self.broken = True
        return roll_to, roll_regs, read_through

    async def gather_eof(self) -> None:
        """Receives each live peer's end of stream; anything else is the peer's error."""
        for i in self.peers:
            if self.recv_errs[i] is not None:
                continue
            resp = await self._read(i)
            if resp is not None:
                self.recv_errs[i] = ReplicationError(f"unexpected response: {_short(resp)}")

    def recv_err(self) -> ReplicationError | None:
        """The first receive-side error, if any."""
        for i, err in enumerate(self.recv_errs):
            if err is not None:
                return _wrap("recv from", self.route.members[i], err)
        return None

    # -- lifecycle ------------------------------------------------------------------------

    async def shutdown(self, expect_err: bool) -> None:
        """Graceful teardown: close the send side, then, in turn, read every peer's EOF.
        Must be called by the send-side owner (it releases the spool)."""
        wait_for, close_after = self.barrier()
        self.close_send()
        if not expect_err and (err := self.send_err()) is not None:
            log.warning("tearing down pipeline: failed to close send", extra={"err": str(err)})
        try:
            await wait_for
            await self.gather_eof()
            if not expect_err and (err := self.recv_err()) is not None:
                log.warning("tearing down pipeline: failed to read EOF", extra={"err": str(err)})
        finally:
            if not close_after.done():
                close_after.set_result(None)

    def cancel(self) -> None:
        """Aborts every stream (the replica is going away); readers fail promptly."""
        self.broken = True
        for i in self.peers:
            sender = self._senders[i]
            assert sender is not None
            self._cancelled.add(i)
            sender.cancel()


def _short(resp: pb.ReplicateResponse) -> str:
    parts = [pb.Status.Name(resp.status)]
    if resp.HasField("fragment"):
        f = resp.fragment
        parts.append(f"fragment=[{f.begin}, {f.end})")
    if resp.HasField("header"):
        parts.append(f"revision={resp.header.etcd.revision}")
    return " ".join(parts)


def _wrap(what: str, member: pb.ProcessSpec.ID, err: BaseException) -> ReplicationError:
    if isinstance(err, ReplicationError):
        msg = str(err)
    elif isinstance(err, grpc.aio.AioRpcError):
        msg = f"{err.code().name}: {err.details()}"
    else:
        msg = f"{type(err).__name__}: {err}"
    return ReplicationError(f"{what} {_member(member)}: {msg}")


class _Sender:
    """Writes one peer's requests in order, from a task of its own: a scatter only queues,
    so appends never wait for a peer's write unless it falls ``MAX_QUEUED`` bytes behind.
    A failed write is the peer's send error; later requests to it are dropped."""

    __slots__ = ("_i", "_loop", "_pln", "_queue", "_queued", "_space", "_stream", "_task", "_wake")

    def __init__(self, pln: Pipeline, i: int, stream: PeerStream) -> None:
        self._pln: Pipeline | None = pln
        self._i = i
        self._stream = stream
        self._queue: deque[bytes | None] = deque()  # None: half-close
        self._queued = 0
        self._loop = asyncio.get_running_loop()
        # Set while the task waits for an empty queue to be fed: one future per idle spell
        # (cheaper than an Event, whose waits each add a future to a waiters list).
        self._wake: asyncio.Future[None] | None = None
        self._space = asyncio.Event()
        self._space.set()
        self._task = asyncio.ensure_future(self._run())

    def put(self, data: bytes | None) -> None:
        self._queue.append(data)
        if data is not None:
            self._queued += len(data)
            if self._queued > MAX_QUEUED:
                self._space.clear()
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():
                wake.set_result(None)

    def full(self) -> bool:
        return self._queued > MAX_QUEUED

    async def wait_space(self) -> None:
        await self._space.wait()

    def close(self) -> None:
        self.put(None)

    def cancel(self) -> None:
        self._task.cancel()
        self._stream.cancel()
        self._queue.clear()
        self._space.set()

    async def _run(self) -> None:
        stream, queue = self._stream, self._queue
        try:
            while True:
                while not queue:
                    self._wake = wake = self._loop.create_future()
                    await wake
                data = queue.popleft()
                if data is None:
                    await stream.done_writing()
                    return
                await stream.write(data)
                self._queued -= len(data)
                if self._queued <= MAX_QUEUED:
                    self._space.set()
        except asyncio.CancelledError:
            self._fail(ReplicationError("stream was aborted"))
        except Exception as err:  # noqa: BLE001 - kept as the peer's send error
            self._fail(err)
        finally:
            queue.clear()
            self._queued = 0
            self._space.set()
            # Break the pipeline <-> sender cycle: a released pipeline is then freed at once
            # by reference counting, not by a full collection (rare in a large heap, where
            # idle brokers' released pipelines piled up by the thousand).
            self._pln = None

    def _fail(self, err: BaseException) -> None:
        if self._pln is not None:
            self._pln._fail_send(self._i, err)  # noqa: SLF001
