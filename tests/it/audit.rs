//! The audit trail on the local stack: every operator action that changes state writes one
//! item (who from STS, when, what, how many, the filter), read-only commands write none,
//! `triage audit` lists them newest first and by time, and an audit write that fails is
//! reported, never silent.

use crate::support;
use crate::support::fault_proxy::{Fault, FaultProxy, FaultRule};

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde_json::{Value, json};
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::effects::dlq::dlq_copy;
use triage::ops::Ctx;
use triage::ops::audit::{self, AuditEntry};

const BIN: &str = env!("CARGO_BIN_EXE_triage");

struct Stack {
    queue_url: String,
    dlq_url: String,
    table: String,
}

/// A `triage` command for `stack`, with STS sent to `sts` (moto, or a proxy in front of it).
fn triage(stack: &Stack, sts: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(args)
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env("AWS_ENDPOINT_URL_STS", sts)
        .env("USER", "auditor")
        .env_remove("TRIAGE_AUDIT_RETENTION")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    cmd
}

fn run(stack: &Stack, sts: &str, args: &[&str]) -> Output {
    triage(stack, sts, args).output().expect("run triage")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_out(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}; stderr: {}",
            String::from_utf8_lossy(&o.stdout),
            stderr(o)
        )
    })
}

fn ok_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "triage failed ({:?}): {}",
        o.status.code(),
        stderr(o)
    );
    json_out(o)
}

async fn fresh(prefix: &str) -> Stack {
    let r = support::fresh_resources(prefix, false).await;
    Stack {
        queue_url: r.queue_url,
        dlq_url: r.dlq_url,
        table: r.table,
    }
}

/// Puts DLQ copies (as the processor makes them) of `(class, type, id)` jobs into the DLQ.
async fn seed_dlq(stack: &Stack, jobs: &[(FailureClass, &str, String)]) {
    let sqs = support::sqs_client().await;
    for chunk in jobs.chunks(10) {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, (class, t, id))| {
                let rec = FailureRecord {
                    class: *class,
                    error: format!("{t} broke"),
                    attempts: 1,
                    job_type: Some((*t).into()),
                    job_id: id.clone(),
                    source_queue: stack.queue_url.clone(),
                    original_message_id: format!("orig-{id}"),
                    first_received_at: 1,
                    failed_at: sqs_triage::clock::now_ms() - 5_000,
                };
                let body = json!({"type": t, "payload": {}, "id": id}).to_string();
                let copy = dlq_copy(&body, &HashMap::new(), &rec, 1 << 20).unwrap();
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(copy.body)
                    .set_message_attributes(Some(copy.attributes))
                    .build()
                    .unwrap()
            })
            .collect();
        let out = sqs
            .send_message_batch()
            .queue_url(&stack.dlq_url)
            .set_entries(Some(entries))
            .send()
            .await
            .unwrap();
        assert!(out.failed.is_empty());
    }
}

