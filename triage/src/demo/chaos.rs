//! The built-in job type `triage.chaos`, for demos, tests and smoke tests of a deployment.
//!
//! Payload: `outcome` (ok | fatal | transient | throttle | panic), `fail_times` (fail with that
//! outcome on attempts 1..=N and succeed from N+1; absent: every attempt), `retry_after_ms`
//! (for throttle), `sleep_ms` (work time before the outcome), `panic_message` (for panic: a
//! value the panic message carries, quoted the way `panic!("{value:?}")` quotes it, as a
//! handler that panics with its payload would), `down_windows_ms` (a dependency shared by
//! every process, down by the clock: a list of `[start, end]` pairs of epoch milliseconds;
//! an attempt whose outcome falls at or after a `start` and before its `end` fails
//! transiently with an error saying the dependency is down, whatever `outcome` says, and
//! spends its attempt like any other; outside every window the job behaves per `outcome` and
//! `fail_times`. Processes on one host share the clock, so their jobs see the same outages).
//!
//! With `TRIAGE_CHAOS_RECORD_TABLE` set (or a [`Recorder`] given to [`register_recording`]),
//! every execution is also written to that side table *before* the handler returns: one item
//! per execution (`pk = exec#<job id>`, `sk = <message id>#<attempt>#<unique>`) with the
//! attempt, the message id and the result (`ok` or the failing outcome; a slow job's item is
//! first written as `started` before its `sleep_ms`, then replaced by the result, so an
//! execution stopped at a deadline or killed with its process still shows up, once). Chaos tests account
//! from it instead of from logs. A success that cannot be recorded is returned as a transient
//! failure, so "recorded ok" and "handler returned Ok" never disagree. The recorder's writes
//! go through the crate's one retry mechanism, a [`StorageRetry`] of its own (up to
//! [`RECORD_MAX_ATTEMPTS`] tries; a handler side effect, so its retries never count as job
//! attempts), over a client with the SDK's retries disabled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Deserialize;

use sqs_triage::core::JobError;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::policy::RetryPolicy;
use sqs_triage::effects::storage_retry::{StorageRetry, StorageRetryConfig, dynamodb_client};
use sqs_triage::processor::registry::{JobContext, Registry};

/// The chaos job type's name.
pub const CHAOS: &str = "triage.chaos";

/// How the `panic` outcome's panic message starts (the attempt follows).
pub const PANIC_PREFIX: &str = "chaos: panic on attempt";

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
    /// A value the panic message carries (`panic` only), `{:?}`-quoted.
    pub panic_message: Option<String>,
    /// `[start, end]` windows (epoch ms) in which the job's dependency is down: an attempt
    /// inside one fails transiently (recorded as `down`); outside, `outcome` applies.
    pub down_windows_ms: Option<Vec<[u64; 2]>>,
}

impl ChaosPayload {
    /// The down window `now_ms` falls in (`start <= now_ms < end`), if any.
    pub(crate) fn down_at(&self, now_ms: u64) -> Option<[u64; 2]> {
        self.down_windows_ms
            .iter()
            .flatten()
            .find(|[start, end]| (*start..*end).contains(&now_ms))
            .copied()
    }
}

/// The variable naming the side table of [`Recorder::from_env`].
pub const RECORD_TABLE_ENV: &str = "TRIAGE_CHAOS_RECORD_TABLE";

/// Writes one item per chaos execution to a side table (same key schema as the state table:
/// string `pk` and `sk`), for tests that account from the emulator's state.
#[derive(Debug, Clone)]
pub struct Recorder {
    client: aws_sdk_dynamodb::Client,
    table: String,
    retry: StorageRetry,
}

/// Tries per record write, the first included.
pub const RECORD_MAX_ATTEMPTS: u32 = 10;

