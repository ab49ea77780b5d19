//! Effects: the AWS calls that carry out decisions, all through one storage retry policy.

pub mod breaker_store;
pub mod calls;
pub mod dlq;
pub mod ledger;
pub mod metrics;
pub mod sqs;
pub mod storage_retry;
pub mod table;
