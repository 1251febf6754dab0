#!/usr/bin/env bash
# The test suite against the compiled build, as users install it: builds the wheel with its
# mypyc-compiled modules (the list in gazette/_compiled.py) from the files git knows, installs
# it with the suite's extras ([dev]) into a virtualenv of its own, and runs the tests of this
# checkout against that installation: no directory of the checkout is on sys.path but a shim
# holding examples/ and fuzz/ (the suites' helper packages), so `import gazette` is the wheel's,
# in the tests and in every process they start (PYTHONSAFEPATH). test_compiled_build.py runs
# first and fails if any listed module imports from its .py (a silent fallback).
#
# Where no C compiler works (or GAZETTE_PURE=1) the wheel is pure Python and the suite runs
# against that instead, saying so. Arguments are passed to pytest (default: the whole suite,
# without the soak tests). The venv is kept at $COMPILED_VENV (default .venv-compiled): only
# the wheel is reinstalled when it exists. COMPILED_TESTS overrides the test paths.
# COMPILED_ONLY_INSTALL=1 builds and installs, and runs no tests (scripts/demo.sh uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
start=$(date +%s)
step() { echo "--- [$(($(date +%s) - start)) s] $*"; }
T=$(mktemp -d -t gazette-compiled.XXXXXX)
trap 'rm -rf "$T"' EXIT
V=${COMPILED_VENV:-$SRC/.venv-compiled}

step "compiled: the wheel (pip wheel: mypyc runs in pip's isolated build environment)"
mkdir "$T/src"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$T/src"
python3 -m venv "$T/host"
"$T/host/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$T/dist" "$T/src" \
  >"$T/build.log" 2>&1 || { tail -40 "$T/build.log"; exit 1; }
grep "^gazette: " "$T/build.log" || true  # the build's own line: compiling N modules, or why pure
WHEEL=$(echo "$T"/dist/gazette-*.whl)
EXPECT=1
case "$WHEEL" in
  *-none-any.whl)
    EXPECT=0
    case "${GAZETTE_PURE:-0}" in 0|"") forced=0 ;; *) forced=1 ;; esac
    if [ "$forced" = 0 ] && command -v "${CC:-cc}" >/dev/null 2>&1; then
      echo "a pure wheel was built though a C compiler is here: $WHEEL" >&2; tail -20 "$T/build.log"; exit 1
    fi
    echo "compiled check: no compiled modules in this wheel (pure Python): the suite runs on it" ;;
esac
step "compiled: built $(basename "$WHEEL")"

if [ ! -x "$V/bin/python" ]; then
  step "compiled: a fresh virtualenv ($V)"
  python3 -m venv "$V"
fi
"$V/bin/python" -m pip install -q --disable-pip-version-check -c constraints/dev.txt \
  --force-reinstall --no-deps "$WHEEL"
"$V/bin/python" -m pip install -q --disable-pip-version-check -c constraints/dev.txt "$WHEEL[dev]"
"$V/bin/python" -m pip check
"$V/bin/gazette" --version
[ "${COMPILED_ONLY_INSTALL:-0}" = "1" ] && { echo "compiled build installed in $V ($(($(date +%s) - start)) s)"; exit 0; }

# The suites' helper packages without the checkout's gazette beside them.
mkdir "$T/path"
ln -s "$SRC/examples" "$T/path/examples"
ln -s "$SRC/fuzz" "$T/path/fuzz"
export PYTHONSAFEPATH=1 PYTHONPATH="$T/path" GAZETTE_EXPECT_COMPILED=$EXPECT
TESTS=${COMPILED_TESTS:-tests}
step "compiled: pytest tests/unit/test_compiled_build.py"
"$V/bin/python" -m pytest -q -o pythonpath= -p no:cacheprovider tests/unit/test_compiled_build.py
step "compiled: pytest $TESTS $*"
# shellcheck disable=SC2086  # the test list is split on purpose
"$V/bin/python" -m pytest -o pythonpath= -p no:cacheprovider $TESTS "$@"
echo "compiled check: passed in $(($(date +%s) - start)) s"
