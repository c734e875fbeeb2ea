#!/usr/bin/env bash
# tests/s3/install.sh — install the S3-protocol server the S3 backup store is
# tested against (s3rver, pinned in package.json / package-lock.json) into
# tests/s3/node_modules: `npm ci`, offline once in npm's cache.  Run by
# tests/integration/test_backup_s3.c when node_modules/s3rver is missing.
set -euo pipefail
cd "$(dirname "$0")"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
exec npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error
