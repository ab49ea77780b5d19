//! The batch processor: records in, a decision per record, effects planned and executed in
//! batches, the batch response out. Both runtimes (Lambda and the worker) are thin over it.
//!
//! Per invocation it makes at most: one ledger read for all redeliveries (none when every
//! record is a first delivery), one cached breaker read per job type, and then, only for
//! records that need them, batched DLQ sends, batched visibility changes, one conditional
//! ledger write per retried record, one batched ledger delete, and one breaker report per job
//! type. A batch of first deliveries that all succeed makes no AWS call at all.

pub mod record;
pub mod registry;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream;
use tokio::time::Instant;
use tracing::{Instrument, info_span, warn};

use crate::clock::now_ms;
use crate::core::breaker::{Aggregate, BreakerState, Lease, Phase, gate};
use crate::core::decision::{StoredAttempts, attempts_before, held_back, retention_margin};
use crate::core::envelope::{self, EnvelopeLimits, Job};
use crate::core::error::ErrorKind;
use crate::core::failure::{FailureClass, FailureRecord};
use crate::core::{Decision, Execution, Gate, Inputs, JobError, Ledger, RecordFacts, decide};
use crate::effects::breaker_store::{BreakerStore, Probe};
use crate::effects::dlq::dlq_copy;
use crate::effects::ledger::{AttemptLedger, Delivery};
use crate::effects::metrics::{Metrics, UNREGISTERED};
use crate::effects::sqs::{Outgoing, Sqs};
pub use record::Incoming;
use registry::{JobContext, Registry, Route};

/// Time kept back before the invocation deadline to report the batch: a handler still
/// running then is stopped and counted as a transient failure.
pub const REPORT_MARGIN: Duration = Duration::from_millis(1_500);

/// The latest moment a call made before the handlers run may end: the report margin before
/// the invocation's deadline, so a stalled read or probe request leaves time to settle the
/// batch (its records are then released, unspent).
fn admission_deadline(deadline: Option<Instant>) -> Option<Instant> {
    deadline.map(|d| d.checked_sub(REPORT_MARGIN).unwrap_or(d))
}

/// Time kept back from the invocation's deadline for writing the batch response after the
/// last effect.
pub const SETTLE_MARGIN: Duration = Duration::from_millis(250);

/// The latest moment an effect after the handlers may end.
fn settle_deadline(deadline: Option<Instant>) -> Option<Instant> {
    deadline.map(|d| d.checked_sub(SETTLE_MARGIN).unwrap_or(d))
}

/// Where a processor sends things and what it reads from.
#[derive(Debug, Clone)]
pub struct Processor {
    registry: Arc<Registry>,
    sqs: Sqs,
    ledger: AttemptLedger,
    breakers: Arc<HashMap<String, BreakerStore>>,
    source_queue: String,
    dlq_url: String,
    dlq_max_bytes: usize,
    concurrency: usize,
    limits: EnvelopeLimits,
    log_payloads: bool,
    receive_limit: Option<u32>,
    retention: Option<Duration>,
    lost_counts: Arc<std::sync::Mutex<LostCounts>>,
    draining: Arc<AtomicBool>,
}

/// The processor's settings.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// The source queue URL (recorded in failure records, target of visibility changes).
    pub source_queue: String,
    /// The DLQ URL.
    pub dlq_url: String,
    /// The DLQ's maximum message size.
    pub dlq_max_bytes: usize,
    /// Records run at once.
    pub concurrency: usize,
    /// Envelope limits.
    pub limits: EnvelopeLimits,
    /// Include bodies in logs.
    pub log_payloads: bool,
    /// The source queue's redrive `maxReceiveCount`, when it has one.
    pub receive_limit: Option<u32>,
    /// The source queue's `MessageRetentionPeriod`, when known.
    pub retention: Option<Duration>,
}

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordReport {
    /// The SQS message id.
    pub message_id: String,
    /// The job id.
    pub job_id: String,
    /// The job type, when the envelope named one.
    pub job_type: Option<String>,
    /// The final decision.
    pub decision: Decision,
    /// Whether the handler ran.
    pub executed: bool,
    /// True when the message is done with (handler succeeded or the DLQ accepted its copy):
    /// Lambda deletes it, the worker deletes it.
    pub settled: bool,
}

