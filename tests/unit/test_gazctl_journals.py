"""gazctl journals commands, through main([...]) against the fake Journal service."""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gazette.cli.gazctl import main
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker


@dataclass
class Result:
    code: int
    out: bytes
    err: str


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create("example/journal", {"app.gazette.dev/message-type": "TestMessage",
                                       "content-type": "application/x-ndjson"})
    for i in range(3):
        cluster.create(f"foobar/part-00{i}", {"my-label": ""}, codec=pb.GZIP)
    b = await start_broker(cluster, suffix="busy-walrus")
    yield b
    await b.stop()


async def gazctl(broker: FakeBroker | None, *argv: str, stdin: bytes = b"",
                 env: dict[str, str] | None = None, home: str = "/nonexistent") -> Result:
    out, err = io.BytesIO(), io.StringIO()
    environ = {"HOME": home, "PATH": os.environ.get("PATH", "")}
    if broker is not None:
        environ["BROKER_ADDRESS"] = broker.endpoint
    environ.update(env or {})
    # gazctl runs its own event loop: give it a thread, keeping this loop serving the fake.
    code = await asyncio.to_thread(main, list(argv), stdin=io.BytesIO(stdin), stdout=out,
                                   stderr=err, env=environ)
    return Result(code, out.getvalue(), err.getvalue())


async def test_list_table_like_gazette(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "list", "--primary")
    assert r.code == 0, r.err
    assert r.out.decode() == (
        "+-----------------+-------------+\n"
        "|      NAME       |   PRIMARY   |\n"
        "+-----------------+-------------+\n"
        "| example/journal | busy-walrus |\n"
        "| foobar/part-000 | busy-walrus |\n"
        "| foobar/part-001 | busy-walrus |\n"
        "| foobar/part-002 | busy-walrus |\n"
        "+-----------------+-------------+\n")

    r = await gazctl(broker, "journals", "list", "-l", "prefix=foobar/, name not in (foobar/part-001)")
    assert r.out.decode().splitlines()[3:5] == ["| foobar/part-000 |", "| foobar/part-002 |"]

    r = await gazctl(broker, "journals", "list", "-l", "my-label", "-L", "my-label", "--rf")
    lines = r.out.decode().splitlines()
    assert lines[1] == "|      NAME       | RF | MY-LABEL |"
    assert lines[3] == "| foobar/part-000 |  1 |          |"


async def test_list_yaml_and_json(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "list", "-l", "name=example/journal", "--format", "yaml")
    assert r.code == 0, r.err
    text = r.out.decode()
    assert text.startswith("name: example/journal\nreplication: 1\nlabels:\n")
    assert "  compression_codec: SNAPPY\n" in text and "revision: 2\n" in text

    r = await gazctl(broker, "journals", "list", "-o", "json", "-l", "prefix=foobar/")
    doc = json.loads(r.out)
    assert [j["spec"]["name"] for j in doc["journals"]] == [f"foobar/part-00{i}" for i in range(3)]
    assert doc["status"] == "OK"


async def test_apply_from_stdin_dry_run_and_for_real(broker: FakeBroker) -> None:
    specs = b"""\
name: new/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
fragment:
  length: 4096
  compression_codec: GZIP
  stores:
  - file:///
  refresh_interval: 1m0s
children:
  - name: new/part-000
  - name: new/part-001
"""
    r = await gazctl(broker, "journals", "apply", "--dry-run", stdin=specs)
    assert r.code == 0, r.err
    req = pb.ApplyRequest()
    from google.protobuf import text_format

    text_format.Parse(r.out.decode(), req)
    assert [c.upsert.name for c in req.changes] == ["new/part-000", "new/part-001"]
    assert req.changes[0].upsert.fragment.length == 4096
    assert "new/part-000" not in broker.cluster.journals  # Dry run applies nothing.

    r = await gazctl(broker, "journals", "apply", stdin=specs)
    assert r.code == 0, r.err
    assert "INFO[0000] successfully applied" in r.err and f"revision={broker.cluster.revision}" in r.err
    assert broker.cluster.journals["new/part-001"].spec.fragment.compression_codec == pb.GZIP

    r = await gazctl(broker, "journals", "apply", stdin=b"name: bad\nbogus: 1\n")
    assert r.code == 1 and "failed to decode journal tree" in r.err and "bogus" in r.err


