#!/usr/bin/env bash
# Offline checks of the deployment templates (no AWS credentials, no network but the package
# registries for the first install). Idempotent: installs its tools when they are missing.
#
#   0. src/config.rs's limits as JSON (`cargo run -p triage --example config_limits`): the one source of
#      both templates' policy parameter ranges (infra/ranges.py generates them)
#   1. cfn-lint on infra/template.yaml (SAM)
#   2. aws-sam-translator: SAM -> plain CloudFormation JSON
#   3. tsc --noEmit, the CDK stack's tests (infra/cdk/test), then `cdk synth` of infra/cdk
#      without compiling the crate, with cdk-nag (AwsSolutions); an unacknowledged cdk-nag error
#      fails the synth; again with other settings, and for the FIFO variant
#   3b. the Python variant: cfn-lint and the translator on infra/template-python.yaml, `cdk synth
#      -c runtime=python` with a stand-in layer zip (the layer build is too slow here)
#   4. infra/check_templates.py: the generated ranges are up to date; the facts that matter, on
#      both templates; SAM and CDK compared resource by resource, setting by setting; the
#      envelope schema and the sample events in events/
#   5. the crate `triage init` writes (into .local/infra-check/starter, depending on this
#      checkout by path): cfn-lint and the SAM translator on its template.yaml, tsc and
#      `cdk synth` (no bundling, cdk-nag) of its CDK app with infra/cdk's node_modules, then the
#      same facts on both, SAM and CDK compared, and both built from the crate's own binary;
#      then `cargo test` of the crate, with this checkout's Cargo.lock and target folder
#   5b. `triage init --runtime python` and `--runtime node`: the same on each project's template and
#      CDK app (infra/template-python.yaml's facts), then `python3 -m unittest` / `node --test` in it
#   6. when the local stack is up (infra/local/test.sh starts it first; CI always has it):
#      infra/deploy_local.py deploys the SAM translator's output and the `cdk synth` output into
#      moto's CloudFormation and checks the created queues, table, function, mapping, log group
#      and dashboard through their APIs (docs/deploy.md, "Deployed into the local stack")
#
# Tools go to .local/venv-infra (Python) and infra/cdk/node_modules (npm ci); outputs to
# .local/infra-check/. Ends with the line `N passed, M failed`; exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# INFRA_VENV / INFRA_OUT: another tool folder / output folder (e.g. a venv that already holds
# the pinned tools, or an output folder outside a shared .local).
VENV="${INFRA_VENV:-$ROOT/.local/venv-infra}"
OUT="${INFRA_OUT:-$ROOT/.local/infra-check}"
CDK_DIR="$ROOT/infra/cdk"
PY_PINS=(cfn-lint==1.58.0 aws-sam-translator==1.115.0)

# Never reach for credentials or the instance metadata endpoint; no CLI telemetry or notices.
# A shell set up for the local stack (`stack.sh env`) has credentials and an STS endpoint:
# with them `cdk synth` would ask STS for the account and write literal ARNs instead of the
# tokens a deployable template has. The checks are offline: none of it is used.
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_PROFILE \
  CDK_DEFAULT_ACCOUNT CDK_DEFAULT_REGION
for v in $(compgen -e | grep '^AWS_ENDPOINT_URL' || true); do unset "$v"; done
export AWS_EC2_METADATA_DISABLED=true
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
export CDK_DISABLE_CLI_TELEMETRY=true
export npm_config_update_notifier=false

step() { printf '== %s\n' "$*"; }

# ---------------------------------------------------------------- tools
if ! "$VENV/bin/python" -c 'import cfnlint, samtranslator' >/dev/null 2>&1; then
  step "installing ${PY_PINS[*]} into .local/venv-infra"
  rm -rf "$VENV"
  mkdir -p "$ROOT/.local"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_PINS[@]}"
fi

if [ -L "$CDK_DIR/node_modules" ]; then
  # A link to another checkout's install: never reinstall through it (npm ci would empty the
  # folder it points at, under whoever else uses it). A fresh checkout's package-lock.json is
  # newer than any install, so the test below would always fire here.
  if [ ! -x "$CDK_DIR/node_modules/.bin/cdk" ]; then
    echo "infra/cdk/node_modules links to $(readlink "$CDK_DIR/node_modules"), which has no cdk: install there" >&2
    exit 1
  fi
