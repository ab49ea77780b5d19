//! A scripted incident on the local stack, driven through the `triage` CLI with workers
//! running in-process:
//!
//! 50 jobs are sent; a fatal bug hits one job type, whose jobs land in the DLQ; `dlq list`
//! shows them grouped; the bug is "fixed"; `dlq replay --type` moves them back; they succeed,
//! the DLQ is empty, no job is lost or run twice, and every replayed job starts again from
//! attempt 1. Every property is per job: fifty prove them as five hundred would.
//!
//! Needs the local stack: `bash infra/local/stack.sh start` and
//! `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqs_triage::JobError;
use sqs_triage::config::Config;
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::build;
use sqs_triage::runtime::worker::{Worker, WorkerOptions};

const BIN: &str = env!("CARGO_BIN_EXE_triage");
const HEALTHY: &str = "email.send";
const BROKEN: &str = "billing.charge";
const HEALTHY_JOBS: usize = 40;
const BROKEN_JOBS: usize = 10;

struct Stack {
    queue_url: String,
    dlq_url: String,
    table: String,
}

fn triage(stack: Option<&Stack>, args: &[&str], input: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    support::strict_env(&mut cmd);
    cmd.args(args)
        .env_remove("TRIAGE_QUEUE_URL")
        .env_remove("TRIAGE_DLQ_URL")
        .env_remove("TRIAGE_TABLE")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(s) = stack {
        cmd.env("TRIAGE_QUEUE_URL", &s.queue_url)
            .env("TRIAGE_DLQ_URL", &s.dlq_url)
            .env("TRIAGE_TABLE", &s.table);
    }
    let mut child = cmd.spawn().expect("spawn triage");
    if let Some(text) = input {
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().expect("run triage")
}

fn ok_json(o: &Output) -> Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "triage failed ({:?}): {err}", o.status.code());
    assert!(!err.contains("panicked"), "{err}");
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// One handler execution, as the handlers saw it.
#[derive(Debug, Clone, Copy)]
struct Run {
    attempt: u32,
    ok: bool,
    after_fix: bool,
}

type Runs = Arc<Mutex<HashMap<String, Vec<Run>>>>;

fn registry(fixed: Arc<AtomicBool>, runs: Runs) -> Registry {
    let healthy_runs = runs.clone();
    Registry::default()
        .handle(HEALTHY, move |_: Value, ctx: JobContext| {
            let runs = healthy_runs.clone();
            async move {
                let run = Run {
                    attempt: ctx.attempt,
                    ok: true,
                    after_fix: false,
                };
                runs.lock().unwrap().entry(ctx.job_id).or_default().push(run);
                Ok(())
            }
        })
        .handle(BROKEN, move |_: Value, ctx: JobContext| {
            let runs = runs.clone();
            let after_fix = fixed.load(Ordering::SeqCst);
            async move {
                let run = Run {
                    attempt: ctx.attempt,
                    ok: after_fix,
                    after_fix,
                };
                runs.lock().unwrap().entry(ctx.job_id).or_default().push(run);
                if after_fix {
                    Ok(())
                } else {
                    Err(JobError::fatal("billing: card token is None (bug #4711)"))
                }
            }
        })
}

async fn counts(client: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
    let d = support::queue_depth(client, url).await;
    (d.visible, d.in_flight)
}

