"""The chaos job's record work under Powertools for AWS Lambda (Python)'s BatchProcessor, as the
benchmark report's added-billed-duration section runs it through awslambdaric: each record's
body is parsed, it sleeps the payload's sleep_ms, and it fails unless outcome is "ok".
BatchProcessor runs the records one after another."""

import json
import time

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)

processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record):
    payload = json.loads(record.body).get("payload", {})
    sleep_ms = payload.get("sleep_ms")
    if sleep_ms:
        time.sleep(sleep_ms / 1000.0)
    outcome = payload.get("outcome", "ok")
    if outcome != "ok":
        raise RuntimeError(f"outcome {outcome}")


def handler(event, context):
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
