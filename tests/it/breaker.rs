//! The shared breaker against DynamoDB Local: many environments (separate stores, no shared
//! cache) racing through conditional writes.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sqs_triage::core::breaker::{Aggregate, BreakerConfig, Phase};
use sqs_triage::core::decision::Gate;
use sqs_triage::effects::breaker_store::{Admission, BreakerStore};
use sqs_triage::effects::calls::CallCounter;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client, dynamodb_config};
use sqs_triage::effects::table::{create_table, delete_table};

const T0: u64 = 1_800_000_000_000;

/// Five executions that all fail open it (at least half of at least five).
fn config(probes: u32) -> BreakerConfig {
    BreakerConfig::builder()
        .min_executions(5)
        .probes(probes)
        .lease(Duration::from_secs(20))
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap()
}

async fn setup() -> (aws_sdk_dynamodb::Client, String) {
    let client = dynamodb_client(&support::sdk_config().await);
    let table = support::unique_name("breaker");
    create_table(&client, &table).await.unwrap();
    (client, table)
}

fn envs(client: &aws_sdk_dynamodb::Client, table: &str, n: usize, probes: u32) -> Vec<Arc<BreakerStore>> {
    (0..n)
        .map(|_| {
            Arc::new(
                BreakerStore::new(client.clone(), table, StorageRetry::default()).with_config(config(probes)),
            )
        })
        .collect()
}

/// What one environment's view of the breaker allows at `now`, as the processor sees it for a
/// batch (one cached read, failing open).
async fn seen(store: &BreakerStore, job_type: &str, now: u64) -> Admission {
    store.view(&store.observe(job_type, None).await, now)
}

/// Admission for a record that will run if allowed: the view, and when half-open a probe
/// permit asked from storage.
async fn admit(store: &BreakerStore, job_type: &str, now: u64) -> Admission {
    let seen = seen(store, job_type, now).await;
    store.admit(job_type, &seen, now, None, None).await
}

async fn open_it(store: &BreakerStore, job_type: &str, now: u64) {
    let g = seen(store, job_type, now).await;
    let agg = Aggregate {
        transient_failures: 5,
        generation: g.generation,
        ..Aggregate::default()
    };
    let s = store.report(job_type, &agg, now, None).await.unwrap().unwrap();
    assert_eq!(s.phase, Phase::Open);
}

