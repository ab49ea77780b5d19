//! The reference Lambda function: serves the built-in `triage.chaos` job type with the
//! policies the `TRIAGE_*` variables set (recording executions to
//! `TRIAGE_CHAOS_RECORD_TABLE` when it is set). A team's own function is the same few lines
//! with its own registry: see the crate documentation and `examples/lambda_function.rs`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use sqs_triage::runtime::env::sdk_config;
use triage::demo::chaos;

#[tokio::main]
async fn main() -> ExitCode {
    // One AWS configuration for the recorder's client and the function's own.
    let sdk = sdk_config().await;
    let registry = chaos::registry(chaos::Recorder::from_env(&sdk));
    match sqs_triage::runtime::lambda::run_with(registry, &sdk).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // A configuration error (an invalid or a missing variable) exits 2; any other
            // start-up refusal (a queue or table that is missing or unusable) exits 1.
            if e.downcast_ref::<sqs_triage::config::ConfigError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
