//! `triage dlq edit` and fair queues on the local stack.
//!
//! Edits go through the `triage` binary (with `--body`, `--patch`, and a real editor process:
//! a shell script named by `$EDITOR` that rewrites the file), except the test of the hold
//! renewed while the editor is open, which calls the library with a short hold.
//!
//! Fair queues: a producer on a standard queue may set `MessageGroupId` (its tenant). moto
//! 5.2.5 accepts it on a standard queue and returns it on receive (checked by experiment), so
//! these tests run end to end without injected answers.

use crate::support;
use crate::support::pipeline::{Harness, RECORDED, fast_policy, quiet_breaker};

use crate::support::fault_proxy::{Fault, FaultProxy, FaultRule};

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use serde_json::{Value, json};
use sqs_triage::core::failure::{FAILURE_ATTRIBUTE, FailureClass, FailureRecord};
use sqs_triage::effects::dlq::dlq_copy;
use sqs_triage::effects::storage_retry::sqs_config;
use sqs_triage::effects::table::ledger_key;
use triage::ops::setup::SetupReport;
use triage::ops::{Ctx, dlq};

fn group_of(m: &Message) -> Option<&str> {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .map(String::as_str)
}

#[tokio::test]
async fn a_fair_queue_group_id_is_kept_on_the_dlq_copy_and_restored_by_replay() {
    let h = Harness::new("fairq", false, fast_policy(3), quiet_breaker()).await;
    let body = json!({"type": RECORDED, "id": "fair-1", "payload": {"outcome": "fatal"}}).to_string();
    h.sqs
        .send_message()
        .queue_url(&h.queue_url)
        .message_body(&body)
        .message_group_id("tenant-7")
        .send()
        .await
        .unwrap();
    let (received, response) = h.invoke_once(Duration::from_secs(2)).await.expect("a batch");
    assert_eq!(
        group_of(&received[0]),
        Some("tenant-7"),
        "the source queue keeps it"
    );
    assert!(
        response.batch_item_failures.is_empty(),
        "dead-lettered, not retried"
    );

    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].body(), Some(body.as_str()));
    assert_eq!(
        group_of(&dlq[0]),
        Some("tenant-7"),
        "the DLQ copy keeps the group"
    );

    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let opts = dlq::ReplayOptions {
        table: Some(h.table.clone()),
        max_scan: 100,
        ..dlq::ReplayOptions::default()
    };
    let report = dlq::replay(&ctx, &h.dlq_url, &opts).await.unwrap();
    assert_eq!(report.moved, 1, "{report:?}");
    let back = h.receive(&h.queue_url, Duration::from_secs(2)).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].body(), Some(body.as_str()));
    assert_eq!(group_of(&back[0]), Some("tenant-7"), "replay restores the group");
}

