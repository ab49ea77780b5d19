//! The Lambda adapter: an SQS event in, a partial batch response out.
//!
//! [`run`] is the whole of a function's `main`; [`handle_raw`] (the event as its JSON text)
//! and [`handle_json`] (the event parsed) are one invocation, for tests and for functions that
//! drive `lambda_runtime` themselves. [`event`] reads the event's records.

pub mod event;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::SdkConfig;
use aws_lambda_events::event::sqs::SqsBatchResponse;
#[cfg(feature = "internals")]
use aws_lambda_events::event::sqs::SqsEvent;
use hyper::body::Bytes;
use lambda_runtime::{Context, LambdaEvent, LambdaInvocation, service_fn, tower};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::RuntimeError;
use super::env::{
    Environment, STARTUP_DEADLINE, StartupError, build, init_tracing, install_panic_hook, print_emf, sdk_config,
};
use crate::clock::now_ms;
use crate::config::Config;
use crate::effects::metrics::UNREGISTERED;
use crate::processor::registry::Registry;
use crate::processor::{Incoming, Processor};

pub use event::UnreadableRecord;
use event::{LeanMessage, is_fifo_arn};

/// Runs `registry` as a Lambda function: reads the configuration from the environment once
/// (the `TRIAGE_*` variables; for a [`Registry::default`] their policies are its defaults, see
/// [`Registry::configured`]), builds the SDK clients once for the container, and serves SQS
/// events until the runtime stops. A configuration that cannot work (an invalid variable, a
/// missing queue) ends it with an error before the first event, which fails the function's
/// init; with the source queue's attributes configured (`TRIAGE_QUEUE_*`) the source queue is
/// not read, so a missing one is not among them. The breakers' first read (the table's check)
/// runs while the runtime polls: a table it finds at fault ends the function with the same
/// error at the first event, before any record runs.
pub async fn run(registry: Registry) -> Result<(), RuntimeError> {
    run_with(registry, &sdk_config().await).await
}

/// [`run`] with the AWS configuration already loaded (a function whose `main` loads it for its
/// own clients passes it on: it is loaded once).
pub async fn run_with(registry: Registry, sdk: &SdkConfig) -> Result<(), RuntimeError> {
    init_tracing();
    let mut config = Config::from_env()?;
    config.startup_deadline = Some(STARTUP_DEADLINE);
    // The first breaker read overlaps the poll for the first event; its admission waits for it.
    config.first_read_at_admission = true;
    install_panic_hook(config.log_payloads);
    let env: Environment = build(&config, registry, sdk).await?;
    let processor = &env.processor;
    // A table the first read finds misconfigured ends the function as a failed start-up
    // does, with the same error: this invocation runs nothing and answers nothing, and Lambda
    // starts a fresh environment for the next one.
    let (refused, mut refusal) = tokio::sync::mpsc::unbounded_channel::<StartupError>();
    let refused = &refused;
    // The event's bytes reach the handler as they came (`EventBody`): it reads them record
    // by record, so one record the typed model rejects does not fail the others, and
    // `lambda_runtime` makes no pass of its own over them.
    let body = EventBody::default();
    let handler = {
        let body = body.clone();
        service_fn(move |event: LambdaEvent<IgnoredAny>| {
            let taken = body.take(&event.context.request_id);
            async move {
                let text = taken.ok_or("the event's body was not handed over")?;
                let text = std::str::from_utf8(&text).map_err(|e| format!("cannot read the event: {e}"))?;
                match handle_text(processor, text, event.context).await {
                    Err(e) if e.is::<StartupError>() => {
                        if let Ok(e) = e.downcast::<StartupError>() {
                            let _ = refused.send(*e);
                        }
                        std::future::pending().await
                    }
                    answer => answer,
                }
            }
        })
    };
    let serve = lambda_runtime::Runtime::new(handler)
        .layer(body)
        .layer(lambda_runtime::layers::TracingLayer::new())
        .run();
    tokio::select! {
        served = serve => served,
        Some(e) = refusal.recv() => Err(e.into()),
    }
}

