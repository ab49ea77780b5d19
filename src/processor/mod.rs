//! The batch processor: SQS records in, the batch response out. Both runtimes (Lambda and the
//! worker) are thin over [`Processor::process`]. A record goes through four steps, a file
//! each, in the order [`Processor::process_within`] calls them:
//!
//! 1. **Read** (`read.rs`): an [`Incoming`] message becomes a `Record`: envelope parsed, job
//!    type routed, delivery facts taken. Its ledger item and its breaker are read with the
//!    batch's, in one round trip, when step 2 starts.
//! 2. **Admit and run** (`run.rs`): a `Record` becomes a `Ran`: the decision before the
//!    handler, the handler in its own task, the decision after it. FIFO groups run in order,
//!    the rest side by side.
//! 3. **Plan** (`plan.rs`): a `Ran` becomes a `Step`, every effect computed without I/O.
//! 4. **Execute** (`execute.rs`): the steps' effects in batched calls, DLQ copies first; each
//!    step becomes its [`RecordReport`].
//!
//! Beside step 2, the visibility heartbeat (`heartbeat.rs`) keeps the batch's messages hidden
//! while handlers outlast their visibility timeout, and takes records that ended through
//! steps 3 and 4 at its ticks. One [`Deadline`] (`deadline.rs`) carries the time through all.
//! A batch of first deliveries that all succeed before the heartbeat's first tick, of job
//! types without a completion marker, makes no AWS call at all.

mod deadline;
mod execute;
mod heartbeat;
mod lost;
mod plan;
mod read;
pub mod registry;
mod run;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

pub use deadline::Deadline;
pub(crate) use deadline::REPORT_MARGIN;
use crate::core::Decision;
use crate::core::envelope::EnvelopeLimits;
use crate::effects::breaker_store::BreakerStore;
use crate::effects::dlq::{DlqLimit, FALLBACK_MAX_MESSAGE_BYTES};
use crate::effects::ledger::AttemptLedger;
use crate::effects::metrics::Metrics;
use crate::effects::sqs::Sqs;
use crate::runtime::env::StartupError;
use heartbeat::MovingDeadline;
pub use heartbeat::{DEFAULT_HEARTBEAT, TICKS_AHEAD};
#[cfg(feature = "internals")]
pub use heartbeat::{DEADLINE_SLACK, extension};
use lost::LostCounts;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use plan::{Effects, Plan, Step};
#[doc(hidden)]
pub use read::Record;
pub use read::Incoming;
pub(crate) use read::read_count;
use registry::Registry;
#[doc(hidden)]
pub use run::Ran;

/// Where a processor sends things and what it reads from.
#[derive(Debug, Clone)]
pub struct Processor {
    registry: Arc<Registry>,
    sqs: Sqs,
    ledger: AttemptLedger,
    breakers: Arc<HashMap<String, BreakerStore>>,
    source_queue: String,
    dlq_url: String,
    dlq_limit: DlqLimit,
    concurrency: usize,
    limits: EnvelopeLimits,
    log_payloads: bool,
    receive_limit: Option<u32>,
    retention: Option<Duration>,
    lost_counts: Arc<std::sync::Mutex<LostCounts>>,
    draining: Arc<AtomicBool>,
    heartbeat: Option<Duration>,
    visibility: Option<Duration>,
    /// Start-up's first breaker read, when start-up left it running ([`FirstRead`]).
    first_read: Option<Arc<FirstRead>>,
}

impl Processor {
    /// A processor over these effects. Breaker reports that only add to a counting window
    /// are sent through `ledger`'s client, in its batched write: the breakers' tables must be
    /// reachable with it (the same account and region).
    pub fn new(
        registry: Arc<Registry>,
        sqs: Sqs,
        ledger: AttemptLedger,
        breakers: HashMap<String, BreakerStore>,
        config: ProcessorConfig,
    ) -> Self {
        Self::with_shared_breakers(registry, sqs, ledger, Arc::new(breakers), config)
    }

    /// [`new`](Self::new) with breaker stores another task also holds (start-up's first read).
    pub(crate) fn with_shared_breakers(
        registry: Arc<Registry>,
        sqs: Sqs,
        ledger: AttemptLedger,
        breakers: Arc<HashMap<String, BreakerStore>>,
        config: ProcessorConfig,
    ) -> Self {
        Self {
            registry,
            sqs,
            ledger,
            breakers,
            source_queue: config.source_queue,
            dlq_url: config.dlq_url,
            dlq_limit: DlqLimit::known(config.dlq_max_bytes),
            concurrency: config.concurrency.max(1),
            limits: config.limits,
            log_payloads: config.log_payloads,
            receive_limit: config.receive_limit,
            retention: config.retention,
            lost_counts: Arc::default(),
            draining: Arc::new(AtomicBool::new(false)),
            heartbeat: Some(DEFAULT_HEARTBEAT),
            visibility: None,
            first_read: None,
        }
    }

