#!/usr/bin/env bash
# tools/watchdog.sh SECONDS NAME CMD [ARG…] — run CMD with an outer bound.
#
# CMD runs as a child with this script's stdout and stderr.  If it ends by
# itself, its exit status is ours.  If it is still running SECONDS after its
# start (an integer > 0) the run is reported, not just killed:
#   1. "HUNG: NAME (pid P) after SECONDS s" on stdout;
#   2. the process tree under CMD (pid, parent, command line), and the stacks
#      of every thread of every process in it (`gdb -p PID -batch -ex 'thread
#      apply all bt'`, at most 60 s each), CMD first — its sbxd children,
#      their shards and the sandboxes' processes are in that tree; then, in
#      short for a log read from its tail, "HUNG-TREE: pid:state:name …" and
#      "HUNG-STACK PID: f<g<h<i | …" (the innermost functions of each thread)
#      for CMD and the processes of its name (a Criterion binary's workers);
#   3. the tree is ended by pid: SIGTERM to every process in it (sbxd cleans
#      up its cgroups and locks on SIGTERM), up to 15 s for it to go, then
#      SIGKILL to whatever of it is left;
# and the exit status is 124 (as timeout(1)).  Processes are only ever
# signalled by pid, after checking that the pid still names the process seen
# in the tree (its start time), never by name.  SIGINT/SIGTERM to this
# script end the tree the same way, without the stacks (status 130/143).
# Exit status 125: bad usage.
set -uo pipefail

if [ $# -lt 3 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -eq 0 ]; then
  echo "usage: $0 SECONDS NAME CMD [ARG...]" >&2
  exit 125
fi
limit=$1 name=$2
shift 2

# start time (clock ticks since boot, field 22 of /proc/PID/stat) of PID, or
# nothing if PID is gone.  The command field (2) may hold spaces: skip past
# its closing parenthesis.
starttime() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*) }
  set -- $s
  echo "${20}"
}

# The tree under $1 ($1 included), one "pid starttime" a line, parents first.
tree() {
  local -A kids=()
  local pid ppid
  while read -r pid ppid; do
    kids[$ppid]+="$pid "
  done < <(ps -e -o pid=,ppid= 2>/dev/null)
  local queue=("$1") p st
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    st=$(starttime "$p")
    [ -n "$st" ] && echo "$p $st"
    for k in ${kids[$p]:-}; do
      queue+=("$k")
    done
  done
}

# Signal every process of a tree listing ($2) with $1, if its pid still
# names the same process.
signal_tree() {
  local sig=$1 pid st
  while read -r pid st; do
    [ -n "$pid" ] && [ "$(starttime "$pid")" = "$st" ] && kill "-$sig" "$pid" 2>/dev/null
  done <<< "$2"
}

# End the tree under $1: SIGTERM, 15 s, SIGKILL; then reap $1.
end_tree() {
  local t
  t=$(tree "$1")
  signal_tree TERM "$t"
  for _ in $(seq 150); do
    # anything of the tree, as seen at the start, still there?
    local alive=0 pid st
    while read -r pid st; do
      [ -n "$pid" ] && [ "$(starttime "$pid")" = "$st" ] && alive=1 && break
    done <<< "$t"
    # children started meanwhile (a supervisor restarting a shard) count too
    [ "$alive" = 0 ] && [ -z "$(tree "$1")" ] && break
    sleep 0.1
  done
  # stop the tree as it is now (a restart cannot race the kill), then kill it
  t=$(printf '%s\n%s\n' "$t" "$(tree "$1")" | sort -u)
  signal_tree STOP "$t"
  signal_tree KILL "$t"
  wait "$1" 2>/dev/null
}

"$@" &
child=$!
# The timer goes too (tools/run-tests.sh ends its watchdogs this way when it is
# interrupted; a `sleep SECONDS` was left behind).
timer=
trap 'end_tree "$child"; [ -n "$timer" ] && kill "$timer" 2>/dev/null; exit 130' INT
trap 'end_tree "$child"; [ -n "$timer" ] && kill "$timer" 2>/dev/null; exit 143' TERM

sleep "$limit" &
timer=$!
wait -n -p ended "$child" "$timer"
status=$?
if [ "${ended:-}" = "$child" ]; then
  kill "$timer" 2>/dev/null
  wait "$timer" 2>/dev/null
  exit "$status"
fi

echo "HUNG: $name (pid $child) after $limit s"
t=$(tree "$child")
echo "---- process tree of $name ----"
while read -r pid _; do
  [ -n "$pid" ] || continue
  printf '%s (parent %s): %s\n' "$pid" "$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')" \
    "$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
done <<< "$t"
# One line for the whole tree (a CI log is often read from its tail only;
# tools/run-tests.sh repeats the HUNG-* lines at the end): pid, state (ps(1)
# STAT: S sleeping, T stopped, Z zombie, D in the kernel) and name of each.
summary=
while read -r pid _; do
  [ -n "$pid" ] || continue
  summary+="$pid:$(ps -o stat= -p "$pid" 2>/dev/null | tr -d ' '):$(cat "/proc/$pid/comm" 2>/dev/null) "
done <<< "$t"
stack_lines=()
if command -v gdb >/dev/null 2>&1; then
  root_comm=$(cat "/proc/$child/comm" 2>/dev/null)
  while read -r pid _; do
    [ -n "$pid" ] || continue
    echo "---- stacks of pid $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) ----"
    bt=$(timeout -k 5 60 gdb -p "$pid" -batch -nx -ex 'set pagination off' \
      -ex 'thread apply all bt' < /dev/null 2>&1 |
      grep -v '^\[New LWP\|^\[Thread debugging\|^Using host libthread_db')
    echo "$bt"
    # The binary itself and its Criterion workers (same name), in short: per
    # thread its three innermost functions that are not the C library's
    # internals (a name starting with "_", "??"), threads of one shape
    # counted once ("2x f<g<h").
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$root_comm" ] && [ ${#stack_lines[@]} -lt 4 ]; then
      stack_lines+=("HUNG-STACK $pid: $(awk '
        function flush() { if (have) { if (!(line in cnt)) ord[++n] = line; cnt[line]++ }
                           line = ""; k = 0; have = 0 }
        /^Thread / { flush(); next }
        /^#[0-9]/ { have = 1; f = ($3 == "in") ? $4 : $2
                    if (k < 3 && f !~ /^_/ && f != "??" && f != "start_thread" && f !~ /^clone/) {
                      line = line (k ? "<" : "") f; k++ } }
        END { flush(); for (i = 1; i <= n; i++) printf "%s%s%s", (i > 1 ? " | " : ""),
                                                    (cnt[ord[i]] > 1 ? cnt[ord[i]] "x " : ""), ord[i] }
        ' <<< "$bt" | cut -c1-600)")
    fi
  done <<< "$t"
else
  echo "(gdb is not installed: no stacks; tools/deps.sh installs it)"
fi
echo "---- end of stacks of $name ----"
echo "HUNG-TREE: $summary" | cut -c1-600
for l in "${stack_lines[@]}"; do echo "$l"; done
end_tree "$child"
exit 124
