//! SQS's in-flight limit (about 120,000 messages held per standard queue, 20,000 per FIFO one),
//! which moto does not model: at the limit long polls return nothing and short polls answer
//! `OverLimit`. The proxy answers as SQS does. `OverLimit` is waited out as throttling, and a
//! DLQ read that meets the limit is never reported complete.

use crate::support;

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use sqs_triage::effects::storage_retry::{FailureKind, StorageRetry, StorageRetryConfig, sqs_config};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};
use triage::ops::Ctx;
use triage::ops::dlq;
use triage::ops::output::Report;

/// SQS's answer to a receive from a queue at its in-flight limit.
fn over_limit() -> Fault {
    Fault::Error {
        status: 403,
        code: "OverLimit".into(),
    }
}

/// What a short poll's request body holds, as the SDK writes it.
const SHORT_POLL: &str = "\"WaitTimeSeconds\":0";

#[tokio::test(flavor = "multi_thread")]
async fn an_over_limit_receive_is_retried_as_throttling() {
    let created = support::fresh_resources("inflight-retry", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_next(2, over_limit(), Some(vec!["ReceiveMessage".into()]));
    let sdk = support::sdk_config().await;
    let sqs = aws_sdk_sqs::Client::from_conf(sqs_config(&sdk).endpoint_url(proxy.url()).build());
    let retry = StorageRetry::new(StorageRetryConfig {
        base: Duration::from_millis(2),
        throttle_base: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        ..StorageRetryConfig::default()
    })
    .unwrap();
    let out = retry
        .call("ReceiveMessage", None, || {
            sqs.receive_message()
                .queue_url(&created.queue_url)
                .wait_time_seconds(0)
                .send()
        })
        .await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(
        proxy.faults().get("Error:OverLimit").copied(),
        Some(2),
        "{:?}",
        proxy.faults()
    );
    // Answered for good, it reads as throttling, never as a refusal.
    proxy.fail_always("ReceiveMessage", over_limit());
    let e = retry
        .call("ReceiveMessage", None, || {
            sqs.receive_message()
                .queue_url(&created.queue_url)
                .wait_time_seconds(0)
                .send()
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind, FailureKind::Throttled, "{e}");
}

/// Five of the DLQ's eight messages are held elsewhere and the queue is at its limit: the
/// sweep reads the three visible ones, then its long poll comes back empty. That is not the
/// end of the DLQ: `dlq list` (as purge and replay, which share the read) says it was not
/// read to the end.
#[tokio::test(flavor = "multi_thread")]
async fn a_dlq_read_at_the_in_flight_limit_is_not_reported_complete() {
    let created = support::fresh_resources("inflight-dlq", false).await;
    let sqs = support::sqs_client().await;
    for i in 0..8 {
        sqs.send_message()
            .queue_url(&created.dlq_url)
            .message_body(format!(r#"{{"type":"inflight.job","id":"j{i}","payload":{{}}}}"#))
            .send()
            .await
            .unwrap();
    }
    let mut held = 0;
    while held < 5 {
        let got = sqs
            .receive_message()
            .queue_url(&created.dlq_url)
            .max_number_of_messages(5 - held)
            .visibility_timeout(300)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        held += got.messages.unwrap_or_default().len() as i32;
    }
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["ReceiveMessage".into()]),
        body_contains: Some(SHORT_POLL.into()),
        fault: over_limit(),
        times: None,
    });
    let sdk = support::sdk_config().await;
    let mut via = Ctx::from_config(&sdk).unwrap();
    via.sqs = aws_sdk_sqs::Client::from_conf(sqs_config(&sdk).endpoint_url(proxy.url()).build());
    let report = dlq::list(&via, &created.dlq_url, &dlq::Filter::default(), false, 1_000)
        .await
        .unwrap();
    assert_eq!(report.scanned, 3, "{report:?}");
    assert!(
        report.incomplete,
        "a read stopped by the in-flight limit is not complete: {report:?}"
    );
    let problem = report.problem().unwrap_or_default();
    assert!(problem.contains("in-flight limit"), "{problem}");
    assert!(
        proxy.faults().contains_key("Error:OverLimit"),
        "{:?}",
        proxy.faults()
    );

    // Without the limit the same read is complete.
    proxy.clear_faults();
    let report = dlq::list(&via, &created.dlq_url, &dlq::Filter::default(), false, 1_000)
        .await
        .unwrap();
    assert!(!report.incomplete, "{report:?}");
    let visible = support::all_attributes(&sqs, &created.dlq_url).await
        [&QueueAttributeName::ApproximateNumberOfMessages]
        .clone();
    assert_eq!(visible, "3", "the read released what it held");
}
