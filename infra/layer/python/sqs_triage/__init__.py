"""sqs-triage's helpers for Python handlers run through the sqs-triage Lambda layer.

Raise ``Fatal`` to send the record to the DLQ at once, ``Transient`` to retry it after its
backoff, ``RetryAfter(seconds)`` to retry it after that delay (capped by the policy). Any other
exception is classified by its type (docs/layer.md). ``job(record)`` reads the job's attempt,
limit, id and type from the record the layer hands the handler.
"""

from collections import namedtuple

__all__ = ["Fatal", "Transient", "RetryAfter", "Job", "job"]


class Fatal(Exception):
    """Retrying cannot help: the record goes to the DLQ with its failure record."""


class Transient(Exception):
    """Retrying may help: the record comes back after its backoff delay."""


class RetryAfter(Exception):
    """Retry after ``seconds`` (the policy's maximum delay caps it)."""

    def __init__(self, seconds, message=""):
        self.seconds = max(0.0, float(seconds))
        text = "after %gs" % self.seconds
        super().__init__(text + (": " + str(message) if message else ""))


Job = namedtuple("Job", ["attempt", "max_attempts", "id", "type"])


def _attribute(record, name):
    value = (record.get("messageAttributes") or {}).get(name) or {}
    return value.get("stringValue")


def job(record):
    """The job of an SQS record the layer handed on: its attempt (1 for the first), the
    policy's attempt limit, its job id and its job type. ``None`` fields when the record did
    not come through the layer."""
    attempt = _attribute(record, "triage-attempt")
    limit = _attribute(record, "triage-max-attempts")
    return Job(
        int(attempt) if attempt else None,
        int(limit) if limit else None,
        _attribute(record, "triage-job-id"),
        _attribute(record, "triage-job-type"),
    )
