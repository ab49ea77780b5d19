//! What start-up calls, and the DLQ's size limit without a start-up read: configured
//! (`TRIAGE_DLQ_MAX_BYTES`, as the stacks set it) or learned at the first DLQ send. With the
//! source queue's attributes configured too (`TRIAGE_QUEUE_*`, as the stacks set them),
//! start-up reads no queue: its one call is the breaker read the first batch would make.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageAttributeValue, QueueAttributeName};
use serde_json::{Value, json};
use sqs_triage::config::Config;
use sqs_triage::core::JobError;
use sqs_triage::effects::dlq::{attribute_size, failure_record};
use sqs_triage::effects::storage_retry::{dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::{Environment, STARTUP_DEADLINE, build_with};
use sqs_triage::runtime::worker::{Worker, WorkerOptions};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};
use triage::demo::chaos;

/// A job type whose handler fails fatally with an error text as long as its payload says.
const BIG_ERROR: &str = "startup.big-error";
/// The DLQ's real size in these tests: far below the 256 KiB assumed while it is unknown.
const DLQ_BYTES: usize = 2_048;

struct Rig {
    sqs: aws_sdk_sqs::Client,
    proxy: FaultProxy,
    /// In front of DynamoDB.
    ddb_proxy: FaultProxy,
    queue_url: String,
    dlq_url: String,
    table: String,
}

/// Fresh queues and table, the DLQ taking [`DLQ_BYTES`], and a proxy in front of SQS and one
/// in front of DynamoDB.
async fn rig(name: &str) -> Rig {
    let created = support::fresh_resources(name, false).await;
    let sqs = support::sqs_client().await;
    sqs.set_queue_attributes()
        .queue_url(&created.dlq_url)
        .attributes(QueueAttributeName::MaximumMessageSize, DLQ_BYTES.to_string())
        .send()
        .await
        .unwrap();
    Rig {
        sqs,
        proxy: FaultProxy::start(&support::sqs_endpoint()),
        ddb_proxy: FaultProxy::start(&support::ddb_endpoint()),
        queue_url: created.queue_url,
        dlq_url: created.dlq_url,
        table: created.table,
    }
}

impl Rig {
    /// Counts (as a fault of zero delay) every `GetQueueAttributes` of the DLQ from now on.
    fn count_dlq_reads(&self) {
        self.proxy.clear_faults();
        self.proxy.add_rule(FaultRule {
            ops: Some(vec!["GetQueueAttributes".into()]),
            body_contains: Some(self.dlq_url.clone()),
            fault: Fault::Delay(Duration::ZERO),
            times: None,
        });
    }

    fn dlq_reads(&self) -> u64 {
        self.proxy.faults().get("Delay").copied().unwrap_or(0)
    }

    async fn build(&self, vars: &[(&str, &str)]) -> Environment {
        self.try_build(vars).await.unwrap()
    }

    async fn try_build(&self, vars: &[(&str, &str)]) -> Result<Environment, String> {
        self.try_build_as(vars, false).await
    }

    /// As the Lambda adapter builds it: the first breaker read left running, awaited at the
    /// first admission.
    async fn build_overlapped(&self, vars: &[(&str, &str)]) -> Environment {
        self.try_build_as(vars, true).await.unwrap()
    }