/// Hands each invocation's body to the handler as `lambda_runtime` received it: the layer
/// keeps the bytes, keyed by request id, and gives the runtime's own deserialization an empty
/// object in their place; the handler takes them back. Keyed, so invocations served side by
/// side each get their own.
#[derive(Clone, Default)]
struct EventBody {
    held: Arc<Mutex<std::collections::HashMap<String, Bytes>>>,
}

/// An empty object: what `lambda_runtime` deserializes (into [`IgnoredAny`]) in place of the
/// event.
const NO_EVENT: &[u8] = b"{}";

/// More bodies than this waiting for their handlers means some were left behind.
const MAX_HELD_BODIES: usize = 64;

impl EventBody {
    /// The body of invocation `request_id`, taken from the layer.
    fn take(&self, request_id: &str) -> Option<Bytes> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(request_id)
    }

    /// Keeps `body` for the handler of invocation `request_id`. A body whose handler never
    /// ran (its invocation failed before it) is dropped here, once that many are kept that no
    /// runtime serves them at once.
    fn keep(&self, request_id: String, body: Bytes) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() >= MAX_HELD_BODIES {
            held.clear();
        }
        held.insert(request_id, body);
    }
}

impl<S> tower::Layer<S> for EventBody {
    type Service = EventBodyService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        EventBodyService {
            inner,
            body: self.clone(),
        }
    }
}

/// The service of [`EventBody`].
#[derive(Clone)]
struct EventBodyService<S> {
    inner: S,
    body: EventBody,
}

impl<S: tower::Service<LambdaInvocation>> tower::Service<LambdaInvocation> for EventBodyService<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut invocation: LambdaInvocation) -> S::Future {
        let body = std::mem::replace(&mut invocation.body, Bytes::from_static(NO_EVENT));
        self.body.keep(invocation.context.request_id.clone(), body);
        self.inner.call(invocation)
    }
}

/// The time left before `deadline` ([`lambda_runtime::Context::deadline`]) at `now`.
/// cargo-lambda's local emulator sends the function timeout itself (e.g. `600000`) where Lambda
/// sends epoch milliseconds, which reads as an instant in 1970: a deadline before 2001 is read
/// as that timeout, so local runs keep a deadline instead of releasing every record.
fn time_left(deadline: SystemTime, now: SystemTime) -> Duration {
    const EPOCH_2001: Duration = Duration::from_millis(1_000_000_000_000);
    match deadline.duration_since(UNIX_EPOCH) {
        Ok(since_epoch) if since_epoch < EPOCH_2001 => since_epoch,
        _ => deadline.duration_since(now).unwrap_or(Duration::ZERO),
    }
}

/// Handles one typed event: see [`handle_json`], which it calls with the event as JSON.
#[cfg(feature = "internals")]
pub async fn handle(
    processor: &Processor,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, RuntimeError> {
    let (payload, context) = (event.payload, event.context);
    let payload = serde_json::to_value(payload).map_err(|e| format!("cannot read the event: {e}"))?;
    handle_json(processor, LambdaEvent::new(payload, context)).await
}

/// The event's shape on the fast path: every record an object the typed model reads.
#[derive(Deserialize)]
struct TypedEvent {
    #[serde(rename = "Records")]
    records: Vec<ObjectRecord>,
}

/// A record the lean model reads from a JSON object (never from an array, which the derived
/// reader would also take).
struct ObjectRecord(LeanMessage);

impl<'de> Deserialize<'de> for ObjectRecord {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = ObjectRecord;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an SQS record object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ObjectRecord, A::Error> {
                LeanMessage::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ObjectRecord)
            }
        }
        d.deserialize_map(Object)
    }
}

/// The event's shape on the record-by-record path: its records, each kept as its JSON text.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "Records", borrow)]
    records: Vec<&'a RawValue>,
}

