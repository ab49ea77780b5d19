//! The processor at its edges, on the local stack through the real SDK: a count the ledger
//! refuses to write, a FIFO group behind a refused DLQ copy, storage calls that stall past the
//! invocation's deadline, and a queue's last receive before SQS's own redrive.

use crate::support;

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::json;
use sqs_triage::core::failure::FailureClass;
use sqs_triage::effects::dlq::failure_record;
use support::fault_proxy::{Fault, FaultProxy};
use support::pipeline::{Harness, Options, failed_ids, fast_policy, quiet_breaker};

fn record_of(m: &aws_sdk_sqs::types::Message) -> sqs_triage::core::failure::FailureRecord {
    failure_record(&m.message_attributes().cloned().unwrap_or_default())
        .expect("a failure record")
        .expect("it parses")
}

/// Item: a count write that fails for good is not forgotten. The proxy refuses every
/// `BatchExecuteStatement` and `UpdateItem` (the ledger's batched count and its single
/// rewrite), while reads work: each redelivery reads a
/// ledger that never moved. The job must still stop at `max_attempts` executions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_refuses_counts_cannot_make_a_job_run_past_its_limit() {
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    proxy.fail_always("UpdateItem", Fault::Status500);
    proxy.fail_always("BatchExecuteStatement", Fault::Status500);
    let h = Harness::build(Options {
        prefix: "nocount",
        policy: fast_policy(3),
        ddb_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("stubborn", json!({"outcome": "transient"}))])
        .await;
    for _ in 0..40 {
        h.invoke_once(Duration::from_secs(2)).await;
        if h.depth(&h.queue_url).await == 0 || h.executions("stubborn").len() > 3 {
            break;
        }
    }
    let runs = h.executions("stubborn");
    assert_eq!(runs, [1, 2, 3], "ran past max_attempts (3), or short of it");
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1, "dead-lettered once its receives reached the limit");
    let r = record_of(&dlq[0]);
    assert_eq!(r.class, FailureClass::Exhausted);
    assert_eq!(r.attempts, 3, "{r:?}");
    assert!(proxy.count("BatchExecuteStatement") >= 1, "the counts were tried");
}

/// Item: FIFO order across a failed DLQ send. In group `g`, a fatal job is followed by an ok
/// one; the DLQ refuses the copy. The ok job must not run before its predecessor's copy is
/// confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_group_waits_for_its_dead_lettered_record_to_reach_the_dlq() {
    let gone = support::queue_to_delete("fifodlq-gone", true).await;
    let dlq = gone.clone();
    let h = Harness::build(Options {
        prefix: "fifodlq",
        fifo: true,
        policy: fast_policy(5),
        breaker: quiet_breaker(),
        tweak: Box::new(move |mut c| {
            c.dlq_url = Some(dlq);
            c
        }),
        ..Options::default()
    })
    .await;
    // A DLQ deleted after start-up: every send is refused.
    support::delete_queue(&gone).await;
    let job =
        |id: &str, p: serde_json::Value| json!({"type": "test.recorded", "id": id, "payload": p}).to_string();
    let first = job("f1", json!({"outcome": "fatal"}));
    let second = job("f2", json!({"outcome": "ok"}));
    h.send_raw(&[(&first, Some("g")), (&second, Some("g"))]).await;
    let mut seen = 0;
    for _ in 0..5 {
        if let Some((messages, response)) = h.invoke_once(Duration::from_secs(2)).await {
            seen += messages.len();
            assert_eq!(
                response.batch_item_failures.len(),
                messages.len(),
                "nothing in the group settles while the DLQ refuses the first"
            );
        }
        if seen >= 2 {
            break;
        }
    }
    assert!(seen >= 1);
    assert_eq!(h.executions("f1"), vec![1]);
    assert!(
        h.executions("f2").is_empty(),
        "f2 ran although f1's DLQ copy does not exist"
    );
}