elif [ ! -f "$CDK_DIR/node_modules/.package-lock.json" ] \
   || [ "$CDK_DIR/package-lock.json" -nt "$CDK_DIR/node_modules/.package-lock.json" ] \
   || [ ! -x "$CDK_DIR/node_modules/.bin/cdk" ]; then
  step "installing infra/cdk node_modules (npm ci)"
  (cd "$CDK_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi

mkdir -p "$OUT"

# ---------------------------------------------------------------- the configuration's limits
step "config limits (cargo run -p triage --example config_limits)"
cargo run --quiet -p triage --example config_limits > "$OUT/config-limits.json"
echo "config limits: $(grep -c '"var"' "$OUT/config-limits.json") variables"

# ---------------------------------------------------------------- SAM
step "cfn-lint infra/template.yaml"
"$VENV/bin/cfn-lint" infra/template.yaml
echo "cfn-lint: no findings"

step "SAM translator"
"$VENV/bin/python" infra/check_templates.py translate infra/template.yaml "$OUT/sam-template.json"

step "the Python variant (infra/template-python.yaml): cfn-lint, SAM translator"
"$VENV/bin/cfn-lint" infra/template-python.yaml
echo "cfn-lint (python): no findings"
"$VENV/bin/python" infra/check_templates.py translate infra/template-python.yaml "$OUT/sam-python.json"
# The layer build is too slow for this check: a stand-in zip with the wrapper at its root.
LAYER_STANDIN="$OUT/layer-standin/sqs-triage-layer-arm64.zip"
mkdir -p "$(dirname "$LAYER_STANDIN")"
python3 - "$LAYER_STANDIN" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("sqs-triage-wrapper", "#!/bin/sh\necho stand-in for the layer build of infra/layer/build.sh\n")
PY

# ---------------------------------------------------------------- CDK
step "tsc --noEmit (infra/cdk)"
(cd "$CDK_DIR" && npx --no-install tsc --noEmit -p tsconfig.json)
echo "tsc: no errors"

step "CDK stack tests (infra/cdk/test)"
(cd "$CDK_DIR" && npx --no-install tsx --test test/*.test.ts)

step "cdk synth (no bundling) with cdk-nag AwsSolutions"
rm -rf "$OUT/cdk.out"
(cd "$CDK_DIR" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
  -c skipBundling=true --output "$OUT/cdk.out")
echo "cdk synth: ok ($(ls "$OUT"/cdk.out/*.template.json | xargs -n1 basename))"

step "cdk synth (no bundling) with other settings (infra/parity-settings.json)"
mapfile -t OTHER < <("$VENV/bin/python" infra/check_templates.py cdk-context infra/parity-settings.json)
rm -rf "$OUT/cdk-other.out"
(cd "$CDK_DIR" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
  -c skipBundling=true "${OTHER[@]}" --output "$OUT/cdk-other.out")
echo "cdk synth: ok (${#OTHER[@]} arguments)"

step "cdk synth (no bundling), the FIFO variant (-c queueType=fifo)"
rm -rf "$OUT/cdk-fifo.out"
(cd "$CDK_DIR" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
  -c skipBundling=true -c queueType=fifo --output "$OUT/cdk-fifo.out")
echo "cdk synth: ok (FIFO)"

step "cdk synth (no bundling), the Python variant (-c runtime=python, the stand-in layer zip)"
rm -rf "$OUT/cdk-python.out"
(cd "$CDK_DIR" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
  -c skipBundling=true -c runtime=python -c layerZip="$LAYER_STANDIN" --output "$OUT/cdk-python.out")
echo "cdk synth: ok (Python)"

# ---------------------------------------------------------------- facts
step "facts"
"$VENV/bin/python" infra/check_templates.py check \
  --sam infra/template.yaml \
  --sam-cfn "$OUT/sam-template.json" \
  --cdk-out "$OUT/cdk.out" \
  --cdk-other-out "$OUT/cdk-other.out" \
  --other-settings infra/parity-settings.json \
  --cdk-fifo-out "$OUT/cdk-fifo.out" \
  --sam-python infra/template-python.yaml \
  --sam-python-cfn "$OUT/sam-python.json" \
  --cdk-python-out "$OUT/cdk-python.out" \
  --events events \
  --schema schema/envelope.schema.json \
  --limits "$OUT/config-limits.json"

# ---------------------------------------------------------------- the crate `triage init` writes
step "triage init: the generated crate's SAM template and CDK app"
STARTER="$OUT/starter"
STARTER_NAME=starter-check
rm -rf "$STARTER" "$OUT/starter-cdk.out"
cargo run --quiet -p triage --bin triage -- init "$STARTER_NAME" --dir "$STARTER" --path "$ROOT" > /dev/null
"$VENV/bin/cfn-lint" "$STARTER/template.yaml"
echo "cfn-lint (starter): no findings"
"$VENV/bin/python" infra/check_templates.py translate "$STARTER/template.yaml" "$OUT/starter-sam.json"
# The generated app's package.json pins infra/cdk's versions: use that install.
ln -s "$CDK_DIR/node_modules" "$STARTER/cdk/node_modules"
(cd "$STARTER/cdk" && npx --no-install tsc --noEmit -p tsconfig.json)
echo "tsc (starter): no errors"
# The reference stack's name, so that the facts compare the same names.
(cd "$STARTER/cdk" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
  -c skipBundling=true -c stackName=sqs-triage --output "$OUT/starter-cdk.out")
"$VENV/bin/python" infra/check_templates.py starter --dir "$STARTER" --name "$STARTER_NAME" \
  --sam-cfn "$OUT/starter-sam.json" --cdk-out "$OUT/starter-cdk.out" --limits "$OUT/config-limits.json"

step "triage init: the generated crate builds against this checkout and passes its tests"
# This checkout's lock file (the same versions, no registry lookup) and target folder (its
# dependencies already built by the `cargo run` above).
cp Cargo.lock "$STARTER/Cargo.lock"
STARTED=$SECONDS
(cd "$STARTER" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}" \
  cargo test --offline --quiet --color never 2>&1) | tee "$OUT/starter-test.log" | grep -E '^test result' \
  || { cat "$OUT/starter-test.log"; exit 1; }
grep -q 'test result: ok. 5 passed; 0 failed' "$OUT/starter-test.log" \
  || { echo "the generated crate's 4 tests did not all pass" >&2; exit 1; }
echo "generated crate: cargo test in $((SECONDS - STARTED)) s"

step "triage init --runtime python and node: each project's SAM template, CDK app and tests"
for RT in python node; do
  PROJECT="$OUT/starter-$RT"
  rm -rf "$PROJECT" "$OUT/starter-$RT-cdk.out"
  cargo run --quiet -p triage --bin triage -- init "starter-$RT" --runtime "$RT" --dir "$PROJECT" --path "$ROOT" > /dev/null
  "$VENV/bin/cfn-lint" "$PROJECT/template.yaml"
  echo "cfn-lint (starter $RT): no findings"
  "$VENV/bin/python" infra/check_templates.py translate "$PROJECT/template.yaml" "$OUT/starter-$RT-sam.json"
  ln -s "$CDK_DIR/node_modules" "$PROJECT/cdk/node_modules"
  (cd "$PROJECT/cdk" && npx --no-install tsc --noEmit -p tsconfig.json)
  echo "tsc (starter $RT): no errors"
  (cd "$PROJECT/cdk" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
    -c stackName=sqs-triage -c layerZip="$LAYER_STANDIN" --output "$OUT/starter-$RT-cdk.out")
  "$VENV/bin/python" infra/check_templates.py starter --runtime "$RT" --dir "$PROJECT" --name "starter-$RT" \
    --sam-cfn "$OUT/starter-$RT-sam.json" --cdk-out "$OUT/starter-$RT-cdk.out" --limits "$OUT/config-limits.json"
done
# The projects' own tests, as their READMEs run them: no packages to install.
(cd "$OUT/starter-python" && python3 -m unittest 2>&1) | tee "$OUT/starter-python-test.log" | tail -1
grep -qx 'OK' "$OUT/starter-python-test.log" && grep -q '^Ran 4 tests' "$OUT/starter-python-test.log" \
  || { cat "$OUT/starter-python-test.log"; echo "the Python project's 4 tests did not all pass" >&2; exit 1; }
(cd "$OUT/starter-node" && node --test 2>&1) > "$OUT/starter-node-test.log" \
  || { cat "$OUT/starter-node-test.log"; echo "the Node.js project's tests failed" >&2; exit 1; }
grep -qx '# pass 4' "$OUT/starter-node-test.log" && grep -qx '# fail 0' "$OUT/starter-node-test.log" \
  || { cat "$OUT/starter-node-test.log"; echo "the Node.js project's 4 tests did not all pass" >&2; exit 1; }
echo "generated projects: python3 -m unittest and node --test, 4 tests each, passed"

# ---------------------------------------------------------------- deployed into the local stack
step "deploy into the local stack's CloudFormation (moto) and check the created resources"
STACK_PY="${TRIAGE_VENV:-$ROOT/.local/venv}/bin/python"
MOTO_ENDPOINT="http://127.0.0.1:${TRIAGE_MOTO_PORT:-45660}"
if [ -x "$STACK_PY" ] && "$STACK_PY" infra/deploy_local.py --probe --endpoint "$MOTO_ENDPOINT"; then
  "$STACK_PY" infra/deploy_local.py --endpoint "$MOTO_ENDPOINT" \
    --sam-cfn "$OUT/sam-template.json" \
    --cdk-out "$OUT/cdk.out" \
    --cdk-fifo-out "$OUT/cdk-fifo.out" \
    --sam-python-cfn "$OUT/sam-python.json" \
    --cdk-python-out "$OUT/cdk-python.out"
else
  echo "skipped: the local stack is not up (bash infra/local/stack.sh start, or run infra/local/test.sh)"
fi