/// Through `triage worker`: its ReceiveMessage asks for the system attributes, so the group
/// reaches the DLQ copy.
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_keeps_a_fair_queue_group_id_on_the_dlq_copy() {
    let stack = support::fresh_resources("fairw", false).await;
    let sqs = support::sqs_client().await;
    let body = json!({"type": "triage.chaos", "id": "fair-w1", "payload": {"outcome": "fatal"}}).to_string();
    sqs.send_message()
        .queue_url(&stack.queue_url)
        .message_body(&body)
        .message_group_id("tenant-9")
        .send()
        .await
        .unwrap();
    let mut child = support::strict_env(&mut Command::new(env!("CARGO_BIN_EXE_triage")))
        .args(["worker", "--demo-handlers"])
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env("RUST_LOG", "sqs_triage=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("triage worker starts");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || stderr.lines().map_while(Result::ok).collect::<Vec<_>>());
    let deadline = Instant::now() + Duration::from_secs(60);
    let copy = loop {
        let got = support::read_all(&sqs, &stack.dlq_url, 30, 1).await;
        if let Some(m) = got.into_iter().next() {
            break Some(m);
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            break None;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let log = reader.join().unwrap();
    let copy = copy.unwrap_or_else(|| panic!("nothing dead-lettered; worker said:\n{}", log.join("\n")));
    assert_eq!(copy.body(), Some(body.as_str()));
    assert_eq!(group_of(&copy), Some("tenant-9"), "the DLQ copy keeps the group");
}

// ---------------------------------------------------------------- dlq edit

const BIN: &str = env!("CARGO_BIN_EXE_triage");

/// `triage` against `stack`, through `sqs_endpoint`, with `env` set (and `EDITOR` / `VISUAL`
/// unset unless `env` sets them), `stdin` as its input.
fn triage(
    stack: &SetupReport,
    sqs_endpoint: &str,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &str,
) -> Output {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(args)
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env("AWS_ENDPOINT_URL_SQS", sqs_endpoint)
        .env("AWS_ENDPOINT_URL_STS", support::sts_endpoint())
        .env_remove("EDITOR")
        .env_remove("VISUAL")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run triage");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().expect("wait triage")
}

fn edit(stack: &SetupReport, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec!["dlq", "edit"];
    all.extend_from_slice(args);
    triage(stack, &support::sqs_endpoint(), &all, env, "")
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

/// Asserts a refused or aborted edit: exit `code`, one `error:` line naming `needle`.
fn assert_refused(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "`{needle}` not in: {err}"
    );
}

fn string_attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

fn job_body(id: &str, n: u64) -> String {
    json!({"type": "report.build", "id": id, "payload": {"n": n}}).to_string()
}

/// Puts the DLQ copy the processor makes of `body` (failed fatally in `stack`'s source queue,
/// with the original attributes `attributes`) into the DLQ, with `group` as its
/// `MessageGroupId` (required on a FIFO DLQ). Returns its DLQ message id.
async fn seed(
    stack: &SetupReport,
    job_id: &str,
    body: &str,
    attributes: &[(&str, &str)],
    group: Option<&str>,
) -> String {
    let record = FailureRecord {
        class: FailureClass::Fatal,
        error: "report.build broke: bad n".into(),
        attempts: 1,
        job_type: Some("report.build".into()),
        job_id: job_id.into(),
        source_queue: stack.queue_url.clone(),
        original_message_id: format!("orig-{job_id}"),
        first_received_at: 1,
        failed_at: sqs_triage::clock::now_ms(),
    };
    let original: HashMap<String, MessageAttributeValue> = attributes
        .iter()
        .map(|(k, v)| (k.to_string(), string_attr(v)))
        .collect();
    let copy = dlq_copy(body, &original, &record, 1 << 20).unwrap();
    let mut req = support::sqs_client()
        .await
        .send_message()
        .queue_url(&stack.dlq_url)
        .message_body(copy.body)
        .set_message_attributes(Some(copy.attributes))
        .set_message_group_id(group.map(str::to_owned));
    if stack.fifo {
        req = req.message_deduplication_id(format!("seed-{job_id}"));
    }
    req.send().await.unwrap().message_id.unwrap()
}

async fn put_ledger(stack: &SetupReport, job_type: &str, job_id: &str) {
    support::ddb_client()
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

async fn has_ledger(stack: &SetupReport, job_type: &str, job_id: &str) -> bool {
    support::ddb_client()
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

/// The DLQ holds exactly its one message, visible to any reader, and nothing was sent.
async fn untouched(stack: &SetupReport) {
    let sqs = support::sqs_client().await;
    let dlq = support::queue_depth(&sqs, &stack.dlq_url).await;
    assert_eq!(
        (dlq.visible, dlq.in_flight),
        (1, 0),
        "the message is back and visible: {dlq:?}"
    );
    let source = support::queue_depth(&sqs, &stack.queue_url).await;
    assert_eq!(source.total(), 0, "nothing was sent: {source:?}");
}

/// A temporary directory of this test, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(support::unique_name(prefix));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// An executable shell script `name` with `body` (after the `#!/bin/sh` line).
    fn script(&self, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn group_and_dedup(m: &Message) -> (Option<&str>, Option<&str>) {
    let a = m.attributes();
    let get = |k: MessageSystemAttributeName| a.and_then(|a| a.get(&k)).map(String::as_str);
    (
        get(MessageSystemAttributeName::MessageGroupId),
        get(MessageSystemAttributeName::MessageDeduplicationId),
    )
}

#[tokio::test]
async fn edit_with_a_body_file_replays_the_edited_copy_and_then_deletes_the_original() {
    let stack = support::fresh_resources("edit-body", false).await;
    let sqs = support::sqs_client().await;
    let dlq_id = seed(
        &stack,
        "e-1",
        &job_body("e-1", 1),
        &[("tenant", "acme")],
        Some("tenant-3"),
    )
    .await;
    put_ledger(&stack, "report.build", "e-1").await;
    let dir = TempDir::new("edit-body");
    let file = dir.path("body.json");
    // An editor or `echo` adds a final newline the original body lacked: it is dropped.
    std::fs::write(&file, format!("{}\n", job_body("e-1", 2))).unwrap();

    let report = ok_json(&edit(
        &stack,
        &["e-1", "--body", file.to_str().unwrap(), "--json"],
        &[],
    ));
    assert_eq!(report["how"], "body", "{report}");
    assert_eq!(report["original_message_id"], dlq_id.as_str(), "{report}");
    assert_eq!(report["target"], stack.queue_url.as_str(), "{report}");
    assert_eq!(report["job_type"], "report.build", "{report}");
    assert_eq!(report["job_id"], "e-1", "{report}");
    assert_eq!(report["changed"], true, "{report}");
    assert_eq!(report["original_deleted"], true, "{report}");
    assert_eq!(report["ledger_reset"], true, "{report}");
    assert_eq!(report["group_id"], "tenant-3", "{report}");
    // The original's failure record travels in the report, for the audit trail.
    assert_eq!(report["record"]["class"], "fatal", "{report}");
    assert_eq!(report["record"]["error"], "report.build broke: bad n", "{report}");
    let new_id = report["new_message_id"].as_str().unwrap();

    let back = support::read_all(&sqs, &stack.queue_url, 60, 1).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].message_id(), Some(new_id));
    assert_eq!(back[0].body(), Some(job_body("e-1", 2).as_str()));
    let attrs = back[0].message_attributes().unwrap();
    assert_eq!(
        attrs["tenant"].string_value(),
        Some("acme"),
        "original attributes kept"
    );
    assert!(
        !attrs.contains_key(FAILURE_ATTRIBUTE),
        "no failure record on the replayed copy"
    );
    assert_eq!(
        group_and_dedup(&back[0]).0,
        Some("tenant-3"),
        "the fair queue's tenant is restored"
    );
    assert_eq!(
        support::queue_depth(&sqs, &stack.dlq_url).await.total(),
        0,
        "original deleted"
    );
    assert!(
        !has_ledger(&stack, "report.build", "e-1").await,
        "fresh attempt ledger"
    );

    // The edit is audited, with the original's failure record.
    assert_eq!(report["audit"]["written"], true, "{report}");
    let trail = ok_json(&triage(
        &stack,
        &support::sqs_endpoint(),
        &["audit", "--json"],
        &[],
        "",
    ));
    let entries = trail["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{trail}");
    let e = &entries[0];
    assert_eq!(e["action"], "dlq.edit", "{e}");
    assert_eq!(e["target"], stack.dlq_url.as_str(), "{e}");
    assert_eq!(e["count"], 1, "{e}");
    assert_eq!(e["filter"]["id"], "e-1", "{e}");
    assert_eq!(e["detail"]["new_message_id"], new_id, "{e}");
    assert_eq!(e["detail"]["original_record"]["class"], "fatal", "{e}");
    assert_eq!(
        e["detail"]["original_record"]["error"], "report.build broke: bad n",
        "{e}"
    );
    assert!(e["actor"].as_str().unwrap().starts_with("arn:"), "{e}");
}

#[tokio::test]
async fn edit_with_a_json_patch_or_from_stdin() {
    let stack = support::fresh_resources("edit-patch", false).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "p-1", &job_body("p-1", 1), &[], None).await;
    let o = edit(
        &stack,
        &[
            "p-1",
            "--patch",
            r#"[{"op": "test", "path": "/payload/n", "value": 1}, {"op": "replace", "path": "/payload/n", "value": 7}, {"op": "add", "path": "/payload/fixed", "value": true}]"#,
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        text.contains("new message id") && text.contains("deleted from the DLQ"),
        "{text}"
    );
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back.len(), 1);
    let body: Value = serde_json::from_str(back[0].body().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"type": "report.build", "id": "p-1", "payload": {"n": 7, "fixed": true}})
    );
    assert!(text.contains(back[0].message_id().unwrap()), "{text}");

    // `--body -`: the new body on stdin. A raw body named by the `job-type` attribute stays a job.
    seed(
        &stack,
        "raw-1",
        "plain text",
        &[("job-type", "report.build"), ("job-id", "raw-1")],
        None,
    )
    .await;
    let o = triage(
        &stack,
        &support::sqs_endpoint(),
        &["dlq", "edit", "raw-1", "--body", "-", "--json"],
        &[],
        "other text",
    );
    let report = ok_json(&o);
    assert_eq!(report["job_type"], "report.build", "{report}");
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some("other text"));
    assert_eq!(
        back[0].message_attributes().unwrap()["job-type"].string_value(),
        Some("report.build")
    );
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
}