/// The result of one batch.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    /// Per record, in input order.
    pub records: Vec<RecordReport>,
    /// Metrics of this batch.
    pub metrics: Metrics,
    /// True when a record that must be reported failed has no message id: an empty
    /// `itemIdentifier` is never sent, so the whole batch is failed instead.
    pub whole_batch_failed: bool,
}

impl BatchOutcome {
    /// Message ids to report in `batchItemFailures`.
    pub fn failures(&self) -> Vec<String> {
        self.records
            .iter()
            .filter(|r| !r.settled)
            .map(|r| r.message_id.clone())
            .collect()
    }
}

/// One record on its way through the batch.
struct Slot {
    inc: Incoming,
    job: Result<Job, String>,
    job_id: String,
    /// The job type the envelope names, registered or not (for the failure record).
    named_type: Option<String>,
    /// When the batch reached the processor; SQS received it a little earlier (see
    /// [`crate::core::decision::RECEIVE_SLACK`]).
    received_at_ms: u64,
    ledger: Ledger,
    had_ledger_item: bool,
}

impl Slot {
    fn job_type(&self) -> Option<&str> {
        self.job.as_ref().ok().map(|j| j.job_type.as_str())
    }

    /// The job's ledger key: job type and job id.
    fn ledger_key(&self) -> (String, String) {
        (
            self.job_type().unwrap_or_default().to_owned(),
            self.job_id.clone(),
        )
    }

    /// The key of this message's lost counts: job type, job id and message id.
    fn lost_key(&self) -> LostKey {
        let (t, id) = self.ledger_key();
        (t, id, self.inc.message_id.clone())
    }
}

/// Counts the ledger refused to write, per job and message, remembered by one environment (at
/// most [`LostCounts::CAPACITY`] entries, the oldest forgotten first). A job whose count was
/// lost reads a ledger that many executions short; adding them back keeps its attempts exact
/// when its redelivery reaches the same environment, so a ledger that refuses writes cannot
/// make a job run past `max_attempts` there. Across environments each adds what it lost.
/// Entries are per message: a replay or a producer's re-send of the job is a new message and
/// starts clean.
#[derive(Debug, Default)]
struct LostCounts {
    jobs: HashMap<LostKey, (u32, u64)>,
    /// Entries by when they were last added to, for eviction.
    order: BTreeMap<u64, LostKey>,
    next: u64,
}

/// Job type, job id and message id.
type LostKey = (String, String, String);

impl LostCounts {
    const CAPACITY: usize = 10_000;

    fn add(&mut self, key: LostKey) {
        self.next += 1;
        let seq = self.next;
        let n = match self.jobs.remove(&key) {
            Some((n, old)) => {
                self.order.remove(&old);
                n + 1
            }
            None => 1,
        };
        if self.jobs.len() >= Self::CAPACITY {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.jobs.remove(&oldest);
            }
        }
        self.order.insert(seq, key.clone());
        self.jobs.insert(key, (n, seq));
    }

    fn get(&self, key: &LostKey) -> u32 {
        self.jobs.get(key).map_or(0, |(n, _)| *n)
    }

    fn forget(&mut self, key: &LostKey) {
        if let Some((_, seq)) = self.jobs.remove(key) {
            self.order.remove(&seq);
        }
    }
}

#[cfg(test)]
mod lost_counts_tests {
    use super::LostCounts;

    fn key(i: usize) -> (String, String, String) {
        ("t".into(), format!("j{i}"), format!("m{i}"))
    }

    #[test]
    fn counts_add_up_per_message_and_the_oldest_go_first() {
        let mut lost = LostCounts::default();
        lost.add(key(0));
        lost.add(key(0));
        assert_eq!(lost.get(&key(0)), 2);
        let other_message = ("t".to_owned(), "j0".to_owned(), "m-replayed".to_owned());
        assert_eq!(lost.get(&other_message), 0, "a new message starts clean");
        for i in 1..=LostCounts::CAPACITY {
            lost.add(key(i));
        }
        assert_eq!(lost.jobs.len(), LostCounts::CAPACITY);
        assert_eq!(lost.order.len(), LostCounts::CAPACITY);
        assert_eq!(lost.get(&key(0)), 0, "the oldest was forgotten");
        lost.forget(&key(5));
        assert_eq!(lost.get(&key(5)), 0);
        assert_eq!(lost.order.len(), LostCounts::CAPACITY - 1);
    }
}

/// How the handler run went, for effects and the breaker.
struct Ran {
    decision: Decision,
    executed: bool,
    error_kind: Option<ErrorKind>,
    lease: Option<Lease>,
    /// The breaker generation the record was admitted in: its failures count there.
    generation: u64,
    handler_time: Option<Duration>,
}

