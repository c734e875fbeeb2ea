#!/bin/bash
# tests/online/run-tests.sh — the opt-in online test of issue 14 (`make
# test-online`; never in `make test` or CI: it reaches the public npm
# registry, the one outside host the project may use besides Debian's).
#
# Starts its own `sbxd dev` (release build, $SBX_BIN or bin/) with a
# temporary data directory, then:
#   1. a sandbox in `egress` mode allowed `registry.npmjs.org:443` by name
#      runs `npm install is-number` with the host's npm (host /usr) and
#      `node -e "require('is-number')"` works — the name resolved by the
#      shard's resolver, the answer pinned for the rule's port
#      (docs/network.md);
#   2. the same command in an `egress` sandbox whose rules name another host
#      (`example.org:443`) fails, and its resolver answers nothing for the
#      registry's name: the registry stays out of reach unless a rule names
#      it.  (A sandbox with no allow rule at all may reach every public
#      address: docs/network.md.)
# Egress needs the host's uplink to forward IPv4 (docs/network.md, "What
# the host must provide"); a fresh Debian host forwards nowhere, so the test
# sets net.ipv4.conf.<uplink>.forwarding=1 on the default route's
# interfaces for its run, as an operator would, and puts back what it
# found.  Cleans up what it started (the daemon by pid, its data directory).
# Exit status 0 when both hold.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${SBX_BIN:-$repo/bin}
tmp=$(mktemp -d /tmp/sbx-online-XXXXXX)
pid=""
fail=0
fwd_saved=()
cleanup() {
  for e in "${fwd_saved[@]}"; do echo "${e#*=}" > "/proc/sys/net/ipv4/conf/${e%%=*}/forwarding"; done
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
check() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}

for ifc in $(awk 'NR > 1 && $2 == "00000000" && $8 == "00000000" {print $1}' /proc/net/route | sort -u); do
  fwd_saved+=("$ifc=$(cat "/proc/sys/net/ipv4/conf/$ifc/forwarding")")
  echo 1 > "/proc/sys/net/ipv4/conf/$ifc/forwarding"
done

name="on$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
mkdir -p "$tmp/data"
setsid "$bin/sbxd" dev --name "$name" --data "$tmp/data" --listen "ipc://$tmp/gw.sock" \
  --http "" --shards 1 >"$tmp/sbxd.log" 2>&1 &
pid=$!
gw="ipc://$tmp/gw.sock"
sbx() { "$bin/sbx" --gateway "$gw" "$@"; }
up=0
for _ in $(seq 1 120); do
  if sbx cluster status >/dev/null 2>&1; then up=1; break; fi
  sleep 0.5
done
check "sbxd dev answers" test $up = 1

install='cd /workspace && npm install --no-audit --no-fund --cache /tmp/npm-cache is-number@7.0.0 >/tmp/npm.log 2>&1; rc=$?; tail -3 /tmp/npm.log; node -e "console.log(require(\"is-number\")(42))"; exit $rc'
a="online-a-$$"
sbx create "$a" --network egress --allow registry.npmjs.org:443 >/dev/null
out=$(sbx exec "$a" --timeout 180s "$install" 2>&1 || true)
check "npm install in a sandbox allowed registry.npmjs.org:443 (got: ${out//$'\n'/ | })" \
  test "$(printf '%s\n' "$out" | tail -1)" = "true"

b="online-b-$$"
sbx create "$b" --network egress --allow example.org:443 >/dev/null
out=$(sbx exec "$b" --timeout 60s "$install" 2>&1 || true)
check "the same without the rule fails (got: ${out//$'\n'/ | })" \
  test "$(printf '%s\n' "$out" | tail -1)" != "true"
out=$(sbx exec "$b" 'getent hosts registry.npmjs.org || echo no-answer' 2>&1 || true)
check "its resolver gives no address for the name (got: $out)" test "$out" = "no-answer"

sbx destroy "$a" >/dev/null 2>&1 || true
sbx destroy "$b" >/dev/null 2>&1 || true
if [ $fail != 0 ]; then
  echo "---- sbxd log ----"; tail -n 40 "$tmp/sbxd.log"
fi
exit $fail
