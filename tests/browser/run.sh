#!/bin/sh
# run.sh KILN_BIN - ctest's entry to the web console's browser test
# (console.test.js): installs puppeteer-core from package-lock.json into
# node_modules/ when it is missing (npm ci, no install scripts: the test
# drives Debian's /usr/bin/chromium, it downloads no browser), then runs it.
# Exits 77 (ctest: skipped) when node or chromium is not installed.
set -eu
cd "$(dirname "$0")"
command -v node >/dev/null 2>&1 || { echo "SKIP: node is not installed (scripts/install-deps.sh)"; exit 77; }
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "SKIP: chromium is not installed (scripts/install-deps.sh)"; exit 77; }
if [ ! -d node_modules/puppeteer-core ]; then
  npm ci --ignore-scripts --no-audit --no-fund
fi
KILN_BIN="$1" exec node console.test.js
