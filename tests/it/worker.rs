//! The `triage worker --demo-handlers` binary on the local stack: SIGTERM finishes the
//! records in flight and releases the ones not started, without spending their attempts.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::storage_retry::{StorageRetry, dynamodb_client};
use triage::ops::Ctx;

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_in_flight_records_and_releases_the_rest() {
    let sdk = support::sdk_config().await;
    let ctx = Ctx::from_config(&sdk).unwrap();
    let created = support::fresh_resources("worker", false).await;
    for i in 0..10 {
        let body = json!({"type": "triage.chaos", "id": format!("w{i}"), "payload": {"outcome": "ok", "sleep_ms": 3000}});
        ctx.sqs
            .send_message()
            .queue_url(&created.queue_url)
            .message_body(body.to_string())
            .send()
            .await
            .unwrap();
    }

    let mut child = support::strict_env(&mut Command::new(env!("CARGO_BIN_EXE_triage")))
        // One batch in flight: with a second poller, its receive could be in flight at the
        // SIGTERM and take messages with it (documented: they come back after their
        // visibility timeout), which is not what this test looks at.
        .args(["worker", "--demo-handlers", "--batches", "1"])
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_TABLE", &created.table)
        .env("TRIAGE_CONCURRENCY", "2")
        .env("RUST_LOG", "sqs_triage=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("triage worker starts");
    // Wait for the event itself: two handlers have started (the concurrency bound).
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let lines = seen.clone();
    let reader = std::thread::spawn(move || {
        let mut started = 0;
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("handler started") {
                started += 1;
                if started == 2 {
                    let _ = tx.send(());
                }
            }
            lines.lock().unwrap().push(line);
        }
    });
    if rx.recv_timeout(Duration::from_secs(120)).is_err() {
        let _ = child.kill();
        panic!(
            "two handlers never started; worker said:\n{}",
            seen.lock().unwrap().join("\n")
        );
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "worker did not stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "worker exit: {status}");
    reader.join().unwrap();

    // The records in flight (two, the concurrency bound) finished and were deleted; the rest,
    // not started, are visible at once: every job is one or the other.
    let started: std::collections::BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("handler started"))
        .map(|l| {
            let at = l.find("job_id=").unwrap_or_else(|| panic!("no job id: {l}")) + "job_id=".len();
            l[at..].split_whitespace().next().unwrap().to_owned()
        })
        .collect();
    assert_eq!(started.len(), 2, "handlers started: {started:?}");
    let released: std::collections::BTreeSet<String> =
        support::read_all(&ctx.sqs, &created.queue_url, 120, 1)
            .await
            .into_iter()
            .map(|m| {
                let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
                body["id"].as_str().unwrap().to_owned()
            })
            .collect();
    let all: std::collections::BTreeSet<String> = (0..10).map(|i| format!("w{i}")).collect();
    assert!(
        started.is_disjoint(&released),
        "started {started:?}, released {released:?}"
    );
    assert_eq!(
        started
            .union(&released)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        all,
        "started {started:?}, released {released:?}"
    );
    // The finished ones are gone from the queue: it holds only the released ones (held by the
    // read above).
    assert_eq!(
        support::queue_depth(&ctx.sqs, &created.queue_url).await.total(),
        released.len() as u64,
        "the finished records were deleted"
    );
    let ledger = AttemptLedger::new(dynamodb_client(&sdk), &created.table, StorageRetry::default());
    for i in 0..10 {
        assert!(
            ledger.show_all_types(&format!("w{i}")).await.unwrap().is_empty(),
            "w{i}: no attempt recorded"
        );
    }
}
