//! Step 3, plan: every effect of a batch, computed without I/O from its records and their
//! final decisions — what each record needs (DLQ copy, visibility change, ledger count or
//! delete), the breaker report per job type, the metrics and the per-record reports.

use std::collections::BTreeMap;

use super::read::Record;
use super::run::{Ran, Run};
use super::{Processor, RecordReport};
use crate::core::breaker::Aggregate;
use crate::core::error::ErrorKind;
use crate::core::failure::{FailureClass, FailureRecord};
use crate::core::{Decision, Ledger};
use crate::effects::dlq::{dlq_copy, group_for, is_reserved};
use crate::effects::metrics::Metrics;
use crate::effects::sqs::Outgoing;

/// Every effect of one batch, to be executed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// One per record, in input order.
    pub steps: Vec<Step>,
    /// One breaker report per job type whose records ran.
    pub(super) breaker_reports: BTreeMap<String, Aggregate>,
    /// The batch's metrics, as far as they are known before executing.
    pub metrics: Metrics,
    /// When the plan was made (epoch ms): failure records and breaker reports carry it.
    pub(super) now_ms: u64,
}

impl Plan {
    /// True when a step sends a copy to the DLQ.
    pub(super) fn sends_copies(&self) -> bool {
        self.steps.iter().any(|s| s.copy.is_some())
    }
}

/// One record's part of the plan.
#[derive(Debug, Clone)]
pub struct Step {
    pub(super) record: Record,
    /// What the batch reports about the record, `settled` as planned (a dead-lettered record
    /// is settled only once its DLQ copy is accepted).
    pub report: RecordReport,
    /// The DLQ copy to send before anything else, for a dead-lettered record.
    pub(super) copy: Option<PlannedCopy>,
    /// The effects when the record has no copy, or when its copy is accepted.
    pub effects: Effects,
    /// The effects instead when its copy is refused (the message stays in its queue).
    pub(super) refused: Effects,
}

/// A DLQ copy.
#[derive(Debug, Clone)]
pub(super) struct PlannedCopy {
    pub(super) message: Outgoing,
    /// Why no failure record fits beside the body, when none does: the copy goes with the body
    /// and attributes alone, and the record (the error) stays in the job's ledger item.
    pub(super) bare: Option<String>,
}

/// What happens to one record after the DLQ's answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effects {
    /// The message is done with: the runtime deletes it (it is not reported failed).
    pub settled: bool,
    /// The visibility timeout to set, in seconds, for a message that stays.
    pub visibility: Option<i32>,
    /// The execution is counted in the attempt ledger.
    pub count: bool,
    /// The job's ledger item is deleted.
    pub forget: bool,
    /// The job's ledger item is replaced by its completion marker (job types that opt in).
    pub mark_done: bool,
    /// Dead-lettered with a record on its last receive and refused by the DLQ: SQS's redrive
    /// moves it without a record (logged as an error, metric `ExpiringUnrecorded`).
    pub unrecorded: bool,
}

impl Processor {
    /// Step 3: the plan of a batch whose records have their final decisions, made at `now_ms`.
    /// Pure: no I/O and no logging.
    #[doc(hidden)]
    pub fn plan(&self, ran: Vec<Ran>, now_ms: u64) -> Plan {
        let mut metrics = Metrics::default();
        let mut breaker_reports: BTreeMap<String, Aggregate> = BTreeMap::new();
        let steps = ran
            .into_iter()
            .enumerate()
            .map(|(key, ran)| {
                let ty = ran.record.dimension();
                metrics.decision(ty, &ran.decision);
                if let Some(run) = &ran.run {
                    metrics.handler_duration(ty, run.time);
                    if let Some(job_type) = ran.record.job_type() {
                        // The job type's name is allocated once per batch, not per record.
                        match breaker_reports.get_mut(job_type) {
                            Some(agg) => tally(agg, run),
                            None => tally(breaker_reports.entry(job_type.to_owned()).or_default(), run),
                        }
                    }
                }
                self.step(key, ran, now_ms)
            })
            .collect();
        Plan {
            steps,
            breaker_reports,
            metrics,
            now_ms,
        }
    }

