#!/usr/bin/env bash
# tools/fuzz.sh SECONDS PARALLEL TARGET... — run libFuzzer targets built in
# build/fuzz/ (make fuzz-bins) for SECONDS each, PARALLEL at a time.
#
# Each target first replays its committed seeds, tests/fuzz/corpus/<target>/
# (every input that once failed is kept there), then mutates for the rest of
# the time.  New coverage goes to $FUZZ_WORK/<target>/ (default
# build/fuzz/work; never into the committed corpus: `build/fuzz/<t> -merge=1
# tests/fuzz/corpus/<t> build/fuzz/work/<t>` adds the useful ones), crashes
# to build/fuzz/artifacts/<target>-crash-*.  Prints one line per target and
# exits non-zero if any target found a failure.
set -uo pipefail
secs=${1:?seconds}; par=${2:-1}; shift 2
export FUZZ_WORK=${FUZZ_WORK:-build/fuzz/work}
mkdir -p build/fuzz/artifacts build/fuzz/logs
run_one() {
  local t=$1 secs=$2 start execs
  mkdir -p "$FUZZ_WORK/$t" "tests/fuzz/corpus/$t"
  start=$(date +%s)
  # -rss_limit_mb: the wire limits allow ~200 MB decoded replies; -timeout:
  # one input may not take 10 s (a hang is a failure like a crash).
  if "build/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2560 \
       -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$t-" \
       "$FUZZ_WORK/$t" "tests/fuzz/corpus/$t" >"build/fuzz/logs/$t.log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "build/fuzz/logs/$t.log" | grep -o '[0-9]*$')
    echo "fuzz: $t ok ($(( $(date +%s) - start )) s, ${execs:-?} inputs)"
  else
    echo "fuzz: $t FAILED — see build/fuzz/logs/$t.log and build/fuzz/artifacts/$t-*"
    grep -m1 -A12 -E 'ERROR: |property failed|==ERROR|runtime error' "build/fuzz/logs/$t.log" | sed 's/^/    /'
    return 1
  fi
}
export -f run_one
printf '%s\n' "$@" | xargs -P "$par" -I{} bash -c "run_one {} $secs"