    /// Leaves start-up's first breaker read running: the first admission waits for it.
    pub(crate) fn with_first_read(mut self, read: FirstRead) -> Self {
        self.first_read = Some(Arc::new(read));
        self
    }

    /// The outcome of start-up's first breaker read, waiting for it the first time, until `by`
    /// at the latest; `Ok` when start-up made it before returning (or skipped it, logged), and
    /// when it is not done by `by` (the read goes on for the next caller; this one's admission
    /// reads the breakers itself, within its own deadline). A misconfigured table (missing,
    /// another key, no access) is an `Err` naming `TRIAGE_TABLE`, every time.
    pub async fn first_read(&self, by: Option<Instant>) -> Result<(), StartupError> {
        let Some(r) = &self.first_read else {
            return Ok(());
        };
        match by {
            Some(by) => tokio::time::timeout_at(by, r.outcome()).await.unwrap_or_else(|_| {
                tracing::warn!("the first breaker read is not done by the admission's deadline; admission reads itself");
                Ok(())
            }),
            None => r.outcome().await,
        }
    }

    /// Sets the visibility heartbeat: every `every`, while a batch's handlers run, the
    /// visibility timeout of the batch's messages is extended (see `TRIAGE_HEARTBEAT_S`);
    /// `None` (or zero): no heartbeat. Default: [`DEFAULT_HEARTBEAT`].
    pub fn with_heartbeat(mut self, every: Option<Duration>) -> Self {
        self.heartbeat = every.filter(|d| !d.is_zero());
        self
    }

    /// The DLQ's message size limit, in place of the configuration's `dlq_max_bytes`: one
    /// [`DlqLimit::unknown`] is read from the DLQ before the first batch that dead-letters
    /// anything is planned for good, and kept.
    pub fn with_dlq_limit(mut self, limit: DlqLimit) -> Self {
        self.dlq_limit = limit;
        self
    }

    /// The source queue's visibility timeout, when known: an extension never sets less.
    pub fn with_visibility_timeout(mut self, visibility: Option<Duration>) -> Self {
        self.visibility = visibility;
        self
    }

    /// The DLQ's message size limit copies are sized for now: the known one, else the
    /// fallback.
    fn dlq_max_bytes(&self) -> usize {
        self.dlq_limit.get().unwrap_or(FALLBACK_MAX_MESSAGE_BYTES)
    }

    /// Where the processor reads time: its ledger's clock (the system's, or a test's).
    fn clock(&self) -> &crate::clock::Clock {
        self.ledger.clock()
    }

