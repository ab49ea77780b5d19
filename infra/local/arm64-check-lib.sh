# What infra/local/artifact-check.sh and infra/local/layer-artifact-check.sh share: both build
# for arm64 and run the build under qemu-user on the local stack. Sourced, not run; the script
# that sources it sets CHECK (its name, for errors) first. Sets ROOT (the checkout, also the
# working folder), TARGET_DIR (the arm64 release build's cargo target folder:
# ARTIFACT_TARGET_DIR, default .local/artifact-target), SYSROOT and QEMU.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TARGET_DIR="${ARTIFACT_TARGET_DIR:-$ROOT/.local/artifact-target}"
SYSROOT=/usr/aarch64-linux-gnu
QEMU=qemu-aarch64-static

step() { printf '== %s\n' "$*"; }
die() { printf '%s: error: %s\n' "$CHECK" "$*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }

# The tools both need, installed when missing: the stack's venv, the aarch64 Rust target, and
# Debian's qemu-user-static with the arm64 C library (apt needs root).
install_arm64_tools() {
  bash infra/local/stack.sh install
  if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
  fi
  if ! command -v "$QEMU" >/dev/null || [ ! -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ] \
     || [ ! -e "$SYSROOT/lib/libgcc_s.so.1" ]; then
    step "installing qemu-user-static, libc6-arm64-cross, libgcc-s1-arm64-cross (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      qemu-user-static libc6-arm64-cross libgcc-s1-arm64-cross >/dev/null
  fi
}

# The stack the environment names (AWS_ENDPOINT_URL_SQS and _DYNAMODB: another checkout's, or
# the caller's), else this checkout's, started when it is not running (STARTED_STACK=1 then)
# and its variables exported.
STARTED_STACK=0
use_local_stack() {
  if [ -n "${AWS_ENDPOINT_URL_SQS:-}" ] && [ -n "${AWS_ENDPOINT_URL_DYNAMODB:-}" ]; then
    echo "the stack at $AWS_ENDPOINT_URL_SQS and $AWS_ENDPOINT_URL_DYNAMODB"
    return
  fi
  if ! bash infra/local/stack.sh status >/dev/null 2>&1; then
    bash infra/local/stack.sh start
    STARTED_STACK=1
  fi
  eval "$(bash infra/local/stack.sh env)"
}

# Stops the stack if use_local_stack started it: for the script's exit trap.
stop_started_stack() {
  if [ "$STARTED_STACK" = 1 ]; then
    bash infra/local/stack.sh stop || true
  fi
}
