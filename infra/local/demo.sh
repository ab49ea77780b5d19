#!/usr/bin/env bash
# Runs the demo on the local stack: starts moto and DynamoDB Local if needed, then
# `triage demo`, which creates a fresh queue, DLQ and table, sends a mixed chaos workload,
# runs the worker until every job settles, and prints a report.
#
#   bash infra/local/demo.sh [--jobs N]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-triage/target}"
bash infra/local/stack.sh start
eval "$(bash infra/local/stack.sh env)"
export RUST_LOG="${RUST_LOG:-error}"
cargo run --quiet -p triage --bin triage -- demo "$@"
