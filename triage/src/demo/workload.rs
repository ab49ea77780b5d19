//! The demo: a mixed `triage.chaos` workload through the worker on whatever endpoint the AWS
//! variables select (the local stack in the README), and a report of what happened.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::ops::Ctx;
use crate::ops::setup::{SetupOptions, SetupReport, setup};
use sqs_triage::config::Config;
use sqs_triage::core::backoff::Backoff;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::policy::RetryPolicy;
use sqs_triage::core::{Decision, FailureClass};
use sqs_triage::effects::sqs::Outgoing;
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::RuntimeError;
use sqs_triage::runtime::env::{build, init_tracing, install_panic_hook, sdk_config};
use sqs_triage::runtime::worker::{Worker, WorkerOptions};

/// Options of `triage demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Jobs of each kind to send.
    pub jobs_per_kind: usize,
}

/// The kinds of job the demo sends: (name, body maker). `None` payload means a raw body.
fn kinds() -> Vec<(&'static str, Option<serde_json::Value>)> {
    vec![
        ("ok", Some(json!({"outcome": "ok"}))),
        ("fatal", Some(json!({"outcome": "fatal"}))),
        ("panic", Some(json!({"outcome": "panic"}))),
        (
            "transient-then-ok",
            Some(json!({"outcome": "transient", "fail_times": 2})),
        ),
        (
            "throttled-then-ok",
            Some(json!({"outcome": "throttle", "fail_times": 1, "retry_after_ms": 1500})),
        ),
        ("always-transient", Some(json!({"outcome": "transient"}))),
        ("malformed", None),
    ]
}

#[derive(Debug, Default, Clone)]
struct Track {
    kind: &'static str,
    executions: u32,
    first_failure: Option<Instant>,
    settled: Option<(Instant, String)>,
    delays: Vec<Duration>,
}

/// The demo's policy: the seed's shape, scaled down so the whole run takes seconds.
fn demo_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(4)
        .backoff(Backoff::exponential(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(8),
            Duration::from_millis(500),
        ))
        .max_delay(Duration::from_secs(8))
        .build()
        .expect("a valid policy")
}

