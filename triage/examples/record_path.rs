//! One Lambda invocation of one record, a first delivery that succeeds, through the library's
//! Lambda adapter, and nothing else inside the runtime's `block_on`: the program
//! `tools/record_path.py` runs under callgrind to list the library's files and functions a
//! record passes through. Such a delivery makes no AWS call, so the clients are never used.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use sqs_triage::core::envelope::EnvelopeLimits;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::sqs::Sqs;
use sqs_triage::effects::storage_retry::StorageRetry;
use sqs_triage::processor::{Processor, ProcessorConfig};
use sqs_triage::runtime::lambda::handle_raw;
use sqs_triage::{JobContext, Registry};

const EVENT: &str = r#"{"Records":[{"messageId":"m-1","receiptHandle":"r-1",
"body":"{\"type\":\"resize\",\"id\":\"job-1\",\"payload\":{\"w\":64}}",
"attributes":{"ApproximateReceiveCount":"1","SentTimestamp":"1767225601000",
"ApproximateFirstReceiveTimestamp":"1767225601150"},"messageAttributes":{},
"md5OfBody":"x","eventSource":"aws:sqs",
"eventSourceARN":"arn:aws:sqs:us-east-1:000000000000:jobs","awsRegion":"us-east-1"}]}"#;

fn main() {
    let creds = aws_sdk_sqs::config::Credentials::new("k", "s", None, None, "none");
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(creds.clone())
            .build(),
    );
    let ddb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .credentials_provider(creds)
            .build(),
    );
    let registry =
        Registry::default().handle("resize", |_: serde_json::Value, _: JobContext| async { Ok(()) });
    let processor = Processor::new(
        Arc::new(registry),
        Sqs::new(sqs, StorageRetry::default()),
        AttemptLedger::new(ddb, "state", StorageRetry::default()),
        HashMap::new(),
        ProcessorConfig {
            source_queue: "https://sqs.us-east-1.amazonaws.com/000000000000/jobs".into(),
            dlq_url: "https://sqs.us-east-1.amazonaws.com/000000000000/jobs-dlq".into(),
            dlq_max_bytes: 262_144,
            concurrency: 10,
            limits: EnvelopeLimits::default(),
            log_payloads: false,
            receive_limit: None,
            retention: None,
        },
    );
    let event: Box<serde_json::value::RawValue> = serde_json::from_str(EVENT).expect("the event is JSON");
    let mut context = lambda_runtime::Context::default();
    context.deadline = sqs_triage::clock::now_ms() + 30_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let answer = runtime
        .block_on(handle_raw(
            &processor,
            lambda_runtime::LambdaEvent::new(event, context),
        ))
        .expect("the invocation answers");
    assert!(answer.batch_item_failures.is_empty(), "the record succeeds");
}
