//! The Lambda adapter end to end on the local stack (moto SQS, DynamoDB Local), through the
//! real SDK: partial batch responses, visibility backoff, immediate DLQ, exact attempts, FIFO.

use crate::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use sqs_triage::core::failure::{FAILURE_ATTRIBUTE, FailureClass, FailureRecord};
use sqs_triage::effects::dlq::failure_record;
use support::pipeline::{Harness, failed_ids, fast_policy, quiet_breaker};

fn record_of(m: &aws_sdk_sqs::types::Message) -> FailureRecord {
    failure_record(
        m.message_attributes()
            .cloned()
            .as_ref()
            .unwrap_or(&Default::default()),
    )
    .unwrap()
    .unwrap()
}

#[tokio::test]
async fn a_fatal_job_is_in_the_dlq_after_one_execution_in_the_same_invocation() {
    let h = Harness::new("fatal", false, fast_policy(5), quiet_breaker()).await;
    let body = r#"{"type":"test.recorded","id":"job-fatal","payload":{"outcome":"fatal"}}"#;
    h.sqs
        .send_message()
        .queue_url(&h.queue_url)
        .message_body(body)
        .message_attributes(
            "tenant",
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value("acme")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let (messages, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert_eq!(messages.len(), 1);
    assert!(
        response.batch_item_failures.is_empty(),
        "settled by the DLQ copy: {response:?}"
    );
    assert_eq!(h.executions("job-fatal"), vec![1]);

    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].body(), Some(body), "body byte for byte");
    let attrs = dlq[0].message_attributes().unwrap();
    assert_eq!(
        attrs["tenant"].string_value(),
        Some("acme"),
        "original attributes kept"
    );
    let record = record_of(&dlq[0]);
    assert_eq!(record.class, FailureClass::Fatal);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.job_id, "job-fatal");
    assert_eq!(record.job_type.as_deref(), Some("test.recorded"));
    assert_eq!(record.source_queue, h.queue_url);
    assert_eq!(record.original_message_id, messages[0].message_id().unwrap());
    assert!(record.error.contains("fatal"), "{}", record.error);
    assert!(attrs.contains_key(FAILURE_ATTRIBUTE));
    assert_eq!(h.depth(&h.queue_url).await, 0, "gone from the source queue");
}

#[tokio::test]
async fn a_transient_job_is_invisible_for_its_delay_and_succeeds_on_attempt_3() {
    let h = Harness::new("transient", false, fast_policy(5), quiet_breaker()).await;
    h.send_jobs(&[("job-t", json!({"outcome": "transient", "fail_times": 2}))])
        .await;
    let (_, response) = h.invoke_once(Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        response.batch_item_failures.len(),
        1,
        "reported failed after the visibility change"
    );
    let failed_at = Instant::now();
    // Backoff(1) = 1 s (no jitter): SQS rounds the visibility up to whole seconds.
    assert!(
        h.receive(&h.queue_url, Duration::ZERO).await.is_empty(),
        "invisible right after"
    );
    let mut attempts_seen = 1;
    while attempts_seen < 3 {
        if let Some((_, _)) = h.invoke_once(Duration::from_secs(5)).await {
            attempts_seen = h.executions("job-t").len();
        }
        assert!(
            failed_at.elapsed() < Duration::from_secs(30),
            "job did not come back"
        );
    }
    assert!(
        failed_at.elapsed() >= Duration::from_secs(1 + 2),
        "came back before its delays: {:?}",
        failed_at.elapsed()
    );
    assert_eq!(h.executions("job-t"), vec![1, 2, 3]);
    assert_eq!(h.depth(&h.queue_url).await, 0);
    assert!(h.dlq_messages().await.is_empty());
}

#[tokio::test]
async fn an_always_transient_job_is_exhausted_after_exactly_max_attempts() {
    let h = Harness::new("exhaust", false, fast_policy(3), quiet_breaker()).await;
    h.send_jobs(&[("job-x", json!({"outcome": "transient"}))]).await;
    let start = Instant::now();
    while h.executions("job-x").len() < 3 || h.depth(&h.queue_url).await > 0 {
        h.invoke_once(Duration::from_secs(5)).await;
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "did not settle: {:?}",
            h.executions("job-x")
        );
    }
    assert_eq!(h.executions("job-x"), vec![1, 2, 3]);
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    let r = record_of(&dlq[0]);
    assert_eq!(r.class, FailureClass::Exhausted);
    assert_eq!(r.attempts, 3);
}

