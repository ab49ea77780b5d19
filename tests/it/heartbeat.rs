//! The visibility heartbeat on the local stack: a handler that runs longer than its queue's
//! visibility timeout runs once, not twice, through `triage worker` and through
//! `triage-lambda`; a batch that finishes before the first tick makes no extra call; a FIFO
//! record waiting behind its group's running record stays hidden too; a heartbeat call that
//! fails fails nothing; and a tick in flight lands before the record's final visibility.
//!
//! `TRIAGE_TEST_HEARTBEAT_S` overrides the heartbeat the two long-handler tests run with
//! (`0` shows them fail without it: the message is delivered again).

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use serde_json::{Value, json};
use sqs_triage::config::Config;
use sqs_triage::core::Backoff;
use sqs_triage::core::policy::RetryPolicy;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};
use sqs_triage::effects::storage_retry::{dynamodb_config, sqs_config};
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::env::build_with;
use support::fault_proxy::{Fault, FaultProxy, FaultRule};
use support::pipeline::{Harness, Options, failed_ids, quiet_breaker};
use support::runtime_api::{Outcome, RuntimeApi};
use triage::demo::chaos;

/// The queue's visibility timeout in the long-handler tests.
const VISIBILITY_S: u64 = 8;
/// The long handler's work time.
const HANDLER_MS: u64 = 20_000;

/// The heartbeat of the long-handler tests, in seconds.
fn heartbeat_s() -> String {
    std::env::var("TRIAGE_TEST_HEARTBEAT_S").unwrap_or_else(|_| "2".into())
}

async fn set_visibility(queue_url: &str, secs: u64) {
    support::sqs_client()
        .await
        .set_queue_attributes()
        .queue_url(queue_url)
        .attributes(QueueAttributeName::VisibilityTimeout, secs.to_string())
        .send()
        .await
        .unwrap();
}

async fn send(queue_url: &str, body: &Value) {
    support::sqs_client()
        .await
        .send_message()
        .queue_url(queue_url)
        .message_body(body.to_string())
        .send()
        .await
        .unwrap();
}

fn long_job(id: &str) -> Value {
    json!({"type": chaos::CHAOS, "id": id, "payload": {"outcome": "ok", "sleep_ms": HANDLER_MS}})
}