/// Item: storage calls before the handlers are bounded by the invocation's deadline. The
/// proxy stalls every DynamoDB call for a minute; an invocation with 6 s left must still
/// answer in time and spend no attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_table_cannot_hold_an_invocation_past_its_deadline() {
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let breaker = sqs_triage::core::breaker::BreakerConfig::builder()
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let h = Harness::build(Options {
        prefix: "stall",
        breaker,
        ddb_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("s1", json!({"outcome": "ok"})), ("s2", json!({"outcome": "ok"}))])
        .await;
    let mut messages = Vec::new();
    for _ in 0..5 {
        messages.extend(h.receive(&h.queue_url, Duration::from_secs(1)).await);
        if messages.len() >= 2 {
            break;
        }
    }
    assert_eq!(messages.len(), 2);
    proxy.fail_always("GetItem", Fault::Delay(Duration::from_secs(60)));
    proxy.fail_always("BatchGetItem", Fault::Delay(Duration::from_secs(60)));
    let time_left = Duration::from_secs(6);
    let answered = tokio::time::timeout(time_left, h.invoke_with(&messages, time_left)).await;
    let response = answered
        .expect("the invocation answered before its deadline")
        .expect("a batch response");
    // The breaker read ran out of time: it fails open and the jobs ran, or they were released
    // unspent; either way every record is accounted for in the response.
    let failed = response.batch_item_failures.len();
    let ran = h.log.lock().unwrap().len();
    assert_eq!(ran + failed, 2, "ran {ran}, reported failed {failed}");
}

/// Item: a message on its last receive before SQS's redrive (`maxReceiveCount`) is never left
/// for the redrive to move without a record: here an open breaker defers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferral_on_the_last_receive_is_dead_lettered_with_a_record() {
    let h = Harness::build(Options {
        prefix: "lastrecv",
        ..Options::default()
    })
    .await;
    h.set_redrive(2).await;
    h.sqs
        .set_queue_attributes()
        .queue_url(&h.queue_url)
        .attributes(QueueAttributeName::VisibilityTimeout, "1")
        .send()
        .await
        .unwrap();
    // The breaker opened before the environment starts, so its start-up read (which it keeps
    // for the cache's lifetime) sees it open.
    let sdk = support::sdk_config().await;
    let store = sqs_triage::effects::breaker_store::BreakerStore::new(
        sqs_triage::effects::storage_retry::dynamodb_client(&sdk),
        &h.table,
        sqs_triage::effects::storage_retry::StorageRetry::default(),
    );
    store
        .force_open(triage::demo::chaos::CHAOS, None, sqs_triage::clock::now_ms())
        .await
        .unwrap();
    // Rebuild the processor so it reads the new redrive policy at start-up.
    let env = env_for(&h, fast_policy(5), &h.dlq_url).await;
    let body = json!({"type": triage::demo::chaos::CHAOS, "id": "held", "payload": {}}).to_string();
    h.send_raw(&[(&body, None)]).await;
    let mut deliveries = 0;
    for _ in 0..20 {
        let messages = h.receive(&h.queue_url, Duration::from_secs(2)).await;
        if messages.is_empty() {
            if h.depth(&h.queue_url).await == 0 {
                break;
            }
            continue;
        }
        deliveries += messages.len();
        let response = h.invoke_env(&env, &messages, Duration::from_secs(30)).await;
        let failed = failed_ids(&response);
        // A forced-open breaker defers for ~12 h: make it visible again to go on.
        h.release(
            &h.queue_url,
            messages
                .iter()
                .filter(|m| failed.contains(&m.message_id().unwrap())),
        )
        .await;
    }
    assert_eq!(deliveries, 2, "delivered up to maxReceiveCount");
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    let r = record_of(&dlq[0]);
    assert_eq!(r.class, FailureClass::Expiring, "{r:?}");
    assert_eq!(r.attempts, 0, "never ran");
    assert_eq!(dlq[0].body(), Some(body.as_str()));
}

/// Runs `messages` through the processor itself (not the Lambda adapter), with `time_left`.
async fn process(
    env: &sqs_triage::runtime::env::Environment,
    messages: &[aws_sdk_sqs::types::Message],
    queue_url: &str,
    time_left: Duration,
) -> sqs_triage::processor::BatchOutcome {
    let event = support::pipeline::lambda_event(messages, queue_url);
    let records = event
        .records
        .into_iter()
        .map(sqs_triage::processor::Incoming::from_lambda)
        .collect();
    env.processor
        .process(records, Some(tokio::time::Instant::now() + time_left))
        .await
}

/// An environment over the harness's resources with the recording job type and `policy`.
async fn env_for(
    h: &Harness,
    policy: sqs_triage::core::policy::RetryPolicy,
    dlq_url: &str,
) -> sqs_triage::runtime::env::Environment {
    env_with(h, policy, dlq_url, None).await
}

