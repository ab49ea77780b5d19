//! The storage retry policy with the real SDK, through the fault-injecting proxy in front of
//! DynamoDB Local.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sqs_triage::effects::ledger::{AttemptLedger, Counted, Delivery};
use sqs_triage::effects::storage_retry::{Stop, StorageRetry, StorageRetryConfig};
use sqs_triage::effects::table::{create_table, delete_table};
use support::fault_proxy::{Fault, FaultPlan};

fn policy(capacity: u32) -> StorageRetry {
    StorageRetry::new(StorageRetryConfig {
        base: Duration::from_millis(2),
        throttle_base: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        budget_capacity: capacity,
        ..StorageRetryConfig::default()
    })
    .unwrap()
}

fn all_kinds() -> Vec<Fault> {
    vec![
        Fault::Throttle,
        Fault::ThrottlingException,
        Fault::Status500,
        Fault::Status503,
        Fault::Reset,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn ledger_is_exact_through_a_share_of_faults_and_retries_stay_in_budget() {
    let (proxy, client) = support::ddb_via_proxy().await;
    let table = support::unique_name("retry");
    create_table(&client, &table).await.unwrap();
    let retry = policy(400);
    let ledger = Arc::new(AttemptLedger::new(client.clone(), &table, retry.clone()));
    proxy.set_faults(FaultPlan {
        share: 0.3,
        kinds: all_kinds(),
        only_ops: None,
        spare_body_containing: None,
        seed: 42,
    });
    let tasks: Vec<_> = (1..=32u32)
        .map(|rc| {
            let l = ledger.clone();
            tokio::spawn(async move {
                l.count(
                    "t",
                    "job",
                    Delivery {
                        message_id: "m",
                        receive_count: rc,
                    },
                    None,
                    "e",
                    None,
                )
                .await
            })
        })
        .collect();
    // A retried write whose first try landed reports AlreadyCounted: the count is exact
    // either way. Each count that says New holds its own number of executions.
    let mut numbers = Vec::new();
    for t in tasks {
        if let Counted::New(n) = t.await.unwrap().expect("counted despite faults") {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    let distinct = numbers.len();
    numbers.dedup();
    assert_eq!(
        numbers.len(),
        distinct,
        "two counts saw the same number: {numbers:?}"
    );
    assert!(numbers.iter().all(|n| (1..=32).contains(n)), "{numbers:?}");
    let ids: Vec<(String, String)> = (0..120)
        .map(|i| ("t".to_owned(), format!("x{i}")))
        .chain([("t".to_owned(), "job".to_owned())])
        .collect();
    let got = ledger.read_many(&ids, None).await.expect("read despite faults");
    assert_eq!(
        got[&("t".to_owned(), "job".to_owned())].attempts,
        32,
        "each delivery counted exactly once"
    );
    ledger
        .forget([("t", "job")], None)
        .await
        .expect("forget despite faults");

    let stats = retry.stats();
    assert!(proxy.faults_injected() > 0);
    assert!(stats.retries > 0, "{stats:?}");
    // Retries are bounded by the budget: its capacity plus what successes earned back.
    let successes = proxy.total() - proxy.faults_injected();
    assert!(stats.retries <= 400 + successes / 5 + 1, "{stats:?}");
    proxy.clear_faults();
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_faults_fail_after_bounded_retries_with_a_clear_error() {
    let (proxy, client) = support::ddb_via_proxy().await;
    let table = support::unique_name("retry");
    create_table(&client, &table).await.unwrap();
    for fault in all_kinds() {
        let retry = policy(100);
        let ledger = AttemptLedger::new(client.clone(), &table, retry.clone());
        proxy.reset_counts();
        proxy.fail_always("UpdateItem", fault.clone());
        let err = ledger
            .count(
                "t",
                "job",
                Delivery {
                    message_id: "m",
                    receive_count: 1,
                },
                None,
                "e",
                None,
            )
            .await
            .unwrap_err();
        proxy.clear_faults();
        assert_eq!(err.stop, Stop::AttemptsExhausted, "{fault:?}: {err}");
        assert_eq!(proxy.count("UpdateItem"), 8, "{fault:?}: max attempts");
        let text = err.to_string();
        assert!(text.starts_with("UpdateItem on `"), "{text}");
        assert!(text.contains("gave up after 8 attempts"), "{text}");
        assert!(!text.contains('\n'));
    }

    // A small budget stops a storm across calls: after it is spent, calls fail at once.
    let retry = policy(3);
    let ledger = AttemptLedger::new(client.clone(), &table, retry.clone());
    proxy.reset_counts();
    proxy.fail_always("GetItem", Fault::Status503);
    let e1 = ledger.show("t", "a").await.unwrap_err();
    let e2 = ledger.show("t", "b").await.unwrap_err();
    proxy.clear_faults();
    assert_eq!((e1.stop, e2.stop), (Stop::BudgetEmpty, Stop::BudgetEmpty));
    assert_eq!(proxy.count("GetItem"), 5, "3 retries in all, then one call each");
    assert_eq!(retry.stats().retries, 3);
    assert_eq!(retry.stats().budget_refusals, 2);
    assert!(e2.to_string().contains("retry budget empty"), "{e2}");
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test]
async fn missing_table_surfaces_at_once_with_what_to_do() {
    let (proxy, client) = support::ddb_via_proxy().await;
    let ledger = AttemptLedger::new(client, "no-such-table", policy(100));
    let err = ledger
        .count(
            "t",
            "job",
            Delivery {
                message_id: "m",
                receive_count: 2,
            },
            None,
            "e",
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(proxy.count("UpdateItem"), 1, "not retried");
    assert_eq!(err.stop, Stop::Permanent);
    assert_eq!(
        err.to_string(),
        "DynamoDB table `no-such-table` does not exist (ResourceNotFoundException)"
    );
    let err = ledger
        .read_many([("t", "a"), ("t", "b")], None)
        .await
        .unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(proxy.count("BatchGetItem"), 1);
}
