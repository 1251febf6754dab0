"""Layering facts that import-linter cannot see: what a client process loads at run time."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_client_reads_compressed_fragments_without_the_broker() -> None:
    mods = _modules_after(
        "import gazette.client\n"
        "from gazette.client.reader import decompressor\n"
        "from gazette.protocol import protocol_pb2 as pb\n"
        "from gazette.fragment import codecs\n"
        "d = decompressor(pb.SNAPPY)\n"
        "assert d.decompress(codecs.compress(pb.SNAPPY, b'x' * 1000)) + d.finish() == b'x' * 1000\n"
    )
    assert "gazette.fragment.codecs" in mods
    assert not {m for m in mods if m.startswith("gazette.broker")}


def test_stores_load_no_backend_dependency() -> None:
    mods = _modules_after("import gazette.fragment.stores")
    assert "boto3" not in mods and "gazette.fragment.stores.s3" not in mods