#[tokio::test]
async fn edit_in_the_editor_named_by_editor_or_visual() {
    let stack = support::fresh_resources("edit-editor", false).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "ed-1", &job_body("ed-1", 1), &[], None).await;
    let dir = TempDir::new("edit-editor");
    let seen = dir.path("seen");
    // A real editor process: it keeps what it was given and rewrites the file in place.
    let editor = dir.script(
        "editor",
        &format!(
            "cp \"$1\" '{}'\nsed -i 's/\"n\":1/\"n\":42/' \"$1\"",
            seen.display()
        ),
    );
    let report = ok_json(&edit(&stack, &["ed-1", "--json"], &[("EDITOR", &editor)]));
    assert_eq!(report["how"], "editor", "{report}");
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        job_body("ed-1", 1),
        "the editor got the body"
    );
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(job_body("ed-1", 42).as_str()));
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);

    // $VISUAL when $EDITOR is not set; an editor command with flags works.
    seed(&stack, "ed-2", &job_body("ed-2", 1), &[], None).await;
    let visual = dir.script(
        "visual",
        "[ \"$1\" = --flag ] || exit 9\nsed -i 's/\"n\":1/\"n\":5/' \"$2\"",
    );
    let report = ok_json(&edit(
        &stack,
        &["ed-2", "--json"],
        &[("VISUAL", &format!("{visual} --flag"))],
    ));
    assert_eq!(report["how"], "editor", "{report}");
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(job_body("ed-2", 5).as_str()));
}