async def test_read_and_offsets(tmp_path: Path, broker: FakeBroker) -> None:
    broker.cluster.write("example/journal", b'{"Msg": "Hello, Gazette!"}\n')
    broker.cluster.roll("example/journal")
    broker.cluster.write("example/journal", b'{"Msg": "See you later alligator"}\n')
    offsets = tmp_path / "offsets.json"
    r = await gazctl(broker, "journals", "read", "-l", "name=example/journal",
                     "--offsets-out", str(offsets))
    assert r.code == 0, r.err
    assert r.out == b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'
    assert json.loads(offsets.read_text()) == {"example/journal": 62}

    broker.cluster.write("example/journal", b"more\n")
    out_file = tmp_path / "out"
    r = await gazctl(broker, "journals", "read", "-l", "name=example/journal", "--offsets",
                     str(offsets), "--offsets-out", str(offsets), "-o", str(out_file))
    assert r.code == 0, r.err
    assert out_file.read_bytes() == b"more\n"
    assert json.loads(offsets.read_text()) == {"example/journal": 67}
    assert (tmp_path / "offsets.json.previous").exists()

    r = await gazctl(broker, "journals", "read", "-l", "name=example/journal", "--offset", "20")
    assert r.out.startswith(b'tte!"}\n{')


async def test_read_multiplexes_whole_fragments(broker: FakeBroker) -> None:
    for i in range(3):
        broker.cluster.write(f"foobar/part-00{i}", b"".join(b"record %d of %d\n" % (n, i) for n in range(20)))
    r = await gazctl(broker, "journals", "read", "-l", "my-label")
    assert r.code == 0, r.err
    lines = r.out.decode().splitlines()
    assert len(lines) == 60 and all(line.startswith("record ") for line in lines)


async def test_append_lines_and_none(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "append", "-l", "name=example/journal",
                     "--framing=lines", stdin=b'{"Msg": "one"}\n{"Msg": "two"}\n')
    assert r.code == 0, r.err
    assert bytes(broker.cluster.journals["example/journal"].fragments[0].content) == \
        b'{"Msg": "one"}\n{"Msg": "two"}\n'

    r = await gazctl(broker, "journals", "append", "-l", "name=example/journal",
                     stdin=b'{"Msg": "Hello, Gazctl!"}\n')
    assert r.code == 0, r.err
    assert broker.cluster.journals["example/journal"].head == 56

    # Lines spread over the journals of a selector, each whole.
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines",
                     stdin=b"".join(b"line %d\n" % i for i in range(50)))
    assert r.code == 0, r.err
    got = b"".join(bytes(f.content) for i in range(3)
                   for f in broker.cluster.journals[f"foobar/part-00{i}"].fragments)
    assert sorted(got.splitlines()) == sorted(b"line %d" % i for i in range(50))

    # Direct mapping: each record follows the name of its journal.
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines", "-m", "direct",
                     stdin=b"foobar/part-002\nhello\nno/such\nbye\n")
    assert r.code == 1 and "not found" in r.err


async def test_fragments_table(broker: FakeBroker) -> None:
    broker.cluster.write("example/journal", b"x" * 43)
    broker.cluster.roll("example/journal", persisted_at=int(time.time()) - 8 * 60 - 5)
    broker.cluster.write("example/journal", b"y" * 2322)
    r = await gazctl(broker, "journals", "fragments", "-l", "name=example/journal")
    assert r.code == 0, r.err
    lines = r.out.decode().splitlines()
    assert lines[1] == ("|     JOURNAL     | OFFSET | LENGTH  |   PERSISTED   |      SHA1       "
                        "| COMPRESSION |")
    assert lines[3].startswith("| example/journal |      0 | 43 B    | 8 minutes ago | ")
    assert lines[3].endswith("... | SNAPPY      |")
    assert lines[4].startswith("| example/journal |     43 | 2.3 KiB |               | ")

    r = await gazctl(broker, "journals", "fragments", "-l", "name=example/journal", "-o", "json")
    docs = [json.loads(line) for line in r.out.decode().splitlines()]
    assert docs[0]["spec"]["end"] == 43 and docs[0]["spec"]["compression_codec"] == pb.SNAPPY
    assert "begin" not in docs[0]["spec"]  # Zero values are omitted, as Go's json does.


