#!/usr/bin/env bash
# tests/mcp/run-tests.sh — `sbx mcp` (tools/cli_mcp.c; docs/mcp.md) driven by the
# official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in
# package.json / package-lock.json; `npm ci`, offline once in npm's cache) as a
# real client over stdio, against a private `sbxd dev` the test starts and
# stops itself ($SBX_BIN: sbxd and sbx, default <repo>/bin).  Registered in
# tools/run-tests.sh's `all` list.  Exit status 0 only when every test passed.
set -euo pipefail
cd "$(dirname "$0")"
export SBX_BIN="${SBX_BIN:-$(cd ../.. && pwd)/bin}"
if [ ! -x "$SBX_BIN/sbxd" ] || [ ! -x "$SBX_BIN/sbx" ]; then
    echo "run-tests.sh: no sbxd/sbx in $SBX_BIN (build them with 'make all', or set SBX_BIN)" >&2
    exit 1
fi
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error
exec node --test --test-reporter=spec --test-timeout=180000 mcp.test.mjs
