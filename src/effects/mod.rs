//! Effects: the AWS calls that carry out decisions, all through one storage retry policy.

pub mod aws_errors;
pub mod breaker_store;
pub mod calls;
pub mod dlq;
pub mod ledger;
pub mod metrics;
pub mod queue_url;
pub mod sqs;
pub mod storage_retry;
pub mod table;

#[cfg(feature = "internals")]
pub use aws_errors::{from_aws_code, from_aws_error};
