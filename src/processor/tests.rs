//! The read step's rules, on a processor whose clients are never called (reading a batch of
//! first deliveries makes no call), and what the steps' tests share.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::registry::{JobContext, Registry};
use super::{Incoming, Processor, ProcessorConfig};
use crate::core::decision::retention_margin;
use crate::core::envelope::EnvelopeLimits;
use crate::effects::ledger::AttemptLedger;
use crate::effects::metrics::{Metrics, UNREGISTERED};
use crate::effects::sqs::Sqs;
use crate::effects::storage_retry::StorageRetry;

/// The settings of the tests' processor: queue `q`, no receive limit, no retention.
pub(super) fn config() -> ProcessorConfig {
    ProcessorConfig {
        source_queue: "https://sqs.us-east-1.amazonaws.com/000000000000/q".into(),
        dlq_url: "https://sqs.us-east-1.amazonaws.com/000000000000/dlq".into(),
        dlq_max_bytes: 262_144,
        concurrency: 1,
        limits: EnvelopeLimits::default(),
        log_payloads: false,
        receive_limit: None,
        retention: None,
    }
}

/// A processor serving job type `t`, whose clients are never called.
pub(super) fn processor(config: ProcessorConfig) -> Processor {
    let creds = aws_sdk_sqs::config::Credentials::new("k", "s", None, None, "test");
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
    let registry = Registry::default().handle("t", |_: serde_json::Value, _: JobContext| async { Ok(()) });
    Processor::new(
        Arc::new(registry),
        Sqs::new(sqs, StorageRetry::default()),
        AttemptLedger::new(ddb, "state", StorageRetry::default()),
        HashMap::new(),
        config,
    )
}

/// A first delivery of `body` from queue `q`, message id `m<n>`.
pub(super) fn incoming(n: usize, body: &str) -> Incoming {
    Incoming {
        message_id: format!("m{n}"),
        receipt_handle: format!("r{n}"),
        body: body.into(),
        receive_count: 1,
        first_received_at_ms: None,
        sent_at_ms: None,
        group_id: None,
        attributes: HashMap::new(),
        from_fifo: false,
        source_arn: Some("arn:aws:sqs:us-east-1:000000000000:q".into()),
    }
}

/// A message whose retention ends at or before it is read cannot exist (a replayed sample, a
/// clock that is off): no retention rule applies to it. One whose retention ends later has
/// its end, and its deadline to be decided a margin before.
#[test]
fn retention_applies_only_when_it_ends_after_the_read() {
    let retention = Duration::from_secs(3_600);
    let p = processor(ProcessorConfig {
        retention: Some(retention),
        ..config()
    });
    let r = retention.as_millis() as u64;
    let mut inc = incoming(0, r#"{"type":"t"}"#);
    inc.sent_at_ms = Some(0);
    let ended = p.read(inc.clone());
    assert_eq!((ended.retention_ends_ms, ended.facts.expires_at_ms), (None, None));
    let now = p.clock().now_ms();
    let sent = now - r + 60_000;
    inc.sent_at_ms = Some(sent);
    let live = p.read(inc);
    assert_eq!(live.retention_ends_ms, Some(sent + r));
    let margin = retention_margin(retention).as_millis() as u64;
    assert_eq!(live.facts.expires_at_ms, Some(sent + r - margin));
    assert!(live.facts.received_at_ms >= now, "the facts are taken at the read");
}

/// Metrics of records that are not runnable jobs go under `unregistered`, so a producer
/// cannot create dimensions; a served job type's go under its name.
#[test]
fn odd_records_count_under_unregistered_and_served_ones_under_their_type() {
    let p = processor(ProcessorConfig {
        receive_limit: Some(1),
        ..config()
    });
    let mut served = incoming(0, r#"{"type":"t"}"#);
    let mut unknown = incoming(1, r#"{"type":"x"}"#);
    let mut unreadable = incoming(2, "not json");
    for inc in [&mut served, &mut unknown, &mut unreadable] {
        inc.receive_count = 2;
        inc.source_arn = Some("arn:aws:sqs:us-east-1:000000000000:other".into());
    }
    let mut metrics = Metrics::default();
    let records = p.read_batch(vec![served, unknown, unreadable], &mut metrics);
    let dims: Vec<&str> = records.iter().map(|r| r.dimension()).collect();
    assert_eq!(dims, ["t", UNREGISTERED, UNREGISTERED]);
    let types: Vec<&str> = metrics.by_type.keys().map(String::as_str).collect();
    assert_eq!(types, ["t", UNREGISTERED]);
    for (dim, n) in [("t", 1), (UNREGISTERED, 2)] {
        let counts = &metrics.by_type[dim].counts;
        assert_eq!(counts.get("PastReceiveLimit"), Some(&n), "{dim}");
        assert_eq!(counts.get("OtherSourceQueue"), Some(&n), "{dim}");
    }
    assert_eq!(records[1].named_type(), Some("x"), "the failure record names the type");
    assert_eq!(records[2].named_type(), None);
}
