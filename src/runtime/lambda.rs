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

/// Lambda gives the deadline as epoch milliseconds. cargo-lambda's local emulator sends the
/// function timeout itself (e.g. `600000`); a value too small to be an instant after 2001 is
/// read that way, so local runs keep a deadline instead of releasing every record.
fn time_left_ms(deadline_ms: u64, now_ms: u64) -> u64 {
    const EPOCH_2001_MS: u64 = 1_000_000_000_000;
    if deadline_ms < EPOCH_2001_MS {
        deadline_ms
    } else {
        deadline_ms.saturating_sub(now_ms)
    }
}

/// Handles one event: processes the records, prints the metrics as EMF, and reports failed
/// records. A record that must be reported but has no message id fails the whole batch (an
/// empty `itemIdentifier` is never sent).
pub async fn handle(
    processor: &Processor,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, RuntimeError> {
    let deadline_ms = event.context.deadline;
    let left = std::time::Duration::from_millis(time_left_ms(deadline_ms, now_ms()));
    let deadline = (deadline_ms > 0).then(|| Instant::now() + left);
    tracing::debug!(
        deadline_ms,
        time_left_ms = left.as_millis() as u64,
        records = event.payload.records.len(),
        "invocation"
    );
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

#[cfg(test)]
mod tests {
    use super::time_left_ms;

    #[test]
    fn deadlines_are_epoch_ms_or_an_emulator_timeout() {
        assert_eq!(time_left_ms(1_700_000_030_000, 1_700_000_000_000), 30_000);
        assert_eq!(time_left_ms(1_700_000_000_000, 1_700_000_030_000), 0);
        assert_eq!(time_left_ms(600_000, 1_700_000_000_000), 600_000);
    }
}
