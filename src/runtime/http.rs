//! HTTP dispatch: a worker's jobs POSTed to a URL, for handlers in any language behind a
//! service (a sidecar, a container, a VM). The answer classifies the job: 2xx done; 4xx fatal
//! except 408, 409, 425 and 429; those, 5xx, connection errors and timeouts transient. A
//! `Retry-After` header (seconds or an HTTP date) sets the retry's delay, capped by the policy.
//!
//! Job types are declared, not taken from the messages: each one gets its breaker and its
//! metrics, and a message naming another type is dead-lettered `invalid`, as for Rust
//! handlers. A forged type creates no state.
//!
//! ```no_run
//! # async fn f() -> Result<(), sqs_triage::RuntimeError> {
//! use sqs_triage::HttpDispatch;
//! let dispatch = HttpDispatch::new("http://127.0.0.1:8080/jobs", std::time::Duration::from_secs(60))?;
//! let registry = dispatch.register(sqs_triage::Registry::default(), &["email.send"]);
//! sqs_triage::worker::run(registry).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::value::RawValue;

use crate::core::JobError;
use crate::processor::registry::{JobContext, Registry};

/// The headers each request carries besides the payload.
pub mod headers {
    /// The job type.
    pub const JOB_TYPE: &str = "x-triage-job-type";
    /// The job id.
    pub const JOB_ID: &str = "x-triage-job-id";
    /// This execution's number, 1 for the first.
    pub const ATTEMPT: &str = "x-triage-attempt";
    /// The policy's attempt limit.
    pub const MAX_ATTEMPTS: &str = "x-triage-max-attempts";
    /// The SQS message id of this delivery.
    pub const MESSAGE_ID: &str = "x-triage-message-id";
    /// When the worker stops waiting for the answer (epoch ms).
    pub const DEADLINE_MS: &str = "x-triage-deadline-ms";
}

/// How much of an error answer's body goes into the failure record.
const BODY_KEPT: usize = 512;

/// A URL that cannot be dispatched to.
#[derive(Debug, thiserror::Error)]
#[error("dispatch URL `{url}`: {why}")]
pub struct BadUrl {
    url: String,
    why: String,
}

/// POSTs jobs to one URL (plain `http://`: a TLS endpoint needs a proxy beside the worker).
#[derive(Clone)]
pub struct HttpDispatch {
    url: hyper::Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpDispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpDispatch")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HttpDispatch {
    /// A dispatcher to `url`, each request given up after `timeout` (a transient failure).
    pub fn new(url: &str, timeout: Duration) -> Result<Self, BadUrl> {
        let bad = |why: &str| BadUrl {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let parsed: hyper::Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        match parsed.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "https is not supported: put a TLS proxy beside the worker, or use http",
                ));
            }
            _ => return Err(bad("must start with http://")),
        }
        if parsed.host().is_none_or(str::is_empty) {
            return Err(bad("has no host"));
        }
        if timeout.is_zero() {
            return Err(bad("the timeout must be above zero"));
        }
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        Ok(Self {
            url: parsed,
            client,
            timeout,
        })
    }

    /// `registry` with each of `job_types` dispatched here, under the registry's defaults.
    pub fn register(self, registry: Registry, job_types: &[impl AsRef<str>]) -> Registry {
        let this = Arc::new(self);
        job_types.iter().fold(registry, |r, t| {
            let this = Arc::clone(&this);
            r.handle(t.as_ref(), move |payload: Box<RawValue>, ctx: JobContext| {
                let this = Arc::clone(&this);
                async move { this.post(payload, &ctx).await }
            })
        })
    }

    /// One job: the request, then its answer classified.
    async fn post(&self, payload: Box<RawValue>, ctx: &JobContext) -> Result<(), JobError> {
        let mut req = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(headers::JOB_TYPE, header_text(&ctx.job_type))
            .header(headers::JOB_ID, header_text(&ctx.job_id))
            .header(headers::ATTEMPT, ctx.attempt)
            .header(headers::MAX_ATTEMPTS, ctx.max_attempts)
            .header(headers::MESSAGE_ID, header_text(&ctx.message_id));
        // A fixed deadline (Lambda's, a probe's lease) may end the wait sooner; a worker's,
        // which the heartbeat moves, does not.
        let timeout = ctx.deadline_ms.map_or(self.timeout, |d| {
            let left = d.saturating_sub(crate::clock::now_ms());
            self.timeout.min(Duration::from_millis(left))
        });
        let deadline = crate::clock::now_ms().saturating_add(timeout.as_millis() as u64);
        req = req.header(headers::DEADLINE_MS, deadline);
        let req = req
            .body(Full::new(Bytes::from(payload.get().to_owned())))
            .map_err(|e| JobError::fatal(format!("the request could not be built: {e}")))?;
        let answer = async {
            let resp = self.client.request(req).await?;
            let status = resp.status().as_u16();
            // A success is done when its status arrives: its body is never waited for, so a
            // slow or broken body cannot turn it into a timeout and a second run.
            if (200..300).contains(&status) {
                return Ok((status, None, Vec::new()));
            }
            let retry_after = resp
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = start_of(resp.into_body()).await;
            Ok::<_, hyper_util::client::legacy::Error>((status, retry_after, body))
        };
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(JobError::transient(format!("no answer from {} within {timeout:?}", self.url))
                .with_code("http.timeout")),
            Ok(Err(e)) => {
                Err(JobError::transient(format!("{} unreachable: {e}", self.url)).with_code("http.connect"))
            }
            Ok(Ok((status, retry_after, body))) => {
                classify(status, retry_after.as_deref(), SystemTime::now(), &body)
            }
        }
    }
}

