//! The reference Lambda function: serves the built-in `triage.chaos` job type with the
//! policies the `TRIAGE_*` variables set (recording executions to
//! `TRIAGE_CHAOS_RECORD_TABLE` when it is set).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use sqs_triage::config::Config;
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::env::sdk_config;
use sqs_triage::runtime::{chaos, lambda};

#[tokio::main]
async fn main() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let registry = chaos::register_recording(
        Registry::new(config.policy.clone(), config.breaker),
        config.policy.clone(),
        config.breaker,
        chaos::Recorder::from_env(&sdk_config().await),
    );
    match lambda::run(registry).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