/// Runs the demo against fresh resources and prints the report.
pub async fn main_from_env(opts: DemoOptions) -> Result<(), RuntimeError> {
    init_tracing();
    let mut config = Config::from_env()?;
    let panics = quiet_deliberate_panics(config.log_payloads);
    let sdk = sdk_config().await;
    let ctx = Ctx::from_config(&sdk)?;
    let created = demo_resources(&ctx).await?;
    config.queue_url = Some(created.queue_url.clone());
    config.dlq_url = Some(created.dlq_url.clone());
    config.table = Some(created.table.clone());
    // The demo shows per-job triage; its always-failing jobs would otherwise open the shared
    // breaker of the one chaos job type and defer everything else.
    let breaker = BreakerConfig::builder().min_executions(100_000).build()?;
    let registry = super::chaos::register(Registry::new(demo_policy(), breaker), demo_policy(), breaker);
    let env = build(&config, registry, &sdk).await?;
    let worker = Worker::new(
        env,
        WorkerOptions {
            wait: Duration::from_secs(1),
            ..WorkerOptions::default()
        },
    );
    let jobs_per_kind = opts.jobs_per_kind.max(1);
    let (mut tracks, total) = send_workload(&worker, &created.queue_url, jobs_per_kind).await?;
    // The worker reads its queue's visibility timeout once; read it before counting calls,
    // so the table shows the calls the jobs cost.
    worker
        .visibility_timeout()
        .await
        .map_err(|e| format!("cannot read the demo queue's visibility timeout: {e}"))?;
    worker.env().calls.reset();
    println!(
        "sent {total} jobs ({jobs_per_kind} of each kind); running the worker until every job settles...\n"
    );

    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    let malformed_expected = jobs_per_kind;
    let malformed_settled = run_until_settled(&worker, &mut tracks, malformed_expected, deadline).await?;
    let elapsed = started.elapsed();
    print!(
        "{}",
        report(
            &tracks,
            malformed_settled,
            malformed_expected,
            elapsed,
            &worker,
            total
        )
    );
    println!(
        "\n{} handler panic(s) on purpose (the `panic` jobs): each failed its own job alone, fatally; \
         RUST_LOG=sqs_triage=debug logs them",
        panics.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!(
        "\ninspect the DLQ with:\n  TRIAGE_DLQ_URL={} TRIAGE_TABLE={} cargo run -q --bin triage -- dlq list",
        created.dlq_url, created.table
    );
    let unsettled = tracks.values().filter(|t| t.settled.is_none()).count()
        + malformed_expected.saturating_sub(malformed_settled);
    if unsettled > 0 {
        return Err(format!("{unsettled} jobs did not settle within {:?}", deadline - started).into());
    }
    Ok(())
}

/// Creates the demo's queue, DLQ and table, named after the time, and says which.
async fn demo_resources(ctx: &Ctx) -> Result<SetupReport, RuntimeError> {
    let stamp = sqs_triage::clock::now_ms() % 1_000_000_000;
    let created = setup(
        ctx,
        &SetupOptions {
            queue: format!("triage-demo-{stamp}"),
            dlq: format!("triage-demo-{stamp}-dlq"),
            table: format!("triage-demo-{stamp}"),
            fifo: false,
            max_receive_count: 100,
        },
    )
    .await?;
    println!(
        "demo resources: queue {}  dlq {}  table {}",
        created.queue_url, created.dlq_url, created.table
    );
    Ok(created)
}

/// Sends `jobs_per_kind` jobs of each kind; returns the tracks of the jobs with an id (all
/// but the malformed ones) and how many were sent.
async fn send_workload(
    worker: &Worker,
    queue_url: &str,
    jobs_per_kind: usize,
) -> Result<(HashMap<String, Track>, usize), RuntimeError> {
    let mut tracks: HashMap<String, Track> = HashMap::new();
    let mut outgoing = Vec::new();
    for (kind, payload) in kinds() {
        for n in 0..jobs_per_kind {
            let id = format!("demo-{kind}-{n}");
            let body = match &payload {
                Some(p) => json!({"type": super::chaos::CHAOS, "id": id, "payload": p}).to_string(),
                None => format!("{{not json: {id}"),
            };
            outgoing.push(Outgoing {
                key: outgoing.len(),
                body,
                attributes: HashMap::new(),
                group_id: None,
                dedup_id: None,
                delay_seconds: None,
            });
            if payload.is_some() {
                tracks.insert(
                    id,
                    Track {
                        kind,
                        ..Track::default()
                    },
                );
            }
        }
    }
    let total = outgoing.len();
    let sent = worker.env().processor.sqs().send(queue_url, outgoing, None).await;
    if !sent.failed.is_empty() {
        return Err(format!(
            "{} of {total} demo messages were not accepted: {:?}",
            sent.failed.len(),
            sent.failed[0]
        )
        .into());
    }
    Ok((tracks, total))
}

/// Runs the worker until every tracked job and the malformed ones are settled, or until
/// `deadline`; fills in the tracks and returns how many malformed jobs were settled.
async fn run_until_settled(
    worker: &Worker,
    tracks: &mut HashMap<String, Track>,
    malformed_expected: usize,
    deadline: Instant,
) -> Result<usize, RuntimeError> {
    let mut malformed_settled = 0usize;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut stop_tx = Some(stop_tx);
    let run = worker.run(
        async {
            tokio::select! {
                _ = stop_rx => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        },
        |outcome| {
            let now = Instant::now();
            for r in &outcome.records {
                let Some(t) = tracks.get_mut(&r.job_id) else {
                    if r.settled {
                        malformed_settled += 1;
                    }
                    continue;
                };
                t.executions += u32::from(r.executed);
                if r.executed && !matches!(r.decision, Decision::Done { .. }) && t.first_failure.is_none() {
                    t.first_failure = Some(now);
                }
                if let Decision::Retry { delay, .. } = &r.decision {
                    t.delays.push(*delay);
                }
                if r.settled && t.settled.is_none() {
                    t.settled = Some((now, r.decision.name().to_owned()));
                }
            }
            if tracks.values().all(|t| t.settled.is_some()) && malformed_settled >= malformed_expected {
                if let Some(tx) = stop_tx.take() {
                    let _ = tx.send(());
                }
            }
        },
    );
    run.await?;
    Ok(malformed_settled)
}

/// Installs the panic hook the worker and `triage-lambda` use (one masked line through
/// `tracing`, no backtrace), except for the demo's own `panic` jobs: their handler panics on
/// purpose, so each is counted for the report and logged at debug level only, instead of
/// printing a panic per job (and, with `RUST_BACKTRACE=1`, a backtrace) before the report.
fn quiet_deliberate_panics(log_payloads: bool) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
    install_panic_hook(log_payloads);
    let runtime_hook = std::panic::take_hook();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = count.clone();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        let deliberate = text.is_some_and(|t| t.starts_with(super::chaos::PANIC_PREFIX))
            && info.location().is_some_and(|l| l.file().ends_with("chaos.rs"));
        if !deliberate {
            return runtime_hook(info);
        }
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!("a `panic` job's handler panicked, as it does on purpose");
    }));
    count
}