/// [`env_for`] with the source queue's attributes configured (`TRIAGE_QUEUE_*`) rather than
/// read.
async fn env_with(
    h: &Harness,
    policy: sqs_triage::core::policy::RetryPolicy,
    dlq_url: &str,
    facts: Option<sqs_triage::config::QueueFacts>,
) -> sqs_triage::runtime::env::Environment {
    let sdk = support::sdk_config().await;
    let mut config = sqs_triage::config::Config::from_lookup(&|_| None).unwrap();
    config.queue_url = Some(h.queue_url.clone());
    config.dlq_url = Some(dlq_url.to_owned());
    config.table = Some(h.table.clone());
    config.source_queue = facts;
    let registry = triage::demo::chaos::register(
        sqs_triage::processor::registry::Registry::new(policy.clone(), quiet_breaker()),
        policy.clone(),
        quiet_breaker(),
    );
    let registry = registry.handle_with(
        support::pipeline::RECORDED,
        policy,
        quiet_breaker(),
        |p: triage::demo::chaos::ChaosPayload, ctx| triage::demo::chaos::run(p, ctx),
    );
    sqs_triage::runtime::env::build(&config, registry, &sdk)
        .await
        .unwrap()
}

/// Review finding: a count the ledger refuses right after an outage (a receive count inflated
/// by deferrals) must not dead-letter a job that still has attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_count_after_many_deferrals_does_not_dead_letter_early() {
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let h = Harness::build(Options {
        prefix: "deferredcount",
        policy: fast_policy(5),
        ddb_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("patient", json!({"outcome": "transient"}))]).await;
    // Seven receives that ran nothing (as deferrals would be), then the ledger refuses counts.
    for _ in 0..7 {
        let m = h.receive_n(1).await;
        h.release(&h.queue_url, &m).await;
    }
    proxy.fail_always("UpdateItem", Fault::Status500);
    proxy.fail_always("BatchExecuteStatement", Fault::Status500);
    let m = h.receive_n(1).await;
    let outcome = process(&h.env, &m, &h.queue_url, Duration::from_secs(30)).await;
    assert!(
        proxy.faults().contains_key("Status500"),
        "the count was refused: {:?}",
        proxy.counts()
    );
    assert!(
        matches!(
            outcome.records[0].decision,
            sqs_triage::core::Decision::Retry { attempts: 1, .. }
        ),
        "{:?}",
        outcome.records[0]
    );
    assert!(h.dlq_messages().await.is_empty(), "one execution of five: no DLQ");
}

/// Review finding: in a FIFO group, records held back behind a failing head are not left on
/// their last receive for SQS's redrive to move without a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_records_held_back_on_their_last_receive_are_dead_lettered_with_a_record() {
    let h = Harness::build(Options {
        prefix: "fifolast",
        fifo: true,
        ..Options::default()
    })
    .await;
    h.set_redrive(2).await;
    let env = env_for(&h, fast_policy(5), &h.dlq_url).await;
    let job =
        |id: &str, p: serde_json::Value| json!({"type": "test.recorded", "id": id, "payload": p}).to_string();
    let head = job("head", json!({"outcome": "transient"}));
    let tail = job("tail", json!({"outcome": "ok"}));
    h.send_raw(&[(&head, Some("g")), (&tail, Some("g"))]).await;
    // Two deliveries of the pair, released at once so the next receive gets both again.
    let mut dlq_copies = 0;
    for _ in 0..2 {
        let messages = h.receive_n(2).await;
        let outcome = process(&env, &messages, &h.queue_url, Duration::from_secs(30)).await;
        for (m, r) in messages.iter().zip(&outcome.records) {
            if r.settled {
                dlq_copies += 1;
                h.sqs
                    .delete_message()
                    .queue_url(&h.queue_url)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            } else {
                h.release(&h.queue_url, [m]).await;
            }
        }
    }
    assert_eq!(dlq_copies, 2, "both settled on their last receive");
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 2);
    for m in &dlq {
        assert_eq!(record_of(m).class, FailureClass::Expiring, "{:?}", record_of(m));
    }
}

/// Review finding: a stalled DLQ send after the handlers cannot hold the batch response past
/// the deadline (the whole batch would then time out and run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_dlq_send_cannot_hold_the_response_past_the_deadline() {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let h = Harness::build(Options {
        prefix: "stalldlq",
        sqs_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[
        ("f", json!({"outcome": "fatal"})),
        ("o", json!({"outcome": "ok"})),
    ])
    .await;
    let messages = h.receive_n(2).await;
    proxy.fail_always("SendMessageBatch", Fault::Delay(Duration::from_secs(60)));
    let time_left = Duration::from_secs(4);
    let response = tokio::time::timeout(time_left, h.invoke_with(&messages, time_left))
        .await
        .expect("answered before the deadline")
        .expect("a batch response");
    let failed = failed_ids(&response);
    let fatal_id = messages
        .iter()
        .find(|m| m.body().unwrap().contains("\"f\""))
        .unwrap()
        .message_id()
        .unwrap();
    assert_eq!(
        failed,
        [fatal_id],
        "only the record whose copy is unconfirmed stays"
    );
}

