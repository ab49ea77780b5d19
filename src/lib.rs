//! sqs-triage sits between Amazon SQS and your job handlers on AWS Lambda (or any host, with a
//! long-polling worker). For every failed job it decides whether another try can help:
//! fatal failures go to the dead-letter queue at once with a failure record, transient ones
//! come back after a jittered backoff through the message's visibility timeout, attempts are
//! counted exactly in DynamoDB, and a circuit breaker per job type, shared by every
//! environment, stops hammering a dependency that is down.
//!
//! # A function in a few lines
//!
//! Register a handler per job type in a [`Registry`] and hand it to [`lambda::run`] (or
//! [`worker::run`] outside Lambda). A handler receives the job's payload, decoded into its
//! argument type, and a [`JobContext`]; it returns `Result<(), JobError>`.
//!
//! ```rust,no_run
#![doc = include_str!("../examples/lambda_function.rs")]
//! ```
//!
//! This is `examples/lambda_function.rs`, and the README's example. [`lambda::run`] reads the
//! configuration, builds the AWS clients and checks the queues and the table once per
//! container, then serves SQS events until the runtime stops; an unusable configuration fails
//! the function's init with one line naming the variable.
//!
//! # Configuration and which policy wins
//!
//! The runtimes read the `TRIAGE_*` variables once at start-up (`docs/configuration.md`
//! lists them with their ranges; [`config::limits`] has them as data): the queue, DLQ
//! and table, `TRIAGE_CONCURRENCY`, and the default retry policy (`TRIAGE_MAX_ATTEMPTS`,
//! `TRIAGE_BASE_DELAY_MS`, `TRIAGE_BACKOFF_MULTIPLIER`, `TRIAGE_MAX_DELAY_MS`,
//! `TRIAGE_JITTER_MAX_MS`) and breaker (`TRIAGE_BREAKER_*`). A job type's policies come from,
//! strongest first:
//!
//! 1. [`Registry::handle_with`]: the policies written for that job type;
//! 2. [`Registry::new`]: defaults written for the whole registry;
//! 3. [`Registry::default`]: the `TRIAGE_*` variables (the built-in defaults where unset).
//!
//! Code wins because it is the more specific statement; the variables are a deployment-wide
//! default an operator can change without a build. An invalid variable is an error from
//! [`lambda::run`] / [`worker::run`] before any job runs, never a panic.
//!
//! # Errors
//!
//! A [`JobError`] is fatal ([`JobError::fatal`]), transient ([`JobError::transient`]) or
//! retry-after ([`JobError::retry_after`]). `?` works on `serde_json` errors (fatal) and
//! `std::io` errors (transient); [`JobError::from_source`] takes any other error and infers
//! the kind (unknown errors are transient), and [`JobError::with_source`] keeps a cause under
//! a kind you state. The cause stays an error value ([`std::error::Error::source`]); its chain
//! is rendered into the DLQ failure record and the logs. A panic fails its own record only,
//! as fatal. A payload that does not decode into the handler's type is fatal.
//!
//! # Policies
//!
//! [`RetryPolicy`] sets the attempt limit, the [`Backoff`] (exponential with jitter, full
//! or decorrelated jitter, Sidekiq's, or your own function) and [`Rules`] that classify
//! error codes or texts of one job type. [`BreakerConfig`] sets when a job type's breaker
//! opens, how long it stays open and how it probes. Both are checked against the source
//! queue's retention period at start-up.
//!
//! # Outside Lambda
//!
//! [`worker::run`] serves the same registry from any host, with the same variables, until
//! SIGINT/SIGTERM; [`worker::run_with`] takes [`RunOptions`], and [`Worker`] lets you drive
//! the polling yourself ([`Worker::from_config`] builds one).
//!
//! # Layers
//!
//! For contributors, ground floor first; each imports only the ones below it. Only the items
//! above are the library's interface. The modules below are private; the non-default
//! `internals` feature makes them public for the `triage` operator tool, the tests and the
//! benchmarks. They are not covered by semver.
//! 1. `core`: pure rules (envelope, classification, backoff, policy, breaker, decision);
//! 2. `effects`: SQS and DynamoDB calls, through one storage retry policy;
//! 3. `processor`: one batch in: read → admit and run → plan (pure) → execute → the batch
//!    response;
//! 4. `runtime`: the Lambda adapter and the long-polling worker.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Declares the building blocks: public with the `internals` feature, private without.
macro_rules! internal {
    ($($name:ident),*) => {$(
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

internal!(clock, core, effects, processor, runtime);
pub mod config;

pub use crate::core::breaker::BreakerConfig;
pub use crate::core::{Backoff, Decision, ErrorKind, FailureClass, JobError, RetryPolicy, Rules};
pub use crate::effects::aws_errors::{from_aws_code, from_aws_error};
pub use crate::processor::registry::{JobContext, Registry};
pub use crate::runtime::RuntimeError;
pub use crate::runtime::http::HttpDispatch;
pub use crate::runtime::worker::{RunOptions, Worker};

pub mod lambda {
    //! The Lambda adapter: an SQS event in, a partial batch response out. [`run`] is the whole
    //! of a function's `main`.
    pub use crate::runtime::env::sdk_config;
    pub use crate::runtime::lambda::{run, run_with};
}

pub mod layer {
    //! The Lambda layer's extension, for handlers in any language (`docs/layer.md`): it serves
    //! the Runtime API to the function's runtime and hands it one record at a time. [`run`] is
    //! the whole of the `sqs-triage-extension` binary.
    pub use crate::runtime::layer::run;
}

pub mod worker {
    //! The long-polling worker: the same pipeline as the Lambda adapter, for local development
    //! and hosts outside Lambda. [`run`] serves a registry until SIGINT/SIGTERM; [`Worker`]
    //! lets you drive the polling yourself.
    pub use crate::runtime::worker::{
        DEFAULT_GIVE_UP_AFTER, DELETE_MARGIN, MIN_VISIBILITY, RECEIVE_LATENCY, RunOptions, Worker,
        WorkerError, WorkerErrorKind, WorkerOptions, run, run_with,
    };
}

/// The README's code blocks, compiled and checked as doctests (its library example is
/// `examples/lambda_function.rs`; see the test below that keeps the two the same).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod readme_tests {
    /// The README's Rust example is `examples/lambda_function.rs` from its first `use` on,
    /// so the README shows the code the crate page compiles.
    #[test]
    fn the_readme_example_is_the_crate_page_example() {
        let readme = include_str!("../README.md");
        let example = include_str!("../examples/lambda_function.rs");
        let code = &example[example.find("use ").expect("a use line")..];
        let start = readme
            .find("```rust,no_run\n")
            .expect("a rust,no_run block in README.md")
            + "```rust,no_run\n".len();
        let end = start + readme[start..].find("```").expect("the block's end");
        assert_eq!(&readme[start..end], code);
    }

    /// The README is a front page a newcomer reads in minutes; the details live in docs/.
    #[test]
    fn the_readme_fits_on_a_front_page() {
        let lines = include_str!("../README.md").lines().count();
        assert!(lines <= 200, "README.md has {lines} lines; move detail to docs/");
    }
}
