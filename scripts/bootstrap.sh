#!/usr/bin/env bash
# Creates .venv (if missing) and installs gazette with the named extras (comma-separated), the
# development tools at their pins in constraints/dev.txt. Idempotent and quick when everything
# is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=".venv/.installed-${extras//,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints/dev.txt -nt "$stamp" ]; then
  # Editable: pure Python (the compiled build is a wheel: scripts/compiled_check.sh).
  GAZETTE_PURE=1 .venv/bin/python -m pip install -q -c constraints/dev.txt -e ".[$extras]"
  touch "$stamp"
fi
