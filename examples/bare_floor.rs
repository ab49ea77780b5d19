//! The cold-start floor the benchmark report (section 5) times next to `triage-lambda`: a bare
//! `lambda_runtime` function that loads the AWS configuration with the same HTTPS client
//! (one trust store, [`sqs_triage::lambda::sdk_config`]), builds the same two SDK clients
//! (SQS and DynamoDB) and answers each SQS event with an empty partial batch response, printing
//! one line per event as `triage-lambda` prints its metrics. No triage logic, no start-up check.
//! With `FLOOR_TABLE` set it also makes, per event, the one DynamoDB call a cold
//! `triage-lambda`'s first event needs: a consistent read of one item of that table (the
//! breaker's read). `cargo bench --bench report` builds it with
//! `cargo build --release --example bare_floor`.
#![forbid(unsafe_code)]

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let sdk = sqs_triage::lambda::sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let table = std::env::var("FLOOR_TABLE").ok();
    let (sqs, ddb, table) = (&sqs, &ddb, &table);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The clients are kept alive (and so built) for the function's life, as a real one's.
        let _ = sqs;
        if let Some(table) = table {
            let key = |v: &str| aws_sdk_dynamodb::types::AttributeValue::S(v.to_owned());
            ddb.get_item()
                .table_name(table)
                .key("pk", key("breaker#floor"))
                .key("sk", key("state"))
                .consistent_read(true)
                .send()
                .await?;
        }
        let records = event.payload["Records"].as_array().map_or(0, Vec::len);
        println!("{}", json!({"handled": records}));
        Ok::<_, lambda_runtime::Error>(json!({"batchItemFailures": []}))
    }))
    .await
}
