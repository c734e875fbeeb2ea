#!/bin/sh
# Tests of the Python client against a private sbx daemon (started and
# stopped by tests/conftest.py).  Used by CI.
#
#   SBX_BIN   directory holding sbxd (default: <repo>/bin; build with `make all`)
#   PYTHON    interpreter (default /usr/bin/python3; needs pytest:
#             apt-get install -y python3-pytest)
#   SBX_TEST_TIMEOUT  seconds before the run is interrupted (default 600)
#   extra arguments go to pytest (e.g. -k terminal, -x)
#
# Exit status: 0 only when every test passed.  Needs root (the daemon does).
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
SBX_BIN=${SBX_BIN:-$repo/bin}
export SBX_BIN

if ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
    echo "run-tests.sh: pytest is missing for $PYTHON (apt-get install -y python3-pytest)" >&2
    exit 2
fi
if [ ! -x "$SBX_BIN/sbxd" ] && [ ! -x "$SBX_BIN" ]; then
    echo "run-tests.sh: no sbxd in $SBX_BIN (run 'make all' or set SBX_BIN)" >&2
    exit 2
fi

state=$(mktemp /tmp/sbx-py-state-XXXXXX)
export SBX_TEST_STATE="$state"
cleanup() {
    # Normally the fixture has stopped the daemon already; this covers a
    # pytest that was killed.
    if [ -s "$state" ]; then
        while read -r pid data; do
            if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then
                kill -TERM "$pid" 2>/dev/null
                i=0
                while kill -0 "$pid" 2>/dev/null && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done
                kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
            fi
            case "${data:-}" in /tmp/sbx-py-*) rm -rf "$data" ;; esac
        done <"$state"
    fi
    rm -f "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# tests/conftest.py turns SIGTERM and the time limit into KeyboardInterrupt,
# so pytest still runs its teardown (stops the daemon) when interrupted.
export SBX_TEST_TIMEOUT="${SBX_TEST_TIMEOUT:-600}"
cd "$here" || exit 2
start=$(date +%s)
PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -m pytest -q -p no:cacheprovider tests "$@"
rc=$?
echo "run-tests.sh: pytest exit $rc after $(( $(date +%s) - start )) s"
exit $rc
