//! Start-up checks and `triage setup` on the local stack, through the real SDK: a runtime
//! refuses a configuration that cannot work (missing DLQ or table, a table with another key
//! schema, the source queue as its own DLQ) and runs degraded, loudly, when a check is only
//! throttled; `triage setup` verifies what it finds instead of accepting it (key schema, TTL
//! attribute, the DLQ's redrive-allow policy) and two setups at once both succeed; a queue ARN
//! in another region is honoured.
//!
//! Needs the local stack: `bash infra/local/stack.sh start` and
//! `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{KeyType, TimeToLiveSpecification};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};
use sqs_triage::config::Config;
use sqs_triage::effects::storage_retry::{dynamodb_config, sqs_config};
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::env::{StartupError, build, build_with};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};

const BIN: &str = env!("CARGO_BIN_EXE_triage");
const ACCOUNT: &str = "123456789012";

fn triage(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(args)
        .env_remove("TRIAGE_QUEUE_URL")
        .env_remove("TRIAGE_DLQ_URL")
        .env_remove("TRIAGE_TABLE")
        .env_remove("TRIAGE_MAX_ATTEMPTS")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    triage(args, env).output().expect("run triage")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "triage failed ({:?}): {}",
        o.status.code(),
        stderr(o)
    );
    serde_json::from_slice(&o.stdout).expect("stdout is JSON")
}

/// The one `error:` line of a failed run, which must exit with `code`.
fn error_line(o: &Output, code: i32) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    lines[0].to_owned()
}

/// Waits for a started process to exit, killing it (and failing) after `limit`.
fn exit_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what}: still running after {limit:?} (a start-up that cannot work must exit); stderr:\n{}",
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `triage worker` with the three variables set; returns its output once it exits.
fn worker_exit(queue: &str, dlq: &str, table: &str, extra: &[(&str, &str)]) -> Output {
    let mut env = vec![
        ("TRIAGE_QUEUE_URL", queue),
        ("TRIAGE_DLQ_URL", dlq),
        ("TRIAGE_TABLE", table),
        ("RUST_LOG", "warn"),
    ];
    env.extend_from_slice(extra);
    let child = triage(&["worker", "--demo-handlers"], &env)
        .spawn()
        .expect("spawn worker");
    exit_within(child, Duration::from_secs(60), "triage worker")
}

fn config(queue: &str, dlq: &str, table: &str) -> Config {
    let vars = [
        ("TRIAGE_QUEUE_URL", queue.to_owned()),
        ("TRIAGE_DLQ_URL", dlq.to_owned()),
        ("TRIAGE_TABLE", table.to_owned()),
    ];
    Config::from_lookup(&|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())).unwrap()
}

fn registry(config: &Config) -> Registry {
    Registry::new(config.policy.clone(), config.breaker)
}

/// The Lambda's path: `runtime::env::build` with the container's SDK configuration.
async fn lambda_build(queue: &str, dlq: &str, table: &str) -> Result<(), StartupError> {
    let c = config(queue, dlq, table);
    match build(&c, registry(&c), &support::sdk_config().await).await {
        Ok(_) => Ok(()),
        Err(e) => Err(*e
            .downcast::<StartupError>()
            .unwrap_or_else(|e| panic!("not a StartupError: {e}"))),
    }
}

/// A table keyed on `id` alone (not the state table's `pk`/`sk`).
async fn table_with_other_key(name: &str) {
    support::hand_table(&support::ddb_client().await, name, &[("id", KeyType::Hash)]).await;
}

fn missing_queue_url() -> String {
    format!(
        "{}/{ACCOUNT}/{}",
        support::sqs_endpoint().trim_end_matches('/'),
        support::unique_name("never-created")
    )
}

// ------------------------------------------------------------------ start-up refusals

