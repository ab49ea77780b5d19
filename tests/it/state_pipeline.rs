//! The shared state as the pipeline uses it, on the local stack through the real SDK: the
//! healthy path's cost, exact attempts under DynamoDB faults injected on the wire, and the
//! breaker deferring a whole job type without spending attempts.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sqs_triage::core::JobError;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::failure::FailureClass;
use sqs_triage::effects::dlq::failure_record;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};
use sqs_triage::processor::registry::JobContext;
use support::fault_proxy::{Fault, FaultPlan, FaultProxy};
use support::pipeline::{Harness, Options, fast_policy};

async fn send_many(h: &Harness, jobs: &[(String, serde_json::Value)]) {
    let sqs = h.env.processor.sqs();
    let outgoing = jobs
        .iter()
        .enumerate()
        .map(|(key, (id, p))| sqs_triage::effects::sqs::Outgoing {
            key,
            body: json!({"type": support::pipeline::RECORDED, "id": id, "payload": p}).to_string(),
            attributes: Default::default(),
            group_id: None,
            dedup_id: None,
            delay_seconds: None,
        })
        .collect();
    let sent = sqs.send(&h.queue_url, outgoing, None).await;
    assert!(sent.failed.is_empty(), "{:?}", sent.failed);
}

fn writes(calls: &BTreeMap<String, u64>) -> u64 {
    [
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "BatchWriteItem",
        "TransactWriteItems",
        "BatchExecuteStatement",
        "ExecuteStatement",
    ]
    .iter()
    .map(|op| calls.get(&format!("DynamoDB.{op}")).copied().unwrap_or(0))
    .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_successful_first_deliveries_make_no_dynamodb_writes() {
    let h = Harness::build(Options {
        prefix: "healthy",
        ..Options::default()
    })
    .await;
    // Every one of them must make no write: a hundred prove it as a thousand would.
    let jobs: Vec<_> = (0..100)
        .map(|i| (format!("ok-{i}"), json!({"outcome": "ok"})))
        .collect();
    send_many(&h, &jobs).await;
    h.env.calls.reset();
    let start = Instant::now();
    while h.log.lock().unwrap().len() < 100 {
        h.invoke_once(Duration::from_secs(1)).await;
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "only {} ran",
            h.log.lock().unwrap().len()
        );
    }
    let calls = h.env.calls.snapshot();
    assert_eq!(writes(&calls), 0, "healthy path wrote to DynamoDB: {calls:?}");
    assert_eq!(
        calls.get("DynamoDB.BatchGetItem"),
        None,
        "first deliveries need no ledger read: {calls:?}"
    );
    let sqs_calls: u64 = calls
        .iter()
        .filter(|(k, _)| k.starts_with("SQS."))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        sqs_calls, 0,
        "nothing to change, send or delete beyond Lambda's own: {calls:?}"
    );
    // Breaker state is read through the per-environment cache, not per message.
    let reads = calls.get("DynamoDB.GetItem").copied().unwrap_or(0);
    assert!(
        reads <= 1 + start.elapsed().as_secs() / 5 + 1,
        "{reads} breaker reads for 100 messages"
    );
    assert_eq!(h.depth(&h.queue_url).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn dynamodb_faults_never_spend_attempts_and_decisions_stay_right() {
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    proxy.set_faults(FaultPlan {
        share: 0.3,
        kinds: vec![
            Fault::Throttle,
            Fault::ThrottlingException,
            Fault::Status500,
            Fault::Status503,
            Fault::Reset,
        ],
        only_ops: None,
        spare_body_containing: None,
        seed: 7,
    });
    let h = Harness::build(Options {
        prefix: "ddbfaults",
        ddb_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    let mut jobs = Vec::new();
    for i in 0..30 {
        jobs.push((
            format!("flaky-{i}"),
            json!({"outcome": "transient", "fail_times": 2}),
        ));
        jobs.push((format!("ok-{i}"), json!({"outcome": "ok"})));
    }
    for i in 0..10 {
        jobs.push((format!("bug-{i}"), json!({"outcome": "fatal"})));
    }
    send_many(&h, &jobs).await;
    let start = Instant::now();
    loop {
        h.invoke_once(Duration::from_secs(1)).await;
        let settled = (0..30).all(|i| h.executions(&format!("flaky-{i}")).len() >= 3)
            && (0..30).all(|i| !h.executions(&format!("ok-{i}")).is_empty());
        if settled && h.depth(&h.queue_url).await == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "did not settle");
    }
    for i in 0..30 {
        // Attempt numbers come from the ledger: a storage retry that spent one would skip a number.
        assert_eq!(h.executions(&format!("flaky-{i}")), vec![1, 2, 3], "flaky-{i}");
        assert_eq!(h.executions(&format!("ok-{i}")), vec![1], "ok-{i}");
    }
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 10);
    for m in &dlq {
        let r = failure_record(m.message_attributes().unwrap()).unwrap().unwrap();
        assert_eq!((r.class, r.attempts), (FailureClass::Fatal, 1));
    }
    let stats = h.env.retry.stats();
    assert!(
        proxy.faults_injected() > 0 && stats.retries > 0,
        "faults were injected and retried"
    );
    let cfg = h.env.retry.config();
    let bound =
        f64::from(cfg.budget_capacity) + proxy.total() as f64 * cfg.budget_deposit_milli as f64 / 1000.0;
    assert!(
        (stats.retries as f64) <= bound,
        "{} retries exceed the budget bound {bound}",
        stats.retries
    );
    println!(
        "faults injected {:?}, storage retries {}",
        proxy.faults(),
        stats.retries
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_breaker_defers_the_job_type_without_spending_attempts() {
    let down = Arc::new(AtomicBool::new(true));
    let dependency = down.clone();
    let breaker = BreakerConfig::builder()
        .min_executions(5)
        .open_for(Duration::from_secs(20))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let h = Harness::build(Options {
        prefix: "breaker",
        policy: fast_policy(3),
        breaker,
        register: Box::new(move |r, log| {
            r.handle_with(
                "test.dependency",
                fast_policy(3),
                breaker,
                move |_: serde_json::Value, ctx: JobContext| {
                    log.lock().unwrap().push((ctx.job_id.clone(), ctx.attempt));
                    let down = dependency.load(Ordering::SeqCst);
                    async move {
                        if down {
                            Err(JobError::transient("dependency down"))
                        } else {
                            Ok(())
                        }
                    }
                },
            )
        }),
        ..Options::default()
    })
    .await;
    let bodies: Vec<String> = (0..10)
        .map(|i| json!({"type": "test.dependency", "id": format!("d{i}")}).to_string())
        .collect();
    h.send_raw(&bodies.iter().map(|b| (b.as_str(), None)).collect::<Vec<_>>())
        .await;

    // The first batch fails together: one aggregated report opens the breaker. The ten are
    // gathered over as many receives as SQS takes to hand them out, as an event source
    // mapping's batching window does.
    let (first, _) = h.invoke_gathered(10).await;
    assert_eq!(first.len(), 10);
    let ledger = AttemptLedger::new(
        dynamodb_client(&support::sdk_config().await),
        &h.table,
        StorageRetry::default(),
    );
    let store = sqs_triage::effects::breaker_store::BreakerStore::new(
        dynamodb_client(&support::sdk_config().await),
        &h.table,
        StorageRetry::default(),
    )
    .with_config(breaker);
    let state = store.read("test.dependency").await.unwrap();
    assert_eq!(state.phase, sqs_triage::core::breaker::Phase::Open, "{state:?}");

    // While open, the jobs come back after their 1 s backoff and are deferred, unexecuted.
    let mut returned: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    while returned.len() < 10 && sqs_triage::clock::now_ms() < state.open_until_ms {
        if let Some((m, _)) = h.invoke_once(Duration::from_secs(2)).await {
            returned.extend(m.iter().map(|m| m.message_id().unwrap().to_owned()));
        }
    }
    // Only a half-open breaker admits a probe, and it cannot be half-open before the end of
    // the open period: if that has not come yet, nothing can have run.
    let still_open = sqs_triage::clock::now_ms() < state.open_until_ms;
    if still_open {
        assert_eq!(returned.len(), 10, "every job came back and was deferred");
        assert_eq!(
            h.log.lock().unwrap().len(),
            10,
            "nothing ran while the breaker was open"
        );
    } else {
        eprintln!("the machine was too slow to see every deferral within the open period");
    }
    // The dependency recovers; after the open period one probe closes the breaker.
    down.store(false, Ordering::SeqCst);
    let start = Instant::now();
    while h.depth(&h.queue_url).await > 0 {
        h.invoke_once(Duration::from_secs(2)).await;
        assert!(start.elapsed() < Duration::from_secs(120), "jobs did not finish");
    }
    for i in 0..10 {
        let ex = h.executions(&format!("d{i}"));
        if still_open {
            assert_eq!(ex, vec![1, 2], "d{i}: deferrals spent no attempt");
        } else {
            assert!(
                ex.iter().copied().eq(1..=ex.len() as u32) && ex.len() <= 3,
                "d{i}: {ex:?}"
            );
        }
        assert!(
            ledger.show_all_types(&format!("d{i}")).await.unwrap().is_empty(),
            "ledger closed after success"
        );
    }
    assert!(
        h.dlq_messages().await.is_empty(),
        "nobody exhausted: 3 attempts allowed, 2 used"
    );
}
