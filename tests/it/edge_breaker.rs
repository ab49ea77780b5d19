//! The breaker at its edges, through the processor on the local stack: it opens again after
//! a probe closed it (in one environment and across three), an operator's close or reset does
//! not disable it, a hanging dependency costs each queued message few receives per cycle, and
//! a healthy environment reports its executions once per counting window.
//!
//! Open periods and windows that a test must see end are read from a manual clock
//! ([`Clock::manual`]) that the test moves past them. SQS's visibility timeouts are moto's
//! own time: a message the breaker deferred stays hidden until the period's end by that clock.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use serde_json::json;
use sqs_triage::clock::{Clock, now_ms};
use sqs_triage::core::JobError;
use sqs_triage::core::breaker::{BreakerConfig, BreakerState, Phase};
use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client, dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::processor::{BatchOutcome, Deadline, Incoming};
use sqs_triage::runtime::env::{Environment, build_with, build_with_clock};
use support::pipeline::{Harness, Options, fast_policy};
use tokio::time::Instant;

const DEP: &str = "test.dependency";

/// The open period of the reopen tests: longer than any test runs, passed by moving the
/// breaker's clock.
const OPEN_FOR: Duration = Duration::from_secs(300);

fn breaker(open_for: Duration) -> BreakerConfig {
    BreakerConfig::builder()
        .min_executions(3)
        .window(Duration::from_secs(120))
        .open_for(open_for)
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap()
}

/// A registry whose `test.dependency` handler fails transiently while `down` is set.
fn registry(down: Arc<AtomicBool>, config: BreakerConfig) -> Registry {
    Registry::new(fast_policy(20), config).handle_with(
        DEP,
        fast_policy(20),
        config,
        move |_: serde_json::Value, _ctx: JobContext| {
            let down = down.load(Ordering::SeqCst);
            async move {
                if down {
                    Err(JobError::transient("dependency down"))
                } else {
                    Ok(())
                }
            }
        },
    )
}

/// `n` more environments over the harness's queue, DLQ and table, reading the time from `clock`.
async fn environments(
    h: &Harness,
    n: usize,
    down: &Arc<AtomicBool>,
    config: BreakerConfig,
    clock: &Clock,
) -> Vec<Environment> {
    let sdk = support::sdk_config().await;
    let mut out = Vec::new();
    for _ in 0..n {
        let mut c = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
        c.queue_url = Some(h.queue_url.clone());
        c.dlq_url = Some(h.dlq_url.clone());
        c.table = Some(h.table.clone());
        let env = build_with_clock(
            &c,
            registry(down.clone(), config),
            sqs_config(&sdk),
            dynamodb_config(&sdk),
            clock.clone(),
        )
        .await
        .unwrap();
        out.push(env);
    }
    out
}

async fn send(h: &Harness, prefix: &str, n: usize) {
    let bodies: Vec<String> = (0..n)
        .map(|i| json!({"type": DEP, "id": format!("{prefix}{i}")}).to_string())
        .collect();
    h.send_raw(&bodies.iter().map(|b| (b.as_str(), None)).collect::<Vec<_>>())
        .await;
}

/// Receives one batch and runs it through `env` as the event source mapping would (deletes
/// what was not reported failed). Returns how many records the batch had.
async fn poll(h: &Harness, env: &Environment) -> usize {
    let messages: Vec<Message> = h.receive(&h.queue_url, Duration::from_secs(1)).await;
    if messages.is_empty() {
        return 0;
    }
    h.invoke_env(env, &messages, Duration::from_secs(60)).await;
    messages.len()
}

async fn store(h: &Harness, config: BreakerConfig, clock: &Clock) -> BreakerStore {
    BreakerStore::new(
        dynamodb_client(&support::sdk_config().await),
        &h.table,
        StorageRetry::default(),
    )
    .with_config(config)
    .with_clock(clock.clone())
}

