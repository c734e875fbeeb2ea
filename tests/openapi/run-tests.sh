#!/usr/bin/env bash
# The OpenAPI document's tests (gateway/openapi.json, generated from
# runtime/ops.yaml): install the pinned npm tools (npm ci; offline once they
# are in npm's cache), generate a TypeScript client from the document with
# openapi-typescript + openapi-fetch into build/openapi-client (not
# committed), compile it with tsc --strict, then start a private sbxd and run
# document.test.mjs (a real OpenAPI 3.1 validator, the served document, real
# answers against the result schemas) and the generated client's smoke test.
#
#   SBX_BIN   directory holding sbxd (default <repo>/bin; `make all`)
# Exit status 0 only when everything passed.  Needs root (the daemon does).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export SBX_BIN="${SBX_BIN:-$repo/bin}"
if [ ! -x "$SBX_BIN/sbxd" ] && [ ! -x "$SBX_BIN" ]; then
    echo "run-tests.sh: no sbxd in $SBX_BIN (build it with 'make all', or set SBX_BIN)" >&2
    exit 1
fi
cd "$here"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error

out="$repo/build/openapi-client"
rm -rf "$out" && mkdir -p "$out"
cp client/smoke.ts client/tsconfig.json "$out/"
echo '{"type": "module", "private": true}' > "$out/package.json"
ln -s "$here/node_modules" "$out/node_modules"
echo "# openapi-typescript: gateway/openapi.json -> $out/schema.d.ts"
node_modules/.bin/openapi-typescript "$repo/gateway/openapi.json" -o "$out/schema.d.ts" --silent --default-non-nullable=false
echo "# tsc --strict: the generated client and its smoke test"
node_modules/.bin/tsc -p "$out/tsconfig.json"
exec node run.mjs "$out/dist/smoke.js"
