#!/usr/bin/env bash
# tools/leftovers.sh snapshot FILE | check FILE — what test deployments left.
#
# `snapshot FILE` writes to FILE what is on the host now (one item a line);
# `check FILE` lists what is on the host now, was not in FILE, and belongs to
# the test run that took FILE, and exits 1 if that list is not empty.
# tools/run-tests.sh takes the snapshot before the first test binary and
# checks after the last one; both also run alone (`check` as often as you
# like; nothing is changed on the host).
#
# Items (what a deployment of sbxd can leave behind):
#   process  a process carrying the run's SBX_TEST_PREFIX in its environment
#            (test binaries, sbxd, etcd, helpers: they inherit it), any sbxd or
#            sbx-agent, and any process in a cgroup under an "sbx" subtree;
#   cgroup   a directory right under an "sbx" directory of a cgroup hierarchy
#            (v1: every controller; v2), i.e. a shard's subtree sbx/<shard>;
#   mount    a mount whose mount point is under /tmp/sbx-*, /run/sbx or
#            /var/lib/sbx;
#   loop     a loop device whose backing file is under /tmp/sbx-* or /var/lib/sbx
#            (a shard's workspace pool <data>/wspool.img among them: it stays
#            attached while any sandbox image in it is mounted, so it stands
#            for those too, whose backing files read "/<id>/disk.img");
#   lock     a file /run/sbx/*.lock (deployment and cgroup-subtree locks;
#            sbxd unlinks its own when it stops), with the pid holding it;
#   netns    a network namespace (`ip netns list`);
#   netif    a host network interface whose alias starts "sbx:" (a shard's
#            router uplink, alias "sbx:<router netns>");
#   nft      a host nft table inet sbx_* (a shard's, comment "sbx:<router netns>").
# An item belongs to the run if the run's prefix (SBX_TEST_PREFIX when the
# snapshot was taken; tests put it in their deployment names, data
# directories and network namespaces) appears in it: in the process's
# environment, command line or cgroup path, in the cgroup's or lock's name,
# in the mount point or backing file, in the namespace's name.  Items
# without the prefix that appeared during the run (another worktree's tests
# beside this run, a test that does not use the prefix yet) are listed as
# "not counted", and fail nothing.  A snapshot taken without SBX_TEST_PREFIX counts everything
# that appeared since.
#
# run-tests.sh sets SBX_TEST_PREFIX for its own children only: if you
# export it in your shell and pipe `check` into another command, that
# command carries it and counts.
#
# Teardown is not instant (a killed process's exit, a cgroup's removal), so
# `check` looks again for up to SBX_LEFTOVER_GRACE seconds (default 30)
# before it reports.  It never kills, unmounts or removes anything: the list
# says what to clean up (by pid, mount point, path).
#
# Exit status: 0 nothing of the run is left; 1 something is (listed on
# stdout); 2 bad usage or unreadable snapshot.
set -uo pipefail
export LC_ALL=C

usage() {
  echo "usage: $0 snapshot FILE | check FILE" >&2
  exit 2
}
[ $# -eq 2 ] || usage
mode=$1 file=$2

# Processes not to look at: this script and its children (they run while it
# looks), its ancestors (the test runner and whoever started it carry the
# prefix too).
ppid_of() {
  awk '/^PPid:/ {print $2}' "/proc/$1/status" 2>/dev/null
}
declare -A skip=()
p=$$
while [ -n "$p" ] && [ "$p" != 0 ]; do
  skip[$p]=1
  p=$(ppid_of "$p")
done
# The parent of every process, refreshed by collect (one ps, not one read
# per process and ancestor).
declare -A parent=()
refresh_parents() {
  parent=()
  local pid ppid
  while read -r pid ppid; do
    parent[$pid]=$ppid
  done < <(ps -e -o pid=,ppid= 2>/dev/null)
}
is_ours_running() {
  local p=$1 n=0
  [ -n "${skip[$p]:-}" ] && return 0
  while [ -n "$p" ] && [ "$p" -gt 1 ] && [ $n -lt 64 ]; do
    [ "$p" = "$$" ] && return 0
    p=${parent[$p]:-}; n=$((n + 1))
  done
  return 1
}

starttime() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*) }
  set -- $s
  echo "${20}"
}

