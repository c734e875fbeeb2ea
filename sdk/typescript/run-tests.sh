#!/usr/bin/env bash
# CI entry point of the TypeScript SDK (sdk/typescript): install the pinned
# dev dependencies (npm ci; works offline once they are in npm's cache),
# compile, and run the end-to-end tests against a private sbx daemon that the
# test runner starts and stops itself (binary: $SBX_BIN, default <repo>/bin,
# built by `make all`). Exit status 0 only when every test passed.
set -euo pipefail
cd "$(dirname "$0")"
export SBX_BIN="${SBX_BIN:-$(cd ../.. && pwd)/bin}"
if [ ! -x "$SBX_BIN/sbxd" ] && [ ! -x "$SBX_BIN" ]; then
    echo "run-tests.sh: no sbxd in $SBX_BIN (build it with 'make all', or set SBX_BIN)" >&2
    exit 1
fi
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error
npm run --silent build
# exec: the test runner gets the signals and stops its daemon itself.
exec node test/run.mjs "$@"
