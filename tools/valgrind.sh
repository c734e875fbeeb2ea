#!/usr/bin/env bash
# tools/valgrind.sh — the valgrind job (`make valgrind`, run by `make test`):
# a short mixed scenario against the release build with the whole daemon —
# shard and gateway — and the client under valgrind --leak-check=full
# --error-exitcode=1.
#
#   sbxd shard    release build, under valgrind (memcheck); its containers'
#                 agents are not (--trace-children=no: the agent is exec'd)
#   sbxd gateway  release build, under valgrind (memcheck)
#   sbx-soak      release build, under valgrind: 4 sandboxes, VALGRIND_SECONDS
#                 (20) of exec, sessions, streams, files, env, processes,
#                 status, create/destroy through the C client library
#   curl          a few requests to the gateway's HTTP front meanwhile: health,
#                 OpenAPI, file PUT/GET, exec, an SSE stream, a missing route,
#                 a malformed body
#
# The gateway and the shard are stopped with SIGTERM, as in production; the
# job fails if valgrind reports an error in any of them (invalid access,
# uninitialised value, a definite or possible leak), the scenario had a
# failed operation or an HTTP request got another status than expected.
#
# Valgrind 3.19 implements neither seccomp(2) nor clone3(2), and resolves
# execveat's empty path by name; the shard copes with all three as it would
# on an older kernel or under a container runtime's seccomp profile
# (container/seccomp.c: the API level from actions_avail; container/spawn.c:
# clone(2), exec by /proc path), and says so in its log.
set -uo pipefail
secs=${VALGRIND_SECONDS:-20}
# Release binaries (not $SBX_BIN, which run-tests.sh points at the ASan build).
bin=${SBX_VALGRIND_BIN:-bin}
# The test run's mark (tools/run-tests.sh; tools/leftovers.sh looks for it).
mark=${SBX_TEST_PREFIX:-}
[[ "$mark" =~ ^[a-z0-9]{1,8}$ ]] || mark=
dir=$(mktemp -d "/tmp/sbx-valgrind-${mark}XXXXXX")
name="vg${mark}$(basename "$dir" | tr -dc 'a-z0-9' | tail -c 6)"
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

# valgrind 3.19 does not implement open_tree(2), by which the shard hands the
# interpreter drivers to a sandbox whatever the permissions of their path
# (container/spawn.c); the agent then opens the path itself, as the
# sandbox's unprivileged uid.  A checkout under /root (0700) is not
# searchable by it: give the shard a copy the sandbox can reach.
chmod 0711 "$dir"
cp -a "$bin/../share/sbx/interp" "$dir/interp"
"${vg[@]}" --log-file="$dir/vg-shard.log" "$bin/sbxd" shard --name "$name-s0" \
  --listen "ipc://$dir/s0.sock" --data "$dir/s0" --interp "$dir/interp" \
  --pool 1 --memory 128M --uid-base 1900000000 >"$dir/shard.log" 2>&1 &
sh=$!
pids+=($sh)
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
  echo "valgrind: the shard's log (last lines):"; tail -n 15 "$dir/shard.log"
  exit 1
fi

# Under valgrind the shard starts containers with clone(2): they must be as
# isolated as with clone3 (the escape tests check the clone3 path at length).
iso_want=$'CapEff: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\nuid_map: 0 UID 1\nnet: lo\ncgroups outside the namespace root: 0\npid 1: sbx-agent'
iso=$("$bin/sbx" --gateway "ipc://$dir/gw.sock" exec vgiso \
  'grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status | tr -s "\t" " ";
   echo "uid_map: $(tr -s " " < /proc/self/uid_map | sed "s/^ //; s/ [0-9]* / UID /")";
   echo "net: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | paste -sd,)";
   echo "cgroups outside the namespace root: $(grep -cv ":/$" /proc/self/cgroup)";
   echo "pid 1: $(cat /proc/1/comm)"' 2>&1)
iso_fail=0
if [ "$iso" != "$iso_want" ]; then
  echo "valgrind: a container started with clone(2) is not isolated as expected:"
  diff <(echo "$iso_want") <(echo "$iso") | sed 's/^/    /'
  iso_fail=1
fi

"${vg[@]}" --log-file="$dir/vg-client.log" "$bin/sbx-soak" --url "ipc://$dir/gw.sock" \
  --seconds "$secs" --sandboxes 4 --seed 7 --quiet >"$dir/soak.out" 2>&1 &
soak=$!
# The HTTP front, while the soak runs: the status codes must be these.
h="http://127.0.0.1:$port/v1"
http_fail=0
check() { # expected-status curl-args...
  local want=$1; shift
  local got; got=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 -H 'X-Sbx-Client: valgrind.sh' "$@")
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
kill -TERM "$sh"
wait "$sh"
shard=$?

status=0
for part in shard gateway client; do
  case $part in
    shard) rc=$shard; pid=$sh ;; gateway) rc=$gateway; pid=$gw ;; client) rc=$client; pid=$soak ;;
  esac
  # the process's own report: a container that failed before its exec would
  # add one as pid 1 of its namespace (and the operation needing it would fail the soak)
  summary=$(grep -E "^==$pid==.*(ERROR SUMMARY|definitely lost|possibly lost)" "$dir/vg-$part.log" |
            sed 's/^==[0-9]*== */    /')
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
if [ $iso_fail = 0 ]; then echo "valgrind: clone(2) containers isolated"; else status=1; fi
echo "valgrind: $(( $(date +%s) - start )) s"
exit $status
