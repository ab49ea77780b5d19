#!/usr/bin/env python3
"""Offline fact checks over the sqs-triage infrastructure templates.

    check_templates.py translate SAM_TEMPLATE OUT_JSON
        Transforms the SAM template to plain CloudFormation with aws-sam-translator
        (the local CodeUri is replaced by a dummy S3 location, as `sam package` would).

    check_templates.py check --sam SAM_TEMPLATE --sam-cfn OUT_JSON --cdk-out CDK_OUT_DIR
        Checks the facts that matter on the translated SAM output and on the synthesized CDK
        template: one line per fact, then `N passed, M failed`; exit status 1 on any failure.
        Some facts read the crate too: the role's actions against the SDK calls derived from
        triage-lambda's source (lambda_calls.py), and the receive rule's factor in
        triage/src/ops/setup.rs, the CDK stack and docs/deploy.md against SAM's Rules.

    check_templates.py sam-rules SAM_TEMPLATE
        Rewrites the template's generated `Rules:` section (maxReceiveCount >= F x MaxAttempts,
        F from triage/src/ops/setup.rs) for the values its MaxAttempts and MaxReceiveCount accept.

    check_templates.py lambda-calls
        Prints the SDK calls triage-lambda can make, as IAM actions, with where each is called.

Both templates are evaluated the same way: intrinsic functions are resolved with the
parameter defaults (or the CDK context baked into the template), resources get the names and
ARNs CloudFormation would give them, and the facts are asserted on those concrete values.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # lambda_calls.py

REGION = "us-east-1"
ACCOUNT = "000000000000"
STACK = "sqs-triage"
NOVALUE = object()

# The policy variables both stacks pass to the function (their defaults are src/config.rs's).
POLICY_VARS = [
    "TRIAGE_MAX_ATTEMPTS", "TRIAGE_BASE_DELAY_MS", "TRIAGE_BACKOFF_MULTIPLIER", "TRIAGE_MAX_DELAY_MS",
    "TRIAGE_JITTER_MAX_MS", "TRIAGE_BREAKER_FAILURE_RATE", "TRIAGE_BREAKER_MIN_EXECUTIONS", "TRIAGE_BREAKER_WINDOW_S", "TRIAGE_BREAKER_OPEN_S",
    "TRIAGE_BREAKER_PROBES",
]
# What the role must allow that triage-lambda's own code does not call: the SQS event source
# mapping polls, deletes and reads the source queue with the function's role, and Lambda
# writes the function's logs with it.
# The layer's exec wrapper (infra/layer/sqs-triage-wrapper at the layer's root, /opt).
LAYER_WRAPPER = "/opt/sqs-triage-wrapper"
MAPPING_ACTIONS = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
LOG_ACTIONS = {"logs:CreateLogStream", "logs:PutLogEvents"}
# Which queue each SQS action of the function's code goes to (the source queue's URL is
# TRIAGE_QUEUE_URL, the DLQ's TRIAGE_DLQ_URL; see src/processor/mod.rs and src/runtime/env.rs).
QUEUES_OF_SQS_ACTION = {
    "sqs:ChangeMessageVisibility": {"source"},   # retries, deferrals, the heartbeat
    "sqs:DeleteMessage": {"source"},
    "sqs:ReceiveMessage": {"source"},
    "sqs:SendMessage": {"dlq"},                  # dead-lettered copies
    "sqs:GetQueueAttributes": {"source", "dlq"},  # start-up without TRIAGE_QUEUE_* / TRIAGE_DLQ_MAX_BYTES (the stacks set both)
}
# DynamoDB calls in this file go to TRIAGE_CHAOS_RECORD_TABLE (a test side table), not to the
# state table; the stacks do not set that variable, so they grant nothing for them.
CHAOS_RECORDER = "triage/src/demo/chaos.rs"
CHAOS_RECORD_ENV = "TRIAGE_CHAOS_RECORD_TABLE"


class Derived:
    """triage-lambda's SDK calls from the source, as per-resource IAM actions."""

    def __init__(self, root: Path):
        import lambda_calls

        self.calls, self.problems = lambda_calls.lambda_calls(root)
        self.table: set[str] = set()
        self.source: set[str] = set(MAPPING_ACTIONS)
        self.dlq: set[str] = set()
        self.chaos: set[str] = set()
        for c in self.calls:
            if c.action.startswith("dynamodb:"):
                (self.chaos if c.file == CHAOS_RECORDER else self.table).add(c.action)
            elif c.action in QUEUES_OF_SQS_ACTION:
                for q in QUEUES_OF_SQS_ACTION[c.action]:
                    (self.source if q == "source" else self.dlq).add(c.action)
            else:
                self.problems.append(f"{c.file}:{c.line} {c.action}: which resource? add it to QUEUES_OF_SQS_ACTION")

    def code_actions(self) -> set[str]:
        return {c.action for c in self.calls if c.file != CHAOS_RECORDER}

    def all_actions(self) -> set[str]:
        return self.table | self.source | self.dlq | LOG_ACTIONS

    def summary(self) -> str:
        seen = {}
        for c in self.calls:
            seen.setdefault(c.action, f"{c.action} ({c.op} in {c.file} fn {c.fn})")
        return "; ".join(seen[a] for a in sorted(seen))


# --------------------------------------------------------------------------- metrics the code emits

METRICS_RS = "src/effects/metrics.rs"
# The AWS metrics the dashboard and the alarms may name, per namespace, with the dimension that
# points them at this stack's resource.
AWS_METRICS = {
    "AWS/SQS": ("QueueName", {"ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible",
                              "ApproximateNumberOfMessagesDelayed", "ApproximateAgeOfOldestMessage",
                              "NumberOfMessagesSent", "NumberOfMessagesReceived", "NumberOfMessagesDeleted",
                              "NumberOfEmptyReceives", "SentMessageSize"}),
    "AWS/Lambda": ("FunctionName", {"Invocations", "Errors", "Throttles", "Duration", "ConcurrentExecutions",
                                    "DeadLetterErrors", "RecursiveInvocationsDropped"}),
}


class Emitted:
    """The EMF metrics triage-lambda writes (src/effects/metrics.rs and every `metrics.add(.., "Name", ..)`
    in src/): their namespace, the names written per job type (dimension JobType) and the names
    written without a dimension (the account-wide totals)."""

    def __init__(self, root: Path):
        text = (root / METRICS_RS).read_text()
        m = re.search(r'const NAMESPACE: &str = "(\w+)";', text)
        self.namespace = m.group(1) if m else None
        self.problems: list[str] = []
        per_type: set[str] = set()
        dec = re.search(r"pub fn decision\(.*?\n    \}\n", text, re.S)
        emf = re.search(r"pub fn emf_lines\(.*?\n    \}\n", text, re.S)
        if not dec or not emf:
            self.problems.append(f"{METRICS_RS}: no `fn decision` or `fn emf_lines` to read the names from")
            self.per_type, self.totals = set(), set()
            return
        per_type |= set(re.findall(r'"([A-Z][A-Za-z]+)"', dec.group(0)))
        for f in sorted((root / "src").rglob("*.rs")):
            per_type |= set(re.findall(r'\.add\(\s*[^;]*?,\s*"([A-Z][A-Za-z]+)"\s*,', f.read_text()))
        per_type |= set(re.findall(r'\("([A-Z][A-Za-z]+)", &m\.\w+\)', emf.group(0)))  # samples
        alarmed = re.findall(r"\[([^\]]*)\]\.contains\(k\)", emf.group(0))
        totals = set(re.findall(r'"(\w+)"', alarmed[0])) & per_type if alarmed else set()
        totals |= set(re.findall(r'\("([A-Z][A-Za-z]+)", self\.\w+\)', emf.group(0)))
        if not alarmed:
            self.problems.append(f"{METRICS_RS}: the account-wide totals' list was not found")
        self.per_type, self.totals = per_type, totals

    def exists(self, name: str, dims: tuple[str, ...]) -> bool:
        if dims == ("JobType",):
            return name in self.per_type
        if dims == ():
            return name in self.totals
        return False

    def summary(self) -> str:
        return (f"namespace {self.namespace}; per JobType {', '.join(sorted(self.per_type))}; "
                f"without dimension {', '.join(sorted(self.totals))}")


MAX_MESSAGE_SIZE = 1048576  # SQS's largest message, 1 MiB
# Lambda's application log levels (LoggingConfig.ApplicationLogLevel), least severe first.
LAMBDA_LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"]
_EMITTED: "Emitted | None" = None


def emitted() -> "Emitted":
    global _EMITTED
    if _EMITTED is None:
        _EMITTED = Emitted(ROOT)
    return _EMITTED


def builds_binary(crate: Path, binary: str) -> bool:
    """Whether `cargo lambda build --bin BINARY` run in `crate` builds it: a binary of the
    package there or of a default member of its workspace (the repository's root package is
    the library; the `triage` package beside it holds triage-lambda)."""
    dirs = [crate]
    if (crate / "Cargo.toml").is_file():
        workspace = tomllib.loads((crate / "Cargo.toml").read_text()).get("workspace", {})
        dirs += [crate / m for m in workspace.get("default-members", []) if m != "."]
    for d in dirs:
        if not (d / "Cargo.toml").is_file():
            continue
        toml = tomllib.loads((d / "Cargo.toml").read_text())
        bins = [b.get("name") for b in toml.get("bin", [])]
        if (d / "src/main.rs").is_file():  # the package's own binary, named after it
            bins.append(toml.get("package", {}).get("name"))
        if binary in bins:
            return True
    return False


def is_fifo(queue_props: dict) -> bool:
    return queue_props.get("FifoQueue") in (True, "true")


def esm_scaling_ok(esm: dict) -> bool:
    """Exactly one of ScalingConfig.MaximumConcurrency (2..1000) and ProvisionedPollerConfig (SQS's ranges)."""
    mc = esm.get("ScalingConfig", {}).get("MaximumConcurrency")
    pp = esm.get("ProvisionedPollerConfig")
    if (mc is None) == (pp is None):
        return False
    if mc is not None:
        return 2 <= num(mc) <= 1000
    lo, hi = num(pp.get("MinimumPollers", 2)), num(pp.get("MaximumPollers", 200))
    return 2 <= lo <= 200 and 2 <= hi <= 2000 and lo <= hi


SEARCH_RE = re.compile(r"""^SEARCH\('\{(?P<ns>[^,}]+)(?P<dims>(?:,[^,}]+)*)\} MetricName="(?P<name>\w+)"', '(?P<stat>[\w.]+)', (?P<period>\d+)\)$""")


def dashboard_metrics(body: dict) -> tuple[list[dict], list[str]]:
    """Every metric a dashboard body graphs, as {ns, name, dims: {name: value}, search: bool}, and
    the rows it cannot read."""
    out, bad = [], []
    for w in body.get("widgets", []):
        if w.get("type") != "metric":
            continue
        for row in w.get("properties", {}).get("metrics", []):
            if len(row) == 1 and isinstance(row[0], dict) and "expression" in row[0]:
                m = SEARCH_RE.match(row[0]["expression"])
                if not m:
                    bad.append(f"{w['properties'].get('title')}: expression {row[0]['expression']!r} is not a SEARCH "
                               "of one metric name")
                    continue
                dims = tuple(d for d in m.group("dims").split(",") if d)
                out.append({"ns": m.group("ns"), "name": m.group("name"), "dims": {d: None for d in dims},
                            "search": True, "title": w["properties"].get("title")})
                continue
            parts = [x for x in row if not isinstance(x, dict)]
            if len(parts) < 2 or len(parts) % 2 or "." in parts:
                bad.append(f"{w['properties'].get('title')}: row {row} (write every row in full, no '.')")
                continue
            out.append({"ns": parts[0], "name": parts[1], "dims": dict(zip(parts[2::2], parts[3::2])),
                        "search": False, "title": w["properties"].get("title")})
    return out, bad


# --------------------------------------------------------------------------- the receive rule

ROOT = Path(__file__).resolve().parent.parent
RUST_RULE = "triage/src/ops/setup.rs"
CDK_RULE = "infra/cdk/lib/sqs-triage.ts"
DOC_RULE = "docs/deploy.md"
SQS_MAX_RECEIVE_COUNT = 1000
# The retention rule (src/core/redrive.rs, docs/deploy.md): maxReceiveCount holds of the visibility
# timeout fit HOLDS_SHARE of the source queue's retention, and a standard DLQ keeps messages
# DLQ_RETENTION_MARGIN_S longer than its source (SQS keeps a moved message's enqueue time).
HOLDS_SHARE = (3, 4)
DLQ_RETENTION_MARGIN_S = 86400
VISIBILITY_FACTOR = 6  # the source queue's visibility timeout is 6 x the function timeout


def holds_fit(max_receive: int, visibility: int, retention: int) -> bool:
    return max_receive * visibility <= retention * HOLDS_SHARE[0] // HOLDS_SHARE[1]


def rust_factor(root: Path) -> int | None:
    m = re.search(r"pub const RECEIVES_PER_ATTEMPT: u32 = (\d+);", (root / RUST_RULE).read_text())
    return int(m.group(1)) if m else None


def cdk_factor(root: Path) -> int | None:
    text = (root / CDK_RULE).read_text()
    m = re.search(r"export const RECEIVES_PER_ATTEMPT = (\d+);", text)
    used = re.search(r"maxReceiveCount\s*<\s*RECEIVES_PER_ATTEMPT\s*\*\s*maxAttempts", text)
    return int(m.group(1)) if m and used else None


def doc_factor(root: Path) -> int | None:
    found = set(re.findall(r"`maxReceiveCount ≥ (\d+) × max attempts`", (root / DOC_RULE).read_text()))
    return int(found.pop()) if len(found) == 1 else None


class Params:
    """A template's parameters: which values CloudFormation accepts, and its Rules."""

    def __init__(self, raw: dict):
        self.decl = raw.get("Parameters", {})
        self.rules = raw.get("Rules", {})

    def accepts(self, name: str, value) -> bool:
        p = self.decl[name]
        v = str(value)
        if "AllowedValues" in p and v not in [str(a) for a in p["AllowedValues"]]:
            return False
        if p.get("Type") == "Number":
            try:
                x = float(v)
            except ValueError:
                return False
            if "MinValue" in p and x < float(p["MinValue"]):
                return False
            if "MaxValue" in p and x > float(p["MaxValue"]):
                return False
        if "AllowedPattern" in p and not re.fullmatch(p["AllowedPattern"], v):
            return False
        return True

    def rules_pass(self, values: dict) -> bool:
        def ev(x):
            if isinstance(x, dict) and len(x) == 1:
                (k, a), = x.items()
                if k == "Ref":
                    return str(values[a] if a in values else self.decl[a].get("Default", ""))
                if k == "Fn::Equals":
                    return str(ev(a[0])) == str(ev(a[1]))
                if k == "Fn::Not":
                    return not ev(a[0])
                if k == "Fn::And":
                    return all(ev(i) for i in a)
                if k == "Fn::Or":
                    return any(ev(i) for i in a)
                if k == "Fn::Contains":
                    return str(ev(a[1])) in [str(ev(i)) for i in a[0]]
                raise ValueError(f"rule function {k} is not evaluated by this check")
            return x

        for rule in self.rules.values():
            if "RuleCondition" in rule and not ev(rule["RuleCondition"]):
                continue
            if not all(ev(a["Assert"]) for a in rule.get("Assertions", [])):
                return False
        return True


