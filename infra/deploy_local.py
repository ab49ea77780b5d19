#!/usr/bin/env python3
"""Deploys the translated templates into the local stack's CloudFormation (moto) and checks the
resources it created through the SQS, DynamoDB, Lambda, Logs and CloudWatch APIs.

    deploy_local.py --sam-cfn OUT/sam-template.json --cdk-out OUT/cdk.out [--cdk-fifo-out OUT/cdk-fifo.out]

Deploys, each under a stack name of its own (deleted afterwards, pass or fail):
  - the SAM translator's output with its defaults (standard queues), and with QueueType=fifo;
  - the `cdk synth` output (standard), and the FIFO variant's (`-c queueType=fifo`) when given;
  - the Python variant's (infra/template-python.yaml translated, `cdk synth -c runtime=python`)
    when given: the layer created and attached, the wrapper variable set;
  - broken copies, each of which must fail a check (a source queue whose maxReceiveCount is
    below the receive rule, SAM and CDK; FIFO queues with content-based deduplication on).

One line per fact, then `N passed, M failed`; exit status 1 on any failure. Runs with the local
stack's Python (.local/venv: boto3 comes with moto). The endpoint is TRIAGE_MOTO_ENDPOINT
(default http://127.0.0.1:45660): moto's server answers every service on one port.

What moto 5.2.5's CloudFormation does not create or keep is listed in UNSUPPORTED_TYPES and
NOT_KEPT below (and docs/deploy.md); infra/check_templates.py checks those statically.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import re
import sys
import time
import uuid
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
TABLE_RS = ROOT / "src/effects/table.rs"
SETUP_RS = ROOT / "triage/src/ops/setup.rs"

# The stacks' defaults (infra/template.yaml's parameters, infra/cdk/cdk.json's context).
EXPECT = {
    "maxReceiveCount": 100,
    "sourceRetention": 864000,
    "dlqRetention": 1209600,
    "maxMessageSize": 1048576,
    "functionTimeout": 30,
    "batchSize": 10,
    "batchingWindow": 0,
    "maxConcurrency": 5,
    "logRetentionDays": 30,
}
VISIBILITY_FACTOR = 6

# Resource types moto's CloudFormation does not create (the stack still completes without them).
UNSUPPORTED_TYPES = {
    "AWS::SQS::QueuePolicy": "the TLS-only queue policies",
    "AWS::CloudWatch::Alarm": "the alarms",
}
# Settings moto creates the resource without (so nothing to read back through the APIs).
NOT_KEPT = [
    "DynamoDB TimeToLiveSpecification, PointInTimeRecoverySpecification and SSESpecification "
    "(the TTL attribute is read back from the stack's template through the CloudFormation API)",
    "SQS RedriveAllowPolicy (GetQueueAttributes does not return it)",
    "Lambda Architectures, LoggingConfig and Code (the function is created from a placeholder zip)",
    "Lambda Layers (the layer is created, not attached: the attachment is checked statically)",
    "the CDK bootstrap version check (parameter BootstrapVersion and rule CheckBootstrapVersion: dropped "
    "from the deployed copy)",
]


class Report:
    def __init__(self, quiet: bool = False):
        self.passed = 0
        self.failed = 0
        self.failures: list[str] = []
        self.quiet = quiet

    def fact(self, label: str, ok: bool, detail: str = "") -> None:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(label)
        if not self.quiet:
            print(f"{'ok  ' if ok else 'FAIL'} {label}{'' if ok or not detail else ': ' + detail}")

    def check(self, label: str, fn) -> None:
        try:
            ok, detail = fn()
        except Exception as e:  # a missing resource or attribute is a failed fact
            ok, detail = False, f"{type(e).__name__}: {e}"
        self.fact(label, ok, detail)


def code_names() -> dict:
    """The state table's key and TTL attribute names the code uses (src/effects/table.rs), and
    the receive rule's factor (triage/src/ops/setup.rs)."""
    text = TABLE_RS.read_text()

    def const(name: str) -> str:
        m = re.search(rf'const {name}: &str = "([^"]+)";', text)
        if not m:
            raise SystemExit(f"{TABLE_RS}: no const {name}")
        return m.group(1)

    m = re.search(r"pub const RECEIVES_PER_ATTEMPT: u32 = (\d+);", SETUP_RS.read_text())
    if not m:
        raise SystemExit(f"{SETUP_RS}: no RECEIVES_PER_ATTEMPT")
    return {"pk": const("PK"), "sk": const("SK"), "ttl": const("TTL_ATTRIBUTE"), "factor": int(m.group(1))}


