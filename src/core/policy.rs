//! A job type's retry policy: how many executions, how long between them, how errors are
//! classified, and the limits SQS puts on all of it.

use std::time::Duration;

use rand::RngCore;
use thiserror::Error;

use super::backoff::Backoff;
use super::error::{ErrorKind, JobError, Rules};

/// The longest visibility timeout SQS allows, counted from the receive.
pub(crate) const SQS_MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);
/// SQS's longest retention period.
pub(crate) const SQS_MAX_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PolicyError {
    /// `max_attempts` outside 1..=1000.
    #[error("max attempts must be 1 to 1000 (got {0})")]
    MaxAttempts(u32),
    /// Multiplier not finite or below 1.
    #[error("backoff multiplier must be a finite number from 1 to 100 (got {0})")]
    Multiplier(f64),
    /// A zero or over-long max delay.
    #[error("max delay must be 1 s to 14 days (got {0:?})")]
    MaxDelay(Duration),
    /// The worst-case schedule outlives the queue.
    #[error(
        "worst-case retry schedule ({schedule:?}) outlives the queue's retention period ({retention:?}); \
         lower max attempts or max delay, or raise the retention"
    )]
    OutlivesRetention {
        /// Sum of the largest delays of every retry.
        schedule: Duration,
        /// The queue's retention period.
        retention: Duration,
    },
    /// A job type's breaker stays open longer than a message can wait in the queue.
    #[error(
        "breaker of `{job_type}` opens for {open_for:?}, not less than the queue's retention period ({retention:?}); \
         every job it defers would expire: lower TRIAGE_BREAKER_OPEN_S or raise the retention"
    )]
    BreakerOutlivesRetention {
        /// The job type.
        job_type: String,
        /// The breaker's open period.
        open_for: Duration,
        /// The queue's retention period.
        retention: Duration,
    },
}

/// A job type's retry policy. Build it with [`RetryPolicy::builder`]; the defaults are the seed's.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    backoff: Backoff,
    max_delay: Duration,
    rules: Rules,
    defer_jitter: Duration,
    start_margin: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            backoff: Backoff::default(),
            max_delay: Duration::from_secs(3600),
            rules: Rules::new(),
            defer_jitter: Duration::from_secs(3),
            start_margin: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// A builder starting from the defaults: 5 attempts, 3 s × 2 up to 1 h, jitter ≤ 1 s.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder {
            policy: Self::default(),
        }
    }

    /// Handler executions in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay strategy.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// No retry delay, Retry-After included, exceeds this.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The job type's classification rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Spread added to breaker deferrals so deferred jobs do not return together.
    pub fn defer_jitter(&self) -> Duration {
        self.defer_jitter
    }

    /// Least time left before the invocation's deadline to start a record.
    pub fn start_margin(&self) -> Duration {
        self.start_margin
    }

    /// The delay before retry `n` after `err`: Retry-After if the error asked for one, else the
    /// backoff strategy; either way capped at `max_delay`.
    pub fn retry_delay(&self, n: u32, err: &JobError, rng: &mut dyn RngCore) -> Duration {
        let d = match err.kind() {
            ErrorKind::RetryAfter(d) => d,
            _ => self.backoff.delay(n, err, rng),
        };
        d.min(self.max_delay)
    }

    /// The longest a job can spend in retry delays: the sum of the largest delay of each retry.
    pub fn worst_case_schedule(&self) -> Duration {
        (1..self.max_attempts)
            .map(|n| {
                self.backoff
                    .worst_case(n)
                    .unwrap_or(self.max_delay)
                    .min(self.max_delay)
            })
            .sum()
    }

    /// Refuses a policy whose worst-case schedule would let a job expire in its queue.
    pub fn check_retention(&self, retention: Duration) -> Result<(), PolicyError> {
        let schedule = self.worst_case_schedule();
        if schedule >= retention {
            return Err(PolicyError::OutlivesRetention { schedule, retention });
        }
        Ok(())
    }
}

