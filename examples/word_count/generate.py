"""Regenerates ``word_count_pb2.py``, ``word_count_pb2_grpc.py`` and ``word_count_pb2.pyi`` from
``word_count.proto`` (``--check``: exits 1 if the checked-in ones are stale), as
``gazette.protocol.generate`` does for the wire protocol."""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NAMES = ("word_count_pb2.py", "word_count_pb2_grpc.py", "word_count_pb2.pyi")


def _protoc(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}", f"--mypy_out={out}",
            "examples/word_count/word_count.proto"]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(Path(tmp))
        fresh = Path(tmp) / "examples" / "word_count"
        if a.check:
            stale = [n for n in NAMES if not (HERE / n).exists() or not filecmp.cmp(fresh / n, HERE / n, shallow=False)]
            if stale:
                print(f"stale generated modules: {', '.join(stale)}; run python -m examples.word_count.generate",
                      file=sys.stderr)
                return 1
            return 0
        for n in NAMES:
            shutil.copy(fresh / n, HERE / n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
