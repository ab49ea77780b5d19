#!/usr/bin/env bash
# Runs every test of sqs-triage on the local stack: formatting and lints, unit and property
# tests, integration tests against moto and DynamoDB Local through the real SDK, the console
# in a real browser, the deployment template checks, and a smoke run of the benchmarks.
#
#   bash infra/local/test.sh
#
# Starts the local stack if it is not running and stops it again if it started it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-triage/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

# What the tests need beyond the running stack (the runtime clients of the layer's tests), up
# to date even where a stack already runs; quick when done already.
bash infra/local/stack.sh install
started=0
if ! bash infra/local/stack.sh status >/dev/null 2>&1; then
  step "starting the local stack"
  bash infra/local/stack.sh start
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then bash infra/local/stack.sh stop || true; fi; }
trap cleanup EXIT
eval "$(bash infra/local/stack.sh env)"

step "cargo fmt --check"
cargo fmt --all -- --check

step "no function over 100 lines outside tests (tools/long_fns.py)"
python3 tools/long_fns.py --max 100

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The library as a function builds it (no `internals` feature): its own lints, dead code included.
cargo clippy -p sqs-triage --all-targets --quiet -- -D warnings

step "cargo test (unit, property and integration tests on the local stack)"
# Benchmarks are not timed in CI: clippy builds them, tests/it/bench_smoke.rs runs the report on a
# tiny input. The integration tests are one binary, tests/it (a module per area); the chaos run is
# its own, tests/chaos. Both are targets of the `triage` package (they run its binaries).
# The chaos run writes its accounting table here; it is printed after the tests, pass or fail.
export CHAOS_TABLE="${CHAOS_TABLE:-$CARGO_TARGET_DIR/chaos-table.md}"
rm -f "$CHAOS_TABLE"
status=0
cargo test --workspace --lib --bins --tests --examples --no-fail-fast || status=$?
# The crate page's and the README's examples are doctests; the docs must have no broken link.
# The library's page is built as a function sees it: default features.
cargo test --doc -p sqs-triage --no-fail-fast || status=$?
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p sqs-triage --lib --quiet || status=$?
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p triage --lib --quiet || status=$?
# The markdown pages' relative links resolve, and their opening summaries stay short.
python3 infra/local/docs_check.py || status=$?

step "triage console in a browser (tests/browser/run.sh: Debian's Chromium, playwright-core)"
# Installs Chromium from apt and playwright-core from npm when missing; screenshots go to the
# target directory here (docs/img/ holds the ones the README shows).
browser_started=$(date +%s)
CONSOLE_SCREENSHOTS="$CARGO_TARGET_DIR/console-screenshots" bash tests/browser/run.sh || status=$?
echo "browser test: $(( $(date +%s) - browser_started ))s"
if [ -f "$CHAOS_TABLE" ]; then
  step "chaos run accounting (tests/chaos, docs/guarantees.md)"
  cat "$CHAOS_TABLE"
fi
[ "$status" = 0 ] || exit "$status"

if [ -f infra/check.sh ]; then
  step "deployment templates (cfn-lint, SAM translator, cdk synth + cdk-nag, facts)"
  bash infra/check.sh
fi