    /// The heartbeat's interval (`None`: off).
    pub fn heartbeat(&self) -> Option<Duration> {
        self.heartbeat
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

    /// Processes one batch. `deadline` is the invocation's deadline (none for the worker).
    ///
    /// The outcome's storage counters are the environment's retries made while the batch ran:
    /// exact for Lambda (one invocation at a time); a worker running batches side by side on
    /// one environment may count a neighbour's retry in either batch.
    pub async fn process(&self, records: Vec<Incoming>, deadline: Option<Instant>) -> BatchOutcome {
        self.process_within(records, Deadline::new(deadline)).await
    }

    /// Processes one batch by `deadline`: [`process`](Self::process) with a deadline that may
    /// follow the messages' visibility (the worker's).
    pub async fn process_within(&self, records: Vec<Incoming>, deadline: Deadline) -> BatchOutcome {
        let before = self.sqs.retry().stats();
        let n = records.len();
        let mut metrics = Metrics::default();
        // 1. Read (its storage reads are made in step 2's future, under the heartbeat).
        let records = self.read_batch(records, &mut metrics);
        // 2. Admit and run. Boxed, as the steps below: nested, their futures make too deep a
        // type for the compiler.
        let (ran, deadline, early) = Box::pin(self.run_held(records, deadline, &mut metrics, true)).await;
        let (indices, ran): (Vec<usize>, Vec<Ran>) = ran.into_iter().unzip();
        // 3. Plan. The batch's one breaker report carries the records finished early too.
        let mut plan = Box::pin(self.plan_now(ran, deadline)).await;
        for (job_type, run) in early.iter().flat_map(|e| &e.runs) {
            plan::tally(plan.breaker_reports.entry(job_type.clone()).or_default(), run);
        }
        plan.metrics.merge(metrics);
        // 4. Execute.
        let last = Box::pin(self.execute(plan, deadline)).await;
        let mut outcome = merge(n, indices, last, early);
        outcome.visible_until = deadline.visible_until();
        let after = self.sqs.retry().stats();
        outcome.metrics.storage_retries = after.retries.saturating_sub(before.retries);
        outcome.metrics.storage_failures = after.failures.saturating_sub(before.failures);
        outcome
    }

    /// Steps 1 and 2 alone: each record with its final decision, in input order, and the
    /// metrics of the reading (ledger fallbacks).
    #[doc(hidden)]
    pub async fn admit_and_run(&self, records: Vec<Incoming>, deadline: Deadline) -> (Vec<Ran>, Metrics) {
        let mut metrics = Metrics::default();
        let records = self.read_batch(records, &mut metrics);
        let (ran, ..) = self.run_held(records, deadline, &mut metrics, false).await;
        (ran.into_iter().map(|(_, r)| r).collect(), metrics)
    }

    /// Step 2 with the heartbeat beside it: the batch's storage reads, then admission and the
    /// handlers. Returns the records not finished early with their positions, in order, the
    /// deadline as the heartbeat left it, and, with `early`, the records the heartbeat finished
    /// at its ticks ([`complete_ended`](Self::complete_ended)). The heartbeat has stopped, its
    /// last call answered, on return.
    async fn run_held(
        &self,
        mut records: Vec<Record>,
        deadline: Deadline,
        metrics: &mut Metrics,
        early: bool,
    ) -> (Vec<(usize, Ran)>, Deadline, Vec<Early>) {
        let hold = MovingDeadline::new(deadline);
        let finished = run::Finished::default();
        let (done, stopped) = tokio::sync::watch::channel(false);
        let held = self.heartbeat.map(|every| (every, self.held(&records, deadline)));
        let beat = async {
            match held {
                Some((every, held)) => {
                    let early = early.then_some(&finished);
                    self.beat(held, every, &hold, stopped, early).await.1
                }
                None => Vec::new(),
            }
        };
        let work = async {
            let states = self.read_state(&mut records, hold.deadline(), metrics).await;
            self.run(records, &states, &hold, &finished).await;
            let _ = done.send(true);
        };
        let ((), early) = tokio::join!(work, beat);
        (finished.take(), hold.deadline(), early)
    }

    /// The plan while the DLQ's limit is not known yet: planned with the fallback size; when
    /// that plan sends any copy to the DLQ, the limit is read from the DLQ and the batch
    /// planned again with it (planning is pure). The read ends by the batch's effects deadline (`Deadline::effects_end`):
    /// a read that fails or runs out of time leaves the copies sized for the fallback.
    async fn plan_learning_dlq_limit(&self, ran: Vec<Ran>, now_ms: u64, deadline: Deadline) -> plan::Plan {
        let again = ran.clone();
        let plan = self.plan(ran, now_ms);
        if !plan.sends_copies() {
            return plan;
        }
        self.dlq_limit
            .learn(&self.sqs, &self.dlq_url, deadline.effects_end())
            .await;
        self.plan(again, now_ms)
    }

    /// Step 3 at this moment: the retention rule taken again with the clock now (a decision
    /// taken before may be applied a heartbeat tick later, or after the batch's slowest
    /// handler), then the plan.
    async fn plan_now(&self, ran: Vec<Ran>, deadline: Deadline) -> plan::Plan {
        let now = self.clock().now_ms();
        let ran = ran.into_iter().map(|r| self.retained(r, now)).collect();
        match self.dlq_limit.get() {
            Some(_) => self.plan(ran, now),
            None => self.plan_learning_dlq_limit(ran, now, deadline).await,
        }
    }

    fn retained(&self, mut ran: Ran, now: u64) -> Ran {
        let facts = ran.record.facts;
        let prior = crate::core::decision::attempts_before(facts, ran.record.ledger);
        ran.decision = crate::core::decision::retained(facts, prior, now, ran.decision);
        ran
    }

    /// Finishes records whose handlers ended before the batch's run step did, at a heartbeat
    /// tick: their plan and its effects in the batched calls of a batch of their own (the
    /// breaker report left to the batch's), and, in a worker's batch, the deletes of those
    /// settled. So a retry or deferral lands long before the queue's retention ends, however
    /// long a handler beside it runs.
    pub(super) async fn complete_ended(&self, ended: Vec<(usize, Ran)>, deadline: Deadline) -> Option<Early> {
        if ended.is_empty() {
            return None;
        }
        let (indices, ran): (Vec<usize>, Vec<Ran>) = ended.into_iter().unzip();
        let runs = ran.iter().filter_map(Ran::breaker_run).collect();
        let receipts: Vec<String> = ran.iter().map(|r| r.record.inc.receipt_handle.clone()).collect();
        let mut plan = self.plan_now(ran, deadline).await;
        plan.breaker_reports.clear();
        let mut outcome = self.execute(plan, deadline).await;
        if let Some(until) = deadline.visible_until() {
            let settled: Vec<(usize, String)> = outcome
                .records
                .iter()
                .enumerate()
                .filter(|(k, r)| r.settled && !receipts[*k].is_empty())
                .map(|(k, _)| (k, receipts[k].clone()))
                .collect();
            if !settled.is_empty() {
                let answer = self.sqs.delete(&self.source_queue, settled, Some(until)).await;
                for (k, why) in &answer.failed {
                    tracing::warn!(message_id = %outcome.records[*k].message_id, error = %why, "delete failed; the message will be seen again");
                }
                outcome.deleted = answer.accepted.iter().map(|&k| indices[k]).collect();
            }
        }
        Some(Early {
            indices,
            outcome,
            runs,
        })
    }
}

/// The processor's settings.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// The source queue URL (recorded in failure records, target of visibility changes).
    pub source_queue: String,
    /// The DLQ URL.
    pub dlq_url: String,
    /// The DLQ's maximum message size (see [`Processor::with_dlq_limit`] for one learned from
    /// the DLQ at its first use).
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
    /// For a batch whose deadline follows visibility ([`Deadline::visibility`]): when its
    /// messages may be visible again at the earliest, after the heartbeat's extensions (the
    /// worker deletes the settled ones by then).
    pub visible_until: Option<Instant>,
    /// Positions of the records the processor deleted itself: a batch whose deadline follows
    /// visibility (a worker's) has its records settled at a heartbeat tick deleted then. The
    /// caller deletes the other settled ones.
    pub deleted: Vec<usize>,
}

