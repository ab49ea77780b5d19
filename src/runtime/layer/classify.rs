//! What a runtime's answer for one record means: its error body (`errorType`,
//! `errorMessage`) classified fatal, transient or retry-after, and a response that is a partial
//! batch response naming the record read as a transient failure. Pure: no I/O.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Deserialize;

use crate::core::JobError;

/// Error types fatal by default: the exceptions that say the code or the payload is wrong in
/// each managed runtime's language, so another try cannot help.
pub const FATAL_DEFAULTS: &[&str] = &[
    // Python
    "ValueError",
    "TypeError",
    "KeyError",
    "AttributeError",
    "IndexError",
    "JSONDecodeError",
    "UnicodeDecodeError",
    "NotImplementedError",
    // Node.js (TypeError as above)
    "SyntaxError",
    "RangeError",
    "ReferenceError",
    // Java, Jackson's parse and mapping errors
    "IllegalArgumentException",
    "NullPointerException",
    "ClassCastException",
    "NumberFormatException",
    "JsonParseException",
    "JsonMappingException",
    "MismatchedInputException",
    "InvalidFormatException",
    "UnrecognizedPropertyException",
    // Ruby (TypeError, KeyError and IndexError as above; JSON::ParserError by its own name)
    "NoMethodError",
    "NameError",
    "ArgumentError",
    "ZeroDivisionError",
    "ParserError",
    // .NET
    "ArgumentException",
    "ArgumentNullException",
    "NullReferenceException",
    "InvalidOperationException",
    "InvalidCastException",
    "FormatException",
    "NotImplementedException",
    "NotSupportedException",
    "JsonException",
];

/// The helpers' error types (`infra/layer/python/sqs_triage`, `infra/layer/nodejs`): the
/// handler said what the failure means, so no rule changes it.
pub const FATAL: &str = "Fatal";
/// See [`FATAL`].
pub const TRANSIENT: &str = "Transient";
/// See [`FATAL`]; its message starts `after <seconds>s`.
pub const RETRY_AFTER: &str = "RetryAfter";

/// The longest delay a `RetryAfter` may ask: SQS's longest visibility timeout (the policy caps
/// it further).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(43_200);

/// How error types are classified: the defaults, `TRIAGE_FATAL_ERRORS` on top, and
/// `TRIAGE_TRANSIENT_ERRORS` winning over both.
///
/// An entry `JOB_TYPE/ErrorName` applies to that job type alone, and decides before the
/// entries for every type: `billing.charge/KeyError` in `TRIAGE_TRANSIENT_ERRORS` makes a
/// `KeyError` of `billing.charge` transient while it stays fatal elsewhere.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    fatal: HashSet<String>,
    transient: HashSet<String>,
    /// `TRIAGE_FATAL_ERRORS` alone: a type listed there is fatal whatever its message.
    configured_fatal: HashSet<String>,
    /// Per job type: (fatal, transient).
    per_type: HashMap<String, (HashSet<String>, HashSet<String>)>,
}

/// The job type of a `JOB_TYPE/ErrorName` entry, and its error name.
fn per_type_entry(entry: &str) -> Option<(&str, &str)> {
    entry
        .split_once('/')
        .filter(|(t, e)| !t.is_empty() && !e.is_empty())
}

/// The message Node.js's `fetch` gives the `TypeError` it throws when a connection fails
/// (DNS, refused, reset, timed out, TLS): mostly a dependency that is down. A few bugs give
/// it too (an unsupported URL scheme); retried, they reach the DLQ as exhausted.
const NODE_FETCH_FAILED: &str = "fetch failed";

