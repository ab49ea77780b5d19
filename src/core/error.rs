//! What went wrong in a handler, and whether another try can help.
//!
//! A handler returns `Result<(), JobError>`. A [`JobError`] is one of three things:
//! fatal (retrying cannot help: a code or payload bug), transient (it might work later),
//! or retry-after (the callee said when to come back). Classification is conservative:
//! anything not known to be fatal stays transient.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
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

/// The cause a [`JobError`] keeps: shared, so the error stays `Clone`.
pub type Source = Arc<dyn StdError + Send + Sync + 'static>;

/// A failed job execution: its kind, its own message, the error that caused it (if any), and
/// an optional error code.
///
/// The cause is kept as an error value ([`source`](StdError::source) returns it), not flattened
/// into the message: [`chain`](Self::chain) (or `{:#}`) renders `message: cause: root` where it
/// is written — the DLQ failure record and the logs.
///
/// ```
/// use sqs_triage::JobError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
/// let e = JobError::transient("calling the billing service").with_source(io);
/// assert_eq!(e.message(), "calling the billing service");
/// assert_eq!(e.chain(), "calling the billing service: timed out");
/// assert_eq!(format!("{e:#}"), e.chain());
/// assert!(std::error::Error::source(&e).is_some());
/// ```
#[derive(Clone)]
pub struct JobError {
    kind: ErrorKind,
    message: String,
    code: Option<String>,
    /// Set when the handler (or a job type rule) said what the error means; inferred kinds
    /// may still be re-classified by a job type's rules.
    explicit: bool,
    source: Option<Source>,
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

    /// A job error caused by `err`, which it keeps as its [`source`](StdError::source): the
    /// message is `err`'s own text, the kind is inferred from `err`'s chain as
    /// [`classify`](Self::classify) does (JSON decode errors fatal, everything else
    /// transient), so a job type's [`Rules`] may still re-classify it. To state the kind, use
    /// [`fatal`](Self::fatal) / [`transient`](Self::transient) with
    /// [`with_source`](Self::with_source).
    pub fn from_source<E>(err: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        let (kind, code) = infer(&err);
        let mut e = Self::with_kind(kind, err.to_string(), false);
        e.code = code.map(str::to_owned);
        e.source = Some(Arc::new(err));
        e
    }

    /// Keeps `err` as this error's cause (its [`source`](StdError::source)); the kind, message
    /// and code stay as they are.
    pub fn with_source<E>(mut self, err: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        self.source = Some(Arc::new(err));
        self
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

    /// Classifies a borrowed error by walking its source chain: JSON decode errors are fatal,
    /// I/O errors transient, everything unknown transient. The chain is rendered into the
    /// message (a borrowed error cannot be kept); with an owned error,
    /// [`from_source`](Self::from_source) keeps it instead.
    pub fn classify(err: &(dyn StdError + 'static)) -> Self {
        let (kind, code) = infer(err);
        let mut e = Self::with_kind(kind, render_chain(err), false);
        e.code = code.map(str::to_owned);
        e
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
            source: None,
        }
    }

    /// What the failure means for the job.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// This error's own message, without its cause (see [`chain`](Self::chain)).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message and every cause after it, `outer: inner: root` (a cause whose text the
    /// previous one already ends with is skipped): what the DLQ failure record and the logs
    /// show. The same as `format!("{err:#}")`.
    pub fn chain(&self) -> String {
        render_chain(self)
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

/// The kind (and code) an error's chain implies: a JSON decode error anywhere in it is fatal
/// (`PayloadDecode`), an I/O error transient, anything unknown transient.
fn infer(err: &(dyn StdError + 'static)) -> (ErrorKind, Option<&'static str>) {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(json) = e.downcast_ref::<serde_json::Error>() {
            if !json.is_io() {
                return (ErrorKind::Fatal, Some("PayloadDecode"));
            }
        }
        if e.downcast_ref::<std::io::Error>().is_some() {
            return (ErrorKind::Transient, None);
        }
        cur = e.source();
    }
    (ErrorKind::Transient, None)
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("code", &self.code)
            .field("explicit", &self.explicit)
            .field("source", &self.source.as_ref().map(|s| render_chain(s.as_ref())))
            .finish()
    }
}

/// Two errors are equal when they mean the same for the job and read the same: kind, code,
/// explicitness and the rendered [`chain`](JobError::chain).
impl PartialEq for JobError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.code == other.code
            && self.explicit == other.explicit
            && self.message == other.message
            && self.chain() == other.chain()
    }
}

