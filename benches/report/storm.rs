//! Item 3, retry storm: `jobs` jobs, 10% with a payload bug (fail fatally on every attempt), 10%
//! transient (fail once or twice, then succeed), the rest succeed. Each job is walked through
//! `admit` and `conclude` delivery by delivery; the retry delay is what `conclude` asks for, handler time is 0.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sqs_triage::core::{
    Backoff, Decision, Gate, Inputs, JobError, Ledger, RecordFacts, RetryPolicy, StoredAttempts, Verdict,
    admit, conclude,
};

use super::{Options, Section, median};

#[derive(Clone, Copy)]
enum Job {
    Ok,
    /// Fails transiently on the first `n` attempts.
    Transient(u32),
    /// A payload bug: fails fatally on every attempt.
    Bug,
}

struct Strategy {
    id: &'static str,
    name: &'static str,
    policy: RetryPolicy,
    /// Retry every error, as a policy that does not classify would.
    uniform: bool,
}

fn strategies() -> Vec<Strategy> {
    let uniform = |attempts: u32| {
        RetryPolicy::builder()
            .max_attempts(attempts)
            .build()
            .expect("a valid policy")
    };
    vec![
        Strategy {
            id: "triage",
            name: "sqs-triage: fatal → DLQ at once; transient: 5 attempts, 3 s × 2 + 0–1 s",
            policy: RetryPolicy::default(),
            uniform: false,
        },
        Strategy {
            id: "uniform5",
            name: "uniform retry, same backoff, 5 attempts",
            policy: uniform(5),
            uniform: true,
        },
        Strategy {
            id: "uniform4",
            name: "uniform retry, the seed's example: 4 attempts (3 + 6 + 12 s)",
            policy: uniform(4),
            uniform: true,
        },
        Strategy {
            id: "sidekiq8",
            name: "Sidekiq 8 default: 25 retries, count⁴ + 15 + rand(10·(count+1)) s",
            policy: sidekiq(Backoff::Sidekiq8),
            uniform: true,
        },
        Strategy {
            id: "sidekiq",
            name: "Sidekiq's older documented formula: 25 retries, count⁴ + 15 + rand(10)·(count+1) s",
            policy: sidekiq(Backoff::Sidekiq),
            uniform: true,
        },
    ]
}

/// Sidekiq's default retry count (25 retries) with one of its backoff formulas.
fn sidekiq(backoff: Backoff) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(26)
        .backoff(backoff)
        .max_delay(Duration::from_secs(14 * 24 * 3600))
        .build()
        .expect("a valid policy")
}

fn workload(n: usize, seed: u64) -> Vec<Job> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|i| match i % 10 {
            0 => Job::Bug,
            1 => Job::Transient(rng.random_range(1..=2)),
            _ => Job::Ok,
        })
        .collect()
}

#[derive(Default)]
struct Walk {
    executions: u64,
    bug_executions: u64,
    delay_ms: u64,
    bug_delay_ms: u64,
    bug_to_dlq_s: Vec<f64>,
    transient_to_ok_s: Vec<f64>,
    transient_lost: u64,
}

