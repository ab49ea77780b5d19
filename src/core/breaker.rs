//! The circuit breaker's state machine: pure transitions over the stored [`BreakerState`].
//!
//! One breaker per job type, shared by every environment. Closed, it counts executions and
//! transient failures in a window and opens on a failure rate (a bare count trips on noise at
//! volume); open, it defers jobs; half-open, a few leased probes decide. Fatal outcomes count
//! nowhere: a payload bug is not an outage. The rule: a transition returns `None` when nothing
//! changes, so a healthy job type writes nothing; every write carries `generation` and
//! `version`, so a stale outcome or a lost race changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

use super::decision::Gate;

/// A breaker configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BreakerConfigError {
    /// `failure_rate` outside 1..=100 (percent).
    #[error("breaker failure rate must be 1 to 100 percent (got {0})")]
    FailureRate(u32),
    /// `min_executions` outside 1..=100 000.
    #[error("breaker minimum executions must be 1 to 100000 (got {0})")]
    MinExecutions(u32),
    /// A window outside 1 s..=1 day.
    #[error("breaker window must be 1 s to 1 day (got {0:?})")]
    Window(Duration),
    /// An open period outside 1 s..=12 h (SQS cannot defer a message longer).
    #[error("breaker open period must be 1 s to 12 h (got {0:?})")]
    OpenFor(Duration),
    /// `probes` outside 1..=100.
    #[error("breaker probes must be 1 to 100 (got {0})")]
    Probes(u32),
    /// A probe lease outside 1 s..=12 h.
    #[error("breaker probe lease must be 1 s to 12 h (got {0:?})")]
    Lease(Duration),
    /// `successes_to_close` outside 1..=100.
    #[error("breaker successes to close must be 1 to 100 (got {0})")]
    SuccessesToClose(u32),
    /// A state cache TTL over 5 minutes.
    #[error("breaker cache TTL must be at most 5 min (got {0:?})")]
    CacheTtl(Duration),
}

/// How a job type's breaker behaves. Build it with [`BreakerConfig::builder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    failure_rate: u32,
    min_executions: u32,
    window: Duration,
    open_for: Duration,
    probes: u32,
    lease: Duration,
    successes_to_close: u32,
    cache_ttl: Duration,
}

impl Default for BreakerConfig {
    /// Half of at least 10 executions within 60 s failing transiently open it for 30 s; then 1
    /// probe at a time (lease 60 s), 1 success closes it; state reads are cached for 5 s.
    ///
    /// Ten: a batch of ten records that all fail opens it with its one report, as five
    /// failures did; a window's first ten executions at a 20% failure share reach 50% about
    /// once in 30, and later ones far less often, as the window fills.
    fn default() -> Self {
        Self {
            failure_rate: 50,
            min_executions: 10,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(30),
            probes: 1,
            lease: Duration::from_secs(60),
            successes_to_close: 1,
            cache_ttl: Duration::from_secs(5),
        }
    }
}

impl BreakerConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> BreakerConfigBuilder {
        BreakerConfigBuilder {
            config: Self::default(),
        }
    }

    /// The share of the window's executions (percent) whose transient failures open it.
    pub fn failure_rate(&self) -> u32 {
        self.failure_rate
    }
    /// The executions the window must hold before its failure rate can open it.
    pub fn min_executions(&self) -> u32 {
        self.min_executions
    }
    /// Whether a window of `executions` executions, `failures` of them transient failures,
    /// opens the breaker. An execution count below the failures (an item written before
    /// executions were counted) is read as the failures.
    pub fn trips(&self, failures: u32, executions: u32) -> bool {
        let executions = executions.max(failures);
        failures > 0
            && executions >= self.min_executions
            && u64::from(failures) * 100 >= u64::from(self.failure_rate) * u64::from(executions)
    }
    /// The failure-counting window.
    pub fn window(&self) -> Duration {
        self.window
    }
    /// How long the breaker stays open.
    pub fn open_for(&self) -> Duration {
        self.open_for
    }
    /// Probe executions admitted at a time while half-open, across all environments.
    pub fn probes(&self) -> u32 {
        self.probes
    }
    /// How long a probe permit is held before its slot is freed for another.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// Probe successes that close the breaker.
    pub fn successes_to_close(&self) -> u32 {
        self.successes_to_close
    }
    /// How long an environment may use a state it read.
    pub fn cache_ttl(&self) -> Duration {
        self.cache_ttl
    }
}

/// Builds a [`BreakerConfig`]; [`build`](Self::build) validates.
#[derive(Debug, Clone)]
pub struct BreakerConfigBuilder {
    config: BreakerConfig,
}

impl BreakerConfigBuilder {
    /// The share of the window's executions, in percent (1..=100), whose transient failures
    /// open the breaker.
    pub fn failure_rate(mut self, percent: u32) -> Self {
        self.config.failure_rate = percent;
        self
    }
    /// Executions the window must hold before its rate can open the breaker (1..=100 000).
    pub fn min_executions(mut self, n: u32) -> Self {
        self.config.min_executions = n;
        self
    }
    /// The failure-counting window (1 s..=1 day).
    pub fn window(mut self, d: Duration) -> Self {
        self.config.window = d;
        self
    }
    /// How long the breaker stays open (1 s..=12 h).
    pub fn open_for(mut self, d: Duration) -> Self {
        self.config.open_for = d;
        self
    }
    /// Probes at a time while half-open (1..=100).
    pub fn probes(mut self, n: u32) -> Self {
        self.config.probes = n;
        self
    }
    /// Probe lease length (1 s..=12 h); make it longer than a handler can run.
    pub fn lease(mut self, d: Duration) -> Self {
        self.config.lease = d;
        self
    }
    /// Probe successes that close the breaker (1..=100).
    pub fn successes_to_close(mut self, n: u32) -> Self {
        self.config.successes_to_close = n;
        self
    }
    /// State cache TTL per environment (0..=5 min; 0 disables the cache).
    pub fn cache_ttl(mut self, d: Duration) -> Self {
        self.config.cache_ttl = d;
        self
    }

