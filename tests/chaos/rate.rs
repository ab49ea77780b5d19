//! The breaker's failure rate under chaos: two scenarios, run after the others.
//!
//! - **`breaker-noise`**: 300 `triage.chaos` jobs through one `triage worker` process with the
//!   default breaker (60% succeed, 20% fail fatally, 20% fail transiently once, then succeed),
//!   the process killed with SIGKILL after 4 s and started again. Transient failures are a
//!   fifth of the counted executions, under the 50% rate: the breaker item must never open
//!   (stored generation 0 throughout), so no job is ever deferred by it.
//! - **`breaker-outage`**: a steady share of noise (one job in ten fails transiently once, one
//!   in ten fatally) through two in-process workers, and a real outage of the jobs' shared
//!   dependency in the middle. The breaker must open during the outage only: every stored
//!   open or half-open phase begins after the outage starts and before it ends (plus a probe's
//!   time), at least one does, and the breaker is closed at the end.
//!
//! Both account for every job as the other scenarios do (nothing lost).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use serde_json::json;
use sqs_triage::core::breaker::Phase;
use tokio::sync::watch;

use super::{
    Faults, Job, Place, Report, Stack, account, breaker_cycles, feed, max_depth, print_table, report_note,
    sigterm, spawn_worker_process, start_workers, time_limit, watch_breaker,
};

/// The scenarios of this file to run: both, or those `CHAOS_SCENARIOS` names.
fn selected() -> Vec<&'static str> {
    let all = ["breaker-noise", "breaker-outage"];
    match std::env::var("CHAOS_SCENARIOS") {
        Ok(names) if !names.trim().is_empty() => {
            let wanted: Vec<&str> = names.split(',').map(str::trim).collect();
            all.into_iter().filter(|s| wanted.contains(s)).collect()
        }
        _ => all.to_vec(),
    }
}

/// The policy of both: five attempts, short delays; the breaker at its defaults (50% of at
/// least 10 executions in 60 s) for `breaker-noise`, in a 5 s window opening for 3 s, states
/// cached 1 s, for `breaker-outage`.
fn vars(outage: bool) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("TRIAGE_MAX_ATTEMPTS", if outage { "20" } else { "5" }.to_owned()),
        ("TRIAGE_BASE_DELAY_MS", "1000".into()),
        ("TRIAGE_BACKOFF_MULTIPLIER", "2".into()),
        ("TRIAGE_MAX_DELAY_MS", "10000".into()),
        ("TRIAGE_JITTER_MAX_MS", "200".into()),
    ];
    if outage {
        vars.extend([
            ("TRIAGE_BREAKER_WINDOW_S", "5".into()),
            ("TRIAGE_BREAKER_OPEN_S", "3".into()),
            ("TRIAGE_BREAKER_CACHE_MS", "1000".into()),
        ]);
    }
    vars
}

fn job(prefix: &str, i: usize, payload: serde_json::Value, expect: Place) -> Job {
    Job {
        id: format!("{prefix}-{i:05}"),
        ok: expect == Place::Succeeded,
        payload,
        expect,
        alt: None,
        decodes: true,
        exact_body: None,
    }
}

/// 60% succeed, 20% fail fatally, 20% fail transiently once, then succeed.
fn noise_workload(prefix: &str, n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| match i % 5 {
            0..=2 => job(prefix, i, json!({"outcome": "ok"}), Place::Succeeded),
            3 => job(prefix, i, json!({"outcome": "fatal"}), Place::Dlq),
            _ => job(
                prefix,
                i,
                json!({"outcome": "transient", "fail_times": 1}),
                Place::Succeeded,
            ),
        })
        .collect()
}

/// One job in ten fails transiently once, one in ten fatally, the rest succeed; every job's
/// dependency is down during `down` (epoch ms).
fn outage_workload(prefix: &str, n: usize, down: [u64; 2]) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let windows = [down];
            match i % 10 {
                0 => job(
                    prefix,
                    i,
                    json!({"outcome": "transient", "fail_times": 1, "down_windows_ms": windows}),
                    Place::Succeeded,
                ),
                9 => job(
                    prefix,
                    i,
                    json!({"outcome": "fatal", "down_windows_ms": windows}),
                    Place::Dlq,
                ),
                _ => job(
                    prefix,
                    i,
                    json!({"outcome": "ok", "down_windows_ms": windows}),
                    Place::Succeeded,
                ),
            }
        })
        .collect()
}

/// The outage, in seconds after the first job is sent, and how long the producer sends.
const OUTAGE: [u64; 2] = [16, 28];
const OUTAGE_SPAN: Duration = Duration::from_secs(44);
/// How long after the outage's end a stored opening may still begin: the open period and a
/// probe's run (a job that failed just before the end is reported just after it).
const OUTAGE_SLACK: Duration = Duration::from_secs(4);

