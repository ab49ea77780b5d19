//! The Lambda layer end to end, as a Python or Node.js function runs it: the local Runtime API
//! (with the Extensions API), the real `sqs-triage-extension` binary, the layer's wrapper
//! script, and the runtime interface client Lambda uses, against the local stack. PyPI's
//! `awslambdaric` runs `tests/layer/handler.py`; npm's `aws-lambda-ric` runs
//! `tests/layer/handler.js`.
//!
//! The Python is the stack's venv (`infra/local/stack.sh` installs `awslambdaric` there), or
//! the one `LAYER_PYTHON` names. The Node.js client is the one `infra/local/stack.sh install`
//! puts under `.local/node-ric`, or the package folder `LAYER_NODE_RIC` names.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use serde_json::{Value, json};
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::effects::dlq::failure_record;
use support::runtime_api::{Outcome, RuntimeApi};
use triage::ops::setup::SetupReport;

const JOB_TYPE: &str = "layer.job";

fn repo() -> PathBuf {
    support::repo_root().to_path_buf()
}

fn python() -> PathBuf {
    let p = std::env::var_os("LAYER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".local/venv/bin/python"));
    assert!(
        p.exists(),
        "no Python with awslambdaric at {} (bash infra/local/stack.sh start installs it; or set LAYER_PYTHON)",
        p.display()
    );
    p
}

/// The folder of npm's `aws-lambda-ric` (its `index.mjs` is the runtime's entry point).
fn node_ric() -> PathBuf {
    let p = std::env::var_os("LAYER_NODE_RIC")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".local/node-ric/node_modules/aws-lambda-ric"));
    assert!(
        p.join("index.mjs").exists(),
        "no aws-lambda-ric at {} (bash infra/local/stack.sh install installs it; or set LAYER_NODE_RIC)",
        p.display()
    );
    p
}

/// The function's runtime.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    Python,
    Node,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One execution environment: Lambda's API, the extension, and the runtime behind the
/// wrapper. The handler appends a JSON line per call to `log`.
struct Env {
    api: RuntimeApi,
    extension: Child,
    runtime: Child,
    dir: PathBuf,
}

impl Env {
    async fn start(created: &SetupReport, vars: &[(&str, &str)]) -> Env {
        Env::ready(Env::spawn(created, vars, "handler.handler", false).await).await
    }

    async fn ready(env: Env) -> Env {
        assert!(
            env.api.ready(Duration::from_secs(60)).await,
            "the environment did not start: {:?}\n{}",
            env.api.init_errors(),
            env.output()
        );
        env
    }

    /// The environment's processes, started (the runtime with `handler`), not waited for.
    /// With `stale_pid`, a pid file left by an earlier runtime (a process gone) is there first.
    async fn spawn(created: &SetupReport, vars: &[(&str, &str)], handler: &str, stale_pid: bool) -> Env {
        Env::spawn_as(created, vars, Lang::Python, handler, stale_pid, None).await
    }

