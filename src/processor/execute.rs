//! Step 4, execute: the plan's effects, each kind batched. DLQ copies first (their answers
//! decide which records are settled and which executions must be counted because they stay),
//! then visibility changes, counts, breaker reports and ledger deletes together, then this
//! environment's memory of lost counts, then the per-record reports and their log lines.
//! Everything ends by the effects margin before the deadline, so the batch response still goes
//! out in time.

use std::collections::BTreeMap;

use tokio::time::Instant;
use tracing::level_filters::LevelFilter;
use tracing::{info_span, warn};

use super::plan::{Plan, Step};
use super::{BatchOutcome, Deadline, Processor, loggable};
use crate::core::Decision;
use crate::core::breaker::{Aggregate, BreakerState};
use crate::core::breaker::Phase;
use crate::effects::ledger::{Batched, Count, Delivery, Waiting, Written};
use crate::effects::storage_retry::StorageError;
use aws_sdk_dynamodb::types::BatchStatementRequest;

impl Processor {
    /// Step 4: performs `plan`.
    pub(super) async fn execute(&self, plan: Plan, deadline: Deadline) -> BatchOutcome {
        let deadline = deadline.effects_end();
        let Plan {
            mut steps,
            breaker_reports,
            mut metrics,
            now_ms,
        } = plan;
        // The DLQ's answers decide which records are settled, so the copies go first.
        self.send_copies(&mut steps, deadline).await;
        let (lost, opened) = self.write_effects(&steps, &breaker_reports, now_ms, deadline).await;
        for t in opened {
            metrics.add(t, "BreakerOpened", 1);
        }
        self.remember_counts(&steps, &lost);
        for s in steps.iter().filter(|s| s.effects.unrecorded) {
            tracing::error!(message_id = %s.record.inc.message_id, job_id = %s.record.job_id, "last receive and the DLQ refused the copy: SQS's redrive will move the message without a failure record");
            metrics.add(s.record.dimension(), "ExpiringUnrecorded", 1);
        }

        let (records, whole_batch_failed) = self.record_reports(steps);
        BatchOutcome {
            records,
            metrics,
            whole_batch_failed,
            visible_until: None,
            deleted: Vec::new(),
        }
    }