/// An error type's own name: without Ruby's `Function<…>` wrapper, and without the
/// namespace (`com.acme.Fatal`, `Jobs::Fatal`, `Outer$Inner`).
fn base_name(error_type: &str) -> &str {
    let t = error_type
        .strip_prefix("Function<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(error_type);
    t.rsplit_once(['.', ':', '$']).map_or(t, |(_, last)| last)
}

/// A runtime's error body, as the managed runtimes write it.
#[derive(Debug, Deserialize, Default)]
struct ErrorBody {
    #[serde(rename = "errorType", default)]
    error_type: Option<String>,
    #[serde(rename = "errorMessage", default)]
    error_message: Option<serde_json::Value>,
}

impl Classifier {
    /// The defaults with the configured lists.
    pub fn new(fatal: &[String], transient: &[String]) -> Self {
        let mut per_type: HashMap<String, (HashSet<String>, HashSet<String>)> = HashMap::new();
        let mut global = |list: &[String], transient: bool| -> HashSet<String> {
            let mut out = HashSet::new();
            for entry in list {
                match per_type_entry(entry) {
                    Some((t, e)) => {
                        let sets = per_type.entry(t.to_owned()).or_default();
                        let set = if transient { &mut sets.1 } else { &mut sets.0 };
                        set.insert(e.to_owned());
                    }
                    None => {
                        out.insert(entry.clone());
                    }
                }
            }
            out
        };
        let configured_fatal = global(fatal, false);
        let transient = global(transient, true);
        let mut f: HashSet<String> = FATAL_DEFAULTS.iter().map(|s| (*s).to_owned()).collect();
        f.extend(configured_fatal.iter().cloned());
        Self {
            fatal: f,
            transient,
            configured_fatal,
            per_type,
        }
    }

    /// The job types that `JOB_TYPE/ErrorName` entries name and `served` does not hold: a
    /// typo there would be ignored silently, so start-up refuses it.
    pub fn unknown_job_types<'a>(&'a self, served: &[String]) -> Vec<&'a str> {
        let mut out: Vec<&str> = self
            .per_type
            .keys()
            .filter(|t| !served.contains(t))
            .map(String::as_str)
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether `error_type` is listed in `set`: by its full name, or by its own name
    /// (`java.lang.NullPointerException` and Ruby's `Function<ArgumentError>` match
    /// `NullPointerException` and `ArgumentError`).
    fn listed(set: &HashSet<String>, error_type: &str) -> bool {
        set.contains(error_type) || set.contains(base_name(error_type))
    }

    /// The record's failure from the runtime's `/error` body (and its
    /// `Lambda-Runtime-Function-Error-Type` header when the body names no type). The error
    /// type becomes the error's code: the failure record in the DLQ shows it.
    /// For a record of `job_type` (its own entries decide first; `None`: only the entries for
    /// every type).
    pub fn error(&self, job_type: Option<&str>, body: &[u8], header_type: Option<&str>) -> JobError {
        let own = job_type.and_then(|t| self.per_type.get(t));
        let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
        let error_type = parsed
            .error_type
            .filter(|t| !t.is_empty())
            .or_else(|| header_type.map(str::to_owned))
            .unwrap_or_else(|| "Unknown".to_owned());
        let message = match parsed.error_message {
            Some(serde_json::Value::String(s)) => s,
            Some(v) => v.to_string(),
            None => String::new(),
        };
        let text = if message.is_empty() {
            error_type.clone()
        } else {
            format!("{error_type}: {message}")
        };
        let t = error_type.as_str();
        // A qualified name listed in full decides first: `com.vendor.Fatal` is not the helper
        // when a list names it. The helpers' own names are never overridden.
        let qualified = base_name(t) != t;
        let e = match base_name(t) {
            _ if qualified && (own.is_some_and(|(_, tr)| tr.contains(t)) || self.transient.contains(t)) => {
                JobError::transient(text)
            }
            _ if qualified && (own.is_some_and(|(fa, _)| fa.contains(t)) || self.configured_fatal.contains(t)) => {
                JobError::fatal(text)
            }
            FATAL => JobError::fatal(text),
            TRANSIENT => JobError::transient(text),
            RETRY_AFTER => match retry_after(&message) {
                Some(delay) => JobError::retry_after(delay, text),
                None => JobError::transient(text),
            },
            _ if own.is_some_and(|(_, tr)| Self::listed(tr, t)) => JobError::transient(text),
            _ if own.is_some_and(|(fa, _)| Self::listed(fa, t)) => JobError::fatal(text),
            _ if Self::listed(&self.transient, t) => JobError::transient(text),
            "TypeError" if message == NODE_FETCH_FAILED && !Self::listed(&self.configured_fatal, t) =>
            {
                JobError::inferred(crate::core::error::ErrorKind::Transient, text)
            }
            _ if Self::listed(&self.fatal, t) => JobError::fatal(text),
            _ => JobError::inferred(crate::core::error::ErrorKind::Transient, text),
        };
        e.with_code(error_type)
    }

    /// The record's outcome from the runtime's `/response` body: a success, unless the body is
    /// a partial batch response naming `message_id` (the handler reported its one record
    /// failed), a transient failure.
    pub fn response(&self, body: &[u8], message_id: &str) -> Result<(), JobError> {
        #[derive(Deserialize)]
        struct Item {
            #[serde(rename = "itemIdentifier")]
            id: Option<String>,
        }
        #[derive(Deserialize)]
        struct Partial {
            #[serde(rename = "batchItemFailures")]
            failures: Vec<Item>,
        }
        match serde_json::from_slice::<Partial>(body) {
            Ok(p) if p.failures.iter().any(|i| i.id.as_deref() == Some(message_id)) => Err(
                JobError::transient("the handler reported the record in batchItemFailures")
                    .with_code("BatchItemFailure"),
            ),
            _ => Ok(()),
        }
    }
}

