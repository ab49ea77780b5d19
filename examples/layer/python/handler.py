"""The reference Python handler of infra/template-python.yaml and `cdk synth -c runtime=python`.

It runs through the sqs-triage layer: each invocation holds one record of job type
example.echo. Returning settles the job; raising Fatal, Transient or RetryAfter decides its fate.
"""

import json

from sqs_triage import Fatal, RetryAfter, job


def handler(event, context):
    for record in event["Records"]:
        j = job(record)
        payload = json.loads(record["body"]).get("payload") or {}
        if payload.get("fail") == "fatal":
            raise Fatal("the payload asked to fail")
        if payload.get("fail") == "later":
            raise RetryAfter(30, "the payload asked to wait")
        print(json.dumps({"job": j.id, "attempt": j.attempt, "echo": payload}))
