//! The fault proxy, checked with the real SDK against the local stack: counts match
//! the calls made, injected throttles / 5xx / resets are retried by the SDK's
//! standard retry, and errors are classified as the real services' errors would be.
//! Needs `bash infra/local/stack.sh start` and `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{AttributeValue, KeyType};
use support::fault_proxy::{Fault, FaultPlan, FaultProxy, FaultRule};
use support::{ddb_client, ddb_client_via_with, ddb_endpoint, fast_retry, sqs_client, sqs_client_via_with};

async fn create_table() -> String {
    let table = support::unique_name("proxy-test");
    support::hand_table(&ddb_client().await, &table, &[("pk", KeyType::Hash)]).await;
    table
}

async fn create_queue(prefix: &str) -> String {
    sqs_client()
        .await
        .create_queue()
        .queue_name(support::unique_name(prefix))
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url")
}

fn ops(names: &[&str]) -> Option<Vec<String>> {
    Some(names.iter().map(|s| s.to_string()).collect())
}

fn map(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

async fn put(ddb: &aws_sdk_dynamodb::Client, table: &str, pk: &str) {
    ddb.put_item()
        .table_name(table)
        .item("pk", AttributeValue::S(pk.into()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put {pk}: {e:?}"));
}

#[tokio::test]
async fn ddb_counts_match_calls() {
    let table = create_table().await;
    let proxy = FaultProxy::start(&ddb_endpoint());
    let ddb = ddb_client_via_with(&proxy.url(), fast_retry(3)).await;

    for i in 0..5 {
        put(&ddb, &table, &format!("k{i}")).await;
    }
    for i in 0..3 {
        let got = ddb
            .get_item()
            .table_name(&table)
            .key("pk", AttributeValue::S(format!("k{i}")))
            .send()
            .await
            .expect("get");
        assert!(got.item.is_some());
    }
    ddb.update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("k0".into()))
        .update_expression("ADD attempts :one")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("update");

    assert_eq!(
        proxy.counts(),
        map(&[("GetItem", 3), ("PutItem", 5), ("UpdateItem", 1)])
    );
    assert_eq!(proxy.total(), 9);
    assert_eq!(proxy.count("PutItem"), 5);
    assert!(proxy.faults().is_empty());

    proxy.reset_counts();
    assert!(proxy.counts().is_empty());
    assert_eq!(proxy.total(), 0);
}

#[tokio::test]
async fn ddb_single_faults_are_retried_by_the_sdk() {
    let table = create_table().await;
    let proxy = FaultProxy::start(&ddb_endpoint());
    let ddb = ddb_client_via_with(&proxy.url(), fast_retry(3)).await;

    let kinds = [
        Fault::Throttle,
        Fault::ThrottlingException,
        Fault::Status500,
        Fault::Status503,
        Fault::Reset,
    ];
    for (i, fault) in kinds.iter().enumerate() {
        proxy.reset_counts();
        proxy.fail_next(1, fault.clone(), ops(&["PutItem"]));
        put(&ddb, &table, &format!("retry-{i}")).await;
        assert_eq!(
            proxy.count("PutItem"),
            2,
            "{fault:?}: one failed attempt, one retry"
        );
        assert_eq!(proxy.faults(), map(&[(&fault.kind_name(), 1)]), "{fault:?}");
    }

    // fail_next(2) with 3 attempts allowed still succeeds on the third attempt.
    proxy.reset_counts();
    proxy.fail_next(2, Fault::Throttle, None);
    put(&ddb, &table, "two-faults").await;
    assert_eq!(proxy.count("PutItem"), 3);

    // Latency injection forwards the request after the delay.
    proxy.reset_counts();
    proxy.fail_next(1, Fault::Delay(Duration::from_millis(100)), None);
    let t = std::time::Instant::now();
    put(&ddb, &table, "delayed").await;
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert_eq!(proxy.count("PutItem"), 1);
    assert_eq!(proxy.faults(), map(&[("Delay", 1)]));
}

#[tokio::test]
async fn ddb_full_throttle_surfaces_provisioned_throughput_exceeded() {
    let table = create_table().await;
    let proxy = FaultProxy::start(&ddb_endpoint());
    let ddb = ddb_client_via_with(&proxy.url(), fast_retry(3)).await;
    proxy.set_faults(FaultPlan {
        share: 1.0,
        kinds: vec![Fault::Throttle],
        only_ops: ops(&["GetItem"]),
        spare_body_containing: None,
        seed: 1,
    });

    let err = ddb
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("x".into()))
        .send()
        .await
        .expect_err("every attempt is throttled");
    assert_eq!(
        err.code(),
        Some("ProvisionedThroughputExceededException"),
        "{err:?}"
    );
    assert!(
        err.as_service_error()
            .is_some_and(|e| e.is_provisioned_throughput_exceeded_exception()),
        "modeled error expected: {err:?}"
    );
    assert_eq!(
        proxy.count("GetItem"),
        3,
        "the SDK's 3 attempts all reached the proxy"
    );

    // A ThrottlingException variant is parsed too.
    proxy.clear_faults();
    proxy.fail_always("GetItem", Fault::ThrottlingException);
    let err = ddb
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("x".into()))
        .send()
        .await
        .expect_err("throttled");
    assert_eq!(err.code(), Some("ThrottlingException"), "{err:?}");

    // Other operations are untouched.
    put(&ddb, &table, "not-throttled").await;
    proxy.clear_faults();
    ddb.get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("x".into()))
        .send()
        .await
        .expect("faults cleared");
}

