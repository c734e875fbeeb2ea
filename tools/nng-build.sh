#!/usr/bin/env bash
# tools/nng-build.sh [OUTDIR] — build the nng sbx links: Debian's nng 1.5.2
# (the source package of bookworm's libnng1, with Debian's patches) plus
# tools/nng/*.patch, as a static, position-independent libnng.a with TLS
# (Debian's mbedTLS), installed into OUTDIR (build/nng): OUTDIR/include/nng/,
# OUTDIR/lib/libnng.a.  Nothing goes into the system.
#
# Why: nng 1.5.2's listeners stop accepting for good after one connection
# reset during the TLS/SP handshake (docs/cluster.md, "The patched nng"); upstream
# fixed it in 1.6.0, which Debian does not ship.  The fix is
# tools/nng/0001-*.patch.  And its nng_close can wait forever after a peer
# dropped a pipe in the middle of a long send (docs/cluster.md, the same
# section); nng 2.0 removed the cause, no 1.x release did: sbx's fix is
# tools/nng/0002-*.patch.  And its task dispatch woke a task thread while
# holding the queue's mutex, two context switches more per aio completion:
# tools/nng/0003-*.patch (performance only; docs/cluster.md, the same section).
# And it runs aio callbacks on one task thread per process, not two per CPU:
# a completion dispatched by a callback then runs on the same thread after
# it, instead of waking another one (NNG_NUM_TASKQ_THREADS=1: performance
# only; docs/cluster.md, the same section, for why this is safe here).
# SBX_NNG_TASK_THREADS=N in the environment builds N instead (0: nng's own
# default, two per CPU up to 16) — measured on 2 CPUs only; a gateway of a
# many-CPU host serving TLS may want more (in a built tree, remove
# build/nng/lib/libnng.a first: make does not see the environment change).
#
# Idempotent and cached: OUTDIR/.stamp holds a hash of this script and the
# patches; when it matches and the library is there, the script exits at once.
# The two source files (720 KiB) are fetched from the Debian archive into
# SBX_NNG_DL (default OUTDIR/dl; tools/deb.sh points it at the tree's copy) and
# checked against the sha256 sums below before use.  Needs cmake, patch, curl
# (or python3) and libmbedtls-dev (tools/deps.sh).  Run by the Makefile before
# anything that includes <nng/nng.h> is compiled.
set -euo pipefail

out=${1:-build/nng}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
dl=${SBX_NNG_DL:-$out/dl}

ver=1.5.2
deb=2
pool=http://deb.debian.org/debian/pool/main/n/nng
orig=nng_${ver}.orig.tar.gz
orig_sha=f8b25ab86738864b1f2e3128e8badab581510fa8085ff5ca9bb980d317334c46
debtar=nng_${ver}-${deb}.debian.tar.xz
debtar_sha=ecf0bcd3b5645b95aa1f1f58519547bcfaaab81a863f88a59178d72fdfdffd72

threads=${SBX_NNG_TASK_THREADS:-1}
[[ "$threads" =~ ^[0-9]+$ ]] || { echo "nng: SBX_NNG_TASK_THREADS must be a number" >&2; exit 2; }
key=$( (cat "$0" "$here"/nng/*.patch; echo "task threads $threads") | sha256sum | cut -d' ' -f1)
if [ -f "$out/lib/libnng.a" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$key" ]; then
  exit 0
fi

# One build at a time per OUTDIR (two makes in one tree).
exec 9>"$out/.lock"
flock 9
if [ -f "$out/lib/libnng.a" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$key" ]; then
  exit 0
fi
echo "nng: building nng $ver (Debian $ver-$deb + tools/nng/*.patch) into $out"

fetch() { # fetch NAME SHA256: $dl/NAME, checked
  local f=$dl/$1
  if [ -f "$f" ] && echo "$2  $f" | sha256sum -c --status; then
    return 0
  fi
  mkdir -p "$dl"
  rm -f "$f.part"
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 -o "$f.part" "$pool/$1"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$pool/$1" "$f.part"
  fi
  if ! echo "$2  $f.part" | sha256sum -c --status; then
    echo "nng: $pool/$1 does not match its pinned sha256 ($2)" >&2
    rm -f "$f.part"
    exit 1
  fi
  mv "$f.part" "$f"
}
fetch "$orig" "$orig_sha"
fetch "$debtar" "$debtar_sha"

src=$out/src
rm -rf "$src" "$out/cmake" "$out/include" "$out/lib" "$out/.stamp"
mkdir -p "$src"
tar -xzf "$dl/$orig" -C "$src" --strip-components=1
tar -xJf "$dl/$debtar" -C "$src"
# Debian's patches, in the order of their series (lines starting with # are off).
while read -r p; do
  case "$p" in ''|'#'*) continue ;; esac
  patch -d "$src" -p1 -s < "$src/debian/patches/$p"
done < "$src/debian/patches/series"
for p in "$here"/nng/*.patch; do
  patch -d "$src" -p1 -s < "$p"
done

# Static, PIC (lib/libsbx.so and lib/libsbx.a include it), its symbols hidden
# (libsbx exports only its own API), no tests, tools or nngcat; one task thread.
cmake -S "$src" -B "$out/cmake" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DNNG_ENABLE_TLS=ON -DNNG_NUM_TASKQ_THREADS="$threads" -DNNG_TESTS=OFF -DNNG_TOOLS=OFF -DNNG_ENABLE_NNGCAT=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_C_VISIBILITY_PRESET=hidden \
  -DCMAKE_INSTALL_PREFIX="$out" -DCMAKE_INSTALL_LIBDIR=lib >"$out/cmake.log" 2>&1 ||
  { cat "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/cmake" -j"$(nproc)" >>"$out/cmake.log" 2>&1 ||
  { tail -50 "$out/cmake.log" >&2; exit 1; }
cmake --install "$out/cmake" >>"$out/cmake.log" 2>&1 ||
  { tail -20 "$out/cmake.log" >&2; exit 1; }
echo "$key" > "$out/.stamp"
echo "nng: built $out/lib/libnng.a"
