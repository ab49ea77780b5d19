//! The `triage` CLI against the local stack: setup, send, DLQ list/show/replay/purge/redrive,
//! and one clear line (no panic, no backtrace) for every kind of bad input.
//!
//! Needs the local stack: `bash infra/local/stack.sh start` and
//! `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use serde_json::{Value, json};
use sqs_triage::core::failure::{FAILURE_ATTRIBUTE, FailureClass, FailureRecord};
use sqs_triage::effects::dlq::{PACKED_ATTRIBUTE, dlq_copy};
use sqs_triage::effects::storage_retry::sqs_config;
use sqs_triage::effects::table::ledger_key;
use triage::ops::output::Report;
use triage::ops::{Ctx, dlq};

const BIN: &str = env!("CARGO_BIN_EXE_triage");

/// One queue pair and table made by `triage setup`.
struct Stack {
    queue_url: String,
    dlq_url: String,
    table: String,
}

fn triage_cmd(stack: Option<&Stack>, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(args)
        .env_remove("TRIAGE_QUEUE_URL")
        .env_remove("TRIAGE_DLQ_URL")
        .env_remove("TRIAGE_TABLE")
        .env_remove("RUST_BACKTRACE")
        .env("AWS_ENDPOINT_URL_STS", support::sts_endpoint())
        .stdin(Stdio::null());
    if let Some(s) = stack {
        cmd.env("TRIAGE_QUEUE_URL", &s.queue_url)
            .env("TRIAGE_DLQ_URL", &s.dlq_url)
            .env("TRIAGE_TABLE", &s.table);
    }
    cmd
}

fn run(stack: Option<&Stack>, args: &[&str]) -> Output {
    triage_cmd(stack, args).output().expect("run triage")
}

fn run_with_stdin(stack: Option<&Stack>, args: &[&str], input: &str) -> Output {
    let mut child = triage_cmd(stack, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn triage");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().expect("wait triage")
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
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// Asserts a failed run printed exactly one `error:` line naming `needle`, with `code`.
fn assert_one_line_error(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace") && !err.contains("RUST_BACKTRACE"),
        "panic or backtrace: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "`{needle}` not in: {err}");
}

fn setup(prefix: &str) -> Stack {
    let q = support::unique_name(prefix);
    let out = run(
        None,
        &[
            "setup",
            "--queue",
            &q,
            "--dlq",
            &format!("{q}-dlq"),
            "--table",
            &format!("{q}-t"),
            "--json",
        ],
    );
    let v = ok_json(&out);
    Stack {
        queue_url: v["queue_url"].as_str().unwrap().to_owned(),
        dlq_url: v["dlq_url"].as_str().unwrap().to_owned(),
        table: v["table"].as_str().unwrap().to_owned(),
    }
}

async fn sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&support::sdk_config().await)
}

async fn ddb() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&support::sdk_config().await)
}

fn string_attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

fn record(class: FailureClass, job_type: &str, job_id: &str, source: &str, error: &str) -> FailureRecord {
    FailureRecord {
        class,
        error: error.into(),
        attempts: if class == FailureClass::Invalid { 0 } else { 1 },
        job_type: Some(job_type.into()),
        job_id: job_id.into(),
        source_queue: source.into(),
        original_message_id: format!("orig-{job_id}"),
        first_received_at: 1,
        failed_at: sqs_triage::clock::now_ms() - 5_000,
    }
}

fn body(job_type: &str, job_id: &str) -> String {
    json!({"type": job_type, "payload": {"n": job_id}, "id": job_id}).to_string()
}

/// Puts DLQ copies (as the processor makes them) of `(class, type, id)` jobs into the DLQ,
/// each with an original attribute `tenant`.
async fn seed_dlq(stack: &Stack, jobs: &[(FailureClass, &str, String)]) {
    let client = sqs().await;
    for chunk in jobs.chunks(10) {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, (class, t, id))| {
                let original = HashMap::from([("tenant".to_owned(), string_attr("acme"))]);
                let rec = record(*class, t, id, &stack.queue_url, &format!("{t} broke: boom {id}"));
                let copy = dlq_copy(&body(t, id), &original, &rec, 1 << 20).unwrap();
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(copy.body)
                    .set_message_attributes(Some(copy.attributes))
                    .build()
                    .unwrap()
            })
            .collect();
        let out = client
            .send_message_batch()
            .queue_url(&stack.dlq_url)
            .set_entries(Some(entries))
            .send()
            .await
            .unwrap();
        assert!(out.failed.is_empty());
    }
}

async fn put_ledger(stack: &Stack, job_type: &str, job_id: &str) {
    ddb()
        .await
        .put_item()
        .table_name(&stack.table)
        .set_item(Some(ledger_key(job_type, job_id)))
        .item("job_type", AttributeValue::S(job_type.into()))
        .item("job_id", AttributeValue::S(job_id.into()))
        .item("attempts", AttributeValue::N("3".into()))
        .send()
        .await
        .unwrap();
}

async fn has_ledger(stack: &Stack, job_type: &str, job_id: &str) -> bool {
    ddb()
        .await
        .get_item()
        .table_name(&stack.table)
        .set_key(Some(ledger_key(job_type, job_id)))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_some()
}

/// Receives (and deletes) every message of a queue: [`support::drain`].
async fn drain(url: &str, want: usize) -> Vec<aws_sdk_sqs::types::Message> {
    support::drain(&sqs().await, url, want).await
}

async fn visible_count(url: &str) -> u64 {
    let d = support::queue_depth(&sqs().await, url).await;
    assert_eq!(d.in_flight, 0, "messages left invisible");
    d.visible
}

