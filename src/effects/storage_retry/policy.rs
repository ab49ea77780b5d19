//! The storage retry policy: capped exponential backoff with jitter, a retry budget shared
//! by every call of an environment, and the deadline.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use rand::Rng;
use tokio::time::Instant;

use super::error::{FailureKind, Stop, StorageError, classify};

/// A token bucket of retries shared by every call of an environment, like tower's retry
/// budget: each success deposits `deposit` milli-retries, each retry withdraws 1000, and the
/// bucket holds at most `capacity` retries. It starts full.
#[derive(Debug)]
pub struct RetryBudget {
    milli: AtomicU64,
    capacity_milli: u64,
    deposit_milli: u64,
}

impl RetryBudget {
    /// A full bucket of `capacity` retries; every success earns `deposit_milli` / 1000 retry.
    pub fn new(capacity: u32, deposit_milli: u64) -> Self {
        let capacity_milli = u64::from(capacity) * 1000;
        Self {
            milli: AtomicU64::new(capacity_milli),
            capacity_milli,
            deposit_milli,
        }
    }

    /// Records a success.
    pub(crate) fn deposit(&self) {
        let _ = self
            .milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m + self.deposit_milli).min(self.capacity_milli))
            });
    }

    /// Takes one retry; false when the bucket is empty.
    pub fn withdraw(&self) -> bool {
        self.milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_sub(1000))
            .is_ok()
    }

    /// Whole retries left.
    #[cfg(test)]
    pub(crate) fn available(&self) -> u64 {
        self.milli.load(Ordering::Relaxed) / 1000
    }
}

/// A retry configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRetryConfig {
    /// `max_attempts` outside 1..=20.
    #[error("storage max attempts must be 1 to 20 (got {0})")]
    MaxAttempts(u32),
    /// A zero base, or a base above the cap.
    #[error("storage backoff base must be above 0 and at most the max backoff ({base:?} > {max:?})")]
    Backoff {
        /// The base delay.
        base: Duration,
        /// The cap.
        max: Duration,
    },
}

/// Settings of the storage retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageRetryConfig {
    /// Calls in all per operation, the first included (default 8).
    pub max_attempts: u32,
    /// First backoff of a transient failure (default 25 ms); doubles each retry.
    pub base: Duration,
    /// First backoff of a throttling failure (default 100 ms); doubles each retry.
    pub throttle_base: Duration,
    /// Cap of any backoff (default 2 s).
    pub max_backoff: Duration,
    /// Retries the budget holds (default 100).
    pub budget_capacity: u32,
    /// Milli-retries each success earns back (default 200: one retry per 5 successes).
    pub budget_deposit_milli: u64,
}

impl Default for StorageRetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base: Duration::from_millis(25),
            throttle_base: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            budget_capacity: 100,
            budget_deposit_milli: 200,
        }
    }
}

/// Counters of the policy, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryStats {
    /// Retries made (calls after the first).
    pub retries: u64,
    /// Retries refused because the budget was empty.
    pub budget_refusals: u64,
    /// Throttling answers seen.
    pub throttled: u64,
    /// Operations that failed after the policy gave up or did not retry.
    pub failures: u64,
}

#[derive(Debug)]
struct Inner {
    config: StorageRetryConfig,
    budget: RetryBudget,
    retries: AtomicU64,
    budget_refusals: AtomicU64,
    throttled: AtomicU64,
    failures: AtomicU64,
}

/// The storage retry policy. Cheap to clone: clones share the budget and the counters, so
/// build one per environment and hand clones to every effect.
#[derive(Debug, Clone)]
pub struct StorageRetry {
    inner: Arc<Inner>,
    /// Longest wait for one try of a [`call`](Self::call), when shorter than the client's own
    /// per-call timeout: a try not answered by then is retried as a transient failure.
    attempt_timeout: Option<Duration>,
}

impl Default for StorageRetry {
    fn default() -> Self {
        Self::new(StorageRetryConfig::default()).expect("the defaults are valid")
    }
}

/// The result of one round of a batch call.
#[derive(Debug)]
pub struct BatchStep<E, S> {
    /// Entries that succeeded (their results).
    pub succeeded: Vec<S>,
    /// Entries to send again (unprocessed, throttled, transient).
    pub retry: Vec<E>,
    /// Entries that failed for good, with the reason.
    pub failed: Vec<(E, String)>,
}

impl<E, S> Default for BatchStep<E, S> {
    fn default() -> Self {
        Self {
            succeeded: Vec::new(),
            retry: Vec::new(),
            failed: Vec::new(),
        }
    }
}

