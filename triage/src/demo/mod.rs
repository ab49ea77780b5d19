//! Demo and test equipment, not part of the library a handler author uses: the built-in
//! `triage.chaos` job type ([`chaos`]), the `triage demo` workload ([`workload`]) and the
//! worker that serves `triage.chaos` alone ([`run_worker`]). The generic runtimes
//! ([`sqs_triage::runtime`]) know nothing of them; the shipped binaries opt in (`triage-lambda`
//! registers [`chaos::registry`], `triage worker --demo-handlers` calls [`run_worker`],
//! `triage demo` calls [`workload::main_from_env`]).

pub mod chaos;
pub mod workload;

use sqs_triage::runtime::RuntimeError;
use sqs_triage::runtime::env::sdk_config;
use sqs_triage::runtime::worker::{RunOptions, run_with};

/// Runs the long-polling worker with the built-in demo job type `triage.chaos` only
/// (`triage worker --demo-handlers`), with the `TRIAGE_*` variables' policies, recording
/// executions when `TRIAGE_CHAOS_RECORD_TABLE` is set.
pub async fn run_worker(opts: RunOptions) -> Result<(), RuntimeError> {
    let recorder = chaos::Recorder::from_env(&sdk_config().await);
    run_with(chaos::registry(recorder), opts).await
}
