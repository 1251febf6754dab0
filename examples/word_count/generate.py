"""Regenerates ``word_count_pb2.py``, ``word_count_pb2_grpc.py`` and ``word_count_pb2.pyi`` from
``word_count.proto`` (``--check``: exits 1 if the checked-in ones are stale), with the wire
protocol's generator."""

from __future__ import annotations

import sys
from pathlib import Path

from gazette.protocol.generate import main

if __name__ == "__main__":
    sys.exit(main(package_dir=Path(__file__).resolve().parent, sources=["word_count.proto"]))
