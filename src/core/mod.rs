//! The pure core: envelope, errors and their classification, backoff, policy, the breaker
//! state machine, the failure record, SQS's characters, the redrive's bounds and the decision. No AWS crate, no
//! tokio, no clock: time and randomness come in as arguments. Read this layer alone to know
//! every rule.

pub mod backoff;
pub mod breaker;
pub mod decision;
pub mod envelope;
pub mod error;
pub mod failure;
pub mod policy;
pub mod redrive;
pub mod sqs_text;

pub use backoff::Backoff;
pub use decision::{Decision, Gate, Inputs, Ledger, RecordFacts, Verdict, admit, conclude, invalid};
// Shorter paths for the operator tool and the tests; the library names these by module.
#[cfg(feature = "internals")]
pub use decision::{DeferReason, Conclusion, StoredAttempts};
#[cfg(feature = "internals")]
pub use envelope::{EnvelopeError, EnvelopeLimits, EventBridgeTypes, Job, Wrapper};
pub use error::{ErrorKind, JobError, Rules};
pub use failure::FailureClass;
#[cfg(feature = "internals")]
pub use failure::FailureRecord;
pub use policy::{PolicyError, RetryPolicy};