/// The delay of a `RetryAfter` helper's message: `after <seconds>s…`, seconds a number of at
/// least 0 (a fraction rounds up to the next millisecond), at most [`MAX_RETRY_AFTER`].
fn retry_after(message: &str) -> Option<Duration> {
    let rest = message.trim_start().strip_prefix("after ")?;
    let end = rest.find('s')?;
    let secs: f64 = rest[..end].trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::error::ErrorKind;

    fn kind(c: &Classifier, body: &str) -> ErrorKind {
        c.error(None, body.as_bytes(), None).kind()
    }

    #[test]
    fn each_languages_bug_errors_are_fatal_and_the_rest_transient() {
        let c = Classifier::new(&[], &[]);
        for t in [
            "ValueError",
            "JSONDecodeError",
            "ReferenceError",
            "java.lang.NullPointerException",
            "com.fasterxml.jackson.core.JsonParseException",
            "System.ArgumentNullException",
            "System.Text.Json.JsonException",
        ] {
            let body = format!(r#"{{"errorType":"{t}","errorMessage":"bad"}}"#);
            assert_eq!(kind(&c, &body), ErrorKind::Fatal, "{t}");
        }
        for t in [
            "ConnectionError",
            "TimeoutError",
            "java.io.IOException",
            "Runtime.ExitError",
        ] {
            let body = format!(r#"{{"errorType":"{t}","errorMessage":"later"}}"#);
            assert_eq!(kind(&c, &body), ErrorKind::Transient, "{t}");
        }
        // Unreadable bodies are transient, never a panic.
        assert_eq!(kind(&c, "not json"), ErrorKind::Transient);
        assert_eq!(kind(&c, r#"{"errorType":7}"#), ErrorKind::Transient);
        let e = c.error(None, br#"{"errorType":"KeyError","errorMessage":"'id'"}"#, None);
        assert_eq!((e.code(), e.message()), (Some("KeyError"), "KeyError: 'id'"));
        // The header names the type when the body does not.
        assert_eq!(c.error(None, b"{}", Some("ValueError")).kind(), ErrorKind::Fatal);
    }

    #[test]
    fn a_nodejs_network_failure_is_transient_though_its_type_is_type_error() {
        let c = Classifier::new(&[], &[]);
        // Node's fetch (undici) throws TypeError("fetch failed") for DNS, refused, reset and
        // timed-out connections: a dependency that is down, not a bug.
        assert_eq!(
            kind(&c, r#"{"errorType":"TypeError","errorMessage":"fetch failed"}"#),
            ErrorKind::Transient
        );
        assert_eq!(
            kind(&c, r#"{"errorType":"TypeError","errorMessage":"Cannot read properties of undefined"}"#),
            ErrorKind::Fatal
        );
        // Only that message: another one starting the same way is the type's.
        assert_eq!(
            kind(&c, r#"{"errorType":"TypeError","errorMessage":"fetch failed to parse x"}"#),
            ErrorKind::Fatal
        );
        // Listed fatal by the user, it is fatal.
        let c = Classifier::new(&["TypeError".into()], &[]);
        assert_eq!(
            kind(&c, r#"{"errorType":"TypeError","errorMessage":"fetch failed"}"#),
            ErrorKind::Fatal
        );
    }

    #[test]
    fn the_helpers_and_listed_types_are_known_in_java_and_ruby_names_too() {
        let c = Classifier::new(&["InvalidOrder".into()], &[]);
        for (t, want) in [
            // Java: the class's full name.
            ("com.acme.jobs.Fatal", ErrorKind::Fatal),
            ("com.acme.jobs.Transient", ErrorKind::Transient),
            ("com.acme.Orders$InvalidOrder", ErrorKind::Fatal),
            // Ruby: the runtime wraps the class's name.
            ("Function<Fatal>", ErrorKind::Fatal),
            ("Function<Jobs::Fatal>", ErrorKind::Fatal),
            ("Function<Jobs::Transient>", ErrorKind::Transient),
            ("Function<ArgumentError>", ErrorKind::Fatal),
            ("Function<NoMethodError>", ErrorKind::Fatal),
            ("Function<JSON::ParserError>", ErrorKind::Fatal),
            ("Function<Net::ReadTimeout>", ErrorKind::Transient),
            ("Function<InvalidOrder>", ErrorKind::Fatal),
        ] {
            let body = format!(r#"{{"errorType":"{t}","errorMessage":"x"}}"#);
            assert_eq!(kind(&c, &body), want, "{t}");
        }
        let e = c.error(None, br#"{"errorType":"Function<Jobs::RetryAfter>","errorMessage":"after 7s"}"#, None);
        assert_eq!(e.kind(), ErrorKind::RetryAfter(Duration::from_secs(7)));
        // A full name listed wins over the helper's short name.
        let c = Classifier::new(&["com.vendor.Transient".into()], &["com.vendor.Fatal".into()]);
        assert_eq!(kind(&c, r#"{"errorType":"com.vendor.Fatal"}"#), ErrorKind::Transient);
        assert_eq!(kind(&c, r#"{"errorType":"com.vendor.Transient"}"#), ErrorKind::Fatal);
        assert_eq!(kind(&c, r#"{"errorType":"com.acme.Fatal"}"#), ErrorKind::Fatal);
        // The failure record keeps the type as the runtime wrote it.
        assert_eq!(
            c.error(None, br#"{"errorType":"Function<Fatal>"}"#, None).code(),
            Some("Function<Fatal>")
        );
    }

    #[test]
    fn a_job_types_own_entries_decide_before_the_entries_for_every_type() {
        let c = Classifier::new(
            &["billing.charge/CardDeclined".into(), "Throttled".into()],
            &["billing.charge/KeyError".into(), "billing.charge/Throttled".into()],
        );
        let of = |job_type: &str, t: &str| {
            c.error(Some(job_type), format!(r#"{{"errorType":"{t}"}}"#).as_bytes(), None)
                .kind()
        };
        assert_eq!(of("billing.charge", "CardDeclined"), ErrorKind::Fatal);
        assert_eq!(of("email.send", "CardDeclined"), ErrorKind::Transient);
        assert_eq!(of("billing.charge", "KeyError"), ErrorKind::Transient);
        assert_eq!(of("email.send", "KeyError"), ErrorKind::Fatal, "the default elsewhere");
        assert_eq!(of("billing.charge", "Throttled"), ErrorKind::Transient);
        assert_eq!(of("email.send", "Throttled"), ErrorKind::Fatal);
        // Matched by the type's own name, as the entries for every type are.
        assert_eq!(of("billing.charge", "com.acme.CardDeclined"), ErrorKind::Fatal);
        // The helpers still say what they mean.
        let c = Classifier::new(&[], &["billing.charge/Fatal".into()]);
        assert_eq!(c.error(Some("billing.charge"), br#"{"errorType":"Fatal"}"#, None).kind(), ErrorKind::Fatal);
        // An entry for a type the function does not serve is named.
        let c = Classifier::new(&["billng.charge/CardDeclined".into()], &["email.send/X".into()]);
        assert_eq!(
            c.unknown_job_types(&["billing.charge".into(), "email.send".into()]),
            vec!["billng.charge"]
        );
    }

    #[test]
    fn configured_lists_extend_the_defaults_and_transient_wins() {
        let c = Classifier::new(&["InvalidOrder".into()], &["KeyError".into()]);
        assert_eq!(kind(&c, r#"{"errorType":"InvalidOrder"}"#), ErrorKind::Fatal);
        assert_eq!(kind(&c, r#"{"errorType":"KeyError"}"#), ErrorKind::Transient);
        assert_eq!(kind(&c, r#"{"errorType":"ValueError"}"#), ErrorKind::Fatal);
        // The helpers' types are the handler's own word: no list changes them.
        let c = Classifier::new(&["Transient".into()], &["Fatal".into()]);
        assert_eq!(kind(&c, r#"{"errorType":"Fatal"}"#), ErrorKind::Fatal);
        assert_eq!(kind(&c, r#"{"errorType":"Transient"}"#), ErrorKind::Transient);
    }

    #[test]
    fn retry_after_reads_its_seconds_and_a_bad_one_is_transient() {
        let c = Classifier::new(&[], &[]);
        let e = c.error(None, 
            br#"{"errorType":"RetryAfter","errorMessage":"after 30s: throttled"}"#,
            None,
        );
        assert_eq!(e.kind(), ErrorKind::RetryAfter(Duration::from_secs(30)));
        let e = c.error(None, br#"{"errorType":"RetryAfter","errorMessage":"after 0.5s"}"#, None);
        assert_eq!(e.kind(), ErrorKind::RetryAfter(Duration::from_millis(500)));
        let e = c.error(None, br#"{"errorType":"RetryAfter","errorMessage":"after 1e9s"}"#, None);
        assert_eq!(e.kind(), ErrorKind::RetryAfter(MAX_RETRY_AFTER));
        for m in ["soon", "after -1s", "after NaNs", "after s"] {
            let body = format!(r#"{{"errorType":"RetryAfter","errorMessage":"{m}"}}"#);
            assert_eq!(kind(&c, &body), ErrorKind::Transient, "{m}");
        }
    }

    #[test]
    fn a_partial_batch_response_naming_the_record_is_a_transient_failure() {
        let c = Classifier::new(&[], &[]);
        assert!(c.response(b"null", "m1").is_ok());
        assert!(c.response(br#"{"batchItemFailures":[]}"#, "m1").is_ok());
        assert!(
            c.response(br#"{"batchItemFailures":[{"itemIdentifier":"m2"}]}"#, "m1")
                .is_ok()
        );
        let e = c
            .response(br#"{"batchItemFailures":[{"itemIdentifier":"m1"}]}"#, "m1")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient);
    }
}
