#!/usr/bin/env bash
# The floors job: installs the oldest release of every direct dependency that pyproject.toml
# allows (constraints/floors.txt) into a fresh virtualenv, with the core and the s3, postgres,
# sql-sqlite, rocksdb, uvloop and etcd extras, and runs the unit tests and the etcd integration tests
# on them. A floor lower than what the code needs fails here (an import, an API, a behaviour).
# The spark and fuzz extras' floors are only checked to exist on the index (pyspark is a 400 MB
# source distribution, and the Spark tests need Java); their tests run on the newest releases.
# FLOORS_VENV=DIR keeps the virtualenv there (default: a temporary one, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
PY="${PYTHON:-python3}"
if [ -n "${FLOORS_VENV:-}" ]; then
  V=$FLOORS_VENV
  rm -rf "$V"
else
  V=$(mktemp -d -t gazette-floors.XXXXXX)
  trap 'rm -rf "$V"' EXIT
fi
"$PY" -m venv "$V"
pip=("$V/bin/python" -m pip --disable-pip-version-check)

echo "--- floors: the spark and fuzz extras' floors exist"
for pkg in pyspark pyarrow pandas numpy atheris; do
  want=$(grep -i "^$pkg==" constraints/floors.txt | cut -d= -f3)
  "${pip[@]}" index versions "$pkg" 2>/dev/null | grep -q "Available versions:.* $want\(,\|$\)" \
    || { echo "floors: $pkg==$want is not on the index" >&2; exit 1; }
done

echo "--- floors: installing constraints/floors.txt (+ test tools at their constraints/dev.txt pins)"
"${pip[@]}" install -q --no-compile -c constraints/floors.txt -c constraints/dev.txt \
  -e ".[s3,postgres,sql-sqlite,rocksdb,uvloop,etcd]" \
  pytest pytest-asyncio pytest-timeout hypothesis "moto[server]" grpcio-tools mypy-protobuf trustme
"${pip[@]}" check
# What was installed is exactly the floors (a constraint ignored would pass silently).
"$V/bin/python" - <<'PY'
import importlib.metadata as md
import sys
from packaging.utils import canonicalize_name
from packaging.version import Version
wrong, installed = [], []
for line in open("constraints/floors.txt"):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, version = line.split("==")
    try:
        got = md.version(name)
    except md.PackageNotFoundError:
        continue  # an extra the floors job does not install (spark, fuzz)
    if Version(got) != Version(version):
        wrong.append(f"{canonicalize_name(name)} {got} (floor {version})")
    installed.append(line)
if wrong:
    sys.exit("floors: installed above the floor: " + ", ".join(wrong))
print("floors: installed", ", ".join(installed))
PY

echo "--- floors: unit tests and etcd integration tests on the floors"
# The layers whose dependencies have floors: the transport and protocol (grpcio, protobuf,
# hpack), etcd (aetcd), the gateway and auth (aiohttp, PyJWT), messages (msgspec), fragments
# and stores (cramjam, zstandard, boto3, SQLAlchemy, psycopg, aiosqlite, rocksdict). Left out
# of the globs: test_rpc_h2_oracle (h2, a dev tool, needs a newer hpack than our floor).
set +e
# shellcheck disable=SC2046  # the globs are expanded on purpose (h2, the test oracle, is dev-only)
"$V/bin/python" -m pytest -q -p no:cacheprovider $(ls tests/unit/test_rpc_*.py tests/unit/test_protocol*.py \
  tests/unit/test_etcd*.py tests/unit/test_keyspace*.py tests/unit/test_auth*.py tests/unit/test_http*.py \
  tests/unit/test_message_*.py tests/unit/test_fragment*.py tests/unit/test_codec*.py \
  tests/unit/test_consumer_*store*.py tests/unit/test_recoverylog_stores.py 2>/dev/null \
  | grep -v test_rpc_h2_oracle) \
  tests/integration/test_etcd_txn.py tests/integration/test_keyspace.py
rc=$?
set -e
echo "floors: done in $(($(date +%s) - start)) s (pytest exit $rc)"
exit "$rc"
