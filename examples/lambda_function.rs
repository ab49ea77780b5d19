//! A Lambda function with two job types, each with its own policy. Build and run it locally
//! with `cargo lambda watch --example lambda_function`.
#![forbid(unsafe_code)]

use serde::Deserialize;
use sqs_triage::{BreakerConfig, JobContext, JobError, Registry, RetryPolicy, Rules};

#[derive(Deserialize)]
struct Charge {
    order: String,
    cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), sqs_triage::RuntimeError> {
    // `handle` follows the TRIAGE_* variables (TRIAGE_MAX_ATTEMPTS, TRIAGE_BASE_DELAY_MS,
    // TRIAGE_BREAKER_*, ...), read once at start-up; `handle_with` sets a job type's own
    // policy, which wins over them.
    let registry = Registry::default()
        .handle("email.send", |to: String, _ctx: JobContext| async move {
            // std::io errors are transient; `?` on them would classify them the same way.
            send_email(&to).await.map_err(JobError::transient)
        })
        .handle_with(
            "billing.charge",
            RetryPolicy::builder()
                .max_attempts(3)
                .rules(Rules::new().fatal_code("CardDeclined"))
                .build()?,
            BreakerConfig::default(),
            |c: Charge, _ctx: JobContext| async move { charge(&c.order, c.cents).await },
        );
    // Outside Lambda, the same registry as a long-polling worker:
    // sqs_triage::worker::run(registry).await
    sqs_triage::lambda::run(registry).await
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