/// The first [`BODY_KEPT`] bytes of an error answer's body; the rest is never read, so a
/// huge error page costs no memory. A body that breaks off keeps what came.
async fn start_of(mut body: hyper::body::Incoming) -> Vec<u8> {
    let mut kept = Vec::new();
    while kept.len() < BODY_KEPT {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    kept.extend_from_slice(&data[..data.len().min(BODY_KEPT - kept.len())]);
                }
            }
            _ => break,
        }
    }
    kept
}

/// A header value from any text: printable ASCII stays, every other byte of its UTF-8 (and
/// `%` itself) is percent-encoded, so distinct ids stay distinct. Any URL decoder reads it.
fn header_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An HTTP answer as a job's outcome. 2xx done; 4xx fatal (the request itself is wrong, and
/// sending it again will not help) except 408 (timeout), 409 (conflict), 425 (too early) and
/// 429 (too many requests); those, 5xx and any other status transient (a redirect is not
/// followed: a wrong URL must not empty the queue into the DLQ). A `Retry-After` above zero
/// sets a transient failure's delay; zero or a date past leaves it to the backoff's jitter.
pub fn classify(
    status: u16,
    retry_after: Option<&str>,
    now: SystemTime,
    body: &[u8],
) -> Result<(), JobError> {
    if (200..300).contains(&status) {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(BODY_KEPT)]);
    let text = text.trim();
    let message = if text.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {text}")
    };
    let fatal = (400..500).contains(&status) && !matches!(status, 408 | 409 | 425 | 429);
    let delay = retry_after
        .and_then(|v| retry_after_delay(v, now))
        .filter(|d| !d.is_zero());
    let err = match (fatal, delay) {
        (true, _) => JobError::fatal(message),
        (false, Some(delay)) => JobError::retry_after(delay, message),
        (false, None) => JobError::transient(message),
    };
    Err(err.with_code(format!("http.{status}")))
}

/// A `Retry-After` value: whole seconds, or an HTTP date (a date past is no delay).
fn retry_after_delay(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ErrorKind;

    fn kind(status: u16, retry_after: Option<&str>) -> Option<ErrorKind> {
        classify(
            status,
            retry_after,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000),
            b"why",
        )
        .err()
        .map(|e| e.kind())
    }

    #[test]
    fn statuses_classify_as_the_table_says() {
        for s in [200, 201, 204, 299] {
            assert_eq!(kind(s, None), None, "{s}");
        }
        for s in [400, 401, 403, 404, 410, 422, 499] {
            assert_eq!(kind(s, None), Some(ErrorKind::Fatal), "{s}");
        }
        for s in [408, 409, 425, 429, 500, 502, 503, 504, 599, 301, 307, 308, 100, 600] {
            assert_eq!(kind(s, None), Some(ErrorKind::Transient), "{s}");
        }
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_an_http_date_on_transient_answers_only() {
        assert_eq!(
            kind(429, Some("7")),
            Some(ErrorKind::RetryAfter(Duration::from_secs(7)))
        );
        // 2001-09-09T01:46:40Z is the test's now; ten seconds later.
        assert_eq!(
            kind(503, Some("Sun, 09 Sep 2001 01:46:50 GMT")),
            Some(ErrorKind::RetryAfter(Duration::from_secs(10)))
        );
        assert_eq!(
            kind(503, Some("Sun, 09 Sep 2001 01:40:00 GMT")),
            Some(ErrorKind::Transient),
            "a date past: the backoff"
        );
        assert_eq!(kind(429, Some("0")), Some(ErrorKind::Transient), "zero: the backoff");
        assert_eq!(
            kind(503, Some("soon")),
            Some(ErrorKind::Transient),
            "unreadable: backoff"
        );
        assert_eq!(kind(503, Some("-3")), Some(ErrorKind::Transient));
        assert_eq!(
            kind(400, Some("7")),
            Some(ErrorKind::Fatal),
            "a fatal answer is not retried"
        );
    }

    #[test]
    fn the_failure_names_the_status_and_the_start_of_the_body() {
        let long = vec![b'x'; 10_000];
        let e = classify(422, None, SystemTime::now(), &long).unwrap_err();
        assert_eq!(e.code(), Some("http.422"));
        assert!(
            e.message().starts_with("HTTP 422: xxx") && e.message().len() < 600,
            "{}",
            e.message()
        );
        let e = classify(500, None, SystemTime::now(), b"").unwrap_err();
        assert_eq!(e.message(), "HTTP 500");
    }

    #[test]
    fn urls_other_than_plain_http_are_refused_with_why() {
        let t = Duration::from_secs(1);
        for (url, why) in [
            ("https://x/jobs", "https is not supported"),
            ("ftp://x/", "must start with http://"),
            ("localhost:80", "must start with http://"),
            ("not a url", "dispatch URL"),
        ] {
            let e = HttpDispatch::new(url, t).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
        assert!(HttpDispatch::new("http://x/", Duration::ZERO).is_err());
        assert!(HttpDispatch::new("http://127.0.0.1:9/jobs", t).is_ok());
    }

    #[test]
    fn header_values_keep_distinct_ids_distinct() {
        assert_eq!(header_text("a\nb\u{e9}c d%"), "a%0Ab%C3%A9c d%25");
        assert_ne!(header_text("order-\u{e9}"), header_text("order-\u{fc}"));
        assert_ne!(header_text("a%0A"), header_text("a\n"));
        assert_eq!(header_text("plain-id_42"), "plain-id_42");
    }
}
