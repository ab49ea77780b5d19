//! What an AWS error code means: the one table ([`CODES`]) every classification reads.
//!
//! The storage retry policy retries throttling and server faults, never refusals; SQS batch
//! entries are sent again by the same rule; a job handler's AWS error is fatal when it is a
//! refusal, else transient. A code not in the table falls back on the HTTP status or SQS's
//! `SenderFault`; a job type's [`Rules`](crate::core::error::Rules) can still name any code.

use std::error::Error as StdError;
use std::fmt;

use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use crate::core::error::{ErrorKind, JobError, render_chain};

/// What an AWS error code says about the request that got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeClass {
    /// The service asked to slow down: retried with a longer backoff.
    Throttling,
    /// A server-side fault that may pass: retried.
    ServerFault,
    /// The request is wrong, not allowed, names something missing, or its condition did not
    /// hold: the same request can never succeed. Never retried; fatal for a job.
    Refused,
    /// The resource is busy or another request won (a table being created, a cancelled
    /// transaction): an answer the caller reads, so the storage layer does not retry it, but a
    /// job's later try may find the resource free, so it is transient for a job.
    Conflict,
}

/// SQS's `OverLimit`: a receive from a queue that holds as many in-flight messages as SQS allows.
pub const OVER_LIMIT: &str = "OverLimit";

/// Every AWS error code the crate knows, with its class. The SDK's own throttling and
/// transient lists plus the service-specific codes DynamoDB and SQS return.
pub const CODES: &[(&str, CodeClass)] = &[
    // Throttling.
    ("Throttling", CodeClass::Throttling),
    ("ThrottlingException", CodeClass::Throttling),
    ("ThrottledException", CodeClass::Throttling),
    ("RequestThrottledException", CodeClass::Throttling),
    ("TooManyRequestsException", CodeClass::Throttling),
    ("ProvisionedThroughputExceededException", CodeClass::Throttling),
    ("TransactionInProgressException", CodeClass::Throttling),
    ("RequestLimitExceeded", CodeClass::Throttling),
    ("BandwidthLimitExceeded", CodeClass::Throttling),
    ("LimitExceededException", CodeClass::Throttling),
    ("RequestThrottled", CodeClass::Throttling),
    ("SlowDown", CodeClass::Throttling),
    ("PriorRequestNotComplete", CodeClass::Throttling),
    ("EC2ThrottledException", CodeClass::Throttling),
    ("TransactionConflictException", CodeClass::Throttling),
    ("KMSThrottlingException", CodeClass::Throttling),
    ("AWS.SimpleQueueService.RequestThrottled", CodeClass::Throttling),
    // SQS's answer to a short poll of a queue at its in-flight limit (about 120,000 messages,
    // 20,000 on FIFO): it passes as messages are settled or come back, so it is waited out.
    (OVER_LIMIT, CodeClass::Throttling),
    // Server faults.
    ("RequestTimeout", CodeClass::ServerFault),
    ("RequestTimeoutException", CodeClass::ServerFault),
    ("InternalError", CodeClass::ServerFault),
    ("InternalFailure", CodeClass::ServerFault),
    ("InternalServerError", CodeClass::ServerFault),
    ("ServiceUnavailable", CodeClass::ServerFault),
    ("ServiceUnavailableException", CodeClass::ServerFault),
    ("KMS.InternalException", CodeClass::ServerFault),
    // Refused: wrong, not allowed, missing, or a condition that did not hold.
    ("ValidationException", CodeClass::Refused),
    ("ValidationError", CodeClass::Refused),
    ("InvalidParameterValue", CodeClass::Refused),
    ("InvalidParameterValueException", CodeClass::Refused),
    ("InvalidParameterCombination", CodeClass::Refused),
    ("MissingParameter", CodeClass::Refused),
    ("InvalidMessageContents", CodeClass::Refused),
    ("SerializationException", CodeClass::Refused),
    ("AccessDenied", CodeClass::Refused),
    ("AccessDeniedException", CodeClass::Refused),
    ("UnauthorizedOperation", CodeClass::Refused),
    ("UnrecognizedClientException", CodeClass::Refused),
    ("ResourceNotFoundException", CodeClass::Refused),
    ("NotFoundException", CodeClass::Refused),
    ("AWS.SimpleQueueService.NonExistentQueue", CodeClass::Refused),
    ("QueueDoesNotExist", CodeClass::Refused),
    ("ConditionalCheckFailedException", CodeClass::Refused),
    // Conflicts.
    ("TransactionCanceledException", CodeClass::Conflict),
    ("ResourceInUseException", CodeClass::Conflict),
];

