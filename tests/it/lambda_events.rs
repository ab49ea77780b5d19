//! Every file in `events/` is invoked against the `triage-lambda` binary through cargo-lambda's
//! emulator (`cargo lambda watch --only-lambda-apis` + `cargo lambda invoke`), with the function
//! pointed at a fresh queue, DLQ and table on the local stack; each answer must match what that
//! event should produce. The binary is this package's own build, started by the test: the
//! emulator builds nothing.

use crate::support;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child process, killed when dropped.
struct Watch(Child);

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn root() -> PathBuf {
    crate::support::repo_root().to_path_buf()
}

fn cargo_lambda() -> PathBuf {
    let venv = std::env::var("TRIAGE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join(".local/venv"));
    let bin = venv.join("bin/cargo-lambda");
    assert!(
        bin.exists(),
        "cargo-lambda not installed at {}: run `bash infra/local/stack.sh install`",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `cargo lambda invoke` of `file`; an error when it fails or has no answer within 120 s (it
/// waits for ever for a function that is gone).
fn invoke(port: u16, file: &Path) -> Result<Value, String> {
    let mut child = Command::new(cargo_lambda())
        .args([
            "lambda",
            "invoke",
            "-A",
            "127.0.0.1",
            "-P",
            &port.to_string(),
            // The function the emulator serves when it starts none itself.
            "_",
            "--output-format",
            "json",
            "--data-file",
        ])
        .arg(file)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("no answer within 120 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn failures(v: &Value) -> BTreeSet<String> {
    v["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("no batchItemFailures in {v}"))
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

fn ids(file: &str, pick: &[usize]) -> BTreeSet<String> {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("events").join(file)).unwrap()).unwrap();
    let records = v["Records"].as_array().unwrap();
    pick.iter()
        .map(|&i| records[i]["messageId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_sample_event_gets_the_right_batch_response_from_the_lambda_binary() {
    let created = support::fresh_resources("events", false).await;

    let port = free_port();
    let envs = [
        format!("TRIAGE_QUEUE_URL={}", created.queue_url),
        format!("TRIAGE_DLQ_URL={}", created.dlq_url),
        format!("TRIAGE_TABLE={}", created.table),
        format!("AWS_ENDPOINT_URL_SQS={}", support::sqs_endpoint()),
        format!("AWS_ENDPOINT_URL_DYNAMODB={}", support::ddb_endpoint()),
        "AWS_REGION=us-east-1".into(),
        "AWS_ACCESS_KEY_ID=test".into(),
        "AWS_SECRET_ACCESS_KEY=test".into(),
        // The samples are independent cases: their transient failures together would open
        // `triage.chaos`'s breaker and defer the later files' records.
        "TRIAGE_BREAKER_MIN_EXECUTIONS=1000".into(),
        // eventbridge.json's `Chaos Requested` events are `triage.chaos` jobs.
        "TRIAGE_EVENTBRIDGE_TYPES=Chaos Requested=triage.chaos".into(),
        format!(
            "RUST_LOG={}",
            std::env::var("TRIAGE_TEST_LAMBDA_LOG").unwrap_or_else(|_| "warn".into())
        ),
    ];
    let mut cmd = Command::new(cargo_lambda());
    cmd.args([
        "lambda",
        "watch",
        "--only-lambda-apis",
        "-q",
        "-A",
        "127.0.0.1",
        "-P",
        &port.to_string(),
    ]);
    let _emulator = Watch(
        cmd.current_dir(root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cargo lambda watch starts"),
    );
    // The function's first poll must find the emulator listening.
    let listening = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            listening.elapsed() < Duration::from_secs(60),
            "cargo lambda's emulator never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut function = Command::new(env!("CARGO_BIN_EXE_triage-lambda"));
    function
        .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{port}/.rt"))
        .env("AWS_LAMBDA_FUNCTION_NAME", "_")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for e in &envs {
        let (k, v) = e.split_once('=').unwrap();
        function.env(k, v);
    }
    let mut function = Watch(function.spawn().expect("triage-lambda starts"));

    // The emulator and the function start side by side: retry until the emulator answers.
    let first = root().join("events/success.json");
    let start = Instant::now();
    while let Err(e) = invoke(port, &first) {
        if let Ok(Some(status)) = function.0.try_wait() {
            panic!("triage-lambda exited ({status}) before its first event");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "cargo lambda never answered: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let success = invoke(port, &first).unwrap();
    assert_eq!(failures(&success), BTreeSet::new(), "success.json: {success}");

    let cases: [(&str, &[usize]); 9] = [
        ("fatal.json", &[]),
        ("transient.json", &[0]),
        ("retry-after.json", &[0]),
        ("malformed.json", &[]),
        ("unknown-type.json", &[]),
        ("mixed.json", &[2, 3]),
        ("fifo.json", &[1, 2]),
        ("sns.json", &[2]),
        ("eventbridge.json", &[1]),
    ];
    for (file, failing) in cases {
        let v = invoke(port, &root().join("events").join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(failures(&v), ids(file, failing), "{file}: {v}");
    }
    // The dead-lettered records really are in the DLQ: fatal, malformed, unknown type,
    // mixed.json's fatal, malformed, unknown-type and attribute-typed records, sns.json's fatal
    // job and eventbridge.json's unmapped `Order Placed` event — these two as SQS delivered
    // them, wrapper and all.
    let dlq = support::read_all(&support::sqs_client().await, &created.dlq_url, 60, 1).await;
    let seen: BTreeSet<String> = dlq.iter().filter_map(|m| m.message_id.clone()).collect();
    assert_eq!(seen.len(), 9, "DLQ copies: {seen:?}");
    let bodies: BTreeSet<&str> = dlq.iter().filter_map(|m| m.body.as_deref()).collect();
    for (file, i) in [("sns.json", 1), ("eventbridge.json", 2)] {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(root().join("events").join(file)).unwrap())
                .unwrap();
        let body = v["Records"][i]["body"].as_str().unwrap();
        assert!(
            bodies.contains(body),
            "{file}: record {i}'s body is not in the DLQ as delivered"
        );
    }
}
