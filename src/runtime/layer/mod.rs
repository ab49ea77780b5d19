//! The Lambda layer: sqs-triage for a function in any language, as a Runtime API proxy.
//!
//! The extension serves the Runtime API on a loopback port, and the wrapper points the runtime
//! at it. An SQS event goes through the processor, each record handed to the runtime as an
//! invocation of its own and its answer classified ([`classify`]); any other event passes
//! through byte for byte. `docs/layer.md` has the rest.

pub mod classify;
mod http;
mod proxy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Method;
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use lambda_runtime::{Context, LambdaEvent};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::RuntimeError;
use super::env::{STARTUP_DEADLINE, build, init_tracing, install_panic_hook, sdk_config};
use crate::config::{Config, ConfigError};
use crate::core::JobError;
use crate::processor::registry::{JobContext, Registry};
use crate::processor::{Processor, REPORT_MARGIN};
use classify::Classifier;
use proxy::{Hub, Reply};

/// The extension's name: the file name Lambda starts it from (`/opt/extensions/…`).
pub const EXTENSION_NAME: &str = "sqs-triage-extension";

/// `TRIAGE_LAYER_PORT`: the loopback port the extension serves the Runtime API on; the
/// wrapper reads the same variable.
pub const PORT_VAR: &str = "TRIAGE_LAYER_PORT";
/// The port when `TRIAGE_LAYER_PORT` is unset.
pub const DEFAULT_PORT: u16 = 9140;

/// `TRIAGE_LAYER_WORKERS`: how many invocations the runtime serves at once (the wrapper sets
/// `AWS_LAMBDA_MAX_CONCURRENCY` to it for a runtime with a worker pool); records run
/// `min(TRIAGE_CONCURRENCY, workers)` at a time.
pub const WORKERS_VAR: &str = "TRIAGE_LAYER_WORKERS";

/// `TRIAGE_LAYER_PID_FILE`: where the wrapper writes the runtime's process id, so the
/// extension sees a runtime that exits mid-record.
pub const PID_FILE_VAR: &str = "TRIAGE_LAYER_PID_FILE";
/// The pid file when `TRIAGE_LAYER_PID_FILE` is unset.
pub const DEFAULT_PID_FILE: &str = "/tmp/sqs-triage-runtime.pid";

/// Message attributes added to the record handed to the runtime: the job as sqs-triage
/// sees it (the helpers read them).
pub const ATTEMPT_ATTRIBUTE: &str = "triage-attempt";
/// See [`ATTEMPT_ATTRIBUTE`].
pub const MAX_ATTEMPTS_ATTRIBUTE: &str = "triage-max-attempts";
/// See [`ATTEMPT_ATTRIBUTE`].
pub const JOB_ID_ATTRIBUTE: &str = "triage-job-id";
/// See [`ATTEMPT_ATTRIBUTE`].
pub const JOB_TYPE_ATTRIBUTE: &str = "triage-job-type";

/// The loopback port from `TRIAGE_LAYER_PORT` (1 to 65535, default [`DEFAULT_PORT`]).
pub fn port(lookup: &dyn Fn(&str) -> Option<String>) -> Result<u16, ConfigError> {
    number(lookup, PORT_VAR, DEFAULT_PORT as u64, 1, 65_535).map(|p| p as u16)
}

/// The runtime's workers from `TRIAGE_LAYER_WORKERS` (1 to 1000, default 1).
pub fn workers(lookup: &dyn Fn(&str) -> Option<String>) -> Result<usize, ConfigError> {
    number(lookup, WORKERS_VAR, 1, 1, 1_000).map(|n| n as usize)
}

fn number(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let Some(raw) = lookup(var).filter(|v| !v.trim().is_empty()) else {
        return Ok(default);
    };
    match raw.trim().parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(ConfigError {
            var,
            value: raw,
            expected: format!("a number from {min} to {max}"),
        }),
    }
}

/// The real invocation whose records are being run, as the record handlers need it.
struct Batch {
    real_id: String,
    /// Headers every record's invocation carries: the real invocation's, its deadline
    /// brought forward.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Each record's JSON text by message id.
    records: HashMap<String, Box<RawValue>>,
}