/// Review finding: on the last receive, a DLQ that refuses the copy leaves the message to SQS's
/// redrive without a record; that is counted and logged as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_copy_on_the_last_receive_is_counted() {
    let h = Harness::build(Options {
        prefix: "lastrefused",
        ..Options::default()
    })
    .await;
    h.set_redrive(1).await;
    // A DLQ deleted after start-up: every send is refused.
    let gone = support::queue_to_delete("lastrefused-gone", false).await;
    let env = env_for(&h, fast_policy(5), &gone).await;
    support::delete_queue(&gone).await;
    h.send_jobs(&[("t", json!({"outcome": "transient"}))]).await;
    let messages = h.receive_n(1).await;
    let outcome = process(&env, &messages, &h.queue_url, Duration::from_secs(30)).await;
    assert!(!outcome.records[0].settled);
    let counted = outcome
        .metrics
        .by_type
        .values()
        .filter_map(|m| m.counts.get("ExpiringUnrecorded"))
        .sum::<u64>();
    assert_eq!(counted, 1, "{:?}", outcome.metrics);
}

/// Issue item: a deferral cannot outlive the queue's retention. With a 60 s retention and the
/// breaker forced open without `--for` (a deferral of ~12 h), the job ends in the DLQ with a
/// record, not deleted by SQS with no copy anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deferred_past_the_queues_retention_is_dead_lettered_with_a_record() {
    let h = Harness::build(Options {
        prefix: "retention",
        ..Options::default()
    })
    .await;
    h.sqs
        .set_queue_attributes()
        .queue_url(&h.queue_url)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "60")
        .attributes(QueueAttributeName::VisibilityTimeout, "10")
        .send()
        .await
        .unwrap();
    // Three receives held 15 s each (the heartbeat's reach) fit three quarters of the retention:
    // start-up refuses more.
    h.set_redrive(3).await;
    let policy = sqs_triage::core::policy::RetryPolicy::builder()
        .max_attempts(2)
        .backoff(sqs_triage::core::Backoff::exponential(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(2),
            Duration::ZERO,
        ))
        .max_delay(Duration::from_secs(2))
        .build()
        .unwrap();
    // Opened before the environment starts: its start-up read sees it open.
    let sdk = support::sdk_config().await;
    let store = sqs_triage::effects::breaker_store::BreakerStore::new(
        sqs_triage::effects::storage_retry::dynamodb_client(&sdk),
        &h.table,
        sqs_triage::effects::storage_retry::StorageRetry::default(),
    );
    store
        .force_open(support::pipeline::RECORDED, None, sqs_triage::clock::now_ms())
        .await
        .unwrap();
    let env = env_for(&h, policy, &h.dlq_url).await;
    h.send_jobs(&[("short-lived", json!({"outcome": "ok"}))]).await;
    // Each delivery is deferred until the retention's end (less its margin); the delivery
    // then is dead-lettered. Bounded: about a minute of the queue's own clock.
    let start = std::time::Instant::now();
    let mut dlq = Vec::new();
    while dlq.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(120), "never dead-lettered");
        let messages = h.receive(&h.queue_url, Duration::from_secs(5)).await;
        if !messages.is_empty() {
            let outcome = process(&env, &messages, &h.queue_url, Duration::from_secs(30)).await;
            for (m, r) in messages.iter().zip(&outcome.records) {
                if r.settled {
                    h.sqs
                        .delete_message()
                        .queue_url(&h.queue_url)
                        .receipt_handle(m.receipt_handle().unwrap())
                        .send()
                        .await
                        .unwrap();
                }
            }
        }
        dlq = h.dlq_messages().await;
    }
    let r = record_of(&dlq[0]);
    assert_eq!(r.class, FailureClass::Expiring, "{r:?}");
    assert!(r.error.contains("retention"), "{r:?}");
    assert!(
        h.executions("short-lived").is_empty(),
        "never ran: the breaker was open"
    );
}

