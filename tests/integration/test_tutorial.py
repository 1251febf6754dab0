"""The broker tutorial, step by step, against real brokers, etcd and the installed entry points.

Each test starts its own cluster (one broker named ``busy-walrus`` in zone ``local``, as in the
tutorial) and replays a section of the tutorial: HTTP appends and reads, raced appends,
blocking reads, gazctl's journal commands, label selectors, fragment files, and a second broker
taking over a share of the journals. Every wait polls a condition under a deadline.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import select
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from gazette.fragment import codecs
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.cluster import BrokerProcess, Cluster, console_script
from gazette.testing.eventually import eventually_sync

EXAMPLE_YAML = """\
name: example/journal
replication: 1
labels:
- name: app.gazette.dev/message-type
  value: TestMessage
- name: app.gazette.dev/region
  value: local
- name: app.gazette.dev/tag
  value: demo
- name: content-type
  value: application/x-ndjson
fragment:
  length: 131072
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1m0s
"""

# As in the tutorial, with its children listed in name order (Gazette requires sorted children).
FOOBAR_YAML = """\
name: foobar/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
- name: my-label
fragment:
  length: 4096
  compression_codec: GZIP
  stores:
  - file:///
  refresh_interval: 1m0s
  flush_interval: 1m0s
children:
  - name: foobar/part-000
  - name: foobar/part-001
  - name: foobar/part-002
"""

FIRST_APPEND = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'
APPLIED = re.compile(r"^INFO\[\d{4}\] successfully applied\s+revision=(\d+)$")
DEADLINE = 30.0


# --- helpers ------------------------------------------------------------------------------


@pytest.fixture
def walrus(cluster: Cluster) -> Iterator[BrokerProcess]:
    """The tutorial's stand-alone broker; afterwards, no broker of the test logged a traceback."""
    yield cluster.add_broker("local", "busy-walrus")
    for b in cluster.brokers:
        assert "Traceback" not in b.log_text(), b.log_text()[-4000:]


def apply_ok(cluster: Cluster, spec: str, *, assigned: bool = True) -> int:
    """Applies `spec` with gazctl, asserts the tutorial's log line, and (by default) waits
    until every journal has a primary; returns the applied revision.

    The wait is the tutorial's "our new journals now appear in list, assigned to our broker":
    as in Gazette, an append racing the allocator's first assignment is refused
    (NO_JOURNAL_PRIMARY_BROKER), which a person typing the next command never hits.
    """
    rc, out, err = cluster.gazctl("journals", "apply", stdin=spec)
    assert rc == 0, err
    assert out == ""
    m = APPLIED.match(err.strip())
    assert m is not None, err
    if assigned:
        eventually_sync(lambda: all(p not in ("", "<none>") for p in primaries(cluster).values()), "every journal has a primary", DEADLINE)
    return int(m.group(1))


def _describe(err: urllib.error.HTTPError) -> str:
    return f"{err.code} {err.reason}: {err.read().decode(errors='replace')!r}"


def http_put(url: str, body: bytes) -> dict[str, str]:
    req = urllib.request.Request(url, data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as resp:  # noqa: S310 - loopback
            assert resp.status == 204, resp.status
            return dict(resp.headers)
    except urllib.error.HTTPError as err:
        raise AssertionError(f"PUT {url}: {_describe(err)}") from None


def http_get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=DEADLINE) as resp:  # noqa: S310 - loopback
            assert resp.status == 206, resp.status
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise
        raise AssertionError(f"GET {url}: {_describe(err)}") from None


def _center(text: str, width: int) -> str:
    left = (width - len(text)) // 2  # an odd pad's extra space goes right, as in the tutorial
    return " " * left + text + " " * (width - len(text) - left)


def table(*rows: tuple[str, ...], headers: tuple[str, ...] = ("NAME",)) -> str:
    """Renders a gazctl table the way the tutorial shows them, for exact comparison."""
    widths = [max(len(str(c)) for c in col) + 2 for col in zip(headers, *rows, strict=True)]
    rule = "+" + "+".join("-" * w for w in widths) + "+"

    def line(cells: tuple[str, ...], center: bool) -> str:
        return "|" + "|".join(
            (_center(c, w) if center else " " + c.ljust(w - 1))
            for c, w in zip(cells, widths, strict=True)
        ) + "|"

    return "\n".join([rule, line(headers, True), rule, *(line(r, False) for r in rows), rule]) + "\n"