/// The demo's report: the outcome per kind, the time to the DLQ, the retry delays and the
/// AWS calls, as markdown tables.
fn report(
    tracks: &HashMap<String, Track>,
    malformed_settled: usize,
    malformed_expected: usize,
    elapsed: Duration,
    worker: &Worker,
    total: usize,
) -> String {
    let mut out = String::new();
    outcome_table(
        &mut out,
        tracks,
        malformed_settled.min(malformed_expected),
        elapsed,
        total,
    );
    dlq_time_table(&mut out, tracks);
    delay_table(&mut out, tracks);
    calls_table(&mut out, worker, total);
    out
}

/// The final outcome of each kind's jobs, and their handler executions.
fn outcome_table(
    out: &mut String,
    tracks: &HashMap<String, Track>,
    malformed: usize,
    elapsed: Duration,
    total: usize,
) {
    let mut by_kind: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut execs: BTreeMap<&str, u32> = BTreeMap::new();
    for t in tracks.values() {
        let outcome = t
            .settled
            .as_ref()
            .map_or("unsettled".to_owned(), |(_, d)| d.clone());
        *by_kind.entry(t.kind).or_default().entry(outcome).or_default() += 1;
        *execs.entry(t.kind).or_default() += t.executions;
    }
    by_kind
        .entry("malformed")
        .or_default()
        .insert("dead_lettered_invalid".into(), malformed);
    let _ = writeln!(
        out,
        "## Final outcome per kind ({total} jobs, settled in {:.1} s)\n",
        elapsed.as_secs_f64()
    );
    let _ = writeln!(out, "| kind | final outcome | jobs | handler executions |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for (kind, outcomes) in &by_kind {
        for (o, n) in outcomes {
            let _ = writeln!(
                out,
                "| {kind} | {o} | {n} | {} |",
                execs.get(kind).copied().unwrap_or(0)
            );
        }
    }
}

/// The time from a job's first failure to its DLQ copy, per failure class.
fn dlq_time_table(out: &mut String, tracks: &HashMap<String, Track>) {
    let _ = writeln!(out, "\n## Time from first failure to the DLQ\n");
    let _ = writeln!(out, "| class | jobs | median | max |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for (class, names) in [
        (FailureClass::Fatal, vec!["fatal", "panic"]),
        (FailureClass::Exhausted, vec!["always-transient"]),
    ] {
        let mut times: Vec<Duration> = tracks
            .values()
            .filter(|t| names.contains(&t.kind))
            .filter_map(|t| Some(t.settled.as_ref()?.0.saturating_duration_since(t.first_failure?)))
            .collect();
        times.sort();
        if let (Some(mid), Some(max)) = (times.get(times.len() / 2), times.last()) {
            let _ = writeln!(
                out,
                "| {class} | {} | {:.2} s | {:.2} s |",
                times.len(),
                mid.as_secs_f64(),
                max.as_secs_f64()
            );
        }
    }
}

/// The range of each retry's delay, per kind that retried.
fn delay_table(out: &mut String, tracks: &HashMap<String, Track>) {
    let _ = writeln!(
        out,
        "\n## Retry delays applied (policy: 1 s × 2, max 8 s, jitter ≤ 0.5 s, 4 attempts)\n"
    );
    let _ = writeln!(out, "| kind | retry 1 | retry 2 | retry 3 |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    let mut kinds: Vec<&str> = tracks
        .values()
        .filter(|t| !t.delays.is_empty())
        .map(|t| t.kind)
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    for kind in kinds {
        let mut cols = Vec::new();
        for n in 0..3 {
            let ds: Vec<f64> = tracks
                .values()
                .filter(|t| t.kind == kind)
                .filter_map(|t| t.delays.get(n))
                .map(Duration::as_secs_f64)
                .collect();
            cols.push(
                match (
                    ds.iter().copied().reduce(f64::min),
                    ds.iter().copied().reduce(f64::max),
                ) {
                    (Some(lo), Some(hi)) => format!("{lo:.2}–{hi:.2} s"),
                    _ => "—".into(),
                },
            );
        }
        let _ = writeln!(out, "| {kind} | {} |", cols.join(" | "));
    }
}

/// The AWS calls the worker made, per operation and per job.
fn calls_table(out: &mut String, worker: &Worker, total: usize) {
    let calls = worker.env().calls.snapshot();
    let all: u64 = calls.values().sum();
    let _ = writeln!(
        out,
        "\n## AWS calls made by the worker ({all} in all, {:.2} per job)\n",
        all as f64 / total as f64
    );
    let _ = writeln!(out, "| operation | calls | per job |");
    let _ = writeln!(out, "| --- | --- | --- |");
    for (op, n) in &calls {
        let _ = writeln!(out, "| {op} | {n} | {:.2} |", *n as f64 / total as f64);
    }
}
