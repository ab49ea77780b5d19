//! Promises of docs/guarantees.md at their edges: a failure record cut to the
//! last bytes of room, a probe's outcome after its lease ended, a routing attribute without a
//! string value, a permit given back against a stalled table, a receive count that does not
//! read. Each test names the promise it checks.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::MessageAttributeValue;
use serde_json::json;
use sqs_triage::clock::now_ms;
use sqs_triage::core::breaker::{Aggregate, BreakerConfig, Phase};
use sqs_triage::core::decision::Gate;
use sqs_triage::core::failure::{FAILURE_ATTRIBUTE, FailureClass, FailureRecord};
use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::dlq::{dlq_copy, failure_record};
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};
use support::pipeline::{Harness, Options, failed_ids};

fn record(error: &str, job_id: &str, source_queue: &str, message_id: &str) -> FailureRecord {
    FailureRecord {
        class: FailureClass::Fatal,
        error: error.to_owned(),
        attempts: 1,
        job_type: Some(support::pipeline::RECORDED.to_owned()),
        job_id: job_id.to_owned(),
        source_queue: source_queue.to_owned(),
        original_message_id: message_id.to_owned(),
        first_received_at: 1_700_000_000_000,
        failed_at: 1_700_000_000_000,
    }
}

/// Bytes of the record with an empty error text.
fn empty_len(r: &FailureRecord) -> usize {
    let mut e = r.clone();
    e.error.clear();
    serde_json::to_string(&e).unwrap().len()
}

/// docs/guarantees.md: the DLQ copy carries "a `triage-failure` JSON record ... that fits
/// SQS's size limit (the error text is cut, never the body)", and "A copy goes even when no
/// record fits": the copy goes bare only "when no failure record can fit next to a body".
/// A record whose error, cut to a few bytes or to nothing, fits goes with the copy, also when
/// the 14-byte `…[truncated]` mark does not fit beside it.
#[test]
fn a_record_that_fits_with_its_error_cut_is_not_dropped() {
    let r = record(&"E".repeat(500), "j", "https://sqs/q", "m");
    let overhead = FAILURE_ATTRIBUTE.len() + "String".len();
    let limit = 4_096;
    for spare in (0..14).rev() {
        // Room for the record with an empty error text, plus `spare` bytes.
        let body = "b".repeat(limit - overhead - empty_len(&r) - spare);
        let copy = dlq_copy(&body, &HashMap::new(), &r, limit);
        assert!(
            copy.is_ok(),
            "spare {spare} B: a record with its error cut fits ({} + {overhead} + {} <= {limit}), \
             but the copy goes without one: {copy:?}",
            body.len(),
            empty_len(&r)
        );
    }
}

/// The same on the local stack, through the Lambda adapter: a fatal job whose body leaves
/// room for its failure record only with the error cut short is dead-lettered with that
/// record, not as a bare copy (`unrecorded` in `triage dlq`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_job_with_room_for_a_cut_record_keeps_its_record() {
    const LIMIT: usize = 2_048;
    let h = Harness::build(Options {
        prefix: "promise-bare",
        tweak: Box::new(|mut c| {
            c.dlq_max_bytes = Some(LIMIT);
            c
        }),
        ..Options::default()
    })
    .await;
    // Size the body so that the room left for the record is the empty record + 6 bytes
    // (moto's message ids are 36-character UUIDs; the timestamps have 13 digits).
    let template = record("", "bare", &h.queue_url, &"x".repeat(36));
    let overhead = FAILURE_ATTRIBUTE.len() + "String".len();
    let target = LIMIT - overhead - empty_len(&template) - 6;
    let skeleton = json!({"type": support::pipeline::RECORDED, "id": "bare", "pad": "", "payload": {"outcome": "fatal"}})
        .to_string();
    let pad = "p".repeat(target - skeleton.len());
    let body = json!({"type": support::pipeline::RECORDED, "id": "bare", "pad": pad, "payload": {"outcome": "fatal"}})
        .to_string();
    assert_eq!(body.len(), target);
    h.send_raw(&[(&body, None)]).await;
    let (messages, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert_eq!(messages[0].message_id().unwrap().len(), 36);
    assert!(failed_ids(&response).is_empty(), "dead-lettered and settled");
    assert_eq!(h.executions("bare"), vec![1]);
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].body(), Some(body.as_str()));
    let attrs = dlq[0].message_attributes().cloned().unwrap_or_default();
    let rec = failure_record(&attrs);
    assert!(
        rec.is_some(),
        "the copy has no failure record, though one with its error cut fits in {} bytes of room \
         (empty record: {} bytes)",
        LIMIT - overhead - body.len(),
        empty_len(&template)
    );
}