impl Processor {
    /// A processor over these effects.
    pub fn new(
        registry: Arc<Registry>,
        sqs: Sqs,
        ledger: AttemptLedger,
        breakers: HashMap<String, BreakerStore>,
        config: ProcessorConfig,
    ) -> Self {
        Self {
            registry,
            sqs,
            ledger,
            breakers: Arc::new(breakers),
            source_queue: config.source_queue,
            dlq_url: config.dlq_url,
            dlq_max_bytes: config.dlq_max_bytes,
            concurrency: config.concurrency.max(1),
            limits: config.limits,
            log_payloads: config.log_payloads,
            receive_limit: config.receive_limit,
            retention: config.retention,
            lost_counts: Arc::default(),
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops starting records: from now on every record not yet started is released
    /// (visibility 0, no attempt spent); records already running finish. Shared by clones.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// The SQS effects (the worker uses them to delete).
    pub fn sqs(&self) -> &Sqs {
        &self.sqs
    }

    /// True when the source queue is FIFO.
    pub fn is_fifo(&self) -> bool {
        self.source_queue.ends_with(".fifo")
    }

    fn read(&self, inc: Incoming) -> Slot {
        let parsed = envelope::parse(
            &inc.body,
            inc.job_type_attribute(),
            inc.job_id_attribute(),
            self.limits,
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
                    None => Err(format!("no handler for job type `{}`", job.job_type)),
                });
        Slot {
            inc,
            job,
            job_id,
            named_type,
            received_at_ms: now_ms(),
            ledger: Ledger::FirstDelivery,
            had_ledger_item: false,
        }
    }

    /// Processes one batch. `deadline` is the invocation's deadline (none for the worker).
    ///
    /// The outcome's storage counters are the environment's retries made while the batch ran:
    /// exact for Lambda (one invocation at a time); a worker running batches side by side on
    /// one environment may count a neighbour's retry in either batch.
    pub async fn process(&self, records: Vec<Incoming>, deadline: Option<Instant>) -> BatchOutcome {
        let before = self.sqs.retry().stats();
        let mut outcome = self.process_records(records, deadline).await;
        let after = self.sqs.retry().stats();
        outcome.metrics.storage_retries = after.retries.saturating_sub(before.retries);
        outcome.metrics.storage_failures = after.failures.saturating_sub(before.failures);
        outcome
    }

    async fn process_records(&self, records: Vec<Incoming>, deadline: Option<Instant>) -> BatchOutcome {
        let mut metrics = Metrics::default();
        let mut slots: Vec<Slot> = records.into_iter().map(|r| self.read(r)).collect();
        self.load_ledger(&mut slots, admission_deadline(deadline), &mut metrics)
            .await;
        let states = self.load_breakers(&slots, deadline).await;

        let groups = self.groups(&slots);
        let slots_ref = &slots;
        let states_ref = &states;
        let mut ran: Vec<(usize, Ran)> = stream::iter(groups)
            .map(|group| async move {
                let mut out = Vec::with_capacity(group.len());
                let mut blocked = false;
                for idx in group {
                    let r = if blocked {
                        // FIFO: after a failure in the group, later records must not overtake it.
                        let s = &slots_ref[idx];
                        let record = self.facts(s);
                        Ran {
                            decision: held_back(record, attempts_before(record, s.ledger)),
                            executed: false,
                            error_kind: None,
                            lease: None,
                            generation: 0,
                            handler_time: None,
                        }
                    } else {
                        self.run(&slots_ref[idx], states_ref, deadline).await
                    };
                    // A dead-lettered record blocks its group too: its DLQ copy is sent after
                    // the handlers, and a later record must not run before that copy exists.
                    blocked |= !matches!(r.decision, Decision::Done { .. });
                    out.push((idx, r));
                }
                out
            })
            .buffer_unordered(self.concurrency)
            .flat_map(stream::iter)
            .collect()
            .await;
        ran.sort_by_key(|(i, _)| *i);
        let ran: Vec<Ran> = ran.into_iter().map(|(_, r)| r).collect();
        self.apply(&slots, ran, deadline, metrics).await
    }

    /// Reads the ledger for redeliveries, in one batched call.
    async fn load_ledger(&self, slots: &mut [Slot], deadline: Option<Instant>, metrics: &mut Metrics) {
        let ids: Vec<(String, String)> = slots
            .iter()
            .filter(|s| s.job.is_ok() && s.inc.receive_count > 1)
            .map(|s| (s.job_type().unwrap_or_default().to_owned(), s.job_id.clone()))
            .collect();
        if ids.is_empty() {
            return;
        }
        let stored = match self.ledger.read_many(&ids, deadline).await {
            Ok(m) => Some(m),
            Err(e) => {
                warn!(error = %e, records = ids.len(), "attempt ledger unavailable: falling back to ApproximateReceiveCount");
                None
            }
        };
        for s in slots
            .iter_mut()
            .filter(|s| s.job.is_ok() && s.inc.receive_count > 1)
        {
            s.ledger = match &stored {
                Some(m) => {
                    let key = s.ledger_key();
                    let item = m.get(&key).copied();
                    s.had_ledger_item = item.is_some();
                    // Counts this environment could not write are added back.
                    let lost = self
                        .lost_counts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&s.lost_key());
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
                    metrics.add(self.dimension(s.job_type()), "LedgerFallback", 1);
                    Ledger::Unavailable
                }
            };
        }
    }

