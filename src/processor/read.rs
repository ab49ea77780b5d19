//! Step 1, read: an [`Incoming`] message in, a [`Record`] out. Its envelope is parsed, its job
//! type routed and its delivery's facts taken once; then the batch reads what it needs from
//! storage in one round trip: the attempt ledger (redeliveries, and first deliveries of job
//! types with a completion marker) beside one breaker state per job type.

use std::collections::HashMap;

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use tracing::warn;

use std::sync::Arc;

use super::lost::LostKey;
use super::registry::Route;
use super::{Deadline, Processor};
use crate::core::breaker::BreakerState;
use crate::core::decision::{StoredAttempts, retention_margin};
use crate::core::envelope::{self, EnvelopeError, JOB_ID_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, Job, Payload};
use crate::core::{Ledger, RecordFacts};
use crate::effects::metrics::{Metrics, UNREGISTERED};
use crate::effects::queue_url::url_names_arn;

/// A received SQS message, as the processor needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// The SQS message id (never empty for a record the processor reports on).
    pub message_id: String,
    /// The receipt handle of this delivery.
    pub receipt_handle: String,
    /// The body, byte for byte.
    pub body: String,
    /// `ApproximateReceiveCount` (1 on the first delivery).
    pub receive_count: u32,
    /// `ApproximateFirstReceiveTimestamp` (epoch ms), if SQS sent it.
    pub first_received_at_ms: Option<u64>,
    /// `SentTimestamp` (epoch ms), if SQS sent it: the queue's retention counts from it.
    pub sent_at_ms: Option<u64>,
    /// `MessageGroupId` on FIFO queues.
    pub group_id: Option<String>,
    /// The producer's message attributes, kept for the DLQ copy.
    pub attributes: HashMap<String, MessageAttributeValue>,
    /// True when the record says it came from a FIFO queue (its event source ARN).
    pub from_fifo: bool,
    /// The queue the record says it came from (its event source ARN, Lambda's records only):
    /// checked against the source queue the processor works for.
    pub source_arn: Option<String>,
}

impl Incoming {
    /// The string value of a message attribute.
    pub(crate) fn string_attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).and_then(|a| a.string_value())
    }

    /// The `job-type` attribute.
    pub fn job_type_attribute(&self) -> Option<&str> {
        self.string_attribute(JOB_TYPE_ATTRIBUTE)
    }

    /// The `job-id` attribute.
    pub fn job_id_attribute(&self) -> Option<&str> {
        self.string_attribute(JOB_ID_ATTRIBUTE)
    }

    /// The first routing attribute (`job-type`, `job-id`) that is there without a string value
    /// (a `Binary` one): routing by the body instead would be a guess.
    pub fn unroutable_attribute(&self) -> Option<&'static str> {
        [JOB_TYPE_ATTRIBUTE, JOB_ID_ATTRIBUTE].into_iter().find(|name| {
            self.attributes
                .get(*name)
                .is_some_and(|a| a.string_value().is_none())
        })
    }

    /// Reads a message received with the SDK (the worker asks for all attributes).
    pub fn from_sdk(m: Message) -> Self {
        let sys = m.attributes.unwrap_or_default();
        let get = |k: MessageSystemAttributeName| sys.get(&k).map(String::as_str);
        Self {
            receive_count: parse_count(get(MessageSystemAttributeName::ApproximateReceiveCount)),
            first_received_at_ms: get(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp)
                .and_then(|v| v.parse().ok()),
            sent_at_ms: get(MessageSystemAttributeName::SentTimestamp).and_then(|v| v.parse().ok()),
            group_id: get(MessageSystemAttributeName::MessageGroupId).map(str::to_owned),
            message_id: m.message_id.unwrap_or_default(),
            receipt_handle: m.receipt_handle.unwrap_or_default(),
            body: m.body.unwrap_or_default(),
            attributes: m.message_attributes.unwrap_or_default(),
            from_fifo: false,
            source_arn: None,
        }
    }
}

/// A missing or unreadable receive count is read as 1: the ledger read is skipped and the
/// ledger's conditional write still keeps the count exact.
pub(crate) fn parse_count(v: Option<&str>) -> u32 {
    v.and_then(read_count).unwrap_or(1)
}

/// A receive count as written: `None` unless it reads as a count of at least 1.
pub(crate) fn read_count(v: &str) -> Option<u32> {
    v.parse().ok().filter(|n| *n >= 1)
}

