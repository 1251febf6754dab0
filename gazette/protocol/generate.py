"""Regenerates the Python modules of the wire protocol from the .proto sources.

``python -m gazette.protocol.generate`` rewrites ``*_pb2.py``, ``*_pb2_grpc.py``
and ``*_pb2.pyi`` beside the sources; ``--check`` regenerates into a scratch
directory and exits 1, naming the stale files, when any differs from the
checked-in version. Requires the ``dev`` extra (grpcio-tools, mypy-protobuf).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent.parent
SOURCES = ("protocol.proto", "recoverylog.proto", "consumer.proto")


def _protoc(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
        f"--mypy_out={out}",
    ] + [f"gazette/protocol/{name}" for name in SOURCES]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def _outputs(base: Path) -> list[Path]:
    gen = base / "gazette" / "protocol"
    return sorted(p for p in gen.iterdir() if p.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if checked-in modules are stale")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "gazette" / "protocol").mkdir(parents=True)
        _protoc(out)
        fresh = _outputs(out)
        if opts.check:
            stale = [p.name for p in fresh if not (PROTO_DIR / p.name).exists() or not filecmp.cmp(p, PROTO_DIR / p.name, shallow=False)]
            if stale:
                print(f"stale generated protocol modules: {', '.join(stale)}; run scripts/genproto.sh", file=sys.stderr)
                return 1
            return 0
        for p in fresh:
            shutil.copyfile(p, PROTO_DIR / p.name)
            print(f"wrote gazette/protocol/{p.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