    /// One record's effects: a success is settled; a retry, deferral or release sets the
    /// visibility (a retry's execution is counted); a dead-lettered record gets its DLQ copy,
    /// and the copy's answer decides the rest — accepted, it is settled (a bare copy's
    /// execution is counted so the ledger keeps the error); refused, it stays, and its
    /// execution, if it ran, is counted. A settled job's ledger item is deleted (unless it
    /// keeps a bare copy's record); a success of a job type with a completion marker replaces
    /// it with the marker instead, and a duplicate of a completed job is settled with no write.
    fn step(&self, key: usize, ran: Ran, now_ms: u64) -> Step {
        let Ran {
            record,
            decision,
            run,
        } = ran;
        let executed = run.is_some();
        let has_item = record.had_ledger_item || record.ledger == Ledger::Unavailable;
        let stays = |visibility: std::time::Duration, count: bool| Effects {
            visibility: Some(visibility.as_secs() as i32),
            count,
            ..Effects::default()
        };
        let (copy, effects, refused) = match &decision {
            Decision::Done { .. } => {
                let marks = record.done_marker.is_some();
                let done = Effects {
                    settled: true,
                    forget: has_item && !marks,
                    mark_done: marks,
                    ..Effects::default()
                };
                (None, done, done)
            }
            Decision::Duplicate { .. } => {
                let dup = Effects {
                    settled: true,
                    ..Effects::default()
                };
                (None, dup, dup)
            }
            Decision::Retry { visibility, .. } => (None, stays(*visibility, true), stays(*visibility, true)),
            Decision::Defer { visibility, .. } => {
                (None, stays(*visibility, false), stays(*visibility, false))
            }
            Decision::Release => (
                None,
                stays(std::time::Duration::ZERO, false),
                stays(std::time::Duration::ZERO, false),
            ),
            Decision::DeadLetter {
                class,
                attempts,
                error,
            } => {
                let error = match (class, &record.park_note) {
                    (FailureClass::Parked, Some(note)) => format!("{error} ({note})"),
                    _ => error.clone(),
                };
                let copy = self.dlq_copy(key, &record, *class, *attempts, &error, now_ms);
                let bare = copy.bare.is_some();
                let sent = Effects {
                    settled: true,
                    count: bare && executed,
                    forget: !bare && has_item,
                    ..Effects::default()
                };
                let refused = Effects {
                    count: executed,
                    unrecorded: *class == FailureClass::Expiring,
                    ..Effects::default()
                };
                (Some(copy), sent, refused)
            }
        };
        let report = RecordReport {
            message_id: record.inc.message_id.clone(),
            job_id: record.job_id.clone(),
            job_type: record.job_type().map(str::to_owned),
            decision,
            executed,
            settled: effects.settled,
        };
        Step {
            record,
            report,
            copy,
            effects,
            refused,
        }
    }