#[tokio::test]
async fn aborted_or_refused_edits_send_nothing_and_leave_the_message_visible() {
    let stack = support::fresh_resources("edit-abort", false).await;
    let dlq_id = seed(&stack, "ab-1", &job_body("ab-1", 1), &[], None).await;
    let dir = TempDir::new("edit-abort");

    // No editor at all: refused before anything is read.
    assert_refused(&edit(&stack, &["ab-1"], &[]), 2, "no editor: set $EDITOR");
    untouched(&stack).await;

    // The editor exits non-zero (vim's :cq): aborted.
    let quit = dir.script("quit", "echo '{\"garbage' > \"$1\"\nexit 1");
    assert_refused(
        &edit(&stack, &["ab-1"], &[("EDITOR", &quit)]),
        2,
        "exited with 1: edit aborted",
    );
    untouched(&stack).await;

    // The editor empties the file.
    let empty = dir.script("empty", ": > \"$1\"");
    assert_refused(&edit(&stack, &["ab-1"], &[("EDITOR", &empty)]), 2, "empty");
    untouched(&stack).await;

    // `--to` the DLQ itself: refused before the message is read (the copy would go back
    // into the DLQ without its failure record).
    let body = dir.script("to-dlq", "echo '{\"type\": \"t\", \"id\": \"ab-1\"}' > \"$1\"");
    assert_refused(
        &edit(&stack, &["ab-1", "--to", &stack.dlq_url], &[("EDITOR", &body)]),
        2,
        "--to names the DLQ being edited",
    );
    untouched(&stack).await;

    // The editor changes nothing: refused without --force.
    let same = dir.script("same", "true");
    assert_refused(&edit(&stack, &["ab-1"], &[("EDITOR", &same)]), 2, "unchanged");
    untouched(&stack).await;

    // A body with no job type (no envelope, and the message has no `job-type` attribute):
    // refused, and the edit is kept for the operator.
    let typeless = dir.script("typeless", "echo '{\"payload\": {\"n\": 3}}' > \"$1\"");
    let o = edit(&stack, &["ab-1"], &[("EDITOR", &typeless)]);
    assert_refused(&o, 2, "not a job");
    untouched(&stack).await;
    let err = stderr(&o);
    let kept = err
        .split("your edit is kept in ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no kept file named: {err}"));
    assert!(
        std::fs::read_to_string(kept).unwrap().contains("\"n\": 3"),
        "{err}"
    );
    let _ = std::fs::remove_file(kept);

    // The same with --body and --patch; and a patch on a body that is not JSON.
    let typeless_file = dir.path("typeless.json");
    std::fs::write(&typeless_file, "[1, 2]").unwrap();
    assert_refused(
        &edit(&stack, &["ab-1", "--body", typeless_file.to_str().unwrap()], &[]),
        2,
        "not a job",
    );
    untouched(&stack).await;
    assert_refused(
        &edit(
            &stack,
            &["ab-1", "--patch", r#"[{"op": "remove", "path": "/type"}]"#],
            &[],
        ),
        2,
        "not a job",
    );
    untouched(&stack).await;
    assert_refused(
        &edit(
            &stack,
            &[
                "ab-1",
                "--patch",
                r#"[{"op": "test", "path": "/payload/n", "value": 9}]"#,
            ],
            &[],
        ),
        2,
        "does not apply",
    );
    untouched(&stack).await;
    assert_refused(
        &edit(&stack, &["ab-1", "--patch", "{not a patch"], &[]),
        2,
        "not an RFC 6902",
    );
    untouched(&stack).await;

    // Over SQS's size limit.
    let huge = dir.path("huge.json");
    let big = json!({"type": "report.build", "id": "ab-1", "payload": "x".repeat(1_048_576)});
    std::fs::write(&huge, big.to_string()).unwrap();
    assert_refused(
        &edit(&stack, &["ab-1", "--body", huge.to_str().unwrap()], &[]),
        2,
        "over the 1048576-byte limit",
    );
    untouched(&stack).await;

    // Not found: exit 3, nothing held.
    assert_refused(
        &edit(&stack, &["no-such-job", "--patch", "[]"], &[]),
        3,
        "no DLQ message",
    );
    untouched(&stack).await;

    // Held by another reader (a second operator's edit): exit 3, and the line says it may be
    // that.
    let sqs = support::sqs_client().await;
    let other = sqs
        .receive_message()
        .queue_url(&stack.dlq_url)
        .wait_time_seconds(1)
        .visibility_timeout(60)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(other.len(), 1);
    assert_refused(
        &edit(&stack, &["ab-1", "--patch", "[]"], &[]),
        3,
        "or another reader holds it right now",
    );
    sqs.change_message_visibility()
        .queue_url(&stack.dlq_url)
        .receipt_handle(other[0].receipt_handle().unwrap())
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    untouched(&stack).await;

    // Unchanged with --force: replayed as it is (by its DLQ message id).
    let report = ok_json(&edit(
        &stack,
        &[&dlq_id, "--force", "--json"],
        &[("EDITOR", &same)],
    ));
    assert_eq!(report["changed"], false, "{report}");
    let sqs = support::sqs_client().await;
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(job_body("ab-1", 1).as_str()));
}

#[tokio::test]
async fn a_patch_on_a_raw_body_and_an_ambiguous_id_are_refused() {
    let stack = support::fresh_resources("edit-raw", false).await;
    seed(
        &stack,
        "raw-2",
        "plain text",
        &[("job-type", "report.build")],
        None,
    )
    .await;
    assert_refused(
        &edit(
            &stack,
            &["raw-2", "--patch", r#"[{"op": "add", "path": "/a", "value": 1}]"#],
            &[],
        ),
        2,
        "the body is not JSON",
    );
    untouched(&stack).await;

    // Two DLQ messages of one job id: the id must name one.
    let other = support::fresh_resources("edit-amb", false).await;
    let a = seed(&other, "amb-1", &job_body("amb-1", 1), &[], None).await;
    let b = seed(&other, "amb-1", &job_body("amb-1", 2), &[], None).await;
    let o = edit(&other, &["amb-1", "--patch", "[]", "--force"], &[]);
    assert_refused(&o, 2, "names 2 DLQ messages");
    assert!(
        stderr(&o).contains(&a) && stderr(&o).contains(&b),
        "{}",
        stderr(&o)
    );
    let sqs = support::sqs_client().await;
    let d = support::queue_depth(&sqs, &other.dlq_url).await;
    assert_eq!((d.visible, d.in_flight), (2, 0), "{d:?}");
}

#[tokio::test]
async fn a_failed_delete_after_the_send_reports_both_copies() {
    let stack = support::fresh_resources("edit-del", false).await;
    let sqs = support::sqs_client().await;
    let dlq_id = seed(&stack, "d-1", &job_body("d-1", 1), &[], None).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("DeleteMessageBatch", Fault::Status500);
    let o = triage(
        &stack,
        &proxy.url(),
        &[
            "dlq",
            "edit",
            "d-1",
            "--patch",
            r#"[{"op": "replace", "path": "/payload/n", "value": 2}]"#,
            "--json",
        ],
        &[],
        "",
    );
    assert_eq!(o.status.code(), Some(5), "stderr: {}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["original_deleted"], false, "{report}");
    assert!(report["delete_error"].as_str().is_some(), "{report}");
    let new_id = report["new_message_id"].as_str().unwrap();
    let err = stderr(&o);
    assert!(
        err.contains("two copies exist") && err.contains(new_id) && err.contains(&dlq_id),
        "{err}"
    );
    assert_eq!(proxy.count("SendMessageBatch"), 1, "one send of the edited copy");
    // The send came first: the edited copy is in the source queue, and the original is still
    // in the DLQ.
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].message_id(), Some(new_id));
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 1);
}

