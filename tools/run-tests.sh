#!/usr/bin/env bash
# tools/run-tests.sh BUILD [unit|integration|check|all] — run the test
# binaries of a build (build/asan), SBX_TEST_PARALLEL (2) at a time, and
# print a table of seconds per binary, the total wall time and one summary
# line: "tests: N passed, N failed".
#   unit         tests/unit/test_* (no containers; no root but for test_ws_guard's
#                loop-mounted workspaces, skipped without it)
#   integration  tests/integration/test_*
#   check        what `make check` runs: the unit tests, the fuzz corpus
#                replay (`make fuzz-replay`) and tests/integration/test_smoke
#   all          unit, integration, security and cluster binaries, then the
#                SDK suites (sdk/*/run-tests.sh, tests/openapi) and `make fuzz-smoke`,
#                `make valgrind` and `make faults-smoke` (each counted as one;
#                SBX_SKIP_RELIABILITY=1 skips the last three) — what CI runs
# Each binary is a Criterion suite run with --jobs SBX_TEST_JOBS (2) and
# --verbose (a "[RUN ]" line as each test starts: a hung binary's excerpt
# names the tests it was running); its
# output (with its own "Synthesis" line) is buffered to a file and printed in
# one piece when it ends, so parallel binaries do not interleave.  Binaries
# that must have the machine to themselves (the list `alone` below: they
# kill shards, fill disks, build clusters, exhaust resources or measure
# leaks; SBX_TEST_ALONE names more) run after the others, one at a time.
# Each runs under tools/watchdog.sh: one still running after
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
par=${SBX_TEST_PARALLEL:-2}
[[ "$par" =~ ^[1-9][0-9]*$ ]] || { echo "run-tests.sh: SBX_TEST_PARALLEL must be a positive integer" >&2; exit 2; }
export SBX_BIN="$(cd "$build/bin" 2>/dev/null && pwd || echo "$build/bin")"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0}"
# This run's mark: tests put it in the names of what they create on the host.
export SBX_TEST_PREFIX="${SBX_TEST_PREFIX:-u$(tr -dc a-z0-9 < /dev/urandom | head -c 5)}"
tools=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/sbx-run-tests-XXXXXX)
snapshot="$out/leftovers.snapshot"
running=() # pids of the jobs in flight
cleanup() {
  # Interrupted: end the jobs still running (each is a watchdog, which ends
  # its own process tree by pid), then drop the buffers.
  for pid in "${running[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$tools/leftovers.sh" snapshot "$snapshot"

# Must run with nothing else of the suite beside them (by file name; a
# glob for the cluster binaries); SBX_TEST_ALONE adds more (space-separated).
alone=(test_shard_kill test_faults test_exhaustion test_leaks 'cluster/*' 'make valgrind'
       'make faults-smoke')
read -r -a more_alone <<< "${SBX_TEST_ALONE:-}"
alone+=("${more_alone[@]}")
is_alone() {
  local a
  for a in "${alone[@]}"; do
    # shellcheck disable=SC2053
    [[ "$1" == *$a ]] && return 0
  done
  return 1
}

# The jobs: "name<TAB>command" lines.
jobs_all=()
add_bins() { # DIR [GLOB]
  local t
  for t in "$build"/tests/"$1"/${2:-test_*}; do
    [ -x "$t" ] || continue
    # Only binaries of sources that still exist: a stale one in an old
    # build directory (its test since renamed or removed) is not the suite.
    [ -f "tests/$1/$(basename "$t").c" ] || continue
    jobs_all+=("$t"$'\t'"$tools/watchdog.sh ${SBX_TEST_BINARY_TIMEOUT:-900} $t $t --jobs ${SBX_TEST_JOBS:-2} --timeout 240 --verbose")
  done
}
case "$which" in
  unit) add_bins unit ;;
  integration) add_bins integration ;;
  check)
    add_bins unit
    jobs_all+=("make fuzz-replay"$'\t'"make --no-print-directory fuzz-replay")
    add_bins integration test_smoke ;;
  *)
    for d in unit integration security cluster; do add_bins "$d"; done
    # The SDKs' end-to-end suites (each starts its own private daemon from
    # the same build): the TypeScript SDK (node:test), the Python client
    # (pytest) and the OpenAPI document (tests/openapi: a real validator, real
    # answers against its schemas, a client generated from it compiled and
    # smoke-tested).
    # tests/install: `make install` (DESTDIR and PREFIX) of the build under test, its
    # man pages and systemd units checked, the installed sbxd dev + sbx exec run;
    # tests/mcp: `sbx mcp` driven by the official MCP TypeScript SDK as the client;
    # tests/console: the web console in chromium driven by puppeteer-core.
    for suite in sdk/typescript/run-tests.sh sdk/python/run-tests.sh tests/openapi/run-tests.sh \
                 tests/install/run-tests.sh tests/mcp/run-tests.sh tests/console/run-tests.sh; do
      jobs_all+=("$suite"$'\t'"$suite")
    done
    # The reliability jobs of the Makefile's reliability block: short runs of
    # the fuzz targets (replaying tests/fuzz/corpus) and the valgrind
    # scenario; and the short fault-injection history test (tests/faults,
    # sbxd dev from $SBX_BIN).
    if [ -z "${SBX_SKIP_RELIABILITY:-}" ]; then
      for job in fuzz-smoke valgrind faults-smoke; do
        jobs_all+=("make $job"$'\t'"make --no-print-directory $job")
      done
    fi ;;