/// Polls `state` until it reports done; on timeout, fails with the last state seen.
async fn wait_for(what: &str, timeout: Duration, mut state: impl AsyncFnMut() -> (bool, String)) {
    let deadline = Instant::now() + timeout;
    loop {
        let (done, seen) = state().await;
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fatal_bug_is_dead_lettered_then_replayed_after_the_fix() {
    let name = support::unique_name("incident");
    let v = ok_json(&triage(
        None,
        &[
            "setup",
            "--queue",
            &name,
            "--dlq",
            &format!("{name}-dlq"),
            "--table",
            &format!("{name}-t"),
            "--json",
        ],
        None,
    ));
    let stack = Stack {
        queue_url: v["queue_url"].as_str().unwrap().to_owned(),
        dlq_url: v["dlq_url"].as_str().unwrap().to_owned(),
        table: v["table"].as_str().unwrap().to_owned(),
    };
    let sqs = aws_sdk_sqs::Client::new(&support::sdk_config().await);

    // One worker, in-process, over the real processor, one batch in flight: moto's
    // ReceiveMessage takes no lock, so concurrent receives can hand out the same message
    // (a duplicate execution, or a second DLQ copy of a broken job) when the machine is
    // loaded; that is the emulator's, not what this test looks at.
    let fixed = Arc::new(AtomicBool::new(false));
    let runs: Runs = Arc::default();
    let vars = HashMap::from([
        ("TRIAGE_QUEUE_URL", stack.queue_url.clone()),
        ("TRIAGE_DLQ_URL", stack.dlq_url.clone()),
        ("TRIAGE_TABLE", stack.table.clone()),
    ]);
    let config = Config::from_lookup(&|k| vars.get(k).cloned()).expect("config");
    let env = build(
        &config,
        registry(fixed.clone(), runs.clone()),
        &support::sdk_config().await,
    )
    .await
    .expect("worker environment");
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(1),
            max_messages: 10,
            emf: false,
        },
    )
    .with_batches(1);
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let workers = vec![tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        worker.run(shutdown, |_| {}).await
    })];

    // 50 jobs through `triage send`.
    let mut ndjson = String::new();
    for i in 0..HEALTHY_JOBS {
        ndjson += &format!(
            "{}\n",
            json!({"type": HEALTHY, "payload": {"i": i}, "id": format!("e-{i}")})
        );
    }
    for i in 0..BROKEN_JOBS {
        ndjson += &format!(
            "{}\n",
            json!({"type": BROKEN, "payload": {"i": i}, "id": format!("b-{i}")})
        );
    }
    let sent = ok_json(&triage(Some(&stack), &["send", "--json"], Some(&ndjson)));
    assert_eq!(sent["accepted"], HEALTHY_JOBS + BROKEN_JOBS);

    // The bug: every billing job lands in the DLQ after one execution.
    wait_for(
        "the broken jobs to reach the DLQ",
        Duration::from_secs(180),
        async || {
            let (dlq, _) = counts(&sqs, &stack.dlq_url).await;
            let (q, inflight) = counts(&sqs, &stack.queue_url).await;
            let ran = runs.lock().unwrap().len();
            (
                dlq == BROKEN_JOBS as u64 && q == 0 && inflight == 0,
                format!("dlq {dlq}, queue {q} visible + {inflight} in flight, {ran} jobs ran"),
            )
        },
    )
    .await;
    {
        let runs = runs.lock().unwrap();
        for i in 0..HEALTHY_JOBS {
            assert!(
                runs[&format!("e-{i}")].iter().any(|r| r.ok),
                "e-{i} never succeeded"
            );
        }
        for i in 0..BROKEN_JOBS {
            let r = &runs[&format!("b-{i}")];
            assert!(
                r.len() == 1 && !r[0].ok && r[0].attempt == 1,
                "b-{i}: one failed execution: {r:?}"
            );
        }
    }

    // The operator looks.
    let list = ok_json(&triage(Some(&stack), &["dlq", "list", "--json"], None));
    assert_eq!(list["total"], BROKEN_JOBS);
    let groups = list["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{list}");
    assert_eq!(groups[0]["job_type"], BROKEN);
    assert_eq!(groups[0]["class"], "fatal");
    assert_eq!(groups[0]["count"], BROKEN_JOBS);
    assert!(
        groups[0]["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("bug #4711")
    );
    let shown = ok_json(&triage(Some(&stack), &["dlq", "show", "b-7", "--json"], None));
    assert_eq!(
        shown["messages"][0]["record"]["source_queue"],
        stack.queue_url.as_str()
    );

    // A dry run changes nothing.
    let dry = ok_json(&triage(
        Some(&stack),
        &["dlq", "replay", "--type", BROKEN, "--dry-run", "--json"],
        None,
    ));
    assert_eq!(dry["moved"], BROKEN_JOBS);
    assert_eq!(counts(&sqs, &stack.dlq_url).await, (BROKEN_JOBS as u64, 0));

    // The fix ships; the operator replays.
    fixed.store(true, Ordering::SeqCst);
    let replay = ok_json(&triage(
        Some(&stack),
        &["dlq", "replay", "--type", BROKEN, "--json"],
        None,
    ));
    assert_eq!(replay["selected"], BROKEN_JOBS);
    assert_eq!(replay["moved"], BROKEN_JOBS);
    assert_eq!(replay["delete_failed"], 0);
    assert_eq!(replay["targets"][0]["queue_url"], stack.queue_url.as_str());

    wait_for(
        "the replayed jobs to succeed",
        Duration::from_secs(120),
        async || {
            let all_ok = {
                let runs = runs.lock().unwrap();
                (0..BROKEN_JOBS).all(|i| runs[&format!("b-{i}")].iter().any(|r| r.ok))
            };
            let (q, inflight) = counts(&sqs, &stack.queue_url).await;
            (
                all_ok && q == 0 && inflight == 0,
                format!("all replayed ok: {all_ok}, queue {q} visible + {inflight} in flight"),
            )
        },
    )
    .await;
    let _ = stop_tx.send(true);
    for w in workers {
        w.await.unwrap().unwrap();
    }

    assert_eq!(counts(&sqs, &stack.dlq_url).await, (0, 0), "DLQ not empty");
    let after = ok_json(&triage(Some(&stack), &["dlq", "list", "--json"], None));
    assert_eq!(after["total"], 0);

    let runs = runs.lock().unwrap();
    let mut duplicates = 0;
    for i in 0..HEALTHY_JOBS {
        let ok = runs[&format!("e-{i}")].iter().filter(|r| r.ok).count();
        assert!(ok >= 1, "e-{i} lost");
        duplicates += ok - 1;
    }
    for i in 0..BROKEN_JOBS {
        let r = &runs[&format!("b-{i}")];
        let replayed: Vec<&Run> = r.iter().filter(|r| r.after_fix).collect();
        assert!(replayed.iter().any(|r| r.ok), "b-{i} lost: {r:?}");
        assert_eq!(
            replayed[0].attempt, 1,
            "b-{i} did not start again from attempt 1: {r:?}"
        );
        duplicates += replayed.iter().filter(|r| r.ok).count() - 1;
    }
    // At-least-once: a duplicate needs a lost delete or an expired visibility timeout (30 s
    // here, one batch in flight, no fault injected), which this run does not produce.
    assert_eq!(duplicates, 0, "duplicate executions");
}
