"""Regenerates the Python modules of the wire protocol from the .proto sources.

``python -m gazette.protocol.generate`` rewrites ``*_pb2.py``, ``*_pb2_grpc.py``
and ``*_pb2.pyi`` beside the sources; ``--check`` regenerates into a scratch
directory and exits 1, naming the stale files, when any differs from the
checked-in version. Requires the ``dev`` extra (grpcio-tools, mypy-protobuf).
``regenerate`` does the same for any package's protos (the word-count example's).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent.parent
SOURCES = ("protocol.proto", "recoverylog.proto", "consumer.proto")


def _protoc(out: Path, protos: Sequence[str]) -> None:
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
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def regenerate(package_dir: Path, sources: Sequence[str], *, check: bool) -> list[str]:
    """Generates the modules of ``sources`` (.proto files in ``package_dir``, beneath the
    repository root). With ``check``, only compares: returns the names of stale or missing
    modules. Otherwise writes them beside their sources and returns their names."""
    rel = package_dir.resolve().relative_to(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / rel).mkdir(parents=True)
        _protoc(out, [f"{rel.as_posix()}/{name}" for name in sources])
        fresh = sorted(p for p in (out / rel).iterdir() if p.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")))
        if check:
            return [p.name for p in fresh
                    if not (package_dir / p.name).exists() or not filecmp.cmp(p, package_dir / p.name, shallow=False)]
        for p in fresh:
            shutil.copyfile(p, package_dir / p.name)
        return [p.name for p in fresh]


def main(argv: list[str] | None = None, *, package_dir: Path = PROTO_DIR,
         sources: Sequence[str] = SOURCES) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if checked-in modules are stale")
    opts = parser.parse_args(argv)
    names = regenerate(package_dir, sources, check=opts.check)
    where = package_dir.resolve().relative_to(ROOT).as_posix()
    if opts.check:
        if names:
            print(f"stale generated modules in {where}: {', '.join(names)}; regenerate them "
                  f"(python -m {where.replace('/', '.')}.generate)", file=sys.stderr)
            return 1
        return 0
    for name in names:
        print(f"wrote {where}/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
