//! The Lambda adapter: an SQS event in, a partial batch response out.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use lambda_runtime::{LambdaEvent, service_fn};
use tokio::time::Instant;

use super::RuntimeError;
use super::env::{Environment, build, init_tracing, sdk_config};
use crate::config::Config;
use crate::processor::registry::Registry;
use crate::processor::{Incoming, Processor, now_ms};

/// Runs `registry` as a Lambda function: reads configuration from the environment, builds the
/// SDK clients once for the container, and serves SQS events until the runtime stops.
pub async fn run(registry: Registry) -> Result<(), RuntimeError> {
    init_tracing();
    let config = Config::from_env()?;
    let env: Environment = build(&config, registry, &sdk_config().await).await?;
    let processor = &env.processor;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        handle(processor, event).await
    }))
    .await
}

/// Handles one event: processes the records, prints the metrics as EMF, and reports failed
/// records. A record that must be reported but has no message id fails the whole batch (an
/// empty `itemIdentifier` is never sent).
pub async fn handle(
    processor: &Processor,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, RuntimeError> {
    let deadline_ms = event.context.deadline;
    let left = std::time::Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
    let deadline = (deadline_ms > 0).then(|| Instant::now() + left);
    let records: Vec<Incoming> = event
        .payload
        .records
        .into_iter()
        .map(Incoming::from_lambda)
        .collect();
    let outcome = processor.process(records, deadline).await;
    for line in outcome.metrics.emf_lines(now_ms()) {
        println!("{line}");
    }
    if outcome.whole_batch_failed {
        return Err("a record without a message id could not be settled; failing the whole batch".into());
    }
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = outcome
        .failures()
        .into_iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            f
        })
        .collect();
    Ok(response)
}
