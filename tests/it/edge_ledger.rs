//! Edges of the attempt ledger's keys, on DynamoDB Local through the real SDK: ids whose
//! bytes exceed DynamoDB's key limits, and job types that share an id.

use crate::support;

use aws_sdk_dynamodb::types::AttributeValue;
use sqs_triage::core::envelope::{MAX_JOB_ID_LEN, MAX_JOB_TYPE_LEN};
use sqs_triage::effects::ledger::{AttemptLedger, Counted, Delivery, JobKey};
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};
use sqs_triage::effects::table::{
    LEDGER_PK_PREFIX, LEDGER_SK_PREFIX, PK_MAX_BYTES, SK_MAX_BYTES, create_table, delete_table,
};

async fn ledger_on(client: aws_sdk_dynamodb::Client) -> (AttemptLedger, String) {
    let table = support::unique_name("edgeledger");
    create_table(&client, &table).await.expect("create table");
    (AttemptLedger::new(client, &table, StorageRetry::default()), table)
}

fn delivery(message_id: &str, receive_count: u32) -> Delivery<'_> {
    Delivery {
        message_id,
        receive_count,
    }
}

fn job(job_type: &str, job_id: &str) -> JobKey {
    (job_type.to_owned(), job_id.to_owned())
}

/// 512 crabs: the longest id the envelope accepts, 2,048 bytes of UTF-8.
fn emoji_id() -> String {
    "🦀".repeat(512)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_id_of_512_emoji_is_counted_and_read_beside_ordinary_ids() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    let long = emoji_id();
    assert_eq!(long.len(), 2048);
    for (id, times) in [("o1", 1u32), ("o2", 2), (long.as_str(), 3)] {
        for rc in 1..=times {
            let c = ledger
                .count("email", id, delivery("m", rc), None, "boom", None)
                .await
                .unwrap_or_else(|e| panic!("count of a {}-byte id: {e}", id.len()));
            assert_eq!(c, Counted::New(rc));
        }
    }
    // The same delivery again is still recognised under the digest key.
    assert_eq!(
        ledger
            .count("email", &long, delivery("m", 2), None, "boom", None)
            .await
            .unwrap(),
        Counted::AlreadyCounted
    );
    let got = ledger
        .read_many(
            [
                ("email", long.as_str()),
                ("email", "o1"),
                ("email", "o2"),
                ("email", "o3"),
            ],
            None,
        )
        .await
        .expect("one long id must not fail the batch");
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[&job("email", "o1")].attempts, 1);
    assert_eq!(got[&job("email", "o2")].attempts, 2);
    assert_eq!(got[&job("email", &long)].attempts, 3);
    // The item carries the full id and type; the CLI's reads find it by either route.
    let shown = ledger.show("email", &long).await.unwrap().expect("item");
    assert_eq!(shown.job_id, long);
    assert_eq!(shown.attempts, 3);
    let all = ledger.show_all_types(&long).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].job_type.as_deref(), Some("email"));
    assert_eq!(all[0].job_id, long);
    // And it can be forgotten like any other.
    ledger.forget([("email", long.as_str())], None).await.unwrap();
    assert!(ledger.show("email", &long).await.unwrap().is_none());
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn longest_type_and_id_in_four_byte_characters_round_trip() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    let ty = "🦀".repeat(MAX_JOB_TYPE_LEN);
    let id = "🦀".repeat(MAX_JOB_ID_LEN);
    // Exactly at DynamoDB's limits verbatim, and one byte over (digested).
    let pk_exact = "p".repeat(PK_MAX_BYTES - LEDGER_PK_PREFIX.len());
    let sk_exact = "s".repeat(SK_MAX_BYTES - LEDGER_SK_PREFIX.len());
    let pk_over = format!("{pk_exact}p");
    let sk_over = format!("{sk_exact}s");
    let jobs = [
        (ty.clone(), id.clone()),
        (ty.clone(), "short".to_owned()),
        ("short".to_owned(), id.clone()),
        (sk_exact.clone(), pk_exact.clone()),
        (sk_over.clone(), pk_over.clone()),
        (sk_exact.clone(), pk_over.clone()),
    ];
    for (i, (t, j)) in jobs.iter().enumerate() {
        for rc in 1..=(i as u32 + 1) {
            ledger
                .count(t, j, delivery("m", rc), Some(u64::from(rc)), "e", None)
                .await
                .unwrap_or_else(|e| panic!("{} / {} bytes: {e}", t.len(), j.len()));
        }
    }
    let got = ledger.read_many(&jobs, None).await.unwrap();
    assert_eq!(got.len(), jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(
            got[j].attempts,
            i as u32 + 1,
            "{} / {} bytes",
            j.0.len(),
            j.1.len()
        );
        assert_eq!(got[j].next_attempt_at_ms, Some(i as u64 + 1));
    }
    let shown = ledger.show(&ty, &id).await.unwrap().unwrap();
    assert_eq!(
        (shown.job_type.as_deref(), shown.job_id.as_str()),
        (Some(ty.as_str()), id.as_str())
    );
    ledger.forget(&jobs[..3], None).await.unwrap();
    let got = ledger.read_many(&jobs, None).await.unwrap();
    assert_eq!(got.len(), 3);
    assert!(!got.contains_key(&jobs[0]));
    ledger.forget([(&sk_over, &pk_over)], None).await.unwrap();
    assert!(ledger.show(&sk_over, &pk_over).await.unwrap().is_none());
    assert!(ledger.show(&sk_exact, &pk_over).await.unwrap().is_some());
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_job_types_sharing_an_id_keep_separate_ledgers() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    for rc in [2, 3] {
        ledger
            .count(
                "billing.charge",
                "order-42",
                delivery("a", rc),
                Some(5),
                "card",
                None,
            )
            .await
            .unwrap();
    }
    let c = ledger
        .count("email.send", "order-42", delivery("b", 2), None, "smtp", None)
        .await
        .unwrap();
    assert_eq!(c, Counted::New(1), "email.send's first attempt of order-42");

    let both = [("billing.charge", "order-42"), ("email.send", "order-42")];
    let got = ledger.read_many(both, None).await.unwrap();
    assert_eq!(got[&job("billing.charge", "order-42")].attempts, 2);
    assert_eq!(
        got[&job("billing.charge", "order-42")].next_attempt_at_ms,
        Some(5)
    );
    assert_eq!(got[&job("email.send", "order-42")].attempts, 1);
    assert_eq!(got[&job("email.send", "order-42")].next_attempt_at_ms, None);
    let email = ledger.show("email.send", "order-42").await.unwrap().unwrap();
    assert_eq!(email.last_error.as_deref(), Some("smtp"));
    assert_eq!(ledger.show_all_types("order-42").await.unwrap().len(), 2);

    ledger
        .forget([("billing.charge", "order-42")], None)
        .await
        .unwrap();
    let got = ledger.read_many(both, None).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[&job("email.send", "order-42")].attempts,
        1,
        "the other type's ledger stays"
    );
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn type_and_id_splits_never_collide() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    // Job types may hold any character, the separator included.
    let jobs = [
        ("a#b", "c"),
        ("a", "b#c"),
        ("a#b#c", "x"),
        ("a", "b#c#x"),
        ("ledger", "x"),
        ("x", "ledger#x"),
        ("sha256", "x"),
    ];
    for (i, (t, id)) in jobs.iter().enumerate() {
        for rc in 1..=(i as u32 + 1) {
            ledger
                .count(t, id, delivery("m", rc), None, "e", None)
                .await
                .unwrap();
        }
    }
    let got = ledger.read_many(jobs, None).await.unwrap();
    assert_eq!(got.len(), jobs.len());
    for (i, (t, id)) in jobs.iter().enumerate() {
        assert_eq!(got[&job(t, id)].attempts, i as u32 + 1, "{t} / {id}");
    }
    delete_table(&client, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn items_of_the_earlier_layout_are_not_read() {
    let client = dynamodb_client(&support::sdk_config().await);
    let (ledger, table) = ledger_on(client.clone()).await;
    // What an earlier version wrote: keyed by the id alone.
    client
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("job#order-7".into()))
        .item("sk", AttributeValue::S("ledger".into()))
        .item("attempts", AttributeValue::N("4".into()))
        .item("job_type", AttributeValue::S("billing.charge".into()))
        .send()
        .await
        .unwrap();
    let got = ledger
        .read_many([("billing.charge", "order-7")], None)
        .await
        .unwrap();
    assert!(got.is_empty(), "{got:?}");
    assert!(ledger.show_all_types("order-7").await.unwrap().is_empty());
    let c = ledger
        .count("billing.charge", "order-7", delivery("m", 2), None, "e", None)
        .await
        .unwrap();
    assert_eq!(c, Counted::New(1));
    delete_table(&client, &table).await.unwrap();
}

