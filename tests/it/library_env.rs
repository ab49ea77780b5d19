//! A Lambda function and a worker built with the library, as the README shows them
//! (`lambda::run(Registry::default().handle(…))`, `worker::run(…)`), honour the `TRIAGE_*`
//! variables: they are the registry's defaults, read once at start-up. The function or worker
//! is this test binary itself, started again in a child process where
//! [`library_function_process`] runs it (the function behind a local Runtime API).

use crate::support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use serde_json::{Value, json};
use sqs_triage::core::failure::FailureClass;
use sqs_triage::effects::dlq::failure_record;

use crate::support::runtime_api::{Outcome, RuntimeApi};

/// Set in the child process: run as the Lambda function (`lambda`) or the worker (`worker`).
const CHILD: &str = "SQS_TRIAGE_TEST_LIBRARY_FUNCTION";
const JOB_TYPE: &str = "lib.flaky";

/// The function (or worker) a user builds: one job type whose dependency is always down,
/// registered with the registry's defaults. Not a test of its own: the tests below run it
/// (`--ignored --exact`) in a child process.
#[test]
#[ignore = "the child process of this module's tests, which run it"]
fn library_function_process() {
    let Ok(role) = std::env::var(CHILD) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let result = rt.block_on(async {
        let registry = sqs_triage::Registry::default().handle(JOB_TYPE, |_: Value, _ctx| async {
            Err(sqs_triage::JobError::transient("the dependency is down"))
        });
        match role.as_str() {
            "worker" => sqs_triage::worker::run(registry).await,
            _ => sqs_triage::lambda::run(registry).await,
        }
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The child process, killed when dropped.
struct Function {
    api: RuntimeApi,
    child: Child,
    log: PathBuf,
}

impl Function {
    async fn start(vars: &[(&str, &str)]) -> Function {
        let api = RuntimeApi::start().await;
        let log = std::env::temp_dir().join(support::unique_name("library-lambda"));
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        support::strict_env(&mut cmd);
        cmd.args([
            "--ignored",
            "--exact",
            "library_env::library_function_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .env("AWS_LAMBDA_RUNTIME_API", api.address())
        .env("AWS_LAMBDA_FUNCTION_NAME", "library-local")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "library")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/library-local")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("the function starts");
        let f = Function { api, child, log };
        assert!(
            f.api.ready(Duration::from_secs(120)).await,
            "the function did not start: {:?}\n{}",
            f.api.init_errors(),
            f.output()
        );
        f
    }

    fn output(&self) -> String {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "{}{}",
            read(self.log.clone()),
            read(self.log.with_extension("err"))
        )
    }

    /// One event source mapping poll: the messages as an event, the batch response's failed
    /// message ids.
    async fn invoke(&self, messages: &[Message], queue_url: &str) -> Vec<String> {
        let event = support::lambda_event::lambda_event_json(messages, queue_url);
        let outcome = self
            .api
            .invoke(
                event.to_string(),
                Duration::from_secs(30),
                Duration::from_secs(30),
                Duration::from_secs(10),
            )
            .await;
        let Outcome::Response(body) = outcome else {
            panic!("expected a batch response, got {outcome:?}\n{}", self.output());
        };
        let v: Value = serde_json::from_str(&body).unwrap();
        v["batchItemFailures"]
            .as_array()
            .unwrap_or_else(|| panic!("no batchItemFailures in {v}"))
            .iter()
            .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
            .collect()
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(self.log.with_extension("err"));
    }
}

/// Waits (long polls, at most a minute) for the job's next delivery.
async fn next_delivery(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Message {
    for _ in 0..3 {
        let got = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(1)
            .visibility_timeout(60)
            .wait_time_seconds(20)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if let Some(m) = got.into_iter().next() {
            return m;
        }
    }
    panic!("the job was not delivered again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_library_function_dead_letters_on_the_attempt_limit_its_environment_sets() {
    let created = support::fresh_resources("lib-attempts", false).await;
    let function = Function::start(&[
        ("TRIAGE_QUEUE_URL", created.queue_url.as_str()),
        ("TRIAGE_DLQ_URL", created.dlq_url.as_str()),
        ("TRIAGE_TABLE", created.table.as_str()),
        ("TRIAGE_MAX_ATTEMPTS", "2"),
        // Retried at once, so the test need not wait out a backoff.
        ("TRIAGE_BASE_DELAY_MS", "0"),
        ("TRIAGE_JITTER_MAX_MS", "0"),
    ])
    .await;
    let sqs = support::sqs_client().await;
    let body = json!({"type": JOB_TYPE, "id": "always-down", "payload": {}}).to_string();
    sqs.send_message()
        .queue_url(&created.queue_url)
        .message_body(body)
        .send()
        .await
        .unwrap();

    // First failure: retried.
    let first = next_delivery(&sqs, &created.queue_url).await;
    let id = first.message_id().unwrap().to_owned();
    assert_eq!(
        function.invoke(&[first], &created.queue_url).await,
        vec![id.clone()],
        "the first failure is retried"
    );

    // Second failure: the limit TRIAGE_MAX_ATTEMPTS=2 sets, so it is dead-lettered and
    // reported settled (the event source mapping deletes it).
    let second = next_delivery(&sqs, &created.queue_url).await;
    assert_eq!(second.message_id(), Some(id.as_str()));
    let failed = function.invoke(&[second], &created.queue_url).await;
    assert!(
        failed.is_empty(),
        "the second failure must be dead-lettered (TRIAGE_MAX_ATTEMPTS=2), but it was reported \
         for another try: {failed:?}\n{}",
        function.output()
    );
    let copies = support::read_all(&sqs, &created.dlq_url, 60, 2).await;
    assert_eq!(copies.len(), 1, "one DLQ copy");
    let record = failure_record(&copies[0].message_attributes.clone().unwrap_or_default())
        .expect("a failure record")
        .expect("a readable failure record");
    assert_eq!(record.class, FailureClass::Exhausted);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.original_message_id, id);
}

/// The DLQ's first copy, waiting up to `within` for it.
async fn first_dlq_copy(sqs: &aws_sdk_sqs::Client, dlq_url: &str, within: Duration) -> Option<Message> {
    let until = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < until {
        let got = support::read_all(sqs, dlq_url, 60, 2).await;
        if let Some(m) = got.into_iter().next() {
            return Some(m);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn a_library_worker_dead_letters_on_the_attempt_limit_its_environment_sets() {
    let created = support::fresh_resources("lib-worker-attempts", false).await;
    let log = std::env::temp_dir().join(support::unique_name("library-worker"));
    let mut child = support::strict_env(&mut Command::new(std::env::current_exe().unwrap()))
        .args([
            "--ignored",
            "--exact",
            "library_env::library_function_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "worker")
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("TRIAGE_MAX_ATTEMPTS", "2")
        .env("TRIAGE_BASE_DELAY_MS", "0")
        .env("TRIAGE_JITTER_MAX_MS", "0")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .expect("the worker starts");
    let output = || {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(log.clone()), read(log.with_extension("err")))
    };
    let sqs = support::sqs_client().await;
    let body = json!({"type": JOB_TYPE, "id": "always-down-worker", "payload": {}}).to_string();
    sqs.send_message()
        .queue_url(&created.queue_url)
        .message_body(body)
        .send()
        .await
        .unwrap();

    // With the built-in defaults (5 attempts, 3 s doubling) it would take over 40 s to reach
    // the DLQ, after 5 attempts; with the environment's, it is there after the second.
    let copy = first_dlq_copy(&sqs, &created.dlq_url, Duration::from_secs(30)).await;
    let _ = child.kill();
    let _ = child.wait();
    let out = output();
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("err"));
    let copy = copy.unwrap_or_else(|| panic!("no DLQ copy within 30 s (TRIAGE_MAX_ATTEMPTS=2)\n{out}"));
    let record = failure_record(&copy.message_attributes.clone().unwrap_or_default())
        .expect("a failure record")
        .expect("a readable failure record");
    assert_eq!(record.class, FailureClass::Exhausted, "{out}");
    assert_eq!(record.attempts, 2, "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_variable_stops_a_library_function_at_start_up_with_its_name() {
    let created = support::fresh_resources("lib-invalid", false).await;
    let api = RuntimeApi::start().await;
    let out = support::strict_env(&mut Command::new(std::env::current_exe().unwrap()))
        .args([
            "--ignored",
            "--exact",
            "library_env::library_function_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "lambda")
        .env("AWS_LAMBDA_RUNTIME_API", api.address())
        .env("AWS_LAMBDA_FUNCTION_NAME", "library-local")
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("TRIAGE_MAX_ATTEMPTS", "0")
        .stdin(Stdio::null())
        .output()
        .expect("the function runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("error: TRIAGE_MAX_ATTEMPTS=\"0\" is not valid: expected a number from 1 to 1000"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
}
