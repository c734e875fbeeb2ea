#!/usr/bin/env bash
# tests/s3/install.sh — install the S3-protocol server the S3 backup store is
# tested against (s3rver, pinned in package.json / package-lock.json) into
# tests/s3/node_modules: `npm ci`, offline once in npm's cache.  Run by every
# test of tests/integration/test_backup_s3.c before it starts s3rver: tests
# run side by side, so one installs under flock(1) on .install.lock while the
# others wait, and node_modules/.sbx-installed (written after `npm ci`
# succeeded; `npm ci` removes it first) tells them it is complete — a test
# that only looked for s3rver.js once ran node on a half-written tree.
set -euo pipefail
cd "$(dirname "$0")"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
exec 9>.install.lock
flock 9
[ -e node_modules/.sbx-installed ] && exit 0
npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error
touch node_modules/.sbx-installed
