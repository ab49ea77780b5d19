//! `triage worker --http`: every job POSTed to a handler written in another language (a small
//! Python server, tests/http/handler.py), its answer classified, on the local stack.

use crate::edge_worker::{exited_within, send, sigterm, spawn_worker};
use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqs_triage::core::failure::FailureClass;

const TYPE: &str = "billing.charge";

/// The Python handler, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server() -> Server {
    let script = support::repo_root().join("tests/http/handler.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs the handler");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("the handler prints its port");
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no port: {line:?}"));
    Server { child, port }
}

/// Every job request the handler received.
fn log(port: u16) -> Vec<Value> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /log HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The requests for each job id, in order.
fn by_job(log: &[Value]) -> HashMap<String, Vec<Value>> {
    let mut out: HashMap<String, Vec<Value>> = HashMap::new();
    for e in log {
        let id = e["x-triage-job-id"].as_str().unwrap_or_default().to_owned();
        out.entry(id).or_default().push(e.clone());
    }
    out
}

/// Every row of the decision table through one `triage worker --http` process: success,
/// a 4xx dead-lettered at once with its record, a 5xx retried with backoff, a 429 retried
/// after its `Retry-After`, a handler that does not answer in time retried, and a job type
/// the worker was not given dead-lettered `invalid` without a request.
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_behind_http_gets_every_outcome_of_the_decision_table() {
    let created = support::fresh_resources("http-dispatch", false).await;
    let srv = server();
    let url = format!("http://127.0.0.1:{}/jobs", srv.port);
    let jobs = [
        ("ok1", json!({"outcome": "ok"})),
        ("bad1", json!({"outcome": "fatal"})),
        ("flaky1", json!({"outcome": "transient"})),
        ("later1", json!({"outcome": "retry_after", "seconds": 3})),
        ("hang1", json!({"outcome": "hang"})),
        // A success whose body never ends is a success: run once.
        ("slow1", json!({"outcome": "slow_body"})),
    ];
    for (id, payload) in &jobs {
        send(
            &created.queue_url,
            json!({"type": TYPE, "id": id, "payload": payload}),
        )
        .await;
    }
    send(
        &created.queue_url,
        json!({"type": "other.type", "id": "stray1", "payload": {}}),
    )
    .await;
    let (mut worker, lines) = spawn_worker(
        &created,
        &["--http", &url, "--types", TYPE, "--http-timeout", "2s"],
        &[("TRIAGE_BASE_DELAY_MS", "500"), ("TRIAGE_JITTER_MAX_MS", "0")],
    );

    // Until every job has settled: the expected requests made, both DLQ copies there and the
    // queue empty.
    let sqs = support::sqs_client().await;
    let want = [
        ("ok1", 1),
        ("bad1", 1),
        ("flaky1", 2),
        ("later1", 2),
        ("hang1", 2),
        ("slow1", 1),
    ];
    let start = Instant::now();
    let requests = loop {
        let seen = by_job(&log(srv.port));
        let counts_met = want.iter().all(|(id, n)| seen.get(*id).map_or(0, Vec::len) >= *n);
        let queue = support::queue_depth(&sqs, &created.queue_url).await;
        let dlq = support::queue_depth(&sqs, &created.dlq_url).await;
        if counts_met && queue.total() == 0 && dlq.total() == 2 {
            break seen;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not settled: requests {seen:?}, queue {queue:?}, DLQ {dlq:?}\n{}",
            lines.text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for (id, n) in want {
        assert_eq!(requests[id].len(), n, "{id}: {:?}", requests[id]);
    }
    assert!(!requests.contains_key("stray1"), "a type not served was sent");

    // What each request carried.
    for (id, reqs) in &requests {
        for (k, r) in reqs.iter().enumerate() {
            assert_eq!(r["path"], "/jobs");
            assert_eq!(r["content_type"], "application/json");
            assert_eq!(r["x-triage-job-type"], TYPE, "{id}");
            assert_eq!(r["x-triage-attempt"], (k + 1).to_string(), "{id}");
            assert_eq!(r["x-triage-max-attempts"], "5", "{id}");
            assert!(r["x-triage-message-id"].as_str().is_some_and(|m| !m.is_empty()));
            let at = r["at_ms"].as_u64().unwrap();
            let deadline: u64 = r["x-triage-deadline-ms"].as_str().unwrap().parse().unwrap();
            // The worker's own deadline moves with the heartbeat: the wait is --http-timeout.
            assert!(
                deadline >= at + 1_000 && deadline <= at + 2_500,
                "{id}: deadline {deadline}, at {at}"
            );
        }
        let payload = &jobs.iter().find(|(j, _)| j == id).unwrap().1;
        assert_eq!(&reqs[0]["payload"], payload, "the payload as sent");
    }
    // The 429's second attempt waited for its Retry-After (3 s), not the 0.5 s backoff.
    let gap =
        |id: &str| requests[id][1]["at_ms"].as_u64().unwrap() - requests[id][0]["at_ms"].as_u64().unwrap();
    assert!(
        gap("later1") >= 3_000,
        "Retry-After not honoured: {} ms",
        gap("later1")
    );
    // The handler that did not answer failed by the timeout: its retry came after the 2 s
    // wait, and the worker said why.
    assert!(gap("hang1") >= 2_000, "hang1 retried after {} ms", gap("hang1"));
    assert!(
        lines.text().lines().any(|l| l.contains("retry scheduled")
            && l.contains("no answer from")
            && l.contains("within 2s")),
        "no timeout logged:\n{}",
        lines.text()
    );

    // The DLQ: the 4xx as fatal with the answer in its record, the stray type as invalid.
    let copies = support::read_all(&sqs, &created.dlq_url, 60, 1).await;
    let mut records: HashMap<String, (FailureClass, String)> = HashMap::new();
    for m in &copies {
        let r = sqs_triage::effects::dlq::failure_record(m.message_attributes().unwrap())
            .expect("a failure record")
            .unwrap();
        records.insert(r.job_id.clone(), (r.class, r.error.clone()));
    }
    assert_eq!(records["bad1"].0, FailureClass::Fatal, "{records:?}");
    assert!(
        records["bad1"]
            .1
            .contains("HTTP 400: bad payload: no such account"),
        "{records:?}"
    );
    assert_eq!(records["stray1"].0, FailureClass::Invalid, "{records:?}");

    sigterm(&worker.0);
    let status = exited_within(&mut worker.0, Duration::from_secs(30)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", lines.text());
}

/// `--http` without the job types it serves, or with a URL it cannot use, refuses to start
/// with a usage error (exit 2), before receiving anything.
#[tokio::test(flavor = "multi_thread")]
async fn http_dispatch_refuses_to_start_without_types_or_with_a_bad_url() {
    let created = support::fresh_resources("http-refuse", false).await;
    for (args, needle) in [
        (vec!["--http", "http://127.0.0.1:9/jobs"], "--types"),
        (
            vec!["--http", "https://example.com/jobs", "--types", TYPE],
            "https is not supported",
        ),
        (
            vec![
                "--http",
                "http://127.0.0.1:9/",
                "--types",
                TYPE,
                "--demo-handlers",
            ],
            "cannot be used with",
        ),
    ] {
        let (mut child, lines) = spawn_worker(&created, &args, &[]);
        let status = exited_within(&mut child.0, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{args:?} ran:\n{}", lines.text()));
        assert_eq!(status.code(), Some(2), "{args:?}:\n{}", lines.text());
        assert!(
            lines.text().contains(needle),
            "{args:?}: missing `{needle}`:\n{}",
            lines.text()
        );
    }
}