    async fn try_build_as(&self, vars: &[(&str, &str)], overlapped: bool) -> Result<Environment, String> {
        let mut all = vec![
            ("TRIAGE_QUEUE_URL", self.queue_url.as_str()),
            ("TRIAGE_DLQ_URL", self.dlq_url.as_str()),
            ("TRIAGE_TABLE", self.table.as_str()),
        ];
        // A variable given here wins over the rig's own.
        all.extend_from_slice(vars);
        let mut config = Config::from_lookup(&|k| {
            all.iter()
                .rev()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
        .map_err(|e| e.to_string())?;
        // As the Lambda adapter builds it.
        config.startup_deadline = Some(STARTUP_DEADLINE);
        config.first_read_at_admission = overlapped;
        let registry = chaos::register(
            Registry::new(config.policy.clone(), config.breaker),
            config.policy.clone(),
            config.breaker,
        )
        .handle(BIG_ERROR, |p: Value, _ctx: JobContext| async move {
            let n = p["error_bytes"].as_u64().unwrap_or(10) as usize;
            Err::<(), _>(JobError::fatal("E".repeat(n)))
        });
        let sdk = support::sdk_config().await;
        build_with(
            &config,
            registry,
            sqs_config(&sdk).endpoint_url(self.proxy.url()),
            dynamodb_config(&sdk).endpoint_url(self.ddb_proxy.url()),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// The start-up error for `vars`, which must be refused (`why`).
    async fn refused(&self, vars: &[(&str, &str)], why: &str) -> String {
        match self.try_build(vars).await {
            Ok(_) => panic!("start-up accepted {vars:?}: {why}"),
            Err(e) => e,
        }
    }

    /// The source queue's attributes as `triage setup` made them, and the DLQ's size: the
    /// variables the stacks set from the queues they make.
    async fn stack_vars(&self) -> Vec<(&'static str, String)> {
        let a = support::all_attributes(&self.sqs, &self.queue_url).await;
        let redrive: Value = serde_json::from_str(&a[&QueueAttributeName::RedrivePolicy]).unwrap();
        vec![
            ("TRIAGE_DLQ_MAX_BYTES", DLQ_BYTES.to_string()),
            (
                "TRIAGE_QUEUE_RETENTION_S",
                a[&QueueAttributeName::MessageRetentionPeriod].clone(),
            ),
            (
                "TRIAGE_QUEUE_VISIBILITY_S",
                a[&QueueAttributeName::VisibilityTimeout].clone(),
            ),
            (
                "TRIAGE_QUEUE_MAX_RECEIVE",
                redrive["maxReceiveCount"]
                    .to_string()
                    .trim_matches('"')
                    .to_owned(),
            ),
            // A cache that outlives a slow machine's gap between start-up and the first batch.
            ("TRIAGE_BREAKER_CACHE_MS", "300000".to_owned()),
        ]
    }

    /// Sends `body`, then one worker poll (receive, process, delete what is settled).
    async fn run(&self, env: &Environment, body: &str) -> sqs_triage::processor::BatchOutcome {
        self.sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .send()
            .await
            .unwrap();
        worker(env.clone()).poll_once().await.unwrap().expect("a batch")
    }

    async fn dlq(&self) -> Vec<Message> {
        support::read_all(&self.sqs, &self.dlq_url, 300, 2).await
    }
}

fn big_error(id: &str) -> String {
    json!({"type": BIG_ERROR, "id": id, "payload": {"error_bytes": DLQ_BYTES * 4}}).to_string()
}

fn ok(id: &str) -> String {
    json!({"type": chaos::CHAOS, "id": id, "payload": {"outcome": "ok"}}).to_string()
}

fn size_of(m: &Message) -> usize {
    let attrs: std::collections::HashMap<String, MessageAttributeValue> =
        m.message_attributes().cloned().unwrap_or_default();
    m.body().unwrap().len() + attrs.iter().map(|(k, v)| attribute_size(k, v)).sum::<usize>()
}

/// The copy of a big error: in the DLQ, within its real limit, with its record cut to fit.
fn assert_fits(copies: &[Message]) {
    assert_eq!(copies.len(), 1, "one copy");
    let copy = &copies[0];
    assert!(size_of(copy) <= DLQ_BYTES, "{} > {DLQ_BYTES}", size_of(copy));
    let attrs = copy.message_attributes().cloned().unwrap_or_default();
    let record = failure_record(&attrs)
        .expect("a failure record")
        .expect("it parses");
    assert!(record.error.ends_with("[truncated]"), "{}", record.error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_dlq_size_configured_start_up_reads_nothing_from_the_dlq() {
    let r = rig("start-conf").await;
    r.count_dlq_reads();
    let env = r.build(&[("TRIAGE_DLQ_MAX_BYTES", &DLQ_BYTES.to_string())]).await;
    assert_eq!(r.dlq_reads(), 0, "no DLQ read at start-up");
    // What start-up still calls: the source queue's attributes (retention, visibility timeout,
    // redrive policy) and the breakers' reads, one per job type (the table's check).
    assert_eq!(
        env.calls.snapshot(),
        BTreeMap::from([
            ("DynamoDB.GetItem".to_owned(), 2),
            ("SQS.GetQueueAttributes".to_owned(), 1),
        ]),
    );
    assert!(env.startup_warnings.is_empty(), "{:?}", env.startup_warnings);

    // The configured limit sizes the copies, and no read happens at the first DLQ send either.
    r.run(&env, &big_error("conf-1")).await;
    assert_fits(&r.dlq().await);
    assert_eq!(r.dlq_reads(), 0);
}

/// A worker on `env`, polling batches of up to 10 with a 2 s long poll.
fn worker(env: Environment) -> Worker {
    Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(2),
            max_messages: 10,
            emf: false,
        },
    )
}

fn pairs<'a>(vars: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    vars.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_queues_configured_start_up_only_reads_the_breakers_and_the_first_batch_reads_none() {
    let r = rig("start-facts").await;
    let vars = r.stack_vars().await;
    let env = r.build(&pairs(&vars)).await;
    // Only the breakers' reads, one per job type (this registry has two), which are the
    // table's check too.
    assert_eq!(
        env.calls.snapshot(),
        BTreeMap::from([("DynamoDB.GetItem".to_owned(), 2)]),
    );
    assert!(env.startup_warnings.is_empty(), "{:?}", env.startup_warnings);
    env.calls.reset();
    let out = r.run(&env, &ok("facts-1")).await;
    assert!(
        out.records[0].executed && out.records[0].settled,
        "{:?}",
        out.records
    );
    let calls = env.calls.snapshot();
    assert!(
        !calls.keys().any(|k| k.starts_with("DynamoDB.")),
        "the first batch read its breaker again: {calls:?}"
    );
    // The worker receives with the configured visibility timeout: it reads no queue either.
    assert_eq!(calls.get("SQS.GetQueueAttributes"), None, "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_open_before_start_up_defers_the_first_batch_from_the_start_up_read() {
    let r = rig("start-open").await;
    let sdk = support::sdk_config().await;
    sqs_triage::effects::breaker_store::BreakerStore::new(
        sqs_triage::effects::storage_retry::dynamodb_client(&sdk),
        &r.table,
        sqs_triage::effects::storage_retry::StorageRetry::default(),
    )
    .force_open(chaos::CHAOS, None, sqs_triage::clock::now_ms())
    .await
    .unwrap();
    let vars = r.stack_vars().await;
    let env = r.build(&pairs(&vars)).await;
    env.calls.reset();
    let out = r.run(&env, &ok("open-1")).await;
    assert!(
        matches!(
            out.records[0].decision,
            sqs_triage::core::decision::Decision::Defer { .. }
        ),
        "{:?}",
        out.records
    );
    assert!(!out.records[0].executed);
    assert_eq!(env.calls.snapshot().get("DynamoDB.GetItem"), None);
}

/// In Lambda the first breaker read is left running while the runtime polls: start-up returns
/// while the read is held on the wire, and the first batch waits for that read (it makes none
/// of its own) and sees the breaker it read open, so its job does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_batch_waits_for_the_breaker_read_start_up_left_running() {
    let r = rig("start-overlap").await;
    let sdk = support::sdk_config().await;
    sqs_triage::effects::breaker_store::BreakerStore::new(
        sqs_triage::effects::storage_retry::dynamodb_client(&sdk),
        &r.table,
        sqs_triage::effects::storage_retry::StorageRetry::default(),
    )
    .force_open(chaos::CHAOS, None, sqs_triage::clock::now_ms())
    .await
    .unwrap();
    let vars = r.stack_vars().await;
    r.ddb_proxy.add_rule(FaultRule {
        ops: Some(vec!["GetItem".into()]),
        body_contains: None,
        fault: Fault::Hold,
        times: None,
    });
    // Returns with both breaker reads held: start-up did not wait for them.
    let env = r.build_overlapped(&pairs(&vars)).await;
    let batch = {
        let (r_env, body) = (env.clone(), ok("overlap-1"));
        let sqs = r.sqs.clone();
        let queue_url = r.queue_url.clone();
        tokio::spawn(async move {
            sqs.send_message()
                .queue_url(&queue_url)
                .message_body(body)
                .send()
                .await
                .unwrap();
            worker(r_env).poll_once().await.unwrap().expect("a batch")
        })
    };
    r.ddb_proxy.release_held();
    let out = batch.await.unwrap();
    assert!(
        matches!(
            out.records[0].decision,
            sqs_triage::core::decision::Decision::Defer { .. }
        ),
        "{:?}",
        out.records
    );
    assert!(!out.records[0].executed);
    // Start-up's two reads (one per job type) and none by the batch.
    assert_eq!(env.calls.snapshot().get("DynamoDB.GetItem"), Some(&2));
}

/// A table the first read finds missing, with that read left running: start-up returns, and
/// every invocation then fails with the start-up error naming `TRIAGE_TABLE` (which ends
/// `triage-lambda` as a failed start-up did) before any record runs or any message is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_found_after_start_up_fails_the_invocation_before_any_record_runs() {
    use lambda_runtime::{Context, LambdaEvent};
    let r = rig("start-late-missing").await;
    let vars = r.stack_vars().await;
    let missing = support::unique_name("no-such-table");
    let mut vars = pairs(&vars);
    vars.push(("TRIAGE_TABLE", &missing));
    let env = r.build_overlapped(&vars).await;
    let event = json!({"Records": [{
        "messageId": "00000000-0000-4000-8000-00000000000a",
        "receiptHandle": "AQEBlate",
        "body": ok("late-1"),
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs",
        "awsRegion": "us-east-1",
    }]});
    for _ in 0..2 {
        let mut ctx = Context::default();
        ctx.deadline = sqs_triage::clock::now_ms() + 30_000;
        let raw = serde_json::value::to_raw_value(&event).unwrap();
        let e = sqs_triage::runtime::lambda::handle_raw(&env.processor, LambdaEvent::new(raw, ctx))
            .await
            .expect_err("the invocation fails");
        let e = e
            .downcast_ref::<sqs_triage::runtime::env::StartupError>()
            .unwrap_or_else(|| panic!("not a start-up error: {e}"));
        assert_eq!(e.var, "TRIAGE_TABLE", "{e}");
        assert!(e.misconfigured && e.message.contains(&missing), "{e}");
    }
    // Start-up's breaker reads (one per job type, the first failure ending the others) and
    // nothing after them: no ledger read, no SQS call.
    let calls = env.calls.snapshot();
    assert!(
        calls.keys().all(|k| k == "DynamoDB.GetItem") && (1..=2).contains(&calls["DynamoDB.GetItem"]),
        "{calls:?}"
    );
}

/// A first read that does not end (held on the wire) does not hold the first invocation past
/// its deadline: the admission stops waiting for it at its own deadline, and the invocation
/// answers in time, its record ran or released unspent, as after any breaker read that stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_read_held_past_the_invocations_deadline_does_not_hold_the_invocation() {
    use lambda_runtime::{Context, LambdaEvent};
    let r = rig("start-held-first").await;
    let vars = r.stack_vars().await;
    r.ddb_proxy.add_rule(FaultRule {
        ops: Some(vec!["GetItem".into()]),
        body_contains: None,
        fault: Fault::Hold,
        times: None,
    });
    let env = r.build_overlapped(&pairs(&vars)).await;
    assert!(
        r.ddb_proxy.until_held(1, Duration::from_secs(30)).await,
        "the first read is on the wire"
    );
    let event = json!({"Records": [{
        "messageId": "00000000-0000-4000-8000-00000000000b",
        "receiptHandle": "AQEBheld",
        "body": ok("held-1"),
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs",
        "awsRegion": "us-east-1",
    }]});
    let time_left = Duration::from_secs(4);
    let mut ctx = Context::default();
    ctx.deadline = sqs_triage::clock::now_ms() + time_left.as_millis() as u64;
    let raw = serde_json::value::to_raw_value(&event).unwrap();
    let answered = tokio::time::timeout(
        time_left,
        sqs_triage::runtime::lambda::handle_raw(&env.processor, LambdaEvent::new(raw, ctx)),
    )
    .await;
    r.ddb_proxy.release_held();
    let response = answered
        .expect("answered before the invocation's deadline")
        .expect("a batch response");
    // Its one record ran (the breaker failing open) or was released unspent: either way the
    // answer accounts for it.
    assert!(
        response
            .batch_item_failures
            .iter()
            .all(|f| f.item_identifier == "00000000-0000-4000-8000-00000000000b"),
        "{response:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_queue_attributes_are_checked_as_read_ones_are() {
    let r = rig("start-facts-bad").await;
    let vars = r.stack_vars().await;
    let with = |var: &'static str, value: &'static str| {
        let mut v = pairs(&vars);
        v.push((var, value));
        v
    };
    // A retention shorter than the policy's worst case (20 attempts, about 5 hours): refused,
    // naming the variable.
    let mut short = with("TRIAGE_QUEUE_RETENTION_S", "3600");
    short.push(("TRIAGE_MAX_ATTEMPTS", "20"));
    let e = r
        .refused(&short, "a policy longer than the configured retention is refused")
        .await;
    assert!(e.contains("TRIAGE_QUEUE_RETENTION_S"), "{e}");
    // A heartbeat no shorter than the configured visibility timeout: a warning.
    let env = r.build(&with("TRIAGE_QUEUE_VISIBILITY_S", "5")).await;
    assert!(
        env.startup_warnings
            .iter()
            .any(|w| w.contains("TRIAGE_HEARTBEAT_S")),
        "{:?}",
        env.startup_warnings
    );
    // Two of the three: refused, naming the missing one.
    let e = r
        .refused(&with("TRIAGE_QUEUE_MAX_RECEIVE", ""), "two of three are refused")
        .await;
    assert!(e.contains("TRIAGE_QUEUE_MAX_RECEIVE"), "{e}");
    // The source queue as its own DLQ under another spelling: refused without reading either.
    let mut own = pairs(&vars);
    let spelled = r.queue_url.replace("127.0.0.1", "localhost");
    assert_ne!(spelled, r.queue_url, "the test needs another spelling");
    own.push(("TRIAGE_DLQ_URL", &spelled));
    let e = r
        .refused(&own, "the source queue as its own DLQ is refused")
        .await;
    assert!(e.contains("names the source queue"), "{e}");
}

/// A message no consumer settles (a crash, out of memory, a timeout) is hidden for one hold per
/// receive; SQS moves it to the DLQ only after `maxReceiveCount` of them. Holds that retention
/// outruns (the templates' old defaults with a 900 s function: 100 x 5400 s over 4 days,
/// deleted around the 64th receive) are refused, configured or read, naming the attributes
/// and the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_that_retention_outruns_is_refused_at_start_up() {
    let r = rig("start-holds").await;
    let vars = r.stack_vars().await;
    let with = |facts: [(&'static str, &'static str); 3]| {
        let mut v = pairs(&vars);
        v.extend(facts);
        v
    };
    let e = r
        .refused(
            &with([
                ("TRIAGE_QUEUE_RETENTION_S", "345600"),
                ("TRIAGE_QUEUE_VISIBILITY_S", "5400"),
                ("TRIAGE_QUEUE_MAX_RECEIVE", "100"),
            ]),
            "100 holds of 5400 s do not fit 4 days of retention",
        )
        .await;
    for part in [
        "TRIAGE_QUEUE_MAX_RECEIVE",
        "maxReceiveCount (100)",
        "MessageRetentionPeriod (345600 s",
        "at most 48",
    ] {
        assert!(e.contains(part), "{part}: {e}");
    }
    // 48 holds fit three quarters of the retention.
    r.build(&with([
        ("TRIAGE_QUEUE_RETENTION_S", "345600"),
        ("TRIAGE_QUEUE_VISIBILITY_S", "5400"),
        ("TRIAGE_QUEUE_MAX_RECEIVE", "48"),
    ]))
    .await;

    // Read from the queue: 1000 receives (the rig's redrive) of 30 s over one hour.
    r.sqs
        .set_queue_attributes()
        .queue_url(&r.queue_url)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "3600")
        .send()
        .await
        .unwrap();
    let e = r
        .refused(&[], "1000 holds of 30 s do not fit an hour of retention")
        .await;
    assert!(
        e.contains("TRIAGE_QUEUE_URL") && e.contains("maxReceiveCount (1000)") && e.contains("at most 90"),
        "{e}"
    );
}