    /// The DLQ copy of a dead-lettered record: body, attributes and failure record; or, when
    /// no record fits beside the body, the body and attributes alone (`bare`).
    fn dlq_copy(
        &self,
        key: usize,
        record: &Record,
        class: FailureClass,
        attempts: u32,
        error: &str,
        now_ms: u64,
    ) -> PlannedCopy {
        let failure = FailureRecord {
            class,
            error: error.to_owned(),
            attempts,
            job_type: record.named_type().map(str::to_owned),
            job_id: record.job_id.clone(),
            source_queue: self.source_queue.clone(),
            original_message_id: record.inc.message_id.clone(),
            first_received_at: record.inc.first_received_at_ms.unwrap_or(now_ms),
            failed_at: now_ms,
        };
        let inc = &record.inc;
        let (body, attributes, bare) =
            match dlq_copy(&inc.body, &inc.attributes, &failure, self.dlq_max_bytes()) {
                Ok(copy) => (copy.body, copy.attributes, None),
                Err(e) => {
                    let attributes = inc
                        .attributes
                        .iter()
                        .filter(|(k, _)| !is_reserved(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    (inc.body.clone(), attributes, Some(e.to_string()))
                }
            };
        let fifo_dlq = self.dlq_url.ends_with(".fifo");
        PlannedCopy {
            message: Outgoing {
                key,
                body,
                attributes,
                // A FIFO group, or a fair queue's tenant on a standard queue: kept either way.
                group_id: group_for(fifo_dlq, inc.group_id.as_deref(), || "triage".into()),
                dedup_id: fifo_dlq.then(|| inc.message_id.clone()),
                delay_seconds: None,
            },
            bare,
        }
    }
}

/// Adds one executed record's outcome to its job type's breaker report (nothing when it was
/// reported already, as a worker's probe is when it ends): a probe's outcome, or an ordinary
/// execution, its transient failure counted too.
pub(super) fn tally(agg: &mut Aggregate, run: &Run) {
    if run.reported {
        return;
    }
    let transient = matches!(run.error, Some(ErrorKind::Transient | ErrorKind::RetryAfter(_)));
    match (&run.lease, run.error) {
        (Some(l), None) => {
            agg.probe_successes += 1;
            agg.generation = l.generation;
            agg.leases.push(l.id.clone());
        }
        (Some(l), Some(_)) => {
            // A fatal probe says nothing about the dependency: its slot is freed, not counted.
            if transient {
                agg.probe_failures += 1;
            }
            agg.generation = l.generation;
            agg.leases.push(l.id.clone());
        }
        (None, _) if transient => {
            agg.transient_failures += 1;
            agg.executions += 1;
            agg.generation = run.generation;
        }
        // A success counts in the failure rate's denominator; a fatal outcome (a payload bug)
        // in neither part of it.
        (None, None) => {
            agg.executions += 1;
            agg.generation = run.generation;
        }
        (None, Some(_)) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::run::{Ran, Run};
    use super::super::{Incoming, Processor};
    use crate::core::breaker::Lease;
    use crate::core::error::ErrorKind;
    use crate::core::failure::{FAILURE_ATTRIBUTE, FailureClass};
    use crate::core::decision::{DeferReason, StoredAttempts};
    use crate::core::{Decision, Ledger};

    const NOW: u64 = 1_800_000_000_000;

    /// A processor whose clients are never called: planning makes no call.
    fn processor() -> Processor {
        super::super::tests::processor(super::super::tests::config())
    }

    fn ran(p: &Processor, n: usize, decision: Decision, run: Option<Run>, item: bool) -> Ran {
        let mut record = p.read(Incoming {
            message_id: format!("m{n}"),
            receipt_handle: format!("r{n}"),
            body: format!(r#"{{"type":"t","id":"j{n}"}}"#),
            receive_count: 2,
            first_received_at_ms: None,
            sent_at_ms: None,
            group_id: None,
            attributes: Default::default(),
            from_fifo: false,
            source_arn: None,
        });
        if item {
            record.ledger = Ledger::Stored(Some(StoredAttempts::default()));
            record.had_ledger_item = true;
        }
        Ran {
            record,
            decision,
            run,
        }
    }

    fn ran_with(error: Option<ErrorKind>, lease: Option<Lease>) -> Option<Run> {
        Some(Run {
            error,
            lease,
            generation: 3,
            time: Duration::from_millis(5),
            reported: false,
        })
    }

    #[test]
    fn every_effect_of_a_batch_is_planned_from_its_decisions() {
        let p = processor();
        let transient = Some(ErrorKind::Transient);
        let lease = Lease {
            id: "l".into(),
            generation: 7,
            expires_at_ms: NOW + 1,
        };
        let dead = |class, error: &str| Decision::DeadLetter {
            class,
            attempts: 1,
            error: error.into(),
        };
        let batch = vec![
            ran(&p, 0, Decision::Done { attempts: 1 }, ran_with(None, None), false),
            ran(
                &p,
                1,
                Decision::Done { attempts: 2 },
                ran_with(None, Some(lease)),
                true,
            ),
            ran(
                &p,
                2,
                Decision::Retry {
                    attempts: 1,
                    delay: Duration::from_millis(2_500),
                    visibility: Duration::from_secs(3),
                    next_attempt_at_ms: NOW + 2_500,
                    error: "down".into(),
                },
                ran_with(transient, None),
                false,
            ),
            ran(
                &p,
                3,
                Decision::Defer {
                    reason: DeferReason::BreakerOpen,
                    visibility: Duration::from_secs(9),
                },
                None,
                false,
            ),
            ran(&p, 4, Decision::Release, None, false),
            ran(
                &p,
                5,
                dead(FailureClass::Fatal, "bug"),
                ran_with(Some(ErrorKind::Fatal), None),
                true,
            ),
            ran(&p, 6, dead(FailureClass::Expiring, "last receive"), None, false),
        ];
        let plan = p.plan(batch, NOW);
        let effects: Vec<_> = plan.steps.iter().map(|s| s.effects).collect();
        let e = |settled, visibility, count, forget| super::Effects {
            settled,
            visibility,
            count,
            forget,
            mark_done: false,
            unrecorded: false,
        };
        assert_eq!(
            effects,
            vec![
                e(true, None, false, false),
                e(true, None, false, true),
                e(false, Some(3), true, false),
                e(false, Some(9), false, false),
                e(false, Some(0), false, false),
                e(true, None, false, true),
                e(true, None, false, false),
            ]
        );
        // Only dead-lettered records have copies, and a refused copy leaves the message,
        // counts an execution, and tells when SQS's redrive will move it unrecorded.
        let copies: Vec<usize> = (0..plan.steps.len())
            .filter(|&i| plan.steps[i].copy.is_some())
            .collect();
        assert_eq!(copies, vec![5, 6]);
        let copy = plan.steps[5].copy.as_ref().unwrap();
        assert!(copy.bare.is_none());
        assert_eq!(copy.message.key, 5);
        assert!(copy.message.attributes.contains_key(FAILURE_ATTRIBUTE));
        assert_eq!(plan.steps[5].refused, e(false, None, true, false));
        assert_eq!(
            plan.steps[6].refused,
            super::Effects {
                unrecorded: true,
                ..e(false, None, false, false)
            }
        );
        // Breaker: the probe's success, the ordinary success and transient failure, one report;
        // the fatal execution counts in neither part of the rate.
        let agg = &plan.breaker_reports["t"];
        assert_eq!(
            (
                agg.probe_successes,
                agg.transient_failures,
                agg.executions,
                agg.leases.clone()
            ),
            (1, 1, 2, vec!["l".to_owned()])
        );
        assert_eq!(plan.metrics.total("Succeeded"), 2);
        assert_eq!(plan.metrics.total("DeadLettered"), 2);
        assert_eq!(plan.metrics.by_type["t"].handler_ms.len(), 4);
        assert!(plan.steps.iter().all(|s| s.report.settled == s.effects.settled));
    }

    #[test]
    fn completion_markers_replace_deletes_and_duplicates_write_nothing() {
        let p = processor();
        let mut marked = ran(&p, 0, Decision::Done { attempts: 2 }, ran_with(None, None), true);
        marked.record.done_marker = Some(Duration::from_secs(60));
        let mut first = ran(&p, 1, Decision::Done { attempts: 1 }, ran_with(None, None), false);
        first.record.done_marker = Some(Duration::from_secs(60));
        let dup = ran(&p, 2, Decision::Duplicate { done_at_ms: NOW - 1 }, None, false);
        let plain = ran(&p, 3, Decision::Done { attempts: 2 }, ran_with(None, None), true);
        let plan = p.plan(vec![marked, first, dup, plain], NOW);
        let effects: Vec<(bool, bool, bool, bool)> = plan
            .steps
            .iter()
            .map(|s| {
                (
                    s.effects.settled,
                    s.effects.forget,
                    s.effects.mark_done,
                    s.effects.count,
                )
            })
            .collect();
        assert_eq!(
            effects,
            vec![
                (true, false, true, false),
                (true, false, true, false),
                (true, false, false, false),
                (true, true, false, false),
            ]
        );
        assert!(
            plan.steps
                .iter()
                .all(|s| s.copy.is_none() && s.effects.visibility.is_none())
        );
        assert_eq!(plan.metrics.total("Duplicate"), 1);
        assert_eq!(plan.metrics.total("Succeeded"), 3);
    }

    #[test]
    fn a_parked_job_gets_a_copy_of_class_parked_with_who_and_why() {
        let p = processor();
        let mut parked = ran(&p, 0, crate::core::decision::parked(3, NOW - 1_000), None, true);
        parked.record.park_note = Some("by ops: vendor down".into());
        let plan = p.plan(vec![parked], NOW);
        let step = &plan.steps[0];
        assert_eq!(
            (step.effects.settled, step.effects.forget, step.effects.count),
            (true, true, false)
        );
        assert!(
            !step.refused.count,
            "it never ran: nothing to count if the DLQ refuses it"
        );
        let copy = step.copy.as_ref().unwrap();
        let record: crate::core::failure::FailureRecord =
            serde_json::from_str(copy.message.attributes[FAILURE_ATTRIBUTE].string_value().unwrap()).unwrap();
        assert_eq!((record.class, record.attempts), (FailureClass::Parked, 3));
        assert!(
            record.error.starts_with("parked by an operator at ")
                && record.error.ends_with("(by ops: vendor down)"),
            "{}",
            record.error
        );
        assert_eq!(plan.metrics.total("DeadLetteredParked"), 1);
    }
}