def sam_rules(raw: dict, factor: int) -> dict:
    """The Rules that hold MaxReceiveCount >= factor x MaxAttempts, for the template's values.

    CloudFormation rules compare strings only, so MaxReceiveCount takes listed values and each
    rule names the MaxAttempts values whose smallest allowed count is the same."""
    params = Params(raw)
    counts = sorted(int(c) for c in params.decl["MaxReceiveCount"]["AllowedValues"])
    attempts = [a for a in range(1, SQS_MAX_RECEIVE_COUNT + 1) if params.accepts("MaxAttempts", a)]
    rules = {}
    for k, m in enumerate(counts):
        lower = counts[k - 1] if k else 0
        group = [a for a in attempts if lower < factor * a <= m]
        if not group or k == 0:
            continue  # the smallest allowed count suits them: nothing to assert
        # The shorter list: the counts allowed, or (MaxReceiveCount takes listed values only)
        # the counts refused.
        if len(counts[:k]) < len(counts[k:]):
            assertion = {"Fn::Not": [{"Fn::Contains": [[str(c) for c in counts[:k]], {"Ref": "MaxReceiveCount"}]}]}
        else:
            assertion = {"Fn::Contains": [[str(c) for c in counts[k:]], {"Ref": "MaxReceiveCount"}]}
        rules[f"ReceivesFor{group[0]}To{group[-1]}Attempts" if len(group) > 1 else f"ReceivesFor{group[0]}Attempts"] = {
            "RuleCondition": {"Fn::Contains": [[str(a) for a in group], {"Ref": "MaxAttempts"}]},
            "Assertions": [{
                "Assert": assertion,
                "AssertDescription": f"MaxReceiveCount must be at least {factor} x MaxAttempts "
                                     f"({m} or more for {group[0]}" + (f" to {group[-1]}" if len(group) > 1 else "")
                                     + " attempts): deferrals count as receives",
            }],
        }
    return rules


def sam_retention_rules(raw: dict) -> dict:
    """The Rules that hold MaxReceiveCount x 6 x FunctionTimeout within 3/4 of SourceRetentionSeconds.

    One rule per FunctionTimeout that some retention refuses counts for; one assertion per group
    of retentions that allow the same largest count."""
    params = Params(raw)
    counts = sorted(int(c) for c in params.decl["MaxReceiveCount"]["AllowedValues"])
    timeouts = sorted(int(v) for v in params.decl["FunctionTimeout"]["AllowedValues"])
    retentions = sorted(int(v) for v in params.decl["SourceRetentionSeconds"]["AllowedValues"])
    rules = {}
    for timeout in timeouts:
        visibility = VISIBILITY_FACTOR * timeout
        groups: dict[int, list[int]] = {}
        for r in retentions:
            allowed = [c for c in counts if holds_fit(c, visibility, r)]
            if len(allowed) < len(counts):
                groups.setdefault(len(allowed), []).append(r)
        assertions = []
        for k, group in sorted(groups.items()):
            allowed, refused = counts[:k], counts[k:]
            retention_is = {"Fn::Contains": [[str(r) for r in group], {"Ref": "SourceRetentionSeconds"}]}
            if not allowed:
                assertions.append({
                    "Assert": {"Fn::Not": [retention_is]},
                    "AssertDescription": f"SourceRetentionSeconds ({', '.join(map(str, group))}) is too short for even "
                                         f"{counts[0]} receives of {visibility} s (6 x FunctionTimeout {timeout}) within 3/4 "
                                         "of it: retention would delete a message no consumer settles before SQS moves it",
                })
                continue
            if len(refused) <= len(allowed):
                fits = {"Fn::Not": [{"Fn::Contains": [[str(c) for c in refused], {"Ref": "MaxReceiveCount"}]}]}
            else:
                fits = {"Fn::Contains": [[str(c) for c in allowed], {"Ref": "MaxReceiveCount"}]}
            assertions.append({
                "Assert": {"Fn::Or": [{"Fn::Not": [retention_is]}, fits]},
                "AssertDescription": f"MaxReceiveCount x {visibility} s (6 x FunctionTimeout {timeout}) must fit 3/4 of "
                                     f"SourceRetentionSeconds ({', '.join(map(str, group))}): MaxReceiveCount at most {allowed[-1]}, "
                                     "or retention deletes a message no consumer settles before SQS moves it to the DLQ",
            })
        if assertions:
            rules[f"RetentionForTimeout{timeout}"] = {
                "RuleCondition": {"Fn::Equals": [{"Ref": "FunctionTimeout"}, str(timeout)]},
                "Assertions": assertions,
            }
    return rules


GENERATED_RULES = ("ReceivesFor", "RetentionFor")

KEPT_RULES_COMMENT = "# Not generated (kept as they are by `sam-rules`): what a FIFO source's mapping accepts."


def write_sam_rules(sam_path: Path, factor: int) -> None:
    """Rewrites the generated `Rules:` section of the SAM template in place."""
    text = sam_path.read_text()
    rules = sam_rules(load_yaml_template(sam_path), factor)
    lines = ["Rules:",
             f"  # Generated by `python3 infra/check_templates.py sam-rules`: MaxReceiveCount >= {factor} x",
             "  # MaxAttempts (docs/deploy.md, the receive rule). CloudFormation rules compare strings only,",
             "  # so each rule lists the MaxAttempts values that need the same smallest MaxReceiveCount."]
    def flow(x) -> str:  # one-line YAML (JSON is YAML)
        return json.dumps(x, separators=(", ", ": "))

    def emit(name, r):
        out = [f"  {name}:",
               f"    RuleCondition: {flow(r['RuleCondition'])}",
               "    Assertions:"]
        for a in r["Assertions"]:
            out += [f"      - Assert: {flow(a['Assert'])}",
                    f"        AssertDescription: {json.dumps(a['AssertDescription'])}"]
        return out

    for name, r in rules.items():
        lines += emit(name, r)
    retention = sam_retention_rules(load_yaml_template(sam_path))
    lines += ["  # Generated too: MaxReceiveCount x the visibility timeout (6 x FunctionTimeout) within 3/4 of",
              "  # SourceRetentionSeconds (docs/deploy.md, the retention rule), one rule per FunctionTimeout."]
    for name, r in retention.items():
        lines += emit(name, r)
    # The template's other rules (the FIFO ones) are kept as they are, after the generated ones.
    kept = {k: v for k, v in load_yaml_template(sam_path).get("Rules", {}).items() if not k.startswith(GENERATED_RULES)}
    if kept:
        lines.append(f"  {KEPT_RULES_COMMENT}")
        for name, r in kept.items():
            lines += emit(name, r)
    block = "\n".join(lines) + "\n\n"
    m = re.search(r"^Rules:\n(?:(?:[ #].*)?\n)*", text, re.M)
    if m:
        text = text[:m.start()] + block + text[m.end():]
    else:
        at = re.search(r"^Mappings:", text, re.M).start()
        text = text[:at] + block + text[at:]
    sam_path.write_text(text)
    print(f"wrote {len(rules) + len(retention)} rules to {sam_path}")


def config_ranges(limits: dict) -> dict[str, tuple[str, str, bool]]:
    """TRIAGE_* variable -> (min, max, whole) as src/config.rs parses them (its limits JSON)."""
    return {v["var"]: (v["min"], v["max"], bool(v["whole"])) for v in limits["variables"]}


def rule_facts(root: Path, sam_raw: dict, limits: dict, report: Report) -> int | None:
    """The one receive rule: setup, CDK, SAM and the docs agree. Returns the factor."""
    rf, cf, df = rust_factor(root), cdk_factor(root), doc_factor(root)
    report.fact(f"[rule] one factor for maxReceiveCount >= F x max attempts: {RUST_RULE} RECEIVES_PER_ATTEMPT, "
                f"{CDK_RULE} RECEIVES_PER_ATTEMPT (and its check), {DOC_RULE}",
                rf is not None and rf == cf == df, f"setup {rf}, CDK {cf}, docs {df}")
    factor = rf or cf or df
    if factor is None:
        return None
    params = Params(sam_raw)

    def sam_rule():
        if not params.rules:
            return False, "the template has no Rules"
        attempts = [a for a in range(0, 1002) if params.accepts("MaxAttempts", a)]
        counts = [m for m in range(0, 1002) if params.accepts("MaxReceiveCount", m)]
        wrong = [(a, m) for a in attempts for m in counts
                 if params.rules_pass({"MaxAttempts": a, "MaxReceiveCount": m}) != (m >= factor * a)]
        stranded = [a for a in attempts if not any(m >= factor * a for m in counts)]
        return not wrong and not stranded and bool(attempts) and bool(counts), (
            f"{len(wrong)} wrong verdicts, e.g. {wrong[:5]} (MaxAttempts, MaxReceiveCount); "
            f"MaxAttempts with no allowed MaxReceiveCount: {stranded[:5]}")

    report.check(f"[sam] Rules accept exactly MaxReceiveCount >= {factor} x MaxAttempts, over every allowed pair", sam_rule)

    def retention_rule():
        timeouts = [int(v) for v in params.decl["FunctionTimeout"]["AllowedValues"]]
        counts = [m for m in range(0, 1002) if params.accepts("MaxReceiveCount", m)]
        retentions = [r for r in range(60, 1_209_601, 60) if params.accepts("SourceRetentionSeconds", r)]
        wrong, stranded = [], []
        for t in timeouts:
            for r in retentions:
                verdicts = [params.rules_pass({"FunctionTimeout": t, "MaxReceiveCount": m, "SourceRetentionSeconds": r,
                                               "MaxAttempts": 1}) for m in counts]
                wrong += [(t, m, r) for m, ok in zip(counts, verdicts) if ok != holds_fit(m, VISIBILITY_FACTOR * t, r)]
        for r in retentions:
            if r + DLQ_RETENTION_MARGIN_S > 1_209_600:
                stranded.append(r)
        return not wrong and not stranded and bool(retentions), (
            f"{len(wrong)} wrong verdicts, e.g. {wrong[:5]} (FunctionTimeout, MaxReceiveCount, SourceRetentionSeconds); "
            f"retentions the 14-day DLQ does not outlive by a day: {stranded[:5]}")

    report.check("[sam] Rules accept exactly MaxReceiveCount x 6 x FunctionTimeout <= 3/4 x SourceRetentionSeconds, over "
                 "every allowed triple, and every allowed retention leaves the 14-day DLQ a day more", retention_rule)

    def ranges():
        cfg = config_ranges(limits)
        fn = next(r for r in sam_raw["Resources"].values() if r["Type"] == "AWS::Serverless::Function")
        env = fn["Properties"]["Environment"]["Variables"]
        bad, seen = [], 0
        for var, v in env.items():
            if not (isinstance(v, dict) and "Ref" in v and v["Ref"] in params.decl and var in cfg):
                continue
            seen += 1
            name, (lo, hi, whole) = v["Ref"], cfg[var]
            conv = int if whole else float
            lo, hi = conv(lo), conv(hi)
            if var == "TRIAGE_MAX_ATTEMPTS":
                hi = min(hi, SQS_MAX_RECEIVE_COUNT // factor)  # the receive rule's cap
            step = 1 if whole else 0.01
            probes = [(lo, True), (hi, True), (round(lo - step, 2), False), (round(hi + step, 2), False),
                      ("abc", False), ("", False)]
            if whole:  # what the function's integer parser refuses
                probes += [(f"{lo}.5", False), (f"{hi}.0", False), ("1e1", False), ("0x10", False)]
            else:
                probes += [((lo + hi) / 2, True)]
            for value, want in probes:
                if params.accepts(name, value) != want:
                    bad.append(f"{name} ({var} {lo}..{hi}) {'refuses' if want else 'accepts'} {value!r}")
        return not bad and seen >= 9, "; ".join(bad) or f"{seen} parameters"

    report.check("[sam] policy parameters accept exactly what src/config.rs accepts: its ranges, whole numbers "
                 f"where it wants them (MaxAttempts up to {SQS_MAX_RECEIVE_COUNT} / {factor})", ranges)
    return factor


def generated_facts(limits: dict, report: Report) -> None:
    """The templates' policy ranges are what infra/ranges.py generates from src/config.rs."""
    import ranges

    rs = ranges.ranges_of(limits)
    sam_text = ranges.SAM.read_text()
    params = ranges.sam_env_params(sam_text)
    deployed = [v for v in rs if v in params]
    report.fact("[ranges] every numeric variable of src/config.rs is a SAM parameter or listed in "
                "infra/ranges.py NOT_DEPLOYED", (set(rs) - set(params)) == set(ranges.NOT_DEPLOYED)
                and set(params) <= set(rs),
                f"parameters {sorted(params)}, not deployed {sorted(ranges.NOT_DEPLOYED)}, config {sorted(rs)}")
    want = {
        ranges.SAM: ranges.generate_sam(sam_text, rs),
        ranges.CDK: ranges.generate_cdk(ranges.CDK.read_text(), ranges.generate_cdk_block(
            deployed, rs, limits, ranges.stack_settings(ranges.load_sam(sam_text)))),
        ranges.CDK_JSON: ranges.generate_cdk_json(ranges.CDK_JSON.read_text(), deployed, rs),
    }
    for path, text in want.items():
        have = path.read_text()
        diff = [ln for ln in difflib.unified_diff(have.splitlines(), text.splitlines(), lineterm="", n=0)
                if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
        report.fact(f"[ranges] {path.relative_to(ROOT)}: policy ranges and defaults are the ones generated from "
                    "src/config.rs (`infra/ranges.py --write` rewrites them)", have == text, " | ".join(diff[:12]))


# --------------------------------------------------------------------------- translation

def load_yaml_template(path: Path) -> dict:
    from samtranslator.yaml_helper import yaml_parse  # handles !Ref, !Sub, ...

    return yaml_parse(path.read_text())


def translate(sam_path: Path, out_path: Path) -> None:
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    from samtranslator.translator.transform import transform

    template = load_yaml_template(sam_path)
    for res in template.get("Resources", {}).values():
        if res.get("Type") == "AWS::Serverless::Function":
            uri = res.get("Properties", {}).get("CodeUri")
            # A local folder, or the CrateDir parameter: `sam build` resolves both to a folder.
            if (isinstance(uri, str) and not uri.startswith("s3://")) or (isinstance(uri, dict) and "Ref" in uri):
                res["Properties"]["CodeUri"] = "s3://offline-check-bucket/triage-lambda.zip"
        if res.get("Type") == "AWS::Serverless::LayerVersion":
            uri = res.get("Properties", {}).get("ContentUri")
            # The layer build's zip (infra/layer/build.sh): `sam package` uploads it.
            if isinstance(uri, str) and not uri.startswith("s3://"):
                res["Properties"]["ContentUri"] = "s3://offline-check-bucket/sqs-triage-layer.zip"

    class NoManagedPolicies:  # offline: the template names no managed policy to look up
        def load(self):
            return {}

    cfn = transform(template, {}, NoManagedPolicies())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(cfn, indent=1, default=str))
    print(f"translated {sam_path} -> {out_path} ({len(cfn.get('Resources', {}))} resources)")


# --------------------------------------------------------------------------- evaluation

class Template:
    """A CloudFormation template with intrinsic functions resolved to concrete values."""

    def __init__(self, raw: dict, overrides: dict | None = None):
        self.raw = raw
        self.resources = raw.get("Resources", {})
        self.params = {}
        for name, p in raw.get("Parameters", {}).items():
            if "Default" in p:
                self.params[name] = str(p["Default"])
        for k, v in (overrides or {}).items():
            self.params[k] = str(v)
        self.pseudo = {
            "AWS::StackName": STACK,
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/x",
            "AWS::NoValue": NOVALUE,
        }
        self._names: dict[str, str] = {}

    # -- names and attributes of resources, as CloudFormation would make them
    def name_of(self, rid: str) -> str:
        if rid in self._names:
            return self._names[rid]
        res = self.resources[rid]
        props = res.get("Properties", {})
        key = {
            "AWS::SQS::Queue": "QueueName",
            "AWS::DynamoDB::Table": "TableName",
            "AWS::Logs::LogGroup": "LogGroupName",
            "AWS::Lambda::Function": "FunctionName",
            "AWS::IAM::Role": "RoleName",
            "AWS::CloudWatch::Dashboard": "DashboardName",
        }.get(res["Type"])
        name = self.ev(props[key]) if key and key in props else f"{STACK}-{rid}"
        self._names[rid] = name
        return name

    def ref(self, rid: str):
        if rid in self.pseudo:
            return self.pseudo[rid]
        if rid in self.params:
            return self.params[rid]
        if rid not in self.resources:
            raise KeyError(f"Ref to unknown {rid}")
        t = self.resources[rid]["Type"]
        if t == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{self.name_of(rid)}"
        if t in ("AWS::DynamoDB::Table", "AWS::Logs::LogGroup", "AWS::Lambda::Function", "AWS::IAM::Role",
                 "AWS::CloudWatch::Dashboard"):
            return self.name_of(rid)
        return f"ref:{rid}"

    def getatt(self, rid: str, attr: str):
        t = self.resources[rid]["Type"]
        if t == "AWS::SQS::Queue":
            name = self.name_of(rid)
            return {
                "Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}",
                "QueueName": name,
                "QueueUrl": self.ref(rid),
            }[attr]
        if t == "AWS::DynamoDB::Table" and attr == "Arn":
            return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{self.name_of(rid)}"
        if t == "AWS::Logs::LogGroup" and attr == "Arn":
            return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{self.name_of(rid)}:*"
        if t == "AWS::IAM::Role" and attr == "Arn":
            return f"arn:aws:iam::{ACCOUNT}:role/{self.name_of(rid)}"
        if t == "AWS::Lambda::Function" and attr == "Arn":
            return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.name_of(rid)}"
        return f"getatt:{rid}.{attr}"

    def condition(self, name: str) -> bool:
        return bool(self.ev(self.raw["Conditions"][name]))

    def sub(self, text: str, variables: dict) -> str:
        def repl(m):
            expr = m.group(1)
            if expr.startswith("!"):
                return "${" + expr[1:] + "}"
            if expr in variables:
                return str(self.ev(variables[expr]))
            if "." in expr and expr.split(".", 1)[0] in self.resources:
                rid, attr = expr.split(".", 1)
                return str(self.getatt(rid, attr))
            return str(self.ref(expr))

        return re.sub(r"\$\{([^}]+)\}", repl, text)

    def ev(self, x):
        if isinstance(x, list):
            return [v for v in (self.ev(i) for i in x) if v is not NOVALUE]
        if not isinstance(x, dict):
            return x
        if len(x) == 1:
            (k, v), = x.items()
            if k == "Ref":
                return self.ref(v)
            if k == "Fn::GetAtt":
                rid, attr = (v.split(".", 1) if isinstance(v, str) else v)
                return self.getatt(rid, attr)
            if k == "Fn::Sub":
                if isinstance(v, str):
                    return self.sub(v, {})
                return self.sub(v[0], v[1])
            if k == "Fn::Join":
                return str(v[0]).join(str(i) for i in self.ev(v[1]))
            if k == "Fn::Select":
                return self.ev(v[1])[int(self.ev(v[0]))]
            if k == "Fn::Split":
                return str(self.ev(v[1])).split(v[0])
            if k == "Fn::FindInMap":
                m, a, b = (self.ev(i) for i in v)
                return self.raw["Mappings"][m][str(a)][str(b)]
            if k == "Fn::If":
                return self.ev(v[1] if self.condition(v[0]) else v[2])
            if k == "Fn::Equals":
                a, b = (self.ev(i) for i in v)
                return str(a) == str(b)
            if k == "Fn::Not":
                return not self.ev(v[0])
            if k == "Fn::And":
                return all(self.ev(i) for i in v)
            if k == "Fn::Or":
                return any(self.ev(i) for i in v)
            if k == "Condition":
                return self.condition(v)
        return {k: v for k, v in ((k, self.ev(v)) for k, v in x.items()) if v is not NOVALUE}

    # -- lookups
    def of_type(self, t: str) -> list[str]:
        return [rid for rid, r in self.resources.items() if r.get("Type") == t]

    def props(self, rid: str) -> dict:
        return self.ev(self.resources[rid].get("Properties", {}))