/// SQS keeps a moved message's first enqueue time on a standard queue: a DLQ that keeps
/// messages no longer than its source deletes what the redrive moves into it. Refused when
/// start-up reads the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlq_that_keeps_messages_no_longer_than_its_source_is_refused_at_start_up() {
    let r = rig("start-dlq-ret").await;
    r.sqs
        .set_queue_attributes()
        .queue_url(&r.dlq_url)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "345600")
        .send()
        .await
        .unwrap();
    let e = r
        .refused(&[], "a DLQ kept as long as its source is refused")
        .await;
    assert!(
        e.contains("TRIAGE_DLQ_URL") && e.contains("the DLQ's MessageRetentionPeriod (345600 s)"),
        "{e}"
    );
    // A day longer is enough.
    r.sqs
        .set_queue_attributes()
        .queue_url(&r.dlq_url)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "432000")
        .send()
        .await
        .unwrap();
    r.build(&[]).await;
}

/// Start-up reads the breakers of the first ten job types (as many as a batch can name), none
/// that no envelope can name, and does it on its own retry budget: a throttled table at
/// start-up leaves the budget the batches share untouched. The worker receives with the
/// configured visibility timeout, raised to its minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_reads_ten_breakers_on_its_own_retry_budget() {
    let r = rig("start-many").await;
    let vars = r.stack_vars().await;
    let mut vars = pairs(&vars);
    vars.extend([
        ("TRIAGE_QUEUE_URL", r.queue_url.as_str()),
        ("TRIAGE_DLQ_URL", r.dlq_url.as_str()),
        ("TRIAGE_TABLE", r.table.as_str()),
        ("TRIAGE_QUEUE_VISIBILITY_S", "0"),
    ]);
    let config = Config::from_lookup(&|k| {
        vars.iter()
            .rev()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    })
    .unwrap();
    let long = "t".repeat(sqs_triage::core::envelope::MAX_JOB_TYPE_LEN + 1);
    let registry = |types: &[String]| {
        types.iter().fold(Registry::default(), |reg, t| {
            reg.handle(t, |_: Value, _ctx: JobContext| async { Ok::<_, JobError>(()) })
        })
    };
    let mut types: Vec<String> = (0..12).map(|i| format!("many.{i:02}")).collect();
    types.push(long.clone());
    let proxy = FaultProxy::start(&support::ddb_endpoint());
    let sdk = support::sdk_config().await;
    let build = |types: Vec<String>| {
        let (config, sdk, proxy) = (&config, &sdk, &proxy);
        async move {
            build_with(
                config,
                registry(&types),
                sqs_config(sdk),
                dynamodb_config(sdk).endpoint_url(proxy.url()),
            )
            .await
            .unwrap()
        }
    };
    let env = build(types.clone()).await;
    assert_eq!(
        env.calls.snapshot(),
        BTreeMap::from([("DynamoDB.GetItem".to_owned(), 10)]),
        "the first ten types' breakers, not the eleventh, twelfth or the one too long to name"
    );
    let worker = worker(env);
    assert_eq!(
        worker.visibility_timeout().await.unwrap(),
        sqs_triage::runtime::worker::MIN_VISIBILITY
    );
    assert_eq!(worker.env().calls.snapshot().get("SQS.GetQueueAttributes"), None);

    // Only the long type: nothing to read, so the table is probed.
    let env = build(vec![long]).await;
    assert_eq!(
        env.calls.snapshot(),
        BTreeMap::from([("DynamoDB.GetItem".to_owned(), 1)])
    );

    // Every read throttled: start-up warns and goes on, its retries spent on its own budget.
    proxy.add_rule(FaultRule {
        ops: Some(vec!["GetItem".into()]),
        body_contains: None,
        fault: Fault::Throttle,
        times: None,
    });
    let env = build(types).await;
    assert!(proxy.faults_injected() > 10, "the reads were retried");
    assert!(
        env.startup_warnings.iter().any(|w| w.contains("TRIAGE_TABLE")),
        "{:?}",
        env.startup_warnings
    );
    let shared = env.retry.stats();
    assert_eq!((shared.retries, shared.budget_refusals), (0, 0), "{shared:?}");
}

