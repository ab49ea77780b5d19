//! The queue's retention holds when an effect is applied, not only when it is decided. moto
//! expires nothing, so these tests enforce SQS's rule themselves: every visibility change the
//! product sends, heartbeat extensions included, must end by its message's `SentTimestamp` +
//! `MessageRetentionPeriod` (SQS deletes the message then, hidden or not), and every
//! execution must start before then (SQS hands out nothing older). The retention the product
//! is given is 20 s, shorter than SQS allows, so a handler can outlast it in a short test.
//!
//! A job that works 25 s and one that fails transiently once arrive in the same batch: the
//! short job's retry must not wait for the long handler.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
use aws_sdk_sqs::types::MessageSystemAttributeName;
use aws_sdk_sqs::types::QueueAttributeName;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::{Value, json};
use sqs_triage::clock::now_ms;
use sqs_triage::config::{Config, QueueFacts};
use sqs_triage::core::Decision;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::failure::FailureClass;
use sqs_triage::effects::storage_retry::{dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::{Environment, build_with};
use sqs_triage::runtime::worker::{Worker, WorkerOptions};
use support::fault_proxy::{Fault, FaultProxy};
use support::pipeline::{Harness, Options, failed_ids, fast_policy};
use triage::demo::chaos::{self, ChaosPayload};

/// The retention the product is told the queue has, and that the test enforces.
const RETENTION: Duration = Duration::from_secs(20);
/// The queue's visibility timeout.
const VISIBILITY_S: u64 = 10;
/// The long handler's work time: past the retention.
const LONG_MS: u64 = 25_000;
const JOB: &str = "test.retention";

/// What the product sent to SQS, read on the wire by an SDK interceptor: each visibility
/// change (when its try was sent, epoch ms; receipt handle; seconds) and each received
/// message's `SentTimestamp` by receipt handle.
#[derive(Debug, Clone, Default)]
struct Wire {
    changes: Arc<Mutex<Vec<(u64, String, u64)>>>,
    sent_at: Arc<Mutex<HashMap<String, (String, u64)>>>,
}

fn op(cfg: &ConfigBag) -> String {
    cfg.load::<Metadata>()
        .map(|m| m.name().to_owned())
        .unwrap_or_default()
}

impl Intercept for Wire {
    fn name(&self) -> &'static str {
        "RetentionWire"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let name = op(cfg);
        if !name.starts_with("ChangeMessageVisibility") {
            return Ok(());
        }
        let body: Value = serde_json::from_slice(context.request().body().bytes().unwrap_or_default())?;
        let entries = match body.get("Entries") {
            Some(Value::Array(e)) => e.clone(),
            _ => vec![body.clone()],
        };
        let at = now_ms();
        let mut changes = self.changes.lock().unwrap();
        for e in entries {
            changes.push((
                at,
                e["ReceiptHandle"].as_str().unwrap_or_default().to_owned(),
                e["VisibilityTimeout"].as_u64().unwrap_or_default(),
            ));
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if op(cfg) != "ReceiveMessage" {
            return Ok(());
        }
        let Ok(out) = context.output_or_error() else {
            return Ok(());
        };
        let Some(out) = out.downcast_ref::<ReceiveMessageOutput>() else {
            return Ok(());
        };
        let mut sent_at = self.sent_at.lock().unwrap();
        for m in out.messages() {
            let sent = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                .and_then(|s| s.parse().ok())
                .unwrap_or_default();
            sent_at.insert(
                m.receipt_handle().unwrap_or_default().to_owned(),
                (m.message_id().unwrap_or_default().to_owned(), sent),
            );
        }
        Ok(())
    }
}

impl Wire {
    /// Every visibility change that would bring its message back, or keep it hidden, past
    /// the end of its retention: (message id, ms past the end).
    fn past_retention(&self, sent: &HashMap<String, (String, u64)>) -> Vec<(String, u64)> {
        let end = |receipt: &str| {
            sent.get(receipt)
                .map(|(id, s)| (id.clone(), s + RETENTION.as_millis() as u64))
        };
        self.changes
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(at, receipt, secs)| {
                let (id, end) = end(receipt).expect("a receipt handle of a received message");
                let back = at + secs * 1000;
                (back > end).then(|| (id, back - end))
            })
            .collect()
    }
}

/// Executions of the test's job type: (job id, attempt, start epoch ms).
type Runs = Arc<Mutex<Vec<(String, u32, u64)>>>;