/// Polls round-robin over `envs` until the stored breaker is in `phase` at `clock`'s time;
/// panics after `max_polls` polls without it.
async fn poll_until(
    h: &Harness,
    envs: &[Environment],
    store: &BreakerStore,
    clock: &Clock,
    phase: Phase,
    max_polls: usize,
) {
    for i in 0..max_polls {
        if store.status(DEP, clock.now_ms()).await.unwrap().phase == phase {
            return;
        }
        poll(h, &envs[i % envs.len()]).await;
    }
    let s = store.read(DEP).await.unwrap();
    panic!("breaker never reached {phase:?}: {s:?}");
}

/// Opens the breaker on an outage, lets a probe close it once the open period has passed on
/// the breaker's clock, and opens it again on a second outage: generations 1 (open), 2
/// (half-open), 3 (closed) and 4 (open).
async fn open_close_reopen(prefix: &str, n_envs: usize) {
    let down = Arc::new(AtomicBool::new(true));
    let config = breaker(OPEN_FOR);
    let h = Harness::build(Options {
        prefix,
        ..Options::default()
    })
    .await;
    let clock = Clock::manual(now_ms());
    let envs = environments(&h, n_envs, &down, config, &clock).await;
    let store = store(&h, config, &clock).await;

    // First outage: it opens.
    send(&h, "a", 6).await;
    poll_until(&h, &envs, &store, &clock, Phase::Open, 40).await;
    let first = store.read(DEP).await.unwrap();
    assert_eq!(first.generation, 1, "{first:?}");

    // The dependency recovers and the open period passes: a probe closes it. The messages it
    // deferred stay hidden in SQS until the period ends by moto's clock; fresh ones are probed.
    down.store(false, Ordering::SeqCst);
    clock.advance(OPEN_FOR);
    send(&h, "p", 3).await;
    poll_until(&h, &envs, &store, &clock, Phase::Closed, 40).await;
    let closed = store.read(DEP).await.unwrap();
    assert_eq!(closed.generation, 3, "{closed:?}");

    // Second outage: it must open again.
    down.store(true, Ordering::SeqCst);
    send(&h, "b", 6).await;
    poll_until(&h, &envs, &store, &clock, Phase::Open, 60).await;
    let second = store.read(DEP).await.unwrap();
    assert_eq!(second.generation, 4, "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_again_after_a_probe_closed_it() {
    open_close_reopen("reopen1", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_environments_open_close_and_reopen_it() {
    open_close_reopen("reopen3", 3).await;
}

/// A harness and one environment over it whose `test.dependency` is down, with the breaker
/// store a test reads it through (the system's clock: these tests wait for no period).
async fn down_dependency(prefix: &str) -> (Harness, Vec<Environment>, BreakerStore) {
    let down = Arc::new(AtomicBool::new(true));
    let config = breaker(Duration::from_secs(30));
    let h = Harness::build(Options {
        prefix,
        ..Options::default()
    })
    .await;
    let clock = Clock::system();
    let envs = environments(&h, 1, &down, config, &clock).await;
    let store = store(&h, config, &clock).await;
    (h, envs, store)
}

/// An operator's close of a job type the breaker has never seen does not disable it: the
/// failures that follow open it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_close_on_a_fresh_type_leaves_the_breaker_working() {
    let (h, envs, store) = down_dependency("opclose").await;
    store.force_close(DEP).await.unwrap();
    send(&h, "c", 6).await;
    poll_until(&h, &envs, &store, &Clock::system(), Phase::Open, 40).await;
}

/// An operator's reset of an open breaker does not disable it: the failures that follow open
/// it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_reset_of_an_open_breaker_leaves_it_working() {
    let (h, envs, store) = down_dependency("opreset").await;
    send(&h, "c", 6).await;
    poll_until(&h, &envs, &store, &Clock::system(), Phase::Open, 40).await;
    store.reset(DEP).await.unwrap();
    send(&h, "d", 6).await;
    poll_until(&h, &envs, &store, &Clock::system(), Phase::Open, 40).await;
}

/// Item: deferrals must not use up `maxReceiveCount`. A dependency that hangs (each run takes
/// 8 s, then fails) behind a breaker that opens for 8 s: two environments poll side by side,
/// so while one runs the probe the other keeps receiving the job type's messages. Each
/// message may be received about twice per open/half-open cycle (once while open, once while
/// the probe runs), and none may reach the DLQ without a failure record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_dependency_costs_each_message_few_receives_per_cycle() {
    use tokio::time::Instant;

    let hang = Duration::from_secs(8);
    let config = BreakerConfig::builder()
        .min_executions(2)
        .window(Duration::from_secs(120))
        .open_for(Duration::from_secs(8))
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let h = Harness::build(Options {
        prefix: "hang",
        ..Options::default()
    })
    .await;
    h.set_redrive(8).await;
    let sdk = support::sdk_config().await;
    let mut envs = Vec::new();
    for _ in 0..2 {
        let mut c = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
        c.queue_url = Some(h.queue_url.clone());
        c.dlq_url = Some(h.dlq_url.clone());
        c.table = Some(h.table.clone());
        let registry = Registry::new(fast_policy(20), config).handle_with(
            DEP,
            fast_policy(20),
            config,
            move |_: serde_json::Value, _ctx: JobContext| async move {
                tokio::time::sleep(hang).await;
                Err(JobError::transient("dependency hangs"))
            },
        );
        envs.push(
            build_with_clock(
                &c,
                registry,
                sqs_config(&sdk),
                dynamodb_config(&sdk),
                Clock::system(),
            )
            .await
            .unwrap(),
        );
    }
    let store = store(&h, config, &Clock::system()).await;
    send(&h, "h", 6).await;

    let until = Instant::now() + Duration::from_secs(50);
    let receives: Receives = Default::default();
    let openings: Openings = Default::default();
    tokio::join!(
        hang_poller(&h, &envs[0], &store, until, &receives, &openings),
        hang_poller(&h, &envs[1], &store, until, &receives, &openings)
    );

    let openings = openings.lock().unwrap().len() as u32;
    let receives = receives.lock().unwrap().clone();
    assert!(openings >= 2, "the breaker cycled: {openings} open periods");
    let most = receives.values().copied().max().unwrap_or(0);
    eprintln!("open periods {openings}, highest receive count {most}: {receives:?}");
    assert!(
        most <= 2 * openings + 2,
        "a message was received {most} times over {openings} open periods: {receives:?}"
    );
    for m in h.dlq_messages().await {
        let attrs = m.message_attributes().cloned().unwrap_or_default();
        assert!(
            sqs_triage::effects::dlq::failure_record(&attrs).is_some(),
            "a message reached the DLQ without a record"
        );
    }
}

