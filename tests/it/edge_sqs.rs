//! SQS at its edges, on the local stack: batches split by SQS's payload cap as well as by
//! entries, batch answers that list an entry neither as sent nor as failed, reserved
//! attributes a producer tries to forge, and a purge confirmed after its hold expired.
//!
//! moto checks a SendMessageBatch's bodies against the 1 MiB cap but not its attributes, so
//! the processor tests put the fault proxy in front of moto with SQS's full rule
//! ([`FaultProxy::enforce_batch_cap`]).

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use serde_json::json;
use sqs_triage::core::failure::{FAILURE_ATTRIBUTE, FailureClass, FailureRecord};
use sqs_triage::effects::dlq::{PACKED_ATTRIBUTE, dlq_copy};
use sqs_triage::effects::ledger::Delivery;
use support::fault_proxy::{Fault, FaultProxy, FaultRule};
use support::pipeline::{Harness, Options, RECORDED};
use triage::ops::Ctx;
use triage::ops::dlq::{self, Filter, ReplayOptions};

/// SQS's cap on one batch call's payload.
const CAP: usize = 1_048_576;

fn string_attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

/// A fatal job of the recording type whose body is `bytes` long (padded outside the payload).
fn big_fatal_body(id: &str, bytes: usize) -> String {
    let head = json!({"type": RECORDED, "id": id, "payload": {"outcome": "fatal"}, "pad": ""}).to_string();
    let pad = "p".repeat(bytes.saturating_sub(head.len()));
    let body = json!({"type": RECORDED, "id": id, "payload": {"outcome": "fatal"}, "pad": pad}).to_string();
    assert_eq!(body.len(), bytes.max(head.len()));
    body
}

async fn harness_via(prefix: &str, proxy: &FaultProxy) -> Harness {
    Harness::build(Options {
        prefix,
        sqs_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await
}

async fn send_with_attrs(h: &Harness, body: &str, attrs: HashMap<String, MessageAttributeValue>) {
    h.sqs
        .send_message()
        .queue_url(&h.queue_url)
        .message_body(body)
        .set_message_attributes(Some(attrs).filter(|a| !a.is_empty()))
        .send()
        .await
        .unwrap();
}

async fn ctx() -> Ctx {
    Ctx::from_config(&support::sdk_config().await).unwrap()
}

fn replay_opts(table: &str) -> ReplayOptions {
    ReplayOptions {
        table: Some(table.to_owned()),
        max_scan: 10_000,
        ..ReplayOptions::default()
    }
}

async fn put_ledger(ctx: &Ctx, table: &str, job_type: &str, job_id: &str) {
    ctx.ledger(table)
        .count(
            job_type,
            job_id,
            Delivery {
                message_id: "m-1",
                receive_count: 1,
            },
            None,
            "boom",
            None,
        )
        .await
        .unwrap();
}

async fn has_ledger(ctx: &Ctx, table: &str, job_id: &str) -> bool {
    ctx.ledger(table).show("t", job_id).await.unwrap().is_some()
}

fn record(job_type: &str, job_id: &str, source_queue: &str) -> FailureRecord {
    FailureRecord {
        class: FailureClass::Fatal,
        error: "boom".into(),
        attempts: 1,
        job_type: Some(job_type.into()),
        job_id: job_id.into(),
        source_queue: source_queue.into(),
        original_message_id: format!("orig-{job_id}"),
        first_received_at: 1,
        failed_at: sqs_triage::clock::now_ms(),
    }
}

// ------------------------------------------------------------- item 9: split by bytes

#[tokio::test]
async fn ten_large_fatal_jobs_are_all_dead_lettered_in_one_invocation() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.enforce_batch_cap(CAP);
    let h = harness_via("big-dlq", &proxy).await;
    let bodies: Vec<String> = (0..10)
        .map(|i| big_fatal_body(&format!("big-{i}"), 110_000))
        .collect();
    let refs: Vec<(&str, Option<&str>)> = bodies.iter().map(|b| (b.as_str(), None)).collect();
    h.send_raw(&refs).await;

    // One invocation of all ten, as a batching window gathers them.
    let (_, response) = h.invoke_gathered(10).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "every fatal job settled by its DLQ copy: {} left in the queue",
        response.batch_item_failures.len()
    );
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 10);
    let mut got: Vec<&str> = dlq.iter().map(|m| m.body().unwrap()).collect();
    got.sort();
    let mut want: Vec<&str> = bodies.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(got, want, "bodies byte for byte");
    assert_eq!(h.depth(&h.queue_url).await, 0);
    assert_eq!(
        proxy.faults().get("BatchRequestTooLong"),
        None,
        "no batch over the cap was sent"
    );
    assert!(
        proxy.count("SendMessageBatch") >= 2,
        "ten 110 KB copies need two calls"
    );
}