    /// Every effect after the DLQ's answers, side by side: visibility changes, the ledger's
    /// counts and deletes, completion markers and breaker reports. A breaker report that only
    /// adds to a counting window rides in the ledger's batched write; the others are written
    /// on their own. Returns the steps whose count could not be written and the job types
    /// whose breaker a report opened.
    async fn write_effects<'a>(
        &self,
        steps: &[Step],
        breaker_reports: &'a BTreeMap<String, Aggregate>,
        now_ms: u64,
        deadline: Option<Instant>,
    ) -> (Vec<usize>, Vec<&'a str>) {
        let visibility = self.visibility_changes(steps);
        let done = done_markers(steps);
        let forget = forgotten(steps, &done);
        // Each report carries this environment's executions not yet reported, when it is made
        // (see `BreakerStore::with_unreported`).
        let breaker_reports: Vec<_> = breaker_reports
            .iter()
            .filter_map(|(t, a)| {
                let b = self.breakers.get(t)?;
                Some((t.as_str(), b, b.with_unreported(t, a, now_ms)))
            })
            .collect();
        let mut folded = Vec::new();
        let mut direct = Vec::new();
        for (t, b, a) in &breaker_reports {
            match b.fold(t, a, now_ms) {
                Some(f) => folded.push((*t, *b, a, f)),
                None => direct.push((*t, *b, a)),
            }
        }
        let extra: Vec<BatchStatementRequest> = folded.iter().map(|(.., f)| f.statement.clone()).collect();
        let reports = futures::future::join_all(
            direct
                .iter()
                .map(|(t, b, a)| async move { opened(t, b.report(t, a, now_ms, deadline).await) }),
        );
        // Folded reports are settled as soon as the batched call answers, beside the ledger's
        // own single-item rewrites.
        let ledger = self.write_ledger(steps, &forget, &extra, deadline, |written| {
            let settled =
                folded
                    .into_iter()
                    .zip(written)
                    .map(|((t, b, a, f), w)| async move {
                        opened(t, b.complete_folded(t, f, w, a, now_ms, deadline).await)
                    });
            futures::future::join_all(settled)
        });
        let visibility = async {
            if !visibility.is_empty() {
                self.sqs
                    .change_visibility_by(&self.source_queue, visibility, deadline)
                    .await;
            }
        };
        let ((), (lost, folded_opened), direct_opened, ()) = tokio::join!(
            visibility,
            ledger,
            reports,
            self.write_done_markers(done, deadline),
        );
        let opened = direct_opened.into_iter().chain(folded_opened).flatten().collect();
        (lost, opened)
    }

    /// The visibility changes of the steps whose message stays: each comes back before its
    /// retention ends, however late the call lands (retried after throttling, after the
    /// DLQ's answer).
    fn visibility_changes(&self, steps: &[Step]) -> Vec<(usize, String, i32, Option<Instant>)> {
        steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let by = s.record.facts.expires_at_ms.map(|ms| self.clock().instant_at(ms));
                s.effects
                    .visibility
                    .map(|v| (i, s.record.inc.receipt_handle.clone(), v, by))
            })
            .collect()
    }

    /// Writes the completion markers `done`; one not written is logged (a duplicate of its
    /// job would run again).
    async fn write_done_markers(&self, done: Vec<((String, String), std::time::Duration)>, deadline: Option<Instant>) {
        if done.is_empty() {
            return;
        }
        let marks = done.len();
        let none: [(String, String); 0] = [];
        if let Err(e) = self.ledger.forget_and_mark_done(&none, done, deadline).await {
            warn!(error = %e, completed = marks, "completion markers not written: a duplicate of these jobs would run again; the ledger items left expire by TTL");
        }
    }

    /// Each step's report, with its final `settled` and its log line; and whether the whole
    /// batch failed (a record without a message id not settled).
    fn record_reports(&self, steps: Vec<Step>) -> (Vec<super::RecordReport>, bool) {
        let mut whole_batch_failed = false;
        let records = steps
            .into_iter()
            .map(|s| {
                let mut report = s.report;
                report.settled = s.effects.settled;
                whole_batch_failed |= !report.settled && report.message_id.is_empty();
                // A span shows only on the lines inside it: none when its one line is filtered
                // out (a success, at DEBUG), which spares most records building one.
                if !logs(&report.decision) {
                    return report;
                }
                let span = info_span!(
                    "record",
                    message_id = %report.message_id,
                    job_id = %report.job_id,
                    job_type = report.job_type.as_deref().unwrap_or("-"),
                    decision = report.decision.name(),
                );
                let body = self.log_payloads.then_some(s.record.inc.body.as_str());
                span.in_scope(|| log_decision(&report.decision, body, self.log_payloads));
                report
            })
            .collect();
        (records, whole_batch_failed)
    }

    /// Sends the DLQ copies and settles each dead-lettered step's effects by the answer: a
    /// copy not listed as accepted (refused, or unanswered by the deadline: the send reports
    /// every entry one way or the other) takes its `refused` effects — the message stays in
    /// its queue and its execution is counted, since it will run again.
    async fn send_copies(&self, steps: &mut [Step], deadline: Option<Instant>) {
        let mut outgoing = Vec::new();
        for s in steps.iter_mut() {
            if let Some(copy) = s.copy.take() {
                if let Some(why) = &copy.bare {
                    warn!(message_id = %s.record.inc.message_id, error = %why, "no failure record fits beside the body: the copy goes without it");
                }
                outgoing.push(copy.message);
            }
        }
        if outgoing.is_empty() {
            return;
        }
        let sent = self.sqs.send(&self.dlq_url, outgoing, deadline).await;
        for (i, why) in &sent.failed {
            let s = &mut steps[*i];
            warn!(message_id = %s.record.inc.message_id, error = %why, "DLQ refused the copy; the message stays in its queue");
            s.effects = s.refused;
        }
    }

    /// Counts executions and deletes finished ledgers in one batched write (see
    /// [`AttemptLedger::write_batch`](crate::effects::ledger::AttemptLedger::write_batch)),
    /// with the folded breaker reports (`extra`); a retry's count also stores where its
    /// message can be reached while it waits (for `triage park`); `then` gets what each extra
    /// statement came to as soon as the batched calls answer. Returns the steps whose count
    /// could not be written, and what `then` came to.
    async fn write_ledger<F, Fut>(
        &self,
        steps: &[Step],
        forget: &[(String, String)],
        extra: &[BatchStatementRequest],
        deadline: Option<Instant>,
        then: F,
    ) -> (Vec<usize>, Fut::Output)
    where
        F: FnOnce(Vec<Written>) -> Fut,
        Fut: std::future::Future,
    {
        let counted: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].effects.count).collect();
        if counted.is_empty() && forget.is_empty() && extra.is_empty() {
            return (Vec::new(), then(Vec::new()).await);
        }
        let counts: Vec<Count<'_>> = counted
            .iter()
            .map(|&i| {
                let s = &steps[i];
                let (next_attempt_at_ms, last_error) = match &s.report.decision {
                    Decision::Retry {
                        next_attempt_at_ms,
                        error,
                        ..
                    } => (Some(*next_attempt_at_ms), error.as_str()),
                    Decision::DeadLetter { error, .. } => (None, error.as_str()),
                    _ => (None, ""),
                };
                let waiting = Waiting {
                    receipt_handle: &s.record.inc.receipt_handle,
                    queue_url: &self.source_queue,
                };
                Count {
                    job_type: s.record.job_type().unwrap_or_default(),
                    job_id: &s.record.job_id,
                    delivery: Delivery {
                        message_id: &s.record.inc.message_id,
                        receive_count: s.record.inc.receive_count,
                    },
                    next_attempt_at_ms,
                    waiting: Some(waiting).filter(|w| !w.receipt_handle.is_empty()),
                    last_error,
                    exists: s.record.believes_item_exists(),
                    clear_marker: s.record.clears_marker,
                }
            })
            .collect();
        let (
            Batched {
                counts: writes,
                forgotten,
                ..
            },
            after,
        ) = self
            .ledger
            .write_batch_then(&counts, forget, extra, deadline, then)
            .await;
        if let Err(e) = forgotten {
            warn!(error = %e, "attempt ledger cleanup failed; the items expire by TTL");
        }
        let mut lost = Vec::new();
        for (w, &i) in writes.iter().zip(&counted) {
            if let Err(e) = w {
                warn!(job_id = %steps[i].record.job_id, error = %e, "attempt not recorded; the receive count bounds it instead");
                lost.push(i);
            }
        }
        (lost, after)
    }

    /// Keeps this environment's memory of counts the ledger refused: a job whose count was
    /// lost comes back to a ledger that many executions short, so its next read here adds
    /// them (see [`LostCounts`](super::lost::LostCounts)). A job that is done with forgets
    /// them.
    fn remember_counts(&self, steps: &[Step], lost: &[usize]) {
        let mut memory = self.lost_counts.lock().unwrap_or_else(|e| e.into_inner());
        for &i in lost {
            memory.add(steps[i].record.lost_key());
        }
        // Nothing to forget (the usual case): no key is built.
        if memory.is_empty() {
            return;
        }
        for s in steps.iter().filter(|s| s.effects.settled) {
            memory.forget(&s.record.lost_key());
        }
    }
}