type Receives = std::sync::Mutex<std::collections::HashMap<String, u32>>;
type Openings = std::sync::Mutex<std::collections::BTreeSet<u64>>;

/// One environment's event source mapping until `until`: records each message's highest
/// receive count and each open period seen.
async fn hang_poller(
    h: &Harness,
    env: &Environment,
    store: &BreakerStore,
    until: tokio::time::Instant,
    receives: &Receives,
    openings: &Openings,
) {
    while tokio::time::Instant::now() < until {
        let s = store.read(DEP).await.unwrap();
        if s.phase == Phase::Open {
            openings.lock().unwrap().insert(s.open_until_ms);
        }
        // Two at a time, so the probe's batch does not hold every message in flight.
        let messages = h
            .sqs
            .receive_message()
            .queue_url(&h.queue_url)
            .max_number_of_messages(2)
            .wait_time_seconds(1)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if messages.is_empty() {
            continue;
        }
        for m in &messages {
            let n: u32 = m
                .attributes()
                .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut r = receives.lock().unwrap();
            let e = r.entry(m.message_id().unwrap().to_owned()).or_default();
            *e = (*e).max(n);
        }
        h.invoke_env(env, &messages, Duration::from_secs(20)).await;
    }
}

/// A breaker that opens on half of at least ten executions in a 120 s window, read afresh by
/// every batch (no cache), so each environment sees the others' reports at once.
fn rate_breaker() -> BreakerConfig {
    BreakerConfig::builder()
        .failure_rate(50)
        .min_executions(10)
        .window(Duration::from_secs(120))
        .open_for(Duration::from_secs(30))
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap()
}

