//! A Lambda function with two job types, each with its own policy. Build and run it locally
//! with `cargo lambda watch --example lambda_function`.
#![forbid(unsafe_code)]

use serde::Deserialize;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::{JobError, RetryPolicy, Rules};
use sqs_triage::processor::registry::{JobContext, Registry};

#[derive(Deserialize)]
struct Charge {
    order: String,
    cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), sqs_triage::runtime::RuntimeError> {
    let card_rules = Rules::new().fatal_code("CardDeclined");
    let registry = Registry::default()
        .handle("email.send", |to: String, _ctx: JobContext| async move {
            // std::io errors are transient; `?` on them would classify them the same way.
            send_email(&to).await.map_err(JobError::transient)
        })
        .handle_with(
            "billing.charge",
            RetryPolicy::builder().max_attempts(3).rules(card_rules).build()?,
            BreakerConfig::default(),
            |c: Charge, _ctx: JobContext| async move { charge(&c.order, c.cents).await },
        );
    sqs_triage::runtime::lambda::run(registry).await
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
