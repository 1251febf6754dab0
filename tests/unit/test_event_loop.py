"""The event loop a process runs on (``gazette.server.loop``), and the transport's duck-typed
view of another loop's transports (``gazette.rpc.connection.stream_transport``)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gazette.rpc.connection import stream_transport
from gazette.server import loop as loops

pytestmark = pytest.mark.both_loops

ROOT = Path(__file__).resolve().parents[2]


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_prefers_uvloop_and_asyncio_is_asyncio_run(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("uvloop")
    with caplog.at_level(logging.INFO, logger="gazette.server.loop"):
        assert loops.run(_loop_module(), "auto").startswith("uvloop")
        assert loops.run(_loop_module(), "UVLoop").startswith("uvloop")
        assert loops.run(_loop_module(), "asyncio").startswith("asyncio")
    lines = [r.getMessage() for r in caplog.records if r.name == "gazette.server.loop"]
    assert len(lines) == 3 and lines[0].startswith("event loop: uvloop 0.") and lines[2] == "event loop: asyncio"
    assert loops.loop_factory("asyncio") == ("asyncio", None)  # made exactly as asyncio.run makes it


def test_a_bad_name_exits_naming_the_flag() -> None:
    coro = _loop_module()
    with pytest.raises(SystemExit, match=r"invalid --event-loop 'tokio' \(expected auto, uvloop, asyncio\)"):
        loops.run(coro, "tokio")


def test_missing_uvloop_exits_naming_the_extra_and_auto_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    with pytest.raises(SystemExit, match=r"uvloop is not installed .*pip install 'gazette\[uvloop\]'"):
        loops.loop_factory("uvloop")
    assert loops.loop_factory("auto") == ("asyncio", None)
    assert loops.run(_loop_module(), "auto").startswith("asyncio")


def test_serve_refuses_a_missing_uvloop_before_it_starts() -> None:
    """``gazette serve --event-loop uvloop`` without uvloop: one line, exit status 1, and no
    etcd dialled (none runs at the address given)."""
    code = ("import sys; sys.modules['uvloop'] = None; from gazette.cli.serve import main; "
            "sys.exit(main(['serve', '--event-loop', 'uvloop', '--etcd.address', 'http://127.0.0.1:9', "
            "'--broker.file-root', sys.argv[1]]))")
    with subprocess.Popen([sys.executable, "-c", code, str(ROOT / "var" / "never")], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    # Only our line (an old dependency may warn on stderr as it imports: google-crc32c 1.5's
    # pure-Python fallback on the floors job), and no traceback.
    assert "Traceback" not in err
    assert [ln for ln in err.strip().splitlines() if ln.startswith("gazette:")] == [
        "gazette: --event-loop uvloop: uvloop is not installed (import of uvloop halted; None in "
        "sys.modules); install the uvloop extra: pip install 'gazette[uvloop]'"]
    assert not (ROOT / "var" / "never").exists()


@pytest.mark.parametrize("flag,keyword,want", [
    ("asyncio", "uvloop", "uvloop"), ("uvloop", None, "uvloop"), ("uvloop", "asyncio", "asyncio"),
    ("auto", None, "uvloop")])
def test_run_consumer_runs_on_the_loop_its_keyword_or_flag_names(
        monkeypatch: pytest.MonkeyPatch, flag: str, keyword: str | None, want: str) -> None:
    pytest.importorskip("uvloop")
    from gazette.consumer import run as consumer_run

    ran: list[str] = []

    async def consume(config: Any, app: Any) -> None:
        ran.append(await _loop_module())

    monkeypatch.setattr(consumer_run, "_consume", consume)
    monkeypatch.setattr(consumer_run, "setup_logging", lambda level, fmt: None)  # keep pytest's handlers
    app: Any = object()
    assert consumer_run.run_consumer(app, ["--event-loop", flag], event_loop=keyword) == 0
    assert len(ran) == 1 and ran[0].startswith(want)
    monkeypatch.setenv("GAZETTE_EVENT_LOOP", "nope")  # read as the flag's default
    with pytest.raises(SystemExit, match="invalid --event-loop 'nope'"):
        consumer_run.run_consumer(app, [])


async def test_both_loops_modules_run_on_the_loop_their_id_names(request: pytest.FixtureRequest) -> None:
    want = "uvloop" if request.node.name.endswith("[uvloop]") else "asyncio"
    assert (await _loop_module()).startswith(want)


async def test_stream_transport_accepts_this_loops_transports_and_refuses_half_ones() -> None:
    """A real transport of the running loop (uvloop's subclass no asyncio class) passes as it
    is; an object lacking what the protocols call is refused, naming what it lacks."""
    got: asyncio.Future[asyncio.BaseTransport] = asyncio.get_running_loop().create_future()

    class Grab(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            got.set_result(transport)

    server = await asyncio.get_running_loop().create_server(Grab, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        transport = await got
        assert stream_transport(transport) is transport
        writer.close()
        transport.close()
    finally:
        server.close()

    class Half:
        def write(self, data: bytes) -> None: ...
        def close(self) -> None: ...

    half: Any = Half()
    with pytest.raises(TypeError, match=r"Half is not a stream transport \(it lacks writelines, abort, "):
        stream_transport(half)
