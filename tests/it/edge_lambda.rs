//! Edges of the runtimes, through the real binaries on the local stack: Lambda events with odd
//! records (`triage-lambda` behind a local Runtime API), and panic messages that carry
//! payload values (`triage worker` and `triage-lambda`).

use crate::support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use sqs_triage::core::failure::FailureClass;
use sqs_triage::effects::dlq::failure_record;
use triage::ops::setup::SetupReport;

use support::runtime_api::{Outcome, RuntimeApi};

/// One `triage-lambda` process and the Runtime API it polls; its stdout and stderr go to files.
pub(crate) struct Lambda {
    api: RuntimeApi,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Lambda {
    pub(crate) async fn start(created: &SetupReport, vars: &[(&str, &str)]) -> Lambda {
        let api = RuntimeApi::start().await;
        let base = std::env::temp_dir().join(support::unique_name("edge-lambda"));
        let stdout = base.with_extension("out");
        let stderr = base.with_extension("log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage-lambda"));
        support::strict_env(&mut cmd);
        cmd.env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", "triage-local")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "edge")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/triage-local")
            .env("TRIAGE_QUEUE_URL", &created.queue_url)
            .env("TRIAGE_DLQ_URL", &created.dlq_url)
            .env("TRIAGE_TABLE", &created.table)
            .env_remove("TRIAGE_LOG_PAYLOADS")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("triage-lambda starts");
        let lambda = Lambda {
            api,
            child,
            stdout,
            stderr,
        };
        assert!(
            lambda.api.ready(Duration::from_secs(120)).await,
            "triage-lambda did not start: {:?}\n{}",
            lambda.api.init_errors(),
            lambda.output()
        );
        lambda
    }

    pub(crate) async fn invoke(&self, event: &Value) -> Outcome {
        self.api
            .invoke(
                event.to_string(),
                Duration::from_secs(60),
                Duration::from_secs(60),
                Duration::from_secs(10),
            )
            .await
    }

    /// Everything the process wrote so far, stdout then stderr.
    pub(crate) fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(&self.stdout), read(&self.stderr))
    }

    /// Waits at most `within` for the process to end by itself: its exit code.
    fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let start = std::time::Instant::now();
        while start.elapsed() < within {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Stops the process and returns all it wrote.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.output()
    }
}

impl Drop for Lambda {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stdout);
        let _ = std::fs::remove_file(&self.stderr);
    }
}

pub(crate) fn response(outcome: Outcome) -> Value {
    match outcome {
        Outcome::Response(body) => serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
        other => panic!("expected a batch response, got {other:?}"),
    }
}

