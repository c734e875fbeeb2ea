#!/usr/bin/env bash
# tools/run-tests.sh BUILD [unit|integration|all] — run the test binaries of
# a build (build/asan) and print one summary line: "tests: N passed, N failed".
# With `all` it then runs the SDK suites (sdk/*/run-tests.sh) and `make
# fuzz-smoke`, `make valgrind` and `make faults-smoke` (each counted as one;
# SBX_SKIP_RELIABILITY=1 skips the last three).
# Each binary is a Criterion suite; its own "Synthesis" line is kept in the
# output.  Exit status 0 only if every binary passed.
set -uo pipefail
build=${1:-build/asan}
which=${2:-all}
export SBX_BIN="$(cd "$build/bin" 2>/dev/null && pwd || echo "$build/bin")"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0}"

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
    if timeout -k 15 "${SBX_TEST_BINARY_TIMEOUT:-900}" \
        "$t" --jobs "${SBX_TEST_JOBS:-2}" --timeout 240 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); failed_names+=("$t")
    fi
    echo "   ($(( $(date +%s) - start )) s)"
  done
done
# The SDKs' end-to-end suites (each starts its own private daemon from the
# same build): the TypeScript SDK (node:test) and the Python client (pytest).
if [ "$which" = all ]; then
  for suite in sdk/typescript/run-tests.sh sdk/python/run-tests.sh; do
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
echo
echo "tests: $passed passed, $failed failed${failed_names[*]:+ (${failed_names[*]})}"
[ "$failed" -eq 0 ]