    /// Validates and returns the configuration.
    pub fn build(self) -> Result<BreakerConfig, BreakerConfigError> {
        let c = self.config;
        let secs =
            |d: Duration, lo: u64, hi: u64| d >= Duration::from_secs(lo) && d <= Duration::from_secs(hi);
        if !(1..=100).contains(&c.failure_rate) {
            return Err(BreakerConfigError::FailureRate(c.failure_rate));
        }
        if !(1..=100_000).contains(&c.min_executions) {
            return Err(BreakerConfigError::MinExecutions(c.min_executions));
        }
        if !secs(c.window, 1, 86_400) {
            return Err(BreakerConfigError::Window(c.window));
        }
        if !secs(c.open_for, 1, 12 * 3600) {
            return Err(BreakerConfigError::OpenFor(c.open_for));
        }
        if !(1..=100).contains(&c.probes) {
            return Err(BreakerConfigError::Probes(c.probes));
        }
        if !secs(c.lease, 1, 12 * 3600) {
            return Err(BreakerConfigError::Lease(c.lease));
        }
        if !(1..=100).contains(&c.successes_to_close) {
            return Err(BreakerConfigError::SuccessesToClose(c.successes_to_close));
        }
        if c.cache_ttl > Duration::from_secs(300) {
            return Err(BreakerConfigError::CacheTtl(c.cache_ttl));
        }
        Ok(c)
    }
}

/// The breaker's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Jobs run; executions and transient failures are counted.
    #[default]
    Closed,
    /// Jobs are deferred until `open_until_ms`.
    Open,
    /// A few probe executions decide whether to close or reopen.
    HalfOpen,
}

impl Phase {
    /// The stored name: `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "closed" => Some(Phase::Closed),
            "open" => Some(Phase::Open),
            "half_open" => Some(Phase::HalfOpen),
            _ => None,
        }
    }
}

/// The shared state of one job type's breaker, as stored. A missing item is
/// [`BreakerState::default`]: closed, generation 0, version 0.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BreakerState {
    /// Current phase (as stored; an open phase past its end is half-open, see [`Self::at`]).
    pub phase: Phase,
    /// Starts at 0; +1 on every phase change.
    pub generation: u64,
    /// Starts at 0 (no item); +1 on every write.
    pub version: u64,
    /// End of the open period (epoch ms); meaningful when open.
    pub open_until_ms: u64,
    /// True when an operator opened it; it then stays open until an operator closes it.
    pub forced: bool,
    /// Start of the failure window (epoch ms); meaningful when closed with failures.
    pub window_start_ms: u64,
    /// Transient failures counted in the current window.
    pub failures: u32,
    /// Executions counted in the current window, its failures included.
    pub executions: u32,
    /// Probe successes in this half-open period.
    pub probe_successes: u32,
    /// Probe leases held in this half-open period: lease id → expiry (epoch ms).
    pub leases: BTreeMap<String, u64>,
}

/// A probe permit: the right to run one execution while half-open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lease id (unique per acquisition).
    pub id: String,
    /// The half-open generation it belongs to.
    pub generation: u64,
    /// When its slot is freed if it is neither released nor reported (epoch ms).
    pub expires_at_ms: u64,
}

/// The outcomes of one invocation for one job type, reported in one write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Aggregate {
    /// Transient failures of ordinary (non-probe) executions. Fatal and invalid never count.
    pub transient_failures: u32,
    /// Ordinary executions that count (successes and transient failures, so at least
    /// `transient_failures`; fatal outcomes are left out).
    pub executions: u32,
    /// Probe executions that succeeded.
    pub probe_successes: u32,
    /// Probe executions that failed transiently.
    pub probe_failures: u32,
    /// Ids of the leases whose probes are reported here (their slots are freed).
    pub leases: Vec<String>,
    /// The generation the executions were admitted in.
    pub generation: u64,
}

impl Aggregate {
    /// True when there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.transient_failures == 0
            && self.executions == 0
            && self.probe_successes == 0
            && self.probe_failures == 0
            && self.leases.is_empty()
    }
}

/// A report that only adds executions and transient failures to a window that is already
/// counting, and (as far as the reporter knows) does not open the breaker: it can be written as
/// an increment conditioned on that window, without reading the item first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Increment {
    /// Failures to add.
    pub failures: u32,
    /// Executions to add (the failures included).
    pub executions: u32,
    /// The closed generation the failures belong to.
    pub generation: u64,
    /// The window they are counted in.
    pub window_start_ms: u64,
    /// When the stored counts satisfy this, the increment cannot open the breaker.
    pub safe: Safe,
}

/// Stored counts on which an [`Increment`] cannot open the breaker: executions at least
/// `executions_from` with failures at most `failures_upto` (the rate stays below the
/// threshold: within a window counts only grow), or executions below `executions_below` (the
/// window stays under the minimum). A write conditioned on this needs no read first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Safe {
    /// The executions the reporter last saw stored.
    pub executions_from: u32,
    /// The most stored failures the increment may meet with that many executions; `None`
    /// when none keeps the rate below the threshold.
    pub failures_upto: Option<u32>,
    /// Stored executions under this keep the window below the minimum (0: never).
    pub executions_below: u32,
}