    /// [`Env::spawn`] with the runtime `lang`, and the extension started by `extension` (a
    /// program and its arguments, such as an emulator and another build) instead of this
    /// package's binary.
    async fn spawn_as(
        created: &SetupReport,
        vars: &[(&str, &str)],
        lang: Lang,
        handler: &str,
        stale_pid: bool,
        extension: Option<&[String]>,
    ) -> Env {
        let api = RuntimeApi::start().await;
        let dir = std::env::temp_dir().join(support::unique_name("layer"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port().to_string();
        let pid_file = dir.join("runtime.pid");
        if stale_pid {
            let mut gone = Command::new("true").spawn().unwrap();
            gone.wait().unwrap();
            std::fs::write(&pid_file, gone.id().to_string()).unwrap();
        }
        let mut ext = match extension {
            Some([program, args @ ..]) => {
                let mut c = Command::new(program);
                c.args(args);
                c
            }
            _ => Command::new(env!("CARGO_BIN_EXE_sqs-triage-extension")),
        };
        support::strict_env(&mut ext);
        ext.env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", "triage-local")
            .env("TRIAGE_QUEUE_URL", &created.queue_url)
            .env("TRIAGE_DLQ_URL", &created.dlq_url)
            .env("TRIAGE_TABLE", &created.table)
            .env("TRIAGE_JOB_TYPES", JOB_TYPE)
            .env("TRIAGE_LAYER_PORT", &port)
            .env("TRIAGE_LAYER_PID_FILE", &pid_file)
            .env("TRIAGE_BASE_DELAY_MS", "1000")
            .env("TRIAGE_JITTER_MAX_MS", "0")
            .env("TRIAGE_BREAKER_MIN_EXECUTIONS", "1000")
            .env_remove("TRIAGE_LOG_PAYLOADS")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("extension.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("extension.log")).unwrap());
        for (k, v) in vars {
            ext.env(k, v);
        }
        let extension = ext.spawn().expect("the extension starts");
        // Lambda starts the runtime once every extension has registered.
        let registered = async {
            while !api.extensions().iter().any(|n| n == "sqs-triage-extension") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), registered)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the extension did not register: {}",
                    read(&dir.join("extension.log"))
                )
            });
        if stale_pid {
            // The runtime starts late, after the extension watches: it must not take the
            // earlier runtime's pid for its own runtime's.
            let started = async {
                while !read(&dir.join("extension.log")).contains("waiting for the runtime") {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            };
            tokio::time::timeout(Duration::from_secs(60), started)
                .await
                .unwrap();
        }
        let mut rt = Command::new("bash");
        rt.arg(repo().join("infra/layer/sqs-triage-wrapper"));
        match lang {
            Lang::Python => rt.arg(python()).args(["-m", "awslambdaric", handler]).env(
                "PYTHONPATH",
                format!(
                    "{}:{}",
                    repo().join("tests/layer").display(),
                    repo().join("infra/layer/python").display()
                ),
            ),
            // As Lambda's Node.js runtimes: the handler from `_HANDLER` under
            // `LAMBDA_TASK_ROOT`, the layer's `nodejs/node_modules` on `NODE_PATH`.
            Lang::Node => rt
                .arg("node")
                .arg(node_ric().join("index.mjs"))
                .env("_HANDLER", handler)
                .env("LAMBDA_TASK_ROOT", repo().join("tests/layer"))
                .env("NODE_PATH", repo().join("infra/layer/nodejs/node_modules"))
                // The function's facts Lambda sets, which aws-lambda-ric requires.
                .env("AWS_LAMBDA_FUNCTION_NAME", "triage-local")
                .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
                .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
                .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/triage-local")
                .env("AWS_LAMBDA_LOG_STREAM_NAME", "local"),
        };
        rt.current_dir(repo().join("tests/layer"))
            // The wrapper must replace it with the extension's port.
            .env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("TRIAGE_LAYER_PORT", &port)
            .env("TRIAGE_LAYER_PID_FILE", &pid_file)
            .env("LAYER_TEST_LOG", dir.join("calls.jsonl"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("runtime.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("runtime.log")).unwrap());
        for (k, v) in vars {
            rt.env(k, v);
        }
        let runtime = rt.spawn().expect("the runtime starts");
        Env {
            api,
            extension,
            runtime,
            dir,
        }
    }

    async fn invoke(&self, event: &Value, time_left: Duration) -> Outcome {
        self.invoke_text(event.to_string(), time_left).await
    }

    /// No grace past the deadline: an answer after it counts as timed out, as in Lambda.
    async fn invoke_text(&self, event: String, time_left: Duration) -> Outcome {
        self.api
            .invoke(event, time_left, Duration::from_secs(30), Duration::ZERO)
            .await
    }

    /// The handler's calls so far.
    fn calls(&self) -> Vec<Value> {
        read(&self.dir.join("calls.jsonl"))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn output(&self) -> String {
        ["extension.log", "extension.out", "runtime.log", "runtime.out"]
            .iter()
            .map(|f| format!("--- {f}\n{}", read(&self.dir.join(f))))
            .collect()
    }

    /// Waits (at most `within`) for the extension to exit; its exit code.
    async fn extension_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.extension.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in [&mut self.extension, &mut self.runtime] {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn job(id: &str, payload: Value) -> String {
    json!({"type": JOB_TYPE, "id": id, "payload": payload}).to_string()
}

/// Sends one job per `(id, payload)`; returns them received in one batch as the event source
/// mapping would (hidden for 120 s: only the extension's visibility change brings one back
/// sooner), by job id.
async fn send_and_receive(created: &SetupReport, jobs: &[(&str, Value)]) -> BTreeMap<String, Message> {
    let groups: Vec<(&str, Value, &str)> = jobs.iter().map(|(i, p)| (*i, p.clone(), "")).collect();
    send_and_receive_in(created, &groups).await
}

/// [`send_and_receive`] with a message group per job (FIFO; `""` for a standard queue).
async fn send_and_receive_in(
    created: &SetupReport,
    jobs: &[(&str, Value, &str)],
) -> BTreeMap<String, Message> {
    send_and_receive_hidden(created, jobs, 120).await
}

/// [`send_and_receive_in`], the messages hidden for `visibility_s` by the receive.
async fn send_and_receive_hidden(
    created: &SetupReport,
    jobs: &[(&str, Value, &str)],
    visibility_s: i32,
) -> BTreeMap<String, Message> {
    let bodies: Vec<(String, &str, &str)> = jobs
        .iter()
        .map(|(id, payload, group)| (job(id, payload.clone()), *group, *id))
        .collect();
    let got: BTreeMap<String, Message> = send_and_receive_bodies(created, &bodies, visibility_s)
        .await
        .into_iter()
        .map(|m| (job_id(&m), m))
        .collect();
    assert_eq!(got.len(), jobs.len(), "every job received");
    got
}

/// Sends each `(body, message group, deduplication id)` (the group `""` for a standard queue);
/// returns them all, received as the event source mapping would, hidden for `visibility_s`.
async fn send_and_receive_bodies(
    created: &SetupReport,
    bodies: &[(String, &str, &str)],
    visibility_s: i32,
) -> Vec<Message> {
    let sqs = support::sqs_client().await;
    for (body, group, dedup) in bodies {
        let mut send = sqs
            .send_message()
            .queue_url(&created.queue_url)
            .message_body(body);
        if !group.is_empty() {
            send = send.message_group_id(*group).message_deduplication_id(*dedup);
        }
        send.send().await.unwrap();
    }
    let mut got = BTreeMap::new();
    for _ in 0..20 {
        if got.len() == bodies.len() {
            break;
        }
        for m in support::read_all(&sqs, &created.queue_url, visibility_s, 1).await {
            got.insert(m.message_id().unwrap().to_owned(), m);
        }
    }
    assert_eq!(got.len(), bodies.len(), "every message received");
    got.into_values().collect()
}

fn job_id(m: &Message) -> String {
    let v: Value = serde_json::from_str(m.body().unwrap()).unwrap();
    v["id"].as_str().unwrap().to_owned()
}

/// The time left before an invocation's deadline, unless a test says otherwise.
const TIME_LEFT: Duration = Duration::from_secs(20);

/// Invokes `env` with one SQS event of `messages`, `time_left` before its deadline; the batch
/// response.
async fn invoke(env: &Env, created: &SetupReport, messages: &[&Message], time_left: Duration) -> Value {
    let owned: Vec<Message> = messages.iter().map(|m| (*m).clone()).collect();
    let event = support::lambda_event::lambda_event_json(&owned, &created.queue_url);
    match env.invoke(&event, time_left).await {
        Outcome::Response(body) => serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
        other => panic!("expected a batch response, got {other:?}\n{}", env.output()),
    }
}

/// [`invoke`] with the messages of `got` (by job id, in its order); the batch response and the
/// job id of each message id (for [`failed`]).
async fn invoke_received(
    env: &Env,
    created: &SetupReport,
    got: &BTreeMap<String, Message>,
    time_left: Duration,
) -> (Value, BTreeMap<String, String>) {
    let messages: Vec<&Message> = got.values().collect();
    (invoke(env, created, &messages, time_left).await, message_ids(got))
}

/// Sends `jobs` and invokes `env` with them, received in one batch ([`send_and_receive`]);
/// the batch response and the job id of each message id.
async fn invoke_batch(
    env: &Env,
    created: &SetupReport,
    jobs: &[(&str, Value)],
) -> (Value, BTreeMap<String, String>) {
    let got = send_and_receive(created, jobs).await;
    invoke_received(env, created, &got, TIME_LEFT).await
}

/// Asserts that the batch response `v` reports failed the records of exactly the jobs `jobs`.
fn assert_failed(env: &Env, v: &Value, by_message: &BTreeMap<String, String>, jobs: &[&str]) {
    assert_eq!(
        failed(v, by_message),
        jobs.iter().map(|j| (*j).to_owned()).collect::<BTreeSet<_>>(),
        "{}",
        env.output()
    );
}

/// Job ids of the records a batch response reports failed.
fn failed(v: &Value, by_message: &BTreeMap<String, String>) -> BTreeSet<String> {
    v["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("no batchItemFailures in {v}"))
        .iter()
        .map(|f| by_message[f["itemIdentifier"].as_str().unwrap()].clone())
        .collect()
}

fn message_ids(got: &BTreeMap<String, Message>) -> BTreeMap<String, String> {
    got.iter()
        .map(|(j, m)| (m.message_id().unwrap().to_owned(), j.clone()))
        .collect()
}

/// The DLQ's copies: job id of the original → (class, reason).
async fn dlq(created: &SetupReport) -> BTreeMap<String, (FailureClass, String)> {
    dlq_records(created)
        .await
        .into_iter()
        .map(|(m, r)| (job_id(&m), (r.class, r.error)))
        .collect()
}

/// The DLQ's copies with their failure records.
async fn dlq_records(created: &SetupReport) -> Vec<(Message, FailureRecord)> {
    let sqs = support::sqs_client().await;
    support::read_all(&sqs, &created.dlq_url, 120, 1)
        .await
        .into_iter()
        .map(|m| {
            let attrs = m.message_attributes.clone().unwrap_or_default();
            let r = failure_record(&attrs)
                .expect("a failure record")
                .expect("readable");
            (m, r)
        })
        .collect()
}

/// Receives again until `ids` are all back (at most `within`), by job id.
async fn back(created: &SetupReport, ids: &[&str], within: Duration) -> BTreeMap<String, Message> {
    let sqs = support::sqs_client().await;
    let mut got = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline && !ids.iter().all(|i| got.contains_key(*i)) {
        for m in support::read_all(&sqs, &created.queue_url, 120, 1).await {
            got.insert(job_id(&m), m);
        }
    }
    got
}

fn calls_of<'a>(calls: &'a [Value], job: &str) -> Vec<&'a Value> {
    calls.iter().filter(|c| c["job_id"] == job).collect()
}

// ------------------------------------------------------------------ records

#[tokio::test(flavor = "multi_thread")]
async fn each_record_runs_as_its_own_invocation_and_its_outcome_is_triaged() {
    let created = support::fresh_resources("layer-mixed", false).await;
    let env = Env::start(&created, &[]).await;
    env.api.set_client_context(r#"{"custom":{"tenant":"t1"}}"#);
    let (v, ids) = invoke_batch(
        &env,
        &created,
        &[
            ("ok", json!({"action": "ok"})),
            ("value", json!({"action": "value_error"})),
            ("fatal", json!({"action": "fatal"})),
            ("partial", json!({"action": "partial"})),
            ("flaky", json!({"action": "transient_once"})),
        ],
    )
    .await;
    // Fatal ones went to the DLQ (settled); the transient ones are reported for SQS to retry.
    assert_failed(&env, &v, &ids, &["flaky", "partial"]);
    let copies = dlq(&created).await;
    assert_eq!(
        copies.keys().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from(["fatal".to_owned(), "value".to_owned()])
    );
    assert_eq!(copies["value"].0, FailureClass::Fatal);
    assert!(
        copies["value"].1.contains("ValueError: the order has no lines"),
        "{:?}",
        copies["value"]
    );
    assert_eq!(copies["fatal"].0, FailureClass::Fatal);

    // Each record was an invocation of its own: one record, a request id of its own (not the
    // real one), the real invocation's ARN, trace id and client context, and a deadline kept
    // back from the real one.
    let real_id = env.api.request_ids()[0].clone();
    let calls = env.calls();
    assert_eq!(calls.len(), 5, "{calls:?}");
    let request_ids: BTreeSet<&str> = calls.iter().map(|c| c["request_id"].as_str().unwrap()).collect();
    assert_eq!(request_ids.len(), 5);
    assert!(!request_ids.contains(real_id.as_str()));
    for c in &calls {
        assert_eq!(c["records"], 1);
        assert_eq!(
            c["arn"],
            "arn:aws:lambda:us-east-1:000000000000:function:triage-local"
        );
        assert_eq!(
            c["trace_id"],
            "Root=1-00000000-000000000000000000000000;Sampled=0"
        );
        assert_eq!(c["client_context"], json!({"tenant": "t1"}));
        assert_eq!(
            (c["attempt"].as_u64(), c["max_attempts"].as_u64()),
            (Some(1), Some(5))
        );
        assert_eq!(c["job_type"], JOB_TYPE);
        let left = c["remaining_ms"].as_u64().unwrap();
        assert!(left <= TIME_LEFT.as_millis() as u64 - 1_500, "{c}");
    }

    // The transient ones come back after their 1 s backoff (long before the 120 s the receive
    // hid them for), and the next attempt is counted as the second.
    let again = back(&created, &["flaky", "partial"], Duration::from_secs(30)).await;
    assert!(
        again.contains_key("flaky") && again.contains_key("partial"),
        "{again:?}"
    );
    for m in again.values() {
        assert_eq!(
            m.attributes().unwrap()[&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount],
            "2"
        );
    }
    let v = invoke(&env, &created, &[&again["flaky"]], TIME_LEFT).await;
    assert!(v["batchItemFailures"].as_array().unwrap().is_empty(), "{v}");
    let calls = env.calls();
    let runs: Vec<u64> = calls_of(&calls, "flaky")
        .iter()
        .map(|c| c["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(runs, [1, 2]);
}

/// The decision table's rows a handler never sees, through the layer: a job type the layer
/// does not serve and a body that is not a job are dead-lettered `invalid` without an
/// invocation; a transient failure on the last attempt is dead-lettered `exhausted` with
/// its attempts.
#[tokio::test(flavor = "multi_thread")]
async fn invalid_jobs_never_reach_the_handler_and_a_last_attempt_is_exhausted() {
    let created = support::fresh_resources("layer-rows", false).await;
    let env = Env::start(&created, &[("TRIAGE_MAX_ATTEMPTS", "1")]).await;
    let got = send_and_receive_bodies(
        &created,
        &[
            (job("spent", json!({"action": "transient"})), "", ""),
            (
                json!({"type": "other.type", "id": "stray", "payload": {}}).to_string(),
                "",
                "",
            ),
            ("not a job".to_owned(), "", ""),
        ],
        120,
    )
    .await;
    assert_eq!(got.len(), 3, "every message received");
    let v = invoke(&env, &created, &got.iter().collect::<Vec<_>>(), TIME_LEFT).await;
    assert_eq!(v["batchItemFailures"], json!([]), "{v}\n{}", env.output());
    let calls = env.calls();
    assert_eq!(
        calls.iter().map(|c| c["job_id"].clone()).collect::<Vec<_>>(),
        vec![json!("spent")],
        "only the served job ran"
    );
    let copies: Vec<FailureRecord> = dlq_records(&created).await.into_iter().map(|(_, r)| r).collect();
    let mut classes: Vec<(String, FailureClass, u32)> = copies
        .iter()
        .map(|r| (r.job_type.clone().unwrap_or_default(), r.class, r.attempts))
        .collect();
    classes.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        classes,
        vec![
            (String::new(), FailureClass::Invalid, 0),
            (JOB_TYPE.to_owned(), FailureClass::Exhausted, 1),
            ("other.type".to_owned(), FailureClass::Invalid, 0),
        ],
        "{copies:?}"
    );
}

/// An error listed for the record's job type decides for that type: a `ValueError`, fatal by
/// default, is retried for `layer.job` when `TRIAGE_TRANSIENT_ERRORS` names it so.
#[tokio::test(flavor = "multi_thread")]
async fn an_error_listed_for_a_job_type_is_classified_so_for_that_type() {
    let created = support::fresh_resources("layer-per-type", false).await;
    let env = Env::start(
        &created,
        &[("TRIAGE_TRANSIENT_ERRORS", &format!("{JOB_TYPE}/ValueError"))],
    )
    .await;
    let (v, ids) = invoke_batch(&env, &created, &[("value", json!({"action": "value_error"}))]).await;
    assert_failed(&env, &v, &ids, &["value"]);
    assert!(dlq(&created).await.is_empty(), "nothing dead-lettered");
}

/// The rows a handler never sees, decided before it: a producer's re-send of a job whose
/// completion marker lives is deleted as a duplicate, and a retry that comes back before its
/// backoff ends (a lost visibility change) is deferred, each without an invocation or an
/// attempt spent.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_and_an_early_arrival_never_reach_the_handler() {
    let created = support::fresh_resources("layer-before", false).await;
    let env = Env::start(
        &created,
        &[
            ("TRIAGE_DONE_MARKER_TYPES", JOB_TYPE),
            ("TRIAGE_BASE_DELAY_MS", "600000"),
        ],
    )
    .await;
    let got = send_and_receive(
        &created,
        &[
            ("done", json!({"action": "ok"})),
            ("waits", json!({"action": "transient"})),
        ],
    )
    .await;
    let (v, ids) = invoke_received(&env, &created, &got, TIME_LEFT).await;
    assert_failed(&env, &v, &ids, &["waits"]);
    // The producer sends `done` again; `waits` comes back at once, as if its 10-minute
    // visibility change had been lost.
    let again = send_and_receive(&created, &[("done", json!({"action": "ok"}))]).await;
    let sqs = support::sqs_client().await;
    sqs.change_message_visibility()
        .queue_url(&created.queue_url)
        .receipt_handle(got["waits"].receipt_handle().unwrap())
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let back = back(&created, &["waits"], Duration::from_secs(10)).await;
    assert!(back.contains_key("waits"), "{back:?}");
    let second = BTreeMap::from([
        ("done".to_owned(), again["done"].clone()),
        ("waits".to_owned(), back["waits"].clone()),
    ]);
    let (v, ids) = invoke_received(&env, &created, &second, TIME_LEFT).await;
    // The duplicate is settled (deleted), the early arrival left to come back when it is due.
    assert_failed(&env, &v, &ids, &["waits"]);
    let runs: Vec<(String, u64)> = env
        .calls()
        .iter()
        .map(|c| {
            (
                c["job_id"].as_str().unwrap().to_owned(),
                c["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        vec![("done".to_owned(), 1), ("waits".to_owned(), 1)],
        "only the first invocation's records ran"
    );
    assert!(dlq(&created).await.is_empty(), "nothing dead-lettered");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_handler_through_aws_lambda_ric_is_triaged_by_its_error_names() {
    let created = support::fresh_resources("layer-node", false).await;
    // A base delay of 10 minutes: only the handler's RetryAfter(2) brings its record back soon.
    let vars = [("TRIAGE_BASE_DELAY_MS", "600000")];
    let env =
        Env::ready(Env::spawn_as(&created, &vars, Lang::Node, "handler.handler", false, None).await).await;
    // Hidden for 8 s by the receive: only the extension's visibility change keeps the transient
    // ones away longer.
    let got = send_and_receive_hidden(
        &created,
        &[
            ("ok", json!({"action": "ok"}), ""),
            ("bug", json!({"action": "type_error"}), ""),
            ("slow", json!({"action": "transient"}), ""),
            ("later", json!({"action": "retry_after", "seconds": 2}), ""),
            ("partial", json!({"action": "partial"}), ""),
        ],
        8,
    )
    .await;
    let (v, ids) = invoke_received(&env, &created, &got, TIME_LEFT).await;
    assert_failed(&env, &v, &ids, &["later", "partial", "slow"]);
    // Node's TypeError is a fatal default: the DLQ holds its failure record.
    let copies = dlq(&created).await;
    assert_eq!(
        copies.keys().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from(["bug".to_owned()]),
        "{}",
        env.output()
    );
    assert_eq!(copies["bug"].0, FailureClass::Fatal);
    assert!(copies["bug"].1.contains("TypeError"), "{:?}", copies["bug"]);
    // One invocation per record, with the job's attributes for the helpers.
    let calls = env.calls();
    assert_eq!(calls.len(), 5, "{calls:?}");
    for c in &calls {
        assert_eq!(c["records"], 1, "{c}");
        assert_eq!(
            (c["attempt"].as_u64(), c["max_attempts"].as_u64()),
            (Some(1), Some(5))
        );
        assert_eq!(c["job_type"], JOB_TYPE);
    }
    // Past the receive's 8 s: the RetryAfter record is back, the transient ones are not.
    let again = back(&created, &["later", "slow", "partial"], Duration::from_secs(15)).await;
    assert!(
        again.contains_key("later"),
        "the RetryAfter record came back: {again:?}"
    );
    assert!(
        !again.contains_key("slow") && !again.contains_key("partial"),
        "the transient ones wait their 10 minutes: {:?}",
        again.keys()
    );
}

/// The layer's extension built for another architecture, run under an emulator as the
/// extension of a Python function: `infra/local/layer-artifact-check.sh` runs it, with
/// `LAYER_EXTENSION` (the binary) and `LAYER_EXTENSION_RUNNER` (the emulator and its
/// arguments, separated by spaces). It prints its timings.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs an emulated extension: bash infra/local/layer-artifact-check.sh"]
async fn an_emulated_extension_triages_a_python_batch() {
    let binary = std::env::var("LAYER_EXTENSION").expect("LAYER_EXTENSION names the extension to run");
    let mut command: Vec<String> = std::env::var("LAYER_EXTENSION_RUNNER")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    command.push(binary);
    let created = support::fresh_resources("layer-emulated", false).await;
    let started = std::time::Instant::now();
    let env = Env::spawn_as(
        &created,
        &[],
        Lang::Python,
        "handler.handler",
        false,
        Some(&command),
    )
    .await;
    let registered = started.elapsed();
    let env = Env::ready(env).await;
    let ready = started.elapsed();
    let got = send_and_receive(
        &created,
        &[
            ("ok", json!({"action": "ok"})),
            ("value", json!({"action": "value_error"})),
            ("later", json!({"action": "transient"})),
        ],
    )
    .await;
    let sent = std::time::Instant::now();
    let (v, ids) = invoke_received(&env, &created, &got, Duration::from_secs(60)).await;
    let answered = sent.elapsed();
    assert_failed(&env, &v, &ids, &["later"]);
    let copies = dlq(&created).await;
    assert_eq!(
        copies.keys().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from(["value".to_owned()])
    );
    assert_eq!(copies["value"].0, FailureClass::Fatal);
    assert!(
        copies["value"].1.contains("ValueError: the order has no lines"),
        "{:?}",
        copies["value"]
    );
    assert_eq!(env.calls().len(), 3);
    println!(
        "timing: extension start -> registered: {} ms",
        registered.as_millis()
    );
    println!(
        "timing: extension start -> runtime's first poll: {} ms",
        ready.as_millis()
    );
    println!(
        "timing: 3-record batch -> batch response: {} ms",
        answered.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pid_file_left_by_an_earlier_runtime_is_not_read_as_a_dead_runtime() {
    let created = support::fresh_resources("layer-stale", false).await;
    let env = Env::ready(Env::spawn(&created, &[], "handler.handler", true).await).await;
    let (v, _) = invoke_batch(
        &env,
        &created,
        &[
            ("a", json!({"action": "slow", "seconds": 0.5})),
            ("b", json!({"action": "ok"})),
        ],
    )
    .await;
    assert!(
        v["batchItemFailures"].as_array().unwrap().is_empty(),
        "{v}\n{}",
        env.output()
    );
    assert_eq!(env.calls().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_from_the_helper_sets_the_delay() {
    let created = support::fresh_resources("layer-retry-after", false).await;
    // A base delay of 10 minutes: only the handler's RetryAfter(2) brings the record back soon.
    let env = Env::start(&created, &[("TRIAGE_BASE_DELAY_MS", "600000")]).await;
    let (v, ids) = invoke_batch(
        &env,
        &created,
        &[
            ("later", json!({"action": "retry_after", "seconds": 2})),
            ("slow", json!({"action": "transient"})),
        ],
    )
    .await;
    assert_eq!(failed(&v, &ids).len(), 2);
    let again = back(&created, &["later"], Duration::from_secs(30)).await;
    assert!(
        again.contains_key("later"),
        "the RetryAfter record came back: {again:?}"
    );
    assert!(
        !again.contains_key("slow"),
        "the transient one waits its 10 minutes"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn records_run_side_by_side_in_a_runtime_with_a_worker_pool() {
    let created = support::fresh_resources("layer-pool", false).await;
    // awslambdaric starts three workers (the wrapper sets AWS_LAMBDA_MAX_CONCURRENCY).
    let env = Env::start(&created, &[("TRIAGE_LAYER_WORKERS", "3")]).await;
    let jobs: Vec<(String, Value)> = (0..3)
        .map(|i| (format!("m{i}"), json!({"action": "meet", "count": 3})))
        .collect();
    let refs: Vec<(&str, Value)> = jobs.iter().map(|(i, p)| (i.as_str(), p.clone())).collect();
    let got = send_and_receive(&created, &refs).await;
    let (v, _) = invoke_received(&env, &created, &got, Duration::from_secs(30)).await;
    // Each record waits for the other two: all three succeed only when they ran at once.
    assert!(
        v["batchItemFailures"].as_array().unwrap().is_empty(),
        "{v}\n{}",
        env.output()
    );
    let pids: BTreeSet<u64> = env.calls().iter().map(|c| c["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 3, "three workers");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_group_runs_in_order_and_stops_at_its_first_failure() {
    let created = support::fresh_resources("layer-fifo", true).await;
    // A worker pool: records of one group still go one after the other.
    let env = Env::start(&created, &[("TRIAGE_LAYER_WORKERS", "3")]).await;
    let got = send_and_receive_in(
        &created,
        &[
            ("a", json!({"action": "ok"}), "g1"),
            ("b", json!({"action": "transient"}), "g1"),
            ("c", json!({"action": "ok"}), "g1"),
            ("d", json!({"action": "ok"}), "g2"),
        ],
    )
    .await;
    // Job ids sort in the order they were sent, so the event keeps the group's order.
    let (v, ids) = invoke_received(&env, &created, &got, TIME_LEFT).await;
    // c waits behind b: reported failed without running; g2 is not held up.
    assert_failed(&env, &v, &ids, &["b", "c"]);
    let calls = env.calls();
    let g1: Vec<&str> = calls
        .iter()
        .map(|c| c["job_id"].as_str().unwrap())
        .filter(|j| *j != "d")
        .collect();
    assert_eq!(g1, ["a", "b"]);
    assert_eq!(calls_of(&calls, "d").len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_in_two_environments_open_one_shared_breaker() {
    let created = support::fresh_resources("layer-breaker", false).await;
    let breaker = [
        ("TRIAGE_BREAKER_MIN_EXECUTIONS", "2"),
        ("TRIAGE_BREAKER_FAILURE_RATE", "100"),
        ("TRIAGE_BREAKER_OPEN_S", "300"),
        ("TRIAGE_BREAKER_CACHE_MS", "0"),
        // Failed records stay away while the test runs.
        ("TRIAGE_BASE_DELAY_MS", "600000"),
    ];
    let one = Env::start(&created, &breaker).await;
    let two = Env::start(&created, &breaker).await;
    // One transient failure in each environment: neither alone reaches the minimum.
    for (env, id) in [(&one, "f1"), (&two, "f2")] {
        let (v, _) = invoke_batch(env, &created, &[(id, json!({"action": "transient"}))]).await;
        assert_eq!(v["batchItemFailures"].as_array().unwrap().len(), 1);
    }
    // Together they opened the breaker: the next record is held back in the first
    // environment without reaching its handler.
    let (v, _) = invoke_batch(&one, &created, &[("next", json!({"action": "ok"}))]).await;
    assert_eq!(
        v["batchItemFailures"].as_array().unwrap().len(),
        1,
        "{v}\n{}",
        one.output()
    );
    assert!(
        calls_of(&one.calls(), "next").is_empty(),
        "the open breaker kept it from the handler"
    );
}

// ------------------------------------------------------------------ other events

#[tokio::test(flavor = "multi_thread")]
async fn any_other_event_passes_through_byte_for_byte_both_ways() {
    let created = support::fresh_resources("layer-pass", false).await;
    let env = Env::start(&created, &[]).await;
    let text = r#"{ "Records" : [ {"eventSource": "aws:s3", "s3": {"object": {"key": "a b"}}} ],
        "wörd": "\u00e9\ud83d\ude00", "n": [1, 2.50, -0.0, 1e3] }"#;
    let sent: Value = serde_json::from_str(text).unwrap();
    let out = env.invoke_text(text.to_owned(), Duration::from_secs(20)).await;
    let Outcome::Response(body) = out else {
        panic!("{out:?}\n{}", env.output())
    };
    let calls = env.calls();
    assert_eq!(calls.len(), 1);
    // The runtime's answer, exactly as it wrote it.
    assert_eq!(body, calls[0]["pass_through"].as_str().unwrap());
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["seen"], sent);
    // Under the real request id.
    assert_eq!(v["request_id"], env.api.request_ids()[0].as_str());

    let out = env.invoke(&json!({"fail": true}), Duration::from_secs(20)).await;
    let Outcome::Error(body) = out else {
        panic!("{out:?}")
    };
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e["errorType"].as_str(), e["errorMessage"].as_str()),
        (Some("LookupError"), Some("asked to fail"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_init_error_reaches_lambda_and_shutdown_ends_the_extension() {
    let created = support::fresh_resources("layer-init", false).await;
    let mut env = Env::spawn(&created, &[], "no_such_module.handler", false).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while env.api.init_errors().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let errors = env.api.init_errors();
    assert_eq!(errors.len(), 1, "{}", env.output());
    let e: Value = serde_json::from_str(&errors[0]).unwrap();
    assert_eq!(e["errorType"], "Runtime.ImportModuleError", "{e}");
    // Lambda ends the environment: SHUTDOWN, and the extension exits cleanly.
    env.api.shutdown();
    assert_eq!(
        env.extension_exit(Duration::from_secs(20)).await,
        Some(0),
        "{}",
        env.output()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configuration_that_cannot_work_fails_the_init_naming_the_variable() {
    let created = support::fresh_resources("layer-config", false).await;
    // No job type; an error entry for a job type the function does not serve (a typo).
    for (vars, needle) in [
        (vec![("TRIAGE_JOB_TYPES", " ")], "TRIAGE_JOB_TYPES"),
        (
            vec![("TRIAGE_FATAL_ERRORS", "layer.jbo/CardDeclined")],
            "layer.jbo",
        ),
    ] {
        let mut env = Env::spawn(&created, &vars, "handler.handler", false).await;
        assert_eq!(
            env.extension_exit(Duration::from_secs(60)).await,
            Some(2),
            "{}",
            env.output()
        );
        let errors = env.api.init_errors();
        assert_eq!(errors.len(), 1, "{}", env.output());
        let e: Value = serde_json::from_str(&errors[0]).unwrap();
        assert_eq!(e["errorType"], "Extension.ConfigInvalid");
        assert!(e["errorMessage"].as_str().unwrap().contains(needle), "{e}");
    }
}

// ------------------------------------------------------------------ hangs and crashes

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_handler_is_reported_before_the_deadline_and_the_environment_replaced() {
    let created = support::fresh_resources("layer-hang", false).await;
    let mut env = Env::start(&created, &[]).await;
    let got = send_and_receive(
        &created,
        &[
            ("a", json!({"action": "ok"})),
            ("b", json!({"action": "ok"})),
            ("c", json!({"action": "hang"})),
        ],
    )
    .await;
    // One worker: records run in order, the hung one last.
    let (v, ids) = invoke_received(&env, &created, &got, Duration::from_secs(6)).await;
    assert_failed(&env, &v, &ids, &["c"]);
    // The runtime still holds the hung handler: the extension ends so Lambda replaces the
    // environment, and the handler with it.
    let code = env.extension_exit(Duration::from_secs(10)).await;
    assert!(matches!(code, Some(c) if c != 0), "{code:?}\n{}", env.output());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_that_dies_mid_record_loses_no_record_and_counts_no_attempt_twice() {
    let created = support::fresh_resources("layer-crash", false).await;
    let mut env = Env::start(&created, &[]).await;
    let got = send_and_receive(
        &created,
        &[
            ("a", json!({"action": "ok"})),
            ("b", json!({"action": "crash_once"})),
            ("c", json!({"action": "transient_once"})),
            ("d", json!({"action": "ok"})),
        ],
    )
    .await;
    // A deadline ten minutes away: the batch is reported as soon as the runtime is seen gone,
    // not when the deadline comes.
    let (v, ids) = tokio::time::timeout(
        Duration::from_secs(60),
        invoke_received(&env, &created, &got, Duration::from_secs(600)),
    )
    .await
    .unwrap_or_else(|_| panic!("the batch waited for its deadline\n{}", env.output()));
    // The crashed record fails; the ones not started are released, unspent.
    assert_failed(&env, &v, &ids, &["b", "c", "d"]);
    let ran: Vec<String> = env
        .calls()
        .iter()
        .map(|c| c["job_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ran, ["a", "b"]);
    assert!(env.extension_exit(Duration::from_secs(10)).await.is_some());
    drop(env);

    // A fresh environment: the released records come back at once and run as their first
    // attempt; the crashed one ran once, so its next run is its second.
    let env = Env::start(&created, &[("TRIAGE_BASE_DELAY_MS", "0")]).await;
    let again = back(&created, &["b", "c", "d"], Duration::from_secs(30)).await;
    assert_eq!(again.len(), 3, "{again:?}");
    let (v, ids) = invoke_received(&env, &created, &again, TIME_LEFT).await;
    // Only c fails: transient on its first attempt.
    assert_failed(&env, &v, &ids, &["c"]);
    let calls = env.calls();
    let attempt = |j: &str| calls_of(&calls, j)[0]["attempt"].as_u64().unwrap();
    assert_eq!((attempt("b"), attempt("c"), attempt("d")), (2, 1, 1));
}