async fn run_random_plan(table: &str, seed: u64) -> (BTreeMap<String, u64>, u64) {
    let proxy = FaultProxy::start(&ddb_endpoint());
    let ddb = ddb_client_via_with(&proxy.url(), fast_retry(10)).await;
    proxy.set_faults(FaultPlan {
        share: 0.3,
        kinds: vec![Fault::Throttle, Fault::Status500, Fault::Status503, Fault::Reset],
        only_ops: None,
        spare_body_containing: None,
        seed,
    });
    for i in 0..30 {
        put(&ddb, table, &format!("rand-{seed}-{i}")).await;
    }
    // Every injected fault cost exactly one extra attempt.
    assert_eq!(proxy.count("PutItem"), 30 + proxy.faults_injected());
    (proxy.faults(), proxy.total())
}

#[tokio::test]
async fn ddb_random_plan_is_deterministic_and_retried() {
    let table = create_table().await;
    let (faults_a, total_a) = run_random_plan(&table, 42).await;
    let (faults_b, total_b) = run_random_plan(&table, 42).await;
    assert!(
        faults_a.values().sum::<u64>() > 0,
        "a 30% plan over 30+ requests injects something"
    );
    assert_eq!(faults_a, faults_b);
    assert_eq!(total_a, total_b);
}

#[tokio::test]
async fn sqs_throttle_retried_and_classified() {
    let url = create_queue("proxy-test").await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let sqs = sqs_client_via_with(&proxy.url(), fast_retry(3)).await;

    // One throttle, then success.
    proxy.fail_next(1, Fault::Throttle, ops(&["SendMessage"]));
    sqs.send_message()
        .queue_url(&url)
        .message_body("hello")
        .send()
        .await
        .expect("retried send");
    assert_eq!(proxy.count("SendMessage"), 2);
    assert_eq!(proxy.faults(), map(&[("Throttle", 1)]));

    // 100% throttling: the SDK gives up after 3 attempts with the throttling code.
    proxy.reset_counts();
    proxy.fail_always("SendMessage", Fault::Throttle);
    let err = sqs
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .send()
        .await
        .expect_err("throttled");
    assert_eq!(err.code(), Some("ThrottlingException"), "{err:?}");
    assert_eq!(proxy.count("SendMessage"), 3);

    proxy.clear_faults();
    proxy.fail_always("SendMessage", Fault::RequestThrottled);
    let err = sqs
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .send()
        .await
        .expect_err("throttled");
    assert_eq!(err.code(), Some("RequestThrottled"), "{err:?}");
    assert!(
        err.as_service_error().is_some_and(|e| e.is_request_throttled()),
        "{err:?}"
    );

    // A queue that rejects every send (e.g. a broken DLQ): not retried, code kept.
    proxy.clear_faults();
    proxy.reset_counts();
    let dlq_url = create_queue("proxy-test-dlq").await;
    proxy.add_rule(FaultRule {
        ops: ops(&["SendMessage", "SendMessageBatch"]),
        body_contains: Some(dlq_url.clone()),
        fault: Fault::Error {
            status: 403,
            code: "AccessDeniedException".into(),
        },
        times: None,
    });
    let err = sqs
        .send_message()
        .queue_url(&dlq_url)
        .message_body("x")
        .send()
        .await
        .expect_err("rejected");
    assert_eq!(err.code(), Some("AccessDeniedException"), "{err:?}");
    assert_eq!(proxy.count("SendMessage"), 1, "not retried");
    // The main queue still works through the same proxy.
    sqs.send_message()
        .queue_url(&url)
        .message_body("ok")
        .send()
        .await
        .expect("main queue send");

    // Reset and 5xx are retried for SQS too; receive sees the messages.
    proxy.clear_faults();
    proxy.fail_next(1, Fault::Reset, ops(&["ReceiveMessage"]));
    proxy.fail_next(1, Fault::Status503, ops(&["ReceiveMessage"]));
    let got = sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .send()
        .await
        .expect("receive after reset and 503");
    assert_eq!(got.messages.unwrap_or_default().len(), 2);
    assert_eq!(proxy.count("ReceiveMessage"), 3);
}

#[tokio::test]
async fn proxy_stops_on_drop() {
    let proxy = FaultProxy::start(&ddb_endpoint());
    let addr = proxy.addr();
    assert!(std::net::TcpStream::connect(addr).is_ok());
    drop(proxy);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "listener closed on drop"
    );
}
