#!/usr/bin/env bash
# tools/run-tests.sh BUILD [unit|integration|all] — run the test binaries of
# a build (build/asan) and print one summary line: "tests: N passed, N failed".
# With `all` it then runs the SDK suites (sdk/*/run-tests.sh, tests/openapi) and `make
# fuzz-smoke`, `make valgrind` and `make faults-smoke` (each counted as one;
# SBX_SKIP_RELIABILITY=1 skips the last three).
# Each binary is a Criterion suite; its own "Synthesis" line is kept in the
# output.  Each runs under tools/watchdog.sh: one still running after
# SBX_TEST_BINARY_TIMEOUT seconds (900) is reported as "HUNG: <binary>" with
# the gdb stacks of its process tree, then ended by pid, and counts as failed.
# The run ends with tools/leftovers.sh: processes, cgroups, mounts, /run/sbx
# locks or network namespaces of its deployments that are still there (its
# tests name them with SBX_TEST_PREFIX, unique per run; what was there before
# the run, or is another run's, is not counted) count as one more failure,
# "leftovers".  Exit status 0 only if every binary passed and nothing is left.
set -uo pipefail
build=${1:-build/asan}
which=${2:-all}
export SBX_BIN="$(cd "$build/bin" 2>/dev/null && pwd || echo "$build/bin")"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0}"
# This run's mark: tests put it in the names of what they create on the host.
export SBX_TEST_PREFIX="${SBX_TEST_PREFIX:-u$(tr -dc a-z0-9 < /dev/urandom | head -c 5)}"
tools=$(cd "$(dirname "$0")" && pwd)
snapshot=$(mktemp /tmp/sbx-leftovers-XXXXXX)
trap 'rm -f "$snapshot"' EXIT
"$tools/leftovers.sh" snapshot "$snapshot"

dirs=()
case "$which" in
  unit) dirs=(unit) ;;
  integration) dirs=(integration) ;;
  *) dirs=(unit integration security cluster) ;;
esac

passed=0; failed=0; failed_names=()
for d in "${dirs[@]}"; do
  for t in "$build"/tests/"$d"/test_*; do
    [ -x "$t" ] || continue
    echo "== $t"
    start=$(date +%s)
    # An outer bound too: a binary whose daemon crashed must not hang the run.
    if "$tools/watchdog.sh" "${SBX_TEST_BINARY_TIMEOUT:-900}" "$t" \
        "$t" --jobs "${SBX_TEST_JOBS:-2}" --timeout 240 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); failed_names+=("$t")
    fi
    echo "   ($(( $(date +%s) - start )) s)"
  done
done
# The SDKs' end-to-end suites (each starts its own private daemon from the
# same build): the TypeScript SDK (node:test), the Python client (pytest) and
# the OpenAPI document (tests/openapi: a real validator, real answers against
# its schemas, a client generated from it compiled and smoke-tested).
if [ "$which" = all ]; then
  for suite in sdk/typescript/run-tests.sh sdk/python/run-tests.sh tests/openapi/run-tests.sh; do
    echo "== $suite"
    start=$(date +%s)
    if "$suite" 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); failed_names+=("$suite")
    fi
    echo "   ($(( $(date +%s) - start )) s)"
  done
fi
# The reliability jobs of the Makefile's reliability block: short runs of the
# fuzz targets (replaying tests/fuzz/corpus) and the valgrind scenario; and
# the short fault-injection history test (tests/faults, sbxd dev from $SBX_BIN).
if [ "$which" = all ] && [ -z "${SBX_SKIP_RELIABILITY:-}" ]; then
  for job in fuzz-smoke valgrind faults-smoke; do
    echo "== make $job"
    start=$(date +%s)
    if make --no-print-directory "$job" 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); failed_names+=("make $job")
    fi
    echo "   ($(( $(date +%s) - start )) s)"
  done
fi
# Nothing of the run's deployments may be left behind.
echo "== leftovers"
if ! "$tools/leftovers.sh" check "$snapshot" 2>&1; then
  failed=$((failed + 1)); failed_names+=("leftovers")
fi
echo
echo "tests: $passed passed, $failed failed${failed_names[*]:+ (${failed_names[*]})}"
[ "$failed" -eq 0 ]
