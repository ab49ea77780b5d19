//! A long-polling worker with two job types, each with its own policy: the same registry a
//! Lambda function would use (see `examples/lambda_function.rs`), served from any host.
//! Configured by the same `TRIAGE_*` variables; stops on Ctrl-C or SIGTERM, within the source
//! queue's visibility timeout. Run it on the local stack with
//! `cargo run --example worker` after `eval "$(bash infra/local/stack.sh env)"` and
//! `triage setup`'s exports.
#![forbid(unsafe_code)]

use std::time::Duration;

use serde::Deserialize;
use sqs_triage::worker::{RunOptions, run_with};
use sqs_triage::{BreakerConfig, JobContext, JobError, Registry, RetryPolicy, Rules};

#[derive(Deserialize)]
struct Charge {
    order: String,
    cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), sqs_triage::RuntimeError> {
    let card_rules = Rules::new().fatal_code("CardDeclined");
    let registry = Registry::default()
        .handle("email.send", |to: String, _ctx: JobContext| async move {
            send_email(&to).await.map_err(JobError::transient)
        })
        .handle_with(
            "billing.charge",
            RetryPolicy::builder().max_attempts(3).rules(card_rules).build()?,
            BreakerConfig::default(),
            |c: Charge, _ctx: JobContext| async move { charge(&c.order, c.cents).await },
        );
    // `sqs_triage::worker::run(registry)` with the defaults; here, four batches in
    // flight and an exit after one minute of a deleted queue or denied access.
    let opts = RunOptions {
        batches: 4,
        give_up_after: Duration::from_secs(60),
    };
    run_with(registry, opts).await
}

async fn send_email(_to: &str) -> Result<(), std::io::Error> {
    Ok(())
}

async fn charge(order: &str, cents: u64) -> Result<(), JobError> {
    if cents == 0 {
        return Err(JobError::fatal(format!("order {order}: nothing to charge")));
    }
    Ok(())
}