    /// One breaker state per job type in the batch, through the per-environment cache. A
    /// breaker that cannot be read fails open (closed), so a storage outage stops nothing.
    async fn load_breakers(
        &self,
        slots: &[Slot],
        deadline: Option<Instant>,
    ) -> HashMap<String, BreakerState> {
        let deadline = admission_deadline(deadline);
        let mut types: Vec<&str> = slots.iter().filter_map(Slot::job_type).collect();
        types.sort_unstable();
        types.dedup();
        let reads = types
            .iter()
            .filter_map(|t| self.breakers.get(*t).map(|b| (*t, b)))
            .map(|(t, b)| async move {
                let state = b.state(t, deadline).await.unwrap_or_else(|e| {
                    warn!(job_type = t, error = %e, "breaker state unavailable; treating it as closed");
                    BreakerState::default()
                });
                (t.to_owned(), state)
            });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// Runs of records that must go in order: a FIFO message group, else each record alone.
    fn groups(&self, slots: &[Slot]) -> Vec<Vec<usize>> {
        if !self.is_fifo() && !slots.iter().any(|s| s.inc.from_fifo) {
            return (0..slots.len()).map(|i| vec![i]).collect();
        }
        let mut order: Vec<Vec<usize>> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, s) in slots.iter().enumerate() {
            let g = s.inc.group_id.as_deref().unwrap_or("");
            match index.get(g) {
                Some(&k) => order[k].push(i),
                None => {
                    index.insert(g, order.len());
                    order.push(vec![i]);
                }
            }
        }
        order
    }

    /// What SQS says about a record's delivery.
    fn facts(&self, slot: &Slot) -> RecordFacts {
        RecordFacts {
            receive_count: slot.inc.receive_count,
            received_at_ms: slot.received_at_ms,
            receive_limit: self.receive_limit,
            expires_at_ms: match (slot.inc.sent_at_ms, self.retention) {
                // A message whose retention ended before it was received cannot exist: the
                // timestamp or a clock is off (a sample event, a replayed fixture), and no
                // retention rule is applied to it.
                (Some(sent), Some(r)) if sent.saturating_add(r.as_millis() as u64) > slot.received_at_ms => {
                    Some(sent.saturating_add(r.saturating_sub(retention_margin(r)).as_millis() as u64))
                }
                _ => None,
            },
        }
    }