/// One record of the event, as far as it has been read. The typed variant is the usual one and
/// is not boxed: that would cost an allocation per record.
#[allow(clippy::large_enum_variant)]
enum RawRecord {
    /// The lean model read it (the usual case): the typed model reads it too, to the same
    /// record.
    Typed(LeanMessage),
    /// The typed model rejected it: read in part by [`Incoming::from_lambda_json`].
    Loose(Value),
    /// Not readable as JSON at all (nested past the parser's depth limit).
    Unparsed(String),
}

impl RawRecord {
    /// Reads a record from its JSON text: with the typed model straight from the text (no
    /// intermediate JSON tree), or, when that fails, as JSON for the lenient reading.
    fn from_text(raw: &RawValue) -> Self {
        // Only an object is read typed here: the typed model would also read a record written
        // as a JSON array, whose message id and group the lenient reading does not see.
        let typed = is_object(raw.get())
            .then(|| serde_json::from_str::<LeanMessage>(raw.get()).ok())
            .flatten();
        match typed {
            Some(m) => Self::Typed(m),
            None => match serde_json::from_str::<Value>(raw.get()) {
                Ok(v) => Self::Loose(v),
                Err(e) => Self::Unparsed(format!("the record cannot be read as JSON ({e})")),
            },
        }
    }

    /// Its non-empty message id, when one reads.
    fn message_id(&self) -> Option<&str> {
        match self {
            Self::Typed(m) => m.message_id(),
            Self::Loose(v) => v["messageId"].as_str(),
            Self::Unparsed(_) => None,
        }
        .filter(|id| !id.is_empty())
    }

    /// Whether its source ARN names a FIFO queue.
    fn is_fifo(&self) -> bool {
        match self {
            Self::Typed(m) => return m.is_fifo(),
            Self::Loose(v) => v["eventSourceARN"].as_str(),
            Self::Unparsed(_) => None,
        }
        .is_some_and(is_fifo_arn)
    }

    /// Its `MessageGroupId` system attribute.
    fn group(&self) -> Option<&str> {
        match self {
            Self::Typed(m) => m.group(),
            Self::Loose(v) => v["attributes"]["MessageGroupId"].as_str(),
            Self::Unparsed(_) => None,
        }
    }

    fn read(self) -> Result<Incoming, UnreadableRecord> {
        match self {
            Self::Typed(m) => Incoming::from_lean(m),
            Self::Loose(v) => Incoming::from_lambda_json(&v),
            Self::Unparsed(reason) => Err(UnreadableRecord {
                message_id: None,
                reason,
            }),
        }
    }
}

/// Handles one event given as its JSON text, as `lambda_runtime` receives it: each record is
/// read with the typed model straight from its text, and only a record the model rejects is
/// read as JSON and in part. An event that is not an object with a `Records` array is read as
/// JSON and handled by [`handle_json`], which says what is wrong with it. Every event an SQS
/// event source mapping sends gets [`handle_json`]'s answer. Some malformed events that cannot
/// be parsed as a whole are read here where `handle_json`'s caller could not parse them: a
/// field the model ignores holding a lone surrogate escape, a number out of range, or nesting
/// past the parser's depth limit no longer fails the invocation.
pub async fn handle_raw(
    processor: &Processor,
    event: LambdaEvent<Box<RawValue>>,
) -> Result<SqsBatchResponse, RuntimeError> {
    handle_text(processor, event.payload.get(), event.context).await
}

/// [`handle_raw`] on the event's text as it came, before any parse.
async fn handle_text(
    processor: &Processor,
    text: &str,
    context: Context,
) -> Result<SqsBatchResponse, RuntimeError> {
    let clock = Clock::of(&context);
    let records = match read_raw(text) {
        Some(records) => records,
        None => {
            let v: Value = serde_json::from_str(text).map_err(|e| format!("cannot read the event: {e}"))?;
            return handle_json(processor, LambdaEvent::new(v, context)).await;
        }
    };
    handle_records(processor, records, clock).await
}