/// A registry whose handler fails transiently on the first attempt of the jobs whose id
/// starts with `f` (and on every attempt while `down` is set), and records each success.
fn noisy_registry(
    policy: sqs_triage::core::RetryPolicy,
    config: BreakerConfig,
    down: Arc<AtomicBool>,
    succeeded: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    runs: Arc<std::sync::atomic::AtomicU32>,
) -> Registry {
    Registry::new(policy.clone(), config).handle_with(
        DEP,
        policy,
        config,
        move |_: serde_json::Value, ctx: JobContext| {
            runs.fetch_add(1, Ordering::SeqCst);
            let fails = down.load(Ordering::SeqCst) || (ctx.job_id.starts_with('f') && ctx.attempt == 1);
            if !fails {
                succeeded.lock().unwrap().insert(ctx.job_id.clone());
            }
            async move {
                if fails {
                    Err(JobError::transient("noise"))
                } else {
                    Ok(())
                }
            }
        },
    )
}

struct Fleet {
    envs: Vec<Environment>,
    calls: Vec<sqs_triage::effects::calls::CallCounter>,
    down: Arc<AtomicBool>,
    succeeded: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    runs: Arc<std::sync::atomic::AtomicU32>,
}

/// `n` environments over the harness's resources, each counting its DynamoDB calls and reading
/// the time from `clock`.
async fn fleet(
    h: &Harness,
    n: usize,
    policy: sqs_triage::core::RetryPolicy,
    config: BreakerConfig,
    clock: &Clock,
) -> Fleet {
    let sdk = support::sdk_config().await;
    let f = Fleet {
        envs: Vec::new(),
        calls: Vec::new(),
        down: Arc::new(AtomicBool::new(false)),
        succeeded: Default::default(),
        runs: Default::default(),
    };
    let mut f = f;
    for _ in 0..n {
        let mut c = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
        c.queue_url = Some(h.queue_url.clone());
        c.dlq_url = Some(h.dlq_url.clone());
        c.table = Some(h.table.clone());
        let calls = sqs_triage::effects::calls::CallCounter::new();
        let registry = noisy_registry(
            policy.clone(),
            config,
            f.down.clone(),
            f.succeeded.clone(),
            f.runs.clone(),
        );
        let env = build_with_clock(
            &c,
            registry,
            sqs_config(&sdk),
            dynamodb_config(&sdk).interceptor(calls.clone()),
            clock.clone(),
        )
        .await
        .unwrap();
        calls.reset();
        f.envs.push(env);
        f.calls.push(calls);
    }
    f
}

/// The DynamoDB writes among `calls`, by operation.
fn writes(calls: &sqs_triage::effects::calls::CallCounter) -> std::collections::BTreeMap<String, u64> {
    calls
        .snapshot()
        .into_iter()
        .filter(|(op, _)| !op.contains("GetItem") && !op.contains("Query") && !op.contains("Scan"))
        .collect()
}

/// One invocation of `env` with `n` messages (at most 10), gathered first as a batching
/// window does.
async fn poll_n(h: &Harness, env: &Environment, n: usize) {
    let messages = h.receive_n(n).await;
    h.invoke_env(env, &messages, Duration::from_secs(60)).await;
}