    fn dimension<'a>(&self, job_type: Option<&'a str>) -> &'a str {
        match job_type {
            Some(t) if self.registry.route(t).is_some() => t,
            _ => UNREGISTERED,
        }
    }

    /// Decides, runs the handler if admitted, and decides again.
    async fn run(
        &self,
        slot: &Slot,
        states: &HashMap<String, BreakerState>,
        deadline: Option<Instant>,
    ) -> Ran {
        let route = slot.job_type().and_then(|t| self.registry.route(t));
        let policy = route.map_or(self.registry.default_policy(), |r| &r.policy);
        let store = slot.job_type().and_then(|t| self.breakers.get(t));
        let state = slot.job_type().and_then(|t| states.get(t));
        let invalid = slot.job.as_ref().err().map(String::as_str);
        let record = self.facts(slot);
        let inputs = |gate, execution, now_ms| Inputs {
            record,
            invalid,
            ledger: slot.ledger,
            gate,
            time_left: if self.draining.load(Ordering::SeqCst) {
                Some(Duration::ZERO)
            } else {
                deadline.map(|d| d.saturating_duration_since(Instant::now()))
            },
            execution,
            policy,
            now_ms,
        };
        let now = now_ms();
        // Failures count in the generation the record was admitted in: a report about a
        // period that has since ended is ignored by the store.
        let mut generation = state.map_or(0, |s| s.at(now).generation);
        let half_open = state.is_some_and(|s| s.phase_at(now) == Phase::HalfOpen);
        // A half-open breaker is asked for a permit only for a record that would otherwise run.
        let mut g = match (state, store) {
            (Some(s), Some(b)) => gate(s, now, half_open, b.config()),
            _ => Gate::Closed,
        };
        let mut pre = decide(&inputs(g, Execution::NotRun, now), &mut rand::rng());
        let mut lease = None;
        if let (true, Decision::Execute { .. }, Some(b)) = (half_open, &pre, store) {
            let job_type = slot.job_type().unwrap_or_default();
            // The permit is held as long as this invocation can run the probe.
            let lease_until = deadline
                .map(|d| now.saturating_add(d.saturating_duration_since(Instant::now()).as_millis() as u64));
            let asked = b
                .acquire_probe(job_type, now, lease_until, admission_deadline(deadline))
                .await;
            g = match asked {
                Ok(Probe::Granted(l)) => {
                    lease = Some(l);
                    Gate::Probe
                }
                Ok(Probe::Busy { until_ms }) => Gate::ProbeBusy {
                    until_ms: until_ms.min(now.saturating_add(b.config().open_for().as_millis() as u64)),
                },
                // The cached view was stale: the breaker closed or opened again meanwhile.
                Ok(Probe::NotHalfOpen(fresh)) => {
                    generation = fresh.at(now).generation;
                    gate(&fresh, now, false, b.config())
                }
                // A probe slot that cannot be asked for fails open, like the state read.
                Err(e) => {
                    warn!(job_type, error = %e, "probe permit unavailable; running without one");
                    Gate::Closed
                }
            };
            // Decide again: the gate changed, and asking took time the start margin counts.
            pre = decide(&inputs(g, Execution::NotRun, now_ms()), &mut rand::rng());
        }
        let (Decision::Execute { attempt }, Some(route), Ok(job)) = (&pre, route, &slot.job) else {
            if let (Some(l), Some(t)) = (lease, slot.job_type()) {
                self.release_probe(t, &l, deadline).await;
            }
            return Ran {
                decision: pre,
                executed: false,
                error_kind: None,
                lease: None,
                generation,
                handler_time: None,
            };
        };
        let ctx = JobContext {
            job_id: slot.job_id.clone(),
            job_type: job.job_type.clone(),
            message_id: slot.inc.message_id.clone(),
            attempt: *attempt,
            max_attempts: policy.max_attempts(),
        };
        tracing::debug!(message_id = %slot.inc.message_id, job_id = %slot.job_id, attempt, "handler started");
        let started = Instant::now();
        let outcome = run_handler(route, job.payload.clone(), ctx, deadline).await;
        let handler_time = started.elapsed();
        let error_kind = outcome
            .as_ref()
            .err()
            .map(|e| e.clone().reclassified(policy.rules()).kind());
        let decision = decide(&inputs(g, Execution::Ran(&outcome), now_ms()), &mut rand::rng());
        Ran {
            decision,
            executed: true,
            error_kind,
            lease,
            generation,
            handler_time: Some(handler_time),
        }
    }

    async fn release_probe(&self, job_type: &str, lease: &Lease, deadline: Option<Instant>) {
        if let Some(b) = self.breakers.get(job_type) {
            if let Err(e) = b.release(job_type, lease, now_ms(), deadline).await {
                warn!(job_type, error = %e, "probe permit not released; it frees its slot when its lease expires");
            }
        }
    }

    /// The DLQ copy of a dead-lettered record: body, attributes and failure record; or, when
    /// no record fits beside the body, the body and attributes alone (`bare`: the record is
    /// then kept in the job's ledger item instead).
    fn dlq_outgoing(&self, i: usize, slot: &Slot, decision: &Decision, now: u64) -> Option<(Outgoing, bool)> {
        let Decision::DeadLetter {
            class,
            attempts,
            error,
        } = decision
        else {
            return None;
        };
        let record = FailureRecord {
            class: *class,
            error: error.clone(),
            attempts: *attempts,
            job_type: slot.named_type.clone(),
            job_id: slot.job_id.clone(),
            source_queue: self.source_queue.clone(),
            original_message_id: slot.inc.message_id.clone(),
            first_received_at: slot.inc.first_received_at_ms.unwrap_or(now),
            failed_at: now,
        };
        let (body, attributes, bare) = match dlq_copy(
            &slot.inc.body,
            &slot.inc.attributes,
            &record,
            self.dlq_max_bytes,
        ) {
            Ok(copy) => (copy.body, copy.attributes, false),
            Err(e) => {
                warn!(message_id = %slot.inc.message_id, error = %e, "no failure record fits beside the body: the copy goes without it");
                let attributes = slot
                    .inc
                    .attributes
                    .iter()
                    .filter(|(k, _)| !is_reserved(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (slot.inc.body.clone(), attributes, true)
            }
        };
        let fifo_dlq = self.dlq_url.ends_with(".fifo");
        let out = Outgoing {
            key: i,
            body,
            attributes,
            group_id: fifo_dlq.then(|| slot.inc.group_id.clone().unwrap_or_else(|| "triage".into())),
            dedup_id: fifo_dlq.then(|| slot.inc.message_id.clone()),
            delay_seconds: None,
        };
        Some((out, bare))
    }

    /// Sends DLQ copies; marks the accepted records settled and returns the keys of those
    /// that failed.
    async fn send_to_dlq(
        &self,
        slots: &[Slot],
        outgoing: Vec<Outgoing>,
        settled: &mut [bool],
        deadline: Option<Instant>,
    ) -> Vec<usize> {
        if outgoing.is_empty() {
            return Vec::new();
        }
        let sent = self.sqs.send(&self.dlq_url, outgoing, deadline).await;
        for (i, why) in &sent.failed {
            warn!(message_id = %slots[*i].inc.message_id, error = %why, "DLQ refused the copy; the message stays in its queue");
        }
        for &i in &sent.accepted {
            settled[i] = true;
        }
        sent.failed.into_iter().map(|(i, _)| i).collect()
    }

    /// Keeps this environment's memory of counts the ledger refused: a job whose count was
    /// lost comes back to a ledger that many executions short, so its next read here adds
    /// them (see [`LostCounts`]). A job that is done with forgets them.
    fn remember_counts(&self, slots: &[Slot], settled: &[bool], lost: &[usize]) {
        let mut memory = self.lost_counts.lock().unwrap_or_else(|e| e.into_inner());
        for &i in lost {
            memory.add(slots[i].lost_key());
        }
        for (s, _) in slots.iter().zip(settled).filter(|(_, done)| **done) {
            memory.forget(&s.lost_key());
        }
    }

    /// Counts executions in the ledger (one conditional write each, in parallel). Returns
    /// the keys whose count could not be written.
    async fn count(
        &self,
        slots: &[Slot],
        ran: &[Ran],
        keys: &[usize],
        deadline: Option<Instant>,
    ) -> Vec<usize> {
        let writes = futures::future::join_all(keys.iter().map(|&i| {
            let (s, r) = (&slots[i], &ran[i]);
            let (next, error) = match &r.decision {
                Decision::Retry {
                    next_attempt_at_ms,
                    error,
                    ..
                } => (Some(*next_attempt_at_ms), error.as_str()),
                Decision::DeadLetter { error, .. } => (None, error.as_str()),
                _ => (None, ""),
            };
            let delivery = Delivery {
                message_id: &s.inc.message_id,
                receive_count: s.inc.receive_count,
            };
            self.ledger.count(
                s.job_type().unwrap_or_default(),
                &s.job_id,
                delivery,
                next,
                error,
                deadline,
            )
        }))
        .await;
        let mut lost = Vec::new();
        for (w, &i) in writes.iter().zip(keys) {
            if let Err(e) = w {
                warn!(job_id = %slots[i].job_id, error = %e, "attempt not recorded; the receive count bounds it instead");
                lost.push(i);
            }
        }
        lost
    }

    /// Carries out the decisions, each kind of effect batched: DLQ copies first (their
    /// answer decides which records are settled and which executions must be counted
    /// because they stay), then counts, ledger cleanup, breaker reports and visibility
    /// changes together. Everything ends by the settle margin before the deadline, so the
    /// batch response still goes out in time.
    async fn apply(
        &self,
        slots: &[Slot],
        ran: Vec<Ran>,
        deadline: Option<Instant>,
        mut metrics: Metrics,
    ) -> BatchOutcome {
        let deadline = settle_deadline(deadline);
        let now = now_ms();
        let mut settled = vec![false; slots.len()];
        let mut outgoing = Vec::new();
        let mut bare = vec![false; slots.len()];
        let mut visibility = Vec::new();
        let mut counts = Vec::new();
        let mut aggregates: BTreeMap<&str, Aggregate> = BTreeMap::new();

        for (i, (slot, r)) in slots.iter().zip(&ran).enumerate() {
            let ty = self.dimension(slot.job_type());
            metrics.decision(ty, &r.decision);
            if let Some(t) = r.handler_time {
                metrics.handler_duration(ty, t);
            }
            if let (true, Some(job_type)) = (r.executed, slot.job_type()) {
                let agg = aggregates.entry(job_type).or_default();
                tally(agg, r);
            }
            match &r.decision {
                Decision::Done { .. } => settled[i] = true,
                Decision::Retry { visibility: v, .. } | Decision::Defer { visibility: v, .. } => {
                    visibility.push((i, slot.inc.receipt_handle.clone(), v.as_secs() as i32));
                    if let Decision::Retry { .. } = r.decision {
                        counts.push(i);
                    }
                }
                Decision::Release => visibility.push((i, slot.inc.receipt_handle.clone(), 0)),
                Decision::DeadLetter { .. } => {
                    if let Some((out, no_room)) = self.dlq_outgoing(i, slot, &r.decision, now) {
                        bare[i] = no_room;
                        outgoing.push(out);
                    }
                }
                Decision::Execute { .. } => unreachable!("the second decision never admits"),
            }
        }

        // DLQ first: an executed record whose copy was refused stays in the queue, so its
        // execution is counted; one whose copy went without its record keeps the record
        // (the error) in its ledger item.
        for i in self.send_to_dlq(slots, outgoing, &mut settled, deadline).await {
            if ran[i].executed {
                counts.push(i);
            }
        }
        for (i, _) in bare.iter().enumerate().filter(|(_, b)| **b) {
            if settled[i] && ran[i].executed {
                counts.push(i);
            }
        }
        let forget: Vec<(String, String)> = slots
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                settled[*i] && !bare[*i] && (s.had_ledger_item || s.ledger == Ledger::Unavailable)
            })
            .map(|(_, s)| (s.job_type().unwrap_or_default().to_owned(), s.job_id.clone()))
            .collect();

        let breaker_reports = futures::future::join_all(aggregates.iter().map(|(t, a)| async move {
            let Some(b) = self.breakers.get(*t) else {
                return false;
            };
            match b.report(t, a, now, deadline).await {
                Ok(Some(state)) => state.phase == Phase::Open,
                Ok(None) => false,
                Err(e) => {
                    warn!(job_type = t, error = %e, "breaker report lost");
                    false
                }
            }
        }));
        let (_, lost, opened, _) = tokio::join!(
            self.sqs
                .change_visibility(&self.source_queue, visibility, deadline),
            self.count(slots, &ran, &counts, deadline),
            breaker_reports,
            async {
                if !forget.is_empty() {
                    if let Err(e) = self.ledger.forget(&forget, deadline).await {
                        warn!(error = %e, "attempt ledger cleanup failed; the items expire by TTL");
                    }
                }
            },
        );
        for (t, o) in aggregates.keys().zip(opened) {
            if o {
                metrics.add(self.dimension(Some(t)), "BreakerOpened", 1);
            }
        }
        self.remember_counts(slots, &settled, &lost);
        for i in slots
            .iter()
            .enumerate()
            .filter(|(i, _)| !settled[*i])
            .map(|(i, _)| i)
        {
            if let Decision::DeadLetter {
                class: FailureClass::Expiring,
                ..
            } = ran[i].decision
            {
                tracing::error!(message_id = %slots[i].inc.message_id, job_id = %slots[i].job_id, "last receive and the DLQ refused the copy: SQS's redrive will move the message without a failure record");
                metrics.add(self.dimension(slots[i].job_type()), "ExpiringUnrecorded", 1);
            }
        }

        let mut whole_batch_failed = false;
        let records = slots
            .iter()
            .zip(ran)
            .zip(settled)
            .map(|((s, r), settled)| {
                whole_batch_failed |= !settled && s.inc.message_id.is_empty();
                let span = info_span!(
                    "record",
                    message_id = %s.inc.message_id,
                    job_id = %s.job_id,
                    job_type = s.job_type().unwrap_or("-"),
                    decision = r.decision.name(),
                );
                span.in_scope(|| log_decision(&r.decision, s, self.log_payloads));
                RecordReport {
                    message_id: s.inc.message_id.clone(),
                    job_id: s.job_id.clone(),
                    job_type: s.job_type().map(str::to_owned),
                    decision: r.decision,
                    executed: r.executed,
                    settled,
                }
            })
            .collect();
        BatchOutcome {
            records,
            metrics,
            whole_batch_failed,
        }
    }
}