mod pipeline {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use aws_sdk_sqs::types::Message;
    use serde_json::json;
    use sqs_triage::effects::ledger::AttemptLedger;
    use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};

    use super::support;
    use super::support::pipeline::{Harness, Options, RECORDED};
    use super::{delivery, emoji_id};

    /// Receives until every message of `ids` (job ids) has been received once.
    async fn receive_all(h: &Harness, want: usize) -> Vec<Message> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let start = Instant::now();
        while out.len() < want {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "only {} received",
                out.len()
            );
            for m in h.receive(&h.queue_url, Duration::from_secs(1)).await {
                if seen.insert(m.message_id().unwrap().to_owned()) {
                    out.push(m);
                }
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_512_emoji_id_does_not_make_its_batch_fall_back() {
        let h = Harness::build(Options {
            prefix: "emoji",
            ..Options::default()
        })
        .await;
        let long = emoji_id();
        let ordinary: Vec<String> = (0..9).map(|i| format!("ord-{i}")).collect();
        let mut jobs: Vec<(&str, serde_json::Value)> = ordinary
            .iter()
            .map(|id| (id.as_str(), json!({"outcome": "ok"})))
            .collect();
        jobs.push((long.as_str(), json!({"outcome": "transient", "fail_times": 1})));
        h.send_jobs(&jobs).await;

        // Every ordinary job already has two counted executions (earlier messages of it).
        let ledger = AttemptLedger::new(
            dynamodb_client(&support::sdk_config().await),
            &h.table,
            StorageRetry::default(),
        );
        for id in &ordinary {
            for rc in 1..=2 {
                ledger
                    .count(RECORDED, id, delivery("earlier", rc), None, "boom", None)
                    .await
                    .unwrap();
            }
        }

        // A consumer receives all ten and crashes before running anything: the next delivery
        // is a redelivery (receive count 2) whose ledger must be read.
        h.release(&h.queue_url, &receive_all(&h, 10).await).await;
        let batch = receive_all(&h, 10).await;
        let response = h.invoke_with(&batch, Duration::from_secs(60)).await.unwrap();
        h.delete_settled(&batch, &response).await;
        for id in &ordinary {
            assert_eq!(
                h.executions(id),
                vec![3],
                "{id}: the stored count (2) must be read, not the receive count (fallback: 2)"
            );
        }
        assert_eq!(
            h.executions(&long),
            vec![1],
            "the emoji job has no counted attempt yet"
        );

        // Its failure is counted under its long id, and its retry reads that count back.
        let start = Instant::now();
        while h.executions(&long).len() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the emoji job was not retried"
            );
            h.invoke_once(Duration::from_secs(1)).await;
        }
        assert_eq!(
            h.executions(&long),
            vec![1, 2],
            "exact attempts for the emoji job (the fallback would say 3)"
        );
        let start = Instant::now();
        while h.depth(&h.queue_url).await > 0 {
            assert!(start.elapsed() < Duration::from_secs(60), "queue not drained");
            h.invoke_once(Duration::from_secs(1)).await;
        }
    }
}
