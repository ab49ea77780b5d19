//! The decision: what happens to one record, as a pure function of what is known about it.
//!
//! Every rule of the product is here. The processor asks twice per record: [`admit`] before
//! the handler, whose [`Verdict`] either runs the record or settles it with its final
//! [`Decision`], and, when it ran, [`conclude`] after, which classifies the handler's error once
//! (by the job type's rules) and turns it into the final decision. A final decision is never
//! "run": the two answers have two types. No I/O happens here: time and randomness come in as
//! arguments.

use std::time::Duration;

use rand::{Rng, RngCore};

use super::error::{ErrorKind, JobError};
use super::failure::FailureClass;
use super::policy::{RetryPolicy, SQS_MAX_VISIBILITY};

/// Time lost between SQS's receive and the moment the record is seen (batching window,
/// invocation start-up); kept off the 12-hour visibility limit so a change is never refused.
pub const RECEIVE_SLACK: Duration = Duration::from_secs(15 * 60);
/// Arrivals this close to their stored `next_attempt_at` count as on time (clock skew between
/// environments).
pub(crate) const ARRIVAL_TOLERANCE: Duration = Duration::from_millis(500);
/// Shortest deferral while the breaker is half-open and has no free probe slot (it waits
/// for the running probe's outcome, see [`Gate::ProbeBusy`]).
pub(crate) const PROBE_BUSY_BASE: Duration = Duration::from_secs(1);

/// What SQS says about this delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFacts {
    /// `ApproximateReceiveCount`: 1 on the first delivery.
    pub receive_count: u32,
    /// When this delivery was received (epoch ms); the 12-hour visibility limit counts from it.
    pub received_at_ms: u64,
    /// The source queue's redrive `maxReceiveCount`, when it has one: SQS moves the message
    /// to the DLQ, without a failure record, on the receive after that many.
    pub receive_limit: Option<u32>,
    /// The latest moment (epoch ms) the message may come back and still be decided: the end
    /// of the queue's retention period for it (`SentTimestamp` + `MessageRetentionPeriod`)
    /// less a margin. SQS deletes it, with no copy anywhere, at the end of that period.
    pub expires_at_ms: Option<u64>,
}

/// What the attempt ledger says about the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ledger {
    /// First delivery: nothing to read, no earlier attempts.
    FirstDelivery,
    /// Read from the ledger (`None`: no item, so no counted attempts).
    Stored(Option<StoredAttempts>),
    /// The ledger could not be read after storage retries: fall back to the receive count.
    /// Its completion marker and a park cannot be seen either.
    Unavailable,
    /// The job's completion marker (job types that opt in): it already succeeded, at
    /// `at_ms` (epoch ms). This delivery is a duplicate and does not run.
    Done {
        /// When it succeeded.
        at_ms: u64,
    },
    /// An operator parked the job (`triage park`) while it waited for its next retry: it
    /// goes to the DLQ, class `parked`, without running.
    Parked {
        /// Handler executions counted before the park.
        attempts: u32,
        /// When it was parked (epoch ms).
        at_ms: u64,
    },
}

/// A job's stored attempt state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoredAttempts {
    /// Handler executions counted so far.
    pub attempts: u32,
    /// The job must not run before this (epoch ms).
    pub next_attempt_at_ms: Option<u64>,
}

/// What the job type's circuit breaker allows for this record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Closed: run.
    Closed,
    /// Half-open and this record holds a probe permit: run.
    Probe,
    /// Open until the given instant (epoch ms).
    Open {
        /// End of the open period.
        until_ms: u64,
    },
    /// Half-open with every probe slot taken.
    ProbeBusy {
        /// When the running probes' outcome can be known (epoch ms): the earliest lease's
        /// end, at most one open period away.
        until_ms: u64,
    },
}

/// Everything the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// What SQS says about this delivery.
    pub record: RecordFacts,
    /// The attempt ledger's view.
    pub ledger: Ledger,
    /// The breaker's view.
    pub gate: Gate,
    /// Time left before the invocation's deadline (`None`: no deadline).
    pub time_left: Option<Duration>,
    /// The job type's policy.
    pub policy: &'a RetryPolicy,
    /// Now (epoch ms).
    pub now_ms: u64,
}

/// Why a record is put back without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferReason {
    /// It came back before its stored `next_attempt_at`.
    EarlyArrival,
    /// The job type's breaker is open.
    BreakerOpen,
    /// The breaker is half-open and no probe slot is free.
    ProbeBusy,
}

impl DeferReason {
    /// A short name for logs and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EarlyArrival => "early arrival",
            Self::BreakerOpen => "breaker open",
            Self::ProbeBusy => "breaker half-open, probe running",
        }
    }
}