/// A read that does not answer: held far longer than any start-up may take, `times` times
/// (`None`: always).
fn stalled(op: &str, body_contains: Option<String>, times: Option<u64>) -> FaultRule {
    FaultRule {
        ops: Some(vec![op.into()]),
        body_contains,
        fault: Fault::Delay(Duration::from_secs(600)),
        times,
    }
}

/// Lambda ends an init that takes longer than this.
const LAMBDA_INIT_LIMIT: Duration = Duration::from_secs(10);

/// In Lambda, start-up's reads end by its deadline ([`STARTUP_DEADLINE`]), inside Lambda's
/// 10 s init: a DLQ and a table that never answer are checks skipped with a warning, and a
/// source queue that never answers (and must be read) is a start-up error naming it. Without
/// the deadline each stalled read waits out its per-call timeout and every retry (minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_service_does_not_hold_start_up_past_its_deadline() {
    // Far above the init limit, far below what the stalled reads would take without the
    // deadline: a start-up that overruns fails here rather than hanging the test.
    let guard = LAMBDA_INIT_LIMIT * 3;
    let r = rig("start-hang").await;
    r.proxy
        .add_rule(stalled("GetQueueAttributes", Some(r.dlq_url.clone()), None));
    r.ddb_proxy.add_rule(stalled("GetItem", None, None));
    let started = tokio::time::Instant::now();
    let env = tokio::time::timeout(guard, r.build(&[]))
        .await
        .expect("start-up ended by its deadline");
    assert!(started.elapsed() < LAMBDA_INIT_LIMIT, "{:?}", started.elapsed());
    for var in ["TRIAGE_DLQ_URL", "TRIAGE_TABLE"] {
        assert!(
            env.startup_warnings
                .iter()
                .any(|w| w.contains(var) && w.contains("deadline")),
            "{var}: {:?}",
            env.startup_warnings
        );
    }
    // The source queue stalled too: there is nothing to consume without it.
    r.proxy
        .add_rule(stalled("GetQueueAttributes", Some(r.queue_url.clone()), None));
    let started = tokio::time::Instant::now();
    let e = tokio::time::timeout(guard, r.refused(&[], "a source queue that never answers"))
        .await
        .expect("start-up ended by its deadline");
    assert!(started.elapsed() < LAMBDA_INIT_LIMIT, "{:?}", started.elapsed());
    assert!(e.contains("TRIAGE_QUEUE_URL") && e.contains("deadline"), "{e}");
}

