#!/usr/bin/env bash
# The console's browser test: `triage console` against the local stack, driven in Debian's
# Chromium through playwright-core (which downloads no browser). Installs what it needs:
# Chromium from apt when /usr/bin/chromium is missing, playwright-core from npm into
# tests/browser/node_modules. Builds `triage` and the incident worker example, then runs
# console.test.mjs with node's test runner. Screenshots go to docs/img/ (CONSOLE_SCREENSHOTS
# to put them elsewhere).
#
#   bash tests/browser/run.sh      # the local stack running (infra/local/stack.sh start)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-triage/target}"

if [ ! -x /usr/bin/chromium ]; then
  echo "installing Debian's chromium (apt-get)"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

(
  cd "$HERE"
  export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
  if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  else
    npm install --no-audit --no-fund --loglevel=error
  fi
)

# One build: the library once, with the features the `triage` binary enables.
cargo build --quiet -p triage -p sqs-triage --bin triage --example incident_worker

if [ -z "${AWS_ENDPOINT_URL_SQS:-}" ]; then
  eval "$(bash infra/local/stack.sh env)"
fi
cd "$HERE"
exec node --test --test-reporter=spec console.test.mjs