/// Review finding: a handler that never yields (it blocks its thread) is still stopped at the
/// report margin before the deadline: the batch answers without waiting for it, the record
/// is retried, and the other records of the batch run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_blocks_its_thread_cannot_hold_the_batch_past_its_deadline() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let release = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (r, f) = (release.clone(), finished.clone());
    let h = Harness::build(Options {
        prefix: "blocking",
        register: Box::new(move |registry, _| {
            registry.handle_with(
                "blocking",
                fast_policy(5),
                quiet_breaker(),
                move |_: serde_json::Value, _| {
                    let (r, f) = (r.clone(), f.clone());
                    async move {
                        // Blocks its thread (no await) until the test lets it go.
                        while !r.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        f.store(true, Ordering::SeqCst);
                        Ok(())
                    }
                },
            )
        }),
        ..Options::default()
    })
    .await;
    // Should the batch wait for the handler after all, it is let go in the end, so the test
    // fails rather than hangs.
    let watchdog = release.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        watchdog.store(true, Ordering::SeqCst);
    });
    h.send_raw(&[(r#"{"type":"blocking","id":"b1"}"#, None)]).await;
    h.send_jobs(&[("ok1", json!({"outcome": "ok"}))]).await;
    let m = h.receive_n(2).await;
    let outcome = process(&h.env, &m, &h.queue_url, Duration::from_secs(4)).await;
    let stuck = finished.load(Ordering::SeqCst);
    release.store(true, Ordering::SeqCst);
    assert!(!stuck, "the batch waited for the blocked handler to end");
    let report = |job: &str| {
        outcome
            .records
            .iter()
            .find(|r| r.job_id == job)
            .unwrap_or_else(|| panic!("{job} reported: {:?}", outcome.records))
    };
    assert!(
        matches!(report("b1").decision, sqs_triage::core::Decision::Retry { .. }),
        "{:?}",
        report("b1")
    );
    assert!(!report("b1").settled);
    assert!(report("ok1").settled, "{:?}", report("ok1"));
}

/// A record received more often than the receive limit the function was given
/// (`TRIAGE_QUEUE_MAX_RECEIVE` lower than the queue's real `maxReceiveCount`) is counted as
/// `PastReceiveLimit`: the sign that records are taken to be on their last receive too early.
/// Records within the limit are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_past_the_configured_limit_is_counted() {
    let h = Harness::build(Options {
        prefix: "pastlimit",
        ..Options::default()
    })
    .await;
    h.set_redrive(10).await;
    let facts = sqs_triage::config::QueueFacts {
        retention: Duration::from_secs(4 * 24 * 3600),
        visibility: Duration::from_secs(30),
        max_receive: Some(2),
    };
    let env = env_with(&h, fast_policy(5), &h.dlq_url, Some(facts)).await;
    let body = |id: &str| {
        json!({"type": triage::demo::chaos::CHAOS, "id": id, "payload": {"outcome": "ok"}}).to_string()
    };
    h.send_raw(&[(&body("past"), None)]).await;
    let past_limit =
        |outcome: &sqs_triage::processor::BatchOutcome| metric_count(outcome, "PastReceiveLimit");
    // Receives 1 and 2 are within the limit; the third is past it.
    for receive in 1..=3u32 {
        let messages = h.receive_n(1).await;
        let count: u32 = messages[0].attributes().unwrap()
            [&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount]
            .parse()
            .unwrap();
        assert_eq!(count, receive);
        if receive < 3 {
            // Within the limit, and at it: not counted.
            let outcome = process(&env, &messages, &h.queue_url, Duration::from_secs(30)).await;
            assert_eq!(
                past_limit(&outcome),
                0,
                "receive {receive}: {:?}",
                outcome.metrics
            );
            h.release(&h.queue_url, &messages).await;
            continue;
        }
        h.send_raw(&[(&body("fresh"), None)]).await;
        let mut batch = messages;
        batch.extend(h.receive_n(1).await);
        let outcome = process(&env, &batch, &h.queue_url, Duration::from_secs(30)).await;
        assert_eq!(past_limit(&outcome), 1, "{:?}", outcome.metrics);
        assert_eq!(
            metric_count(&outcome, "OtherSourceQueue"),
            0,
            "{:?}",
            outcome.metrics
        );
        assert!(
            outcome.records.iter().all(|r| r.executed),
            "{:?}",
            outcome.records
        );
    }
}

/// A metric's count over every job type of a batch.
fn metric_count(outcome: &sqs_triage::processor::BatchOutcome, metric: &str) -> u64 {
    outcome
        .metrics
        .by_type
        .values()
        .filter_map(|m| m.counts.get(metric))
        .sum()
}

/// Records whose event source ARN names another queue than `TRIAGE_QUEUE_URL` (a function
/// mapped to a queue it was not configured for: another name, or the same name in another
/// account) are counted as `OtherSourceQueue`, and still run; records of the configured queue
/// are not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_from_another_queue_than_the_configured_one_are_counted() {
    let h = Harness::build(Options {
        prefix: "otherq",
        ..Options::default()
    })
    .await;
    let env = env_for(&h, fast_policy(5), &h.dlq_url).await;
    let body = |id: &str| {
        json!({"type": triage::demo::chaos::CHAOS, "id": id, "payload": {"outcome": "ok"}}).to_string()
    };
    h.send_raw(&[(&body("a"), None), (&body("b"), None)]).await;
    let messages = h.receive_n(2).await;
    let other = format!("{}-elsewhere", h.queue_url);
    let outcome = process(&env, &messages, &other, Duration::from_secs(30)).await;
    assert_eq!(
        metric_count(&outcome, "OtherSourceQueue"),
        2,
        "{:?}",
        outcome.metrics
    );
    assert!(
        outcome.records.iter().all(|r| r.executed),
        "{:?}",
        outcome.records
    );
    // A queue of the same name in another account: counted.
    let account = h.queue_url.rsplit('/').nth(1).unwrap().to_owned();
    let elsewhere = h.queue_url.replace(&format!("/{account}/"), "/210987654321/");
    assert_ne!(elsewhere, h.queue_url, "the test needs another account");
    let outcome = process(&env, &messages, &elsewhere, Duration::from_secs(30)).await;
    assert_eq!(
        metric_count(&outcome, "OtherSourceQueue"),
        2,
        "{:?}",
        outcome.metrics
    );
    // The configured queue: not counted.
    let outcome = process(&env, &messages, &h.queue_url, Duration::from_secs(30)).await;
    assert_eq!(
        metric_count(&outcome, "OtherSourceQueue"),
        0,
        "{:?}",
        outcome.metrics
    );
}