/// The class of an AWS error code, when the table knows it.
pub(crate) fn code_class(code: &str) -> Option<CodeClass> {
    CODES.iter().find(|(c, _)| *c == code).map(|(_, k)| *k)
}

/// True when the code is a throttling code.
#[cfg(any(test, feature = "internals"))]
pub fn is_throttling_code(code: &str) -> bool {
    code_class(code) == Some(CodeClass::Throttling)
}

/// The kind of job failure an AWS error code implies: a refusal is fatal, anything else
/// (throttling, server faults, conflicts, unknown codes) transient.
pub(crate) fn job_error_kind(code: &str) -> ErrorKind {
    match code_class(code) {
        Some(CodeClass::Refused) => ErrorKind::Fatal,
        _ => ErrorKind::Transient,
    }
}

/// A job error from an AWS error code (the SDK's `code()`), for handlers that call AWS:
/// fatal when no retry can fix the request (validation, access, not found, a failed
/// condition), transient otherwise and when there is no code. The kind is inferred, so a job
/// type's rules may still re-classify it; the code is kept for them to match on.
pub fn from_aws_code(code: Option<&str>, message: impl fmt::Display) -> JobError {
    let kind = code.map_or(ErrorKind::Transient, job_error_kind);
    let err = JobError::inferred(kind, message);
    match code {
        Some(c) => err.with_code(c),
        None => err,
    }
}

/// A job error from an AWS SDK error, e.g. `SdkError<PutItemError, _>`: its code classified
/// as by [`from_aws_code`], its message the error's chain. A timeout or a connection failure
/// has no code, so it is transient.
///
/// ```no_run
/// # async fn handler(ddb: aws_sdk_dynamodb::Client) -> Result<(), sqs_triage::JobError> {
/// ddb.delete_table()
///     .table_name("t")
///     .send()
///     .await
///     .map_err(|e| sqs_triage::from_aws_error(&e))?;
/// # Ok(())
/// # }
/// ```
pub fn from_aws_error<E>(err: &E) -> JobError
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    from_aws_code(err.code(), render_chain(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for (code, _) in CODES {
            assert!(seen.insert(*code), "{code} is listed twice");
        }
    }

    #[test]
    fn aws_codes_classify_jobs() {
        for code in [
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "InternalError",
            "TransactionCanceledException",
            "ResourceInUseException",
            "Weird",
        ] {
            assert_eq!(
                from_aws_code(Some(code), "x").kind(),
                ErrorKind::Transient,
                "{code}"
            );
        }
        for code in [
            "ValidationException",
            "AccessDeniedException",
            "ResourceNotFoundException",
            "ConditionalCheckFailedException",
        ] {
            assert_eq!(from_aws_code(Some(code), "x").kind(), ErrorKind::Fatal, "{code}");
        }
        let e = from_aws_code(Some("CardDeclined"), "declined");
        assert_eq!((e.code(), e.is_explicit()), (Some("CardDeclined"), false));
        assert_eq!(from_aws_code(None, "x").code(), None);
        assert!(is_throttling_code("ProvisionedThroughputExceededException"));
        assert!(!is_throttling_code("ValidationException"));
    }

    /// The storage layer never retried `UnrecognizedClientException` (credentials AWS does
    /// not know), but a handler's error with that code was transient, so the job burned
    /// every attempt on a request that can never succeed: it is a refusal, like
    /// `AccessDeniedException`.
    #[test]
    fn unknown_credentials_are_fatal_for_a_job_as_for_storage() {
        assert_eq!(
            from_aws_code(
                Some("UnrecognizedClientException"),
                "The security token is invalid"
            )
            .kind(),
            ErrorKind::Fatal
        );
    }

    #[test]
    fn sdk_errors_keep_their_code_and_text() {
        use aws_sdk_dynamodb::operation::get_item::GetItemError;
        use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
        use aws_smithy_runtime_api::client::result::SdkError;
        use aws_smithy_runtime_api::http::StatusCode;
        use aws_smithy_types::body::SdkBody;
        use aws_smithy_types::error::ErrorMetadata;

        let meta = ErrorMetadata::builder()
            .code("ValidationException")
            .message("bad key")
            .build();
        let resp = HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::empty());
        let err: SdkError<GetItemError, HttpResponse> =
            SdkError::service_error(GetItemError::generic(meta), resp);
        let e = from_aws_error(&err);
        assert_eq!(e.kind(), ErrorKind::Fatal);
        assert_eq!(e.code(), Some("ValidationException"));
    }
}
