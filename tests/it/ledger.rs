//! The attempt ledger against DynamoDB Local, with the real SDK.

use crate::support;

use std::sync::Arc;

use sqs_triage::effects::ledger::{AttemptLedger, Counted, Delivery};
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client, dynamodb_config};
use sqs_triage::effects::table::{create_table, delete_table};
use support::fault_proxy::FaultProxy;

async fn ledger_on(client: aws_sdk_dynamodb::Client) -> (AttemptLedger, String) {
    let table = support::unique_name("ledger");
    create_table(&client, &table).await.expect("create table");
    create_table(&client, &table)
        .await
        .expect("create table is idempotent");
    (AttemptLedger::new(client, &table, StorageRetry::default()), table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn same_delivery_counted_once_under_32_racers() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    let ledger = Arc::new(ledger);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let l = ledger.clone();
            tokio::spawn(async move {
                l.count(
                    "email",
                    "job-a",
                    Delivery {
                        message_id: "m",
                        receive_count: 2,
                    },
                    Some(123),
                    "timeout",
                    None,
                )
                .await
            })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Counted::New(n) => {
                assert_eq!(n, 1);
                new += 1;
            }
            Counted::AlreadyCounted => {}
        }
    }
    assert_eq!(new, 1, "exactly one racer counts the delivery");
    let item = ledger.show("email", "job-a").await.unwrap().expect("item");
    assert_eq!(item.attempts, 1);
    assert_eq!(item.next_attempt_at_ms, Some(123));
    assert_eq!(item.job_type.as_deref(), Some("email"));
    assert_eq!(item.last_error.as_deref(), Some("timeout"));
    assert!(item.expires_at_s.is_some());
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn distinct_deliveries_each_counted_once_in_any_order() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    let ledger = Arc::new(ledger);
    let tasks: Vec<_> = (1..=32u32)
        .rev()
        .map(|rc| {
            let l = ledger.clone();
            tokio::spawn(async move {
                l.count(
                    "email",
                    "job-b",
                    Delivery {
                        message_id: "m",
                        receive_count: rc,
                    },
                    None,
                    "boom",
                    None,
                )
                .await
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Counted::New(n) => seen.push(n),
            Counted::AlreadyCounted => panic!("a distinct delivery was dropped"),
        }
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=32).collect::<Vec<_>>(),
        "ADD gives each racer its own count"
    );
    let item = ledger.show("email", "job-b").await.unwrap().unwrap();
    assert_eq!(item.attempts, 32);
    assert_eq!(item.deliveries.len(), 32);
    assert_eq!(item.next_attempt_at_ms, None);
    // A repeat of an old delivery is still recognised.
    assert_eq!(
        ledger
            .count(
                "email",
                "job-b",
                Delivery {
                    message_id: "m",
                    receive_count: 7
                },
                None,
                "boom",
                None
            )
            .await
            .unwrap(),
        Counted::AlreadyCounted
    );
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_many_is_one_batch_get_per_100_ids_and_close_reset_work() {
    let conf = support::sdk_config().await;
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let client =
        aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&conf).endpoint_url(proxy.url()).build());
    let (ledger, table) = ledger_on(client.clone()).await;
    for i in 0..150u32 {
        if i % 2 == 0 {
            ledger
                .count(
                    "t",
                    &format!("j{i}"),
                    Delivery {
                        message_id: "m",
                        receive_count: 2,
                    },
                    Some(u64::from(i)),
                    "e",
                    None,
                )
                .await
                .unwrap();
        }
    }
    let key = |i: u32| ("t".to_owned(), format!("j{i}"));
    let mut ids: Vec<(String, String)> = (0..150).map(key).collect();
    ids.extend((0..20).map(key)); // duplicates are read once
    proxy.reset_counts();
    let got = ledger.read_many(&ids, None).await.unwrap();
    assert_eq!(proxy.count("BatchGetItem"), 2, "150 distinct ids: two calls");
    assert_eq!(got.len(), 75);
    assert_eq!(got[&key(4)].attempts, 1);
    assert_eq!(got[&key(4)].next_attempt_at_ms, Some(4));
    assert!(!got.contains_key(&key(5)));

    proxy.reset_counts();
    let evens: Vec<(String, String)> = (0..150).step_by(2).map(key).collect();
    ledger.forget(&evens[..60], None).await.unwrap();
    assert_eq!(
        proxy.count("BatchWriteItem"),
        3,
        "60 deletes: three calls of at most 25"
    );
    let got = ledger.read_many(&ids, None).await.unwrap();
    assert_eq!(got.len(), 15);

    // Replay: forgetting gives the job a fresh ledger, so delivery 2 counts again as attempt 1.
    ledger.forget([("t", "j140")], None).await.unwrap();
    assert!(ledger.show("t", "j140").await.unwrap().is_none());
    assert_eq!(
        ledger
            .count(
                "t",
                "j140",
                Delivery {
                    message_id: "m",
                    receive_count: 2
                },
                None,
                "e",
                None
            )
            .await
            .unwrap(),
        Counted::New(1)
    );
    assert!(
        ledger
            .read_many(Vec::<(String, String)>::new(), None)
            .await
            .unwrap()
            .is_empty()
    );
    delete_table(&client, &table).await.unwrap();
}
