//! Edge cases of the long-polling worker (`runtime::worker::Worker` and the `triage worker`
//! binary) on the local stack: handlers that hang past the queue's visibility timeout,
//! SIGTERM while one hangs, receives that fail for good or for a while, FIFO receive retries,
//! and the binary refusing to serve job types it has no handler for.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::json;
use sqs_triage::config::Config;
use sqs_triage::core::Decision;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client, dynamodb_config, sqs_config};
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::env::{build, build_with};
use sqs_triage::runtime::worker::{Worker, WorkerOptions};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};
use triage::demo::chaos;
use triage::ops::setup::SetupReport;

/// The flag `triage worker` needs to run the built-in demo job type.
const DEMO: &str = "--demo-handlers";

/// The short visibility timeout the hanging-handler tests give their queue.
const VISIBILITY_S: u64 = 6;

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

pub(crate) async fn send(queue_url: &str, body: serde_json::Value) {
    support::sqs_client()
        .await
        .send_message()
        .queue_url(queue_url)
        .message_body(body.to_string())
        .send()
        .await
        .unwrap();
}

fn hanging_job(id: &str) -> serde_json::Value {
    json!({"type": chaos::CHAOS, "id": id, "payload": {"outcome": "ok", "sleep_ms": 600_000}})
}

/// Configuration for `created`, with a retry delay long enough (20 s, no jitter) that a
/// retried message stays hidden while the test looks.
fn config(created: &SetupReport) -> Config {
    let vars = [
        ("TRIAGE_QUEUE_URL", created.queue_url.clone()),
        ("TRIAGE_DLQ_URL", created.dlq_url.clone()),
        ("TRIAGE_TABLE", created.table.clone()),
        ("TRIAGE_BASE_DELAY_MS", "20000".to_owned()),
        ("TRIAGE_JITTER_MAX_MS", "0".to_owned()),
    ];
    Config::from_lookup(&|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())).unwrap()
}

fn chaos_registry(config: &Config) -> Registry {
    chaos::register(
        Registry::new(config.policy.clone(), config.breaker),
        config.policy.clone(),
        config.breaker,
    )
}

fn ledger(sdk: &aws_config::SdkConfig, table: &str) -> AttemptLedger {
    AttemptLedger::new(dynamodb_client(sdk), table, StorageRetry::default())
}

// ------------------------------------------------------------------ the binary

/// Everything a `triage worker` process wrote to stderr, and a way to wait for a line.
#[derive(Clone, Default)]
pub(crate) struct Lines(Arc<(Mutex<Vec<String>>, Condvar)>);

impl Lines {
    fn follow(child: &mut Child) -> Lines {
        let lines = Lines::default();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let writer = lines.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let (m, c) = &*writer.0;
                m.lock().unwrap().push(line);
                c.notify_all();
            }
        });
        lines
    }

    /// Waits until `count` lines contain `needle`; false after `timeout`.
    fn wait_for(&self, needle: &str, count: usize, timeout: Duration) -> bool {
        let (m, c) = &*self.0;
        let guard = m.lock().unwrap();
        let (_guard, res) = c
            .wait_timeout_while(guard, timeout, |v| {
                v.iter().filter(|l| l.contains(needle)).count() < count
            })
            .unwrap();
        !res.timed_out()
    }

    pub(crate) fn text(&self) -> String {
        self.0.0.lock().unwrap().join("\n")
    }
}

/// A `triage worker` process killed if the test ends while it still runs.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub(crate) fn spawn_worker(created: &SetupReport, args: &[&str], env: &[(&str, &str)]) -> (Proc, Lines) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    support::strict_env(&mut cmd);
    cmd.arg("worker")
        .args(args)
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("RUST_LOG", "sqs_triage=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("triage worker starts");
    let lines = Lines::follow(&mut child);
    (Proc(child), lines)
}