/// The answer before the handler: run it, or settle the record without running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run the handler; this is execution number `attempt`.
    Run {
        /// 1 for the first execution.
        attempt: u32,
    },
    /// Not run: the record's final decision (it spends no attempt).
    Decided(Decision),
}

impl Verdict {
    /// True when the handler runs.
    pub fn runs(&self) -> bool {
        matches!(self, Self::Run { .. })
    }
}

/// The answer after the handler: the final decision, and the handler's error as the job
/// type's rules classify it (`None` when it succeeded). The breaker counts by that kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conclusion {
    /// The final decision.
    pub decision: Decision,
    /// The classified error kind, when the handler failed.
    pub error: Option<ErrorKind>,
}

/// What finally happens to a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The handler succeeded: delete the message.
    Done {
        /// Executions including this one.
        attempts: u32,
    },
    /// The job already succeeded (its completion marker says so): delete the message without
    /// running the handler. No attempt spent.
    Duplicate {
        /// When the job succeeded (epoch ms).
        done_at_ms: u64,
    },
    /// Transient failure with attempts left: come back after `delay`.
    Retry {
        /// Executions so far, this one included.
        attempts: u32,
        /// The full retry delay (after the policy's cap).
        delay: Duration,
        /// The visibility timeout to set: `delay`, cut to what SQS allows for this receive.
        visibility: Duration,
        /// The job must not run before this (epoch ms).
        next_attempt_at_ms: u64,
        /// The failure, for the ledger.
        error: String,
    },
    /// Put back without running; no attempt spent.
    Defer {
        /// Why.
        reason: DeferReason,
        /// The visibility timeout to set.
        visibility: Duration,
    },
    /// Too little time left to start: visibility 0, no attempt spent.
    Release,
    /// Send to the DLQ with a failure record, then report success.
    DeadLetter {
        /// Why.
        class: FailureClass,
        /// Handler executions so far.
        attempts: u32,
        /// The error text for the record.
        error: String,
    },
}

impl Decision {
    /// True when this decision spends no attempt.
    pub fn spends_no_attempt(&self) -> bool {
        matches!(self, Self::Defer { .. } | Self::Release | Self::Duplicate { .. })
            || matches!(
                self,
                Self::DeadLetter {
                    class: FailureClass::Invalid | FailureClass::Parked,
                    ..
                }
            )
    }

    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Done { .. } => "succeeded",
            Self::Duplicate { .. } => "duplicate",
            Self::Retry { .. } => "retried",
            Self::Defer { .. } => "deferred",
            Self::Release => "released",
            Self::DeadLetter {
                class: FailureClass::Fatal,
                ..
            } => "dead_lettered_fatal",
            Self::DeadLetter {
                class: FailureClass::Exhausted,
                ..
            } => "dead_lettered_exhausted",
            Self::DeadLetter {
                class: FailureClass::Invalid,
                ..
            } => "dead_lettered_invalid",
            Self::DeadLetter {
                class: FailureClass::Expiring,
                ..
            } => "dead_lettered_expiring",
            Self::DeadLetter {
                class: FailureClass::Parked,
                ..
            } => "dead_lettered_parked",
        }
    }
}

/// Handler executions counted before this delivery.
pub(crate) fn attempts_before(record: RecordFacts, ledger: Ledger) -> u32 {
    match ledger {
        Ledger::FirstDelivery => 0,
        Ledger::Stored(s) => s.map_or(0, |s| s.attempts),
        // Every earlier receive may have run the handler: an upper bound, so nothing retries
        // forever while the ledger is down.
        Ledger::Unavailable => record.receive_count.saturating_sub(1),
        Ledger::Done { .. } => 0,
        Ledger::Parked { attempts, .. } => attempts,
    }
}

/// The longest visibility timeout SQS accepts for this receive at `now_ms`.
pub fn visibility_limit(record: RecordFacts, now_ms: u64) -> Duration {
    let elapsed = Duration::from_millis(now_ms.saturating_sub(record.received_at_ms));
    SQS_MAX_VISIBILITY
        .saturating_sub(elapsed)
        .saturating_sub(RECEIVE_SLACK)
}

/// Rounds up to whole seconds (SQS's unit) and cuts to the limit.
fn visibility(delay: Duration, limit: Duration) -> Duration {
    let secs = delay.as_millis().div_ceil(1000) as u64;
    Duration::from_secs(secs).min(Duration::from_secs(limit.as_secs()))
}

