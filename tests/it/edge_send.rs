//! `triage send` at its edges, the real binary against the local stack: a batch call that fails
//! as a call (the report says which lines went and which did not, exit 5, and `--unsent FILE`
//! holds exactly the lines to send again), and FIFO queues (per-group order, a group stopped
//! behind a failed batch, deduplicated lines reported as such, group and deduplication ids
//! checked before anything is sent).
//!
//! Needs the local stack: `bash infra/local/stack.sh start` and
//! `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};

const BIN: &str = env!("CARGO_BIN_EXE_triage");

fn triage(queue_url: &str, endpoint: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(args)
        .env("TRIAGE_QUEUE_URL", queue_url)
        .env_remove("TRIAGE_DLQ_URL")
        .env_remove("TRIAGE_TABLE")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    if let Some(e) = endpoint {
        cmd.env("AWS_ENDPOINT_URL_SQS", e);
    }
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run triage")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {} / stderr: {}",
            String::from_utf8_lossy(&o.stdout),
            stderr(o)
        )
    })
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(support::unique_name(name))
}

fn write_file(name: &str, text: &str) -> PathBuf {
    let p = temp_path(name);
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap();
    p
}

async fn sqs() -> aws_sdk_sqs::Client {
    support::sqs_client().await
}

/// Every message of the queue (received and deleted, in order: [`support::drain`]), as JSON.
async fn drain(queue_url: &str) -> Vec<Value> {
    support::drain(&sqs().await, queue_url, 0)
        .await
        .iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect()
}

fn lines_of(v: &Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no `{key}` in {v}"))
        .iter()
        .map(|e| e["line"].as_u64().unwrap())
        .collect()
}