impl Safe {
    /// Whether stored counts `(failures, executions)` satisfy it.
    pub fn holds(&self, failures: u32, executions: u32) -> bool {
        let rate_ok = self
            .failures_upto
            .is_some_and(|f| executions >= self.executions_from && failures <= f);
        rate_ok || executions < self.executions_below
    }
}

/// The answer to a probe request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// Not half-open: no permit needed (closed) or none possible (open).
    NotHalfOpen,
    /// Every slot is held by an unexpired lease; the first of them ends at `until_ms`.
    Busy {
        /// When the earliest held lease ends (epoch ms).
        until_ms: u64,
    },
    /// This lease id already holds a slot (a retried request whose first try landed):
    /// nothing to write.
    Held(Lease),
    /// A slot was free: write `state`, then the holder owns `lease`.
    Granted {
        /// The state to write.
        state: BreakerState,
        /// The permit.
        lease: Lease,
    },
}

const fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl BreakerState {
    /// The state as it is at `now_ms`: an open period that has ended becomes half-open (a new
    /// generation with no leases). Returns a copy; `version` is unchanged (nothing written yet).
    pub fn at(&self, now_ms: u64) -> BreakerState {
        let mut s = self.clone();
        if s.phase == Phase::Open && !s.forced && now_ms >= s.open_until_ms {
            s.phase = Phase::HalfOpen;
            s.generation += 1;
            s.probe_successes = 0;
            s.leases.clear();
        }
        s
    }

    /// The phase at `now_ms`.
    pub fn phase_at(&self, now_ms: u64) -> Phase {
        self.at(now_ms).phase
    }

    fn bumped(mut self) -> BreakerState {
        self.version += 1;
        self
    }

    fn opened(mut self, now_ms: u64, config: &BreakerConfig) -> BreakerState {
        self.phase = Phase::Open;
        self.generation += 1;
        self.open_until_ms = now_ms.saturating_add(ms(config.open_for));
        self.forced = false;
        self.failures = 0;
        self.executions = 0;
        self.window_start_ms = 0;
        self.probe_successes = 0;
        self.leases.clear();
        self
    }

    fn closed(mut self) -> BreakerState {
        self.phase = Phase::Closed;
        self.generation += 1;
        self.open_until_ms = 0;
        self.forced = false;
        self.failures = 0;
        self.executions = 0;
        self.window_start_ms = 0;
        self.probe_successes = 0;
        self.leases.clear();
        self
    }

    /// Whether the window is counting at `now_ms`: closed, a failure in it, not yet over.
    fn counting(&self, now_ms: u64, config: &BreakerConfig) -> bool {
        self.phase == Phase::Closed
            && self.failures > 0
            && now_ms.saturating_sub(self.window_start_ms) < ms(config.window)
    }

    /// Counts `executions` executions, `failures` of them transient failures, seen at `now_ms`
    /// in generation `generation`. A failure starts a window when none is counting; successes
    /// alone never do (they are dropped: a healthy type writes nothing). Opens the breaker
    /// when the window's counts reach the failure rate over the minimum executions. `None`:
    /// nothing to write (nothing to count, a stale generation, or not closed).
    pub(crate) fn record(
        &self,
        failures: u32,
        executions: u32,
        generation: u64,
        now_ms: u64,
        config: &BreakerConfig,
    ) -> Option<BreakerState> {
        let s = self.at(now_ms);
        let executions = executions.max(failures);
        if executions == 0 || generation != s.generation || s.phase != Phase::Closed {
            return None;
        }
        let mut next = s;
        if !next.counting(now_ms, config) {
            if failures == 0 {
                return None;
            }
            next.window_start_ms = now_ms;
            next.failures = 0;
            next.executions = 0;
        }
        next.executions = next.executions.max(next.failures).saturating_add(executions);
        next.failures = next.failures.saturating_add(failures);
        if config.trips(next.failures, next.executions) {
            next = next.opened(now_ms, config);
        }
        Some(next.bumped())
    }

    /// Whether reporting `agg` at `now_ms` on this state (typically an environment's cached
    /// copy) is a plain [`Increment`]. The store's write re-checks every premise in its
    /// condition, so a stale state only costs a refused increment.
    pub fn increment(&self, agg: &Aggregate, now_ms: u64, config: &BreakerConfig) -> Option<Increment> {
        let s = self.at(now_ms);
        let executions = agg.executions.max(agg.transient_failures);
        let plain =
            executions > 0 && agg.probe_successes == 0 && agg.probe_failures == 0 && agg.leases.is_empty();
        let counting = s.generation == agg.generation && s.counting(now_ms, config);
        if !(plain && counting) {
            return None;
        }
        let stored = s.executions.max(s.failures);
        if config.trips(
            s.failures.saturating_add(agg.transient_failures),
            stored.saturating_add(executions),
        ) {
            return None;
        }
        // The most failures that keep (f + n) / (e + m) below the rate, with e at least what
        // was seen: f + n < rate × (e + m) / 100.
        let room = u64::from(config.failure_rate) * u64::from(stored.saturating_add(executions));
        let failures_upto = room
            .div_ceil(100)
            .checked_sub(1 + u64::from(agg.transient_failures))
            .map(|f| f.min(u64::from(u32::MAX)) as u32);
        Some(Increment {
            failures: agg.transient_failures,
            executions,
            generation: s.generation,
            window_start_ms: s.window_start_ms,
            safe: Safe {
                executions_from: stored,
                failures_upto,
                executions_below: config.min_executions.saturating_sub(executions),
            },
        })
    }

    /// After an increment brought the window to the failure rate (other environments counted
    /// too): the opened state to write. `None` when there is nothing to open.
    pub(crate) fn trip(&self, now_ms: u64, config: &BreakerConfig) -> Option<BreakerState> {
        let s = self.at(now_ms);
        (s.counting(now_ms, config) && config.trips(s.failures, s.executions))
            .then(|| s.opened(now_ms, config).bumped())
    }

    /// Asks for a probe slot at `now_ms` for a new lease `lease_id`, held until
    /// `lease_until_ms` (the moment its execution can no longer be running: the invocation's
    /// deadline) or, when that is unknown, for the configured lease. Expired leases free their
    /// slots first. Asking again with an id that already holds a slot returns that lease.
    pub(crate) fn acquire(
        &self,
        lease_id: &str,
        now_ms: u64,
        lease_until_ms: Option<u64>,
        config: &BreakerConfig,
    ) -> Acquire {
        let mut s = self.at(now_ms);
        if s.phase != Phase::HalfOpen {
            return Acquire::NotHalfOpen;
        }
        s.leases.retain(|_, exp| *exp > now_ms);
        if let Some(&expires_at_ms) = s.leases.get(lease_id) {
            return Acquire::Held(Lease {
                id: lease_id.to_owned(),
                generation: s.generation,
                expires_at_ms,
            });
        }
        if s.leases.len() >= config.probes as usize {
            return Acquire::Busy {
                until_ms: s.leases.values().copied().min().unwrap_or(now_ms),
            };
        }
        let lease = Lease {
            id: lease_id.to_owned(),
            generation: s.generation,
            expires_at_ms: lease_until_ms
                .filter(|&u| u > now_ms)
                .unwrap_or_else(|| now_ms.saturating_add(ms(config.lease))),
        };
        s.leases.insert(lease.id.clone(), lease.expires_at_ms);
        Acquire::Granted {
            state: s.bumped(),
            lease,
        }
    }

    /// When the outcome of the probes now running can be known: the end of the earliest
    /// unexpired lease, but no later than one open period from `now_ms` (a probe that
    /// fails opens the breaker for that long anyway). `now_ms` when no lease is held.
    pub(crate) fn probes_known_at(&self, now_ms: u64, config: &BreakerConfig) -> u64 {
        let s = self.at(now_ms);
        let first = s.leases.values().copied().filter(|&e| e > now_ms).min();
        first.map_or(now_ms, |e| e.min(now_ms.saturating_add(ms(config.open_for))))
    }

    /// Gives back a permit whose user code never started. `None`: nothing to write (a stale
    /// generation, or the lease is already gone).
    pub fn release(&self, lease: &Lease, now_ms: u64) -> Option<BreakerState> {
        let mut s = self.at(now_ms);
        if s.generation != lease.generation || s.phase != Phase::HalfOpen {
            return None;
        }
        s.leases.remove(&lease.id)?;
        Some(s.bumped())
    }

    /// Applies one invocation's outcomes. A probe failure reopens the breaker; enough probe
    /// successes close it; executions and transient failures count while closed. Outcomes from another
    /// generation are ignored. `None`: nothing to write.
    pub fn report(&self, agg: &Aggregate, now_ms: u64, config: &BreakerConfig) -> Option<BreakerState> {
        let s = self.at(now_ms);
        if agg.generation != s.generation {
            return None;
        }
        match s.phase {
            Phase::Closed => self.record(
                agg.transient_failures,
                agg.executions,
                agg.generation,
                now_ms,
                config,
            ),
            Phase::Open => None,
            Phase::HalfOpen => {
                // A probe's failure reopens the breaker only while its lease is held: once
                // expired, its slot may be another probe's, whose outcome must not be cut off.
                if agg.probe_failures > 0 && agg.leases.iter().any(|id| s.leases.contains_key(id)) {
                    return Some(s.opened(now_ms, config).bumped());
                }
                let mut next = s;
                let before = (next.leases.len(), next.probe_successes);
                let held = agg
                    .leases
                    .iter()
                    .filter(|id| next.leases.remove(*id).is_some())
                    .count() as u32;
                // Only probes whose leases are still held count: a report applied a second
                // time (a retried write whose first try landed) finds them gone.
                next.probe_successes = next.probe_successes.saturating_add(agg.probe_successes.min(held));
                if next.probe_successes >= config.successes_to_close {
                    return Some(next.closed().bumped());
                }
                if (next.leases.len(), next.probe_successes) == before {
                    return None;
                }
                Some(next.bumped())
            }
        }
    }

    /// Operator: open now, until closed by an operator (`for_ = None`) or for a period.
    pub fn force_open(&self, for_: Option<Duration>, now_ms: u64, config: &BreakerConfig) -> BreakerState {
        let mut s = self.clone().opened(now_ms, config);
        match for_ {
            Some(d) => s.open_until_ms = now_ms.saturating_add(ms(d)),
            None => {
                s.forced = true;
                s.open_until_ms = u64::MAX;
            }
        }
        s.bumped()
    }

    /// Operator: close now (a new generation; in-flight probes become stale).
    pub fn force_close(&self) -> BreakerState {
        self.clone().closed().bumped()
    }

    /// Operator: back to a fresh closed breaker. Generation and version keep growing so
    /// conditions and stale reports still work.
    pub fn reset(&self) -> BreakerState {
        BreakerState {
            generation: self.generation + 1,
            version: self.version + 1,
            ..BreakerState::default()
        }
    }
}