impl Eq for JobError {}

/// The message alone; with `{:#}`, the whole [`chain`](JobError::chain).
impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            f.write_str(&self.chain())
        } else {
            f.write_str(&self.message)
        }
    }
}

impl StdError for JobError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn StdError + 'static))
    }
}

impl From<serde_json::Error> for JobError {
    fn from(err: serde_json::Error) -> Self {
        Self::from_source(err)
    }
}

impl From<std::io::Error> for JobError {
    fn from(err: std::io::Error) -> Self {
        Self::from_source(err)
    }
}

/// Renders an error and its sources as `outer: inner: root`, skipping a source whose text the
/// rendering already ends with.
pub(crate) fn render_chain(err: &(dyn StdError + 'static)) -> String {
    // A `JobError`'s Display is its own message; `{:#}` would recurse.
    let mut out = match err.downcast_ref::<JobError>() {
        Some(j) => j.message.clone(),
        None => err.to_string(),
    };
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = match e.downcast_ref::<JobError>() {
            Some(j) => j.message.clone(),
            None => e.to_string(),
        };
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
    /// The error's text contains this string: its message or the message of any error in its
    /// source chain (what [`JobError::chain`] renders).
    MessageContains(String),
}

impl Matcher {
    fn matches(&self, err: &JobError) -> bool {
        match self {
            Matcher::Code(c) => err.code() == Some(c.as_str()),
            Matcher::MessageContains(s) => err.chain().contains(s.as_str()),
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

    /// Errors whose text contains `text` are fatal: the message or any cause in the chain
    /// (`JobError::transient("calling billing").with_source(e)` matches on `e`'s text too).
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
    fn a_source_is_kept_and_its_chain_rendered_where_written() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let e = JobError::fatal("charging order 7").with_source(Wrapped(io));
        assert_eq!(e.kind(), ErrorKind::Fatal);
        assert_eq!(e.message(), "charging order 7");
        assert_eq!(e.to_string(), "charging order 7");
        assert_eq!(
            e.chain(),
            "charging order 7: calling the billing service: timed out"
        );
        assert_eq!(format!("{e:#}"), e.chain());
        // The cause is the error value itself, down to its root.
        let source = StdError::source(&e).expect("a source");
        assert!(source.downcast_ref::<Wrapped>().is_some());
        let root = source.source().expect("the root");
        let io = root.downcast_ref::<std::io::Error>().expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
        // A clone shares the cause.
        let copy = e.clone();
        assert_eq!(copy, e);
        assert!(
            StdError::source(&copy)
                .unwrap()
                .downcast_ref::<Wrapped>()
                .is_some()
        );
        // Nested job errors render once each.
        let outer = JobError::transient("batch step").with_source(e);
        assert_eq!(
            outer.chain(),
            "batch step: charging order 7: calling the billing service: timed out"
        );
    }

    #[test]
    fn from_source_infers_the_kind_and_keeps_the_error() {
        let e = JobError::from_source(Wrapped(std::io::Error::other("reset")));
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(!e.is_explicit());
        assert_eq!(e.message(), "calling the billing service");
        assert_eq!(e.chain(), "calling the billing service: reset");
        assert!(StdError::source(&e).unwrap().downcast_ref::<Wrapped>().is_some());

        let json = serde_json::from_str::<u32>("\"x\"").unwrap_err();
        let e = JobError::from(json);
        assert_eq!(e.kind(), ErrorKind::Fatal);
        assert!(
            StdError::source(&e)
                .unwrap()
                .downcast_ref::<serde_json::Error>()
                .is_some()
        );
        // An inferred kind can still be re-classified by text anywhere in the chain.
        let rules = Rules::new().fatal_message("reset");
        let e = JobError::from_source(Wrapped(std::io::Error::other("reset")));
        assert_eq!(e.reclassified(&rules).kind(), ErrorKind::Fatal);
        // Without a cause, the chain is the message.
        let plain = JobError::transient("down");
        assert_eq!(plain.chain(), "down");
        assert!(StdError::source(&plain).is_none());
        assert_ne!(plain, JobError::transient("down").with_source(Opaque));
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
