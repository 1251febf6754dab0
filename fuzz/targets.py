"""Fuzz targets: every parser that outside bytes reach, each a function of one ``bytes``.

A target returns, or raises one of the errors its parser documents for bad input (listed with
it in ``TARGETS``); any other exception is a crash. Targets also check what must hold of what
they accept (a selector that parses formats and parses back to itself; an HTTP/2 connection
answers only with well-formed frames). Run them coverage-guided with atheris
(``python fuzz/run.py TARGET``); ``tests/unit/test_fuzz_targets.py`` replays the
regressions under ``fuzz/regressions/`` and a short hypothesis run of each.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import grpc
import jwt
from google.protobuf.message import DecodeError
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

# Imported here, inside fuzz/run.py's instrumentation, so that their coverage guides campaigns.
from gazette import auth
from gazette.broker.http_gateway import (
    BadRequest,
    UnsupportedEncoding,
    parse_append_request,
    parse_read_request,
)
from gazette.consumer.shardspace import parse_yaml as parse_shard_yaml
from gazette.errors import GazetteError
from gazette.journalspace import apply_request
from gazette.message.errors import MessageError
from gazette.message.framing import CSVFraming, FixedFraming, JSONFraming
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import validate, validate_consumer
from gazette.protocol.labels import LabelSelector
from gazette.recoverylog import ops
from gazette.recoverylog.errors import RecoveryLogError
from gazette.recoverylog.fsm import FSM
from gazette.rpc import frames as f
from gazette.rpc.server import RpcServer, ServerConnection

__all__ = ["TARGETS", "RecordingTransport"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


# -- HTTP/2, HPACK and gRPC framing: one server connection ---------------------------------

class RecordingTransport(asyncio.Transport):
    """A transport that keeps what is written (``out``) and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += bytes(data)

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.out += bytes(p)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _sum(requests: Any, context: Any) -> bytes:
    n = 0
    async for r in requests:
        n += len(r)
    return str(n).encode()


_loop = asyncio.new_event_loop()


