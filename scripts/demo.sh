#!/usr/bin/env bash
# The main job: a local cluster on embedded defaults, and bike-share end to end. Installs what
# it needs, starts a real etcd and two brokers on loopback (file fragment store under var/),
# appends and reads a few messages through the HTTP gateway, then runs bike-share: two consumer
# processes with four cycles-part shards (two on PostgreSQL when a server answers on
# 127.0.0.1:5432, else all four on embedded SQLite), generated Citi Bike rides streamed through
# the seed's pipeline, found cycles printed as they arrive, the history API and the shards'
# lag, and a Spark analytics job over the rides and cycles journals. Then it keeps running until
# Ctrl-C. DEMO_ONESHOT=1 stops after one full pass (tests, CI).
set -euo pipefail
cd "$(dirname "$0")/.."
# The build users install: gazette's wheel, its hot paths compiled where a C compiler works,
# with the extras the demo uses, in .venv-compiled (DEMO_VENV: a virtualenv already holding
# gazette and them, which the demo's test passes: its own).
if [ -n "${DEMO_VENV:-}" ]; then
  B=$DEMO_VENV/bin
else
  COMPILED_ONLY_INSTALL=1 bash scripts/compiled_check.sh
  B=.venv-compiled/bin
fi
PY=$B/python
$B/gazette --version
VAR=${DEMO_DIR:-var/demo}
ETCD_PORT=${ETCD_PORT:-2379}
PORT1=${BROKER_PORT:-8080}
PORT2=$((PORT1 + 1))
rm -rf "$VAR"  # each run is a fresh cluster
mkdir -p "$VAR/fragment-store" "$VAR/path"
# The examples package importable without the checkout's gazette beside it: every process
# imports the installed build (PYTHONSAFEPATH: no script or working directory on sys.path).
ln -s "$PWD/examples" "$VAR/path/examples"
export PYTHONSAFEPATH=1 PYTHONPATH="$(cd "$VAR/path" && pwd)"
pids=()
cleanup() {
  # Last started, first stopped (consumers, then brokers, then etcd), each given a grace period
  # to drain as Kubernetes would, then killed.
  local i pid
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[$i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

$PY -m gazette.testing.etcd_process --data-dir "$VAR/etcd" --port "$ETCD_PORT" >"$VAR/etcd.log" 2>&1 &
pids+=($!)
export ETCD_ADDRESS="http://127.0.0.1:$ETCD_PORT"
$PY -m gazette.cli.wait_ready --etcd "$ETCD_ADDRESS" --timeout 30

for port in "$PORT1" "$PORT2"; do
  $B/gazette serve --broker.port "$port" --broker.file-root "$VAR/fragment-store" \
    --broker.id "broker-$port" --broker.zone "zone-$((port % 2))" >"$VAR/broker-$port.log" 2>&1 &
  pids+=($!)
done
for port in "$PORT1" "$PORT2"; do
  $PY -m gazette.cli.wait_ready --url "http://127.0.0.1:$port/debug/ready" --timeout 30
done
export BROKER_ADDRESS="http://127.0.0.1:$PORT1"
$B/gazctl journals apply --specs examples/journals.yaml
$B/gazctl journals list --primary

echo "--- appending through broker :$PORT1, reading through broker :$PORT2"
# The allocator assigns the new journals within moments: retry until the journal has a primary.
msgs='{"Msg": "Hello, Gazette!"}
{"Msg": "See you later alligator"}
'
for _ in $(seq 1 100); do
  if curl -sSf -o /dev/null -X PUT --data-binary "$msgs" "http://127.0.0.1:$PORT1/examples/example-journal" 2>/dev/null; then break; fi
  sleep 0.1
done
curl -sSf "http://127.0.0.1:$PORT2/examples/example-journal"
echo "--- fragments"
$B/gazctl journals fragments -l name=examples/example-journal
echo "--- messages: publish and read committed (examples/hello_messages.py)"
BROKER_ADDRESS="http://127.0.0.1:$PORT1" $B/python examples/hello_messages.py Ada Grace

echo "--- bike-share: journals, two consumer processes, four shards"
$B/gazctl journals apply --specs examples/bike_share/journals.yaml
CPORT1=${CONSUMER_PORT:-$((PORT1 + 100))}
CPORT2=$((CPORT1 + 1))
SHARDS=$(cat examples/bike_share/shards.yaml)
if PG_URL=$($PY -m examples.bike_share.database --fresh --database "${DEMO_DATABASE:-bike_share_demo}"); then
  echo "PostgreSQL answers: cycles-part-000/001 use it, 002/003 embedded SQLite"
else
  echo "no PostgreSQL: all four shards on embedded SQLite"
  PG_URL=""
  SHARDS=${SHARDS//value: postgres/value: sqlite}
fi
export BIKE_SHARE_POSTGRES=$PG_URL
for port in "$CPORT1" "$CPORT2"; do
  $B/gazette consume --app examples.bike_share.app:BikeShare --consumer.port "$port" \
    --consumer.id "bikes-$port" --etcd.prefix /gazette/consumers/bike-share >"$VAR/consumer-$port.log" 2>&1 &
  pids+=($!)
done
for port in "$CPORT1" "$CPORT2"; do
  $PY -m gazette.cli.wait_ready --url "http://127.0.0.1:$port/debug/ready" --timeout 60
done
export CONSUMER_ADDRESS="http://127.0.0.1:$CPORT1"
echo "$SHARDS" | $B/gazctl shards apply
$B/gazctl shards list -p -L store

echo "--- bike-share: rides generated (Citi Bike 2019 schema, with planted cycles), streamed"
$PY -m examples.bike_share.rides --bikes "${DEMO_BIKES:-150}" --days 30 --cycles 12 --malformed 2 \
  --expect "$VAR/expected-cycles.json" >"$VAR/rides.csv"
EXPECTED=$(wc -l <"$VAR/expected-cycles.json")
TOTAL=$(($(wc -l <"$VAR/rides.csv") - 1)) RATE=${DEMO_RATE:-2000} GAZCTL=$B/gazctl PYTHON=$PY \
  bash examples/bike_share/stream_rides.sh "$VAR/rides.csv" &
stream=$!
pids+=($stream)
echo "--- bike-share: cycles as they are found (the generator planted $EXPECTED)"
$PY -m examples.bike_share.watch --count "$EXPECTED" --timeout 300
wait "$stream"
echo "--- bike-share: the history API (any consumer process answers, proxying to the shard's primary)"
BIKE=$($PY -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["BikeID"])' "$VAR/expected-cycles.json")
curl -sSf "http://127.0.0.1:$CPORT2/api/bikes?id=$BIKE" | tail -3
echo "--- bike-share: shard lag"
$B/gazctl shards list --lag
echo "bike-share: $EXPECTED planted cycles found; malformed rides skipped: $(grep -c 'skipping malformed ride' "$VAR"/consumer-*.log | awk -F: '{n += $2} END {print n}')"

echo "--- bike-share analytics: Spark over the rides and cycles journals (examples/bike_share/analytics.py)"
$PY -m examples.bike_share.analytics --out "$VAR/analytics" --file-root "$VAR/fragment-store"

if [ "${DEMO_ONESHOT:-0}" = "1" ]; then exit 0; fi
echo "Watching for more cycles (stream more rides with examples/bike_share/stream_rides.sh)."
$PY -m examples.bike_share.watch &
pids+=($!)
echo "Cluster is up: BROKER_ADDRESS=$BROKER_ADDRESS CONSUMER_ADDRESS=$CONSUMER_ADDRESS ETCD_ADDRESS=$ETCD_ADDRESS (logs in $VAR). Ctrl-C stops it."
wait
