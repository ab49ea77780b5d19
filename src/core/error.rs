//! What went wrong in a handler, and whether another try can help.
//!
//! A handler returns `Result<(), JobError>`. A [`JobError`] is one of three things:
//! fatal (retrying cannot help: a code or payload bug), transient (it might work later),
//! or retry-after (the callee said when to come back). Classification is conservative:
//! anything not known to be fatal stays transient.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The three things a failure can mean for the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Retrying cannot help; the job goes to the DLQ at once.
    Fatal,
    /// Retrying may help; the job comes back after its backoff delay.
    Transient,
    /// Retrying may help after the given delay (throttling, `Retry-After`).
    RetryAfter(Duration),
}

/// A failed job execution: its kind, its rendered error chain, and an optional error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    kind: ErrorKind,
    message: String,
    code: Option<String>,
    /// Set when the handler (or a job type rule) said what the error means; inferred kinds
    /// may still be re-classified by a job type's rules.
    explicit: bool,
}

impl JobError {
    /// An error retrying cannot fix (the `fatal` marker).
    pub fn fatal(err: impl fmt::Display) -> Self {
        Self::with_kind(ErrorKind::Fatal, err.to_string(), true)
    }

    /// An error that may go away with time.
    pub fn transient(err: impl fmt::Display) -> Self {
        Self::with_kind(ErrorKind::Transient, err.to_string(), true)
    }

    /// An error whose callee asked to be called again after `delay`.
    pub fn retry_after(delay: Duration, err: impl fmt::Display) -> Self {
        Self::with_kind(ErrorKind::RetryAfter(delay), err.to_string(), true)
    }

    /// A panic caught in the handler: always fatal (a code bug).
    pub fn panic(payload: &(dyn std::any::Any + Send)) -> Self {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_owned());
        Self::with_kind(ErrorKind::Fatal, format!("handler panicked: {text}"), true).with_code("Panic")
    }

    /// The payload could not be decoded into the handler's type: fatal, it will never decode.
    pub fn payload_decode(err: &serde_json::Error) -> Self {
        Self::with_kind(ErrorKind::Fatal, format!("payload does not decode: {err}"), true)
            .with_code("PayloadDecode")
    }

    /// Classifies any error by walking its source chain: JSON decode errors are fatal, I/O
    /// errors transient, everything unknown transient.
    pub fn classify(err: &(dyn StdError + 'static)) -> Self {
        let message = render_chain(err);
        let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
        while let Some(e) = cur {
            if let Some(json) = e.downcast_ref::<serde_json::Error>() {
                if !json.is_io() {
                    return Self::with_kind(ErrorKind::Fatal, message, false).with_code("PayloadDecode");
                }
            }
            if e.downcast_ref::<std::io::Error>().is_some() {
                return Self::with_kind(ErrorKind::Transient, message, false);
            }
            cur = e.source();
        }
        Self::with_kind(ErrorKind::Transient, message, false)
    }

    /// An error whose kind was inferred rather than stated (e.g. from an error code by
    /// `effects::from_aws_code`): a job type's rules may still re-classify it.
    pub fn inferred(kind: ErrorKind, err: impl fmt::Display) -> Self {
        Self::with_kind(kind, err.to_string(), false)
    }

    /// Attaches an error code that job type rules can match on.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    fn with_kind(kind: ErrorKind, message: String, explicit: bool) -> Self {
        Self {
            kind,
            message,
            code: None,
            explicit,
        }
    }

    /// What the failure means for the job.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The rendered error chain (`outer: inner: root`).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error code, if the error carried one.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// True when the handler or a rule stated the kind; false when it was inferred.
    pub fn is_explicit(&self) -> bool {
        self.explicit
    }

    /// Re-classifies an inferred error with a job type's rules; explicit kinds are kept.
    pub fn reclassified(mut self, rules: &Rules) -> Self {
        if self.explicit {
            return self;
        }
        if let Some(kind) = rules.verdict(&self) {
            self.kind = kind;
            self.explicit = true;
        }
        self
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for JobError {}

impl From<serde_json::Error> for JobError {
    fn from(err: serde_json::Error) -> Self {
        Self::classify(&err)
    }
}

impl From<std::io::Error> for JobError {
    fn from(err: std::io::Error) -> Self {
        Self::classify(&err)
    }
}

/// Renders an error and its sources as `outer: inner: root`, skipping repeats.
pub fn render_chain(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = e.source();
    }
    out
}

