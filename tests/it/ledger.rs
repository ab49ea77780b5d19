//! The attempt ledger against DynamoDB Local, with the real SDK.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sqs_triage::effects::ledger::{AttemptLedger, Batched, Count, Counted, Delivery, Waiting};
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client, dynamodb_config};
use sqs_triage::effects::table::{create_table, delete_table};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};

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

fn count<'a>(job_id: &'a str, message_id: &'a str, receive_count: u32, exists: bool) -> Count<'a> {
    Count {
        job_type: "t",
        job_id,
        delivery: Delivery {
            message_id,
            receive_count,
        },
        next_attempt_at_ms: None,
        waiting: None,
        last_error: "e",
        exists,
        clear_marker: None,
    }
}

/// Counts a first execution of job `job_id` of type `t`, delivered as message `message_id`.
async fn seed(ledger: &AttemptLedger, job_id: &str, message_id: &str) {
    let delivery = Delivery {
        message_id,
        receive_count: 1,
    };
    ledger
        .count("t", job_id, delivery, None, "e", None)
        .await
        .unwrap();
}

/// Writes a batch of counts and deletes, every one of which must be written.
async fn write_all(ledger: &AttemptLedger, counts: &[Count<'_>], forget: &[(String, String)]) {
    let Batched {
        counts: results,
        forgotten,
        ..
    } = ledger.write_batch(counts, forget, &[], None).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    forgotten.unwrap();
}

async fn attempts(ledger: &AttemptLedger, job_id: &str) -> Option<u32> {
    ledger.show("t", job_id).await.unwrap().map(|i| i.attempts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_invocations_counts_and_deletes_are_one_call_and_exact_whatever_the_guess() {
    let (proxy, client) = support::ddb_via_proxy().await;
    let (ledger, table) = ledger_on(client.clone()).await;
    for (id, m) in [("old", "m0"), ("old2", "m2"), ("gone", "m3")] {
        ledger
            .count(
                "t",
                id,
                Delivery {
                    message_id: m,
                    receive_count: 1,
                },
                Some(5),
                "e",
                None,
            )
            .await
            .unwrap();
    }
    let mut retry = count("n1", "m1", 1, false);
    retry.next_attempt_at_ms = Some(777);
    retry.waiting = Some(Waiting {
        receipt_handle: "rh-1",
        queue_url: "http://q",
    });
    let counts = [
        retry,
        // Read and found: an UPDATE, which also clears the earlier retry's fields.
        count("old", "m0", 2, true),
        // Guessed absent but there: the INSERT is refused and written again singly.
        count("old2", "m2", 2, false),
        // Guessed present but missing: the UPDATE is refused and written again singly.
        count("ghost", "m4", 2, true),
        // A second message of a job already in the call: one statement per item.
        count("n1", "m9", 1, false),
    ];
    let forget = [
        ("t".to_owned(), "gone".to_owned()),
        // Counted in the same call: its item stays.
        ("t".to_owned(), "n1".to_owned()),
    ];
    proxy.reset_counts();
    write_all(&ledger, &counts, &forget).await;
    assert_eq!(proxy.count("BatchExecuteStatement"), 1, "{:?}", proxy.counts());
    assert_eq!(proxy.count("UpdateItem"), 3, "{:?}", proxy.counts());
    assert_eq!(proxy.count("BatchWriteItem"), 0);
    assert_eq!(attempts(&ledger, "n1").await, Some(2));
    assert_eq!(attempts(&ledger, "old").await, Some(2));
    assert_eq!(attempts(&ledger, "old2").await, Some(2));
    assert_eq!(attempts(&ledger, "ghost").await, Some(1));
    assert_eq!(attempts(&ledger, "gone").await, None, "deleted");
    let n1 = ledger.show("t", "n1").await.unwrap().unwrap();
    assert_eq!(n1.deliveries, vec!["m1#1".to_owned(), "m9#1".to_owned()]);
    assert_eq!(n1.job_id, "n1");
    let old = ledger.show("t", "old").await.unwrap().unwrap();
    assert_eq!(old.next_attempt_at_ms, None, "a count without a retry removes it");
    assert_eq!(old.last_receive_count, Some(2));
    assert_eq!(old.last_error.as_deref(), Some("e"));
    assert!(old.expires_at_s.is_some());

    // The whole invocation again (a duplicate delivery of the batch): nothing counts twice,
    // whichever statement each count takes.
    let Batched { counts: results, .. } = ledger.write_batch(&counts, &[], &[], None).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for (id, want) in [("n1", 2), ("old", 2), ("old2", 2), ("ghost", 1)] {
        assert_eq!(attempts(&ledger, id).await, Some(want), "{id}");
    }

    // 60 counts: three calls of at most 25 statements.
    let ids: Vec<String> = (0..60).map(|i| format!("bulk{i}")).collect();
    let bulk: Vec<Count<'_>> = ids.iter().map(|id| count(id, "m", 1, false)).collect();
    proxy.reset_counts();
    let Batched { counts: results, .. } = ledger.write_batch(&bulk, &[], &[], None).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(proxy.count("BatchExecuteStatement"), 3, "{:?}", proxy.counts());
    assert_eq!(proxy.total(), 3);
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_answer_was_lost_or_throttled_counts_each_execution_once() {
    let (proxy, client) = support::ddb_via_proxy().await;
    let (ledger, table) = ledger_on(client.clone()).await;
    let ids: Vec<String> = (0..30).map(|i| format!("j{i}")).collect();
    for id in ids.iter().step_by(2) {
        seed(&ledger, id, "m").await;
    }
    // Even jobs were read and have an item; odd ones are first executions.
    let counts: Vec<Count<'_>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| count(id, "m", 2, i % 2 == 0))
        .collect();
    for (round, fault) in [
        // The statements ran, the answer never came: the retry's statements are refused and
        // each count is settled singly by its condition.
        Fault::LostAnswer,
        // Every statement throttled: sent again.
        Fault::Body {
            status: 200,
            body: serde_json::json!({
                "Responses": (0..25).map(|_| serde_json::json!({"Error": {"Code": "ThrottlingError", "Message": "slow down"}})).collect::<Vec<_>>()
            })
            .to_string(),
        },
        // An answer listing no statement: all sent again.
        Fault::Body {
            status: 200,
            body: "{}".into(),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let name = fault.kind_name();
        proxy.add_rule(FaultRule {
            ops: Some(vec!["BatchExecuteStatement".into()]),
            body_contains: None,
            fault,
            times: Some(1),
        });
        let delivery = round as u32 + 2;
        let counts: Vec<Count<'_>> = counts
            .iter()
            .map(|c| Count {
                delivery: Delivery {
                    message_id: "m",
                    receive_count: delivery,
                },
                exists: c.exists || delivery > 2,
                ..*c
            })
            .collect();
        let Batched { counts: results, .. } = ledger.write_batch(&counts, &[], &[], None).await;
        assert!(results.iter().all(Result::is_ok), "{name}: {results:?}");
        for (i, id) in ids.iter().enumerate() {
            let want = delivery - 1 + u32::from(i % 2 == 0);
            assert_eq!(attempts(&ledger, id).await, Some(want), "{name}: {id}");
        }
    }
    assert_eq!(proxy.faults_injected(), 3, "{:?}", proxy.faults());
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_without_partiql_still_counts_and_deletes_through_the_single_item_calls() {
    let (proxy, client) = support::ddb_via_proxy().await;
    let (ledger, table) = ledger_on(client.clone()).await;
    seed(&ledger, "done", "m").await;
    // A stack deployed before its role had the PartiQL actions: every call refused.
    proxy.fail_always(
        "BatchExecuteStatement",
        Fault::Error {
            status: 400,
            code: "AccessDeniedException".into(),
        },
    );
    let counts = [count("a", "m", 1, false), count("b", "m", 2, true)];
    let forget = [("t".to_owned(), "done".to_owned())];
    write_all(&ledger, &counts, &forget).await;
    assert_eq!(attempts(&ledger, "a").await, Some(1));
    assert_eq!(attempts(&ledger, "b").await, Some(1));
    assert_eq!(attempts(&ledger, "done").await, None, "deleted");
    assert_eq!(proxy.count("UpdateItem"), 3, "{:?}", proxy.counts());
    assert_eq!(proxy.count("BatchWriteItem"), 1, "{:?}", proxy.counts());

    // Counts only: a refused call is no cleanup failure.
    let Batched {
        counts: results,
        forgotten,
        ..
    } = ledger
        .write_batch(&[count("c", "m", 1, false)], &[], &[], None)
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    forgotten.unwrap();
    proxy.clear_faults();
    delete_table(&client, &table).await.unwrap();
}

/// A count that clears a lived-out completion marker clears that marker only: a fresh one that
/// a concurrent duplicate wrote after the read stays, on the single-item and the batched write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_clears_the_marker_it_saw_not_a_fresh_one_written_since() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    let key = |id: &str| ("t".to_owned(), id.to_owned());
    for id in ["single", "batched"] {
        // A marker with no lifetime has lived out as soon as it is written.
        ledger
            .forget_and_mark_done(
                Vec::<(String, String)>::new(),
                vec![(key(id), Duration::ZERO)],
                None,
            )
            .await
            .unwrap();
        let seen = ledger.show("t", id).await.unwrap().unwrap();
        let facts = seen.facts(sqs_triage::clock::now_ms());
        assert!(
            facts.lived_out_marker.is_some() && facts.done_at_ms.is_none(),
            "{facts:?}"
        );
        // A duplicate of the job succeeds meanwhile: a fresh marker.
        ledger
            .forget_and_mark_done(
                Vec::<(String, String)>::new(),
                vec![(key(id), Duration::from_secs(3600))],
                None,
            )
            .await
            .unwrap();
        let fresh = ledger.show("t", id).await.unwrap().unwrap();
        assert!(fresh.marker_lives(sqs_triage::clock::now_ms()));
        // The delivery that read the lived-out marker is counted, and asks to clear it.
        let delivery = Delivery {
            message_id: "m",
            receive_count: 2,
        };
        if id == "single" {
            let counted = ledger
                .count_waiting(
                    "t",
                    id,
                    delivery,
                    Some(1),
                    None,
                    "e",
                    facts.lived_out_marker,
                    None,
                )
                .await
                .unwrap();
            assert_eq!(counted, Counted::New(1));
        } else {
            let c = Count {
                delivery,
                next_attempt_at_ms: Some(1),
                clear_marker: facts.lived_out_marker,
                ..count(id, "m", 2, true)
            };
            write_all(&ledger, &[c], &[]).await;
        }
        let after = ledger.show("t", id).await.unwrap().unwrap();
        assert_eq!(after.attempts, 1, "{after:?}");
        assert_eq!(
            (after.done_at_ms, after.done_until_ms),
            (fresh.done_at_ms, fresh.done_until_ms),
            "{id}: the fresh marker was cleared: {after:?}"
        );
    }
    delete_table(&client, &table).await.unwrap();
}

/// DynamoDB's cost of the ledger's calls, as the environment's call counter sums it: units read
/// from each answer, and computed by the published rules where DynamoDB Local answers none (a
/// PartiQL batch, a refused conditional write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ledger_call_is_costed_in_units_and_a_refused_count_still_costs_one() {
    use sqs_triage::effects::calls::{CallCounter, Units};
    let counter = CallCounter::new();
    let conf = dynamodb_config(&support::sdk_config().await)
        .interceptor(counter.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(conf);
    let (ledger, table) = ledger_on(client.clone()).await;
    counter.reset();

    // A first execution counted in the invocation's batch: one INSERT statement.
    let Batched { counts: results, .. } = ledger
        .write_batch(&[count("a", "m", 1, false)], &[], &[], None)
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // A single count, then the same delivery again: the condition refuses it.
    let delivery = Delivery {
        message_id: "m",
        receive_count: 1,
    };
    let first = ledger.count("t", "b", delivery, None, "e", None).await.unwrap();
    assert!(matches!(first, Counted::New(1)), "{first:?}");
    let again = ledger.count("t", "b", delivery, None, "e", None).await.unwrap();
    assert!(matches!(again, Counted::AlreadyCounted), "{again:?}");
    // One consistent read of both items, and of one that does not exist.
    let read = ledger
        .read_many([("t", "a"), ("t", "b"), ("t", "none")], None)
        .await
        .unwrap();
    assert_eq!(read.len(), 2);

    let units = counter.units();
    let of = |op: &str| units.get(&format!("DynamoDB.{op}")).copied().unwrap_or_default();
    assert_eq!(
        of("BatchExecuteStatement"),
        Units {
            read: 0.0,
            write: 1.0,
            computed: 1.0
        },
        "{units:?}"
    );
    assert_eq!(
        of("UpdateItem"),
        Units {
            read: 0.0,
            write: 2.0,
            computed: 1.0
        },
        "one answered, the refused one computed: {units:?}"
    );
    assert_eq!(
        of("BatchGetItem"),
        Units {
            read: 2.0,
            write: 0.0,
            computed: 0.0
        },
        "{units:?}"
    );
    assert_eq!(units.len(), 3, "{units:?}");
    delete_table(&client, &table).await.unwrap();
}