# collect PREFIX — every item, one a line: KIND<TAB>KEY<TAB>MINE<TAB>WHAT,
# MINE 1 when PREFIX (non-empty) appears in the item.
collect() {
  local prefix=$1
  local -A cand=() envmark=()
  local f p
  refresh_parents
  # processes: by environment, by name, by cgroup
  if [ -n "$prefix" ]; then
    while IFS= read -r f; do
      p=${f#/proc/}; p=${p%%/*}
      cand[$p]=1; envmark[$p]=1
    done < <(grep -lzx -- "SBX_TEST_PREFIX=$prefix" /proc/[0-9]*/environ 2>/dev/null)
  fi
  while IFS= read -r f; do
    p=${f#/proc/}; p=${p%%/*}; cand[$p]=1
  done < <(grep -lx -e sbxd -e sbx-agent /proc/[0-9]*/comm 2>/dev/null;
           grep -l -e '/sbx/' /proc/[0-9]*/cgroup 2>/dev/null)
  local cmd cg st mine
  for p in "${!cand[@]}"; do
    is_ours_running "$p" && continue
    st=$(starttime "$p")
    [ -n "$st" ] || continue
    # (it may end while we look)
    cmd=$({ tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | cut -c1-200)
    [ -n "$cmd" ] || cmd="[$(cat "/proc/$p/comm" 2>/dev/null)]"
    cg=$(grep -m1 -o '/sbx/.*' "/proc/$p/cgroup" 2>/dev/null)
    mine=0
    if [ -n "$prefix" ]; then
      { [ -n "${envmark[$p]:-}" ] || [[ "$cmd" == *"$prefix"* ]] ||
        [[ "$cg" == *"/sbx/"*"$prefix"* ]]; } && mine=1
    fi
    printf 'process\t%s:%s\t%s\tprocess %s%s: %s\n' "$p" "$st" "$mine" "$p" \
      "${cg:+ (cgroup $cg)}" "$cmd"
  done
  # cgroups: <hierarchy>/…/sbx/<shard>, every hierarchy
  local d n
  while IFS= read -r d; do
    [ "$(basename "$(dirname "$d")")" = sbx ] || continue
    n=$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | wc -l)
    mine=0
    [ -n "$prefix" ] && [[ "$(basename "$d")" == *"$prefix"* ]] && mine=1
    printf 'cgroup\t%s\t%s\tcgroup %s (%s processes in it)\n' "$d" "$mine" "$d" "$n"
  done < <(find /sys/fs/cgroup -mindepth 2 -maxdepth 10 -type d -path '*/sbx/*' -prune \
             2>/dev/null)
  # mounts
  local id mp fstype src
  while read -r id mp fstype src; do
    mine=0
    [ -n "$prefix" ] && [[ "$mp" == *"$prefix"* ]] && mine=1
    printf 'mount\t%s %s\t%s\tmount %s (%s %s)\n' "$id" "$mp" "$mine" "$mp" "$fstype" "$src"
  done < <(awk '{ for (i = 7; $i != "-"; i++) ; mp = $5;
                  if (mp ~ "^/tmp/sbx-" || mp ~ "^/run/sbx(/|$)" || mp ~ "^/var/lib/sbx(/|$)")
                    print $1, mp, $(i + 1), $(i + 2) }' /proc/self/mountinfo)
  # loop devices whose backing file is under /tmp/sbx-* or /var/lib/sbx (a
  # loop file system of a test, unmounted but not detached; a workspace pool)
  local bf
  for f in /sys/block/loop*/loop/backing_file; do
    [ -r "$f" ] || continue
    bf=$(cat "$f" 2>/dev/null)
    [[ "$bf" == /tmp/sbx-* || "$bf" == /var/lib/sbx/* ]] || continue
    d=${f#/sys/block/}; d=/dev/${d%%/*}
    mine=0
    [ -n "$prefix" ] && [[ "$bf" == *"$prefix"* ]] && mine=1
    printf 'loop\t%s %s\t%s\tloop device %s (backing file %s)\n' "$d" "$bf" "$mine" "$d" "$bf"
  done
  # locks, with their holders (/proc/locks: "1: FLOCK ADVISORY WRITE pid maj:min:ino …")
  local ino holder open
  for f in /run/sbx/*.lock; do
    [ -e "$f" ] || continue
    ino=$(stat -c %i "$f" 2>/dev/null) || continue
    # (a waiter's line has "->" after the number: find the dev:ino field)
    holder=$(awk -v ino="$ino" '{ for (i = 2; i <= NF; i++)
                                    if ($i ~ /^[0-9a-f]+:[0-9a-f]+:[0-9]+$/) {
                                      split($i, a, ":");
                                      if (a[3] == ino && !seen[$(i - 1)]++) printf "%s ", $(i - 1)
                                      break } }' /proc/locks)
    holder=${holder% }
    # /proc/locks names the process that took the lock; if that one is gone
    # the lock lives on in whoever inherited the open file: name those.
    if [ -n "$holder" ] && ! [ -e "/proc/${holder%% *}" ]; then
      open=
      for p in $(find -L /proc/[0-9]*/fd -maxdepth 1 -samefile "$f" 2>/dev/null |
                 cut -d/ -f3 | sort -un); do
        [ -e "/proc/$p" ] && ! is_ours_running "$p" && open+="$p "
      done
      holder="$holder (gone; open in pid ${open% })"
    fi
    [ -n "$holder" ] && holder="pid $holder" || holder=nobody
    mine=0
    [ -n "$prefix" ] && [[ "$(basename "$f")" == *"$prefix"* ]] && mine=1
    printf 'lock\t%s %s\t%s\tlock %s (held by %s)\n' "$f" "$ino" "$mine" "$f" \
      "$holder"
  done
  # network namespaces
  local ns
  while read -r ns _; do
    [ -n "$ns" ] || continue
    mine=0
    [ -n "$prefix" ] && [[ "$ns" == *"$prefix"* ]] && mine=1
    printf 'netns\t%s\t%s\tnetwork namespace %s\n' "$ns" "$mine" "$ns"
  done < <(ip netns list 2>/dev/null)
  # egress networking (container/net.h): a shard's router uplink veth in the
  # host netns (alias "sbx:<router netns>") and its host nft table
  # (comment "sbx:<router netns>"); both go when the shard stops
  local ifn alias t
  while read -r ifn alias; do
    mine=0
    [ -n "$prefix" ] && [[ "$alias" == *"$prefix"* ]] && mine=1
    printf 'netif\t%s\t%s\tnetwork interface %s (%s)\n' "$ifn" "$mine" "$ifn" "$alias"
  done < <(for f in /sys/class/net/*/ifalias; do
             a=$(cat "$f" 2>/dev/null); [[ "$a" == sbx:* ]] || continue
             f=${f%/ifalias}; echo "${f##*/} $a"; done)
  while read -r _ _ t; do
    [[ "$t" == sbx_* ]] || continue
    alias=$(nft list table inet "$t" 2>/dev/null | awk '/comment "sbx:/ {print $2; exit}')
    mine=0
    [ -n "$prefix" ] && [[ "$alias" == *"$prefix"* ]] && mine=1
    printf 'nft\t%s\t%s\tnft table inet %s (%s)\n' "$t" "$mine" "$t" "$alias"
  done < <(nft list tables inet 2>/dev/null)
}

case "$mode" in
  snapshot)
    prefix=${SBX_TEST_PREFIX:-}
    if [ -n "$prefix" ] && ! [[ "$prefix" =~ ^[a-z0-9]+$ ]]; then
      echo "leftovers: SBX_TEST_PREFIX must be lower-case letters and digits" >&2
      exit 2
    fi
    { echo "prefix $prefix"; collect "$prefix"; } > "$file" || exit 2
    ;;
  check)
    [ -r "$file" ] || { echo "leftovers: cannot read snapshot $file" >&2; exit 2; }
    read -r tag prefix < "$file"
    [ "${tag:-}" = prefix ] || { echo "leftovers: $file is not a snapshot" >&2; exit 2; }
    declare -A before=()
    while IFS=$'\t' read -r kind key _; do
      before["$kind $key"]=1
    done < <(tail -n +2 "$file")
    grace=${SBX_LEFTOVER_GRACE:-30}
    until=$(( $(date +%s) + grace ))
    while :; do
      mine=() other=()
      while IFS=$'\t' read -r kind key m what; do
        [ -n "${before["$kind $key"]:-}" ] && continue
        if [ "$m" = 1 ] || [ -z "$prefix" ]; then mine+=("$what"); else other+=("$what"); fi
      done < <(collect "$prefix")
      [ ${#mine[@]} -eq 0 ] && break
      [ "$(date +%s)" -ge "$until" ] && break
      sleep 1
    done
    if [ ${#other[@]} -gt 0 ]; then
      echo "leftovers: ${#other[@]} not counted (appeared during the run, without its prefix" \
        "'$prefix': other runs' or older tests'), the first ones:"
      printf '  %s\n' "${other[@]:0:20}"
    fi
    if [ ${#mine[@]} -eq 0 ]; then
      echo "leftovers: none${prefix:+ (prefix $prefix)}"
      exit 0
    fi
    echo "leftovers: ${#mine[@]} left by the test deployments${prefix:+ (prefix $prefix)}:"
    printf '  %s\n' "${mine[@]}"
    exit 1
    ;;
  *) usage ;;
esac