fn ids_of(bodies: &[Value]) -> Vec<String> {
    bodies
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Item 4: one batch call fails as a call (HTTP 500 on every try) while the other batches go
/// through. The report lists the sent lines and the lines not sent, exit 5, and `--unsent`
/// holds the unsent lines byte for byte; sending that file again completes the job set with
/// no duplicate.
#[tokio::test]
async fn a_failed_batch_call_is_reported_per_line_and_its_lines_can_be_sent_again() {
    let stack = support::fresh_resources("edge-send-call", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SendMessageBatch".into()]),
        body_contains: Some("poison-15".into()),
        fault: Fault::Status500,
        times: None,
    });
    // Lines as a user writes them: some with CRLF, odd spacing, blank lines between.
    let mut input = String::new();
    let mut raw = Vec::new();
    for i in 1..=30 {
        let line = if i % 4 == 0 {
            format!(
                "{{ \"type\": \"bulk\",  \"id\": \"b-{i}\", \"payload\": {{\"tag\": \"poison-{i}\"}} }}\r\n"
            )
        } else {
            format!(
                "{}\n",
                json!({"type": "bulk", "id": format!("b-{i}"), "payload": {"tag": format!("poison-{i}")}})
            )
        };
        raw.push(line.clone());
        input.push_str(&line);
        if i == 12 {
            input.push_str("\n   \n");
        }
    }
    let file = write_file("edge-send-in", &input);
    let unsent = temp_path("edge-send-unsent");
    let o = run(triage(
        &stack.queue_url,
        Some(&proxy.url()),
        &[
            "send",
            "--file",
            file.to_str().unwrap(),
            "--unsent",
            unsent.to_str().unwrap(),
            "--json",
        ],
    ));
    assert_eq!(o.status.code(), Some(5), "exit code; stderr: {}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["requested"], 30, "{r}");
    assert_eq!(r["accepted"], 20, "{r}");
    // Lines 13 and 14 are the input's lines 15 and 16 (two blank lines after line 12).
    let not_sent: Vec<u64> = lines_of(&r, "rejected");
    let expected: Vec<u64> = (11..=20).map(|i| if i > 12 { i + 2 } else { i }).collect();
    assert_eq!(not_sent, expected, "{r}");
    for e in r["rejected"].as_array().unwrap() {
        assert_eq!(
            e["status"], "unconfirmed",
            "a 500 may or may not have stored the batch: {e}"
        );
    }
    assert_eq!(r["not_sent"], 10, "{r}");
    let sent: HashSet<u64> = lines_of(&r, "sent").into_iter().collect();
    assert_eq!(sent.len(), 20);
    assert!(sent.is_disjoint(&expected.iter().copied().collect()));
    let err = stderr(&o);
    assert!(err.contains("10 of 30"), "{err}");

    let text = std::fs::read_to_string(&unsent).expect("the unsent file is written");
    assert_eq!(
        text,
        raw[10..20].concat(),
        "the unsent lines, byte for byte, in order"
    );

    // Sending the unsent lines again (faults gone) completes the set, with no duplicate.
    let again = temp_path("edge-send-unsent2");
    let o = run(triage(
        &stack.queue_url,
        None,
        &[
            "send",
            "--file",
            unsent.to_str().unwrap(),
            "--unsent",
            again.to_str().unwrap(),
            "--json",
        ],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(report(&o)["accepted"], 10);
    assert_eq!(
        std::fs::read_to_string(&again).unwrap(),
        "",
        "nothing left to send"
    );
    let ids = ids_of(&drain(&stack.queue_url).await);
    assert_eq!(ids.len(), 30, "{ids:?}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 30, "{ids:?}");
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(unsent);
    let _ = std::fs::remove_file(again);
}

/// Item 4: a call refused after the throttling retries is a refusal (SQS stored nothing):
/// those lines are `rejected`, the human report names them as a range, and they are in the
/// unsent file.
#[tokio::test]
async fn a_throttled_batch_is_reported_rejected_with_its_line_range() {
    let stack = support::fresh_resources("edge-send-thr", false).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SendMessageBatch".into()]),
        body_contains: Some("t-3\\\"".into()),
        fault: Fault::Throttle,
        times: None,
    });
    let raw: Vec<String> = (1..=12)
        .map(|i| format!("{}\n", json!({"type": "t", "id": format!("t-{i}")})))
        .collect();
    let file = write_file("edge-send-thr-in", &raw.concat());
    let unsent = temp_path("edge-send-thr-unsent");
    let o = run(triage(
        &stack.queue_url,
        Some(&proxy.url()),
        &[
            "send",
            "-f",
            file.to_str().unwrap(),
            "--unsent",
            unsent.to_str().unwrap(),
            "--no-progress",
        ],
    ));
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("sent 2 of 12"), "{out}");
    assert!(out.contains("lines 1-10"), "{out}");
    assert!(out.contains("rejected"), "{out}");
    let err = stderr(&o);
    assert!(
        err.contains("10 of 12 job(s) were not sent (lines 1-10)"),
        "{err}"
    );
    assert!(
        err.contains(unsent.to_str().unwrap()),
        "the error names the unsent file: {err}"
    );
    assert_eq!(std::fs::read_to_string(&unsent).unwrap(), raw[..10].concat());
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(unsent);
}

fn fifo_line(group: &str, id: &str) -> String {
    format!("{}\n", json!({"type": "f", "id": id, "group": group}))
}

/// Item 5: a FIFO group's lines reach the queue in file order, even when the first batch is
/// slow to arrive (the proxy holds it back): batches to a FIFO queue go one after another.
#[tokio::test]
async fn fifo_lines_of_a_group_arrive_in_file_order() {
    let stack = support::fresh_resources("edge-send-order", true).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SendMessageBatch".into()]),
        body_contains: Some("o-00\\\"".into()),
        fault: Fault::Delay(Duration::from_millis(1500)),
        times: Some(1),
    });
    let ids: Vec<String> = (0..40).map(|i| format!("o-{i:02}")).collect();
    let text: String = ids.iter().map(|id| fifo_line("g", id)).collect();
    let file = write_file("edge-send-order-in", &text);
    let o = run(triage(
        &stack.queue_url,
        Some(&proxy.url()),
        &["send", "-f", file.to_str().unwrap(), "--json"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(report(&o)["accepted"], 40);
    assert_eq!(proxy.faults().get("Delay"), Some(&1));
    assert_eq!(ids_of(&drain(&stack.queue_url).await), ids);
    let _ = std::fs::remove_file(file);
}

/// Item 5: when a batch of group `a` fails, the later lines of group `a` are not sent (they
/// would overtake the failed ones) and are reported `skipped`; group `b` goes on.
#[tokio::test]
async fn a_failed_fifo_batch_stops_the_rest_of_its_group() {
    let stack = support::fresh_resources("edge-send-stop", true).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["SendMessageBatch".into()]),
        body_contains: Some("a-05\\\"".into()),
        fault: Fault::Status500,
        times: None,
    });
    let mut raw = Vec::new();
    for i in 1..=10 {
        raw.push(fifo_line("a", &format!("a-{i:02}")));
    }
    for i in 1..=10 {
        raw.push(fifo_line("b", &format!("b-{i:02}")));
    }
    for i in 11..=15 {
        raw.push(fifo_line("a", &format!("a-{i:02}")));
    }
    for i in 11..=15 {
        raw.push(fifo_line("b", &format!("b-{i:02}")));
    }
    let file = write_file("edge-send-stop-in", &raw.concat());
    let unsent = temp_path("edge-send-stop-unsent");
    let o = run(triage(
        &stack.queue_url,
        Some(&proxy.url()),
        &[
            "send",
            "-f",
            file.to_str().unwrap(),
            "--unsent",
            unsent.to_str().unwrap(),
            "--json",
        ],
    ));
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["accepted"], 15, "{r}");
    let status = |line: u64| -> String {
        r["rejected"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["line"] == line)
            .map(|e| e["status"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| "sent".into())
    };
    for line in 1..=10 {
        assert_eq!(status(line), "unconfirmed", "line {line}: {r}");
    }
    for line in 21..=25 {
        assert_eq!(status(line), "skipped", "line {line}: {r}");
    }
    assert_eq!(
        lines_of(&r, "sent"),
        (11..=20).chain(26..=30).collect::<Vec<u64>>()
    );
    let got = ids_of(&drain(&stack.queue_url).await);
    let expected: Vec<String> = (1..=15).map(|i| format!("b-{i:02}")).collect();
    assert_eq!(got, expected, "only group b is on the queue, in order");
    let mut want = raw[..10].concat();
    want.push_str(&raw[20..25].concat());
    assert_eq!(std::fs::read_to_string(&unsent).unwrap(), want);
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(unsent);
}