/// One record as read: the message, its job (or why it is not a runnable one) and what the
/// ledger says about it. Everything the later steps know about a record lives here.
#[derive(Debug, Clone)]
pub struct Record {
    pub(super) inc: Incoming,
    /// The job and its type's handler and policies, when its envelope reads and its type has
    /// a handler; else why not.
    pub(super) job: Result<(Job<Payload>, Arc<Route>), String>,
    pub(super) job_id: String,
    /// The job type the envelope names when no handler serves it (for the failure record).
    unrouted_type: Option<String>,
    /// What SQS says about this delivery, taken when the batch reached the processor (SQS
    /// received it a little earlier: [`crate::core::decision::RECEIVE_SLACK`]).
    pub(super) facts: RecordFacts,
    /// When the queue's retention period for its message ends (epoch ms): SQS deletes it
    /// then. `None` when unknown, or when the timestamp cannot be right.
    pub(super) retention_ends_ms: Option<u64>,
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
        self.job.as_ref().ok().map(|(j, _)| j.job_type.as_str())
    }

    /// The job type the envelope names, served or not (for the failure record).
    pub(super) fn named_type(&self) -> Option<&str> {
        self.job_type().or(self.unrouted_type.as_deref())
    }

    /// The record's metric dimension: its job type when it is a runnable job, else
    /// [`UNREGISTERED`].
    pub(super) fn dimension(&self) -> &str {
        self.job_type().unwrap_or(UNREGISTERED)
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
fn no_handler(job_type: &str) -> String {
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
        let done_marker = parsed
            .as_ref()
            .ok()
            .and_then(|j| self.registry.done_marker_ttl(&j.job_type));
        let (job, unrouted_type) = match parsed {
            Err(e) => (Err(e.to_string()), None),
            Ok(job) => match self.registry.shared_route(&job.job_type) {
                Some(route) => (Ok((job, route)), None),
                None => (Err(no_handler(&job.job_type)), Some(job.job_type)),
            },
        };
        let received_at_ms = self.clock().now_ms();
        Record {
            facts: self.facts(&inc, received_at_ms),
            retention_ends_ms: self.retention_ends_ms(&inc, received_at_ms),
            inc,
            job,
            job_id,
            unrouted_type,
            ledger: Ledger::FirstDelivery,
            had_ledger_item: false,
            done_marker,
            park_note: None,
            clears_marker: None,
        }
    }

    /// Step 1 for a batch: every record read, and the batch's odd deliveries counted.
    pub(super) fn read_batch(&self, incoming: Vec<Incoming>, metrics: &mut Metrics) -> Vec<Record> {
        let records: Vec<Record> = incoming.into_iter().map(|inc| self.read(inc)).collect();
        self.count_past_receive_limit(&records, metrics);
        self.count_other_source_queue(&records, metrics);
        records
    }

    /// What the batch needs from storage: its ledger items, into the records, and one breaker
    /// state per job type. The two reads do not depend on each other: side by side, a batch
    /// with a redelivery and a breaker read waits one round trip, not two.
    pub(super) async fn read_state(
        &self,
        records: &mut [Record],
        deadline: Deadline,
        metrics: &mut Metrics,
    ) -> HashMap<String, BreakerState> {
        let types = breaker_types(records);
        let ((), states) = tokio::join!(
            self.load_ledger(records, deadline, metrics),
            self.load_breakers(&types, deadline),
        );
        states
    }

    /// Reads the ledger for redeliveries and for first deliveries of job types with a
    /// completion marker, in one batched call, adding back the counts this environment could
    /// not write. An unreadable ledger falls back to the receive count (and then neither a
    /// completion marker nor a park can be seen).
    async fn load_ledger(
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
                metrics.add(r.dimension(), "LedgerFallback", 1);
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
    async fn load_breakers(
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
    fn count_past_receive_limit(&self, records: &[Record], metrics: &mut Metrics) {
        let Some(limit) = self.receive_limit else {
            return;
        };
        let past: Vec<&Record> = records.iter().filter(|r| r.inc.receive_count > limit).collect();
        let Some(first) = past.first() else {
            return;
        };
        for r in &past {
            metrics.add(r.dimension(), "PastReceiveLimit", 1);
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
    fn count_other_source_queue(&self, records: &[Record], metrics: &mut Metrics) {
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
                metrics.add(r.dimension(), "OtherSourceQueue", 1);
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

    /// When the queue's retention period for a message received at `received_at_ms` ends
    /// (epoch ms). `None` when unknown, or when the timestamp cannot be right (see
    /// [`facts`](Self::facts)).
    fn retention_ends_ms(&self, inc: &Incoming, received_at_ms: u64) -> Option<u64> {
        let (sent, r) = inc.sent_at_ms.zip(self.retention)?;
        let end = sent.saturating_add(r.as_millis() as u64);
        (end > received_at_ms).then_some(end)
    }

    /// What SQS says about a delivery received at `received_at_ms`.
    fn facts(&self, inc: &Incoming, received_at_ms: u64) -> RecordFacts {
        RecordFacts {
            receive_count: inc.receive_count,
            received_at_ms,
            receive_limit: self.receive_limit,
            // A message whose retention ended before it was received cannot exist: the
            // timestamp or a clock is off (a sample event, a replayed fixture), and no
            // retention rule is applied to it.
            expires_at_ms: self.retention_ends_ms(inc, received_at_ms).and(
                inc.sent_at_ms
                    .zip(self.retention)
                    .map(|(sent, r)| sent.saturating_add(r.saturating_sub(retention_margin(r)).as_millis() as u64)),
            ),
        }
    }
}

/// The batch's job types, each once: the breakers its admission reads.
fn breaker_types(records: &[Record]) -> Vec<String> {
    let mut types: Vec<&str> = records.iter().filter_map(Record::job_type).collect();
    types.sort_unstable();
    types.dedup();
    types.into_iter().map(str::to_owned).collect()
}