/// A steady share of transient failures under the rate never opens the breaker: 100 jobs,
/// every fifth failing transiently once, through three environments side by side. The count
/// the breaker used to open on (5 in the window) is passed four times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_percent_transient_failures_at_a_fifty_percent_rate_never_open_the_breaker() {
    let h = Harness::build(Options {
        prefix: "noise",
        ..Options::default()
    })
    .await;
    let clock = Clock::system();
    let f = fleet(&h, 3, fast_policy(20), rate_breaker(), &clock).await;
    let store = store(&h, rate_breaker(), &clock).await;
    let bodies: Vec<String> = (0..100)
        .map(|i| {
            let id = if i % 5 == 0 {
                format!("f{i}")
            } else {
                format!("n{i}")
            };
            json!({"type": DEP, "id": id}).to_string()
        })
        .collect();
    h.send_raw(&bodies.iter().map(|b| (b.as_str(), None)).collect::<Vec<_>>())
        .await;
    let mut idle = 0;
    for i in 0..400 {
        let s = store.read(DEP).await.unwrap();
        assert_eq!(
            (s.phase, s.generation),
            (Phase::Closed, 0),
            "opened after poll {i}: {s:?}"
        );
        if f.succeeded.lock().unwrap().len() == 100 {
            break;
        }
        idle = if poll(&h, &f.envs[i % 3]).await == 0 {
            idle + 1
        } else {
            0
        };
        assert!(idle < 40, "jobs stopped coming");
    }
    assert_eq!(f.succeeded.lock().unwrap().len(), 100, "every job succeeded");
    let s = store.read(DEP).await.unwrap();
    assert_eq!(
        (s.phase, s.generation, s.failures),
        (Phase::Closed, 0, 20),
        "{s:?}"
    );
    // 100 first executions and 20 retries ran: the window holds some of them, none twice.
    assert!(
        s.executions >= 2 * s.failures && s.executions <= 120,
        "the successes were counted beside the failures, each once: {s:?}"
    );
}

/// Retries a minute away: a failed job stays out of the batches that follow.
fn slow_retries() -> sqs_triage::core::RetryPolicy {
    sqs_triage::core::RetryPolicy::builder()
        .max_attempts(5)
        .backoff(sqs_triage::core::Backoff::exponential(
            Duration::from_secs(60),
            2.0,
            Duration::from_secs(60),
            Duration::ZERO,
        ))
        .max_delay(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A dependency down for every execution opens the breaker at the tenth failing execution:
/// nine leave it closed, the tenth opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_down_for_every_execution_opens_the_breaker_at_the_tenth_failure() {
    let h = Harness::build(Options {
        prefix: "down10",
        ..Options::default()
    })
    .await;
    let clock = Clock::system();
    let f = fleet(&h, 1, slow_retries(), rate_breaker(), &clock).await;
    f.down.store(true, Ordering::SeqCst);
    let store = store(&h, rate_breaker(), &clock).await;
    send(&h, "d", 9).await;
    poll_n(&h, &f.envs[0], 9).await;
    assert_eq!(f.runs.load(Ordering::SeqCst), 9);
    let s = store.read(DEP).await.unwrap();
    assert_eq!(
        (s.phase, s.generation, s.failures),
        (Phase::Closed, 0, 9),
        "still closed after 9 failing executions: {s:?}"
    );
    send(&h, "e", 1).await;
    poll_n(&h, &f.envs[0], 1).await;
    assert_eq!(f.runs.load(Ordering::SeqCst), 10);
    let s = store.read(DEP).await.unwrap();
    assert_eq!(
        (s.phase, s.generation),
        (Phase::Open, 1),
        "opened by the tenth failing execution: {s:?}"
    );
}

/// With batches of ten, a dependency down for every execution opens the breaker by the report
/// of the first batch, as the former count of five did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ten_failing_executions_opens_the_breaker_with_its_report() {
    let h = Harness::build(Options {
        prefix: "batch10",
        ..Options::default()
    })
    .await;
    let clock = Clock::system();
    let f = fleet(&h, 1, slow_retries(), rate_breaker(), &clock).await;
    f.down.store(true, Ordering::SeqCst);
    let store = store(&h, rate_breaker(), &clock).await;
    send(&h, "d", 10).await;
    poll_n(&h, &f.envs[0], 10).await;
    assert_eq!(f.runs.load(Ordering::SeqCst), 10);
    let s = store.read(DEP).await.unwrap();
    assert_eq!((s.phase, s.generation), (Phase::Open, 1), "{s:?}");
}