/// Records finished at a heartbeat tick, before the batch's run step ended.
#[derive(Debug, Default)]
pub(super) struct Early {
    /// Their positions in the batch, in the order of `outcome.records`.
    indices: Vec<usize>,
    outcome: BatchOutcome,
    /// Their handlers' runs, for the batch's breaker report.
    runs: Vec<(String, run::Run)>,
}

impl Early {
    /// Positions of the records settled but not deleted: their deletes failed.
    pub(super) fn undeleted(&self) -> std::collections::HashSet<usize> {
        self.indices
            .iter()
            .zip(&self.outcome.records)
            .filter(|(i, r)| r.settled && !self.outcome.deleted.contains(i))
            .map(|(i, _)| *i)
            .collect()
    }
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

/// Start-up's first breaker read (the table's check), left running while start-up goes on,
/// the runtime polls and the event is read. The first admission waits for it: no job runs
/// before its breaker is read, or found unreadable and read again by the admission itself.
#[derive(Debug)]
pub(crate) struct FirstRead {
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<Result<(), StartupError>>>>,
    outcome: tokio::sync::OnceCell<Result<(), StartupError>>,
}

impl FirstRead {
    /// Starts `read` on the runtime now.
    pub(crate) fn start(
        read: impl std::future::Future<Output = Result<(), StartupError>> + Send + 'static,
    ) -> Self {
        Self {
            task: tokio::sync::Mutex::new(Some(tokio::spawn(read))),
            outcome: tokio::sync::OnceCell::new(),
        }
    }

    /// The read's outcome, waiting for it the first time. A caller that stops waiting leaves
    /// the read to the next one.
    async fn outcome(&self) -> Result<(), StartupError> {
        self.outcome
            .get_or_init(|| async {
                let mut task = self.task.lock().await;
                match task.as_mut() {
                    Some(t) => t.await.unwrap_or_else(|e| {
                        // The admission reads the breakers itself, as after a skipped check.
                        tracing::warn!(error = %e, "the first breaker read did not finish; admission reads again");
                        Ok(())
                    }),
                    None => Ok(()),
                }
            })
            .await
            .clone()
    }
}


/// The batch's outcome from its last execute and the early ones: every record's report at
/// its position, metrics added up.
fn merge(n: usize, indices: Vec<usize>, last: BatchOutcome, early: Vec<Early>) -> BatchOutcome {
    let mut records: Vec<Option<RecordReport>> = vec![None; n];
    let mut out = BatchOutcome {
        whole_batch_failed: last.whole_batch_failed,
        metrics: last.metrics,
        ..BatchOutcome::default()
    };
    for (i, r) in indices.into_iter().zip(last.records) {
        records[i] = Some(r);
    }
    for e in early {
        out.metrics.merge(e.outcome.metrics);
        out.whole_batch_failed |= e.outcome.whole_batch_failed;
        out.deleted.extend(e.outcome.deleted);
        for (i, r) in e.indices.into_iter().zip(e.outcome.records) {
            records[i] = Some(r);
        }
    }
    out.records = records.into_iter().flatten().collect();
    out
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
