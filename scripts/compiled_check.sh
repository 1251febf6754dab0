#!/usr/bin/env bash
# The compiled build as users get it: builds the wheel with its mypyc-compiled modules (the list
# in gazette/_compiled.py) from the files git knows, installs it into a fresh virtualenv, and
# runs the unit tests of the compiled layers (rpc, message, the transport's mux, the allocator) against it from
# a directory with no checkout on sys.path, test_compiled_build.py first (it fails if any listed
# module imports from its .py: a silent fallback). Prints its duration.
# COMPILED_TESTS overrides the test files (paths relative to the checkout, space-separated).
# The venv is kept at $COMPILED_VENV if set (reused when present: only the wheel is reinstalled).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
start=$(date +%s)
step() { echo "--- [$(($(date +%s) - start)) s] $*"; }
T=$(mktemp -d -t gazette-compiled.XXXXXX)
trap 'rm -rf "$T"' EXIT
V=${COMPILED_VENV:-$T/venv}

step "compiled: the wheel (pip wheel: mypyc runs in pip's isolated build environment)"
mkdir "$T/src"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$T/src"
unset GAZETTE_PURE
python3 -m venv "$T/host"
"$T/host/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$T/dist" "$T/src" \
  >"$T/build.log" 2>&1 || { tail -40 "$T/build.log"; exit 1; }
WHEEL=$(echo "$T"/dist/gazette-*.whl)
case "$WHEEL" in *-none-any.whl) echo "a pure wheel was built: $WHEEL" >&2; tail -20 "$T/build.log"; exit 1 ;; esac
step "compiled: built $(basename "$WHEEL")"

if [ ! -x "$V/bin/python" ]; then
  step "compiled: a fresh virtualenv with the wheel and the test tools"
  python3 -m venv "$V"
fi
"$V/bin/python" -m pip install -q --disable-pip-version-check -c constraints/dev.txt \
  --force-reinstall --no-deps "$WHEEL"
"$V/bin/python" -m pip install -q --disable-pip-version-check -c constraints/dev.txt \
  "$WHEEL[uvloop,etcd]" pytest pytest-asyncio pytest-timeout hypothesis h2 trustme
"$V/bin/python" -m pip check

mkdir "$T/run"
cp -r tests examples fuzz "$T/run/"
cat >"$T/run/pytest.ini" <<'INI'
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
markers =
    soak: long-running fault and soak tests
    both_loops: run the module's async tests on asyncio's loop and on uvloop
addopts = -m "not soak" --timeout=300 -p no:cacheprovider
INI
cd "$T/run"  # nothing of the checkout on sys.path from here on
unset PYTHONPATH
"$V/bin/gazette" --version
TESTS=${COMPILED_TESTS:-"tests/unit/test_compiled_build.py tests/unit/test_rpc_*.py tests/unit/test_message_*.py tests/unit/test_mux.py tests/unit/test_flow.py tests/unit/test_allocator_*.py"}
step "compiled: pytest $TESTS"
# shellcheck disable=SC2086  # the test list is globbed and split on purpose
GAZETTE_EXPECT_COMPILED=1 "$V/bin/python" -m pytest -q $TESTS
echo "compiled check: passed in $(($(date +%s) - start)) s"
