//! Step 1, read: each record's envelope parsed and its job type routed, then what the batch
//! needs from storage — the attempt ledger for redeliveries and for first deliveries of job
//! types with a completion marker (one batched read: attempts, completion markers and parks
//! come back together) — and one breaker state per job type.

use std::collections::HashMap;

use tracing::warn;

use super::lost::LostKey;
use super::{Deadline, Incoming, Processor};
use crate::clock::now_ms;
use crate::core::breaker::BreakerState;
use crate::core::decision::{StoredAttempts, retention_margin};
use crate::core::envelope::{self, EnvelopeError, Job, Payload};
use crate::core::{Ledger, RecordFacts};
use crate::effects::metrics::Metrics;
use crate::effects::queue_url::url_names_arn;

/// One record as read: the message, its job (or why it is not a runnable one) and what the
/// ledger says about it. Everything the later steps know about a record lives here.
#[derive(Debug, Clone)]
pub struct Record {
    pub(super) inc: Incoming,
    /// The job, when its envelope reads and its type has a handler; else why not.
    pub(super) job: Result<Job<Payload>, String>,
    pub(super) job_id: String,
    /// The job type the envelope names, registered or not (for the failure record).
    pub(super) named_type: Option<String>,
    /// When the batch reached the processor; SQS received it a little earlier (see
    /// [`crate::core::decision::RECEIVE_SLACK`]).
    pub(super) received_at_ms: u64,
    pub(super) ledger: Ledger,
    pub(super) had_ledger_item: bool,
    /// The lifetime of its job type's completion marker, when the type has one.
    pub(super) done_marker: Option<std::time::Duration>,
    /// Who parked the job and why, when the ledger says it is parked.
    pub(super) park_note: Option<String>,
    /// Its ledger item carries a completion marker that no longer counts: lived out, or of a
    /// job type without a marker now. A count written for it removes the marker.
    pub(super) clears_marker: Option<crate::effects::ledger::SeenMarker>,
}

impl Record {
    /// The job type, when the record is a runnable job.
    pub(super) fn job_type(&self) -> Option<&str> {
        self.job.as_ref().ok().map(|j| j.job_type.as_str())
    }

    /// The job's ledger key: job type and job id.
    pub(super) fn ledger_key(&self) -> (String, String) {
        (
            self.job_type().unwrap_or_default().to_owned(),
            self.job_id.clone(),
        )
    }

    /// The key of this message's lost counts: job type, job id and message id.
    pub(super) fn lost_key(&self) -> LostKey {
        let (t, id) = self.ledger_key();
        (t, id, self.inc.message_id.clone())
    }

    /// Whether the job's ledger item is believed to exist: it was read and found, or could
    /// not be read for a redelivery. Chooses how a count is written, never what it counts.
    pub(super) fn believes_item_exists(&self) -> bool {
        self.had_ledger_item || (self.inc.receive_count > 1 && self.ledger == Ledger::Unavailable)
    }

    /// A redelivery of a runnable job, or any delivery of a job type with a completion
    /// marker: its ledger is read.
    fn reads_ledger(&self) -> bool {
        self.job.is_ok() && (self.inc.receive_count > 1 || self.done_marker.is_some())
    }
}

/// Why a job whose type has no handler is not runnable.
pub(super) fn no_handler(job_type: &str) -> String {
    format!("no handler for job type `{job_type}`")
}

impl Processor {
    /// Reads one record: parses its envelope and routes its job type.
    pub(super) fn read(&self, inc: Incoming) -> Record {
        // The worker's messages; Lambda's records are refused before.
        let unroutable = inc.unroutable_attribute();
        let parsed = match unroutable {
            Some(name) => Err(EnvelopeError::AttributeNotString(name)),
            None => envelope::parse_for_handler(
                &inc.body,
                inc.job_type_attribute(),
                inc.job_id_attribute(),
                self.limits,
                self.registry.eventbridge_types(),
            ),
        };
        let job_id = match &parsed {
            Ok(Job { id: Some(id), .. }) => id.clone(),
            _ => inc.message_id.clone(),
        };
        let named_type = parsed.as_ref().ok().map(|j| j.job_type.clone());
        let done_marker = parsed
            .as_ref()
            .ok()
            .and_then(|j| self.registry.done_marker_ttl(&j.job_type));
        let job =
            parsed
                .map_err(|e| e.to_string())
                .and_then(|job| match self.registry.route(&job.job_type) {
                    Some(_) => Ok(job),
                    None => Err(no_handler(&job.job_type)),
                });
        Record {
            inc,
            job,
            job_id,
            named_type,
            received_at_ms: now_ms(),
            ledger: Ledger::FirstDelivery,
            had_ledger_item: false,
            done_marker,
            park_note: None,
            clears_marker: None,
        }
    }