/// A harness whose queue has a 10 s visibility timeout, and an environment over it that is
/// told the queue keeps messages 20 s, whose SQS requests `wire` reads.
async fn setup(prefix: &str, wire: &Wire, runs: &Runs) -> (Harness, Environment) {
    setup_via(prefix, wire, runs, None).await
}

/// [`setup`], the environment's SQS client sending to `endpoint` when given (a fault proxy).
async fn setup_via(
    prefix: &str,
    wire: &Wire,
    runs: &Runs,
    endpoint: Option<String>,
) -> (Harness, Environment) {
    let h = Harness::build(Options {
        prefix,
        ..Options::default()
    })
    .await;
    h.sqs
        .set_queue_attributes()
        .queue_url(&h.queue_url)
        .attributes(QueueAttributeName::VisibilityTimeout, VISIBILITY_S.to_string())
        .send()
        .await
        .unwrap();
    let sdk = support::sdk_config().await;
    let mut config = Config::from_lookup(&|_| None).unwrap();
    config.queue_url = Some(h.queue_url.clone());
    config.dlq_url = Some(h.dlq_url.clone());
    config.table = Some(h.table.clone());
    config.heartbeat = Some(Duration::from_secs(1));
    config.source_queue = Some(QueueFacts {
        retention: RETENTION,
        visibility: Duration::from_secs(VISIBILITY_S),
        max_receive: None,
    });
    let policy = fast_policy(5);
    let breaker = BreakerConfig::builder()
        .min_executions(100_000)
        .open_for(Duration::from_secs(5))
        .build()
        .unwrap();
    let log = runs.clone();
    let registry = Registry::new(policy.clone(), breaker).handle_with(
        JOB,
        policy,
        breaker,
        move |p: ChaosPayload, ctx: JobContext| {
            log.lock()
                .unwrap()
                .push((ctx.job_id.clone(), ctx.attempt, now_ms()));
            chaos::run(p, ctx)
        },
    );
    let mut sqs_conf = sqs_config(&sdk).interceptor(wire.clone());
    if let Some(url) = endpoint {
        sqs_conf = sqs_conf.endpoint_url(url);
    }
    let env = build_with(&config, registry, sqs_conf, dynamodb_config(&sdk))
        .await
        .unwrap();
    (h, env)
}

/// Sends the long job and the short one, together.
async fn send_both(h: &Harness) {
    let long = json!({"type": JOB, "id": "long", "payload": {"outcome": "ok", "sleep_ms": LONG_MS}});
    let short = json!({"type": JOB, "id": "short", "payload": {"outcome": "transient", "fail_times": 1}});
    h.send_raw(&[(&long.to_string(), None), (&short.to_string(), None)])
        .await;
}

/// The rule itself, checked on what was sent and run: no visibility change past a message's
/// retention, no execution after it, the short job run again in time and succeeded.
fn assert_retention_held(wire: &Wire, runs: &Runs) {
    let sent = wire.sent_at.lock().unwrap().clone();
    let past = wire.past_retention(&sent);
    assert!(
        past.is_empty(),
        "visibility changes past the message's retention (message id, ms past): {past:?}"
    );
    let first_sent = sent.values().map(|(_, s)| *s).min().expect("messages received");
    let end = first_sent + RETENTION.as_millis() as u64;
    let runs = runs.lock().unwrap().clone();
    let late: Vec<_> = runs.iter().filter(|(_, _, at)| *at > end).collect();
    assert!(
        late.is_empty(),
        "executions SQS would not have delivered: {late:?}"
    );
    let short: Vec<u32> = runs.iter().filter(|r| r.0 == "short").map(|r| r.1).collect();
    assert_eq!(short, vec![1, 2], "the short job's retry ran, in time: {runs:?}");
}

/// The worker: the short job's retry is applied at the next heartbeat tick and runs in a
/// second batch long before the retention ends; the long handler's message is extended only
/// up to its retention, and the job is dead-lettered `expiring` rather than lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_workers_settled_record_is_applied_before_its_retention_ends() {
    let (wire, runs) = (Wire::default(), Runs::default());
    let (h, env) = setup("ret-worker", &wire, &runs).await;
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(1),
            ..WorkerOptions::default()
        },
    )
    .with_batches(2);
    send_both(&h).await;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut finals: HashMap<String, Decision> = HashMap::new();
    let run = worker.run(
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        },
        |outcome| {
            for r in &outcome.records {
                if r.settled {
                    finals.insert(r.job_id.clone(), r.decision.clone());
                }
            }
            if finals.len() == 2 {
                let _ = stop_tx.send(true);
            }
        },
    );
    tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("both jobs settled")
        .unwrap();
    assert_retention_held(&wire, &runs);
    let dlq = h.dlq_messages().await;
    // The long job ends in the DLQ (its handler stopped at its message's retention), never
    // silently gone.
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let record = sqs_triage::effects::dlq::failure_record(dlq[0].message_attributes().unwrap())
        .expect("a failure record")
        .unwrap();
    assert_eq!(
        (record.job_id.as_str(), record.class),
        ("long", FailureClass::Expiring)
    );
}