/// The exit status, or None if the process still runs after `bound` (an event with a
/// generous bound: liveness, not timing).
pub(crate) async fn exited_within(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if start.elapsed() > bound {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

// ------------------------------------------------------------------ item: deadlines

/// Without the heartbeat, a handler that hangs is stopped before the message's visibility
/// timeout runs out: no second consumer can receive the message while the first still works on it, and the
/// message comes back later as a counted transient failure.
#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_handler_is_stopped_before_its_visibility_timeout_ends() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("ew-hang", false).await;
    set_visibility(&created.queue_url, VISIBILITY_S).await;
    send(&created.queue_url, hanging_job("hang1")).await;

    // Without the visibility heartbeat (with it, the worker keeps the message hidden and the
    // handler runs on: `heartbeat::`).
    let mut config = config(&created);
    config.heartbeat = None;
    let env = build(&config, chaos_registry(&config), &sdk).await.unwrap();
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(1),
            ..WorkerOptions::default()
        },
    );

    // A second consumer polls the queue the whole time (visibility 0: it takes nothing away).
    let done = Arc::new(AtomicBool::new(false));
    let watcher = crate::heartbeat::second_consumer(&created.queue_url, done.clone());

    let bound = Duration::from_secs(VISIBILITY_S + 20);
    let polled = tokio::time::timeout(bound, worker.poll_once()).await;
    done.store(true, Ordering::SeqCst);
    let seen_by_another = watcher.await.unwrap();
    let outcome = polled
        .expect("the worker never stopped the hanging handler")
        .unwrap()
        .expect("a batch");
    assert_eq!(
        seen_by_another, 0,
        "another consumer received the message while its first consumer still ran it"
    );
    let r = &outcome.records[0];
    assert!(r.executed && !r.settled, "{r:?}");
    match &r.decision {
        Decision::Retry { attempts, error, .. } => {
            assert_eq!(*attempts, 1);
            assert!(error.contains("deadline"), "{error}");
        }
        other => panic!("expected a transient failure, got {other:?}"),
    }
    let items = ledger(&sdk, &created.table)
        .show_all_types("hang1")
        .await
        .unwrap();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].attempts, 1, "{items:?}");
    // Still in its queue (hidden for its retry delay), not dead-lettered.
    let depth = support::queue_depth(&support::sqs_client().await, &created.queue_url).await;
    assert_eq!(depth.total(), 1, "{depth:?}");
}

/// SIGTERM while a handler hangs: the worker stops it at the batch's deadline, settles the
/// record as a transient failure and exits, well before the orchestrator's kill could be
/// needed (bound: the visibility timeout + 10 s).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_with_a_hanging_handler_exits_within_the_visibility_timeout() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("ew-term", false).await;
    set_visibility(&created.queue_url, VISIBILITY_S).await;
    send(&created.queue_url, hanging_job("term1")).await;

    let (mut child, lines) = spawn_worker(&created, &[DEMO], &[("TRIAGE_BASE_DELAY_MS", "20000")]);
    assert!(
        lines.wait_for("handler started", 1, Duration::from_secs(60)),
        "the handler never started; worker said:\n{}",
        lines.text()
    );
    sigterm(&child.0);
    let status = exited_within(&mut child.0, Duration::from_secs(VISIBILITY_S + 10)).await;
    let status = status.unwrap_or_else(|| {
        panic!(
            "worker still running {} s after SIGTERM; it said:\n{}",
            VISIBILITY_S + 10,
            lines.text()
        )
    });
    assert!(status.success(), "exit {status}; worker said:\n{}", lines.text());
    let items = ledger(&sdk, &created.table)
        .show_all_types("term1")
        .await
        .unwrap();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].attempts, 1, "{items:?}");
    assert!(
        items[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("deadline")),
        "{items:?}"
    );
    let sqs = support::sqs_client().await;
    assert_eq!(support::queue_depth(&sqs, &created.queue_url).await.total(), 1);
    assert_eq!(support::queue_depth(&sqs, &created.dlq_url).await.total(), 0);
}

// ------------------------------------------------------------------ item: receive errors