class Aws:
    def __init__(self, endpoint: str):
        import boto3
        from botocore.config import Config

        kw = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id="test",
                  aws_secret_access_key="test", config=Config(retries={"max_attempts": 2}))
        self.cf = boto3.client("cloudformation", **kw)
        self.sqs = boto3.client("sqs", **kw)
        self.ddb = boto3.client("dynamodb", **kw)
        self.lam = boto3.client("lambda", **kw)
        self.logs = boto3.client("logs", **kw)
        self.cw = boto3.client("cloudwatch", **kw)
        self.s3 = boto3.client("s3", **kw)
        self.sts = boto3.client("sts", **kw)


# --------------------------------------------------------------------------- the deployed copy

def placeholder_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("bootstrap", "#!/bin/sh\necho placeholder: the real artifact is checked by infra/local/artifact-check.sh\n")
    return buf.getvalue()


def walk_strings(x, f):
    if isinstance(x, dict):
        return {k: walk_strings(v, f) for k, v in x.items()}
    if isinstance(x, list):
        return [walk_strings(v, f) for v in x]
    if isinstance(x, str):
        return f(x)
    return x


def for_moto(template: dict, bucket: str, key: str, rename: tuple[str, str] | None) -> tuple[dict, list[str]]:
    """The copy of a template that moto can deploy, and what was changed for it (only what moto
    needs: nothing the checks read)."""
    t = copy.deepcopy(template)
    notes = []
    if rename:
        # The CDK app writes its stackName context into the names (literal 'sqs-triage-jobs'...):
        # the copy takes the stack's own unique name.
        old, new = rename
        # Not the layer's wrapper path (/opt/sqs-triage-wrapper), which no stack name is part of.
        t = walk_strings(t, lambda s: re.sub(rf"(?<![\w-]){re.escape(old)}(?=-)(?!-wrapper)", new, s))
        notes.append(f"names {old}-* renamed {new}-*")
    for rid, r in t.get("Resources", {}).items():
        if r.get("Type") == "AWS::Lambda::Function":
            r["Properties"]["Code"] = {"S3Bucket": bucket, "S3Key": key}
        if r.get("Type") == "AWS::Lambda::LayerVersion":
            r["Properties"]["Content"] = {"S3Bucket": bucket, "S3Key": key}
            notes.append("layer content: the placeholder zip")
    notes.append("function code: a placeholder zip in a bucket of the run's own")
    params = t.get("Parameters", {})
    # CloudFormation passes parameters as strings; moto turns a Number into an int, and then
    # cannot find it among a mapping's keys (Fn::FindInMap [VisibilityByTimeout, !Ref FunctionTimeout]).
    mapped = set()

    def find_refs(x):
        if isinstance(x, dict):
            if "Fn::FindInMap" in x:
                for k in x["Fn::FindInMap"][1:]:
                    if isinstance(k, dict) and "Ref" in k:
                        mapped.add(k["Ref"])
            for v in x.values():
                find_refs(v)
        elif isinstance(x, list):
            for v in x:
                find_refs(v)

    find_refs(t.get("Resources", {}))
    for p in sorted(mapped & set(params)):
        if params[p].get("Type") == "Number":
            params[p]["Type"] = "String"
            params[p]["Default"] = str(params[p]["Default"])
            params[p]["AllowedValues"] = [str(v) for v in params[p].get("AllowedValues", [])] or None
            if params[p]["AllowedValues"] is None:
                del params[p]["AllowedValues"]
            notes.append(f"parameter {p} typed String (a mapping key)")
    if "BootstrapVersion" in params:
        del params["BootstrapVersion"]
        t.get("Rules", {}).pop("CheckBootstrapVersion", None)
        if not t.get("Rules"):
            t.pop("Rules", None)
        notes.append("CDK bootstrap version check dropped")
    return t, notes


