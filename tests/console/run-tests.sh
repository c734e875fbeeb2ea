#!/usr/bin/env bash
# tests/console/run-tests.sh — the web console (gateway/console/; docs/console.md) in
# Debian's chromium (tools/deps.sh) driven by puppeteer-core (pinned in
# package.json / package-lock.json; `npm ci`, offline once in npm's cache),
# against private `sbxd dev --console` daemons the test starts and stops
# itself ($SBX_BIN: sbxd and sbx, default <repo>/bin).  Registered in
# tools/run-tests.sh's `all` list.  Exit status 0 only when every test passed.
set -euo pipefail
cd "$(dirname "$0")"
export SBX_BIN="${SBX_BIN:-$(cd ../.. && pwd)/bin}"
if [ ! -x "$SBX_BIN/sbxd" ] || [ ! -x "$SBX_BIN/sbx" ]; then
    echo "run-tests.sh: no sbxd/sbx in $SBX_BIN (build them with 'make all', or set SBX_BIN)" >&2
    exit 1
fi
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error
fi
exec node --test --test-reporter=spec --test-timeout=300000 console.test.mjs