/// Sends ten jobs whose ids start with `prefix`, the first `failing` of them failing on their
/// first attempt (their ids start with `f`).
async fn send_ten(h: &Harness, prefix: &str, failing: usize) {
    let bodies: Vec<String> = (0..10)
        .map(|i| {
            let id = if i < failing {
                format!("f{prefix}{i}")
            } else {
                format!("{prefix}{i}")
            };
            json!({"type": DEP, "id": id}).to_string()
        })
        .collect();
    h.send_raw(&bodies.iter().map(|b| (b.as_str(), None)).collect::<Vec<_>>())
        .await;
}

/// Environment 0 of `f` (healthy) runs ten jobs while no window counts; then three failures
/// among ten executions in environment 1 start one. Returns the window's state.
async fn window_after_a_healthy_batch(h: &Harness, f: &Fleet, store: &BreakerStore) -> BreakerState {
    let (healthy, failing) = (&f.calls[0], &f.calls[1]);
    send_ten(h, "a", 0).await;
    poll_n(h, &f.envs[0], 10).await;
    assert_eq!(writes(healthy), Default::default(), "no window: no write");
    assert_eq!(store.read(DEP).await.unwrap().version, 0, "no breaker item");
    send_ten(h, "b", 3).await;
    poll_n(h, &f.envs[1], 10).await;
    assert!(!writes(failing).is_empty());
    let s = store.read(DEP).await.unwrap();
    assert_eq!(
        (s.phase, s.failures, s.executions),
        (Phase::Closed, 3, 10),
        "{s:?}"
    );
    s
}

/// A healthy environment's ten executions reported into a counting window: in one write, folded
/// into a batched write. Returns the window's state after it.
async fn healthy_batch_reported(h: &Harness, f: &Fleet, store: &BreakerStore, prefix: &str) -> BreakerState {
    let healthy = &f.calls[0];
    healthy.reset();
    send_ten(h, prefix, 0).await;
    poll_n(h, &f.envs[0], 10).await;
    assert_eq!(
        writes(healthy),
        std::collections::BTreeMap::from([("DynamoDB.BatchExecuteStatement".to_owned(), 1)])
    );
    store.read(DEP).await.unwrap()
}

/// A fresh harness and two environments on `clock`: 0 runs the healthy batches, 1 the failing
/// ones; retries wait a minute, so the failed jobs stay out of the healthy environment's batches.
async fn healthy_and_failing(prefix: &str, clock: &Clock) -> (Harness, Fleet, BreakerStore) {
    let h = Harness::build(Options {
        prefix,
        ..Options::default()
    })
    .await;
    let f = fleet(&h, 2, slow_retries(), rate_breaker(), clock).await;
    let store = store(&h, rate_breaker(), clock).await;
    (h, f, store)
}

/// The healthy path's cost: an environment whose executions all succeed writes nothing while no
/// window counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_environment_writes_nothing_while_no_window_counts() {
    let (h, f, store) = healthy_and_failing("healthy0", &Clock::system()).await;
    send_ten(&h, "a", 0).await;
    poll_n(&h, &f.envs[0], 10).await;
    assert_eq!(writes(&f.calls[0]), Default::default(), "no window: no write");
    assert_eq!(store.read(DEP).await.unwrap().version, 0, "no breaker item");
}

