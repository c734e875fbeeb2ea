#!/usr/bin/env bash
# tools/deb-systemd-check.sh DEB — the package under a real systemd (issue 17):
# boots systemd as PID 1 of a container (systemd-nspawn --boot, to basic.target,
# with its own network namespace) whose root is an overlay of this host's root
# (every change lands in a temp upper directory, thrown away at the end), and
# inside it: `dpkg -i DEB` installs, `systemctl start sbxd-dev` starts the unit
# the package ships, `sbx exec` through it runs a command in a sandbox,
# `systemctl stop` stops it, `dpkg --purge sbx` removes every file of it.
#
# On a cgroup v1 (hybrid) host nspawn delegates only the name=systemd
# hierarchy to the container, so the unit cannot make its v1 memory/pids/cpu
# cgroups there: a drop-in adds `--cgroup none` (said in the output).  On a
# pure v2 host the unit's own Delegate=yes is used as shipped.
#
# Needs root and systemd-nspawn (Debian's systemd-container).  Everything in
# one temp dir; the container stopped by pid, the overlay unmounted.
# `make deb-systemd-check` (after `make deb`).
set -euo pipefail
deb=$(cd "$(dirname "${1:?usage: deb-systemd-check.sh DEB}")" && pwd)/$(basename "$1")
command -v systemd-nspawn >/dev/null || {
  echo "deb-systemd-check: systemd-nspawn is not installed (apt-get install systemd-container)" >&2
  exit 2
}
tmp=$(mktemp -d /tmp/sbx-debsd-XXXXXX)
root=$tmp/merged
nspawn=""
fail=0
cleanup() {
  if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
    kill -TERM "$nspawn" # nspawn asks the container's systemd to power off
    for _ in $(seq 1 60); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$nspawn" 2>/dev/null && kill -KILL "$nspawn"
    wait "$nspawn" 2>/dev/null || true
  fi
  mountpoint -q "$root" && umount "$root"
  rm -rf "$tmp"
}
trap cleanup EXIT
check() { local what=$1; shift; if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi; }

mkdir -p "$tmp/upper" "$tmp/work" "$root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$tmp/upper,workdir=$tmp/work" "$root"
# A machine id of its own (nspawn refuses to share the host's journal otherwise).
cat /proc/sys/kernel/random/uuid | tr -d - > "$root/etc/machine-id"
rm -f "$root/usr/sbin/policy-rc.d" # a container's dpkg may start services
cp "$deb" "$root/root/sbx.deb"
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
  mkdir -p "$root/etc/systemd/system/sbxd-dev.service.d"
  printf '[Service]\nExecStart=\nExecStart=/usr/bin/sbxd dev --data /var/lib/sbx/dev --log-format json --cgroup none\n' \
    > "$root/etc/systemd/system/sbxd-dev.service.d/cgroup-v1-host.conf"
  echo "note cgroup v1 host: the unit runs with --cgroup none in the container"
fi
SYSTEMD_NSPAWN_API_VFS_WRITABLE=1 systemd-nspawn -D "$root" --register=no --keep-unit \
  --link-journal=no --private-network --boot -q --machine="sbx-debsd-$$" \
  -- systemd.unit=basic.target > "$tmp/boot.log" 2>&1 &
nspawn=$!
# The container's PID 1: nspawn's child running systemd.
leader=""
for _ in $(seq 1 100); do
  for c in $(pgrep -P "$nspawn" 2>/dev/null); do
    [ "$(cat "/proc/$c/comm" 2>/dev/null)" = systemd ] && leader=$c
  done
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "FAIL systemd did not boot in the container"; cat "$tmp/boot.log"; exit 1; }
inside() { timeout 120 nsenter -t "$leader" -a -- "$@"; }
state=""
for _ in $(seq 1 150); do
  state=$(inside systemctl is-system-running 2>/dev/null || true)
  case $state in running | degraded) break ;; esac
  sleep 0.2
done
check "systemd runs as PID 1 of the container ($state)" test "$state" = running -o "$state" = degraded

check "dpkg -i installs the package" sh -c "timeout 120 nsenter -t $leader -a -- dpkg -i /root/sbx.deb >/dev/null"
check "the unit is known to systemd" sh -c "timeout 60 nsenter -t $leader -a -- systemctl cat sbxd-dev.service >/dev/null"
check "systemctl start sbxd-dev" inside systemctl start sbxd-dev
out=""
for _ in $(seq 1 60); do
  out=$(inside sbx exec debsd-1 'echo under-systemd-$((6*7))' 2>/dev/null || true)
  [ "$out" = under-systemd-42 ] && break
  sleep 1
done
check "sbx exec through the unit's sbxd runs a command (got: $out)" test "$out" = under-systemd-42
check "the unit is active" inside systemctl is-active --quiet sbxd-dev
check "systemctl stop sbxd-dev" inside systemctl stop sbxd-dev
check "the unit is inactive after stop" sh -c "! timeout 60 nsenter -t $leader -a -- systemctl is-active --quiet sbxd-dev"
check "dpkg --purge removes the package" sh -c "timeout 120 nsenter -t $leader -a -- dpkg --purge sbx >/dev/null"
check "no file of the package is left" sh -c "! test -e '$root/usr/bin/sbxd' && ! test -e '$root/lib/systemd/system/sbxd-dev.service' && ! test -e '$root/usr/libexec/sbx/sbx-agent'"
if [ "$fail" != 0 ]; then
  inside journalctl -u sbxd-dev --no-pager 2>/dev/null | tail -20 || true
fi
exit "$fail"