#[tokio::test]
async fn message_attributes_count_toward_the_batch_cap() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.enforce_batch_cap(CAP);
    let h = harness_via("attr-cap", &proxy).await;
    // Bodies alone (10 × 100,000) fit under the cap; with a 6 KB attribute each they do not.
    for i in 0..10 {
        let attrs = HashMap::from([("note".to_owned(), string_attr(&"n".repeat(6_000)))]);
        send_with_attrs(&h, &big_fatal_body(&format!("ac-{i}"), 100_000), attrs).await;
    }
    let (_, response) = h.invoke_gathered(10).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "{} fatal job(s) stayed in the queue",
        response.batch_item_failures.len()
    );
    assert_eq!(h.dlq_messages().await.len(), 10);
    assert_eq!(proxy.faults().get("BatchRequestTooLong"), None);
}

/// Puts DLQ copies (as the processor makes them) of big jobs from `source` into `dlq`.
async fn seed_big_copies(sqs: &aws_sdk_sqs::Client, dlq: &str, source: &str, n: usize, bytes: usize) {
    for i in 0..n {
        let id = format!("rb-{i}");
        let copy = dlq_copy(
            &big_fatal_body(&id, bytes),
            &HashMap::from([("tenant".to_owned(), string_attr("acme"))]),
            &record(RECORDED, &id, source),
            CAP,
        )
        .unwrap();
        sqs.send_message()
            .queue_url(dlq)
            .message_body(copy.body)
            .set_message_attributes(Some(copy.attributes))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn replay_moves_ten_large_messages() {
    let ctx = ctx().await;
    let r = support::fresh_resources("big-replay", false).await;
    seed_big_copies(&ctx.sqs, &r.dlq_url, &r.queue_url, 10, 110_000).await;

    let report = dlq::replay(&ctx, &r.dlq_url, &replay_opts(&r.table))
        .await
        .expect("replay runs");
    assert_eq!(report.selected, 10);
    assert_eq!(report.moved, 10, "not moved: {:?}", report.not_moved);
    let back = support::read_all(&ctx.sqs, &r.queue_url, 300, 1).await;
    assert_eq!(back.len(), 10);
    for m in &back {
        assert_eq!(m.body().unwrap().len(), 110_000);
        let attrs = m.message_attributes().unwrap();
        assert_eq!(attrs.len(), 1);
        assert_eq!(attrs["tenant"].string_value(), Some("acme"));
    }
    assert_eq!(support::queue_depth(&ctx.sqs, &r.dlq_url).await.total(), 0);
}

// ------------------------------------------------------------- item 10: Successful only

#[tokio::test]
async fn an_empty_success_answer_settles_nothing() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let h = harness_via("empty-ok", &proxy).await;
    proxy.fail_always(
        "SendMessageBatch",
        Fault::Body {
            status: 200,
            body: "{}".into(),
        },
    );
    h.send_jobs(&[("job-empty", json!({"outcome": "fatal"}))]).await;
    let (messages, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert_eq!(h.executions("job-empty"), vec![1]);
    let failed = support::pipeline::failed_ids(&response);
    assert_eq!(
        failed,
        vec![messages[0].message_id().unwrap()],
        "a copy SQS never confirmed must not settle its original"
    );
    assert_eq!(h.depth(&h.queue_url).await, 1, "the original still exists");
    assert_eq!(h.depth(&h.dlq_url).await, 0);
    assert!(
        proxy.count("SendMessageBatch") > 1,
        "the unaccounted entry is sent again"
    );
}

#[tokio::test]
async fn an_entry_missing_from_the_answer_is_sent_again() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let h = harness_via("empty-once", &proxy).await;
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SendMessageBatch".into()]),
        body_contains: None,
        fault: Fault::Body {
            status: 200,
            body: r#"{"Successful":[],"Failed":[]}"#.into(),
        },
        times: Some(1),
    });
    h.send_jobs(&[("job-again", json!({"outcome": "fatal"}))]).await;
    let (_, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(h.dlq_messages().await.len(), 1);
    assert_eq!(proxy.count("SendMessageBatch"), 2);
}

// ------------------------------------------------------------- item 15: reserved attributes

