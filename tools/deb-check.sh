#!/usr/bin/env bash
# tools/deb-check.sh DEB — what the package holds, checked without installing
# it on this machine: its metadata, its files (dpkg-deb -c), its units
# (systemd-analyze verify), then its programs run from an extracted copy
# (dpkg-deb -x into a temp root): `sbxd dev` from it serves `sbx exec` from
# it.  Everything in one temp dir, removed at the end; the daemon stopped by
# pid.  Root (the daemon creates containers).  `make deb-check`.
set -euo pipefail
deb=$(cd "$(dirname "${1:?usage: deb-check.sh DEB}")" && pwd)/$(basename "$1")
tmp=$(mktemp -d /tmp/sbx-debchk-XXXXXX)
pid=""
fail=0
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
check() { local what=$1; shift; if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi; }

check "package is named sbx" test "$(dpkg-deb -f "$deb" Package)" = sbx
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' > "$tmp/files"
for f in /usr/bin/sbx /usr/bin/sbxd /usr/libexec/sbx/sbx-agent /usr/share/sbx/interp/driver.py \
         /usr/share/man/man1/sbx.1.gz /usr/share/man/man8/sbxd.8.gz \
         /lib/systemd/system/sbxd-dev.service /usr/lib/libsbx.so.0 /usr/include/sbx/sbx.h \
         /usr/lib/pkgconfig/sbx.pc; do
  check "package holds $f" grep -qx "$f" "$tmp/files"
done
root=$tmp/root
dpkg-deb -x "$deb" "$root"
check "the unit runs /usr/bin/sbxd" grep -q '^ExecStart=/usr/bin/sbxd dev ' \
  "$root/lib/systemd/system/sbxd-dev.service"
if command -v systemd-analyze >/dev/null; then
  # verify wants ExecStart's binary: check a copy of the unit pointing into the extract
  mkdir -p "$tmp/units"
  for u in "$root"/lib/systemd/system/*.service; do
    sed "s|/usr/bin/sbxd|$root/usr/bin/sbxd|" "$u" > "$tmp/units/$(basename "$u")"
  done
  check "systemd-analyze verify accepts the units" \
    env MANPATH="$root/usr/share/man" systemd-analyze verify "$tmp"/units/*.service
fi
mark="${SBX_TEST_PREFIX:-}"; [[ "$mark" =~ ^[a-z0-9]{1,8}$ ]] || mark=""
name="deb${mark}$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
gw="ipc://$tmp/gw.sock"
"$root/usr/bin/sbxd" dev --name "$name" --data "$tmp/data" --listen "$gw" --http "" \
  --shards 1 --pool 0 >"$tmp/sbxd.log" 2>&1 &
pid=$!
up=0
for _ in $(seq 1 120); do
  "$root/usr/bin/sbx" --gateway "$gw" cluster status >/dev/null 2>&1 && { up=1; break; }
  sleep 0.5
done
check "the packaged sbxd dev answers" test $up = 1
out=$("$root/usr/bin/sbx" --gateway "$gw" exec "deb-${mark}$$" 'echo deb-$((6 * 7))' 2>&1 || true)
check "the packaged sbx exec runs a command (got: $out)" test "$out" = deb-42
"$root/usr/bin/sbx" --gateway "$gw" destroy "deb-${mark}$$" >/dev/null 2>&1 || true
[ $fail = 0 ] || tail -n 40 "$tmp/sbxd.log"
exit $fail
