//! Every file in `events/` is invoked against the `triage-lambda` binary through cargo-lambda
//! (`cargo lambda watch` + `cargo lambda invoke`), with the function pointed at a fresh queue,
//! DLQ and table on the local stack; each answer must match what that event should produce.

use crate::support;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

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

fn invoke(port: u16, file: &Path) -> Result<Value, String> {
    let out = Command::new(cargo_lambda())
        .args([
            "lambda",
            "invoke",
            "-A",
            "127.0.0.1",
            "-P",
            &port.to_string(),
            "triage-lambda",
            "--output-format",
            "json",
            "--data-file",
        ])
        .arg(file)
        .current_dir(root())
        .output()
        .map_err(|e| e.to_string())?;
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
// The rebuild guard is held across awaits on purpose: other tests' spawns of the binary wait.
#[allow(clippy::await_holding_lock)]
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
    // The watch rebuilds target/debug/triage-lambda, which other tests of this process start.
    let rebuilding = support::rebuilding_lambda_binary();
    let mut cmd = Command::new(cargo_lambda());
    cmd.args([
        "lambda",
        "watch",
        "--ignore-changes",
        "-q",
        "-A",
        "127.0.0.1",
        "-P",
        &port.to_string(),
        "--bin",
        "triage-lambda",
    ]);
    for e in &envs {
        cmd.args(["--env-var", e]);
    }
    let _watch = Watch(
        cmd.current_dir(root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cargo lambda watch starts"),
    );

    // The first invoke waits for the build, which eats its deadline (the record is then
    // released, not run); retry until the emulator answers, then invoke for real.
    let first = root().join("events/success.json");
    let start = Instant::now();
    while let Err(e) = invoke(port, &first) {
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "cargo lambda never answered: {e}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    drop(rebuilding);
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