/// docs/guarantees.md ("A probe keeps its breaker lease"): "A half-open breaker's probe
/// permit is a lease: expired, it frees its slot for another probe, and the probe's outcome
/// no longer counts." A failure reported on an expired lease, as a success, is ignored: it
/// does not reopen the breaker in the middle of the probe that took the freed slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_failure_on_an_expired_lease_does_not_count() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("promise-lease", false).await;
    let config = BreakerConfig::builder()
        .open_for(Duration::from_secs(1))
        .probes(1)
        .build()
        .unwrap();
    let store =
        BreakerStore::new(dynamodb_client(&sdk), &created.table, StorageRetry::default()).with_config(config);
    let jt = "promise.lease";
    let t0 = now_ms();
    store
        .force_open(jt, Some(Duration::from_secs(1)), t0)
        .await
        .unwrap();

    // Half-open: environment A takes the probe, its lease ending 1 s later.
    let t1 = t0 + 1_500;
    let seen = store.view(&store.read(jt).await.unwrap(), t1);
    let a = store.admit(jt, &seen, t1, Some(t1 + 1_000), None).await;
    assert_eq!(a.gate, Gate::Probe);
    let lease_a = a.permit.clone().unwrap();

    // A's lease has expired: environment B takes the freed slot for a probe of its own.
    let t2 = t1 + 2_000;
    let seen = store.view(&store.read(jt).await.unwrap(), t2);
    let b = store.admit(jt, &seen, t2, Some(t2 + 60_000), None).await;
    assert_eq!(b.gate, Gate::Probe, "the expired lease freed its slot");
    let lease_b = b.permit.clone().unwrap();

    // A's probe (its lease expired) now reports a transient failure: it must not count.
    let late = Aggregate {
        probe_failures: 1,
        leases: vec![lease_a.id.clone()],
        generation: lease_a.generation,
        ..Aggregate::default()
    };
    store.report(jt, &late, t2 + 100, None).await.unwrap();
    let s = store.read(jt).await.unwrap();
    assert_eq!(
        s.at(t2 + 100).phase,
        Phase::HalfOpen,
        "a failure reported on an expired lease reopened the breaker: {s:?}"
    );
    assert!(
        s.leases.contains_key(&lease_b.id),
        "B's probe still holds its slot: {s:?}"
    );
}

/// A harness whose queue holds one job of the recording type, id `job_id`, sent with a
/// `job-type` attribute of type `Binary` naming another type.
async fn with_a_binary_job_type(prefix: &'static str, job_id: &str) -> Harness {
    let h = Harness::build(Options {
        prefix,
        ..Options::default()
    })
    .await;
    let body =
        json!({"type": support::pipeline::RECORDED, "id": job_id, "payload": {"outcome": "ok"}}).to_string();
    h.sqs
        .send_message()
        .queue_url(&h.queue_url)
        .message_body(&body)
        .message_attributes(
            "job-type",
            MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(Blob::new(b"other.type".to_vec()))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    h
}

/// docs/guarantees.md ("One odd record never fails its batch"): "A record whose body is not a
/// string, or whose `job-type` / `job-id` attribute has no readable string value, cannot be
/// processed: it is reported in `batchItemFailures` on its own ..., not dead-lettered,
/// because ... guessing its route could run the wrong handler". A `job-type` attribute
/// carrying only a `binaryValue` (valid base64, so the typed model reads the record) is such
/// an attribute: the record is not routed by its body's `type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_type_attribute_without_a_string_value_is_not_routed_by_the_body() {
    let h = with_a_binary_job_type("promise-binrt", "routed").await;
    let (messages, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    let id = messages[0].message_id().unwrap();
    assert!(
        h.executions("routed").is_empty(),
        "the handler of the body's type ran although the `job-type` attribute has no readable \
         string value (routed by a guess); response {response:?}"
    );
    assert_eq!(failed_ids(&response), vec![id], "reported failed on its own");
}

/// The worker's messages come from the SDK, with no event to refuse: a `job-type` attribute
/// without a string value makes the job invalid (dead-lettered with its record), and its body
/// does not route it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_message_whose_job_type_attribute_has_no_string_value_is_invalid() {
    use sqs_triage::core::Decision;
    use sqs_triage::processor::Incoming;
    let h = with_a_binary_job_type("promise-binwk", "routed-wk").await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    let records: Vec<Incoming> = messages.into_iter().map(Incoming::from_sdk).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let outcome = h.env.processor.process(records, Some(deadline)).await;
    assert!(h.executions("routed-wk").is_empty(), "routed by its body");
    let report = &outcome.records[0];
    match &report.decision {
        Decision::DeadLetter { class, error, .. } => {
            assert_eq!(*class, FailureClass::Invalid, "{report:?}");
            assert!(error.contains("`job-type` has no string value"), "{error}");
        }
        other => panic!("not dead-lettered: {other:?}"),
    }
    assert!(report.settled, "{report:?}");
    assert_eq!(h.dlq_messages().await.len(), 1);
}

