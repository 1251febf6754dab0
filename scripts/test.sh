#!/usr/bin/env bash
# The project's test command: installs what it needs, then lints, type-checks
# and runs the test suite. SOAK=1 runs the long soak/fault tests instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh dev
.venv/bin/python -m gazette.protocol.generate --check
.venv/bin/python -m examples.word_count.generate --check
.venv/bin/ruff check gazette examples tests bench fuzz
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/python scripts/import_cycles.py
if [ "${SOAK:-0}" = "1" ]; then
  # -rP: the soak tests print their figures (faults injected, streams verified); show them.
  set +e; .venv/bin/pytest -m soak -rP --durations=15 "$@"; rc=$?; set -e
  # exit 5 = no soak tests collected, which is not a failure
  [ "$rc" = 5 ] && rc=0
  exit "$rc"
fi
exec .venv/bin/pytest "$@"
