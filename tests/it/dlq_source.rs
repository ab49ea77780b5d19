//! Messages SQS dead-lettered itself (its redrive after `maxReceiveCount`): they carry no
//! failure record, only SQS's `DeadLetterQueueSourceArn` system attribute. `dlq list` shows
//! that source and `dlq replay` sends them back there without `--to`.
//!
//! moto (5.2) moves a message to the DLQ after `maxReceiveCount` but does not set
//! `DeadLetterQueueSourceArn` (checked by experiment: a receive from the DLQ asking for All
//! system attributes returns SenderId, SentTimestamp and the receive counts only). So the
//! message is dead-lettered by moto's own redrive, and the DLQ read the CLI makes is answered,
//! once, through the fault proxy with that same message (same id, body and a live receipt
//! handle) plus the attribute AWS sets.

use crate::support;
use crate::support::fault_proxy::{Fault, FaultProxy};

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use serde_json::{Value, json};
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::effects::dlq::dlq_copy;
use triage::ops::setup::SetupReport;

const BIN: &str = env!("CARGO_BIN_EXE_triage");

fn triage(stack: &SetupReport, sqs_endpoint: &str, args: &[&str]) -> Output {
    support::strict_env(&mut Command::new(BIN))
        .args(args)
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env("AWS_ENDPOINT_URL_SQS", sqs_endpoint)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .expect("run triage")
}

fn ok_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "triage failed ({:?}): {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// Lowers the source queue's `maxReceiveCount` to 1, sends `body` and receives it twice
/// without deleting it: SQS (moto) moves it to the DLQ itself, without a failure record.
async fn dead_letter_by_sqs(sqs: &aws_sdk_sqs::Client, stack: &SetupReport, body: &str) {
    let policy = json!({"deadLetterTargetArn": stack.dlq_arn, "maxReceiveCount": "1"});
    sqs.set_queue_attributes()
        .queue_url(&stack.queue_url)
        .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
        .send()
        .await
        .unwrap();
    sqs.send_message()
        .queue_url(&stack.queue_url)
        .message_body(body)
        .send()
        .await
        .unwrap();
    // Long polls: a short one may find nothing on SQS though the message is there. The first
    // delivery comes within the deadline; the receive after it finds the message past
    // maxReceiveCount, and SQS moves it rather than hand it out again.
    let receive = || async {
        sqs.receive_message()
            .queue_url(&stack.queue_url)
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
            .len()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut received = 0;
    while received == 0 {
        assert!(std::time::Instant::now() < deadline, "the message never arrived");
        received += receive().await;
    }
    received += receive().await;
    assert_eq!(received, 1, "received once, then moved to the DLQ");
}

/// Receives the one DLQ message (holding it, so the CLI's own receive after the injected one
/// comes back empty) and returns the ReceiveMessage answer AWS would give for it: the same
/// message with `DeadLetterQueueSourceArn` set to `source_arn`.
async fn dlq_answer_with_source(sqs: &aws_sdk_sqs::Client, stack: &SetupReport, source_arn: &str) -> String {
    let out = sqs
        .receive_message()
        .queue_url(&stack.dlq_url)
        .visibility_timeout(300)
        .wait_time_seconds(1)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let ms = out.messages.unwrap_or_default();
    assert_eq!(ms.len(), 1, "the dead-lettered message is in the DLQ");
    let m = &ms[0];
    let system = m.attributes.clone().unwrap_or_default();
    assert!(
        !system.contains_key(&MessageSystemAttributeName::DeadLetterQueueSourceArn),
        "moto now sets DeadLetterQueueSourceArn: drop the injected answer and test end to end"
    );
    let sent = system
        .get(&MessageSystemAttributeName::SentTimestamp)
        .cloned()
        .unwrap_or_else(|| "0".into());
    let attributes: serde_json::Map<String, Value> = m
        .message_attributes()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            (
                k.clone(),
                json!({"DataType": v.data_type(), "StringValue": v.string_value()}),
            )
        })
        .collect();
    json!({"Messages": [{
        "MessageId": m.message_id(),
        "ReceiptHandle": m.receipt_handle(),
        "MD5OfBody": m.md5_of_body(),
        "Body": m.body(),
        "MessageAttributes": attributes,
        "Attributes": {
            "SentTimestamp": sent,
            "ApproximateReceiveCount": "2",
            "DeadLetterQueueSourceArn": source_arn,
        },
    }]})
    .to_string()
}

/// A queue URL without its scheme and host.
fn path(url: &str) -> &str {
    url.splitn(4, '/').nth(3).unwrap_or(url)
}

fn inject_once(proxy: &FaultProxy, answer: String) {
    proxy.fail_next(
        1,
        Fault::Body {
            status: 200,
            body: answer,
        },
        Some(vec!["ReceiveMessage".into()]),
    );
}

