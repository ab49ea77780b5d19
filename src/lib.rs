//! sqs-triage: decides, for every failed SQS job, whether another try can help, and acts on
//! it with the cheapest correct AWS calls.
//!
//! Layers, ground floor first; each imports only the ones below it:
//! 1. [`core`]: pure rules (envelope, classification, backoff, policy, breaker, decision);
//! 2. [`effects`]: SQS and DynamoDB calls, through one storage retry policy;
//! 3. [`processor`]: one batch in, decisions, batched effects, batch response out;
//! 4. [`runtime`] and [`ops`]: the Lambda adapter, the long-polling worker, operator actions.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod config;
pub mod core;
pub mod effects;
pub mod ops;
pub mod processor;
pub mod runtime;

pub use crate::core::{Backoff, Decision, FailureClass, JobError, RetryPolicy, Rules};