/// The deadline does not cost a start-up that a patient one would make: one stalled request
/// is tried again (each try is short) rather than taking the whole deadline, and a source
/// queue throttled on all but the last of the storage retries' eight tries still answers
/// in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_read_that_answers_late_is_waited_for() {
    let r = rig("start-late").await;
    let size = [("TRIAGE_DLQ_MAX_BYTES", "2048")];
    r.proxy
        .add_rule(stalled("GetQueueAttributes", Some(r.queue_url.clone()), Some(1)));
    let env = r.try_build(&size).await.expect("the second try answers");
    assert!(env.startup_warnings.is_empty(), "{:?}", env.startup_warnings);
    r.proxy.clear_faults();
    r.proxy.reset_counts();
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.queue_url.clone()),
        fault: Fault::Throttle,
        times: Some(7),
    });
    let started = tokio::time::Instant::now();
    r.try_build(&size).await.expect("the eighth try answers");
    assert!(started.elapsed() < LAMBDA_INIT_LIMIT, "{:?}", started.elapsed());
    assert_eq!(r.proxy.faults_injected(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dlq_size_is_learned_at_the_first_dlq_send_when_start_up_could_not_read_it() {
    let r = rig("start-lazy").await;
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Throttle,
        times: None,
    });
    let env = r.build(&[]).await;
    assert!(
        env.startup_warnings
            .iter()
            .any(|w| w.contains("TRIAGE_DLQ_URL") && w.contains("first DLQ send")),
        "{:?}",
        env.startup_warnings
    );
    r.count_dlq_reads();

    // A batch with nothing for the DLQ reads nothing.
    r.run(&env, &ok("lazy-ok")).await;
    assert_eq!(r.dlq_reads(), 0, "no read before a DLQ send");
    // The first copy is sized for the DLQ's real limit (the fallback, 256 KiB, is more than
    // the DLQ takes: sized for it, the copy would be refused).
    r.run(&env, &big_error("lazy-1")).await;
    assert_fits(&r.dlq().await);
    assert_eq!(r.dlq_reads(), 1, "read once, at the first DLQ send");
    // And kept.
    r.run(&env, &big_error("lazy-2")).await;
    assert_fits(&r.dlq().await);
    assert_eq!(r.dlq_reads(), 1, "kept");
}