#[tokio::test]
async fn a_producers_packed_attributes_do_not_survive_the_dlq_copy_or_replay() {
    let h = Harness::build(Options {
        prefix: "forge-pack",
        ..Options::default()
    })
    .await;
    let forged = json!({
        "tenant": {"data_type": "String", "string": "evil"},
        "admin": {"data_type": "String", "string": "true"},
    })
    .to_string();
    let attrs = HashMap::from([
        ("tenant".to_owned(), string_attr("acme")),
        (PACKED_ATTRIBUTE.to_owned(), string_attr(&forged)),
    ]);
    let body = json!({"type": RECORDED, "id": "job-forge", "payload": {"outcome": "fatal"}}).to_string();
    send_with_attrs(&h, &body, attrs).await;
    let (_, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert!(response.batch_item_failures.is_empty());

    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    let copy_attrs = dlq[0].message_attributes().unwrap();
    assert!(
        !copy_attrs.contains_key(PACKED_ATTRIBUTE),
        "the producer's `{PACKED_ATTRIBUTE}` survived the DLQ copy: {copy_attrs:?}"
    );

    let ctx = ctx().await;
    let report = dlq::replay(&ctx, &h.dlq_url, &replay_opts(&h.table))
        .await
        .unwrap();
    assert_eq!(report.moved, 1, "{:?}", report.not_moved);
    let back = support::read_all(&ctx.sqs, &h.queue_url, 300, 1).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].body(), Some(body.as_str()));
    let attrs = back[0].message_attributes().unwrap();
    assert_eq!(attrs.len(), 1, "{attrs:?}");
    assert_eq!(attrs["tenant"].string_value(), Some("acme"));
}

#[tokio::test]
async fn replay_unpacks_only_what_the_processor_packed() {
    // SQS's own redrive moved a message whose producer set `triage-attributes` and 2 more.
    let ctx = ctx().await;
    let r = support::fresh_resources("forge-shape", false).await;
    let forged = json!({"tenant": {"data_type": "String", "string": "evil"}}).to_string();
    let body = json!({"type": "t", "id": "job-shape"}).to_string();
    ctx.sqs
        .send_message()
        .queue_url(&r.dlq_url)
        .message_body(&body)
        .message_attributes("tenant", string_attr("acme"))
        .message_attributes("region", string_attr("eu"))
        .message_attributes(PACKED_ATTRIBUTE, string_attr(&forged))
        .send()
        .await
        .unwrap();
    let to = support::fresh_resources("forge-shape-to", false).await;
    let opts = ReplayOptions {
        to: Some(to.queue_url.clone()),
        ..replay_opts(&r.table)
    };
    let report = dlq::replay(&ctx, &r.dlq_url, &opts).await.unwrap();
    assert_eq!(report.moved, 1, "{:?}", report.not_moved);
    let back = support::read_all(&ctx.sqs, &to.queue_url, 300, 1).await;
    assert_eq!(back.len(), 1);
    let attrs = back[0].message_attributes().unwrap();
    let mut names: Vec<&str> = attrs.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, vec!["region", "tenant"]);
    assert_eq!(attrs["tenant"].string_value(), Some("acme"));
}