/// What the record handlers share with the invocation loop.
struct Layer {
    hub: Arc<Hub>,
    classifier: Classifier,
    batch: Mutex<Option<Arc<Batch>>>,
    gone: tokio::sync::watch::Sender<bool>,
}

impl Layer {
    fn batch(&self) -> Option<Arc<Batch>> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_batch(&self, b: Option<Arc<Batch>>) {
        *self.batch.lock().unwrap_or_else(|e| e.into_inner()) = b;
    }

    /// One record's run: its own invocation of the runtime, and the answer classified.
    async fn run_record(self: Arc<Self>, ctx: JobContext) -> Result<(), JobError> {
        let batch = self
            .batch()
            .ok_or_else(|| JobError::transient("no invocation is running"))?;
        let record = batch
            .records
            .get(&ctx.message_id)
            .ok_or_else(|| JobError::transient("the record is not in the invocation"))?;
        let event = record_event(record, &ctx)
            .map_err(|e| JobError::fatal(format!("the record cannot be handed on: {e}")))?;
        let id = self.hub.fresh_id(&batch.real_id);
        let rx = self.hub.dispatch(id, batch.headers.clone(), event);
        let mut gone = self.gone.subscribe();
        let reply: Option<Reply> = tokio::select! {
            r = rx => r.ok(),
            _ = gone.wait_for(|g| *g) => None,
        };
        match reply {
            Some(r) if r.ok => self.classifier.response(&r.body, &ctx.message_id),
            Some(r) => {
                let header = r
                    .headers
                    .iter()
                    .find(|(k, _)| k.as_str() == proxy::ERROR_TYPE)
                    .and_then(|(_, v)| v.to_str().ok());
                Err(self
                    .classifier
                    .error(Some(&ctx.job_type), &r.body, header))
            }
            None => Err(JobError::transient(
                "the function's runtime exited before it answered for this record",
            )
            .with_code("Runtime.ExitError")),
        }
    }
}

/// The SQS event of one record handed to the runtime: the record as Lambda sent it, with the
/// job's attempt, limit, id and type added as message attributes.
fn record_event(record: &RawValue, ctx: &JobContext) -> Result<Bytes, serde_json::Error> {
    let mut r: Map<String, Value> = serde_json::from_str(record.get())?;
    let attrs = r
        .entry("messageAttributes")
        .or_insert_with(|| Value::Object(Map::new()));
    if !attrs.is_object() {
        *attrs = Value::Object(Map::new());
    }
    if let Value::Object(attrs) = attrs {
        let attempt = ctx.attempt.to_string();
        let max = ctx.max_attempts.to_string();
        for (name, value, kind) in [
            (ATTEMPT_ATTRIBUTE, attempt.as_str(), "Number"),
            (MAX_ATTEMPTS_ATTRIBUTE, max.as_str(), "Number"),
            (JOB_ID_ATTRIBUTE, ctx.job_id.as_str(), "String"),
            (JOB_TYPE_ATTRIBUTE, ctx.job_type.as_str(), "String"),
        ] {
            attrs.insert(
                name.to_owned(),
                serde_json::json!({
                    "stringValue": value,
                    "stringListValues": [],
                    "binaryListValues": [],
                    "dataType": kind,
                }),
            );
        }
    }
    let event = serde_json::json!({ "Records": [Value::Object(r)] });
    serde_json::to_vec(&event).map(Bytes::from)
}

/// Whether an event is an SQS event: a `Records` array, not empty, every record from
/// `aws:sqs`. Anything else (S3, SNS, an API request) passes through.
fn is_sqs(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(rename = "Records", borrow)]
        records: Vec<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Source {
        #[serde(rename = "eventSource")]
        source: Option<String>,
    }
    let Ok(e) = serde_json::from_slice::<Event<'_>>(body) else {
        return false;
    };
    !e.records.is_empty()
        && e.records.iter().all(|r| {
            serde_json::from_str::<Source>(r.get()).is_ok_and(|s| s.source.as_deref() == Some("aws:sqs"))
        })
}