async fn race_for_probes(stores: &[Arc<BreakerStore>], job_type: &str, now: u64) -> usize {
    let tasks: Vec<_> = stores
        .iter()
        .map(|s| {
            let s = s.clone();
            let jt = job_type.to_owned();
            tokio::spawn(async move { admit(&s, &jt, now).await })
        })
        .collect();
    let mut granted = 0;
    for t in tasks {
        let a = t.await.unwrap();
        match a.gate {
            Gate::Probe => {
                assert!(a.permit.is_some());
                granted += 1;
            }
            Gate::ProbeBusy { .. } => assert!(a.permit.is_none()),
            other => panic!("unexpected gate {other:?}"),
        }
    }
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn fifty_environments_get_exactly_n_probes_and_expired_leases_free_slots() {
    let (client, table) = setup().await;
    for probes in [1, 3] {
        let jt = format!("probe-{probes}");
        let stores = envs(&client, &table, 50, probes);
        open_it(&stores[0], &jt, T0).await;
        assert!(matches!(
            seen(&stores[1], &jt, T0 + 1).await.gate,
            Gate::Open { .. }
        ));
        let half_open = T0 + 30_000;
        assert_eq!(race_for_probes(&stores, &jt, half_open).await, probes as usize);
        assert_eq!(
            race_for_probes(&stores, &jt, half_open + 1_000).await,
            0,
            "slots stay held"
        );
        // Leases expire after 20 s: their slots are free again.
        assert_eq!(
            race_for_probes(&stores, &jt, half_open + 20_001).await,
            probes as usize
        );
    }
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_aggregate_open_defers_and_probe_success_closes() {
    let (client, table) = setup().await;
    let stores = envs(&client, &table, 5, 1);
    let jt = "email";
    // Healthy: closed, and gating writes nothing.
    assert_eq!(seen(&stores[0], jt, T0).await.gate, Gate::Closed);
    assert_eq!(stores[0].read(jt).await.unwrap().version, 0, "no item written");
    // Five environments each report one transient failure: the fifth opens it.
    let tasks: Vec<_> = stores
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move {
                let agg = Aggregate {
                    transient_failures: 1,
                    generation: 0,
                    ..Aggregate::default()
                };
                s.report(jt, &agg, T0 + 1_000, None).await.unwrap()
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let s = stores[0].status(jt, T0 + 1_000).await.unwrap();
    assert_eq!(s.phase, Phase::Open, "5 failures in the window open it: {s:?}");
    assert_eq!(
        admit(&stores[1], jt, T0 + 2_000).await.gate,
        Gate::Open {
            until_ms: T0 + 31_000
        }
    );
    // Half-open: one probe; a released permit is free again; a success closes.
    let a = admit(&stores[2], jt, T0 + 31_000).await;
    let permit = a.permit.expect("a probe");
    stores[2].release(jt, &permit, T0 + 31_001, None).await.unwrap();
    let b = admit(&stores[3], jt, T0 + 31_002).await;
    let permit = b.permit.expect("the released slot is free");
    let stale = Aggregate {
        probe_failures: 1,
        generation: permit.generation - 1,
        ..Aggregate::default()
    };
    assert_eq!(
        stores[4].report(jt, &stale, T0 + 31_003, None).await.unwrap(),
        None,
        "stale generation ignored"
    );
    let ok = Aggregate {
        probe_successes: 1,
        leases: vec![permit.id.clone()],
        generation: permit.generation,
        ..Aggregate::default()
    };
    let closed = stores[3]
        .report(jt, &ok, T0 + 31_004, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed.phase, Phase::Closed);
    assert_eq!(seen(&stores[0], jt, T0 + 31_005).await.gate, Gate::Closed);
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test]
async fn operator_forces_and_missing_table_fails_open() {
    let (client, table) = setup().await;
    let store = BreakerStore::new(client.clone(), &table, StorageRetry::default()).with_config(config(1));
    let s = store.force_open("jt", None, T0).await.unwrap();
    assert!(s.forced);
    assert!(matches!(
        seen(&store, "jt", T0 + 3_600_000).await.gate,
        Gate::Open { .. }
    ));
    assert_eq!(store.force_close("jt").await.unwrap().phase, Phase::Closed);
    let r = store.reset("jt").await.unwrap();
    assert_eq!((r.phase, r.failures), (Phase::Closed, 0));
    assert_eq!(store.status("jt", T0).await.unwrap(), r);

    let missing =
        BreakerStore::new(client.clone(), "no-such-table", StorageRetry::default()).with_config(config(1));
    assert_eq!(admit(&missing, "jt", T0).await.gate, Gate::Closed, "fails open");
    let err = missing.status("jt", T0).await.unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    delete_table(&client, &table).await.unwrap();
}

/// Environments that have seen the window counting report with one `UpdateItem` each (no
/// read); racing increments still open the breaker exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counting_windows_take_one_write_per_report_and_open_once() {
    let (client, table) = setup().await;
    let sdk = support::sdk_config().await;
    let caching = BreakerConfig::builder()
        .min_executions(8)
        .cache_ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let counted = |calls: &CallCounter| {
        let conf = dynamodb_config(&sdk).interceptor(calls.clone()).build();
        BreakerStore::new(
            aws_sdk_dynamodb::Client::from_conf(conf),
            &table,
            StorageRetry::default(),
        )
        .with_config(caching)
    };
    let jt = "email";
    let one = Aggregate {
        transient_failures: 1,
        generation: 0,
        ..Aggregate::default()
    };
    // The first failure starts the window: a read and a full write.
    let calls = CallCounter::new();
    let first = counted(&calls);
    first.report(jt, &one, T0, None).await.unwrap();
    assert_eq!(
        calls.snapshot(),
        BTreeMap::from([
            ("DynamoDB.GetItem".to_owned(), 1),
            ("DynamoDB.PutItem".to_owned(), 1)
        ])
    );
    // The same environment again: one increment.
    calls.reset();
    let s = first.report(jt, &one, T0 + 1_000, None).await.unwrap().unwrap();
    assert_eq!(
        calls.snapshot(),
        BTreeMap::from([("DynamoDB.UpdateItem".to_owned(), 1)])
    );
    assert_eq!((s.phase, s.failures), (Phase::Closed, 2));

    // Six environments that have seen the counting window race one failure each: the count
    // passes 8 with the sixth increment, and exactly one of them opens the breaker.
    let racers: Vec<(CallCounter, Arc<BreakerStore>)> = (0..6)
        .map(|_| {
            let c = CallCounter::new();
            let store = Arc::new(counted(&c));
            (c, store)
        })
        .collect();
    for (_, store) in &racers {
        seen(store, jt, T0 + 2_000).await;
    }
    let tasks: Vec<_> = racers
        .iter()
        .map(|(_, store)| {
            let store = store.clone();
            let one = one.clone();
            tokio::spawn(async move { store.report(jt, &one, T0 + 3_000, None).await.unwrap() })
        })
        .collect();
    let mut opened = 0;
    for t in tasks {
        if t.await.unwrap().is_some_and(|s| s.phase == Phase::Open) {
            opened += 1;
        }
    }
    assert_eq!(opened, 1, "one report opens it");
    let s = first.read(jt).await.unwrap();
    assert_eq!((s.phase, s.generation), (Phase::Open, 1), "{s:?}");
    let updates: Vec<u64> = racers
        .iter()
        .map(|(c, _)| c.snapshot().get("DynamoDB.UpdateItem").copied().unwrap_or(0))
        .collect();
    assert!(
        updates.iter().all(|&u| u >= 1),
        "every racer tried an increment: {updates:?}"
    );
    delete_table(&client, &table).await.unwrap();
}

/// A report that only adds to a counting window rides in the ledger's batched write as one
/// statement: counted once when written, once when the call's answer was lost and it was sent
/// again, and made the long way (which opens the breaker) when other environments' failures
/// would take it to the threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_folded_report_counts_once_and_one_that_would_reach_the_threshold_opens_the_breaker() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use sqs_triage::effects::ledger::{AttemptLedger, Batched, Written};
    use sqs_triage::effects::storage_retry::StorageRetryConfig;
    use support::fault_proxy::{Fault, FaultProxy, FaultRule};

    let (client, table) = setup().await;
    let sdk = support::sdk_config().await;
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let proxied =
        aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&sdk).endpoint_url(proxy.url()).build());
    let caching = BreakerConfig::builder()
        .min_executions(6)
        .cache_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let store = BreakerStore::new(proxied.clone(), &table, StorageRetry::default()).with_config(caching);
    let other = BreakerStore::new(client.clone(), &table, StorageRetry::default()).with_config(caching);
    let quick = StorageRetry::new(StorageRetryConfig {
        base: Duration::from_millis(2),
        throttle_base: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        ..StorageRetryConfig::default()
    })
    .unwrap();
    let ledger = AttemptLedger::new(proxied, &table, quick);
    let jt = "email";
    let one = Aggregate {
        transient_failures: 1,
        generation: 0,
        ..Aggregate::default()
    };
    // Nothing cached: no fold. The first failure starts the window the long way.
    assert!(store.fold(jt, &one, T0).is_none());
    store.report(jt, &one, T0, None).await.unwrap();

    let written = |f: &sqs_triage::effects::breaker_store::FoldedReport| {
        let statement = f.statement.clone();
        let ledger = &ledger;
        async move {
            let Batched { extras, .. } = ledger.write_batch(&[], &[], &[statement], None).await;
            extras.into_iter().next().unwrap()
        }
    };

    // Written in the batch: one call, no UpdateItem.
    proxy.reset_counts();
    let f = store
        .fold(jt, &one, T0 + 1)
        .expect("a counting window below the threshold");
    let w = written(&f).await;
    assert!(matches!(w, Written::Done), "{w:?}");
    let s = store
        .complete_folded(jt, f, w, &one, T0 + 1, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.phase, s.failures), (Phase::Closed, 2));
    assert_eq!(
        proxy.counts(),
        BTreeMap::from([("BatchExecuteStatement".to_owned(), 1)])
    );
    assert_eq!(other.read(jt).await.unwrap().failures, 2);

    // The call landed and its answer was lost: the retry is refused by the token, and the
    // read shows this write's own token. Counted once.
    proxy.add_rule(FaultRule {
        ops: Some(vec!["BatchExecuteStatement".into()]),
        body_contains: None,
        fault: Fault::LostAnswer,
        times: Some(1),
    });
    let f = store.fold(jt, &one, T0 + 2).unwrap();
    let w = written(&f).await;
    assert!(matches!(w, Written::Refused), "{w:?}");
    let s = store
        .complete_folded(jt, f, w, &one, T0 + 2, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.phase, s.failures), (Phase::Closed, 3));
    assert_eq!(other.read(jt).await.unwrap().failures, 3, "counted once");

    // The batched call fails for good (the retry policy gives up): the report is sent on
    // its own.
    proxy.fail_always("BatchExecuteStatement", Fault::Status503);
    let f = store.fold(jt, &one, T0 + 3).unwrap();
    let w = written(&f).await;
    assert!(matches!(w, Written::Failed(_)), "{w:?}");
    let s = store
        .complete_folded(jt, f, w, &one, T0 + 3, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.phase, s.failures), (Phase::Closed, 4));
    proxy.clear_faults();

    // Another environment's failure takes the window to 5; this one still knows 4, so its
    // statement (5 + 1 would reach 6) is refused and the report, made the long way, opens it:
    // the refused statement, one read, one write.
    other.report(jt, &one, T0 + 4, None).await.unwrap();
    let f = store.fold(jt, &one, T0 + 5).expect("the cache still says 4");
    proxy.reset_counts();
    let w = written(&f).await;
    assert!(matches!(w, Written::Refused), "{w:?}");
    let s = store
        .complete_folded(jt, f, w, &one, T0 + 5, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.phase, Phase::Open, "{s:?}");
    assert_eq!(
        proxy.counts(),
        BTreeMap::from([
            ("BatchExecuteStatement".to_owned(), 1),
            ("GetItem".to_owned(), 1),
            ("PutItem".to_owned(), 1)
        ])
    );
    assert_eq!(other.read(jt).await.unwrap().phase, Phase::Open);
    // Open: nothing more to fold.
    assert!(store.fold(jt, &one, T0 + 6).is_none());

    // An item without a `version` (written by something else) is not folded: `report`'s
    // `ADD version` gives it one, where the statement's `version + 1` could not.
    let jt = "bare";
    client
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S(format!("breaker#{jt}")))
        .item("sk", AttributeValue::S("state".into()))
        .item("phase", AttributeValue::S("closed".into()))
        .item("generation", AttributeValue::N("0".into()))
        .item("window_start", AttributeValue::N(T0.to_string()))
        .item("failures", AttributeValue::N("1".into()))
        .send()
        .await
        .unwrap();
    store.read(jt).await.unwrap();
    assert!(store.fold(jt, &one, T0 + 1).is_none());
    let s = store.report(jt, &one, T0 + 1, None).await.unwrap().unwrap();
    assert_eq!((s.phase, s.failures, s.version), (Phase::Closed, 2, 1));
    delete_table(&client, &table).await.unwrap();
}