/// Lambda: the same batch in one invocation whose deadline outlasts the long handler. The
/// short job's retry is applied at the next tick (an event source mapping poller beside runs
/// it), and the batch response still reports it failed, the long job's record settled.
#[tokio::test(flavor = "multi_thread")]
async fn a_lambda_settled_record_is_applied_before_its_retention_ends() {
    let (wire, runs) = (Wire::default(), Runs::default());
    let (h, env) = setup("ret-lambda", &wire, &runs).await;
    send_both(&h).await;
    let first = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 2, "one batch");
    // The receive was the test's: its messages' sent times come from the batch itself.
    for m in &first {
        let sent = m.attributes().unwrap()[&MessageSystemAttributeName::SentTimestamp]
            .parse()
            .unwrap();
        wire.sent_at.lock().unwrap().insert(
            m.receipt_handle().unwrap().to_owned(),
            (m.message_id().unwrap().to_owned(), sent),
        );
    }
    let short_id = first
        .iter()
        .find(|m| m.body().unwrap().contains("\"short\""))
        .unwrap()
        .message_id()
        .unwrap()
        .to_owned();
    let env = Arc::new(env);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A second poller of the event source mapping, as Lambda scales out.
    let poller = {
        let (env, done, queue_url) = (env.clone(), done.clone(), h.queue_url.clone());
        let wire = wire.clone();
        tokio::spawn(async move {
            let sqs = support::sqs_client().await;
            let mut retried = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let got = sqs
                    .receive_message()
                    .queue_url(&queue_url)
                    .wait_time_seconds(1)
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .send()
                    .await
                    .unwrap()
                    .messages
                    .unwrap_or_default();
                let mut live = Vec::new();
                for m in got {
                    let sent: u64 = m.attributes().unwrap()[&MessageSystemAttributeName::SentTimestamp]
                        .parse()
                        .unwrap();
                    if sent + RETENTION.as_millis() as u64 <= now_ms() {
                        // SQS would have deleted it: so does the test, and hands it to no one.
                        sqs.delete_message()
                            .queue_url(&queue_url)
                            .receipt_handle(m.receipt_handle().unwrap())
                            .send()
                            .await
                            .unwrap();
                        continue;
                    }
                    wire.sent_at.lock().unwrap().insert(
                        m.receipt_handle().unwrap().to_owned(),
                        (m.message_id().unwrap().to_owned(), sent),
                    );
                    live.push(m);
                }
                let got = live;
                if got.is_empty() {
                    continue;
                }
                let response = support::pipeline::invoke(&env, &got, &queue_url, Duration::from_secs(30))
                    .await
                    .unwrap();
                let failed = failed_ids(&response);
                for m in got.iter().filter(|m| !failed.contains(&m.message_id().unwrap())) {
                    sqs.delete_message()
                        .queue_url(&queue_url)
                        .receipt_handle(m.receipt_handle().unwrap())
                        .send()
                        .await
                        .unwrap();
                    retried.push(m.message_id().unwrap().to_owned());
                }
            }
            retried
        })
    };
    // Not deleted after: the long job's message lived out its retention meanwhile.
    let response = support::pipeline::invoke(&env, &first, &h.queue_url, Duration::from_secs(40))
        .await
        .unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let retried = poller.await.unwrap();
    assert_eq!(
        failed_ids(&response),
        vec![short_id.as_str()],
        "the retried record is reported failed, the long one settled"
    );
    // The long job's message is hidden up to its retention's end, to the second: in that
    // last second a poller may receive it again, as SQS may.
    assert!(
        retried.contains(&short_id),
        "the retry ran and settled beside: {retried:?}"
    );
    assert_retention_held(&wire, &runs);
    assert!(h.dlq_messages().await.is_empty());
}

