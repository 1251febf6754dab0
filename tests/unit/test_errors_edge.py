"""The error root and the one edge that maps errors to gRPC and HTTP statuses."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import gazette
from gazette.broker.append import AppendStreamError
from gazette.broker.flow import FlowControlUnderflow
from gazette.broker.pipeline import ReplicationError
from gazette.errors import GazetteError, ValidationError
from gazette.server.edge import grpc_edge, http_error


def _public_exception_classes() -> list[type[BaseException]]:
    out = []
    for info in pkgutil.walk_packages(gazette.__path__, "gazette."):
        if "_pb2" in info.name or info.name.startswith("gazette.testing"):
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and not name.startswith("_")
                    and obj.__module__ == mod.__name__):
                out.append(obj)
    return out


def test_every_public_error_derives_from_the_root() -> None:
    classes = _public_exception_classes()
    assert len(classes) > 30
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, GazetteError)]
    assert strays == []


def test_one_validation_error() -> None:
    names = [c for c in _public_exception_classes() if c.__name__ == "ValidationError"]
    assert names == [ValidationError]


def test_every_grpc_code_names_a_status_code() -> None:
    for c in _public_exception_classes():
        assert isinstance(getattr(grpc.StatusCode, c.grpc_code), grpc.StatusCode), c  # type: ignore[attr-defined]
        assert 400 <= c.http_status < 600, c  # type: ignore[attr-defined]


class _Aborted(grpc.aio.AbortError):  # type: ignore[misc]
    pass


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted()


class _Svc:
    def __init__(self, err: BaseException | None) -> None:
        self.err = err

    @grpc_edge
    async def Unary(self, request: Any, context: Any) -> str:
        if self.err is not None:
            raise self.err
        return "ok"

    @grpc_edge
    async def Stream(self, request: Any, context: Any) -> AsyncIterator[str]:
        yield "first"
        if self.err is not None:
            raise self.err
        yield "second"


@pytest.mark.parametrize(("err", "code"), [
    (ValidationError("journal", "is required"), grpc.StatusCode.INVALID_ARGUMENT),
    (AppendStreamError("bad chunk"), grpc.StatusCode.INVALID_ARGUMENT),
    (ReplicationError("peer gone"), grpc.StatusCode.UNAVAILABLE),
    (FlowControlUnderflow(), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (GazetteError("unclassified"), grpc.StatusCode.UNKNOWN),
])
async def test_grpc_edge_maps_gazette_errors(err: GazetteError, code: grpc.StatusCode) -> None:
    ctx = _Context()
    with pytest.raises(_Aborted):
        await _Svc(err).Unary(None, ctx)
    assert ctx.aborted == (code, str(err))

    ctx = _Context()
    got = []
    with pytest.raises(_Aborted):
        async for r in _Svc(err).Stream(None, ctx):
            got.append(r)
    assert got == ["first"]
    assert ctx.aborted == (code, str(err))


async def test_grpc_edge_tells_nothing_of_bugs_and_leaves_cancellation_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    secret = OSError(2, "No such file or directory", "/var/lib/gazette/secret-path")
    ctx = _Context()
    with pytest.raises(_Aborted):
        await _Svc(secret).Unary(None, ctx)
    assert ctx.aborted is not None and ctx.aborted[0] is grpc.StatusCode.UNKNOWN
    assert "secret-path" not in ctx.aborted[1] and "OSError" not in ctx.aborted[1]
    ident = ctx.aborted[1].split("incident ")[1].split(";")[0]
    logged = [r for r in caplog.records if getattr(r, "incident", None) == ident]
    assert logged and logged[0].exc_info is not None  # The log keeps the traceback.
    ctx = _Context()
    with pytest.raises(_Aborted):
        async for _ in _Svc(secret).Stream(None, ctx):
            pass
    assert ctx.aborted is not None and "secret-path" not in ctx.aborted[1]
    err = asyncio.CancelledError()
    ctx = _Context()
    with pytest.raises(asyncio.CancelledError):
        await _Svc(err).Unary(None, ctx)
    with pytest.raises(asyncio.CancelledError):
        async for _ in _Svc(err).Stream(None, ctx):
            pass
    assert ctx.aborted is None
    assert await _Svc(None).Unary(None, _Context()) == "ok"


def test_http_error() -> None:
    r = http_error(ValidationError("offset", "must be >= 0"))
    assert (r.status, r.text) == (400, "offset: must be >= 0\n")
    r = http_error(ReplicationError("peer gone"))
    assert (r.status, r.text) == (500, "ReplicationError: peer gone\n")
    r = http_error(KeyError("/a/secret/path"))
    assert r.status == 500 and r.text is not None
    assert r.text.startswith("internal error (incident ") and "secret" not in r.text
