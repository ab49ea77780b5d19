//! The circuit breaker shared by every environment through DynamoDB.
//!
//! One item per job type (`pk = breaker#<job_type>`, `sk = state`) holds the pure
//! [`BreakerState`]; the transitions themselves are
//! computed by [`crate::core::breaker`]. Every write is a whole-item `PutItem` conditioned
//! on the version and phase that were read (`attribute_not_exists(pk)` for a breaker never
//! written); when the condition fails the store re-reads and re-applies the transition, a
//! bounded number of times. So 50 environments racing for one probe slot get exactly one
//! permit, and a report computed from an old state is never written over a newer one.
//!
//! Reads for [`observe`](BreakerStore::observe) are cached per environment for
//! [`BreakerConfig::cache_ttl`]; admission ([`view`](BreakerStore::view), then
//! [`admit`](BreakerStore::admit) for a record that would run on a half-open breaker) works
//! from that one read per batch and job type. The healthy path (closed, no window counting)
//! makes no writes; while a window counts, a healthy environment writes its executions once
//! per window ([`BreakerStore::with_unreported`]). Reports are aggregated by the caller per
//! invocation and job type, so a failing invocation costs one write per job type once its
//! window is counting (an `ADD` conditioned on the window, see [`Increment`]; the processor
//! sends it as a statement of its batched ledger write, [`BreakerStore::fold`]) and a read and
//! a write when it starts a window or changes the phase. The counters are attributes of the
//! one item (not sharded); once the window reaches the failure rate the breaker opens and
//! further reports stop writing.
//!
//! If DynamoDB stays unavailable after the storage retries, `observe` and `admit` answer
//! closed (fail open, logged): jobs keep running and their attempt limits still bound them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, BatchStatementRequest, ReturnConsumedCapacity, ReturnValue};
use rand::Rng;
use tokio::time::Instant;

use super::ledger::Written;
use super::storage_retry::{FailureKind, StorageError, StorageRetry};
use super::table::{BREAKER_SK, PK, SK, TTL_ATTRIBUTE, breaker_key, breaker_pk, get_consistent};
use crate::core::breaker::{Acquire, Aggregate, BreakerConfig, BreakerState, Increment, Lease, Phase, gate};
use crate::clock::Clock;
use crate::core::decision::Gate;

/// How long a breaker item lives after its last write. A vanished item is a fresh closed
/// breaker, which is what a breaker untouched for this long is anyway.
pub(crate) const BREAKER_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Re-reads after lost conditions before a transition gives up (plus one per probe slot).
pub(crate) const MAX_CONFLICTS: u32 = 16;

/// What the breaker allows one record, as seen by one environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The gate for the decision.
    pub gate: Gate,
    /// The generation the execution is admitted in (put it in the [`Aggregate`]): its
    /// failures count there, and a report about a period that has since ended is ignored.
    pub generation: u64,
    /// The probe permit, when `gate` is [`Gate::Probe`].
    pub permit: Option<Lease>,
}

impl Admission {
    /// No breaker (or none configured): closed.
    pub fn closed() -> Self {
        Self {
            gate: Gate::Closed,
            generation: 0,
            permit: None,
        }
    }

    /// True when the breaker is half-open and this record holds no permit: it may run only
    /// with one, which [`BreakerStore::admit`] asks for.
    pub(crate) fn needs_probe(&self) -> bool {
        matches!(self.gate, Gate::ProbeBusy { .. }) && self.permit.is_none()
    }

    /// The gate this record would have with a permit: asking for one is worth it only when
    /// the record would then run.
    pub(crate) fn if_granted(&self) -> Gate {
        if self.needs_probe() {
            Gate::Probe
        } else {
            self.gate
        }
    }
}

/// The answer to a probe request, as the store saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A slot was taken (or was already held by this request's lease id).
    Granted(Lease),
    /// Every slot is held; the first lease ends at `until_ms`.
    Busy {
        /// When the earliest held lease ends (epoch ms).
        until_ms: u64,
    },
    /// The breaker is not half-open (a cached view was stale): the state as stored.
    NotHalfOpen(BreakerState),
}

/// Breakers read by [`warm`], at most (the first job types in order): as many as a batch of
/// SQS's largest size, 10 records, can name.
pub const WARM_TYPES: usize = 10;

/// Reads the breakers of the job types in `stores` (each type's own store), the first
/// [`WARM_TYPES`] in order, at once: one consistent `GetItem` each, as
/// [`observe`](BreakerStore::observe) reads them, through `retry` (start-up's own, so that a
/// throttled start-up does not spend the retry budget the batches share), each kept in its
/// store's cache for that store's `cache_ttl`. A batch within that lifetime then reads none of
/// them. The runtimes call it at start-up, where it is the table's check too (a missing table,
/// another key schema or a role that may not read the breakers fails it). A job type no
/// envelope can name (longer than [`MAX_JOB_TYPE_LEN`](crate::core::envelope::MAX_JOB_TYPE_LEN))
/// is not read. Returns how many breakers were read; `Err` is the first read that failed after
/// the retries.
pub async fn warm(
    stores: &HashMap<String, BreakerStore>,
    retry: &StorageRetry,
    deadline: Option<Instant>,
) -> Result<usize, StorageError> {
    let mut types: Vec<&str> = stores
        .keys()
        .map(String::as_str)
        .filter(|t| t.chars().count() <= crate::core::envelope::MAX_JOB_TYPE_LEN)
        .collect();
    types.sort_unstable();
    types.truncate(WARM_TYPES);
    let reads = types.iter().map(|t| async move {
        let store = &stores[*t];
        let item = get_consistent(&store.client, retry, &store.table, breaker_key(t), deadline).await?;
        store.remember(t, &item.as_ref().map(from_item).unwrap_or_default());
        Ok::<_, StorageError>(())
    });
    Ok(futures::future::try_join_all(reads).await?.len())
}

