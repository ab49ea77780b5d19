//! Configuration from `TRIAGE_*` environment variables. Bad values stop start-up with a
//! message naming the variable and the accepted range.

use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

use crate::core::backoff::Backoff;
use crate::core::breaker::BreakerConfig;
use crate::core::envelope::EventBridgeTypes;
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
    /// `TRIAGE_DLQ_MAX_BYTES`: the DLQ's `MaximumMessageSize` (1024 to 1048576, SQS's range), as
    /// the stack that made the DLQ configured it. Unset: the runtime reads the DLQ's own limit
    /// at its first DLQ send and keeps it.
    pub dlq_max_bytes: Option<usize>,
    /// `TRIAGE_QUEUE_RETENTION_S`, `TRIAGE_QUEUE_VISIBILITY_S` and `TRIAGE_QUEUE_MAX_RECEIVE`:
    /// the source queue's attributes as the stack that made it configured them, all three or
    /// none. Set, start-up does not read the source queue (see [`QueueFacts`]).
    pub source_queue: Option<QueueFacts>,
    /// How long start-up's reads may take in all, from no variable: the Lambda adapter sets
    /// it (8 s) so a stalled service
    /// cannot run the init into Lambda's limit; `None` (the worker's) retries each read as
    /// the storage retry policy allows.
    pub startup_deadline: Option<std::time::Duration>,
    /// Whether start-up leaves its first breaker read (the table's check) running, to be
    /// awaited at the first admission, from no variable: the Lambda adapter sets it so the
    /// read overlaps the poll for the first event. A table the read finds misconfigured then
    /// fails that invocation instead of the start-up.
    pub first_read_at_admission: bool,
    /// Default retry policy of every job type.
    pub policy: RetryPolicy,
    /// Default breaker settings of every job type.
    pub breaker: BreakerConfig,
    /// `TRIAGE_CONCURRENCY`: records run at once per batch (1 to 1000, default 10).
    pub concurrency: usize,
    /// `TRIAGE_LOG_PAYLOADS`: include bodies in logs (default off).
    pub log_payloads: bool,
    /// `TRIAGE_EMF`: a worker prints EMF metric lines to stdout (default off; Lambda always
    /// does).
    pub emf: bool,
    /// `TRIAGE_DONE_MARKER_TYPES`: job types with a completion marker (comma-separated; default
    /// none). See [`Registry::done_marker`](crate::processor::registry::Registry::done_marker).
    pub done_marker_types: Vec<String>,
    /// `TRIAGE_DONE_MARKER_TTL_S`: how long a completion marker lives (default 1 day).
    pub done_marker_ttl: Duration,
    /// `TRIAGE_HEARTBEAT_S`: seconds between the visibility heartbeat's ticks while a batch
    /// runs (0 to 3600, default 5); `None` (`0`): no heartbeat. See docs/handlers.md.
    pub heartbeat: Option<Duration>,
    /// `TRIAGE_EVENTBRIDGE_TYPES`: job types of EventBridge events by `detail-type`
    /// (`Detail Type=job.type;…` or a JSON object; default none). Mappings given in code
    /// ([`Registry::eventbridge_type`](crate::processor::registry::Registry::eventbridge_type))
    /// win for the detail-types they name.
    pub eventbridge_types: EventBridgeTypes,
    /// `TRIAGE_JOB_TYPES`: the job types the Lambda layer's extension runs in the function's
    /// own runtime (comma-separated; default none). Only the layer reads it.
    pub job_types: Vec<String>,
    /// `TRIAGE_FATAL_ERRORS`: error types (`errorType` of a runtime's error body) the layer
    /// classifies fatal, on top of its per-language defaults (comma-separated). An entry
    /// `JOB_TYPE/ErrorName` applies to that job type alone.
    pub fatal_errors: Vec<String>,
    /// `TRIAGE_TRANSIENT_ERRORS`: error types the layer classifies transient, even those on
    /// its fatal defaults; they win over `TRIAGE_FATAL_ERRORS` (comma-separated;
    /// `JOB_TYPE/ErrorName` for one job type).
    pub transient_errors: Vec<String>,
}

