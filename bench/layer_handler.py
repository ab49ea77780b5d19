"""The Python handlers `cargo bench --bench layer` runs through awslambdaric: a plain SQS handler
that loops over its records and returns batchItemFailures itself (bare, and the one the layer
runs unchanged), and the same record work under Powertools' BatchProcessor.

BENCH_SLEEP_MS: milliseconds each record sleeps (default 0: the record's JSON body is parsed,
nothing more).
"""

import json
import os
import time

SLEEP_S = float(os.environ.get("BENCH_SLEEP_MS", "0")) / 1000.0


def work(body):
    json.loads(body)
    if SLEEP_S:
        time.sleep(SLEEP_S)


def handler(event, context):
    failures = []
    for record in event["Records"]:
        try:
            work(record["body"])
        except Exception:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
