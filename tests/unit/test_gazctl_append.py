"""gazctl journals append: record splitting, key mapping and flag checks, and the command
through main([...]) against the fake Journal service.

Where each key lands is checked against Gazette's own regression fixtures for modulo and
rendezvous mapping (443 and 400 partitions), so the CLI places keys as Go publishers do.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.cli.gazctl import main
from gazette.cli.gazctl.journals import append as gazctl_append_cmd
from gazette.cli.gazctl.journals.framing import (
    FixedSplitter,
    LineSplitter,
    RecordError,
    RecordMapper,
    Splitter,
    check_flags,
    router,
    splitter,
)
from gazette.message.errors import MappingError
from gazette.message.framing import FIXED_FRAME_WORD
from gazette.message.mapping import modulo_mapping, rendezvous_mapping
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.eventually import eventually
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

# Gazette's message/routines_test.go fixtures: key -> partition index.
MODULO_443 = {
    "It always": 119, "seems": 54, "impossible": 308, "until": 97, "it is done.": 179,
    "- Nelson Mandela": 437, "Shall I compare": 84, "thee to": 300, "a summer's day?": 214,
    "Thou art more": 135, "lovely and more": 118, "temperate - Shakespeare": 228,
}
RENDEZVOUS_400 = {
    "It always": 21, "seems": 179, "impossible": 50, "until": 13, "it is done.": 337,
    "- Nelson Mandela": 29, "Shall I compare": 110, "thee to": 395, "a summer's day?": 192,
    "Thou art more": 394, "lovely and more": 344, "temperate - Shakespeare": 75,
}


@dataclass
class Result:
    code: int
    out: bytes
    err: str


async def gazctl(broker: FakeBroker, *argv: str, stdin: bytes = b"") -> Result:
    out, err = io.BytesIO(), io.StringIO()
    env = {"HOME": "/nonexistent", "PATH": os.environ.get("PATH", ""),
           "BROKER_ADDRESS": broker.endpoint}
    # gazctl runs its own event loop: give it a thread, keeping this loop serving the fake.
    code = await asyncio.to_thread(main, list(argv), stdin=io.BytesIO(stdin), stdout=out,
                                   stderr=err, env=env)
    return Result(code, out.getvalue(), err.getvalue())


def content(broker: FakeBroker, journal: str) -> bytes:
    return b"".join(bytes(f.content) for f in broker.cluster.journals[journal].fragments)


def fixed(payload: bytes) -> bytes:
    return FIXED_FRAME_WORD + struct.pack("<I", len(payload)) + payload


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    for i in range(3):
        cluster.create(f"foobar/part-00{i}", {"my-label": ""})
    cluster.create("other/journal", {})
    b = await start_broker(cluster, suffix="busy-walrus")
    yield b
    await b.stop()


def listing(*names: str) -> pb.ListResponse:
    resp = pb.ListResponse()
    for name in names:
        resp.journals.add().spec.name = name
    return resp


# --- splitting ----------------------------------------------------------------------------

def split_all(split: Splitter, chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    """Feeds ``chunks`` as gazctl does; returns the records and the unsplit rest."""
    out: list[bytes] = []
    rest = b""
    for chunk in chunks:
        buf = rest + chunk
        records, used, err = split.split(buf)
        assert err is None
        out += records
        rest = buf[used:]
    return out, rest


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary().map(lambda b: b.replace(b"\n", b"")), max_size=20),
       st.lists(st.integers(min_value=0), max_size=8))
def test_lines_split_anywhere_yield_the_same_records(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    records, rest = split_all(LineSplitter(), chunked(data, cuts))
    assert records == [line + b"\n" for line in lines]
    assert rest == b""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=20),
       st.lists(st.integers(min_value=0), max_size=8))
def test_fixed_frames_split_anywhere_yield_the_same_records(payloads: list[bytes],
                                                            cuts: list[int]) -> None:
    data = b"".join(fixed(p) for p in payloads)
    records, rest = split_all(FixedSplitter(), chunked(data, cuts))
    assert records == [fixed(p) for p in payloads]
    assert rest == b""
    assert [FixedSplitter().key(r) for r in records] == payloads


def test_lines_keep_carriage_returns_and_form_feeds_inside_records() -> None:
    records, used, err = LineSplitter().split(b"a\rb\x0cc\r\nnext\npart")
    assert records == [b"a\rb\x0cc\r\n", b"next\n"] and used == 12 and err is None
    assert LineSplitter().end_error(b"part") is not None
    assert LineSplitter().end_error(b"") is None
    assert LineSplitter().key(b"Key-1\r\n") == b"Key-1"


def test_fixed_desync_and_end_of_input() -> None:
    good = fixed(b"one")
    records, used, err = FixedSplitter().split(good + b"garbage!!" + fixed(b"two"))
    assert records == [good] and used == len(good)
    assert err is not None and "de-synchronization" in str(err)
    assert FixedSplitter().end_error(b"\n") is None  # Gazette tolerates one trailing newline.
    assert FixedSplitter().end_error(fixed(b"cut")[:-1]) is not None


def test_base64_keys() -> None:
    split = splitter("lines", True)
    assert split.key(base64.b64encode(b"\x00\xffkey") + b"\n") == b"\x00\xffkey"
    with pytest.raises(RecordError, match="base64"):
        split.key(b"not base64!\n")


@pytest.mark.parametrize(("framing", "mapping", "b64", "problem"), [
    ("none", "random", False, None),
    ("none", "modulo", False, "'none' --framing may only be used with 'random' --mapping"),
    ("none", "direct", False, "'none' --framing may only be used with 'random' --mapping"),
    ("lines", "rendezvous", True, None),
    ("lines", "random", True, "--base64 requires --framing 'lines' and not --mapping 'random'"),
    ("fixed", "modulo", True, "--base64 requires --framing 'lines' and not --mapping 'random'"),
    ("fixed", "direct", False, None),
])
def test_flag_combinations(framing: str, mapping: str, b64: bool, problem: str | None) -> None:
    assert check_flags(framing, mapping, b64) == problem


# --- mapping ------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=30), st.integers(1, 9))
def test_router_places_keys_as_message_mappings(keys: list[bytes], count: int) -> None:
    parts = listing(*(f"p/{i:03d}" for i in range(count)))
    mod = modulo_mapping(lambda k: k, lambda: parts)
    hrw = rendezvous_mapping(lambda k: k, lambda: parts)
    modulo, rendezvous = router("modulo", lambda: parts), router("rendezvous", lambda: parts)
    for k in keys:
        assert modulo(k) == mod(k)[0]
        assert rendezvous(k) == hrw(k)[0]


def test_record_mapper_keeps_order_and_reports_the_failing_record() -> None:
    parts = listing("a", "b")
    mapper = RecordMapper(LineSplitter(), router("direct", lambda: parts), keyed=True)
    # A key may arrive in one block and its record in the next.
    first = mapper.feed([b"a\n", b"1\n", b"b\n", b"2\n", b"a\n"])
    assert first.batches == {"a": [b"1\n"], "b": [b"2\n"]} and mapper.pending_key == b"a"
    second = mapper.feed([b"3\n", b"c\n", b"4\n", b"a\n", b"5\n"])
    assert second.batches == {"a": [b"3\n"]}
    assert isinstance(second.error, MappingError) and "'c' not found" in str(second.error)
    assert second.stage == "mapping partition key to journal"


def test_empty_listing_is_a_mapping_error() -> None:
    with pytest.raises(MappingError):
        router("modulo", pb.ListResponse)(b"key")


# --- the command --------------------------------------------------------------------------

async def test_modulo_and_rendezvous_place_keys_as_gazette_fixtures() -> None:
    # Rendezvous hashes journal names too: the fixtures' names are a/topic/part-NNN.
    cluster = FakeCluster()
    for i in range(443):
        cluster.create(f"a/topic/part-{i:03d}", {"mod": "", **({"hrw": ""} if i < 400 else {})})
    b = await start_broker(cluster)
    try:
        total = 0
        for label, mapping, fixture in [("mod", "modulo", MODULO_443),
                                        ("hrw", "rendezvous", RENDEZVOUS_400)]:
            records = {k: f'{{"key": "{k}", "by": "{mapping}"}}\n'.encode() for k in fixture}
            data = b"".join(k.encode() + b"\n" + rec for k, rec in records.items())
            r = await gazctl(b, "journals", "append", "-l", label, "--framing", "lines",
                             "--mapping", mapping, stdin=data)
            assert r.code == 0, r.err
            for k, idx in fixture.items():
                assert records[k] in content(b, f"a/topic/part-{idx:03d}"), (mapping, k)
            # Keys are not appended, and each record went to exactly one journal.
            total += sum(map(len, records.values()))
            assert sum(len(content(b, n)) for n in cluster.journals) == total
    finally:
        await b.stop()


async def test_keyed_records_keep_their_order_per_journal(
        broker: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gazctl_append_cmd, "_READ_BLOCK", 7)  # Keys and records span blocks.
    keys = [f"user-{i % 5}".encode() for i in range(60)]
    data = b"".join(k + b"\n" + b"%s seq=%d\n" % (k, i) for i, k in enumerate(keys))
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines",
                     "-m", "rendezvous", "--log.level", "debug", stdin=data)
    assert r.code == 0, r.err
    names = [f"foobar/part-00{i}" for i in range(3)]
    hrw = rendezvous_mapping(lambda k: k, lambda: listing(*names))
    for name in names:
        got = content(broker, name).splitlines()
        want = [b"%s seq=%d" % (k, i) for i, k in enumerate(keys) if hrw(k)[0] == name]
        assert got == want
    assert r.err.count("mapped partition key to journal") == 60


async def test_base64_keys_and_fixed_framing(broker: FakeBroker) -> None:
    names = [f"foobar/part-00{i}" for i in range(3)]
    mod = modulo_mapping(lambda k: k, lambda: listing(*names))
    key = b"\x00\x01binary"
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines", "-m",
                     "modulo", "--base64", stdin=base64.b64encode(key) + b"\nrecord\n")
    assert r.code == 0, r.err
    assert content(broker, mod(key)[0]) == b"record\n"

    frames = fixed(b"k2") + fixed(b"payload-2") + fixed(b"k3") + fixed(b"payload-3")
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "fixed", "-m",
                     "modulo", stdin=frames + b"\n")
    assert r.code == 0, r.err
    # The header is kept with the record; keys are frame payloads.
    assert fixed(b"payload-2") in content(broker, mod(b"k2")[0])
    assert fixed(b"payload-3") in content(broker, mod(b"k3")[0])
    assert sum(len(content(broker, n)) for n in names) == len(b"record\n") + 2 * len(fixed(b"payload-2"))


async def test_direct_mapping_names_the_journal(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "append", "-l", "prefix=foobar/", "-f", "lines",
                     "-m", "direct", stdin=b"foobar/part-002\nto two\nfoobar/part-000\nto zero\n"
                                             b"other/journal\nnot selected\nfoobar/part-001\nlost\n")
    assert r.code == 1
    assert "mapping partition key to journal: journal 'other/journal' not found" in r.err
    assert content(broker, "foobar/part-002") == b"to two\n"
    assert content(broker, "foobar/part-000") == b"to zero\n"  # Records before the bad one.
    assert content(broker, "other/journal") == b"" and content(broker, "foobar/part-001") == b""


async def test_input_errors(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "append", "-l", "name=other/journal", "-f", "lines",
                     stdin=b"whole\nno newline")
    assert r.code == 1 and "unpacking record: unexpected EOF" in r.err
    assert content(broker, "other/journal") == b"whole\n"

    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines", "-m",
                     "modulo", "--base64", stdin=b"!!!\nrecord\n")
    assert r.code == 1 and "unpacking partition key: illegal base64" in r.err

    r = await gazctl(broker, "journals", "append", "-l", "name=other/journal", "-f", "fixed",
                     stdin=fixed(b"ok") + b"junk-junk")
    assert r.code == 1 and "de-synchronization" in r.err
    assert content(broker, "other/journal") == b"whole\n" + fixed(b"ok")

    # A key without its record is dropped with a warning (Gazette drops it silently).
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines", "-m",
                     "modulo", stdin=b"k\nv\ndangling\n")
    assert r.code == 0 and "partition key but no record" in r.err and "dangling" in r.err


async def test_flag_and_selector_errors(broker: FakeBroker) -> None:
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-m", "modulo")
    assert r.code == 1
    assert r.err.startswith("FATA") and "'none' --framing may only be used with 'random'" in r.err
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-f", "lines", "--base64")
    assert r.code == 1 and "--base64 requires --framing 'lines'" in r.err
    r = await gazctl(broker, "journals", "append", "-l", "my-label", "-m", "hashring")
    assert r.code == 2 and "invalid choice" in r.err
    r = await gazctl(broker, "journals", "append", "-l", "a in (b")
    assert r.code == 1 and "failed to parse label selector" in r.err

    # No journal matches: nothing to map to (only once there is a record).
    r = await gazctl(broker, "journals", "append", "-l", "nope", stdin=b"x")
    assert r.code == 1 and "mapping to journal" in r.err
    r = await gazctl(broker, "journals", "append", "-l", "nope", "-f", "lines", "-m", "modulo",
                     stdin=b"k\nv\n")
    assert r.code == 1 and "mapping partition key to journal" in r.err and "empty" in r.err
    r = await gazctl(broker, "journals", "append", "-l", "nope", "-f", "lines")
    assert r.code == 0, r.err


async def test_journals_created_while_appending_are_mapped_to(broker: FakeBroker) -> None:
    """The selector is listed again while appending (Gazette watches it)."""
    r_fd, w_fd = os.pipe()
    stdin, feed = os.fdopen(r_fd, "rb"), os.fdopen(w_fd, "wb")
    out, err = io.BytesIO(), io.StringIO()
    env = {"HOME": "/nonexistent", "BROKER_ADDRESS": broker.endpoint}
    run = asyncio.create_task(asyncio.to_thread(
        main, ["journals", "append", "-l", "prefix=foobar/", "-f", "lines", "-m", "direct",
               "--interval", "0.01"], stdin=stdin, stdout=out, stderr=err, env=env))
    try:
        feed.write(b"foobar/part-001\nbefore\n")
        feed.flush()
        await eventually(lambda: content(broker, "foobar/part-001") == b"before\n", "the first append lands", 10.0)
        broker.cluster.create("foobar/part-new", {})
        lists = sum(1 for c in broker.calls if c[0] == "List")
        # Two more listings: at least one began after the journal was created.
        await eventually(lambda: sum(1 for c in broker.calls if c[0] == "List") >= lists + 2, "two more listings", 10.0)
        feed.write(b"foobar/part-new\nafter\n")
        feed.close()
        assert await run == 0, err.getvalue()
    finally:
        if not feed.closed:
            feed.close()
        await asyncio.gather(run, return_exceptions=True)
        stdin.close()
    assert content(broker, "foobar/part-new") == b"after\n"