def h2_connection(data: bytes) -> None:
    """Bytes after the client preface (and its SETTINGS frame), in two chunks (split at the first byte's value), into
    a server hosting a unary echo and a client-streaming sum; the connection's own tasks run
    to completion. Its output must split into frames."""
    async def run() -> None:
        server = RpcServer(max_message=1 << 16)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("fuzz.Svc", {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Sum": grpc.stream_unary_rpc_method_handler(_sum)})])
        conn = ServerConnection(server)
        transport = RecordingTransport()
        conn.connection_made(transport)
        cut = data[0] % (len(data) + 1) if data else 0
        # The preface's SETTINGS frame is ours: a fuzzed first frame that is not SETTINGS
        # ends the connection at once (RFC 9113 3.4), which would leave the rest unexplored.
        for chunk in (PREFACE + f.settings_frame({}) + data[:cut], data[cut:]):
            if not transport.closed and chunk:
                conn.data_received(chunk)
        conn.flush()
        for _ in range(3):  # let handlers started by the input run and answer
            await asyncio.sleep(0)
        conn.connection_lost(None)
        await server.handlers.aclose()
        reader = f.FrameReader(f.MAX_FRAME_LIMIT)
        out = bytes(transport.out)
        list(reader.feed(out))  # our own output is well-formed frames
    _loop.run_until_complete(run())


def grpc_messages(data: bytes) -> None:
    """gRPC length-prefixed messages from DATA payloads cut at varying points."""
    reader = f.MessageReader(1 << 16)
    step = (data[0] % 7 + 1) if data else 1
    view = memoryview(data)
    with contextlib.suppress(f.ProtocolError):  # a message over the limit
        for i in range(0, len(data), step):
            reader.feed(view[i:i + step])


def http2_frames(data: bytes) -> None:
    reader = f.FrameReader(1 << 14)
    step = (data[0] % 13 + 1) if data else 1
    with contextlib.suppress(f.ProtocolError):  # a frame over the limit
        for i in range(0, len(data), step):
            list(reader.feed(data[i:i + step]))


# -- requests into each RPC handler's validation -----------------------------------------

_REQUESTS: list[tuple[Any, Callable[[Any], None]]] = [
    (pb.ListRequest, validate.validate_list_request),
    (pb.ApplyRequest, validate.validate_apply_request),
    (pb.ReadRequest, validate.validate_read_request),
    (pb.AppendRequest, validate.validate_append_request),
    (pb.ReplicateRequest, validate.validate_replicate_request),
    (pb.FragmentsRequest, validate.validate_fragments_request),
    (pc.ListRequest, validate_consumer.validate_shard_list_request),
    (pc.ApplyRequest, validate_consumer.validate_shard_apply_request),
    (pc.StatRequest, validate_consumer.validate_stat_request),
]


def rpc_requests(data: bytes) -> None:
    """The first byte picks a request type; the rest is parsed and validated."""
    if not data:
        return
    cls, check = _REQUESTS[data[0] % len(_REQUESTS)]
    try:
        req = cls.FromString(data[1:])
    except DecodeError:
        return
    with contextlib.suppress(GazetteError):
        check(req)


# -- text parsers --------------------------------------------------------------------------

def selector(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        sel = LabelSelector.parse(text)
    except GazetteError:
        return
    again = LabelSelector.parse(sel.format())
    assert again == sel, (text, sel.format())


def journal_specs(data: bytes) -> None:
    with contextlib.suppress(GazetteError, ValueError):
        apply_request(data.decode("utf-8", "replace"))


def shard_specs(data: bytes) -> None:
    with contextlib.suppress(GazetteError, ValueError):
        parse_shard_yaml(data.decode("utf-8", "replace"))


class _Request:
    """What the gateway's parsers read of an aiohttp request (its path match, method, query,
    headers)."""

    def __init__(self, method: str, journal: str, query: str, encoding: str | None) -> None:
        self.method = method
        self.match_info = {"journal": journal}
        self.query = MultiDictProxy(MultiDict(parse_qsl(query, keep_blank_values=True)))
        headers = CIMultiDict[str]()
        if encoding is not None:
            headers["Content-Encoding"] = encoding
        self.headers = CIMultiDictProxy(headers)


def gateway_request(data: bytes) -> None:
    """A gateway path, query and content coding (``journal?key=value#coding``) through the
    read and append parsers."""
    text = data.decode("utf-8", "replace")
    text, hash_, coding = text.partition("#")
    journal, _, query = text.partition("?")
    for method, parse in (("GET", parse_read_request), ("HEAD", parse_read_request),
                          ("PUT", parse_append_request)):
        with contextlib.suppress(BadRequest, UnsupportedEncoding):
            parse(_Request(method, journal, query, coding if hash_ else None))  # type: ignore[arg-type]


_KEYED = auth.KeyedAuth("c2VjcmV0 AA==", clock=lambda: 1_800_000_000.0)


def auth_token(data: bytes) -> None:
    """A bearer value as given (odd first byte), or claims built from the input and signed with
    the verifier's key (even), so that the claims' parsing is reached: ``cap`` and times from
    the first bytes, then labels ``name=value`` (include) or ``!name=value`` (exclude)."""
    if not data:
        return
    if data[0] & 1:
        text = data[1:].decode("utf-8", "replace")
        with contextlib.suppress(auth.AuthError):
            _KEYED.verify(text, auth.READ)
        return
    head, text = data[1:13].ljust(12, b"\0"), data[13:].decode("utf-8", "replace")
    cap = int.from_bytes(head[:4], "big") - (1 << 31) * (head[0] >> 7)
    iat = 1_800_000_000 + int.from_bytes(head[4:8], "big", signed=True) % 7200 - 3600
    exp = iat + int.from_bytes(head[8:12], "big", signed=True) % 7200 - 60
    sets: dict[str, list[dict[str, Any]]] = {"include": [], "exclude": []}
    for item in text.split(","):
        name, _, value = item.partition("=")
        which = "exclude" if name.startswith("!") else "include"
        sets[which].append({"name": name.lstrip("!").removesuffix(":prefix"), "value": value,
                            "prefix": name.endswith(":prefix")})
    body: dict[str, Any] = {"cap": cap, "iat": iat, "exp": exp,
                            "sel": {k: {"labels": v or None} for k, v in sets.items()}}
    token = jwt.encode(body, b"secret", algorithm="HS256")
    with contextlib.suppress(auth.AuthError):
        claims = _KEYED.verify(f"Bearer {token}", auth.READ)
        assert claims.capability & auth.READ and 0 <= claims.capability <= auth.ALL


# -- message framings and recovery logs ----------------------------------------------------

def _framing(framing: Any, data: bytes) -> None:
    final = bool(data[:1]) and data[0] & 1 == 1
    with contextlib.suppress(MessageError):
        framing.unpack(data, final)
    with contextlib.suppress(MessageError):
        framing.decode(data, final)


def json_lines(data: bytes) -> None:
    _framing(JSONFraming(), data)


def csv_lines(data: bytes) -> None:
    _framing(CSVFraming(), data)


def fixed_frames(data: bytes) -> None:
    _framing(FixedFraming(), data)


def recovery_log(data: bytes) -> None:
    """Recorded ops into the FSM, as the player applies them. The input is a sequence of (length
    byte, that many bytes of RecordedOp); each op that parses gets the seq_no and chained
    CRC32-C checksum the FSM expects (which no fuzzer forges), is framed as the recorder frames
    it and read back through the fixed framing, then applied."""
    fsm = FSM("log")
    framing = FixedFraming()
    i = 0
    while i < len(data):
        n = data[i]
        raw, i = data[i + 1:i + 1 + n], i + 1 + n
        try:
            op = ops.decode_op(raw)
        except ValueError:
            continue
        op.seq_no, op.checksum = fsm.next_seq_no, fsm.next_checksum
        if fsm._hinted_segments:  # noqa: SLF001 - never set here: no hints
            return
        frame, message = ops.encode_op(op)
        unpacked = framing.unpack(frame, True)
        assert unpacked.frames == [message], "a recorded op's frame reads back as itself"
        with contextlib.suppress(RecoveryLogError):
            fsm.apply(op, message)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "h2_connection": h2_connection,
    "http2_frames": http2_frames,
    "grpc_messages": grpc_messages,
    "rpc_requests": rpc_requests,
    "selector": selector,
    "journal_specs": journal_specs,
    "shard_specs": shard_specs,
    "gateway_request": gateway_request,
    "auth_token": auth_token,
    "json_lines": json_lines,
    "csv_lines": csv_lines,
    "fixed_frames": fixed_frames,
    "recovery_log": recovery_log,
}
