"""Powertools for AWS Lambda (Python) BatchProcessor with the record work of `triage-lambda`'s
built-in job type on a healthy record, as the report's section on the shipped binary runs it
through awslambdaric: parse the body, check the job type, read the payload's outcome, succeed."""

import json

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)

JOB_TYPE = "triage.chaos"

processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record):
    job = json.loads(record.body)
    if not isinstance(job, dict) or job.get("type") != JOB_TYPE or not isinstance(job.get("id"), str):
        raise ValueError("not a triage.chaos job")
    payload = job.get("payload")
    if not isinstance(payload, dict) or payload.get("outcome", "ok") != "ok":
        raise ValueError("not a healthy job")


def handler(event, context):
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
