#!/usr/bin/env bash
# Builds the artifact the templates deploy and runs it: the arm64 `bootstrap` of triage-lambda,
# as SAM's rust-cargolambda build method makes it (`cargo lambda build --release --arm64`) and
# as the CDK app bundles it (cargo-lambda-cdk, bundling on), checked to be an aarch64 ELF and
# run under qemu-user against a local Lambda Runtime API (cargo-lambda's emulator, as the
# cold-start benchmark uses) with one SQS event on the local stack: one job succeeds, one fails
# fatally (dead-lettered with its failure record), one fails transiently (reported in
# batchItemFailures for SQS to retry). Prints its timings. Slow (a release build with LTO for
# another CPU, then an emulated CPU): not part of the default test command.
#
#   bash infra/local/artifact-check.sh
#
# Idempotent: installs what it needs when missing (the stack's venv with cargo-lambda and zig,
# the aarch64 Rust target, Debian's qemu-user-static with the arm64 C library; apt needs root).
# It uses the stack the environment names (AWS_ENDPOINT_URL_SQS and _DYNAMODB), else this
# checkout's, which it starts only when it is not running (and then stops at the end).
#
#   ARTIFACT_TARGET_DIR  cargo target folder of the arm64 release build (default
#                        .local/artifact-target; kept apart from the debug builds)
#   ARTIFACT_OUT         work folder (default .local/artifact-check)
#   ARTIFACT_CDK=0       skip the CDK bundling step
#   ARTIFACT_LAYER=0     skip the arm64 layer's check (infra/local/layer-artifact-check.sh)
set -euo pipefail

CHECK=artifact-check
source "$(dirname "${BASH_SOURCE[0]}")/arm64-check-lib.sh"
VENV="$ROOT/.local/venv"
OUT="${ARTIFACT_OUT:-$ROOT/.local/artifact-check}"
CDK="${ARTIFACT_CDK:-1}"
LAYER="${ARTIFACT_LAYER:-1}"

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do
    if [ -n "$p" ]; then kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
  done
  if [ -f "$OUT/resources.json" ]; then
    "$VENV/bin/python" infra/local/artifact_check.py cleanup "$OUT" || true
  fi
  stop_started_stack
}
trap cleanup EXIT

# ---------------------------------------------------------------- tools
step "tools"
install_arm64_tools
export PATH="$VENV/bin:$PATH"   # cargo-lambda, and zig through the ziglang package
"$VENV/bin/python" -m ziglang version >/dev/null || die "zig (the ziglang package) is missing from $VENV"
echo "cargo-lambda $(cargo-lambda lambda --version 2>/dev/null | awk '{print $2}'), zig $("$VENV/bin/python" -m ziglang version), $("$QEMU" --version | head -1)"

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log

# ---------------------------------------------------------------- build
step "cargo lambda build --release --arm64 --bin triage-lambda (target dir $TARGET_DIR)"
t0=$(now)
CARGO_TARGET_DIR="$TARGET_DIR" cargo lambda build --release --arm64 --bin triage-lambda
BUILD_S=$(secs "$t0" "$(now)")
SAM_BOOTSTRAP="$TARGET_DIR/lambda/triage-lambda/bootstrap"
[ -f "$SAM_BOOTSTRAP" ] || die "no bootstrap at $SAM_BOOTSTRAP"
echo "built in ${BUILD_S} s: $SAM_BOOTSTRAP ($(du -h "$SAM_BOOTSTRAP" | cut -f1))"

BOOTSTRAPS=("$SAM_BOOTSTRAP")
CDK_S="skipped"
if [ "$CDK" = 1 ]; then
  step "cdk synth with bundling (cargo-lambda-cdk; same target dir, so the build above is reused)"
  if [ ! -x infra/cdk/node_modules/.bin/cdk ]; then
    (cd infra/cdk && npm ci --no-audit --no-fund --loglevel=error)
  fi
  rm -rf "$OUT/cdk.out"
  t0=$(now)
  # Offline, as infra/check.sh: no credentials, no account lookups.
  (cd infra/cdk && env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE \
     -u CDK_DEFAULT_ACCOUNT -u CDK_DEFAULT_REGION -u AWS_ENDPOINT_URL_SQS -u AWS_ENDPOINT_URL_DYNAMODB \
     -u AWS_ENDPOINT_URL_STS AWS_EC2_METADATA_DISABLED=true CDK_DISABLE_CLI_TELEMETRY=true \
     CARGO_TARGET_DIR="$TARGET_DIR" \
     npx --no-install cdk synth --quiet --no-notices --no-version-reporting --output "$OUT/cdk.out" >/dev/null)
  CDK_S=$(secs "$t0" "$(now)")
  asset=$(python3 - "$OUT/cdk.out" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
manifest = json.loads((out / "manifest.json").read_text())
for art in manifest["artifacts"].values():
    if art.get("type") == "aws:cloudformation:stack":
        t = json.loads((out / art["properties"]["templateFile"]).read_text())
        fn = next(r for r in t["Resources"].values() if r["Type"] == "AWS::Lambda::Function")
        print(out / fn["Metadata"]["aws:asset:path"])
        break
EOF
)
  [ -f "$asset/bootstrap" ] || die "the CDK asset $asset has no bootstrap"
  echo "cdk synth in ${CDK_S} s: $asset/bootstrap"
  if cmp -s "$asset/bootstrap" "$SAM_BOOTSTRAP"; then
    echo "the CDK asset's bootstrap is byte for byte the cargo lambda build's"
  else
    echo "the CDK asset's bootstrap differs from the cargo lambda build's: checking both"
    BOOTSTRAPS+=("$asset/bootstrap")
  fi