#[tokio::test]
async fn a_message_sqs_dead_lettered_is_listed_with_its_source_and_replayed_there_without_to() {
    let stack = support::fresh_resources("dlqsrc", false).await;
    let sqs = support::sqs_client().await;
    let body = json!({"type": "report.build", "id": "sqs-moved-1", "payload": {}}).to_string();
    dead_letter_by_sqs(&sqs, &stack, &body).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());

    // list (and its JSON) shows the source queue SQS names.
    inject_once(
        &proxy,
        dlq_answer_with_source(&sqs, &stack, &stack.queue_arn).await,
    );
    let list = ok_json(&triage(
        &stack,
        &proxy.url(),
        &["dlq", "list", "--messages", "--json"],
    ));
    let messages = list["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{list}");
    assert_eq!(messages[0]["class"], "unrecorded", "{list}");
    assert_eq!(messages[0]["source_queue"], stack.queue_arn.as_str(), "{list}");

    // show names it too.
    inject_once(
        &proxy,
        dlq_answer_with_source(&sqs, &stack, &stack.queue_arn).await,
    );
    let shown = triage(&stack, &proxy.url(), &["dlq", "show", "sqs-moved-1"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        text.contains("source queue") && text.contains(&stack.queue_arn),
        "{text}"
    );

    // replay without --to sends it back to that queue, whose redrive policy names this DLQ.
    inject_once(
        &proxy,
        dlq_answer_with_source(&sqs, &stack, &stack.queue_arn).await,
    );
    let report = ok_json(&triage(&stack, &proxy.url(), &["dlq", "replay", "--json"]));
    assert_eq!(report["moved"], 1, "{report}");
    // The URL comes from GetQueueUrl through the proxy, so moto gives it the proxy's host: the
    // queue is told by its path.
    let target = report["targets"][0]["queue_url"].as_str().unwrap();
    assert_eq!(path(target), path(&stack.queue_url), "{report}");
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].body(), Some(body.as_str()));
    let dlq = support::queue_depth(&sqs, &stack.dlq_url).await;
    assert_eq!(dlq.total(), 0, "the DLQ copy is deleted: {dlq:?}");
}

#[tokio::test]
async fn a_source_arn_whose_queue_does_not_feed_this_dlq_is_not_trusted() {
    let stack = support::fresh_resources("dlqsrc-other", false).await;
    let other = support::fresh_resources("dlqsrc-other2", false).await;
    let sqs = support::sqs_client().await;
    let body = json!({"type": "report.build", "id": "sqs-moved-2", "payload": {}}).to_string();
    dead_letter_by_sqs(&sqs, &stack, &body).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());

    // The attribute names a queue whose dead letters go to another DLQ: not moved, and said why.
    inject_once(
        &proxy,
        dlq_answer_with_source(&sqs, &stack, &other.queue_arn).await,
    );
    let o = triage(&stack, &proxy.url(), &["dlq", "replay", "--json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["moved"], 0, "{report}");
    let reason = report["not_moved"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("not this DLQ") && reason.contains("--to"),
        "{reason}"
    );
    assert_eq!(support::queue_depth(&sqs, &other.queue_url).await.total(), 0);
}

#[tokio::test]
async fn a_failure_records_source_wins_over_the_one_sqs_names() {
    let stack = support::fresh_resources("dlqsrc-rec", false).await;
    let other = support::fresh_resources("dlqsrc-rec2", false).await;
    let sqs = support::sqs_client().await;
    let body = json!({"type": "report.build", "id": "rec-1", "payload": {}}).to_string();
    let record = FailureRecord {
        class: FailureClass::Fatal,
        error: "boom".into(),
        attempts: 1,
        job_type: Some("report.build".into()),
        job_id: "rec-1".into(),
        source_queue: stack.queue_url.clone(),
        original_message_id: "orig-rec-1".into(),
        first_received_at: 1,
        failed_at: sqs_triage::clock::now_ms(),
    };
    let copy = dlq_copy(&body, &HashMap::new(), &record, 1 << 20).unwrap();
    sqs.send_message()
        .queue_url(&stack.dlq_url)
        .message_body(copy.body)
        .set_message_attributes(Some(copy.attributes))
        .send()
        .await
        .unwrap();
    let proxy = FaultProxy::start(&support::sqs_endpoint());

    // SQS's attribute names a queue that does not feed this DLQ; the record names one that does.
    inject_once(
        &proxy,
        dlq_answer_with_source(&sqs, &stack, &other.queue_arn).await,
    );
    let list = ok_json(&triage(
        &stack,
        &proxy.url(),
        &["dlq", "list", "--messages", "--json"],
    ));
    assert_eq!(list["messages"][0]["class"], "fatal", "{list}");
    assert_eq!(
        list["messages"][0]["source_queue"],
        stack.queue_url.as_str(),
        "{list}"
    );

    inject_once(
        &proxy,
        dlq_answer_with_source(&sqs, &stack, &other.queue_arn).await,
    );
    let report = ok_json(&triage(&stack, &proxy.url(), &["dlq", "replay", "--json"]));
    assert_eq!(report["moved"], 1, "{report}");
    assert_eq!(
        report["targets"][0]["queue_url"],
        stack.queue_url.as_str(),
        "{report}"
    );
    assert_eq!(support::drain(&sqs, &stack.queue_url, 1).await.len(), 1);
    assert_eq!(support::queue_depth(&sqs, &other.queue_url).await.total(), 0);
}