fn jitter(rng: &mut dyn RngCore, max: Duration) -> Duration {
    let ms = max.as_millis() as u64;
    Duration::from_millis(if ms == 0 { 0 } else { rng.random_range(0..ms) })
}

/// The jitter window of a deferral by the breaker for receive `receive_count` of a job that
/// ran `prior` times: the policy's `defer_jitter`, doubled for each earlier receive that did
/// not run (deferred or released), up to the policy's max delay. Deferrals all land at the end
/// of an open period; those that met a reopening there spread wider each time, so the jobs an
/// outage holds back do not keep coming back as one herd into the next open period.
pub fn defer_spread(policy: &RetryPolicy, receive_count: u32, prior: u32) -> Duration {
    let idle = receive_count.saturating_sub(1).saturating_sub(prior);
    let base = policy.defer_jitter();
    base.saturating_mul(1 << idle.min(16))
        .min(policy.max_delay().max(base))
}

/// The decision for a record that is not a runnable job (its envelope does not read, or no
/// handler is registered for its type): dead-lettered at once, class `invalid`, no attempt
/// spent, `reason` in its failure record. Nothing else about the record matters.
pub fn invalid(reason: &str) -> Decision {
    Decision::DeadLetter {
        class: FailureClass::Invalid,
        attempts: 0,
        error: reason.to_owned(),
    }
}

/// Decides, before the handler, whether one runnable job runs. Pure: the same inputs and random
/// draws give the same verdict, and every input gets exactly one.
pub fn admit(inputs: &Inputs<'_>, rng: &mut dyn RngCore) -> Verdict {
    let prior = attempts_before(inputs.record, inputs.ledger);
    // The ledger's facts come first: a finished job is never run again, and a parked one
    // goes to the DLQ whatever else holds (its retry time, the breaker, the time left).
    match inputs.ledger {
        Ledger::Done { at_ms } => {
            return Verdict::Decided(Decision::Duplicate { done_at_ms: at_ms });
        }
        Ledger::Parked { at_ms, .. } => return Verdict::Decided(parked(prior, at_ms)),
        _ => {}
    }
    match before_run(inputs, prior, rng) {
        Ok(attempt) => Verdict::Run { attempt },
        Err(d) => Verdict::Decided(final_rules(inputs, prior, d)),
    }
}

/// The decision for a job an operator parked at `at_ms`: dead-lettered, class `parked`, with
/// the attempts it had used.
pub fn parked(attempts: u32, at_ms: u64) -> Decision {
    Decision::DeadLetter {
        class: FailureClass::Parked,
        attempts,
        error: format!("parked by an operator at {}", rfc3339_ms(at_ms)),
    }
}

/// An epoch-ms instant as RFC 3339 (UTC, seconds).
pub fn rfc3339_ms(at_ms: u64) -> String {
    crate::clock::rfc3339_seconds(at_ms)
}

/// Decides, after the handler ran, what happens to the record: classifies the handler's error
/// by the job type's rules (once) and turns it into the final decision. Pure, like [`admit`].
pub fn conclude(inputs: &Inputs<'_>, outcome: &Result<(), JobError>, rng: &mut dyn RngCore) -> Conclusion {
    let prior = attempts_before(inputs.record, inputs.ledger);
    let (decision, error) = after_run(inputs, prior, outcome, rng);
    Conclusion {
        decision: final_rules(inputs, prior, decision),
        error,
    }
}

/// The rules every final decision passes: the queue's retention, then the last receive.
fn final_rules(inputs: &Inputs<'_>, prior: u32, decision: Decision) -> Decision {
    let decision = within_retention(inputs.record, prior, inputs.now_ms, decision);
    last_receive(inputs.record, prior, decision)
}

/// The queue's retention period must not end while a message waits: a deferral or retry
/// that would bring it back after [`RecordFacts::expires_at_ms`] is shortened to come back
/// by then; with less than a second left, it is dead-lettered (class `expiring`) instead of
/// being deleted by SQS with no copy anywhere.
fn within_retention(record: RecordFacts, prior: u32, now_ms: u64, decision: Decision) -> Decision {
    let Some(expires) = record.expires_at_ms else {
        return decision;
    };
    let room = Duration::from_secs(expires.saturating_sub(now_ms) / 1000);
    let left = |what: String| {
        format!(
            "{what}; the queue's retention period for it ends in {} s",
            expires.saturating_sub(now_ms) / 1000
        )
    };
    match decision {
        Decision::Defer { reason, visibility } if visibility > room => {
            if room.is_zero() {
                Decision::DeadLetter {
                    class: FailureClass::Expiring,
                    attempts: prior,
                    error: left(format!("deferred ({})", reason.as_str())),
                }
            } else {
                Decision::Defer {
                    reason,
                    visibility: room,
                }
            }
        }
        // The retry's own time (not only the visibility, which SQS cuts at 12 h) must come
        // before the end of the retention, or its early arrivals are deferred past it.
        Decision::Retry {
            attempts,
            delay,
            visibility,
            next_attempt_at_ms,
            error,
        } if visibility > room || next_attempt_at_ms > expires => {
            if room.is_zero() {
                Decision::DeadLetter {
                    class: FailureClass::Expiring,
                    attempts,
                    error: left(format!("retry after: {error}")),
                }
            } else {
                // Earlier than the backoff asked for, rather than never.
                Decision::Retry {
                    attempts,
                    delay: delay.min(room),
                    visibility: visibility.min(room),
                    next_attempt_at_ms: next_attempt_at_ms
                        .min(now_ms.saturating_add(room.as_millis() as u64)),
                    error,
                }
            }
        }
        other => other,
    }
}