/// A Lambda tick throttled five times lands its extension by the invocation's deadline + 5 s all
/// the same: its retried try asks for the seconds left until then, not for what the first
/// try asked for.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_tick_lands_its_extension_by_the_deadline_slack() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let (wire, runs) = (Wire::default(), Runs::default());
    let (h, env) = setup_via("ret-slack", &wire, &runs, Some(proxy.url())).await;
    let job = json!({"type": JOB, "id": "slow", "payload": {"outcome": "ok", "sleep_ms": 5_000}});
    h.send_raw(&[(&job.to_string(), None)]).await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert_eq!(messages.len(), 1);
    proxy.fail_next(
        5,
        Fault::Throttle,
        Some(vec!["ChangeMessageVisibilityBatch".into()]),
    );
    let before = now_ms();
    support::pipeline::invoke(&env, &messages, &h.queue_url, Duration::from_secs(6))
        .await
        .unwrap();
    // Five throttled tries: the last one lands at least 1.5 s after the first.
    assert_eq!(proxy.faults_injected(), 5, "the first tick was throttled");
    // The invocation's deadline is `before` + 6 s at the latest; 50 ms for the wire.
    let cap = before + 6_000 + sqs_triage::processor::DEADLINE_SLACK.as_millis() as u64 + 50;
    let changes = wire.changes.lock().unwrap().clone();
    assert!(changes.len() >= 3, "{changes:?}");
    let late: Vec<_> = changes
        .iter()
        .filter(|(at, _, secs)| at + secs * 1000 > cap)
        .collect();
    assert!(
        late.is_empty(),
        "visible again after the deadline's slack (cap {cap}): {late:?}"
    );
}

/// The worker: a record settled at a tick whose early delete fails is still held, its message
/// extended, until the batch's end deletes it. Not extended, it would be visible again while
/// the long handler beside it runs, and run a second time.
#[tokio::test(flavor = "multi_thread")]
async fn a_workers_record_whose_early_delete_failed_stays_hidden_until_the_batch_deletes_it() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let (wire, runs) = (Wire::default(), Runs::default());
    let (h, env) = setup_via("ret-undeleted", &wire, &runs, Some(proxy.url())).await;
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(1),
            ..WorkerOptions::default()
        },
    )
    .with_batches(2);
    // Past the visibility timeout (10 s), inside the retention (20 s).
    let long = json!({"type": JOB, "id": "long", "payload": {"outcome": "ok", "sleep_ms": 14_000}});
    let short = json!({"type": JOB, "id": "short", "payload": {"outcome": "ok"}});
    h.send_raw(&[(&long.to_string(), None), (&short.to_string(), None)])
        .await;
    // The first delete, the short job's at a tick, is refused for its one entry.
    proxy.fail_next(
        1,
        Fault::Body {
            status: 200,
            body: r#"{"Successful":[],"Failed":[{"Id":"e0","SenderFault":true,"Code":"InvalidParameterValue","Message":"refused"}]}"#.into(),
        },
        Some(vec!["DeleteMessageBatch".into()]),
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut settled: HashMap<String, u32> = HashMap::new();
    let mut batch_of_long: Vec<String> = Vec::new();
    let run = worker.run(
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        },
        |outcome| {
            for r in outcome.records.iter().filter(|r| r.settled) {
                *settled.entry(r.job_id.clone()).or_default() += 1;
            }
            if outcome.records.iter().any(|r| r.job_id == "long") {
                batch_of_long = outcome.records.iter().map(|r| r.job_id.clone()).collect();
                batch_of_long.sort();
            }
            if settled.contains_key("long") {
                let _ = stop_tx.send(true);
            }
        },
    );
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the long job settled")
        .unwrap();
    // What this test is about: both jobs in one receive (SQS may split them; the test does
    // not hold without it).
    assert_eq!(
        batch_of_long,
        vec!["long".to_owned(), "short".to_owned()],
        "one receive"
    );
    assert_eq!(proxy.faults_injected(), 1, "the early delete was refused");
    let short: Vec<u32> = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.0 == "short")
        .map(|r| r.1)
        .collect();
    assert_eq!(short, vec![1], "the short job ran once");
    // Both messages are gone: the batch's end deleted the short job's.
    h.sqs
        .set_queue_attributes()
        .queue_url(&h.queue_url)
        .attributes(QueueAttributeName::VisibilityTimeout, "0")
        .send()
        .await
        .unwrap();
    assert!(h.receive(&h.queue_url, Duration::from_secs(2)).await.is_empty());
}