fn group_count(list: &Value, job_type: &str, class: &str) -> u64 {
    list["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["job_type"] == job_type && g["class"] == class)
        .map_or(0, |g| g["count"].as_u64().unwrap())
}

#[tokio::test]
async fn setup_is_idempotent_and_wires_the_redrive_policy() {
    let q = support::unique_name("cli-setup");
    let args = |json: bool| {
        let mut a = vec![
            "setup".to_owned(),
            "--queue".into(),
            q.clone(),
            "--dlq".into(),
            format!("{q}-dlq"),
            "--table".into(),
            format!("{q}-t"),
        ];
        if json {
            a.push("--json".into());
        }
        a
    };
    let first = ok_json(&run(
        None,
        &args(true).iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let again = ok_json(&run(
        None,
        &args(true).iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert_eq!(first, again);
    let human = run(None, &args(false).iter().map(String::as_str).collect::<Vec<_>>());
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains(&format!(
            "export TRIAGE_DLQ_URL={}",
            first["dlq_url"].as_str().unwrap()
        )),
        "{text}"
    );

    let attrs = support::all_attributes(&sqs().await, first["queue_url"].as_str().unwrap()).await;
    let redrive: Value = serde_json::from_str(&attrs[&QueueAttributeName::RedrivePolicy]).unwrap();
    assert_eq!(redrive["deadLetterTargetArn"], first["dlq_arn"]);
    assert_eq!(redrive["maxReceiveCount"].to_string().trim_matches('"'), "50");
    ddb()
        .await
        .describe_table()
        .table_name(first["table"].as_str().unwrap())
        .send()
        .await
        .expect("table exists");

    let fifo = ok_json(&run(
        None,
        &[
            "setup",
            "--queue",
            &format!("{q}-f"),
            "--dlq",
            &format!("{q}-fd"),
            "--table",
            &format!("{q}-t"),
            "--fifo",
            "--json",
        ],
    ));
    assert!(fifo["queue_url"].as_str().unwrap().ends_with(".fifo"));
    assert!(fifo["dlq_url"].as_str().unwrap().ends_with(".fifo"));
}

#[tokio::test]
async fn send_takes_one_job_from_flags_or_many_as_ndjson() {
    let stack = setup("cli-send");
    let one = ok_json(&run(
        Some(&stack),
        &[
            "send",
            "--type",
            "email.send",
            "--payload",
            r#"{"to":"a@b"}"#,
            "--id",
            "j-1",
            "--json",
        ],
    ));
    assert_eq!(one["accepted"], 1);
    let lines: String = (0..25)
        .map(|i| {
            format!(
                "{}\n",
                json!({"type": "bulk", "payload": {"i": i}, "id": format!("b-{i}")})
            )
        })
        .collect();
    let many = ok_json(&run_with_stdin(Some(&stack), &["send", "--json"], &lines));
    assert_eq!(many["requested"], 25);
    assert_eq!(many["accepted"], 25);
    assert_eq!(many["rejected"].as_array().unwrap().len(), 0);

    let got = drain(&stack.queue_url, 26).await;
    assert_eq!(got.len(), 26);
    let bodies: Vec<Value> = got
        .iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect();
    assert!(bodies.contains(&json!({"type": "email.send", "payload": {"to": "a@b"}, "id": "j-1"})));
    let ids: HashSet<&str> = bodies.iter().filter_map(|b| b["id"].as_str()).collect();
    assert_eq!(ids.len(), 26);
}

#[tokio::test]
async fn send_keeps_every_digit_of_a_payload() {
    let stack = setup("cli-send-digits");
    // Numbers a 64-bit reading cannot carry: an integer beyond 64 bits, a decimal with more
    // digits than a double holds, and a spelling a parse would change.
    let payload = r#"{"n":123456789012345678901234,"p":19.99999999999999999,"e":1e2}"#;
    ok_json(&run(
        Some(&stack),
        &[
            "send",
            "--type",
            "t",
            "--payload",
            payload,
            "--id",
            "flags",
            "--json",
        ],
    ));
    let line = format!("{{\"type\":\"t\",\"id\":\"ndjson\",\"payload\":{payload}}}\n");
    ok_json(&run_with_stdin(Some(&stack), &["send", "--json"], &line));
    let got = drain(&stack.queue_url, 2).await;
    assert_eq!(got.len(), 2);
    for m in &got {
        let body = m.body().unwrap();
        assert!(body.contains(payload), "the payload was rewritten: {body}");
    }
}

/// A `--payload` written over several lines goes as one line: its `--unsent` line can be sent
/// again.
#[tokio::test]
async fn the_unsent_line_of_a_payload_written_over_several_lines_can_be_sent_again() {
    use support::fault_proxy::{Fault, FaultProxy};
    let stack = setup("cli-send-unsent-lines");
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("SendMessageBatch", Fault::Throttle);
    let unsent = std::env::temp_dir().join(support::unique_name("unsent-lines"));
    let unsent = unsent.to_str().unwrap();
    let payload = "{\n  \"a\": 1,\n  \"n\": 123456789012345678901234\n}";
    let o = triage_cmd(
        Some(&stack),
        &[
            "send",
            "--type",
            "t",
            "--id",
            "j1",
            "--payload",
            payload,
            "--unsent",
            unsent,
        ],
    )
    .env("AWS_ENDPOINT_URL_SQS", proxy.url())
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let again = ok_json(&run(Some(&stack), &["send", "--file", unsent, "--json"]));
    assert_eq!(again["accepted"], 1, "{again}");
    let got = drain(&stack.queue_url, 1).await;
    assert_eq!(
        got[0].body(),
        Some(r#"{"id":"j1","payload":{"a":1,"n":123456789012345678901234},"type":"t"}"#)
    );
    let _ = std::fs::remove_file(unsent);
}

#[tokio::test]
async fn bad_input_gets_one_clear_line_and_a_nonzero_exit() {
    let stack = setup("cli-bad");
    let missing_queue = Stack {
        queue_url: format!("{}-nope", stack.queue_url),
        dlq_url: format!("{}-nope", stack.dlq_url),
        table: format!("{}-nope", stack.table),
    };

    // Missing variables.
    let o = run(None, &["dlq", "list"]);
    assert_one_line_error(
        &o,
        2,
        "TRIAGE_DLQ_URL is not set: pass --dlq-url or export TRIAGE_DLQ_URL",
    );
    let o = run(None, &["send", "--type", "t"]);
    assert_one_line_error(&o, 2, "TRIAGE_QUEUE_URL is not set");
    let o = run(Some(&stack), &["dlq", "replay", "--table", ""]);
    assert_one_line_error(&o, 2, "TRIAGE_TABLE is not set");
    let o = triage_cmd(Some(&stack), &["dlq", "list"])
        .env_remove("AWS_REGION")
        .env_remove("AWS_DEFAULT_REGION")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .output()
        .unwrap();
    assert_one_line_error(&o, 2, "AWS_REGION is not set");

    // Unknown queue, missing table.
    let o = run(Some(&missing_queue), &["dlq", "list"]);
    assert_one_line_error(
        &o,
        3,
        "does not exist: run `triage setup` or check TRIAGE_DLQ_URL",
    );
    let o = run(Some(&missing_queue), &["send", "--type", "t"]);
    assert_one_line_error(
        &o,
        3,
        "does not exist: run `triage setup` or check TRIAGE_QUEUE_URL",
    );
    let o = run(Some(&stack), &["dlq", "replay", "--table", &missing_queue.table]);
    assert_one_line_error(&o, 3, &format!("table {} does not exist", missing_queue.table));
    let o = run(Some(&stack), &["dlq", "show", "no-such-job"]);
    assert_one_line_error(&o, 3, "no DLQ message with job id or message id `no-such-job`");

    // Bad payloads and arguments.
    let o = run(Some(&stack), &["send", "--type", "t", "--payload", "{not json"]);
    assert_one_line_error(&o, 2, "--payload is not valid JSON");
    let o = run_with_stdin(Some(&stack), &["send"], "{\"type\":\"a\"}\n{oops\n");
    assert_one_line_error(&o, 2, "line 2: not a job");
    let o = run(Some(&stack), &["send", "--type", "", "--payload", "1"]);
    assert_one_line_error(&o, 2, "job type must be");
    let o = run(Some(&stack), &["dlq", "replay", "--older-than", "soon"]);
    assert_one_line_error(&o, 2, "soon");
    let o = run(Some(&stack), &["dlq", "replay", "--rate", "0"]);
    assert_one_line_error(&o, 2, "--rate must be a positive number");
    // A rate so small that its pacing overflows a Duration is refused, not a panic.
    for tiny in ["1e-19", "0.001"] {
        let o = run(Some(&stack), &["dlq", "replay", "--rate", tiny]);
        assert_one_line_error(&o, 2, "--rate must be");
    }
    let o = run(Some(&stack), &["dlq", "replay", "--rate", "1e9"]);
    assert_one_line_error(&o, 2, "--rate must be");
    let o = run(Some(&stack), &["dlq", "frobnicate"]);
    assert_one_line_error(&o, 2, "frobnicate");
    let o = run(
        None,
        &["setup", "--queue", "bad name!", "--dlq", "d", "--table", "tbl"],
    );
    assert_one_line_error(&o, 2, "not a valid queue name");

    // Unreachable endpoint.
    let o = triage_cmd(Some(&stack), &["dlq", "list"])
        .env("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert_one_line_error(
        &o,
        4,
        "cannot reach SQS at http://127.0.0.1:9: is the local stack running",
    );

    // Destructive commands need --yes without a terminal; nothing is deleted.
    seed_dlq(&stack, &[(FailureClass::Fatal, "t", "p-1".into())]).await;
    let o = run(Some(&stack), &["dlq", "purge"]);
    assert_one_line_error(&o, 2, "pass --yes");
    assert_eq!(visible_count(&stack.dlq_url).await, 1);
}

/// `--max-scan N` reads at most N messages, and every command that reads the DLQ says when it
/// stopped there.
#[tokio::test]
async fn reads_stop_at_max_scan_and_say_so() {
    let stack = setup("cli-max-scan");
    let jobs: Vec<(FailureClass, &str, String)> = (0..12)
        .map(|i| (FailureClass::Fatal, "ms.job", format!("ms-{i}")))
        .collect();
    seed_dlq(&stack, &jobs).await;

    let list = ok_json(&run(Some(&stack), &["dlq", "list", "--max-scan", "5", "--json"]));
    assert_eq!(
        (list["total"].as_u64(), list["scanned"].as_u64()),
        (Some(5), Some(5)),
        "{list}"
    );
    assert_eq!(list["scan_limit_reached"], true, "{list}");
    assert_eq!(list["incomplete"], false, "{list}");
    let human = run(Some(&stack), &["dlq", "list", "--max-scan", "5"]);
    assert!(human.status.success(), "{}", stderr(&human));
    assert!(
        String::from_utf8_lossy(&human.stdout)
            .contains("note: the read stopped at --max-scan (5 message(s))"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );
    let all = ok_json(&run(Some(&stack), &["dlq", "list", "--json"]));
    assert_eq!(all["total"], 12, "{all}");
    assert_eq!(all["scan_limit_reached"], false, "{all}");

    let dry = ok_json(&run(
        Some(&stack),
        &["dlq", "replay", "--dry-run", "--max-scan", "7", "--json"],
    ));
    assert_eq!(
        (dry["scanned"].as_u64(), dry["selected"].as_u64()),
        (Some(7), Some(7)),
        "{dry}"
    );
    assert_eq!(dry["scan_limit_reached"], true, "{dry}");

    let purge = ok_json(&run(
        Some(&stack),
        &["dlq", "purge", "--max-scan", "3", "--yes", "--json"],
    ));
    assert_eq!(purge["deleted"], 3, "{purge}");
    assert_eq!(purge["scan_limit_reached"], true, "{purge}");
    assert_eq!(visible_count(&stack.dlq_url).await, 9);

    // Not found in the part read: the error says the read stopped there.
    for args in [
        &["dlq", "show", "nope", "--max-scan", "2"][..],
        &["dlq", "edit", "nope", "--patch", "[]", "--max-scan", "2"][..],
    ] {
        let o = run(Some(&stack), args);
        assert_one_line_error(&o, 3, "the read stopped at --max-scan (2 message(s))");
    }
    assert_eq!(visible_count(&stack.dlq_url).await, 9);
}

#[tokio::test]
async fn list_show_and_dry_run_remove_nothing() {
    let stack = setup("cli-list");
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..12).map(|i| (FailureClass::Fatal, "billing.charge", format!("bc-{i}"))));
    jobs.extend((0..5).map(|i| (FailureClass::Exhausted, "email.send", format!("es-{i}"))));
    jobs.extend((0..3).map(|i| (FailureClass::Invalid, "nope", format!("nv-{i}"))));
    seed_dlq(&stack, &jobs).await;
    // One message SQS's own redrive would have moved: no failure record.
    sqs()
        .await
        .send_message()
        .queue_url(&stack.dlq_url)
        .message_body(body("crashy", "cr-1"))
        .send()
        .await
        .unwrap();

    let list = ok_json(&run(Some(&stack), &["dlq", "list", "--json"]));
    assert_eq!(list["total"], 21);
    assert_eq!(group_count(&list, "billing.charge", "fatal"), 12);
    assert_eq!(group_count(&list, "email.send", "exhausted"), 5);
    assert_eq!(group_count(&list, "nope", "invalid"), 3);
    assert_eq!(group_count(&list, "crashy", "unrecorded"), 1);
    let g = &list["groups"][0];
    assert_eq!(g["job_type"], "billing.charge");
    assert!(g["oldest_age_s"].as_u64().unwrap() >= 4);
    assert!(
        g["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("billing.charge broke")
    );
    assert_eq!(
        visible_count(&stack.dlq_url).await,
        21,
        "list must release what it read"
    );

    let human = run(Some(&stack), &["dlq", "list"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("21 message(s)"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("billing.charge"))
        .expect(&text);
    assert!(row.contains("fatal") && row.contains("12"), "{row}");

    let filtered = ok_json(&run(
        Some(&stack),
        &["dlq", "list", "--class", "exhausted", "--messages", "--json"],
    ));
    assert_eq!(filtered["total"], 5);
    assert_eq!(filtered["messages"].as_array().unwrap().len(), 5);

    let shown = ok_json(&run(Some(&stack), &["dlq", "show", "bc-3", "--json"]));
    let m = &shown["messages"][0];
    assert_eq!(m["job_id"], "bc-3");
    assert_eq!(m["record"]["class"], "fatal");
    assert_eq!(m["attributes"]["tenant"], "acme");
    assert_eq!(m["body"], body("billing.charge", "bc-3"));

    let dry = ok_json(&run(
        Some(&stack),
        &["dlq", "replay", "--type", "billing.charge", "--dry-run", "--json"],
    ));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["selected"], 12);
    assert_eq!(dry["moved"], 12);
    assert_eq!(visible_count(&stack.dlq_url).await, 21, "dry run changed the DLQ");
    assert_eq!(visible_count(&stack.queue_url).await, 0, "dry run sent something");
}

#[tokio::test]
async fn replay_moves_the_selection_back_unchanged_at_the_given_rate() {
    let stack = setup("cli-replay");
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..30).map(|i| (FailureClass::Fatal, "billing.charge", format!("rb-{i}"))));
    jobs.extend((0..5).map(|i| (FailureClass::Fatal, "email.send", format!("re-{i}"))));
    seed_dlq(&stack, &jobs).await;
    for (_, t, id) in &jobs {
        put_ledger(&stack, t, id).await;
    }

    let started = Instant::now();
    let out = run(
        Some(&stack),
        &[
            "dlq",
            "replay",
            "--type",
            "billing.charge",
            "--rate",
            "20",
            "--json",
        ],
    );
    let elapsed = started.elapsed();
    let report = ok_json(&out);
    assert_eq!(report["selected"], 30);
    assert_eq!(report["moved"], 30);
    assert_eq!(report["ledgers_reset"], 30);
    assert!(
        elapsed >= Duration::from_millis(1_500),
        "30 messages at 20/s took only {elapsed:?}"
    );

    let moved = drain(&stack.queue_url, 30).await;
    assert_eq!(moved.len(), 30);
    for m in &moved {
        let b: Value = serde_json::from_str(m.body().unwrap()).unwrap();
        let id = b["id"].as_str().unwrap();
        assert_eq!(m.body().unwrap(), body("billing.charge", id), "body changed");
        let attrs = m.message_attributes().unwrap();
        assert_eq!(attrs.len(), 1, "{attrs:?}");
        assert_eq!(attrs["tenant"].string_value(), Some("acme"));
        assert!(!attrs.contains_key(FAILURE_ATTRIBUTE));
        assert!(
            !has_ledger(&stack, "billing.charge", id).await,
            "ledger of {id} not reset"
        );
    }
    assert!(
        has_ledger(&stack, "email.send", "re-0").await,
        "an unselected job's ledger was reset"
    );
    let list = ok_json(&run(Some(&stack), &["dlq", "list", "--json"]));
    assert_eq!(list["total"], 5);
    assert_eq!(group_count(&list, "email.send", "fatal"), 5);

    // --to and --limit.
    let other = setup("cli-replay-to");
    let to = ok_json(&run(
        Some(&stack),
        &[
            "dlq",
            "replay",
            "--to",
            &other.queue_url,
            "--limit",
            "2",
            "--json",
        ],
    ));
    assert_eq!(to["moved"], 2);
    assert_eq!(to["targets"][0]["queue_url"], other.queue_url.as_str());
    assert_eq!(drain(&other.queue_url, 2).await.len(), 2);
    assert_eq!(visible_count(&stack.dlq_url).await, 3);
}

#[tokio::test]
async fn replay_reports_what_it_could_not_move() {
    let stack = setup("cli-nomove");
    sqs()
        .await
        .send_message()
        .queue_url(&stack.dlq_url)
        .message_body(body("crashy", "cr-1"))
        .send()
        .await
        .unwrap();
    let out = run(Some(&stack), &["dlq", "replay", "--json"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["selected"], 1);
    assert_eq!(report["moved"], 0);
    assert!(
        report["not_moved"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("--to")
    );
    assert_one_line_error(&out, 5, "1 of 1 selected message(s) were not moved");
    assert_eq!(
        visible_count(&stack.dlq_url).await,
        1,
        "unmoved message must stay visible"
    );
}

#[tokio::test]
async fn purge_deletes_only_the_selection() {
    let stack = setup("cli-purge");
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..4).map(|i| (FailureClass::Invalid, "junk", format!("pj-{i}"))));
    jobs.extend((0..3).map(|i| (FailureClass::Fatal, "keep", format!("pk-{i}"))));
    seed_dlq(&stack, &jobs).await;
    let report = ok_json(&run(
        Some(&stack),
        &["dlq", "purge", "--class", "invalid", "--yes", "--json"],
    ));
    assert_eq!(report["deleted"], 4);
    assert_eq!(visible_count(&stack.dlq_url).await, 3);
    let list = ok_json(&run(Some(&stack), &["dlq", "list", "--json"]));
    assert_eq!(group_count(&list, "keep", "fatal"), 3);
}

#[tokio::test]
async fn redrive_on_moto_points_to_replay() {
    let stack = setup("cli-redrive");
    let o = run(Some(&stack), &["dlq", "redrive", "--rate", "5", "--yes"]);
    assert_one_line_error(&o, 6, "does not support StartMessageMoveTask");
    assert!(stderr(&o).contains("triage dlq replay"));
    let o = run(Some(&stack), &["dlq", "redrive", "status"]);
    assert_one_line_error(&o, 6, "use `triage dlq replay`");
}

#[tokio::test]
async fn breakers_are_read_and_forced_with_confirmation() {
    let stack = setup("cli-breaker");
    let empty = ok_json(&run(Some(&stack), &["breaker", "status", "--json"]));
    assert_eq!(empty["breakers"].as_array().unwrap().len(), 0);

    let o = run(Some(&stack), &["breaker", "open", "billing.charge"]);
    assert_one_line_error(&o, 2, "pass --yes");
    let fresh = ok_json(&run(
        Some(&stack),
        &["breaker", "status", "billing.charge", "--json"],
    ));
    assert_eq!(fresh["breakers"][0]["phase"], "closed");
    assert_eq!(
        fresh["breakers"][0]["version"], 0,
        "a refused force wrote something"
    );

    let o = run(
        Some(&stack),
        &["breaker", "open", "billing.charge", "--yes", "--json"],
    );
    let opened = ok_json(&o);
    assert_eq!(opened["breakers"][0]["phase"], "open");
    assert_eq!(opened["breakers"][0]["forced"], true);
    // Forces are audited in the state table (tests/it/audit.rs), not logged to stderr.
    assert_eq!(opened["audit"]["written"], true, "not audited: {}", stderr(&o));
    assert_eq!(opened["audit"]["table"], stack.table.as_str());
    let all = ok_json(&run(Some(&stack), &["breaker", "status", "--json"]));
    assert_eq!(all["breakers"][0]["job_type"], "billing.charge");
    assert_eq!(all["breakers"][0]["phase"], "open");
    let text = String::from_utf8_lossy(&run(Some(&stack), &["breaker", "status"]).stdout).into_owned();
    assert!(text.contains("forced (until closed)"), "{text}");

    let timed = ok_json(&run(
        Some(&stack),
        &["breaker", "open", "email.send", "--for", "10m", "-y", "--json"],
    ));
    assert_eq!(timed["breakers"][0]["forced"], false);
    assert!(timed["breakers"][0]["open_until_ms"].as_u64().unwrap() > sqs_triage::clock::now_ms());

    let closed = ok_json(&run(
        Some(&stack),
        &["breaker", "close", "billing.charge", "--yes", "--json"],
    ));
    assert_eq!(closed["breakers"][0]["phase"], "closed");
    let reset = ok_json(&run(
        Some(&stack),
        &["breaker", "reset", "email.send", "--yes", "--json"],
    ));
    assert_eq!(reset["breakers"][0]["phase"], "closed");

    let o = run(
        Some(&stack),
        &["breaker", "status", "--table", "no-such-table-cli"],
    );
    assert_one_line_error(&o, 3, "table no-such-table-cli does not exist");
}

/// `breaker status` shows a counting window's failure rate: its failures of its executions.
#[tokio::test]
async fn breaker_status_shows_the_windows_failures_of_its_executions() {
    let stack = setup("cli-rate");
    let sdk = support::sdk_config().await;
    let store = sqs_triage::effects::breaker_store::BreakerStore::new(
        sqs_triage::effects::storage_retry::dynamodb_client(&sdk),
        &stack.table,
        sqs_triage::effects::storage_retry::StorageRetry::default(),
    );
    let agg = sqs_triage::core::breaker::Aggregate {
        transient_failures: 3,
        executions: 10,
        ..Default::default()
    };
    store
        .report("billing.charge", &agg, sqs_triage::clock::now_ms(), None)
        .await
        .unwrap();
    let v = ok_json(&run(Some(&stack), &["breaker", "status", "--json"]));
    let b = &v["breakers"][0];
    assert_eq!(
        (&b["phase"], &b["failures"], &b["executions"]),
        (&json!("closed"), &json!(3), &json!(10)),
        "{v}"
    );
    let text = String::from_utf8_lossy(&run(Some(&stack), &["breaker", "status"]).stdout).into_owned();
    assert!(text.contains("FAILED/RAN") && text.contains(" 3/10 "), "{text}");
}

#[tokio::test]
async fn attempts_show_reads_the_ledger() {
    let stack = setup("cli-attempts");
    put_ledger(&stack, "email.send", "job-7").await;
    let shown = ok_json(&run(Some(&stack), &["attempts", "show", "job-7", "--json"]));
    assert_eq!(shown["found"], true);
    assert_eq!(shown["attempts"], 3);
    assert_eq!(shown["job_type"], "email.send", "the one type with a ledger");
    let typed = ok_json(&run(
        Some(&stack),
        &["attempts", "show", "job-7", "--type", "email.send", "--json"],
    ));
    assert_eq!(
        (typed["found"].clone(), typed["attempts"].clone()),
        (json!(true), json!(3))
    );
    let other = ok_json(&run(
        Some(&stack),
        &["attempts", "show", "job-7", "--type", "billing.charge", "--json"],
    ));
    assert_eq!(other["found"], false, "ledgers are per job type");
    let none = ok_json(&run(Some(&stack), &["attempts", "show", "job-8", "--json"]));
    assert_eq!(none["found"], false);
    // Two job types share the id: without --type the answer would be ambiguous.
    put_ledger(&stack, "billing.charge", "job-7").await;
    let o = run(Some(&stack), &["attempts", "show", "job-7"]);
    assert_one_line_error(&o, 2, "pass --type");
    assert!(
        stderr(&o).contains("billing.charge") && stderr(&o).contains("email.send"),
        "{}",
        stderr(&o)
    );
    let typed = ok_json(&run(
        Some(&stack),
        &["attempts", "show", "job-7", "--type", "billing.charge", "--json"],
    ));
    assert_eq!(typed["found"], true);
    let o = run(
        Some(&stack),
        &["attempts", "show", "job-7", "--type", "email.send"],
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.contains("attempts") && text.contains('3') && text.contains("email.send"),
        "{text}"
    );
    let o = run(None, &["attempts", "show", "job-7"]);
    assert_one_line_error(&o, 2, "TRIAGE_TABLE is not set");
    let o = run(
        Some(&stack),
        &["attempts", "show", "job-7", "--table", "no-such-table-cli"],
    );
    assert_one_line_error(&o, 3, "does not exist");
}

/// Every queue whose name starts with `prefix`, and whether the table `table` exists.
async fn created(prefix: &str, table: &str) -> (Vec<String>, bool) {
    let queues = sqs()
        .await
        .list_queues()
        .queue_name_prefix(prefix)
        .send()
        .await
        .unwrap()
        .queue_urls
        .unwrap_or_default();
    let table = match ddb().await.describe_table().table_name(table).send().await {
        Ok(_) => true,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            false
        }
        Err(e) => panic!("DescribeTable {table}: {e:?}"),
    };
    (queues, table)
}

#[tokio::test]
async fn setup_refuses_a_max_receive_count_that_leaves_no_room_for_the_attempts() {
    let q = support::unique_name("cli-mrc");
    let (dlq, table) = (format!("{q}-dlq"), format!("{q}-t"));
    let setup_args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["setup", "--queue", &q, "--dlq", &dlq, "--table", &table]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run_setup = |extra: &[&str], attempts_env: Option<&str>| {
        let args = setup_args(extra);
        let mut cmd = triage_cmd(None, &args.iter().map(String::as_str).collect::<Vec<_>>());
        match attempts_env {
            Some(v) => cmd.env("TRIAGE_MAX_ATTEMPTS", v),
            None => cmd.env_remove("TRIAGE_MAX_ATTEMPTS"),
        };
        cmd.output().expect("run triage")
    };

    // The configuration's default of 5 attempts needs at least 4 x 5 = 20 receives.
    let o = run_setup(&["--max-receive-count", "1"], None);
    assert_one_line_error(&o, 2, "--max-receive-count 1");
    assert!(
        stderr(&o).contains("5 attempts") && stderr(&o).contains("20"),
        "{}",
        stderr(&o)
    );
    // Attempts from the flag, then from TRIAGE_MAX_ATTEMPTS as the worker reads it.
    let o = run_setup(&["--max-receive-count", "100", "--max-attempts", "30"], None);
    assert_one_line_error(&o, 2, "--max-receive-count 100");
    assert!(
        stderr(&o).contains("30 attempts") && stderr(&o).contains("120"),
        "{}",
        stderr(&o)
    );
    let o = run_setup(&["--max-receive-count", "100"], Some("30"));
    assert_one_line_error(&o, 2, "--max-receive-count 100");
    assert!(stderr(&o).contains("TRIAGE_MAX_ATTEMPTS"), "{}", stderr(&o));
    // More attempts than any redrive policy can hold (SQS caps maxReceiveCount at 1000).
    let o = run_setup(&["--max-attempts", "251"], None);
    assert_one_line_error(&o, 2, "251");
    let o = run_setup(&["--max-attempts", "0"], None);
    assert_one_line_error(&o, 2, "--max-attempts");
    assert_eq!(
        created(&q, &table).await,
        (vec![], false),
        "a refused setup creates nothing"
    );

    // Without --max-receive-count the default leaves room for the configured attempts.
    let v = ok_json(&run_setup(&["--json"], Some("30")));
    assert_eq!(v["max_receive_count"], 120);
    let v = ok_json(&run_setup(&["--json", "--max-receive-count", "20"], None));
    assert_eq!(v["max_receive_count"], 20);
}

#[tokio::test]
async fn send_fills_each_batch_up_to_the_payload_cap() {
    use support::fault_proxy::FaultProxy;
    let stack = setup("cli-send-big");
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.enforce_batch_cap(1_048_576);
    let lines: String = (0..10)
        .map(|i| {
            let line = json!({"type": "big", "id": format!("big-{i}"), "payload": "x".repeat(110_000)});
            format!("{line}\n")
        })
        .collect();
    let mut child = triage_cmd(Some(&stack), &["send", "--json"])
        .env("AWS_ENDPOINT_URL_SQS", proxy.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let report = ok_json(&child.wait_with_output().unwrap());
    assert_eq!(report["accepted"], 10, "{report}");
    assert_eq!(report["sent"].as_array().unwrap().len(), 10);
    assert!(
        report["sent"][0]["message_id"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert_eq!(proxy.faults().get("BatchRequestTooLong"), None);
    assert_eq!(
        proxy.count("SendMessageBatch"),
        2,
        "ten 110 KB jobs fill two batches under SQS's 1 MiB cap"
    );
    assert_eq!(drain(&stack.queue_url, 10).await.len(), 10);
}

#[tokio::test]
async fn send_reports_a_job_sqs_never_confirmed_as_rejected() {
    use support::fault_proxy::{Fault, FaultProxy};
    let stack = setup("cli-send-empty");
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always(
        "SendMessageBatch",
        Fault::Body {
            status: 200,
            body: "{}".into(),
        },
    );
    let o = triage_cmd(Some(&stack), &["send", "--type", "t", "--id", "j-1", "--json"])
        .env("AWS_ENDPOINT_URL_SQS", proxy.url())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["accepted"], 0, "{report}");
    assert_eq!(report["rejected"].as_array().unwrap().len(), 1, "{report}");
}

#[tokio::test]
async fn redrive_asks_for_confirmation_like_purge() {
    let stack = setup("cli-redrive-ask");
    // Without a terminal and without --yes: refused before anything is asked of SQS.
    let o = run(Some(&stack), &["dlq", "redrive"]);
    assert_one_line_error(
        &o,
        2,
        "refusing to redrive without confirmation in a non-interactive shell: pass --yes",
    );
    let o = run(
        Some(&stack),
        &["dlq", "redrive", "--to", &stack.queue_url, "--rate", "5"],
    );
    assert_one_line_error(&o, 2, "pass --yes");
    // With --yes it goes ahead (moto has no move tasks).
    let o = run(Some(&stack), &["dlq", "redrive", "--yes"]);
    assert_one_line_error(&o, 6, "does not support StartMessageMoveTask");
    // Reading or cancelling move tasks asks nothing.
    let o = run(Some(&stack), &["dlq", "redrive", "status"]);
    assert_one_line_error(&o, 6, "use `triage dlq replay`");
}

/// Operator commands retry through the one storage retry policy, a few tries because an
/// operator waits: a DLQ read SQS keeps throttling is tried 3 times (not the SDK's tries on
/// top of the policy's), then reported as one line with exit 1.
#[tokio::test]
async fn a_throttled_dlq_read_is_tried_three_times_then_reported() {
    use support::fault_proxy::{Fault, FaultProxy};
    let stack = setup("cli-throttled");
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("ReceiveMessage", Fault::Throttle);
    let o = triage_cmd(Some(&stack), &["dlq", "list"])
        .env("AWS_ENDPOINT_URL_SQS", proxy.url())
        .output()
        .unwrap();
    assert_one_line_error(&o, 1, "ReceiveMessage");
    assert_eq!(proxy.count("ReceiveMessage"), 3, "{:?}", proxy.counts());
}

#[tokio::test]
async fn replay_refuses_a_to_queue_that_is_the_dlq_itself() {
    let stack = setup("cli-self");
    seed_dlq(&stack, &[(FailureClass::Fatal, "loop.me", "ls-1".to_owned())]).await;
    let with_slash = format!("{}/", stack.dlq_url);
    let name = stack.dlq_url.rsplit('/').next().unwrap().to_owned();
    for to in [stack.dlq_url.as_str(), with_slash.as_str(), name.as_str()] {
        for dry_run in [true, false] {
            let mut args = vec!["dlq", "replay", "--to", to];
            if dry_run {
                args.push("--dry-run");
            }
            let o = run(Some(&stack), &args);
            assert_one_line_error(&o, 2, "--to names the DLQ being replayed");
        }
    }
    // Nothing was sent or taken: the one message is still there, with its failure record.
    let left = drain(&stack.dlq_url, 1).await;
    assert_eq!(left.len(), 1);
    assert!(
        left[0]
            .message_attributes()
            .unwrap()
            .contains_key(FAILURE_ATTRIBUTE)
    );
}

/// Puts into the DLQ a copy of job `id` shaped as the processor packs one (`triage-failure`
/// and `triage-attributes`) whose packed attributes are not JSON.
async fn seed_malformed_packed(stack: &Stack, job_type: &str, id: &str) {
    let rec = record(FailureClass::Fatal, job_type, id, &stack.queue_url, "boom");
    sqs()
        .await
        .send_message()
        .queue_url(&stack.dlq_url)
        .message_body(body(job_type, id))
        .message_attributes(
            FAILURE_ATTRIBUTE,
            string_attr(&serde_json::to_string(&rec).unwrap()),
        )
        .message_attributes(PACKED_ATTRIBUTE, string_attr("{not json"))
        .send()
        .await
        .unwrap();
}

/// The one `not_moved` reason of a replay report.
fn only_reason(report: &Value) -> String {
    let not_moved = report["not_moved"].as_array().unwrap();
    assert_eq!(not_moved.len(), 1, "{report}");
    not_moved[0]["reason"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_dry_run_refuses_what_the_replay_refuses() {
    let stack = setup("cli-dry-checks");
    seed_dlq(&stack, &[(FailureClass::Fatal, "fine.job", "dc-ok".to_owned())]).await;
    seed_malformed_packed(&stack, "bad.attrs", "dc-bad").await;
    // A job larger than the --to queue takes.
    let small = support::unique_name("cli-small");
    let small_url = sqs()
        .await
        .create_queue()
        .queue_name(&small)
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let big_id = format!("dc-big-{}", "x".repeat(1_500));
    seed_dlq(&stack, &[(FailureClass::Fatal, "big.job", big_id.clone())]).await;

    // `dlq show` says the reserved attributes cannot be read, rather than showing none.
    let shown = ok_json(&run(Some(&stack), &["dlq", "show", "dc-bad", "--json"]));
    let error = shown["messages"][0]["attributes_error"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains(PACKED_ATTRIBUTE), "{shown}");
    let human = run(Some(&stack), &["dlq", "show", "dc-bad"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains(PACKED_ATTRIBUTE),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );

    for (args, job) in [
        (vec!["--type", "bad.attrs"], "dc-bad"),
        (
            vec!["--type", "big.job", "--to", small_url.as_str()],
            big_id.as_str(),
        ),
    ] {
        let mut dry_args = vec!["dlq", "replay", "--dry-run", "--json"];
        dry_args.extend(&args);
        let dry = ok_json(&run(Some(&stack), &dry_args));
        assert_eq!(
            (dry["selected"].as_u64(), dry["moved"].as_u64()),
            (Some(1), Some(0)),
            "{dry}"
        );
        assert_eq!(dry["not_moved"][0]["job_id"], job);
        let dry_reason = only_reason(&dry);

        let mut real_args = vec!["dlq", "replay", "--json"];
        real_args.extend(&args);
        let real = run(Some(&stack), &real_args);
        assert_eq!(real.status.code(), Some(5), "{}", stderr(&real));
        let real: Value = serde_json::from_slice(&real.stdout).unwrap();
        assert_eq!(real["moved"], 0, "{real}");
        assert_eq!(
            only_reason(&real),
            dry_reason,
            "the dry run gives the replay's reason"
        );
    }
    assert_eq!(visible_count(&small_url).await, 0);
    assert_eq!(visible_count(&stack.dlq_url).await, 3);
}

/// A replay slow enough that the messages it holds but does not move come back before it is
/// done: it still reads every message that was in the DLQ when it started.
#[tokio::test]
async fn a_slow_filtered_replay_reads_the_whole_dlq() {
    let stack = setup("cli-slow");
    seed_dlq(&stack, &slow_replay_jobs()).await;
    // Whole receives: with SQS's partial ones, the held messages coming back can cut the sweep
    // short before it sees an empty receive (a report that says so; nothing is lost).
    support::strict_sqs().receive_whole(&stack.dlq_url);

    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let opts = slow_replay_options(&stack.table);
    let report = dlq::replay(&ctx, &stack.dlq_url, &opts).await.unwrap();
    assert_eq!(report.scanned, 70, "{report:?}");
    assert_eq!((report.selected, report.moved), (30, 30), "{report:?}");
    assert!(!report.incomplete, "{report:?}");
    assert_eq!(report.problem(), None);
    let moved = job_ids(&drain(&stack.queue_url, 30).await);
    assert_eq!(moved.len(), 30, "{moved:?}");
    assert_eq!(
        moved.into_iter().collect::<BTreeSet<_>>(),
        (0..30).map(|i| format!("mv-{i}")).collect::<BTreeSet<_>>(),
        "every selected job moved, once"
    );
    assert_eq!(visible_count(&stack.dlq_url).await, 40);
}

/// [`a_slow_filtered_replay_reads_the_whole_dlq`]'s jobs: 40 not selected, sent first (so
/// received first: the held messages that come back crowd the receives), then 30 selected.
fn slow_replay_jobs() -> Vec<(FailureClass, &'static str, String)> {
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..40).map(|i| (FailureClass::Fatal, "y.stay", format!("st-{i}"))));
    jobs.extend((0..30).map(|i| (FailureClass::Fatal, "y.move", format!("mv-{i}"))));
    jobs
}

/// [`a_slow_filtered_replay_reads_the_whole_dlq`]'s replay: the 30 selected at 5/s, holds of
/// 2 s (shorter than the 6 s the moves take: the 40 held come back meanwhile).
fn slow_replay_options(table: &str) -> dlq::ReplayOptions {
    dlq::ReplayOptions {
        filter: dlq::Filter {
            job_types: vec!["y.move".into()],
            ..dlq::Filter::default()
        },
        rate: Some(5.0),
        hold: Some(Duration::from_secs(2)),
        table: Some(table.to_owned()),
        max_scan: 100_000,
        ..dlq::ReplayOptions::default()
    }
}

/// When SQS refuses to hold them again, the messages that come back end a slow replay's sweep
/// early, and the report says the DLQ was not read to the end (exit 5 from the CLI); nothing
/// is lost.
#[tokio::test]
async fn a_slow_replay_whose_holds_are_refused_says_the_dlq_was_not_read_to_the_end() {
    use support::fault_proxy::{Fault, FaultProxy};
    let jobs = slow_replay_jobs();
    let stuck = setup("cli-slow-stuck");
    seed_dlq(&stuck, &jobs).await;
    support::strict_sqs().receive_whole(&stuck.dlq_url);
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("ChangeMessageVisibilityBatch", Fault::Status500);
    let sdk = support::sdk_config().await;
    let mut via = Ctx::from_config(&sdk).unwrap();
    via.sqs = aws_sdk_sqs::Client::from_conf(sqs_config(&sdk).endpoint_url(proxy.url()).build());
    let opts = slow_replay_options(&stuck.table);
    let report = dlq::replay(&via, &stuck.dlq_url, &opts).await.unwrap();
    assert!(report.incomplete, "{report:?}");
    assert!(report.moved < 30, "{report:?}");
    let problem = report.problem().unwrap_or_default();
    assert!(problem.contains("not read to the end"), "{problem}");
    // Nothing lost: every job is in the source queue or still in the DLQ. One in both is a
    // moved job whose delete came after its hold ended (SQS then deletes nothing).
    let id = |m: &aws_sdk_sqs::types::Message| -> String {
        let v: Value = serde_json::from_str(m.body().unwrap_or_default()).unwrap();
        v["id"].as_str().unwrap_or_default().to_owned()
    };
    let moved: BTreeSet<String> = drain(&stuck.queue_url, report.moved)
        .await
        .iter()
        .map(id)
        .collect();
    assert_eq!(
        moved.len(),
        report.moved,
        "the moved jobs are in the source queue"
    );
    let left: Vec<String> = drain(&stuck.dlq_url, 70 - report.moved)
        .await
        .iter()
        .map(id)
        .collect();
    let left_set: BTreeSet<String> = left.iter().cloned().collect();
    assert_eq!(left.len(), left_set.len(), "a job twice in the DLQ: {left:?}");
    let all: BTreeSet<String> = jobs.iter().map(|(_, _, id)| id.clone()).collect();
    assert_eq!(&moved | &left_set, all, "nothing lost");
    assert!(
        moved.iter().all(|j| j.starts_with("mv-")),
        "only the selected type moved: {moved:?}"
    );
}

/// A replay to a FIFO queue keeps each message group in order: once a message of a group is
/// not moved, the later ones of that group stay in the DLQ too, reported with the reason.
#[tokio::test]
async fn a_fifo_replay_moves_nothing_of_a_group_past_a_message_it_could_not_move() {
    let q = support::unique_name("cli-fifo-order");
    let v = ok_json(&run(
        None,
        &[
            "setup",
            "--queue",
            &q,
            "--dlq",
            &format!("{q}-dlq"),
            "--table",
            &format!("{q}-t"),
            "--fifo",
            "--json",
        ],
    ));
    let stack = Stack {
        queue_url: v["queue_url"].as_str().unwrap().to_owned(),
        dlq_url: v["dlq_url"].as_str().unwrap().to_owned(),
        table: v["table"].as_str().unwrap().to_owned(),
    };
    let client = sqs().await;
    // Group g: g-1, then g-2 (its packed attributes are not JSON: replay refuses it), then
    // g-3. Group h: h-1.
    for (group, id, packed) in [
        ("g", "g-1", None),
        ("g", "g-2", Some("{not json")),
        ("g", "g-3", None),
        ("h", "h-1", None),
    ] {
        let rec = record(FailureClass::Fatal, "fifo.job", id, &stack.queue_url, "boom");
        let mut send = client
            .send_message()
            .queue_url(&stack.dlq_url)
            .message_body(body("fifo.job", id))
            .message_group_id(group)
            .message_deduplication_id(id)
            .message_attributes(
                FAILURE_ATTRIBUTE,
                string_attr(&serde_json::to_string(&rec).unwrap()),
            );
        if let Some(p) = packed {
            send = send.message_attributes(PACKED_ATTRIBUTE, string_attr(p));
        }
        send.send().await.unwrap();
    }

    for dry_run in [true, false] {
        let mut args = vec!["dlq", "replay", "--json"];
        if dry_run {
            args.push("--dry-run");
        }
        let o = run(Some(&stack), &args);
        assert_eq!(
            o.status.code(),
            Some(if dry_run { 0 } else { 5 }),
            "{}",
            stderr(&o)
        );
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (report["selected"].as_u64(), report["moved"].as_u64()),
            (Some(4), Some(2)),
            "{report}"
        );
        let not_moved: HashMap<&str, &str> = report["not_moved"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["job_id"].as_str().unwrap(), n["reason"].as_str().unwrap()))
            .collect();
        assert!(not_moved["g-2"].contains(PACKED_ATTRIBUTE), "{report}");
        assert!(
            not_moved["g-3"].contains("group g") && not_moved["g-3"].contains("overtake"),
            "{report}"
        );
    }
    let moved: HashSet<String> = drain(&stack.queue_url, 2)
        .await
        .iter()
        .map(|m| {
            serde_json::from_str::<Value>(m.body().unwrap()).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(moved, HashSet::from(["g-1".to_owned(), "h-1".to_owned()]));
    assert_eq!(
        drain(&stack.dlq_url, 2).await.len(),
        2,
        "g-2 and g-3 stay in the DLQ"
    );
}

/// While the purge question waits, only the selection is held: the rest of the DLQ is
/// visible to other readers, and an answer other than yes makes the selection visible too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_holds_only_its_selection_while_it_asks() {
    let stack = setup("cli-purge-hold");
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..3).map(|i| (FailureClass::Invalid, "junk", format!("ph-j{i}"))));
    jobs.extend((0..4).map(|i| (FailureClass::Fatal, "keep", format!("ph-k{i}"))));
    seed_dlq(&stack, &jobs).await;
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let client = sqs().await;
    let opts = dlq::PurgeOptions {
        filter: dlq::Filter {
            job_types: vec!["junk".into()],
            ..dlq::Filter::default()
        },
        ..dlq::PurgeOptions::default()
    };
    let mut asked = None;
    let r = dlq::purge_with(&ctx, &stack.dlq_url, &opts, |plan| {
        let depth = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(support::queue_depth(&client, &stack.dlq_url))
        });
        asked = Some((plan.selected, depth.visible, depth.in_flight));
        false
    })
    .await;
    assert!(r.is_err(), "answered no");
    assert_eq!(asked, Some((3, 4, 3)), "(selected, visible, held) while asking");
    assert_eq!(visible_count(&stack.dlq_url).await, 7);
}

/// `cmd` run in a terminal (util-linux `script`), its input and output piped to the test.
fn in_terminal(stack: &Stack, cmd: &str) -> std::process::Child {
    Command::new("script")
        .args(["-q", "-f", "-e", "-c", cmd, "/dev/null"])
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env("AWS_ENDPOINT_URL_STS", support::sts_endpoint())
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script (util-linux)")
}

/// The output of a command run with [`in_terminal`], chunk by chunk as it comes.
fn terminal_output(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<Vec<u8>> {
    use std::io::Read;
    let mut out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Types Ctrl-C into the terminal of a command run with [`in_terminal`], and waits for it to end.
fn ctrl_c_and_wait(child: &mut std::process::Child) -> std::process::ExitStatus {
    let mut input = child.stdin.take().unwrap();
    input.write_all(b"\x03").unwrap();
    input.flush().unwrap();
    let status = child.wait().unwrap();
    drop(input);
    status
}

/// Ctrl-C while purge is still reading the DLQ (before its question) deletes nothing and
/// makes what it had read visible again.
#[tokio::test]
async fn ctrl_c_while_purge_reads_makes_everything_visible_again() {
    use support::fault_proxy::FaultProxy;
    let stack = setup("cli-purge-read-int");
    let jobs: Vec<(FailureClass, &str, String)> = (0..30)
        .map(|i| (FailureClass::Invalid, "junk", format!("pr-j{i}")))
        .collect();
    seed_dlq(&stack, &jobs).await;
    // The second receive is held: the read is still going when Ctrl-C comes, with the first
    // receive's messages held.
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    hold_from(&proxy, "ReceiveMessage", 2);
    let mut child = in_terminal(
        &stack,
        &format!("AWS_ENDPOINT_URL_SQS={} {BIN} dlq purge --type junk", proxy.url()),
    );
    let rx = terminal_output(&mut child);
    assert!(
        proxy.until_held(1, Duration::from_secs(30)).await,
        "the purge never read the DLQ twice"
    );
    let mut input = child.stdin.take().unwrap();
    input.write_all(b"\x03").unwrap();
    input.flush().unwrap();
    // The purge takes the interrupt while its receive is held, then the receive goes on.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("interrupted: stopping the read") {
        let chunk = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the interrupt was not taken: {}", String::from_utf8_lossy(&seen)));
        seen.extend(chunk);
    }
    proxy.release_held();
    let status = child.wait().unwrap();
    drop(input);
    seen.extend(rx.try_iter().flatten());
    let seen = String::from_utf8_lossy(&seen);
    assert!(!status.success(), "{seen}");
    assert!(!seen.contains("[y/N]"), "the read was not interrupted: {seen}");
    assert!(seen.contains("nothing was deleted"), "{seen}");
    assert_eq!(visible_count(&stack.dlq_url).await, 30, "{seen}");
}

/// Lets the first `n - 1` `op` requests through `proxy` and holds the `n`th and every later
/// one until [`support::fault_proxy::FaultProxy::release_held`].
fn hold_from(proxy: &support::fault_proxy::FaultProxy, op: &str, n: u64) {
    use support::fault_proxy::{Fault, FaultRule};
    let rule = |fault, times| FaultRule {
        ops: Some(vec![op.into()]),
        body_contains: None,
        fault,
        times,
    };
    if n > 1 {
        proxy.add_rule(rule(Fault::Delay(Duration::ZERO), Some(n - 1)));
    }
    proxy.add_rule(rule(Fault::Hold, None));
}

/// Sends SIGINT to `child`, as Ctrl-C in its terminal would.
fn sigint(child: &std::process::Child) {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits until `proxy` has received `n` requests of `op`.
async fn until_requests(proxy: &support::fault_proxy::FaultProxy, op: &str, n: u64) {
    let asked = std::time::Instant::now();
    while proxy.count(op) < n {
        assert!(asked.elapsed() < Duration::from_secs(30), "no {op} #{n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `dlq purge --yes --json` on `stack`, its SQS calls through a proxy, interrupted while the
/// `n`th `op` request is held by the proxy: exits 2 and deletes nothing.
async fn purge_interrupted_at(stack: &Stack, op: &str, n: u64) {
    use std::io::{BufRead, BufReader};
    use support::fault_proxy::FaultProxy;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    hold_from(&proxy, op, n);
    let mut child = triage_cmd(
        Some(stack),
        &["dlq", "purge", "--type", "junk", "--yes", "--json"],
    )
    .env("AWS_ENDPOINT_URL_SQS", proxy.url())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("interrupted: stopping the read") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    assert!(proxy.until_held(1, Duration::from_secs(30)).await, "no {op} #{n}");
    sigint(&child);
    // The purge takes the interrupt while the request is held, then the request goes on.
    let taken = rx.recv_timeout(Duration::from_secs(30));
    proxy.release_held();
    let status = child.wait().unwrap();
    let err = reader.join().unwrap();
    assert!(taken.is_ok(), "the interrupt was not taken: {err}");
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("nothing was deleted"), "{err}");
}

/// With --yes there is no question: a Ctrl-C during the read's last (empty) receive, or while
/// the messages not selected are given back, still stops the purge before it deletes.
#[tokio::test]
async fn a_ctrl_c_at_the_end_of_the_read_stops_a_purge_without_question() {
    let stack = setup("cli-purge-int-yes");
    let jobs = [
        (FailureClass::Invalid, "junk", "piy-j".to_owned()),
        (FailureClass::Fatal, "keep", "piy-k".to_owned()),
    ];
    seed_dlq(&stack, &jobs).await;
    // Receive 1 brings both messages; receive 2, the empty one, ends the read. Whole receives:
    // with a partial first receive, receive 2 would still be reading.
    support::strict_sqs().receive_whole(&stack.dlq_url);
    purge_interrupted_at(&stack, "ReceiveMessage", 2).await;
    assert_eq!(visible_count(&stack.dlq_url).await, 2);
    // The first visibility change gives back the message not selected.
    purge_interrupted_at(&stack, "ChangeMessageVisibilityBatch", 1).await;
    assert_eq!(visible_count(&stack.dlq_url).await, 2);
}

/// A second Ctrl-C while a declined purge gives its selection back does not cut that short.
#[tokio::test]
async fn a_second_ctrl_c_after_the_purge_question_still_gives_everything_back() {
    use support::fault_proxy::{Fault, FaultProxy, FaultRule};
    let stack = setup("cli-purge-int-twice");
    let jobs: Vec<(FailureClass, &str, String)> = (0..3)
        .map(|i| (FailureClass::Invalid, "junk", format!("pit-{i}")))
        .collect();
    seed_dlq(&stack, &jobs).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    let mut child = in_terminal(
        &stack,
        &format!("AWS_ENDPOINT_URL_SQS={} {BIN} dlq purge --type junk", proxy.url()),
    );
    let rx = terminal_output(&mut child);
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("[y/N]") {
        seen.extend(rx.recv_timeout(Duration::from_secs(30)).expect("the question"));
    }
    // The selection's release is held up; the second Ctrl-C lands while it waits.
    proxy.add_rule(FaultRule {
        ops: Some(vec!["ChangeMessageVisibilityBatch".into()]),
        body_contains: None,
        fault: Fault::Delay(Duration::from_millis(1500)),
        times: None,
    });
    let released = proxy.count("ChangeMessageVisibilityBatch");
    let mut input = child.stdin.take().unwrap();
    input.write_all(b"\x03").unwrap();
    input.flush().unwrap();
    until_requests(&proxy, "ChangeMessageVisibilityBatch", released + 1).await;
    input.write_all(b"\x03").unwrap();
    input.flush().unwrap();
    let status = child.wait().unwrap();
    drop(input);
    seen.extend(rx.try_iter().flatten());
    assert!(!status.success(), "{}", String::from_utf8_lossy(&seen));
    assert_eq!(
        visible_count(&stack.dlq_url).await,
        3,
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

/// Ctrl-C at the purge question deletes nothing and leaves nothing hidden.
#[tokio::test]
async fn ctrl_c_at_the_purge_question_makes_everything_visible_again() {
    let stack = setup("cli-purge-int");
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..3).map(|i| (FailureClass::Invalid, "junk", format!("pi-j{i}"))));
    jobs.extend((0..2).map(|i| (FailureClass::Fatal, "keep", format!("pi-k{i}"))));
    seed_dlq(&stack, &jobs).await;
    let mut child = in_terminal(&stack, &format!("{BIN} dlq purge --type junk"));
    let rx = terminal_output(&mut child);
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("[y/N]") {
        let chunk = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no question: {}", String::from_utf8_lossy(&seen)));
        seen.extend(chunk);
    }
    let status = ctrl_c_and_wait(&mut child);
    let rest: Vec<u8> = rx.try_iter().flatten().collect();
    seen.extend(rest);
    assert!(!status.success(), "{}", String::from_utf8_lossy(&seen));
    assert_eq!(
        visible_count(&stack.dlq_url).await,
        5,
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

fn fifo_stack(prefix: &str) -> Stack {
    let q = support::unique_name(prefix);
    let v = ok_json(&run(
        None,
        &[
            "setup",
            "--queue",
            &q,
            "--dlq",
            &format!("{q}-dlq"),
            "--table",
            &format!("{q}-t"),
            "--fifo",
            "--json",
        ],
    ));
    Stack {
        queue_url: v["queue_url"].as_str().unwrap().to_owned(),
        dlq_url: v["dlq_url"].as_str().unwrap().to_owned(),
        table: v["table"].as_str().unwrap().to_owned(),
    }
}

async fn seed_fifo(stack: &Stack, items: &[(&str, &str, &str, Option<&str>)]) {
    let client = sqs().await;
    for (group, ty, id, packed) in items {
        let rec = record(FailureClass::Fatal, ty, id, &stack.queue_url, "boom");
        let mut send = client
            .send_message()
            .queue_url(&stack.dlq_url)
            .message_body(body(ty, id))
            .message_group_id(*group)
            .message_deduplication_id(*id)
            .message_attributes(
                FAILURE_ATTRIBUTE,
                string_attr(&serde_json::to_string(&rec).unwrap()),
            );
        if let Some(p) = packed {
            send = send.message_attributes(PACKED_ATTRIBUTE, string_attr(p));
        }
        send.send().await.unwrap();
    }
}

fn job_ids(ms: &[aws_sdk_sqs::types::Message]) -> Vec<String> {
    ms.iter()
        .map(|m| {
            serde_json::from_str::<Value>(m.body().unwrap()).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// A send refused for a FIFO group's message stops the later messages of the group, also when
/// a message after them had already been refused by the copy checks (the group then counted
/// as stopped already).
#[tokio::test]
async fn a_send_refused_in_a_fifo_group_stops_its_later_messages() {
    for with_bad_tail in [false, true] {
        let stack = fifo_stack("rv-fifo-send");
        let mut items = vec![("g", "fifo.job", "g-1", None), ("g", "fifo.job", "g-2", None)];
        if with_bad_tail {
            items.push(("g", "fifo.job", "g-3", Some("{not json")));
        }
        seed_fifo(&stack, &items).await;
        use support::fault_proxy::{Fault, FaultProxy};
        let proxy = FaultProxy::start(&support::sqs_endpoint());
        proxy.fail_next(
            1,
            Fault::Body {
                status: 200,
                body: r#"{"Successful":[],"Failed":[{"Id":"e0","Code":"InvalidParameterValue","SenderFault":true,"Message":"refused"}]}"#.into(),
            },
            Some(vec!["SendMessageBatch".into()]),
        );
        let sdk = support::sdk_config().await;
        let mut via = Ctx::from_config(&sdk).unwrap();
        via.sqs = aws_sdk_sqs::Client::from_conf(sqs_config(&sdk).endpoint_url(proxy.url()).build());
        let opts = dlq::ReplayOptions {
            rate: Some(1.0),
            table: Some(stack.table.clone()),
            max_scan: 100_000,
            ..dlq::ReplayOptions::default()
        };
        let report = dlq::replay(&via, &stack.dlq_url, &opts).await.unwrap();
        let moved = job_ids(&drain(&stack.queue_url, 0).await);
        assert!(
            moved.is_empty(),
            "{with_bad_tail}: moved {moved:?}, overtaking g-1: {:?}",
            report.not_moved
        );
        assert!(
            report
                .not_moved
                .iter()
                .any(|n| n.job_id == "g-2" && n.reason.contains("overtake")),
            "{:?}",
            report.not_moved
        );
    }
}

/// On a FIFO DLQ, a message the filter does not select, held while the replay reads, hides
/// the later messages of its group: they are read once it is released, so a filtered replay
/// moves the whole group but that message.
#[tokio::test]
async fn a_filtered_fifo_replay_reads_past_a_message_it_does_not_select() {
    let stack = fifo_stack("rv-fifo-tail");
    let ids: Vec<String> = (1..=11).map(|i| format!("g-{i}")).collect();
    let mut items = vec![("g", "skip.job", "g-0", None)];
    for id in &ids {
        items.push(("g", "go.job", id.as_str(), None));
    }
    seed_fifo(&stack, &items).await;
    let o = run(Some(&stack), &["dlq", "replay", "--type", "go.job", "--json"]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{r}");
    assert_eq!(
        (r["selected"].as_u64(), r["moved"].as_u64()),
        (Some(11), Some(11)),
        "{r}"
    );
    assert_eq!(r["incomplete"], false, "{r}");
    let moved = job_ids(&drain(&stack.queue_url, 11).await);
    assert_eq!(moved, ids, "in the group's order");
    assert_eq!(job_ids(&drain(&stack.dlq_url, 1).await), ["g-0"]);
}

/// A job the replay moves that a worker dead-letters again while the replay runs comes back
/// to the DLQ with the same body: it is left there (`repeated`), not moved again, so a
/// replay of jobs that still fail does not loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_dead_lettered_again_during_its_replay_is_not_moved_again() {
    let stack = setup("rv-loop");
    let jobs: Vec<_> = (0..5)
        .map(|i| (FailureClass::Fatal, "poison", format!("lp-{i}")))
        .collect();
    seed_dlq(&stack, &jobs).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (q, d, s) = (stack.queue_url.clone(), stack.dlq_url.clone(), stop.clone());
    let worker = tokio::spawn(async move {
        let c = sqs().await;
        let mut redead = 0;
        while !s.load(Ordering::SeqCst) {
            let got = c
                .receive_message()
                .queue_url(&q)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            for m in got.messages.unwrap_or_default() {
                let b = m.body().unwrap().to_owned();
                let v: Value = serde_json::from_str(&b).unwrap();
                let id = v["id"].as_str().unwrap().to_owned();
                let rec = record(FailureClass::Fatal, "poison", &id, &q, "still poison");
                let copy = dlq_copy(&b, &HashMap::new(), &rec, 1 << 20).unwrap();
                c.send_message()
                    .queue_url(&d)
                    .message_body(copy.body)
                    .set_message_attributes(Some(copy.attributes))
                    .send()
                    .await
                    .unwrap();
                c.delete_message()
                    .queue_url(&q)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
                redead += 1;
            }
        }
        redead
    });
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let opts = dlq::ReplayOptions {
        rate: Some(2.0),
        table: Some(stack.table.clone()),
        max_scan: 30,
        ..dlq::ReplayOptions::default()
    };
    let report = dlq::replay(&ctx, &stack.dlq_url, &opts).await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let redead: usize = worker.await.unwrap();
    assert_eq!(report.moved, 5, "{report:?}");
    assert_eq!(report.selected, 5, "{report:?}");
    assert!(redead >= report.repeated, "{redead} {report:?}");
}

/// On a FIFO DLQ with many groups the filter does not select, the releases that let a
/// group's later messages be read do not make a complete read look cut short: exit 0.
#[tokio::test]
async fn a_filtered_fifo_replay_past_many_unselected_groups_is_complete() {
    let stack = fifo_stack("fifo-many");
    let mut owned: Vec<(String, &str, String)> = vec![("a".into(), "skip.job", "a-0".into())];
    owned.extend((1..=11).map(|i| ("a".to_owned(), "go.job", format!("a-{i}"))));
    owned.extend((0..70).map(|i| (format!("s{i}"), "skip.job", format!("s-{i}"))));
    let items: Vec<(&str, &str, &str, Option<&str>)> = owned
        .iter()
        .map(|(g, t, id)| (g.as_str(), *t, id.as_str(), None))
        .collect();
    seed_fifo(&stack, &items).await;
    let o = run(Some(&stack), &["dlq", "replay", "--type", "go.job", "--json"]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{r}");
    assert_eq!(
        (r["moved"].as_u64(), r["scanned"].as_u64()),
        (Some(11), Some(82)),
        "{r}"
    );
    assert_eq!(r["incomplete"], false, "{r}");
}

/// Distinct messages with identical bodies that were in the DLQ before the replay (jobs
/// without ids, dead-lettered once each) are all moved: none is taken for a copy
/// dead-lettered again during the run.
#[tokio::test]
async fn identical_bodies_already_in_the_dlq_are_all_moved() {
    let stack = fifo_stack("fifo-same");
    let client = sqs().await;
    let same = json!({"type": "rebuild", "payload": {}}).to_string();
    for (i, b) in [same.clone(), same.clone(), body("rebuild", "c")]
        .iter()
        .enumerate()
    {
        let rec = record(
            FailureClass::Fatal,
            "rebuild",
            &format!("m-{i}"),
            &stack.queue_url,
            "boom",
        );
        client
            .send_message()
            .queue_url(&stack.dlq_url)
            .message_body(b)
            .message_group_id("g")
            .message_deduplication_id(format!("d-{i}"))
            .message_attributes(
                FAILURE_ATTRIBUTE,
                string_attr(&serde_json::to_string(&rec).unwrap()),
            )
            .send()
            .await
            .unwrap();
    }
    let o = run(Some(&stack), &["dlq", "replay", "--json"]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{r}");
    assert_eq!(
        (r["moved"].as_u64(), r["repeated"].as_u64()),
        (Some(3), Some(0)),
        "{r}"
    );
    assert_eq!(drain(&stack.queue_url, 3).await.len(), 3);
}

/// The deduplication id the next message of `queue_url` was sent with; the message is deleted
/// (as a worker that processed it would).
async fn take_dedup_id(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> String {
    use aws_sdk_sqs::types::MessageSystemAttributeName;
    let got = sqs
        .receive_message()
        .queue_url(queue_url)
        .message_system_attribute_names(MessageSystemAttributeName::MessageDeduplicationId)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(got.len(), 1, "one message expected: {got:?}");
    let m = &got[0];
    sqs.delete_message()
        .queue_url(queue_url)
        .receipt_handle(m.receipt_handle().unwrap())
        .send()
        .await
        .unwrap();
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageDeduplicationId))
        .cloned()
        .expect("a FIFO message carries its deduplication id")
}

/// A FIFO job sent again by a later run is stored again. SQS drops a send whose deduplication
/// id was sent less than five minutes before, even when that message was processed and
/// deleted since, and answers it as a success; moto keeps no such window (it deduplicates only
/// against messages still queued), so the test holds the rule itself: two runs never send one
/// deduplication id. Within a run, a batch retried after its first try landed keeps its ids,
/// and is stored once.
#[tokio::test]
async fn a_fifo_job_sent_again_by_a_later_run_is_not_dropped_as_a_duplicate() {
    use support::fault_proxy::{Fault, FaultProxy};
    let r = support::fresh_resources("cli-dedup-runs", true).await;
    let stack = Stack {
        queue_url: r.queue_url.clone(),
        dlq_url: r.dlq_url.clone(),
        table: r.table.clone(),
    };
    let sqs = support::sqs_client().await;
    let line = json!({"type": "report.build", "id": "j1", "group": "g", "payload": {}}).to_string() + "\n";
    let args = ["send", "--file", "-", "--json"];
    let first = ok_json(&run_with_stdin(Some(&stack), &args, &line));
    assert_eq!(first["accepted"], 1, "{first}");
    let d1 = take_dedup_id(&sqs, &stack.queue_url).await;
    // The job ran and was deleted; the producer sends it again a moment later.
    let again = ok_json(&run_with_stdin(Some(&stack), &args, &line));
    assert_eq!(again["accepted"], 1, "{again}");
    let d2 = take_dedup_id(&sqs, &stack.queue_url).await;
    assert_ne!(
        d1, d2,
        "the second run reused the first run's deduplication id: SQS would drop its job and the report says sent"
    );

    // The first try of the batch lands but its answer is lost: the retry carries the same ids.
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_next(1, Fault::LostAnswer, Some(vec!["SendMessageBatch".into()]));
    let mut cmd = triage_cmd(Some(&stack), &args);
    cmd.env("AWS_ENDPOINT_URL_SQS", proxy.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
    let retried = ok_json(&child.wait_with_output().unwrap());
    assert_eq!(retried["accepted"], 1, "{retried}");
    assert_eq!(proxy.count("SendMessageBatch"), 2, "the batch was retried");
    let d3 = take_dedup_id(&sqs, &stack.queue_url).await;
    assert!(d3 != d1 && d3 != d2, "{d1} {d2} {d3}");
    assert_eq!(
        support::queue_depth(&sqs, &stack.queue_url).await.total(),
        0,
        "the retry was stored as a second copy"
    );
}