/// A second consumer: from the moment the queue has a message in flight until `done`, it
/// polls the queue (visibility 0, so it takes nothing away) and counts what it receives.
/// Panics when no message was ever in flight before `done`: it then watched nothing.
pub(crate) fn second_consumer(queue_url: &str, done: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let url = queue_url.to_owned();
    tokio::spawn(async move {
        let sqs = support::sqs_client().await;
        while support::queue_depth(&sqs, &url).await.in_flight == 0 {
            assert!(
                !done.load(Ordering::SeqCst),
                "the message was never in flight: the second consumer watched nothing"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut seen = 0;
        while !done.load(Ordering::SeqCst) {
            let got = sqs
                .receive_message()
                .queue_url(&url)
                .visibility_timeout(0)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            seen += got.messages.unwrap_or_default().len();
        }
        seen
    })
}

/// Lines a child process writes to stderr, collected by a thread.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn follow(child: &mut Child) -> Lines {
        let lines = Lines::default();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let writer = lines.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                writer.0.lock().unwrap().push(line);
            }
        });
        lines
    }

    fn count(&self, needle: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ledger(sdk: &aws_config::SdkConfig, table: &str) -> AttemptLedger {
    AttemptLedger::new(dynamodb_client(sdk), table, StorageRetry::default())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_20s_handler_on_an_8s_queue_runs_once_through_the_worker() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("hb-worker", false).await;
    set_visibility(&created.queue_url, VISIBILITY_S).await;
    send(&created.queue_url, &long_job("hbw1")).await;

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    support::strict_env(&mut cmd);
    cmd.args(["worker", "--demo-handlers"])
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("TRIAGE_HEARTBEAT_S", heartbeat_s())
        .env("RUST_LOG", "sqs_triage=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = Proc(cmd.spawn().expect("triage worker starts"));
    let lines = Lines::follow(&mut child.0);
    let done = Arc::new(AtomicBool::new(false));
    let watcher = second_consumer(&created.queue_url, done.clone());

    // The run ends when the worker has deleted the message.
    let sqs = support::sqs_client().await;
    let start = Instant::now();
    let mut deleted = false;
    while start.elapsed() < Duration::from_secs(60) {
        if lines.count("handler started") > 0
            && support::queue_depth(&sqs, &created.queue_url).await.total() == 0
        {
            deleted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    done.store(true, Ordering::SeqCst);
    let seen_by_another = watcher.await.unwrap();
    drop(child);
    let log = lines.text();
    assert_eq!(
        seen_by_another, 0,
        "a second consumer received the message while the worker still ran it:\n{log}"
    );
    assert!(deleted, "the message was not done with in 60 s:\n{log}");
    assert_eq!(lines.count("handler started"), 1, "{log}");
    assert!(lines.count("heartbeat: visibility extended") >= 1, "{log}");
    let items = ledger(&sdk, &created.table).show_all_types("hbw1").await.unwrap();
    assert!(items.is_empty(), "no attempt spent: {items:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_20s_handler_on_an_8s_queue_runs_once_through_triage_lambda() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("hb-lambda", false).await;
    set_visibility(&created.queue_url, VISIBILITY_S).await;
    send(&created.queue_url, &long_job("hbl1")).await;

    let api = RuntimeApi::start().await;
    let log = std::env::temp_dir().join(support::unique_name("hb-lambda"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage-lambda"));
    support::strict_env(&mut cmd);
    cmd.env("AWS_LAMBDA_RUNTIME_API", api.address())
        .env("AWS_LAMBDA_FUNCTION_NAME", "triage-local")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "heartbeat")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/triage-local")
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("TRIAGE_HEARTBEAT_S", heartbeat_s())
        .env("RUST_LOG", "sqs_triage=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _child = Proc(cmd.spawn().expect("triage-lambda starts"));
    let output = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    assert!(
        api.ready(Duration::from_secs(120)).await,
        "triage-lambda did not start: {:?}\n{}",
        api.init_errors(),
        output(&log)
    );

    // The event source mapping's receive: the queue's own visibility timeout.
    let sqs = support::sqs_client().await;
    let messages = sqs
        .receive_message()
        .queue_url(&created.queue_url)
        .wait_time_seconds(5)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(messages.len(), 1);
    let done = Arc::new(AtomicBool::new(false));
    let watcher = second_consumer(&created.queue_url, done.clone());
    let event = support::lambda_event::lambda_event_json(&messages, &created.queue_url);
    let outcome = api
        .invoke(
            event.to_string(),
            Duration::from_secs(40),
            Duration::from_secs(30),
            Duration::from_secs(10),
        )
        .await;
    done.store(true, Ordering::SeqCst);
    let seen_by_another = watcher.await.unwrap();
    let text = output(&log);
    let _ = std::fs::remove_file(&log);
    let Outcome::Response(body) = outcome else {
        panic!("expected a batch response, got {outcome:?}\n{text}");
    };
    let response: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(response["batchItemFailures"], json!([]), "{text}");
    assert_eq!(
        seen_by_another, 0,
        "a second consumer received the message while the function still ran it:\n{text}"
    );
    assert_eq!(text.matches("handler started").count(), 1, "{text}");
    assert!(text.contains("heartbeat: visibility extended"), "{text}");
    let items = ledger(&sdk, &created.table).show_all_types("hbl1").await.unwrap();
    assert!(items.is_empty(), "no attempt spent: {items:?}");
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

fn with_heartbeat<'a>(prefix: &'a str, fifo: bool, every: Duration) -> Options<'a> {
    Options {
        prefix,
        fifo,
        tweak: Box::new(move |mut c| {
            c.heartbeat = Some(every);
            c
        }),
        ..Options::default()
    }
}

/// The healthy path makes no extra call: a batch whose handlers end before the first tick
/// sends no visibility change. On a FIFO queue, the record waiting behind its group's running
/// record is held too: while the batch runs, no message of it is visible, long after their
/// visibility timeout would have ended.
#[tokio::test(flavor = "multi_thread")]
async fn fast_batches_make_no_call_and_fifo_records_waiting_behind_their_group_stay_hidden() {
    let h = Harness::build(with_heartbeat("hb-fifo", true, Duration::from_secs(1))).await;
    let quick = |id: &str| json!({"type": chaos::CHAOS, "id": id, "payload": {"outcome": "ok"}}).to_string();
    let (a, b, c) = (quick("f1"), quick("f2"), quick("f3"));
    h.send_raw(&[(&a, Some("f")), (&b, Some("f")), (&c, Some("f"))])
        .await;
    let (messages, response) = h.invoke_once(Duration::from_secs(5)).await.unwrap();
    assert_eq!(messages.len(), 3);
    assert!(failed_ids(&response).is_empty());
    assert_eq!(visibility_calls(&h), 0, "{:?}", h.env.calls.snapshot());

    set_visibility(&h.queue_url, 3).await;
    let slow = json!({"type": chaos::CHAOS, "id": "g1", "payload": {"outcome": "ok", "sleep_ms": 7_000}})
        .to_string();
    let next = quick("g2");
    h.send_raw(&[(&slow, Some("g")), (&next, Some("g"))]).await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert_eq!(messages.len(), 2, "both records of the group in one batch");

    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, url) = (done.clone(), h.queue_url.clone());
        tokio::spawn(async move {
            let sqs = support::sqs_client().await;
            let mut samples = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let depth = support::queue_depth(&sqs, &url).await;
                samples.push((std::time::Instant::now(), depth));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            samples
        })
    };
    let invoked = std::time::Instant::now();
    let response = h.invoke_env(&h.env, &messages, Duration::from_secs(30)).await;
    done.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    assert!(failed_ids(&response).is_empty());
    // Sampled after the 3 s visibility would have ended, with a second to spare.
    assert!(
        samples
            .iter()
            .any(|(at, _)| at.duration_since(invoked) > Duration::from_secs(4)),
        "{samples:?}"
    );
    assert!(
        samples.iter().all(|(_, d)| d.visible == 0),
        "a message of the running group became visible: {samples:?}"
    );
    assert!(visibility_calls(&h) >= 3, "{:?}", h.env.calls.snapshot());
    assert_eq!(h.depth(&h.queue_url).await, 0);
}

/// A heartbeat whose every call is throttled (after the storage retries) is logged and fails
/// neither the batch nor the record.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_heartbeat_fails_nothing() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let h = Harness::build(Options {
        sqs_endpoint: Some(proxy.url()),
        ..with_heartbeat("hb-fail", false, Duration::from_secs(1))
    })
    .await;
    proxy.fail_always("ChangeMessageVisibilityBatch", Fault::Throttle);
    let job = json!({"type": chaos::CHAOS, "id": "t1", "payload": {"outcome": "ok", "sleep_ms": 3_500}})
        .to_string();
    h.send_raw(&[(&job, None)]).await;
    let (_, response) = h.invoke_once(Duration::from_secs(5)).await.unwrap();
    assert!(failed_ids(&response).is_empty(), "{response:?}");
    assert!(
        proxy.faults_injected() >= 2,
        "the heartbeat ticked: {:?}",
        proxy.counts()
    );
    assert_eq!(h.depth(&h.queue_url).await, 0);
}

/// A tick in flight when the handler ends is answered before the execute step sets the
/// record's retry delay: the retry's visibility (30 s) is the last word, not the heartbeat's
/// extension (3 s), so the message does not come back before its delay. The tick's request
/// reaches SQS late even if the processor stopped waiting for it (a dropped tick would land
/// after the retry's visibility change and fail this test).
#[tokio::test(flavor = "multi_thread")]
async fn a_tick_in_flight_lands_before_the_retry_delay() {
    let h = Harness::build(Options {
        prefix: "hb-order",
        ..Options::default()
    })
    .await;
    // Read at start-up: the environment below extends by 3 ticks of 1 s, not by 30 s.
    set_visibility(&h.queue_url, 2).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let policy = RetryPolicy::builder()
        .max_attempts(5)
        .backoff(Backoff::exponential(
            Duration::from_secs(30),
            1.0,
            Duration::from_secs(30),
            Duration::ZERO,
        ))
        .max_delay(Duration::from_secs(30))
        .build()
        .unwrap();
    let sdk = support::sdk_config().await;
    let mut config = Config::from_lookup(&|_| None).unwrap();
    config.queue_url = Some(h.queue_url.clone());
    config.dlq_url = Some(h.dlq_url.clone());
    config.table = Some(h.table.clone());
    config.heartbeat = Some(Duration::from_secs(1));
    let breaker = quiet_breaker();
    let registry = chaos::register(Registry::new(policy.clone(), breaker), policy, breaker);
    let env = build_with(
        &config,
        registry,
        sqs_config(&sdk).endpoint_url(proxy.url()),
        dynamodb_config(&sdk),
    )
    .await
    .unwrap();
    // The first tick's request reaches SQS only after the handler has ended.
    proxy.add_rule(FaultRule {
        ops: Some(vec!["ChangeMessageVisibilityBatch".into()]),
        body_contains: None,
        fault: Fault::LateDelivery(Duration::from_millis(1_800)),
        times: Some(1),
    });
    let job =
        json!({"type": chaos::CHAOS, "id": "o1", "payload": {"outcome": "transient", "sleep_ms": 1_500}})
            .to_string();
    h.send_raw(&[(&job, None)]).await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert_eq!(messages.len(), 1);
    let response = h.invoke_env(&env, &messages, Duration::from_secs(30)).await;
    assert_eq!(failed_ids(&response).len(), 1, "{response:?}");
    assert_eq!(proxy.faults_injected(), 1, "the delayed tick was sent");
    assert_eq!(
        proxy.count("ChangeMessageVisibilityBatch"),
        2,
        "one tick, then the retry's visibility: {:?}",
        proxy.counts()
    );
    // A heartbeat extension landing last would make the message visible within 3 s.
    let back = h.receive(&h.queue_url, Duration::from_secs(8)).await;
    assert!(back.is_empty(), "the message came back before its retry delay");
}
