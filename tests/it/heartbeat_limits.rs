//! What the visibility heartbeat must not do: let a worker's probe outlive its breaker lease
//! (a second probe admitted meanwhile, the first one's success thrown away; a probe longer
//! than its lease is stopped before the lease ends), or send a Lambda invocation's records
//! the same visibility target tick after tick.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use serde_json::{Value, json};
use sqs_triage::clock::now_ms;
use sqs_triage::core::JobError;
use sqs_triage::core::breaker::{BreakerConfig, Phase};
use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};
use sqs_triage::processor::registry::JobContext;
use sqs_triage::processor::{Deadline, Incoming};
use support::pipeline::{Harness, Options, failed_ids};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The job type of the probe test.
const PROBED: &str = "hb.probed";

/// Handlers of [`PROBED`] running now, the most ever at once, and the permits that let a
/// held handler (`"hold": true`) end.
#[derive(Clone)]
struct Running(Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<Semaphore>);

impl Default for Running {
    fn default() -> Self {
        Self(Arc::default(), Arc::default(), Arc::new(Semaphore::new(0)))
    }
}

/// Takes one off a running count when dropped.
struct Out(Arc<AtomicUsize>);

impl Drop for Out {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn receive_one(h: &Harness, visibility_s: i32) -> Vec<Message> {
    h.sqs
        .receive_message()
        .queue_url(&h.queue_url)
        .max_number_of_messages(10)
        .visibility_timeout(visibility_s)
        .wait_time_seconds(5)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default()
}

/// Receives with a `visibility_s` timeout until `n` distinct messages are in hand, as an event
/// source mapping's batching window gathers a batch (a receive may hand out fewer than the
/// queue holds). Panics when fewer arrive within 30 s, more, or one twice (it came back
/// before the batch was whole: the batch's visibility would not be what the test assumes).
async fn receive_all(h: &Harness, n: usize, visibility_s: i32) -> Vec<Message> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut batch: Vec<Message> = Vec::new();
    while batch.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} messages arrived",
            batch.len()
        );
        for m in receive_one(h, visibility_s).await {
            assert!(
                batch.iter().all(|b| b.message_id() != m.message_id()),
                "a message came back before the batch was whole"
            );
            batch.push(m);
        }
    }
    assert_eq!(batch.len(), n, "more messages than the {n} expected");
    batch
}

fn incoming(messages: Vec<Message>) -> Vec<Incoming> {
    messages.into_iter().map(Incoming::from_sdk).collect()
}

/// A harness whose [`PROBED`] handler sleeps `payload.sleep_ms` (or, with `payload.hold`, runs
/// until the test lets it end), counted in `running`; its breaker (one probe at a time, one success closes it, lease `lease`) half-open from now.
async fn half_open(prefix: &str, lease: Duration, running: &Running) -> (Harness, BreakerStore) {
    let breaker = BreakerConfig::builder()
        .min_executions(100_000)
        .probes(1)
        .successes_to_close(1)
        .lease(lease)
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let r = running.clone();
    let h = Harness::build(Options {
        prefix,
        breaker,
        tweak: Box::new(|mut c| {
            c.heartbeat = Some(Duration::from_secs(1));
            c
        }),
        register: Box::new(move |reg, _| {
            let policy = reg.default_policy().clone();
            reg.handle_with(PROBED, policy, breaker, move |p: Value, _: JobContext| {
                let r = r.clone();
                async move {
                    let now = r.0.fetch_add(1, Ordering::SeqCst) + 1;
                    r.1.fetch_max(now, Ordering::SeqCst);
                    // Counted out when it ends or is stopped (its task aborted).
                    let _out = Out(r.0.clone());
                    if p["hold"] == true {
                        r.2.acquire().await.unwrap().forget();
                    } else {
                        tokio::time::sleep(Duration::from_millis(p["sleep_ms"].as_u64().unwrap())).await;
                    }
                    Ok::<(), JobError>(())
                }
            })
        }),
        ..Options::default()
    })
    .await;
    let sdk = support::sdk_config().await;
    let store =
        BreakerStore::new(dynamodb_client(&sdk), &h.table, StorageRetry::default()).with_config(breaker);
    // Open for no time: half-open from now.
    store
        .force_open(PROBED, Some(Duration::ZERO), now_ms())
        .await
        .unwrap();
    (h, store)
}

