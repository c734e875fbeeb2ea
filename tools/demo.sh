#!/usr/bin/env bash
# tools/demo.sh — what `make run` shows: start the embedded single-node
# default (`sbxd dev`, data in ./.sbx-data), run real Python, Node and shell
# programs in several sandboxes through the gateway, then stop the daemon.
# KEEP=1 leaves the daemon running afterwards.  If an sbxd already answers at
# $SBX_GATEWAY (default tcp://127.0.0.1:7700) the demo uses it instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export SBX_GATEWAY=${SBX_GATEWAY:-tcp://127.0.0.1:7700}
SBX=bin/sbx
started=""
log=.sbx-data/sbxd.log

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

cleanup() {
  for id in demo-python demo-node demo-shell; do $SBX destroy "$id" >/dev/null 2>&1 || true; done
  if [ -n "$started" ] && [ "${KEEP:-0}" != 1 ]; then
    kill -TERM "$started" 2>/dev/null || true
    wait "$started" 2>/dev/null || true
    echo "sbxd stopped (run 'make run KEEP=1' or 'bin/sbxd dev' to keep one running)"
  fi
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ]; then
  echo "make run: sbxd needs root (namespaces, cgroups, mounts); run as root" >&2
  exit 1
fi
if ! $SBX status >/dev/null 2>&1; then
  mkdir -p .sbx-data
  say "starting sbxd dev (gateway on $SBX_GATEWAY, 2 shards, data in .sbx-data; log $log)"
  bin/sbxd dev --data .sbx-data --listen "$SBX_GATEWAY" >>"$log" 2>&1 &
  started=$!
  # up once the gateway answers and every shard reports healthy (10 s at most)
  for _ in $(seq 100); do
    st=$($SBX status 2>/dev/null) && ! grep -q unavailable <<<"$st" && break
    sleep 0.1
  done
fi
run $SBX status

say "Python in sandbox demo-python"
run $SBX exec demo-python "python3 - <<'PY'
import platform, sys
primes = [n for n in range(2, 60) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
print('primes:', primes)
print('python', sys.version.split()[0], 'on', platform.node(), 'as uid', __import__('os').getuid())
PY"

say "Node in sandbox demo-node"
run $SBX exec demo-node -- node -e '
const fib = n => n < 2 ? n : fib(n - 1) + fib(n - 2);
console.log("fib(25) =", fib(25), "node", process.version, "pid", process.pid);'

say "shell and git in sandbox demo-shell (a session keeps cd and export)"
run $SBX exec demo-shell 'cd /workspace && git init -q proj && cd proj && export GREETING=hello'
run $SBX exec demo-shell 'echo "$GREETING from $(pwd)"; echo "a b c" | tr " " "\n" | sort -r | paste -sd,'

say "isolation: what a sandbox sees"
run $SBX exec demo-shell 'echo "host name: $(hostname)"; echo "processes: $(ls -d /proc/[0-9]* | wc -l)"; echo "interfaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | paste -sd,)"; touch /usr/x 2>&1 | head -1; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status | tr -s "\t" " "'

say "a timeout kills the whole process tree (exit 124)"
set +e
run $SBX exec demo-shell --timeout 1000 "sh -c 'sleep 60 & sleep 60'"
echo "exit code: $?"
set -e

say "all sandboxes"
run $SBX list
