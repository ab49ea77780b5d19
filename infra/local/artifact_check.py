"""The SQS side of infra/local/artifact-check.sh, on the local stack (boto3 from the stack's venv).

  setup  OUT   creates a source queue (1 MiB, redrive to its DLQ), the DLQ and a state table,
               sends three chaos jobs (one succeeds, one fails fatally, one fails transiently),
               receives them, and writes OUT/event.json (the SQS event Lambda would send, with
               the real receipt handles) and OUT/resources.json
  verify OUT   reads OUT/response.json (the function's answer) and checks it against the jobs:
               only the transient job in batchItemFailures, the fatal one in the DLQ with a
               `triage-failure` record of class fatal, nothing else dead-lettered
  cleanup OUT  deletes what setup created
"""

import json
import sys
import time
from pathlib import Path

import boto3

CHAOS = "triage.chaos"
JOBS = {"ok": "artifact-ok", "fatal": "artifact-fatal", "transient": "artifact-transient"}


def clients():
    return boto3.client("sqs"), boto3.client("dynamodb")


def setup(out: Path) -> None:
    sqs, ddb = clients()
    name = f"artifact-{int(time.time() * 1000)}"
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq", Attributes={
        "MaximumMessageSize": "1048576", "MessageRetentionPeriod": "1209600"})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = sqs.create_queue(QueueName=name, Attributes={
        "MaximumMessageSize": "1048576", "MessageRetentionPeriod": "345600", "VisibilityTimeout": "180",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "100"})})["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    table = f"{name}-state"
    ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                           {"AttributeName": "sk", "AttributeType": "S"}],
                     KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                {"AttributeName": "sk", "KeyType": "RANGE"}])
    ddb.get_waiter("table_exists").wait(TableName=table)

    for outcome, job_id in JOBS.items():
        body = json.dumps({"type": CHAOS, "id": job_id, "payload": {"outcome": outcome}})
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    messages = []
    deadline = time.time() + 30
    while len(messages) < len(JOBS) and time.time() < deadline:
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                  AttributeNames=["All"], MessageAttributeNames=["All"]).get("Messages", [])
        messages += got
    if len(messages) != len(JOBS):
        sys.exit(f"received {len(messages)} of {len(JOBS)} jobs")
    region = queue_arn.split(":")[3]
    records = [{
        "messageId": m["MessageId"],
        "receiptHandle": m["ReceiptHandle"],
        "body": m["Body"],
        "attributes": m.get("Attributes", {}),
        "messageAttributes": {},
        "md5OfBody": m["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    } for m in messages]
    ids = {json.loads(m["Body"])["id"]: m["MessageId"] for m in messages}
    (out / "event.json").write_text(json.dumps({"Records": records}))
    (out / "resources.json").write_text(json.dumps(
        {"queue_url": queue_url, "dlq_url": dlq_url, "table": table, "message_ids": ids}))
    print(f"queue {queue_url}, DLQ {dlq_url}, table {table}; event of {len(records)} records")


def verify(out: Path) -> None:
    sqs, _ = clients()
    res = json.loads((out / "resources.json").read_text())
    ids = res["message_ids"]
    raw = (out / "response.json").read_text().strip()
    try:
        response = json.loads(raw)
    except ValueError:
        sys.exit(f"not a batch response: {raw!r}")
    failed = sorted(f["itemIdentifier"] for f in response.get("batchItemFailures", []))
    problems = []
    if failed != [ids[JOBS["transient"]]]:
        problems.append(f"batchItemFailures {failed}, expected only the transient job's {ids[JOBS['transient']]}")
    dead = []
    deadline = time.time() + 10
    while time.time() < deadline:
        got = sqs.receive_message(QueueUrl=res["dlq_url"], MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                  MessageAttributeNames=["All"]).get("Messages", [])
        dead += got
        if dead and not got:
            break
    records = []
    for m in dead:
        attr = m.get("MessageAttributes", {}).get("triage-failure", {}).get("StringValue")
        records.append(json.loads(attr) if attr else None)
    if [r and (r.get("job_id"), r.get("class")) for r in records] != [(JOBS["fatal"], "fatal")]:
        problems.append(f"DLQ holds {records}, expected the fatal job alone with a failure record of class fatal")
    if problems:
        sys.exit("; ".join(problems))
    print(f"batch response {json.dumps(response)}: the transient job retried, the fatal one dead-lettered "
          f"(triage-failure class fatal, {records[0]['attempts']} attempt), the ok one done")


def cleanup(out: Path) -> None:
    sqs, ddb = clients()
    path = out / "resources.json"
    if not path.exists():
        return
    res = json.loads(path.read_text())
    for url in (res["queue_url"], res["dlq_url"]):
        try:
            sqs.delete_queue(QueueUrl=url)
        except Exception as e:  # noqa: BLE001 - best effort
            print(f"cleanup: {url}: {e}", file=sys.stderr)
    try:
        ddb.delete_table(TableName=res["table"])
    except Exception as e:  # noqa: BLE001
        print(f"cleanup: {res['table']}: {e}", file=sys.stderr)


if __name__ == "__main__":
    cmd, out = sys.argv[1], Path(sys.argv[2])
    {"setup": setup, "verify": verify, "cleanup": cleanup}[cmd](out)