/// Once another environment's failures start a window, a healthy environment writes its
/// executions since the window began in one write, folded into a batched write: those of its
/// batch, not its ten from before the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_environment_reports_its_executions_into_a_counting_window_in_one_write() {
    let (h, f, store) = healthy_and_failing("healthy1", &Clock::system()).await;
    window_after_a_healthy_batch(&h, &f, &store).await;
    let s = healthy_batch_reported(&h, &f, &store, "c").await;
    assert_eq!(
        (s.phase, s.failures, s.executions),
        (Phase::Closed, 3, 20),
        "{s:?}"
    );
}

/// A healthy environment writes once per window: not again in the window it reported into,
/// and once again in the next window, once the first has ended on the breakers' clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_environment_writes_once_per_window() {
    let clock = Clock::manual(now_ms());
    let (h, f, store) = healthy_and_failing("healthy2", &clock).await;
    let first = window_after_a_healthy_batch(&h, &f, &store).await;
    let reported = healthy_batch_reported(&h, &f, &store, "c").await;

    // Not again in this window.
    f.calls[0].reset();
    send_ten(&h, "e", 0).await;
    poll_n(&h, &f.envs[0], 10).await;
    assert_eq!(
        writes(&f.calls[0]),
        Default::default(),
        "already reported into this window"
    );
    assert_eq!(store.read(DEP).await.unwrap().executions, reported.executions);

    // The window ends; the failing environment's failures start the next one, and the healthy
    // environment reports into it once, its batches of the first window dropped.
    clock.advance(rate_breaker().window() + Duration::from_secs(1));
    send_ten(&h, "g", 3).await;
    poll_n(&h, &f.envs[1], 10).await;
    let next = store.read(DEP).await.unwrap();
    assert_eq!(
        (next.phase, next.generation, next.failures, next.executions),
        (Phase::Closed, first.generation, 3, 10),
        "{next:?}"
    );
    assert!(
        next.window_start_ms > first.window_start_ms,
        "a new window: {next:?}"
    );
    let s = healthy_batch_reported(&h, &f, &store, "h").await;
    assert_eq!(
        (s.phase, s.failures, s.executions),
        (Phase::Closed, 3, 20),
        "{s:?}"
    );
}

/// A registry whose [`DEP`] handler always fails transiently; one whose payload says
/// `"hold": true` first adds a permit to `started`, then waits for a permit of `gate`.
fn held_failing_registry(gate: Gate) -> Registry {
    Registry::new(slow_retries(), rate_breaker()).handle_with(
        DEP,
        slow_retries(),
        rate_breaker(),
        move |p: serde_json::Value, _ctx: JobContext| {
            let gate = gate.clone();
            async move {
                if p["hold"] == true {
                    gate.started.add_permits(1);
                    gate.open.acquire().await.unwrap().forget();
                }
                Err::<(), _>(JobError::transient("dependency down"))
            }
        },
    )
}

/// The held jobs of [`held_failing_registry`]: one permit of `started` per held job that
/// began, and the permits of `open` that let them end.
#[derive(Clone)]
struct Gate {
    started: Arc<tokio::sync::Semaphore>,
    open: Arc<tokio::sync::Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        let none = || Arc::new(tokio::sync::Semaphore::new(0));
        Self {
            started: none(),
            open: none(),
        }
    }
}

/// An environment over the harness's resources serving [`held_failing_registry`].
async fn held_failing_env(h: &Harness, gate: &Gate) -> Environment {
    let sdk = support::sdk_config().await;
    let mut c = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
    c.queue_url = Some(h.queue_url.clone());
    c.dlq_url = Some(h.dlq_url.clone());
    c.table = Some(h.table.clone());
    build_with(
        &c,
        held_failing_registry(gate.clone()),
        sqs_config(&sdk),
        dynamodb_config(&sdk),
    )
    .await
    .unwrap()
}

/// Runs `messages` through `env`'s processor with a minute to go, and returns its outcome.
async fn outcome_of(env: &Environment, messages: Vec<Message>) -> BatchOutcome {
    let incoming = messages.into_iter().map(Incoming::from_sdk).collect();
    env.processor
        .process_within(
            incoming,
            Deadline::new(Some(Instant::now() + Duration::from_secs(60))),
        )
        .await
}