/// What the runtimes need to know of the source queue, as its stack configured it: with these
/// given, start-up makes no call to the source queue (unset, it reads them with
/// `GetQueueAttributes`). They are trusted for the process's life, so they must be the queue's
/// own: the SAM and CDK stacks set them from the queue they make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFacts {
    /// `MessageRetentionPeriod`: every retry policy's worst case must fit in it.
    pub retention: Duration,
    /// `VisibilityTimeout`: the heartbeat never sets less, and must tick more often.
    pub visibility: Duration,
    /// The redrive policy's `maxReceiveCount`; `None` (`0`) when the queue has no redrive policy.
    pub max_receive: Option<u32>,
}

/// The source queue's attributes a stack may configure ([`QueueFacts`]): each variable's name and
/// the range SQS allows the attribute (`0` for the receive limit: no redrive policy). Like
/// [`DLQ_MAX_BYTES`], not in [`vars`]: no default and no template parameter.
pub const QUEUE_FACTS: [(&str, u64, u64); 3] = [
    ("TRIAGE_QUEUE_RETENTION_S", 60, 1_209_600),
    ("TRIAGE_QUEUE_VISIBILITY_S", 0, 43_200),
    ("TRIAGE_QUEUE_MAX_RECEIVE", 0, 1_000),
];

/// A number type a variable is read as: whole numbers (`u32`, `u64`, `usize`) or any number
/// (`f64`).
pub trait VarValue: FromStr + PartialOrd + Copy + std::fmt::Display {
    /// Whether only whole numbers are accepted (Rust's integer syntax: digits only, no fraction,
    /// no exponent).
    const WHOLE: bool;
}

/// The former name of [`VarValue`].
#[deprecated(note = "renamed VarValue: `Value` read as serde_json's")]
pub use VarValue as Value;

impl VarValue for u32 {
    const WHOLE: bool = true;
}
impl VarValue for u64 {
    const WHOLE: bool = true;
}
impl VarValue for usize {
    const WHOLE: bool = true;
}
impl VarValue for f64 {
    const WHOLE: bool = false;
}

/// One numeric `TRIAGE_*` variable: its name, its default and the range the parser accepts.
/// [`Config::from_lookup`] reads every variable through its `Var` in [`vars`], and [`limits`]
/// lists the same `Var`s, so the published ranges are the parser's own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Var<T> {
    /// The variable's name.
    pub name: &'static str,
    /// The value used when the variable is unset or blank.
    pub default: T,
    /// The smallest accepted value.
    pub min: T,
    /// The largest accepted value.
    pub max: T,
}

impl<T: VarValue> Var<T> {
    fn read(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<T, ConfigError> {
        parse(lookup, self.name, self.default, self.min, self.max)
    }

    /// The variable's range in a form any tool can read (see [`limits`]).
    pub fn limit(&self) -> Limit {
        Limit {
            var: self.name,
            whole: T::WHOLE,
            default: self.default.to_string(),
            min: self.min.to_string(),
            max: self.max.to_string(),
        }
    }
}

/// The accepted range of one numeric variable, as text (the numbers as the error message
/// writes them). `examples/config_limits.rs` prints them all as JSON; the deployment templates'
/// parameter ranges are generated from that (`infra/ranges.py`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Limit {
    /// The variable's name.
    pub var: &'static str,
    /// Only whole numbers are accepted.
    pub whole: bool,
    /// The value used when the variable is unset or blank.
    pub default: String,
    /// The smallest accepted value.
    pub min: String,
    /// The largest accepted value.
    pub max: String,
}

/// Every numeric variable the configuration reads, with its default and accepted range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vars {
    /// `TRIAGE_MAX_ATTEMPTS`
    pub max_attempts: Var<u32>,
    /// `TRIAGE_BASE_DELAY_MS`
    pub base_delay_ms: Var<u64>,
    /// `TRIAGE_BACKOFF_MULTIPLIER`
    pub backoff_multiplier: Var<f64>,
    /// `TRIAGE_MAX_DELAY_MS`
    pub max_delay_ms: Var<u64>,
    /// `TRIAGE_JITTER_MAX_MS`
    pub jitter_max_ms: Var<u64>,
    /// `TRIAGE_BREAKER_FAILURE_RATE` (percent)
    pub breaker_failure_rate: Var<u32>,
    /// `TRIAGE_BREAKER_MIN_EXECUTIONS`
    pub breaker_min_executions: Var<u32>,
    /// `TRIAGE_BREAKER_WINDOW_S`
    pub breaker_window_s: Var<u64>,
    /// `TRIAGE_BREAKER_OPEN_S`
    pub breaker_open_s: Var<u64>,
    /// `TRIAGE_BREAKER_PROBES`
    pub breaker_probes: Var<u32>,
    /// `TRIAGE_BREAKER_SUCCESSES`
    pub breaker_successes: Var<u32>,
    /// `TRIAGE_BREAKER_CACHE_MS`
    pub breaker_cache_ms: Var<u64>,
    /// `TRIAGE_CONCURRENCY`
    pub concurrency: Var<usize>,
    /// `TRIAGE_DONE_MARKER_TTL_S`
    pub done_marker_ttl_s: Var<u64>,
    /// `TRIAGE_HEARTBEAT_S`
    pub heartbeat_s: Var<u64>,
}