/// The retention rule again, at `now_ms`, for a decision taken earlier and applied now: a
/// deferral or retry still comes back before the retention ends, or is dead-lettered
/// `expiring` ([`within_retention`]'s rule).
pub(crate) fn retained(record: RecordFacts, prior: u32, now_ms: u64, decision: Decision) -> Decision {
    within_retention(record, prior, now_ms, decision)
}

/// The margin kept before the end of a message's retention period: a tenth of the period, at
/// most a minute (the message must come back, be received and be decided before SQS deletes
/// it).
pub(crate) fn retention_margin(retention: Duration) -> Duration {
    (retention / 10).min(Duration::from_secs(60))
}

/// A record held back without running because an earlier record of its FIFO message group
/// did not finish: released, so it comes back after that one — or, on its last receive,
/// dead-lettered (class `expiring`) rather than left for SQS's redrive to move without a
/// record.
pub(crate) fn held_back(record: RecordFacts, prior: u32) -> Decision {
    last_receive(record, prior, Decision::Release)
}

/// True when SQS will not deliver this message again: its next receive moves it to the DLQ.
pub(crate) fn is_last_receive(record: RecordFacts) -> bool {
    record
        .receive_limit
        .is_some_and(|limit| record.receive_count >= limit)
}

/// On the last receive before SQS's redrive, a decision that leaves the message in its queue
/// (defer, release, retry) would let SQS move it to the DLQ without a failure record: it is
/// dead-lettered here instead, class `expiring`, with what was known.
fn last_receive(record: RecordFacts, prior: u32, decision: Decision) -> Decision {
    if !is_last_receive(record) {
        return decision;
    }
    let limit = record.receive_limit.unwrap_or_default();
    let why = |what: String| {
        format!(
            "{what}; receive {} of the queue's maxReceiveCount {limit}",
            record.receive_count
        )
    };
    match decision {
        Decision::Defer { reason, .. } => Decision::DeadLetter {
            class: FailureClass::Expiring,
            attempts: prior,
            error: why(format!("deferred ({})", reason.as_str())),
        },
        Decision::Release => Decision::DeadLetter {
            class: FailureClass::Expiring,
            attempts: prior,
            error: why("released before it could start".to_owned()),
        },
        Decision::Retry { attempts, error, .. } => Decision::DeadLetter {
            class: FailureClass::Expiring,
            attempts,
            error: why(format!("retry after: {error}")),
        },
        other => other,
    }
}

/// `Ok(attempt)` to run execution number `attempt`, else the decision without running.
fn before_run(inputs: &Inputs<'_>, prior: u32, rng: &mut dyn RngCore) -> Result<u32, Decision> {
    let policy = inputs.policy;
    let limit = visibility_limit(inputs.record, inputs.now_ms);
    if prior >= policy.max_attempts() {
        // Exhausted earlier but still here (its DLQ send failed, or the ledger fallback counts
        // every receive): finish the job now instead of running it again.
        return Err(Decision::DeadLetter {
            class: FailureClass::Exhausted,
            attempts: prior,
            error: format!("no attempts left ({prior} of {} used)", policy.max_attempts()),
        });
    }
    if let Ledger::Stored(Some(StoredAttempts {
        next_attempt_at_ms: Some(at),
        ..
    })) = inputs.ledger
    {
        let early_by = at.saturating_sub(inputs.now_ms);
        if early_by > ARRIVAL_TOLERANCE.as_millis() as u64 {
            return Err(Decision::Defer {
                reason: DeferReason::EarlyArrival,
                visibility: visibility(Duration::from_millis(early_by), limit),
            });
        }
    }
    let spread = || defer_spread(policy, inputs.record.receive_count, prior);
    match inputs.gate {
        Gate::Open { until_ms } => {
            let rest = Duration::from_millis(until_ms.saturating_sub(inputs.now_ms));
            return Err(Decision::Defer {
                reason: DeferReason::BreakerOpen,
                visibility: visibility(rest + jitter(rng, spread()), limit),
            });
        }
        Gate::ProbeBusy { until_ms } => {
            // Asking again before the probe's outcome can be known only spends receives.
            let rest = Duration::from_millis(until_ms.saturating_sub(inputs.now_ms)).max(PROBE_BUSY_BASE);
            return Err(Decision::Defer {
                reason: DeferReason::ProbeBusy,
                visibility: visibility(rest + jitter(rng, spread()), limit),
            });
        }
        Gate::Closed | Gate::Probe => {}
    }
    if inputs.time_left.is_some_and(|left| left < policy.start_margin()) {
        return Err(Decision::Release);
    }
    Ok(prior + 1)
}

