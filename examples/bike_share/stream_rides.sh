#!/usr/bin/env bash
# The seed's stream-rides pipeline: CSV rides (a file, or the generator's output) get a UUID each
# (gazctl attach-uuids), the bike id plucked onto its own line before its record (awk: the key
# for --mapping modulo), a rate limit (RATE records/s; 0 for none), and an append to the
# four rides partitions. BROKER_ADDRESS names a broker; GAZCTL overrides the gazctl binary;
# TOTAL (records expected) gives the progress line an ETA.
#   bash examples/bike_share/stream_rides.sh rides.csv
#   python -m examples.bike_share.rides | bash examples/bike_share/stream_rides.sh
set -euo pipefail
GAZCTL=${GAZCTL:-gazctl}
RATE=${RATE:-300}
PY=${PYTHON:-python3}
limit() {
  if [ "$RATE" = 0 ]; then cat; else "$PY" -m examples.bike_share.rate_limit --rate "$RATE" --total "${TOTAL:-0}"; fi
}
"$GAZCTL" attach-uuids --skip-header "${@:--}" \
  | awk -F "," '{print $13}{print}' \
  | limit \
  | "$GAZCTL" journals append -l app.gazette.dev/message-type=bike_share.Ride --framing=lines --mapping=modulo
