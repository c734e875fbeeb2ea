#!/usr/bin/env bash
# tests/install/run-tests.sh — `make install` as an operator runs it (issue 17;
# docs/operations.md "Install"), on the build under test ($SBX_BIN: its
# parent is the INSTALL_BUILD, default build/asan):
#
#  1. DESTDIR: `make install DESTDIR=T/stage PREFIX=/usr/local` puts every file
#     under T/stage/usr/local (binaries, agent, interpreter files, man pages,
#     units, library, headers, sbx.pc) and the units name /usr/local/bin.
#  2. PREFIX=T/prefix: the man pages render (man -l), the units pass
#     `systemd-analyze verify`, and the installed `sbxd dev` (no --agent, no
#     --interp: it finds its files from where it is installed) serves the
#     installed `sbx exec`, Python code included.
#
# Everything lives in one temp dir, removed at the end; the daemon is stopped
# by pid.  Root is needed (the daemon creates containers).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${SBX_BIN:-$repo/build/asan/bin}
build=$(cd "$bin/.." && pwd)
build=${build#"$repo"/}
mark=${SBX_TEST_PREFIX:-}
[[ "$mark" =~ ^[a-z0-9]{1,8}$ ]] || mark=""
tmp=$(mktemp -d "/tmp/sbx-install-${mark}XXXXXX")
pid=""
fail=0
cleanup() {
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

# flock: test_libsbx builds the same lib/ files (make install-lib) at the same time.
mkdir -p "$repo/build"
lock="$repo/build/install.lock"
echo "# make install INSTALL_BUILD=$build"
flock "$lock" make -s --no-print-directory -C "$repo" install INSTALL_BUILD="$build" \
  DESTDIR="$tmp/stage" PREFIX=/usr/local >"$tmp/make1.log" 2>&1 ||
  { cat "$tmp/make1.log"; echo "FAIL make install DESTDIR"; exit 1; }
s=$tmp/stage/usr/local
for f in bin/sbx bin/sbxd libexec/sbx/sbx-agent share/sbx/interp/driver.py \
         share/sbx/interp/driver.js share/man/man1/sbx.1 share/man/man8/sbxd.8 \
         lib/systemd/system/sbxd-dev.service lib/systemd/system/sbxd-gateway.service \
         lib/systemd/system/sbxd-shard.service include/sbx/sbx.h lib/libsbx.so.0 \
         lib/pkgconfig/sbx.pc; do
  check "DESTDIR install has $f" test -e "$s/$f"
done
check "nothing installed outside DESTDIR/usr/local" \
  test "$(find "$tmp/stage" -mindepth 1 -maxdepth 2 | sort | tr '\n' ' ')" = \
       "$tmp/stage/usr $tmp/stage/usr/local "
check "units run /usr/local/bin/sbxd" \
  grep -q '^ExecStart=/usr/local/bin/sbxd dev ' "$s/lib/systemd/system/sbxd-dev.service"
check "units are not left with a placeholder" \
  bash -c "! grep -q -e '@BINDIR@' -e '^\\.include' '$s'/lib/systemd/system/*.service"

echo "# make install PREFIX=$tmp/prefix"
p=$tmp/prefix
flock "$lock" make -s --no-print-directory -C "$repo" install INSTALL_BUILD="$build" PREFIX="$p" \
  >"$tmp/make2.log" 2>&1 || { cat "$tmp/make2.log"; echo "FAIL make install PREFIX"; exit 1; }
check "sbx(1) renders and documents exec" \
  bash -c "MANWIDTH=80 man -l '$p/share/man/man1/sbx.1' 2>/dev/null | grep -q 'exec'"
check "sbxd(8) renders with every command's options" \
  bash -c "MANWIDTH=80 man -l '$p/share/man/man8/sbxd.8' 2>/dev/null | grep -q -- '--log-format'"
if command -v systemd-analyze >/dev/null; then
  check "systemd-analyze verify accepts the units" \
    env MANPATH="$p/share/man" systemd-analyze verify "$p"/lib/systemd/system/*.service
fi

name="in${mark}$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
mkdir -p "$tmp/data"
setsid "$p/bin/sbxd" dev --name "$name" --data "$tmp/data" --listen "ipc://$tmp/gw.sock" \
  --http "" --shards 1 --pool 0 >"$tmp/sbxd.log" 2>&1 &
pid=$!
gw="ipc://$tmp/gw.sock"
up=0
for _ in $(seq 1 120); do
  if "$p/bin/sbx" --gateway "$gw" cluster status >/dev/null 2>&1; then up=1; break; fi
  sleep 0.5
done
check "the installed sbxd dev answers" test $up = 1
sb="install-${mark}$$"
out=$("$p/bin/sbx" --gateway "$gw" exec "$sb" 'echo installed-$((6 * 7))' 2>&1 || true)
check "the installed sbx exec runs a command (got: $out)" test "$out" = "installed-42"
out=$("$p/bin/sbx" --gateway "$gw" exec "$sb" "python3 -c 'print(6*7)'" 2>&1 || true)
check "a sandbox of the install runs python3 (got: $out)" test "$out" = "42"
"$p/bin/sbx" --gateway "$gw" destroy "$sb" >/dev/null 2>&1 || true
if [ $fail != 0 ]; then
  echo "---- sbxd log ----"; tail -n 50 "$tmp/sbxd.log"
fi
exit $fail