/// The source queue deleted under a running worker: it backs off, then exits with code 3
/// (not found) and a message naming the queue, after the configured time.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_queue_ends_the_worker_with_a_clear_error() {
    let created = support::fresh_resources("ew-gone", false).await;
    let (mut child, lines) = spawn_worker(&created, &[DEMO, "--give-up-after", "3s"], &[]);
    assert!(
        lines.wait_for("worker started", 1, Duration::from_secs(60)),
        "worker did not start:\n{}",
        lines.text()
    );
    support::sqs_client()
        .await
        .delete_queue()
        .queue_url(&created.queue_url)
        .send()
        .await
        .unwrap();
    let status = exited_within(&mut child.0, Duration::from_secs(90))
        .await
        .unwrap_or_else(|| panic!("worker kept polling a deleted queue:\n{}", lines.text()));
    let text = lines.text();
    assert_eq!(status.code(), Some(3), "exit {status}:\n{text}");
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains(&created.queue_url) && last.contains("does not exist"),
        "last line: {last}\n{text}"
    );
}

/// Access denied on every receive: exponential backoff (each wait longer than the one
/// before, as the worker reports them), then exit 1 with the error.
#[tokio::test(flavor = "multi_thread")]
async fn access_denied_backs_off_then_exits() {
    let created = support::fresh_resources("ew-deny", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always(
        "ReceiveMessage",
        Fault::Error {
            status: 403,
            code: "AccessDenied".into(),
        },
    );
    let url = proxy.url();
    let (mut child, lines) = spawn_worker(
        &created,
        &[DEMO, "--give-up-after", "6s"],
        &[("AWS_ENDPOINT_URL_SQS", &url)],
    );
    let status = exited_within(&mut child.0, Duration::from_secs(90))
        .await
        .unwrap_or_else(|| panic!("worker kept polling:\n{}", lines.text()));
    let text = lines.text();
    assert_eq!(status.code(), Some(1), "exit {status}:\n{text}");
    assert!(
        text.lines().last().unwrap_or_default().contains("AccessDenied"),
        "{text}"
    );
    let waits: Vec<u64> = text
        .lines()
        .filter(|l| l.contains("receive failed; retrying"))
        .filter_map(|l| {
            let at = l.find("retry_in_ms=")? + "retry_in_ms=".len();
            l[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        })
        .collect();
    assert!(waits.len() >= 2, "waits {waits:?}:\n{text}");
    // Equal jitter: each wait is in the upper half of a doubling step, so below the cap
    // a wait is never shorter than the one before (the last try before giving up, cut to
    // the time left, is logged apart).
    for w in waits.windows(2) {
        assert!(w[1] >= w[0], "waits shrink: {waits:?}");
    }
    assert!(
        waits.last().unwrap() > waits.first().unwrap(),
        "waits do not grow: {waits:?}"
    );
}

/// Throttling is never a reason to exit: the worker keeps retrying past the give-up time,
/// then serves jobs once SQS answers again.
#[tokio::test(flavor = "multi_thread")]
async fn throttled_receives_are_retried_past_the_give_up_time() {
    let created = support::fresh_resources("ew-throttle", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("ReceiveMessage", Fault::Throttle);
    let url = proxy.url();
    let (mut child, lines) = spawn_worker(
        &created,
        &[DEMO, "--give-up-after", "1s"],
        &[("AWS_ENDPOINT_URL_SQS", &url)],
    );
    // Three rounds of backoff: well past the give-up time.
    assert!(
        lines.wait_for("receive failed", 3, Duration::from_secs(120)),
        "worker said:\n{}",
        lines.text()
    );
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "worker exited:\n{}",
        lines.text()
    );
    proxy.clear_faults();
    send(
        &created.queue_url,
        json!({"type": chaos::CHAOS, "id": "t1", "payload": {"outcome": "ok"}}),
    )
    .await;
    assert!(
        lines.wait_for("succeeded", 1, Duration::from_secs(120)),
        "the job never ran after the throttling ended:\n{}",
        lines.text()
    );
    sigterm(&child.0);
    let status = exited_within(&mut child.0, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(status.success(), "exit {status}:\n{}", lines.text());
}

/// A source queue at SQS's in-flight limit answers short polls `OverLimit` (long polls, nothing):
/// it passes as held messages are settled or come back, so the worker waits it out as
/// throttling, past the give-up time, and says why no job of any type is received.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_queue_at_its_in_flight_limit_is_waited_out_and_named() {
    let created = support::fresh_resources("ew-overlimit", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always(
        "ReceiveMessage",
        Fault::Error {
            status: 403,
            code: "OverLimit".into(),
        },
    );
    let url = proxy.url();
    let (mut child, lines) = spawn_worker(
        &created,
        &[DEMO, "--give-up-after", "1s"],
        &[("AWS_ENDPOINT_URL_SQS", &url)],
    );
    assert!(
        lines.wait_for("in-flight messages as SQS allows", 3, Duration::from_secs(120)),
        "worker said:\n{}",
        lines.text()
    );
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "worker exited:\n{}",
        lines.text()
    );
    proxy.clear_faults();
    send(
        &created.queue_url,
        json!({"type": chaos::CHAOS, "id": "ol1", "payload": {"outcome": "ok"}}),
    )
    .await;
    assert!(
        lines.wait_for("succeeded", 1, Duration::from_secs(120)),
        "the job never ran after the limit passed:\n{}",
        lines.text()
    );
    sigterm(&child.0);
    let status = exited_within(&mut child.0, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(status.success(), "exit {status}:\n{}", lines.text());
}

/// At the in-flight limit SQS answers long polls with nothing, which looks like an idle queue.
/// After an empty long poll the worker asks once with a short poll (at most once a minute, the
/// first at once), which SQS answers `OverLimit`: the cause is named within a minute.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_source_queue_is_named_though_its_long_polls_return_nothing() {
    let created = support::fresh_resources("ew-full", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["ReceiveMessage".into()]),
        body_contains: Some("\"WaitTimeSeconds\":0".into()),
        fault: Fault::Error {
            status: 403,
            code: "OverLimit".into(),
        },
        times: None,
    });
    proxy.add_rule(FaultRule {
        ops: Some(vec!["ReceiveMessage".into()]),
        body_contains: None,
        fault: Fault::Body {
            status: 200,
            body: "{}".into(),
        },
        times: None,
    });
    let url = proxy.url();
    let (mut child, lines) = spawn_worker(&created, &[DEMO], &[("AWS_ENDPOINT_URL_SQS", &url)]);
    assert!(
        lines.wait_for("in-flight messages as SQS allows", 1, Duration::from_secs(60)),
        "worker said:\n{}",
        lines.text()
    );
    proxy.clear_faults();
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "worker exited:\n{}",
        lines.text()
    );
    sigterm(&child.0);
    let status = exited_within(&mut child.0, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(status.success(), "exit {status}:\n{}", lines.text());
}

