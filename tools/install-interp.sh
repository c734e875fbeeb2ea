#!/usr/bin/env bash
# tools/install-interp.sh DEST — install the code-interpreter drivers into
# DEST (e.g. share/sbx/interp): driver.py and its package _sbx_driver/, driver.js,
# the npm packages the JavaScript/TypeScript driver uses (pinned in
# container/interp/package-lock.json), and a pre-built matplotlib font cache.
# sbxd binds DEST read-only at /opt/sbx in every sandbox.  Needs the npm
# registry only the first time (npm ci); afterwards it works offline.
set -euo pipefail
dest=${1:?usage: install-interp.sh DEST}
src=$(cd "$(dirname "$0")/../container/interp" && pwd)

if [ ! -d "$src/node_modules" ] || [ "$src/package-lock.json" -nt "$src/node_modules/.package-lock.json" ]; then
  (cd "$src" && npm ci --omit=dev --no-audit --no-fund --loglevel=error)
fi
mkdir -p "$dest"
cp "$src/driver.py" "$src/driver.js" "$dest/"
# The Python driver's package, imported by driver.py from beside it.
rm -rf "$dest/_sbx_driver.new"
mkdir -p "$dest/_sbx_driver.new"
cp "$src"/_sbx_driver/*.py "$dest/_sbx_driver.new/"
rm -rf "$dest/_sbx_driver"
mv "$dest/_sbx_driver.new" "$dest/_sbx_driver"
rm -rf "$dest/node_modules.new"
cp -r "$src/node_modules" "$dest/node_modules.new"
rm -rf "$dest/node_modules"
mv "$dest/node_modules.new" "$dest/node_modules"
# matplotlib builds its font list on first import (~0.6 s); build it once here.
if [ ! -f "$dest/mplcache/fontlist-v330.json" ] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  mkdir -p "$dest/mplcache"
  MPLCONFIGDIR="$dest/mplcache" /usr/bin/python3 -c 'import matplotlib.font_manager' >/dev/null 2>&1 || true
fi
touch "$dest/.installed"