/// The decision for the handler's outcome, and the error's kind by the job type's rules.
fn after_run(
    inputs: &Inputs<'_>,
    prior: u32,
    outcome: &Result<(), JobError>,
    rng: &mut dyn RngCore,
) -> (Decision, Option<ErrorKind>) {
    let policy = inputs.policy;
    let attempts = prior.saturating_add(1);
    let err = match outcome {
        Ok(()) => return (Decision::Done { attempts }, None),
        Err(e) => e.clone().reclassified(policy.rules()),
    };
    let kind = err.kind();
    let decision = if kind == ErrorKind::Fatal {
        Decision::DeadLetter {
            class: FailureClass::Fatal,
            attempts,
            error: err.chain(),
        }
    } else if attempts >= policy.max_attempts() {
        Decision::DeadLetter {
            class: FailureClass::Exhausted,
            attempts,
            error: err.chain(),
        }
    } else {
        let delay = policy.retry_delay(attempts, &err, rng);
        Decision::Retry {
            attempts,
            delay,
            visibility: visibility(delay, visibility_limit(inputs.record, inputs.now_ms)),
            next_attempt_at_ms: inputs.now_ms.saturating_add(delay.as_millis() as u64),
            error: err.chain(),
        }
    };
    (decision, Some(kind))
}

#[cfg(test)]
mod ledger_fact_tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn inputs(policy: &RetryPolicy, ledger: Ledger, gate: Gate, receive_count: u32) -> Inputs<'_> {
        Inputs {
            record: RecordFacts {
                receive_count,
                received_at_ms: NOW,
                receive_limit: Some(receive_count),
                expires_at_ms: Some(NOW),
            },
            ledger,
            gate,
            time_left: Some(Duration::ZERO),
            policy,
            now_ms: NOW,
        }
    }

    #[test]
    fn a_completed_job_is_a_duplicate_whatever_else_holds() {
        let policy = RetryPolicy::default();
        // Breaker open, no time left, last receive, retention over: still a duplicate, no
        // attempt spent, no DLQ copy.
        let i = inputs(
            &policy,
            Ledger::Done { at_ms: NOW - 5 },
            Gate::Open { until_ms: NOW + 1 },
            3,
        );
        let v = admit(&i, &mut StdRng::seed_from_u64(1));
        assert_eq!(v, Verdict::Decided(Decision::Duplicate { done_at_ms: NOW - 5 }));
        let Verdict::Decided(d) = v else { unreachable!() };
        assert!(d.spends_no_attempt());
        assert_eq!(d.name(), "duplicate");
    }

    #[test]
    fn a_parked_job_is_dead_lettered_with_its_attempts_before_its_retry_time() {
        let policy = RetryPolicy::default();
        let ledger = Ledger::Parked {
            attempts: 2,
            at_ms: 1_700_000_000_000,
        };
        for gate in [
            Gate::Closed,
            Gate::Open {
                until_ms: NOW + 60_000,
            },
        ] {
            let i = inputs(&policy, ledger, gate, 3);
            match admit(&i, &mut StdRng::seed_from_u64(1)) {
                Verdict::Decided(Decision::DeadLetter {
                    class,
                    attempts,
                    error,
                }) => {
                    assert_eq!((class, attempts), (FailureClass::Parked, 2));
                    assert_eq!(error, "parked by an operator at 2023-11-14T22:13:20Z");
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            attempts_before(inputs(&policy, ledger, Gate::Closed, 9).record, ledger),
            2
        );
        assert!(parked(2, NOW).spends_no_attempt());
        assert_eq!(parked(2, NOW).name(), "dead_lettered_parked");
    }
}