/// Whether a state read `elapsed` ago by the monotonic clock, at `read_ms` by the wall clock,
/// is still within `ttl` at `now_ms`: by both clocks, since the monotonic one may not advance
/// while an environment is frozen (between Lambda invocations, or between a provisioned
/// environment's init and its first event) while the breaker's item goes on changing.
fn fresh(elapsed: Duration, read_ms: u64, now_ms: u64, ttl: Duration) -> bool {
    elapsed < ttl && u128::from(now_ms.saturating_sub(read_ms)) < ttl.as_millis()
}

/// The breakers of every job type, in one table.
#[derive(Debug)]
pub struct BreakerStore {
    client: Client,
    table: String,
    retry: StorageRetry,
    config: BreakerConfig,
    /// What the cache's ages and the items' `updated_at` and `expires_at` are read from.
    clock: Clock,
    /// Per job type: the state, and when it was read by the monotonic clock and by the wall
    /// clock (epoch ms).
    cache: Mutex<HashMap<String, (BreakerState, Instant, u64)>>,
    /// Per job type: the executions this environment ran and has not reported yet.
    unreported: Mutex<HashMap<String, Unreported>>,
}

/// One job type's executions that an environment has not reported yet (see
/// [`BreakerStore::with_unreported`]).
#[derive(Debug, Clone, Default)]
struct Unreported {
    /// Executions not yet reported, failures included, per second they were counted in
    /// (epoch ms of the second's start, oldest first). A window counts only the seconds that
    /// began at or after its start.
    seconds: VecDeque<(u64, u32)>,
    /// The closed generation they ran in.
    generation: u64,
    /// The window (generation, start) this environment last reported into.
    reported_into: Option<(u64, u64)>,
}

impl Unreported {
    /// Takes the executions kept since `start_ms` and drops the rest: those before a window
    /// ran outside it and never count in it.
    fn take_since(&mut self, start_ms: u64) -> u32 {
        let kept = self
            .seconds
            .iter()
            .filter(|(second, _)| *second >= start_ms)
            .fold(0u32, |sum, (_, n)| sum.saturating_add(*n));
        self.seconds.clear();
        kept
    }

    /// Keeps `n` executions counted at `now_ms`, dropping those older than a window.
    fn keep(&mut self, n: u32, now_ms: u64, window_ms: u64) {
        let second = now_ms - now_ms % 1_000;
        while self
            .seconds
            .front()
            .is_some_and(|(s, _)| now_ms.saturating_sub(*s) >= window_ms)
        {
            self.seconds.pop_front();
        }
        match self.seconds.back_mut() {
            Some((s, count)) if *s == second => *count = count.saturating_add(n),
            _ => self.seconds.push_back((second, n)),
        }
    }
}

impl BreakerStore {
    /// A store in `table`, every call through `retry`, the default configuration for every
    /// job type (see [`with_config`](Self::with_config)).
    pub fn new(client: Client, table: impl Into<String>, retry: StorageRetry) -> Self {
        Self {
            client,
            table: table.into(),
            retry,
            config: BreakerConfig::default(),
            clock: Clock::system(),
            cache: Mutex::new(HashMap::new()),
            unreported: Mutex::new(HashMap::new()),
        }
    }

    /// Uses `config` for every job type.
    pub fn with_config(mut self, config: BreakerConfig) -> Self {
        self.config = config;
        self
    }

    /// Reads the time from `clock` (the system's by default): the cache's ages, and the
    /// `updated_at` and `expires_at` of what it writes. The times given to its methods are the
    /// caller's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The stored state, read consistently (no cache); a missing item is a fresh breaker.
    pub async fn read(&self, job_type: &str) -> Result<BreakerState, StorageError> {
        self.read_by(job_type, None).await
    }

    /// Like [`read`](Self::read), every try ending by `deadline`.
    pub(crate) async fn read_by(
        &self,
        job_type: &str,
        deadline: Option<Instant>,
    ) -> Result<BreakerState, StorageError> {
        Ok(self.read_raw(job_type, deadline).await?.0)
    }

    /// The stored state and the token of the write that produced it.
    async fn read_raw(
        &self,
        job_type: &str,
        deadline: Option<Instant>,
    ) -> Result<(BreakerState, Option<String>), StorageError> {
        let item = get_consistent(
            &self.client,
            &self.retry,
            &self.table,
            breaker_key(job_type),
            deadline,
        )
        .await?;
        let state = item.as_ref().map(from_item).unwrap_or_default();
        let writer = item
            .as_ref()
            .and_then(|i| i.get("writer"))
            .and_then(|v| v.as_s().ok())
            .cloned();
        self.remember(job_type, &state);
        Ok((state, writer))
    }