def list_names(cluster: Cluster, selector: str) -> list[str]:
    rc, out, err = cluster.gazctl("journals", "list", "-l", selector)
    assert rc == 0, err
    return [line.strip("| ") for line in out.splitlines()[3:-1]]


def primaries(cluster: Cluster, broker: BrokerProcess | None = None) -> dict[str, str]:
    rc, out, err = cluster.gazctl("journals", "list", "--primary", broker=broker)
    assert rc == 0, err
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[3:-1]]
    return {name: primary for name, primary in rows}


class LineStream:
    """Reads a child process's stdout incrementally, with deadlines (no blocking forever)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buf = b""

    def read_until(self, needle: bytes, timeout: float = DEADLINE) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{needle!r} not seen; got {self.buf!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise EOFError(f"stream ended before {needle!r}; got {self.buf!r}")
                self.buf += chunk
        return self.buf


@pytest.fixture
def popen_reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


# --- First steps: apply, PUT, GET, offsets ----------------------------------------------------


def test_first_steps(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    url = walrus.url("example/journal")

    headers = http_put(url, FIRST_APPEND)
    assert (headers["X-Commit-Begin"], headers["X-Commit-End"]) == ("0", str(len(FIRST_APPEND)))
    assert headers["X-Commit-SHA1-Sum"] == hashlib.sha1(FIRST_APPEND).hexdigest()

    assert http_get(url) == FIRST_APPEND
    # Offsets are byte offsets: the tutorial's "not valid JSON" tail.
    assert http_get(url + "?offset=16") == b'Gazette!"}\n{"Msg": "See you later alligator"}\n'
    assert http_get(url + "?offset=0") == FIRST_APPEND


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_first_steps_with_curl(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    url = walrus.url("example/journal")
    put = subprocess.run(["curl", "-sS", "--fail-with-body", "-X", "PUT", "--data-binary", "@-", url],
                         input=FIRST_APPEND, capture_output=True, timeout=DEADLINE, check=False)
    assert put.returncode == 0, put.stderr
    assert put.stdout == b""
    get = subprocess.run(["curl", "-sS", "-f", url], capture_output=True, timeout=DEADLINE,
                         check=False)
    assert get.returncode == 0, get.stderr
    assert get.stdout == FIRST_APPEND
    tail = subprocess.run(["curl", "-sS", "-f", url + "?offset=16"], capture_output=True,
                          timeout=DEADLINE, check=False)
    assert tail.stdout == b'Gazette!"}\n{"Msg": "See you later alligator"}\n'


# --- Concurrent appends -------------------------------------------------------------------


def test_raced_appends_land_whole_and_once(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    url = walrus.url("example/journal")
    http_put(url, FIRST_APPEND)

    n = 20
    start = threading.Barrier(n)

    def race(i: int) -> tuple[int, int]:
        start.wait(DEADLINE)
        headers = http_put(url, f'{{"Msg": "Race!", "N": {i}}}\n'.encode())
        return int(headers["X-Commit-Begin"]), int(headers["X-Commit-End"])

    with ThreadPoolExecutor(n) as pool:
        spans = sorted(pool.map(race, range(1, n + 1)))

    # Commits tile the journal after the first append: no gaps, no overlaps.
    assert spans[0][0] == len(FIRST_APPEND)
    for (_, end), (begin, _) in zip(spans, spans[1:], strict=False):
        assert end == begin

    content = http_get(url)
    assert len(content) == spans[-1][1]
    assert content.startswith(FIRST_APPEND)
    lines = [json.loads(line) for line in content.splitlines()]  # each line whole, valid JSON
    races = [m["N"] for m in lines[2:]]
    assert sorted(races) == list(range(1, n + 1))
    assert all(m["Msg"] == "Race!" for m in lines[2:])


# --- Streaming reads ----------------------------------------------------------------------


def test_blocking_read_streams_later_appends(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    url = walrus.url("example/journal")
    http_put(url, FIRST_APPEND)

    conn = http.client.HTTPConnection("127.0.0.1", walrus.port, timeout=DEADLINE)
    opened: dict[str, http.client.HTTPResponse] = {}
    ready = threading.Event()

    def open_stream() -> None:
        conn.request("GET", "/example/journal?block=true&offset=-1")
        opened["resp"] = conn.getresponse()
        ready.set()

    def msg(i: int) -> bytes:
        return f'{{"Msg": "streamed", "N": {i}}}\n'.encode()

    opener = threading.Thread(target=open_stream, daemon=True)
    try:
        opener.start()
        # As in Gazette, a blocking read at the write head answers (headers included) only once
        # content commits at its offset. The request races our appends, so append until it has.
        sent: list[bytes] = []
        deadline = time.monotonic() + DEADLINE
        while not ready.wait(0.2):
            assert time.monotonic() < deadline, "blocking read never answered"
            sent.append(msg(len(sent)))
            http_put(url, sent[-1])
        resp = opened["resp"]
        assert resp.status == 206
        head = int(resp.headers["X-Write-Head"])
        assert head > len(FIRST_APPEND)

        got = b""
        for i in range(len(sent), len(sent) + 3):
            sent.append(msg(i))
            http_put(url, sent[-1])
            while not got.endswith(sent[-1]):
                assert time.monotonic() < deadline, f"not streamed: {got!r}"
                chunk = resp.read1(65536)
                assert chunk, "stream ended"
                got += chunk
        # The stream began at an append made after the read started (-1 is the head at its
        # start), never earlier, and carries every later append exactly once, in order.
        starts = [k for k in range(len(sent)) if got == b"".join(sent[k:])]
        assert starts, got
        assert FIRST_APPEND not in got
    finally:
        conn.close()
        opener.join(DEADLINE)


# --- gazctl: append, read ------------------------------------------------------------------


def test_gazctl_append_and_read(
    cluster: Cluster, walrus: BrokerProcess, popen_reaper: list[subprocess.Popen[bytes]]
) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    url = walrus.url("example/journal")
    http_put(url, FIRST_APPEND)

    hello = b'{"Msg": "Hello, Gazctl!"}\n'
    rc, out, err = cluster.gazctl("journals", "append", "-l", "name=example/journal", stdin=hello)
    assert rc == 0, err
    assert http_get(url) == FIRST_APPEND + hello

    # Without --block, read copies through the write head and exits.
    rc, out, err = cluster.gazctl("journals", "read", "-l", "name=example/journal")
    assert rc == 0, err
    assert out.encode() == FIRST_APPEND + hello

    # --block keeps streaming: appends made afterwards show up.
    reader = subprocess.Popen(
        [console_script("gazctl"), "journals", "read", "-l", "name=example/journal", "--block"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=cluster.env(),
    )
    popen_reaper.append(reader)
    stream = LineStream(reader)
    stream.read_until(hello)

    # --framing lines: every line lands whole.
    lines = b"".join(f'{{"Msg": "line {i}"}}\n'.encode() for i in range(5))
    rc, out, err = cluster.gazctl("journals", "append", "-l", "name=example/journal",
                                  "--framing", "lines", stdin=lines)
    assert rc == 0, err
    assert stream.read_until(lines) == FIRST_APPEND + hello + lines
    assert reader.poll() is None  # still blocking for more

    # --tail starts at the write head.
    tail = subprocess.Popen(
        [console_script("gazctl"), "journals", "read", "-l", "name=example/journal",
         "--tail", "--block"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cluster.env(),
    )
    popen_reaper.append(tail)
    # Appends race the tail read's start; the first one it sees is where it resolved -1 to.
    tail_stream = LineStream(tail)
    marker = b'{"Msg": "after tail"}\n'
    deadline = time.monotonic() + DEADLINE
    while marker not in tail_stream.buf:
        assert time.monotonic() < deadline
        http_put(url, marker)
        try:
            tail_stream.read_until(marker, timeout=1.0)
        except TimeoutError:
            continue
    assert set(tail_stream.buf.splitlines()) == {marker.strip()}  # nothing from before


def test_gazctl_ini_configures_the_broker_address(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    ini = cluster.home / ".config" / "gazette" / "gazctl.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text(f"[journals.Broker]\nAddress = {walrus.address}\n")
    hello = b'{"Msg": "Hello, Gazctl!"}\n'
    no_env = {"BROKER_ADDRESS": ""}
    rc, out, err = cluster.gazctl("journals", "append", "-l", "name=example/journal",
                                  stdin=hello, env=no_env)
    assert rc == 0, err
    rc, out, err = cluster.gazctl("journals", "read", "-l", "name=example/journal", env=no_env)
    assert (rc, out.encode()) == (0, hello), err


# --- gazctl: list, apply, edit ----------------------------------------------------------------


def test_list_table_primary_labels_and_yaml_round_trip(
    cluster: Cluster, walrus: BrokerProcess
) -> None:
    apply_ok(cluster, EXAMPLE_YAML)

    rc, out, err = cluster.gazctl("journals", "list")
    assert (rc, out) == (0, table(("example/journal",))), err

    rc, out, err = cluster.gazctl("journals", "list", "--primary")
    assert (rc, out) == (0, table(("example/journal", "busy-walrus"),
                                  headers=("NAME", "PRIMARY"))), err

    rc, out, err = cluster.gazctl("journals", "list", "-L", "app.gazette.dev/region",
                                  "-L", "app.gazette.dev/tag", "-L", "missing")
    assert rc == 0, err
    assert out == table(("example/journal", "local", "demo", "<none>"),
                        # Gazette's table titles: upper case, '.' and '_' shown as spaces.
                        headers=("NAME", "APP GAZETTE DEV/REGION", "APP GAZETTE DEV/TAG",
                                 "MISSING"))

    rc, listed, err = cluster.gazctl("journals", "list", "--format", "yaml")
    assert rc == 0, err
    doc = yaml.safe_load(listed)
    assert doc["name"] == "example/journal"
    assert doc["fragment"]["compression_codec"] == "SNAPPY"
    assert doc["fragment"]["length"] == 131072
    revision = doc["revision"]
    assert revision > 0

    # The listing applies back unchanged (its revision is current).
    apply_ok(cluster, listed, assigned=False)
    rc, relisted, err = cluster.gazctl("journals", "list", "-o", "yaml")
    assert rc == 0, err
    again = yaml.safe_load(relisted)
    assert again["revision"] > revision
    assert {k: v for k, v in again.items() if k != "revision"} == \
        {k: v for k, v in doc.items() if k != "revision"}

    # The tutorial's modification: GZIP and a new length, at the listed revision.
    modified = relisted.replace("SNAPPY", "GZIP").replace("131072", "131073")
    apply_ok(cluster, modified, assigned=False)
    rc, out, err = cluster.gazctl("journals", "list", "-o", "yaml")
    final = yaml.safe_load(out)
    assert final["fragment"]["compression_codec"] == "GZIP"
    assert final["fragment"]["length"] == 131073

    # Applying the same document again: its revision is now stale, and nothing changes.
    rc, out, err = cluster.gazctl("journals", "apply", stdin=relisted)
    assert rc == 1
    assert "ETCD_TRANSACTION_FAILED" in err and err.startswith("FATA")
    assert len(err.strip().splitlines()) == 1
    rc, out, err = cluster.gazctl("journals", "list", "-o", "yaml")
    assert yaml.safe_load(out) == final


def test_edit_is_revision_checked(cluster: Cluster, walrus: BrokerProcess, tmp_path: Path) -> None:
    apply_ok(cluster, EXAMPLE_YAML)

    # An editor that switches the codec to GZIP.
    editor = tmp_path / "to-gzip.sh"
    editor.write_text('#!/bin/sh\nsed -i "s/compression_codec: SNAPPY/compression_codec: GZIP/" "$1"\n')
    editor.chmod(0o755)
    rc, out, err = cluster.gazctl("journals", "edit", "-l", "name=example/journal",
                                  env={"EDITOR": str(editor), "VISUAL": ""})
    assert rc == 0, err
    assert "successfully applied" in err
    rc, out, err = cluster.gazctl("journals", "list", "-o", "yaml")
    assert yaml.safe_load(out)["fragment"]["compression_codec"] == "GZIP"

    # An editor during whose session someone else changes the journal: the edit is refused.
    # (A spec without a revision only creates; the concurrent change lists, edits, applies.)
    gazctl = console_script("gazctl")
    sneaky = tmp_path / "sneaky.sh"
    sneaky.write_text(
        "#!/bin/sh\n"
        f'"{gazctl}" journals list -o yaml | sed "s/length: 131072/length: 65536/" '
        f'| "{gazctl}" journals apply || exit 3\n'
        'sed -i "s/compression_codec: GZIP/compression_codec: ZSTANDARD/" "$1"\n'
    )
    sneaky.chmod(0o755)
    rc, out, err = cluster.gazctl("journals", "edit", "-l", "name=example/journal",
                                  env={"EDITOR": str(sneaky), "VISUAL": ""})
    assert rc == 1, err
    assert "stale revision" in err and "ETCD_TRANSACTION_FAILED" in err, err
    # (stderr is shared with the editor's own gazctl; edit's verdict is its last line.)
    assert err.strip().splitlines()[-1].startswith("FATA")
    rc, out, err = cluster.gazctl("journals", "list", "-o", "yaml")
    doc = yaml.safe_load(out)
    # The concurrent change landed; the stale edit did not.
    assert doc["fragment"]["length"] == 65536
    assert doc["fragment"]["compression_codec"] == "GZIP"


# --- journal hierarchies and selectors --------------------------------------------------------


def test_foobar_hierarchy_and_selectors(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    apply_ok(cluster, FOOBAR_YAML)
    names = ("example/journal", "foobar/part-000", "foobar/part-001", "foobar/part-002")

    expect = {n: "busy-walrus" for n in names}
    eventually_sync(lambda: primaries(cluster) == expect, "all journals assigned", DEADLINE)
    rc, out, err = cluster.gazctl("journals", "list", "--primary")
    assert out == table(*((n, "busy-walrus") for n in names), headers=("NAME", "PRIMARY"))

    # Children inherit the parent's labels and fragment settings.
    rc, out, err = cluster.gazctl("journals", "list", "-l", "prefix=foobar/", "-o", "json")
    assert rc == 0, err
    listed = json.loads(out)["journals"]
    assert [j["spec"]["name"] for j in listed] == list(names[1:])
    for j in listed:
        assert j["spec"]["fragment"]["compression_codec"] == "GZIP"
        assert j["spec"]["fragment"]["length"] == "4096"
        labels = {(lb["name"], lb["value"]) for lb in j["spec"]["labels"]["labels"]}
        assert labels == {("content-type", "application/x-ndjson"), ("my-label", "")}

    selectors = {
        "prefix=example/": ["example/journal"],
        "prefix=foobar/": ["foobar/part-000", "foobar/part-001", "foobar/part-002"],
        "app.gazette.dev/message-type=TestMessage": ["example/journal"],
        "my-label": ["foobar/part-000", "foobar/part-001", "foobar/part-002"],
        "name in (example/journal, foobar/part-001)": ["example/journal", "foobar/part-001"],
        "prefix=foobar/, name not in (foobar/part-001)": ["foobar/part-000", "foobar/part-002"],
    }
    for selector, expected in selectors.items():
        rc, out, err = cluster.gazctl("journals", "list", "-l", selector)
        assert rc == 0, (selector, err)
        assert out == table(*((n,) for n in expected)), selector


# --- fragments ------------------------------------------------------------------------------

FRAGMENT_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})(\.[a-z]+)?$")


@pytest.mark.parametrize("codec", ["SNAPPY", "GZIP", "ZSTANDARD", "NONE"])
def test_fragment_files_are_content_addressed(
    cluster: Cluster, walrus: BrokerProcess, codec: str
) -> None:
    spec = (EXAMPLE_YAML.replace("length: 131072", "length: 1024")
            .replace("compression_codec: SNAPPY", f"compression_codec: {codec}"))
    apply_ok(cluster, spec)
    url = walrus.url("example/journal")
    appends = [json.dumps({"Msg": "fragment", "N": i, "pad": "x" * 60}).encode() + b"\n"
               for i in range(40)]
    for body in appends:
        http_put(url, body)
    content = b"".join(appends)
    assert http_get(url) == content

    directory = cluster.file_root / "example" / "journal"

    def persisted_through() -> int:
        """End offset of the contiguous run of persisted fragments from offset 0."""
        spans = []
        for p in directory.glob("*") if directory.is_dir() else []:
            m = FRAGMENT_NAME.match(p.name)
            if m and not p.name.startswith("."):
                spans.append((int(m.group(1), 16), int(m.group(2), 16)))
        end = 0
        for b, e in sorted(spans):
            if b == end:
                end = e
        return end

    # Spools roll once they exceed 1024 bytes; closed spools are persisted in the background.
    eventually_sync(lambda: persisted_through() >= 2048, "fragments persisted", DEADLINE)

    files = sorted(p for p in directory.iterdir() if FRAGMENT_NAME.match(p.name))
    assert len(files) >= 2
    ext = codecs.extension(pb.CompressionCodec.Value(codec))
    offset = 0
    for path in files:
        m = FRAGMENT_NAME.match(path.name)
        assert m is not None
        begin, end, sha, suffix = int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4)
        assert (suffix or "") == ext
        assert begin == offset  # name order is offset order, without gaps
        raw = codecs.decompress(pb.CompressionCodec.Value(codec), path.read_bytes())
        assert len(raw) == end - begin
        assert hashlib.sha1(raw).hexdigest() == sha
        assert raw == content[begin:end]
        # Fragments hold whole appends only.
        assert raw.endswith(b"\n") and json.loads(raw.splitlines()[0])["Msg"] == "fragment"
        offset = end

    rc, out, err = cluster.gazctl("journals", "fragments", "-l", "name=example/journal")
    assert rc == 0, err
    lines = out.splitlines()
    assert [c.strip() for c in lines[1].strip("|").split("|")] == \
        ["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA1", "COMPRESSION"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[3:-1]]
    by_offset = {int(r[1]): r for r in rows}
    for path in files:
        m = FRAGMENT_NAME.match(path.name)
        assert m is not None
        row = by_offset[int(m.group(1), 16)]
        assert row[0] == "example/journal"
        assert row[4] == m.group(3)[:12] + "..."
        assert row[5] == codec
        assert row[3] != ""  # persisted: shows when


# --- a second broker ------------------------------------------------------------------------


def test_second_broker_takes_a_share(cluster: Cluster, walrus: BrokerProcess) -> None:
    apply_ok(cluster, EXAMPLE_YAML)
    apply_ok(cluster, FOOBAR_YAML)
    more = FOOBAR_YAML.replace("foobar/", "scale/").replace(
        "  - name: scale/part-002\n",
        "".join(f"  - name: scale/part-{i:03d}\n" for i in range(2, 8)))
    apply_ok(cluster, more)
    journals = sorted(primaries(cluster))
    assert len(journals) == 12

    second = cluster.add_broker("local", "calm-otter")

    def balanced() -> dict[str, str] | None:
        got = primaries(cluster)
        ok = set(got.values()) == {"busy-walrus", "calm-otter"} and len(got) == 12
        return got if ok else None

    assignment = eventually_sync(balanced, "both brokers primary for some journals", 60.0)
    assert set(assignment) == set(journals)

    # Reads and appends work through either broker; the other proxies.
    for i, name in enumerate(journals):
        via, other = (walrus, second) if i % 2 else (second, walrus)
        first = f'{{"N": {i}, "via": "{via.broker_id}"}}\n'.encode()
        then = f'{{"N": {i}, "via": "{other.broker_id}"}}\n'.encode()
        http_put(via.url(name), first)
        http_put(other.url(name), then)
        assert http_get(other.url(name)) == first + then
        assert http_get(via.url(name)) == first + then

    # gazctl through the second broker sees the same cluster.
    assert primaries(cluster, broker=second) == primaries(cluster, broker=walrus)
    rc, out, err = cluster.gazctl("journals", "read", "-l", "prefix=scale/", broker=second)
    assert rc == 0, err
    assert sorted(out.splitlines()) == sorted(
        line for i, name in enumerate(journals) if name.startswith("scale/")
        for line in http_get(walrus.url(name)).decode().splitlines())

    # Brokers are cattle: the second one leaves gracefully (SIGTERM drains it), the first
    # takes every journal back, and no committed byte is lost.
    before = {name: http_get(walrus.url(name)) for name in journals}
    assert second.stop(DEADLINE) == 0
    eventually_sync(lambda: set(primaries(cluster).values()) == {"busy-walrus"}, "the first broker is primary for every journal again", DEADLINE)
    for name in journals:
        assert http_get(walrus.url(name)) == before[name]
        http_put(walrus.url(name), b'{"after": "drain"}\n')
        assert http_get(walrus.url(name)) == before[name] + b'{"after": "drain"}\n'


def test_operability_endpoints_and_unknown_journal(cluster: Cluster, walrus: BrokerProcess) -> None:
    """The readiness and metrics endpoints the harness relies on."""
    with urllib.request.urlopen(walrus.url("/debug/ready"), timeout=DEADLINE) as resp:  # noqa: S310
        assert resp.status == 200
    with urllib.request.urlopen(walrus.url("/debug/metrics"), timeout=DEADLINE) as resp:  # noqa: S310
        assert b"gazette_append" in resp.read()
    with pytest.raises(urllib.error.HTTPError) as info:
        http_get(walrus.url("no/such/journal"))
    assert info.value.code == 404