esac
# The parallel ones first, longest first by the seconds of the last run
# ($build/test-seconds, written at the end: fewer idle slots at the end of
# the parallel part), then the ones that run alone.
times_file="$build/test-seconds"
declare -A last_secs
if [ -r "$times_file" ]; then
  while IFS=$'\t' read -r s n; do [[ "$s" =~ ^[0-9]+$ ]] && last_secs[$n]=$s; done < "$times_file"
fi
queue=()
while IFS= read -r j; do [ -n "$j" ] && queue+=("$j"); done < <(
  for j in "${jobs_all[@]}"; do
    n=${j%%$'\t'*}
    is_alone "$n" || printf '%s\t%s\n' "${last_secs[$n]:-0}" "$j"
  done | sort -t$'\t' -k1,1nr -s | cut -f2-)
nalone_start=${#queue[@]}
for j in "${jobs_all[@]}"; do is_alone "${j%%$'\t'*}" && queue+=("$j"); done

passed=0; failed=0; failed_names=(); failed_logs=(); table=()
declare -A job_name job_start job_file
t_run=$(date +%s)

start_job() { # INDEX
  local name=${queue[$1]%%$'\t'*} cmd=${queue[$1]#*$'\t'} f="$out/job$1.log"
  bash -c "$cmd" >"$f" 2>&1 &
  local pid=$!
  running+=("$pid")
  job_name[$pid]=$name; job_start[$pid]=$(date +%s); job_file[$pid]=$f
}
reap_one() { # wait for any job to end, print its output and account for it
  local pid rc=0 secs name r
  wait -n -p pid "${running[@]}"; rc=$?
  name=${job_name[$pid]}
  secs=$(( $(date +%s) - ${job_start[$pid]} ))
  echo "== $name"
  cat "${job_file[$pid]}"
  echo "   ($secs s)"
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1)); table+=("$secs"$'\t'"ok"$'\t'"$name")
    rm -f "${job_file[$pid]}"
  else
    failed=$((failed + 1)); failed_names+=("$name"); table+=("$secs"$'\t'"FAILED"$'\t'"$name")
    failed_logs+=("${job_file[$pid]}") # kept for the excerpt at the end
  fi
  local keep=()
  for r in "${running[@]}"; do [ "$r" != "$pid" ] && keep+=("$r"); done
  running=("${keep[@]}")
}

for i in "${!queue[@]}"; do
  if [ "$i" -ge "$nalone_start" ]; then
    # Alone: wait for everything else to end first.
    while [ ${#running[@]} -gt 0 ]; do reap_one; done
    start_job "$i"
    reap_one
    continue
  fi
  while [ ${#running[@]} -ge "$par" ]; do reap_one; done
  start_job "$i"
done
while [ ${#running[@]} -gt 0 ]; do reap_one; done

# Nothing of the run's deployments may be left behind.
echo "== leftovers"
if ! "$tools/leftovers.sh" check "$snapshot" > "$out/leftovers.log" 2>&1; then
  failed=$((failed + 1)); failed_names+=("leftovers"); failed_logs+=("$out/leftovers.log")
fi
cat "$out/leftovers.log"
echo
echo "seconds per binary (SBX_TEST_PARALLEL=$par, SBX_TEST_JOBS=${SBX_TEST_JOBS:-2}):"
sum=0
while IFS=$'\t' read -r s st n; do
  [ -n "$s" ] || continue
  printf '%6d  %-6s  %s\n' "$s" "$st" "$n"
  sum=$((sum + s))
  last_secs[$n]=$s
done < <(printf '%s\n' "${table[@]}" | sort -t$'\t' -k1,1nr)
for n in "${!last_secs[@]}"; do printf '%s\t%s\n' "${last_secs[$n]}" "$n"; done \
  > "$times_file" 2>/dev/null
printf '%6d  total wall time (%d s of binaries)\n' "$(( $(date +%s) - t_run ))" "$sum"
echo
# Why each failed job failed, again, here at the end: a CI log is often read
# from its tail only, where each job's own output is long gone.
# Kept short (a tail of ~20 lines must hold it): per failed job at most 10
# lines, a hung binary's first (HUNG, the Criterion tests it was running —
# "[RUN ]" lines of --verbose with no result line —, its tree and stacks in
# short, from tools/watchdog.sh).
nfail=${#failed_logs[@]}
per=$(( nfail > 1 ? 16 / nfail : 12 )); [ "$per" -lt 3 ] && per=3
for i in "${!failed_logs[@]}"; do
  f=${failed_logs[$i]}
  echo "why ${failed_names[$i]} failed (its lines that say so; the whole output is above):"
  {
    if grep -aq '^HUNG: ' "$f"; then
      grep -a '^HUNG: ' "$f"
      echo "in flight: $(awk '
        /^\[RUN \] / { run[$3] = 1; order[++n] = $3; next }
        /^\[(PASS|FAIL|SKIP|ERR )\] / { t = ($1 == "[ERR") ? $3 : $2; sub(/:$/, "", t); done[t] = 1 }
        END { for (i = 1; i <= n; i++) if (!done[order[i]]) printf "%s ", order[i] }' "$f")"
      grep -a '^HUNG-TREE: \|^HUNG-STACK ' "$f"
    fi
    grep -aE '✖|FAIL|[Ff]ailing|[Aa]ssert|Error|error:|DIED|leftover|Traceback|not ok|^  (process|cgroup|mount|lock|netns|network|nft|loop)' "$f" \
      | grep -avE '✔|^\s*at |Passing: [0-9]+ \| Failing: 0|^HUNG|^\[(PASS|RUN |SKIP)\]'
  } | head -n "$per" | cut -c1-400 | sed 's/^/  | /'
done
echo "tests: $passed passed, $failed failed${failed_names[*]:+ (${failed_names[*]})}"
[ "$failed" -eq 0 ]
