//! The built-in job type `triage.chaos`, for demos, tests and smoke tests of a deployment.
//!
//! Payload: `outcome` (ok | fatal | transient | throttle | panic), `fail_times` (fail with that
//! outcome on attempts 1..=N and succeed from N+1; absent: every attempt), `retry_after_ms`
//! (for throttle), `sleep_ms` (work time before the outcome).

use std::time::Duration;

use serde::Deserialize;

use crate::core::JobError;
use crate::core::breaker::BreakerConfig;
use crate::core::policy::RetryPolicy;
use crate::processor::registry::{JobContext, Registry};

/// The chaos job type's name.
pub const CHAOS: &str = "triage.chaos";

/// What a chaos job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ChaosOutcome {
    /// Succeed.
    #[default]
    Ok,
    /// Fail fatally.
    Fatal,
    /// Fail transiently.
    Transient,
    /// Ask to be retried after `retry_after_ms`.
    Throttle,
    /// Panic.
    Panic,
}

/// The chaos payload.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ChaosPayload {
    /// What to do on a failing attempt.
    #[serde(default)]
    pub outcome: ChaosOutcome,
    /// Fail on attempts 1..=N, then succeed.
    pub fail_times: Option<u32>,
    /// Delay asked for by `throttle`.
    pub retry_after_ms: Option<u64>,
    /// Work time before the outcome.
    pub sleep_ms: Option<u64>,
}

/// Runs one chaos job.
pub async fn run(p: ChaosPayload, ctx: JobContext) -> Result<(), JobError> {
    if let Some(ms) = p.sleep_ms {
        tokio::time::sleep(Duration::from_millis(ms.min(900_000))).await;
    }
    if p.fail_times.is_some_and(|n| ctx.attempt > n) {
        return Ok(());
    }
    match p.outcome {
        ChaosOutcome::Ok => Ok(()),
        ChaosOutcome::Fatal => Err(JobError::fatal(format!(
            "chaos: fatal on attempt {}",
            ctx.attempt
        ))),
        ChaosOutcome::Transient => Err(JobError::transient(format!(
            "chaos: transient on attempt {}",
            ctx.attempt
        ))),
        ChaosOutcome::Throttle => Err(JobError::retry_after(
            Duration::from_millis(p.retry_after_ms.unwrap_or(1_000)),
            format!("chaos: throttled on attempt {}", ctx.attempt),
        )),
        ChaosOutcome::Panic => panic!("chaos: panic on attempt {}", ctx.attempt),
    }
}

/// Adds the chaos job type to a registry with the given policies.
pub fn register(registry: Registry, policy: RetryPolicy, breaker: BreakerConfig) -> Registry {
    registry.handle_with(CHAOS, policy, breaker, run)
}
