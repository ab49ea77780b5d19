//! Step 2, admit and run: per record, admission (the decision before the handler, with the
//! breaker's answer), the handler in its own task, and the decision after it. Records of one
//! FIFO message group go in order and stop at the first that does not finish; all other
//! records run side by side, `concurrency` at a time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::stream;
use tokio::time::Instant;
use tracing::{Instrument, warn};

use super::heartbeat::MovingDeadline;
use super::plan::tally;
use super::read::Record;
use super::registry::{JobContext, Route};
use super::{Deadline, Processor};
use crate::core::breaker::{Aggregate, BreakerState, Lease};
use crate::core::decision::{attempts_before, held_back};
use crate::core::envelope::Payload;
use crate::core::error::ErrorKind;
use crate::core::{Decision, Gate, Inputs, JobError, Verdict, admit, conclude, invalid};
use crate::effects::breaker_store::{Admission, BreakerStore};

/// A record after step 2: its final decision and, when its handler ran, how that went.
#[derive(Debug, Clone)]
pub struct Ran {
    pub(super) record: Record,
    pub(super) decision: Decision,
    /// `Some` when the handler ran.
    pub(super) run: Option<Run>,
}

/// How a handler run went, for the breaker and the metrics.
#[derive(Debug, Clone)]
pub(super) struct Run {
    /// The handler's error as the job type's rules classify it; `None`: it succeeded.
    pub(super) error: Option<ErrorKind>,
    /// The probe permit it ran with (half-open breaker).
    pub(super) lease: Option<Lease>,
    /// The breaker generation it was admitted in: its failures count there.
    pub(super) generation: u64,
    pub(super) time: Duration,
    /// Its probe outcome was reported when it ended (a worker's probe, see
    /// [`Processor::report_probe`]): the batch's breaker report leaves it out.
    pub(super) reported: bool,
}

/// The records whose handlers have ended, with their positions in the batch, waiting to be
/// finished: at the next heartbeat tick, or after the run step.
#[derive(Debug, Default)]
pub(super) struct Finished(std::sync::Mutex<Vec<(usize, Ran)>>);

impl Finished {
    fn push(&self, i: usize, ran: Ran) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push((i, ran));
    }

    /// Takes every record waiting, in batch order.
    pub(super) fn take(&self) -> Vec<(usize, Ran)> {
        let mut all = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        all.sort_by_key(|(i, _)| *i);
        all
    }
}

impl Ran {
    /// The job type and the handler's run, for the batch's breaker report.
    pub(super) fn breaker_run(&self) -> Option<(String, Run)> {
        Some((self.record.job_type()?.to_owned(), self.run.clone()?))
    }

    fn without_run(record: Record, decision: Decision) -> Self {
        Self {
            record,
            decision,
            run: None,
        }
    }
}

impl Processor {
    /// Admits and runs every record by the deadline `hold` keeps (the heartbeat may move a
    /// worker's); each record goes to `finished`, with its position, as soon as it ends.
    pub(super) async fn run(
        &self,
        records: Vec<Record>,
        states: &HashMap<String, BreakerState>,
        hold: &MovingDeadline,
        finished: &Finished,
    ) {
        let concurrency = self.concurrency;
        if self.is_fifo() || records.iter().any(|r| r.inc.from_fifo) {
            stream::iter(self.groups(records))
                .map(|group| self.run_group(group, states, hold, finished))
                .buffer_unordered(concurrency)
                .for_each(|()| async {})
                .await
        } else {
            stream::iter(records.into_iter().enumerate())
                // Boxed: a record's future is large, and the stream moves it on its way.
                .map(|(i, record)| Box::pin(async move { (i, self.run_one(record, states, hold).await) }))
                .buffer_unordered(concurrency)
                .for_each(|(i, r)| async move { finished.push(i, r) })
                .await
        }
    }

    /// The records of one FIFO message group, in order: after one that does not finish, the
    /// rest are held back.
    async fn run_group(
        &self,
        group: Vec<(usize, Record)>,
        states: &HashMap<String, BreakerState>,
        hold: &MovingDeadline,
        finished: &Finished,
    ) {
        let mut blocked = false;
        for (i, record) in group {
            let r = if blocked {
                // FIFO: after a failure in the group, later records must not overtake it.
                let facts = record.facts;
                let decision = held_back(facts, attempts_before(facts, record.ledger));
                Ran::without_run(record, decision)
            } else {
                self.run_one(record, states, hold).await
            };
            // A dead-lettered record blocks its group too: its DLQ copy is sent after the
            // handlers, and a later record must not run before that copy exists.
            blocked |= !matches!(r.decision, Decision::Done { .. } | Decision::Duplicate { .. });
            finished.push(i, r);
        }
    }

