//! One retry policy for every DynamoDB and SQS call the crate makes.
//!
//! Throttling and server faults are retried with capped, jittered backoff, within a budget the
//! environment's calls share (a storm cannot multiply the load) and never past the deadline.
//! Refusals and conditional check failures are never retried. The rule: a storage retry never
//! counts as a job attempt. [`error`] classifies, [`policy`] retries, [`clients`] builds SDK
//! clients with the SDK's own retries off, so this is the only policy.

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