/// The job type when its report opened the breaker; a report that could not be written is
/// logged.
fn opened(job_type: &str, report: Result<Option<BreakerState>, StorageError>) -> Option<&str> {
    match report {
        Ok(Some(state)) if state.phase == Phase::Open => Some(job_type),
        Ok(_) => None,
        Err(e) => {
            warn!(job_type, error = %e, "breaker report lost");
            None
        }
    }
}

/// Whether [`log_decision`]'s line for `d` can be enabled: only a success logs below INFO.
fn logs(d: &Decision) -> bool {
    !matches!(d, Decision::Done { .. }) || LevelFilter::current() >= LevelFilter::DEBUG
}

fn log_decision(d: &Decision, body: Option<&str>, log_payloads: bool) {
    // Bodies stay out of logs unless explicitly enabled: they may hold personal data.
    match d {
        Decision::Retry {
            attempts,
            delay,
            error,
            ..
        } => tracing::info!(
            attempt = attempts,
            delay_ms = delay.as_millis() as u64,
            error = %loggable(error, log_payloads),
            body,
            "retry scheduled"
        ),
        Decision::DeadLetter {
            class,
            attempts,
            error,
        } => {
            tracing::warn!(class = %class, attempt = attempts, error = %loggable(error, log_payloads), body, "dead-lettered")
        }
        Decision::Defer { reason, visibility } => {
            tracing::info!(?reason, delay_ms = visibility.as_millis() as u64, "deferred")
        }
        Decision::Release => tracing::info!("released"),
        Decision::Done { attempts } => tracing::debug!(attempt = attempts, "succeeded"),
        Decision::Duplicate { done_at_ms } => tracing::info!(
            done_at_ms,
            "duplicate of a completed job (its completion marker): deleted without running"
        ),
    }
}

/// The completion markers to write: the settled steps whose job type marks done, with each
/// marker's lifetime.
fn done_markers(steps: &[Step]) -> Vec<((String, String), std::time::Duration)> {
    steps
        .iter()
        .filter(|s| s.effects.settled && s.effects.mark_done)
        .filter_map(|s| s.record.done_marker.map(|ttl| (s.record.ledger_key(), ttl)))
        .collect()
}

/// The ledger items to delete. A job given a completion marker keeps its item: the marker
/// replaces it.
fn forgotten(steps: &[Step], done: &[((String, String), std::time::Duration)]) -> Vec<(String, String)> {
    steps
        .iter()
        .filter(|s| s.effects.forget)
        .map(|s| s.record.ledger_key())
        .filter(|k| !done.iter().any(|(d, _)| d == k))
        .collect()
}