/// The attribute names only the processor may set on a DLQ copy.
fn is_reserved(name: &str) -> bool {
    name == crate::core::failure::FAILURE_ATTRIBUTE || name == crate::effects::dlq::PACKED_ATTRIBUTE
}

/// Adds one executed record's outcome to its job type's breaker report.
fn tally(agg: &mut Aggregate, r: &Ran) {
    let transient = matches!(
        r.error_kind,
        Some(ErrorKind::Transient | ErrorKind::RetryAfter(_))
    );
    match (&r.lease, r.error_kind) {
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
            agg.generation = r.generation;
        }
        (None, _) => {}
    }
}

fn log_decision(d: &Decision, s: &Slot, log_payloads: bool) {
    // Bodies stay out of logs unless explicitly enabled: they may hold personal data.
    let body = log_payloads.then_some(s.inc.body.as_str());
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
        Decision::Execute { .. } => {}
    }
}

/// An error text as logged: cut to 256 characters and, unless payloads may be logged, with
/// every quoted span (`…` or "…") masked — decoders (serde's "unknown variant `x`", "invalid
/// type: string \"x\"") and most libraries echo input values there.
pub(crate) fn loggable(s: &str, log_payloads: bool) -> String {
    let s = truncate(s);
    if log_payloads {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut open: Option<char> = None;
    // Inside a span, a backslash escapes the next character: the `{:?}` form of an error
    // (`Error("invalid type: string \"x\"")`) must not reopen outside its own quotes.
    let mut escaped = false;
    for c in s.chars() {
        match open {
            None => {
                out.push(c);
                if c == '`' || c == '"' {
                    open = Some(c);
                    out.push('…');
                }
            }
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => {
                out.push(c);
                open = None;
            }
            Some(_) => {}
        }
    }
    out
}

/// Error texts in logs are cut: they may echo payload data.
fn truncate(s: &str) -> &str {
    match s.char_indices().nth(256) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Runs a handler in its own task so a panic fails only this record, and stops it at the
/// report margin before the deadline.
async fn run_handler(
    route: &Route,
    payload: serde_json::Value,
    ctx: JobContext,
    deadline: Option<Instant>,
) -> Result<(), JobError> {
    let mut task = tokio::spawn(route.call(payload, ctx).instrument(tracing::Span::current()));
    let joined = match deadline {
        None => (&mut task).await,
        Some(d) => match tokio::time::timeout_at(d - REPORT_MARGIN, &mut task).await {
            Ok(j) => j,
            Err(_) => {
                task.abort();
                return Err(JobError::transient(
                    "handler still running at the batch's deadline",
                ));
            }
        },
    };
    match joined {
        Ok(r) => r,
        Err(e) if e.is_panic() => Err(JobError::panic(e.into_panic().as_ref())),
        Err(_) => Err(JobError::transient("handler task was cancelled")),
    }
}

#[cfg(test)]
mod log_tests {
    use super::loggable;

    #[test]
    fn quoted_values_are_masked_unless_payloads_are_logged() {
        let e = "payload does not decode: unknown variant `s3cr3t`, expected `ok`; got \"s3cr3t\"";
        let masked = loggable(e, false);
        assert!(!masked.contains("s3cr3t"), "{masked}");
        assert!(masked.starts_with("payload does not decode: unknown variant `…`"));
        assert_eq!(loggable(e, true), e);
        assert_eq!(loggable(&"x".repeat(1_000), false).len(), 256);
        // The Debug form of a decode error escapes its inner quotes.
        let debug = format!("{:?}", "invalid type: string \"s3cr3t\", expected u32");
        let masked = loggable(
            &format!("called `unwrap()` on an `Err` value: Error({debug})"),
            false,
        );
        assert!(!masked.contains("s3cr3t"), "{masked}");
    }
}