/// What a job type's rule matches on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// The error code equals this string.
    Code(String),
    /// The error message contains this string.
    MessageContains(String),
}

impl Matcher {
    fn matches(&self, err: &JobError) -> bool {
        match self {
            Matcher::Code(c) => err.code() == Some(c.as_str()),
            Matcher::MessageContains(s) => err.message().contains(s.as_str()),
        }
    }
}

/// A job type's own classification rules, tried in order; the first match wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    rules: Vec<(Matcher, ErrorKind)>,
}

impl Rules {
    /// No rules: the built-in classification stands.
    pub fn new() -> Self {
        Self::default()
    }

    /// Errors with this code are fatal.
    pub fn fatal_code(mut self, code: impl Into<String>) -> Self {
        self.rules.push((Matcher::Code(code.into()), ErrorKind::Fatal));
        self
    }

    /// Errors whose message contains `text` are fatal.
    pub fn fatal_message(mut self, text: impl Into<String>) -> Self {
        self.rules
            .push((Matcher::MessageContains(text.into()), ErrorKind::Fatal));
        self
    }

    /// Errors with this code are transient even if the built-in rules say fatal.
    pub fn transient_code(mut self, code: impl Into<String>) -> Self {
        self.rules
            .push((Matcher::Code(code.into()), ErrorKind::Transient));
        self
    }

    /// Errors with this code are retried after `delay`.
    pub fn retry_after_code(mut self, code: impl Into<String>, delay: Duration) -> Self {
        self.rules
            .push((Matcher::Code(code.into()), ErrorKind::RetryAfter(delay)));
        self
    }

    /// The kind the first matching rule gives, if any.
    pub fn verdict(&self, err: &JobError) -> Option<ErrorKind> {
        self.rules.iter().find(|(m, _)| m.matches(err)).map(|(_, k)| *k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);
    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("calling the billing service")
        }
    }
    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[derive(Debug)]
    struct Opaque;
    impl fmt::Display for Opaque {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("something odd")
        }
    }
    impl StdError for Opaque {}

    #[test]
    fn json_decode_errors_are_fatal() {
        let err = serde_json::from_str::<u32>("\"x\"").unwrap_err();
        let e = JobError::from(err);
        assert_eq!(e.kind(), ErrorKind::Fatal);
        assert_eq!(e.code(), Some("PayloadDecode"));
    }

    #[test]
    fn io_errors_are_transient_even_when_wrapped() {
        let e = JobError::classify(&Wrapped(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        )));
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert_eq!(e.message(), "calling the billing service: timed out");
    }

    #[test]
    fn unknown_errors_are_transient() {
        assert_eq!(JobError::classify(&Opaque).kind(), ErrorKind::Transient);
    }

    #[test]
    fn panics_are_fatal_and_keep_their_text() {
        let payload: Box<dyn std::any::Any + Send> = Box::new("index out of bounds");
        let e = JobError::panic(payload.as_ref());
        assert_eq!(e.kind(), ErrorKind::Fatal);
        assert!(e.message().contains("index out of bounds"));
        let payload: Box<dyn std::any::Any + Send> = Box::new(String::from("owned"));
        assert!(JobError::panic(payload.as_ref()).message().contains("owned"));
    }

    #[test]
    fn rules_reclassify_inferred_errors_only() {
        let rules = Rules::new()
            .fatal_code("CardDeclined")
            .retry_after_code("SlowDown", Duration::from_secs(7))
            .fatal_message("schema v1");
        let inferred = JobError::classify(&Opaque).with_code("CardDeclined");
        assert_eq!(inferred.reclassified(&rules).kind(), ErrorKind::Fatal);
        let explicit = JobError::transient("explicit").with_code("CardDeclined");
        assert_eq!(explicit.reclassified(&rules).kind(), ErrorKind::Transient);
        let slow = JobError::inferred(ErrorKind::Transient, "x").with_code("SlowDown");
        assert_eq!(
            slow.reclassified(&rules).kind(),
            ErrorKind::RetryAfter(Duration::from_secs(7))
        );
        let by_text = JobError::classify(&Opaque);
        assert_eq!(by_text.clone().reclassified(&rules).kind(), ErrorKind::Transient);
        let v1 = JobError::inferred(ErrorKind::Transient, "rejected: schema v1 payload");
        assert_eq!(v1.reclassified(&rules).kind(), ErrorKind::Fatal);
    }
}
