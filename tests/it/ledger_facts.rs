//! Facts on the attempt ledger item, read with the batch's one ledger read: `triage park`
//! (a job waiting for its retry goes to the DLQ now, class `parked`) and the opt-in completion
//! marker (a completed job is never run again while its marker lives).
//!
//! Needs the local stack: `bash infra/local/stack.sh start` and
//! `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use sqs_triage::clock::{Clock, now_ms};
use sqs_triage::core::backoff::Backoff;
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::core::policy::RetryPolicy;
use sqs_triage::effects::dlq::failure_record;
use sqs_triage::effects::ledger::{AttemptLedger, Delivery};
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::{Environment, build_with_clock};
use support::fault_proxy::{Fault, FaultProxy};
use support::pipeline::{Harness, Options, RECORDED, failed_ids};
use triage::demo::chaos;

const BIN: &str = env!("CARGO_BIN_EXE_triage");

/// 5 attempts, the first retry 10 minutes away: far beyond any wait in these tests.
fn slow_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(5)
        .backoff(Backoff::exponential(
            Duration::from_secs(600),
            2.0,
            Duration::from_secs(1_200),
            Duration::ZERO,
        ))
        .max_delay(Duration::from_secs(1_200))
        .build()
        .unwrap()
}

fn triage(h: &Harness, args: &[&str]) -> Output {
    support::strict_env(&mut Command::new(BIN))
        .args(args)
        .env("TRIAGE_QUEUE_URL", &h.queue_url)
        .env("TRIAGE_DLQ_URL", &h.dlq_url)
        .env("TRIAGE_TABLE", &h.table)
        .env("USER", "ops-alice")
        .env("AWS_ENDPOINT_URL_STS", support::sts_endpoint())
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .expect("run triage")
}

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "triage failed ({:?}): {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// A failed run: exit `code` and one `error:` line containing `needle`.
fn assert_error(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "{err}");
}

fn record_of(m: &aws_sdk_sqs::types::Message) -> FailureRecord {
    failure_record(&m.message_attributes().cloned().unwrap_or_default())
        .expect("a failure record")
        .expect("it parses")
}

async fn ledger(h: &Harness) -> AttemptLedger {
    AttemptLedger::new(support::ddb_client().await, &h.table, StorageRetry::default())
}

