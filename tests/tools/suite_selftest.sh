#!/usr/bin/env bash
# tests/tools/suite_selftest.sh — do the suite's own guards work?  (root)
#
# Not run by `make test` (tools/run-tests.sh runs build/*/tests/*/test_*
# only): run it by hand after changing tools/watchdog.sh,
# tools/leftovers.sh or tools/run-tests.sh.  It checks what a user of
# `make test` relies on:
#   1. tools/watchdog.sh passes on the exit status of a command that ends;
#   2. a hanging command is reported as "HUNG: <name>" with the gdb stacks of
#      every process of its tree, the tree is gone afterwards, status 124;
#   3. tools/leftovers.sh check fails, naming each, on a process in a shard
#      cgroup of the run, that cgroup, a tmpfs under /tmp/sbx-*, a /run/sbx
#      lock file and a network namespace, all named with the run's prefix —
#      and passes once they are cleaned up (by pid and path);
#   4. tools/run-tests.sh runs binaries SBX_TEST_PARALLEL at a time, prints
#      each one's output in one piece, a table of seconds and the total,
#      and fails naming the binary that failed.
# Everything it creates is named with a fresh prefix and removed at the end.
# Exit status 0 only if every check passed.
set -uo pipefail
export LC_ALL=C
tools=$(cd "$(dirname "$0")/../../tools" && pwd)
[ "$(id -u)" = 0 ] || { echo "suite_selftest: needs root (cgroups, mounts, netns)"; exit 2; }
failed=0
check() { # check WHAT CONDITION-STATUS
  if [ "$2" = 0 ]; then echo "ok   - $1"; else echo "FAIL - $1"; failed=$((failed + 1)); fi
}
tmp=$(mktemp -d /tmp/sbx-selftest-XXXXXX)
prefix="st$(tr -dc a-z0-9 < /dev/urandom | head -c 5)"
name="t${prefix}x"
cgdir= made_sbx= sleeper= mnt= lock= ns=
cleanup() {
  [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null && wait "$sleeper" 2>/dev/null
  [ -n "$cgdir" ] && rmdir "$cgdir" 2>/dev/null
  [ -n "$made_sbx" ] && rmdir "$made_sbx" 2>/dev/null
  [ -n "$mnt" ] && umount "$mnt" 2>/dev/null && rmdir "$mnt"
  [ -n "$lock" ] && rm -f "$lock"
  [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null
  sleeper= cgdir= made_sbx= mnt= lock= ns=
  true
}
trap 'cleanup; rm -rf "$tmp"' EXIT

# 1. an ending command keeps its status
"$tools/watchdog.sh" 30 quick sh -c 'exit 3' > "$tmp/quick.out" 2>&1
st=$?
check "watchdog passes on the status of a command that ends (3, got $st)" $([ $st = 3 ]; echo $?)
! grep -q HUNG "$tmp/quick.out"
check "watchdog says nothing of a command that ends" $?

# 2. a hanging tree
cat > "$tmp/hang.sh" <<'EOF'
#!/usr/bin/env bash
sleep 1000 &
bash -c 'sleep 1000 & wait' &
wait
EOF
chmod +x "$tmp/hang.sh"
"$tools/watchdog.sh" 3 dummy-hang "$tmp/hang.sh" > "$tmp/hang.out" 2>&1
st=$?
check "a hung command ends with status 124 (got $st)" $([ $st = 124 ]; echo $?)
grep -q '^HUNG: dummy-hang (pid [0-9]*) after 3 s$' "$tmp/hang.out"
check "a hung command is reported by name" $?
pids=$(sed -n '/^---- process tree of/,/^---- stacks/ s/^\([0-9][0-9]*\) (parent.*/\1/p' "$tmp/hang.out")
n=$(echo "$pids" | grep -c .)
check "its whole tree is listed (4 processes, got $n)" $([ "$n" = 4 ]; echo $?)
s=$(grep -c '^---- stacks of pid ' "$tmp/hang.out")
t=$(grep -c '^Thread 1 ' "$tmp/hang.out")
check "gdb stacks of every process of the tree ($s headers, $t 'Thread 1')" \
  $([ "$s" = 4 ] && [ "$t" = 4 ]; echo $?)
grep -q 'in .*sleep\|nanosleep' "$tmp/hang.out"
check "the stacks show where it waits (nanosleep)" $?
left=0
for p in $pids; do [ -e "/proc/$p" ] && left=$((left + 1)); done
check "no process of the tree is left ($left)" $([ $left = 0 ]; echo $?)

# 3. leftovers
export SBX_TEST_PREFIX=$prefix
"$tools/leftovers.sh" snapshot "$tmp/snap"
check "leftovers snapshot" $?
SBX_LEFTOVER_GRACE=0 "$tools/leftovers.sh" check "$tmp/snap" > "$tmp/clean0.out" 2>&1
check "nothing of the run left before it made anything" $?
if [ -d /sys/fs/cgroup/memory ]; then root=/sys/fs/cgroup/memory; else root=/sys/fs/cgroup; fi
[ -d "$root/sbx" ] || { mkdir "$root/sbx" && made_sbx="$root/sbx"; }
cgdir="$root/sbx/$name-s0"
mkdir "$cgdir"
env -u SBX_TEST_PREFIX sleep 600 < /dev/null > /dev/null 2>&1 &
sleeper=$!
echo "$sleeper" > "$cgdir/cgroup.procs"
mnt="/tmp/sbx-full-${prefix}y"
mkdir "$mnt" && mount -t tmpfs -o size=1m tmpfs "$mnt" || mnt=
mkdir -p /run/sbx && lock="/run/sbx/deploy.$name.lock" && : > "$lock"
ns="sbx${prefix}n0"
ip netns add "$ns" || ns=
SBX_LEFTOVER_GRACE=1 "$tools/leftovers.sh" check "$tmp/snap" > "$tmp/left.out" 2>&1
st=$?
check "leftovers check fails on what the run left (status 1, got $st)" $([ $st = 1 ]; echo $?)
grep -q "^  process $sleeper (cgroup /sbx/$name-s0): sleep 600" "$tmp/left.out"
check "it names the process in the run's cgroup" $?
grep -q "^  cgroup $cgdir (1 processes in it)" "$tmp/left.out"
check "it names the cgroup" $?
grep -q "^  mount /tmp/sbx-full-${prefix}y (tmpfs" "$tmp/left.out"
check "it names the mount" $?
grep -q "^  lock /run/sbx/deploy.$name.lock (held by nobody)" "$tmp/left.out"
check "it names the lock file" $?
grep -q "^  network namespace sbx${prefix}n0" "$tmp/left.out"
check "it names the network namespace" $?
[ -e "/proc/$sleeper" ] && [ -d "$cgdir" ] && mountpoint -q "/tmp/sbx-full-${prefix}y"
check "the check removed nothing" $?
cleanup
SBX_LEFTOVER_GRACE=5 "$tools/leftovers.sh" check "$tmp/snap" > "$tmp/clean.out" 2>&1
st=$?
check "leftovers check passes once they are cleaned up (got $st)" $([ $st = 0 ]; echo $?)

# 4. the parallel runner: two binaries that can only finish together (each
# waits up to 30 s for the other to have started), one that fails; each
# one's output in one piece, a table of seconds, the failure named.
fb="$tmp/build"
mkdir -p "$fb/bin" "$fb/tests/unit"
for t in a b; do
  o=$([ $t = a ] && echo b || echo a)
  rc=$([ $t = a ] && echo 0 || echo 1)
  cat > "$fb/tests/unit/test_$t" <<SCRIPT
#!/usr/bin/env bash
: > "$tmp/$t.started"; echo $t-1
for _ in \$(seq 300); do [ -e "$tmp/$o.started" ] && { echo $t-2; exit $rc; }; sleep 0.1; done
echo $t-alone; exit $rc
SCRIPT
done
printf '#!/bin/sh\necho c-1\necho c-2\n' > "$fb/tests/unit/test_c"
chmod +x "$fb"/tests/unit/test_*
SBX_TEST_PARALLEL=2 "$tools/run-tests.sh" "$fb" unit > "$tmp/runner.out" 2>&1
st=$?
check "the runner fails when a binary fails (status $st)" $([ $st = 1 ]; echo $?)
grep -q "^tests: 2 passed, 1 failed ($fb/tests/unit/test_b)$" "$tmp/runner.out"
check "its summary counts and names the failure" $?
grep -q '^a-2$' "$tmp/runner.out" && grep -q '^b-2$' "$tmp/runner.out"
check "two binaries ran at the same time (SBX_TEST_PARALLEL=2)" $?
together=0
for t in a b c; do
  grep -A3 "^== $fb/tests/unit/test_$t$" "$tmp/runner.out" | tr '\n' ' ' |
    grep -qE "^== $fb/tests/unit/test_$t $t-1 $t-2 +\([0-9]+ s\) $" || together=1
done
check "each binary's output is printed in one piece" $together
n=$(grep -cE "^ +[0-9]+  (ok|FAILED) +$fb/tests/unit/test_[abc]$" "$tmp/runner.out")
check "a table with the seconds of each binary (3 rows, got $n)" $([ "$n" = 3 ]; echo $?)
grep -qE '^ +[0-9]+  total wall time' "$tmp/runner.out"
check "and the total wall time" $?
[ "$(wc -l < "$fb/test-seconds")" = 3 ]
check "the seconds are kept for the next run's order" $?

if [ $failed -ne 0 ]; then
  for f in "$tmp"/*.out; do echo "---- $f"; cat "$f"; done
fi
echo "suite_selftest: $failed failed"
[ $failed = 0 ]