#[tokio::test]
async fn a_fifo_dlq_message_is_edited_into_its_group_with_a_dedup_id_of_the_edit() {
    let stack = support::fresh_resources("edit-fifo", true).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "f-1", &job_body("f-1", 1), &[], Some("g-7")).await;
    let report = ok_json(&edit(
        &stack,
        &[
            "f-1",
            "--patch",
            r#"[{"op": "replace", "path": "/payload/n", "value": 3}]"#,
            "--json",
        ],
        &[],
    ));
    assert_eq!(report["group_id"], "g-7", "{report}");
    let back = support::read_all(&sqs, &stack.queue_url, 60, 1).await;
    assert_eq!(back.len(), 1);
    let (group, dedup) = group_and_dedup(&back[0]);
    assert_eq!(group, Some("g-7"));
    assert!(dedup.is_some_and(|d| d.starts_with("edit-")), "{dedup:?}");
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
}

/// Lets a waiting editor go when dropped (written when the test is done watching, or fails).
struct Go(PathBuf);

impl Drop for Go {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "");
    }
}

/// An editor script that marks `opened` when it starts, then waits for `go` (at most 60 s,
/// then gives up) and edits `"n":1` into `"n":8`: no editor outlives the test.
fn waiting_editor(dir: &TempDir) -> (String, PathBuf, Go) {
    let (opened, go) = (dir.path("opened"), dir.path("go"));
    let editor = dir.script(
        "editor",
        &format!(
            "touch '{}'\ni=0\nwhile [ ! -e '{go}' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n\
             [ -e '{go}' ] || exit 1\nsed -i 's/\"n\":1/\"n\":8/' \"$1\"",
            opened.display(),
            go = go.display()
        ),
    );
    (editor, opened, Go(go))
}

/// Waits until the editor marked `opened` (30 s at most).
async fn editor_opened(opened: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !opened.exists() {
        assert!(Instant::now() < deadline, "the editor never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While the editor is open, no other reader gets the message, however long the edit takes:
/// its hold (2 s here) is renewed.
#[tokio::test(flavor = "multi_thread")]
async fn the_message_stays_hidden_while_the_editor_is_open() {
    let stack = support::fresh_resources("edit-hold", false).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "h-1", &job_body("h-1", 1), &[], None).await;
    let dir = TempDir::new("edit-hold");
    let (editor, opened, go) = waiting_editor(&dir);
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let opts = dlq::EditOptions {
        table: Some(stack.table.clone()),
        hold: Duration::from_secs(2),
        ..dlq::EditOptions::new("h-1", dlq::EditSource::Editor(editor))
    };
    let dlq_url = stack.dlq_url.clone();
    let task = tokio::spawn(async move { dlq::edit(&ctx, &dlq_url, &opts).await });
    editor_opened(&opened).await;
    // Another reader, for three holds' worth of time: it never gets the message.
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(6) {
        let got = sqs
            .receive_message()
            .queue_url(&stack.dlq_url)
            .wait_time_seconds(1)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        assert!(
            got.is_empty(),
            "another reader got the message while it was being edited"
        );
    }
    drop(go);
    let report = task.await.unwrap().unwrap();
    assert!(report.original_deleted, "{report:?}");
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(job_body("h-1", 8).as_str()));
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
}

#[tokio::test]
async fn a_send_sqs_refuses_deletes_nothing_and_releases_the_message() {
    let stack = support::fresh_resources("edit-send", false).await;
    seed(&stack, "s-1", &job_body("s-1", 1), &[], None).await;
    put_ledger(&stack, "report.build", "s-1").await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always(
        "SendMessageBatch",
        Fault::Error {
            status: 400,
            code: "InvalidParameterValue".into(),
        },
    );
    let o = triage(
        &stack,
        &proxy.url(),
        &[
            "dlq",
            "edit",
            "s-1",
            "--patch",
            r#"[{"op": "replace", "path": "/payload/n", "value": 2}]"#,
        ],
        &[],
        "",
    );
    assert_refused(&o, 5, "was not sent");
    assert!(stderr(&o).contains("InvalidParameterValue"), "{}", stderr(&o));
    // The ledger was reset before the send (as replay does): the error says so.
    assert!(
        stderr(&o)
            .contains("the attempt ledger of job `s-1` (type `report.build`) was reset before the send"),
        "{}",
        stderr(&o)
    );
    assert!(!has_ledger(&stack, "report.build", "s-1").await);
    untouched(&stack).await;

    // An edit that names another job: that job's ledger was reset, and the line says whose.
    put_ledger(&stack, "report.build", "s-9").await;
    let o = triage(
        &stack,
        &proxy.url(),
        &[
            "dlq",
            "edit",
            "s-1",
            "--patch",
            r#"[{"op": "replace", "path": "/id", "value": "s-9"}]"#,
        ],
        &[],
        "",
    );
    assert_refused(
        &o,
        5,
        "the attempt ledger of job `s-9` (type `report.build`, the edited body's job, not the original's) was reset",
    );
    assert!(!has_ledger(&stack, "report.build", "s-9").await);
    assert!(
        !stderr(&o).contains("may have stored it"),
        "a refusal is clear: {}",
        stderr(&o)
    );
    assert_eq!(proxy.count("DeleteMessageBatch"), 0, "nothing deleted");
    untouched(&stack).await;

    // No clear answer (a 5xx after the retries): the copy may have landed, and the error says so.
    proxy.clear_faults();
    proxy.fail_always("SendMessageBatch", Fault::Status500);
    let o = triage(
        &stack,
        &proxy.url(),
        &[
            "dlq",
            "edit",
            "s-1",
            "--patch",
            r#"[{"op": "replace", "path": "/payload/n", "value": 2}]"#,
        ],
        &[],
        "",
    );
    assert_refused(&o, 5, "may have stored it");
    assert_eq!(proxy.count("DeleteMessageBatch"), 0, "nothing deleted");
    untouched(&stack).await;
}

#[tokio::test]
async fn replay_reads_an_eventbridge_body_with_the_consumers_mapping() {
    let stack = support::fresh_resources("edit-eb", false).await;
    let event = json!({
        "version": "0",
        "id": "ev-1",
        "detail-type": "Report Wanted",
        "source": "shop.orders",
        "account": "123456789012",
        "time": "2026-12-01T00:00:00Z",
        "region": "us-east-1",
        "resources": [],
        "detail": {"n": 1}
    })
    .to_string();
    seed(&stack, "ev-1", &event, &[], None).await;
    put_ledger(&stack, "report.build", "ev-1").await;
    let mapping = [("TRIAGE_EVENTBRIDGE_TYPES", "Report Wanted=report.build")];

    // A mapping the CLI cannot read is refused before any message is touched.
    let bad = triage(
        &stack,
        &support::sqs_endpoint(),
        &["dlq", "list"],
        &[("TRIAGE_EVENTBRIDGE_TYPES", "Report Wanted")],
        "",
    );
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("TRIAGE_EVENTBRIDGE_TYPES"),
        "{}",
        stderr(&bad)
    );
    untouched(&stack).await;

    // With the consumers' mapping the replay resets the ledger of the job the event is.
    let report = ok_json(&triage(
        &stack,
        &support::sqs_endpoint(),
        &["dlq", "replay", "--json"],
        &mapping,
        "",
    ));
    assert_eq!(report["moved"], 1, "{report}");
    assert!(
        !has_ledger(&stack, "report.build", "ev-1").await,
        "the mapped job type's ledger is reset: {report}"
    );
    let back = support::read_all(&support::sqs_client().await, &stack.queue_url, 60, 1).await;
    assert_eq!(
        back[0].body(),
        Some(event.as_str()),
        "the event goes back byte for byte"
    );
}