/// Records the `ReceiveRequestAttemptId` of every ReceiveMessage request sent.
#[derive(Debug, Clone, Default)]
struct AttemptIds(Arc<Mutex<Vec<Option<String>>>>);

impl Intercept for AttemptIds {
    fn name(&self) -> &'static str {
        "AttemptIds"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg
            .load::<Metadata>()
            .is_some_and(|m| m.name() == "ReceiveMessage")
        {
            let body = context.request().body().bytes().unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let id = v
                .get("ReceiveRequestAttemptId")
                .and_then(|s| s.as_str())
                .map(str::to_owned);
            self.0.lock().unwrap().push(id);
        }
        Ok(())
    }
}

/// FIFO: every receive carries a `ReceiveRequestAttemptId`; a retry after a lost answer
/// (5xx) carries the same one (SQS then hands out the same messages instead of hiding their
/// groups), a new receive or a retry after throttling (whose id SQS will not take again) a
/// new one.
#[tokio::test(flavor = "multi_thread")]
async fn fifo_receives_reuse_their_attempt_id_on_retries() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("ew-fifo", true).await;
    for i in 0..2 {
        support::sqs_client()
            .await
            .send_message()
            .queue_url(&created.queue_url)
            .message_body(json!({"type": chaos::CHAOS, "id": format!("f{i}"), "payload": {}}).to_string())
            .message_group_id(format!("g{i}"))
            .message_deduplication_id(format!("f{i}"))
            .send()
            .await
            .unwrap();
    }
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let ids = AttemptIds::default();
    let config = config(&created);
    let env = build_with(
        &config,
        chaos_registry(&config),
        sqs_config(&sdk)
            .endpoint_url(proxy.url())
            .interceptor(ids.clone()),
        dynamodb_config(&sdk),
    )
    .await
    .unwrap();
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(1),
            max_messages: 1,
            emf: false,
        },
    );
    let only = Some(vec!["ReceiveMessage".to_owned()]);
    proxy.fail_next(1, Fault::Status500, only.clone());
    worker.poll_once().await.unwrap().expect("a batch");
    proxy.fail_next(1, Fault::Throttle, only);
    worker.poll_once().await.unwrap().expect("a batch");
    let ids = ids.0.lock().unwrap().clone();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(
        ids.iter().all(Option::is_some),
        "a receive without an attempt id: {ids:?}"
    );
    assert_eq!(ids[0], ids[1], "the retry after a 5xx must reuse the id: {ids:?}");
    assert_ne!(ids[1], ids[2], "a new receive needs a new id: {ids:?}");
    assert_ne!(ids[2], ids[3], "a retry after throttling needs a new id: {ids:?}");
}

