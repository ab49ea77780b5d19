//! The Lambda SQS event the event source mapping would build from received messages:
//! system attributes, message attributes (binary ones as base64), body, ids and ARN.

#![allow(dead_code)]

use std::collections::HashMap;

use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_sqs::types::Message;
use serde_json::{Value, json};

/// The event as JSON.
pub fn lambda_event_json(messages: &[Message], queue_url: &str) -> Value {
    // The queue's ARN as Lambda writes it: the account and name from the URL's path.
    let mut path = queue_url.trim_end_matches('/').rsplit('/');
    let queue_name = path.next().unwrap_or(queue_url);
    let account = path.next().unwrap_or("000000000000");
    let arn = format!("arn:aws:sqs:us-east-1:{account}:{queue_name}");
    let records: Vec<Value> = messages.iter().map(|m| record(m, &arn)).collect();
    json!({ "Records": records })
}

/// The event, typed.
pub fn lambda_event(messages: &[Message], queue_url: &str) -> SqsEvent {
    serde_json::from_value(lambda_event_json(messages, queue_url)).expect("a valid SqsEvent")
}

fn record(m: &Message, arn: &str) -> Value {
    let attributes: HashMap<String, String> = m
        .attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let message_attributes: HashMap<String, Value> = m
        .message_attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| {
                    let mut o =
                        json!({"dataType": v.data_type(), "stringListValues": [], "binaryListValues": []});
                    if let Some(s) = v.string_value() {
                        o["stringValue"] = json!(s);
                    }
                    if let Some(b) = v.binary_value() {
                        o["binaryValue"] = json!(aws_smithy_types::base64::encode(b.as_ref()));
                    }
                    (k.clone(), o)
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "messageId": m.message_id(),
        "receiptHandle": m.receipt_handle(),
        "body": m.body(),
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": m.md5_of_body(),
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": "us-east-1",
    })
}