fn walk(st: &Strategy, jobs: &[Job], seed: u64) -> Walk {
    let mut rng = SmallRng::seed_from_u64(seed);
    let start = 1_700_000_000_000u64;
    let mut w = Walk::default();
    for job in jobs {
        let mut t = start;
        let mut attempts = 0u32;
        loop {
            let ledger = if attempts == 0 {
                Ledger::FirstDelivery
            } else {
                Ledger::Stored(Some(StoredAttempts {
                    attempts,
                    next_attempt_at_ms: Some(t),
                }))
            };
            let inputs = Inputs {
                record: RecordFacts {
                    receive_count: attempts + 1,
                    received_at_ms: t,
                    receive_limit: None,
                    expires_at_ms: None,
                },
                ledger,
                gate: Gate::Closed,
                time_left: None,
                policy: &st.policy,
                now_ms: t,
            };
            // Every delivery of this walk is admitted: no breaker, no deadline, on time.
            let Verdict::Run { attempt } = admit(&inputs, &mut rng) else {
                break;
            };
            let outcome = match job {
                Job::Ok => Ok(()),
                Job::Transient(n) if attempt > *n => Ok(()),
                Job::Transient(_) => Err(JobError::transient("connection reset")),
                Job::Bug if st.uniform => Err(JobError::transient("NullReferenceException")),
                Job::Bug => Err(JobError::fatal("NullReferenceException")),
            };
            w.executions += 1;
            let bug = matches!(job, Job::Bug);
            w.bug_executions += u64::from(bug);
            match conclude(&inputs, &outcome, &mut rng).decision {
                Decision::Retry {
                    attempts: a, delay, ..
                } => {
                    let ms = delay.as_millis() as u64;
                    w.delay_ms += ms;
                    if bug {
                        w.bug_delay_ms += ms;
                    }
                    t += ms;
                    attempts = a;
                }
                Decision::Done { .. } => {
                    if matches!(job, Job::Transient(_)) {
                        w.transient_to_ok_s.push((t - start) as f64 / 1000.0);
                    }
                    break;
                }
                Decision::DeadLetter { .. } => {
                    if bug {
                        w.bug_to_dlq_s.push((t - start) as f64 / 1000.0);
                    } else {
                        w.transient_lost += 1;
                    }
                    break;
                }
                other => unreachable!("unexpected decision {other:?}"),
            }
        }
    }
    w
}

/// Seconds, in the unit a reader wants.
pub fn human(secs: f64) -> String {
    if secs < 0.05 {
        "0 s".into()
    } else if secs < 120.0 {
        format!("{secs:.1} s")
    } else if secs < 7_200.0 {
        format!("{:.1} min", secs / 60.0)
    } else if secs < 172_800.0 {
        format!("{:.1} h", secs / 3_600.0)
    } else {
        format!("{:.1} days", secs / 86_400.0)
    }
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("3. Retry storm");
    let n = opts.jobs;
    let jobs = workload(n, 7);
    let bugs = jobs.iter().filter(|j| matches!(j, Job::Bug)).count();
    let transient = jobs.iter().filter(|j| matches!(j, Job::Transient(_))).count();
    s.line(format!(
        "{n} jobs: {bugs} with a payload bug (fail on every attempt), {transient} transient (fail \
         once or twice, then succeed), the rest succeed at once. Every delivery goes through \
         `admit` and `conclude`; delays are the policy's (seeded jitter), handler time is taken as 0."
    ));
    s.line(String::new());
    s.header(&[
        "policy",
        "executions",
        "on bugs",
        "retry delay spent (all jobs)",
        "of it on bugs",
        "bug → DLQ (median / max)",
        "transient → success (median)",
    ]);
    for st in strategies() {
        let mut w = walk(&st, &jobs, 11);
        let bug_med = median(&mut w.bug_to_dlq_s);
        let bug_max = w.bug_to_dlq_s.iter().copied().fold(0.0, f64::max);
        let tr = median(&mut w.transient_to_ok_s);
        s.row(&[
            st.name.into(),
            w.executions.to_string(),
            w.bug_executions.to_string(),
            human(w.delay_ms as f64 / 1000.0),
            human(w.bug_delay_ms as f64 / 1000.0),
            format!("{} / {}", human(bug_med), human(bug_max)),
            if w.transient_lost > 0 {
                format!("{} ({} exhausted)", human(tr), w.transient_lost)
            } else {
                human(tr)
            },
        ]);
        s.value(&format!("storm.{}.executions", st.id), w.executions as f64);
        s.value(
            &format!("storm.{}.bug_executions", st.id),
            w.bug_executions as f64,
        );
        s.value(
            &format!("storm.{}.bug_delay_s", st.id),
            w.bug_delay_ms as f64 / 1000.0,
        );
        s.value(&format!("storm.{}.bug_to_dlq_s", st.id), bug_med);
    }
    s
}
