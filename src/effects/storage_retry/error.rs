//! What a failed storage call means: its classification (by the one code table,
//! [`crate::effects::aws_errors`], then by HTTP status) and the error the policy returns.

use std::fmt;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use crate::effects::aws_errors::{CodeClass, code_class};

/// What a failed call means for retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The service asked to slow down: retried with a longer backoff.
    Throttled,
    /// A server fault, timeout or connection error: retried.
    Transient,
    /// Retrying cannot help (or the error is a domain answer): returned at once.
    Permanent,
}

/// Classifies an error code and HTTP status: a code in the table goes by its class (refusals
/// and conflicts are never retried, whatever the status); otherwise unknown client errors (4xx)
/// are permanent, unknown server errors (5xx) transient.
pub fn classify_code(code: Option<&str>, status: Option<u16>) -> FailureKind {
    match code.and_then(code_class) {
        Some(CodeClass::Throttling) => return FailureKind::Throttled,
        Some(CodeClass::ServerFault) => return FailureKind::Transient,
        Some(CodeClass::Refused | CodeClass::Conflict) => return FailureKind::Permanent,
        None => {}
    }
    match status {
        Some(429) => FailureKind::Throttled,
        Some(500 | 502 | 503 | 504) => FailureKind::Transient,
        Some(s) if s >= 500 => FailureKind::Transient,
        _ => FailureKind::Permanent,
    }
}

/// Classifies an SDK error: timeouts, dispatch failures (connection refused or reset) and
/// unparseable responses are transient; service errors go by code and status; a request
/// that could not be built is permanent.
pub fn classify<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> FailureKind {
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            FailureKind::Transient
        }
        SdkError::ConstructionFailure(_) => FailureKind::Permanent,
        SdkError::ServiceError(_) => {
            classify_code(err.code(), err.raw_response().map(|r| r.status().as_u16()))
        }
        _ => FailureKind::Transient,
    }
}

/// Why the storage layer stopped trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The error is not retryable.
    Permanent,
    /// The attempt limit was reached.
    AttemptsExhausted,
    /// The environment's retry budget was empty.
    BudgetEmpty,
    /// Another try would end after the deadline.
    Deadline,
}

/// A storage call that failed after the retry policy was applied. Its text states facts (the
/// call, the resource, the code, why the policy stopped); what an operator should do about it
/// is the caller's to say (see `crate::ops::hints`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.render())]
pub struct StorageError {
    /// The operation, e.g. `UpdateItem`.
    pub op: &'static str,
    /// The AWS error code, when the service answered with one.
    pub code: Option<String>,
    /// The error text (one line).
    pub message: String,
    /// The HTTP status, when there was a response.
    pub status: Option<u16>,
    /// What the last failure meant.
    pub kind: FailureKind,
    /// Why the policy stopped.
    pub stop: Stop,
    /// Calls made in all.
    pub attempts: u32,
    /// The table or queue the call was about, for the message.
    pub resource: Option<String>,
    /// True when some try ended without a definite answer (a timeout, a reset connection, a
    /// 5xx): the call may have taken effect although it is reported failed.
    pub uncertain: bool,
}

impl StorageError {
    /// An error made by the storage layer itself (not from an SDK error).
    pub fn new(op: &'static str, code: Option<&str>, message: impl Into<String>, kind: FailureKind) -> Self {
        Self {
            op,
            code: code.map(str::to_owned),
            message: one_line(&message.into()),
            status: None,
            kind,
            stop: Stop::Permanent,
            attempts: 1,
            resource: None,
            uncertain: false,
        }
    }