    /// The records of a FIFO batch by message group, each record with its position.
    fn groups(&self, records: Vec<Record>) -> Vec<Vec<(usize, Record)>> {
        let mut order: Vec<Vec<(usize, Record)>> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, r) in records.into_iter().enumerate() {
            let g = r.inc.group_id.clone().unwrap_or_default();
            match index.get(&g) {
                Some(&k) => order[k].push((i, r)),
                None => {
                    index.insert(g, order.len());
                    order.push(vec![(i, r)]);
                }
            }
        }
        order
    }

    /// One record through admission, its handler and the decision after it.
    async fn run_one(&self, mut record: Record, states: &HashMap<String, BreakerState>, hold: &MovingDeadline) -> Ran {
        let deadline = hold.deadline();
        let (job, route) = match &record.job {
            Ok((job, route)) => (job, Arc::clone(route)),
            Err(reason) => {
                let decision = invalid(reason);
                return Ran::without_run(record, decision);
            }
        };
        let (verdict, admission) = self.admit(&record, &route, states, deadline).await;
        let attempt = match verdict {
            Verdict::Run { attempt } => attempt,
            Verdict::Decided(decision) => return Ran::without_run(record, decision),
        };
        // A worker's probe never outlives its lease: its handler is stopped by the lease's end
        // and its outcome reported as soon as it ends, however far the heartbeat moves the
        // batch (whose other handlers run on).
        let probe_cap = admission
            .permit
            .as_ref()
            .filter(|_| self.deadline_moves(deadline))
            .map(|lease| {
                let left = lease.expires_at_ms.saturating_sub(self.clock().now_ms());
                Instant::now() + Duration::from_millis(left)
            });
        let ctx = JobContext {
            job_id: record.job_id.clone(),
            job_type: job.job_type.clone(),
            message_id: record.inc.message_id.clone(),
            attempt,
            max_attempts: route.policy.max_attempts(),
            // A deadline the heartbeat moves is none: the handler is not stopped by it.
            deadline_ms: probe_cap
                .map_or(deadline, |c| deadline.at_most(c))
                .admission()
                .filter(|_| probe_cap.is_some() || !self.deadline_moves(deadline))
                .map(|at| {
                    let left = at.saturating_duration_since(Instant::now());
                    self.clock().now_ms().saturating_add(left.as_millis() as u64)
                }),
        };
        tracing::debug!(message_id = %record.inc.message_id, job_id = %record.job_id, attempt, "handler started");
        // The handler takes the payload itself: nothing after it reads the record's (a DLQ
        // copy carries the body).
        let payload = record
            .job
            .as_mut()
            .map(|(j, _)| std::mem::take(&mut j.payload))
            .unwrap_or_default();
        let started = Instant::now();
        let outcome = run_handler(&route, payload, ctx, hold, probe_cap).await;
        let time = started.elapsed();
        let settled = conclude(
            &self.inputs(&record, &route, admission.gate, self.clock().now_ms(), hold.deadline()),
            &outcome,
            &mut rand::rng(),
        );
        let mut run = Run {
            error: settled.error,
            lease: admission.permit,
            generation: admission.generation,
            time,
            reported: false,
        };
        if let Some(cap) = probe_cap {
            let job_type = record.job_type().unwrap_or_default();
            Box::pin(self.report_probe(job_type, &mut run, hold.deadline().at_most(cap))).await;
        }
        Ran {
            record,
            decision: settled.decision,
            run: Some(run),
        }
    }

    /// Reports a worker probe's outcome at once, while its lease still holds (the batch may
    /// run on, its deadline moved by the heartbeat, long after the lease). One conditional
    /// write per probe; probes are few. A report that fails is left to the batch's report.
    async fn report_probe(&self, job_type: &str, run: &mut Run, deadline: Deadline) {
        let Some(store) = self.breakers.get(job_type) else {
            return;
        };
        let mut agg = Aggregate::default();
        tally(&mut agg, run);
        match store.report(job_type, &agg, self.clock().now_ms(), deadline.at()).await {
            Ok(_) => run.reported = true,
            Err(e) => {
                warn!(job_type, error = %e, "probe outcome not reported yet; the batch's report carries it")
            }
        }
    }

    /// Whether `deadline` is one the heartbeat may move later (a worker's, with the heartbeat
    /// on), so a probe lease cannot simply end with it.
    fn deadline_moves(&self, deadline: Deadline) -> bool {
        self.heartbeat.is_some() && deadline.visible_until().is_some()
    }

    /// Admission: whether a record runs, and what the breaker allows it. A half-open breaker is
    /// asked for a probe permit only for a record that would run with one; asking takes time,
    /// so the decision is taken again after (the start margin counts), and a permit that is
    /// then not used is given back.
    async fn admit(
        &self,
        record: &Record,
        route: &Route,
        states: &HashMap<String, BreakerState>,
        deadline: Deadline,
    ) -> (Verdict, Admission) {
        let job_type = record.job_type().unwrap_or_default();
        let breaker = self.breakers.get(job_type).zip(states.get(job_type));
        let now = self.clock().now_ms();
        let seen = breaker.map_or_else(Admission::closed, |(b, s)| b.view(s, now));
        let verdict = self.verdict(record, route, seen.if_granted(), now, deadline);
        let Some((store, _)) = breaker.filter(|_| verdict.runs() && seen.needs_probe()) else {
            return (verdict, seen);
        };
        // The breaker's calls are boxed, as are the other calls a record rarely makes: inline,
        // their SDK futures would make every record's future kilobytes long, copied as it
        // moves (into the batch's stream, and on).
        let admission = Box::pin(store.admit(
            job_type,
            &seen,
            now,
            self.lease_until(store, deadline, now),
            deadline.admission(),
        ))
        .await;
        let verdict = self.verdict(record, route, admission.gate, self.clock().now_ms(), deadline);
        if let (false, Some(lease)) = (verdict.runs(), &admission.permit) {
            if let Err(e) = Box::pin(store.release(job_type, lease, self.clock().now_ms(), deadline.admission())).await {
                warn!(job_type, error = %e, "probe permit not released; it frees its slot when its lease expires");
            }
        }
        (verdict, admission)
    }

    /// Until when (epoch ms) a probe permit taken at `now` is held. A fixed deadline (a Lambda
    /// invocation, a worker without heartbeat): the deadline, the moment the probe can no
    /// longer be running. A worker's deadline that the heartbeat may move: the deadline or the
    /// breaker's configured lease, whichever ends later; the probe's handler is then stopped by
    /// the lease's end and its outcome reported at once ([`Processor::report_probe`]), so the
    /// probe never runs, or is reported, without its lease.
    fn lease_until(&self, store: &BreakerStore, deadline: Deadline, now: u64) -> Option<u64> {
        let at = deadline.epoch_ms(now);
        if !self.deadline_moves(deadline) {
            return at;
        }
        let lease = now.saturating_add(store.config().lease().as_millis() as u64);
        Some(at.map_or(lease, |at| at.max(lease)))
    }

    /// The decision before the handler, with the breaker's gate at `now`.
    fn verdict(&self, record: &Record, route: &Route, gate: Gate, now: u64, deadline: Deadline) -> Verdict {
        admit(&self.inputs(record, route, gate, now, deadline), &mut rand::rng())
    }

    /// What the decision depends on for this record at `now`.
    fn inputs<'a>(
        &self,
        record: &Record,
        route: &'a Route,
        gate: Gate,
        now: u64,
        deadline: Deadline,
    ) -> Inputs<'a> {
        Inputs {
            record: record.facts,
            ledger: record.ledger,
            gate,
            time_left: if self.draining.load(Ordering::SeqCst) {
                Some(Duration::ZERO)
            } else {
                deadline.time_left()
            },
            policy: &route.policy,
            now_ms: now,
        }
    }
}