/// Runs the selected scenarios of this file, printing each one's table; panics when a
/// breaker check fails. Returns their reports for the run's common checks.
pub(crate) async fn run_all() -> Vec<Report> {
    let mut reports = Vec::new();
    for name in selected() {
        let outage = name == "breaker-outage";
        let jobs = if outage { 200 } else { 300 };
        eprintln!("[chaos] {name} ({jobs} jobs) ...");
        let r = run(name, jobs, outage).await;
        eprintln!("[chaos] {name} done in {:.0} s", r.secs);
        print_table(std::slice::from_ref(&r));
        reports.push(r);
    }
    reports
}

async fn run(name: &'static str, n: usize, outage: bool) -> Report {
    let stack = Arc::new(Stack::new(&format!("chaos-{name}"), vars(outage)).await);
    let faults = Faults::start();
    let endpoint = faults.router.url();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (mut tasks, mut child) = (Vec::new(), None);
    if outage {
        tasks = start_workers(&stack, &endpoint, 2, stop_rx.clone()).await.1;
    } else {
        let log = format!("/tmp/chaos-{name}-worker-1.log");
        child = Some(spawn_worker_process(&stack, &faults, &log));
    }
    let started = Instant::now();
    let t0 = sqs_triage::clock::now_ms();
    let down = [t0 + OUTAGE[0] * 1000, t0 + OUTAGE[1] * 1000];
    let jobs = Arc::new(if outage {
        outage_workload(name, n, down)
    } else {
        noise_workload(name, n)
    });
    let watch = tokio::spawn(watch_breaker(stack.clone(), started, stop_rx.clone()));
    let producer = tokio::spawn(feed(
        stack.clone(),
        jobs.clone(),
        0,
        max_depth(),
        outage.then_some(OUTAGE_SPAN),
        Arc::new(AtomicU64::new(0)),
    ));
    let limit = time_limit(jobs.len());
    let (mut killed, mut quiet) = (false, 0);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = started.elapsed();
        if let (false, false, Some(c)) = (outage, killed, child.as_mut()) {
            if elapsed >= Duration::from_secs(4) {
                c.sigkill(&faults.wire);
                killed = true;
                report_note(&format!(
                    "{name}: worker process killed with SIGKILL at {elapsed:?}"
                ));
                let log = format!("/tmp/chaos-{name}-worker-2.log");
                child = Some(spawn_worker_process(&stack, &faults, &log));
            }
        }
        let (visible, in_flight) = stack.depth(&stack.queue_url).await;
        let done = producer.is_finished() && visible == 0 && in_flight == 0 && (outage || killed);
        quiet = if done { quiet + 1 } else { 0 };
        if quiet >= 3 {
            break;
        }
        assert!(
            elapsed < limit,
            "{name}: not settled after {limit:?} (visible {visible}, in flight {in_flight})"
        );
    }
    producer.await.unwrap();
    stop_tx.send(true).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    if let Some(c) = child.as_mut() {
        sigterm(c);
    }
    let seen = watch.await.unwrap();
    let mut report = Report {
        name: name.to_owned(),
        secs: started.elapsed().as_secs_f64(),
        faults: faults.faults(),
        // The SIGKILL of `breaker-noise` can repeat work; the outage is the handler's.
        injects: !outage,
        ..Report::default()
    };
    let (_, _, closed_at_end, periods) = breaker_cycles(&seen);
    report.notes.push(format!(
        "breaker open or half-open {}; {} phase changes seen",
        if periods.is_empty() { "never" } else { &periods },
        seen.len() - 1
    ));
    faults.sqs.clear_faults();
    faults.ddb.clear_faults();
    account(&stack, &jobs, &mut report, &faults.wire).await;

    // Each stored phase change: when it was seen, and the phase.
    let openings: Vec<Duration> = seen
        .windows(2)
        .filter(|w| w[0].1 == Phase::Closed && w[1].1 != Phase::Closed)
        .map(|w| w[1].0)
        .collect();
    if outage {
        let (from, to) = (
            Duration::from_secs(OUTAGE[0]),
            Duration::from_secs(OUTAGE[1]) + OUTAGE_SLACK,
        );
        assert!(
            !openings.is_empty(),
            "{name}: the outage did not open the breaker: {seen:?}"
        );
        assert!(
            openings.iter().all(|at| *at >= from && *at <= to),
            "{name}: the breaker opened outside the outage ({from:?}–{to:?}): {seen:?}"
        );
        assert!(
            closed_at_end,
            "{name}: the breaker is not closed at the end: {seen:?}"
        );
    } else {
        assert_eq!(
            seen.iter().map(|(_, p, g)| (*p, *g)).collect::<Vec<_>>(),
            vec![(Phase::Closed, 0)],
            "{name}: noise under the rate changed the breaker: {seen:?}"
        );
        // No deferral, so every job ran at most twice (its one retry), plus the executions a
        // SIGKILL repeats.
        assert!(
            report.max_executions <= 2 + report.repeated,
            "{name}: a job ran {} times",
            report.max_executions
        );
    }
    report
}