/// Item: a redelivery's ledger read and its breaker's read go out side by side, so a batch
/// waits one storage round trip before its handlers, not two. The proxy holds both reads
/// (the breaker's cache is off, so the batch reads it): both must be on the wire at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeliverys_ledger_read_and_its_breakers_read_go_out_together() {
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let breaker = sqs_triage::core::breaker::BreakerConfig::builder()
        .min_executions(100_000)
        .cache_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let h = Harness::build(Options {
        prefix: "readstogether",
        breaker,
        ddb_endpoint: Some(proxy.url()),
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("again", json!({"outcome": "ok"}))]).await;
    // Received, visible again at once, received a second time: a redelivery.
    let mut first = Vec::new();
    for _ in 0..10 {
        first.extend(h.receive(&h.queue_url, Duration::from_secs(1)).await);
        if !first.is_empty() {
            break;
        }
    }
    assert_eq!(first.len(), 1);
    h.sqs
        .change_message_visibility()
        .queue_url(&h.queue_url)
        .receipt_handle(first[0].receipt_handle().unwrap())
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let mut second = Vec::new();
    for _ in 0..10 {
        second.extend(h.receive(&h.queue_url, Duration::from_secs(1)).await);
        if !second.is_empty() {
            break;
        }
    }
    assert_eq!(second.len(), 1);
    let count = second[0].attributes().unwrap()
        [&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount]
        .clone();
    assert_eq!(count, "2", "a redelivery");

    proxy.reset_counts();
    proxy.add_rule(support::fault_proxy::FaultRule {
        ops: Some(vec!["GetItem".into(), "BatchGetItem".into()]),
        body_contains: None,
        fault: Fault::Hold,
        times: None,
    });
    let reads = async {
        let both = proxy.until_held(2, Duration::from_secs(10)).await;
        proxy.release_held();
        both
    };
    let (both, response) = tokio::join!(reads, h.invoke_with(&second, Duration::from_secs(60)));
    assert!(
        both,
        "the ledger's read and the breaker's were not on the wire at once: {:?}",
        proxy.counts()
    );
    assert_eq!(
        proxy.count("BatchGetItem"),
        1,
        "the ledger read: {:?}",
        proxy.counts()
    );
    assert_eq!(
        proxy.count("GetItem"),
        1,
        "the breaker read: {:?}",
        proxy.counts()
    );
    let response = response.expect("a batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(h.executions("again").len(), 1, "the job ran once");
}