/// The result of a batch call after retries.
#[derive(Debug)]
pub struct BatchResult<E, S> {
    /// Results of the entries that succeeded.
    pub succeeded: Vec<S>,
    /// Entries that failed for good or were still failing when the policy stopped.
    pub failed: Vec<(E, String)>,
    /// Why the policy stopped early, when it did (a whole-call failure, the budget, the
    /// deadline or the attempt limit).
    pub error: Option<StorageError>,
}

impl StorageRetry {
    /// A policy with its own budget.
    pub fn new(config: StorageRetryConfig) -> Result<Self, InvalidRetryConfig> {
        if !(1..=20).contains(&config.max_attempts) {
            return Err(InvalidRetryConfig::MaxAttempts(config.max_attempts));
        }
        for base in [config.base, config.throttle_base] {
            if base.is_zero() || base > config.max_backoff {
                return Err(InvalidRetryConfig::Backoff {
                    base,
                    max: config.max_backoff,
                });
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                budget: RetryBudget::new(config.budget_capacity, config.budget_deposit_milli),
                config,
                retries: AtomicU64::new(0),
                budget_refusals: AtomicU64::new(0),
                throttled: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            }),
            attempt_timeout: None,
        })
    }

    /// This policy (the same budget and counters) with each try of a [`call`](Self::call)
    /// given at most `timeout`: a try not answered by then is abandoned and retried as a
    /// transient failure, so one stalled connection does not take a whole deadline.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The settings.
    pub fn config(&self) -> &StorageRetryConfig {
        &self.inner.config
    }

    /// The shared budget.
    pub fn budget(&self) -> &RetryBudget {
        &self.inner.budget
    }

    /// The counters so far.
    pub fn stats(&self) -> RetryStats {
        let i = &self.inner;
        RetryStats {
            retries: i.retries.load(Ordering::Relaxed),
            budget_refusals: i.budget_refusals.load(Ordering::Relaxed),
            throttled: i.throttled.load(Ordering::Relaxed),
            failures: i.failures.load(Ordering::Relaxed),
        }
    }

    /// The backoff before retry number `retry` (1 for the first): the capped exponential
    /// delay with "equal jitter" (uniform in its upper half), so retries spread out but never
    /// come back at once.
    pub fn backoff(&self, retry: u32, kind: FailureKind, rng: &mut impl Rng) -> Duration {
        let c = &self.inner.config;
        let base = if kind == FailureKind::Throttled {
            c.throttle_base
        } else {
            c.base
        };
        let exp = base.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        let capped = exp.min(c.max_backoff).as_micros() as u64;
        Duration::from_micros(capped / 2 + rng.random_range(0..=capped / 2))
    }

    /// Decides whether failure number `attempts` may be retried: the error, the attempt
    /// limit, the deadline, then the budget. `Ok(delay)` to retry after `delay`.
    fn next_delay(
        &self,
        kind: FailureKind,
        attempts: u32,
        deadline: Option<Instant>,
    ) -> Result<Duration, Stop> {
        let i = &self.inner;
        if kind == FailureKind::Throttled {
            i.throttled.fetch_add(1, Ordering::Relaxed);
        }
        if kind == FailureKind::Permanent {
            return Err(Stop::Permanent);
        }
        if attempts >= i.config.max_attempts {
            return Err(Stop::AttemptsExhausted);
        }
        let delay = self.backoff(attempts, kind, &mut rand::rng());
        if deadline.is_some_and(|d| Instant::now() + delay >= d) {
            return Err(Stop::Deadline);
        }
        if !i.budget.withdraw() {
            i.budget_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(Stop::BudgetEmpty);
        }
        i.retries.fetch_add(1, Ordering::Relaxed);
        Ok(delay)
    }

    /// Runs one SDK operation under the policy. `f` makes the call (it is called again for
    /// each retry); `deadline` is the latest moment a retry may end (the Lambda deadline).
    pub async fn call<T, E, F, Fut>(
        &self,
        op: &'static str,
        deadline: Option<Instant>,
        mut f: F,
    ) -> Result<T, StorageError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let mut attempts = 1;
        // Whether an earlier try ended without a definite answer.
        let mut uncertain = false;
        loop {
            let try_ends = self.attempt_timeout.map(|t| Instant::now() + t);
            let ends = match (deadline, try_ends) {
                (Some(d), Some(t)) => Some(d.min(t)),
                (d, t) => d.or(t),
            };
            let answer = match ends {
                None => f().await,
                Some(at) => match tokio::time::timeout_at(at, f()).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        uncertain = true;
                        // The try's own time ran out before the deadline: retried as a
                        // transient failure, when the policy allows another try.
                        let stop = if deadline.is_some_and(|d| at >= d) {
                            Stop::Deadline
                        } else {
                            match self.next_delay(FailureKind::Transient, attempts, deadline) {
                                Ok(delay) => {
                                    tracing::debug!(
                                        op,
                                        attempt = attempts,
                                        ?delay,
                                        "storage call timed out; retried"
                                    );
                                    tokio::time::sleep(delay).await;
                                    attempts += 1;
                                    continue;
                                }
                                Err(stop) => stop,
                            }
                        };
                        self.inner.failures.fetch_add(1, Ordering::Relaxed);
                        let what = match stop {
                            Stop::Deadline => "no answer before the deadline",
                            _ => "no answer within the time a try may take",
                        };
                        let mut err = StorageError::new(op, None, what, FailureKind::Transient);
                        err.stop = stop;
                        err.attempts = attempts;
                        err.uncertain = true;
                        return Err(err);
                    }
                },
            };
            match answer {
                Ok(v) => {
                    self.inner.budget.deposit();
                    return Ok(v);
                }
                Err(e) => {
                    let kind = classify(&e);
                    uncertain |= kind == FailureKind::Transient;
                    match self.next_delay(kind, attempts, deadline) {
                        Ok(delay) => {
                            tracing::debug!(
                                op,
                                attempt = attempts,
                                ?kind,
                                code = e.code(),
                                ?delay,
                                "storage call retried"
                            );
                            tokio::time::sleep(delay).await;
                            attempts += 1;
                        }
                        Err(stop) => {
                            self.inner.failures.fetch_add(1, Ordering::Relaxed);
                            let mut err = StorageError::from_sdk(op, &e, kind, attempts);
                            err.stop = stop;
                            err.uncertain = uncertain;
                            return Err(err);
                        }
                    }
                }
            }
        }
    }

    /// Runs a batch operation under the policy, sending again only the entries that failed
    /// retryably. `f` takes the pending entries, makes one call (usually through
    /// [`call`](Self::call), which retries whole-call failures) and sorts the entries.
    /// Each round after the first is one retry against the budget.
    pub async fn batch<E, S, F, Fut>(
        &self,
        op: &'static str,
        deadline: Option<Instant>,
        entries: Vec<E>,
        mut f: F,
    ) -> BatchResult<E, S>
    where
        E: Clone,
        F: FnMut(Vec<E>) -> Fut,
        Fut: Future<Output = Result<BatchStep<E, S>, StorageError>>,
    {
        let mut out = BatchResult {
            succeeded: Vec::new(),
            failed: Vec::new(),
            error: None,
        };
        let mut pending = entries;
        let mut rounds = 1;
        while !pending.is_empty() {
            match f(pending.clone()).await {
                Err(e) => {
                    let why = e.to_string();
                    out.failed.extend(pending.into_iter().map(|p| (p, why.clone())));
                    out.error = Some(e);
                    return out;
                }
                Ok(step) => {
                    out.succeeded.extend(step.succeeded);
                    out.failed.extend(step.failed);
                    pending = step.retry;
                }
            }
            if pending.is_empty() {
                break;
            }
            match self.next_delay(FailureKind::Throttled, rounds, deadline) {
                Ok(delay) => {
                    tracing::debug!(
                        op,
                        round = rounds,
                        left = pending.len(),
                        ?delay,
                        "batch entries retried"
                    );
                    tokio::time::sleep(delay).await;
                    rounds += 1;
                }
                Err(stop) => {
                    self.inner.failures.fetch_add(1, Ordering::Relaxed);
                    let n = pending.len();
                    let mut e = StorageError::new(
                        op,
                        None,
                        format!("{n} entries still unprocessed"),
                        FailureKind::Throttled,
                    );
                    e.stop = stop;
                    e.attempts = rounds;
                    let why = e.to_string();
                    out.failed.extend(pending.into_iter().map(|p| (p, why.clone())));
                    out.error = Some(e);
                    return out;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::super::error::tests::{reset, service};
    use super::*;

    fn quick(capacity: u32) -> StorageRetry {
        StorageRetry::new(StorageRetryConfig {
            base: Duration::from_millis(10),
            throttle_base: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            budget_capacity: capacity,
            ..StorageRetryConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn config_validates() {
        assert_eq!(
            StorageRetry::new(StorageRetryConfig {
                max_attempts: 0,
                ..Default::default()
            })
            .unwrap_err(),
            InvalidRetryConfig::MaxAttempts(0)
        );
        assert!(
            StorageRetry::new(StorageRetryConfig {
                base: Duration::ZERO,
                ..Default::default()
            })
            .is_err()
        );
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let r = StorageRetry::default();
        let mut rng = SmallRng::seed_from_u64(7);
        for n in 1..30 {
            let d = r.backoff(n, FailureKind::Transient, &mut rng);
            let exp = Duration::from_millis(25)
                .saturating_mul(1 << (n - 1).min(20))
                .min(Duration::from_secs(2));
            assert!(d >= exp / 2 && d <= exp, "retry {n}: {d:?} vs {exp:?}");
        }
        let t = r.backoff(1, FailureKind::Throttled, &mut rng);
        assert!(
            t >= Duration::from_millis(50),
            "throttling backs off longer: {t:?}"
        );
    }

    #[test]
    fn budget_deposits_and_withdraws() {
        let b = RetryBudget::new(2, 500);
        assert!(b.withdraw());
        assert!(b.withdraw());
        assert!(!b.withdraw());
        b.deposit();
        assert!(!b.withdraw(), "half a retry is not enough");
        b.deposit();
        assert!(b.withdraw());
        for _ in 0..100 {
            b.deposit();
        }
        assert_eq!(b.available(), 2, "capped at capacity");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_until_success() {
        let r = quick(10);
        let calls = AtomicU32::new(0);
        let out = r
            .call("GetItem", None, || async {
                match calls.fetch_add(1, Ordering::Relaxed) {
                    0 => Err(service("ProvisionedThroughputExceededException", 400)),
                    1 => Err(service("ServiceUnavailable", 503)),
                    2 => Err(reset()),
                    _ => Ok(7),
                }
            })
            .await
            .unwrap();
        assert_eq!(out, 7);
        let s = r.stats();
        assert_eq!((s.retries, s.throttled, s.failures), (3, 1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn never_retries_permanent_errors_and_names_the_resource() {
        let r = quick(10);
        let calls = AtomicU32::new(0);
        let err = r
            .call("GetItem", None, || async {
                calls.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(service("ResourceNotFoundException", 400))
            })
            .await
            .unwrap_err()
            .with_resource("jobs");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(err.stop, Stop::Permanent);
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            "DynamoDB table `jobs` does not exist (ResourceNotFoundException)"
        );
        let ccf = r
            .call("UpdateItem", None, || async {
                Err::<(), _>(service("ConditionalCheckFailedException", 400))
            })
            .await
            .unwrap_err();
        assert!(ccf.is_conditional_check_failed());
        assert_eq!(r.stats().retries, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_max_attempts_budget_and_deadline() {
        let r = quick(100);
        let calls = AtomicU32::new(0);
        let err = r
            .call("PutItem", None, || async {
                calls.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(service("InternalServerError", 500))
            })
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::Relaxed), 8);
        assert_eq!((err.stop, err.attempts), (Stop::AttemptsExhausted, 8));
        assert!(!err.to_string().contains('\n'));
        assert!(
            err.to_string()
                .contains("PutItem failed: InternalServerError: boom second line (gave up after 8 attempts)")
        );

        let small = quick(3);
        let err = small
            .call("PutItem", None, || async { Err::<(), _>(reset()) })
            .await
            .unwrap_err();
        assert_eq!((err.stop, err.attempts), (Stop::BudgetEmpty, 4));
        assert_eq!(small.stats().budget_refusals, 1);
        assert_eq!(small.stats().retries, 3);

        let r = quick(100);
        let start = Instant::now();
        let err = r
            .call("PutItem", Some(start + Duration::from_millis(30)), || async {
                Err::<(), _>(reset())
            })
            .await
            .unwrap_err();
        assert_eq!(err.stop, Stop::Deadline);
        assert!(Instant::now() <= start + Duration::from_millis(30));
    }

    #[tokio::test(start_paused = true)]
    async fn batch_retries_only_failed_entries() {
        let r = quick(10);
        let round = AtomicU32::new(0);
        let out = r
            .batch("BatchWriteItem", None, (1..=5).collect::<Vec<u32>>(), |pending| {
                let first = round.fetch_add(1, Ordering::Relaxed) == 0;
                async move {
                    let mut step = BatchStep::default();
                    for p in pending {
                        match p {
                            5 => step.failed.push((p, "bad".to_owned())),
                            2 if first => step.retry.push(p),
                            _ => step.succeeded.push(p * 10),
                        }
                    }
                    Ok(step)
                }
            })
            .await;
        assert_eq!(out.succeeded.len(), 4);
        assert_eq!(out.failed, vec![(5, "bad".to_owned())]);
        assert!(out.error.is_none());

        // Entries that never succeed end as failures with the reason once the policy stops.
        let r = quick(2);
        let out: BatchResult<u32, u32> = r
            .batch("BatchGetItem", None, vec![1, 2], |pending| async move {
                Ok(BatchStep {
                    retry: pending,
                    ..BatchStep::default()
                })
            })
            .await;
        assert_eq!(out.failed.len(), 2);
        assert_eq!(out.error.unwrap().stop, Stop::BudgetEmpty);
    }
}
