#!/bin/bash
# tools/bench_backup.sh [BIN] — backup.create and backup.restore of a real
# tree (numpy + pandas from the host's dist-packages, ~106 MB, copied into a
# sandbox's /workspace) against a private release `sbxd dev` (one shard,
# --disk 1G); prints the shard's own time of each op (its log line
# `backup … in N ms`: archive + hash + the store's writes and syncs, or
# digest check + extraction; not the client's round trip).
# Three creates without gitignore, three with it (`*.pyc`, `__pycache__/`,
# `tests/`), one file changed before each so every create writes and syncs
# a new blob; then three restores.  docs/benchmarks.md, "Backup and restore".
# Needs root (the daemon does); BIN defaults to ./bin (`make all`).
# BENCH_WORKSPACE=persistent: the sandbox's workspace is persistent (an
# ext4 image; default ephemeral, a tmpfs); BENCH_SBXD_ARGS: more `sbxd dev`
# arguments (e.g. "--ws-pool off": docs/persistence.md, "The workspace pool").
set -u
bin=${1:-bin}
src=/usr/lib/python3/dist-packages
[ -d "$src/numpy" ] && [ -d "$src/pandas" ] || { echo "bench_backup: needs $src/numpy and pandas" >&2; exit 2; }
d=$(mktemp -d /tmp/sbx-bench-backup-XXXXXX)
url="ipc://$d/gw.sock"
name=bb$(basename "$d" | tail -c 7 | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9')
"$bin/sbxd" dev --data "$d" --listen "$url" --name "$name" --shards 1 --pool 0 --disk 1G \
    ${BENCH_SBXD_ARGS:-} > "$d/sbxd.log" 2>&1 &
pid=$!
stop() {
    kill -TERM "$pid" 2>/dev/null && wait "$pid"
    rm -rf "$d"
}
trap stop EXIT
S="$bin/sbx --gateway $url"
for _ in $(seq 150); do $S health >/dev/null 2>&1 && break; sleep 0.2; done
id=bench-backup-$$
$S create "$id" --workspace "${BENCH_WORKSPACE:-ephemeral}" >/dev/null || exit 1
$S exec "$id" "mkdir -p /workspace/t && cp -r $src/numpy $src/pandas /workspace/t/ && \
    printf '*.pyc\\n__pycache__/\\ntests/\\n' > /workspace/t/.gitignore && \
    echo \"tree: \$(du -sh /workspace/t | cut -f1), \$(find /workspace/t | wc -l) entries\"" || exit 1
for i in 1 2 3; do
    $S exec "$id" "echo $i > /workspace/t/n" >/dev/null && $S backup create "$id" /workspace/t >/dev/null
done
for i in 4 5 6; do
    $S exec "$id" "echo $i > /workspace/t/n" >/dev/null &&
        $S backup create "$id" /workspace/t --gitignore >/dev/null
done
bk=$($S --json backup create "$id" /workspace/t | grep -o 'bk_[0-9a-f]*' | head -1)
for i in 1 2 3; do $S backup restore "$id" "$bk" "/workspace/r$i" >/dev/null; done
grep -rh "backup bk_" "$d" --include='*log*' | sed 's/.*sandbox /sandbox /'