#[tokio::test(flavor = "multi_thread")]
async fn worker_refuses_a_dlq_that_does_not_exist() {
    let r = support::fresh_resources("su-nodlq", false).await;
    let o = worker_exit(&r.queue_url, &missing_queue_url(), &r.table, &[]);
    let line = error_line(&o, 2);
    assert!(
        line.contains("TRIAGE_DLQ_URL") && line.contains("does not exist"),
        "{line}"
    );

    let e = lambda_build(&r.queue_url, &missing_queue_url(), &r.table)
        .await
        .unwrap_err();
    assert_eq!(e.var, "TRIAGE_DLQ_URL", "{e}");
    assert!(e.misconfigured, "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_refuses_a_dlq_it_is_denied() {
    let r = support::fresh_resources("su-denied", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Error {
            status: 403,
            code: "AccessDenied".into(),
        },
        times: None,
    });
    let o = worker_exit(
        &r.queue_url,
        &r.dlq_url,
        &r.table,
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    let line = error_line(&o, 2);
    assert!(
        line.contains("TRIAGE_DLQ_URL") && line.contains("AccessDenied"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_refuses_a_table_that_does_not_exist() {
    let r = support::fresh_resources("su-notable", false).await;
    let missing = support::unique_name("no-such-table");
    let o = worker_exit(&r.queue_url, &r.dlq_url, &missing, &[]);
    let line = error_line(&o, 2);
    assert!(line.contains("TRIAGE_TABLE") && line.contains(&missing), "{line}");

    let e = lambda_build(&r.queue_url, &r.dlq_url, &missing)
        .await
        .unwrap_err();
    assert_eq!(e.var, "TRIAGE_TABLE", "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_refuses_a_table_with_another_key_schema() {
    let r = support::fresh_resources("su-badkey", false).await;
    let other = support::unique_name("su-badkey-t");
    table_with_other_key(&other).await;
    let o = worker_exit(&r.queue_url, &r.dlq_url, &other, &[]);
    let line = error_line(&o, 2);
    assert!(line.contains("TRIAGE_TABLE") && line.contains("key"), "{line}");

    let e = lambda_build(&r.queue_url, &r.dlq_url, &other).await.unwrap_err();
    assert_eq!(e.var, "TRIAGE_TABLE", "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_refuses_the_source_queue_as_its_own_dlq() {
    let r = support::fresh_resources("su-self", false).await;
    let o = worker_exit(&r.queue_url, &r.queue_url, &r.table, &[]);
    let line = error_line(&o, 2);
    assert!(
        line.contains("TRIAGE_DLQ_URL") && line.contains("TRIAGE_QUEUE_URL"),
        "{line}"
    );

    let e = lambda_build(&r.queue_url, &r.queue_url, &r.table)
        .await
        .unwrap_err();
    assert_eq!(e.var, "TRIAGE_DLQ_URL", "{e}");
    // The same queue under another spelling of its URL: the ARNs tell.
    let spelled = r.queue_url.replace("127.0.0.1", "localhost");
    assert_ne!(spelled, r.queue_url);
    let e = lambda_build(&r.queue_url, &spelled, &r.table).await.unwrap_err();
    assert_eq!(e.var, "TRIAGE_DLQ_URL", "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_dlq_read_runs_degraded_and_says_so() {
    let r = support::fresh_resources("su-throttle", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Throttle,
        times: None,
    });
    let c = config(&r.queue_url, &r.dlq_url, &r.table);
    let sdk = support::sdk_config().await;
    let env = build_with(
        &c,
        registry(&c),
        sqs_config(&sdk).endpoint_url(proxy.url()),
        dynamodb_config(&sdk),
    )
    .await
    .expect("a throttled DLQ read does not stop the start-up");
    assert!(
        env.startup_warnings.iter().any(|w| w.contains("TRIAGE_DLQ_URL")),
        "{:?}",
        env.startup_warnings
    );
    assert!(
        proxy.faults_injected() > 1,
        "the read was retried: {:?}",
        proxy.faults()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redrive_target_other_than_the_dlq_is_a_warning() {
    let r = support::fresh_resources("su-split", false).await;
    let other = support::fresh_resources("su-split-b", false).await;
    let c = config(&r.queue_url, &other.dlq_url, &r.table);
    let env = build(&c, registry(&c), &support::sdk_config().await)
        .await
        .expect("a mismatched redrive target is not fatal");
    assert!(
        env.startup_warnings
            .iter()
            .any(|w| w.contains(&r.dlq_arn) && w.contains(&other.dlq_arn)),
        "{:?}",
        env.startup_warnings
    );
    // The configuration `triage setup` made has no warning.
    let c = config(&r.queue_url, &r.dlq_url, &r.table);
    let env = build(&c, registry(&c), &support::sdk_config().await)
        .await
        .unwrap();
    assert!(env.startup_warnings.is_empty(), "{:?}", env.startup_warnings);
}

// ------------------------------------------------------------------ setup verifies

fn setup_args<'a>(q: &'a str, dlq: &'a str, table: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["setup", "--queue", q, "--dlq", dlq, "--table", table, "--json"];
    v.extend_from_slice(extra);
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_refuses_a_table_with_another_key_schema() {
    let q = support::unique_name("su-key");
    let table = format!("{q}-t");
    table_with_other_key(&table).await;
    let o = run(&setup_args(&q, &format!("{q}-dlq"), &table, &[]), &[]);
    let line = error_line(&o, 2);
    assert!(line.contains(&table) && line.contains("key schema"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_refuses_ttl_on_another_attribute() {
    let q = support::unique_name("su-ttl");
    let table = format!("{q}-t");
    let ddb = support::ddb_client().await;
    sqs_triage::effects::table::create_table(&ddb, &table).await.ok();
    // A fresh table from create_table has TTL on expires_at; build one with TTL elsewhere.
    let other = format!("{q}-t2");
    support::hand_table(&ddb, &other, &[("pk", KeyType::Hash), ("sk", KeyType::Range)]).await;
    ddb.update_time_to_live()
        .table_name(&other)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("ttl")
                .enabled(true)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let o = run(&setup_args(&q, &format!("{q}-dlq"), &other, &[]), &[]);
    let line = error_line(&o, 2);
    assert!(line.contains("ttl") && line.contains("expires_at"), "{line}");
}

/// Another setup enabled TTL between this one's DescribeTimeToLive and UpdateTimeToLive:
/// DynamoDB answers "TimeToLive is already enabled", which is success when the attribute is
/// ours. The proxy replays the race: the describe answers DISABLED once, after TTL is on.
#[tokio::test(flavor = "multi_thread")]
async fn setup_treats_ttl_enabled_meanwhile_as_done() {
    let q = support::unique_name("su-ttlrace");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    ok_json(&run(&setup_args(&q, &dlq, &table, &[]), &[]));
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["DescribeTimeToLive".into()]),
        body_contains: None,
        fault: Fault::Body {
            status: 200,
            body: json!({"TimeToLiveDescription": {"TimeToLiveStatus": "DISABLED"}}).to_string(),
        },
        times: Some(1),
    });
    let o = run(
        &setup_args(&q, &dlq, &table, &[]),
        &[("AWS_ENDPOINT_URL_DYNAMODB", &proxy.url())],
    );
    ok_json(&o);
    assert_eq!(proxy.count("UpdateTimeToLive"), 1, "{:?}", proxy.counts());
}

/// Two setups of one table and DLQ at once (two source queues): both succeed. Each one's
/// DescribeTimeToLive is held until both have asked, so both read TTL as disabled before
/// either enables it.
#[tokio::test(flavor = "multi_thread")]
async fn two_setups_at_once_both_succeed() {
    let q = support::unique_name("su-twice");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    proxy.fail_always("DescribeTimeToLive", Fault::Hold);
    let url = proxy.url();
    let env = [("AWS_ENDPOINT_URL_DYNAMODB", url.as_str())];
    let (qa, qb) = (format!("{q}-a"), format!("{q}-b"));
    let a = triage(&setup_args(&qa, &dlq, &table, &[]), &env).spawn().unwrap();
    let b = triage(&setup_args(&qb, &dlq, &table, &[]), &env).spawn().unwrap();
    let both = proxy.until_held(2, Duration::from_secs(60)).await;
    proxy.release_held();
    let a = exit_within(a, Duration::from_secs(60), "setup a");
    let b = exit_within(b, Duration::from_secs(60), "setup b");
    assert!(both, "the two setups never both read TTL: {:?}", proxy.counts());
    let (a, b) = (ok_json(&a), ok_json(&b));
    assert_eq!(a["dlq_arn"], b["dlq_arn"]);
    assert_eq!(a["table"], b["table"]);
}

/// A DLQ's redrive-allow policy as the proxy reports it (moto stores the attribute but never
/// returns it, so the proxy answers the DLQ's GetQueueAttributes in SQS's place).
fn dlq_attributes(dlq_name: &str, allow: Value) -> String {
    json!({"Attributes": {
        "QueueArn": format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{dlq_name}"),
        "RedriveAllowPolicy": allow.to_string(),
    }})
    .to_string()
}

/// What identifies a request about the DLQ: the end of its URL (moto builds queue URLs
/// from the host it is called on, the proxy's here) and the closing quote, so the source
/// queue (whose name the DLQ's starts with) does not match.
fn dlq_url_of(dlq_name: &str) -> String {
    format!("/{ACCOUNT}/{dlq_name}\"")
}

/// A proxy reporting `allow` as the DLQ's redrive-allow policy (every read, or the first
/// `reads`), and counting the writes of a redrive-allow policy (`Delay` faults of zero), or
/// refusing them.
fn allow_proxy(dlq_name: &str, allow: Value, refuse_writes: bool) -> FaultProxy {
    allow_proxy_for(dlq_name, allow, refuse_writes, None)
}

fn allow_proxy_for(dlq_name: &str, allow: Value, refuse_writes: bool, reads: Option<u64>) -> FaultProxy {
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SetQueueAttributes".into()]),
        body_contains: Some("redrivePermission".into()),
        fault: if refuse_writes {
            Fault::Error {
                status: 400,
                code: "RewriteNotExpected".into(),
            }
        } else {
            Fault::Delay(Duration::ZERO)
        },
        times: None,
    });
    proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(dlq_url_of(dlq_name)),
        fault: Fault::Body {
            status: 200,
            body: dlq_attributes(dlq_name, allow),
        },
        times: reads,
    });
    proxy
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_keeps_an_allow_all_dlq_as_it_is() {
    let q = support::unique_name("su-allowall");
    let dlq = format!("{q}-dlq");
    let proxy = allow_proxy(&dlq, json!({"redrivePermission": "allowAll"}), true);
    let o = run(
        &setup_args(&q, &dlq, &format!("{q}-t"), &[]),
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    ok_json(&o);
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_refuses_a_deny_all_dlq_unless_told() {
    let q = support::unique_name("su-denyall");
    let dlq = format!("{q}-dlq");
    let table = format!("{q}-t");
    let proxy = allow_proxy(&dlq, json!({"redrivePermission": "denyAll"}), true);
    let o = run(
        &setup_args(&q, &dlq, &table, &[]),
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    let line = error_line(&o, 2);
    assert!(
        line.contains("denyAll") && line.contains("--replace-deny-all"),
        "{line}"
    );

    // After the rewrite, reads go to moto, which does not report the attribute.
    let proxy = allow_proxy_for(&dlq, json!({"redrivePermission": "denyAll"}), false, Some(1));
    let o = run(
        &setup_args(&q, &dlq, &table, &["--replace-deny-all"]),
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    ok_json(&o);
    assert_eq!(
        proxy.faults().get("Delay"),
        Some(&1),
        "one rewrite: {:?}",
        proxy.faults()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_never_evicts_a_source_from_a_full_dlq() {
    let q = support::unique_name("su-full");
    let dlq = format!("{q}-dlq");
    let ten: Vec<String> = (0..10)
        .map(|i| format!("arn:aws:sqs:us-east-1:{ACCOUNT}:other-{i}"))
        .collect();
    let proxy = allow_proxy(
        &dlq,
        json!({"redrivePermission": "byQueue", "sourceQueueArns": ten}),
        true,
    );
    let o = run(
        &setup_args(&q, &dlq, &format!("{q}-t"), &[]),
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    let line = error_line(&o, 2);
    assert!(line.contains("10") && line.contains("allowAll"), "{line}");
}

/// A concurrent setup of another source overwrote the policy between this setup's write and
/// its check: the check finds this source missing and adds it again, keeping the other one.
#[tokio::test(flavor = "multi_thread")]
async fn setup_adds_its_source_again_when_a_concurrent_setup_overwrote_it() {
    let q = support::unique_name("su-lost");
    let dlq = format!("{q}-dlq");
    let other = format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{q}-other");
    let ours = format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{q}");
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SetQueueAttributes".into()]),
        body_contains: Some("redrivePermission".into()),
        fault: Fault::Delay(Duration::ZERO),
        times: None,
    });
    let reads = [
        // Before the write: nothing yet; after it, the other setup's policy alone.
        json!({"redrivePermission": "byQueue", "sourceQueueArns": []}),
        json!({"redrivePermission": "byQueue", "sourceQueueArns": [other]}),
    ];
    for allow in reads {
        proxy.add_rule(FaultRule {
            ops: Some(vec!["GetQueueAttributes".into()]),
            body_contains: Some(dlq_url_of(&dlq)),
            fault: Fault::Body {
                status: 200,
                body: dlq_attributes(&dlq, allow),
            },
            times: Some(1),
        });
    }
    // Every later read: both sources.
    proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(dlq_url_of(&dlq)),
        fault: Fault::Body {
            status: 200,
            body: dlq_attributes(
                &dlq,
                json!({"redrivePermission": "byQueue", "sourceQueueArns": [other, ours]}),
            ),
        },
        times: None,
    });
    let o = run(
        &setup_args(&q, &dlq, &format!("{q}-t"), &[]),
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    ok_json(&o);
    assert_eq!(
        proxy.faults().get("Delay"),
        Some(&2),
        "written again: {:?}",
        proxy.faults()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_sets_the_visibility_timeout_only_when_asked() {
    let q = support::unique_name("su-vis");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let v = ok_json(&run(
        &setup_args(&q, &dlq, &table, &["--visibility-timeout", "360"]),
        &[],
    ));
    let url = v["queue_url"].as_str().unwrap().to_owned();
    let sqs = support::sqs_client().await;
    let vis = |sqs: aws_sdk_sqs::Client, url: String| async move {
        sqs.get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::VisibilityTimeout)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&QueueAttributeName::VisibilityTimeout]
            .clone()
    };
    assert_eq!(vis(sqs.clone(), url.clone()).await, "360");
    assert_eq!(v["visibility_timeout_s"], 360);
    // Without the flag an existing queue's timeout stays as it is.
    let v = ok_json(&run(&setup_args(&q, &dlq, &table, &[]), &[]));
    assert_eq!(vis(sqs.clone(), url.clone()).await, "360");
    assert_eq!(v["visibility_timeout_s"], 360);

    let o = run(
        &setup_args(&q, &dlq, &table, &["--visibility-timeout", "43201"]),
        &[],
    );
    let line = error_line(&o, 2);
    assert!(line.contains("--visibility-timeout"), "{line}");
}

/// Holds that retention would outrun (100 receives of 5400 s over SQS's default 4 days): refused
/// before the source queue's redrive policy or visibility timeout is written; 48 fit.
#[tokio::test(flavor = "multi_thread")]
async fn setup_refuses_a_redrive_that_retention_would_outrun() {
    let q = support::unique_name("su-hold");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let flags = |n: &'static str| ["--visibility-timeout", "5400", "--max-receive-count", n];
    let o = run(&setup_args(&q, &dlq, &table, &flags("100")), &[]);
    let line = error_line(&o, 2);
    for part in [
        "--max-receive-count 100",
        "maxReceiveCount (100)",
        "MessageRetentionPeriod (345600 s",
        "at most 48",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    let sqs = support::sqs_client().await;
    let url = sqs
        .get_queue_url()
        .queue_name(&q)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let a = support::all_attributes(&sqs, &url).await;
    assert!(!a.contains_key(&QueueAttributeName::RedrivePolicy), "{a:?}");
    assert_eq!(a[&QueueAttributeName::VisibilityTimeout], "30");
    let v = ok_json(&run(&setup_args(&q, &dlq, &table, &flags("48")), &[]));
    assert_eq!(v["max_receive_count"], 48);
}

/// A source queue that keeps messages 14 days: its DLQ (14 days, SQS's longest) would delete
/// what SQS moves into it at once. Refused; a FIFO pair is not, since a FIFO DLQ gives a
/// moved message a new enqueue time.
#[tokio::test(flavor = "multi_thread")]
async fn setup_refuses_a_source_queue_its_dlq_cannot_outlive() {
    let sqs = support::sqs_client().await;
    for fifo in [false, true] {
        let base = support::unique_name("su-ret");
        let q = if fifo {
            format!("{base}.fifo")
        } else {
            base.clone()
        };
        let mut create = sqs
            .create_queue()
            .queue_name(&q)
            .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600");
        if fifo {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        create.send().await.unwrap();
        let o = run(
            &setup_args(&q, &format!("{base}-dlq"), &format!("{base}-t"), &[]),
            &[],
        );
        if fifo {
            ok_json(&o);
            continue;
        }
        let line = error_line(&o, 2);
        assert!(
            line.contains("the DLQ's MessageRetentionPeriod (1209600 s)") && line.contains(&q),
            "{line}"
        );
    }
}

// ------------------------------------------------------------------ ARN regions

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_arn_in_another_region_is_honoured() {
    let sdk = support::sdk_config().await;
    assert_eq!(
        sdk.region().map(|r| r.as_ref()),
        Some("us-east-1"),
        "the stack's region"
    );
    let west = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&sdk)
            .region(aws_sdk_sqs::config::Region::new("us-west-2"))
            .build(),
    );
    let name = support::unique_name("su-west");
    let url = west
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let arn = format!("arn:aws:sqs:us-west-2:{ACCOUNT}:{name}");
    let o = run(
        &["send", "--type", "t", "--payload", "1", "--json"],
        &[("TRIAGE_QUEUE_URL", &arn)],
    );
    ok_json(&o);
    let got = west
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(got.len(), 1, "the job went to the queue in us-west-2");

    // The DLQ commands too.
    let o = run(&["dlq", "list", "--json"], &[("TRIAGE_DLQ_URL", &arn)]);
    ok_json(&o);
    // A queue of another region within the same command is refused, not looked up in the
    // wrong region.
    let r = support::fresh_resources("su-west-to", false).await;
    let o = run(
        &["dlq", "replay", "--to", &arn, "--dry-run", "--json"],
        &[("TRIAGE_DLQ_URL", &r.dlq_url)],
    );
    let line = error_line(&o, 2);
    assert!(line.contains("us-west-2") && line.contains("--to"), "{line}");
    // A malformed region is refused.
    let o = run(
        &["send", "--type", "t", "--json"],
        &[(
            "TRIAGE_QUEUE_URL",
            &format!("arn:aws:sqs:not a region:{ACCOUNT}:{name}"),
        )],
    );
    let line = error_line(&o, 2);
    assert!(line.contains("TRIAGE_QUEUE_URL"), "{line}");
}

/// A queue name SQS says exists with other creation attributes (`QueueAlreadyExists`, the
/// SDK's `QueueNameExists`) is a usage error naming the queue, read from the code of the
/// storage error now that setup's calls go through the storage retry policy.
#[tokio::test(flavor = "multi_thread")]
async fn setup_says_when_a_queue_name_exists_with_other_attributes() {
    let q = support::unique_name("su-exists");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always(
        "CreateQueue",
        Fault::Error {
            status: 400,
            code: "QueueAlreadyExists".into(),
        },
    );
    let o = run(
        &setup_args(&q, &dlq, &table, &[]),
        &[("AWS_ENDPOINT_URL_SQS", &proxy.url())],
    );
    let line = error_line(&o, 2);
    assert!(line.contains("exists with other attributes"), "{line}");
    assert_eq!(proxy.count("CreateQueue"), 1, "a refusal is not retried");
}

/// Both queues take SQS's largest message (1 MiB), as the SAM and CDK stacks make them: the DLQ
/// is never smaller than its source, so every dead-lettered copy fits. Setup brings queues made
/// before (SQS's old 256 KiB default) to the same size.
#[tokio::test(flavor = "multi_thread")]
async fn setup_makes_both_queues_take_1_mib_messages() {
    let q = support::unique_name("su-size");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let sqs = support::sqs_client().await;
    let size = |sqs: aws_sdk_sqs::Client, url: String| async move {
        sqs.get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::MaximumMessageSize)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&QueueAttributeName::MaximumMessageSize]
            .clone()
    };
    // Queues that exist already, at 256 KiB.
    for name in [&q, &dlq] {
        sqs.create_queue()
            .queue_name(name.as_str())
            .attributes(QueueAttributeName::MaximumMessageSize, "262144")
            .send()
            .await
            .unwrap();
    }
    let v = ok_json(&run(&setup_args(&q, &dlq, &table, &[]), &[]));
    let (url, dlq_url) = (
        v["queue_url"].as_str().unwrap().to_owned(),
        v["dlq_url"].as_str().unwrap().to_owned(),
    );
    assert_eq!(size(sqs.clone(), url).await, "1048576");
    assert_eq!(size(sqs.clone(), dlq_url).await, "1048576");

    // Fresh queues too.
    let q = support::unique_name("su-size-new");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let v = ok_json(&run(&setup_args(&q, &dlq, &table, &[]), &[]));
    assert_eq!(
        size(sqs.clone(), v["queue_url"].as_str().unwrap().to_owned()).await,
        "1048576"
    );
    assert_eq!(
        size(sqs.clone(), v["dlq_url"].as_str().unwrap().to_owned()).await,
        "1048576"
    );
}
