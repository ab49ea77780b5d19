//! The reference Lambda function: serves the built-in `triage.chaos` job type with the
//! policies the `TRIAGE_*` variables set.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use sqs_triage::config::Config;
use sqs_triage::processor::registry::Registry;
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
    let registry = chaos::register(
        Registry::new(config.policy.clone(), config.breaker),
        config.policy.clone(),
        config.breaker,
    );
    match lambda::run(registry).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