    /// The state through this environment's cache (read again after `cache_ttl`), every
    /// try of a read ending by `deadline`.
    pub async fn state(
        &self,
        job_type: &str,
        deadline: Option<Instant>,
    ) -> Result<BreakerState, StorageError> {
        let ttl = self.config.cache_ttl();
        if let Some((s, at, at_ms)) = self.cache.lock().expect("cache lock").get(job_type) {
            let age = self.clock.now().saturating_duration_since(*at);
            if fresh(age, *at_ms, self.clock.now_ms(), ttl) {
                return Ok(s.clone());
            }
        }
        self.read_by(job_type, deadline).await
    }

    /// Keeps `state` as this environment's last known one: reads use it within `cache_ttl`
    /// (with a TTL of zero, never); reports use it however old, to choose how to write.
    fn remember(&self, job_type: &str, state: &BreakerState) {
        self.cache.lock().expect("cache lock").insert(
            job_type.to_owned(),
            (state.clone(), self.clock.now(), self.clock.now_ms()),
        );
    }

    /// The state for one batch, through the cache, every try of a read ending by `deadline`.
    /// Fails open: a breaker that cannot be read is a closed one (logged), so a storage outage
    /// stops nothing.
    pub async fn observe(&self, job_type: &str, deadline: Option<Instant>) -> BreakerState {
        self.state(job_type, deadline).await.unwrap_or_else(|e| {
            tracing::warn!(job_type, error = %e, "breaker state unavailable; treating it as closed");
            BreakerState::default()
        })
    }

    /// What `state` (this environment's view) allows at `now_ms`, asking storage nothing:
    /// closed, open, or, half-open, [`Gate::ProbeBusy`] until the running probes' outcome can
    /// be known (running then needs a permit, see [`admit`](Self::admit)).
    pub fn view(&self, state: &BreakerState, now_ms: u64) -> Admission {
        Admission {
            gate: gate(state, now_ms, &self.config),
            generation: state.at(now_ms).generation,
            permit: None,
        }
    }

    /// What the breaker allows a record that will run if allowed, `seen` being its
    /// [`view`](Self::view) at `now_ms`. Unless half-open, that is `seen`. Half-open, a probe
    /// permit is asked for, held until `lease_until_ms` (see
    /// [`acquire_probe`](Self::acquire_probe)), every try ending by `deadline`:
    /// - granted: [`Gate::Probe`] with the permit, in the permit's generation;
    /// - every slot held: [`Gate::ProbeBusy`] until the first lease ends, at most one open
    ///   period away (a failing probe reopens the breaker for that long anyway);
    /// - not half-open any more (the view was stale): the gate of the state as stored, in its
    ///   generation;
    /// - storage unavailable: [`Gate::Closed`] (fail open, logged), in `seen`'s generation.
    pub async fn admit(
        &self,
        job_type: &str,
        seen: &Admission,
        now_ms: u64,
        lease_until_ms: Option<u64>,
        deadline: Option<Instant>,
    ) -> Admission {
        if !seen.needs_probe() {
            return seen.clone();
        }
        match self
            .acquire_probe(job_type, now_ms, lease_until_ms, deadline)
            .await
        {
            Ok(Probe::Granted(lease)) => Admission {
                gate: Gate::Probe,
                generation: lease.generation,
                permit: Some(lease),
            },
            Ok(Probe::Busy { until_ms }) => Admission {
                gate: Gate::ProbeBusy {
                    until_ms: until_ms.min(now_ms.saturating_add(self.config.open_for().as_millis() as u64)),
                },
                ..seen.clone()
            },
            Ok(Probe::NotHalfOpen(fresh)) => self.view(&fresh, now_ms),
            Err(e) => {
                tracing::warn!(job_type, error = %e, "probe permit unavailable; running without one");
                Admission {
                    gate: Gate::Closed,
                    generation: seen.generation,
                    permit: None,
                }
            }
        }
    }

    /// Takes a probe permit at `now_ms` if the breaker is half-open and a slot is free
    /// (expired leases free theirs). The lease is held until `lease_until_ms` (the
    /// invocation's deadline, so no second probe is admitted while this one can still run)
    /// or, when that is unknown, for the configured lease. Every try ends by `deadline`.
    pub(crate) async fn acquire_probe(
        &self,
        job_type: &str,
        now_ms: u64,
        lease_until_ms: Option<u64>,
        deadline: Option<Instant>,
    ) -> Result<Probe, StorageError> {
        let id = format!("{:016x}", rand::rng().random::<u64>());
        let config = self.config;
        let mut answer = None;
        let written = self
            .transition(job_type, deadline, |s| {
                match s.acquire(&id, now_ms, lease_until_ms, &config) {
                    Acquire::Granted { state, lease } => {
                        answer = Some(Probe::Granted(lease));
                        Some(state)
                    }
                    // The lease id is this request's own: a retried write whose first try landed
                    // and was followed by another writer.
                    Acquire::Held(lease) => {
                        answer = Some(Probe::Granted(lease));
                        None
                    }
                    Acquire::Busy { until_ms } => {
                        answer = Some(Probe::Busy { until_ms });
                        None
                    }
                    Acquire::NotHalfOpen => {
                        answer = Some(Probe::NotHalfOpen(s.clone()));
                        None
                    }
                }
            })
            .await?;
        // `transition` applies the closure at least once before it answers.
        let _ = written;
        Ok(answer.unwrap_or_else(|| Probe::NotHalfOpen(BreakerState::default())))
    }