/// What the breaker allows at `now_ms` for a record that holds no probe permit: closed, open,
/// or, half-open, [`Gate::ProbeBusy`] until the running probes' outcome can be known (a record
/// runs then only with a permit taken from storage, which makes its gate [`Gate::Probe`]).
pub fn gate(state: &BreakerState, now_ms: u64, config: &BreakerConfig) -> Gate {
    let s = state.at(now_ms);
    match s.phase {
        Phase::Closed => Gate::Closed,
        Phase::Open => Gate::Open {
            until_ms: s.open_until_ms,
        },
        Phase::HalfOpen => Gate::ProbeBusy {
            until_ms: s.probes_known_at(now_ms, config),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A controllable clock in epoch ms.
    struct Clock(u64);
    impl Clock {
        fn now(&self) -> u64 {
            self.0
        }
        fn advance(&mut self, d: Duration) {
            self.0 += ms(d);
        }
    }

    fn cfg() -> BreakerConfig {
        BreakerConfig::default()
    }

    fn fail(s: &BreakerState, n: u32, now: u64) -> BreakerState {
        s.record(n, n, s.generation, now, &cfg()).expect("a write")
    }

    fn open_state(clock: &Clock) -> BreakerState {
        fail(&BreakerState::default(), 10, clock.now())
    }

    fn failures(n: u32, generation: u64) -> Aggregate {
        Aggregate {
            transient_failures: n,
            executions: n,
            generation,
            ..Aggregate::default()
        }
    }

    #[test]
    fn an_increment_is_what_a_full_report_would_write_below_the_threshold() {
        let t0 = 1_000_000;
        let fresh = BreakerState::default();
        assert_eq!(
            fresh.increment(&failures(1, 0), t0, &cfg()),
            None,
            "the first failure starts a window: a full write"
        );
        let one = fail(&fresh, 1, t0);
        let inc = one
            .increment(&failures(2, 0), t0 + 5_000, &cfg())
            .expect("an increment");
        assert_eq!(
            inc,
            Increment {
                failures: 2,
                executions: 2,
                generation: 0,
                window_start_ms: t0,
                safe: Safe {
                    executions_from: 1,
                    failures_upto: None,
                    executions_below: 8
                }
            }
        );
        // What the increment adds is what the full transition writes.
        let full = one.report(&failures(2, 0), t0 + 5_000, &cfg()).unwrap();
        assert_eq!(full.failures, one.failures + inc.failures);
        assert_eq!((full.window_start_ms, full.phase), (t0, Phase::Closed));
        // Not an increment: reaching the threshold, a window that ended, another generation,
        // probe outcomes, an open breaker.
        assert_eq!(one.increment(&failures(9, 0), t0 + 1, &cfg()), None);
        assert_eq!(one.increment(&failures(1, 0), t0 + 60_000, &cfg()), None);
        assert_eq!(one.increment(&failures(1, 1), t0 + 1, &cfg()), None);
        let probe = Aggregate {
            probe_successes: 1,
            ..failures(1, 0)
        };
        assert_eq!(one.increment(&probe, t0 + 1, &cfg()), None);
        let open = fail(&one, 9, t0 + 1);
        assert_eq!(open.phase, Phase::Open);
        assert_eq!(
            open.increment(&failures(1, open.generation), t0 + 2, &cfg()),
            None
        );
    }

    #[test]
    fn trip_opens_only_a_closed_window_at_the_threshold() {
        let t0 = 1_000_000;
        let mut s = fail(&BreakerState::default(), 1, t0);
        assert_eq!(s.trip(t0 + 1, &cfg()), None, "below the threshold");
        (s.failures, s.executions) = (10, 10);
        let opened = s.trip(t0 + 1, &cfg()).expect("opens");
        assert_eq!(opened.phase, Phase::Open);
        assert_eq!(opened.generation, s.generation + 1);
        assert_eq!(opened.version, s.version + 1);
        assert_eq!(s.trip(t0 + 60_000, &cfg()), None, "the window is over");
        assert_eq!(opened.trip(t0 + 2, &cfg()), None, "already open");
    }

    fn lease_of(a: Acquire) -> (BreakerState, Lease) {
        match a {
            Acquire::Granted { state, lease } => (state, lease),
            other => panic!("expected a permit, got {other:?}"),
        }
    }

    #[test]
    fn config_validates() {
        assert!(BreakerConfig::builder().build().is_ok());
        assert_eq!(
            BreakerConfig::builder().failure_rate(0).build(),
            Err(BreakerConfigError::FailureRate(0))
        );
        assert_eq!(
            BreakerConfig::builder().failure_rate(101).build(),
            Err(BreakerConfigError::FailureRate(101))
        );
        assert_eq!(
            BreakerConfig::builder().min_executions(0).build(),
            Err(BreakerConfigError::MinExecutions(0))
        );
        assert!(matches!(
            BreakerConfig::builder()
                .open_for(Duration::from_secs(13 * 3600))
                .build(),
            Err(BreakerConfigError::OpenFor(_))
        ));
        assert_eq!(
            BreakerConfig::builder().probes(0).build(),
            Err(BreakerConfigError::Probes(0))
        );
        assert!(BreakerConfig::builder().cache_ttl(Duration::ZERO).build().is_ok());
        let msg = BreakerConfig::builder()
            .window(Duration::ZERO)
            .build()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("window"), "{msg}");
    }

    #[test]
    fn failures_below_the_minimum_stay_closed_and_window_rolls() {
        let mut clock = Clock(1_000_000);
        let s = fail(&BreakerState::default(), 4, clock.now());
        assert_eq!(s.phase, Phase::Closed);
        assert_eq!((s.failures, s.version, s.generation), (4, 1, 0));
        clock.advance(Duration::from_secs(61));
        let s = fail(&s, 1, clock.now());
        assert_eq!(s.phase, Phase::Closed, "the old window's failures are gone");
        assert_eq!(s.failures, 1);
        assert_eq!(s.window_start_ms, clock.now());
    }

    #[test]
    fn the_rate_within_window_opens_with_new_generation() {
        let mut clock = Clock(1_000_000);
        let s = fail(&BreakerState::default(), 6, clock.now());
        clock.advance(Duration::from_secs(30));
        let s = fail(&s, 4, clock.now());
        assert_eq!(s.phase, Phase::Open);
        assert_eq!(s.generation, 1);
        assert_eq!(s.open_until_ms, clock.now() + 30_000);
        assert_eq!(
            gate(&s, clock.now(), &cfg()),
            Gate::Open {
                until_ms: s.open_until_ms
            }
        );
    }

    #[test]
    fn nothing_to_write_without_failures_or_when_stale_or_open() {
        let clock = Clock(5_000);
        let s = BreakerState::default();
        assert_eq!(s.record(0, 0, 0, clock.now(), &cfg()), None);
        assert_eq!(s.record(3, 3, 7, clock.now(), &cfg()), None, "stale generation");
        let open = open_state(&clock);
        assert_eq!(open.record(3, 3, open.generation, clock.now(), &cfg()), None);
        let empty = Aggregate {
            generation: 0,
            ..Aggregate::default()
        };
        assert!(empty.is_empty());
        assert_eq!(
            s.report(&empty, clock.now(), &cfg()),
            None,
            "healthy path writes nothing"
        );
        assert_eq!(gate(&s, clock.now(), &cfg()), Gate::Closed);
    }

    #[test]
    fn open_becomes_half_open_after_the_period() {
        let mut clock = Clock(1_000_000);
        let s = open_state(&clock);
        clock.advance(Duration::from_millis(29_999));
        assert_eq!(s.phase_at(clock.now()), Phase::Open);
        clock.advance(Duration::from_millis(1));
        let h = s.at(clock.now());
        assert_eq!(h.phase, Phase::HalfOpen);
        assert_eq!(h.generation, s.generation + 1);
        assert_eq!(h.version, s.version, "time alone writes nothing");
        assert_eq!(
            gate(&s, clock.now(), &cfg()),
            Gate::ProbeBusy {
                until_ms: clock.now()
            },
            "no probe running: ask now"
        );
    }

    #[test]
    fn half_open_admits_n_probes_and_expired_leases_free_slots() {
        let mut clock = Clock(1_000_000);
        let config = BreakerConfig::builder().probes(2).build().unwrap();
        let mut s = open_state(&clock);
        assert_eq!(s.acquire("x", clock.now(), None, &config), Acquire::NotHalfOpen);
        clock.advance(Duration::from_secs(30));
        let (s1, a) = lease_of(s.acquire("a", clock.now(), None, &config));
        assert_eq!(a.expires_at_ms, clock.now() + 60_000);
        assert_eq!(a.generation, s1.generation);
        let (s2, _b) = lease_of(s1.acquire("b", clock.now(), None, &config));
        assert_eq!(
            s2.acquire("c", clock.now(), None, &config),
            Acquire::Busy {
                until_ms: a.expires_at_ms
            }
        );
        clock.advance(Duration::from_secs(60));
        let (s3, c) = lease_of(s2.acquire("c", clock.now(), None, &config));
        assert_eq!(s3.leases.len(), 1, "both expired leases were dropped");
        assert!(s3.leases.contains_key(&c.id));
        s = s3;
        assert_eq!(s.version, 4);
        assert_eq!(
            BreakerState::default().acquire("x", 0, None, &config),
            Acquire::NotHalfOpen
        );
    }

    #[test]
    fn release_frees_the_slot_and_ignores_stale_permits() {
        let mut clock = Clock(1_000_000);
        let s = open_state(&clock);
        clock.advance(Duration::from_secs(30));
        let (s1, a) = lease_of(s.acquire("a", clock.now(), None, &cfg()));
        assert_eq!(
            s1.acquire("b", clock.now(), None, &cfg()),
            Acquire::Busy {
                until_ms: a.expires_at_ms
            }
        );
        let s2 = s1.release(&a, clock.now()).expect("a write");
        assert!(s2.leases.is_empty());
        assert_eq!(s2.release(&a, clock.now()), None, "already released");
        let (_s3, _b) = lease_of(s2.acquire("b", clock.now(), None, &cfg()));
        let stale = Lease {
            generation: a.generation - 1,
            ..a
        };
        assert_eq!(s1.release(&stale, clock.now()), None);
    }

    #[test]
    fn probe_successes_close_at_m() {
        let mut clock = Clock(1_000_000);
        let config = BreakerConfig::builder().successes_to_close(2).build().unwrap();
        let s = fail(&BreakerState::default(), 10, clock.now());
        clock.advance(Duration::from_secs(30));
        let (s1, a) = lease_of(s.acquire("a", clock.now(), None, &config));
        let ok = |lease: &Lease| Aggregate {
            probe_successes: 1,
            leases: vec![lease.id.clone()],
            generation: lease.generation,
            ..Aggregate::default()
        };
        let s2 = s1.report(&ok(&a), clock.now(), &config).expect("a write");
        assert_eq!((s2.phase, s2.probe_successes), (Phase::HalfOpen, 1));
        assert!(s2.leases.is_empty(), "the reported lease frees its slot");
        let (s3, b) = lease_of(s2.acquire("b", clock.now(), None, &config));
        let s4 = s3.report(&ok(&b), clock.now(), &config).expect("a write");
        assert_eq!(s4.phase, Phase::Closed);
        assert_eq!(s4.generation, s3.generation + 1);
        assert_eq!(gate(&s4, clock.now(), &cfg()), Gate::Closed);
        assert_eq!(
            s4.report(&ok(&b), clock.now(), &config),
            None,
            "stale report ignored"
        );
    }

    #[test]
    fn one_probe_failure_reopens_with_new_generation() {
        let mut clock = Clock(1_000_000);
        let s = open_state(&clock);
        clock.advance(Duration::from_secs(31));
        let (s1, a) = lease_of(s.acquire("a", clock.now(), None, &cfg()));
        let agg = Aggregate {
            probe_failures: 1,
            leases: vec![a.id.clone()],
            generation: a.generation,
            ..Aggregate::default()
        };
        let s2 = s1.report(&agg, clock.now(), &cfg()).expect("a write");
        assert_eq!(s2.phase, Phase::Open);
        assert_eq!(s2.generation, s1.generation + 1);
        assert_eq!(s2.open_until_ms, clock.now() + 30_000);
        assert!(s2.leases.is_empty());
        assert_eq!(s2.report(&agg, clock.now(), &cfg()), None, "stale generation");
    }

    #[test]
    fn transient_failures_reported_while_open_or_half_open_do_not_count() {
        let mut clock = Clock(1_000_000);
        let s = open_state(&clock);
        let agg = Aggregate {
            transient_failures: 9,
            generation: s.generation,
            ..Aggregate::default()
        };
        assert_eq!(s.report(&agg, clock.now(), &cfg()), None);
        clock.advance(Duration::from_secs(30));
        let h = s.at(clock.now());
        let agg = Aggregate {
            transient_failures: 9,
            generation: h.generation,
            ..Aggregate::default()
        };
        assert_eq!(s.report(&agg, clock.now(), &cfg()), None);
    }

    #[test]
    fn forced_transitions() {
        let mut clock = Clock(1_000_000);
        let s = BreakerState::default();
        let o = s.force_open(None, clock.now(), &cfg());
        assert_eq!(
            (o.phase, o.forced, o.version, o.generation),
            (Phase::Open, true, 1, 1)
        );
        clock.advance(Duration::from_secs(3600));
        assert_eq!(
            o.phase_at(clock.now()),
            Phase::Open,
            "forced open holds until closed"
        );
        let timed = s.force_open(Some(Duration::from_secs(10)), clock.now(), &cfg());
        assert_eq!(timed.open_until_ms, clock.now() + 10_000);
        assert!(!timed.forced);
        let c = o.force_close();
        assert_eq!(
            (c.phase, c.forced, c.version, c.generation),
            (Phase::Closed, false, 2, 2)
        );
        let f = fail(&c, 3, clock.now());
        let r = f.reset();
        assert_eq!(
            (r.phase, r.failures, r.version, r.generation),
            (Phase::Closed, 0, 4, 3)
        );
    }

    #[test]
    fn phase_names_round_trip() {
        for p in [Phase::Closed, Phase::Open, Phase::HalfOpen] {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
        assert_eq!(Phase::parse("weird"), None);
    }

    #[test]
    fn a_lease_lasts_until_its_invocation_ends_and_a_repeated_ask_gets_the_same_lease() {
        let mut clock = Clock(1_000_000);
        let s = open_state(&clock);
        clock.advance(Duration::from_secs(30));
        let deadline = clock.now() + 900_000;
        let (s1, a) = lease_of(s.acquire("a", clock.now(), Some(deadline), &cfg()));
        assert_eq!(
            a.expires_at_ms, deadline,
            "held as long as the invocation can run"
        );
        clock.advance(Duration::from_secs(120));
        assert_eq!(
            s1.acquire("b", clock.now(), None, &cfg()),
            Acquire::Busy { until_ms: deadline },
            "a second probe is not admitted while the first can still be running"
        );
        assert_eq!(
            s1.acquire("a", clock.now(), Some(deadline), &cfg()),
            Acquire::Held(a.clone()),
            "a retried ask whose first try landed gets its own lease back"
        );
        // A past or missing deadline falls back to the configured lease.
        let (_, b) = lease_of(s.acquire("b", clock.now(), Some(1), &cfg()));
        assert_eq!(b.expires_at_ms, clock.now() + 60_000);
    }

    #[test]
    fn busy_records_wait_until_the_probe_can_be_known_but_no_longer_than_an_open_period() {
        let mut clock = Clock(1_000_000);
        let s = open_state(&clock);
        clock.advance(Duration::from_secs(30));
        let (s1, _) = lease_of(s.acquire("a", clock.now(), Some(clock.now() + 10_000), &cfg()));
        assert_eq!(
            gate(&s1, clock.now(), &cfg()),
            Gate::ProbeBusy {
                until_ms: clock.now() + 10_000
            }
        );
        let (s2, _) = lease_of(s.acquire("a", clock.now(), Some(clock.now() + 600_000), &cfg()));
        assert_eq!(
            gate(&s2, clock.now(), &cfg()),
            Gate::ProbeBusy {
                until_ms: clock.now() + 30_000
            },
            "capped at one open period"
        );
    }

    #[test]
    fn a_success_report_applied_twice_counts_once() {
        let mut clock = Clock(1_000_000);
        let config = BreakerConfig::builder().successes_to_close(2).build().unwrap();
        let s = open_state(&clock);
        clock.advance(Duration::from_secs(30));
        let (s1, a) = lease_of(s.acquire("a", clock.now(), None, &config));
        let ok = Aggregate {
            probe_successes: 1,
            leases: vec![a.id.clone()],
            generation: a.generation,
            ..Aggregate::default()
        };
        let s2 = s1.report(&ok, clock.now(), &config).expect("a write");
        assert_eq!((s2.phase, s2.probe_successes), (Phase::HalfOpen, 1));
        assert_eq!(s2.report(&ok, clock.now(), &config), None, "nothing new to count");
    }

    /// A report of one invocation: `executions` executions, `failures` of them transient.
    fn batch(failures: u32, executions: u32, generation: u64) -> Aggregate {
        Aggregate {
            transient_failures: failures,
            executions,
            generation,
            ..Aggregate::default()
        }
    }

    #[test]
    fn twenty_percent_transient_failures_at_a_fifty_percent_rate_never_open_it() {
        let mut clock = Clock(1_000_000);
        let mut s = BreakerState::default();
        // Ten minutes of invocations of ten records, two of them failing transiently, one
        // invocation a second.
        for i in 0..600u32 {
            if let Some(next) = s.report(&batch(2, 10, s.generation), clock.now(), &cfg()) {
                s = next;
            }
            assert_eq!(s.phase, Phase::Closed, "opened at invocation {i}: {s:?}");
            clock.advance(Duration::from_secs(1));
        }
        // One execution at a time, the failures two in a row out of every ten: a window that
        // starts with them is below the minimum until it holds ten executions, a fifth failed.
        let mut s = BreakerState::default();
        for i in 0..1_000u32 {
            let failed = u32::from(i % 10 < 2);
            if let Some(next) = s.report(&batch(failed, 1, s.generation), clock.now(), &cfg()) {
                s = next;
            }
            assert_eq!(s.phase, Phase::Closed, "opened at execution {i}: {s:?}");
            clock.advance(Duration::from_millis(300));
        }
        assert!(s.executions > s.failures, "successes were counted: {s:?}");
    }

    #[test]
    fn a_dependency_down_for_every_execution_opens_it_at_the_tenth_failure() {
        let clock = Clock(1_000_000);
        let mut s = BreakerState::default();
        for n in 1..=9 {
            s = s.report(&batch(1, 1, s.generation), clock.now(), &cfg()).unwrap();
            assert_eq!((s.phase, s.failures), (Phase::Closed, n));
        }
        s = s.report(&batch(1, 1, s.generation), clock.now(), &cfg()).unwrap();
        assert_eq!(s.phase, Phase::Open, "the tenth failure opens it");
        // One invocation of ten failing records opens it with its one report.
        let one = BreakerState::default()
            .report(&batch(10, 10, 0), clock.now(), &cfg())
            .unwrap();
        assert_eq!(one.phase, Phase::Open);
        // Successes in the window hold it closed while the rate is below half, not after.
        let s = BreakerState::default()
            .report(&batch(5, 11, 0), clock.now(), &cfg())
            .unwrap();
        assert_eq!(s.phase, Phase::Closed, "5 of 11 is under half");
        let s = s.report(&batch(1, 1, 0), clock.now(), &cfg()).unwrap();
        assert_eq!(s.phase, Phase::Open, "6 of 12 is half");
    }

    #[test]
    fn successes_alone_start_no_window_but_count_in_one() {
        let t0 = 1_000_000;
        let fresh = BreakerState::default();
        assert_eq!(
            fresh.report(&batch(0, 40, 0), t0, &cfg()),
            None,
            "no window: no write"
        );
        let one = fresh.report(&batch(1, 3, 0), t0, &cfg()).unwrap();
        assert_eq!((one.failures, one.executions, one.window_start_ms), (1, 3, t0));
        let more = one.report(&batch(0, 40, 0), t0 + 1, &cfg()).unwrap();
        assert_eq!((more.failures, more.executions), (1, 43));
        assert_eq!(
            more.report(&batch(0, 40, 0), t0 + 60_000, &cfg()),
            None,
            "the window is over: successes start none"
        );
        // An item written before executions were counted reads its failures as executions.
        let legacy = BreakerState {
            failures: 4,
            executions: 0,
            ..one.clone()
        };
        let s = legacy.report(&batch(0, 2, 0), t0 + 1, &cfg()).unwrap();
        assert_eq!((s.failures, s.executions), (4, 6));
    }

    #[test]
    fn a_safe_increment_never_opens_the_stored_window() {
        let config = BreakerConfig::builder()
            .failure_rate(40)
            .min_executions(6)
            .build()
            .unwrap();
        let t0 = 1_000_000;
        for seen_f in 1..8u32 {
            for seen_e in seen_f..14 {
                let seen = BreakerState {
                    failures: seen_f,
                    executions: seen_e,
                    window_start_ms: t0,
                    version: 1,
                    ..BreakerState::default()
                };
                for n in 0..5u32 {
                    for m in n.max(1)..9 {
                        let Some(inc) = seen.increment(&batch(n, m, 0), t0 + 1, &config) else {
                            assert!(
                                config.trips(seen_f + n, seen_e + m),
                                "{seen_f}/{seen_e} + {n}/{m}"
                            );
                            continue;
                        };
                        assert!(inc.safe.holds(seen_f, seen_e), "the counts seen satisfy it");
                        for f in 1..16u32 {
                            for e in f..24 {
                                if inc.safe.holds(f, e) {
                                    assert!(
                                        !config.trips(f + n, e + m),
                                        "{f}/{e} + {n}/{m} opens though safe {:?}",
                                        inc.safe
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