fn probe_job(id: &str, ms: u64) -> String {
    json!({"type": PROBED, "id": id, "payload": {"sleep_ms": ms}}).to_string()
}

/// A worker's half-open breaker (one probe at a time, one success closes it) admits a probe
/// whose handler outlasts the deadline its batch had at admission, the heartbeat keeping its
/// message hidden. While it runs, no second probe is admitted by another batch, and its
/// success closes the breaker.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_probe_that_outlasts_its_admission_deadline_keeps_its_lease() {
    let running = Running::default();
    let (h, store) = half_open("hb-probe", Duration::from_secs(40), &running).await;
    let held = json!({"type": PROBED, "id": "p1", "payload": {"hold": true}}).to_string();
    h.send_raw(&[(&held, None)]).await;
    let first = receive_one(&h, 4).await;
    assert_eq!(first.len(), 1);
    // A worker's batch: settled a second before its 4 s visibility ends, unless extended.
    let received = Instant::now();
    let admitted_until = received + Duration::from_secs(3);
    let processor = h.env.processor.clone();
    let probe = tokio::spawn(async move {
        processor
            .process_within(
                incoming(first),
                Deadline::visibility(received + Duration::from_secs(4), Duration::from_secs(1)),
            )
            .await
    });
    // The probe runs past the deadline its batch had when it was admitted, and past the
    // visibility its message was received with.
    while running.0.load(Ordering::SeqCst) == 0
        || Instant::now() < admitted_until.max(received + Duration::from_secs(4)) + Duration::from_millis(500)
    {
        assert!(!probe.is_finished(), "the probe's batch ended early");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running.0.load(Ordering::SeqCst), 1, "the probe still runs");

    // Another batch of the same job type asks for a probe meanwhile: admitted, its 3 s
    // handler would run beside the held probe.
    h.send_raw(&[(&probe_job("p2", 3_000), None)]).await;
    let second = receive_one(&h, 4).await;
    assert_eq!(second.len(), 1);
    assert!(
        second[0].body().unwrap().contains("\"p2\""),
        "the held probe's message stays hidden: {second:?}"
    );
    let at = Instant::now();
    let other = h
        .env
        .processor
        .process_within(
            incoming(second),
            Deadline::visibility(at + Duration::from_secs(4), Duration::from_secs(1)),
        )
        .await;
    assert_eq!(
        running.1.load(Ordering::SeqCst),
        1,
        "two probes ran at once: {other:?}"
    );
    assert!(!other.records[0].executed, "{other:?}");

    // The probe ends, past its batch's first deadline.
    assert!(!probe.is_finished(), "the probe's batch ended early");
    running.2.add_permits(1);
    let outcome = probe.await.unwrap();
    assert!(
        outcome.records[0].executed && outcome.records[0].settled,
        "{outcome:?}"
    );
    let state = store.read(PROBED).await.unwrap();
    assert_eq!(
        state.phase,
        Phase::Closed,
        "the probe's success was not counted: {state:?}"
    );
}

