//! Step 1, read: each record's envelope parsed and its job type routed, then what the batch
//! needs from storage — the attempt ledger for redeliveries (one batched read) and one breaker
//! state per job type.

use std::collections::HashMap;

use tracing::warn;

use super::lost::LostKey;
use super::{Deadline, Incoming, Processor};
use crate::clock::now_ms;
use crate::core::breaker::BreakerState;
use crate::core::decision::{StoredAttempts, retention_margin};
use crate::core::envelope::{self, Job};
use crate::core::{Ledger, RecordFacts};
use crate::effects::metrics::Metrics;

/// One record as read: the message, its job (or why it is not a runnable one) and what the
/// ledger says about it. Everything the later steps know about a record lives here.
#[derive(Debug, Clone)]
pub struct Record {
    pub(super) inc: Incoming,
    /// The job, when its envelope reads and its type has a handler; else why not.
    pub(super) job: Result<Job, String>,
    pub(super) job_id: String,
    /// The job type the envelope names, registered or not (for the failure record).
    pub(super) named_type: Option<String>,
    /// When the batch reached the processor; SQS received it a little earlier (see
    /// [`crate::core::decision::RECEIVE_SLACK`]).
    pub(super) received_at_ms: u64,
    pub(super) ledger: Ledger,
    pub(super) had_ledger_item: bool,
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

    /// A redelivery of a runnable job: its ledger is read.
    fn reads_ledger(&self) -> bool {
        self.job.is_ok() && self.inc.receive_count > 1
    }
}

/// Why a job whose type has no handler is not runnable.
pub(super) fn no_handler(job_type: &str) -> String {
    format!("no handler for job type `{job_type}`")
}

impl Processor {
    /// Reads one record: parses its envelope and routes its job type.
    pub(super) fn read(&self, inc: Incoming) -> Record {
        let parsed = envelope::parse_with(
            &inc.body,
            inc.job_type_attribute(),
            inc.job_id_attribute(),
            self.limits,
            self.registry.eventbridge_types(),
        );
        let job_id = match &parsed {
            Ok(Job { id: Some(id), .. }) => id.clone(),
            _ => inc.message_id.clone(),
        };
        let named_type = parsed.as_ref().ok().map(|j| j.job_type.clone());
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
        }
    }

    /// Reads the ledger for redeliveries, in one batched call, adding back the counts this
    /// environment could not write. An unreadable ledger falls back to the receive count.
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
        let stored = match self.ledger.read_many(&ids, deadline.admission()).await {
            Ok(m) => Some(m),
            Err(e) => {
                warn!(error = %e, records = ids.len(), "attempt ledger unavailable: falling back to ApproximateReceiveCount");
                None
            }
        };
        for r in records.iter_mut().filter(|r| r.reads_ledger()) {
            r.ledger = match &stored {
                Some(m) => {
                    let item = m.get(&r.ledger_key()).copied();
                    r.had_ledger_item = item.is_some();
                    // Counts this environment could not write are added back.
                    let lost = self
                        .lost_counts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&r.lost_key());
                    Ledger::Stored(match (item, lost) {
                        (item, 0) => item,
                        (Some(i), n) => Some(StoredAttempts {
                            attempts: i.attempts.saturating_add(n),
                            ..i
                        }),
                        (None, n) => Some(StoredAttempts {
                            attempts: n,
                            next_attempt_at_ms: None,
                        }),
                    })
                }
                None => {
                    metrics.add(self.dimension(r.job_type()), "LedgerFallback", 1);
                    Ledger::Unavailable
                }
            };
        }
    }

    /// One breaker state per job type in the batch, through the per-environment cache; a
    /// breaker that cannot be read fails open (see
    /// [`BreakerStore::observe`](crate::effects::breaker_store::BreakerStore::observe)).
    pub(super) async fn load_breakers(
        &self,
        records: &[Record],
        deadline: Deadline,
    ) -> HashMap<String, BreakerState> {
        let mut types: Vec<&str> = records.iter().filter_map(Record::job_type).collect();
        types.sort_unstable();
        types.dedup();
        let reads = types
            .iter()
            .filter_map(|t| self.breakers.get(*t).map(|b| (*t, b)))
            .map(|(t, b)| async move { (t.to_owned(), b.observe(t, deadline.admission()).await) });
        futures::future::join_all(reads).await.into_iter().collect()
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