/// The records of an SQS event given as its JSON text, read as [`handle_raw`] reads them (a
/// FIFO group's records are not held back here): for benchmarks and tools.
#[cfg(any(test, feature = "internals"))]
pub fn read_records(event: &str) -> Result<Vec<Result<Incoming, UnreadableRecord>>, RuntimeError> {
    let records = read_raw(event).ok_or(NOT_SQS)?;
    Ok(records.into_iter().map(RawRecord::read).collect())
}

/// The records of an event given as its JSON text: in one pass with the typed model when
/// every record reads with it (the usual case), else record by record
/// ([`RawRecord::from_text`]). `None` when the text is not an object with a `Records` array.
fn read_raw(event: &str) -> Option<Vec<RawRecord>> {
    if !is_object(event) {
        return None;
    }
    if let Ok(e) = serde_json::from_str::<TypedEvent>(event) {
        return Some(e.records.into_iter().map(|r| RawRecord::Typed(r.0)).collect());
    }
    let e = serde_json::from_str::<RawEvent<'_>>(event).ok()?;
    Some(e.records.into_iter().map(RawRecord::from_text).collect())
}

/// Whether a JSON text is an object (the derived readers would also take an array).
fn is_object(json: &str) -> bool {
    json.trim_start().starts_with('{')
}

/// When an invocation must answer, read once as it starts.
#[derive(Debug, Clone, Copy)]
struct Clock {
    deadline_ms: u64,
    left: Duration,
    deadline: Option<Instant>,
}

impl Clock {
    fn of(context: &Context) -> Self {
        let deadline_ms = context.deadline;
        let now = UNIX_EPOCH + Duration::from_millis(now_ms());
        let left = time_left(context.deadline(), now);
        Self {
            deadline_ms,
            left,
            deadline: (deadline_ms > 0).then(|| Instant::now() + left),
        }
    }
}

/// Handles one event: reads it record by record ([`Incoming::from_lambda_json`]), processes
/// the records that read, prints the metrics as EMF, and reports failed records.
///
/// A record that cannot be read is reported failed on its own (SQS delivers it again and,
/// after `maxReceiveCount`, its redrive policy moves it to the DLQ); the others proceed. The
/// whole batch fails (an empty `itemIdentifier` is never sent) when the event has no
/// `Records` array, when a record that cannot be read has no readable message id (then
/// before any handler runs, so no job runs twice), or when a record without a message id
/// must be reported.
pub async fn handle_json(
    processor: &Processor,
    event: LambdaEvent<Value>,
) -> Result<SqsBatchResponse, RuntimeError> {
    let clock = Clock::of(&event.context);
    let raw = match event.payload {
        Value::Object(mut map) => match map.remove("Records") {
            Some(Value::Array(raw)) => raw,
            _ => return Err(NOT_SQS.into()),
        },
        _ => return Err(NOT_SQS.into()),
    };
    handle_records(processor, raw.into_iter().map(RawRecord::Loose).collect(), clock).await
}

const NOT_SQS: &str = "not an SQS event (no `Records` array); failing the whole batch";

async fn handle_records(
    processor: &Processor,
    raw: Vec<RawRecord>,
    clock: Clock,
) -> Result<SqsBatchResponse, RuntimeError> {
    // Start-up's first breaker read, if still running: a misconfigured table fails the
    // invocation before any record runs. Not waited for past the admission's deadline.
    processor
        .first_read(crate::processor::Deadline::new(clock.deadline).admission())
        .await?;
    tracing::debug!(
        deadline_ms = clock.deadline_ms,
        time_left_ms = clock.left.as_millis() as u64,
        records = raw.len(),
        "invocation"
    );
    let (records, unreadable) = read_event(processor.is_fifo(), raw)?;
    let mut outcome = processor.process(records, clock.deadline).await;
    outcome
        .metrics
        .add(UNREGISTERED, "UnreadableRecords", unreadable.len() as u64);
    for line in outcome.metrics.emf_lines(now_ms()) {
        print_emf(&line);
    }
    if outcome.whole_batch_failed {
        return Err("a record without a message id could not be settled; failing the whole batch".into());
    }
    let mut response = SqsBatchResponse::default();
    response.set_failures(outcome.failures().into_iter().chain(unreadable));
    Ok(response)
}