/// Runs a handler in its own task so a panic fails only this record, handlers run side by
/// side on the runtime's threads, and one that never yields (blocking or CPU-bound) neither
/// holds up the batch (its heartbeat, the other handlers) nor outlives it: it is stopped at the
/// report margin before the deadline — the deadline as it is then: a worker's moves while the
/// heartbeat keeps the batch's messages hidden.
async fn run_handler(
    route: &Route,
    payload: Payload,
    ctx: JobContext,
    hold: &MovingDeadline,
    cap: Option<Instant>,
) -> Result<(), JobError> {
    let mut task = tokio::spawn(route.call(payload, ctx).instrument(tracing::Span::current()));
    let deadline = || {
        let d = hold.deadline();
        cap.map_or(d, |c| d.at_most(c))
    };
    let joined = loop {
        let Some(stop) = deadline().admission() else {
            break (&mut task).await;
        };
        match tokio::time::timeout_at(stop, &mut task).await {
            Ok(j) => break j,
            Err(_) if deadline().admission().is_some_and(|later| later > stop) => continue,
            Err(_) => {
                task.abort();
                return Err(JobError::transient(
                    "handler still running at the batch's deadline",
                ));
            }
        }
    };
    match joined {
        Ok(r) => r,
        Err(e) if e.is_panic() => Err(JobError::panic(e.into_panic().as_ref())),
        Err(_) => Err(JobError::transient("handler task was cancelled")),
    }
}
