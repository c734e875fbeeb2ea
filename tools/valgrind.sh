#!/usr/bin/env bash
# tools/valgrind.sh — the valgrind job (`make valgrind`, run by `make test`):
# a short mixed scenario against the release build with the gateway and the
# client under valgrind --leak-check=full --error-exitcode=1.
#
#   sbxd shard    release build, native (see below)
#   sbxd gateway  release build, under valgrind (memcheck)
#   sbx-soak      release build, under valgrind: 4 sandboxes, VALGRIND_SECONDS
#                 (20) of exec, sessions, streams, files, env, processes,
#                 status, create/destroy through the C client library
#   curl          a few requests to the gateway's HTTP front meanwhile: health,
#                 OpenAPI, file PUT/GET, exec, an SSE stream, a missing route,
#                 a malformed body
#
# The gateway is stopped with SIGTERM, as in production; the job fails if
# either valgrind reports an error (invalid access, uninitialised value, a
# definite or possible leak), the scenario had a failed operation or an
# HTTP request got another status than expected.
#
# Why not the shard: valgrind 3.19 implements neither seccomp(2) — so
# libseccomp believes the kernel has API level 1 and refuses to build the
# sandbox filters (SCMP_ACT_KILL_PROCESS needs level 3) — nor clone3(2),
# which starts containers.  A shard cannot start under it; its leaks are
# checked by LeakSanitizer at every clean stop instead
# (tests/integration/test_leaks.c reads the shards' reports).
set -uo pipefail
secs=${VALGRIND_SECONDS:-20}
# Release binaries (not $SBX_BIN, which run-tests.sh points at the ASan build).
bin=${SBX_VALGRIND_BIN:-bin}
dir=$(mktemp -d /tmp/sbx-valgrind-XXXXXX)
name="vg$(basename "$dir" | tr -dc 'a-z0-9' | tail -c 6)"
start=$(date +%s)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "${SBX_KEEP_TEST_DATA:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
vg=(valgrind --leak-check=full --errors-for-leak-kinds=definite,possible --error-exitcode=1
    --track-origins=yes --num-callers=30 --suppressions=tests/valgrind.supp)

"$bin/sbxd" shard --name "$name-s0" --listen "ipc://$dir/s0.sock" --data "$dir/s0" \
  --pool 1 --memory 128M --uid-base 1900000000 >"$dir/shard.log" 2>&1 &
pids+=($!)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${vg[@]}" --log-file="$dir/vg-gateway.log" "$bin/sbxd" gateway --name "$name-gw" \
  --listen "ipc://$dir/gw.sock" --shard "$name-s0=ipc://$dir/s0.sock" \
  --http "127.0.0.1:$port" >"$dir/gateway.log" 2>&1 &
gw=$!
pids+=($gw)

ready=0
for _ in $(seq 1 300); do
  if "$bin/sbx" --gateway "ipc://$dir/gw.sock" status 2>/dev/null | grep -q " ok " &&
     curl -sf --max-time 5 "http://127.0.0.1:$port/v1/health" >/dev/null; then
    ready=1; break
  fi
  sleep 0.1
done
if [ $ready = 0 ]; then
  echo "valgrind: the gateway did not become ready"; cat "$dir/gateway.log" "$dir/vg-gateway.log"
  exit 1
fi

"${vg[@]}" --log-file="$dir/vg-client.log" "$bin/sbx-soak" --url "ipc://$dir/gw.sock" \
  --seconds "$secs" --sandboxes 4 --seed 7 --quiet >"$dir/soak.out" 2>&1 &
soak=$!
# The HTTP front, while the soak runs: the status codes must be these.
h="http://127.0.0.1:$port/v1"
http_fail=0
check() { # expected-status curl-args...
  local want=$1; shift
  local got; got=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 "$@")
  [ "$got" = "$want" ] || { echo "valgrind: HTTP $* answered $got, expected $want"; http_fail=1; }
}
check 200 "$h/health"
check 200 "$h/openapi.json"
check 200 -X PUT --data-binary 'hello' "$h/sandboxes/vghttp/files/workspace/h.txt"
check 200 "$h/sandboxes/vghttp/files/workspace/h.txt"
check 200 -X POST -H 'Content-Type: application/json' -d '{"command":"echo hi"}' "$h/sandboxes/vghttp/exec"
check 200 -N -H 'Accept: text/event-stream' -H 'Content-Type: application/json' \
  -d '{"command":"echo a; echo b"}' "$h/sandboxes/vghttp/exec.stream"
check 404 "$h/no/such/route"
check 400 -X POST -H 'Content-Type: application/json' -d '{"command":' "$h/sandboxes/vghttp/exec"
check 200 -X DELETE "$h/sandboxes/vghttp"
wait "$soak"
client=$?

kill -TERM "$gw"
wait "$gw"
gateway=$?

status=0
for part in gateway client; do
  rc=$([ $part = gateway ] && echo $gateway || echo $client)
  summary=$(grep -E "ERROR SUMMARY|definitely lost|possibly lost" "$dir/vg-$part.log" | sed 's/^==[0-9]*== */    /')
  if [ "$rc" -ne 0 ]; then
    echo "valgrind: $part FAILED (exit $rc)"
    sed 's/^/    /' "$dir/soak.out" | tail -20
    grep -v "^--" "$dir/vg-$part.log" | head -150
    status=1
  else
    echo "valgrind: $part ok"
  fi
  echo "$summary"
done
grep -E "^total" "$dir/soak.out" | sed 's/^/    soak /'
if [ $http_fail = 0 ]; then echo "valgrind: HTTP requests ok"; else echo "valgrind: HTTP requests FAILED"; status=1; fi
echo "valgrind: $(( $(date +%s) - start )) s"
exit $status