/// The numeric variables, their defaults and accepted ranges: the table the parser reads with.
pub fn vars() -> Vars {
    let d = BreakerConfig::default();
    Vars {
        max_attempts: var("TRIAGE_MAX_ATTEMPTS", 5, 1, 1000),
        base_delay_ms: var("TRIAGE_BASE_DELAY_MS", 3_000, 0, 43_200_000),
        backoff_multiplier: var("TRIAGE_BACKOFF_MULTIPLIER", 2.0, 1.0, 100.0),
        max_delay_ms: var("TRIAGE_MAX_DELAY_MS", 3_600_000, 1_000, 1_209_600_000),
        jitter_max_ms: var("TRIAGE_JITTER_MAX_MS", 1_000, 0, 3_600_000),
        breaker_failure_rate: var("TRIAGE_BREAKER_FAILURE_RATE", d.failure_rate(), 1, 100),
        breaker_min_executions: var("TRIAGE_BREAKER_MIN_EXECUTIONS", d.min_executions(), 1, 100_000),
        breaker_window_s: var("TRIAGE_BREAKER_WINDOW_S", d.window().as_secs(), 1, 86_400),
        breaker_open_s: var("TRIAGE_BREAKER_OPEN_S", d.open_for().as_secs(), 1, 43_200),
        breaker_probes: var("TRIAGE_BREAKER_PROBES", d.probes(), 1, 100),
        breaker_successes: var("TRIAGE_BREAKER_SUCCESSES", d.successes_to_close(), 1, 100),
        breaker_cache_ms: var(
            "TRIAGE_BREAKER_CACHE_MS",
            d.cache_ttl().as_millis() as u64,
            0,
            300_000,
        ),
        concurrency: var("TRIAGE_CONCURRENCY", 10, 1, 1000),
        // A minute to 15 days (the attempt ledger's own lifetime: SQS's longest retention and
        // a day).
        done_marker_ttl_s: var("TRIAGE_DONE_MARKER_TTL_S", 86_400, 60, 1_296_000),
        heartbeat_s: var(
            "TRIAGE_HEARTBEAT_S",
            crate::processor::DEFAULT_HEARTBEAT.as_secs(),
            0,
            3_600,
        ),
    }
}

/// The breaker's former count, refused when set: a value meant as "failures that open it"
/// (or a huge one meant to disable it) must not be silently read as something else.
pub const RETIRED_BREAKER_THRESHOLD: &str = "TRIAGE_BREAKER_THRESHOLD";

/// `TRIAGE_DLQ_MAX_BYTES`: its name and the range SQS allows a queue's `MaximumMessageSize`.
/// Not in [`vars`]: it has no default (unset, the DLQ's own limit is read) and no template
/// parameter (the stacks set it from the DLQ they make).
pub const DLQ_MAX_BYTES: (&str, usize, usize) = ("TRIAGE_DLQ_MAX_BYTES", 1_024, 1_048_576);

const fn var<T>(name: &'static str, default: T, min: T, max: T) -> Var<T> {
    Var {
        name,
        default,
        min,
        max,
    }
}