/// A `Ctx` whose SQS calls go through `proxy` (DynamoDB direct).
async fn ctx_via(proxy: &FaultProxy) -> Ctx {
    let sdk = support::sdk_config().await;
    let mut ctx = Ctx::from_config(&sdk).unwrap();
    ctx.sqs = aws_sdk_sqs::Client::from_conf(sqs_config(&sdk).endpoint_url(proxy.url()).build());
    ctx
}

/// While a held send stays held: another reader, receiving with a 1 s long poll, never gets a
/// message of `queue_url`, until `op` (the hold's renewal) has been renewed three more times.
/// The task must not finish meanwhile: its send is held.
async fn never_received_over_three_renewals<T>(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    proxy: &FaultProxy,
    op: &str,
    task: &tokio::task::JoinHandle<T>,
) {
    let until = proxy.count(op) + 3;
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.count(op) < until {
        assert!(
            Instant::now() < deadline,
            "the hold was not renewed during the send"
        );
        let got = sqs
            .receive_message()
            .queue_url(queue_url)
            .wait_time_seconds(1)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        assert!(got.is_empty(), "another reader got the message during the send");
        assert!(!task.is_finished(), "the held send ended");
    }
}

fn replace_n(n: u64) -> String {
    format!(r#"[{{"op": "replace", "path": "/payload/n", "value": {n}}}]"#)
}

#[tokio::test]
async fn a_patch_never_rewrites_what_it_does_not_touch() {
    let stack = support::fresh_resources("edit-exact", false).await;
    let sqs = support::sqs_client().await;
    // Pretty-printed, with an integer beyond 64 bits.
    let body = "{\n  \"type\": \"report.build\",\n  \"id\": \"x-1\",\n  \"payload\": {\"n\": 1, \"big\": 123456789012345678901234}\n}";
    seed(&stack, "x-1", body, &[], None).await;

    // A patch of another field would write the big integer back as a float: refused.
    let o = edit(&stack, &["x-1", "--patch", &replace_n(2)], &[]);
    assert_refused(&o, 2, "123456789012345678901234");
    assert!(stderr(&o).contains("--body"), "{}", stderr(&o));
    untouched(&stack).await;

    // An empty patch changes no value: unchanged, whatever the bytes.
    assert_refused(&edit(&stack, &["x-1", "--patch", "[]"], &[]), 2, "unchanged");
    untouched(&stack).await;

    // With --force, the body goes back byte for byte.
    let report = ok_json(&edit(&stack, &["x-1", "--patch", "[]", "--force", "--json"], &[]));
    assert_eq!(report["changed"], false, "{report}");
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(body));
}