/// A DLQ that never answers the size read at the first DLQ send: the read ends with the
/// batch's effects deadline, the copy is sized for the fallback, and the batch still settles
/// before its deadline instead of running into the function's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_dlq_size_read_still_settles_the_batch_by_its_deadline() {
    let r = rig("start-stall").await;
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Throttle,
        times: None,
    });
    let env = r.build(&[]).await;
    r.proxy.clear_faults();
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Delay(Duration::from_secs(120)),
        times: None,
    });
    r.sqs
        .send_message()
        .queue_url(&r.queue_url)
        .message_body(big_error("stall-1"))
        .send()
        .await
        .unwrap();
    let batch = r
        .sqs
        .receive_message()
        .queue_url(&r.queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(batch.len(), 1);
    let records = batch
        .into_iter()
        .map(sqs_triage::processor::Incoming::from_sdk)
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    // The guard is far past the deadline and far short of the stalled read: only a read
    // without the batch's deadline reaches it.
    let outcome = tokio::time::timeout(
        Duration::from_secs(40),
        env.processor.process(records, Some(deadline)),
    )
    .await
    .expect("the batch settled while the DLQ's size read was stalled");
    assert_eq!(outcome.records.len(), 1);
}

/// A worker's start-up (no deadline) waits for credentials that take longer than a Lambda
/// start-up's try may (a `credential_process`, SSO, instance metadata): the SDK loads them
/// inside the first try of the first read, so a cut try would load them again each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_start_up_waits_for_slow_credentials() {
    let r = rig("start-creds").await;
    let mut config = Config::from_lookup(&|k| match k {
        "TRIAGE_QUEUE_URL" => Some(r.queue_url.clone()),
        "TRIAGE_DLQ_URL" => Some(r.dlq_url.clone()),
        "TRIAGE_TABLE" => Some(r.table.clone()),
        _ => None,
    })
    .unwrap();
    config.startup_deadline = None;
    // Slower than a Lambda start-up's try, within the SDK's own 5 s for loading credentials.
    let load = sqs_triage::runtime::env::STARTUP_ATTEMPT_TIMEOUT + Duration::from_millis(700);
    let creds = aws_config::credential_process::CredentialProcessProvider::new(format!(
        r#"sleep {}; echo '{{"Version":1,"AccessKeyId":"test","SecretAccessKey":"test"}}'"#,
        load.as_secs_f64()
    ));
    let sdk = support::sdk_config()
        .await
        .into_builder()
        .credentials_provider(aws_sdk_sqs::config::SharedCredentialsProvider::new(creds))
        .build();
    let registry = chaos::register(
        Registry::new(config.policy.clone(), config.breaker),
        config.policy.clone(),
        config.breaker,
    );
    let env = build_with(
        &config,
        registry,
        sqs_config(&sdk).endpoint_url(r.proxy.url()),
        dynamodb_config(&sdk).endpoint_url(r.ddb_proxy.url()),
    )
    .await
    .expect("the worker starts once the credentials are loaded");
    assert!(env.startup_warnings.is_empty(), "{:?}", env.startup_warnings);
}