/// The accepted range of every numeric variable, in the order of [`Vars`].
pub fn limits() -> Vec<Limit> {
    // Destructured without `..`: a variable added to `Vars` must be listed here too.
    let Vars {
        max_attempts,
        base_delay_ms,
        backoff_multiplier,
        max_delay_ms,
        jitter_max_ms,
        breaker_failure_rate,
        breaker_min_executions,
        breaker_window_s,
        breaker_open_s,
        breaker_probes,
        breaker_successes,
        breaker_cache_ms,
        concurrency,
        done_marker_ttl_s,
        heartbeat_s,
    } = vars();
    vec![
        max_attempts.limit(),
        base_delay_ms.limit(),
        backoff_multiplier.limit(),
        max_delay_ms.limit(),
        jitter_max_ms.limit(),
        breaker_failure_rate.limit(),
        breaker_min_executions.limit(),
        breaker_window_s.limit(),
        breaker_open_s.limit(),
        breaker_probes.limit(),
        breaker_successes.limit(),
        breaker_cache_ms.limit(),
        concurrency.limit(),
        done_marker_ttl_s.limit(),
        heartbeat_s.limit(),
    ]
}

fn parse<T: VarValue>(
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

/// The source queue's configured attributes: all three variables of [`QUEUE_FACTS`], or none.
fn queue_facts(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<QueueFacts>, ConfigError> {
    let set = |var: &str| lookup(var).is_some_and(|v| !v.trim().is_empty());
    let missing: Vec<&str> = QUEUE_FACTS.iter().map(|f| f.0).filter(|v| !set(v)).collect();
    if missing.len() == QUEUE_FACTS.len() {
        return Ok(None);
    }
    if let Some(first) = missing.first() {
        return Err(invalid(
            first,
            "",
            format!(
                "a value: {} go together (all three set, start-up does not read the source queue; \
                 none set, it does), and {} not set",
                QUEUE_FACTS.map(|f| f.0).join(", "),
                missing.join(", ")
            ),
        ));
    }
    let [retention, visibility, max_receive] =
        QUEUE_FACTS.map(|(var, min, max)| parse(lookup, var, min, min, max));
    Ok(Some(QueueFacts {
        retention: Duration::from_secs(retention?),
        visibility: Duration::from_secs(visibility?),
        max_receive: Some(max_receive? as u32).filter(|n| *n > 0),
    }))
}

/// The boolean variables, each read the same way ([`BOOLEAN_SPELLINGS`]).
pub const BOOLEAN_VARS: [&str; 2] = ["TRIAGE_LOG_PAYLOADS", "TRIAGE_EMF"];

/// What a boolean variable accepts, as its error says.
pub const BOOLEAN_SPELLINGS: &str = "true or false (also 1 or 0, yes or no, on or off; any case)";

/// A boolean variable: one spelling set for all of them, so `TRUE` never means false in one
/// place and true in another. Unset or blank is false; any other value stops start-up.
fn boolean(lookup: &dyn Fn(&str) -> Option<String>, var: &'static str) -> Result<bool, ConfigError> {
    let Some(raw) = lookup(var).filter(|v| !v.trim().is_empty()) else {
        return Ok(false);
    };
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(invalid(var, raw, BOOLEAN_SPELLINGS)),
    }
}

/// `TRIAGE_DONE_MARKER_TYPES`: job types separated by commas, blanks around each ignored; an
/// empty entry (`a,,b`) or one longer than a job type may be (256 characters) is refused.
fn done_marker_types(raw: Option<&str>) -> Result<Vec<String>, ConfigError> {
    names(
        "TRIAGE_DONE_MARKER_TYPES",
        raw,
        "job types separated by commas (each 1 to 256 characters), e.g. billing.charge,email.send",
    )
}

/// A list of names separated by commas, read as [`done_marker_types`] reads job types.
fn names(var: &'static str, raw: Option<&str>, expected: &str) -> Result<Vec<String>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    let mut out: Vec<String> = Vec::new();
    for t in raw.split(',').map(str::trim) {
        if t.is_empty() || t.chars().count() > 256 {
            return Err(invalid(var, raw, expected));
        }
        if !out.iter().any(|o| o == t) {
            out.push(t.to_owned());
        }
    }
    Ok(out)
}

/// The retry policy of the `TRIAGE_MAX_ATTEMPTS` and backoff variables.
fn policy_from(lookup: &dyn Fn(&str) -> Option<String>, v: &Vars) -> Result<RetryPolicy, ConfigError> {
    let max_attempts = v.max_attempts.read(lookup)?;
    let base = v.base_delay_ms.read(lookup)?;
    let mult = v.backoff_multiplier.read(lookup)?;
    let max = v.max_delay_ms.read(lookup)?;
    let jitter = v.jitter_max_ms.read(lookup)?;
    let backoff = Backoff::exponential(
        Duration::from_millis(base),
        mult,
        Duration::from_millis(max),
        Duration::from_millis(jitter),
    );
    RetryPolicy::builder()
        .max_attempts(max_attempts)
        .backoff(backoff)
        .max_delay(Duration::from_millis(max))
        .build()
        .map_err(|e| invalid(v.max_delay_ms.name, max, e))
}

/// The breaker settings of the `TRIAGE_BREAKER_*` variables; an error names the variable.
fn breaker_from(lookup: &dyn Fn(&str) -> Option<String>, v: &Vars) -> Result<BreakerConfig, ConfigError> {
    BreakerConfig::builder()
        .failure_rate(v.breaker_failure_rate.read(lookup)?)
        .min_executions(v.breaker_min_executions.read(lookup)?)
        .window(Duration::from_secs(v.breaker_window_s.read(lookup)?))
        .open_for(Duration::from_secs(v.breaker_open_s.read(lookup)?))
        .probes(v.breaker_probes.read(lookup)?)
        .successes_to_close(v.breaker_successes.read(lookup)?)
        .cache_ttl(Duration::from_millis(v.breaker_cache_ms.read(lookup)?))
        .build()
        .map_err(|e| {
            use crate::core::breaker::BreakerConfigError as E;
            let var = match e {
                E::FailureRate(_) => v.breaker_failure_rate.name,
                E::MinExecutions(_) => v.breaker_min_executions.name,
                E::Window(_) => "TRIAGE_BREAKER_WINDOW_S",
                E::OpenFor(_) | E::Lease(_) => "TRIAGE_BREAKER_OPEN_S",
                E::Probes(_) => "TRIAGE_BREAKER_PROBES",
                E::SuccessesToClose(_) => "TRIAGE_BREAKER_SUCCESSES",
                E::CacheTtl(_) => "TRIAGE_BREAKER_CACHE_MS",
            };
            invalid(var, "", e)
        })
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads configuration through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let text = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let v = vars();
        let policy = policy_from(lookup, &v)?;
        if let Some(old) = text(RETIRED_BREAKER_THRESHOLD) {
            return Err(invalid(
                RETIRED_BREAKER_THRESHOLD,
                &old,
                "unset: the breaker opens on a failure rate, not a count; set \
                 TRIAGE_BREAKER_FAILURE_RATE (percent, 1 to 100) and TRIAGE_BREAKER_MIN_EXECUTIONS \
                 (1 to 100000) instead",
            ));
        }
        let breaker = breaker_from(lookup, &v)?;
        let [log_payloads, emf] = BOOLEAN_VARS.map(|var| boolean(lookup, var));
        let (log_payloads, emf) = (log_payloads?, emf?);
        let done_marker_types = done_marker_types(text("TRIAGE_DONE_MARKER_TYPES").as_deref())?;
        let done_marker_ttl = Duration::from_secs(v.done_marker_ttl_s.read(lookup)?);
        let eventbridge_types = match text("TRIAGE_EVENTBRIDGE_TYPES") {
            None => EventBridgeTypes::new(),
            Some(spec) => EventBridgeTypes::parse(&spec).map_err(|e| {
                invalid(
                    "TRIAGE_EVENTBRIDGE_TYPES",
                    &spec,
                    format!("`Detail Type=job.type` pairs separated by `;`, or a JSON object ({e})"),
                )
            })?,
        };
        let dlq_max_bytes = match text("TRIAGE_DLQ_MAX_BYTES") {
            None => None,
            Some(_) => Some(parse(
                lookup,
                DLQ_MAX_BYTES.0,
                DLQ_MAX_BYTES.1,
                DLQ_MAX_BYTES.1,
                DLQ_MAX_BYTES.2,
            )?),
        };
        Ok(Self {
            queue_url: text("TRIAGE_QUEUE_URL"),
            dlq_url: text("TRIAGE_DLQ_URL"),
            table: text("TRIAGE_TABLE"),
            dlq_max_bytes,
            source_queue: queue_facts(lookup)?,
            startup_deadline: None,
            first_read_at_admission: false,
            policy,
            breaker,
            concurrency: v.concurrency.read(lookup)?,
            log_payloads,
            emf,
            done_marker_types,
            done_marker_ttl,
            heartbeat: Some(Duration::from_secs(v.heartbeat_s.read(lookup)?)).filter(|d| !d.is_zero()),
            eventbridge_types,
            job_types: names(
                "TRIAGE_JOB_TYPES",
                text("TRIAGE_JOB_TYPES").as_deref(),
                "job types separated by commas (each 1 to 256 characters), e.g. billing.charge,email.send",
            )?,
            fatal_errors: names(
                "TRIAGE_FATAL_ERRORS",
                text("TRIAGE_FATAL_ERRORS").as_deref(),
                "error types separated by commas (each 1 to 256 characters), e.g. ValueError,InvalidOrder",
            )?,
            transient_errors: names(
                "TRIAGE_TRANSIENT_ERRORS",
                text("TRIAGE_TRANSIENT_ERRORS").as_deref(),
                "error types separated by commas (each 1 to 256 characters), e.g. KeyError,ConnectionError",
            )?,
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
        assert_eq!((c.breaker.failure_rate(), c.breaker.min_executions()), (50, 10));
        assert_eq!(c.concurrency, 10);
        assert!(!c.log_payloads);
        assert_eq!(c.heartbeat, Some(Duration::from_secs(5)));
    }

    #[test]
    fn every_boolean_variable_reads_the_same_spellings_and_refuses_the_rest() {
        let read = |var: &str, v: &str| {
            with(&[(var, v)]).map(|c| match var {
                "TRIAGE_EMF" => c.emf,
                _ => c.log_payloads,
            })
        };
        for var in BOOLEAN_VARS {
            assert_eq!(read(var, ""), Ok(false), "{var} unset");
            for v in ["true", "TRUE", "True", "1", "yes", "YES", "on", "On", " true "] {
                assert_eq!(read(var, v), Ok(true), "{var}={v}");
            }
            for v in ["false", "FALSE", "0", "no", "No", "off", "OFF"] {
                assert_eq!(read(var, v), Ok(false), "{var}={v}");
            }
            for v in ["maybe", "2", "y", "t", "enabled", "truee"] {
                let e = read(var, v).unwrap_err();
                assert_eq!(e.var, var, "{v}");
                assert_eq!(
                    e.to_string(),
                    format!("{var}={v:?} is not valid: expected {BOOLEAN_SPELLINGS}")
                );
            }
        }
    }

    #[test]
    fn the_dlq_size_is_read_when_set_and_bad_values_name_the_variable() {
        assert_eq!(with(&[]).unwrap().dlq_max_bytes, None);
        assert_eq!(
            with(&[("TRIAGE_DLQ_MAX_BYTES", " ")]).unwrap().dlq_max_bytes,
            None
        );
        assert_eq!(
            with(&[("TRIAGE_DLQ_MAX_BYTES", "1048576")])
                .unwrap()
                .dlq_max_bytes,
            Some(1_048_576)
        );
        for bad in ["1023", "1048577", "256k", "-1"] {
            let e = with(&[("TRIAGE_DLQ_MAX_BYTES", bad)]).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("TRIAGE_DLQ_MAX_BYTES={bad:?} is not valid: expected a number from 1024 to 1048576")
            );
        }
    }

    #[test]
    fn the_source_queue_facts_are_all_three_or_none() {
        assert_eq!(with(&[]).unwrap().source_queue, None);
        let all = [
            ("TRIAGE_QUEUE_RETENTION_S", "1209600"),
            ("TRIAGE_QUEUE_VISIBILITY_S", "180"),
            ("TRIAGE_QUEUE_MAX_RECEIVE", "50"),
        ];
        assert_eq!(
            with(&all).unwrap().source_queue,
            Some(QueueFacts {
                retention: Duration::from_secs(1_209_600),
                visibility: Duration::from_secs(180),
                max_receive: Some(50),
            })
        );
        let no_redrive = with(&[all[0], all[1], ("TRIAGE_QUEUE_MAX_RECEIVE", "0")]).unwrap();
        assert_eq!(no_redrive.source_queue.unwrap().max_receive, None);
        // One or two of them: refused, naming the first missing one and listing the rest.
        let e = with(&[all[0], ("TRIAGE_QUEUE_MAX_RECEIVE", "50")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_QUEUE_VISIBILITY_S");
        assert!(e.expected.contains("TRIAGE_QUEUE_VISIBILITY_S not set"), "{e}");
        let e = with(&[all[2], ("TRIAGE_QUEUE_VISIBILITY_S", " ")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_QUEUE_RETENTION_S");
        assert!(
            e.expected
                .contains("TRIAGE_QUEUE_RETENTION_S, TRIAGE_QUEUE_VISIBILITY_S not set"),
            "{e}"
        );
        // Out of SQS's ranges: refused with the range.
        for (var, bad, range) in [
            ("TRIAGE_QUEUE_RETENTION_S", "59", "60 to 1209600"),
            ("TRIAGE_QUEUE_RETENTION_S", "1209601", "60 to 1209600"),
            ("TRIAGE_QUEUE_VISIBILITY_S", "43201", "0 to 43200"),
            ("TRIAGE_QUEUE_MAX_RECEIVE", "1001", "0 to 1000"),
            ("TRIAGE_QUEUE_MAX_RECEIVE", "5.0", "0 to 1000"),
        ] {
            let mut vars = all.to_vec();
            vars.retain(|(v, _)| *v != var);
            vars.push((var, bad));
            let e = with(&vars).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{var}={bad:?} is not valid: expected a number from {range}")
            );
        }
    }

    #[test]
    fn the_heartbeat_is_off_at_zero_and_bad_values_name_the_variable() {
        assert_eq!(with(&[("TRIAGE_HEARTBEAT_S", "0")]).unwrap().heartbeat, None);
        assert_eq!(
            with(&[("TRIAGE_HEARTBEAT_S", "12")]).unwrap().heartbeat,
            Some(Duration::from_secs(12))
        );
        for bad in ["-1", "3601", "2.5", "often"] {
            let e = with(&[("TRIAGE_HEARTBEAT_S", bad)]).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("TRIAGE_HEARTBEAT_S={bad:?} is not valid: expected a number from 0 to 3600")
            );
        }
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
        let e = with(&[("TRIAGE_BREAKER_FAILURE_RATE", "101")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_BREAKER_FAILURE_RATE");
        let e = with(&[("TRIAGE_BREAKER_MIN_EXECUTIONS", "0")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_BREAKER_MIN_EXECUTIONS");
        let c = with(&[
            ("TRIAGE_BREAKER_FAILURE_RATE", "25"),
            ("TRIAGE_BREAKER_MIN_EXECUTIONS", "40"),
        ])
        .unwrap();
        assert_eq!((c.breaker.failure_rate(), c.breaker.min_executions()), (25, 40));
        let e = with(&[("TRIAGE_BACKOFF_MULTIPLIER", "fast")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_BACKOFF_MULTIPLIER");
    }

    #[test]
    fn the_retired_breaker_count_stops_start_up_naming_its_replacement() {
        let e = with(&[("TRIAGE_BREAKER_THRESHOLD", "5")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_BREAKER_THRESHOLD");
        let msg = e.to_string();
        assert!(
            msg.contains("TRIAGE_BREAKER_FAILURE_RATE") && msg.contains("TRIAGE_BREAKER_MIN_EXECUTIONS"),
            "{msg}"
        );
        assert!(
            with(&[("TRIAGE_BREAKER_THRESHOLD", " ")]).is_ok(),
            "blank is unset"
        );
    }

    #[test]
    fn done_markers_are_off_unless_types_are_listed() {
        let c = with(&[]).unwrap();
        assert!(c.done_marker_types.is_empty());
        assert_eq!(c.done_marker_ttl, Duration::from_secs(86_400));
        let c = with(&[
            (
                "TRIAGE_DONE_MARKER_TYPES",
                " billing.charge, email.send,billing.charge ",
            ),
            ("TRIAGE_DONE_MARKER_TTL_S", "3600"),
        ])
        .unwrap();
        assert_eq!(c.done_marker_types, ["billing.charge", "email.send"]);
        assert_eq!(c.done_marker_ttl, Duration::from_secs(3600));
        for bad in ["a,,b", ",", &"x".repeat(257)] {
            let e = with(&[("TRIAGE_DONE_MARKER_TYPES", bad)]).unwrap_err();
            assert_eq!(e.var, "TRIAGE_DONE_MARKER_TYPES", "{bad}");
        }
        let e = with(&[("TRIAGE_DONE_MARKER_TTL_S", "5")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TRIAGE_DONE_MARKER_TTL_S=\"5\" is not valid: expected a number from 60 to 1296000"
        );
    }

    #[test]
    fn eventbridge_types_are_read_and_a_bad_mapping_stops_start_up() {
        assert!(with(&[]).unwrap().eventbridge_types.is_empty());
        let c = with(&[(
            "TRIAGE_EVENTBRIDGE_TYPES",
            "Order Placed=billing.charge; Refund=billing.refund",
        )])
        .unwrap();
        assert_eq!(c.eventbridge_types.get("Order Placed"), Some("billing.charge"));
        assert_eq!(c.eventbridge_types.get("Refund"), Some("billing.refund"));
        let e = with(&[("TRIAGE_EVENTBRIDGE_TYPES", "Order Placed")]).unwrap_err();
        assert_eq!(e.var, "TRIAGE_EVENTBRIDGE_TYPES");
        assert!(
            e.to_string()
                .contains("(`Order Placed` is not `Detail Type=job.type`)"),
            "{e}"
        );
        let e = with(&[("TRIAGE_EVENTBRIDGE_TYPES", "A=x;A=y")]).unwrap_err();
        assert!(e.to_string().contains("listed twice"), "{e}");
    }

    #[test]
    fn limits_are_the_ranges_the_parser_enforces() {
        let all = limits();
        // Every variable the parser reads as a number is in the table, and nothing else.
        let asked = std::cell::RefCell::new(Vec::new());
        Config::from_lookup(&|k| {
            asked.borrow_mut().push(k.to_string());
            None
        })
        .unwrap();
        let mut numeric: Vec<String> = asked
            .into_inner()
            .into_iter()
            .filter(|k| {
                !matches!(
                    k.as_str(),
                    "TRIAGE_QUEUE_URL"
                        | "TRIAGE_DLQ_URL"
                        | "TRIAGE_TABLE"
                        | "TRIAGE_LOG_PAYLOADS"
                        | "TRIAGE_EMF"
                        | "TRIAGE_DONE_MARKER_TYPES"
                        | "TRIAGE_EVENTBRIDGE_TYPES"
                        | "TRIAGE_JOB_TYPES"
                        | "TRIAGE_FATAL_ERRORS"
                        | "TRIAGE_TRANSIENT_ERRORS"
                        // Numeric, but no policy: no default and no template parameter (the
                        // stacks set it from the DLQ they make), so not in `limits()`.
                        | "TRIAGE_DLQ_MAX_BYTES"
                        | "TRIAGE_QUEUE_RETENTION_S"
                        | "TRIAGE_QUEUE_VISIBILITY_S"
                        | "TRIAGE_QUEUE_MAX_RECEIVE"
                        // Read only to be refused: it has no range.
                        | RETIRED_BREAKER_THRESHOLD
                )
            })
            .collect();
        numeric.sort();
        numeric.dedup();
        let mut listed: Vec<String> = all.iter().map(|l| l.var.to_string()).collect();
        listed.sort();
        assert_eq!(numeric, listed);

        for l in &all {
            let ok = |v: &str| with(&[(l.var, v)]).map(|_| ()).map_err(|e| e.to_string());
            for v in [&l.min, &l.max, &l.default] {
                assert_eq!(ok(v), Ok(()), "{} accepts {v}", l.var);
            }
            let expected = format!("expected a number from {} to {}", l.min, l.max);
            let below = if l.whole {
                l.min
                    .parse::<i64>()
                    .unwrap()
                    .checked_sub(1)
                    .map(|x| x.to_string())
            } else {
                Some((l.min.parse::<f64>().unwrap() - 0.01).to_string())
            };
            let above = if l.whole {
                (l.max.parse::<u64>().unwrap() + 1).to_string()
            } else {
                (l.max.parse::<f64>().unwrap() + 0.01).to_string()
            };
            let mut refused = vec![above, "abc".to_string(), "0x10".to_string()];
            refused.extend(below);
            if l.whole {
                refused.push(format!("{}.5", l.min));
                refused.push(format!("{}.0", l.min));
                refused.push("1e1".to_string());
            }
            for v in refused {
                let e = ok(&v).unwrap_err();
                assert!(e.starts_with(l.var) && e.ends_with(&expected), "{v}: {e}");
            }
        }
        // The whole-number ones are exactly the integer-typed fields.
        let whole: Vec<&str> = all.iter().filter(|l| !l.whole).map(|l| l.var).collect();
        assert_eq!(whole, ["TRIAGE_BACKOFF_MULTIPLIER"]);
    }
}
