//! One retry policy for every DynamoDB and SQS call the crate makes.
//!
//! Throttling and transient failures (HTTP 500/502/503/504, timeouts, connection errors) are
//! retried with capped exponential backoff and jitter, within a retry budget shared by every
//! call of the environment (a token bucket: each success deposits a fraction of a retry, each
//! retry withdraws one, so a storm cannot multiply the load), and never past the deadline
//! passed in. `ConditionalCheckFailed`, validation, access and not-found errors are never
//! retried. Storage retries never count as job attempts.
//!
//! Three parts:
//! - [`error`]: what a failure means ([`classify`], by the code table of
//!   [`crate::effects::aws_errors`]) and the [`StorageError`] a call returns;
//! - [`policy`]: the backoff, the budget and the deadline ([`StorageRetry`]);
//! - [`clients`]: the SDK clients, built with the SDK's own retries disabled so there is
//!   exactly one policy: use [`dynamodb_client`] / [`sqs_client`] (or the `*_config` builders
//!   to override the endpoint).

pub mod clients;
pub mod error;
pub mod policy;

pub use clients::{CONNECT_TIMEOUT, dynamodb_config, sqs_config};
pub use error::{FailureKind, StorageError, classify};
pub use policy::{BatchResult, BatchStep, StorageRetry};
// Shorter paths for the operator tool and the tests; the library names these by module.
#[cfg(feature = "internals")]
pub use clients::{DYNAMODB_ATTEMPT_TIMEOUT, SQS_ATTEMPT_TIMEOUT, dynamodb_client, sqs_client};
#[cfg(feature = "internals")]
pub use error::{Stop, classify_code};
#[cfg(feature = "internals")]
pub use policy::{InvalidRetryConfig, RetryBudget, RetryStats, StorageRetryConfig};