/// Each record's JSON text by message id (the first of a message id given twice).
fn records_by_id(body: &[u8]) -> HashMap<String, Box<RawValue>> {
    #[derive(Deserialize)]
    struct Event {
        #[serde(rename = "Records")]
        records: Vec<Box<RawValue>>,
    }
    #[derive(Deserialize)]
    struct Id {
        #[serde(rename = "messageId")]
        id: Option<String>,
    }
    let mut out = HashMap::new();
    if let Ok(e) = serde_json::from_slice::<Event>(body) {
        for r in e.records {
            if let Ok(Id { id: Some(id) }) = serde_json::from_str::<Id>(r.get()) {
                out.entry(id).or_insert(r);
            }
        }
    }
    out
}

/// Headers of Lambda's invocation the runtime gets with each record's: everything but the
/// request id (each record has its own) and the deadline (brought forward).
fn record_headers(real: &HeaderMap, deadline_ms: u64) -> Vec<(HeaderName, HeaderValue)> {
    let mut out: Vec<(HeaderName, HeaderValue)> = real
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            k != "lambda-runtime-aws-request-id"
                && k != "lambda-runtime-deadline-ms"
                && k != "content-length"
                && k != "transfer-encoding"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.push((
        HeaderName::from_static("lambda-runtime-deadline-ms"),
        HeaderValue::from(deadline_ms),
    ));
    out
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Runs the extension: reads the configuration, builds the processor with one handler per
/// job type of `TRIAGE_JOB_TYPES`, registers with the Extensions API and serves the runtime
/// until Lambda shuts the environment down. An error before the first event (a bad variable,
/// a missing queue or table) is reported as the function's init error.
pub async fn run() -> Result<(), RuntimeError> {
    init_tracing();
    let upstream = std::env::var("AWS_LAMBDA_RUNTIME_API")
        .map_err(|_| "AWS_LAMBDA_RUNTIME_API is not set: the extension runs inside Lambda")?;
    let lookup = |k: &str| std::env::var(k).ok();
    let port = port(&lookup)?;
    let workers = workers(&lookup)?;
    // A pid file left by an earlier runtime of this environment would read as a runtime
    // already gone: only the wrapper that starts after this registration writes the new one.
    let pid_file = lookup(PID_FILE_VAR).unwrap_or_else(|| DEFAULT_PID_FILE.to_owned());
    let _ = std::fs::remove_file(&pid_file);
    // Bound first: the runtime starts once the extension has registered.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("{PORT_VAR}: cannot listen on 127.0.0.1:{port}: {e}"))?;
    let identifier = register(&upstream).await?;
    let hub = Hub::new(upstream.clone());
    tokio::spawn(proxy::serve(listener, hub.clone()));
    match start(&hub, workers, pid_file).await {
        Ok((layer, processor)) => {
            tracing::info!(port, workers, "started; waiting for the runtime");
            let events = tokio::spawn(events(upstream.clone(), identifier));
            // The runtime's first `next` ends its init: only then is Lambda's first
            // invocation taken (an init error the runtime reports must come before it).
            let work = async {
                hub.wait_ready().await;
                serve_invocations(&layer, &processor).await
            };
            tokio::select! {
                r = work => r,
                _ = events => Ok(()),
            }
        }
        Err(e) => {
            init_error(&upstream, &identifier, &e).await;
            Err(e)
        }
    }
}

/// Reports a start-up failure to the Extensions API: Lambda fails the init with it.
async fn init_error(upstream: &str, identifier: &str, e: &RuntimeError) {
    let kind = if e.downcast_ref::<ConfigError>().is_some() {
        "Extension.ConfigInvalid"
    } else {
        "Extension.StartupFailed"
    };
    let body = serde_json::json!({ "errorType": kind, "errorMessage": e.to_string() });
    let Ok(id) = HeaderValue::from_str(identifier) else {
        return;
    };
    let sent = http::call(
        upstream,
        Method::POST,
        "/2020-01-01/extension/init/error",
        &[
            (HeaderName::from_static("lambda-extension-identifier"), id),
            (
                HeaderName::from_static("lambda-extension-function-error-type"),
                HeaderValue::from_static(kind),
            ),
        ],
        Bytes::from(body.to_string()),
    )
    .await;
    if let Err(e) = sent {
        tracing::error!(error = %e, "the init error could not be reported");
    }
}

/// The configuration, the processor and the runtime's watch: everything before the first
/// invocation.
async fn start(
    hub: &Arc<Hub>,
    workers: usize,
    pid_file: String,
) -> Result<(Arc<Layer>, Processor), RuntimeError> {
    let mut config = Config::from_env()?;
    config.startup_deadline = Some(STARTUP_DEADLINE);
    install_panic_hook(config.log_payloads);
    if config.job_types.is_empty() {
        return Err(ConfigError {
            var: "TRIAGE_JOB_TYPES",
            value: String::new(),
            expected: "the job types the function handles, separated by commas".into(),
        }
        .into());
    }
    config.concurrency = config.concurrency.min(workers);
    let classifier = Classifier::new(&config.fatal_errors, &config.transient_errors);
    let unknown = classifier.unknown_job_types(&config.job_types);
    if !unknown.is_empty() {
        return Err(ConfigError {
            var: "TRIAGE_FATAL_ERRORS",
            value: unknown.join(","),
            expected: format!(
                "JOB_TYPE/ErrorName entries (in TRIAGE_FATAL_ERRORS or TRIAGE_TRANSIENT_ERRORS) naming a job type of TRIAGE_JOB_TYPES ({})",
                config.job_types.join(",")
            ),
        }
        .into());
    }
    let layer = Arc::new(Layer {
        hub: hub.clone(),
        classifier,
        batch: Mutex::new(None),
        gone: tokio::sync::watch::channel(false).0,
    });
    let mut registry = Registry::default();
    for t in &config.job_types {
        let layer = layer.clone();
        registry = registry.handle(t.clone(), move |_: serde::de::IgnoredAny, ctx| {
            layer.clone().run_record(ctx)
        });
    }
    let env = build(&config, registry, &sdk_config().await).await?;
    let processor = env.processor;
    tokio::spawn(watch_runtime(pid_file, layer.clone(), processor.clone()));
    Ok((layer, processor))
}

/// Registers with the Extensions API for INVOKE and SHUTDOWN; returns the identifier.
async fn register(upstream: &str) -> Result<String, RuntimeError> {
    let a = http::call(
        upstream,
        Method::POST,
        "/2020-01-01/extension/register",
        &[
            (
                HeaderName::from_static("lambda-extension-name"),
                HeaderValue::from_static(EXTENSION_NAME),
            ),
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
        ],
        Bytes::from_static(br#"{"events":["INVOKE","SHUTDOWN"]}"#),
    )
    .await?;
    if !a.status.is_success() {
        return Err(format!(
            "the Extensions API refused the registration ({}): {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        )
        .into());
    }
    header(&a.headers, "lambda-extension-identifier")
        .map(str::to_owned)
        .ok_or_else(|| "the Extensions API gave no Lambda-Extension-Identifier".into())
}

/// The Extensions API's event loop: INVOKE needs nothing (the Runtime API carries the work);
/// SHUTDOWN ends it, and with it the extension.
async fn events(upstream: String, identifier: String) {
    let id = match HeaderValue::from_str(&identifier) {
        Ok(v) => v,
        Err(_) => return,
    };
    loop {
        let a = http::call(
            &upstream,
            Method::GET,
            "/2020-01-01/extension/event/next",
            &[(HeaderName::from_static("lambda-extension-identifier"), id.clone())],
            Bytes::new(),
        )
        .await;
        match a {
            Ok(a) if a.status.is_success() => {
                #[derive(Deserialize)]
                struct Event {
                    #[serde(rename = "eventType")]
                    kind: String,
                }
                if serde_json::from_slice::<Event>(&a.body).is_ok_and(|e| e.kind == "SHUTDOWN") {
                    tracing::info!("shutdown");
                    return;
                }
            }
            Ok(a) => {
                tracing::error!(status = %a.status, "the Extensions API refused event/next");
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "the Extensions API cannot be reached");
                return;
            }
        }
    }
}

/// Watches the runtime's process (its id in the wrapper's pid file): when it is gone, the
/// records it held fail at once as transient, and records not started yet are released
/// unspent (the processor drains).
async fn watch_runtime(pid_file: String, layer: Arc<Layer>, processor: Processor) {
    let mut pid: Option<String> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if pid.is_none() {
            pid = std::fs::read_to_string(&pid_file)
                .ok()
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            continue;
        }
        let Some(p) = &pid else { continue };
        let alive = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(false);
        if !alive {
            tracing::error!(pid = %p, "the function's runtime exited; its records fail, the rest are released");
            processor.drain();
            layer.hub.runtime_gone();
            layer.gone.send_replace(true);
            return;
        }
    }
}

/// Takes invocations from Lambda's Runtime API until it cannot.
async fn serve_invocations(layer: &Arc<Layer>, processor: &Processor) -> Result<(), RuntimeError> {
    let upstream = layer.hub.upstream.clone();
    loop {
        let inv = http::call(
            &upstream,
            Method::GET,
            "/2018-06-01/runtime/invocation/next",
            &[],
            Bytes::new(),
        )
        .await?;
        if !inv.status.is_success() {
            return Err(format!("the Runtime API refused next ({})", inv.status).into());
        }
        let Some(real_id) = header(&inv.headers, "lambda-runtime-aws-request-id").map(str::to_owned) else {
            return Err("the Runtime API gave an invocation without a request id".into());
        };
        let (path, headers, body) = if is_sqs(&inv.body) {
            batch(layer, processor, &real_id, &inv.headers, inv.body).await
        } else {
            pass_through(layer, &real_id, &inv.headers, inv.body).await
        };
        let path = format!("/2018-06-01/runtime/invocation/{real_id}/{path}");
        let a = http::call(&upstream, Method::POST, &path, &headers, body).await?;
        if !a.status.is_success() {
            tracing::error!(status = %a.status, body = %String::from_utf8_lossy(&a.body), "the Runtime API refused the answer");
        }
        if layer.hub.is_gone() {
            return Err("the function's runtime exited; the environment must be replaced".into());
        }
        let held = layer.hub.unanswered();
        if held > 0 {
            // A handler still runs in the runtime: the environment is not fit for another
            // invocation, so the extension ends and Lambda replaces it.
            return Err(format!(
                "{held} handler(s) still running after the batch was reported; the environment must be replaced"
            )
            .into());
        }
    }
}

type Answer = (&'static str, Vec<(HeaderName, HeaderValue)>, Bytes);

fn json_headers() -> Vec<(HeaderName, HeaderValue)> {
    vec![(
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("application/json"),
    )]
}

/// An SQS event: its records through the processor, each run as its own invocation.
async fn batch(
    layer: &Arc<Layer>,
    processor: &Processor,
    real_id: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Answer {
    let deadline_ms: u64 = header(headers, "lambda-runtime-deadline-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // The runtime must answer for a record before the processor stops waiting for it.
    let record_deadline = match deadline_ms {
        0 => 0,
        d => d.saturating_sub(REPORT_MARGIN.as_millis() as u64),
    };
    layer.set_batch(Some(Arc::new(Batch {
        real_id: real_id.to_owned(),
        headers: record_headers(headers, record_deadline),
        records: records_by_id(&body),
    })));
    let mut ctx = Context::default();
    ctx.request_id = real_id.to_owned();
    ctx.deadline = deadline_ms;
    ctx.invoked_function_arn = header(headers, "lambda-runtime-invoked-function-arn")
        .unwrap_or_default()
        .to_owned();
    ctx.xray_trace_id = header(headers, "lambda-runtime-trace-id").map(str::to_owned);
    let raw = match std::str::from_utf8(&body)
        .ok()
        .and_then(|s| RawValue::from_string(s.to_owned()).ok())
    {
        Some(raw) => raw,
        None => {
            layer.set_batch(None);
            return batch_error("the event is not JSON text");
        }
    };
    let result = crate::runtime::lambda::handle_raw(processor, LambdaEvent::new(raw, ctx)).await;
    layer.set_batch(None);
    match result {
        Ok(response) => match serde_json::to_vec(&response) {
            Ok(b) => ("response", json_headers(), Bytes::from(b)),
            Err(e) => batch_error(&format!("the batch response cannot be written: {e}")),
        },
        Err(e) => batch_error(&e.to_string()),
    }
}

/// The whole batch failed (SQS delivers every record again).
fn batch_error(message: &str) -> Answer {
    let body = serde_json::json!({ "errorType": "SqsTriage.BatchFailed", "errorMessage": message });
    let mut h = json_headers();
    h.push((
        HeaderName::from_static(proxy::ERROR_TYPE),
        HeaderValue::from_static("SqsTriage.BatchFailed"),
    ));
    ("error", h, Bytes::from(body.to_string()))
}

/// Any other event: to the runtime as it came, and its answer back as it came.
async fn pass_through(layer: &Arc<Layer>, real_id: &str, headers: &HeaderMap, body: Bytes) -> Answer {
    let forwarded = headers
        .iter()
        .filter(|(k, _)| *k != "content-length" && *k != "transfer-encoding")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let rx = layer.hub.dispatch(real_id.to_owned(), forwarded, body);
    let mut gone = layer.gone.subscribe();
    let reply = tokio::select! {
        r = rx => r.ok(),
        _ = gone.wait_for(|g| *g) => None,
    };
    match reply {
        Some(r) => (if r.ok { "response" } else { "error" }, r.headers, r.body),
        None => {
            let body = serde_json::json!({
                "errorType": "Runtime.ExitError",
                "errorMessage": "the function's runtime exited before it answered",
            });
            let mut h = json_headers();
            h.push((
                HeaderName::from_static(proxy::ERROR_TYPE),
                HeaderValue::from_static("Runtime.ExitError"),
            ));
            ("error", h, Bytes::from(body.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_events_whose_every_record_is_from_sqs_are_batches() {
        assert!(is_sqs(
            br#"{"Records":[{"eventSource":"aws:sqs","messageId":"a"}]}"#
        ));
        assert!(!is_sqs(br#"{"Records":[]}"#));
        assert!(!is_sqs(br#"{"Records":[{"eventSource":"aws:s3"}]}"#));
        assert!(!is_sqs(
            br#"{"Records":[{"eventSource":"aws:sqs"},{"EventSource":"aws:sns"}]}"#
        ));
        assert!(!is_sqs(br#"{"hello":"world"}"#));
        assert!(!is_sqs(b"[1,2]"));
        assert!(!is_sqs(b"not json"));
    }

    #[test]
    fn a_records_event_carries_the_job_as_attributes() {
        let raw = RawValue::from_string(
            r#"{"messageId":"m1","body":"{}","messageAttributes":{"job-type":{"stringValue":"t","dataType":"String"}},"eventSource":"aws:sqs"}"#.into(),
        )
        .unwrap();
        let ctx = JobContext {
            job_id: "j1".into(),
            job_type: "t".into(),
            message_id: "m1".into(),
            attempt: 2,
            max_attempts: 5,
            deadline_ms: None,
        };
        let e: Value = serde_json::from_slice(&record_event(&raw, &ctx).unwrap()).unwrap();
        let r = &e["Records"][0];
        assert_eq!(r["messageId"], "m1");
        assert_eq!(r["messageAttributes"]["job-type"]["stringValue"], "t");
        assert_eq!(r["messageAttributes"][ATTEMPT_ATTRIBUTE]["stringValue"], "2");
        assert_eq!(r["messageAttributes"][JOB_ID_ATTRIBUTE]["stringValue"], "j1");
        assert_eq!(e["Records"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_port_and_workers_are_read_with_their_ranges() {
        let none = |_: &str| None;
        assert_eq!(port(&none).unwrap(), DEFAULT_PORT);
        assert_eq!(workers(&none).unwrap(), 1);
        let bad = |_: &str| Some("0".to_owned());
        assert_eq!(port(&bad).unwrap_err().var, PORT_VAR);
        assert_eq!(workers(&bad).unwrap_err().var, WORKERS_VAR);
    }
}
