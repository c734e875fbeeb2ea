#!/bin/bash
# tools/bench_disk_guard.sh [N] [BIN] — the disk guard's pass
# (docs/persistence.md, "When the host disk runs short"): a private release
# `sbxd dev` (one shard, --pool 0, --disk 64M, its own XFS workspace pool of
# 2500M) on a 3 GiB tmpfs data directory, N (200) persistent sandboxes
# created and started (`exec true`, 8 at a time); the room is then under the
# guard's 8 GiB, so a pass runs every second.  Prints `status`'s diskGuard
# five times, 2 s apart (lastPassUs: one pass's time; limited: workspaces
# held below their want), what `df` shows free inside one sandbox, and the
# shard's "disk is short" line.  docs/benchmarks.md, "The disk guard's
# pass".  Needs root (tmpfs, the daemon); BIN defaults to ./bin (`make all`).
# Removes its daemon (by pid), mount and directory at the end.
set -u
N=${1:-200}
BIN=${2:-bin}
M=$(mktemp -d /tmp/sbx-gbench-XXXXXX)
PID=
cleanup() {
    [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    umount "$M" 2>/dev/null
    rm -rf "$M"
}
trap cleanup EXIT
mount -t tmpfs -o size=3g tmpfs "$M" || exit 1
SOCK="ipc://$M/gw.sock"
"$BIN/sbxd" dev --data "$M/d" --listen "$SOCK" --http "" --shards 1 --pool 0 --disk 64M \
    --ws-pool on --ws-pool-size 2500M > "$M/log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do "$BIN/sbx" --gateway "$SOCK" status >/dev/null 2>&1 && break; sleep 0.1; done
t0=$(date +%s%N)
for i in $(seq 1 "$N"); do
    "$BIN/sbx" --gateway "$SOCK" create "gb$i" --workspace persistent >/dev/null || echo "create $i failed"
done
seq 1 "$N" | xargs -P 8 -I{} "$BIN/sbx" --gateway "$SOCK" exec gb{} true >/dev/null
echo "created and started $N in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
for _ in 1 2 3 4 5; do
    sleep 2
    "$BIN/sbx" --gateway "$SOCK" --json status | python3 -c '
import json, sys
def find(o):
    if isinstance(o, dict):
        if "diskGuard" in o:
            print("diskGuard", json.dumps(o["diskGuard"]))
            return
        for v in o.values(): find(v)
    elif isinstance(o, list):
        for v in o: find(v)
find(json.load(sys.stdin))'
done
echo "df inside gb1 (MiB free): $("$BIN/sbx" --gateway "$SOCK" exec gb1 "df -B1M --output=avail /workspace | tail -1")"
grep -m1 "disk is short" "$M/log"
