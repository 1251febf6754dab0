#!/usr/bin/env bash
# The project's test command: installs what it needs, then lints, type-checks and runs the test
# suite: the compiled modules' tests on their sources, then the whole suite against the
# compiled wheel (.venv-compiled). SOAK=1 runs the long soak/fault tests instead (on the
# sources). A developer's quick loop is `.venv/bin/pytest` on the editable sources.
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
# The compiled modules' unit and property tests on their .py sources (the interpreted build,
# as GAZETTE_PURE=1 installs it and as development runs it)...
.venv/bin/pytest tests/unit/test_compiled_build.py tests/unit/test_rpc_*.py \
  tests/unit/test_message_*.py tests/unit/test_mux.py tests/unit/test_flow.py \
  tests/unit/test_allocator_*.py tests/unit/test_pipeline*.py tests/unit/test_spool*.py \
  tests/unit/test_append_service.py tests/unit/test_group_commit.py tests/unit/test_fifo_lock.py \
  tests/unit/test_fragment.py tests/unit/test_index.py "$@"
# ...then the whole suite against the build users install: the wheel, compiled where a C
# compiler works (scripts/compiled_check.sh; pure Python where none does, saying so).
exec bash scripts/compiled_check.sh "$@"