/// The hold is renewed while the edited copy is sent: a slow send (held until three renewals
/// of a 1 s hold have passed) does not let another reader receive the original meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn the_message_stays_hidden_while_a_slow_send_runs() {
    let stack = support::fresh_resources("edit-slow", false).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "sl-1", &job_body("sl-1", 1), &[], None).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("SendMessageBatch", Fault::Hold);
    let ctx = ctx_via(&proxy).await;
    let opts = dlq::EditOptions {
        table: Some(stack.table.clone()),
        hold: Duration::from_secs(1),
        ..dlq::EditOptions::new("sl-1", dlq::EditSource::Patch(replace_n(2)))
    };
    let dlq_url = stack.dlq_url.clone();
    let task = tokio::spawn(async move { dlq::edit(&ctx, &dlq_url, &opts).await });
    assert!(
        proxy.until_held(1, Duration::from_secs(30)).await,
        "no send reached SQS"
    );
    never_received_over_three_renewals(&sqs, &stack.dlq_url, &proxy, "ChangeMessageVisibility", &task).await;
    proxy.release_held();
    let report = task.await.unwrap().unwrap();
    assert!(report.original_deleted, "{report:?}");
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(job_body("sl-1", 2).as_str()));
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
}

/// A hold lost during the send (the renewals refused, another reader received the original)
/// means no delete with the stale receipt handle, and a report that says the original may
/// still be in the DLQ.
#[tokio::test(flavor = "multi_thread")]
async fn a_hold_lost_during_the_send_deletes_nothing_and_says_so() {
    let stack = support::fresh_resources("edit-lost", false).await;
    let sqs = support::sqs_client().await;
    let dlq_id = seed(&stack, "lo-1", &job_body("lo-1", 1), &[], None).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("SendMessageBatch", Fault::Hold);
    let ctx = ctx_via(&proxy).await;
    let opts = dlq::EditOptions {
        table: Some(stack.table.clone()),
        hold: Duration::from_secs(1),
        ..dlq::EditOptions::new("lo-1", dlq::EditSource::Patch(replace_n(2)))
    };
    let dlq_url = stack.dlq_url.clone();
    let task = tokio::spawn(async move { dlq::edit(&ctx, &dlq_url, &opts).await });
    assert!(
        proxy.until_held(1, Duration::from_secs(30)).await,
        "no send reached SQS"
    );
    // From now on SQS refuses the edit's renewals, as it refuses a receipt handle whose
    // message is no longer in flight for it (moto accepts any handle it ever issued).
    proxy.add_rule(FaultRule {
        ops: Some(vec!["ChangeMessageVisibility".into()]),
        body_contains: None,
        fault: Fault::Error {
            status: 400,
            code: "MessageNotInflight".into(),
        },
        times: None,
    });
    // Another reader gets the original once the hold has run out.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stolen = loop {
        let got = sqs
            .receive_message()
            .queue_url(&stack.dlq_url)
            .wait_time_seconds(1)
            .visibility_timeout(60)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if let Some(m) = got.into_iter().next() {
            break m;
        }
        assert!(Instant::now() < deadline, "the hold never ran out");
    };
    assert!(!task.is_finished(), "the send was still running");
    proxy.release_held();
    let report = task.await.unwrap().unwrap();
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["original_deleted"], false, "{json}");
    assert_eq!(json["hold_lost"], true, "{json}");
    assert_eq!(
        proxy.count("DeleteMessageBatch"),
        0,
        "no delete with a stale handle"
    );
    let problem = triage::ops::output::Report::problem(&report).expect("a problem line");
    assert!(
        problem.contains("may still be in the DLQ")
            && problem.contains(&dlq_id)
            && problem.contains(&report.new_message_id),
        "{problem}"
    );
    // Both copies exist: the edited one in the source queue, the original with the other reader.
    assert_eq!(stolen.message_id(), Some(dlq_id.as_str()));
    let back = support::drain(&sqs, &stack.queue_url, 1).await;
    assert_eq!(back[0].body(), Some(job_body("lo-1", 2).as_str()));
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 1);
}

/// An editor left open does not hide the message for ever: past the longest hold (2 s here)
/// the message is visible again, and the edit is refused when the editor exits, its draft kept.
#[tokio::test(flavor = "multi_thread")]
async fn an_editor_left_open_lets_the_message_go_after_the_longest_hold() {
    let stack = support::fresh_resources("edit-cap", false).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "c-1", &job_body("c-1", 1), &[], None).await;
    let dir = TempDir::new("edit-cap");
    let (editor, opened, go) = waiting_editor(&dir);
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let opts = dlq::EditOptions {
        table: Some(stack.table.clone()),
        hold: Duration::from_secs(1),
        max_hold: Duration::from_secs(2),
        ..dlq::EditOptions::new("c-1", dlq::EditSource::Editor(editor))
    };
    let dlq_url = stack.dlq_url.clone();
    let task = tokio::spawn(async move { dlq::edit(&ctx, &dlq_url, &opts).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    editor_opened(&opened).await;
    // Another reader gets the message while the editor is still open.
    loop {
        let got = sqs
            .receive_message()
            .queue_url(&stack.dlq_url)
            .wait_time_seconds(1)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if !got.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the message was never let go");
        assert!(!task.is_finished(), "the edit ended before the editor");
    }
    drop(go);
    let e = task.await.unwrap().unwrap_err();
    assert_eq!(e.kind, triage::ops::ErrorKind::Failed, "{e}");
    assert!(e.message.contains("open longer than 2s"), "{e}");
    let kept = e
        .message
        .split("your edit is kept in ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no kept file named: {e}"));
    assert!(std::fs::read_to_string(kept).unwrap().contains("\"n\":8"), "{e}");
    let _ = std::fs::remove_file(kept);
    untouched(&stack).await;
}