/// Builds a validated [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct RetryPolicyBuilder {
    policy: RetryPolicy,
}

impl RetryPolicyBuilder {
    /// Handler executions in all (1 to 1000).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.policy.max_attempts = n;
        self
    }

    /// The delay strategy.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.policy.backoff = b;
        self
    }

    /// The cap on every delay (1 s to 14 days).
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.policy.max_delay = d;
        self
    }

    /// Classification rules for this job type.
    pub fn rules(mut self, r: Rules) -> Self {
        self.policy.rules = r;
        self
    }

    /// Spread added to breaker deferrals.
    pub fn defer_jitter(mut self, d: Duration) -> Self {
        self.policy.defer_jitter = d;
        self
    }

    /// Least time left to start a record.
    pub fn start_margin(mut self, d: Duration) -> Self {
        self.policy.start_margin = d;
        self
    }

    /// Validates and returns the policy.
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        let p = self.policy;
        if !(1..=1000).contains(&p.max_attempts) {
            return Err(PolicyError::MaxAttempts(p.max_attempts));
        }
        if p.max_delay < Duration::from_secs(1) || p.max_delay > SQS_MAX_RETENTION {
            return Err(PolicyError::MaxDelay(p.max_delay));
        }
        match p.backoff {
            Backoff::Exponential { multiplier, .. } | Backoff::FullJitter { multiplier, .. }
                if !(multiplier.is_finite() && (1.0..=100.0).contains(&multiplier)) =>
            {
                return Err(PolicyError::Multiplier(multiplier));
            }
            _ => {}
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_seeds() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts(), 5);
        assert_eq!(p.max_delay(), Duration::from_secs(3600));
        // 4 retries: (3+1) + (6+1) + (12+1) + (24+1) seconds at worst.
        assert_eq!(p.worst_case_schedule(), Duration::from_secs(49));
    }

    #[test]
    fn builder_validates() {
        assert_eq!(
            RetryPolicy::builder().max_attempts(0).build().unwrap_err(),
            PolicyError::MaxAttempts(0)
        );
        let b = Backoff::exponential(
            Duration::from_secs(1),
            f64::NAN,
            Duration::from_secs(9),
            Duration::ZERO,
        );
        assert!(matches!(
            RetryPolicy::builder().backoff(b).build(),
            Err(PolicyError::Multiplier(_))
        ));
        assert!(matches!(
            RetryPolicy::builder()
                .max_delay(Duration::from_millis(10))
                .build(),
            Err(PolicyError::MaxDelay(_))
        ));
    }

    #[test]
    fn retention_check_rejects_long_schedules() {
        let p = RetryPolicy::builder()
            .max_attempts(25)
            .backoff(Backoff::Sidekiq)
            .max_delay(Duration::from_secs(14 * 24 * 3600))
            .build()
            .unwrap();
        // Sidekiq's 25 retries take about three weeks: longer than SQS can keep a message.
        assert!(p.check_retention(SQS_MAX_RETENTION).is_err());
        let p = RetryPolicy {
            backoff: Backoff::Sidekiq8,
            ..p
        };
        assert!(p.check_retention(SQS_MAX_RETENTION).is_err());
        assert!(
            RetryPolicy::default()
                .check_retention(Duration::from_secs(4 * 24 * 3600))
                .is_ok()
        );
    }

    #[test]
    fn retry_after_is_capped() {
        let p = RetryPolicy::builder()
            .max_delay(Duration::from_secs(60))
            .build()
            .unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
        let e = JobError::retry_after(Duration::from_secs(600), "slow down");
        assert_eq!(p.retry_delay(1, &e, &mut rng), Duration::from_secs(60));
        let e = JobError::retry_after(Duration::from_secs(5), "slow down");
        assert_eq!(p.retry_delay(1, &e, &mut rng), Duration::from_secs(5));
    }
}