#[tokio::test]
async fn malformed_bodies_and_unknown_types_are_invalid_and_never_run() {
    let h = Harness::new("invalid", false, fast_policy(5), quiet_breaker()).await;
    h.send_raw(&[
        ("{not json", None),
        (r#"{"type":"nope.unknown","id":"u1"}"#, None),
        (r#"{"payload":1}"#, None),
    ])
    .await;
    let mut seen = 0;
    while seen < 3 {
        let (messages, response) = h.invoke_once(Duration::from_secs(2)).await.expect("messages");
        assert!(response.batch_item_failures.is_empty());
        seen += messages.len();
    }
    assert!(h.log.lock().unwrap().is_empty(), "nothing executed");
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 3);
    for m in &dlq {
        let r = record_of(m);
        assert_eq!(r.class, FailureClass::Invalid);
        assert_eq!(r.attempts, 0);
    }
    let unknown = dlq
        .iter()
        .map(record_of)
        .find(|r| r.job_id == "u1")
        .expect("the unknown type keeps its id");
    assert!(unknown.error.contains("no handler"), "{}", unknown.error);
    assert_eq!(unknown.job_type.as_deref(), Some("nope.unknown"));
}

#[tokio::test]
async fn a_dlq_that_rejects_sends_loses_nothing() {
    let gone = support::queue_to_delete("nodlq-gone", false).await;
    let dlq = gone.clone();
    let h = Harness::with("nodlq", false, fast_policy(5), quiet_breaker(), move |mut c| {
        c.dlq_url = Some(dlq);
        c
    })
    .await;
    // A DLQ deleted after start-up: every send is refused.
    support::delete_queue(&gone).await;
    h.sqs
        .set_queue_attributes()
        .queue_url(&h.queue_url)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "1")
        .send()
        .await
        .unwrap();
    h.send_jobs(&[("job-f", json!({"outcome": "fatal"}))]).await;
    h.send_raw(&[("garbage", None)]).await;
    // Every receive until both messages have been handed out, each reported failed.
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let start = Instant::now();
    while reported.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {reported:?} of the 2 messages arrived"
        );
        if let Some((messages, response)) = h.invoke_once(Duration::from_secs(2)).await {
            let ids: BTreeSet<String> = messages
                .iter()
                .map(|m| m.message_id().unwrap().to_owned())
                .collect();
            assert_eq!(
                failed_ids(&response)
                    .into_iter()
                    .map(str::to_owned)
                    .collect::<BTreeSet<_>>(),
                ids,
                "nothing settled without a DLQ copy"
            );
            reported.extend(ids);
        }
    }
    assert_eq!(h.depth(&h.queue_url).await, 2, "both still in the source queue");
    // Both come back.
    let mut back: BTreeSet<String> = BTreeSet::new();
    let start = Instant::now();
    while back.len() < reported.len() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {back:?} of {reported:?} came back"
        );
        let got = h.receive(&h.queue_url, Duration::from_secs(5)).await;
        back.extend(got.iter().map(|m| m.message_id().unwrap().to_owned()));
    }
    assert_eq!(back, reported, "the same messages, nothing lost");
    // The fatal one ran once per delivery, each with the next attempt number.
    let runs = h.executions("job-f");
    assert!(
        !runs.is_empty() && runs.iter().copied().eq(1..=runs.len() as u32),
        "{runs:?}"
    );
}

#[tokio::test]
async fn fifo_order_within_a_group_holds_across_a_failure() {
    let h = Harness::new("fifo", true, fast_policy(5), quiet_breaker()).await;
    let job =
        |id: &str, p: serde_json::Value| json!({"type": "test.recorded", "id": id, "payload": p}).to_string();
    let a1 = job("a1", json!({"outcome": "ok"}));
    let a2 = job("a2", json!({"outcome": "transient", "fail_times": 1}));
    let a3 = job("a3", json!({"outcome": "ok"}));
    let b1 = job("b1", json!({"outcome": "ok"}));
    h.send_raw(&[
        (&a1, Some("A")),
        (&a2, Some("A")),
        (&a3, Some("A")),
        (&b1, Some("B")),
    ])
    .await;
    let start = Instant::now();
    loop {
        h.invoke_once(Duration::from_secs(2)).await;
        let done = ["a1", "a2", "a3", "b1"]
            .iter()
            .all(|j| !h.executions(j).is_empty())
            && h.executions("a2").len() == 2;
        if done && h.depth(&h.queue_url).await == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "FIFO jobs did not settle: {:?}",
            h.log.lock().unwrap()
        );
    }
    let order: Vec<String> = h
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(j, _)| j.starts_with('a'))
        .map(|(j, a)| format!("{j}#{a}"))
        .collect();
    assert_eq!(
        order,
        vec!["a1#1", "a2#1", "a2#2", "a3#1"],
        "a3 never overtakes a2"
    );
}