/// A worker's probe that outlasts its lease, however far the heartbeat could keep its message
/// hidden, is stopped before the lease ends (a failed probe: the breaker opens again), and its
/// outcome is reported while the lease still holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_probe_is_stopped_before_its_lease_ends() {
    let running = Running::default();
    let (h, store) = half_open("hb-lease", Duration::from_secs(6), &running).await;
    h.send_raw(&[(&probe_job("q1", 30_000), None)]).await;
    let first = receive_one(&h, 4).await;
    assert_eq!(first.len(), 1);
    let received = Instant::now();
    let outcome = h
        .env
        .processor
        .process_within(
            incoming(first),
            Deadline::visibility(received + Duration::from_secs(4), Duration::from_secs(1)),
        )
        .await;
    let record = &outcome.records[0];
    assert!(record.executed && !record.settled, "{outcome:?}");
    assert_eq!(running.0.load(Ordering::SeqCst), 0, "the probe was stopped");
    // The 30 s handler is stopped by the 6 s lease, not by anything shorter or later.
    assert!(
        received.elapsed() < Duration::from_secs(6),
        "the batch outlived the probe's lease: {:?}",
        received.elapsed()
    );
    let state = store.read(PROBED).await.unwrap();
    assert_eq!(
        state.phase,
        Phase::Open,
        "the failed probe was not counted: {state:?}"
    );
}

/// A worker's probe ends within its lease without cutting the rest of its batch short: a
/// long handler of another job type in the same batch runs to its end and is counted once,
/// and the probe's success, reported when it ended, closes the breaker.
#[tokio::test(flavor = "multi_thread")]
async fn a_probe_does_not_cut_short_the_other_handlers_of_its_batch() {
    let running = Running::default();
    let (h, store) = half_open("hb-mixed", Duration::from_secs(3), &running).await;
    let long = json!({
        "type": support::pipeline::RECORDED,
        "id": "long",
        "payload": {"outcome": "ok", "sleep_ms": 7_000}
    })
    .to_string();
    h.send_raw(&[(&probe_job("m1", 10), None), (&long, None)]).await;
    // Hidden from the first receive on: the batch's visibility ends 4 s after it at the latest.
    let received = Instant::now();
    let batch = receive_all(&h, 2, 4).await;
    let outcome = h
        .env
        .processor
        .process_within(
            incoming(batch),
            Deadline::visibility(received + Duration::from_secs(4), Duration::from_secs(1)),
        )
        .await;
    assert!(
        outcome.records.iter().all(|r| r.executed && r.settled),
        "both ran to their end and were settled: {outcome:?}"
    );
    assert_eq!(h.executions("long"), vec![1], "the long handler ran once");
    let state = store.read(PROBED).await.unwrap();
    assert_eq!(
        state.phase,
        Phase::Closed,
        "the probe's success was counted: {state:?}"
    );
}

/// `ChangeMessageVisibilityBatch` requests the environment sent so far.
fn visibility_calls(h: &Harness) -> u64 {
    h.env
        .calls
        .snapshot()
        .iter()
        .filter(|(op, _)| op.ends_with(".ChangeMessageVisibilityBatch"))
        .map(|(_, n)| *n)
        .sum()
}

/// In Lambda, an extension ends shortly after the invocation's deadline: once one reached
/// that, a later tick would set the same moment again. A long handler makes one or two
/// visibility calls for its batch, not one per tick.
#[tokio::test(flavor = "multi_thread")]
async fn a_lambda_batch_is_not_extended_to_the_same_moment_tick_after_tick() {
    let h = Harness::build(Options {
        prefix: "hb-lcap",
        tweak: Box::new(|mut c| {
            c.heartbeat = Some(Duration::from_secs(1));
            c
        }),
        ..Options::default()
    })
    .await;
    let job = |id: &str| {
        json!({"type": triage::demo::chaos::CHAOS, "id": id, "payload": {"outcome": "ok", "sleep_ms": 7_000}})
            .to_string()
    };
    let (a, b) = (job("l1"), job("l2"));
    h.send_raw(&[(&a, None), (&b, None)]).await;
    let messages = receive_all(&h, 2, 30).await;
    // The invocation has 9 s; every tick after the first would ask for its deadline + 5 s.
    let response = h.invoke_env(&h.env, &messages, Duration::from_secs(9)).await;
    assert!(failed_ids(&response).is_empty(), "{response:?}");
    let calls = visibility_calls(&h);
    assert!(
        (1..=2).contains(&calls),
        "{calls} visibility calls for 2 records over 7 ticks: {:?}",
        h.env.calls.snapshot()
    );
}
