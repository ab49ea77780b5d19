//! The bare function the benchmark report's added-billed-duration section (section 8) times
//! beside `triage-lambda`: `lambda_runtime` and `aws_lambda_events` alone, no sqs-triage. It
//! runs the chaos job's work for each record, all records side by side as `triage-lambda`
//! runs them (`TRIAGE_CONCURRENCY`'s default covers a 10-record batch): it sleeps the payload's
//! `sleep_ms`, then fails the record unless `outcome` is `ok`. It reports the failures itself in
//! an `SqsBatchResponse` and makes no AWS call. `cargo bench --bench report` builds it with
//! `cargo build --release --example bare_batch`.
#![forbid(unsafe_code)]

use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

/// The record's work: `Ok` when it succeeded.
async fn work(record: &SqsMessage) -> Result<(), String> {
    let body: Value = serde_json::from_str(record.body.as_deref().unwrap_or_default())
        .map_err(|e| format!("not JSON: {e}"))?;
    let payload = &body["payload"];
    if let Some(ms) = payload["sleep_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    match payload["outcome"].as_str().unwrap_or("ok") {
        "ok" => Ok(()),
        other => Err(format!("outcome {other}")),
    }
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| async move {
        let records = &event.payload.records;
        let results = futures::future::join_all(records.iter().map(work)).await;
        let mut response = SqsBatchResponse::default();
        for (record, result) in records.iter().zip(results) {
            if result.is_err() {
                response.add_failure(record.message_id.clone().unwrap_or_default());
            }
        }
        Ok::<_, lambda_runtime::Error>(response)
    }))
    .await
}