fi

# ---------------------------------------------------------------- ELF
step "ELF header"
for b in "${BOOTSTRAPS[@]}"; do
  python3 infra/local/elf_aarch64.py "$b"
  if command -v file >/dev/null; then file -b "$b"; fi
done

# ---------------------------------------------------------------- run under qemu
step "local stack"
use_local_stack
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-$AWS_REGION}"   # boto3 reads this one

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
  local i
  for i in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

FIRST_S=()
for b in "${BOOTSTRAPS[@]}"; do
  step "one SQS event to $b under $QEMU"
  "$VENV/bin/python" infra/local/artifact_check.py setup "$OUT"
  res() { python3 -c "import json, sys; print(json.load(open('$OUT/resources.json'))[sys.argv[1]])" "$1"; }
  port=$(free_port)
  cargo-lambda lambda watch --only-lambda-apis -A 127.0.0.1 -P "$port" >"$OUT/watch.log" 2>&1 &
  PIDS+=("$!")
  wait_port "$port" || die "cargo lambda watch did not listen on $port (see $OUT/watch.log)"
  # The event waits in the emulator before the function starts, as a cold start's does.
  cargo-lambda lambda invoke -A 127.0.0.1 -P "$port" _ --data-file "$OUT/event.json" \
    >"$OUT/response.json" 2>"$OUT/invoke.log" &
  invoke=$!
  PIDS+=("$invoke")
  sleep 0.5
  t0=$(now)
  env AWS_LAMBDA_RUNTIME_API="http://127.0.0.1:$port/.rt" \
    AWS_LAMBDA_FUNCTION_NAME=_ AWS_LAMBDA_FUNCTION_VERSION=1 AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256 \
    AWS_LAMBDA_LOG_FORMAT=JSON AWS_LAMBDA_LOG_LEVEL=INFO \
    TRIAGE_QUEUE_URL="$(res queue_url)" TRIAGE_DLQ_URL="$(res dlq_url)" TRIAGE_TABLE="$(res table)" \
    "$QEMU" -L "$SYSROOT" "$b" >"$OUT/function.out" 2>"$OUT/function.log" &
  fn=$!
  PIDS+=("$fn")
  waited=0
  while kill -0 "$invoke" 2>/dev/null; do
    sleep 0.05
    waited=$((waited + 1))
    [ "$waited" -lt 3600 ] || die "no answer within 180 s (see $OUT/function.log)"
  done
  wait "$invoke" || { cat "$OUT/invoke.log" "$OUT/function.log" >&2; die "cargo lambda invoke failed"; }
  FIRST_S+=("$(secs "$t0" "$(now)")")
  kill "$fn" 2>/dev/null; wait "$fn" 2>/dev/null || true
  echo "function log lines: $(wc -l <"$OUT/function.log"), EMF lines: $(grep -c '"_aws"' "$OUT/function.out" || true)"
  "$VENV/bin/python" infra/local/artifact_check.py verify "$OUT" \
    || { cat "$OUT/function.log" >&2; die "wrong batch response or DLQ"; }
  "$VENV/bin/python" infra/local/artifact_check.py cleanup "$OUT"
  rm -f "$OUT/resources.json"
  echo "first invocation under qemu (process start -> batch response): ${FIRST_S[-1]} s"
done

step "result"
echo "artifact check: ok"
echo "build (cargo lambda build --release --arm64): ${BUILD_S} s"
echo "cdk synth with bundling: ${CDK_S}$([ "$CDK_S" = skipped ] || echo ' s')"
echo "first invocation under qemu (process start -> batch response): ${FIRST_S[*]} s"

if [ "$LAYER" = 1 ]; then
  # The layer's extension, the same way: built for arm64, run under qemu-user.
  ARTIFACT_TARGET_DIR="$TARGET_DIR" ARTIFACT_OUT="$OUT/layer" bash infra/local/layer-artifact-check.sh
fi
