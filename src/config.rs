//! Configuration from `TRIAGE_*` environment variables. Bad values stop start-up with a
//! message naming the variable and the accepted range.

use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

use crate::core::backoff::Backoff;
use crate::core::breaker::BreakerConfig;
use crate::core::policy::RetryPolicy;

/// A configuration value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{var}={value:?} is not valid: expected {expected}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// What it held.
    pub value: String,
    /// The accepted range.
    pub expected: String,
}

/// Everything the runtimes read from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TRIAGE_QUEUE_URL`: the source queue (the worker polls it).
    pub queue_url: Option<String>,
    /// `TRIAGE_DLQ_URL`: where dead-lettered copies go.
    pub dlq_url: Option<String>,
    /// `TRIAGE_TABLE`: the state table (attempt ledger and breakers).
    pub table: Option<String>,
    /// Default retry policy of every job type.
    pub policy: RetryPolicy,
    /// Default breaker settings of every job type.
    pub breaker: BreakerConfig,
    /// `TRIAGE_CONCURRENCY`: records run at once per batch (1 to 1000, default 10).
    pub concurrency: usize,
    /// `TRIAGE_LOG_PAYLOADS`: include bodies in logs (default off).
    pub log_payloads: bool,
}

fn parse<T: FromStr + PartialOrd + Copy + std::fmt::Display>(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    default: T,
    min: T,
    max: T,
) -> Result<T, ConfigError> {
    let Some(raw) = lookup(var).filter(|v| !v.trim().is_empty()) else {
        return Ok(default);
    };
    match raw.trim().parse::<T>() {
        Ok(v) if v >= min && v <= max => Ok(v),
        _ => Err(ConfigError {
            var,
            value: raw,
            expected: format!("a number from {min} to {max}"),
        }),
    }
}

fn invalid(var: &'static str, value: impl ToString, expected: impl ToString) -> ConfigError {
    ConfigError {
        var,
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads configuration through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let text = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let max_attempts = parse(lookup, "TRIAGE_MAX_ATTEMPTS", 5u32, 1, 1000)?;
        let base = parse(lookup, "TRIAGE_BASE_DELAY_MS", 3_000u64, 0, 43_200_000)?;
        let mult = parse(lookup, "TRIAGE_BACKOFF_MULTIPLIER", 2.0f64, 1.0, 100.0)?;
        let max = parse(lookup, "TRIAGE_MAX_DELAY_MS", 3_600_000u64, 1_000, 1_209_600_000)?;
        let jitter = parse(lookup, "TRIAGE_JITTER_MAX_MS", 1_000u64, 0, 3_600_000)?;
        let backoff = Backoff::exponential(
            Duration::from_millis(base),
            mult,
            Duration::from_millis(max),
            Duration::from_millis(jitter),
        );
        let policy = RetryPolicy::builder()
            .max_attempts(max_attempts)
            .backoff(backoff)
            .max_delay(Duration::from_millis(max))
            .build()
            .map_err(|e| invalid("TRIAGE_MAX_DELAY_MS", max, e))?;
        let d = BreakerConfig::default();
        let breaker = BreakerConfig::builder()
            .threshold(parse(
                lookup,
                "TRIAGE_BREAKER_THRESHOLD",
                d.threshold(),
                1,
                100_000,
            )?)
            .window(Duration::from_secs(parse(
                lookup,
                "TRIAGE_BREAKER_WINDOW_S",
                d.window().as_secs(),
                1,
                86_400,
            )?))
            .open_for(Duration::from_secs(parse(
                lookup,
                "TRIAGE_BREAKER_OPEN_S",
                d.open_for().as_secs(),
                1,
                43_200,
            )?))
            .probes(parse(lookup, "TRIAGE_BREAKER_PROBES", d.probes(), 1, 100)?)
            .successes_to_close(parse(
                lookup,
                "TRIAGE_BREAKER_SUCCESSES",
                d.successes_to_close(),
                1,
                100,
            )?)
            .cache_ttl(Duration::from_millis(parse(
                lookup,
                "TRIAGE_BREAKER_CACHE_MS",
                d.cache_ttl().as_millis() as u64,
                0,
                300_000,
            )?))
            .build()
            .map_err(|e| {
                use crate::core::breaker::BreakerConfigError as E;
                let var = match e {
                    E::Threshold(_) => "TRIAGE_BREAKER_THRESHOLD",
                    E::Window(_) => "TRIAGE_BREAKER_WINDOW_S",
                    E::OpenFor(_) | E::Lease(_) => "TRIAGE_BREAKER_OPEN_S",
                    E::Probes(_) => "TRIAGE_BREAKER_PROBES",
                    E::SuccessesToClose(_) => "TRIAGE_BREAKER_SUCCESSES",
                    E::CacheTtl(_) => "TRIAGE_BREAKER_CACHE_MS",
                };
                invalid(var, "", e)
            })?;
        let log_payloads = match text("TRIAGE_LOG_PAYLOADS").as_deref().map(str::trim) {
            None | Some("0" | "false" | "no") => false,
            Some("1" | "true" | "yes") => true,
            Some(other) => return Err(invalid("TRIAGE_LOG_PAYLOADS", other, "true or false")),
        };
        Ok(Self {
            queue_url: text("TRIAGE_QUEUE_URL"),
            dlq_url: text("TRIAGE_DLQ_URL"),
            table: text("TRIAGE_TABLE"),
            policy,
            breaker,
            concurrency: parse(lookup, "TRIAGE_CONCURRENCY", 10usize, 1, 1000)?,
            log_payloads,
        })
    }

    /// A required variable, or an error that says how to set it.
    pub fn require<'a>(value: &'a Option<String>, var: &'static str) -> Result<&'a str, ConfigError> {
        value
            .as_deref()
            .ok_or_else(|| invalid(var, "", "a value (it is not set; `triage setup` prints one)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&move |k| m.get(k).cloned())
    }

    #[test]
    fn defaults_without_variables() {
        let c = with(&[]).unwrap();
        assert_eq!(c.policy.max_attempts(), 5);
        assert_eq!(c.breaker.threshold(), 5);
        assert_eq!(c.concurrency, 10);
        assert!(!c.log_payloads);
    }

    #[test]
    fn values_are_read_and_bad_ones_name_the_variable_and_range() {
        let c = with(&[("TRIAGE_MAX_ATTEMPTS", "3"), ("TRIAGE_BREAKER_OPEN_S", "10")]).unwrap();
        assert_eq!(c.policy.max_attempts(), 3);
        assert_eq!(c.breaker.open_for(), Duration::from_secs(10));
        let e = with(&[("TRIAGE_MAX_ATTEMPTS", "0")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TRIAGE_MAX_ATTEMPTS=\"0\" is not valid: expected a number from 1 to 1000"
        );
        let e = with(&[("TRIAGE_BREAKER_THRESHOLD", "1000000")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_BREAKER_THRESHOLD");
        let e = with(&[("TRIAGE_BACKOFF_MULTIPLIER", "fast")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_BACKOFF_MULTIPLIER");
    }
}