# --------------------------------------------------------------------------- one deployment

class Deployment:
    def __init__(self, aws: Aws, label: str, template: dict, params: dict, fifo: bool, rename: str | None,
                 expect: dict, runtime: str = "rust"):
        self.runtime = runtime
        self.aws = aws
        self.label = label
        self.template = template
        self.params = params
        self.fifo = fifo
        self.rename = rename
        self.expect = expect
        self.stack = f"triage-cfn-{uuid.uuid4().hex[:10]}"
        self.bucket = f"{self.stack}-code"
        self.created = False
        self.error: str | None = None
        self.made: dict[str, str] = {}

    def deploy(self) -> bool:
        a = self.aws
        a.s3.create_bucket(Bucket=self.bucket)
        a.s3.put_object(Bucket=self.bucket, Key="bootstrap.zip", Body=placeholder_zip())
        body, self.notes = for_moto(self.template, self.bucket, "bootstrap.zip",
                                    (self.rename, self.stack) if self.rename else None)
        self.deployed = body
        try:
            a.cf.create_stack(StackName=self.stack, TemplateBody=json.dumps(body),
                              Parameters=[{"ParameterKey": k, "ParameterValue": str(v)} for k, v in self.params.items()],
                              Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"])
            self.created = True
        except Exception as e:  # refused: a broken copy may be
            self.error = f"{type(e).__name__}: {e}"
            try:
                self.created = self.stack_exists()
            except Exception:  # moto keeps a refused stack half made, and may fail to describe it
                self.created = True
            return False
        for _ in range(120):
            st = a.cf.describe_stacks(StackName=self.stack)["Stacks"][0]
            if not st["StackStatus"].endswith("_IN_PROGRESS"):
                break
            time.sleep(0.25)
        if st["StackStatus"] != "CREATE_COMPLETE":
            self.error = f"{st['StackStatus']} {st.get('StackStatusReason', '')}"
            return False
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in st.get("Outputs", [])}
        self.resources = {r["LogicalResourceId"]: r for r in
                          a.cf.describe_stack_resources(StackName=self.stack)["StackResources"]
                          if r.get("LogicalResourceId")}
        return True

    def stack_exists(self) -> bool:
        try:
            st = self.aws.cf.describe_stacks(StackName=self.stack)["Stacks"][0]
        except self.aws.cf.exceptions.ClientError as e:
            if "does not exist" in str(e):
                return False
            raise
        return st["StackStatus"] != "DELETE_COMPLETE"

    def delete(self) -> str:
        a = self.aws
        problems = []
        if self.created:
            try:
                a.cf.delete_stack(StackName=self.stack)
                for _ in range(120):
                    if not self.stack_exists():
                        break
                    time.sleep(0.25)
                else:
                    problems.append("stack not deleted")
            except Exception as e:
                if not self.error:  # a refused stack: moto may not describe or delete what it half made
                    problems.append(f"stack: {type(e).__name__}: {e}")
        # A refused stack may leave what moto made before the refusal; a deleted one, nothing.
        left = a.sqs.list_queues(QueueNamePrefix=self.stack).get("QueueUrls", [])
        for url in left:
            a.sqs.delete_queue(QueueUrl=url)
        if left and self.created and not self.error:
            problems.append(f"queues left behind by the stack's deletion: {left}")
        for what, gone in (("table", lambda n: a.ddb.describe_table(TableName=n)),
                           ("function", lambda n: a.lam.get_function(FunctionName=n))):
            name = self.made.get(what)
            if name:
                try:
                    gone(name)
                    problems.append(f"{what} {name} left behind")
                except Exception:
                    pass
        # moto's CloudFormation does not delete a stack's layer versions: removed here.
        try:
            for v in a.lam.list_layers().get("Layers", []):
                if self.stack in v["LayerName"]:
                    a.lam.delete_layer_version(LayerName=v["LayerName"],
                                               VersionNumber=v["LatestMatchingVersion"]["Version"])
        except Exception as e:
            problems.append(f"layer: {e}")
        try:
            for o in a.s3.list_objects_v2(Bucket=self.bucket).get("Contents", []):
                a.s3.delete_object(Bucket=self.bucket, Key=o["Key"])
            a.s3.delete_bucket(Bucket=self.bucket)
        except Exception as e:
            problems.append(f"bucket: {e}")
        return "; ".join(problems)

    # -- lookups
    def of_type(self, t: str) -> list[str]:
        return [k for k, r in self.template["Resources"].items() if r["Type"] == t]

    def physical(self, rid: str) -> str:
        return self.resources[rid]["PhysicalResourceId"]

    def run(self, r: Report, names: dict) -> None:
        tag = f"[{self.label}]"
        if not self.deploy():
            r.fact(f"{tag} stack created in moto's CloudFormation", False, self.error or "")
            return
        r.fact(f"{tag} stack created in moto's CloudFormation ({self.stack}; for moto: {'; '.join(self.notes)})", True)
        a = self.aws

        # -- what moto created, what it skipped
        made = {rid for rid in self.resources}
        skipped = {rid: res["Type"] for rid, res in self.template["Resources"].items() if rid not in made}
        r.fact(f"{tag} every resource was created but the types moto's CloudFormation does not support "
               f"({', '.join(sorted(UNSUPPORTED_TYPES))}: checked statically)",
               set(skipped.values()) <= set(UNSUPPORTED_TYPES) and bool(made),
               f"not created: {skipped}")

        # -- the function and the mapping (Lambda API)
        fn_id = self.of_type("AWS::Lambda::Function")[0]
        fn = a.lam.get_function(FunctionName=self.physical(fn_id))["Configuration"]
        self.made["function"] = fn["FunctionName"]
        env = fn.get("Environment", {}).get("Variables", {})
        esm_id = self.of_type("AWS::Lambda::EventSourceMapping")[0]
        esm = a.lam.get_event_source_mapping(UUID=self.physical(esm_id))

        # -- the queues (SQS API), found from the mapping and the redrive policy
        src_arn = esm["EventSourceArn"]
        src_name = src_arn.rsplit(":", 1)[1]
        src_url = a.sqs.get_queue_url(QueueName=src_name)["QueueUrl"]
        src = a.sqs.get_queue_attributes(QueueUrl=src_url, AttributeNames=["All"])["Attributes"]
        redrive = json.loads(src.get("RedrivePolicy", "{}"))
        dlq_name = redrive.get("deadLetterTargetArn", ":").rsplit(":", 1)[1]
        dlq_url = a.sqs.get_queue_url(QueueName=dlq_name)["QueueUrl"]
        dlq = a.sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["All"])["Attributes"]
        attempts = int(env.get("TRIAGE_MAX_ATTEMPTS", 0))
        ex = self.expect

        r.fact(f"{tag} the mapping reads a queue of this stack, which redrives to a DLQ of this stack",
               src_name.startswith(self.stack) and dlq_name.startswith(self.stack) and src_name != dlq_name,
               f"source {src_name}, DLQ {dlq_name}")
        r.fact(f"{tag} source queue RedrivePolicy: the DLQ's ARN, maxReceiveCount {ex['maxReceiveCount']} "
               f"(>= {names['factor']} x TRIAGE_MAX_ATTEMPTS {attempts})",
               redrive.get("deadLetterTargetArn") == dlq.get("QueueArn")
               and int(redrive.get("maxReceiveCount", -1)) == ex["maxReceiveCount"]
               and attempts >= 1 and int(redrive["maxReceiveCount"]) >= names["factor"] * attempts,
               json.dumps(redrive))
        r.fact(f"{tag} retention: source {ex['sourceRetention']} s, DLQ {ex['dlqRetention']} s",
               int(src["MessageRetentionPeriod"]) == ex["sourceRetention"]
               and int(dlq["MessageRetentionPeriod"]) == ex["dlqRetention"],
               f"source {src['MessageRetentionPeriod']}, DLQ {dlq['MessageRetentionPeriod']}")
        r.fact(f"{tag} MaximumMessageSize {ex['maxMessageSize']} on both queues",
               int(src["MaximumMessageSize"]) == ex["maxMessageSize"] == int(dlq["MaximumMessageSize"]),
               f"source {src['MaximumMessageSize']}, DLQ {dlq['MaximumMessageSize']}")
        r.fact(f"{tag} both queues encrypted (SqsManagedSseEnabled)",
               src.get("SqsManagedSseEnabled") == "true" == dlq.get("SqsManagedSseEnabled") or
               bool(src.get("KmsMasterKeyId") and dlq.get("KmsMasterKeyId")),
               f"source {src.get('SqsManagedSseEnabled')}, DLQ {dlq.get('SqsManagedSseEnabled')}")
        r.fact(f"{tag} source visibility timeout = {VISIBILITY_FACTOR} x the function's timeout ({ex['functionTimeout']} s)",
               int(fn["Timeout"]) == ex["functionTimeout"]
               and int(src["VisibilityTimeout"]) == VISIBILITY_FACTOR * int(fn["Timeout"]),
               f"visibility {src['VisibilityTimeout']}, timeout {fn['Timeout']}")
        if self.fifo:
            r.fact(f"{tag} FIFO: both queues FifoQueue, ContentBasedDeduplication false, names end .fifo",
                   src.get("FifoQueue") == "true" == dlq.get("FifoQueue")
                   and src.get("ContentBasedDeduplication") == "false" == dlq.get("ContentBasedDeduplication")
                   and src_name.endswith(".fifo") and dlq_name.endswith(".fifo"),
                   json.dumps({k: [src.get(k), dlq.get(k)] for k in ("FifoQueue", "ContentBasedDeduplication")})
                   + f" {src_name} {dlq_name}")
        else:
            r.fact(f"{tag} standard: neither queue is FIFO",
                   src.get("FifoQueue", "false") == "false" == dlq.get("FifoQueue", "false")
                   and not src_name.endswith(".fifo") and not dlq_name.endswith(".fifo"),
                   f"{src.get('FifoQueue')} {dlq.get('FifoQueue')} {src_name} {dlq_name}")

        # -- the table (DynamoDB API)
        table_id = self.of_type("AWS::DynamoDB::Table")[0]
        table = a.ddb.describe_table(TableName=self.physical(table_id))["Table"]
        self.made["table"] = table["TableName"]
        r.fact(f"{tag} table key schema is the code's: {names['pk']} (HASH, S), {names['sk']} (RANGE, S); on-demand",
               {k["KeyType"]: k["AttributeName"] for k in table["KeySchema"]} == {"HASH": names["pk"], "RANGE": names["sk"]}
               and sorted((d["AttributeName"], d["AttributeType"]) for d in table["AttributeDefinitions"])
               == sorted([(names["pk"], "S"), (names["sk"], "S")])
               and table.get("BillingModeSummary", {}).get("BillingMode") == "PAY_PER_REQUEST",
               json.dumps({"KeySchema": table["KeySchema"], "AttributeDefinitions": table["AttributeDefinitions"],
                           "Billing": table.get("BillingModeSummary")}))
        ttl = a.ddb.describe_time_to_live(TableName=table["TableName"])["TimeToLiveDescription"]
        held = a.cf.get_template(StackName=self.stack)["TemplateBody"]
        held = held if isinstance(held, dict) else json.loads(held)
        spec = held["Resources"][table_id]["Properties"].get("TimeToLiveSpecification", {})
        r.fact(f"{tag} table TTL on the code's attribute {names['ttl']} (moto does not apply "
               "TimeToLiveSpecification: read from the stack's template; from the table when moto has it)",
               spec.get("AttributeName") == names["ttl"] and spec.get("Enabled") in (True, "true")
               and (ttl.get("TimeToLiveStatus") != "ENABLED" or ttl.get("AttributeName") == names["ttl"]),
               f"template {spec}, table {ttl}")

        # -- the function's wiring
        r.fact(f"{tag} function variables name the created source queue, DLQ and table",
               env.get("TRIAGE_QUEUE_URL", "").endswith("/" + src_name)
               and env.get("TRIAGE_DLQ_URL", "").endswith("/" + dlq_name)
               and env.get("TRIAGE_TABLE") == table["TableName"],
               json.dumps({k: env.get(k) for k in ("TRIAGE_QUEUE_URL", "TRIAGE_DLQ_URL", "TRIAGE_TABLE")}))
        if self.runtime == "rust":
            r.fact(f"{tag} function runtime provided.al2023, handler bootstrap",
                   fn.get("Runtime") == "provided.al2023" and fn.get("Handler") == "bootstrap",
                   f"{fn.get('Runtime')} {fn.get('Handler')}")
        else:
            # moto's CloudFormation creates the layer (named after the stack) but neither gives it a
            # physical id nor attaches it to the function: the attachment is checked statically.
            made_layers = [v for v in a.lam.list_layers().get("Layers", []) if self.stack in v["LayerName"]]
            r.fact(f"{tag} function runtime python3.13, handler handler.handler, AWS_LAMBDA_EXEC_WRAPPER the layer's "
                   "wrapper, TRIAGE_JOB_TYPES set; the stack's one layer created, for python3.13",
                   fn.get("Runtime") == "python3.13" and fn.get("Handler") == "handler.handler"
                   and env.get("AWS_LAMBDA_EXEC_WRAPPER") == "/opt/sqs-triage-wrapper" and bool(env.get("TRIAGE_JOB_TYPES"))
                   and len(made_layers) == 1
                   and made_layers[0]["LatestMatchingVersion"].get("CompatibleRuntimes") == ["python3.13"],
                   f"{fn.get('Runtime')} {fn.get('Handler')} "
                   f"{ {k: env.get(k) for k in ('AWS_LAMBDA_EXEC_WRAPPER', 'TRIAGE_JOB_TYPES')} } layers {made_layers}")

        # -- the mapping (Lambda API)
        window_ok = ("MaximumBatchingWindowInSeconds" not in esm if self.fifo
                     else esm.get("MaximumBatchingWindowInSeconds") == ex["batchingWindow"])
        r.fact(f"{tag} mapping: source queue -> function, enabled, batch size {ex['batchSize']}, "
               + ("no batching window (FIFO)" if self.fifo else f"batching window {ex['batchingWindow']} s")
               + f", ReportBatchItemFailures, MaximumConcurrency {ex['maxConcurrency']}, MetricsConfig EventCount",
               esm.get("EventSourceArn") == src.get("QueueArn") and esm.get("FunctionArn") == fn["FunctionArn"]
               and esm.get("State") == "Enabled" and esm.get("BatchSize") == ex["batchSize"] and window_ok
               and esm.get("FunctionResponseTypes") == ["ReportBatchItemFailures"]
               and esm.get("ScalingConfig") == {"MaximumConcurrency": ex["maxConcurrency"]}
               and "ProvisionedPollerConfig" not in esm
               and esm.get("MetricsConfig") == {"Metrics": ["EventCount"]},
               json.dumps({k: v for k, v in esm.items() if k != "ResponseMetadata"}, default=str))

        # -- the log group (Logs API) and the dashboard (CloudWatch API)
        lg_id = self.of_type("AWS::Logs::LogGroup")[0]
        lgs = a.logs.describe_log_groups(logGroupNamePrefix=self.physical(lg_id))["logGroups"]
        r.fact(f"{tag} log group /aws/lambda/<function>, retention {ex['logRetentionDays']} days",
               len(lgs) == 1 and lgs[0]["logGroupName"] == f"/aws/lambda/{fn['FunctionName']}"
               and lgs[0].get("retentionInDays") == ex["logRetentionDays"], json.dumps(lgs, default=str))
        db_id = self.of_type("AWS::CloudWatch::Dashboard")[0]
        board = json.loads(a.cw.get_dashboard(DashboardName=self.physical(db_id))["DashboardBody"])
        text = json.dumps(board)
        r.fact(f"{tag} dashboard graphs the created queues and function",
               all(json.dumps(n) in text for n in (src_name, dlq_name, fn["FunctionName"]))
               and len(board.get("widgets", [])) > 1, f"{len(board.get('widgets', []))} widgets")

        r.fact(f"{tag} outputs: the created queue URL, DLQ URL, table and function",
               self.outputs.get("QueueUrl", "").endswith("/" + src_name)
               and self.outputs.get("DlqUrl", "").endswith("/" + dlq_name)
               and self.outputs.get("TableName") == table["TableName"]
               and self.outputs.get("FunctionName") == fn["FunctionName"], json.dumps(self.outputs))