async def test_bad_selector_names_position(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "list", "-l", "name in (a, b")
    assert r.code == 1
    assert r.err.count("\n") == 1 and "Traceback" not in r.err
    assert r.err.startswith("FATA[0000] failed to parse label selector")
    assert "position" in r.err


async def test_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    r = await gazctl(None, "journals", "list", env={"BROKER_ADDRESS": "http://127.0.0.1:1"})
    assert r.code == 1 and r.err.count("\n") == 1
    assert "failed to list journals" in r.err and "UNAVAILABLE" in r.err


async def test_address_from_ini_and_flag(tmp_path: Path, broker: FakeBroker) -> None:
    ini = tmp_path / ".config" / "gazette" / "gazctl.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text(f"[journals.Broker]\nAddress = {broker.endpoint}\n")
    r = await gazctl(None, "journals", "list", home=str(tmp_path))
    assert r.code == 0, r.err and b"example/journal" in r.out
    r = await gazctl(None, "journals", "list", "--broker.address", "http://127.0.0.1:1",
                     home=str(tmp_path))
    assert r.code == 1


async def test_reset_head(broker: FakeBroker) -> None:
    broker.cluster.write("example/journal", b"content")
    r = await gazctl(broker, "journals", "reset-head", "-l", "name=example/journal")
    assert r.code == 0, r.err
    assert "reset write head" in r.err
    assert ("Append", "example/journal") in broker.calls


def _editor(tmp_path: Path, script: str) -> str:
    path = tmp_path / "editor.sh"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


async def test_edit_round_trip_and_stale_revision(tmp_path: Path, broker: FakeBroker) -> None:
    editor = _editor(tmp_path, "sed -i 's/length: 1048576/length: 2048/' \"$1\"\n")
    r = await gazctl(broker, "journals", "edit", "-l", "name=example/journal",
                     env={"EDITOR": editor})
    assert r.code == 0, r.err
    assert broker.cluster.journals["example/journal"].spec.fragment.length == 2048

    # Someone else changes the journal while it is being edited: nothing is applied.
    cluster = broker.cluster
    broker.before_apply = lambda: cluster.upsert(cluster.journals["example/journal"].spec)
    editor = _editor(tmp_path, "sed -i 's/length: 2048/length: 4096/' \"$1\"\n")
    r = await gazctl(broker, "journals", "edit", "-l", "name=example/journal",
                     env={"EDITOR": editor})
    assert r.code == 1 and r.err.count("\n") == 1
    assert "stale revision" in r.err and "ETCD_TRANSACTION_FAILED" in r.err
    assert cluster.journals["example/journal"].spec.fragment.length == 2048

    unchanged = _editor(tmp_path, "true\n")
    broker.before_apply = None
    r = await gazctl(broker, "journals", "edit", "-l", "name=example/journal",
                     env={"EDITOR": unchanged})
    assert r.code == 0 and "nothing to do" in r.err


@pytest.mark.parametrize("name", sorted(__import__("gazette.cli.gazctl.journals", fromlist=["COMMANDS"]).COMMANDS))
def test_each_command_has_help_and_its_own_module(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gazette.cli.gazctl.journals import COMMANDS

    summary, _, _, command = COMMANDS[name]
    assert command.__module__ == f"gazette.cli.gazctl.journals.{name.replace('-', '_')}"
    assert main(["journals", name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gazctl journals {name}") and summary in main_help()


def main_help() -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["journals", "--help"])
    return buf.getvalue()
