//! The Lambda layer's extension: serves the Runtime API to the function's runtime and runs
//! each SQS record as its own invocation (see `docs/layer.md`). Lambda starts it from
//! `/opt/extensions/sqs-triage-extension`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match sqs_triage::layer::run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // A configuration error exits 2, any other refusal 1: either way Lambda fails the
            // environment's init (or replaces the environment) with this line in the log.
            if e.downcast_ref::<sqs_triage::config::ConfigError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
