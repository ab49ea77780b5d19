//! The cold-start floor the benchmark report (section 5) times next to `triage-lambda`: a bare
//! `lambda_runtime` function that loads the AWS configuration, builds the same two SDK clients
//! (SQS and DynamoDB) and answers each SQS event with an empty partial batch response, printing
//! one line per event as `triage-lambda` prints its metrics. No triage logic, no start-up check.
//! `cargo bench --bench report` builds it with `cargo build --release --example bare_floor`.
#![forbid(unsafe_code)]

use aws_config::BehaviorVersion;
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let sdk = aws_config::defaults(BehaviorVersion::latest()).load().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let (sqs, ddb) = (&sqs, &ddb);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The clients are kept alive (and so built) for the function's life, as a real one's.
        let _ = (sqs, ddb);
        let records = event.payload["Records"].as_array().map_or(0, Vec::len);
        println!("{}", json!({"handled": records}));
        Ok::<_, lambda_runtime::Error>(json!({"batchItemFailures": []}))
    }))
    .await
}
