#!/usr/bin/env bash
# tools/deb.sh OUTDIR — build the Debian package (debian/, dpkg-buildpackage -b)
# from the committed tree (HEAD), in a temp copy so that the package's
# `make clean` leaves this tree's build alone; the .deb files land in OUTDIR.
# The interpreter drivers' and the web console's npm packages are copied from
# container/interp/node_modules and gateway/console/node_modules when present (no network
# needed then).
# `make deb`; docs/operations.md, "Debian package".  A full release build:
# minutes.  Needs Debian's debhelper (apt-get install debhelper; not in
# tools/deps.sh: `make test` does not build the package).
set -euo pipefail
out=$(mkdir -p "${1:?usage: deb.sh OUTDIR}" && cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/sbx-deb-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/sbx"
git -C "$repo" archive --format=tar HEAD | tar -x -C "$tmp/sbx"
if [ -d "$repo/container/interp/node_modules" ]; then
  cp -r "$repo/container/interp/node_modules" "$tmp/sbx/container/interp/"
fi
# And the web console's build tools (TypeScript, esbuild, xterm.js; docs/console.md).
if [ -d "$repo/gateway/console/node_modules" ]; then
  cp -r "$repo/gateway/console/node_modules" "$tmp/sbx/gateway/console/"
fi
# And nng's source files as fetched and checked by tools/nng-build.sh (the package's
# build makes its own build/nng from them; no network needed then).
if [ -d "$repo/build/nng/dl" ]; then
  export SBX_NNG_DL="$repo/build/nng/dl"
fi
(cd "$tmp/sbx" && DEB_BUILD_OPTIONS="nocheck" dpkg-buildpackage -b -us -uc)
cp "$tmp"/*.deb "$out/"
ls -l "$out"/*.deb