// ------------------------------------------------------------------ item: demo handlers only

/// Without `--demo-handlers`, `triage worker` refuses to start (it would dead-letter every
/// job of a real queue as `invalid`) and says how to run a worker with your own handlers.
#[tokio::test(flavor = "multi_thread")]
async fn triage_worker_without_demo_handlers_refuses_to_start() {
    let created = support::fresh_resources("ew-refuse", false).await;
    send(
        &created.queue_url,
        json!({"type": "billing.charge", "id": "real1", "payload": {}}),
    )
    .await;
    let (mut child, lines) = spawn_worker(&created, &[], &[]);
    let status = exited_within(&mut child.0, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("`triage worker` ran without --demo-handlers:\n{}", lines.text()));
    let text = lines.text();
    assert_eq!(status.code(), Some(2), "exit {status}:\n{text}");
    for needle in [
        "--demo-handlers",
        "triage.chaos",
        "--http",
        "--types",
        "examples/worker.rs",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    // Nothing was received: the job is still there, not dead-lettered.
    let sqs = support::sqs_client().await;
    let depth = support::queue_depth(&sqs, &created.queue_url).await;
    assert_eq!((depth.visible, depth.in_flight), (1, 0), "{depth:?}");
    assert_eq!(support::queue_depth(&sqs, &created.dlq_url).await.total(), 0);
}

/// A message that arrives in the middle of a long poll on a queue with a short visibility
/// timeout (raised to the worker's floor) still runs: its batch's clock leaves room for the
/// start margin, so it is not released again and again.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_arriving_during_a_long_poll_runs_on_a_short_visibility_queue() {
    let sdk = support::sdk_config().await;
    let created = support::fresh_resources("ew-midpoll", false).await;
    set_visibility(&created.queue_url, 5).await;
    let config = config(&created);
    // Through a proxy that counts the worker's calls: the test sends once the long poll is on
    // its way.
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let env = build_with(
        &config,
        chaos_registry(&config),
        sqs_config(&sdk).endpoint_url(proxy.url()),
        dynamodb_config(&sdk),
    )
    .await
    .unwrap();
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(20),
            max_messages: 10,
            emf: false,
        },
    );
    // The worker reads the queue's visibility timeout before its first receive.
    worker.visibility_timeout().await.unwrap();
    let poll = tokio::spawn(async move { worker.poll_once().await });
    let asked = Instant::now();
    while proxy.count("ReceiveMessage") == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the worker never polled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    send(
        &created.queue_url,
        json!({"type": chaos::CHAOS, "id": "mid", "payload": {"outcome": "ok"}}),
    )
    .await;
    let outcome = poll.await.unwrap().unwrap().expect("a batch");
    assert_eq!(outcome.records.len(), 1);
    assert!(
        matches!(outcome.records[0].decision, Decision::Done { attempts: 1 }),
        "{:?}",
        outcome.records[0].decision
    );
}