impl Recorder {
    /// A recorder writing to `table` with `client` (build it with
    /// [`dynamodb_client`], so the recorder's
    /// retries are the only ones).
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        let retry = StorageRetry::new(StorageRetryConfig {
            max_attempts: RECORD_MAX_ATTEMPTS,
            ..StorageRetryConfig::default()
        })
        .unwrap_or_default();
        Self {
            client,
            table: table.into(),
            retry,
        }
    }

    /// A recorder for `TRIAGE_CHAOS_RECORD_TABLE`, if set.
    pub fn from_env(sdk: &SdkConfig) -> Option<Self> {
        let table = std::env::var(RECORD_TABLE_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())?;
        Some(Self::new(dynamodb_client(sdk), table))
    }

    /// A key for one execution, unique across processes.
    pub(crate) fn execution_key() -> String {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        format!(
            "{}-{}-{}",
            std::process::id(),
            sqs_triage::clock::now_ms(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Records execution `key` of `ctx` with its result (`started`, `ok` or the failing
    /// outcome's name); a later record of the same execution replaces the earlier one.
    pub async fn record(&self, ctx: &JobContext, key: &str, result: &str) -> Result<(), String> {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        self.retry
            .call("PutItem", None, || {
                self.client
                    .put_item()
                    .table_name(&self.table)
                    .item("pk", s(&format!("exec#{}", ctx.job_id)))
                    .item("sk", s(&format!("{}#{}#{key}", ctx.message_id, ctx.attempt)))
                    .item("job_id", s(&ctx.job_id))
                    .item("message_id", s(&ctx.message_id))
                    .item("attempt", AttributeValue::N(ctx.attempt.to_string()))
                    .item("result", s(result))
                    .send()
            })
            .await
            .map(|_| ())
            .map_err(|e| e.with_resource(&self.table).to_string())
    }
}

/// Runs one chaos job.
pub async fn run(p: ChaosPayload, ctx: JobContext) -> Result<(), JobError> {
    run_recorded(p, ctx, None).await
}

/// Runs one chaos job and, with a recorder, records the execution before returning. The
/// recorder's writes are boxed: an SDK call's future is kilobytes, and without the box every
/// job's future carries it, copied as the processor moves it into its task.
pub(crate) async fn run_recorded(
    p: ChaosPayload,
    ctx: JobContext,
    recorder: Option<&Recorder>,
) -> Result<(), JobError> {
    let key = Recorder::execution_key();
    if let Some(ms) = p.sleep_ms {
        // A slow execution is also recorded when it starts, so one stopped at a deadline or
        // killed with its process still shows up.
        if let Some(r) = recorder {
            if let Err(e) = Box::pin(r.record(&ctx, &key, "started")).await {
                tracing::warn!(error = %e, "chaos: execution start not recorded");
            }
        }
        tokio::time::sleep(Duration::from_millis(ms.min(900_000))).await;
    }
    // The dependency's state is read when the work is done, after any `sleep_ms`.
    let down = p.down_at(sqs_triage::clock::now_ms());
    let succeeds =
        down.is_none() && (p.outcome == ChaosOutcome::Ok || p.fail_times.is_some_and(|n| ctx.attempt > n));
    if let Some(r) = recorder {
        let result = match down {
            Some(_) => "down",
            None if succeeds => "ok",
            None => p.outcome.name(),
        };
        if let Err(e) = Box::pin(r.record(&ctx, &key, result)).await {
            if succeeds {
                return Err(JobError::transient(format!("chaos: success not recorded: {e}")));
            }
            tracing::warn!(error = %e, "chaos: execution not recorded");
        }
    }
    if succeeds {
        return Ok(());
    }
    if let Some([start, end]) = down {
        return Err(JobError::transient(format!(
            "chaos: dependency down (from {start} to {end} epoch ms) on attempt {}",
            ctx.attempt
        )));
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
        ChaosOutcome::Panic => match p.panic_message {
            None => panic!("{PANIC_PREFIX} {}", ctx.attempt),
            Some(m) => panic!("{PANIC_PREFIX} {}: {m:?}", ctx.attempt),
        },
    }
}

impl ChaosOutcome {
    /// The payload's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Fatal => "fatal",
            Self::Transient => "transient",
            Self::Throttle => "throttle",
            Self::Panic => "panic",
        }
    }
}

/// A registry with the chaos job type alone, under the registry's defaults (the `TRIAGE_*`
/// variables, see [`Registry::default`]), recording every execution with `recorder` when
/// there is one: what `triage-lambda` and `triage worker --demo-handlers` serve.
pub fn registry(recorder: Option<Recorder>) -> Registry {
    let recorder = recorder.map(std::sync::Arc::new);
    Registry::default().handle(CHAOS, move |p: ChaosPayload, ctx: JobContext| {
        let recorder = recorder.clone();
        async move { run_recorded(p, ctx, recorder.as_deref()).await }
    })
}

/// Adds the chaos job type to a registry with the given policies.
pub fn register(registry: Registry, policy: RetryPolicy, breaker: BreakerConfig) -> Registry {
    registry.handle_with(CHAOS, policy, breaker, run)
}

/// Like [`register`], recording every execution with `recorder` when there is one.
pub fn register_recording(
    registry: Registry,
    policy: RetryPolicy,
    breaker: BreakerConfig,
    recorder: Option<Recorder>,
) -> Registry {
    let Some(recorder) = recorder else {
        return register(registry, policy, breaker);
    };
    let recorder = std::sync::Arc::new(recorder);
    registry.handle_with(CHAOS, policy, breaker, move |p: ChaosPayload, ctx: JobContext| {
        let recorder = recorder.clone();
        async move { run_recorded(p, ctx, Some(&recorder)).await }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_triage::core::ErrorKind;

    fn ctx(attempt: u32) -> JobContext {
        JobContext {
            deadline_ms: None,
            job_id: "j".into(),
            job_type: CHAOS.into(),
            message_id: "m".into(),
            attempt,
            max_attempts: 5,
        }
    }

    fn payload(v: serde_json::Value) -> ChaosPayload {
        serde_json::from_value(v).unwrap()
    }

    #[tokio::test]
    async fn a_down_window_fails_transiently_and_outside_it_the_outcome_applies() {
        let now = sqs_triage::clock::now_ms();
        let inside = payload(serde_json::json!({
            "outcome": "ok",
            "down_windows_ms": [[now - 60_000, now - 30_000], [now - 1_000, now + 60_000]],
        }));
        let err = run(inside, ctx(1)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transient);
        assert!(err.message().contains("dependency down"), "{}", err.message());

        let past = serde_json::json!([[now - 60_000, now - 30_000]]);
        let ok = payload(serde_json::json!({"outcome": "ok", "down_windows_ms": past}));
        assert!(run(ok, ctx(1)).await.is_ok());
        let fatal = payload(serde_json::json!({"outcome": "fatal", "down_windows_ms": past}));
        assert_eq!(run(fatal, ctx(1)).await.unwrap_err().kind(), ErrorKind::Fatal);
        let flaky = payload(serde_json::json!({
            "outcome": "transient", "fail_times": 1, "down_windows_ms": past,
        }));
        assert!(run(flaky, ctx(2)).await.is_ok());
        // The end is exclusive; an empty or inverted window is never down.
        let edge = payload(serde_json::json!({
            "outcome": "ok", "down_windows_ms": [[now - 10, now - 10], [now + 5, now - 5]],
        }));
        assert_eq!(edge.down_at(now), None);
        assert_eq!(edge.down_at(now - 10), None);
    }
}
