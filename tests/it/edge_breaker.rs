//! The breaker at its edges, through the processor on the local stack: it opens again after
//! a probe closed it (in one environment and across three), an operator's close does not
//! disable it, and a hanging dependency costs each queued message few receives per cycle.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use serde_json::json;
use sqs_triage::clock::now_ms;
use sqs_triage::core::JobError;
use sqs_triage::core::breaker::{BreakerConfig, Phase};
use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client, dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::{Environment, build_with};
use support::pipeline::{Harness, Options, fast_policy};

const DEP: &str = "test.dependency";

fn breaker(open_for: Duration) -> BreakerConfig {
    BreakerConfig::builder()
        .threshold(3)
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

/// `n` more environments over the harness's queue, DLQ and table.
async fn environments(
    h: &Harness,
    n: usize,
    down: &Arc<AtomicBool>,
    config: BreakerConfig,
) -> Vec<Environment> {
    let sdk = support::sdk_config().await;
    let mut out = Vec::new();
    for _ in 0..n {
        let mut c = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
        c.queue_url = Some(h.queue_url.clone());
        c.dlq_url = Some(h.dlq_url.clone());
        c.table = Some(h.table.clone());
        let env = build_with(
            &c,
            registry(down.clone(), config),
            sqs_config(&sdk),
            dynamodb_config(&sdk),
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

async fn store(h: &Harness, config: BreakerConfig) -> BreakerStore {
    BreakerStore::new(
        dynamodb_client(&support::sdk_config().await),
        &h.table,
        StorageRetry::default(),
    )
    .with_config(config)
}

/// Polls round-robin over `envs` until the stored breaker reaches `phase`; panics after
/// `max_polls` polls without it.
async fn poll_until(h: &Harness, envs: &[Environment], store: &BreakerStore, phase: Phase, max_polls: usize) {
    for i in 0..max_polls {
        if store.status(DEP, now_ms()).await.unwrap().phase == phase {
            return;
        }
        poll(h, &envs[i % envs.len()]).await;
    }
    let s = store.read(DEP).await.unwrap();
    panic!("breaker never reached {phase:?}: {s:?}");
}

async fn open_close_reopen(prefix: &str, n_envs: usize) {
    let down = Arc::new(AtomicBool::new(true));
    let config = breaker(Duration::from_secs(1));
    let h = Harness::build(Options {
        prefix,
        ..Options::default()
    })
    .await;
    let envs = environments(&h, n_envs, &down, config).await;
    let store = store(&h, config).await;

    // First outage: it opens.
    send(&h, "a", 6).await;
    poll_until(&h, &envs, &store, Phase::Open, 40).await;
    let first = store.read(DEP).await.unwrap();

    // The dependency recovers: after the open period a probe closes it.
    down.store(false, Ordering::SeqCst);
    poll_until(&h, &envs, &store, Phase::Closed, 200).await;
    let closed = store.read(DEP).await.unwrap();
    assert!(closed.generation > first.generation, "{closed:?}");

    // Second outage: it must open again.
    down.store(true, Ordering::SeqCst);
    send(&h, "b", 6).await;
    poll_until(&h, &envs, &store, Phase::Open, 60).await;
    let second = store.read(DEP).await.unwrap();
    assert!(second.generation > closed.generation, "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_again_after_a_probe_closed_it() {
    open_close_reopen("reopen1", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_environments_open_close_and_reopen_it() {
    open_close_reopen("reopen3", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_close_on_a_fresh_type_leaves_the_breaker_working() {
    let down = Arc::new(AtomicBool::new(true));
    let config = breaker(Duration::from_secs(30));
    let h = Harness::build(Options {
        prefix: "opclose",
        ..Options::default()
    })
    .await;
    let envs = environments(&h, 1, &down, config).await;
    let store = store(&h, config).await;
    store.force_close(DEP).await.unwrap();
    send(&h, "c", 6).await;
    poll_until(&h, &envs, &store, Phase::Open, 40).await;

    // And after an operator's reset too.
    store.reset(DEP).await.unwrap();
    send(&h, "d", 6).await;
    poll_until(&h, &envs, &store, Phase::Open, 40).await;
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
        .threshold(2)
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
            build_with(&c, registry, sqs_config(&sdk), dynamodb_config(&sdk))
                .await
                .unwrap(),
        );
    }
    let store = store(&h, config).await;
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
