"""Powertools for AWS Lambda (Python) BatchProcessor over the same SQS event file the Rust
side of `cargo bench --bench report` processes, with an equivalent record handler.

Usage: powertools_batch.py EVENT_FILE [--iterations N | --once]

Each iteration times, in this interpreter: json.loads of the file's bytes, then
process_partial_response(BatchProcessor(EventType.SQS)), then json.dumps of the response
(the Lambda runtime serializes it), as wall time (time.perf_counter) and as the process's CPU
time (time.process_time). One untimed warm-up iteration runs first. Prints one JSON object:
per-iteration seconds, per-iteration CPU seconds, records, and the failures reported.

With --once: one iteration, untimed, no warm-up (what `valgrind --tool=callgrind` runs to count
instructions). Prints the same object without timings.
"""

import json
import sys
import time

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

JOB_TYPE = "email.send"


class TransientError(Exception):
    pass


class FatalError(Exception):
    pass


def record_handler(record: SQSRecord):
    # Same work as the Rust handler: parse the envelope, check the job type, decode the
    # payload, fail as the payload says. Malformed bodies raise from json.loads.
    job = json.loads(record.body)
    if not isinstance(job, dict) or not isinstance(job.get("type"), str):
        raise FatalError("invalid envelope")
    if job["type"] != JOB_TYPE:
        raise FatalError("no handler for job type " + job["type"])
    payload = job.get("payload")
    if not isinstance(payload, dict) or not payload.get("to") or not payload.get("template"):
        raise FatalError("recipient or template missing")
    outcome = payload.get("outcome")
    if outcome == "transient":
        raise TransientError("smtp timeout")
    if outcome == "fatal":
        raise FatalError("recipient rejected")


processor = BatchProcessor(event_type=EventType.SQS)


def once(raw: bytes):
    event = json.loads(raw)
    response = process_partial_response(event=event, record_handler=record_handler, processor=processor)
    return json.dumps(response), len(event["Records"]), len(response["batchItemFailures"])


def main():
    path = sys.argv[1]
    iterations = 5
    if "--iterations" in sys.argv:
        iterations = int(sys.argv[sys.argv.index("--iterations") + 1])
    with open(path, "rb") as f:
        raw = f.read()
    if "--once" in sys.argv:
        _, records, failures = once(raw)
        print(json.dumps({"records": records, "failures": failures}))
        return
    once(raw)
    runs = []
    cpu = []
    records = failures = 0
    for _ in range(iterations):
        c0 = time.process_time()
        t0 = time.perf_counter()
        _, records, failures = once(raw)
        runs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({"seconds": runs, "cpu_seconds": cpu, "records": records, "failures": failures}))


if __name__ == "__main__":
    main()