/// `BreakerOpened` of `DEP` in `outcome`'s metrics.
fn opened_metric(outcome: &BatchOutcome) -> u64 {
    outcome
        .metrics
        .by_type
        .get(DEP)
        .and_then(|t| t.counts.get("BreakerOpened").copied())
        .unwrap_or(0)
}

/// A report written on its own that opens the breaker (the type's first report) counts
/// `BreakerOpened` once, under its job type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_opens_the_breaker_counts_breaker_opened_once_under_its_type() {
    let h = Harness::build(Options {
        prefix: "opened-direct",
        ..Options::default()
    })
    .await;
    let gate = Gate::default();
    let env = held_failing_env(&h, &gate).await;
    send(&h, "d", 10).await;
    let outcome = outcome_of(&env, h.receive_n(10).await).await;
    assert_eq!(outcome.records.iter().filter(|r| r.executed).count(), 10);
    assert_eq!(opened_metric(&outcome), 1, "{:?}", outcome.metrics);
    assert_eq!(outcome.metrics.total("BreakerOpened"), 1, "{:?}", outcome.metrics);
    let s = store(&h, rate_breaker(), &Clock::system())
        .await
        .read(DEP)
        .await
        .unwrap();
    assert_eq!((s.phase, s.generation), (Phase::Open, 1), "{s:?}");
}

/// A report folded into the ledger's batched write on a state another environment has moved
/// on meanwhile is refused, written again on its own, and opens the breaker: `BreakerOpened`
/// counts once, under its job type, in the environment whose report opened it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_report_refused_then_opening_the_breaker_counts_breaker_opened_once() {
    let h = Harness::build(Options {
        prefix: "opened-folded",
        ..Options::default()
    })
    .await;
    let gate = Gate::default();
    let (a, b) = (
        held_failing_env(&h, &gate).await,
        held_failing_env(&h, &gate).await,
    );
    let store = store(&h, rate_breaker(), &Clock::system()).await;
    // B starts the window: one failure of one execution.
    send(&h, "b", 1).await;
    let first = outcome_of(&b, h.receive_n(1).await).await;
    assert_eq!(opened_metric(&first), 0);
    // A admits a held job, reading the window as B left it (1 of 1).
    let held = json!({"type": DEP, "id": "held", "payload": {"hold": true}}).to_string();
    h.send_raw(&[(&held, None)]).await;
    let held = h.receive_n(1).await;
    let a_run = tokio::spawn(async move {
        let outcome = outcome_of(&a, held).await;
        (a, outcome)
    });
    // Its handler runs once its admission has read the breaker.
    gate.started.acquire().await.unwrap().forget();
    // Meanwhile B brings the window to nine failures of nine: still closed (ten needed).
    send(&h, "c", 8).await;
    let more = outcome_of(&b, h.receive_n(8).await).await;
    assert_eq!(opened_metric(&more), 0);
    let s = store.read(DEP).await.unwrap();
    assert_eq!(
        (s.phase, s.failures, s.executions),
        (Phase::Closed, 9, 9),
        "{s:?}"
    );
    // A's failure, folded on its stale 1 of 1, is the tenth: the fold is refused and its
    // report written again opens the breaker.
    assert!(!a_run.is_finished(), "the held job ended early");
    gate.open.add_permits(1);
    let (a, outcome) = a_run.await.unwrap();
    assert!(outcome.records[0].executed, "{outcome:?}");
    assert_eq!(opened_metric(&outcome), 1, "{:?}", outcome.metrics);
    assert_eq!(outcome.metrics.total("BreakerOpened"), 1, "{:?}", outcome.metrics);
    let s = store.read(DEP).await.unwrap();
    assert_eq!((s.phase, s.generation), (Phase::Open, 1), "{s:?}");
    drop(a);
}
