//! The incident of `tests/it/incident.rs` as a worker process, for the console's browser test
//! (`tests/browser/`) and for trying the console by hand: `email.send` always succeeds;
//! `billing.charge` fails fatally ("card token is None") until the file that
//! `INCIDENT_FIXED_FILE` names exists — the "fix" — and succeeds from then on. Each job that
//! succeeds appends `TYPE ID` as a line to the file `INCIDENT_DONE_FILE` names, when set.
//! Configured by the usual `TRIAGE_*` variables; stops on Ctrl-C or SIGTERM.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;
use sqs_triage::worker::{RunOptions, run_with};
use sqs_triage::{JobContext, JobError, Registry};

fn done(job_type: &str, ctx: &JobContext) -> Result<(), JobError> {
    if let Some(path) = std::env::var_os("INCIDENT_DONE_FILE") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(PathBuf::from(path))
            .map_err(JobError::transient)?;
        f.write_all(format!("{job_type} {}\n", ctx.job_id).as_bytes())
            .map_err(JobError::transient)?;
    }
    Ok(())
}

fn fixed() -> bool {
    std::env::var_os("INCIDENT_FIXED_FILE").is_some_and(|p| PathBuf::from(p).exists())
}

#[tokio::main]
async fn main() -> Result<(), sqs_triage::RuntimeError> {
    let registry = Registry::default()
        .handle("email.send", |_: Value, ctx: JobContext| async move {
            done("email.send", &ctx)
        })
        .handle("billing.charge", |_: Value, ctx: JobContext| async move {
            if fixed() {
                done("billing.charge", &ctx)
            } else {
                Err(JobError::fatal("billing: card token is None (bug #4711)"))
            }
        });
    run_with(registry, RunOptions::default()).await
}