    /// Gives back a permit whose user code never started (deadline, shutdown, early arrival).
    pub async fn release(
        &self,
        job_type: &str,
        permit: &Lease,
        now_ms: u64,
        deadline: Option<Instant>,
    ) -> Result<(), StorageError> {
        self.transition(job_type, deadline, |s| s.release(permit, now_ms))
            .await?;
        Ok(())
    }

    /// Reports one invocation's outcomes for a job type (one write at most; none when the
    /// aggregate is empty or stale). Returns the state written, if any.
    pub async fn report(
        &self,
        job_type: &str,
        agg: &Aggregate,
        now_ms: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<BreakerState>, StorageError> {
        let written = self.write_report(job_type, agg, now_ms, deadline).await;
        self.reported_into(job_type, agg, &written);
        written
    }

    async fn write_report(
        &self,
        job_type: &str,
        agg: &Aggregate,
        now_ms: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<BreakerState>, StorageError> {
        if agg.is_empty() {
            return Ok(None);
        }
        let config = self.config;
        let cached = self.cached(job_type);
        if let Some(inc) = cached.and_then(|s| s.increment(agg, now_ms, &config)) {
            if let Some(counted) = self.add_failures(job_type, &inc, deadline).await? {
                self.remember(job_type, &counted);
                // Other environments' failures may have brought the window to the rate.
                if counted.trip(now_ms, &config).is_none() {
                    return Ok(Some(counted));
                }
                let opened = self
                    .transition(job_type, deadline, |s| s.trip(now_ms, &config))
                    .await?;
                return Ok(opened.or(Some(counted)));
            }
            // The window, phase or generation changed since this environment last saw it.
        }
        self.transition(job_type, deadline, |s| s.report(agg, now_ms, &config))
            .await
    }

    /// The report to make of `agg`, one invocation's outcomes for `job_type` at `now_ms`, with
    /// this environment's executions not yet reported. An invocation with a transient failure
    /// reports them all. One with successes alone keeps them back (nothing to write), unless
    /// this environment's last known state shows a counting window it has not reported into
    /// yet: then they go, once per window. So a healthy environment writes at most once per
    /// window and job type, and only while some environment reports failures; a healthy fleet
    /// writes nothing. Executions from before the window a report goes into, or from another
    /// generation, are dropped: they say nothing about the window that counts now. So a window
    /// started by this report's own failure holds only this invocation's executions.
    pub fn with_unreported(&self, job_type: &str, agg: &Aggregate, now_ms: u64) -> Aggregate {
        let ordinary = agg.executions.max(agg.transient_failures);
        if ordinary == 0 {
            return agg.clone();
        }
        let window = self.config.window().as_millis() as u64;
        let counting = self
            .cached(job_type)
            .map(|s| s.at(now_ms))
            .filter(|s| {
                s.phase == Phase::Closed
                    && s.generation == agg.generation
                    && s.failures > 0
                    && now_ms.saturating_sub(s.window_start_ms) < window
            })
            .map(|s| (s.generation, s.window_start_ms));
        let mut all = self.unreported.lock().expect("unreported lock");
        let u = match all.get_mut(job_type) {
            Some(u) => u,
            None => all.entry(job_type.to_owned()).or_default(),
        };
        if u.generation != agg.generation {
            u.seconds.clear();
            u.generation = agg.generation;
        }
        let into = match counting {
            _ if agg.transient_failures > 0 => Some(counting.unwrap_or((agg.generation, now_ms))),
            Some(w) if u.reported_into != Some(w) => Some(w),
            _ => None,
        };
        let mut out = agg.clone();
        out.executions = 0;
        match into {
            // This invocation's own executions count in the window it reports into; of those
            // kept back, only the ones counted after the window began.
            Some(w) => {
                out.executions = ordinary.saturating_add(u.take_since(w.1));
                u.reported_into = into;
            }
            None => u.keep(ordinary, now_ms, window),
        }
        out
    }

    /// The report of `agg` as one PartiQL statement to ride in the invocation's batched
    /// ledger write, when this environment's cached state says the report only adds to a
    /// counting window and does not open the breaker. The statement's condition says so of the
    /// item itself (closed, same generation and window, stored counts on which the increment
    /// cannot open it, [`Safe`](crate::core::breaker::Safe), and not this write's own token: a
    /// retried call whose first try landed is refused). `None`: send the report with [`report`](Self::report). Finish it with
    /// [`complete_folded`](Self::complete_folded).
    pub fn fold(&self, job_type: &str, agg: &Aggregate, now_ms: u64) -> Option<FoldedReport> {
        let config = self.config;
        let cached = self.cached(job_type)?;
        // An item without a `version` (written by hand or by something else) is left to
        // `report`, whose `ADD version` gives it one; the statement's `version + 1` cannot.
        if cached.version == 0 {
            return None;
        }
        let inc = cached.increment(agg, now_ms, &config)?;
        let token = format!("{:016x}", rand::rng().random::<u64>());
        let now_s = self.clock.now_ms() / 1000;
        // The stored counts must be ones on which this increment cannot open the breaker
        // (`Safe`): no new values come back from a statement in a batch to check after.
        let (rate_safe, rate_params) = match inc.safe.failures_upto {
            Some(f) => (
                "(\"executions\" >= ? AND \"failures\" <= ?) OR ",
                vec![num(u64::from(inc.safe.executions_from)), num(u64::from(f))],
            ),
            None => ("", Vec::new()),
        };
        let mut parameters = vec![
            num(u64::from(inc.failures)),
            num(u64::from(inc.executions)),
            AttributeValue::S(token.clone()),
            num(now_s * 1000),
            num(now_s + BREAKER_TTL.as_secs()),
            AttributeValue::S(breaker_pk(job_type)),
            AttributeValue::S(BREAKER_SK.to_owned()),
            AttributeValue::S(Phase::Closed.as_str().to_owned()),
            num(inc.generation),
            num(inc.window_start_ms),
            AttributeValue::S(token.clone()),
        ];
        parameters.extend(rate_params);
        parameters.push(num(u64::from(inc.safe.executions_below)));
        let statement = BatchStatementRequest::builder()
            .statement(format!(
                "UPDATE \"{}\" SET \"failures\" = \"failures\" + ? SET \"executions\" = \"executions\" + ? \
                 SET \"version\" = \"version\" + 1 \
                 SET \"writer\" = ? SET \"updated_at\" = ? SET \"{TTL_ATTRIBUTE}\" = ? \
                 WHERE \"{PK}\" = ? AND \"{SK}\" = ? AND \"phase\" = ? AND \"generation\" = ? \
                 AND \"window_start\" = ? AND \"failures\" > 0 \
                 AND (\"writer\" IS MISSING OR \"writer\" <> ?) \
                 AND ({rate_safe}\"executions\" < ?)",
                self.table
            ))
            .set_parameters(Some(parameters))
            .build()
            .expect("statement is set");
        let mut counted = cached;
        counted.failures = counted.failures.saturating_add(inc.failures);
        counted.executions = inc.safe.executions_from.saturating_add(inc.executions);
        counted.version = counted.version.saturating_add(1);
        Some(FoldedReport {
            statement,
            token,
            counted,
        })
    }

    /// Finishes a folded report from what its statement came to: written, the state as this
    /// environment now knows it (closed, below the rate); refused, the report is made
    /// the long way (read, then a conditional write of the reported state), unless the read
    /// shows this write's own token (it had landed); not written by the deadline or the retry
    /// policy's end, the report is sent on its own ([`report`](Self::report)), which may count
    /// it twice if the statement had landed after all: the breaker then opens early, never
    /// late.
    pub async fn complete_folded(
        &self,
        job_type: &str,
        folded: FoldedReport,
        written: Written,
        agg: &Aggregate,
        now_ms: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<BreakerState>, StorageError> {
        let done = self
            .complete_written(job_type, folded, written, agg, now_ms, deadline)
            .await;
        self.reported_into(job_type, agg, &done);
        done
    }

    /// The window a written report of executions went into is the one this environment has
    /// reported into, whatever window it expected: another environment may have started the
    /// window first. So its healthy executions go once per window, not once more.
    fn reported_into(
        &self,
        job_type: &str,
        agg: &Aggregate,
        written: &Result<Option<BreakerState>, StorageError>,
    ) {
        let Ok(Some(s)) = written else { return };
        if agg.executions == 0 || s.phase != Phase::Closed || s.failures == 0 {
            return;
        }
        let mut all = self.unreported.lock().expect("unreported lock");
        if let Some(u) = all.get_mut(job_type) {
            u.reported_into = Some((s.generation, s.window_start_ms));
        }
    }

    async fn complete_written(
        &self,
        job_type: &str,
        folded: FoldedReport,
        written: Written,
        agg: &Aggregate,
        now_ms: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<BreakerState>, StorageError> {
        match written {
            Written::Done => {
                self.remember(job_type, &folded.counted);
                Ok(Some(folded.counted))
            }
            Written::Failed(_) => self.report(job_type, agg, now_ms, deadline).await,
            Written::Refused => {
                let (fresh, writer) = self.read_raw(job_type, deadline).await?;
                if writer.as_deref() == Some(folded.token.as_str()) {
                    return Ok(Some(fresh));
                }
                let config = self.config;
                self.transition_from(job_type, fresh, deadline, |s| s.report(agg, now_ms, &config))
                    .await
            }
        }
    }

    /// This environment's last known state of a breaker, however old (only used to choose
    /// how to write; conditions check the real item).
    fn cached(&self, job_type: &str) -> Option<BreakerState> {
        let cache = self.cache.lock().expect("cache lock");
        cache.get(job_type).map(|(s, ..)| s.clone())
    }

    /// Adds failures to a counting window in one `UpdateItem`, on condition that the item is
    /// still closed in that generation and window. Returns the state after the write; `None`
    /// when the condition failed (the caller falls back to a read and a full write). The
    /// write carries a token, so a retried increment whose first try landed is recognised
    /// instead of counted twice.
    async fn add_failures(
        &self,
        job_type: &str,
        inc: &Increment,
        deadline: Option<Instant>,
    ) -> Result<Option<BreakerState>, StorageError> {
        let now_s = self.clock.now_ms() / 1000;
        let token = format!("{:016x}", rand::rng().random::<u64>());
        let result = self
            .retry
            .call("UpdateItem", deadline, || {
                self.client
                    .update_item()
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .table_name(&self.table)
                    .set_key(Some(breaker_key(job_type)))
                    .update_expression(
                        "ADD failures :n, executions :e, version :one \
                         SET writer = :token, updated_at = :now, #ttl = :exp",
                    )
                    .condition_expression(
                        "phase = :closed AND generation = :g AND window_start = :ws AND failures > :zero \
                         AND (attribute_not_exists(writer) OR writer <> :token)",
                    )
                    .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
                    .expression_attribute_values(":n", num(u64::from(inc.failures)))
                    .expression_attribute_values(":e", num(u64::from(inc.executions)))
                    .expression_attribute_values(":one", num(1))
                    .expression_attribute_values(":zero", num(0))
                    .expression_attribute_values(":token", AttributeValue::S(token.clone()))
                    .expression_attribute_values(":now", num(now_s * 1000))
                    .expression_attribute_values(":exp", num(now_s + BREAKER_TTL.as_secs()))
                    .expression_attribute_values(
                        ":closed",
                        AttributeValue::S(Phase::Closed.as_str().to_owned()),
                    )
                    .expression_attribute_values(":g", num(inc.generation))
                    .expression_attribute_values(":ws", num(inc.window_start_ms))
                    .return_values(ReturnValue::AllNew)
                    .send()
            })
            .await
            .map_err(|e| e.with_resource(&self.table));
        match result {
            Ok(out) => Ok(Some(out.attributes().map(from_item).unwrap_or_default())),
            Err(e) if e.is_conditional_check_failed() => {
                let (fresh, writer) = self.read_raw(job_type, deadline).await?;
                // A retried increment that had landed before its answer was lost.
                Ok((writer.as_deref() == Some(token.as_str())).then_some(fresh))
            }
            Err(e) => Err(e),
        }
    }

    /// Operator: opens the breaker, until closed (`for_ = None`) or for a period.
    pub async fn force_open(
        &self,
        job_type: &str,
        for_: Option<Duration>,
        now_ms: u64,
    ) -> Result<BreakerState, StorageError> {
        let config = self.config;
        self.forced(job_type, |s| s.force_open(for_, now_ms, &config))
            .await
    }

    /// Operator: closes the breaker (in-flight probes become stale).
    pub async fn force_close(&self, job_type: &str) -> Result<BreakerState, StorageError> {
        self.forced(job_type, BreakerState::force_close).await
    }

    /// Operator: back to a fresh closed breaker.
    pub async fn reset(&self, job_type: &str) -> Result<BreakerState, StorageError> {
        self.forced(job_type, BreakerState::reset).await
    }

    /// The state as it is at `now_ms`, read consistently, for the CLI.
    pub async fn status(&self, job_type: &str, now_ms: u64) -> Result<BreakerState, StorageError> {
        Ok(self.read(job_type).await?.at(now_ms))
    }

    async fn forced(
        &self,
        job_type: &str,
        f: impl Fn(&BreakerState) -> BreakerState,
    ) -> Result<BreakerState, StorageError> {
        let written = self.transition(job_type, None, |s| Some(f(s))).await?;
        Ok(written.expect("forced transitions always write"))
    }

    /// Reads the state, applies `f`, writes the result on condition that the item is still
    /// the one read; on a lost condition re-reads and re-applies. `None` when `f` says
    /// nothing changes.
    async fn transition(
        &self,
        job_type: &str,
        deadline: Option<Instant>,
        f: impl FnMut(&BreakerState) -> Option<BreakerState>,
    ) -> Result<Option<BreakerState>, StorageError> {
        let cur = self.read_by(job_type, deadline).await?;
        self.transition_from(job_type, cur, deadline, f).await
    }

    /// [`transition`](Self::transition) from a state just read.
    async fn transition_from(
        &self,
        job_type: &str,
        mut cur: BreakerState,
        deadline: Option<Instant>,
        mut f: impl FnMut(&BreakerState) -> Option<BreakerState>,
    ) -> Result<Option<BreakerState>, StorageError> {
        let limit = MAX_CONFLICTS + self.config.probes();
        for _ in 0..limit {
            let Some(next) = f(&cur) else {
                return Ok(None);
            };
            // Identifies this write, so a retried write whose first try landed is recognised
            // (comparing states would not do: two racers can compute the same state).
            let token = format!("{:016x}", rand::rng().random::<u64>());
            match self.write(job_type, &cur, &next, &token, deadline).await {
                Ok(()) => {
                    self.remember(job_type, &next);
                    return Ok(Some(next));
                }
                Err(e) if e.is_conditional_check_failed() => {
                    let (fresh, writer) = self.read_raw(job_type, deadline).await?;
                    // A retried write that had landed before its answer was lost.
                    if writer.as_deref() == Some(token.as_str()) {
                        return Ok(Some(next));
                    }
                    cur = fresh;
                }
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::new(
            "PutItem",
            Some("ConditionalCheckFailedException"),
            format!("breaker `{job_type}` kept changing: gave up after {limit} conflicting writes"),
            FailureKind::Permanent,
        )
        .with_resource(&self.table))
    }

    async fn write(
        &self,
        job_type: &str,
        expected: &BreakerState,
        next: &BreakerState,
        token: &str,
        deadline: Option<Instant>,
    ) -> Result<(), StorageError> {
        let now_s = self.clock.now_ms() / 1000;
        let mut item = to_item(job_type, next, now_s);
        item.insert("writer".to_owned(), AttributeValue::S(token.to_owned()));
        self.retry
            .call("PutItem", deadline, || {
                let req = self
                    .client
                    .put_item()
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .table_name(&self.table)
                    .set_item(Some(item.clone()));
                if expected.version == 0 {
                    req.condition_expression("attribute_not_exists(pk)")
                } else {
                    req.condition_expression("version = :v AND phase = :p")
                        .expression_attribute_values(":v", num(expected.version))
                        .expression_attribute_values(
                            ":p",
                            AttributeValue::S(expected.phase.as_str().to_owned()),
                        )
                }
                .send()
            })
            .await
            .map_err(|e| e.with_resource(&self.table))?;
        Ok(())
    }
}

/// A breaker report made into a statement of another batched write
/// ([`BreakerStore::fold`]).
#[derive(Debug, Clone)]
pub struct FoldedReport {
    /// The statement to send.
    pub statement: BatchStatementRequest,
    /// This write's token.
    token: String,
    /// The state as this environment will know it once the statement is written.
    counted: BreakerState,
}

fn num(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn to_item(job_type: &str, s: &BreakerState, now_s: u64) -> HashMap<String, AttributeValue> {
    let leases = s
        .leases
        .iter()
        .map(|(id, exp)| (id.clone(), num(*exp)))
        .collect::<HashMap<_, _>>();
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(breaker_pk(job_type))),
        (SK.to_owned(), AttributeValue::S(BREAKER_SK.to_owned())),
        ("job_type".to_owned(), AttributeValue::S(job_type.to_owned())),
        ("phase".to_owned(), AttributeValue::S(s.phase.as_str().to_owned())),
        ("generation".to_owned(), num(s.generation)),
        ("version".to_owned(), num(s.version)),
        ("open_until".to_owned(), num(s.open_until_ms)),
        ("forced".to_owned(), AttributeValue::Bool(s.forced)),
        ("window_start".to_owned(), num(s.window_start_ms)),
        ("failures".to_owned(), num(u64::from(s.failures))),
        ("executions".to_owned(), num(u64::from(s.executions))),
        ("probe_successes".to_owned(), num(u64::from(s.probe_successes))),
        ("leases".to_owned(), AttributeValue::M(leases)),
        ("updated_at".to_owned(), num(now_s * 1000)),
        (TTL_ATTRIBUTE.to_owned(), num(now_s + BREAKER_TTL.as_secs())),
    ])
}

fn from_item(item: &HashMap<String, AttributeValue>) -> BreakerState {
    let n = |k: &str| {
        item.get(k)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let leases = match item.get("leases") {
        Some(AttributeValue::M(m)) => m
            .iter()
            .filter_map(|(id, v)| Some((id.clone(), v.as_n().ok()?.parse().ok()?)))
            .collect(),
        _ => BTreeMap::new(),
    };
    BreakerState {
        phase: item
            .get("phase")
            .and_then(|v| v.as_s().ok())
            .and_then(|s| Phase::parse(s))
            .unwrap_or_default(),
        generation: n("generation"),
        version: n("version"),
        open_until_ms: n("open_until"),
        forced: matches!(item.get("forced"), Some(AttributeValue::Bool(true))),
        window_start_ms: n("window_start"),
        failures: n("failures") as u32,
        executions: n("executions") as u32,
        probe_successes: n("probe_successes") as u32,
        leases,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_state_is_fresh_only_while_both_clocks_say_so() {
        let ttl = Duration::from_secs(5);
        let t0 = 1_800_000_000_000;
        assert!(fresh(Duration::from_secs(1), t0, t0 + 1_000, ttl));
        // The monotonic clock stood still (a frozen environment) while the wall clock went on.
        assert!(!fresh(Duration::ZERO, t0, t0 + 3_600_000, ttl));
        // The other way round.
        assert!(!fresh(Duration::from_secs(6), t0, t0, ttl));
        // A wall clock stepped back is not an age.
        assert!(fresh(Duration::from_secs(1), t0, t0 - 60_000, ttl));
        assert!(!fresh(Duration::ZERO, t0, t0, Duration::ZERO));
    }

    /// A store whose reads cannot reach any table (nothing listens on its endpoint).
    fn unreachable_store() -> BreakerStore {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "a", "b", None, None, "test",
            ))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        BreakerStore::new(Client::from_conf(conf), "t", StorageRetry::default())
    }

    const T0: u64 = 1_800_000_000_000;

    fn open() -> BreakerState {
        BreakerState {
            phase: Phase::Open,
            ..BreakerState::default()
        }
    }

    /// A read that must be made ends in an error (nothing to reach) by this deadline.
    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(300))
    }

    #[tokio::test(start_paused = true)]
    async fn a_state_cached_before_a_freeze_is_read_again() {
        let clock = Clock::manual(T0);
        let store = unreachable_store().with_clock(clock.clone());
        store.remember("jt", &open());
        assert_eq!(
            store.state("jt", soon()).await.unwrap(),
            open(),
            "fresh: from the cache"
        );
        // Frozen for an hour: the wall clock went on, the monotonic one stood still.
        clock.set_ms(T0 + 3_600_000);
        assert!(
            store.state("jt", soon()).await.is_err(),
            "read again, not trusted"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cached_state_is_read_again_once_its_cache_ttl_has_passed() {
        let clock = Clock::manual(T0);
        let store = unreachable_store().with_clock(clock);
        let ttl = store.config().cache_ttl();
        store.remember("jt", &open());
        tokio::time::advance(ttl - Duration::from_millis(1)).await;
        assert_eq!(
            store.state("jt", soon()).await.unwrap(),
            open(),
            "within its ttl: from the cache"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            store.state("jt", soon()).await.is_err(),
            "read again at its ttl"
        );
    }

    fn batch(failures: u32, executions: u32) -> Aggregate {
        Aggregate {
            transient_failures: failures,
            executions,
            ..Aggregate::default()
        }
    }

    #[test]
    fn executions_kept_from_before_a_window_do_not_count_in_it() {
        let store = unreachable_store();
        let config = BreakerConfig::default();
        let t0 = 1_800_000_000_000;
        // Healthy for 50 s: a hundred executions kept back, no window counting.
        for i in 0..10 {
            assert_eq!(
                store
                    .with_unreported("jt", &batch(0, 10), t0 + i * 5_000)
                    .executions,
                0
            );
        }
        // The dependency goes down: every execution fails, one a second. The successes before
        // the first failure ran before its window began: the tenth failure opens it.
        let mut s = BreakerState::default();
        let mut n = 0u64;
        while s.phase == Phase::Closed && n < 100 {
            n += 1;
            let now = t0 + 50_000 + n * 1_000;
            let r = store.with_unreported("jt", &batch(1, 1), now);
            if let Some(next) = s.report(&r, now, &config) {
                s = next;
            }
            store.remember("jt", &s);
        }
        assert_eq!((n, s.phase), (10, Phase::Open), "{s:?}");
        // A window another environment started after this one's executions: they are not
        // of it either.
        let store = unreachable_store();
        for i in 0..10 {
            store.with_unreported("jt", &batch(0, 10), t0 + i * 5_000);
        }
        let theirs = BreakerState::default()
            .report(&batch(1, 1), t0 + 50_000, &config)
            .unwrap();
        store.remember("jt", &theirs);
        let r = store.with_unreported("jt", &batch(1, 1), t0 + 51_000);
        assert_eq!((r.transient_failures, r.executions), (1, 1));
    }

    #[test]
    fn unreported_executions_ride_with_failures_and_go_once_per_counting_window() {
        let store = unreachable_store();
        let t0 = 1_800_000_000_000;
        let executions = |agg: &Aggregate, at: u64| store.with_unreported("jt", agg, at).executions;
        // Healthy, no window: kept back.
        assert_eq!(executions(&batch(0, 8), t0), 0);
        assert_eq!(executions(&batch(0, 8), t0 + 1_000), 0);
        // A failure starts a window: the executions kept from before it do not count in it.
        let r = store.with_unreported("jt", &batch(1, 4), t0 + 2_000);
        assert_eq!((r.transient_failures, r.executions), (1, 4));
        // Another environment's window, seen: the healthy executions go once.
        let counting = BreakerState {
            failures: 3,
            executions: 30,
            window_start_ms: t0 + 10_000,
            version: 2,
            ..BreakerState::default()
        };
        store.remember("jt", &counting);
        assert_eq!(executions(&batch(0, 5), t0 + 11_000), 5);
        assert_eq!(executions(&batch(0, 5), t0 + 12_000), 0);
        // Kept back after the window began, they ride with the next failure in it.
        assert_eq!(executions(&batch(1, 1), t0 + 43_000), 6);
        // Executions older than a window are dropped.
        assert_eq!(executions(&batch(0, 7), t0 + 44_000), 0);
        assert_eq!(executions(&batch(1, 1), t0 + 200_000), 1, "a window later");
        // A new generation drops the old one's.
        assert_eq!(executions(&batch(0, 7), t0 + 201_000), 0);
        let next = Aggregate {
            generation: 4,
            ..batch(1, 1)
        };
        assert_eq!(executions(&next, t0 + 202_000), 1);
        // Probes only: nothing of the tally moves.
        let probe = Aggregate {
            probe_successes: 1,
            leases: vec!["l".into()],
            generation: 5,
            ..Aggregate::default()
        };
        assert_eq!(store.with_unreported("jt", &probe, t0 + 203_000), probe);
    }

    #[test]
    fn a_report_into_a_window_another_environment_started_is_its_one_report_there() {
        let store = unreachable_store();
        let t0 = 1_800_000_000_000;
        // This environment's failure reports as if it started a window at t0 + 1 s...
        let agg = store.with_unreported("jt", &batch(1, 5), t0 + 1_000);
        assert_eq!(agg.executions, 5);
        // ...but another environment's began first, at t0: the write went into that one.
        let theirs = BreakerState {
            failures: 5,
            executions: 17,
            window_start_ms: t0,
            version: 3,
            ..BreakerState::default()
        };
        store.remember("jt", &theirs);
        store.reported_into("jt", &agg, &Ok(Some(theirs.clone())));
        // Its healthy executions wait for its next failure: no second write in this window.
        let healthy = store.with_unreported("jt", &batch(0, 5), t0 + 2_000);
        assert_eq!(healthy.executions, 0);
        assert_eq!(
            store.with_unreported("jt", &batch(1, 1), t0 + 3_000).executions,
            6
        );
    }

    #[test]
    fn items_round_trip() {
        let mut s = BreakerState {
            phase: Phase::HalfOpen,
            generation: 4,
            version: 9,
            open_until_ms: 123,
            forced: true,
            window_start_ms: 5,
            failures: 2,
            executions: 7,
            probe_successes: 1,
            leases: BTreeMap::new(),
        };
        s.leases.insert("abc".into(), 77);
        assert_eq!(from_item(&to_item("email", &s, 1)), s);
        assert_eq!(from_item(&HashMap::new()), BreakerState::default());
    }
}