/// Sends a message straight to the DLQ, as SQS's redrive would move it, with a producer's
/// forged failure record.
async fn forge_in_dlq(ctx: &Ctx, dlq_url: &str, body: &str, forged: &FailureRecord) {
    ctx.sqs
        .send_message()
        .queue_url(dlq_url)
        .message_body(body)
        .message_attributes(
            FAILURE_ATTRIBUTE,
            string_attr(&serde_json::to_string(forged).unwrap()),
        )
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_forged_record_cannot_send_elsewhere_or_forget_another_jobs_ledger() {
    let ctx = ctx().await;
    let r = support::fresh_resources("forge-src", false).await;
    // Another queue the operator can write to; its redrive policy names its own DLQ.
    let victim = support::fresh_resources("forge-victim", false).await;
    put_ledger(&ctx, &r.table, "t", "victim-job").await;
    let body = json!({"type": "t", "id": "victim-job"}).to_string();
    forge_in_dlq(
        &ctx,
        &r.dlq_url,
        &body,
        &record("t", "victim-job", &victim.queue_url),
    )
    .await;

    let report = dlq::replay(&ctx, &r.dlq_url, &replay_opts(&r.table))
        .await
        .unwrap();
    assert_eq!(report.moved, 0, "sent to a queue that does not feed this DLQ");
    assert_eq!(report.not_moved.len(), 1);
    let reason = &report.not_moved[0].reason;
    assert!(
        reason.contains("dead-letter") && reason.contains("--to"),
        "{reason}"
    );
    assert_eq!(support::queue_depth(&ctx.sqs, &victim.queue_url).await.total(), 0);
    assert!(
        has_ledger(&ctx, &r.table, "victim-job").await,
        "the ledger of a job that was not replayed was forgotten"
    );
    assert_eq!(
        support::queue_depth(&ctx.sqs, &r.dlq_url).await.visible,
        1,
        "kept in the DLQ"
    );

    // Dry runs say the same.
    let dry = dlq::replay(
        &ctx,
        &r.dlq_url,
        &ReplayOptions {
            dry_run: true,
            ..replay_opts(&r.table)
        },
    )
    .await
    .unwrap();
    assert_eq!(dry.moved, 0);
}

#[tokio::test]
async fn a_record_that_disagrees_with_its_body_is_unverified_and_only_the_bodys_ledger_is_reset() {
    let ctx = ctx().await;
    let r = support::fresh_resources("forge-id", false).await;
    put_ledger(&ctx, &r.table, "t", "victim-job").await;
    put_ledger(&ctx, &r.table, "t", "attacker-job").await;
    // The record names this DLQ's real source queue, but another job than the body.
    let body = json!({"type": "t", "id": "attacker-job"}).to_string();
    forge_in_dlq(&ctx, &r.dlq_url, &body, &record("t", "victim-job", &r.queue_url)).await;

    let report = dlq::replay(&ctx, &r.dlq_url, &replay_opts(&r.table))
        .await
        .unwrap();
    assert_eq!(report.moved, 1, "{:?}", report.not_moved);
    assert!(
        has_ledger(&ctx, &r.table, "victim-job").await,
        "replay forgot the ledger the forged record named"
    );
    assert!(
        !has_ledger(&ctx, &r.table, "attacker-job").await,
        "the replayed job (as its body names it) starts from attempt 1"
    );
    let json = serde_json::to_value(&report).unwrap();
    let unverified = json["unverified"].as_array().cloned().unwrap_or_default();
    assert_eq!(unverified.len(), 1, "{json}");
    assert!(
        unverified[0]["reason"].as_str().unwrap().contains("victim-job"),
        "{json}"
    );
}

// ------------------------------------------------------------- item 17: stale holds

/// Blocks the calling (multi-thread runtime) thread on a future.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Waits (event, not time) until `n` messages of `url` are visible again.
async fn until_visible(sqs: &aws_sdk_sqs::Client, url: &str, n: u64) {
    for _ in 0..600 {
        if support::queue_depth(sqs, url).await.visible >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} message(s) never became visible again in {url}");
}

async fn seed_small(ctx: &Ctx, dlq_url: &str, source: &str, n: usize) {
    let entries: Vec<_> = (0..n)
        .map(|i| {
            let id = format!("p-{i}");
            let copy = dlq_copy(
                &json!({"type": "t", "id": id}).to_string(),
                &HashMap::new(),
                &record("t", &id, source),
                CAP,
            )
            .unwrap();
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(copy.body)
                .set_message_attributes(Some(copy.attributes))
                .build()
                .unwrap()
        })
        .collect();
    let out = ctx
        .sqs
        .send_message_batch()
        .queue_url(dlq_url)
        .set_entries(Some(entries))
        .send()
        .await
        .unwrap();
    assert!(out.failed.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_confirmed_after_its_hold_expired_reports_what_it_really_deleted() {
    let ctx = ctx().await;
    let r = support::fresh_resources("stale-purge", false).await;
    seed_small(&ctx, &r.dlq_url, &r.queue_url, 4).await;

    // The operator answers after the hold expired, and meanwhile another reader took the
    // messages: the purge's receipt handles are stale.
    let other = ctx.sqs.clone();
    let dlq_url = r.dlq_url.clone();
    let opts = dlq::PurgeOptions {
        filter: Filter::default(),
        limit: None,
        max_scan: 1_000,
        hold: Duration::from_secs(2),
        stop: None,
    };
    let report = dlq::purge_with(&ctx, &r.dlq_url, &opts, |plan| {
        assert_eq!(plan.selected, 4);
        block_on(async {
            until_visible(&other, &dlq_url, 4).await;
            let taken = support::read_all(&other, &dlq_url, 120, 1).await;
            assert_eq!(taken.len(), 4);
        });
        true
    })
    .await
    .unwrap();
    let left = support::queue_depth(&ctx.sqs, &r.dlq_url).await.total();
    assert_eq!(
        report.deleted as u64,
        4 - left,
        "reported {} deleted, {left} of 4 still in the DLQ",
        report.deleted
    );
    assert_eq!(report.deleted, 0, "another reader holds all four");
    assert_eq!(
        left, 4,
        "stale receipt handles deleted messages another reader holds"
    );
    assert_eq!(report.failed, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_confirmed_after_its_hold_expired_receives_again_and_deletes() {
    let ctx = ctx().await;
    let r = support::fresh_resources("stale-purge2", false).await;
    seed_small(&ctx, &r.dlq_url, &r.queue_url, 3).await;
    let sqs = ctx.sqs.clone();
    let dlq_url = r.dlq_url.clone();
    let opts = dlq::PurgeOptions {
        filter: Filter::default(),
        limit: None,
        max_scan: 1_000,
        hold: Duration::from_secs(2),
        stop: None,
    };
    let report = dlq::purge_with(&ctx, &r.dlq_url, &opts, |_| {
        block_on(until_visible(&sqs, &dlq_url, 3));
        true
    })
    .await
    .unwrap();
    assert_eq!(report.deleted, 3);
    assert_eq!(report.failed, 0);
    assert_eq!(support::queue_depth(&ctx.sqs, &r.dlq_url).await.total(), 0);
}

/// To a FIFO queue, a message group stops at its first entry that was not sent: later
/// entries of that group (in later batches) are not sent ahead of it; other groups go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_group_stops_at_its_first_entry_not_sent() {
    use sqs_triage::effects::sqs::{Outgoing, Sqs};
    use sqs_triage::effects::storage_retry::StorageRetry;
    let created = support::fresh_resources("fifostop", true).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    // The first batch call is refused as a whole (a sender fault: not retried).
    proxy.fail_next(
        1,
        Fault::Error {
            status: 400,
            code: "InvalidParameterValue".into(),
        },
        Some(vec!["SendMessageBatch".into()]),
    );
    let sqs = Sqs::new(
        support::sqs_client_via(&proxy.url()).await,
        StorageRetry::default(),
    );
    let entry = |key: usize, group: &str| Outgoing {
        key,
        body: format!("m{key}"),
        attributes: HashMap::new(),
        group_id: Some(group.to_owned()),
        dedup_id: Some(format!("d{key}")),
        delay_seconds: None,
    };
    // Ten of group a fill the first batch; then one more of a and one of b.
    let mut entries: Vec<Outgoing> = (0..10).map(|k| entry(k, "a")).collect();
    entries.push(entry(10, "a"));
    entries.push(entry(11, "b"));
    let sent = sqs.send(&created.queue_url, entries, None).await;
    let mut failed: Vec<usize> = sent.failed.iter().map(|(k, _)| *k).collect();
    failed.sort_unstable();
    assert_eq!(failed, (0..=10).collect::<Vec<_>>(), "{:?}", sent.failed);
    assert_eq!(sent.codes.get(&10).map(String::as_str), Some("GroupStopped"));
    assert_eq!(sent.accepted, vec![11], "group b goes on");
}

/// A failed batch entry is judged by the one code table before SQS's `SenderFault` flag: an
/// entry refused with `AccessDenied` is not sent again even when the flag says it was not the
/// sender's fault, and an `InternalError` entry is sent again even when the flag blames the
/// sender. (The batch helper used to go by the flag alone, while whole calls went by the
/// table.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_entries_go_by_the_code_table_before_the_sender_fault_flag() {
    use sqs_triage::effects::sqs::Sqs;
    use sqs_triage::effects::storage_retry::{StorageRetry, StorageRetryConfig};
    let quick = || {
        StorageRetry::new(StorageRetryConfig {
            max_attempts: 4,
            base: Duration::from_millis(5),
            throttle_base: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            ..StorageRetryConfig::default()
        })
        .unwrap()
    };
    let answer = |code: &str, sender_fault: bool| Fault::Body {
        status: 200,
        body: serde_json::json!({
            "Successful": [],
            "Failed": [{"Id": "e0", "Code": code, "SenderFault": sender_fault, "Message": "m"}],
        })
        .to_string(),
    };

    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("DeleteMessageBatch", answer("AccessDenied", false));
    let sqs = Sqs::new(support::sqs_client_via(&proxy.url()).await, quick());
    let url = format!("{}/000000000000/none", proxy.url());
    let r = sqs.delete(&url, vec![(0, "h".into())], None).await;
    assert_eq!(r.codes.get(&0).map(String::as_str), Some("AccessDenied"), "{r:?}");
    assert_eq!(
        proxy.count("DeleteMessageBatch"),
        1,
        "a refusal is not sent again"
    );

    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("DeleteMessageBatch", answer("InternalError", true));
    let sqs = Sqs::new(support::sqs_client_via(&proxy.url()).await, quick());
    let url = format!("{}/000000000000/none", proxy.url());
    let r = sqs.delete(&url, vec![(0, "h".into())], None).await;
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert_eq!(
        proxy.count("DeleteMessageBatch"),
        4,
        "a server fault is sent again"
    );
}