/// SQS unreachable while the source queue is checked: exit 4 (not a usage error), nothing
/// sent, the message back.
#[tokio::test]
async fn an_unreachable_sqs_while_checking_the_source_is_exit_4() {
    let stack = support::fresh_resources("edit-src4", false).await;
    seed(&stack, "u-1", &job_body("u-1", 1), &[], None).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some("RedrivePolicy".into()),
        fault: Fault::Reset,
        times: None,
    });
    let o = triage(
        &stack,
        &proxy.url(),
        &["dlq", "edit", "u-1", "--patch", &replace_n(2)],
        &[],
        "",
    );
    assert_refused(&o, 4, "nothing was sent");
    assert_eq!(proxy.count("SendMessageBatch"), 0);
    untouched(&stack).await;
}

/// The size check uses the target queue's own MaximumMessageSize.
#[tokio::test]
async fn an_edit_over_the_target_queues_size_limit_is_refused() {
    let stack = support::fresh_resources("edit-size", false).await;
    seed(&stack, "z-1", &job_body("z-1", 1), &[], None).await;
    support::sqs_client()
        .await
        .set_queue_attributes()
        .queue_url(&stack.queue_url)
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap();
    let dir = TempDir::new("edit-size");
    let file = dir.path("big.json");
    let big = json!({"type": "report.build", "id": "z-1", "payload": "x".repeat(2000)});
    std::fs::write(&file, big.to_string()).unwrap();
    assert_refused(
        &edit(&stack, &["z-1", "--body", file.to_str().unwrap()], &[]),
        2,
        "over the 1024-byte limit",
    );
    untouched(&stack).await;
}

// ---------------------------------------------------------------- dlq replay: the hold

/// A replay of `stack`'s DLQ through `proxy`, holding each message read for `hold`.
async fn replay_via(
    proxy: &FaultProxy,
    stack: &SetupReport,
    hold: Duration,
) -> tokio::task::JoinHandle<dlq::ReplayReport> {
    let ctx = ctx_via(proxy).await;
    let opts = dlq::ReplayOptions {
        table: Some(stack.table.clone()),
        hold: Some(hold),
        max_scan: 1000,
        ..dlq::ReplayOptions::default()
    };
    let dlq_url = stack.dlq_url.clone();
    tokio::spawn(async move { dlq::replay(&ctx, &dlq_url, &opts).await.unwrap() })
}

/// The hold is renewed while the copies are sent: a slow send (held until three renewals of a
/// 1 s hold have passed) does not let another reader receive a DLQ message meanwhile, so the delete afterwards uses a receipt
/// handle that still holds it (on SQS a stale one answers success and deletes nothing).
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_keeps_its_hold_while_a_slow_send_runs() {
    let stack = support::fresh_resources("replay-slow", false).await;
    let sqs = support::sqs_client().await;
    seed(&stack, "rs-1", &job_body("rs-1", 1), &[], None).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("SendMessageBatch", Fault::Hold);
    let task = replay_via(&proxy, &stack, Duration::from_secs(1)).await;
    assert!(
        proxy.until_held(1, Duration::from_secs(30)).await,
        "no send reached SQS"
    );
    never_received_over_three_renewals(
        &sqs,
        &stack.dlq_url,
        &proxy,
        "ChangeMessageVisibilityBatch",
        &task,
    )
    .await;
    proxy.release_held();
    let report = task.await.unwrap();
    assert_eq!((report.moved, report.delete_failed), (1, 0), "{report:?}");
    assert_eq!(support::drain(&sqs, &stack.queue_url, 1).await.len(), 1);
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
}

/// A hold lost during the send (the renewals refused, another reader received the message)
/// means no delete with the stale receipt handle: the report counts the message moved but not
/// deleted, and the DLQ copy stays with the other reader. moto would delete with the stale
/// handle; SQS would answer success and delete nothing, so the test counts the deletes.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_whose_hold_was_lost_during_the_send_deletes_nothing() {
    let stack = support::fresh_resources("replay-lost", false).await;
    let sqs = support::sqs_client().await;
    let dlq_id = seed(&stack, "rl-1", &job_body("rl-1", 1), &[], None).await;
    let proxy = FaultProxy::start(&support::sqs_endpoint());
    proxy.fail_always("SendMessageBatch", Fault::Hold);
    let task = replay_via(&proxy, &stack, Duration::from_secs(1)).await;
    assert!(
        proxy.until_held(1, Duration::from_secs(30)).await,
        "no send reached SQS"
    );
    // SQS refuses a receipt handle whose message is no longer in flight for it.
    proxy.add_rule(FaultRule {
        ops: Some(vec![
            "ChangeMessageVisibilityBatch".into(),
            "ChangeMessageVisibility".into(),
        ]),
        body_contains: None,
        fault: Fault::Error {
            status: 400,
            code: "MessageNotInflight".into(),
        },
        times: None,
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let stolen = loop {
        let got = sqs
            .receive_message()
            .queue_url(&stack.dlq_url)
            .wait_time_seconds(1)
            .visibility_timeout(60)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if let Some(m) = got.into_iter().next() {
            break m;
        }
        assert!(Instant::now() < deadline, "the hold never ran out");
    };
    assert!(!task.is_finished(), "the send was still running");
    proxy.release_held();
    let report = task.await.unwrap();
    assert_eq!((report.moved, report.delete_failed), (1, 1), "{report:?}");
    assert_eq!(
        proxy.count("DeleteMessageBatch"),
        0,
        "a delete with a stale handle"
    );
    assert_eq!(stolen.message_id(), Some(dlq_id.as_str()));
    assert_eq!(support::drain(&sqs, &stack.queue_url, 1).await.len(), 1);
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 1);
}