# --------------------------------------------------------------------------- checks

class Report:
    def __init__(self, quiet: bool = False):
        self.passed = 0
        self.failed = 0
        self.quiet = quiet
        self.failures: list[str] = []

    def fact(self, label: str, ok: bool, detail: str = "") -> None:
        if ok:
            self.passed += 1
            if not self.quiet:
                print(f"ok   {label}")
        else:
            self.failed += 1
            self.failures.append(label)
            if not self.quiet:
                print(f"FAIL {label}{': ' + detail if detail else ''}")

    def check(self, label: str, fn) -> None:
        try:
            ok, detail = fn()
        except Exception as e:  # a missing resource or property is a failed fact
            ok, detail = False, f"{type(e).__name__}: {e}"
        self.fact(label, ok, detail)


def as_list(v):
    return v if isinstance(v, list) else [v]


def num(v) -> float:
    return float(v)


def parse_json_prop(v):
    return json.loads(v) if isinstance(v, str) else v


class Facts:
    """The shared facts, asserted on one evaluated template."""

    def __init__(self, tag: str, tpl: Template, report: Report, derived: "Derived | None" = None,
                 factor: int | None = None, limits: dict | None = None, fifo: bool | None = None,
                 runtime: str = "rust"):
        self.tag = tag
        # "rust": triage-lambda itself; a Lambda runtime (python3.13, nodejs22.x): a handler in that
        # runtime through the sqs-triage layer.
        self.runtime = runtime
        # The variant this template must be: FIFO queues (True), standard ones (False), either (None).
        self.fifo = fifo
        self.limits = limits or {"variables": []}
        self.t = tpl
        self.r = report
        self.derived = derived
        self.factor = factor
        funcs = tpl.of_type("AWS::Lambda::Function")
        if len(funcs) != 1:
            raise SystemExit(f"[{tag}] expected exactly one Lambda function, found {funcs}")
        self.fn = funcs[0]
        esms = tpl.of_type("AWS::Lambda::EventSourceMapping")
        if len(esms) != 1:
            raise SystemExit(f"[{tag}] expected exactly one event source mapping, found {esms}")
        self.esm = esms[0]
        # The source queue is the one the mapping reads; the DLQ is its redrive target.
        src_arn = tpl.props(self.esm)["EventSourceArn"]
        queues = tpl.of_type("AWS::SQS::Queue")
        self.src = next(q for q in queues if tpl.getatt(q, "Arn") == src_arn)
        dlq_arn = parse_json_prop(tpl.props(self.src)["RedrivePolicy"])["deadLetterTargetArn"]
        self.dlq = next(q for q in queues if tpl.getatt(q, "Arn") == dlq_arn)
        tables = tpl.of_type("AWS::DynamoDB::Table")
        if len(tables) != 1:
            raise SystemExit(f"[{tag}] expected exactly one table, found {tables}")
        self.table = tables[0]
        self.fnp = tpl.props(self.fn)
        self.env = self.fnp.get("Environment", {}).get("Variables", {})

    def c(self, label, fn):
        self.r.check(f"[{self.tag}] {label}", fn)

    def run(self):
        t = self.t
        src_arn = t.getatt(self.src, "Arn")
        dlq_arn = t.getatt(self.dlq, "Arn")
        table_arn = t.getatt(self.table, "Arn")

        if self.runtime == "rust":
            self.c("function runs provided.al2023 on arm64 with handler bootstrap", lambda: (
                self.fnp.get("Runtime") == "provided.al2023"
                and self.fnp.get("Architectures") == ["arm64"]
                and self.fnp.get("Handler") == "bootstrap"
                and not self.fnp.get("Layers"),
                f"{self.fnp.get('Runtime')} {self.fnp.get('Architectures')} {self.fnp.get('Handler')}"))
        else:
            self.layer_facts()

        esm = t.props(self.esm)
        self.c("event source mapping reads the source queue into the function", lambda: (
            esm["EventSourceArn"] == src_arn and esm["FunctionName"] in (
                self.fnp.get("FunctionName"), t.ref(self.fn), t.getatt(self.fn, "Arn")),
            f"{esm.get('EventSourceArn')} -> {esm.get('FunctionName')}"))
        self.c("event source mapping has ReportBatchItemFailures on", lambda: (
            "ReportBatchItemFailures" in esm.get("FunctionResponseTypes", []),
            f"FunctionResponseTypes={esm.get('FunctionResponseTypes')}"))
        src_fifo = is_fifo(t.props(self.src))
        self.c("event source mapping sets batch size, batching window (none on a FIFO source, which takes at most "
               "10 records) and maximum concurrency", lambda: (
            1 <= num(esm["BatchSize"]) <= (10 if src_fifo else 10000)
            and (("MaximumBatchingWindowInSeconds" not in esm) if src_fifo
                 else 0 <= num(esm["MaximumBatchingWindowInSeconds"]) <= 300
                 and (num(esm["BatchSize"]) <= 10 or num(esm["MaximumBatchingWindowInSeconds"]) >= 1))
            and 2 <= num(esm["ScalingConfig"]["MaximumConcurrency"]) <= 1000,
            json.dumps({k: esm.get(k) for k in ("BatchSize", "MaximumBatchingWindowInSeconds", "ScalingConfig")})))
        self.c("event source mapping: exactly one of MaximumConcurrency and provisioned pollers (SQS: 2 to 200 "
               "minimum, up to 2000 maximum, minimum <= maximum)", lambda: (esm_scaling_ok(esm), json.dumps(
                   {k: esm.get(k) for k in ("ScalingConfig", "ProvisionedPollerConfig")})))
        self.c("event source mapping reports its event counts (MetricsConfig EventCount)", lambda: (
            "EventCount" in esm.get("MetricsConfig", {}).get("Metrics", []), json.dumps(esm.get("MetricsConfig"))))

        srcp = t.props(self.src)
        dlqp = t.props(self.dlq)
        self.c("source queue visibility timeout >= 6 x function timeout", lambda: (
            num(srcp["VisibilityTimeout"]) >= 6 * num(self.fnp["Timeout"]),
            f"visibility {srcp.get('VisibilityTimeout')} s, timeout {self.fnp.get('Timeout')} s"))
        self.c(f"source queue redrives to the DLQ with maxReceiveCount >= {self.factor} x TRIAGE_MAX_ATTEMPTS", lambda: (
            self.factor is not None
            and (rp := parse_json_prop(srcp["RedrivePolicy"]))["deadLetterTargetArn"] == dlq_arn
            and num(rp["maxReceiveCount"]) >= self.factor * num(self.env["TRIAGE_MAX_ATTEMPTS"]),
            json.dumps(srcp.get("RedrivePolicy"))))
        self.c("DLQ redrive-allow policy admits the source queue only", lambda: (
            (ra := parse_json_prop(dlqp["RedriveAllowPolicy"]))["redrivePermission"] == "byQueue"
            and ra["sourceQueueArns"] == [src_arn],
            json.dumps(dlqp.get("RedriveAllowPolicy"))))
        self.c("both queues are encrypted at rest", lambda: (
            all(p.get("SqsManagedSseEnabled") in (True, "true") or p.get("KmsMasterKeyId")
                for p in (srcp, dlqp)), ""))
        self.c("both queues deny requests without TLS", self.tls_only)
        self.c(f"both queues take SQS's largest message ({MAX_MESSAGE_SIZE} bytes, 1 MiB)", lambda: (
            all(num(p.get("MaximumMessageSize", 0)) == MAX_MESSAGE_SIZE for p in (srcp, dlqp)),
            f"source {srcp.get('MaximumMessageSize')} dlq {dlqp.get('MaximumMessageSize')}"))
        self.c("DLQ's MaximumMessageSize is never below the source queue's (every dead-lettered copy fits)", lambda: (
            # Unset, the resource default applies: 1 MiB (it was 256 KiB before SQS raised its limit).
            num(dlqp.get("MaximumMessageSize", MAX_MESSAGE_SIZE)) >= num(srcp.get("MaximumMessageSize", MAX_MESSAGE_SIZE)),
            f"source {srcp.get('MaximumMessageSize')} dlq {dlqp.get('MaximumMessageSize')}"))
        self.c("TRIAGE_DLQ_MAX_BYTES is the DLQ's MaximumMessageSize (start-up then reads no size from the DLQ)", lambda: (
            # Unset on the DLQ, the resource default applies: 1 MiB.
            "TRIAGE_DLQ_MAX_BYTES" in self.env
            and num(self.env["TRIAGE_DLQ_MAX_BYTES"]) == num(dlqp.get("MaximumMessageSize", MAX_MESSAGE_SIZE)),
            f"TRIAGE_DLQ_MAX_BYTES {self.env.get('TRIAGE_DLQ_MAX_BYTES')} dlq {dlqp.get('MaximumMessageSize')}"))
        queue_vars = ("TRIAGE_QUEUE_RETENTION_S", "TRIAGE_QUEUE_VISIBILITY_S", "TRIAGE_QUEUE_MAX_RECEIVE")
        self.c("TRIAGE_QUEUE_RETENTION_S, _VISIBILITY_S and _MAX_RECEIVE are the source queue's (start-up then reads no queue)", lambda: (
            # Unset on the queue, the resource defaults apply: 4 days, 30 s.
            all(k in self.env for k in queue_vars)
            and num(self.env["TRIAGE_QUEUE_RETENTION_S"]) == num(srcp.get("MessageRetentionPeriod", 345600))
            and num(self.env["TRIAGE_QUEUE_VISIBILITY_S"]) == num(srcp.get("VisibilityTimeout", 30))
            and num(self.env["TRIAGE_QUEUE_MAX_RECEIVE"]) == num(parse_json_prop(srcp["RedrivePolicy"])["maxReceiveCount"]),
            f"{ {k: self.env.get(k) for k in queue_vars} } source retention {srcp.get('MessageRetentionPeriod')} "
            f"visibility {srcp.get('VisibilityTimeout')} redrive {json.dumps(srcp.get('RedrivePolicy'))}"))
        self.fifo_facts(srcp, dlqp)
        self.c("DLQ keeps messages 14 days, source queue 10 days", lambda: (
            num(dlqp["MessageRetentionPeriod"]) == 1209600 and num(srcp["MessageRetentionPeriod"]) == 864000,
            f"dlq {dlqp.get('MessageRetentionPeriod')} source {srcp.get('MessageRetentionPeriod')}"))
        self.c("maxReceiveCount x the visibility timeout fits 3/4 of the source queue's retention, and a standard "
               "DLQ keeps messages a day longer than its source (the retention rule)", lambda: (
            holds_fit(int(num(parse_json_prop(srcp["RedrivePolicy"])["maxReceiveCount"])),
                      int(num(srcp.get("VisibilityTimeout", 30))), int(num(srcp.get("MessageRetentionPeriod", 345600))))
            and (is_fifo(srcp) or num(dlqp.get("MessageRetentionPeriod", 345600))
                 >= num(srcp.get("MessageRetentionPeriod", 345600)) + DLQ_RETENTION_MARGIN_S),
            f"maxReceiveCount {parse_json_prop(srcp['RedrivePolicy']).get('maxReceiveCount')} visibility "
            f"{srcp.get('VisibilityTimeout')} retention {srcp.get('MessageRetentionPeriod')} dlq "
            f"{dlqp.get('MessageRetentionPeriod')}"))

        tp = t.props(self.table)
        self.c("state table: pk/sk strings, on-demand, TTL on expires_at, point-in-time recovery set", lambda: (
            sorted((a["AttributeName"], a["AttributeType"]) for a in tp["AttributeDefinitions"]) == [("pk", "S"), ("sk", "S")]
            and {k["KeyType"]: k["AttributeName"] for k in tp["KeySchema"]} == {"HASH": "pk", "RANGE": "sk"}
            and tp["BillingMode"] == "PAY_PER_REQUEST"
            and tp["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
            and tp["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] in (True, "true"),
            json.dumps(tp)))

        self.c("variables name the created queue, DLQ and table", lambda: (
            self.env.get("TRIAGE_QUEUE_URL") == t.ref(self.src)
            and self.env.get("TRIAGE_DLQ_URL") == t.ref(self.dlq)
            and self.env.get("TRIAGE_TABLE") == t.ref(self.table),
            json.dumps({k: self.env.get(k) for k in ("TRIAGE_QUEUE_URL", "TRIAGE_DLQ_URL", "TRIAGE_TABLE")})))
        defaults = {v["var"]: v["default"] for v in self.limits["variables"]}
        self.c("policy variables TRIAGE_* are set with src/config.rs's defaults", lambda: (
            {k: str(self.env.get(k)) for k in POLICY_VARS} == {k: defaults[k] for k in POLICY_VARS},
            json.dumps({k: [self.env.get(k), defaults.get(k)] for k in POLICY_VARS})))

        lc = self.fnp.get("LoggingConfig", {})
        self.c("function logs JSON lines at an application log level (LoggingConfig: LogFormat JSON, "
               "ApplicationLogLevel one of Lambda's, SystemLogLevel INFO), into its log group", lambda: (
                   lc.get("LogFormat") == "JSON" and lc.get("ApplicationLogLevel") in LAMBDA_LOG_LEVELS
                   and lc.get("SystemLogLevel") == "INFO"
                   and lc.get("LogGroup") in [t.ref(g) for g in t.of_type("AWS::Logs::LogGroup")],
                   json.dumps(lc)))

        self.iam_facts(src_arn, dlq_arn, table_arn)
        self.alarm_facts()
        self.dashboard_facts()

        outs = {k: t.ev(v["Value"]) for k, v in t.raw.get("Outputs", {}).items()}
        self.c("outputs: queue URL, DLQ URL, table name", lambda: (
            outs.get("QueueUrl") == t.ref(self.src)
            and outs.get("DlqUrl") == t.ref(self.dlq)
            and outs.get("TableName") == t.ref(self.table),
            json.dumps(outs)))

    def layer_facts(self) -> None:
        t, fnp = self.t, self.fnp
        layers = t.of_type("AWS::Lambda::LayerVersion")
        lp = t.props(layers[0]) if len(layers) == 1 else {}
        self.c(f"function runs {self.runtime} on arm64 (handler handler.handler) with the stack's one layer, its "
               "architecture and runtime the function's", lambda: (
            fnp.get("Runtime") == self.runtime and fnp.get("Architectures") == ["arm64"]
            and fnp.get("Handler") == "handler.handler"
            and len(layers) == 1 and fnp.get("Layers") == [t.ref(layers[0])]
            and lp.get("CompatibleArchitectures") == fnp.get("Architectures")
            and lp.get("CompatibleRuntimes") == [fnp.get("Runtime")],
            f"{fnp.get('Runtime')} {fnp.get('Architectures')} {fnp.get('Handler')} layers {fnp.get('Layers')} "
            f"of {layers}: {json.dumps({k: lp.get(k) for k in ('CompatibleArchitectures', 'CompatibleRuntimes')})}"))
        self.c(f"function runs through the layer's wrapper (AWS_LAMBDA_EXEC_WRAPPER={LAYER_WRAPPER}) and names its "
               "job types (TRIAGE_JOB_TYPES)", lambda: (
            self.env.get("AWS_LAMBDA_EXEC_WRAPPER") == LAYER_WRAPPER
            and bool(re.fullmatch(r"[^,\s]+(,[^,\s]+)*", str(self.env.get("TRIAGE_JOB_TYPES", "")))),
            json.dumps({k: self.env.get(k) for k in ("AWS_LAMBDA_EXEC_WRAPPER", "TRIAGE_JOB_TYPES")})))
        self.c("the layer is deleted with its stack (no retained layer versions)", lambda: (
            self.t.resources[layers[0]].get("DeletionPolicy", "Delete") == "Delete", json.dumps(
                {k: self.t.resources[layers[0]].get(k) for k in ("DeletionPolicy", "UpdateReplacePolicy")})))

    def fifo_facts(self, srcp: dict, dlqp: dict) -> None:
        t = self.t
        names = {"source": t.getatt(self.src, "QueueName"), "dlq": t.getatt(self.dlq, "QueueName")}
        kinds = {"source": is_fifo(srcp), "dlq": is_fifo(dlqp)}
        detail = json.dumps({k: {"name": names[k], "FifoQueue": p.get("FifoQueue"),
                                 "ContentBasedDeduplication": p.get("ContentBasedDeduplication")}
                             for k, p in (("source", srcp), ("dlq", dlqp))})
        want = {True: "FIFO", False: "standard", None: "FIFO or standard"}[self.fifo]
        self.c(f"queues: both {want}, FIFO together (the DLQ FIFO exactly when its source is)", lambda: (
            kinds["source"] == kinds["dlq"] and (self.fifo is None or kinds["source"] == self.fifo), detail))
        self.c("queues: a name ends .fifo exactly when the queue is FIFO", lambda: (
            all(names[k].endswith(".fifo") == kinds[k] for k in names), detail))
        self.c("queues: content-based deduplication off (ContentBasedDeduplication false on a FIFO queue, unset on "
               "a standard one)", lambda: (
            all(p.get("ContentBasedDeduplication") in ((False, "false") if kinds[k] else (None,))
                for k, p in (("source", srcp), ("dlq", dlqp))), detail))

    def tls_only(self):
        covered = set()
        for pid in self.t.of_type("AWS::SQS::QueuePolicy"):
            p = self.t.props(pid)
            for st in p["PolicyDocument"]["Statement"]:
                if (st.get("Effect") == "Deny"
                        and st.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") in ("false", False)
                        and set(as_list(st.get("Action"))) & {"sqs:*"}):
                    covered |= set(as_list(st.get("Resource")))
        want = {self.t.getatt(self.src, "Arn"), self.t.getatt(self.dlq, "Arn")}
        return want <= covered, f"covered {sorted(covered)}"

    def role_of_function(self) -> str:
        role_arn = self.fnp["Role"]
        return next(r for r in self.t.of_type("AWS::IAM::Role") if self.t.getatt(r, "Arn") == role_arn)

    def statements_of_role(self, role: str) -> list[dict]:
        t = self.t
        role_arn_name = t.ref(role)
        sts = []
        for pol in t.props(role).get("Policies", []):
            sts += as_list(pol["PolicyDocument"]["Statement"])
        for pid in t.of_type("AWS::IAM::Policy") + t.of_type("AWS::IAM::ManagedPolicy"):
            p = t.props(pid)
            if role_arn_name in p.get("Roles", []):
                sts += as_list(p["PolicyDocument"]["Statement"])
        return sts

    def iam_facts(self, src_arn, dlq_arn, table_arn):
        t = self.t
        role = self.role_of_function()
        rp = t.props(role)
        sts = self.statements_of_role(role)
        log_groups = {t.getatt(lg, "Arn") for lg in t.of_type("AWS::Logs::LogGroup")}

        self.c("function role trusts lambda.amazonaws.com only and has no managed policies", lambda: (
            [s["Principal"] for s in rp["AssumeRolePolicyDocument"]["Statement"]] == [{"Service": "lambda.amazonaws.com"}]
            and not rp.get("ManagedPolicyArns"),
            json.dumps(rp.get("ManagedPolicyArns"))))

        def no_wildcards():
            bad = []
            for s in sts:
                if s.get("Effect") != "Allow":
                    continue
                for a in as_list(s.get("Action", [])):
                    if "*" in a:
                        bad.append(f"action {a}")
                for r in as_list(s.get("Resource", [])):
                    # A log group's own ARN ends in ':*' (its streams): the narrowest ARN there is.
                    if "*" in r and r not in log_groups:
                        bad.append(f"resource {r}")
                if "NotAction" in s or "NotResource" in s:
                    bad.append("NotAction/NotResource")
            return not bad and bool(sts), "; ".join(bad) or f"{len(sts)} statements"

        self.c("no IAM statement allows '*' actions or '*' resources", no_wildcards)

        d = self.derived
        got: dict[str, set] = {}
        for s in sts:
            if s.get("Effect") == "Allow":
                for r in as_list(s["Resource"]):
                    got.setdefault(r, set()).update(as_list(s["Action"]))

        def exactly():
            granted = set().union(*got.values()) if got else set()
            want = d.all_actions()
            extra, missing = sorted(granted - want), sorted(want - granted)
            return not extra and not missing and not d.problems, (
                f"extra {extra}, missing {missing}" + (f"; {d.problems}" if d.problems else ""))

        self.c("role grants exactly the actions triage-lambda's code calls (derived from src/), "
               "the SQS mapping's and the logs': no extra, none missing", exactly)

        def grants():
            lg = next(iter(log_groups)) if len(log_groups) == 1 else None
            want = {src_arn: d.source, dlq_arn: d.dlq, table_arn: d.table, lg: LOG_ACTIONS}
            bad = []
            for r in sorted(set(got) | set(want), key=str):
                g, w = got.get(r, set()), want.get(r, set())
                if g != w:
                    bad.append(f"{r}: extra {sorted(g - w)} missing {sorted(w - g)}")
            return not bad, "; ".join(bad)

        self.c("IAM grants each action on its own resource only (source queue, DLQ, table, log group)", grants)
        self.c(f"{CHAOS_RECORD_ENV} is not set (its recorder's {sorted(d.chaos)} are granted nowhere)", lambda: (
            CHAOS_RECORD_ENV not in self.env, json.dumps(self.env.get(CHAOS_RECORD_ENV))))

    def alarm_facts(self):
        t = self.t
        alarms = [t.props(a) for a in t.of_type("AWS::CloudWatch::Alarm")]
        dlq_name = t.getatt(self.dlq, "QueueName")

        def dlq_alarm():
            for a in alarms:
                if (a.get("Namespace") == "AWS/SQS" and a.get("MetricName") == "ApproximateNumberOfMessagesVisible"
                        and a.get("Dimensions") == [{"Name": "QueueName", "Value": dlq_name}]
                        and num(a["Threshold"]) == 1
                        and a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"):
                    return True, ""
            return False, json.dumps(alarms)

        def breaker_alarm():
            for a in alarms:
                if (a.get("Namespace") == "SqsTriage" and a.get("MetricName") == "BreakerOpened"
                        and not a.get("Dimensions") and a.get("Statistic") == "Sum"
                        and num(a["Threshold"]) == 1
                        and a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"):
                    return True, ""
            return False, json.dumps(alarms)

        def errors_alarm():
            fn_name = t.ref(self.fn)
            for a in alarms:
                if (a.get("Namespace") == "AWS/Lambda" and a.get("MetricName") == "Errors"
                        and a.get("Dimensions") == [{"Name": "FunctionName", "Value": fn_name}]
                        and a.get("Statistic") == "Sum" and num(a["Threshold"]) == 1
                        and a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"):
                    return True, ""
            return False, json.dumps(alarms)

        def alarm_with(ns, name, dims, stat):
            for a in alarms:
                if (a.get("Namespace") == ns and a.get("MetricName") == name and (a.get("Dimensions") or []) == dims
                        and a.get("Statistic") == stat and num(a["Threshold"]) >= 1
                        and a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
                        and a.get("TreatMissingData") == "notBreaching"):
                    return True, ""
            return False, json.dumps(alarms)

        src_name = t.getatt(self.src, "QueueName")
        fn_dims = [{"Name": "FunctionName", "Value": t.ref(self.fn)}]
        self.c("alarm on the source queue's age of oldest message (AWS/SQS ApproximateAgeOfOldestMessage Maximum)",
               lambda: alarm_with("AWS/SQS", "ApproximateAgeOfOldestMessage",
                                  [{"Name": "QueueName", "Value": src_name}], "Maximum"))
        self.c("alarm on the function's throttles (AWS/Lambda Throttles Sum)",
               lambda: alarm_with("AWS/Lambda", "Throttles", fn_dims, "Sum"))
        self.c("alarm near SQS's in-flight limit (AWS/SQS ApproximateNumberOfMessagesNotVisible Maximum of the source "
               "queue, at 100,000, 16,000 on FIFO)", lambda: alarm_with(
                   "AWS/SQS", "ApproximateNumberOfMessagesNotVisible", [{"Name": "QueueName", "Value": src_name}],
                   "Maximum") if any(
                       a.get("MetricName") == "ApproximateNumberOfMessagesNotVisible"
                       and num(a["Threshold"]) == (16000 if is_fifo(t.props(self.src)) else 100000) for a in alarms)
               else (False, json.dumps(alarms)))
        self.c("alarm on storage failures (SqsTriage StorageFailures Sum, no dimension)",
               lambda: alarm_with("SqsTriage", "StorageFailures", [], "Sum"))

        def every_alarm_metric_exists():
            bad = []
            for a in alarms:
                bad += self.metric_problems(a.get("Namespace"), a.get("MetricName"),
                                            {d["Name"]: d["Value"] for d in a.get("Dimensions") or []})
            return not bad and bool(alarms), "; ".join(bad) or f"{len(alarms)} alarms"

        self.c("every alarm watches a metric that exists: an EMF metric the code writes with that dimension set "
               "(src/effects/metrics.rs), or an AWS/SQS or AWS/Lambda metric of this stack's queue or function",
               every_alarm_metric_exists)
        self.c("alarm on DLQ depth (ApproximateNumberOfMessagesVisible >= 1)", dlq_alarm)
        self.c("alarm on the function's errors (AWS/Lambda Errors Sum >= 1: failed invocations, "
               "and a start-up refused on bad configuration)", errors_alarm)
        self.c("alarm on breaker openings (SqsTriage BreakerOpened Sum >= 1, all job types)", breaker_alarm)


    def metric_problems(self, ns, name, dims: dict, search: bool = False) -> list[str]:
        """Why the metric ns/name with dimensions dims (a SEARCH's: names only) does not exist."""
        t, em = self.t, emitted()
        where = f"{ns}/{name} {dims or ''}"
        if ns == em.namespace:
            return [] if em.exists(name, tuple(sorted(dims))) else [
                f"{where}: the code writes no such metric with dimensions {sorted(dims)} ({em.summary()})"]
        if ns in AWS_METRICS:
            dim, names = AWS_METRICS[ns]
            own = ({t.getatt(self.src, "QueueName"), t.getatt(self.dlq, "QueueName")} if ns == "AWS/SQS"
                   else {t.ref(self.fn)})
            if name not in names:
                return [f"{where}: not a {ns} metric"]
            if set(dims) != {dim} or (not search and dims[dim] not in own):
                return [f"{where}: not this stack's {dim} ({sorted(own)})"]
            return []
        return [f"{where}: unknown namespace"]

    def dashboard_facts(self):
        t = self.t
        boards = t.of_type("AWS::CloudWatch::Dashboard")
        self.c("one CloudWatch dashboard", lambda: (len(boards) == 1, f"{boards}"))
        if len(boards) != 1:
            return
        props = t.props(boards[0])

        def body():
            return json.loads(props["DashboardBody"])

        def names_exist():
            ms, bad = dashboard_metrics(body())
            for m in ms:
                bad += self.metric_problems(m["ns"], m["name"], m["dims"], m["search"])
            em = emitted()
            return not bad and bool(ms) and not em.problems, "; ".join(bad + em.problems) or f"{len(ms)} metrics"

        self.c("dashboard: every metric it graphs exists (EMF metrics the code writes, with their dimension set; "
               "AWS/SQS and AWS/Lambda metrics of this stack's queues and function)", names_exist)

        src, dlq, fn = t.getatt(self.src, "QueueName"), t.getatt(self.dlq, "QueueName"), t.ref(self.fn)
        want = [("AWS/SQS", "ApproximateNumberOfMessagesVisible", src), ("AWS/SQS", "ApproximateNumberOfMessagesNotVisible", src),
                ("AWS/SQS", "ApproximateAgeOfOldestMessage", src), ("AWS/SQS", "ApproximateNumberOfMessagesVisible", dlq),
                ("AWS/Lambda", "Duration", fn), ("AWS/Lambda", "Errors", fn), ("AWS/Lambda", "Throttles", fn),
                ("AWS/Lambda", "ConcurrentExecutions", fn),
                ("SqsTriage", "StorageRetries", None), ("SqsTriage", "StorageFailures", None)]
        want += [("SqsTriage", n, "JobType") for n in ("Succeeded", "Retried", "Deferred", "DeadLetteredFatal",
                                                       "DeadLetteredExhausted", "DeadLetteredInvalid", "BreakerOpened")]

        def shows_what_matters():
            ms, _ = dashboard_metrics(body())
            have = set()
            for m in ms:
                if m["search"]:
                    have.add((m["ns"], m["name"], ",".join(sorted(m["dims"]))))
                elif m["dims"]:
                    have.add((m["ns"], m["name"], next(iter(m["dims"].values()))))
                else:
                    have.add((m["ns"], m["name"], None))
            missing = [w for w in want if w not in have]
            return not missing, f"missing {missing}"

        self.c("dashboard shows the source queue (visible, in flight, age of oldest), the DLQ depth, per job type "
               "(SEARCH over JobType) Succeeded, Retried, Deferred, DeadLettered{Fatal,Exhausted,Invalid}, "
               "BreakerOpened, StorageRetries / StorageFailures, and the function's duration, errors, throttles "
               "and concurrency", shows_what_matters)


def sam_only_facts(sam_path: Path, sam_raw: dict, sam_cfn: dict, report: Report, tag: str = "sam") -> None:
    fn = next(r for r in sam_raw["Resources"].values() if r["Type"] == "AWS::Serverless::Function")
    params = sam_raw.get("Parameters", {})

    def build_param(value, name):
        """A build setting's value as `sam build` resolves it: the parameter's default (or a literal)."""
        if isinstance(value, dict):
            return params.get(value.get("Ref"), {}).get("Default") if value.get("Ref") == name else None
        return value

    def build():
        uri = fn["Properties"]["CodeUri"]
        binary = fn.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
        crate_dir, name = build_param(uri, "CrateDir"), build_param(binary, "BinaryName")
        if crate_dir is None or name is None:
            return False, f"CodeUri {uri} / Binary {binary}: a literal, or a Ref to CrateDir / BinaryName with a default"
        crate = (sam_path.parent / crate_dir).resolve()
        return (fn.get("Metadata", {}).get("BuildMethod") == "rust-cargolambda"
                and builds_binary(crate, name),
                f"CodeUri {uri} -> {crate}, binary {name}, Metadata {fn.get('Metadata')}")

    report.check(f"[{tag}] built by cargo-lambda (rust-cargolambda, the crate at CodeUri = CrateDir has the binary "
                 "BinaryName, as their defaults name them)", build)

    def every_timeout():
        allowed = sam_raw["Parameters"]["FunctionTimeout"]["AllowedValues"]
        bad = []
        for v in allowed:
            tpl = Template(sam_cfn, {"FunctionTimeout": v})
            f = Facts("sam", tpl, Report())
            vis = num(tpl.props(f.src)["VisibilityTimeout"])
            if vis < 6 * num(v) or vis > 43200:
                bad.append(f"{v}->{vis}")
        return not bad, ", ".join(bad) or f"{len(allowed)} allowed values"

    report.check("[sam] visibility timeout >= 6 x function timeout for every allowed FunctionTimeout", every_timeout)

    def alarm_topic():
        topic = f"arn:aws:sns:{REGION}:{ACCOUNT}:ops"
        bad = []
        for value, want in ((topic, [topic]), ("", None)):
            tpl = Template(copy.deepcopy(sam_cfn), {"AlarmTopicArn": value})
            for a in tpl.of_type("AWS::CloudWatch::Alarm"):
                if tpl.props(a).get("AlarmActions") != want:
                    bad.append(f"{a} with AlarmTopicArn={value!r}: {tpl.props(a).get('AlarmActions')}")
        return not bad, "; ".join(bad)

    report.check("[sam] every alarm notifies AlarmTopicArn when it is set, none when it is empty", alarm_topic)

    sam_only_facts_thresholds(sam_raw, sam_cfn, report)
    sam_only_facts_log_level(sam_raw, sam_cfn, report)

    def pollers():
        tpl = Template(copy.deepcopy(sam_cfn), {"EventSourceScaling": "ProvisionedPollers", "MinimumPollers": "3",
                                                 "MaximumPollers": "40"})
        esm = tpl.props(tpl.of_type("AWS::Lambda::EventSourceMapping")[0])
        return (esm.get("ProvisionedPollerConfig") == {"MinimumPollers": "3", "MaximumPollers": "40"}
                and "ScalingConfig" not in esm and esm_scaling_ok(esm), json.dumps(esm))

    report.check("[sam] EventSourceScaling=ProvisionedPollers sets ProvisionedPollerConfig and drops MaximumConcurrency",
                 pollers)

    def fifo_rules():
        params = Params(sam_raw)
        cases = [({"QueueType": "fifo"}, True), ({"QueueType": "fifo", "BatchSize": "10"}, True),
                 ({"QueueType": "fifo", "BatchSize": "11"}, False), ({"QueueType": "fifo", "BatchSize": "10000",
                                                                      "MaxBatchingWindowSeconds": "1"}, False),
                 ({"QueueType": "fifo", "MaxBatchingWindowSeconds": "1"}, False),
                 ({"QueueType": "standard", "BatchSize": "20", "MaxBatchingWindowSeconds": "1"}, True)]
        wrong = [(v, want) for v, want in cases if params.rules_pass(v) != want]
        return not wrong, f"wrong verdicts (values, should pass): {wrong}"

    report.check("[sam] Rules: QueueType fifo refuses BatchSize above 10 and any batching window (Lambda's FIFO "
                 "limits); standard queues keep their ranges", fifo_rules)


def sam_only_facts_log_level(sam_raw: dict, sam_cfn: dict, report: Report) -> None:
    def log_level():
        p = sam_raw["Parameters"].get("ApplicationLogLevel", {})
        bad = [] if p.get("AllowedValues") == LAMBDA_LOG_LEVELS and p.get("Default") == "INFO" else [
            f"parameter {json.dumps(p)}"]
        for value in LAMBDA_LOG_LEVELS:
            tpl = Template(copy.deepcopy(sam_cfn), {"ApplicationLogLevel": value})
            f = Facts("sam", tpl, Report(quiet=True))
            got = f.fnp.get("LoggingConfig", {}).get("ApplicationLogLevel")
            if got != value:
                bad.append(f"ApplicationLogLevel={value}: {got}")
        return not bad, "; ".join(bad)

    report.check("[sam] the function's ApplicationLogLevel is the ApplicationLogLevel parameter (Lambda's levels, "
                 "default INFO)", log_level)


def sam_only_facts_thresholds(sam_raw: dict, sam_cfn: dict, report: Report) -> None:
    thresholds = {"SourceAgeAlarmSeconds": "ApproximateAgeOfOldestMessage", "FunctionErrorsAlarmThreshold": "Errors",
                  "FunctionThrottlesAlarmThreshold": "Throttles", "StorageFailuresAlarmThreshold": "StorageFailures",
                  "BreakerOpenedAlarmThreshold": "BreakerOpened"}

    def threshold_params():
        bad = []
        for param, metric in thresholds.items():
            p = sam_raw["Parameters"].get(param)
            if not p:
                bad.append(f"no parameter {param}")
                continue
            value = str(int(p["MinValue"]) + 7)
            tpl = Template(copy.deepcopy(sam_cfn), {param: value})
            got = [tpl.props(a).get("Threshold") for a in tpl.of_type("AWS::CloudWatch::Alarm")
                   if tpl.props(a).get("MetricName") == metric]
            if [str(g) for g in got] != [value]:
                bad.append(f"{param}={value}: {metric} alarm thresholds {got}")
        return not bad, "; ".join(bad)

    report.check("[sam] each alarm's threshold is its parameter (" + ", ".join(thresholds) + ")", threshold_params)


def cdk_only_facts(cdk_out: Path, cdk_cfn: dict, report: Report, binary: str = "triage-lambda", tag: str = "cdk",
                   code: bool = True) -> None:
    def nag():
        path = cdk_out / "validation-report.json"
        if not path.exists():
            return True, "no validation report (no violations)"
        rep = json.loads(path.read_text())
        fails = [v["ruleName"] for p in rep.get("pluginReports", []) for v in p.get("violations", [])
                 if v.get("severity") == "error"]
        return not fails, ", ".join(fails)

    report.check(f"[{tag}] cdk-nag AwsSolutions: no unacknowledged errors", nag)

    def code_fact():
        fn = next(r for r in cdk_cfn["Resources"].values() if r["Type"] == "AWS::Lambda::Function")
        asset = Path(fn["Metadata"]["aws:asset:path"])
        if not asset.is_absolute():
            asset = cdk_out / asset
        if (asset / "Cargo.toml").exists():  # synthesized without bundling: the crate itself
            return builds_binary(asset, binary), str(asset)
        return (asset / "bootstrap").exists(), f"{asset} (bundled)"

    if code:
        report.check(f"[{tag}] function code is the {binary} binary of the crate (cargo-lambda-cdk)", code_fact)


RECORD_KEYS = {"messageId", "receiptHandle", "body", "attributes", "messageAttributes", "md5OfBody",
               "eventSource", "eventSourceARN", "awsRegion"}
ATTRIBUTE_KEYS = {"ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"}


def events_facts(events_dir: Path, schema_path: Path, report: Report) -> None:
    """The sample SqsEvent files have Lambda's shape, and their bodies match the envelope schema."""
    import hashlib

    import jsonschema

    schema = json.loads(schema_path.read_text())

    def schema_ok():
        jsonschema.Draft202012Validator.check_schema(schema)
        v = jsonschema.Draft202012Validator(schema)
        bad = [e for e in schema.get("examples", []) if not v.is_valid(e)]
        wrong = [e for e in ({"payload": {}}, {"type": ""}, {"type": "x", "id": 7},
                             {"type": "triage.chaos", "payload": {"outcome": "explode"}}) if v.is_valid(e)]
        return not bad and not wrong, f"invalid examples {bad}, accepted {wrong}"

    report.check("[schema] envelope.schema.json is a valid 2020-12 schema that accepts its examples and rejects bad envelopes", schema_ok)
    validator = jsonschema.Draft202012Validator(schema)
    expected = ["eventbridge", "fatal", "fifo", "malformed", "mixed", "retry-after", "sns", "success", "transient",
                "unknown-type"]
    have = sorted(p.stem for p in events_dir.glob("*.json"))
    report.fact("[events] one file per case: " + ", ".join(expected), have == expected, f"found {have}")
    for path in sorted(events_dir.glob("*.json")):
        def shape(path=path):
            recs = json.loads(path.read_text())["Records"]
            problems = []
            fifo = path.stem == "fifo"
            for r in recs:
                if set(r) != RECORD_KEYS:
                    problems.append(f"{r.get('messageId')}: keys {sorted(set(r) ^ RECORD_KEYS)}")
                    continue
                a = r["attributes"]
                if not ATTRIBUTE_KEYS <= set(a) or (fifo and not {"MessageGroupId", "SequenceNumber"} <= set(a)):
                    problems.append(f"{r['messageId']}: attributes {sorted(a)}")
                if r["eventSource"] != "aws:sqs" or not r["eventSourceARN"].endswith(":triage-jobs.fifo" if fifo else ":triage-jobs"):
                    problems.append(f"{r['messageId']}: source {r['eventSourceARN']}")
                if hashlib.md5(r["body"].encode()).hexdigest() != r["md5OfBody"]:
                    problems.append(f"{r['messageId']}: md5OfBody")
                if not r["messageId"]:
                    problems.append("empty messageId")
                try:
                    body = json.loads(r["body"])
                except ValueError:
                    body = None
                if "job-type" in r["messageAttributes"]:
                    continue  # any body: the job type travels in the attribute
                if path.stem == "sns":
                    # SNS's notification around the job (raw message delivery off).
                    if not (isinstance(body, dict) and body.get("Type") == "Notification"
                            and isinstance(body.get("TopicArn"), str) and isinstance(body.get("Message"), str)
                            and isinstance(body.get("MessageId"), str)):
                        problems.append(f"{r['messageId']}: body is not an SNS notification")
                        continue
                    if "job-type" in body.get("MessageAttributes", {}):
                        continue  # any message: the job type travels in SNS's attribute
                    try:
                        body = json.loads(body["Message"])
                    except ValueError:
                        body = None
                elif path.stem == "eventbridge":
                    # EventBridge's event around the job: an envelope as the detail is checked,
                    # any other detail's job type is its detail-type (TRIAGE_EVENTBRIDGE_TYPES).
                    keys = {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
                    if not (isinstance(body, dict) and keys <= set(body) and "type" not in body):
                        problems.append(f"{r['messageId']}: body is not an EventBridge event")
                        continue
                    detail = body["detail"]
                    if not (isinstance(detail, dict) and "type" in detail and "payload" in detail):
                        continue
                    body = detail
                if path.stem == "malformed" or (body is None and path.stem == "mixed"):
                    if body is not None:
                        problems.append(f"{r['messageId']}: body should not be JSON")
                elif body is None or not validator.is_valid(body):
                    problems.append(f"{r['messageId']}: body does not match the envelope schema")
            ids = [r.get("messageId") for r in recs]
            if len(set(ids)) != len(ids):
                problems.append("duplicate messageId")
            return bool(recs) and not problems, "; ".join(problems)

        report.check(f"[events] {path.name}: Lambda SqsEvent shape, bodies match the envelope schema", shape)


# --------------------------------------------------------------------------- SAM = CDK

# The settings in which the SAM template (after the SAM translator) and the synthesized CDK
# template may differ, each with the reason. Key: (resource kind, setting path; list positions
# left out). Any other difference, in any setting of any resource, fails the check.
PARITY_ALLOWED = {
    ("function", "Code"): "where the binary comes from: SAM's is what `sam build` makes of CodeUri (offline: a "
                          "placeholder), CDK's the cargo-lambda-cdk asset; both are triage-lambda of this crate "
                          "(checked by the [sam] built-by and [cdk] function-code facts)",
    ("function", "Tags"): "SAM tags every function it makes with lambda:createdBy=SAM",
    ("queue TLS policy", "Statement.Sid"): "a statement id is a label: the SAM template names its statement, "
                                           "CDK's enforceSSL does not",
}


class Roles:
    """Each template's resources by what they are for, so the two can be compared one by one."""

    def __init__(self, tag: str, t: Template):
        f = Facts(tag, t, Report())
        self.t = t
        self.by_key: dict[str, tuple[str, str]] = {}  # key -> (kind, logical id)
        self.unclaimed = set(t.resources)
        self.claim("source queue", "queue", f.src)
        self.claim("dead-letter queue", "queue", f.dlq)
        self.claim("state table", "table", f.table)
        self.claim("function", "function", f.fn)
        self.claim("event source mapping", "event source mapping", f.esm)
        self.claim("function role", "role", f.role_of_function())
        for lg in t.of_type("AWS::Logs::LogGroup"):
            self.claim("function log group" if len(t.of_type("AWS::Logs::LogGroup")) == 1 else lg, "log group", lg)
        for a in t.of_type("AWS::CloudWatch::Alarm"):
            p = t.props(a)
            self.claim(f"alarm {p.get('Namespace')}/{p.get('MetricName')}", "alarm", a)
        for d in t.of_type("AWS::CloudWatch::Dashboard"):
            self.claim("dashboard", "dashboard", d)
        for layer in t.of_type("AWS::Lambda::LayerVersion"):
            self.claim("layer", "layer", layer)
        # Queue policies: one per queue or one for both, compared per queue.
        self.policies = t.of_type("AWS::SQS::QueuePolicy")
        self.unclaimed -= set(self.policies)
        self.tokens: dict[str, str] = {}
        for key, (_, rid) in self.by_key.items():
            self.tokens.setdefault(str(t.ref(rid)), f"<{key}>")
            for attr in ("Arn", "QueueName", "QueueUrl"):
                v = str(t.getatt(rid, attr))
                if not v.startswith("getatt:"):
                    self.tokens.setdefault(v, f"<{key}.{attr}>")

    def claim(self, key: str, kind: str, rid: str) -> None:
        if key in self.by_key:
            key = f"{key} ({rid})"
        self.by_key[key] = (kind, rid)
        self.unclaimed.discard(rid)

    def norm(self, x, key: str = ""):
        """Concrete values with resource names, ARNs and URLs as <role> tokens; numbers as numbers."""
        if isinstance(x, dict):
            # A dashboard's body is JSON text: compared as the JSON it holds, widget by widget.
            return {k: (sorted(self.norm(as_list(v))) if k in ("Action", "NotAction", "Resource")
                        else self.norm(json.loads(v), k) if k == "DashboardBody" and isinstance(v, str)
                        else self.norm(v, k))
                    for k, v in x.items()}
        if isinstance(x, list):
            return [self.norm(i) for i in x]
        if isinstance(x, str):
            if x in self.tokens:
                return self.tokens[x]
            if re.fullmatch(r"-?\d+(\.\d+)?", x):
                return num(x) if "." in x else int(x)
            if x in ("true", "false"):
                return x == "true"
            return x
        if isinstance(x, float) and x.is_integer():
            return int(x)
        return x

    def records(self) -> dict[str, tuple[str, dict]]:
        t, out = self.t, {}
        for key, (kind, rid) in self.by_key.items():
            res = t.resources[rid]
            out[key] = (kind, {
                "Properties": self.norm(t.props(rid)),
                # CloudFormation deletes these resource types with their stack unless told otherwise.
                "DeletionPolicy": res.get("DeletionPolicy", "Delete"),
                "UpdateReplacePolicy": res.get("UpdateReplacePolicy", "Delete"),
            })
        per_queue: dict[str, dict] = {}
        for pid in self.policies:
            doc = t.props(pid)["PolicyDocument"]
            for st in as_list(doc["Statement"]):
                for r in as_list(st.get("Resource")):
                    q = self.norm(r)
                    entry = per_queue.setdefault(f"queue TLS policy of {q}", {"Version": doc.get("Version"), "Statement": []})
                    entry["Statement"].append(self.norm({**st, "Resource": r}))
        for key, rec in per_queue.items():
            rec["Statement"].sort(key=lambda st: json.dumps({k: v for k, v in st.items() if k != "Sid"}, sort_keys=True))
            out[key] = ("queue TLS policy", rec)
        out["outputs"] = ("outputs", {k: {"Value": self.norm(t.ev(v["Value"])), "Description": v.get("Description")}
                                      for k, v in t.raw.get("Outputs", {}).items()})
        return out


def differences(a, b, path: str = "") -> list[tuple[str, object, object]]:
    """(path, SAM value, CDK value) of every setting that differs."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else k
            if k not in a or k not in b:
                out.append((sub, a.get(k, "(unset)"), b.get(k, "(unset)")))
            else:
                out += differences(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    return [] if same else [(path, a, b)]


# The Python variant's: the layer's content, as the function's code.
PARITY_ALLOWED_LAYER = {
    **PARITY_ALLOWED,
    ("layer", "Content"): "where the layer's zip comes from: SAM's is what `sam package` uploads of ContentUri "
                          "(offline: a placeholder), CDK's an asset of the zip (checked: both are the layer build's zip)",
}


def parity_facts(sam: Template, cdk: Template, report: Report, tag: str = "sam=cdk",
                 allowed_diffs: dict | None = None) -> None:
    """SAM and CDK make the same resources with the same settings, resource by resource."""
    allowed_diffs = PARITY_ALLOWED if allowed_diffs is None else allowed_diffs
    rs, rc = Roles("sam", sam), Roles("cdk", cdk)
    report.fact(f"[{tag}] every resource of either template has a counterpart role (queues, queue policies, table, "
                "log group, role, function, mapping, alarms, dashboard)", not rs.unclaimed and not rc.unclaimed,
                f"SAM {sorted(rs.unclaimed)}, CDK {sorted(rc.unclaimed)}")
    a, b = rs.records(), rc.records()
    used = set()
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            report.fact(f"[{tag}] {key}: in both templates", False, "SAM only" if key in a else "CDK only")
            continue
        kind = a[key][0]
        bad, allowed = [], []
        for path, x, y in differences(a[key][1], b[key][1]):
            setting = re.sub(r"\[\d+\]", "", path.removeprefix("Properties."))
            rule = next(((k, a) for k, a in allowed_diffs if k == kind and (setting == a or setting.startswith(a + "."))), None)
            if rule:
                used.add(rule)
                allowed.append(rule[1])
            else:
                bad.append(f"{path}: SAM {json.dumps(x)} / CDK {json.dumps(y)}")
        note = f" (allowed: {', '.join(sorted(set(allowed)))})" if allowed else ""
        report.fact(f"[{tag}] {key}: same settings{note}", not bad, "; ".join(bad))
    report.fact(f"[{tag}] every allowed difference still occurs (no stale allow-list entry)",
                used == set(allowed_diffs), f"unused: {sorted(set(allowed_diffs) - used)}")


# --------------------------------------------------------------------------- broken copies

def _set_body(tpl: Template, edit) -> None:
    """Replaces the dashboard's body by edit(body) (evaluated, so the copy holds plain JSON text)."""
    d = tpl.of_type("AWS::CloudWatch::Dashboard")[0]
    body = json.loads(tpl.props(d)["DashboardBody"])
    edit(body)
    tpl.resources[d]["Properties"]["DashboardBody"] = json.dumps(body)


def _widget(body: dict, title_part: str) -> dict:
    return next(w for w in body["widgets"] if title_part in w.get("properties", {}).get("title", ""))


def _alarm(tpl: Template, metric: str) -> dict:
    rid = next(a for a in tpl.of_type("AWS::CloudWatch::Alarm") if tpl.props(a).get("MetricName") == metric)
    return tpl.resources[rid]["Properties"]


def _esm(tpl: Template) -> dict:
    return tpl.resources[tpl.of_type("AWS::Lambda::EventSourceMapping")[0]]["Properties"]


def _logging(tpl: Template) -> dict:
    return tpl.resources[tpl.of_type("AWS::Lambda::Function")[0]]["Properties"]["LoggingConfig"]


def _fn_env(tpl: Template) -> dict:
    return tpl.resources[tpl.of_type("AWS::Lambda::Function")[0]]["Properties"]["Environment"]["Variables"]


def _queue(tpl: Template, which: str) -> dict:
    f = Facts("x", tpl, Report(quiet=True))
    return tpl.resources[f.src if which == "source" else f.dlq]["Properties"]


def _renamed_metric_source(tmp: Path) -> Path:
    """A copy of src/ whose metrics.rs writes `Postponed` where it wrote `Deferred`."""
    import shutil

    shutil.copytree(ROOT / "src", tmp / "src")
    m = tmp / METRICS_RS
    m.write_text(m.read_text().replace('"Deferred"', '"Postponed"'))
    return tmp


def _search_edit(metric: str, new: str):
    def edit(body):
        for w in body["widgets"]:
            for row in w.get("properties", {}).get("metrics", []):
                for x in row:
                    if isinstance(x, dict) and "expression" in x:
                        x["expression"] = x["expression"].replace(metric, new)
    return edit


# Each broken copy: (what is broken, how to break a template copy, the fact label part that must fail).
MUTANTS = [
    ("dashboard graphs a metric the code does not write (Succeded)",
     lambda t: _set_body(t, _search_edit('MetricName="Succeeded"', 'MetricName="Succeded"')), "every metric it graphs exists"),
    ("dashboard SEARCHes Retried without its JobType dimension",
     lambda t: _set_body(t, _search_edit("{SqsTriage,JobType} MetricName=\"Retried\"", "{SqsTriage} MetricName=\"Retried\"")),
     "every metric it graphs exists"),
    ("dashboard graphs another queue's depth",
     lambda t: _set_body(t, lambda b: _widget(b, "Dead-letter queue")["properties"]["metrics"][0].__setitem__(3, "other-dlq")),
     "every metric it graphs exists"),
    ("dashboard graphs an AWS/Lambda metric that does not exist",
     lambda t: _set_body(t, lambda b: _widget(b, "concurrency")["properties"]["metrics"][0].__setitem__(1, "Concurrency")),
     "every metric it graphs exists"),
    ("dashboard lost its throttles",
     lambda t: _set_body(t, lambda b: _widget(b, "errors and throttles")["properties"]["metrics"].pop()),
     "dashboard shows the source queue"),
    ("dashboard lost the DeadLetteredInvalid widget",
     lambda t: _set_body(t, lambda b: b["widgets"].remove(_widget(b, "invalid"))), "dashboard shows the source queue"),
    ("StorageFailures alarm with a JobType dimension (the code writes it without)",
     lambda t: _alarm(t, "StorageFailures").__setitem__("Dimensions", [{"Name": "JobType", "Value": "email"}]),
     "every alarm watches a metric that exists"),
    ("age alarm on a misspelt SQS metric",
     lambda t: _alarm(t, "ApproximateAgeOfOldestMessage").__setitem__("MetricName", "ApproximateAgeOfOldestMessages"),
     "every alarm watches a metric that exists"),
    ("throttles alarm on another function",
     lambda t: _alarm(t, "Throttles").__setitem__("Dimensions", [{"Name": "FunctionName", "Value": "other"}]),
     "every alarm watches a metric that exists"),
    ("no age-of-oldest-message alarm",
     lambda t: t.resources.pop(next(a for a in t.of_type("AWS::CloudWatch::Alarm")
                                   if t.props(a).get("MetricName") == "ApproximateAgeOfOldestMessage")),
     "alarm on the source queue's age"),
    ("DLQ takes 256 KiB messages",
     lambda t: _queue(t, "dlq").__setitem__("MaximumMessageSize", 262144), "both queues take SQS's largest message"),
    ("DLQ smaller than its source",
     lambda t: (_queue(t, "dlq").__setitem__("MaximumMessageSize", 2048),
                _queue(t, "source").__setitem__("MaximumMessageSize", 4096)), "DLQ's MaximumMessageSize is never below"),
    ("DLQ at 256 KiB with TRIAGE_DLQ_MAX_BYTES still 1 MiB",
     lambda t: _queue(t, "dlq").__setitem__("MaximumMessageSize", 262144), "TRIAGE_DLQ_MAX_BYTES is the DLQ's"),
    ("function without TRIAGE_DLQ_MAX_BYTES",
     lambda t: _fn_env(t).pop("TRIAGE_DLQ_MAX_BYTES"), "TRIAGE_DLQ_MAX_BYTES is the DLQ's"),
    ("source queue keeps messages 1 day, TRIAGE_QUEUE_RETENTION_S still the parameter's",
     lambda t: _queue(t, "source").__setitem__("MessageRetentionPeriod", 86400), "TRIAGE_QUEUE_RETENTION_S, _VISIBILITY_S"),
    ("source queue's visibility timeout raised, TRIAGE_QUEUE_VISIBILITY_S not",
     lambda t: _queue(t, "source").__setitem__("VisibilityTimeout", 43200), "TRIAGE_QUEUE_RETENTION_S, _VISIBILITY_S"),
    ("function without TRIAGE_QUEUE_MAX_RECEIVE",
     lambda t: _fn_env(t).pop("TRIAGE_QUEUE_MAX_RECEIVE"), "TRIAGE_QUEUE_RETENTION_S, _VISIBILITY_S"),
    ("source queue without MaximumMessageSize",
     lambda t: _queue(t, "source").pop("MaximumMessageSize"), "both queues take SQS's largest message"),
    ("mapping with both MaximumConcurrency and provisioned pollers",
     lambda t: _esm(t).__setitem__("ProvisionedPollerConfig", {"MinimumPollers": 2, "MaximumPollers": 10}),
     "exactly one of MaximumConcurrency and provisioned pollers"),
    ("mapping without MetricsConfig", lambda t: _esm(t).pop("MetricsConfig"), "MetricsConfig EventCount"),
    ("function logs Text (no level filter, no AWS_LAMBDA_LOG_LEVEL)",
     lambda t: _logging(t).__setitem__("LogFormat", "Text"), "function logs JSON lines"),
    ("function without an application log level",
     lambda t: _logging(t).pop("ApplicationLogLevel"), "function logs JSON lines"),
    ("function with Lambda's platform lines from WARN (no REPORT lines)",
     lambda t: _logging(t).__setitem__("SystemLogLevel", "WARN"), "function logs JSON lines"),
]


def mutant_facts(sam_cfn: dict, cdk_cfn: dict, derived: "Derived", factor, limits, report: Report) -> None:
    """Every new fact fails on a broken copy of either template (and the checks still pass on the real ones)."""
    global _EMITTED
    for tag, raw in (("sam", sam_cfn), ("cdk", cdk_cfn)):
        for what, breaks, label in MUTANTS:
            tpl = Template(copy.deepcopy(raw))
            try:
                breaks(tpl)
            except (StopIteration, KeyError, IndexError, ValueError) as e:
                report.fact(f"[broken copy] {tag}, {what}: caught by '{label}'", False,
                            f"the template has nothing this breaks ({type(e).__name__} {e})")
                continue
            rep = Report(quiet=True)
            Facts(tag, tpl, rep, derived, factor, limits).run()
            caught = [f for f in rep.failures if label in f]
            report.fact(f"[broken copy] {tag}, {what}: caught by '{label}'", bool(caught), f"failed only {rep.failures}")

    # Parity: a CDK dashboard widget or alarm threshold of its own is a difference.
    for what, breaks in (("CDK dashboard with another widget title",
                          lambda t: _set_body(t, lambda b: _widget(b, "Deferred")["properties"].__setitem__("title", "x"))),
                         ("CDK throttles alarm with another threshold",
                          lambda t: _alarm(t, "Throttles").__setitem__("Threshold", 9)),
                         ("CDK function at another application log level",
                          lambda t: _logging(t).__setitem__("ApplicationLogLevel", "DEBUG"))):
        cdk = Template(copy.deepcopy(cdk_cfn))
        try:
            breaks(cdk)
        except (StopIteration, KeyError, IndexError, ValueError) as e:
            report.fact(f"[broken copy] {what}: caught by [sam=cdk]", False, f"nothing to break ({type(e).__name__})")
            continue
        rep = Report(quiet=True)
        parity_facts(Template(copy.deepcopy(sam_cfn)), cdk, rep)
        report.fact(f"[broken copy] {what}: caught by [sam=cdk]", rep.failed > 0, "no parity fact failed")

    # The metric names come from the code: rename one there and the dashboard's graph of it fails.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        saved = _EMITTED
        _EMITTED = Emitted(_renamed_metric_source(Path(tmp)))
        try:
            rep = Report(quiet=True)
            Facts("sam", Template(copy.deepcopy(sam_cfn)), rep, derived, factor, limits).run()
        finally:
            _EMITTED = saved
        report.fact("[broken copy] the code writes Postponed instead of Deferred: caught by 'every metric it graphs exists'",
                    any("every metric it graphs exists" in f for f in rep.failures), f"failed only {rep.failures}")

    # SAM: a threshold written as a number instead of its parameter.
    def fixed_threshold():
        broken = copy.deepcopy(sam_cfn)
        for r in broken["Resources"].values():
            if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("MetricName") == "Throttles":
                r["Properties"]["Threshold"] = 1
        rep = Report(quiet=True)
        sam_only_facts_thresholds(load_yaml_template(ROOT / "infra/template.yaml"), broken, rep)
        return rep.failed > 0, "not caught"

    report.check("[broken copy] sam, a threshold that ignores its parameter: caught by 'threshold is its parameter'",
                 fixed_threshold)

    # SAM: the application log level written as a level instead of its parameter.
    def fixed_log_level():
        broken = copy.deepcopy(sam_cfn)
        for r in broken["Resources"].values():
            if r["Type"] == "AWS::Lambda::Function":
                r["Properties"]["LoggingConfig"]["ApplicationLogLevel"] = "INFO"
        rep = Report(quiet=True)
        sam_only_facts_log_level(load_yaml_template(ROOT / "infra/template.yaml"), broken, rep)
        return rep.failed > 0, "not caught"

    report.check("[broken copy] sam, an application log level that ignores its parameter: caught by "
                 "'ApplicationLogLevel is the ApplicationLogLevel parameter'", fixed_log_level)


# SAM parameters that choose a variant of the stack rather than a setting: each variant is
# evaluated, checked and compared with its CDK synth on its own ([sam fifo], [sam=cdk fifo]).
VARIANT_PARAMS = {"QueueType": "fifo"}
# What `sam build` reads (the crate and its binary): no deployed setting, the CDK construct's
# manifestPath and binaryName props. Checked by the "[sam] built by cargo-lambda" fact.
BUILD_PARAMS = ("CrateDir", "BinaryName")


def _fifo_queue(tpl: Template, which: str) -> dict:
    f = Facts("x", tpl, Report(quiet=True))
    return tpl.resources[f.src if which == "source" else f.dlq]["Properties"]


# Broken copies of the FIFO variant: (what, how, the fact label part that must fail).
FIFO_MUTANTS = [
    ("the DLQ is a standard queue behind the FIFO source",
     lambda t: (_fifo_queue(t, "dlq").pop("FifoQueue"), _fifo_queue(t, "dlq").pop("ContentBasedDeduplication")),
     "FIFO together"),
    ("content-based deduplication on the source queue",
     lambda t: _fifo_queue(t, "source").__setitem__("ContentBasedDeduplication", True), "content-based deduplication off"),
    ("content-based deduplication unset on the DLQ",
     lambda t: _fifo_queue(t, "dlq").pop("ContentBasedDeduplication"), "content-based deduplication off"),
    ("the FIFO DLQ's name without .fifo",
     lambda t: _fifo_queue(t, "dlq").__setitem__("QueueName", "sqs-triage-dlq"), "name ends .fifo exactly when"),
    ("a batching window on the FIFO source's mapping",
     lambda t: _esm(t).__setitem__("MaximumBatchingWindowInSeconds", 1), "none on a FIFO source"),
    ("batch size 20 on the FIFO source's mapping",
     lambda t: _esm(t).__setitem__("BatchSize", 20), "none on a FIFO source"),
    ("both queues standard where FIFO is asked for",
     lambda t: [(_fifo_queue(t, w).pop("FifoQueue"), _fifo_queue(t, w).pop("ContentBasedDeduplication"),
                 _fifo_queue(t, w).__setitem__("QueueName", f"sqs-triage-{w}")) for w in ("dlq", "source")],
     "both FIFO"),
]


def fifo_mutant_facts(sam_cfn: dict, cdk_fifo_cfn: dict, derived: "Derived", factor, limits, report: Report) -> None:
    """Every FIFO fact fails on a broken copy of either template's FIFO variant."""
    for tag, raw, params in (("sam fifo", sam_cfn, VARIANT_PARAMS), ("cdk fifo", cdk_fifo_cfn, {})):
        for what, breaks, label in FIFO_MUTANTS:
            tpl = Template(copy.deepcopy(raw), params)
            try:
                breaks(tpl)
            except (StopIteration, KeyError, IndexError, ValueError) as e:
                report.fact(f"[broken copy] {tag}, {what}: caught by '{label}'", False,
                            f"the template has nothing this breaks ({type(e).__name__} {e})")
                continue
            tpl = Template(tpl.raw, params)  # names evaluated afresh (finding the queues cached them)
            rep = Report(quiet=True)
            try:
                Facts(tag, tpl, rep, derived, factor, limits, fifo=True).run()
            except StopIteration:  # the redrive target is no longer found by its ARN: also caught
                rep.fact("FIFO together: the source's redrive target is not a queue of the template", False)
            caught = [f for f in rep.failures if label in f]
            report.fact(f"[broken copy] {tag}, {what}: caught by '{label}'", bool(caught), f"failed only {rep.failures}")

    # Parity: a CDK FIFO variant that differs from SAM's is a difference.
    cdk = Template(copy.deepcopy(cdk_fifo_cfn))
    _fifo_queue(cdk, "source")["ContentBasedDeduplication"] = True
    rep = Report(quiet=True)
    parity_facts(Template(copy.deepcopy(sam_cfn), VARIANT_PARAMS), cdk, rep, "sam=cdk fifo")
    report.fact("[broken copy] CDK FIFO source queue with content-based deduplication: caught by [sam=cdk fifo]",
                rep.failed > 0, "no parity fact failed")


def parity_settings(path: Path) -> list[dict]:
    return json.loads(path.read_text())["settings"]


def other_settings_facts(sam_raw: dict, sam_cfn: dict, cdk_alt_out: Path, settings_path: Path, report: Report) -> None:
    """The same comparison with every setting away from its default, on both sides."""
    settings = parity_settings(settings_path)
    params = Params(sam_raw)
    listed = {s["sam"] for s in settings}
    report.fact(f"[sam=cdk other settings] {settings_path.name} lists every SAM parameter but the variants' "
                f"({', '.join(VARIANT_PARAMS)}: compared in their own runs) and sam build's "
                f"({', '.join(BUILD_PARAMS)}), each with a value it accepts and that is not its default",
                listed == set(params.decl) - set(VARIANT_PARAMS) - set(BUILD_PARAMS) and len(listed) == len(settings)
                and all(params.accepts(s["sam"], s["value"]) and str(params.decl[s["sam"]].get("Default")) != s["value"]
                        for s in settings)
                and params.rules_pass({s["sam"]: s["value"] for s in settings}),
                f"missing {sorted(set(params.decl) - listed - set(VARIANT_PARAMS) - set(BUILD_PARAMS))}, "
                f"unknown {sorted(listed - set(params.decl))}")
    sam = Template(copy.deepcopy(sam_cfn), {s["sam"]: s["value"] for s in settings})
    cdk = Template(json.loads(find_cdk_template(cdk_alt_out).read_text()))
    parity_facts(sam, cdk, report, "sam=cdk other settings")


def starter_facts(args, report: Report) -> None:
    """The crate `triage init` wrote: its SAM template is infra/template.yaml with the build
    parameters' defaults on the crate; SAM and CDK hold every fact the reference stacks hold, and
    the same resources as each other; both build the crate's own binary."""
    crate = Path(args.dir)
    starter_path = crate / "template.yaml"
    if args.runtime != "rust":
        return layered_starter_facts(args, report)
    ref_lines = (ROOT / "infra/template.yaml").read_text().splitlines()
    lines = starter_path.read_text().splitlines()
    changed = [(a, b) for a, b in zip(ref_lines, lines) if a != b]
    report.fact("[starter] template.yaml is infra/template.yaml but for the defaults of CrateDir (.) and "
                f"BinaryName ({args.name}) and the function's description",
                len(ref_lines) == len(lines)
                and changed == [("    Default: ..", "    Default: ."), ("    Default: triage-lambda", f"    Default: {args.name}"),
                                ("      Description: sqs-triage reference function (triage-lambda)",
                                 f"      Description: {args.name} (sqs-triage)")],
                f"{len(ref_lines)} / {len(lines)} lines, changed {changed[:4]}")
    starter_raw = load_yaml_template(starter_path)
    sam_cfn = json.loads(Path(args.sam_cfn).read_text())
    cdk_out = Path(args.cdk_out)
    cdk_cfn = json.loads(find_cdk_template(cdk_out).read_text())
    derived = Derived(ROOT)
    limits = json.loads(Path(args.limits).read_text())
    factor = rust_factor(ROOT)
    sam_only_facts(starter_path, starter_raw, sam_cfn, report, "starter sam")
    Facts("starter sam", Template(copy.deepcopy(sam_cfn)), report, derived, factor, limits, fifo=False).run()
    Facts("starter cdk", Template(copy.deepcopy(cdk_cfn)), report, derived, factor, limits, fifo=False).run()
    cdk_only_facts(cdk_out, cdk_cfn, report, args.name, "starter cdk")
    parity_facts(Template(copy.deepcopy(sam_cfn)), Template(copy.deepcopy(cdk_cfn)), report, "starter sam=cdk")


# --------------------------------------------------------------------------- the Python variant

PYTHON_TEMPLATE_HEADER = """# Generated from infra/template.yaml by `python3 infra/check_templates.py python-template --write`;
# `bash infra/check.sh` fails when it differs. Edit infra/template.yaml (or the generator) instead.
"""

PYTHON_DESCRIPTION = """Description: >-
  sqs-triage: a Python function through the sqs-triage layer behind an SQS queue (partial batch
  responses), its DLQ, the DynamoDB state table (attempt ledger and circuit breakers), alarms and
  a dashboard: infra/template.yaml's resources, the layer added. `cdk synth -c runtime=python`
  builds the same resources with the same settings.
"""

PYTHON_BUILD_PARAMS = """  HandlerDir:
    Type: String
    Description: >-
      The folder of the handler's code (sam build's CodeUri), relative to this template. `sam
      build` reads it (default or --parameter-overrides); CloudFormation never sees it.
    Default: ../examples/layer/python
  JobTypes:
    Type: String
    Description: TRIAGE_JOB_TYPES, the job types the handler takes, comma-separated (any other goes to the DLQ as invalid).
    Default: example.echo
    AllowedPattern: "^[^,\\\\s]{1,256}(,[^,\\\\s]{1,256})*$"
    ConstraintDescription: job types of 1 to 256 characters separated by commas, without spaces
"""

PYTHON_FUNCTION = """  # The extension, the exec wrapper and the helpers: `bash infra/layer/build.sh` writes the zip
  # (sam build cannot take the path from a parameter). The function's architecture and runtime only.
  TriageLayer:
    Type: AWS::Serverless::LayerVersion
    Properties:
      LayerName: !Sub "${AWS::StackName}-sqs-triage"
      Description: "sqs-triage: the extension, the exec wrapper and the Python and Node.js helpers (infra/layer/build.sh)"
      ContentUri: ../.local/layer/sqs-triage-layer-arm64.zip
      CompatibleArchitectures: [arm64]
      CompatibleRuntimes: [python3.13]
      RetentionPolicy: Delete

  # The layer's extension splits each batch into one invocation per record and settles the
  # batch as triage-lambda does: the same variables, role, mapping, alarms and dashboard.
  TriageLambda:
    Type: AWS::Serverless::Function
    Properties:
      FunctionName: !Sub "${AWS::StackName}-triage-lambda"
      Description: sqs-triage reference function (Python, through the sqs-triage layer)
      CodeUri: !Ref HandlerDir
      Handler: handler.handler
      Runtime: python3.13
      Architectures: [arm64]
      Layers: [!Ref TriageLayer]
"""


def python_template(text: str) -> str:
    """infra/template.yaml with a Python function through the layer instead of triage-lambda."""
    lines = text.splitlines(keepends=True)

    def index(prefix: str, start: int = 0) -> int:
        for i in range(start, len(lines)):
            if lines[i].startswith(prefix):
                return i
        raise SystemExit(f"infra/template.yaml: no line starting {prefix!r} (the python-template generator needs it)")

    d0, p0 = index("Description: >-"), index("Parameters:")
    c0, c1 = index("  CrateDir:"), index("  FunctionTimeout:")
    f0 = index("  TriageLambda:")
    f1 = index("      MemorySize: !Ref FunctionMemory", f0)
    e0 = index("          RUST_LOG: info", f1)
    env = ["          AWS_LAMBDA_EXEC_WRAPPER: /opt/sqs-triage-wrapper\n",
           "          TRIAGE_JOB_TYPES: !Ref JobTypes\n"]
    out = (lines[:d0] + [PYTHON_DESCRIPTION, "\n"] + lines[p0:c0] + [PYTHON_BUILD_PARAMS] + lines[c1:f0]
           + [PYTHON_FUNCTION] + lines[f1:e0 + 1] + env + lines[e0 + 1:])
    return PYTHON_TEMPLATE_HEADER + "".join(out)


def layer_sam_facts(sam_path: Path, sam_raw: dict, report: Report, tag: str, layer_zip: str,
                    handler_file: str = "handler.py") -> None:
    """What `sam build` and `sam package` read: the handler's folder (HandlerDir's default) holds
    its handler, and the layer's ContentUri is the zip the layer build writes."""
    fn = next(r for r in sam_raw["Resources"].values() if r["Type"] == "AWS::Serverless::Function")
    layer = next(r for r in sam_raw["Resources"].values() if r["Type"] == "AWS::Serverless::LayerVersion")

    def code():
        uri = fn["Properties"]["CodeUri"]
        folder = sam_raw["Parameters"]["HandlerDir"]["Default"] if uri == {"Ref": "HandlerDir"} else None
        if folder is None:
            return False, f"CodeUri {uri}: a Ref to HandlerDir"
        module, func = fn["Properties"]["Handler"].rsplit(".", 1)
        path = (sam_path.parent / folder / handler_file).resolve()
        text = path.read_text() if path.exists() else ""
        defines = re.search(rf"^(def {func}\(|export (async )?function {func}\()", text, re.M)
        return (path.stem == module and bool(defines) and "Metadata" not in fn,
                f"CodeUri {uri} -> {path} (exists {path.exists()}), Handler {fn['Properties']['Handler']}")

    report.check(f"[{tag}] function code: HandlerDir's default holds {handler_file} defining the handler (sam build's "
                 "default build for the runtime)", code)
    report.check(f"[{tag}] layer content is the layer build's zip ({layer_zip}, relative to the template)", lambda: (
        layer["Properties"].get("ContentUri") == layer_zip, str(layer["Properties"].get("ContentUri"))))


def cdk_layer_facts(cdk_out: Path, cdk_cfn: dict, report: Report, tag: str, handler_file: str = "handler.py") -> None:
    def asset_of(rtype):
        r = next(r for r in cdk_cfn["Resources"].values() if r["Type"] == rtype)
        asset = Path(r["Metadata"]["aws:asset:path"])
        return asset if asset.is_absolute() else cdk_out / asset

    def code():
        asset = asset_of("AWS::Lambda::Function")
        return (asset / handler_file).exists(), str(asset)

    def layer():
        import zipfile

        asset = asset_of("AWS::Lambda::LayerVersion")
        # The asset of a .zip is the zip itself (staged as is); the check's is a stand-in.
        ok = asset.is_file() and zipfile.is_zipfile(asset) and "sqs-triage-wrapper" in zipfile.ZipFile(asset).namelist()
        return ok, str(asset)

    report.check(f"[{tag}] function code is the handler's folder ({handler_file})", code)
    report.check(f"[{tag}] layer content is a zip with the wrapper at its root (the layer build's, or the check's "
                 "stand-in)", layer)


def python_template_facts(report: Report) -> None:
    want = python_template((ROOT / "infra/template.yaml").read_text())
    path = ROOT / "infra/template-python.yaml"
    have = path.read_text() if path.exists() else ""
    diff = list(difflib.unified_diff(have.splitlines(), want.splitlines(), "infra/template-python.yaml", "generated", lineterm="", n=0))
    report.fact("[sam python] infra/template-python.yaml is infra/template.yaml with the Python function through the layer "
                "(`python3 infra/check_templates.py python-template --write`)", not diff, "\n".join(diff[:20]))


# What `triage init --runtime R` writes for a handler through the layer: its runtime, handler file.
LAYERED_STARTERS = {"python": ("python3.13", "handler.py"), "node": ("nodejs22.x", "handler.mjs")}


def layered_starter_facts(args, report: Report) -> None:
    """The project `triage init --runtime python|node` wrote: its SAM template is
    infra/template-python.yaml with its handler folder, job type, layer zip and description (and
    the runtime, for Node.js); both stacks hold the Python variant's facts and match each other."""
    runtime, handler_file = LAYERED_STARTERS[args.runtime]
    tag = f"starter {args.runtime}"
    crate = Path(args.dir)
    starter_path = crate / "template.yaml"
    ref_lines = [ln for ln in (ROOT / "infra/template-python.yaml").read_text().splitlines()][2:]
    lines = starter_path.read_text().splitlines()
    changed = [(a, b) for a, b in zip(ref_lines, lines) if a != b]
    want = [("    Default: ../examples/layer/python", "    Default: src"),
            ("    Default: example.echo", f"    Default: {args.name}"),
            ("      ContentUri: ../.local/layer/sqs-triage-layer-arm64.zip", "      ContentUri: layer/sqs-triage-layer-arm64.zip"),
            ("      Description: sqs-triage reference function (Python, through the sqs-triage layer)",
             f"      Description: {args.name} (sqs-triage)"),
            ("  a dashboard: infra/template.yaml's resources, the layer added. `cdk synth -c runtime=python`",
             "  a dashboard, the layer added. The CDK app in cdk/ builds the same resources with the"),
            ("  builds the same resources with the same settings.", "  same settings.")]
    if runtime != "python3.13":
        want += [("  sqs-triage: a Python function through the sqs-triage layer behind an SQS queue (partial batch",
                  "  sqs-triage: a Node.js function through the sqs-triage layer behind an SQS queue (partial batch"),
                 ("      CompatibleRuntimes: [python3.13]", f"      CompatibleRuntimes: [{runtime}]"),
                 ("      Runtime: python3.13", f"      Runtime: {runtime}")]
    report.fact(f"[{tag}] template.yaml is infra/template-python.yaml but for the handler folder (src), job type "
                f"({args.name}), layer zip (layer/), description" + ("" if runtime == "python3.13" else " and runtime"),
                len(ref_lines) == len(lines) and sorted(changed) == sorted(want),
                f"{len(ref_lines)} / {len(lines)} lines, changed {changed[:8]}")
    raw = load_yaml_template(starter_path)
    sam_cfn = json.loads(Path(args.sam_cfn).read_text())
    cdk_out = Path(args.cdk_out)
    cdk_cfn = json.loads(find_cdk_template(cdk_out).read_text())
    derived, limits, factor = Derived(ROOT), json.loads(Path(args.limits).read_text()), rust_factor(ROOT)
    Facts(f"{tag} sam", Template(copy.deepcopy(sam_cfn)), report, derived, factor, limits, fifo=False, runtime=runtime).run()
    layer_sam_facts(starter_path, raw, report, f"{tag} sam", "layer/sqs-triage-layer-arm64.zip", handler_file)
    Facts(f"{tag} cdk", Template(copy.deepcopy(cdk_cfn)), report, derived, factor, limits, fifo=False, runtime=runtime).run()
    cdk_only_facts(cdk_out, cdk_cfn, report, tag=f"{tag} cdk", code=False)
    cdk_layer_facts(cdk_out, cdk_cfn, report, f"{tag} cdk", handler_file)
    for t in (Template(copy.deepcopy(sam_cfn)), Template(copy.deepcopy(cdk_cfn))):
        env = t.props(t.of_type("AWS::Lambda::Function")[0]).get("Environment", {}).get("Variables", {})
        report.fact(f"[{tag}] TRIAGE_JOB_TYPES is the project's job type ({args.name})",
                    env.get("TRIAGE_JOB_TYPES") == args.name, str(env.get("TRIAGE_JOB_TYPES")))
    parity_facts(Template(copy.deepcopy(sam_cfn)), Template(copy.deepcopy(cdk_cfn)), report, f"{tag} sam=cdk",
                 PARITY_ALLOWED_LAYER)


def find_cdk_template(cdk_out: Path) -> Path:
    manifest = json.loads((cdk_out / "manifest.json").read_text())
    for art in manifest["artifacts"].values():
        if art.get("type") == "aws:cloudformation:stack":
            return cdk_out / art["properties"]["templateFile"]
    raise SystemExit(f"no stack template in {cdk_out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("translate")
    tr.add_argument("sam")
    tr.add_argument("out")
    sr = sub.add_parser("sam-rules", help="rewrite the SAM template's generated Rules section")
    sr.add_argument("sam")
    sub.add_parser("lambda-calls", help="print the SDK calls derived from triage-lambda's source")
    pt = sub.add_parser("python-template", help="print infra/template-python.yaml as generated from infra/template.yaml")
    pt.add_argument("--write", action="store_true", help="write it instead")
    pc = sub.add_parser("cdk-context", help="print `-c key=value` arguments for the CDK app, one a line")
    pc.add_argument("settings")
    ck = sub.add_parser("check")
    ck.add_argument("--sam", required=True)
    ck.add_argument("--sam-cfn", required=True)
    ck.add_argument("--cdk-out", required=True)
    ck.add_argument("--events", help="folder of sample SqsEvent files")
    ck.add_argument("--schema", help="envelope JSON Schema")
    ck.add_argument("--cdk-other-out", help="the CDK app synthesized with the values of --other-settings")
    ck.add_argument("--other-settings", help="infra/parity-settings.json")
    ck.add_argument("--cdk-fifo-out", help="the CDK app synthesized with -c queueType=fifo")
    ck.add_argument("--sam-python", help="infra/template-python.yaml")
    ck.add_argument("--sam-python-cfn", help="infra/template-python.yaml, translated")
    ck.add_argument("--cdk-python-out", help="the CDK app synthesized with -c runtime=python")
    ck.add_argument("--limits", required=True,
                    help="src/config.rs's limits as JSON (`cargo run -p triage --example config_limits`)")
    st = sub.add_parser("starter", help="check the crate `triage init` wrote (its SAM template and CDK app)")
    st.add_argument("--dir", required=True, help="the generated crate")
    st.add_argument("--name", required=True, help="the NAME it was generated with")
    st.add_argument("--sam-cfn", required=True, help="its template.yaml, translated")
    st.add_argument("--cdk-out", required=True, help="its CDK app, synthesized with -c stackName=" + STACK)
    st.add_argument("--limits", required=True)
    st.add_argument("--runtime", default="rust", choices=["rust", *LAYERED_STARTERS],
                    help="the --runtime it was generated with")
    args = ap.parse_args()

    if args.cmd == "starter":
        report = Report()
        starter_facts(args, report)
        print(f"{report.passed} passed, {report.failed} failed")
        return 1 if report.failed else 0
    if args.cmd == "translate":
        translate(Path(args.sam), Path(args.out))
        return 0
    if args.cmd == "python-template":
        text = python_template((ROOT / "infra/template.yaml").read_text())
        if args.write:
            (ROOT / "infra/template-python.yaml").write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    if args.cmd == "sam-rules":
        write_sam_rules(Path(args.sam), rust_factor(ROOT))
        return 0
    if args.cmd == "cdk-context":
        for s in parity_settings(Path(args.settings)):
            print("-c")
            print(f"{s['cdk']}={s['value']}")
        return 0
    if args.cmd == "lambda-calls":
        d = Derived(ROOT)
        print(d.summary())
        for problem in d.problems:
            print(f"PROBLEM {problem}")
        return 1 if d.problems else 0

    report = Report()
    sam_path = Path(args.sam)
    sam_raw = load_yaml_template(sam_path)
    sam_cfn = json.loads(Path(args.sam_cfn).read_text())
    cdk_out = Path(args.cdk_out)
    cdk_cfn = json.loads(find_cdk_template(cdk_out).read_text())

    report.fact("[sam] translated template has no Serverless resources left",
                not any(r["Type"].startswith("AWS::Serverless::") for r in sam_cfn["Resources"].values()))
    derived = Derived(ROOT)
    report.fact("[source] SDK calls triage-lambda can make, from triage/src/bin/triage-lambda.rs down: " + derived.summary(),
                bool(derived.calls) and not derived.problems, "; ".join(derived.problems))
    limits = json.loads(Path(args.limits).read_text())
    generated_facts(limits, report)
    factor = rule_facts(ROOT, sam_raw, limits, report)
    Facts("sam", Template(copy.deepcopy(sam_cfn)), report, derived, factor, limits, fifo=False).run()
    sam_only_facts(sam_path, sam_raw, sam_cfn, report)
    Facts("cdk", Template(copy.deepcopy(cdk_cfn)), report, derived, factor, limits, fifo=False).run()
    cdk_only_facts(cdk_out, cdk_cfn, report)
    parity_facts(Template(copy.deepcopy(sam_cfn)), Template(copy.deepcopy(cdk_cfn)), report)
    cdk_fifo_cfn = None
    if args.cdk_fifo_out:
        cdk_fifo_cfn = json.loads(find_cdk_template(Path(args.cdk_fifo_out)).read_text())
        Facts("sam fifo", Template(copy.deepcopy(sam_cfn), VARIANT_PARAMS), report, derived, factor, limits,
              fifo=True).run()
        Facts("cdk fifo", Template(copy.deepcopy(cdk_fifo_cfn)), report, derived, factor, limits, fifo=True).run()
        parity_facts(Template(copy.deepcopy(sam_cfn), VARIANT_PARAMS), Template(copy.deepcopy(cdk_fifo_cfn)), report,
                     "sam=cdk fifo")
    if args.cdk_other_out and args.other_settings:
        other_settings_facts(sam_raw, sam_cfn, Path(args.cdk_other_out), Path(args.other_settings), report)
    if args.events and args.schema:
        events_facts(Path(args.events), Path(args.schema), report)
    if args.sam_python and args.sam_python_cfn and args.cdk_python_out:
        python_template_facts(report)
        py_raw = load_yaml_template(Path(args.sam_python))
        py_sam = json.loads(Path(args.sam_python_cfn).read_text())
        py_out = Path(args.cdk_python_out)
        py_cdk = json.loads(find_cdk_template(py_out).read_text())
        Facts("sam python", Template(copy.deepcopy(py_sam)), report, derived, factor, limits, fifo=False,
              runtime="python3.13").run()
        layer_sam_facts(Path(args.sam_python), py_raw, report, "sam python", "../.local/layer/sqs-triage-layer-arm64.zip")
        Facts("cdk python", Template(copy.deepcopy(py_cdk)), report, derived, factor, limits, fifo=False,
              runtime="python3.13").run()
        cdk_only_facts(py_out, py_cdk, report, tag="cdk python", code=False)
        cdk_layer_facts(py_out, py_cdk, report, "cdk python")
        parity_facts(Template(copy.deepcopy(py_sam)), Template(copy.deepcopy(py_cdk)), report, "sam=cdk python",
                     PARITY_ALLOWED_LAYER)
    mutant_facts(sam_cfn, cdk_cfn, derived, factor, limits, report)
    if cdk_fifo_cfn is not None:
        fifo_mutant_facts(sam_cfn, cdk_fifo_cfn, derived, factor, limits, report)

    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