    /// Reads the ledger for redeliveries and for first deliveries of job types with a
    /// completion marker, in one batched call, adding back the counts this environment could
    /// not write. An unreadable ledger falls back to the receive count (and then neither a
    /// completion marker nor a park can be seen).
    pub(super) async fn load_ledger(
        &self,
        records: &mut [Record],
        deadline: Deadline,
        metrics: &mut Metrics,
    ) {
        let ids: Vec<(String, String)> = records
            .iter()
            .filter(|r| r.reads_ledger())
            .map(Record::ledger_key)
            .collect();
        if ids.is_empty() {
            return;
        }
        let stored = match self.ledger.read_facts(&ids, deadline.admission()).await {
            Ok(m) => Some(m),
            Err(e) => {
                warn!(error = %e, records = ids.len(), "attempt ledger unavailable: falling back to ApproximateReceiveCount; completion markers and parks cannot be seen, so such jobs run as if neither were set");
                None
            }
        };
        for r in records.iter_mut().filter(|r| r.reads_ledger()) {
            let redelivery = r.inc.receive_count > 1;
            let Some(m) = &stored else {
                metrics.add(self.dimension(r.job_type()), "LedgerFallback", 1);
                if redelivery {
                    r.ledger = Ledger::Unavailable;
                }
                continue;
            };
            let mut facts = m.get(&r.ledger_key()).cloned();
            if let Some(f) = facts.as_mut() {
                // A marker of a job type taken out of the markers says nothing any more: its
                // job runs, and its retries too.
                if r.done_marker.is_none() && f.done_at_ms.take().is_some() {
                    f.lived_out_marker = f.marker;
                }
                r.clears_marker = f.lived_out_marker;
            }
            if !redelivery {
                // A first delivery reads only the completion marker: its attempts start at 0
                // as without one.
                if let Some(at_ms) = facts.and_then(|f| f.done_at_ms) {
                    r.ledger = Ledger::Done { at_ms };
                }
                continue;
            }
            r.had_ledger_item = facts.is_some();
            // Counts this environment could not write are added back.
            let lost = self
                .lost_counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&r.lost_key());
            r.ledger = match facts {
                Some(mut f) => {
                    f.stored.attempts = f.stored.attempts.saturating_add(lost);
                    r.park_note = f.park_note.clone();
                    f.ledger()
                }
                None if lost == 0 => Ledger::Stored(None),
                None => Ledger::Stored(Some(StoredAttempts {
                    attempts: lost,
                    next_attempt_at_ms: None,
                })),
            };
        }
    }

    /// One breaker state per job type of [`breaker_types`], through the per-environment cache; a
    /// breaker that cannot be read fails open (see
    /// [`BreakerStore::observe`](crate::effects::breaker_store::BreakerStore::observe)).
    pub(super) async fn load_breakers(
        &self,
        types: &[String],
        deadline: Deadline,
    ) -> HashMap<String, BreakerState> {
        // Start-up's first read fills the caches: wait for it rather than read the same items
        // again (after a failed one, the reads below are the admission's own).
        let _ = self.first_read(deadline.admission()).await;
        let reads = types
            .iter()
            .filter_map(|t| self.breakers.get(t.as_str()).map(|b| (t.as_str(), b)))
            .map(|(t, b)| async move { (t.to_owned(), b.observe(t, deadline.admission()).await) });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// Counts the records delivered more often than the receive limit this environment was
    /// given (`TRIAGE_QUEUE_MAX_RECEIVE`, or the redrive policy read at start-up) as
    /// `PastReceiveLimit`, and warns once per batch: SQS would have moved such a record to its
    /// DLQ at that limit, so the queue's `maxReceiveCount` is higher than the one the
    /// processor works with (or its redrive policy was changed since), and records are taken
    /// to be on their last receive, and dead-lettered as `expiring` when deferred, too early.
    /// Such a record is seen only when a receive at the limit did not settle it (the
    /// processor settles every record on that receive when it can).
    pub(super) fn count_past_receive_limit(&self, records: &[Record], metrics: &mut Metrics) {
        let Some(limit) = self.receive_limit else {
            return;
        };
        let past: Vec<&Record> = records.iter().filter(|r| r.inc.receive_count > limit).collect();
        let Some(first) = past.first() else {
            return;
        };
        for r in &past {
            metrics.add(self.dimension(r.job_type()), "PastReceiveLimit", 1);
        }
        let n = past.len();
        warn!(
            message_id = %first.inc.message_id,
            receive_count = first.inc.receive_count,
            receive_limit = limit,
            records = n,
            "a record was received more often than the queue's maxReceiveCount this function was \
             given (TRIAGE_QUEUE_MAX_RECEIVE, or the redrive policy read at start-up): the queue's own \
             limit is higher, so records are dead-lettered as `expiring` before their last receive; \
             set the TRIAGE_QUEUE_* variables from the queue's attributes, or restart the function \
             if the queue's redrive policy changed since it started"
        );
    }

    /// Counts the records whose event source ARN names another queue than the source queue
    /// the processor works for (`TRIAGE_QUEUE_URL`) as `OtherSourceQueue`, and warns once per
    /// batch: the function is mapped to a queue it was not configured for, whose
    /// `maxReceiveCount` and retention were not checked, and on which its visibility changes
    /// (retries, deferrals) do not land. One comparison per distinct ARN in the batch.
    pub(super) fn count_other_source_queue(&self, records: &[Record], metrics: &mut Metrics) {
        let mut last: Option<(&str, bool)> = None;
        let mut first: Option<(&Record, &str)> = None;
        let mut n = 0;
        for r in records {
            let Some(arn) = r.inc.source_arn.as_deref().filter(|a| !a.is_empty()) else {
                continue;
            };
            let ours = match last {
                Some((seen, ours)) if seen == arn => ours,
                _ => {
                    let ours = url_names_arn(&self.source_queue, arn);
                    last = Some((arn, ours));
                    ours
                }
            };
            if !ours {
                metrics.add(self.dimension(r.job_type()), "OtherSourceQueue", 1);
                first.get_or_insert((r, arn));
                n += 1;
            }
        }
        if let Some((r, arn)) = first {
            warn!(
                message_id = %r.inc.message_id,
                event_source_arn = arn,
                source_queue = %self.source_queue,
                records = n,
                "a record comes from another queue than TRIAGE_QUEUE_URL: its retries and deferrals \
                 change its visibility on TRIAGE_QUEUE_URL's queue, where they do not land, so it comes \
                 back after its own queue's visibility timeout, and that queue's maxReceiveCount and \
                 retention were not checked; map this function to TRIAGE_QUEUE_URL's queue only, or set \
                 TRIAGE_QUEUE_URL to the queue it is mapped to"
            );
        }
    }

    /// When the queue's retention period for a record's message ends (epoch ms): SQS deletes
    /// it then. `None` when unknown, or when the timestamp cannot be right (see
    /// [`facts`](Self::facts)).
    pub(super) fn retention_ends_ms(&self, record: &Record) -> Option<u64> {
        let (sent, r) = record.inc.sent_at_ms.zip(self.retention)?;
        let end = sent.saturating_add(r.as_millis() as u64);
        (end > record.received_at_ms).then_some(end)
    }

    /// What SQS says about a record's delivery.
    pub(super) fn facts(&self, record: &Record) -> RecordFacts {
        RecordFacts {
            receive_count: record.inc.receive_count,
            received_at_ms: record.received_at_ms,
            receive_limit: self.receive_limit,
            expires_at_ms: match (record.inc.sent_at_ms, self.retention) {
                // A message whose retention ended before it was received cannot exist: the
                // timestamp or a clock is off (a sample event, a replayed fixture), and no
                // retention rule is applied to it.
                (Some(sent), Some(r))
                    if sent.saturating_add(r.as_millis() as u64) > record.received_at_ms =>
                {
                    Some(sent.saturating_add(r.saturating_sub(retention_margin(r)).as_millis() as u64))
                }
                _ => None,
            },
        }
    }
}

/// The batch's job types, each once: the breakers its admission reads.
pub(super) fn breaker_types(records: &[Record]) -> Vec<String> {
    let mut types: Vec<&str> = records.iter().filter_map(Record::job_type).collect();
    types.sort_unstable();
    types.dedup();
    types.into_iter().map(str::to_owned).collect()
}
