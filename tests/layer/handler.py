"""The Python handler the layer's tests run through awslambdaric and the extension: written for
SQS events, one record at a time or a whole batch, with no sqs-triage code but the helpers."""

import json
import os
import time

from awslambdaric.lambda_runtime_marshaller import to_json
from sqs_triage import Fatal, RetryAfter, Transient, job

LOG = os.environ["LAYER_TEST_LOG"]


def _log(entry):
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def handler(event, context):
    records = event.get("Records") if isinstance(event, dict) else None
    if not (isinstance(records, list) and records and records[0].get("eventSource") == "aws:sqs"):
        if isinstance(event, dict) and event.get("fail"):
            raise LookupError("asked to fail")
        result = {"seen": event, "request_id": context.aws_request_id, "ü": "✓"}
        _log({"pass_through": to_json(result), "request_id": context.aws_request_id})
        return result
    failures = []
    for r in records:
        j = job(r)
        payload = json.loads(r["body"])["payload"]
        action = payload["action"]
        _log({
            "message_id": r["messageId"],
            "records": len(records),
            "request_id": context.aws_request_id,
            "arn": context.invoked_function_arn,
            "trace_id": os.environ.get("_X_AMZN_TRACE_ID"),
            "client_context": getattr(context.client_context, "custom", None),
            "remaining_ms": context.get_remaining_time_in_millis(),
            "attempt": j.attempt,
            "max_attempts": j.max_attempts,
            "job_id": j.id,
            "job_type": j.type,
            "action": action,
            "pid": os.getpid(),
            "at": time.time(),
        })
        if action == "ok":
            continue
        if action == "slow":
            time.sleep(payload.get("seconds", 0.2))
            continue
        if action == "value_error":
            raise ValueError("the order has no lines")
        if action == "fatal":
            raise Fatal("refused")
        if action == "transient_once":
            if j.attempt == 1:
                raise ConnectionError("the service is down")
            continue
        if action == "transient":
            raise Transient("later")
        if action == "retry_after":
            raise RetryAfter(payload.get("seconds", 40), "throttled")
        if action == "partial":
            failures.append({"itemIdentifier": r["messageId"]})
            continue
        if action == "meet":
            # Succeeds only when `count` records run side by side: each waits for the others.
            meet = os.path.join(os.path.dirname(LOG), "meet")
            os.makedirs(meet, exist_ok=True)
            open(os.path.join(meet, r["messageId"]), "w").close()
            until = time.time() + 10
            while len(os.listdir(meet)) < payload["count"]:
                if time.time() > until:
                    raise Transient("ran alone")
                time.sleep(0.02)
            continue
        if action == "hang":
            time.sleep(3600)
        if action == "crash":
            os._exit(137)
        if action == "crash_once":
            if j.attempt == 1:
                os._exit(137)
            continue
    return {"batchItemFailures": failures}
