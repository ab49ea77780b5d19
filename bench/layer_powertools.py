"""The record work of bench/layer_handler.py under Powertools for AWS Lambda (Python)'s
BatchProcessor, as `cargo bench --bench layer` runs it through awslambdaric."""

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)

from layer_handler import work

processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record):
    work(record.body)


def handler(event, context):
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