/// Operations a batch sent to DynamoDB, from the environment's call counter.
fn ddb_calls(h: &Harness) -> Vec<(String, u64)> {
    h.env
        .calls
        .snapshot()
        .into_iter()
        .filter(|(k, _)| k.starts_with("DynamoDB."))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_job_reaches_the_dlq_long_before_its_retry_without_running_again() {
    let h = Harness::build(Options {
        prefix: "park",
        policy: slow_policy(),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("p-1", json!({"outcome": "transient"}))]).await;
    let (_, response) = h.invoke_once(Duration::from_secs(5)).await.expect("delivered");
    assert_eq!(failed_ids(&response).len(), 1, "a retry, 10 minutes away");
    assert_eq!(h.executions("p-1"), vec![1]);

    let o = triage(&h, &["park", "p-1", "--reason", "vendor down", "--json"]);
    let report = json_of(&o);
    assert_eq!(report["job_type"], RECORDED);
    assert_eq!(report["attempts"], 1);
    assert_eq!(report["released_now"], true, "{report}");
    assert_eq!(report["parked_by"], "ops-alice");
    assert_eq!(report["reason"], "vendor down");
    assert_eq!(report["already_parked"], false);
    assert_eq!(report["queue_url"], h.queue_url.as_str());

    // The park is audited: one item on the job type, the job in its filter.
    assert_eq!(report["audit"]["written"], true, "{report}");
    let trail = json_of(&triage(&h, &["audit", "--action", "park", "--json"]));
    let entries = trail["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{trail}");
    assert_eq!(entries[0]["target"], RECORDED, "{trail}");
    assert_eq!(entries[0]["count"], 1, "{trail}");
    assert_eq!(entries[0]["filter"]["job_id"], "p-1", "{trail}");
    assert_eq!(entries[0]["detail"]["reason"], "vendor down", "{trail}");
    assert_eq!(entries[0]["detail"]["attempts"], 1, "{trail}");

    // Parking again keeps the first time and says so.
    let again = json_of(&triage(&h, &["park", "p-1", "--json"]));
    assert_eq!(again["already_parked"], true, "{again}");
    assert_eq!(again["parked_at_ms"], report["parked_at_ms"]);

    // The message is visible now, ten minutes before its retry: the next poll dead-letters it.
    let (messages, response) = h
        .invoke_once(Duration::from_secs(5))
        .await
        .expect("the parked message comes back now");
    assert_eq!(messages.len(), 1);
    assert!(
        failed_ids(&response).is_empty(),
        "settled: its DLQ copy was accepted"
    );
    assert_eq!(h.executions("p-1"), vec![1], "the handler did not run again");
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    let r = record_of(&dlq[0]);
    assert_eq!((r.class, r.attempts), (FailureClass::Parked, 1), "{r:?}");
    assert!(
        r.error.starts_with("parked by an operator at ") && r.error.contains("by ops-alice: vendor down"),
        "{}",
        r.error
    );
    assert_eq!(h.depth(&h.queue_url).await, 0);
    assert_eq!(
        ledger(&h).await.show(RECORDED, "p-1").await.unwrap(),
        None,
        "forgotten"
    );

    // `dlq list --class parked` finds it; replay gives it a fresh ledger and it runs again.
    let list = json_of(&triage(
        &h,
        &["dlq", "list", "--class", "parked", "--messages", "--json"],
    ));
    assert!(list.to_string().contains("p-1"), "{list}");
    assert_eq!(list["total"], 1, "{list}");
    let replay = json_of(&triage(&h, &["dlq", "replay", "--class", "parked", "--json"]));
    assert_eq!(replay["moved"], 1, "{replay}");
    h.invoke_once(Duration::from_secs(5)).await.expect("replayed");
    assert_eq!(h.executions("p-1"), vec![1, 1], "a fresh ledger: attempt 1 again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_refuses_what_it_cannot_park_in_one_clear_line() {
    let h = Harness::build(Options {
        prefix: "parkerr",
        ..Options::default()
    })
    .await;
    let l = ledger(&h).await;
    let d = |rc| Delivery {
        message_id: "m",
        receive_count: rc,
    };

    // Unknown id, with and without --type.
    assert_error(
        &triage(&h, &["park", "nobody"]),
        3,
        "job nobody is not waiting for a retry",
    );
    assert_error(
        &triage(&h, &["park", "nobody", "--type", "t"]),
        3,
        "job nobody of type t is not waiting for a retry",
    );

    // A ledger without a retry scheduled (its last count sent it to the DLQ with a bare copy).
    l.count("t", "spent", d(1), None, "boom", None).await.unwrap();
    assert_error(
        &triage(&h, &["park", "spent"]),
        2,
        "job spent of type t is not waiting for a retry",
    );

    // A completed job (its completion marker).
    l.forget_and_mark_done(
        Vec::<(String, String)>::new(),
        vec![(("t".into(), "done".into()), Duration::from_secs(60))],
        None,
    )
    .await
    .unwrap();
    assert_error(&triage(&h, &["park", "done"]), 2, "it completed at");

    // One id under two job types: --type picks one.
    let later = sqs_triage::clock::now_ms() + 600_000;
    l.count("a", "shared", d(1), Some(later), "e", None)
        .await
        .unwrap();
    l.count("b", "shared", d(1), Some(later), "e", None)
        .await
        .unwrap();
    assert_error(
        &triage(&h, &["park", "shared"]),
        2,
        "2 job types (a, b): pass --type",
    );
    let r = json_of(&triage(&h, &["park", "shared", "--type", "b", "--json"]));
    assert_eq!(r["job_type"], "b");
    // Counted without a receipt handle (as by an earlier version): parked, message not moved.
    assert_eq!(r["released_now"], false);
    assert!(
        r["release_error"].as_str().unwrap().contains("no receipt handle"),
        "{r}"
    );
    let human = triage(&h, &["park", "shared", "--type", "b"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("at its scheduled retry"), "{text}");
    let b = l.show("b", "shared").await.unwrap().unwrap();
    assert!(b.parked_at_ms.is_some(), "{b:?}");
    assert_eq!(
        l.show("a", "shared").await.unwrap().unwrap().parked_at_ms,
        None,
        "the other type is untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_marker_duplicates_and_resends_of_completed_jobs_never_run() {
    // Opted in through the configuration, as TRIAGE_DONE_MARKER_TYPES does.
    let h = Harness::build(Options {
        prefix: "marker",
        tweak: Box::new(|mut c| {
            c.done_marker_types = vec![RECORDED.to_owned()];
            c
        }),
        ..Options::default()
    })
    .await;
    let ids: Vec<String> = (0..5).map(|i| format!("d-{i}")).collect();
    let jobs: Vec<(&str, Value)> = ids
        .iter()
        .map(|i| (i.as_str(), json!({"outcome": "ok"})))
        .collect();
    h.send_jobs(&jobs).await;

    // First deliveries: one read and one batched marker write for the batch, nothing per
    // message.
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert_eq!(messages.len(), 5);
    h.env.calls.reset();
    let response = h.invoke_with(&messages, Duration::from_secs(60)).await.unwrap();
    assert!(failed_ids(&response).is_empty());
    let calls = ddb_calls(&h);
    let get = |op: &str| calls.iter().find(|(k, _)| k.ends_with(op)).map_or(0, |(_, v)| *v);
    assert_eq!(
        (get(".BatchGetItem"), get(".BatchWriteItem")),
        (1, 1),
        "{calls:?}"
    );
    assert_eq!(get(".UpdateItem") + get(".PutItem"), 0, "{calls:?}");
    for id in &ids {
        assert_eq!(h.executions(id), vec![1]);
        let item = ledger(&h)
            .await
            .show(RECORDED, id)
            .await
            .unwrap()
            .expect("a marker");
        assert!(item.done_at_ms.is_some(), "{item:?}");
    }

    // A rerun after a lost delete: the same messages come back (receive count 2).
    h.release(&h.queue_url, &messages).await;
    let again = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert_eq!(again.len(), 5, "the undeleted messages come back");
    let response = h.invoke_with(&again, Duration::from_secs(60)).await.unwrap();
    assert!(failed_ids(&response).is_empty(), "duplicates are settled");
    h.delete_settled(&again, &response).await;

    // A producer re-sends every job: new messages, receive count 1.
    h.send_jobs(&jobs).await;
    let (resent, response) = h.invoke_once(Duration::from_secs(5)).await.expect("re-sent");
    assert_eq!(resent.len(), 5);
    assert!(failed_ids(&response).is_empty());

    for id in &ids {
        assert_eq!(h.executions(id), vec![1], "{id} ran once in all");
    }
    assert_eq!(h.depth(&h.queue_url).await, 0, "every duplicate was deleted");
    assert!(h.dlq_messages().await.is_empty());

    // Another job id of the same type still runs.
    h.send_jobs(&[("d-new", json!({"outcome": "ok"}))]).await;
    h.invoke_once(Duration::from_secs(5)).await.expect("delivered");
    assert_eq!(h.executions("d-new"), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_marker_the_healthy_path_makes_no_dynamodb_write() {
    let h = Harness::build(Options {
        prefix: "nomarker",
        ..Options::default()
    })
    .await;
    let jobs: Vec<(String, Value)> = (0..10)
        .map(|i| (format!("n-{i}"), json!({"outcome": "ok"})))
        .collect();
    let refs: Vec<(&str, Value)> = jobs.iter().map(|(i, p)| (i.as_str(), p.clone())).collect();
    h.send_jobs(&refs).await;
    let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
    assert!(!messages.is_empty());
    h.env.calls.reset();
    let response = h.invoke_with(&messages, Duration::from_secs(60)).await.unwrap();
    assert!(failed_ids(&response).is_empty());
    let calls = ddb_calls(&h);
    assert!(
        calls.iter().all(|(k, _)| k.ends_with(".GetItem")),
        "at most the breaker's cached read, no ledger read or write: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_ledger_cannot_show_markers_or_parks_and_falls_back_as_before() {
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let h = Harness::build(Options {
        prefix: "factsdown",
        policy: slow_policy(),
        ddb_endpoint: Some(proxy.url()),
        register: Box::new(|r, _| r.done_marker(RECORDED, Duration::from_secs(600))),
        ..Options::default()
    })
    .await;
    // A completed job, marked while the table answers.
    h.send_jobs(&[("f-done", json!({"outcome": "ok"}))]).await;
    h.invoke_once(Duration::from_secs(5)).await.expect("delivered");
    assert_eq!(h.executions("f-done"), vec![1]);
    // A job waiting for its retry, parked while the table answers.
    h.send_jobs(&[("f-park", json!({"outcome": "transient"}))]).await;
    h.invoke_once(Duration::from_secs(5)).await.expect("delivered");
    assert!(json_of(&triage(&h, &["park", "f-park", "--json"]))["released_now"] == true);

    // Now every ledger read fails: neither fact can be seen.
    proxy.fail_always("BatchGetItem", Fault::Status500);
    h.send_jobs(&[("f-done", json!({"outcome": "ok"}))]).await;
    let mut seen = 0;
    for _ in 0..5 {
        let Some((messages, response)) = h.invoke_once(Duration::from_secs(3)).await else {
            break;
        };
        seen += messages.len();
        let outcome_ids = failed_ids(&response);
        assert!(outcome_ids.len() <= 1, "{outcome_ids:?}");
        if seen >= 2 {
            break;
        }
    }
    assert_eq!(seen, 2, "the re-send and the parked message were both delivered");
    // The re-sent completed job ran again (its marker could not be read: at-least-once, as
    // without a marker), and the parked job ran as a redelivery falling back to its receive
    // count instead of going to the DLQ.
    assert_eq!(h.executions("f-done"), vec![1, 1]);
    assert_eq!(h.executions("f-park"), vec![1, 2]);
    assert!(h.dlq_messages().await.is_empty(), "the park could not be seen");

    // Once the table answers again the park is seen at the next delivery.
    proxy.clear_faults();
    let item = ledger(&h).await.show(RECORDED, "f-park").await.unwrap().unwrap();
    assert!(item.parked_at_ms.is_some(), "still parked: {item:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_whose_retry_is_due_does_not_release_a_message_that_may_be_running() {
    let h = Harness::build(Options {
        prefix: "park-due",
        policy: slow_policy(),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("d-1", json!({"outcome": "transient"}))]).await;
    let (_, response) = h.invoke_once(Duration::from_secs(5)).await.expect("delivered");
    assert_eq!(failed_ids(&response).len(), 1, "a retry, 10 minutes away");

    // Its retry falls due: from now on the message may be received and running, under a
    // newer receipt handle than the stored one.
    let past = sqs_triage::clock::now_ms() - 1_000;
    support::ddb_client()
        .await
        .update_item()
        .table_name(&h.table)
        .set_key(Some(sqs_triage::effects::table::ledger_key(RECORDED, "d-1")))
        .update_expression("SET next_attempt_at = :t")
        .expression_attribute_values(":t", aws_sdk_dynamodb::types::AttributeValue::N(past.to_string()))
        .send()
        .await
        .unwrap();

    let report = json_of(&triage(&h, &["park", "d-1", "--json"]));
    assert_eq!(report["released_now"], false, "{report}");
    assert!(
        report["release_error"]
            .as_str()
            .unwrap()
            .contains("may be running now"),
        "{report}"
    );
    let depth = support::queue_depth(&support::sqs_client().await, &h.queue_url).await;
    assert_eq!(
        (depth.visible, depth.in_flight),
        (0, 1),
        "the message was not made visible: {depth:?}"
    );
    // The park stands: the ledger says so.
    let item = ledger(&h).await.show(RECORDED, "d-1").await.unwrap().unwrap();
    assert!(item.parked_at_ms.is_some(), "{item:?}");
}

/// Runs every delivery of the harness's queue through `env` until none comes within `wait`.
async fn run_until_quiet(h: &Harness, env: &sqs_triage::runtime::env::Environment, wait: Duration) {
    loop {
        let messages = h.receive(&h.queue_url, wait).await;
        if messages.is_empty() {
            return;
        }
        h.invoke_env(env, &messages, Duration::from_secs(60)).await;
    }
}

/// An environment over `h`'s queue, DLQ and table whose ledger and breakers read `clock`, with
/// [`RECORDED`] run as `h`'s own (logged in `h.log`) and marked done for `ttl` after a success.
async fn env_on_clock(h: &Harness, ttl: Duration, clock: Clock) -> Environment {
    let sdk = support::sdk_config().await;
    let mut config = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
    config.queue_url = Some(h.queue_url.clone());
    config.dlq_url = Some(h.dlq_url.clone());
    config.table = Some(h.table.clone());
    let (policy, breaker) = (
        support::pipeline::fast_policy(5),
        support::pipeline::quiet_breaker(),
    );
    let log = h.log.clone();
    let registry = Registry::new(policy.clone(), breaker)
        .handle_with(
            RECORDED,
            policy,
            breaker,
            move |p: chaos::ChaosPayload, ctx: JobContext| {
                log.lock().unwrap().push((ctx.job_id.clone(), ctx.attempt));
                chaos::run(p, ctx)
            },
        )
        .done_marker(RECORDED, ttl);
    build_with_clock(&config, registry, sqs_config(&sdk), dynamodb_config(&sdk), clock)
        .await
        .unwrap()
}

/// A marker that has lived out is no marker, even after a count was written on its item: a
/// producer's re-send of a completed job after the marker's lifetime runs, and its retry
/// runs too instead of being deleted as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lived_out_marker_does_not_swallow_the_retry_of_a_resend() {
    let ttl = Duration::from_secs(86_400);
    let h = Harness::build(Options {
        prefix: "marker-out",
        ..Options::default()
    })
    .await;
    let clock = Clock::manual(now_ms());
    let env = env_on_clock(&h, ttl, clock.clone()).await;
    h.send_jobs(&[("j1", json!({"outcome": "ok"}))]).await;
    run_until_quiet(&h, &env, Duration::from_secs(2)).await;
    assert_eq!(h.executions("j1"), vec![1]);
    let marked = ledger(&h).await.show(RECORDED, "j1").await.unwrap().unwrap();
    let done_at = marked.done_at_ms.expect("a marker");
    // The marker lives out on the ledger's clock (DynamoDB Local deletes nothing by TTL: the
    // item stays).
    clock.advance(ttl);
    h.send_jobs(&[("j1", json!({"outcome": "transient", "fail_times": 1}))])
        .await;
    // The re-send fails once; its retry comes back after 1 s and must run.
    run_until_quiet(&h, &env, Duration::from_secs(4)).await;
    assert_eq!(
        h.executions("j1"),
        vec![1, 1, 2],
        "the re-send ran, and so did its retry"
    );
    assert_eq!(h.depth(&h.queue_url).await, 0);
    assert!(h.dlq_messages().await.is_empty());
    let item = ledger(&h).await.show(RECORDED, "j1").await.unwrap().unwrap();
    assert!(
        item.done_at_ms
            .is_some_and(|at| at >= done_at + ttl.as_millis() as u64),
        "the retry's success wrote a new marker, after the first one lived out: {item:?}"
    );
}

/// A job type taken out of the completion markers: the markers its items still carry, alive,
/// swallow nothing. A re-send runs, and its retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_taken_out_of_the_markers_has_its_retries_run() {
    let h = Harness::build(Options {
        prefix: "marker-off",
        tweak: Box::new(|mut c| {
            c.done_marker_types = vec![RECORDED.to_owned()];
            c
        }),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("k1", json!({"outcome": "ok"}))]).await;
    run_until_quiet(&h, &h.env, Duration::from_secs(2)).await;
    let marked = ledger(&h).await.show(RECORDED, "k1").await.unwrap().unwrap();
    assert!(marked.done_at_ms.is_some(), "{marked:?}");

    // The same resources, the type no longer in TRIAGE_DONE_MARKER_TYPES.
    let without = Harness::build(Options {
        prefix: "marker-off2",
        ..Options::default()
    })
    .await;
    let sdk = support::sdk_config().await;
    let mut config = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
    config.queue_url = Some(h.queue_url.clone());
    config.dlq_url = Some(h.dlq_url.clone());
    config.table = Some(h.table.clone());
    let policy = support::pipeline::fast_policy(5);
    let breaker = support::pipeline::quiet_breaker();
    let log = without.log.clone();
    let registry = sqs_triage::processor::registry::Registry::new(policy.clone(), breaker).handle_with(
        RECORDED,
        policy,
        breaker,
        move |p: triage::demo::chaos::ChaosPayload, ctx: sqs_triage::processor::registry::JobContext| {
            log.lock().unwrap().push((ctx.job_id.clone(), ctx.attempt));
            triage::demo::chaos::run(p, ctx)
        },
    );
    let env = sqs_triage::runtime::env::build_with(
        &config,
        registry,
        sqs_triage::effects::storage_retry::sqs_config(&sdk),
        sqs_triage::effects::storage_retry::dynamodb_config(&sdk),
    )
    .await
    .unwrap();
    h.send_jobs(&[("k1", json!({"outcome": "transient", "fail_times": 1}))])
        .await;
    run_until_quiet(&h, &env, Duration::from_secs(4)).await;
    assert_eq!(
        without.executions("k1"),
        vec![1, 2],
        "the re-send ran, and so did its retry"
    );
    assert_eq!(h.depth(&h.queue_url).await, 0);
    assert!(h.dlq_messages().await.is_empty());
}
