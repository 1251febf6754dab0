#!/usr/bin/env bash
# Regenerates gazette/protocol/*_pb2*.py(i) from the .proto sources.
# With --check, fails (exit 1) when the checked-in modules are stale.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m gazette.protocol.generate "$@"
