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
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
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
        let deadline = crate::clock::now_ms().saturating_add(self.timeout.as_millis() as u64);
        let deadline = ctx.deadline_ms.map_or(deadline, |d| d.min(deadline));
        req = req.header(headers::DEADLINE_MS, deadline);
        let req = req
            .body(Full::new(Bytes::from(payload.get().to_owned())))
            .map_err(|e| JobError::fatal(format!("the request could not be built: {e}")))?;
        let answer = async {
            let resp = self.client.request(req).await?;
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            // An error answer's body explains it; a success's is not read past its end.
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, hyper_util::client::legacy::Error>((status, retry_after, body))
        };
        match tokio::time::timeout(self.timeout, answer).await {
            Err(_) => Err(JobError::transient(format!(
                "no answer from {} within {:?}",
                self.url, self.timeout
            ))
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

/// A header value from text that may hold what a header cannot (control characters, non-ASCII):
/// those bytes become `?`.
fn header_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii() && (c == '\t' || !c.is_ascii_control()) {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// An HTTP answer as a job's outcome. 2xx done; 408 (timeout), 409 (conflict), 425 (too early),
/// 429 (too many requests) and 5xx transient, with `Retry-After` as the delay when it parses;
/// any other status fatal: the request itself is wrong, and sending it again will not help.
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
    let transient = matches!(status, 408 | 409 | 425 | 429) || (500..600).contains(&status);
    let err = match (transient, retry_after.and_then(|v| retry_after_delay(v, now))) {
        (true, Some(delay)) => JobError::retry_after(delay, message),
        (true, None) => JobError::transient(message),
        (false, _) => JobError::fatal(message),
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
        for s in [400, 401, 403, 404, 410, 422, 499, 301, 100] {
            assert_eq!(kind(s, None), Some(ErrorKind::Fatal), "{s}");
        }
        for s in [408, 409, 425, 429, 500, 502, 503, 504, 599] {
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
            Some(ErrorKind::RetryAfter(Duration::ZERO)),
            "a date past"
        );
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
    fn header_values_keep_only_what_a_header_can_carry() {
        assert_eq!(header_text("a\nb\u{e9}c\td"), "a?b?c\td");
    }
}