/// Every audit item in the table, read straight from DynamoDB (oldest first).
async fn audit_items(table: &str) -> Vec<HashMap<String, AttributeValue>> {
    let out = support::ddb_client()
        .await
        .scan()
        .table_name(table)
        .filter_expression("begins_with(pk, :p)")
        .expression_attribute_values(":p", AttributeValue::S("audit#".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let mut items = out.items.unwrap_or_default();
    items.sort_by_key(|i| s(i, "sk"));
    items
}

fn s(item: &HashMap<String, AttributeValue>, k: &str) -> String {
    item.get(k)
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap_or_default()
}

fn n(item: &HashMap<String, AttributeValue>, k: &str) -> Option<u64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

fn parsed(item: &HashMap<String, AttributeValue>, k: &str) -> Value {
    serde_json::from_str(&s(item, k)).unwrap_or(Value::Null)
}

/// The ARN moto's STS gives the stack's credentials.
async fn moto_arn() -> String {
    let conf = aws_sdk_sts::config::Builder::from(&support::sdk_config().await)
        .endpoint_url(support::sts_endpoint())
        .build();
    aws_sdk_sts::Client::from_conf(conf)
        .get_caller_identity()
        .send()
        .await
        .unwrap()
        .arn
        .unwrap()
}

/// Asserts the newest audit item is the only one added since `before` items, and returns it.
async fn one_new_item(table: &str, before: usize) -> HashMap<String, AttributeValue> {
    let items = audit_items(table).await;
    assert_eq!(
        items.len(),
        before + 1,
        "exactly one audit item expected: {items:?}"
    );
    items.last().unwrap().clone()
}

#[tokio::test]
async fn each_state_changing_command_writes_one_item_and_reads_write_none() {
    let stack = fresh("audit-cmds").await;
    let arn = moto_arn().await;
    // STS through a proxy that counts its calls.
    let sts = FaultProxy::start(&support::sts_endpoint());
    let sts_url = sts.url();
    let mut jobs: Vec<(FailureClass, &str, String)> = Vec::new();
    jobs.extend((0..3).map(|i| (FailureClass::Fatal, "billing.charge", format!("b-{i}"))));
    jobs.extend((0..2).map(|i| (FailureClass::Invalid, "junk", format!("j-{i}"))));
    jobs.push((FailureClass::Fatal, "email.send", "e-0".to_owned()));
    seed_dlq(&stack, &jobs).await;

    // Commands that only read write nothing and never ask STS.
    for args in [
        &["dlq", "list", "--json"][..],
        &["dlq", "list", "--messages"],
        &["dlq", "show", "b-0", "--json"],
        &["breaker", "status", "--json"],
        &["attempts", "show", "b-0", "--json"],
        &["audit", "--json"],
        &["dlq", "replay", "--dry-run", "--json"],
    ] {
        let o = run(&stack, &sts_url, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    assert!(
        audit_items(&stack.table).await.is_empty(),
        "a read wrote an audit item"
    );
    assert_eq!(sts.total(), 0, "a read asked STS who is calling");

    // Replay: the count moved and the filter flags.
    let o = run(
        &stack,
        &sts_url,
        &[
            "dlq",
            "replay",
            "--type",
            "billing.charge",
            "--older-than",
            "1s",
            "--json",
        ],
    );
    let report = ok_json(&o);
    assert_eq!(report["moved"], 3);
    assert_eq!(report["audit"]["written"], true, "{report}");
    assert_eq!(report["audit"]["actor"], arn.as_str());
    let item = one_new_item(&stack.table, 0).await;
    assert_eq!(s(&item, "action"), "dlq.replay");
    assert_eq!(s(&item, "target"), stack.dlq_url);
    assert_eq!(s(&item, "actor"), arn);
    assert_eq!(s(&item, "local_user"), "auditor");
    assert!(!item.contains_key("actor_error"), "{item:?}");
    assert_eq!(n(&item, "count"), Some(3));
    assert_eq!(
        parsed(&item, "filter"),
        json!({"type": ["billing.charge"], "older_than": "1s", "max_scan": 100_000})
    );
    assert_eq!(parsed(&item, "detail")["targets"][&stack.queue_url], 3);
    let at = n(&item, "at").unwrap();
    let now = sqs_triage::clock::now_ms();
    assert!(at <= now && at + 120_000 > now, "at {at}, now {now}");
    assert_eq!(s(&item, "pk"), format!("audit#{}", audit::utc_day(at)));
    assert!(s(&item, "sk").starts_with(&format!("{at:013}#")), "{item:?}");
    // Kept for the default 400 days.
    assert_eq!(n(&item, "expires_at"), Some(at / 1000 + 400 * 86_400));
    assert_eq!(
        sts.count("GetCallerIdentity"),
        1,
        "one STS call per audited command"
    );

    // Purge: the count deleted, with the retention set by the environment.
    let o = triage(
        &stack,
        &sts_url,
        &["dlq", "purge", "--class", "invalid", "--yes", "--json"],
    )
    .env("TRIAGE_AUDIT_RETENTION", "30d")
    .output()
    .unwrap();
    assert_eq!(ok_json(&o)["deleted"], 2);
    let item = one_new_item(&stack.table, 1).await;
    assert_eq!(s(&item, "action"), "dlq.purge");
    assert_eq!(n(&item, "count"), Some(2));
    assert_eq!(
        parsed(&item, "filter"),
        json!({"class": ["invalid"], "max_scan": 100_000})
    );
    assert_eq!(
        n(&item, "expires_at"),
        Some(n(&item, "at").unwrap() / 1000 + 30 * 86_400)
    );

    // Breaker forces: target the job type, no count.
    for (i, (verb, extra)) in [("open", Some("10m")), ("close", None), ("reset", None)]
        .into_iter()
        .enumerate()
    {
        let mut args = vec!["breaker", verb, "email.send", "--yes", "--json"];
        if let Some(d) = extra {
            args.extend(["--for", d]);
        }
        let report = ok_json(&run(&stack, &sts_url, &args));
        assert_eq!(report["audit"]["written"], true);
        let item = one_new_item(&stack.table, 2 + i).await;
        assert_eq!(s(&item, "action"), format!("breaker.{verb}"));
        assert_eq!(s(&item, "target"), "email.send");
        assert_eq!(s(&item, "actor"), arn);
        assert_eq!(n(&item, "count"), None);
        assert!(!item.contains_key("filter"));
        let detail = parsed(&item, "detail");
        assert_eq!(detail["to"], report["breakers"][0]["phase"]);
        if verb == "open" {
            assert_eq!(detail["for"], "10m");
        }
    }
    // Five audited runs, five STS calls: one per run, none for the reads in between.
    assert_eq!(sts.count("GetCallerIdentity"), 5);
    assert_eq!(sts.total(), 5);

    // `triage audit` lists the five, newest first.
    let listed = ok_json(&run(&stack, &sts_url, &["audit", "--json"]));
    let actions: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "breaker.reset",
            "breaker.close",
            "breaker.open",
            "dlq.purge",
            "dlq.replay"
        ]
    );
    assert_eq!(listed["entries"][4]["count"], 3);
    assert_eq!(listed["entries"][4]["filter"]["type"], json!(["billing.charge"]));
    assert_eq!(
        audit_items(&stack.table).await.len(),
        5,
        "`triage audit` wrote an item"
    );
}

/// `dlq redrive` start and cancel on a proxy that answers SQS's move-task calls (moto does
/// not implement them).
#[tokio::test]
async fn redrive_start_and_cancel_are_audited() {
    let stack = fresh("audit-redrive").await;
    let arn = moto_arn().await;
    let sqs = FaultProxy::start(&support::sqs_endpoint());
    let answer = |op: &str, body: &str| FaultRule {
        ops: Some(vec![op.to_owned()]),
        body_contains: None,
        fault: Fault::Body {
            status: 200,
            body: body.to_owned(),
        },
        times: None,
    };
    sqs.add_rule(answer("StartMessageMoveTask", r#"{"TaskHandle":"task-1"}"#));
    sqs.add_rule(answer(
        "CancelMessageMoveTask",
        r#"{"ApproximateNumberOfMessagesMoved":4}"#,
    ));
    let via = |args: &[&str]| {
        triage(&stack, &support::sts_endpoint(), args)
            .env("AWS_ENDPOINT_URL_SQS", sqs.url())
            .output()
            .unwrap()
    };
    let started = ok_json(&via(&["dlq", "redrive", "--rate", "5", "--yes", "--json"]));
    assert_eq!(started["task_handle"], "task-1");
    let item = one_new_item(&stack.table, 0).await;
    assert_eq!(s(&item, "action"), "dlq.redrive.start");
    assert_eq!(s(&item, "target"), stack.dlq_url);
    assert_eq!(s(&item, "actor"), arn);
    assert_eq!(n(&item, "count"), Some(0), "the DLQ's approximate count (empty)");
    let detail = parsed(&item, "detail");
    assert_eq!(detail["task_handle"], "task-1");
    assert_eq!(detail["rate"], 5);

    let cancelled = ok_json(&via(&["dlq", "redrive", "cancel", "task-1", "--json"]));
    assert_eq!(cancelled["moved"], 4);
    let item = one_new_item(&stack.table, 1).await;
    assert_eq!(s(&item, "action"), "dlq.redrive.cancel");
    assert_eq!(n(&item, "count"), Some(4));
    assert_eq!(parsed(&item, "detail")["task_handle"], "task-1");

    // `--action dlq.redrive` lists both sub-actions; `status` writes nothing.
    let listed = ok_json(&via(&["audit", "--action", "dlq.redrive", "--json"]));
    assert_eq!(listed["entries"].as_array().unwrap().len(), 2);
    let o = via(&["dlq", "redrive", "status", "--json"]);
    assert_eq!(o.status.code(), Some(6), "moto: {}", stderr(&o));
    assert_eq!(audit_items(&stack.table).await.len(), 2);
}

#[tokio::test]
async fn audit_lists_newest_first_within_the_period_and_by_action() {
    let stack = fresh("audit-since").await;
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let now = sqs_triage::clock::now_ms();
    let hour = 3_600_000;
    // Written out of order, over four UTC days at most.
    for (ago, action, target) in [
        (2 * hour, "dlq.purge", "q-2h"),
        (73 * hour, "dlq.replay", "q-73h"),
        (60_000, "breaker.open", "t-1m"),
        (25 * hour, "breaker.close", "t-25h"),
        (47 * hour, "dlq.replay", "q-47h"),
    ] {
        let entry = AuditEntry::new(action, target)
            .count(1)
            .filter(json!({"type": ["x"]}));
        let status = audit::record_at(&ctx, &stack.table, entry, now - ago).await;
        assert!(status.written, "{status:?}");
    }
    let targets = |v: &Value| -> Vec<String> {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["target"].as_str().unwrap().to_owned())
            .collect()
    };
    let sts = support::sts_endpoint();
    let day = ok_json(&run(&stack, &sts, &["audit", "--json"]));
    assert_eq!(targets(&day), ["t-1m", "q-2h"], "default --since 1d");
    let two = ok_json(&run(&stack, &sts, &["audit", "--since", "2d", "--json"]));
    assert_eq!(targets(&two), ["t-1m", "q-2h", "t-25h", "q-47h"]);
    let all = ok_json(&run(&stack, &sts, &["audit", "--since", "4d", "--json"]));
    assert_eq!(targets(&all), ["t-1m", "q-2h", "t-25h", "q-47h", "q-73h"]);
    assert_eq!(all["truncated"], false);
    let at: Vec<u64> = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["at_ms"].as_u64().unwrap())
        .collect();
    assert!(at.windows(2).all(|w| w[0] > w[1]), "newest first: {at:?}");

    let replays = ok_json(&run(
        &stack,
        &sts,
        &["audit", "--since", "4d", "--action", "dlq.replay", "--json"],
    ));
    assert_eq!(targets(&replays), ["q-47h", "q-73h"]);
    let breakers = ok_json(&run(
        &stack,
        &sts,
        &["audit", "--since", "4d", "--action", "breaker", "--json"],
    ));
    assert_eq!(targets(&breakers), ["t-1m", "t-25h"]);
    let limited = ok_json(&run(
        &stack,
        &sts,
        &["audit", "--since", "4d", "--limit", "2", "--json"],
    ));
    assert_eq!(targets(&limited), ["t-1m", "q-2h"]);
    assert_eq!(limited["truncated"], true);

    // The human table, and a clear line for a bad flag.
    let o = run(&stack, &sts, &["audit", "--since", "2d"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("AT") && lines[0].contains("ACTION"),
        "{text}"
    );
    assert!(
        lines[1].contains("breaker.open") && lines[1].contains("t-1m"),
        "{text}"
    );
    assert_eq!(lines.len(), 5, "{text}");
    let o = run(&stack, &sts, &["audit", "--since", "soon"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&stack, &sts, &["audit", "--since", "20y"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--since"), "{}", stderr(&o));
    let o = run(&stack, &sts, &["audit", "--limit", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--limit"), "{}", stderr(&o));
}

#[tokio::test]
async fn an_audit_write_that_fails_is_reported_after_the_action() {
    let stack = fresh("audit-denied").await;
    let sts = support::sts_endpoint();
    let jobs: Vec<(FailureClass, &str, String)> = (0..3)
        .map(|i| (FailureClass::Invalid, "junk", format!("d-{i}")))
        .collect();
    seed_dlq(&stack, &jobs).await;
    // DynamoDB refuses the audit item's PutItem only (breaker writes are PutItems too).
    let ddb = FaultProxy::start(&support::ddb_endpoint());
    ddb.add_rule(FaultRule {
        ops: Some(vec!["PutItem".into()]),
        body_contains: Some("audit#".into()),
        fault: Fault::Error {
            status: 400,
            code: "AccessDeniedException".into(),
        },
        times: None,
    });
    let via = |args: &[&str]| {
        triage(&stack, &sts, args)
            .env("AWS_ENDPOINT_URL_DYNAMODB", ddb.url())
            .output()
            .unwrap()
    };

    // The purge is done (its count is real), then the audit write fails: exit 7, one error
    // line, and the report says so.
    let o = via(&["dlq", "purge", "--yes", "--json"]);
    assert_eq!(o.status.code(), Some(7), "stderr: {}", stderr(&o));
    let report = json_out(&o);
    assert_eq!(report["deleted"], 3);
    assert_eq!(report["audit"]["written"], false);
    assert!(
        report["audit"]["error"]
            .as_str()
            .unwrap()
            .contains("AccessDenied"),
        "{report}"
    );
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("error: ") && l.contains("audit item was not written")),
        "{err}"
    );
    let depth = support::queue_depth(&support::sqs_client().await, &stack.dlq_url).await;
    assert_eq!(depth.total(), 0, "the purge must stand");
    assert_eq!(ddb.faults_injected(), 1, "access denied is not retried");

    // A breaker force: forced, not audited, exit 7; the human output still shows the force.
    let o = via(&["breaker", "open", "billing.charge", "--yes"]);
    assert_eq!(o.status.code(), Some(7), "stderr: {}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("forced open"));
    assert!(
        stderr(&o).contains("audit item was not written"),
        "{}",
        stderr(&o)
    );
    let status = ok_json(&run(
        &stack,
        &sts,
        &["breaker", "status", "billing.charge", "--json"],
    ));
    assert_eq!(status["breakers"][0]["phase"], "open");
    assert!(audit_items(&stack.table).await.is_empty());
}

#[tokio::test]
async fn sts_failures_and_missing_tables_are_not_silent() {
    let stack = fresh("audit-sts").await;
    // STS refuses: the force is done and audited with the actor unknown, and the reason.
    let sts = FaultProxy::start(&support::sts_endpoint());
    sts.fail_always(
        "GetCallerIdentity",
        Fault::Body {
            status: 403,
            body: "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error>\
                   <Type>Sender</Type><Code>AccessDenied</Code><Message>not allowed</Message>\
                   </Error><RequestId>r-1</RequestId></ErrorResponse>"
                .into(),
        },
    );
    let o = run(
        &stack,
        &sts.url(),
        &["breaker", "open", "t.sts", "--yes", "--json"],
    );
    let report = ok_json(&o);
    assert_eq!(report["audit"]["written"], true);
    assert_eq!(report["audit"]["actor"], "unknown");
    assert!(
        stderr(&o).contains("warning: audited with actor `unknown`"),
        "{}",
        stderr(&o)
    );
    let items = audit_items(&stack.table).await;
    assert_eq!(items.len(), 1);
    assert_eq!(s(&items[0], "actor"), "unknown");
    assert!(
        s(&items[0], "actor_error").contains("AccessDenied"),
        "{:?}",
        items[0]
    );

    // Purge needs the state table to audit to: refused before anything is deleted.
    seed_dlq(&stack, &[(FailureClass::Invalid, "junk", "m-0".to_owned())]).await;
    let o = triage(&stack, &support::sts_endpoint(), &["dlq", "purge", "--yes"])
        .env_remove("TRIAGE_TABLE")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("TRIAGE_TABLE"), "{}", stderr(&o));
    let o = triage(&stack, &support::sts_endpoint(), &["dlq", "purge", "--yes"])
        .env("TRIAGE_TABLE", "no-such-audit-table")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let o = triage(&stack, &support::sts_endpoint(), &["dlq", "purge", "--yes"])
        .env("TRIAGE_AUDIT_RETENTION", "1h")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("TRIAGE_AUDIT_RETENTION"), "{}", stderr(&o));
    let depth = support::queue_depth(&support::sqs_client().await, &stack.dlq_url).await;
    assert_eq!(depth.total(), 1, "nothing deleted");
}

/// A replay stopped by an error part-way is audited with what it really moved.
#[tokio::test]
async fn a_replay_stopped_by_an_error_audits_what_it_moved() {
    let stack = fresh("audit-partial").await;
    let jobs: Vec<(FailureClass, &str, String)> = (0..12)
        .map(|i| (FailureClass::Fatal, "billing.charge", format!("pa-{i:02}")))
        .collect();
    seed_dlq(&stack, &jobs).await;
    // The ledger reset of the batch holding pa-11 is refused: the replay stops there.
    let ddb = FaultProxy::start(&support::ddb_endpoint());
    ddb.add_rule(FaultRule {
        ops: Some(vec!["BatchWriteItem".into()]),
        body_contains: Some("pa-11".into()),
        fault: Fault::Error {
            status: 400,
            code: "AccessDeniedException".into(),
        },
        times: None,
    });
    let o = triage(&stack, &support::sts_endpoint(), &["dlq", "replay", "--json"])
        .env("AWS_ENDPOINT_URL_DYNAMODB", ddb.url())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("AccessDenied") && err.contains("audited as"),
        "{err}"
    );
    let sqs = support::sqs_client().await;
    let moved = support::queue_depth(&sqs, &stack.queue_url).await.total();
    // The batch that holds pa-11 stopped the replay: at most the one batch of ten read before
    // it moved, and pa-11 is not among them.
    assert!(moved <= 10, "more than the batch before pa-11's moved: {moved}");
    let bodies: Vec<Value> = support::read_all(&sqs, &stack.queue_url, 60, 0)
        .await
        .iter()
        .map(|m| serde_json::from_str(m.body().unwrap_or_default()).unwrap())
        .collect();
    assert_eq!(bodies.len() as u64, moved, "{bodies:?}");
    assert!(
        bodies.iter().all(|b| b["id"] != "pa-11"),
        "the batch with pa-11 moved: {bodies:?}"
    );
    let items = audit_items(&stack.table).await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(s(&items[0], "action"), "dlq.replay");
    assert_eq!(
        n(&items[0], "count"),
        Some(moved),
        "the count is what really moved"
    );
    let detail = parsed(&items[0], "detail");
    assert!(
        detail["error"].as_str().unwrap().contains("AccessDenied"),
        "{detail}"
    );
}

/// Whatever an action carries, its item fits DynamoDB; a stored time no clock wrote, or a
/// retention no one meant, never breaks the trail.
#[tokio::test]
async fn oversized_details_odd_times_and_absurd_retentions_keep_the_trail_working() {
    let stack = fresh("audit-odd").await;
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    // A failure record's error can be as long as an SQS message (and a forged one longer
    // than DynamoDB's item limit): the detail is cut, the item written.
    let huge = "x".repeat(600_000);
    let entry = AuditEntry::new("dlq.edit", "q")
        .count(1)
        .detail(json!({"original_record": {"error": huge}}));
    let status = audit::record(&ctx, &stack.table, entry).await;
    assert!(status.written, "{status:?}");

    // An item written by hand with a time past year 9999, in today's partition.
    let now = sqs_triage::clock::now_ms();
    support::ddb_client()
        .await
        .put_item()
        .table_name(&stack.table)
        .item("pk", AttributeValue::S(format!("audit#{}", audit::utc_day(now))))
        .item("sk", AttributeValue::S("9999999999999#0".into()))
        .item("at", AttributeValue::N(u64::MAX.to_string()))
        .item("action", AttributeValue::S("forged".into()))
        .send()
        .await
        .unwrap();

    let listed = ok_json(&run(&stack, &support::sts_endpoint(), &["audit", "--json"]));
    let entries = listed["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{listed}");
    let edit = entries.iter().find(|e| e["action"] == "dlq.edit").unwrap();
    assert_eq!(
        edit["detail"]["truncated_from_bytes"]
            .as_u64()
            .map(|n| n > 600_000),
        Some(true)
    );
    let forged = entries.iter().find(|e| e["action"] == "forged").unwrap();
    assert_eq!(forged["at"], "9999-12-31T23:59:59.999Z", "{forged}");
    let human = run(&stack, &support::sts_endpoint(), &["audit"]);
    assert!(human.status.success(), "{}", stderr(&human));

    // A retention that would overflow the TTL is refused before the action.
    let o = triage(
        &stack,
        &support::sts_endpoint(),
        &["breaker", "open", "t.odd", "--yes"],
    )
    .env("TRIAGE_AUDIT_RETENTION", "18446744073709551615")
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("TRIAGE_AUDIT_RETENTION"), "{}", stderr(&o));
    let status = ok_json(&run(
        &stack,
        &support::sts_endpoint(),
        &["breaker", "status", "t.odd", "--json"],
    ));
    assert!(!status.to_string().contains("\"open\""), "not forced: {status}");
}

/// Actions whose answer was unclear, or that changed state before they failed, are audited
/// too, saying so: a `dlq redrive` start or cancel whose answer was lost (the task may run),
/// a breaker force whose write got no answer (it may have landed), and a `dlq edit` whose send
/// failed after the job's attempt ledger was reset.
#[tokio::test]
async fn actions_that_may_have_changed_state_are_audited_when_they_fail() {
    let stack = fresh("audit-unclear").await;
    let arn = moto_arn().await;
    let lost = |op: &str, body: Option<&str>| FaultRule {
        ops: Some(vec![op.to_owned()]),
        body_contains: body.map(str::to_owned),
        fault: Fault::LostAnswer,
        times: None,
    };
    let sqs = FaultProxy::start(&support::sqs_endpoint());
    sqs.add_rule(lost("StartMessageMoveTask", None));
    sqs.add_rule(lost("CancelMessageMoveTask", None));
    let via_sqs = |args: &[&str]| {
        triage(&stack, &support::sts_endpoint(), args)
            .env("AWS_ENDPOINT_URL_SQS", sqs.url())
            .output()
            .unwrap()
    };
    let unclear = |item: &HashMap<String, AttributeValue>, action: &str| {
        assert_eq!(s(item, "action"), action, "{item:?}");
        assert_eq!(s(item, "actor"), arn);
        let detail = parsed(item, "detail");
        assert_eq!(detail["outcome"], "unclear", "{detail}");
        assert!(
            detail["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{detail}"
        );
    };

    let o = via_sqs(&["dlq", "redrive", "--yes", "--json"]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("audited as"), "{}", stderr(&o));
    unclear(&one_new_item(&stack.table, 0).await, "dlq.redrive.start");

    let o = via_sqs(&["dlq", "redrive", "cancel", "task-1", "--json"]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    let item = one_new_item(&stack.table, 1).await;
    unclear(&item, "dlq.redrive.cancel");
    assert_eq!(parsed(&item, "detail")["task_handle"], "task-1");

    // The breaker's write lands but its answer is lost, on every try.
    let ddb = FaultProxy::start(&support::ddb_endpoint());
    ddb.add_rule(lost("PutItem", Some("breaker#bk.unclear")));
    let o = triage(
        &stack,
        &support::sts_endpoint(),
        &["breaker", "open", "bk.unclear", "--yes", "--json"],
    )
    .env("AWS_ENDPOINT_URL_DYNAMODB", ddb.url())
    .output()
    .unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("audited as"), "{}", stderr(&o));
    let item = one_new_item(&stack.table, 2).await;
    unclear(&item, "breaker.open");
    assert_eq!(s(&item, "target"), "bk.unclear");

    // An edit whose send fails after the ledger reset: audited as not sent, the reset named.
    seed_dlq(&stack, &[(FailureClass::Fatal, "e.type", "e-1".into())]).await;
    sqs.add_rule(FaultRule {
        ops: Some(vec!["SendMessageBatch".into()]),
        body_contains: None,
        fault: Fault::Error {
            status: 400,
            code: "InvalidParameterValue".into(),
        },
        times: None,
    });
    let o = via_sqs(&[
        "dlq",
        "edit",
        "e-1",
        "--patch",
        r#"[{"op": "add", "path": "/payload/n", "value": 2}]"#,
    ]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("audited as"), "{}", stderr(&o));
    let item = one_new_item(&stack.table, 3).await;
    assert_eq!(s(&item, "action"), "dlq.edit");
    let detail = parsed(&item, "detail");
    assert_eq!(detail["outcome"], "not_sent", "{detail}");
    assert_eq!(detail["ledger_reset"], true, "{detail}");
    assert_eq!(detail["job_id"], "e-1", "{detail}");

    // No clear answer from the send: the copy may have landed.
    sqs.clear_faults();
    sqs.add_rule(lost("SendMessageBatch", None));
    let o = via_sqs(&[
        "dlq",
        "edit",
        "e-1",
        "--patch",
        r#"[{"op": "add", "path": "/payload/n", "value": 3}]"#,
    ]);
    assert_eq!(o.status.code(), Some(4), "SQS unreachable: {}", stderr(&o));
    assert!(stderr(&o).contains("audited as"), "{}", stderr(&o));
    let item = one_new_item(&stack.table, 4).await;
    assert_eq!(s(&item, "action"), "dlq.edit");
    assert_eq!(parsed(&item, "detail")["outcome"], "unclear");
}

/// Whoever answers at `AWS_ENDPOINT_URL_STS` names the actor. An answer naming another account
/// than the resources' (here the DLQ URL's) is recorded as not verified, with why, and the
/// command warns; the item keeps what STS said.
#[tokio::test]
async fn an_actor_of_another_account_than_the_resources_is_recorded_unverified() {
    let stack = fresh("audit-foreign").await;
    let sts = FaultProxy::start(&support::sts_endpoint());
    sts.add_rule(FaultRule {
        ops: None,
        body_contains: Some("GetCallerIdentity".into()),
        fault: Fault::Body {
            status: 200,
            body: "<GetCallerIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
<GetCallerIdentityResult><Arn>arn:aws:iam::999999999999:user/mallory</Arn>\
<UserId>AIDAEXAMPLE</UserId><Account>999999999999</Account></GetCallerIdentityResult>\
<ResponseMetadata><RequestId>r-1</RequestId></ResponseMetadata></GetCallerIdentityResponse>"
                .into(),
        },
        times: None,
    });
    let o = run(&stack, &sts.url(), &["dlq", "purge", "--yes", "--json"]);
    let report = ok_json(&o);
    assert_eq!(
        report["audit"]["actor"], "arn:aws:iam::999999999999:user/mallory",
        "{report}"
    );
    let why = report["audit"]["actor_unverified"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        why.contains("999999999999") && why.contains("123456789012"),
        "{report}"
    );
    assert!(stderr(&o).contains("not verified"), "{}", stderr(&o));
    let item = one_new_item(&stack.table, 0).await;
    assert_eq!(s(&item, "actor"), "arn:aws:iam::999999999999:user/mallory");
    assert_eq!(s(&item, "actor_unverified"), why);
    let listed = ok_json(&run(&stack, &support::sts_endpoint(), &["audit", "--json"]));
    assert_eq!(listed["entries"][0]["actor_unverified"], why.as_str(), "{listed}");
    // The console's audit page marks it too.
    let console = crate::console::start_on(&stack.queue_url, &stack.dlq_url, &stack.table, &[], &[]);
    let page = crate::console::get(&console, "/audit").await.body;
    assert!(page.contains("user/mallory <span class=\"unverified\""), "{page}");

    // moto's own STS names the queues' account: verified, nothing added.
    let o = run(
        &stack,
        &support::sts_endpoint(),
        &["dlq", "purge", "--yes", "--json"],
    );
    let report = ok_json(&o);
    assert!(report["audit"].get("actor_unverified").is_none(), "{report}");
    assert!(!stderr(&o).contains("not verified"), "{}", stderr(&o));
    assert!(
        !one_new_item(&stack.table, 1)
            .await
            .contains_key("actor_unverified")
    );
}
