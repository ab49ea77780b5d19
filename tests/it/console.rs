//! `triage console` on the local stack: the real binary serves the pages on an ephemeral port;
//! the tests read them over HTTP, and check every change with SQS and DynamoDB themselves.

use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use aws_sdk_sqs::types::MessageAttributeValue;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::effects::dlq::dlq_copy;
use triage::ops::setup::SetupReport;
use triage::ops::{Ctx, audit, breaker};

const BIN: &str = env!("CARGO_BIN_EXE_triage");

/// A running `triage console`, stopped on drop.
pub(crate) struct Console {
    child: Child,
    /// `http://127.0.0.1:PORT`
    base: String,
    /// The URL it printed.
    printed: String,
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(stack: &SetupReport, extra: &[&str], env: &[(&str, &str)]) -> Console {
    start_on(&stack.queue_url, &stack.dlq_url, &stack.table, extra, env)
}

pub(crate) fn start_on(
    queue_url: &str,
    dlq_url: &str,
    table: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Console {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(["console", "--port", "0"])
        .args(extra)
        .env("TRIAGE_QUEUE_URL", queue_url)
        .env("TRIAGE_DLQ_URL", dlq_url)
        .env("TRIAGE_TABLE", table)
        .env("AWS_ENDPOINT_URL_STS", support::sts_endpoint())
        .env_remove("TRIAGE_CONSOLE_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn triage console");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read the console's URL");
    let printed = line
        .trim()
        .strip_prefix("triage console: ")
        .unwrap_or_else(|| panic!("no URL printed: {line:?}"))
        .to_owned();
    let base = printed
        .split_once("/?")
        .map_or(printed.trim_end_matches('/'), |(b, _)| b)
        .to_owned();
    Console { child, base, printed }
}

pub(crate) struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    pub(crate) body: String,
}

async fn http(method: &str, url: &str, headers: &[(&str, &str)], body: Option<String>) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if body.is_some() {
        req = req.header("content-type", "application/x-www-form-urlencoded");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = client.request(req).await.expect("HTTP request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub(crate) async fn get(c: &Console, path: &str) -> Answer {
    http("GET", &format!("{}{path}", c.base), &[], None).await
}

async fn post(c: &Console, path: &str, form: &[(&str, &str)]) -> Answer {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter().copied())
        .finish();
    http("POST", &format!("{}{path}", c.base), &[], Some(body)).await
}

/// Every `value` of the hidden inputs named `name` in a page.
fn hidden_values(page: &str, name: &str) -> Vec<String> {
    let needle = format!("name=\"{name}\" value=\"");
    page.match_indices(&needle)
        .map(|(i, _)| {
            let rest = &page[i + needle.len()..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect()
}

fn csrf(page: &str) -> String {
    hidden_values(page, "csrf")
        .into_iter()
        .next()
        .expect("a CSRF field")
}

/// Puts the processor's DLQ copy of a job that failed fatally into the DLQ; returns the DLQ
/// message id.
async fn seed(
    stack: &SetupReport,
    job_type: &str,
    job_id: &str,
    payload: serde_json::Value,
    error: &str,
) -> String {
    let body = json!({"type": job_type, "id": job_id, "payload": payload}).to_string();
    seed_body(stack, job_type, job_id, &body, error).await
}

/// [`seed`] with the job's body as it is.
async fn seed_body(stack: &SetupReport, job_type: &str, job_id: &str, body: &str, error: &str) -> String {
    let record = FailureRecord {
        class: FailureClass::Fatal,
        error: error.into(),
        attempts: 1,
        job_type: Some(job_type.into()),
        job_id: job_id.into(),
        source_queue: stack.queue_url.clone(),
        original_message_id: format!("orig-{job_id}"),
        first_received_at: 1,
        failed_at: sqs_triage::clock::now_ms(),
    };
    let attrs: HashMap<String, MessageAttributeValue> = [(
        "tenant".to_owned(),
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value("<img src=x onerror=alert(2)>")
            .build()
            .unwrap(),
    )]
    .into();
    let copy = dlq_copy(body, &attrs, &record, 1 << 20).unwrap();
    support::sqs_client()
        .await
        .send_message()
        .queue_url(&stack.dlq_url)
        .message_body(copy.body)
        .set_message_attributes(Some(copy.attributes))
        .send()
        .await
        .unwrap()
        .message_id
        .unwrap()
}

async fn ctx() -> Ctx {
    Ctx::from_config(&support::sdk_config().await).unwrap()
}

/// The last hour's audit entries whose action starts with `prefix`, newest first.
async fn audited(ctx: &Ctx, table: &str, prefix: &str) -> Vec<audit::AuditRecord> {
    audit::list(ctx, table, std::time::Duration::from_secs(3600), Some(prefix), 10)
        .await
        .unwrap()
        .entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_show_the_real_depths_and_groups_and_escape_every_body() {
    let stack = support::fresh_resources("console-pages", false).await;
    for i in 0..3 {
        seed(
            &stack,
            "billing.charge",
            &format!("b{i}"),
            json!({"n": i}),
            "card token is None",
        )
        .await;
    }
    let hostile = seed(
        &stack,
        "email.send",
        "e0",
        json!({"html": "<script>alert(1)</script>"}),
        "bad <b>address</b>",
    )
    .await;
    let sqs = support::sqs_client().await;
    for i in 0..2 {
        sqs.send_message()
            .queue_url(&stack.queue_url)
            .message_body(format!(
                "{{\"type\":\"email.send\",\"id\":\"s{i}\",\"payload\":null}}"
            ))
            .send()
            .await
            .unwrap();
    }
    let c = start(&stack, &[], &[]);

    let o = get(&c, "/").await;
    assert_eq!(o.status, 200, "{}", o.body);
    assert!(
        o.body
            .contains("id=\"source-visible\" data-field=\"source.visible\">2<"),
        "{}",
        o.body
    );
    assert!(
        o.body
            .contains("id=\"dlq-visible\" data-field=\"dlq.visible\">4<"),
        "{}",
        o.body
    );
    assert!(o.body.contains("Oldest DLQ failure instead"), "{}", o.body);
    assert!(o.body.contains("<svg id=\"arrivals-chart\""), "{}", o.body);
    // Not `no-referrer`: under it a browser's form POST says `Origin: null`, which the origin
    // check refuses.
    assert_eq!(o.headers["referrer-policy"], "same-origin");
    let csp = o.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );

    let j = get(&c, "/api/overview").await;
    let v: serde_json::Value = serde_json::from_str(&j.body).unwrap();
    assert_eq!(v["source"]["visible"], 2, "{v}");
    assert_eq!(v["dlq"]["visible"], 4, "{v}");

    let d = get(&c, "/dlq").await;
    assert_eq!(d.status, 200);
    assert!(d.body.contains("4 message(s) in 2 group(s)"), "{}", d.body);
    assert!(d.body.contains("card token is None"), "{}", d.body);
    assert!(d.body.contains("bad &lt;b&gt;address&lt;/b&gt;"), "{}", d.body);
    assert!(!d.body.contains("<b>address"), "{}", d.body);

    let g = get(
        &c,
        "/dlq/group?type=billing.charge&class=fatal&error_is=card+token+is+None",
    )
    .await;
    assert_eq!(g.status, 200);
    assert!(g.body.contains("3 message(s)."), "{}", g.body);
    assert_eq!(g.body.matches("class=\"message-link\"").count(), 3, "{}", g.body);

    let m = get(&c, &format!("/dlq/message/{hostile}")).await;
    assert_eq!(m.status, 200, "{}", m.body);
    assert!(
        m.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        m.body
    );
    assert!(!m.body.contains("<script>alert"), "{}", m.body);
    assert!(
        m.body.contains("&lt;img src=x onerror=alert(2)&gt;"),
        "{}",
        m.body
    );
    assert!(!m.body.contains("<img"), "{}", m.body);
    // Reading changed nothing.
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.visible, 4);

    // Bad input: a clear error page, not a panic.
    let bad = get(&c, "/dlq?older_than=soon").await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body.contains("older_than: `soon` is not a duration"),
        "{}",
        bad.body
    );
    let missing = get(&c, "/dlq/message/no-such-id").await;
    assert_eq!(missing.status, 404, "{}", missing.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changes_need_the_csrf_token_the_same_origin_and_our_host() {
    let stack = support::fresh_resources("console-csrf", false).await;
    let c = start(&stack, &[], &[]);
    let ctx = ctx().await;
    let phase = || async {
        breaker::status(&ctx, &stack.table, Some("billing.charge"))
            .await
            .unwrap()
            .breakers[0]
            .phase
            .clone()
    };
    assert_eq!(phase().await, "closed");

    let no_token = post(&c, "/breaker", &[("type", "billing.charge"), ("action", "open")]).await;
    assert_eq!(no_token.status, 403, "{}", no_token.body);
    let confirm = get(&c, "/breaker?type=billing.charge&action=open").await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(
        confirm.body.contains("Nothing changes until you confirm"),
        "{}",
        confirm.body
    );
    let token = csrf(&confirm.body);
    let wrong = post(
        &c,
        "/breaker",
        &[
            ("type", "billing.charge"),
            ("action", "open"),
            ("csrf", "0123456789abcdef0123456789abcdef"),
        ],
    )
    .await;
    assert_eq!(wrong.status, 403);
    // A page of another site posting with a stolen token still fails on its Origin.
    let body = format!("type=billing.charge&action=open&csrf={token}");
    let cross = http(
        "POST",
        &format!("{}/breaker", c.base),
        &[("origin", "http://evil.example")],
        Some(body.clone()),
    )
    .await;
    assert_eq!(cross.status, 403, "{}", cross.body);
    let site = http(
        "POST",
        &format!("{}/breaker", c.base),
        &[("sec-fetch-site", "cross-site")],
        Some(body),
    )
    .await;
    assert_eq!(site.status, 403, "{}", site.body);
    // DNS rebinding: a name that resolves to 127.0.0.1 but is not ours.
    let port = c.base.rsplit(':').next().unwrap();
    let rebound = http(
        "GET",
        &format!("{}/", c.base),
        &[("host", &format!("evil.example:{port}"))],
        None,
    )
    .await;
    assert_eq!(rebound.status, 421, "{}", rebound.body);
    assert_eq!(phase().await, "closed", "a refused request changed the breaker");

    // A browser's own form: its Origin is ours.
    let body = format!("type=billing.charge&action=open&csrf={token}");
    let headers = [("origin", c.base.as_str()), ("sec-fetch-site", "same-origin")];
    let ok = http("POST", &format!("{}/breaker", c.base), &headers, Some(body)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(ok.body.contains("is now open"), "{}", ok.body);
    assert_eq!(phase().await, "open");
    let o = get(&c, "/").await;
    assert!(
        o.body
            .contains("data-breaker=\"billing.charge\" data-part=\"phase\">open<"),
        "{}",
        o.body
    );
    let ok = post(
        &c,
        "/breaker",
        &[("type", "billing.charge"), ("action", "reset"), ("csrf", &token)],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(phase().await, "closed");
    let trail = audited(&ctx, &stack.table, "breaker").await;
    let actions: Vec<&str> = trail.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["breaker.reset", "breaker.open"], "{actions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_group_replay_moves_exactly_the_group() {
    let stack = support::fresh_resources("console-replay", false).await;
    for i in 0..3 {
        seed(
            &stack,
            "billing.charge",
            &format!("b{i}"),
            json!({"n": i}),
            "card token is None",
        )
        .await;
    }
    for i in 0..2 {
        seed(
            &stack,
            "email.send",
            &format!("e{i}"),
            json!(null),
            "smtp refused",
        )
        .await;
    }
    let c = start(&stack, &[], &[]);
    let sqs = support::sqs_client().await;

    let confirm = get(
        &c,
        "/replay?type=billing.charge&class=fatal&error_is=card+token+is+None",
    )
    .await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(
        confirm.body.contains("Replay <strong>3</strong> message(s)"),
        "{}",
        confirm.body
    );
    assert!(confirm.body.contains("id=\"dry-run\""), "{}", confirm.body);
    let ids = hidden_values(&confirm.body, "id");
    assert_eq!(ids.len(), 3);
    // The confirmation page moved nothing.
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.visible, 5);
    assert_eq!(support::queue_depth(&sqs, &stack.queue_url).await.total(), 0);

    let token = csrf(&confirm.body);
    let mut form: Vec<(&str, &str)> = vec![("csrf", &token), ("expected", "3"), ("rate", "50")];
    form.extend(ids.iter().map(|i| ("id", i.as_str())));
    let done = post(&c, "/replay", &form).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("Replayed 3 of the 3"), "{}", done.body);
    assert!(done.body.contains("Recorded in the audit trail"), "{}", done.body);
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.visible, 2);
    let moved = support::read_all(&sqs, &stack.queue_url, 60, 0).await;
    let mut types: Vec<String> = moved
        .iter()
        .map(|m| {
            serde_json::from_str::<serde_json::Value>(m.body().unwrap()).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    types.sort();
    assert_eq!(types, ["billing.charge"; 3]);

    // A purge confirmed for messages that are gone deletes nothing.
    let confirm = get(&c, "/purge?type=email.send").await;
    assert!(
        confirm.body.contains("Delete <strong>2</strong>"),
        "{}",
        confirm.body
    );
    let ids = hidden_values(&confirm.body, "id");
    let mut form: Vec<(&str, &str)> = vec![("csrf", &token), ("expected", "3")];
    form.extend(ids.iter().map(|i| ("id", i.as_str())));
    let refused = post(&c, "/purge", &form).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.visible, 2);
    form[1] = ("expected", "2");
    let purged = post(&c, "/purge", &form).await;
    assert_eq!(purged.status, 200, "{}", purged.body);
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
    let trail = audited(&ctx().await, &stack.table, "dlq").await;
    let actions: Vec<&str> = trail.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["dlq.purge", "dlq.replay"], "{actions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_bind_every_request_needs_the_token() {
    let stack = support::fresh_resources("console-token", false).await;
    let c = start(&stack, &["--bind", "127.0.0.1"], &[]);
    let token = c
        .printed
        .split_once("?token=")
        .expect("the printed URL carries the token")
        .1
        .to_owned();
    assert_eq!(token.len(), 32);
    let refused = get(&c, "/").await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert!(refused.body.contains("needs its token"), "{}", refused.body);
    assert_eq!(get(&c, "/api/overview").await.status, 401);
    let wrong = http(
        "GET",
        &format!("{}/", c.base),
        &[("authorization", "Bearer 0123456789abcdef0123456789abcdef")],
        None,
    )
    .await;
    assert_eq!(wrong.status, 401);
    let bearer = format!("Bearer {token}");
    let ok = http(
        "GET",
        &format!("{}/", c.base),
        &[("authorization", &bearer)],
        None,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    // The printed URL keeps the token in a cookie and drops it from the address.
    let (location, cookie, _) = log_in(&c, &token).await;
    // Another console on this host (another port) keeps a cookie of its own.
    let port = c.base.rsplit(':').next().unwrap();
    assert!(
        cookie.starts_with(&format!("triage_console_token_{port}=")),
        "{cookie}"
    );
    let ok = http(
        "GET",
        &format!("{}{location}/dlq", c.base),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    // A token given by the operator must be long enough.
    let out = support::strict_env(&mut Command::new(BIN))
        .args([
            "console",
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--token",
            "short",
        ])
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16 characters of letters, digits"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_is_previewed_then_replayed_with_the_new_body() {
    let stack = support::fresh_resources("console-edit", false).await;
    let id = seed(
        &stack,
        "report.build",
        "r1",
        json!({"n": 0}),
        "n must be positive",
    )
    .await;
    let c = start(&stack, &[], &[]);
    let sqs = support::sqs_client().await;

    let m = get(&c, &format!("/dlq/message/{id}")).await;
    assert_eq!(m.status, 200, "{}", m.body);
    let token = csrf(&m.body);
    let edited = json!({"type": "report.build", "id": "r1", "payload": {"n": 7}}).to_string();
    let preview = post(
        &c,
        "/edit/preview",
        &[("csrf", &token), ("id", &id), ("body", &edited)],
    )
    .await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    assert!(preview.body.contains("The body changed."), "{}", preview.body);
    assert!(preview.body.contains("&quot;n&quot;: 7"), "{}", preview.body);
    // The preview moved nothing.
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.visible, 1);
    assert_eq!(support::queue_depth(&sqs, &stack.queue_url).await.total(), 0);
    let without = post(&c, "/edit", &[("id", &id), ("body", &edited)]).await;
    assert_eq!(without.status, 403);
    let done = post(&c, "/edit", &[("csrf", &token), ("id", &id), ("body", &edited)]).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("Sent the edited body"), "{}", done.body);
    assert_eq!(support::queue_depth(&sqs, &stack.dlq_url).await.total(), 0);
    let sent = support::read_all(&sqs, &stack.queue_url, 60, 0).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body(), Some(edited.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_shows_the_ledger_first_and_then_parks_the_job() {
    use std::time::Duration;
    use support::pipeline::{Harness, Options, RECORDED, failed_ids};
    // The first retry 10 minutes away: the job waits for it throughout the test.
    let policy = sqs_triage::core::policy::RetryPolicy::builder()
        .max_attempts(5)
        .backoff(sqs_triage::core::backoff::Backoff::exponential(
            Duration::from_secs(600),
            2.0,
            Duration::from_secs(1_200),
            Duration::ZERO,
        ))
        .max_delay(Duration::from_secs(1_200))
        .build()
        .unwrap();
    let h = Harness::build(Options {
        prefix: "console-park",
        policy,
        ..Options::default()
    })
    .await;
    h.send_jobs(&[("p-1", json!({"outcome": "transient"}))]).await;
    let (_, response) = h.invoke_once(Duration::from_secs(5)).await.expect("delivered");
    assert_eq!(failed_ids(&response).len(), 1, "a retry, 10 minutes away");
    let c = start_on(&h.queue_url, &h.dlq_url, &h.table, &[], &[("USER", "ops-alice")]);

    let confirm = get(&c, "/park/confirm?job_id=p-1&reason=vendor+down").await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(
        confirm.body.contains("with the 1 attempt(s) it used"),
        "{}",
        confirm.body
    );
    let unknown = get(&c, "/park/confirm?job_id=nobody").await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let token = csrf(&confirm.body);
    let job_type = hidden_values(&confirm.body, "type").remove(0);
    assert_eq!(job_type, RECORDED);
    let done = post(
        &c,
        "/park",
        &[
            ("csrf", &token),
            ("job_id", "p-1"),
            ("type", &job_type),
            ("reason", "vendor down"),
        ],
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("Parked job p-1."), "{}", done.body);
    assert!(done.body.contains("Recorded in the audit trail"), "{}", done.body);

    // The next delivery dead-letters it as parked, without running it again.
    h.invoke_once(Duration::from_secs(5))
        .await
        .expect("the parked message comes back now");
    assert_eq!(h.executions("p-1"), vec![1]);
    let dlq = h.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    let record =
        sqs_triage::effects::dlq::failure_record(&dlq[0].message_attributes().cloned().unwrap_or_default())
            .expect("a failure record")
            .expect("it parses");
    assert_eq!(record.class, FailureClass::Parked);
    assert!(
        record.error.contains("by ops-alice: vendor down"),
        "{}",
        record.error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_get_reads_nothing_and_max_scan_stays_bounded() {
    let stack = support::fresh_resources("console-xsite", false).await;
    seed(&stack, "billing.charge", "x0", json!(null), "card token is None").await;
    let c = start(&stack, &["--max-scan", "50"], &[]);
    let sqs = support::sqs_client().await;
    // Another site's `<img src=http://127.0.0.1:PORT/dlq>`: the browser marks it cross-site.
    for site in ["cross-site", "same-site"] {
        let r = http(
            "GET",
            &format!("{}/dlq", c.base),
            &[("sec-fetch-site", site)],
            None,
        )
        .await;
        assert_eq!(r.status, 403, "{site}: {}", r.body);
    }
    let d = support::queue_depth(&sqs, &stack.dlq_url).await;
    assert_eq!((d.visible, d.in_flight), (1, 0), "a refused GET read the DLQ");
    let m = sqs
        .receive_message()
        .queue_url(&stack.dlq_url)
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
        )
        .visibility_timeout(0)
        // A long poll: a short one may find nothing on SQS though the message is there.
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let count = m.messages()[0]
        .attributes()
        .unwrap()
        .get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
        .cloned();
    assert_eq!(count.as_deref(), Some("1"), "the DLQ message was received before");
    // The operator's own navigation still works.
    for site in ["same-origin", "none"] {
        let r = http(
            "GET",
            &format!("{}/dlq", c.base),
            &[("sec-fetch-site", site)],
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{site}: {}", r.body);
    }
    let big = get(&c, "/dlq?max_scan=1000000").await;
    assert_eq!(big.status, 400, "{}", big.body);
    assert!(big.body.contains("--max-scan"), "{}", big.body);
    assert_eq!(get(&c, "/dlq?max_scan=50").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_finishes_when_the_browser_goes_away() {
    use tokio::io::AsyncWriteExt;
    let stack = support::fresh_resources("console-gone", false).await;
    for i in 0..4 {
        seed(
            &stack,
            "billing.charge",
            &format!("g{i}"),
            json!({"n": i}),
            "card token is None",
        )
        .await;
    }
    let c = start(&stack, &[], &[]);
    let sqs = support::sqs_client().await;
    let confirm = get(&c, "/replay?type=billing.charge").await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    let ids = hidden_values(&confirm.body, "id");
    assert_eq!(ids.len(), 4);
    let token = csrf(&confirm.body);
    let mut form: Vec<(&str, &str)> = vec![("csrf", &token), ("expected", "4"), ("rate", "1")];
    form.extend(ids.iter().map(|i| ("id", i.as_str())));
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter().copied())
        .finish();
    let addr = c.base.strip_prefix("http://").unwrap().to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "POST /replay HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    // Once the replay has begun (the first message is back in the source queue), the tab closes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while support::queue_depth(&sqs, &stack.queue_url).await.total() == 0 {
        assert!(std::time::Instant::now() < deadline, "the replay never began");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    drop(stream);
    let ctx = ctx().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let src = support::queue_depth(&sqs, &stack.queue_url).await.total();
        let dlq = support::queue_depth(&sqs, &stack.dlq_url).await.total();
        let trail = audited(&ctx, &stack.table, "dlq.replay").await;
        let counts: Vec<Option<u64>> = trail.iter().map(|e| e.count).collect();
        if src == 4 && dlq == 0 && counts == [Some(4)] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replay stopped with the connection: source {src}, DLQ {dlq}, audit counts {counts:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_rate_out_of_bounds_is_refused_and_moves_nothing() {
    let stack = support::fresh_resources("console-rate", false).await;
    seed(&stack, "billing.charge", "r0", json!(null), "card token is None").await;
    let c = start(&stack, &[], &[]);
    let sqs = support::sqs_client().await;
    let confirm = get(&c, "/replay?type=billing.charge").await;
    let ids = hidden_values(&confirm.body, "id");
    let token = csrf(&confirm.body);
    for rate in ["1e-19", "1e9"] {
        let done = post(
            &c,
            "/replay",
            &[
                ("csrf", &token),
                ("expected", "1"),
                ("rate", rate),
                ("id", &ids[0]),
            ],
        )
        .await;
        assert_eq!(done.status, 400, "{rate}: {}", done.body);
        assert!(done.body.contains("rate must be"), "{}", done.body);
    }
    let d = support::queue_depth(&sqs, &stack.dlq_url).await;
    assert_eq!((d.visible, d.in_flight), (1, 0));
    assert_eq!(support::queue_depth(&sqs, &stack.queue_url).await.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_console_answers_to_loopback_names_on_any_port() {
    let stack = support::fresh_resources("console-host", false).await;
    let c = start(&stack, &[], &[]);
    // An SSH tunnel from another local port, and a browser that omits the port (`--port 80`).
    for host in [
        "localhost:9000",
        "localhost",
        "127.0.0.1",
        "[::1]:8443",
        "LOCALHOST:9000",
    ] {
        let r = http("GET", &format!("{}/", c.base), &[("host", host)], None).await;
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
    // The tunnel's form posts with the tunnel's own origin.
    let confirm = get(&c, "/breaker?type=t.x&action=reset").await;
    let body = format!("type=t.x&action=reset&csrf={}", csrf(&confirm.body));
    let headers = [("host", "localhost:9000"), ("origin", "http://localhost:9000")];
    let ok = http("POST", &format!("{}/breaker", c.base), &headers, Some(body)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    for host in [
        "evil.example",
        "evil.example:9000",
        "127.0.0.2:9000",
        "localhost.evil.example",
    ] {
        let r = http("GET", &format!("{}/", c.base), &[("host", host)], None).await;
        assert_eq!(r.status, 421, "{host}: {}", r.body);
    }
}

/// Deletes DLQ message `id` behind the console's back (another operator's purge); the others
/// are made visible again.
async fn delete_behind(sqs: &aws_sdk_sqs::Client, dlq_url: &str, ids: &[&str]) {
    for m in support::read_all(sqs, dlq_url, 60, 0).await {
        let h = m.receipt_handle().unwrap();
        if ids.contains(&m.message_id().unwrap()) {
            sqs.delete_message()
                .queue_url(dlq_url)
                .receipt_handle(h)
                .send()
                .await
                .unwrap();
        } else {
            sqs.change_message_visibility()
                .queue_url(dlq_url)
                .receipt_handle(h)
                .visibility_timeout(0)
                .send()
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_names_what_it_did_not_move_and_a_purge_of_nothing_left_is_a_conflict() {
    let stack = support::fresh_resources("console-gone2", false).await;
    for i in 0..2 {
        seed(
            &stack,
            "billing.charge",
            &format!("m{i}"),
            json!(null),
            "card token is None",
        )
        .await;
    }
    seed(&stack, "email.send", "p0", json!(null), "smtp refused").await;
    let c = start(&stack, &[], &[]);
    let sqs = support::sqs_client().await;

    let confirm = get(&c, "/replay?type=billing.charge").await;
    let ids = hidden_values(&confirm.body, "id");
    assert_eq!(ids.len(), 2);
    let token = csrf(&confirm.body);
    delete_behind(&sqs, &stack.dlq_url, &[&ids[1]]).await;
    let mut form: Vec<(&str, &str)> = vec![("csrf", &token), ("expected", "2")];
    form.extend(ids.iter().map(|i| ("id", i.as_str())));
    let done = post(&c, "/replay", &form).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("Replayed 1 of the 2"), "{}", done.body);
    let problem = done
        .body
        .split("id=\"problem\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no problem shown: {}", done.body));
    let problem = &problem[..problem.find("</p>").unwrap()];
    assert!(problem.contains(&ids[1]), "{problem}");
    assert!(!problem.contains(&ids[0]), "{problem}");

    let confirm = get(&c, "/purge?type=email.send").await;
    let ids = hidden_values(&confirm.body, "id");
    assert_eq!(ids.len(), 1);
    delete_behind(&sqs, &stack.dlq_url, &[&ids[0]]).await;
    let form: Vec<(&str, &str)> = vec![("csrf", &token), ("expected", "1"), ("id", &ids[0])];
    let refused = post(&c, "/purge", &form).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(refused.body.contains("now holds 0"), "{}", refused.body);
}

/// What a browser submits for a form field the page gave: character references decoded, and
/// every line break as CRLF (the HTML form encoding).
fn as_browser_submits(html_text: &str) -> String {
    html_text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
        .replace("\r\n", "\n")
        .replace('\n', "\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untouched_body_survives_a_browser_byte_for_byte() {
    let stack = support::fresh_resources("console-crlf", false).await;
    let original = "\n{\"type\": \"report.build\",\n \"id\": \"r9\",\n \"payload\": {\"s\": \"a&b <c>\"}}\n";
    let id = seed_body(&stack, "report.build", "r9", original, "n must be positive").await;
    let c = start(&stack, &[], &[]);
    let sqs = support::sqs_client().await;
    let m = get(&c, &format!("/dlq/message/{id}")).await;
    assert_eq!(m.status, 200, "{}", m.body);
    let token = csrf(&m.body);
    let start_tag = m.body.find("<textarea").unwrap();
    let open = start_tag + m.body[start_tag..].find('>').unwrap() + 1;
    let close = open + m.body[open..].find("</textarea>").unwrap();
    // The HTML parser drops one newline right after `<textarea>`.
    let shown = &m.body[open..close];
    let shown = shown.strip_prefix('\n').unwrap_or(shown);
    let submitted = as_browser_submits(shown);
    let preview = post(
        &c,
        "/edit/preview",
        &[("csrf", &token), ("id", &id), ("body", &submitted)],
    )
    .await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    assert!(preview.body.contains("The body is unchanged"), "{}", preview.body);
    // The preview's form, as the browser submits it again.
    let mut form: Vec<(String, String)> = Vec::new();
    for name in ["csrf", "id", "body", "force", "lf"] {
        for v in hidden_values(&preview.body, name) {
            form.push((name.to_owned(), as_browser_submits(&v)));
        }
    }
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let done = post(&c, "/edit", &form).await;
    assert_eq!(done.status, 200, "{}", done.body);
    let sent = support::read_all(&sqs, &stack.queue_url, 60, 0).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body(), Some(original), "the replayed body changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_form_is_taken_and_a_too_large_one_gets_an_error_page() {
    let stack = support::fresh_resources("console-large", false).await;
    let id = seed(&stack, "report.build", "l1", json!(null), "too big").await;
    let c = start(&stack, &[], &[]);
    let m = get(&c, &format!("/dlq/message/{id}")).await;
    let token = csrf(&m.body);
    // A 1 MiB body (SQS's largest) of characters that URL-encode to three bytes each.
    let big = "<".repeat(1 << 20);
    let preview = post(
        &c,
        "/edit/preview",
        &[("csrf", &token), ("id", &id), ("body", &big)],
    )
    .await;
    assert_eq!(
        preview.status,
        200,
        "{}",
        &preview.body[..preview.body.len().min(2000)]
    );
    assert!(preview.body.contains("The body changed."));
    let huge = "<".repeat(6 << 20);
    let refused = post(
        &c,
        "/edit/preview",
        &[("csrf", &token), ("id", &id), ("body", &huge)],
    )
    .await;
    assert_eq!(refused.status, 413, "{}", refused.body);
    assert!(refused.body.contains("id=\"error\""), "{}", refused.body);
    assert!(refused.body.contains("16 MiB"), "{}", refused.body);
    assert_eq!(
        support::queue_depth(&support::sqs_client().await, &stack.dlq_url)
            .await
            .total(),
        1
    );
}

/// A page built from a read of the DLQ that stopped at `--max-scan` says so, as `dlq list`
/// does; a read to the end says nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_that_read_the_dlq_says_when_the_read_stopped_at_max_scan() {
    let stack = support::fresh_resources("console-scan", false).await;
    for i in 0..3 {
        seed(
            &stack,
            "billing.charge",
            "same",
            json!({"n": i}),
            "card token is None",
        )
        .await;
    }
    let pages = [
        "/",
        "/dlq",
        "/dlq/group?type=billing.charge&class=fatal",
        "/replay?type=billing.charge",
        "/purge?type=billing.charge",
        "/dlq/message/same",
    ];
    let note = "the read stopped at --max-scan (2 message(s))";
    let c = start(&stack, &["--max-scan", "2"], &[]);
    for page in pages {
        let a = get(&c, page).await;
        assert_eq!(a.status, 200, "{page}: {}", a.body);
        assert!(
            a.body.contains(note),
            "{page} does not say the read stopped:\n{}",
            a.body
        );
    }
    // A selection's own smaller `max_scan` is named too.
    let a = get(&c, "/dlq?max_scan=1").await;
    assert!(
        a.body.contains("the read stopped at --max-scan (1 message(s))"),
        "{}",
        a.body
    );
    drop(c);
    let c = start(&stack, &["--max-scan", "50"], &[]);
    for page in pages {
        let a = get(&c, page).await;
        assert_eq!(a.status, 200, "{page}: {}", a.body);
        assert!(
            !a.body.contains("stopped at --max-scan"),
            "{page} names a limit it did not reach:\n{}",
            a.body
        );
    }
}

/// Opens the printed URL of `c` as a browser does: returns where it was sent, the token's
/// cookie (`name=value`) and that cookie's `Path`.
async fn log_in(c: &Console, token: &str) -> (String, String, String) {
    let first = http("GET", &c.printed, &[], None).await;
    assert_eq!(first.status, 303, "{}", first.body);
    let location = first.headers["location"].to_str().unwrap().to_owned();
    let set = first
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| {
            v.split(';')
                .next()
                .is_some_and(|kv| kv.ends_with(&format!("={token}")))
        })
        .expect("a cookie with the token");
    let attrs: Vec<String> = set.split(';').map(|a| a.trim().to_ascii_lowercase()).collect();
    assert!(attrs.contains(&"httponly".to_owned()), "{set}");
    assert!(attrs.contains(&"samesite=strict".to_owned()), "{set}");
    let path = set
        .split(';')
        .map(str::trim)
        .find_map(|a| a.strip_prefix("Path=").or_else(|| a.strip_prefix("path=")))
        // RFC 6265's default path of a cookie set by `/?token=`.
        .unwrap_or("/")
        .to_owned();
    let cookie = set.split(';').next().unwrap().to_owned();
    (location, cookie, path)
}

/// RFC 6265 (5.1.4): whether a browser sends a cookie whose `Path` is `cookie_path` with a
/// request for `path`. Host-only cookies go to every port of the host.
fn path_match(path: &str, cookie_path: &str) -> bool {
    path == cookie_path
        || (path.starts_with(cookie_path)
            && (cookie_path.ends_with('/') || path[cookie_path.len()..].starts_with('/')))
}

/// Cookies are not isolated by port: a browser sends the console's cookie to any other web
/// server on the same host whose path matches the cookie's. So the cookie is scoped to a
/// random path the console serves under, which no other server is visited at (and which no
/// `Referer` names to another origin), and every link of the console stays under it.
#[tokio::test]
async fn the_token_cookie_never_reaches_another_server_on_this_host() {
    let stack = support::fresh_resources("console-cookie", false).await;
    let c = start(&stack, &["--bind", "127.0.0.1"], &[]);
    let token = c.printed.split_once("?token=").unwrap().1.to_owned();
    let (location, cookie, cookie_path) = log_in(&c, &token).await;
    // Where the operator may open another local server's pages: the cookie is not sent there.
    for elsewhere in [
        "/",
        "/index.html",
        "/login",
        "/dlq",
        "/api/overview",
        "/assets/console.js",
        "/s/",
    ] {
        assert!(
            !path_match(elsewhere, &cookie_path),
            "the browser sends the token to any server on this host at {elsewhere} (cookie Path={cookie_path})"
        );
    }
    assert!(cookie_path.len() >= 20, "a path no one guesses: {cookie_path}");
    assert!(path_match(&location, &cookie_path), "{location} {cookie_path}");
    let home = http(
        "GET",
        &format!("{}{location}", c.base),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(home.status, 200, "{}", home.body);
    let policy = home.headers["referrer-policy"].to_str().unwrap();
    assert!(policy == "same-origin" || policy == "no-referrer", "{policy}");
    // Every link, form and asset of the page stays where the cookie goes, and works with it.
    let mut links = Vec::new();
    for attr in ["href=\"", "action=\"", "src=\""] {
        for (i, _) in home.body.match_indices(attr) {
            let rest = &home.body[i + attr.len()..];
            links.push(rest[..rest.find('"').unwrap()].to_owned());
        }
    }
    assert!(links.len() >= 6, "{links:?}");
    for l in &links {
        let path = l.split('?').next().unwrap();
        assert!(path_match(path, &cookie_path), "{l} is outside {cookie_path}");
    }
    for l in links.iter().filter(|l| !l.contains("breaker")) {
        let got = http(
            "GET",
            &format!("{}{}", c.base, l.replace("&amp;", "&")),
            &[("cookie", &cookie)],
            None,
        )
        .await;
        assert_eq!(got.status, 200, "{l}: {}", got.body);
    }
    // The live refresh asks for `api/overview` under the overview's path.
    let api = http(
        "GET",
        &format!("{}{location}/api/overview", c.base),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(api.status, 200, "{}", api.body);
    assert!(include_str!("../../triage/src/console/assets/console.js").contains("location.pathname"));
    // The prefix with a slash leads to the overview.
    let slash = http(
        "GET",
        &format!("{}{location}/", c.base),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(
        (slash.status, slash.headers["location"].to_str().unwrap()),
        (303, location.as_str())
    );
    // A token cookie sent anywhere else (a cookie a former console set at `/`) is refused.
    let outside = http("GET", &format!("{}/dlq", c.base), &[("cookie", &cookie)], None).await;
    assert_eq!(outside.status, 401, "{}", outside.body);
}