/// The event's records that read, and the message ids to report failed without processing:
/// records that cannot be read and, on a FIFO queue, the records of their message group
/// behind them (they must not overtake them). An error fails the whole batch: such a record
/// has no message id to report, and no handler has run yet.
fn read_event(fifo_queue: bool, raw: Vec<RawRecord>) -> Result<(Vec<Incoming>, Vec<String>), RuntimeError> {
    let mut records = Vec::with_capacity(raw.len());
    let mut unreadable = Vec::new();
    let mut held_groups: HashSet<String> = HashSet::new();
    let mut hold_all = false;
    for (index, r) in raw.into_iter().enumerate() {
        let fifo = fifo_queue || r.is_fifo();
        let whole_batch = |reason: &str| -> RuntimeError {
            tracing::error!(
                record = index,
                reason,
                "record has no message id; failing the whole batch"
            );
            format!("record {index}: {reason}, and it has no message id; failing the whole batch").into()
        };
        if fifo && (hold_all || r.group().is_some_and(|g| held_groups.contains(g))) {
            let Some(id) = r.message_id() else {
                return Err(whole_batch("held back behind an unreadable record of its FIFO group"));
            };
            tracing::warn!(message_id = %id, "held back behind an unreadable record of its FIFO group; reported failed");
            unreadable.push(id.to_owned());
            continue;
        }
        let group = if fifo { r.group().map(str::to_owned) } else { None };
        match r.read() {
            Ok(inc) => records.push(inc),
            Err(e) => {
                let Some(id) = e.message_id else {
                    return Err(whole_batch(&format!("cannot be read ({})", e.reason)));
                };
                tracing::warn!(message_id = %id, reason = %e.reason, "record cannot be read; reported failed");
                unreadable.push(id);
                match group {
                    Some(g) => {
                        held_groups.insert(g);
                    }
                    None => hold_all |= fifo,
                }
            }
        }
    }
    Ok((records, unreadable))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    /// Invocations served side by side each get their own body back, whatever the order.
    #[test]
    fn each_invocation_takes_its_own_body() {
        use hyper::body::Bytes;
        let body = super::EventBody::default();
        body.keep("a".into(), Bytes::from_static(b"A"));
        body.keep("b".into(), Bytes::from_static(b"B"));
        assert_eq!(body.take("b").as_deref(), Some(&b"B"[..]));
        assert_eq!(body.take("a").as_deref(), Some(&b"A"[..]));
        assert_eq!(body.take("a"), None, "taken once");
    }


    use lambda_runtime::Context;

    use super::time_left;

    fn left(deadline_ms: u64, now_ms: u64) -> u64 {
        let mut ctx = Context::default();
        ctx.deadline = deadline_ms;
        let now = UNIX_EPOCH + Duration::from_millis(now_ms);
        time_left(ctx.deadline(), now).as_millis() as u64
    }

    #[test]
    fn arrays_are_not_read_as_an_event_or_as_typed_records() {
        assert!(super::read_records(r#"[[{"messageId":"m1","receiptHandle":"r","body":"{}"}]]"#).is_err());
        assert!(super::read_records("[[]]").is_err());
        let raw = serde_json::value::RawValue::from_string(
            r#"["b","rh","{}",null,null,{"MessageGroupId":"g"},{},"arn:aws:sqs:us-east-1:1:q.fifo"]"#.into(),
        )
        .unwrap();
        let r = super::RawRecord::from_text(&raw);
        assert!(matches!(r, super::RawRecord::Loose(_)));
        // As the JSON reading sees it: no message id, no group, not FIFO.
        assert_eq!((r.message_id(), r.group(), r.is_fifo()), (None, None, false));
        let obj = serde_json::value::RawValue::from_string(
            r#" {"messageId":"a","receiptHandle":"r","body":"{}","attributes":{"MessageGroupId":"g"},"eventSourceARN":"arn:aws:sqs:us-east-1:1:q.fifo"}"#.into(),
        )
        .unwrap();
        let r = super::RawRecord::from_text(&obj);
        assert!(matches!(r, super::RawRecord::Typed(_)));
        assert_eq!(
            (r.message_id(), r.group(), r.is_fifo()),
            (Some("a"), Some("g"), true)
        );
    }

    #[test]
    fn deadlines_are_epoch_ms_or_an_emulator_timeout() {
        assert_eq!(left(1_700_000_030_000, 1_700_000_000_000), 30_000);
        assert_eq!(left(1_700_000_000_000, 1_700_000_030_000), 0);
        assert_eq!(left(600_000, 1_700_000_000_000), 600_000);
    }
}

/// How an event's unreadable records are reported: alone on a standard queue; on a FIFO
/// queue, with the records of their group behind them (or every later record, for one without
/// a group); and the whole batch fails when such a record has no message id.
#[cfg(test)]
mod read_event_tests {
    use super::{read_event, read_raw};

    /// A record with message id `id`, readable or not (a receive count that reads as no
    /// count), in message group `group`.
    fn record(id: Option<&str>, group: Option<&str>, readable: bool) -> String {
        let id = id.map_or(String::new(), |id| format!(r#""messageId":"{id}","#));
        let count = if readable { "1" } else { "x" };
        let group = group.map_or(String::new(), |g| format!(r#","MessageGroupId":"{g}""#));
        format!(
            r#"{{{id}"receiptHandle":"r","body":"{{}}","attributes":{{"ApproximateReceiveCount":"{count}"{group}}},"eventSourceARN":"arn:aws:sqs:us-east-1:0:q"}}"#
        )
    }

    fn read(fifo: bool, records: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
        let event = format!(r#"{{"Records":[{}]}}"#, records.join(","));
        let raw = read_raw(&event).expect("an SQS event");
        read_event(fifo, raw)
            .map(|(read, unreadable)| (read.into_iter().map(|i| i.message_id).collect(), unreadable))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn on_a_standard_queue_an_unreadable_record_holds_nothing_back() {
        let got = read(false, &[record(Some("a"), Some("g"), false), record(Some("b"), Some("g"), true)]);
        assert_eq!(got, Ok((vec!["b".into()], vec!["a".into()])));
    }

    #[test]
    fn on_a_fifo_queue_an_unreadable_record_holds_its_group_back() {
        let got = read(
            true,
            &[
                record(Some("b0"), Some("g2"), true),
                record(Some("a"), Some("g1"), false),
                record(Some("b"), Some("g1"), true),
                record(Some("c"), Some("g2"), true),
            ],
        );
        assert_eq!(got, Ok((vec!["b0".into(), "c".into()], vec!["a".into(), "b".into()])));
    }

    #[test]
    fn on_a_fifo_queue_an_unreadable_record_without_a_group_holds_every_later_record_back() {
        let got = read(
            true,
            &[
                record(Some("z"), Some("g2"), true),
                record(Some("a"), None, false),
                record(Some("b"), Some("g1"), true),
                record(Some("c"), Some("g2"), true),
            ],
        );
        assert_eq!(got, Ok((vec!["z".into()], vec!["a".into(), "b".into(), "c".into()])));
    }

    #[test]
    fn a_record_that_cannot_be_reported_by_its_message_id_fails_the_whole_batch() {
        let unreadable = read(false, &[record(Some("a"), None, true), record(None, None, false)]);
        assert!(unreadable.is_err_and(|e| e.contains("record 1") && e.contains("no message id")));
        let held = read(true, &[record(Some("a"), Some("g"), false), record(None, Some("g"), true)]);
        assert!(held.is_err_and(|e| e.contains("held back") && e.contains("no message id")));
    }
}