pub(crate) fn failures(v: &Value) -> BTreeSet<String> {
    v["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("no batchItemFailures in {v}"))
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

fn job(id: &str, outcome: &str) -> String {
    json!({"type": "triage.chaos", "id": id, "payload": {"outcome": outcome}}).to_string()
}

/// A well-formed record, as the event source mapping would build it.
pub(crate) fn record(id: &str, body: &str) -> Value {
    json!({
        "messageId": id,
        "receiptHandle": format!("AQEB{id}receipt=="),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1767225601000",
            "SenderId": "AIDAEXAMPLEPRODUCER",
            "ApproximateFirstReceiveTimestamp": "1767225601150"
        },
        "messageAttributes": {},
        "md5OfBody": "00000000000000000000000000000000",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:triage-jobs",
        "awsRegion": "us-east-1"
    })
}

/// The DLQ's messages: (original message id, class, attributes).
async fn dlq_copies(
    created: &SetupReport,
) -> Vec<(
    String,
    FailureClass,
    std::collections::HashMap<String, aws_sdk_sqs::types::MessageAttributeValue>,
)> {
    let sqs = support::sqs_client().await;
    support::read_all(&sqs, &created.dlq_url, 120, 1)
        .await
        .into_iter()
        .map(|m| {
            let attrs = m.message_attributes.unwrap_or_default();
            let record = failure_record(&attrs)
                .expect("a failure record")
                .expect("a readable failure record");
            (record.original_message_id, record.class, attrs)
        })
        .collect()
}

// ------------------------------------------------------------------ odd records

#[tokio::test(flavor = "multi_thread")]
async fn one_odd_record_of_ten_fails_alone_and_the_others_proceed() {
    let created = support::fresh_resources("edge-odd", false).await;
    let mut records = Vec::new();
    // r0: a clean record.
    records.push(record("r0", &job("j0", "ok")));
    // r1: the Powertools test event's shape: a Number attribute whose binaryValue is not base64.
    let mut r = record("r1", &job("j1", "ok"));
    r["messageAttributes"] =
        json!({"testAttr": {"stringValue": "100", "binaryValue": "not*base64!", "dataType": "Number"}});
    records.push(r);
    // r2: the same odd attribute on a fatal job: its DLQ copy keeps what could be read.
    let mut r = record("r2", &job("j2", "fatal"));
    r["messageAttributes"] = json!({
        "testAttr": {"stringValue": "100", "binaryValue": "not*base64!", "dataType": "Number"},
        "tag": {"stringValue": "blue", "dataType": "String"},
        "blob": {"binaryValue": "%%%", "dataType": "Binary"}
    });
    records.push(r);
    // r3: a system attribute of the wrong type.
    let mut r = record("r3", &job("j3", "ok"));
    r["attributes"]["ApproximateReceiveCount"] = json!(1);
    records.push(r);
    // r4: message attributes that are not a map.
    let mut r = record("r4", &job("j4", "ok"));
    r["messageAttributes"] = json!(["not", "a", "map"]);
    records.push(r);
    // r5: source ARN and receipt handle of the wrong types.
    let mut r = record("r5", &job("j5", "ok"));
    r["eventSourceARN"] = json!(42);
    r["receiptHandle"] = json!({"x": 1});
    records.push(r);
    // r6: a body that is not a string: unreadable, reported failed on its own.
    let mut r = record("r6", &job("j6", "ok"));
    r["body"] = json!(17);
    records.push(r);
    // r7: no body at all: read as empty, dead-lettered as invalid.
    let mut r = record("r7", "");
    r.as_object_mut().unwrap().remove("body");
    records.push(r);
    // r8: fields the processor does not use, of the wrong types.
    let mut r = record("r8", &job("j8", "ok"));
    r["md5OfBody"] = json!(5);
    r["awsRegion"] = json!([]);
    records.push(r);
    // r9: a job-type attribute whose value cannot be read: routing would be a guess.
    let mut r = record("r9", &job("j9", "ok"));
    r["messageAttributes"] = json!({"job-type": {"stringValue": 7, "dataType": "String"}});
    records.push(r);

    let lambda = Lambda::start(&created, &[]).await;
    let outcome = lambda.invoke(&json!({ "Records": records })).await;
    let out = lambda.stop();
    let v = match outcome {
        Outcome::Response(_) => response(outcome),
        other => panic!("the batch failed as a whole: {other:?}\n{out}"),
    };
    assert_eq!(
        failures(&v),
        BTreeSet::from(["r6".to_owned(), "r9".to_owned()]),
        "{v}\n{out}"
    );

    let mut copies = dlq_copies(&created).await;
    copies.sort_by(|a, b| a.0.cmp(&b.0));
    let got: Vec<(&str, FailureClass)> = copies.iter().map(|(id, c, _)| (id.as_str(), *c)).collect();
    assert_eq!(
        got,
        vec![("r2", FailureClass::Fatal), ("r7", FailureClass::Invalid)],
        "{out}"
    );
    let r2 = &copies[0].2;
    assert_eq!(r2.get("testAttr").and_then(|a| a.string_value()), Some("100"));
    assert_eq!(r2.get("testAttr").map(|a| a.data_type()), Some("Number"));
    assert_eq!(r2.get("tag").and_then(|a| a.string_value()), Some("blue"));
    assert!(
        !r2.contains_key("blob"),
        "an attribute with no readable value is dropped"
    );
    // The warnings name the attribute, never its value.
    assert!(out.contains("testAttr"), "{out}");
    assert!(!out.contains("not*base64!"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_without_any_readable_id_fails_the_batch_before_anything_runs() {
    let created = support::fresh_resources("edge-noid", false).await;
    let lambda = Lambda::start(&created, &[]).await;
    for bad in [
        json!(5),
        json!({"messageId": 5, "body": 6}),
        json!({"body": ["x"]}),
    ] {
        let event = json!({"Records": [record("f1", &job("jf1", "fatal")), bad]});
        match lambda.invoke(&event).await {
            Outcome::Error(_) => {}
            other => panic!("{bad}: expected the whole batch to fail, got {other:?}"),
        }
    }
    let out = lambda.stop();
    assert!(
        dlq_copies(&created).await.is_empty(),
        "no record of a failed batch runs (its fatal job was not dead-lettered)\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_fifo_queue_an_unreadable_record_holds_back_the_rest_of_its_group() {
    let created = support::fresh_resources("edge-fifo", true).await;
    let fifo = |id: &str, body: Value, group: &str| {
        let mut r = record(id, "");
        r["body"] = body;
        r["attributes"]["MessageGroupId"] = json!(group);
        r["eventSourceARN"] = json!("arn:aws:sqs:us-east-1:000000000000:triage-jobs.fifo");
        r
    };
    let event = json!({"Records": [
        fifo("a", json!(job("ja", "ok")), "g"),
        fifo("b", json!(17), "g"),
        fifo("c", json!(job("jc", "fatal")), "g"),
        fifo("d", json!(job("jd", "fatal")), "h"),
    ]});
    let lambda = Lambda::start(&created, &[]).await;
    let v = response(lambda.invoke(&event).await);
    let out = lambda.stop();
    assert_eq!(
        failures(&v),
        BTreeSet::from(["b".to_owned(), "c".to_owned()]),
        "{v}\n{out}"
    );
    // `c` did not run (its fatal job is not in the DLQ); `d`, in another group, did.
    let copies: Vec<String> = dlq_copies(&created).await.into_iter().map(|c| c.0).collect();
    assert_eq!(copies, vec!["d".to_owned()], "{out}");
}

/// Every event in `tests/corpus/sqs_event` through the binary: an event with a `Records`
/// array is answered with a batch response naming only its own records; anything else fails
/// the invocation as a whole.
#[tokio::test(flavor = "multi_thread")]
async fn the_sqs_event_corpus_gets_a_batch_response_per_event() {
    let created = support::fresh_resources("edge-corpus", false).await;
    let dir = support::repo_root().join("tests/corpus/sqs_event");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let lambda = Lambda::start(&created, &[]).await;
    let mut answered = 0;
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let Ok(event) = serde_json::from_str::<Value>(&text) else {
            // Not JSON: the runtime rejects it before the function (nothing to check here).
            continue;
        };
        let outcome = lambda.invoke(&event).await;
        let Some(records) = event.get("Records").and_then(Value::as_array) else {
            assert!(matches!(outcome, Outcome::Error(_)), "{name}: {outcome:?}");
            continue;
        };
        let v = match outcome {
            Outcome::Response(_) => response(outcome),
            other => panic!("{name}: {other:?}\n{}", lambda.output()),
        };
        let ids: BTreeSet<String> = records
            .iter()
            .filter_map(|r| r["messageId"].as_str().map(str::to_owned))
            .collect();
        let failed = failures(&v);
        assert!(failed.is_subset(&ids), "{name}: {v}");
        let expected: Option<&[&str]> = match name.as_str() {
            "attr-binary-bad-b64.json" | "record-empty.json" | "no-message-id.json" => Some(&[]),
            "body-number.json" => Some(&["m"]),
            "powertools-bad-binary-value.json" => Some(&[]),
            _ => None,
        };
        if let Some(expected) = expected {
            let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
            assert_eq!(failed, expected, "{name}: {v}");
        }
        answered += 1;
    }
    assert!(
        answered >= 15,
        "the corpus reached the function ({answered} events)"
    );
    drop(lambda);
    // The Powertools-style event's plain-text record was dead-lettered as invalid, its
    // attribute kept with the value that could be read.
    let copies = dlq_copies(&created).await;
    let pt = copies
        .iter()
        .find(|(id, _, _)| id == "7d1f0c52-3e7b-4a51-9c1e-2b5f3a9e0d41")
        .expect("the Powertools-style record's DLQ copy");
    assert_eq!(pt.1, FailureClass::Invalid);
    assert_eq!(pt.2.get("retries").and_then(|a| a.string_value()), Some("3"));
}

// ------------------------------------------------------------------ panic messages

const SECRET: &str = "pan-4111-1111-1111-1111";

fn panic_job(id: &str) -> String {
    json!({"type": "triage.chaos", "id": id, "payload": {"outcome": "panic", "panic_message": SECRET}})
        .to_string()
}

/// Runs `triage worker` on a fresh queue holding one job that panics with [`SECRET`] in its
/// panic message, until the job is dead-lettered; returns all the worker wrote.
async fn worker_output_for_a_panic(log_payloads: bool) -> String {
    let created = support::fresh_resources("edge-panic-w", false).await;
    let sqs = support::sqs_client().await;
    sqs.send_message()
        .queue_url(&created.queue_url)
        .message_body(panic_job("wp1"))
        .send()
        .await
        .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    support::strict_env(&mut cmd);
    cmd.args(["worker", "--demo-handlers"])
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("TRIAGE_EMF", "true")
        .env("RUST_LOG", "info")
        .env_remove("TRIAGE_LOG_PAYLOADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if log_payloads {
        cmd.env("TRIAGE_LOG_PAYLOADS", "true");
    }
    let mut child = cmd.spawn().expect("triage worker starts");
    let stdout = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = lines.clone();
    let reader = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("dead-lettered") {
                let _ = tx.send(());
            }
            seen.lock().unwrap().push(line);
        }
    });
    let settled = rx.recv_timeout(Duration::from_secs(120)).is_ok();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    reader.join().unwrap();
    let stderr = lines.lock().unwrap().join("\n");
    let out = format!("{}{stderr}", stdout.join().unwrap());
    assert!(settled, "the panicking job was never dead-lettered:\n{out}");
    out
}

/// The line the panic hook wrote.
fn panic_line(out: &str) -> &str {
    out.lines()
        .find(|l| l.contains("panicked") && l.contains("chaos.rs"))
        .unwrap_or_else(|| panic!("no panic line in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_message_reaches_the_worker_logs_masked() {
    let out = worker_output_for_a_panic(false).await;
    assert!(!out.contains(SECRET), "the secret leaked:\n{out}");
    let line = panic_line(&out);
    assert!(line.contains("chaos: panic on attempt 1"), "{line}");

    let out = worker_output_for_a_panic(true).await;
    assert!(panic_line(&out).contains(SECRET), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_message_reaches_the_lambda_logs_masked() {
    let created = support::fresh_resources("edge-panic-l", false).await;
    for log_payloads in [false, true] {
        let vars: &[(&str, &str)] = if log_payloads {
            &[("TRIAGE_LOG_PAYLOADS", "true")]
        } else {
            &[]
        };
        let lambda = Lambda::start(&created, vars).await;
        let id = format!("lp-{log_payloads}");
        let v = response(
            lambda
                .invoke(&json!({"Records": [record(&id, &panic_job(&id))]}))
                .await,
        );
        let out = lambda.stop();
        assert_eq!(
            failures(&v),
            BTreeSet::new(),
            "dead-lettered, not failed: {v}\n{out}"
        );
        // Logs go to CloudWatch, not a terminal: no colour codes.
        assert!(!out.contains('\u{1b}'), "ANSI escape codes in the logs:\n{out}");
        if log_payloads {
            assert!(panic_line(&out).contains(SECRET), "{out}");
        } else {
            assert!(!out.contains(SECRET), "the secret leaked:\n{out}");
            assert!(panic_line(&out).contains("chaos: panic on attempt 1"), "{out}");
        }
    }
}

// ------------------------------------------------------------------ log level

/// Lambda's log level setting (`AWS_LAMBDA_LOG_LEVEL`, from the function's logging config)
/// sets the level over `RUST_LOG`; without it, `RUST_LOG` does.
#[tokio::test(flavor = "multi_thread")]
async fn the_functions_log_level_setting_wins_over_rust_log() {
    let created = support::fresh_resources("edge-loglevel", false).await;
    let mut outputs = Vec::new();
    for vars in [&[][..], &[("AWS_LAMBDA_LOG_LEVEL", "WARN")][..]] {
        let lambda = Lambda::start(&created, vars).await;
        let id = format!("ll-{}", vars.len());
        // A retried job logs at info; an unreadable record at warn.
        let mut odd = record(&format!("{id}-odd"), "x");
        odd["body"] = json!(17);
        let event = json!({"Records": [record(&id, &job(&id, "transient")), odd]});
        let _ = response(lambda.invoke(&event).await);
        outputs.push(lambda.stop());
    }
    let (rust_log, lambda_level) = (&outputs[0], &outputs[1]);
    assert!(
        rust_log.contains(" INFO "),
        "RUST_LOG=info logs info lines:\n{rust_log}"
    );
    assert!(
        lambda_level.contains(" WARN "),
        "warnings are logged:\n{lambda_level}"
    );
    assert!(
        !lambda_level.contains(" INFO "),
        "AWS_LAMBDA_LOG_LEVEL=WARN must drop info lines even with RUST_LOG=info:\n{lambda_level}"
    );
}

/// With Lambda's JSON log format (`AWS_LAMBDA_LOG_FORMAT=JSON`, the templates' LoggingConfig)
/// every line the function writes is a JSON object with a `level`, logs and EMF metric lines
/// alike, since Lambda's level filter reads that key and drops a line without one at any
/// setting above INFO. The function's log level (`AWS_LAMBDA_LOG_LEVEL`) is honoured over
/// `RUST_LOG=info`: at ERROR only error lines, at DEBUG debug lines as well; the metric lines
/// carry a level the filter keeps at every setting.
#[tokio::test(flavor = "multi_thread")]
async fn json_log_format_writes_json_lines_at_the_functions_log_level() {
    let created = support::fresh_resources("edge-logjson", false).await;
    for level in ["ERROR", "DEBUG"] {
        let lambda = Lambda::start(
            &created,
            &[("AWS_LAMBDA_LOG_FORMAT", "JSON"), ("AWS_LAMBDA_LOG_LEVEL", level)],
        )
        .await;
        // A panic (logged at error), a retried job (info), an unreadable record (warn).
        let (panics, retried, odd_id) = (
            format!("lj-{level}-p"),
            format!("lj-{level}-t"),
            format!("lj-{level}-odd"),
        );
        let mut odd = record(&odd_id, "x");
        odd["body"] = json!(17);
        let event = json!({"Records": [
            record(&panics, &panic_job(&panics)),
            record(&retried, &job(&retried, "transient")),
            odd,
        ]});
        let v = response(lambda.invoke(&event).await);
        let out = lambda.stop();
        assert_eq!(
            failures(&v),
            BTreeSet::from([retried.clone(), odd_id.clone()]),
            "{v}\n{out}"
        );
        let lines: Vec<Value> = out
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| panic!("not a JSON object line: {l}\n{out}"))
            })
            .collect();
        let level_of = |l: &Value| -> String {
            l["level"]
                .as_str()
                .unwrap_or_else(|| panic!("a line without a level: {l}\n{out}"))
                .to_ascii_uppercase()
        };
        let (metrics, logs): (Vec<&Value>, Vec<&Value>) = lines.iter().partition(|l| l.get("_aws").is_some());
        assert!(!metrics.is_empty(), "no EMF metric line:\n{out}");
        // Lambda uses a line's level only with a valid RFC 3339 `timestamp`; without one it
        // files the line at INFO, which a WARN or ERROR function level drops.
        for l in &lines {
            let ts = l["timestamp"]
                .as_str()
                .unwrap_or_else(|| panic!("a line without a timestamp: {l}\n{out}"));
            aws_smithy_types::DateTime::from_str(ts, aws_smithy_types::date_time::Format::DateTime)
                .unwrap_or_else(|e| panic!("timestamp `{ts}` is not RFC 3339 ({e}): {l}"));
        }
        let log_levels: BTreeSet<String> = logs.iter().map(|l| level_of(l)).collect();
        if level == "ERROR" {
            assert_eq!(
                log_levels,
                BTreeSet::from(["ERROR".to_owned()]),
                "only error lines at ERROR (the panic's among them):\n{out}"
            );
            for m in &metrics {
                assert_eq!(level_of(m), "ERROR", "a metric line Lambda would drop: {m}");
            }
        } else {
            for want in ["DEBUG", "INFO", "WARN", "ERROR"] {
                assert!(log_levels.contains(want), "no {want} line at DEBUG:\n{out}");
            }
            for m in &metrics {
                assert_eq!(level_of(m), "INFO", "{m}");
            }
        }
    }
}

/// A missing table found by the first breaker read, which runs while the runtime polls: the
/// first invocation gets no answer, and the process ends as a failed start-up does (exit 1,
/// the error naming `TRIAGE_TABLE` and the table), so Lambda starts a fresh environment for
/// the next event and no record of this one ran or was reported done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_ends_the_function_at_its_first_event_with_the_start_up_error() {
    let created = support::fresh_resources("edge-lambda-notable", false).await;
    let missing = support::unique_name("no-such-table");
    let mut lambda = Lambda::start(&created, &[("TRIAGE_TABLE", missing.as_str())]).await;
    let event = json!({"Records": [record("nt-1", &json!({"type": "triage.chaos", "id": "nt-1", "payload": {"outcome": "ok"}}).to_string())]});
    let invoked = {
        let api = &lambda.api;
        api.invoke(
            event.to_string(),
            Duration::from_secs(2),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
    };
    let outcome = invoked.await;
    assert!(!matches!(outcome, Outcome::Response(_)), "{outcome:?}");
    let code = lambda.exit_code(Duration::from_secs(30));
    let output = lambda.output();
    assert_eq!(code, Some(1), "{output}");
    let line = output
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {output}"));
    assert!(line.contains("TRIAGE_TABLE") && line.contains(&missing), "{line}");
}
