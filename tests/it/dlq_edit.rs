//! `triage dlq edit` and fair queues on the local stack.
//!
//! Fair queues: a producer on a standard queue may set `MessageGroupId` (its tenant). moto
//! 5.2.5 accepts it on a standard queue and returns it on receive (checked by experiment), so
//! these tests run end to end without injected answers.

use crate::support;
use crate::support::pipeline::{Harness, RECORDED, fast_policy, quiet_breaker};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use serde_json::json;
use sqs_triage::ops::{Ctx, dlq};

fn group_of(m: &Message) -> Option<&str> {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .map(String::as_str)
}

#[tokio::test]
async fn a_fair_queue_group_id_is_kept_on_the_dlq_copy_and_restored_by_replay() {
    let h = Harness::new("fairq", false, fast_policy(3), quiet_breaker()).await;
    let body = json!({"type": RECORDED, "id": "fair-1", "payload": {"outcome": "fatal"}}).to_string();
    h.sqs
        .send_message()
        .queue_url(&h.queue_url)
        .message_body(&body)
        .message_group_id("tenant-7")
        .send()
        .await
        .unwrap();
    let (received, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert_eq!(
        group_of(&received[0]),
        Some("tenant-7"),
        "the source queue keeps it"
    );
    assert!(
        response.batch_item_failures.is_empty(),
        "dead-lettered, not retried"
    );

    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].body(), Some(body.as_str()));
    assert_eq!(
        group_of(&dlq[0]),
        Some("tenant-7"),
        "the DLQ copy keeps the group"
    );

    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let opts = dlq::ReplayOptions {
        table: Some(h.table.clone()),
        max_scan: 100,
        ..dlq::ReplayOptions::default()
    };
    let report = dlq::replay(&ctx, &h.dlq_url, &opts).await.unwrap();
    assert_eq!(report.moved, 1, "{report:?}");
    let back = h.receive(&h.queue_url, Duration::from_secs(2)).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].body(), Some(body.as_str()));
    assert_eq!(group_of(&back[0]), Some("tenant-7"), "replay restores the group");
}

/// Through `triage worker`: its ReceiveMessage asks for the system attributes, so the group
/// reaches the DLQ copy.
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_keeps_a_fair_queue_group_id_on_the_dlq_copy() {
    let stack = support::fresh_resources("fairw", false).await;
    let sqs = support::sqs_client().await;
    let body = json!({"type": "triage.chaos", "id": "fair-w1", "payload": {"outcome": "fatal"}}).to_string();
    sqs.send_message()
        .queue_url(&stack.queue_url)
        .message_body(&body)
        .message_group_id("tenant-9")
        .send()
        .await
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(["worker", "--demo-handlers"])
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env("RUST_LOG", "sqs_triage=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("triage worker starts");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || stderr.lines().map_while(Result::ok).collect::<Vec<_>>());
    let deadline = Instant::now() + Duration::from_secs(60);
    let copy = loop {
        let got = support::read_all(&sqs, &stack.dlq_url, 30, 1).await;
        if let Some(m) = got.into_iter().next() {
            break Some(m);
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            break None;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let log = reader.join().unwrap();
    let copy = copy.unwrap_or_else(|| panic!("nothing dead-lettered; worker said:\n{}", log.join("\n")));
    assert_eq!(copy.body(), Some(body.as_str()));
    assert_eq!(group_of(&copy), Some("tenant-9"), "the DLQ copy keeps the group");
}