/// Item 5: two lines with one job id are one deduplication id: SQS keeps the first and answers
/// the second as a success. The report says `deduplicated` (and which line it duplicates)
/// instead of counting it as sent.
///
/// moto deduplicates but answers a deduplicated send with a new message id (AWS answers with
/// the first message's id), so this shows the detection by deduplication id; detection by a
/// repeated message id is covered by the unit tests.
#[tokio::test]
async fn fifo_lines_sqs_deduplicates_are_reported_as_such() {
    let stack = support::fresh_resources("edge-send-dedup", true).await;
    let raw = [
        fifo_line("g", "j1"),
        fifo_line("g", "j2"),
        fifo_line("g", "j1"),
        fifo_line("g", "j3"),
    ];
    let file = write_file("edge-send-dedup-in", &raw.concat());
    let o = run(triage(
        &stack.queue_url,
        None,
        &["send", "-f", file.to_str().unwrap(), "--json"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["accepted"], 3, "{r}");
    assert_eq!(r["deduplicated"], 1, "{r}");
    assert_eq!(lines_of(&r, "duplicates"), vec![3]);
    assert_eq!(r["duplicates"][0]["duplicate_of"], 1, "{r}");
    assert_eq!(lines_of(&r, "sent"), vec![1, 2, 4]);
    assert_eq!(drain(&stack.queue_url).await.len(), 3);
    let _ = std::fs::remove_file(file);
}

/// Item 5: group and deduplication ids outside SQS's rules (1-128 characters of letters,
/// digits and ASCII punctuation) refuse the whole file before anything is sent, naming every
/// bad line. moto accepts such ids, so without the check they would be sent here (and refused
/// by AWS, line by line, after the good lines went).
#[tokio::test]
async fn fifo_ids_outside_sqs_rules_refuse_the_file_first() {
    let stack = support::fresh_resources("edge-send-ids", true).await;
    let long = "x".repeat(129);
    let raw = [
        fifo_line("g", "ok-1"),
        fifo_line("a b", "ok-2"),
        fifo_line("g", "ok-3"),
        fifo_line("g", &long),
        fifo_line("gé", "ok-5"),
        fifo_line("g", "tab\tid"),
    ];
    let file = write_file("edge-send-ids-in", &raw.concat());
    let o = run(triage(
        &stack.queue_url,
        None,
        &["send", "-f", file.to_str().unwrap()],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for n in ["line 2", "line 4", "line 5", "line 6"] {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
    assert!(!err.contains("line 1:") && !err.contains("line 3:"), "{err}");
    assert!(drain(&stack.queue_url).await.is_empty(), "nothing was sent");

    // One job from flags is checked the same way.
    let o = run(triage(
        &stack.queue_url,
        None,
        &["send", "--type", "t", "--group", "a b", "--id", "x"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("group"), "{}", stderr(&o));
    assert!(drain(&stack.queue_url).await.is_empty(), "nothing was sent");
    let _ = std::fs::remove_file(file);
}

/// Item 4: when nothing can be sent (here the queue does not exist, exit 3), `--unsent` holds
/// every line, so the file to send again is always the one `--unsent` names; a refused input
/// (exit 2) leaves it alone.
#[tokio::test]
async fn nothing_sent_leaves_every_line_in_the_unsent_file() {
    let stack = support::fresh_resources("edge-send-none", false).await;
    let missing = format!("{}-gone", stack.queue_url);
    let raw = [
        format!("{}\n", json!({"type": "t", "id": "n-1"})),
        format!("{}\r\n", json!({"type": "t", "id": "n-2"})),
    ];
    let file = write_file("edge-send-none-in", &raw.concat());
    let unsent = temp_path("edge-send-none-unsent");
    let o = run(triage(
        &missing,
        None,
        &[
            "send",
            "-f",
            file.to_str().unwrap(),
            "--unsent",
            unsent.to_str().unwrap(),
        ],
    ));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&unsent).unwrap(), raw.concat());

    std::fs::write(&unsent, "untouched").unwrap();
    let bad = write_file("edge-send-none-bad", "{\"type\": \"t\"}\n{bad\n");
    let o = run(triage(
        &stack.queue_url,
        None,
        &[
            "send",
            "-f",
            bad.to_str().unwrap(),
            "--unsent",
            unsent.to_str().unwrap(),
        ],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&unsent).unwrap(), "untouched");
    assert!(drain(&stack.queue_url).await.is_empty());
    for p in [file, unsent, bad] {
        let _ = std::fs::remove_file(p);
    }
}

/// The unsent file holds payloads: it keeps the permissions of the file it replaces (here the
/// input itself, readable by its owner only), and a new one is readable by its owner only.
#[test]
fn the_unsent_file_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("unsent-perm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let existing = dir.join("jobs.ndjson");
    std::fs::write(&existing, "{}\n").unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o600)).unwrap();
    triage::ops::send::write_unsent(&existing, "{\"type\":\"t\"}\n").unwrap();
    let mode = std::fs::metadata(&existing).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let fresh = dir.join("fresh.ndjson");
    triage::ops::send::write_unsent(&fresh, "x\n").unwrap();
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    std::fs::remove_dir_all(&dir).unwrap();
}
