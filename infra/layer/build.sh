#!/usr/bin/env bash
# Builds the sqs-triage Lambda layer, one zip per architecture:
#
#   extensions/sqs-triage-extension      the extension (Lambda starts it before the runtime)
#   sqs-triage-wrapper                   AWS_LAMBDA_EXEC_WRAPPER=/opt/sqs-triage-wrapper
#   python/sqs_triage/__init__.py        the Python helpers (/opt/python is on sys.path)
#   nodejs/node_modules/sqs-triage/      the Node.js helpers (/opt/nodejs/node_modules)
#
#   bash infra/layer/build.sh            both architectures (cargo lambda, release)
#   LAYER_ARCHS=arm64 bash infra/layer/build.sh
#   LAYER_BINARY=path/to/binary LAYER_ARCHS=x86_64 bash infra/layer/build.sh
#                                        package a binary built already (no cargo build)
#
# The zips go to LAYER_OUT (default .local/layer). Needs the stack's venv (cargo-lambda and
# zig: `bash infra/local/stack.sh install`) and the Rust targets, as infra/local/artifact-check.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${LAYER_OUT:-$ROOT/.local/layer}"
ARCHS="${LAYER_ARCHS:-arm64 x86_64}"
VENV="$ROOT/.local/venv"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

die() { printf 'layer build: error: %s\n' "$*" >&2; exit 1; }

# A binary built already is one architecture's: packaging it for two would ship a layer whose
# extension cannot start on one of them.
if [ -n "${LAYER_BINARY:-}" ] && [ "$(wc -w <<<"$ARCHS")" != 1 ]; then
  die "LAYER_BINARY is one architecture's binary: set LAYER_ARCHS to arm64 or x86_64"
fi

# The ELF machine of a binary: 183 for arm64, 62 for x86_64.
elf_machine() {
  python3 -c 'import struct,sys; h=open(sys.argv[1],"rb").read(20); print(struct.unpack_from("<H",h,18)[0] if h[:4]==b"\x7fELF" else "none")' "$1"
}

mkdir -p "$OUT"
for arch in $ARCHS; do
  case "$arch" in
    arm64) flag=--arm64; triple=aarch64-unknown-linux-gnu; machine=183 ;;
    x86_64) flag=--x86-64; triple=x86_64-unknown-linux-gnu; machine=62 ;;
    *) die "unknown architecture $arch (arm64 or x86_64)" ;;
  esac
  if [ -n "${LAYER_BINARY:-}" ]; then
    bin="$LAYER_BINARY"
  else
    export PATH="$VENV/bin:$PATH"
    command -v cargo-lambda >/dev/null || die "cargo-lambda is missing: bash infra/local/stack.sh install"
    rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
    cargo lambda build --release "$flag" --extension --bin sqs-triage-extension
    bin="$TARGET_DIR/lambda/extensions/sqs-triage-extension"
  fi
  [ -x "$bin" ] || die "no extension binary at $bin"
  got=$(elf_machine "$bin")
  [ "$got" = "$machine" ] || die "$bin is not an $arch Linux binary (ELF machine $got, expected $machine)"
  stage="$OUT/stage-$arch"
  rm -rf "$stage"
  mkdir -p "$stage/extensions"
  cp "$bin" "$stage/extensions/sqs-triage-extension"
  cp infra/layer/sqs-triage-wrapper "$stage/sqs-triage-wrapper"
  cp -R infra/layer/python infra/layer/nodejs "$stage/"
  find "$stage" -name __pycache__ -prune -exec rm -rf {} +
  zip="$OUT/sqs-triage-layer-$arch.zip"
  # Python's zipfile keeps the executable bits (Lambda runs both files as they are stored).
  python3 - "$stage" "$zip" <<'PY'
import os, sys, zipfile
stage, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for base, dirs, files in os.walk(stage):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            info = zipfile.ZipInfo.from_file(path, os.path.relpath(path, stage))
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as f:
                z.writestr(info, f.read())
PY
  rm -rf "$stage"
  printf 'layer %s: %s (%s bytes)\n' "$arch" "$zip" "$(wc -c <"$zip")"
done