/// docs/guarantees.md ("The breaker"): "Breaker and ledger calls made before the handlers end
/// by the report margin (1.5 s) before the invocation's deadline, later ones by the deadline
/// ...: a stalled table cannot hold an invocation past its deadline". A half-open breaker's
/// probe permit taken for a record that then has too little time left to start is given
/// back (`BreakerStore::release`) by the report margin too: a table that stalls that write
/// does not hold the batch response past the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_permit_release_cannot_hold_the_invocation_past_its_deadline() {
    use support::fault_proxy::{Fault, FaultProxy, FaultRule};
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let breaker = BreakerConfig::builder()
        .min_executions(100_000)
        .cache_ttl(Duration::ZERO)
        .open_for(Duration::from_secs(1))
        .build()
        .unwrap();
    let h = Harness::build(Options {
        prefix: "promise-release",
        breaker,
        ddb_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("probe", json!({"outcome": "ok"}))]).await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(2)).await;
    assert_eq!(messages.len(), 1);
    // Opened 1.3 s ago for 1 s, so half-open now: the record needs a probe permit.
    let sdk = support::sdk_config().await;
    let store = BreakerStore::new(dynamodb_client(&sdk), &h.table, StorageRetry::default());
    store
        .force_open(
            support::pipeline::RECORDED,
            Some(Duration::from_secs(1)),
            now_ms() - 1_300,
        )
        .await
        .unwrap();
    // The permit's write is slow (1.2 s): afterwards less than the start margin (2 s) is
    // left, so the permit is given back; that write stalls.
    proxy.add_rule(FaultRule {
        ops: Some(vec!["PutItem".into()]),
        body_contains: None,
        fault: Fault::Delay(Duration::from_millis(1_200)),
        times: Some(1),
    });
    proxy.fail_always("PutItem", Fault::Delay(Duration::from_secs(60)));
    let time_left = Duration::from_secs(3);
    let started = std::time::Instant::now();
    let response = h.invoke_with(&messages, time_left).await;
    let took = started.elapsed();
    assert!(h.executions("probe").is_empty(), "released, not run");
    assert!(
        took + Duration::from_millis(300) < time_left,
        "the invocation answered {took:?} after it started, with {time_left:?} left: at or past \
         its deadline ({response:?}); PutItem calls: {}",
        proxy.count("PutItem")
    );
}

/// A record whose `ApproximateReceiveCount` is there but does not read as a count (a string or
/// a number that is no count of at least 1, another kind of value) cannot be counted: taken for a first delivery on
/// every receive, each delivery would run as attempt 1 and each count be refused as the same
/// delivery (`<message id>#1`), so a job failing transiently would run past `max_attempts`
/// with no end but the queue's own redrive. It is reported failed on its own and not run, as
/// a record whose routing attribute does not read is, whichever way the event is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_receive_count_does_not_read_is_not_run() {
    use lambda_runtime::{Context, LambdaEvent};
    let h = Harness::build(Options {
        prefix: "promise-rc",
        policy: support::pipeline::fast_policy(3),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("uncounted", json!({"outcome": "transient"}))])
        .await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    let id = messages[0].message_id().unwrap().to_owned();
    let event = support::lambda_event::lambda_event_json(&messages, &h.queue_url);
    for count in [json!("x"), json!("0"), json!(0), json!(1.5), json!(true)] {
        let mut event = event.clone();
        event["Records"][0]["attributes"]["ApproximateReceiveCount"] = count.clone();
        // As `triage-lambda` reads an event: from its text, with the lean model.
        let read = sqs_triage::runtime::lambda::read_records(&event.to_string()).unwrap();
        let refused = read[0].as_ref().expect_err(&format!("count {count} is refused"));
        assert_eq!(refused.message_id.as_deref(), Some(id.as_str()));
        assert!(refused.reason.contains("ApproximateReceiveCount"), "{refused}");
        // And from its JSON value.
        let mut ctx = Context::default();
        ctx.deadline = now_ms() + 30_000;
        let response =
            sqs_triage::runtime::lambda::handle_json(&h.env.processor, LambdaEvent::new(event, ctx))
                .await
                .unwrap();
        assert_eq!(failed_ids(&response), vec![id.clone()], "count {count}");
    }
    assert!(
        h.executions("uncounted").is_empty(),
        "a record whose count does not read ran"
    );
    // A count written as a number is read as that number.
    let mut event = event.clone();
    event["Records"][0]["attributes"]["ApproximateReceiveCount"] = json!(3);
    let read = sqs_triage::runtime::lambda::read_records(&event.to_string()).unwrap();
    assert_eq!(read[0].as_ref().map(|r| r.receive_count).ok(), Some(3));
}