/// `triage worker --demo-handlers` on `created`, stdout and stderr piped.
fn worker_process(created: &triage::ops::setup::SetupReport, vars: &[(&str, &str)]) -> std::process::Child {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    support::strict_env(&mut cmd);
    cmd.args(["worker", "--demo-handlers"])
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("RUST_LOG", "warn")
        .env_remove("TRIAGE_EMF")
        .env_remove("TRIAGE_LOG_PAYLOADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("triage worker starts")
}

/// Every boolean variable reads the same spellings, in any case: `TRIAGE_EMF=YES` turns the
/// worker's metric lines on, as `true` does.
#[tokio::test(flavor = "multi_thread")]
async fn boolean_variables_read_any_case() {
    use std::io::{BufRead, BufReader};
    let created = support::fresh_resources("startup-flags", false).await;
    support::sqs_client()
        .await
        .send_message()
        .queue_url(&created.queue_url)
        .message_body(json!({"type": chaos::CHAOS, "id": "f1", "payload": {"outcome": "ok"}}).to_string())
        .send()
        .await
        .unwrap();
    let mut child = worker_process(&created, &[("TRIAGE_EMF", "YES"), ("TRIAGE_LOG_PAYLOADS", "Off")]);
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if line.contains("\"_aws\"") {
                let _ = tx.send(line);
            }
        }
    });
    // The batch that runs the job prints its metric line (a bound for liveness, not timing).
    let metric = rx.recv_timeout(Duration::from_secs(60));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let metric = metric.unwrap_or_else(|_| {
        panic!(
            "TRIAGE_EMF=YES printed no EMF line:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(metric.contains("Namespace"), "{metric}");
}

/// A boolean variable whose value is no boolean stops the worker's start-up (exit 2), naming
/// the variable.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_boolean_variable_stops_the_worker_naming_it() {
    let created = support::fresh_resources("startup-bad-flag", false).await;
    for (var, bad) in [("TRIAGE_EMF", "maybe"), ("TRIAGE_LOG_PAYLOADS", "2")] {
        let mut child = worker_process(&created, &[(var, bad)]);
        let mut exited = None;
        for _ in 0..300 {
            if let Some(s) = child.try_wait().unwrap() {
                exited = Some(s);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if exited.is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(exited.and_then(|s| s.code()), Some(2), "{var}={bad}: {stderr}");
        assert!(
            stderr.contains(&format!("{var}=\"{bad}\" is not valid: expected true or false")),
            "{stderr}"
        );
    }
}