    pub(crate) fn from_sdk<E>(
        op: &'static str,
        err: &SdkError<E, HttpResponse>,
        kind: FailureKind,
        attempts: u32,
    ) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let message = match (err.message(), err) {
            (Some(m), _) => m.to_owned(),
            (None, e) => DisplayErrorContext(e).to_string(),
        };
        Self {
            op,
            code: err.code().map(str::to_owned),
            message: one_line(&message),
            status: err.raw_response().map(|r| r.status().as_u16()),
            kind,
            stop: Stop::Permanent,
            attempts,
            resource: None,
            uncertain: false,
        }
    }

    /// Names the table or queue in the message.
    pub fn with_resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    /// The AWS error code, if any.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// True for `ConditionalCheckFailedException` (a domain answer: the condition did not hold).
    pub(crate) fn is_conditional_check_failed(&self) -> bool {
        self.code() == Some("ConditionalCheckFailedException")
    }

    /// True when the table or queue does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.code(),
            Some(
                "ResourceNotFoundException" | "AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist"
            )
        )
    }

    /// True when the policy gave up on a retryable failure (the service may come back).
    pub fn is_unavailable(&self) -> bool {
        self.kind != FailureKind::Permanent
    }

    fn render(&self) -> String {
        let code = self.code().unwrap_or(match self.kind {
            FailureKind::Throttled => "throttled",
            FailureKind::Transient => "transient failure",
            FailureKind::Permanent => "error",
        });
        match (self.code(), &self.resource) {
            (Some("ResourceNotFoundException"), Some(table)) => {
                return format!("DynamoDB table `{table}` does not exist (ResourceNotFoundException)");
            }
            (Some("AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist"), Some(queue)) => {
                return format!("SQS queue `{queue}` does not exist ({code})");
            }
            _ => {}
        }
        let on = self
            .resource
            .as_deref()
            .map(|r| format!(" on `{r}`"))
            .unwrap_or_default();
        let why = match self.stop {
            Stop::Permanent => String::new(),
            Stop::AttemptsExhausted => format!(" (gave up after {} attempts)", self.attempts),
            Stop::BudgetEmpty => format!(" (retry budget empty, {} attempts)", self.attempts),
            Stop::Deadline => format!(" (stopped at the deadline, {} attempts)", self.attempts),
        };
        format!("{}{on} failed: {code}: {}{why}", self.op, self.message)
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Throttled => "throttled",
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    use super::*;

    /// An SDK error as a storage call returns it (the policy's tests use these too).
    pub(in crate::effects::storage_retry) type Err = SdkError<GetItemError, HttpResponse>;

    /// A service error with this code and HTTP status.
    pub(in crate::effects::storage_retry) fn service(code: &str, status: u16) -> Err {
        let meta = ErrorMetadata::builder()
            .code(code)
            .message("boom\nsecond line")
            .build();
        let resp = HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty());
        SdkError::service_error(GetItemError::generic(meta), resp)
    }

    /// A connection reset before any answer.
    pub(in crate::effects::storage_retry) fn reset() -> Err {
        SdkError::dispatch_failure(ConnectorError::io("connection reset".into()))
    }

    #[test]
    fn classification() {
        use FailureKind::*;
        assert_eq!(
            classify(&service("ProvisionedThroughputExceededException", 400)),
            Throttled
        );
        assert_eq!(classify(&service("ThrottlingException", 400)), Throttled);
        assert_eq!(classify(&service("RequestLimitExceeded", 400)), Throttled);
        assert_eq!(classify(&service("TransactionConflictException", 400)), Throttled);
        // SQS's in-flight limit passes as held messages are settled: waited out, not refused.
        assert_eq!(classify(&service("OverLimit", 403)), Throttled);
        assert_eq!(classify(&service("InternalServerError", 500)), Transient);
        assert_eq!(classify(&service("Whatever", 502)), Transient);
        assert_eq!(classify(&service("ServiceUnavailable", 503)), Transient);
        assert_eq!(classify(&service("", 504)), Transient);
        assert_eq!(classify(&reset()), Transient);
        for code in [
            "ConditionalCheckFailedException",
            "ValidationException",
            "AccessDeniedException",
            "ResourceNotFoundException",
            "InvalidParameterValue",
            "UnrecognizedClientException",
            "TransactionCanceledException",
            "ResourceInUseException",
        ] {
            assert_eq!(classify(&service(code, 400)), Permanent, "{code}");
            assert_eq!(
                classify(&service(code, 500)),
                Permanent,
                "{code} is never retried"
            );
        }
        assert_eq!(classify(&service("SomethingNew", 400)), Permanent);
    }
}
