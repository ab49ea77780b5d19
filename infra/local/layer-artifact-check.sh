#!/usr/bin/env bash
# Builds the Lambda layer for arm64 and runs it: `LAYER_ARCHS=arm64 bash infra/layer/build.sh`,
# the zip's extension checked to be an aarch64 ELF, then run under qemu-user as the extension
# of a Python function (the host's Python with awslambdaric, tests/layer/handler.py) against
# the project's local Runtime API, with one SQS event of three jobs on the local stack: one
# succeeds, one raises ValueError (dead-lettered with its failure record), one fails
# transiently (in batchItemFailures). The run is the ignored test
# `layer::an_emulated_extension_triages_a_python_batch`. Prints its timings. Slow (a release
# build with LTO for another CPU, then an emulated CPU): not part of the default test command.
#
#   bash infra/local/layer-artifact-check.sh       # infra/local/artifact-check.sh runs it too
#
# Idempotent: installs what it needs when missing (as infra/local/artifact-check.sh). It uses the
# stack the environment names (AWS_ENDPOINT_URL_SQS and _DYNAMODB), else this checkout's, which
# it starts only when it is not running (and then stops at the end).
#
#   ARTIFACT_TARGET_DIR  cargo target folder of the arm64 release build (default
#                        .local/artifact-target)
#   ARTIFACT_OUT         work folder (default .local/artifact-check/layer)
set -euo pipefail

CHECK=layer-artifact-check
source "$(dirname "${BASH_SOURCE[0]}")/arm64-check-lib.sh"
OUT="${ARTIFACT_OUT:-$ROOT/.local/artifact-check/layer}"
trap stop_started_stack EXIT

step "tools"
install_arm64_tools
command -v unzip >/dev/null || python3 -c 'import zipfile' || die "no way to unzip the layer"

step "LAYER_ARCHS=arm64 bash infra/layer/build.sh (target dir $TARGET_DIR)"
mkdir -p "$OUT"
t0=$(now)
CARGO_TARGET_DIR="$TARGET_DIR" LAYER_OUT="$OUT" LAYER_ARCHS=arm64 bash infra/layer/build.sh
BUILD_S=$(secs "$t0" "$(now)")
ZIP="$OUT/sqs-triage-layer-arm64.zip"
[ -f "$ZIP" ] || die "no layer zip at $ZIP"

step "the zip's extension"
rm -rf "$OUT/opt"
# Python's zipfile keeps the files' modes as the layer stores them (Lambda runs them so).
python3 - "$ZIP" "$OUT/opt" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode:
            os.chmod(path, mode & 0o7777)
PY
EXT="$OUT/opt/extensions/sqs-triage-extension"
[ -x "$EXT" ] || die "the zip has no executable extensions/sqs-triage-extension"
[ -x "$OUT/opt/sqs-triage-wrapper" ] || die "the zip has no executable sqs-triage-wrapper"
python3 infra/local/elf_aarch64.py "$EXT"
if command -v file >/dev/null; then file -b "$EXT"; fi

step "local stack"
use_local_stack

step "one SQS event of three jobs through the extension under $QEMU"
t0=$(now)
LAYER_EXTENSION="$EXT" LAYER_EXTENSION_RUNNER="$QEMU -L $SYSROOT" \
  cargo test -p triage --test it layer::an_emulated_extension_triages_a_python_batch \
  -- --ignored --exact --nocapture 2>&1 | tee "$OUT/test.log"
[ "${PIPESTATUS[0]}" = 0 ] || die "the emulated layer's run failed (see $OUT/test.log)"
grep -q '^test result: ok. 1 passed' "$OUT/test.log" || die "the test did not run (see $OUT/test.log)"
RUN_S=$(secs "$t0" "$(now)")

step "result"
echo "layer artifact check: ok"
echo "layer build (LAYER_ARCHS=arm64 bash infra/layer/build.sh): ${BUILD_S} s"
echo "layer zip: $ZIP ($(wc -c <"$ZIP") bytes)"
grep '^timing: ' "$OUT/test.log" | sed 's/^timing: /under qemu: /'
echo "test command (build of the tests included): ${RUN_S} s"
