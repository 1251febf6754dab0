#!/usr/bin/env bash
# The main job: a local cluster on embedded defaults. Installs what it needs, starts a real
# etcd and two brokers on loopback (file fragment store under var/), applies the example
# journals, appends and reads a few messages through the HTTP gateway, then keeps running
# until Ctrl-C. DEMO_ONESHOT=1 stops after the demo pipeline (used by tests and CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh dev
PY=.venv/bin/python
VAR=${DEMO_DIR:-var/demo}
ETCD_PORT=${ETCD_PORT:-2379}
PORT1=${BROKER_PORT:-8080}
PORT2=$((PORT1 + 1))
mkdir -p "$VAR/fragment-store"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

$PY -m gazette.testing.etcd_process --data-dir "$VAR/etcd" --port "$ETCD_PORT" >"$VAR/etcd.log" 2>&1 &
pids+=($!)
export ETCD_ADDRESS="http://127.0.0.1:$ETCD_PORT"
$PY -m gazette.cli.wait_ready --etcd "$ETCD_ADDRESS" --timeout 30

for port in "$PORT1" "$PORT2"; do
  .venv/bin/gazette serve --broker.port "$port" --broker.file-root "$VAR/fragment-store" \
    --broker.id "broker-$port" --broker.zone "zone-$((port % 2))" >"$VAR/broker-$port.log" 2>&1 &
  pids+=($!)
done
for port in "$PORT1" "$PORT2"; do
  $PY -m gazette.cli.wait_ready --url "http://127.0.0.1:$port/debug/ready" --timeout 30
done
export BROKER_ADDRESS="http://127.0.0.1:$PORT1"
.venv/bin/gazctl journals apply --specs examples/journals.yaml
.venv/bin/gazctl journals list --primary

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
.venv/bin/gazctl journals fragments -l name=examples/example-journal
echo "--- messages: publish and read committed (examples/hello_messages.py)"
BROKER_ADDRESS="http://127.0.0.1:$PORT1" .venv/bin/python examples/hello_messages.py Ada Grace

if [ "${DEMO_ONESHOT:-0}" = "1" ]; then exit 0; fi
echo "Cluster is up: BROKER_ADDRESS=$BROKER_ADDRESS ETCD_ADDRESS=$ETCD_ADDRESS (logs in $VAR). Ctrl-C stops it."
wait