# --------------------------------------------------------------------------- broken copies

def broken_low_receive_count(t: dict) -> None:
    """The source queue's maxReceiveCount below the receive rule (4 x 5 attempts)."""
    for r in t["Resources"].values():
        if r["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" in r["Properties"]:
            r["Properties"]["RedrivePolicy"]["maxReceiveCount"] = 7


def broken_dedup_on(t: dict) -> None:
    """FIFO queues with content-based deduplication on (two jobs with the same body would be one)."""
    for r in t["Resources"].values():
        if r["Type"] == "AWS::SQS::Queue":
            r["Properties"]["ContentBasedDeduplication"] = True


def find_cdk_template(cdk_out: Path) -> Path:
    manifest = json.loads((cdk_out / "manifest.json").read_text())
    for art in manifest["artifacts"].values():
        if art.get("type") == "aws:cloudformation:stack":
            return cdk_out / art["properties"]["templateFile"]
    raise SystemExit(f"no stack template in {cdk_out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sam-cfn", help="the SAM translator's output (infra/check_templates.py translate)")
    ap.add_argument("--cdk-out", help="`cdk synth` output folder (standard queues)")
    ap.add_argument("--cdk-fifo-out", help="`cdk synth -c queueType=fifo` output folder")
    ap.add_argument("--sam-python-cfn", help="infra/template-python.yaml, translated")
    ap.add_argument("--cdk-python-out", help="`cdk synth -c runtime=python` output folder")
    ap.add_argument("--cdk-stack-name", default="sqs-triage", help="the stackName context the CDK app was synthesized with")
    ap.add_argument("--endpoint", default=os.environ.get("TRIAGE_MOTO_ENDPOINT", "http://127.0.0.1:45660"))
    ap.add_argument("--probe", action="store_true", help="exit 0 when moto's CloudFormation answers, 3 when not")
    args = ap.parse_args()

    if args.probe:
        try:
            import boto3
            from botocore.config import Config

            boto3.client("cloudformation", endpoint_url=args.endpoint, region_name=REGION, aws_access_key_id="test",
                         aws_secret_access_key="test", config=Config(connect_timeout=2, read_timeout=5,
                                                                     retries={"max_attempts": 1})).list_stacks()
            return 0
        except Exception as e:
            print(f"moto's CloudFormation at {args.endpoint} does not answer ({type(e).__name__})")
            return 3
    if not args.sam_cfn or not args.cdk_out:
        ap.error("--sam-cfn and --cdk-out are required")

    started = time.monotonic()
    aws = Aws(args.endpoint)
    names = code_names()
    sam = json.loads(Path(args.sam_cfn).read_text())
    cdk = json.loads(find_cdk_template(Path(args.cdk_out)).read_text())
    has_fifo = "QueueType" in sam.get("Parameters", {})

    plan = [("sam", sam, {}, False, None, "rust")]
    if has_fifo:
        plan.append(("sam fifo", sam, {"QueueType": "fifo"}, True, None, "rust"))
    plan.append(("cdk", cdk, {}, False, args.cdk_stack_name, "rust"))
    if args.cdk_fifo_out:
        plan.append(("cdk fifo", json.loads(find_cdk_template(Path(args.cdk_fifo_out)).read_text()), {}, True,
                     args.cdk_stack_name, "rust"))
    if args.sam_python_cfn:
        plan.append(("sam python", json.loads(Path(args.sam_python_cfn).read_text()), {}, False, None, "python"))
    if args.cdk_python_out:
        plan.append(("cdk python", json.loads(find_cdk_template(Path(args.cdk_python_out)).read_text()), {}, False,
                     args.cdk_stack_name, "python"))

    report = Report()
    print(f"moto {args.endpoint}: account {aws.sts.get_caller_identity()['Account']}; not created by moto's "
          f"CloudFormation: {', '.join(f'{k} ({v})' for k, v in UNSUPPORTED_TYPES.items())}; not kept: "
          + "; ".join(NOT_KEPT))
    for label, template, params, fifo, rename, runtime in plan:
        d = Deployment(aws, label, template, params, fifo, rename, EXPECT, runtime)
        try:
            d.run(report, names)
        finally:
            problem = d.delete()
            report.fact(f"[{label}] stack {d.stack} deleted, with its resources and code bucket", not problem, problem)

    # Broken copies: each must fail a check above. (None that moto refuses: a refused stack stays
    # half made in moto, CREATE_IN_PROGRESS, and cannot be deleted.)
    broken = [("sam, maxReceiveCount 7 (below 4 x 5 attempts)", sam, {}, False, None, broken_low_receive_count,
               "maxReceiveCount"),
              ("cdk, maxReceiveCount 7 (below 4 x 5 attempts)", cdk, {}, False, args.cdk_stack_name,
               broken_low_receive_count, "maxReceiveCount")]
    if has_fifo:
        broken.append(("sam fifo, content-based deduplication on", sam, {"QueueType": "fifo"}, True, None,
                       broken_dedup_on, "ContentBasedDeduplication false"))
    for what, template, params, fifo, rename, breaks, label in broken:
        t = copy.deepcopy(template)
        breaks(t)
        d = Deployment(aws, f"broken {what}", t, params, fifo, rename, EXPECT)
        rep = Report(quiet=True)
        try:
            d.run(rep, names)
        except Exception as e:
            rep.fact(f"raised {type(e).__name__}: {e}", False)
        finally:
            problem = d.delete()
        caught = [f for f in rep.failures if label in f]
        report.fact(f"[broken copy] {what}: caught by '{label}'" + (f" ({d.error.splitlines()[0][:120]})" if d.error else ""),
                    bool(caught) and not problem, f"failed only {rep.failures}; cleanup {problem}")

    print(f"{report.passed} passed, {report.failed} failed ({time.monotonic() - started:.1f} s)")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
